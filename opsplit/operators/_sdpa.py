r"""Softmax attention by ``torch.nn.functional.scaled_dot_product_attention``, guarded
against scores that overflow the dtype.

SDPA subtracts the row maximum before exponentiating, so any *finite* scores give a finite
result; but the scores :math:`s\,\langle q_i, k_j\rangle` themselves are formed in the
input's dtype, and for finite inputs of large magnitude (float32 near :math:`10^{19}`,
float64 near :math:`10^{154}`) they overflow to :math:`\pm\infty` and the softmax returns
NaN.  :func:`attention` bounds the scores first, by
:math:`|s\,\langle q_i, k_j\rangle| \le s\, d\, \max|q| \max|k|` (two reductions, no
:math:`N^2` work): when the bound is below a quarter of the dtype's largest number (row
differences of scores stay finite too) SDPA runs as is; otherwise a float32 call is
evaluated in float64 (where the scores fit) and rounded back, and a float64 call whose
scores may overflow raises a ``ValueError`` that says so.  The bound is a value check: it
is skipped under ``torch.compile`` / ``torch.jit`` tracing (:func:`opsplit._checks.skip_value_checks`)
and under ``torch.func.vmap`` (a parallel scheme's batched call); there a zero that is NaN
when :math:`q` or :math:`k` holds a NaN/inf is added to the output (torch's fused CPU kernel
returns zeros for NaN scores, which no later check would see).  A caller that already
knows :math:`\max|q|` and :math:`\max|k|` (a decode step: the key/value cache keeps the
maximum of its keys, :mod:`opsplit.operators.kv_cache`) passes the bound,
:func:`bound_from`, and no reduction over the keys is made.

Which SDPA implementation runs (3-D: the math path, differentiable to any order; 4-D:
torch's fused kernel) is chosen by :func:`opsplit.functional._sdpa_path.sdpa`, the same on
every torch version.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from .._checks import skip_value_checks
from ..functional._sdpa_path import sdpa as _sdpa

__all__ = ["attention", "score_bound", "bound_from", "max_abs", "check_scores", "values_unchecked", "nan_carrier"]


def values_unchecked(*xs) -> bool:
    """Value checks are skipped under torch.compile / torch.jit and torch.func.vmap."""
    f = getattr(getattr(torch._C, "_functorch", None), "is_batchedtensor", None)
    return skip_value_checks() or (f is not None and any(f(x) for x in xs))


#: up to this many entries in all, :func:`max_abs` reduces ``|x|`` (one reduction per tensor)
_SMALL_MAX_ABS = 1 << 16


def _memory_order(x: Tensor) -> Tensor:
    """``x`` with its dimensions permuted into memory order (outermost stride first; the
    heads ``(B, H, N, d)`` of a token-major ``(B, N, H, d)`` tensor back to token-major),
    where a full reduction runs several times faster than over the permuted strides."""
    if x.is_contiguous():
        return x
    return x.permute(sorted(range(x.dim()), key=lambda i: -x.stride(i)))


def max_abs(*xs: Tensor) -> list[float]:
    """:math:`\\max|x|` of each (non-empty) tensor, as floats, from one host transfer.

    :math:`\\max|x| = \\max(\\max x, -\\min x)`: two plain reductions over ``x`` in memory
    order (no copy ``|x|``; max and min are exact, so the order does not matter); small
    inputs (a decode step, a short sequence), where the number of calls costs more than the
    copy, as ``x.abs().amax()``.  A NaN in ``x`` gives NaN either way."""
    dtype = xs[0].dtype
    if sum(x.numel() for x in xs) <= _SMALL_MAX_ABS:  # small (a decode step): fewer calls, |x| is cheap
        m = [x.detach().abs().amax() for x in xs]
        return torch.stack([v if v.dtype == dtype else v.to(dtype) for v in m]).tolist()
    parts = []
    for x in xs:
        x = _memory_order(x.detach())
        parts += [x.amax(), x.amin()]
    m = torch.stack([p if p.dtype == dtype else p.to(dtype) for p in parts]).tolist()  # in the first one's dtype
    out = []
    for hi, lo in zip(m[0::2], m[1::2]):
        out.append(math.nan if hi != hi or lo != lo else max(hi, -lo))
    return out


def score_bound(q: Tensor, k: Tensor, scale: float) -> float:
    """An upper bound of :math:`|s\\,\\langle q_i, k_j\\rangle|` over all pairs (a float)."""
    if q.numel() == 0 or k.numel() == 0:
        return 0.0
    mq, mk = max_abs(q, k)
    return bound_from(mq, mk, q.shape[-1], scale)


def bound_from(q_max: float, k_max: float, d: int, scale: float) -> float:
    """:math:`s\\,d\\,\\max|q|\\max|k|`, the bound of :func:`score_bound` from the two maxima."""
    return float(scale) * d * q_max * k_max


def attention(q: Tensor, k: Tensor, v: Tensor, *, scale: float, name: str,
              attn_mask: Tensor | None = None, dropout_p: float = 0.0,
              is_causal: bool = False, enable_gqa: bool = False, bound: float | None = None) -> Tensor:
    """``F.scaled_dot_product_attention(q, k, v, attn_mask, dropout_p, is_causal, scale,
    enable_gqa)`` with the overflow guard of the module docstring; ``name`` names the caller
    in errors; ``bound``: :func:`score_bound` of ``q, k`` when the caller has it."""
    if not values_unchecked(q, k):
        if bound is None:
            bound = score_bound(q, k, scale)
        if not bound < torch.finfo(q.dtype).max / 4:
            if q.dtype == torch.float32 and bound < torch.finfo(torch.float64).max / 4:
                mask = attn_mask.double() if attn_mask is not None and attn_mask.is_floating_point() else attn_mask
                out = _sdpa(q.double(), k.double(), v.double(), mask, dropout_p, is_causal,
                            scale, enable_gqa)
                return out.to(v.dtype)
            raise ValueError(
                f"{name}: the attention scores s*<q, k> may reach "
                f"{bound:.3g}".replace("inf", "more than 1.8e308") + ", beyond the range "
                f"of {q.dtype} (max {torch.finfo(q.dtype).max:.3g}): the softmax would be NaN; "
                f"scale the input (or the weights) down"
                + (", or use float64" if q.dtype != torch.float64 else "")
            )
        return _sdpa(q, k, v, attn_mask, dropout_p, is_causal, scale, enable_gqa)
    out = _sdpa(q, k, v, attn_mask, dropout_p, is_causal, scale, enable_gqa)
    return out + nan_carrier(q, k)


def nan_carrier(*xs: Tensor) -> Tensor:
    """A zero that is NaN when any of ``xs`` holds a NaN or an inf: ``sum(max x * 0 + min x * 0)``
    (no overflow: each term is 0 or NaN).  Added to the output where the values cannot be read
    (``torch.func.vmap``, ``torch.compile``): torch's fused CPU kernel returns finite values
    (zeros) for NaN scores, which would hide a NaN weight (one written through ``.data``) or an
    overflowed state from every later check; with it the caller's output check sees them."""
    z = None
    for x in xs:
        if x.numel():
            t = x.amax() * 0 + x.amin() * 0
            z = t if z is None else z + t
    return z if z is not None else xs[0].new_zeros(())


def check_scores(a: Tensor, name: str) -> Tensor:
    """Raise a ``ValueError`` if dense scores ``a`` (before the softmax) overflowed."""
    if not values_unchecked(a) and a.numel() and bool(torch.isposinf(a).any() | torch.isnan(a).any()):
        raise ValueError(
            f"{name}: the attention scores overflow {a.dtype} (finite inputs of too large a "
            f"magnitude): the softmax would be NaN; scale the input (or the weights) down"
            + (", or use float64" if a.dtype != torch.float64 else "")
        )
    return a
