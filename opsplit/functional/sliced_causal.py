r"""Causal sliced ReLU attention and causal sliced ReLU-bump attention (paper 004, eqs. 2,
3 and 7 with the sums restricted to the causal prefix), exact, in :math:`O(n \log^2 n)`
time and :math:`O(n D)` memory, with a hand-written backward pass.

**Causality convention.**  Query :math:`i` (``0 <= i < N_q``) sees the keys
:math:`l \le t_i := i + N_k - N_q` (bottom-right alignment: the last query sees every key,
as in a decoder that appends :math:`N_q` new tokens to a cache of :math:`N_k - N_q`;
with :math:`N_q = N_k`, :math:`t_i = i`).  A query with :math:`t_i < 0` sees no key and
gets 0.  With weights :math:`w_l \ge 0` (``key_weights``, 0 at masked keys), let
:math:`\mathcal P_i = \{l \le t_i\}` and :math:`W_i = \sum_{l \in \mathcal P_i} w_l`.

.. math::

    \text{(eq. 2, causal)}\quad o_i &= \frac{\sum_{j \in \mathcal P_i} w_j\,
        \mathrm{ReLU}(z^q_i - z^k_j)\, v_j}{\sum_{l \in \mathcal P_i} w_l |z^q_i - z^k_l|}, \\
    \text{(eq. 3, causal)}\quad o_i &= \frac{\sum_{j \in \mathcal P_i} w_j\,
        \mathrm{ReLU}(z^q_i - z^k_j)\,(v_j - \bar v_i)}
        {\sum_{l \in \mathcal P_i} w_l |z^q_i - z^k_l|},\qquad
        \bar v_i = \frac{1}{W_i}\sum_{l \in \mathcal P_i} w_l v_l, \\
    \text{(eq. 7, causal)}\quad o_i &= \frac{1}{W_i}\sum_{j \in \mathcal P_i} w_j\,
        \mathrm{ReLU}\Big(1 - \frac{|z^q_i - z^k_j|}{b}\Big)\, v_j .

**Centring (eq. 3).**  The values are centred by the mean over the query's own causal
prefix, :math:`\bar v_i`, not by the mean over all keys.  Two reasons.  (i) Paper 004
(§2.2.1, Prop. A.1) centres so that the weights :math:`\gamma_j = v_j - \bar v` summed by
the kernel have zero sum over *the keys the kernel acts on*, where
:math:`\mathrm{ReLU}(x - y)` is conditionally positive definite of order 1; for query
:math:`i` that set is :math:`\mathcal P_i`, and :math:`\sum_{j \in \mathcal P_i} w_j
(v_j - \bar v_i) = 0` exactly.  (ii) The mean over all keys would make :math:`o_i` depend on
future values :math:`v_l, l > t_i`, and the attention would not be causal.  With
:math:`N_q = N_k = n` and no mask the last query's output equals the full eq. 3.  For
eq. 7 the normalisation :math:`1/n` becomes :math:`1/W_i`, the number (weight) of keys the
query sees, again the full eq. 7 for the last query; eq. 7 has no centring.

**Algorithm** (divide and conquer over positions).  Put the queries on the key positions
(query :math:`i` at :math:`t_i`).  Below a block size :data:`BASE` the pairs
:math:`l \le t` inside a block are summed densely (``BASE x BASE`` tiles).  Above it, at
level :math:`s = \mathrm{BASE}, 2\,\mathrm{BASE}, \dots < N_k`, the positions are cut into
nodes of :math:`2s`; the keys of a node's left half precede every query of its right half,
so their interaction is the *full* sliced sum of eq. 6 (Prop. 2.1): sort the :math:`s`
left keys, rank the right queries among them, and read prefix tables
:math:`A_p = \sum_{j<p} w_j v_j`, :math:`B_p = \sum_{j<p} w_j z_j v_j` (sorted order):
:math:`\sum_j w_j\,\mathrm{ReLU}(q - z_j)\, v_j = q A_{p} - B_{p}`.  Every pair
:math:`l \le t_i` is counted exactly once (in the block, or at the level where
:math:`l` and :math:`t_i` part), all nodes of a level are one batched sort.  Each level
costs :math:`O(n \log n)` (sort) and there are :math:`\log_2(n / \mathrm{BASE})` levels:
:math:`O(n \log^2 n)` time, :math:`O(n D)` memory (tables built in chunks of rows and
columns of at most ``_TABLE_BYTES``); no :math:`N_q \times N_k` tensor exists.  The scalar
sums (denominators, :math:`\sum w\,\mathrm{ReLU}`, kernel masses, prefix weights) are
accumulated in float64.  The centring of eq. 3 is
:math:`\sum_j w_j\mathrm{ReLU}(q_i - z_j)(v_j - \bar v_i) = N_i - R_i \bar v_i` with the
causal sums :math:`N_i` above and :math:`R_i = \sum_{j\in\mathcal P_i} w_j
\mathrm{ReLU}(q_i - z_j)` (scalar), and :math:`\bar v_i` a float64 prefix sum over positions.
The ReLU-bump kernel reads the same tables over the window :math:`q - b < z < q + b`
(Lemma B.4).

**Conditioning and exact causality.**  The formulas are invariant under a common shift of
the scores and (after adding back the kernel mass) of the values.  The values are shifted by
the value of the first unmasked key (a key every query that sees any key sees).  The dense
blocks form :math:`q - z` from the scores as given (and the in-block denominators
:math:`\sum w |q - z|` directly); each node of a level builds its tables for the scores
shifted by its own heaviest key (:func:`~opsplit.functional._scale.heaviest`), so that the
rounding of :math:`q A - B` is a multiple of the node's share of the denominator however the
weights are spread and however close the query is to the heavy keys (issue 42: shifted by the
first key, a heavy key at the query cancelled the light keys away).  Key weights spanning
more than :math:`2^{64}` in a float32 row are summed in float64 (the light keys' products
would leave float32's range); in float64, rows whose weights grow by more than
:math:`2^{192}` along the sequence are cut into segments (:func:`~opsplit.functional._scale.weight_segments`)
that keep every earlier key down to :math:`2^{-640}` of the segment's leading weight (a
lighter key changes a result only where every heavier key it sees is within :math:`2^{-640}`
relative of the query).  Every sum that reaches :math:`o_i` (dense block, sorted left
halves, prefix scans) involves only positions :math:`\le t_i`, so :math:`o_i` does not
depend on later inputs even in rounding: the outputs for a prefix of the sequence are
bitwise those of the prefix alone (tested).  The backward pass is the analytic gradient of
the unshifted formulas, and the gradient of :math:`o_i` with respect to any input at a
position after :math:`t_i` is exactly zero.

**Ties** (as in :mod:`opsplit.functional.sliced`).  :math:`\mathrm{ReLU}(0) = |0| = 0`;
ranks are decided on the exact float values, gradients use the convention of
``torch.relu`` / ``torch.abs`` (derivative 0 at 0).  A query whose denominator vanishes
(every visible key equal to it, or none visible) gets 0 with zero gradient through its
normalisation.  For eq. 7 a pair is inside the window when ``q - b < z < q + b`` evaluated
in floating point, identically in the forward and backward passes.

**Magnitudes and small bandwidths** as in :mod:`opsplit.functional.sliced`: rows are
rescaled by powers of two where their scores, values or weights lie far from 1 (the dense
blocks and the sorted levels multiply scores by values), the incoming gradient likewise in
the backward pass; the bump with a bandwidth far below the spread of the scores is summed
pair by pair over the windows (causal pairs only), read off float64 tables, or refused
(:mod:`~opsplit.functional._windows`).

**torch.func** transforms (``vmap``, ``grad``, ``vjp``, ``jacrev``, ``jvp``, ``jacfwd``,
``hessian``) and forward-mode AD are refused with a ``RuntimeError`` naming them (the
divide and conquer depends on the data and the backward pass is hand-written for
``torch.autograd``); the kernels take any leading dims, which batch independent calls.

**Double backward** is refused: the backward pass is hand-written and not itself
differentiable, so a backward pass with ``create_graph=True`` (Hessian-vector products,
gradient penalties, ``gradgradcheck``) through these kernels raises a ``RuntimeError``
at once.  (``torch.autograd.function.once_differentiable`` is not enough: it raises only
when the incoming gradient itself requires grad, and otherwise lets the second derivative
through *without* this kernel's terms, a silently wrong number.)
"""

