r"""Power-of-two rescaling of the sliced attentions' rows: the kernels are exact at every
magnitude their dtype represents (issue 17).

The sliced kernels are homogeneous.  With scores (and the bump's bandwidth) scaled by
:math:`\sigma > 0`, values by :math:`\tau > 0` and key weights by :math:`\omega > 0`,

.. math::  o(\sigma z^q, \sigma z^k, \tau v, \omega w; \sigma b) = \tau\, o(z^q, z^k, v, w; b)

exactly: :math:`\mathrm{ReLU}(z^q_i - z^k_j)` and :math:`|z^q_i - z^k_l|` are of degree 1 in
the scores (eqs. 2, 3: their ratio is of degree 0), the bump kernel depends on
:math:`(z^q_i - z^k_j)/b` only (eq. 7), the output is linear in the values and the weights
are normalised away.  With :math:`\sigma, \tau, \omega` powers of two the rescaling itself is
exact in floating point (an entry loses bits only where it falls below the smallest normal
number, i.e. more than :math:`2^{-125}` below its row's largest entry, where it is far below
the rounding of the result).

The prefix tables multiply scores by values (eq. 6: :math:`B_p = \sum_{j<p} z_j v_j`); in
float32 scores and values of size 1e19 overflow there and sizes 1e-30 underflow to 0 (an
O(1) error).  So every row (batch x head) whose largest score, value or weight lies outside
:math:`[2^{-L}, 2^{L}]` (:data:`BAND`) is rescaled by its own powers of two to
:math:`[\tfrac12, 1)` before the tables are built, and the output is scaled back.  The
backward pass does the same with the incoming gradient and scales the input gradients
back; the chain rule through the constant scales is exact because the kernels are exactly
homogeneous.  Rows inside the band are left as they are: the common case costs one
reduction per input, which is also the finiteness check, and no rescaling.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

__all__ = [
    "BAND",
    "Scales",
    "ldexp",
    "row_maxabs",
    "exponents",
    "value_exponents",
    "grad_exponents",
]

#: rows whose largest |score|, |value| or weight lies in [2^-L, 2^L] are not rescaled: in
#: that band the products of the prefix tables (<= 2^2L N) and their smallest significant
#: terms (>= 2^-2L) stay far from the dtype's range (2^+-126 in float32)
BAND = {torch.float32: 32, torch.float64: 256}
#: exponents e for which 2^e is a normal number of the dtype (one factor in :func:`ldexp`)
_ONE_FACTOR = {torch.float32: 125, torch.float64: 1021}


def exponents(m: Tensor) -> Tensor:
    """int64 exponents ``e`` of non-negative finite row maxima ``m``: ``m 2^-e`` lies in
    ``[1/2, 1)``; ``e = 0`` where ``m = 0``."""
    return torch.frexp(m)[1].to(torch.int64)


def _out_of_band(e: Tensor, dtype) -> bool:
    L = BAND[dtype]
    return bool(((e < -L) | (e > L)).any())


def ldexp(x: Tensor, e: Tensor | None) -> Tensor:
    """``x * 2^e`` exactly (``e``: integer tensor broadcastable to ``x``; ``None``: ``x``).
    Two factors, each inside the dtype's normal range, so that no factor overflows where
    the product does not."""
    if e is None:
        return x
    if not bool((e.abs() > _ONE_FACTOR[x.dtype]).any()):  # 2^e itself is a normal number
        return x * torch.exp2(e.double()).to(x.dtype)
    e1 = torch.div(e, 2, rounding_mode="floor")
    f1 = torch.exp2(e1.double()).to(x.dtype)
    f2 = torch.exp2((e - e1).double()).to(x.dtype)
    return x * f1 * f2


def row_maxabs(x: Tensor, R: int) -> Tensor:
    """``max |x|`` of each of the ``R`` rows of ``x`` (NaN where a row holds NaN)."""
    xr = x.reshape(R, -1)
    if xr.shape[1] == 0:
        return x.new_zeros(R)
    return torch.maximum(xr.amax(1), -xr.amin(1))


def _norm_in_band(xr: Tensor) -> bool:
    """True when every row's 2-norm shows its max |x| inside the band (and finite): one
    fused reduction.  False says only that the exact maxima must be looked at."""
    n = xr.shape[1]
    L = BAND[xr.dtype]
    nrm = torch.linalg.vector_norm(xr, dim=1)
    return bool(((nrm <= 2.0**L) & (nrm >= 2.0**-L * math.sqrt(n))).all())


def value_exponents(v: Tensor, R: int) -> tuple[bool, Tensor | None]:
    """``(finite, e)`` for the values ``v`` (``R`` rows): whether every entry is finite, and
    the per-row exponents of max |v| when some row lies outside the band (else ``None``).
    One 2-norm per row decides the common case (max |v| <= norm <= sqrt(n) max |v|); the
    exact maxima are computed only when that is not conclusive."""
    vr = v.reshape(R, -1)
    if vr.shape[1] == 0 or _norm_in_band(vr):
        return True, None
    m = row_maxabs(vr, R)
    if not bool(torch.isfinite(m).all()):
        return False, None
    e = exponents(m)
    return True, (e if _out_of_band(e, v.dtype) else None)


def grad_exponents(g: Tensor, R: int) -> Tensor | None:
    """Per-row exponents of the incoming gradient ``g`` when some row lies outside the
    band, else ``None`` (non-finite gradients are passed on as they are)."""
    ok, e = value_exponents(g, R)
    return e if ok else None


class Scales:
    """Per-row exponents of one call (``None``: that input is not rescaled): ``ez`` of the
    scores (and bandwidth), ``ev`` of the values, ``ew`` of the weights; each ``(R,)``
    int64.  The kernels work on ``z 2^-ez``, ``v 2^-ev``, ``w 2^-ew``, ``b 2^-ez``."""

    __slots__ = ("ez", "ev", "ew")

    def __init__(
        self, ez: Tensor | None = None, ev: Tensor | None = None, ew: Tensor | None = None
    ):
        self.ez, self.ev, self.ew = ez, ev, ew

    @property
    def active(self) -> bool:
        return self.ez is not None or self.ev is not None or self.ew is not None

    @staticmethod
    def _neg(e):
        return None if e is None else -e

    def scores(self, z: Tensor) -> Tensor:
        """``(R, N)`` scores (or ``(R, 1)`` bandwidths) in the scaled problem."""
        return z if self.ez is None else ldexp(z, -self.ez.unsqueeze(1))

    def values(self, v: Tensor) -> Tensor:
        return v if self.ev is None else ldexp(v, -self.ev.view(-1, 1, 1))

    def weights(self, w: Tensor | None) -> Tensor | None:
        return w if (w is None or self.ew is None) else ldexp(w, -self.ew.unsqueeze(1))

    def output(self, out: Tensor) -> Tensor:
        """``(R, M, D)`` output of the scaled problem -> the output."""
        return out if self.ev is None else ldexp(out, self.ev.view(-1, 1, 1))

    def grads(self, eg: Tensor | None, dzq=None, dzk=None, dv=None, db=None):
        """Gradients of the scaled problem, computed with the incoming gradient scaled by
        ``2^-eg`` -> the gradients of the inputs: ``dz, db`` times ``2^(ev + eg - ez)``,
        ``dv`` times ``2^eg``."""
        if not self.active and eg is None:
            return dzq, dzk, dv, db
        ez = 0 if self.ez is None else self.ez
        ev = 0 if self.ev is None else self.ev
        ge = 0 if eg is None else eg
        ed = ev + ge - ez
        ed = None if isinstance(ed, int) else ed.unsqueeze(1)
        dzq = None if dzq is None else ldexp(dzq, ed)
        dzk = None if dzk is None else ldexp(dzk, ed)
        db = None if db is None else ldexp(db, ed)
        dv = dv if (dv is None or eg is None) else ldexp(dv, eg.view(-1, 1, 1))
        return dzq, dzk, dv, db


def gradient_in(g: Tensor, R: int) -> tuple[Tensor, Tensor | None]:
    """The incoming gradient ``(R, M, D)`` normalised per row (when outside the band) and
    its exponents, for :meth:`Scales.grads`."""
    eg = grad_exponents(g, R)
    return (g if eg is None else ldexp(g, -eg.view(-1, 1, 1))), eg


# --------------------------------------------------------------------------------------
# causal sums: weights spread over more than one scale
# --------------------------------------------------------------------------------------
#: width (in powers of two) of the leading weights of one segment (:func:`weight_segments`)
SEGMENT = {torch.float32: 16, torch.float64: 128}
#: a key lighter than ``2^-FLUSH`` times the leading weight of a segment is dropped from it
#: (eq. 7: its share of the query's normalisation :math:`\sum_l w_l` is below the rounding)
FLUSH = {torch.float32: 40, torch.float64: 200}
#: the same for eqs. 2 and 3 (float64 only: float32 rows whose weights span more than
#: :data:`RELU_SPAN_F32` are computed in float64).  Their normalisation is
#: :math:`\sum_l w_l |q - z_l|`, not :math:`\sum_l w_l`: a heavy key at (or near) the query adds
#: (almost) nothing to it, and a key far lighter than the heaviest may carry the whole sum
#: (issue 42: float32 weights 1e-10 and 1e10, the query on the heavy key: FLUSH dropped the
#: light key, the only one that counts).  So a segment keeps every earlier key down to
#: :math:`2^{-640}` of its leading weight, and segments are :math:`2^{192}` wide (the two
#: together stay inside float64's normal range, with room for the scaled scores and values).
SEGMENT_RELU, FLUSH_RELU = 192, 640
#: float32 rows whose positive key weights span more than :math:`2^{64}` (largest over
#: smallest) are computed in float64 by eqs. 2 and 3: in float32 the products of the lightest
#: weights with scores and values would fall below its normal range
RELU_SPAN_F32 = 64


def _weight_exponents(w: Tensor) -> Tensor:
    """int64 exponents of the weights ``(R, N)``; a very negative number at zero weights."""
    e = exponents(w)
    return torch.where(w > 0, e, torch.full_like(e, -(1 << 40)))


def heaviest(ws: Tensor) -> Tensor:
    r"""``(n, 1)`` index, per row of the key weights ``ws`` ``(n, s)`` (in the keys' sorted
    order), of the median of the keys of the largest weight (the median key when the weights
    are equal): the shift :math:`c` of the prefix tables of eqs. 2 and 3.  With it every table
    term's rounding, :math:`\varepsilon w_j (|q - c| + |z_j - c|)`, sums to at most
    :math:`(2s + 1)\varepsilon\sum_j w_j |q - z_j|` (as :math:`w_j \le w_c` and
    :math:`|z_j - c| \le |z_j - q| + |q - c|`): a multiple of the denominator the terms enter,
    however close the query is to the heavy keys (issue 42)."""
    ismax = ws == ws.amax(1, keepdim=True)
    k = ismax.sum(1, keepdim=True)
    return (torch.cumsum(ismax, 1) > (k - 1) // 2).to(torch.int8).argmax(1, keepdim=True)


def weights_span(w: Tensor) -> int:
    """The largest, over the rows of the key weights ``w`` ``(R, N)``, of the span in powers of
    two of the positive weights (exponent of the largest minus that of the smallest); 0 for
    rows without two positive weights."""
    R, N = w.shape
    if R * N == 0:
        return 0
    e = exponents(w)
    pos = w > 0
    hi = torch.where(pos, e, torch.full_like(e, -(1 << 40))).amax(1)
    lo = torch.where(pos, e, torch.full_like(e, 1 << 40)).amin(1)
    return int(torch.where(pos.any(1), hi - lo, 0).amax())


def weights_one_scale(w: Tensor, segment: int | None = None) -> bool:
    r"""Whether every row of the key weights ``w`` ``(R, N)`` suits one scale for all of its
    causal prefixes: the first key of positive weight, which every query that sees a key
    sees, is within :math:`2^{\mathrm{SEGMENT}}` of the row's largest weight.  (Rows with
    weights of one scale are rescaled by :class:`Scales`; see :func:`weight_segments` for
    the others.)"""
    R, N = w.shape
    if R * N == 0:
        return True
    e = _weight_exponents(w)
    first = (w > 0).to(torch.int8).argmax(1, keepdim=True)
    spread = e.amax(1) - e.gather(1, first).squeeze(1)
    return bool((spread <= (SEGMENT[w.dtype] if segment is None else segment)).all())


def weight_segments(w: Tensor, Nq: int, segment: int | None = None, flush: int | None = None):
    r"""Subproblems of a causal sum whose key weights ``w`` ``(R, N_k)`` span more than one
    scale within a row (queries on the last ``N_q`` positions, bottom-right aligned).

    The causal outputs are of degree 0 in the weights *per query*: query :math:`i` may be
    scaled by the largest weight :math:`2^{C_t}` of its own prefix :math:`l \le t`
    (:math:`C_t` the running maximum of the weights' exponents), and its keys lighter than
    :math:`2^{C_t - \mathrm{FLUSH}}` are below its rounding (the prefix holds a key of
    weight :math:`\ge 2^{C_t - 1}`, seen by the query).  One row-wide scale cannot do that
    when :math:`C_t` grows by more than the dtype's range along the row (float32 weights
    1e-20 and 1e20: the first query's weights underflow to 0).  So the positions of a row
    are cut into segments :math:`[a_g, b_g)` over which :math:`C_t` grows by at most
    :data:`SEGMENT` (``segment``); segment :math:`g` is its own causal problem: the keys before
    :math:`a_g` of weight :math:`\ge 2^{c_g - \mathrm{FLUSH}}` (:math:`c_g = C_{a_g}`), then
    every position of the segment, weights scaled by :math:`2^{-c_g}` (lighter ones set to
    0), and the segment's queries, the last ones (bottom-right alignment holds).  (``segment``,
    ``flush``: other widths than :data:`SEGMENT`, :data:`FLUSH`: :data:`SEGMENT_RELU`,
    :data:`FLUSH_RELU` for eqs. 2 and 3.)  As
    :math:`C` grows by more than SEGMENT from one segment to the next, a key enters at most
    :math:`(\mathrm{FLUSH} + \mathrm{SEGMENT}) / \mathrm{SEGMENT} + 1` (4.5 in float32, 3.6
    in float64) subproblems.

    Returns ``(key_index, key_weight, query_index, query_real)``: the subproblems batched
    with left padding (``(S, K)`` flat indices into the ``R * N_k`` keys, their scaled
    weights (0 at pads), ``(S, M)`` flat indices into the ``R * N_q`` queries, and whether
    each is real), or ``None`` when every row has one scale.  A left pad repeats the first
    real key (weight 0) or query (output dropped), so that it changes no magnitude; the
    bottom-right alignment is unchanged by it.
    """
    R, N = w.shape
    dt = w.dtype
    H = SEGMENT[dt] if segment is None else segment
    G = FLUSH[dt] if flush is None else flush
    e_all = _weight_exponents(w).cpu()
    C_all = torch.cummax(e_all, 1)[0]
    d = N - Nq  # position of query i is i + d
    subs = []
    for r in range(R):
        e, C = e_all[r], C_all[r]
        pos = torch.nonzero(e > -(1 << 40)).flatten()
        if pos.numel() == 0:
            continue
        a = int(pos[0])
        while a < N:
            c = int(C[a])
            b = int(torch.searchsorted(C, torch.tensor([c + H]), right=True)[0])
            q0 = max(a, d)
            if q0 < b:
                pre = torch.nonzero(e[:a] >= c - G).flatten()
                keys = torch.cat([pre, torch.arange(a, b)])
                subs.append((r, keys, torch.arange(q0, b) - d, c))
            a = b
    if len(subs) == 1 and subs[0][1].numel() == N and subs[0][2].numel() == Nq:
        return None
    K = max(s[1].numel() for s in subs)
    M = max(s[2].numel() for s in subs)
    S = len(subs)
    kidx = torch.empty(S, K, dtype=torch.int64)
    kreal = torch.zeros(S, K, dtype=torch.bool)
    qidx = torch.empty(S, M, dtype=torch.int64)
    qreal = torch.zeros(S, M, dtype=torch.bool)
    cexp = torch.empty(S, 1, dtype=torch.int64)
    for s, (r, keys, qs, c) in enumerate(subs):
        nk, nq = keys.numel(), qs.numel()
        kidx[s, : K - nk] = r * N + keys[0]
        kidx[s, K - nk :] = r * N + keys
        kreal[s, K - nk :] = True
        qidx[s, : M - nq] = r * Nq + qs[0]
        qidx[s, M - nq :] = r * Nq + qs
        qreal[s, M - nq :] = True
        cexp[s] = c
    dev = w.device
    kidx, kreal, qidx, qreal, cexp = (x.to(dev) for x in (kidx, kreal, qidx, qreal, cexp))
    ws = ldexp(w.reshape(-1)[kidx], -cexp)
    ws = torch.where(kreal & (ws >= 2.0**-G), ws, torch.zeros_like(ws))
    return kidx, ws, qidx, qreal
