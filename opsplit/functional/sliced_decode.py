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
differs; the scalar sums are accumulated in float64 as there).  Differentiable by autograd.
A query whose denominator vanishes gets 0.  As there, rows of extreme magnitude are
rescaled by powers of two (:mod:`~opsplit.functional._scale`; eq. 7 needs none: its kernel
values are at most 1).

A sub-linear step would keep the cached keys sorted with prefix sums of :math:`w v` and
:math:`w z v` (a query is then one binary search and two table reads, Prop. 2.1), but every
append would shift those tables (:math:`O(n D)`) unless they live in a balanced tree; opsplit
does not implement that.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from ._scale import BAND, exponents, ldexp, row_maxabs

__all__ = ["decode_sliced_relu_attention", "decode_sliced_relu_bump_attention"]


def _pow2_scales(zq: Tensor, zk: Tensor, v: Tensor):
    """Per leading index, the powers of two that bring the largest |score| and |value| to
    [1/2, 1) (``None`` for an input whose every row lies inside the band of
    :mod:`~opsplit.functional._scale`): eq. 2/3 are of degree 0 in the scores and 1 in the
    values, so ``o(z 2^-ez, v 2^-ev) 2^ev = o(z, v)`` exactly, and in float32 the products
    ``ReLU(q - z) v`` no longer overflow (1e19) or underflow (1e-30).  The exponents are
    constants for autograd (the formula is exactly homogeneous)."""
    lead = zq.shape[:-1]
    R = math.prod(lead)
    if R == 0 or zk.shape[-1] == 0 or v.shape[-1] == 0:
        return None, None
    with torch.no_grad():
        ez = exponents(torch.maximum(row_maxabs(zq.detach(), R), row_maxabs(zk.detach(), R)))
        ev = exponents(row_maxabs(v.detach(), R).nan_to_num(0.0, 0.0, 0.0))
        L = BAND[zq.dtype]
        out = torch.stack([((ez < -L) | (ez > L)).any(), ((ev < -L) | (ev > L)).any()]).tolist()
    shape = (*lead, 1)
    return (ez.view(shape) if out[0] else None), (ev.view(*shape, 1) if out[1] else None)


def _visible(zq: Tensor, zk: Tensor, key_weights: Tensor | None) -> Tensor:
    """``(..., N_q, N_k)`` weights :math:`w_l [l \\le t_i]` (float64)."""
    Nq, Nk = zq.shape[-1], zk.shape[-1]
    vis = torch.ones(Nq, Nk, dtype=torch.float64, device=zq.device).tril_(Nk - Nq)
    if key_weights is None:
        return vis
    return vis * key_weights.detach().to(torch.float64).unsqueeze(-2)


def decode_sliced_relu_attention(zq: Tensor, zk: Tensor, v: Tensor, *, centered: bool = True,
                                 key_weights: Tensor | None = None) -> Tensor:
    """Eq. 3 (eq. 2 with ``centered=False``) for the last ``N_q`` of ``N_k`` positions:
    ``zq`` ``(..., N_q)``, ``zk`` ``(..., N_k)``, ``v`` ``(..., N_k, D)`` -> ``(..., N_q, D)``."""
    ez, ev = _pow2_scales(zq, zk, v)
    if ez is not None:
        zq, zk = ldexp(zq, -ez), ldexp(zk, -ez)
    if ev is not None:
        return ldexp(decode_sliced_relu_attention(zq, zk, ldexp(v, -ev), centered=centered,
                                                  key_weights=key_weights), ev)
    W = _visible(zq, zk, key_weights)
    d = zq.unsqueeze(-1) - zk.unsqueeze(-2)  # (..., N_q, N_k)
    K = torch.relu(d) * W.to(d.dtype)
    den = (d.abs().double() * W).sum(-1, keepdim=True)
    num = K @ v
    if centered:
        mass = W.sum(-1, keepdim=True)
        vbar = (W.to(v.dtype) @ v) / torch.where(mass > 0, mass, torch.ones_like(mass)).to(v.dtype)
        num = num - K.sum(-1, keepdim=True, dtype=torch.float64).to(v.dtype) * vbar
    ok = den > 0
    return torch.where(ok, num / torch.where(ok, den, torch.ones_like(den)).to(num.dtype), torch.zeros_like(num))


def decode_sliced_relu_bump_attention(zq: Tensor, zk: Tensor, v: Tensor, bandwidth: Tensor, *,
                                      key_weights: Tensor | None = None) -> Tensor:
    """Eq. 7 for the last ``N_q`` of ``N_k`` positions; ``bandwidth`` broadcastable to the
    leading dims of ``zq`` (e.g. ``(H,)`` for ``(B, H, N_q)``)."""
    W = _visible(zq, zk, key_weights)
    b = torch.as_tensor(bandwidth, dtype=zq.dtype, device=zq.device)
    b = b.reshape(*b.shape, 1, 1) if b.dim() else b
    d = zq.unsqueeze(-1) - zk.unsqueeze(-2)
    K = torch.relu(1 - d.abs() / b) * W.to(d.dtype)
    mass = W.sum(-1, keepdim=True)
    return (K @ v) / torch.where(mass > 0, mass, torch.ones_like(mass)).to(v.dtype)