from __future__ import annotations

import contextlib
import functools
import math
import threading

import torch
import torch.nn.functional as F
from torch import Tensor

from .._compile import eager_under_compile
from . import _windows
from ._inputs import bandwidth_rows, check_centered, check_scores_values, scales, transform
from ._inputs import key_weights as combine_key_weights
from ._scale import (
    FLUSH_RELU,
    RELU_SPAN_F32,
    SEGMENT_RELU,
    gradient_in,
    heaviest,
    weight_segments,
    weights_one_scale,
    weights_span,
)

__all__ = ["causal_sliced_relu_attention", "causal_sliced_relu_bump_attention", "BASE"]

#: positions per dense block of the divide and conquer
BASE = 64
# bytes of one gathered value table per chunk (rows x columns)
_TABLE_BYTES = 32 << 20
# bytes of one dense base-case tile batch
_TILE_BYTES = 32 << 20


# --------------------------------------------------------------------------------------
# validation
# --------------------------------------------------------------------------------------
def _check(fn, zq, zk, v, key_padding_mask, key_weights, bandwidth=None):
    """Refusals (``torch.jit.trace``, ``torch.func`` transforms, forward-mode AD), metadata
    checks of ``zq, zk, v`` and the combined key weights (or ``None``).  The finiteness of
    the scores and values is checked with their magnitudes (:func:`._inputs.scales`)."""
    if torch.jit.is_tracing():
        raise RuntimeError(
            f"{fn}: torch.jit.trace is not supported: the causal kernel's divide and conquer "
            "depends on the data (sorted prefix tables per level); run the model eagerly, or "
            "compile it with torch.compile (without fullgraph: the kernel runs eagerly)"
        )
    how = transform(zq, zk, v, key_weights, bandwidth)
    if how == "vmap":
        raise RuntimeError(
            f"{fn}: torch.func.vmap is not supported: the causal kernel's divide and conquer "
            "depends on the data; the kernel takes any leading dims, so stack the batch into "
            "zq, zk and v instead (e.g. (V, B, H, N) for V vmapped calls)"
        )
    if how is not None:
        what = ("torch.func transforms that differentiate (grad, vjp, jacrev, jvp, jacfwd, "
                "hessian) are" if how == "grad" else
                "forward-mode AD (torch.autograd.forward_ad) is")
        raise RuntimeError(
            f"{fn}: {what} not supported: the causal kernel has a hand-written first-order "
            "backward pass for torch.autograd; use torch.autograd.grad or .backward() (first "
            "derivatives)"
        )
    check_scores_values(fn, zq, zk, v)
    return combine_key_weights(fn, key_padding_mask, key_weights, zk.shape, zk.dtype, zk.device)


