r"""Integral transforms over :math:`\Omega_y` as GEMMs.

:func:`linear_y` is :math:`\int_{\Omega_y} W(\xi, \cdot)\, x(\cdot, \xi)\, d\xi + b` for a
kernel ``W`` of shape ``(N_y, M)`` (rows: the integration variable), the y-weights folded
into the kernel when they are equal.

:func:`side_by_side` puts several kernels side by side for inference: one GEMM where a term
applies several integral transforms to the same state (queries/keys/values, gate/up).  The
concatenation is a copy made at every call and kept nowhere, so it can never hold weights
older than the parameters, whatever wrote to them (``p.data.mul_``, ``copy_``, ``.data =``,
``load_state_dict``, an optimizer step, ``to()``).  It costs one pass over the kernels,
small beside the GEMM of a whole sequence; the decode steps of a generation
(:mod:`opsplit.operators._fused`) make it once per generation, not per token.  With
autograd recording the operators apply the kernels one by one, so gradients reach each
parameter directly.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

__all__ = ["linear_y", "side_by_side", "fan_in_uniform_"]


@torch.no_grad()
def fan_in_uniform_(fan_in: int, *tensors) -> None:
    """``nn.Linear``'s and ``nn.Conv2d``'s default initialisation of a weight and its bias:
    each of ``tensors`` (``None`` skipped), in order, uniform in
    :math:`\\pm 1/\\sqrt{\\text{fan\\_in}}`."""
    bound = 1.0 / math.sqrt(fan_in)
    for t in tensors:
        if t is not None:
            nn.init.uniform_(t, -bound, bound)


def linear_y(x: Tensor, W: Tensor, b: Tensor | None, grid) -> Tensor:
    r""":math:`\int_{\Omega_y} W(\xi, \cdot)\, x(\cdot, \xi)\, d\xi + b`: ``x`` ``(..., N_y)``,
    ``W`` ``(N_y, M)``, ``b`` ``(M,)`` or ``None`` -> ``(..., M)`` (one GEMM)."""
    wy = grid.y.uniform_weight
    if wy is None:
        x = x * grid.y.weights(x.dtype, x.device)
    elif wy != 1.0:
        W = W * wy
    return F.linear(x, W.t(), b)


def side_by_side(kernels, biases) -> tuple[Tensor, Tensor | None]:
    """``[W_1, ..., W_k]`` as one ``(N_y, sum M_i)`` kernel (each ``W_i`` reshaped to
    ``(N_y, M_i)``) and the matching bias (zeros where a ``b_i`` is ``None``; ``None`` if all
    are): new tensors made from the current values (module docstring)."""
    ny = kernels[0].shape[0]
    Ws = [w.reshape(ny, -1) for w in kernels]
    W = torch.cat(Ws, 1)
    b = None
    if any(x is not None for x in biases):
        b = torch.cat([x.reshape(-1) if x is not None else w.new_zeros(w.shape[1]) for w, x in zip(Ws, biases)])
    return W, b
