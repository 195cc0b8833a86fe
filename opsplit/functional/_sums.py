r"""Differentiable sliced sums: the two primitives of paper 004's eq. (6), each with a
backward pass written with the other, so that derivatives of every order exist.

For rows of query scores :math:`q_i` (``(R, M)``), key scores :math:`k_j` (``(R, N)``) and
key vectors :math:`\gamma_j` (``(R, N, D)``):

.. math::

    \mathrm{relu\_sum}(q, k, \gamma)_i &= \sum_j \mathrm{ReLU}(q_i - k_j)\,\gamma_j
        = q_i A_{p_i} - B_{p_i}                                   \qquad\text{(eq. 6)}\\
    \mathrm{step\_sum}(q, k, \gamma)_i &= \sum_j \mathbf 1[q_i > k_j]\,\gamma_j = A_{p_i}

with :math:`p_i = \#\{j : k_j < q_i\}` (ranks decided on the exact values) and the
exclusive prefix sums :math:`A_p = \sum_{j<p}\gamma_j`, :math:`B_p = \sum_{j<p} k_j\gamma_j`
over the sorted keys.  Both are written with plain torch operations (``sort``,
``searchsorted``, ``gather``, ``cumsum``), so autograd differentiates them to any order:
the ranks :math:`p_i` are piecewise constant (no derivative), so the derivatives are the
exact ones with the conventions of ``torch.relu`` (:math:`\mathrm{ReLU}'(0) = 0`,
:math:`\mathrm{ReLU}'' = 0`; a key tied with a query contributes nothing, as in the naive
formula).  Both are :math:`O((M + N)\log N + (M + N) D)`, never form an
:math:`M \times N` tensor and have no data-dependent Python control flow (so they also run
under ``torch.compile(fullgraph=True)``, ``torch.jit.trace`` and ``torch.func.vmap``).

They are the *differentiable* path of the sliced attentions: the fast kernels of
:mod:`opsplit.functional.sliced` have a hand-written first-order backward pass; when that
backward pass is itself differentiated (``create_graph=True``: Hessian-vector products,
gradient penalties) it recomputes the attention as a composition of these primitives
(:func:`relu_attention_composed`, :func:`bump_attention_composed`) and differentiates that;
and under ``torch.compile``, ``torch.jit.trace`` and ``vmap`` the composition is the whole
kernel.  Prefix sums, and everything after them, are computed in float64; the result is
rounded to the inputs' dtype once, at the end.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ._scale import heaviest

__all__ = ["relu_sum", "step_sum", "relu_attention_composed", "bump_attention_composed"]


def _eval(q: Tensor, k: Tensor, gamma: Tensor, relu: bool, shift_weights: Tensor | None = None) -> Tensor:
    R, N = k.shape
    M, D = q.shape[1], gamma.shape[2]
    ks, order = torch.sort(k, dim=1)
    # keys strictly below each query, decided on the exact (unshifted) values
    p = torch.searchsorted(ks, q.contiguous(), side="left")
    gs = gamma.gather(1, order.unsqueeze(-1).expand(R, N, D)).double()
    idx = p.unsqueeze(-1).expand(R, M, D)
    A = torch.nn.functional.pad(torch.cumsum(gs, 1), (0, 0, 1, 0))
    Ap = A.gather(1, idx)
    if not relu:
        return Ap
    # shift the scores (the sum is shift-invariant) by the median key, or by the median of the
    # heaviest keys of ``shift_weights`` (opsplit.functional._scale.heaviest): prefix sums of
    # the size of the result
    if shift_weights is None:
        mid = (N - 1) // 2
        c = ks[:, mid : mid + 1].double()
    else:
        c = ks.gather(1, heaviest(shift_weights.detach().gather(1, order))).double()
    kc = (ks.double() - c).unsqueeze(-1)
    B = torch.nn.functional.pad(torch.cumsum(kc * gs, 1), (0, 0, 1, 0))
    qc = (q.double() - c).unsqueeze(-1)
    return qc * Ap - B.gather(1, idx)


def relu_sum(q: Tensor, k: Tensor, gamma: Tensor, shift_weights: Tensor | None = None) -> Tensor:
    r""":math:`\sum_j \mathrm{ReLU}(q_i - k_j)\gamma_j`; ``q (R, M)``, ``k (R, N)`` (``N >= 1``),
    ``gamma (R, N, D)`` -> ``(R, M, D)`` in float64 (products of scores and values of
    float32 inputs overflow or underflow float32 at magnitudes the inputs represent);
    differentiable to any order by autograd.  ``shift_weights`` ``(R, N)``: the key weights
    inside ``gamma``; the tables are then shifted by the heaviest keys' score (the rounding
    stays a multiple of :math:`\sum_j w_j |q_i - k_j|`, also where a heavy key ties the query)."""
    return _eval(q, k, gamma, relu=True, shift_weights=shift_weights)


def step_sum(q: Tensor, k: Tensor, gamma: Tensor) -> Tensor:
    r""":math:`\sum_j \mathbf 1[q_i > k_j]\gamma_j`; shapes as :func:`relu_sum`."""
    return _eval(q, k, gamma, relu=False)


def _safe_div(num: Tensor, den: Tensor) -> Tensor:
    nz = den != 0
    return torch.where(nz, num / torch.where(nz, den, torch.ones_like(den)), torch.zeros_like(num))


def _weights(k: Tensor, w: Tensor | None) -> Tensor:
    """The key weights divided by a power of two near their row maximum (the outputs are of
    degree 0 in them), in float64: weights of 1e-300 or 1e300 neither underflow nor overflow
    the sums, and float32 weights spread over 1e-38 .. 3e38 keep the light ones (which carry
    eq. 2's denominator where the heavy keys tie the query).  Plain torch operations, no
    data-dependent control flow."""
    if w is None:
        return torch.ones_like(k, dtype=torch.float64)
    w = w.to(k.dtype)
    m = w.detach().amax(-1, keepdim=True).double()
    e = torch.where(m > 0, torch.floor(torch.log2(m)), torch.zeros_like(m)).clamp(-1000, 1000)
    return w.double() * torch.exp2(-e)


def _mean(v: Tensor, w: Tensor, dtype: torch.dtype | None = None) -> Tensor:
    """The ``w``-weighted mean of ``v`` over its keys, accumulated in float64, returned in
    ``dtype`` (default ``v``'s)."""
    W = w.sum(1, keepdim=True, dtype=torch.float64)  # (R, 1)
    s = (w.unsqueeze(-1) * v).sum(1, dtype=torch.float64)
    return _safe_div(s, W).to(v.dtype if dtype is None else dtype)  # (R, D)


def relu_attention_composed(q: Tensor, k: Tensor, v: Tensor, w: Tensor | None,
                            centered: bool) -> Tensor:
    r"""Paper 004 eq. (3) (eq. (2) if not ``centered``) on rows, as a composition of
    :func:`relu_sum` (differentiable to any order):
    :math:`o_i = \sum_j w_j\mathrm{ReLU}(q_i - k_j)(v_j - \bar v) / \sum_l w_l |q_i - k_l|`,
    with :math:`|t| = \mathrm{ReLU}(t) + \mathrm{ReLU}(-t)` (so :math:`|\cdot|'(0) = 0`, as
    ``torch.abs``) and 0 where the denominator vanishes.  ``q (R, M)``, ``k (R, N)``,
    ``v (R, N, D)``, ``w (R, N)`` or ``None``."""
    wk = _weights(k, w)
    # eq. 3 centres in float64 (the sums below are float64): a mean rounded to v's dtype would
    # leave a remainder of up to half an ulp of |v|, all of the result at large value means
    vc = v.double() - _mean(v, wk, torch.float64).unsqueeze(1) if centered else v
    sw = None if w is None else wk
    num = relu_sum(q, k, wk.unsqueeze(-1) * vc, sw)
    ws = wk.unsqueeze(-1)
    den = relu_sum(q, k, ws, sw) + relu_sum(-q, -k, ws, sw)  # (R, M, 1)
    return _safe_div(num, den).to(v.dtype)


def bump_attention_composed(q: Tensor, k: Tensor, v: Tensor, w: Tensor | None,
                            b: Tensor) -> Tensor:
    r"""Paper 004 eq. (7) on rows, as a composition of :func:`relu_sum`:
    :math:`o_i = \frac{1}{\sum_l w_l}\sum_j w_j\,\mathrm{hat}_b(q_i - k_j)\, v_j` with

    .. math::  b\,\mathrm{hat}_b(t) = \mathrm{ReLU}(b + t) + \mathrm{ReLU}(b - t) - |t| - b

    (:math:`= b\,\mathrm{ReLU}(1 - |t|/b)`; in this form the derivatives at :math:`t = 0`
    and :math:`|t| = b` follow the conventions of ``torch.relu``/``torch.abs`` applied to
    :math:`\mathrm{ReLU}(1 - |t|/b)`, i.e. 0 there).  ``b (R, 1)``."""
    wk = _weights(k, w)
    W = wk.sum(1, keepdim=True, dtype=torch.float64)  # (R, 1)
    m = _mean(v, wk)  # centre the values: smaller prefix sums, m enters with the kernel mass
    gam = torch.cat([wk.unsqueeze(-1) * (v - m.unsqueeze(1)), wk.unsqueeze(-1)], dim=-1)
    b64 = b.double()
    s = (relu_sum(q + b, k, gam) + relu_sum(b - q, -k, gam)
         - relu_sum(q, k, gam) - relu_sum(-q, -k, gam)
         - b64.unsqueeze(-1) * gam.sum(1, keepdim=True, dtype=torch.float64))
    # s = b * sum_j hat(q_i - k_j) gamma_j
    D = v.shape[-1]
    out = s[..., :D] + s[..., D:] * m.double().unsqueeze(1)
    return _safe_div(out, (b64 * W).unsqueeze(-1)).to(v.dtype)
