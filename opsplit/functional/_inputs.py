"""Argument checks shared by the attention kernels of :mod:`opsplit.functional`.

One place for what the sliced kernels (full and causal) and kernel attention accept:
score/value tensors, ``key_padding_mask`` and ``key_weights`` (combined into one weight per
key), ``centered``, the bandwidth, and which ``torch.func`` transforms are running.  Every
error names the argument and says what was expected (``opsplit/_checks.py`` conventions).
"""

from __future__ import annotations

import torch
from torch import Tensor
from torch.autograd import forward_ad

from .._checks import all_finite
from . import _scale

__all__ = [
    "check_scores_values",
    "key_weights",
    "check_centered",
    "bandwidth_rows",
    "transform",
    "scales",
]


def check_scores_values(fn: str, zq, zk, v) -> None:
    """Types, dtypes, devices and shapes of the sliced kernels' ``zq (..., N_q)``,
    ``zk (..., N_k)`` and ``v (..., N_k, D)`` (metadata only)."""
    for name, x in (("zq", zq), ("zk", zk), ("v", v)):
        if not isinstance(x, Tensor):
            raise TypeError(f"{fn}: {name}: expected a torch.Tensor, got {type(x).__name__}")
        if x.dtype not in (torch.float32, torch.float64):
            raise TypeError(
                f"{fn}: {name}: expected a float32 or float64 tensor, got dtype {x.dtype}"
            )
    if not (zq.dtype == zk.dtype == v.dtype):
        raise TypeError(
            f"{fn}: zq, zk and v must share one dtype, got {zq.dtype}, {zk.dtype}, {v.dtype}"
        )
    if not (zq.device == zk.device == v.device):
        raise ValueError(
            f"{fn}: zq, zk and v must be on one device, got {zq.device}, {zk.device}, {v.device}"
        )
    if zq.dim() < 1 or zk.dim() != zq.dim() or v.dim() != zq.dim() + 1:
        raise ValueError(
            f"{fn}: expected zq of shape (..., N_q), zk of shape (..., N_k) and v of shape "
            f"(..., N_k, D) with the same leading dims (e.g. (B, H, N)); got zq "
            f"{tuple(zq.shape)}, zk {tuple(zk.shape)}, v {tuple(v.shape)}"
        )
    lead = zq.shape[:-1]
    if zk.shape[:-1] != lead or v.shape[:-2] != lead or v.shape[-2] != zk.shape[-1]:
        raise ValueError(
            f"{fn}: shape mismatch: expected zq (..., N_q), zk (..., N_k), v (..., N_k, D) with "
            f"equal leading dims; got zq {tuple(zq.shape)}, zk {tuple(zk.shape)}, "
            f"v {tuple(v.shape)}"
        )
    if zk.shape[-1] == 0:
        raise ValueError(f"{fn}: expected at least one key (N_k >= 1), got zk {tuple(zk.shape)}")


def check_centered(fn: str, centered) -> bool:
    """``centered`` must be a bool (a string such as ``"False"`` is truthy)."""
    if not isinstance(centered, bool):
        raise TypeError(f"{fn}: centered: expected a bool, got {centered!r}")
    return centered


def key_weights(
    fn: str,
    key_padding_mask,
    key_weights,
    shape,
    dtype,
    device,
    *,
    check_values: bool = True,
    differentiable: bool = False,
) -> Tensor | None:
    """The weight of every key, ``shape = (..., N_k)``: ``key_weights`` (broadcast) times 0 at
    the keys ``key_padding_mask`` marks (``True`` = ignore); ``None`` when neither is given.

    A 2-D mask on scores of rank >= 3 is ``(B, N_k)`` (or ``(1, N_k)``): shared by every head
    (every leading dim but the first), whatever the sizes; another 2-D shape is refused (a
    mask of the scores' rank broadcasts as usual).  Unless ``differentiable``, weights that
    require grad are refused (the sliced kernels do not differentiate them)."""
    w = None
    shape = tuple(shape)
    if key_weights is not None:
        if not isinstance(key_weights, Tensor):
            try:
                key_weights = torch.as_tensor(key_weights, dtype=dtype, device=device)
            except (TypeError, ValueError, RuntimeError):
                raise TypeError(
                    f"{fn}: key_weights: expected a tensor, got {type(key_weights).__name__}"
                ) from None
        if not key_weights.is_floating_point():
            raise TypeError(
                f"{fn}: key_weights: expected a floating-point tensor, got {key_weights.dtype}"
            )
        if not differentiable and key_weights.requires_grad and torch.is_grad_enabled():
            raise ValueError(
                f"{fn}: key_weights: gradients with respect to the key weights are not "
                f"supported; pass weights that do not require grad (e.g. key_weights.detach())"
            )
        try:
            w = key_weights.to(dtype=dtype, device=device).expand(shape)
        except RuntimeError:
            raise ValueError(
                f"{fn}: key_weights: expected a shape broadcastable to {shape}, got "
                f"{tuple(key_weights.shape)}"
            ) from None
        if check_values and (not all_finite(w) or bool((w < 0).any())):
            raise ValueError(f"{fn}: key_weights: expected finite weights >= 0")
    if key_padding_mask is not None:
        m = key_padding_mask
        if not isinstance(m, Tensor) or m.dtype != torch.bool:
            raise TypeError(
                f"{fn}: key_padding_mask: expected a bool tensor (True = ignore the key), got "
                f"{type(m).__name__ if not isinstance(m, Tensor) else m.dtype}"
            )
        if m.dim() == 2 and len(shape) >= 3:
            if m.shape[1] != shape[-1] or m.shape[0] not in (1, shape[0]):
                raise ValueError(
                    f"{fn}: key_padding_mask: expected shape (B, N_k) = ({shape[0]}, "
                    f"{shape[-1]}) for scores of shape {shape} (a 2-D mask is one row per "
                    f"batch, shared by the heads; pass a mask of rank {len(shape)} to "
                    f"broadcast otherwise), got {tuple(m.shape)}"
                )
            m = m.view(m.shape[0], *([1] * (len(shape) - 2)), m.shape[1])
        try:
            m = m.to(device).expand(shape)
        except RuntimeError:
            raise ValueError(
                f"{fn}: key_padding_mask: expected shape (B, N_k) or one broadcastable to "
                f"{shape}, got {tuple(key_padding_mask.shape)}"
            ) from None
        keep = (~m).to(dtype)
        w = keep if w is None else w * keep
    return w


