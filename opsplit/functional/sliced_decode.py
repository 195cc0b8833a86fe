r"""Decode steps of causal sliced attention: the last :math:`N_q` queries of a sequence
against all :math:`N_k` keys (a key/value cache), by direct sums in :math:`O(N_q N_k D)`.

Generation appends :math:`N_q = 1` token to :math:`n` cached ones.  The causal sums of
:mod:`opsplit.functional.sliced_causal` for that one query (bottom-right alignment: query
:math:`i` sees the keys :math:`l \le t_i = i + N_k - N_q`) are

.. math::

    o_i = \frac{\sum_{j \le t_i} w_j\,\mathrm{ReLU}(z^q_i - z^k_j)\,(v_j - \bar v_i)}
               {\sum_{l \le t_i} w_l\,|z^q_i - z^k_l|}\quad\text{(eq. 3; eq. 2 without } \bar v_i),
    \qquad
    o_i = \frac{1}{\sum_{l \le t_i} w_l}\sum_{j \le t_i} w_j\,
        \mathrm{ReLU}\Big(1 - \frac{|z^q_i - z^k_j|}{b}\Big) v_j \quad\text{(eq. 7)},

and for one query they are plain sums over the :math:`n` cached keys: :math:`O(n\,D)` per head,
against :math:`O(n \log^2 n)` for the divide and conquer over all positions (which would
re-sort the whole prefix at every step).  The same formulas, so the results equal those of
:func:`~opsplit.functional.causal_sliced_relu_attention` to rounding (the summation order
differs; eqs. 2-3 are summed in float64 from the scores as given, the result rounded once).  Differentiable by autograd.
A query whose denominator vanishes gets 0.  As there, rows of extreme magnitude are
rescaled by powers of two (:mod:`~opsplit.functional._scale`): the scores (with the
bump's bandwidth) and the values per row, and the key weights per *query*, by the largest
weight it sees (a query's output is of degree 0 in its weights; float32 weights spread over
1e-30 .. 1e30, or float64 over 1e-300 .. 1e300, keep their ratios where they matter).  Eq. 7
needs the values rescaled too: its kernel values are at most 1, but a sum of 300 values of
3e38 overflows float32.  The inputs are checked first (types, shapes, finite scores and
values, key weights, bandwidth), each error naming the argument.

These direct sums are the differentiable decode (a :class:`~opsplit.operators.KVCache` uses
them under autograd, with concatenated scores and values) and the reference of the
sub-linear one: :class:`~opsplit.functional.sliced_runs.SlicedDecodeCache` keeps the cached
keys as sorted runs with prefix tables (the logarithmic method), :math:`O(D \log^2 n)` per
step, which generation uses.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from ._inputs import bandwidth_rows, check_centered, check_scores_values
from ._inputs import key_weights as combine_key_weights
from ._scale import BAND, exponents, ldexp, row_maxabs

__all__ = ["decode_sliced_relu_attention", "decode_sliced_relu_bump_attention"]


def _check(fn: str, zq, zk, v, key_weights, bandwidth=None):
    """Metadata and value checks of a decode call; returns the combined key weights (or
    ``None``) and the bandwidth as a tensor of the leading dims (or ``None``)."""
    check_scores_values(fn, zq, zk, v)
    w = combine_key_weights(fn, None, key_weights, zk.shape, zk.dtype, zk.device)
    b = None if bandwidth is None else bandwidth_rows(fn, bandwidth, zq.shape[:-1], zq.dtype, zq.device)
    for name, x, what in (("zq", zq, "scores"), ("zk", zk, "scores"), ("v", v, "values")):
        if x.numel() and not bool(torch.isfinite(x.detach().sum())) and not bool(torch.isfinite(x).all()):
            n_bad = int((~torch.isfinite(x)).sum())
            raise ValueError(f"{fn}: {name}: expected finite {what}, found {n_bad} NaN/inf entries")
    return w, b


def _pow2_scales(zq: Tensor, zk: Tensor, v: Tensor, b: Tensor | None = None):
    """Per leading index, the powers of two that bring the largest |score| (and bandwidth)
    and |value| to [1/2, 1) (``None`` for an input whose every row lies inside the band of
    :mod:`~opsplit.functional._scale`): eqs. 2/3 are of degree 0 in the scores and eq. 7
    depends on (z^q - z^k)/b only, and all are of degree 1 in the values, so ``o(z 2^-ez,
    v 2^-ev; b 2^-ez) 2^ev = o(z, v; b)`` exactly, and in float32 the products
    ``ReLU(q - z) v`` no longer overflow (1e19) or underflow (1e-30), nor the sums of eq. 7.
    The exponents are constants for autograd (the formulas are exactly homogeneous)."""
    lead = zq.shape[:-1]
    R = math.prod(lead)
    if R == 0 or zk.shape[-1] == 0 or v.shape[-1] == 0:
        return None, None
    with torch.no_grad():
        m = torch.maximum(row_maxabs(zq.detach(), R), row_maxabs(zk.detach(), R))
        if b is not None:
            m = torch.maximum(m, b.detach().reshape(R))
        ez = exponents(m)
        ev = exponents(row_maxabs(v.detach(), R))
        L = BAND[zq.dtype]
        out = torch.stack([((ez < -L) | (ez > L)).any(), ((ev < -L) | (ev > L)).any()]).tolist()
    shape = (*lead, 1)
    return (ez.view(shape) if out[0] else None), (ev.view(*shape, 1) if out[1] else None)


def _visible(zq: Tensor, zk: Tensor, key_weights: Tensor | None) -> Tensor:
    """``(..., N_q, N_k)`` weights :math:`w_l [l \\le t_i]` (float64), each query's divided by
    a power of two near the largest weight it sees (module docstring)."""
    Nq, Nk = zq.shape[-1], zk.shape[-1]
    vis = torch.ones(Nq, Nk, dtype=torch.float64, device=zq.device).tril_(Nk - Nq)
    if key_weights is None:
        return vis
    W = vis * key_weights.detach().to(torch.float64).unsqueeze(-2)
    if W.numel() == 0:
        return W
    return ldexp(W, -exponents(W.amax(-1, keepdim=True)))


def decode_sliced_relu_attention(zq: Tensor, zk: Tensor, v: Tensor, *, centered: bool = True,
                                 key_weights: Tensor | None = None) -> Tensor:
    """Eq. 3 (eq. 2 with ``centered=False``) for the last ``N_q`` of ``N_k`` positions:
    ``zq`` ``(..., N_q)``, ``zk`` ``(..., N_k)``, ``v`` ``(..., N_k, D)`` -> ``(..., N_q, D)``;
    ``key_weights`` (:math:`w_l \\ge 0`) broadcastable to ``zk``."""
    fn = "decode_sliced_relu_attention"
    centered = check_centered(fn, centered)
    w, _ = _check(fn, zq, zk, v, key_weights)
    ez, ev = _pow2_scales(zq, zk, v)
    if ez is not None:
        zq, zk = ldexp(zq, -ez), ldexp(zk, -ez)
    if ev is not None:
        v = ldexp(v, -ev)
    W = _visible(zq, zk, w)
    # in float64 from the scores as given (float32 differences are exact there): a query's
    # weights are divided by the largest it sees, and a light key may carry the whole
    # denominator when the heavy ones tie the query (float32 weights 1e-30 and 1e30: the light
    # key's kernel underflowed float32 and the float64 denominator rounded to 0 in float32, NaN)
    d = zq.double().unsqueeze(-1) - zk.double().unsqueeze(-2)  # (..., N_q, N_k)
    K = torch.relu(d) * W
    den = (d.abs() * W).sum(-1, keepdim=True)
    v64 = v.double()
    num = K @ v64
    if centered:
        mass = W.sum(-1, keepdim=True)
        vbar = (W @ v64) / torch.where(mass > 0, mass, torch.ones_like(mass))
        num = num - K.sum(-1, keepdim=True) * vbar
    ok = den > 0
    out = torch.where(ok, num / torch.where(ok, den, torch.ones_like(den)), torch.zeros_like(num)).to(v.dtype)
    return out if ev is None else ldexp(out, ev)


def decode_sliced_relu_bump_attention(zq: Tensor, zk: Tensor, v: Tensor, bandwidth, *,
                                      key_weights: Tensor | None = None) -> Tensor:
    """Eq. 7 for the last ``N_q`` of ``N_k`` positions; ``bandwidth`` :math:`b > 0` a number
    or a tensor broadcastable to the leading dims of ``zq`` (e.g. ``(H,)`` for
    ``(B, H, N_q)``)."""
    fn = "decode_sliced_relu_bump_attention"
    w, b = _check(fn, zq, zk, v, key_weights, bandwidth)
    ez, ev = _pow2_scales(zq, zk, v, b)
    if ez is not None:
        zq, zk, b = ldexp(zq, -ez), ldexp(zk, -ez), ldexp(b, -ez.squeeze(-1))
    if ev is not None:
        v = ldexp(v, -ev)
    W = _visible(zq, zk, w)
    b = b.reshape(*b.shape, 1, 1)
    d = zq.unsqueeze(-1) - zk.unsqueeze(-2)
    K = torch.relu(1 - d.abs() / b) * W.to(d.dtype)
    mass = W.sum(-1, keepdim=True)
    out = (K @ v) / torch.where(mass > 0, mass, torch.ones_like(mass)).to(v.dtype)
    return out if ev is None else ldexp(out, ev)
