r"""Error metrics that documented targets are stated in.

* :func:`relative_l2` — the relative :math:`L^2` error per sample,
  :math:`\|w_i - v_i\|_2 / \|v_i\|_2`, averaged over the batch (FNO's ``LpLoss`` with
  :math:`p = 2`, the Burgers benchmark's test metric and training loss; also the
  :class:`~opsplit.control.Objective` loss ``"relative_l2"``).
"""

from __future__ import annotations

import torch
from torch import Tensor

from .._checks import check_choice

__all__ = ["relative_l2", "REDUCTIONS"]

#: what :func:`relative_l2` returns: the batch mean, or the per-sample errors
REDUCTIONS = ("mean", "none")


def relative_l2(outputs: Tensor, targets: Tensor, *, reduction: str = "mean") -> Tensor:
    r"""The relative :math:`L^2` error :math:`\|w_i - v_i\|_2 / \|v_i\|_2` of each sample
    ``i`` (every dimension after the first flattened), averaged over the batch
    (``reduction="mean"``, a scalar) or per sample (``"none"``, shape ``(B,)``).

    Args:
        outputs: ``(B, ...)`` floating point.
        targets: ``(B, ...)``, the same shape; no sample may be all zeros (its relative
            error is undefined).
    """
    if not isinstance(outputs, Tensor) or not isinstance(targets, Tensor):
        bad = "outputs" if not isinstance(outputs, Tensor) else "targets"
        raise TypeError(f"relative_l2.{bad}: expected a torch.Tensor, got {type(outputs if bad == 'outputs' else targets).__name__}")
    if outputs.shape != targets.shape:
        raise ValueError(f"relative_l2: outputs shape {tuple(outputs.shape)} and targets shape "
                         f"{tuple(targets.shape)} differ")
    if outputs.dim() < 1 or outputs.shape[0] == 0:
        raise ValueError(f"relative_l2.outputs: expected (B, ...) with B >= 1 samples, got shape {tuple(outputs.shape)}")
    if not outputs.is_floating_point() or not targets.is_floating_point():
        raise TypeError(f"relative_l2: expected floating-point outputs and targets, got {outputs.dtype} and "
                        f"{targets.dtype}")
    check_choice(reduction, REDUCTIONS, "relative_l2.reduction")
    b = outputs.shape[0]
    denom = targets.reshape(b, -1).norm(dim=1)
    if not torch.compiler.is_compiling() and bool((denom == 0).any()):
        i = int((denom == 0).nonzero()[0])
        raise ValueError(f"relative_l2.targets: sample {i} is all zeros, its relative error is undefined; expected "
                         "targets with a nonzero norm")
    err = (outputs - targets).reshape(b, -1).norm(dim=1) / denom
    return err.mean() if reduction == "mean" else err
