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
A query whose denominator vanishes gets 0.

A sub-linear step would keep the cached keys sorted with prefix sums of :math:`w v` and
:math:`w z v` (a query is then one binary search and two table reads, Prop. 2.1), but every
append would shift those tables (:math:`O(n D)`) unless they live in a balanced tree; opsplit
does not implement that.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["decode_sliced_relu_attention", "decode_sliced_relu_bump_attention"]


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