# --------------------------------------------------------------------------------------
# layout: queries on key positions, levels of the divide and conquer
# --------------------------------------------------------------------------------------
class _Layout:
    """Rows ``R``, ``N = N_k`` key positions; query ``i`` sits at ``i + N_k - N_q``."""

    def __init__(self, R, Nq, Nk):
        self.R, self.Nq, self.N = R, Nq, Nk
        d = Nk - Nq
        self.a0 = max(0, d)  # first position holding a query
        self.i0 = max(0, -d)  # first query that sees a key
        self.levels = []
        s = BASE
        while s < Nk:
            self.levels.append(s)
            s *= 2
        self.P = max([-(-Nk // (2 * s)) * 2 * s for s in self.levels] + [-(-Nk // BASE) * BASE])

    def to_pos(self, x: Tensor) -> Tensor:
        """``(R, N_q, ...)`` -> ``(R, P, ...)`` on positions, 0 where no query sits."""
        out = x.new_zeros(self.R, self.P, *x.shape[2:])
        out[:, self.a0 : self.N] = x[:, self.i0 :]
        return out

    def from_pos(self, x: Tensor) -> Tensor:
        out = x.new_zeros(self.R, self.Nq, *x.shape[2:])
        out[:, self.i0 :] = x[:, self.a0 : self.N]
        return out


def _split(x: Tensor, s: int, half: int, M: int) -> Tensor:
    """Positions ``(R, P, ...)`` -> one half (0: left, keys; 1: right, queries) of each of
    the ``M`` nodes of ``2s`` positions: a strided view ``(R, M, s, ...)``."""
    R = x.shape[0]
    return x[:, : M * 2 * s].view(R, M, 2, s, *x.shape[2:])[:, :, half]


def _chunks(rows: int, s: int, D: int, elt: int):
    """Row chunks and column chunks so that one ``(rows, s, cols)`` table stays small."""
    per_row = max(1, s * D * elt)
    cr = max(1, min(rows, _TABLE_BYTES // per_row))
    cd = D if cr > 1 or per_row <= _TABLE_BYTES else max(1, _TABLE_BYTES // (s * elt))
    return cr, cd


#: rows per block of the in-block triangular products of :class:`_Table`
_S = 8
_TRIL_S: dict = {}


class _Table:
    r"""Exclusive prefix sums, in a sorted order, of gathered rows weighted by ``cA`` (table
    A) and ``cB`` (table B), for ``n`` rows of ``s`` positions (eq. 6's :math:`a_i, b_i`).

    Built in blocks of :data:`_S` positions: one ``bmm`` with lower-triangular matrices whose
    columns are scaled by ``cA`` and ``cB`` gives both in-block prefix sums, and the block
    offsets are a cumulative sum over the blocks.  Stored in one flat matrix (in-block rows,
    then the offsets, then a row of zeros) that :meth:`combine` reads with one
    ``embedding_bag``: a prefix is an in-block row plus an offset row.
    """

    def __init__(self, src: Tensor, idx: Tensor, cA: Tensor, cB: Tensor | None):
        n, s = idx.shape
        C = src.shape[1]
        S = _S
        nb = s // S
        k = 1 if cB is None else 2
        nblk = n * nb
        size = nblk * k * S
        dt, dev = src.dtype, src.device
        self.flat = src.new_empty(size + nblk * k + 1, C)
        self.flat[-1].zero_()
        X = src.index_select(0, idx.reshape(-1)).view(nblk, S, C)
        key = (dt, str(dev))
        L = _TRIL_S.get(key)
        if L is None:
            L = _TRIL_S[key] = torch.ones(S, S, dtype=dt, device=dev).tril()
        Lc = torch.empty(nblk, k * S, S, dtype=dt, device=dev)
        torch.mul(L, cA.reshape(nblk, 1, S), out=Lc[:, :S])
        if cB is not None:
            torch.mul(L, cB.reshape(nblk, 1, S), out=Lc[:, S:])
        Y = self.flat[:size].view(nblk, k * S, C)
        torch.bmm(Lc, X, out=Y)
        del X, Lc
        tot = Y.view(n, nb, k, S, C)[:, :, :, S - 1]  # (n, nb, k, C) block totals
        off = self.flat[size : size + nblk * k].view(n, nb, k, C)
        off[:, 0] = 0
        if nb > 1:
            off[:, 1:] = torch.cumsum(tot[:, :-1], 1)
        self.n, self.s, self.nb, self.k, self.size = n, s, nb, k, size

    def _index(self, p: Tensor, t: int):
        S = _S
        j = p - 1
        blk = torch.div(j, S, rounding_mode="floor")
        rb = torch.arange(self.n, device=p.device).unsqueeze(1) * self.nb + blk
        zero = self.flat.shape[0] - 1
        irow = torch.where(p > 0, rb * (self.k * S) + t * S + (j & (S - 1)), zero)
        ioff = torch.where(p > 0, self.size + rb * self.k + t, zero)
        return irow, ioff

    def combine(self, terms) -> Tensor:
        """``sum_e coef_e * T_e[p_e]`` for ``terms = [(p, t, coef), ...]`` (``p``: ``(n, M)``
        exclusive ranks, ``t``: 0 for A, 1 for B, ``coef``: ``(n, M)`` or broadcastable)
        -> ``(n, M, C)``."""
        idx, cf = [], []
        for p, t, c in terms:
            irow, ioff = self._index(p, t)
            c = c.to(self.flat.dtype).expand(p.shape)
            idx += [irow, ioff]
            cf += [c, c]
        n, M = terms[0][0].shape
        E = len(idx)
        out = F.embedding_bag(torch.stack(idx, -1).view(-1, E), self.flat,
                              per_sample_weights=torch.stack(cf, -1).view(-1, E), mode="sum")
        return out.view(n, M, -1)


def _gather0(c0: Tensor, p: Tensor) -> Tensor:
    return c0.gather(1, p)


def _excl64(x: Tensor) -> Tensor:
    """Exclusive float64 prefix sums along dim 1 of ``(n, s)`` -> ``(n, s + 1)``."""
    return F.pad(torch.cumsum(x.double(), 1), (1, 0))


def _suffix64(x: Tensor) -> Tensor:
    """Float64 suffix sums along dim 1 of ``(n, s)`` -> ``(n, s + 1)``: ``[:, p]`` = the sum of
    ``x[:, p:]`` (where a total minus a prefix would cancel)."""
    return F.pad(torch.flip(torch.cumsum(torch.flip(x.double(), [1]), 1), [1]), (0, 1))


def _safe_inv(x: Tensor) -> Tensor:
    nz = x != 0
    return torch.where(nz, 1.0 / torch.where(nz, x, torch.ones_like(x)), torch.zeros_like(x))


#: where the forward keeps each level's key order while :func:`keep_sorts` is active
_SORTS = threading.local()


@contextlib.contextmanager
def keep_sorts():
    """Within the block, the causal forward kernels (:func:`causal_sliced_relu_attention`,
    :func:`causal_sliced_relu_bump_attention`) keep the sort of each level's left halves: a
    dict ``{s: order}``, ``order`` ``(R * M, s)`` the local order of the keys of node ``j`` of
    row ``r`` in row ``r * M + j`` (``M`` nodes of ``2 s`` positions per row), sorted by the
    scores as given up to a power of two per row (``"unusable"`` in the dict: a call whose keys
    were cut into weight segments).  What a decode cache builds its sorted runs from
    (:class:`~opsplit.functional.sliced_runs.SlicedDecodeCache`: the prefill sorts no run the
    forward has sorted)."""
    old = getattr(_SORTS, "sink", None)
    sink: dict = {}
    _SORTS.sink = sink
    try:
        yield sink
    finally:
        _SORTS.sink = old


class _Keys:
    r"""The left halves (keys) and right halves (queries) of one level, keys sorted.

    **Shift.**  The prefix tables of a node are formed for the scores shifted by those of the
    node's heaviest key (:func:`~opsplit.functional._scale.heaviest`), :math:`c`: ``zc = z - c``, ``qc = q - c``.  A table
    sum :math:`\sum_j w_j (q - z_j)\gamma_j` read as :math:`q_c A - B` then rounds each term
    to about :math:`\varepsilon w_j (|q - c| + |z_j - c|)|\gamma_j|`, and with :math:`w_c`
    the largest weight :math:`\sum_j w_j (|q - c| + |z_j - c|) \le (2 s + 1)\sum_j w_j |q - z_j|`
    (:math:`w_j \le w_c` and :math:`|z_j - c| \le |z_j - q| + |q - c|`): the rounding is a
    multiple of the node's own share of the denominator, whatever the weights and however
    close the query is to the heavy keys.  (Shifted by another key, a heavy key at or near the
    query cancels in :math:`q A - B` down to nothing of the light keys' sums: issue 42.)
    Ranks are decided on the scores as given (``zs``, ``q``)."""

    def __init__(self, lay: _Layout, s: int, zp: Tensor, qp: Tensor, wp: Tensor):
        R, N = lay.R, lay.N
        self.s = s
        M = -(-N // (2 * s))
        self.M = M
        self.z = _split(zp, s, 0, M).reshape(R * M, s)
        self.q = _split(qp, s, 1, M).reshape(R * M, s)
        self.w = _split(wp, s, 0, M).reshape(R * M, s)
        self.zs, self.order = torch.sort(self.z, dim=1)
        sink = getattr(_SORTS, "sink", None)
        if sink is not None:
            sink[s] = self.order
        self.ws = self.w.gather(1, self.order)
        self.c = self.zs.gather(1, heaviest(self.ws))  # (R M, 1) the shift
        self.zc = self.z - self.c  # unsorted shifted keys
        self.qc = self.q - self.c
        self.zsc = self.zs - self.c
        # flat index of each sorted key into the (R * P, D) values (zero beyond N_k)
        rm = torch.arange(R * M, device=zp.device)
        self.base = ((rm // M) * lay.P + (rm % M) * (2 * s)).unsqueeze(1)  # left half start
        self.flat = self.base + self.order
        self.wzs = self.ws * self.zsc
        self.Wc0 = _excl64(self.ws)
        self.Kc0 = _excl64(self.wzs)
        self.W = self.Wc0[:, -1:]
        self.K = self.Kc0[:, -1:]

    def rank(self, x: Tensor, side: str) -> Tensor:
        return torch.searchsorted(self.zs, x.contiguous(), side=side)

    def table(self, vflat: Tensor, r0: int, r1: int, d0: int, d1: int, B: bool = True):
        """The prefix tables A (w v) and, with ``B``, B (w z v) of rows ``r0:r1``, columns
        ``d0:d1``, in sorted key order."""
        return _Table(vflat[:, d0:d1], self.flat[r0:r1], self.ws[r0:r1],
                      self.wzs[r0:r1] if B else None)


class _Queries:
    """The right halves (queries) of one level sorted, for the transposed sums of the
    backward pass (over the queries above / near each key)."""

    def __init__(self, q: Tensor):
        self.qs, self.order = torch.sort(q, dim=1)

    def rank(self, x: Tensor, side: str, sorted_values: Tensor | None = None) -> Tensor:
        ref = self.qs if sorted_values is None else sorted_values
        return torch.searchsorted(ref, x.contiguous(), side=side)


def _blocks(x: Tensor) -> Tensor:
    """Positions ``(R, P, ...)`` -> ``(R * P / BASE, BASE, ...)`` over the first
    ``ceil(N / BASE) * BASE`` positions (P is a multiple of BASE)."""
    R, P = x.shape[:2]
    return x.reshape(R * (P // BASE), BASE, *x.shape[2:])


def _tile_steps(nblk: int, D: int, elt: int):
    per = BASE * max(BASE, D) * elt * 4
    step = max(1, min(nblk, _TILE_BYTES // per))
    return range(0, nblk, step), step


_TRIL: dict = {}


def _tril(dtype, device) -> Tensor:
    key = (dtype, str(device))
    t = _TRIL.get(key)
    if t is None:
        t = torch.ones(BASE, BASE, dtype=dtype, device=device).tril()
        _TRIL[key] = t
    return t


# --------------------------------------------------------------------------------------
# causal sliced ReLU attention (eqs. 2-3)
# --------------------------------------------------------------------------------------
def _scan(x: Tensor) -> Tensor:
    """Inclusive prefix sums along dim 1 of ``(R, P, C)`` (``P`` a multiple of :data:`_S`):
    in-block triangular products, then the block totals (``torch.cumsum`` along a
    non-innermost dimension is slow on the CPU)."""
    R, P, C = x.shape
    S = _S
    key = (x.dtype, str(x.device))
    L = _TRIL_S.get(key)
    if L is None:
        L = _TRIL_S[key] = torch.ones(S, S, dtype=x.dtype, device=x.device).tril()
    y = torch.matmul(L, x.reshape(R * (P // S), S, C))
    yb = y.view(R, P // S, S, C)
    if P // S > 1:
        yb[:, 1:] += torch.cumsum(yb[:, :-1, S - 1], 1).unsqueeze(2)
    return y.view(R, P, C)


class _Prep:
    """Inputs moved to positions, shifted scores and values."""

    def __init__(self, zq, zk, v, w):
        R, Nq = zq.shape
        Nk, D = v.shape[1], v.shape[2]
        lay = _Layout(R, Nq, Nk)
        self.lay = lay
        P = lay.P
        self.weighted = w is not None
        wk = torch.ones_like(zk) if w is None else w
        # the values are shifted by the value of the first unmasked key, which every query that
        # sees a key sees, so that no input after t_i takes part in o_i, not even in rounding
        # (the shift cancels exactly in the formulas); the scores are kept as they are: the
        # dense blocks form q - z from them, and each node of a level shifts its tables by
        # its own heaviest key (_Keys)
        first = (wk > 0).to(torch.int8).argmax(1, keepdim=True)  # (R, 1); 0 if none
        self.cv = v.gather(1, first.unsqueeze(-1).expand(R, 1, D)).squeeze(1)
        self.zp = F.pad(zk, (0, P - Nk))
        self.qp = lay.to_pos(zq)
        self.wp = F.pad(wk, (0, P - Nk))
        self.vp = v.new_empty(R, P, D)  # (R, P, D): v - c, zeros beyond N_k
        torch.sub(v, self.cv.unsqueeze(1), out=self.vp[:, :Nk])
        self.vp[:, Nk:] = 0
        self.vflat = self.vp.view(R * P, D)
        self.Wpre = torch.cumsum(self.wp.double(), 1)  # prefix weights W_i (float64)
        self.invWpre = _safe_inv(self.Wpre)

    def prefix_sum(self) -> Tensor:
        r""":math:`\sum_{l \le t} w_l (v_l - c)` per position ``(R, P, D)``."""
        x = self.vp * self.wp.unsqueeze(-1) if self.weighted else self.vp
        return _scan(x)


def _relu_forward(pp: _Prep):
    """Sums over the causal prefix: ``num`` = sum w relu(q - z) (v - c) ``(R, P, D)`` (dtype),
    ``den`` = sum w |q - z| and ``Rm`` = sum w relu(q - z) ``(R, P)`` (float64)."""
    lay = pp.lay
    R, P = lay.R, lay.P
    D = pp.vflat.shape[1]
    dt, dev = pp.vflat.dtype, pp.vflat.device
    num = torch.zeros(R, P, D, dtype=dt, device=dev)
    Rm = torch.zeros(R, P, dtype=torch.float64, device=dev)
    # dense blocks: pairs l <= t inside a block of BASE positions
    qb, zb, wb, vb = _blocks(pp.qp), _blocks(pp.zp), _blocks(pp.wp), _blocks(pp.vp)
    den = torch.zeros(R, P, dtype=torch.float64, device=dev)
    numb, Rmb, denb = _blocks(num), _blocks(Rm), _blocks(den)
    L = _tril(dt, dev)
    rng, step = _tile_steps(qb.shape[0], D, dt.itemsize)
    for b0 in rng:
        b1 = min(qb.shape[0], b0 + step)
        K = qb[b0:b1].unsqueeze(-1) - zb[b0:b1].unsqueeze(-2)  # q - z of the scores as given
        mw = L * wb[b0:b1].unsqueeze(-2) if pp.weighted else L
        # the in-block denominators sum w |q - z| directly (2 sum w relu(q - z) - sum w (q - z)
        # cancels where a heavy key ties the query)
        denb[b0:b1] += (K.abs() * mw).sum(-1, dtype=torch.float64)
        K.relu_()
        K.mul_(mw)
        Rmb[b0:b1] += K.sum(-1, dtype=torch.float64)
        numb[b0:b1] += torch.bmm(K, vb[b0:b1])
    for s in lay.levels:
        lv = _Keys(lay, s, pp.zp, pp.qp, pp.wp)
        M = lv.M
        q = lv.qc  # shifted by the node's heaviest key (the ranks: lv.q)
        p = lv.rank(lv.q, "left")
        q64 = q.double()
        Wlt, Klt = _gather0(lv.Wc0, p), _gather0(lv.Kc0, p)
        dl = q64 * (2 * Wlt - lv.W) - (2 * Klt - lv.K)
        rl = q64 * Wlt - Klt
        _split(den, s, 1, M).add_(dl.view(R, lv.M, s))
        _split(Rm, s, 1, M).add_(rl.view(R, lv.M, s))
        nv = _split(num, s, 1, M)  # (R, M, s, D) view
        rows = R * lv.M
        cr, cd = _chunks(rows, s, D, dt.itemsize)
        mone = -torch.ones(1, 1, dtype=dt, device=dev)
        for r0 in range(0, rows, cr):
            r1 = min(rows, r0 + cr)
            for d0 in range(0, D, cd):
                d1 = min(D, d0 + cd)
                T = lv.table(pp.vflat, r0, r1, d0, d1)
                pr = p[r0:r1]
                val = T.combine([(pr, 0, q[r0:r1]), (pr, 1, mone)])
                del T
                _add_rows(nv, r0, r1, d0, d1, val, lv.M)
    return num, den, Rm


def _add_rows(view: Tensor, r0: int, r1: int, d0: int, d1: int, val: Tensor, M: int) -> None:
    """``view`` ``(R, M, s, D)`` (a strided view of an accumulator): add ``val``
    ``(r1 - r0, s, d1 - d0)`` into its flattened rows ``r0:r1`` (row = r * M + m)."""
    k = r0
    while k < r1:
        r, m = divmod(k, M)
        m1 = min(M, m + (r1 - k))
        view[r, m:m1, :, d0:d1] += val[k - r0 : k - r0 + (m1 - m)]
        k += m1 - m


def _first_order_only(name: str):
    """Wrap a hand-written ``backward``: refuse ``create_graph=True`` (grad mode is on inside
    a backward pass exactly when a differentiable backward was asked for)."""

    def wrap(backward):
        @functools.wraps(backward)
        def wrapper(ctx, *grads):
            if torch.is_grad_enabled():
                raise RuntimeError(
                    f"{name}: cannot differentiate twice (backward with create_graph=True): "
                    "the causal kernel's backward pass is hand-written and not itself "
                    "differentiable, and the second derivative would silently miss its terms; "
                    "second derivatives are available for the non-causal kernels "
                    "(sliced_relu_attention, sliced_relu_bump_attention)"
                )
            with torch.no_grad():
                return backward(ctx, *grads)

        return wrapper

    return wrap


class _CausalReLU(torch.autograd.Function):
    @staticmethod
    def forward(ctx, zq, zk, v, w, centered, sc):
        # sc: per-row power-of-two scales (opsplit.functional._scale): the sums are formed
        # for the rescaled scores, values and weights, the output is scaled back
        zq, zk, v, w = sc.scores(zq), sc.scores(zk), sc.values(v), sc.weights(w)
        pp = _Prep(zq, zk, v, w)
        lay = pp.lay
        num, den, Rm = _relu_forward(pp)
        dt = num.dtype
        inv = _safe_inv(den)
        # o = (num + R rho) / den with rho = -(vbar_i - c) (centred) or c: in place in num
        out_p = num.mul_(inv.to(dt).unsqueeze(-1))
        if centered:
            coef = (-Rm * inv * pp.invWpre).to(dt).unsqueeze(-1)
            out_p.addcmul_(pp.prefix_sum(), coef)
        else:
            out_p.addcmul_(pp.cv.unsqueeze(1), (Rm * inv).to(dt).unsqueeze(-1))
        out = out_p if out_p.shape[1] == zq.shape[1] == zk.shape[1] else lay.from_pos(out_p)
        ctx.save_for_backward(zq, zk, v, w, out, den, Rm)
        ctx.centered = centered
        ctx.sc = sc
        return sc.output(out)

    @staticmethod
    @_first_order_only("causal_sliced_relu_attention")
    def backward(ctx, g):
        zq, zk, v, w, out, den, Rm = ctx.saved_tensors
        centered = ctx.centered
        pp = _Prep(zq, zk, v, w)
        lay = pp.lay
        R, P, N = lay.R, lay.P, lay.N
        D = v.shape[2]
        dt, dev = v.dtype, v.device
        inv = _safe_inv(den)  # (R, P) float64
        g, eg = gradient_in(g.contiguous(), R)  # normalised per row where extreme
        gp = lay.to_pos(g)
        op = lay.to_pos(out)
        gh = gp * inv.unsqueeze(-1).to(dt)  # g_i / den_i
        sden = -(gp.double() * op.double()).sum(-1) * inv  # dL/d den_i
        if centered:  # dL/dR_i = <gh_i, -(vbar_i - c)>
            phi = -(gh * pp.prefix_sum()).sum(-1, dtype=torch.float64) * pp.invWpre
        else:
            phi = (gh * pp.cv.unsqueeze(1)).sum(-1, dtype=torch.float64)
        dq = torch.zeros(R, P, dtype=torch.float64, device=dev)
        dz = torch.zeros(R, P, dtype=torch.float64, device=dev)
        dv = torch.zeros(R, P, D, dtype=dt, device=dev)
        # dense blocks
        qb, zb, wb, vb = _blocks(pp.qp), _blocks(pp.zp), _blocks(pp.wp), _blocks(pp.vp)
        ghb, sb, phib = _blocks(gh), _blocks(sden), _blocks(phi)
        dqb, dzb, dvb = _blocks(dq), _blocks(dz), _blocks(dv)
        L = _tril(dt, dev)
        rng, step = _tile_steps(qb.shape[0], D, dt.itemsize)
        for b0 in rng:
            b1 = min(qb.shape[0], b0 + step)
            d = qb[b0:b1].unsqueeze(-1) - zb[b0:b1].unsqueeze(-2)
            mw = L * wb[b0:b1].unsqueeze(-2)
            GV = torch.bmm(ghb[b0:b1], vb[b0:b1].transpose(1, 2))  # <gh_i, v_j - c>
            T = ((d > 0).to(dt) * (GV + phib[b0:b1].unsqueeze(-1).to(dt))
                 + torch.sign(d) * sb[b0:b1].unsqueeze(-1).to(dt)) * mw
            dqb[b0:b1] += T.sum(-1, dtype=torch.float64)
            dzb[b0:b1] -= T.sum(-2, dtype=torch.float64)
            dvb[b0:b1] += torch.bmm((torch.relu(d) * mw).transpose(1, 2), ghb[b0:b1])
        ghflat = gh.view(R * P, D)
        for s in lay.levels:
            lv = _Keys(lay, s, pp.zp, pp.qp, pp.wp)
            M, rows = lv.M, R * lv.M
            q, z = lv.q, lv.z  # ranks: the scores as given; table sums: shifted (lv.zc, qdw)
            p = lv.rank(q, "left")
            ple = lv.rank(q, "right")
            Wlt = _gather0(lv.Wc0, p)
            # W_> from suffix sums (W - W_<= cancels where a heavy key ties the query)
            Wgt = _gather0(_suffix64(lv.ws), ple)
            ghq = _split(gh, s, 1, M).reshape(rows, s, D)
            sq = _split(sden, s, 1, M).reshape(rows, s)
            phq = _split(phi, s, 1, M).reshape(rows, s)
            # queries: d/dq = <gh, A_p> + phi W_< + s (W_< - W_>)
            gA = torch.empty(rows, s, dtype=torch.float64, device=dev)
            cr, cd = _chunks(rows, s, D, dt.itemsize)
            for r0 in range(0, rows, cr):
                r1 = min(rows, r0 + cr)
                acc = torch.zeros(r1 - r0, s, dtype=torch.float64, device=dev)
                for d0 in range(0, D, cd):
                    d1 = min(D, d0 + cd)
                    T = lv.table(pp.vflat, r0, r1, d0, d1, B=False)
                    X = T.combine([(p[r0:r1], 0, torch.ones_like(q[:1]))])
                    del T
                    acc += (X * ghq[r0:r1, :, d0:d1]).sum(-1, dtype=torch.float64)
                gA[r0:r1] = acc
            dql = gA + phq * Wlt + sq * (Wlt - Wgt)
            _split(dq, s, 1, M).add_(dql.view(R, M, s))
            # keys: sums over the queries above each key (queries sorted by decreasing score)
            qd, qord = torch.sort(q, dim=1, descending=True)
            qa = qd.flip(1)  # ascending
            n_le = torch.searchsorted(qa, z.contiguous(), side="right")  # queries <= z
            n_lt = torch.searchsorted(qa, z.contiguous(), side="left")  # queries < z
            n_gt = s - n_le
            sa = sq.gather(1, qord.flip(1))
            Sc0 = _excl64(sa)
            S_lt = _gather0(Sc0, n_lt)
            S_gt = _gather0(_suffix64(sa), n_le)  # suffix sums: no total minus prefix
            Pc0 = _excl64(phq.gather(1, qord))  # descending
            Phi_gt = _gather0(Pc0, n_gt)
            # flat rows of gh in decreasing query order
            rm = torch.arange(rows, device=dev)
            qbase = ((rm // M) * P + (rm % M) * (2 * s) + s).unsqueeze(1)
            qflat = qbase + qord
            qdw = qd - lv.c  # coefficient of the second table: q (shifted as z)
            vG = torch.empty(rows, s, dtype=torch.float64, device=dev)
            dvl = _split(dv, s, 0, M)
            wl = lv.w
            vkeys = _split(pp.vp, s, 0, M).reshape(rows, s, D)
            for r0 in range(0, rows, cr):
                r1 = min(rows, r0 + cr)
                acc = torch.zeros(r1 - r0, s, dtype=torch.float64, device=dev)
                for d0 in range(0, D, cd):
                    d1 = min(D, d0 + cd)
                    T = _Table(ghflat[:, d0:d1], qflat[r0:r1], torch.ones_like(qdw[r0:r1]),
                               qdw[r0:r1])
                    ng = n_gt[r0:r1]
                    one = torch.ones_like(q[:1])
                    Gg = T.combine([(ng, 0, one)])
                    Hg = T.combine([(ng, 1, one)])
                    del T
                    zz = lv.zc[r0:r1].unsqueeze(-1)
                    vk = vkeys[r0:r1, :, d0:d1]
                    acc += (vk * Gg).sum(-1, dtype=torch.float64)
                    val = (Hg - zz * Gg) * wl[r0:r1].unsqueeze(-1)
                    _add_rows(dvl, r0, r1, d0, d1, val, M)
                vG[r0:r1] = acc
            dzl = -wl.double() * (vG + Phi_gt + S_gt - S_lt)
            _split(dz, s, 0, M).add_(dzl.view(R, M, s))
        if centered:
            # through vbar_i: dv_l += w_l sum_{t >= l} -Rm_t gh_t / W_t
            X = gh * (-Rm * pp.invWpre).to(dt).unsqueeze(-1)
            suffix = _scan(X.flip(1)).flip(1)  # sums over t >= l (exact zeros after the last)
            dv.addcmul_(pp.wp.unsqueeze(-1), suffix)
        dzq = lay.from_pos(dq).to(dt) if ctx.needs_input_grad[0] else None
        dzk = dz[:, :N].to(dt) if ctx.needs_input_grad[1] else None
        dvv = dv[:, :N].contiguous() if ctx.needs_input_grad[2] else None
        dzq, dzk, dvv, _ = ctx.sc.grads(eg, dzq, dzk, dvv)
        return dzq, dzk, dvv, None, None, None


def _prepare(fn, zq, zk, v, key_padding_mask, key_weights, bandwidth=None):
    w = _check(fn, zq, zk, v, key_padding_mask, key_weights, bandwidth)
    lead = zq.shape[:-1]
    Nq, Nk, D = zq.shape[-1], zk.shape[-1], v.shape[-1]
    R = math.prod(lead)
    wr = None if w is None else w.reshape(R, Nk).contiguous()
    return w, wr, lead, R, Nq, Nk, D


@eager_under_compile("causal_sliced_relu_attention: data-dependent divide and conquer, runs eagerly")
def causal_sliced_relu_attention(
    zq: Tensor,
    zk: Tensor,
    v: Tensor,
    *,
    centered: bool = True,
    key_padding_mask: Tensor | None = None,
    key_weights: Tensor | None = None,
) -> Tensor:
    r"""Causal sliced ReLU attention: paper 004 eq. (3) (eq. (2) with ``centered=False``)
    with the sums restricted to the causal prefix :math:`l \le t_i = i + N_k - N_q`.

    .. math::  o_i = \frac{\sum_{j \le t_i} w_j\,\mathrm{ReLU}(z^q_i - z^k_j)\,
               (v_j - \bar v_i)}{\sum_{l \le t_i} w_l\,|z^q_i - z^k_l|},\qquad
               \bar v_i = \frac{\sum_{l \le t_i} w_l v_l}{\sum_{l \le t_i} w_l}

    (:math:`\bar v_i = 0` if not ``centered``): the values are centred over the query's own
    causal prefix (see the module docstring for why), computed exactly in
    :math:`O(n \log^2 n)` time and :math:`O(n D)` memory by divide and conquer over
    positions with sorted prefix tables (eq. 6, Prop. 2.1) at every level.

    Args:
        zq: query scores, ``(..., N_q)``; zk: key scores, ``(..., N_k)``; v: values
            ``(..., N_k, D)`` (e.g. ``(B, H, N)``, ``(B, H, N, D)``).
        centered: eq. 3 (prefix-centred values) or, ``False``, eq. 2.
        key_padding_mask: bool, ``True`` = ignore the key; ``(B, N_k)`` for ``(B, H, N_k)``
            scores, or broadcastable to ``zk``.  Combined with causality: query ``i`` sees
            the unmasked keys ``l <= t_i``.
        key_weights: quadrature weights :math:`w_l \ge 0` broadcastable to ``zk`` (not
            differentiated).

    Returns:
        ``(..., N_q, D)``; a query that sees no (unmasked) key, or whose denominator
        vanishes, gets 0.  Differentiable in ``zq``, ``zk``, ``v`` by a hand-written
        backward pass (again sorted prefix sums); double backward is refused.
    """
    fn = "causal_sliced_relu_attention"
    w, wr, lead, R, Nq, Nk, D = _prepare(fn, zq, zk, v, key_padding_mask, key_weights)
    centered = check_centered(fn, centered)
    if R == 0 or Nq == 0 or D == 0:
        return v.new_zeros(*lead, Nq, D) + 0 * (zq.sum() + zk.sum() + v.sum())
    zq = zq.reshape(R, Nq).contiguous()
    zk = zk.reshape(R, Nk).contiguous()
    v = v.reshape(R, Nk, D).contiguous()
    sc = scales(fn, zq, zk, v, wr)  # also the finiteness checks
    dtype = v.dtype
    if wr is not None and dtype == torch.float32 and weights_span(wr) > RELU_SPAN_F32:
        # weights beyond float32's range of products (issue 42): the sums in float64
        zq, zk, v, wr = zq.double(), zk.double(), v.double(), wr.double()
        sc = scales(fn, zq, zk, v, wr)

    def run(zq, zk, v, w, b=None):
        return _CausalReLU.apply(zq, zk, v, w, centered, scales(fn, zq, zk, v, w))

    seg = None
    if wr is not None and wr.dtype == torch.float64 and not weights_one_scale(wr, SEGMENT_RELU):
        seg = weight_segments(wr, Nq, SEGMENT_RELU, FLUSH_RELU)
    if seg is not None:
        _unusable_sorts()
        out = _by_segments(run, seg, zq, zk, v)
    else:
        out = _CausalReLU.apply(zq, zk, v, wr, centered, sc)
    return out.to(dtype).view(*lead, Nq, D)


def _unusable_sorts() -> None:
    sink = getattr(_SORTS, "sink", None)
    if sink is not None:
        sink["unusable"] = True


def _by_segments(run, seg, zq: Tensor, zk: Tensor, v: Tensor, b: Tensor | None = None) -> Tensor:
    """The causal attention of rows whose key weights span several scales, as the batched
    subproblems of :func:`~opsplit.functional._scale.weight_segments` (``seg``): ``run``
    on the gathered inputs, each real query's output put back (0 for a query that sees no
    key of positive weight).  Plain indexing, so autograd carries the gradients through."""
    kidx, ws, qidx, qreal = seg
    R, Nq = zq.shape
    Nk, D = v.shape[1], v.shape[2]
    S = kidx.shape[0]
    zq_s = zq.reshape(-1)[qidx]
    zk_s = zk.reshape(-1)[kidx]
    v_s = v.reshape(R * Nk, D)[kidx.reshape(-1)].view(S, -1, D)
    b_s = None if b is None else b.reshape(-1)[torch.div(qidx[:, :1], Nq, rounding_mode="floor")]
    out_s = run(zq_s, zk_s, v_s, ws, b_s)
    keep = qreal.reshape(-1)
    src = out_s.reshape(-1, D)[keep]
    return v.new_zeros(R * Nq, D).index_copy(0, qidx.reshape(-1)[keep], src).view(R, Nq, D)


# --------------------------------------------------------------------------------------
# causal sliced ReLU-bump attention (eq. 7)
# --------------------------------------------------------------------------------------
def _bump_ranks(lv: _Keys, q: Tensor, b: Tensor):
    """Ranks of the window ``q - b < z < q + b`` among the sorted keys: ``a0 = #{z <= q-b}``,
    ``a_lt = #{z < q}``, ``a_le = #{z <= q}``, ``a2 = #{z < q+b}`` (clamped so that the
    windows are ordered even where rounding makes ``q +- b == q``)."""
    a_lt = lv.rank(q, "left")
    a_le = lv.rank(q, "right")
    a0 = torch.minimum(lv.rank(q - b, "right"), a_lt)
    a2 = torch.maximum(lv.rank(q + b, "left"), a_le)
    return a0, a_lt, a_le, a2


def _bump_forward(pp: _Prep, b: Tensor):
    """``num`` = sum_{j <= t} w hat(q - z) (v - c) ``(R, P, D)`` and the kernel mass
    ``sum_{j <= t} w hat(q - z)`` ``(R, P)`` (float64), hat(t) = ReLU(1 - |t| / b)."""
    lay = pp.lay
    R, P = lay.R, lay.P
    D = pp.vflat.shape[1]
    dt, dev = pp.vflat.dtype, pp.vflat.device
    num = torch.zeros(R, P, D, dtype=dt, device=dev)
    mass = torch.zeros(R, P, dtype=torch.float64, device=dev)
    qb, zb, wb, vb = _blocks(pp.qp), _blocks(pp.zp), _blocks(pp.wp), _blocks(pp.vp)
    numb, massb = _blocks(num), _blocks(mass)
    bb = b.repeat_interleave(P // BASE, 0).unsqueeze(-1)  # (R * P / BASE, 1, 1)
    L = _tril(dt, dev)
    rng, step = _tile_steps(qb.shape[0], D, dt.itemsize)
    for b0 in rng:
        b1 = min(qb.shape[0], b0 + step)
        d = qb[b0:b1].unsqueeze(-1) - zb[b0:b1].unsqueeze(-2)
        K = torch.relu(1 - d.abs() / bb[b0:b1]) * (L * wb[b0:b1].unsqueeze(-2))
        massb[b0:b1] += K.sum(-1, dtype=torch.float64)
        numb[b0:b1] += torch.bmm(K, vb[b0:b1])
    for s in lay.levels:
        lv = _Keys(lay, s, pp.zp, pp.qp, pp.wp)
        M, rows = lv.M, R * lv.M
        q = lv.q
        br = b.repeat_interleave(M, 0)  # (rows, 1)
        a0, _, a1, a2 = _bump_ranks(lv, q, br)  # the scores as given
        q64, ib = lv.qc.double(), 1.0 / br.double()  # the tables' shift
        qb_ = q64 * ib
        # coefficients of A[a0], A[a1], A[a2], B[a0], B[a1], B[a2] (Lemma B.4)
        cA = (qb_ - 1, -2 * qb_, 1 + qb_)
        cB = (-ib, 2 * ib, -ib)
        ml = torch.zeros_like(q64)
        for a, ca, cb in zip((a0, a1, a2), cA, cB):
            ml += ca * _gather0(lv.Wc0, a) + cb * _gather0(lv.Kc0, a)
        _split(mass, s, 1, M).add_(ml.view(R, M, s))
        nv = _split(num, s, 1, M)
        cr, cd = _chunks(rows, s, D, dt.itemsize)
        for r0 in range(0, rows, cr):
            r1 = min(rows, r0 + cr)
            terms = [(a[r0:r1], 0, c[r0:r1]) for a, c in zip((a0, a1, a2), cA)]
            terms += [(a[r0:r1], 1, c[r0:r1]) for a, c in zip((a0, a1, a2), cB)]
            for d0 in range(0, D, cd):
                d1 = min(D, d0 + cd)
                T = lv.table(pp.vflat, r0, r1, d0, d1)
                val = T.combine(terms)
                del T
                _add_rows(nv, r0, r1, d0, d1, val, M)
    return num, mass


class _CausalBump(torch.autograd.Function):
    @staticmethod
    def forward(ctx, zq, zk, v, w, b, sc):
        # the bandwidth scales with the scores
        zq, zk, v, w, b = sc.scores(zq), sc.scores(zk), sc.values(v), sc.weights(w), sc.scores(b)
        pp = _Prep(zq, zk, v, w)
        lay = pp.lay
        num, mass = _bump_forward(pp, b)
        invW = _safe_inv(pp.Wpre)  # (R, P)
        out_p = (num + (mass.unsqueeze(-1) * pp.cv.double().unsqueeze(1)).to(num.dtype)) \
            * invW.unsqueeze(-1).to(num.dtype)
        out = lay.from_pos(out_p)
        ctx.save_for_backward(zq, zk, v, w, b, out)
        ctx.sc = sc
        return sc.output(out)

    @staticmethod
    @_first_order_only("causal_sliced_relu_bump_attention")
    def backward(ctx, g):
        zq, zk, v, w, b, out = ctx.saved_tensors
        pp = _Prep(zq, zk, v, w)
        lay = pp.lay
        R, P, N = lay.R, lay.P, lay.N
        D = v.shape[2]
        dt, dev = v.dtype, v.device
        g, eg = gradient_in(g.contiguous(), R)  # normalised per row where extreme
        gp = lay.to_pos(g)
        invW = _safe_inv(pp.Wpre)
        gh = gp * invW.unsqueeze(-1).to(dt)  # g_i / W_i
        gc = (gh.double() * pp.cv.double().unsqueeze(1)).sum(-1)  # <gh_i, c>
        dq = torch.zeros(R, P, dtype=torch.float64, device=dev)
        dz = torch.zeros(R, P, dtype=torch.float64, device=dev)
        dv = torch.zeros(R, P, D, dtype=dt, device=dev)
        db_q = torch.zeros(R, P, dtype=torch.float64, device=dev)  # per query: <gh, V_win(|t|/b)>
        # dense blocks
        qb, zb, wb, vb = _blocks(pp.qp), _blocks(pp.zp), _blocks(pp.wp), _blocks(pp.vp)
        ghb, gcb = _blocks(gh), _blocks(gc)
        dqb, dzb, dvb, dbb = _blocks(dq), _blocks(dz), _blocks(dv), _blocks(db_q)
        bb = b.repeat_interleave(P // BASE, 0).unsqueeze(-1)
        L = _tril(dt, dev)
        rng, step = _tile_steps(qb.shape[0], D, dt.itemsize)
        for b0 in rng:
            b1 = min(qb.shape[0], b0 + step)
            d = qb[b0:b1].unsqueeze(-1) - zb[b0:b1].unsqueeze(-2)
            mw = L * wb[b0:b1].unsqueeze(-2)
            bk = bb[b0:b1]
            x = 1 - d.abs() / bk
            inside = (x > 0).to(dt) * mw
            GV = torch.bmm(ghb[b0:b1], vb[b0:b1].transpose(1, 2)) + gcb[b0:b1].unsqueeze(-1).to(dt)
            T = -torch.sign(d) / bk * inside * GV  # hat'(d) <gh_i, v_j>
            dqb[b0:b1] += T.sum(-1, dtype=torch.float64)
            dzb[b0:b1] -= T.sum(-2, dtype=torch.float64)
            # (1/b) <gh_i, V(q-b, q+b)>; the -(1/b) <g_i, o_i> of d hat/db = |t|/b^2 is added
            # once at the end
            dbb[b0:b1] += (inside * GV / bk).sum(-1, dtype=torch.float64)
            dvb[b0:b1] += torch.bmm((torch.relu(x) * mw).transpose(1, 2), ghb[b0:b1])
        for s in lay.levels:
            lv = _Keys(lay, s, pp.zp, pp.qp, pp.wp)
            M, rows = lv.M, R * lv.M
            q, z = lv.q, lv.z
            br = b.repeat_interleave(M, 0)
            ib = 1.0 / br.double()
            a0, alt, ale, a2 = _bump_ranks(lv, q, br)
            ghq = _split(gh, s, 1, M).reshape(rows, s, D)
            gcq = _split(gc, s, 1, M).reshape(rows, s)
            W_ = [_gather0(lv.Wc0, a) for a in (a0, alt, ale, a2)]
            # <gh_i, V(q-b, q) - V(q, q+b)> and <gh_i, V(q-b, q+b)> (true values: + c W)
            sq = gcq * (W_[1] - W_[0] - W_[3] + W_[2])
            sb = gcq * (W_[3] - W_[0])
            cr, cd = _chunks(rows, s, D, dt.itemsize)
            one = torch.ones(1, 1, dtype=dt, device=dev)
            for r0 in range(0, rows, cr):
                r1 = min(rows, r0 + cr)
                A0, At, Ae, A2 = (a[r0:r1] for a in (a0, alt, ale, a2))
                for d0 in range(0, D, cd):
                    d1 = min(D, d0 + cd)
                    T = lv.table(pp.vflat, r0, r1, d0, d1, B=False)
                    Xq = T.combine([(At, 0, one), (A0, 0, -one), (A2, 0, -one), (Ae, 0, one)])
                    Xb = T.combine([(A2, 0, one), (A0, 0, -one)])
                    del T
                    gq = ghq[r0:r1, :, d0:d1]
                    sq[r0:r1] += (Xq * gq).sum(-1, dtype=torch.float64)
                    sb[r0:r1] += (Xb * gq).sum(-1, dtype=torch.float64)
            _split(dq, s, 1, M).add_((-ib * sq).view(R, M, s))
            _split(db_q, s, 1, M).add_((ib * sb).view(R, M, s))
            # keys: windows of queries (sorted); the pair test lo < z < hi is the forward's
            qs, qord = torch.sort(q, dim=1)
            zc = z.contiguous()
            e1 = torch.searchsorted(qs, zc, side="left")  # q < z
            e1p = torch.searchsorted(qs, zc, side="right")  # q <= z
            e0 = torch.minimum(torch.searchsorted((qs + br).contiguous(), zc, side="right"), e1)
            e2 = torch.maximum(torch.searchsorted((qs - br).contiguous(), zc, side="left"), e1p)
            rm = torch.arange(rows, device=dev)
            qflat = ((rm // M) * P + (rm % M) * (2 * s) + s).unsqueeze(1) + qord
            ghflat = gh.reshape(R * P, D)
            Cc0 = _excl64(gcq.gather(1, qord))  # <c, gh> in sorted order
            C_ = [_gather0(Cc0, e) for e in (e0, e1, e1p, e2)]
            zw = lv.zc.double() * ib  # z / b (shifted by the node's heaviest key, as the tables)
            qsc = qs - lv.c
            wl = lv.w
            vz = (C_[3] - C_[2]) - (C_[1] - C_[0])  # <c, G(z, z+b) - G(z-b, z)>
            dvl = _split(dv, s, 0, M)
            vkeys = _split(pp.vp, s, 0, M).reshape(rows, s, D)
            ones_q = torch.ones_like(qs)
            for r0 in range(0, rows, cr):
                r1 = min(rows, r0 + cr)
                E0, E1, E1p, E2 = (e[r0:r1] for e in (e0, e1, e1p, e2))
                zr, ibr, wr_ = zw[r0:r1], ib[r0:r1], wl[r0:r1].double()
                # w (1 - z/b)(G1' - G0) + (H1' - H0)/b + (1 + z/b)(G2 - G1') - (H2 - H1')/b
                terms = [(E0, 0, wr_ * (zr - 1)), (E1p, 0, wr_ * (-2 * zr)), (E2, 0, wr_ * (1 + zr)),
                         (E0, 1, -wr_ * ibr), (E1p, 1, 2 * wr_ * ibr), (E2, 1, -wr_ * ibr)]
                for d0 in range(0, D, cd):
                    d1 = min(D, d0 + cd)
                    T = _Table(ghflat[:, d0:d1], qflat[r0:r1], ones_q[r0:r1], qsc[r0:r1])
                    Gw = T.combine([(E2, 0, one), (E1p, 0, -one), (E1, 0, -one), (E0, 0, one)])
                    vz[r0:r1] += (vkeys[r0:r1, :, d0:d1] * Gw).sum(-1, dtype=torch.float64)
                    del Gw
                    val = T.combine(terms)
                    del T
                    _add_rows(dvl, r0, r1, d0, d1, val, M)
            _split(dz, s, 0, M).add_((wl.double() * ib * vz).view(R, M, s))
        dzq = lay.from_pos(dq).to(dt) if ctx.needs_input_grad[0] else None
        dzk = dz[:, :N].to(dt) if ctx.needs_input_grad[1] else None
        dvv = dv[:, :N].contiguous() if ctx.needs_input_grad[2] else None
        db = None
        if ctx.needs_input_grad[4]:
            go = (g.double() * out.double()).sum(-1)  # (R, N_q)
            db = (db_q.sum(1, keepdim=True) - go.sum(1, keepdim=True) / b.double()).to(b.dtype)
        dzq, dzk, dvv, db = ctx.sc.grads(eg, dzq, dzk, dvv, db)
        return dzq, dzk, dvv, None, db, None


@eager_under_compile("causal_sliced_relu_bump_attention: data-dependent divide and conquer, runs eagerly")
def causal_sliced_relu_bump_attention(
    zq: Tensor,
    zk: Tensor,
    v: Tensor,
    bandwidth,
    *,
    key_padding_mask: Tensor | None = None,
    key_weights: Tensor | None = None,
) -> Tensor:
    r"""Causal sliced ReLU-bump (hat-kernel) attention: paper 004 eq. (7) with the sum
    restricted to the causal prefix :math:`l \le t_i = i + N_k - N_q`,

    .. math::  o_i = \frac{1}{\sum_{l \le t_i} w_l}\sum_{j \le t_i} w_j\,
               \mathrm{ReLU}\Big(1 - \frac{|z^q_i - z^k_j|}{b}\Big)\, v_j

    (the paper's :math:`1/n` becomes the number of keys the query sees), exactly, in
    :math:`O(n \log^2 n)` time: at every level of the divide and conquer the hat kernel is
    three sliced ReLU sums (Lemma B.4) read from one pair of prefix tables.

    Args:
        zq, zk, v, key_padding_mask, key_weights: as in
            :func:`causal_sliced_relu_attention`.
        bandwidth: :math:`b > 0`: a number or a tensor broadcastable to the leading dims of
            ``zq`` (e.g. ``(H,)``); differentiable.

    Returns:
        ``(..., N_q, D)``; a query that sees no (unmasked) key gets 0.
    """
    fn = "causal_sliced_relu_bump_attention"
    w, wr, lead, R, Nq, Nk, D = _prepare(fn, zq, zk, v, key_padding_mask, key_weights,
                                         bandwidth)
    b_full = bandwidth_rows(fn, bandwidth, lead, zq.dtype, zq.device)
    if R == 0 or Nq == 0 or D == 0:
        return v.new_zeros(*lead, Nq, D) + 0 * (zq.sum() + zk.sum() + v.sum() + b_full.sum())
    zq, zk = zq.reshape(R, Nq).contiguous(), zk.reshape(R, Nk).contiguous()
    v, b = v.reshape(R, Nk, D).contiguous(), b_full.reshape(R, 1)
    seg = None if wr is None or weights_one_scale(wr) else weight_segments(wr, Nq)
    if seg is not None:
        scales(fn, zq, zk, v, wr, b)  # the finiteness checks, on every key

        def run(zq, zk, v, w, b):
            return _windows.evaluate(fn, zq, zk, v, w, b, _CausalBump.apply, causal=True)

        _unusable_sorts()
        out = _by_segments(run, seg, zq, zk, v, b)
    else:
        out = _windows.evaluate(fn, zq, zk, v, wr, b, _CausalBump.apply, causal=True)
    return out.view(*lead, Nq, D)