def bandwidth_rows(fn: str, bandwidth, lead, dtype, device, *, check_values: bool = True) -> Tensor:
    """The bandwidth ``b > 0`` (a number or a floating tensor broadcastable to ``lead``) as a
    tensor of shape ``lead`` (differentiable)."""
    if isinstance(bandwidth, Tensor):
        if not bandwidth.is_floating_point():
            raise TypeError(
                f"{fn}: bandwidth: expected a floating-point tensor, got {bandwidth.dtype}"
            )
        bt = bandwidth.to(device=device, dtype=dtype)
    else:
        try:
            if isinstance(bandwidth, (bool, str, bytes)):
                raise TypeError
            bt = torch.tensor(float(bandwidth), dtype=dtype, device=device)
        except (TypeError, ValueError):
            raise TypeError(
                f"{fn}: bandwidth: expected a number or a tensor, got {bandwidth!r}"
            ) from None
    if check_values and (not bool(torch.isfinite(bt).all()) or bool((bt <= 0).any())):
        raise ValueError(f"{fn}: bandwidth: expected finite values > 0, got {bandwidth!r}")
    try:
        if bt.dim() > len(lead):
            raise RuntimeError
        return bt.expand(lead)
    except RuntimeError:
        raise ValueError(
            f"{fn}: bandwidth: expected a number or a shape broadcastable to the leading dims "
            f"{tuple(lead)} of zq, got {tuple(bt.shape)}"
        ) from None


def transform(*xs) -> str | None:
    """Which ``torch.func`` transform (or forward-mode AD) sees these tensors: ``"vmap"``,
    ``"grad"`` (grad, vjp, jacrev, jvp, jacfwd, hessian: tensors wrapped by functorch),
    ``"forward-mode AD"`` (dual tensors of ``torch.autograd.forward_ad``) or ``None``."""
    ft = getattr(torch._C, "_functorch", None)
    tensors = [x for x in xs if isinstance(x, Tensor)]
    if ft is not None:
        for x in tensors:
            if ft.is_batchedtensor(x):
                return "vmap"
        for x in tensors:
            if ft.is_functorch_wrapped_tensor(x):
                return "grad"
    if getattr(forward_ad, "_current_level", 0) >= 0:  # inside a dual_level(): duals?
        for x in tensors:
            if forward_ad.unpack_dual(x).tangent is not None:
                return "forward-mode AD"
    return None


def scales(
    fn: str, zq: Tensor, zk: Tensor, v: Tensor, w: Tensor | None, b: Tensor | None = None
) -> _scale.Scales:
    """Check that the scores and values are finite (a ``ValueError`` naming ``zq``, ``zk`` or
    ``v``) and return the per-row power-of-two scales of the call (:mod:`._scale`).  Inputs
    are rows: ``zq (R, N_q)``, ``zk (R, N_k)``, ``v (R, N_k, D)``, ``w (R, N_k)``, ``b (R, 1)``
    (the bump's bandwidth: scaled with the scores, and part of their magnitude)."""
    R = zq.shape[0]
    mq, mk = _scale.row_maxabs(zq, R), _scale.row_maxabs(zk, R)
    for name, x, m in (("zq", zq, mq), ("zk", zk, mk)):
        if not bool(torch.isfinite(m).all()):
            n_bad = int((~torch.isfinite(x)).sum())
            raise ValueError(f"{fn}: {name}: expected finite scores, found {n_bad} NaN/inf entries")
    ok, ev = _scale.value_exponents(v, R)
    if not ok:
        n_bad = int((~torch.isfinite(v)).sum())
        raise ValueError(f"{fn}: v: expected finite values, found {n_bad} NaN/inf entries")
    m = torch.maximum(mq, mk)
    if b is not None:
        m = torch.maximum(m, b.detach().reshape(R))
    L = _scale.BAND[zq.dtype]
    ez = _scale.exponents(m)
    ew = None
    if w is not None:
        ew = _scale.exponents(w.reshape(R, -1).amax(1))
        flags = torch.stack([((ez < -L) | (ez > L)).any(), ((ew < -L) | (ew > L)).any()])
        fz, fw = flags.tolist()
        ew = ew if fw else None
    else:
        fz = bool(((ez < -L) | (ez > L)).any())
    return _scale.Scales(ez if fz else None, ev, ew)
