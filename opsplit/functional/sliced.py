r"""Sliced ReLU attention and sliced ReLU-bump attention (paper 004), exact, in
:math:`O(n \log n)` time and :math:`O(n D)` memory.

With projected scalar scores :math:`z^q_i = \Pi Q x_i` (queries) and :math:`z^k_j = \Pi K x_j`
(keys) and values :math:`v_j \in \mathbb R^D`:

.. math::

    \text{(eq. 2)}\quad o_i &= \frac{\sum_j \mathrm{ReLU}(z^q_i - z^k_j)\, v_j}
                                    {\sum_l |z^q_i - z^k_l|}, \\
    \text{(eq. 3)}\quad o_i &= \frac{\sum_j \mathrm{ReLU}(z^q_i - z^k_j)\,
                                    (v_j - \tfrac1n \sum_l v_l)}{\sum_l |z^q_i - z^k_l|}, \\
    \text{(eq. 7)}\quad o_i &= \frac1n \sum_j \mathrm{ReLU}\Big(1 - \frac{|z^q_i - z^k_j|}{b}\Big) v_j .

**Algorithm (eq. 6, Prop. 2.1).**  Sort the keys of each row once.  With
:math:`p_i = \#\{j : z^k_j < z^q_i\}` and the prefix sums (in sorted key order)
:math:`A_p = \sum_{j<p} \gamma_j`, :math:`B_p = \sum_{j<p} z^k_j \gamma_j`,

.. math::  \sum_j \mathrm{ReLU}(z^q_i - z^k_j)\,\gamma_j = z^q_i A_{p_i} - B_{p_i},

and the denominator is the same identity with scalar weights.  The ReLU-bump kernel is
:math:`\tfrac1b[\mathrm{ReLU}(t+b) - 2\mathrm{ReLU}(t) + \mathrm{ReLU}(t-b)]` (Lemma B.4),
i.e. the same tables read at the three ranks of :math:`z^q_i - b, z^q_i, z^q_i + b`.
Queries are never sorted in the forward pass: they are *ranked* against the sorted keys
(one merged sort, :func:`~opsplit.functional._sorted.sort_and_rank`) and read their table
rows (two for eq. 2, three for eq. 3, seven for eq. 7, with the mean) with one
``embedding_bag``, so queries and keys may differ in number (cross-attention) and no
``N_q x N_k`` tensor exists, in the forward or the backward pass.

**Gradients.**  A custom backward pass, derived analytically: it is again sorted prefix
sums, over the queries for the key and value gradients (eq. 6 transposed), and reads the
kept table :math:`A` for the query gradients; see ``docs/sliced_attention.md``.  When that
backward pass must itself be differentiable (``create_graph=True``: Hessian-vector
products, gradient penalties, ``gradgradcheck``) it recomputes the output with the
composition of differentiable sliced sums of :mod:`~opsplit.functional._sums` and
differentiates that (derivatives of every order, same conventions at ties).  Under
``torch.compile``, ``torch.jit.trace``, the ``torch.func`` transforms (``vmap``, ``grad``,
``jacrev``, ``jvp``, ``hessian``, ...) and forward-mode AD that composition is the whole
kernel (no data-dependent Python control flow; value checks skipped there, see
:func:`opsplit._checks.skip_value_checks`).

**Without autograd** (``torch.no_grad()``, or no input requiring a gradient) eqs. 2-3 need
no table kept for a backward pass: :func:`_relu_forward_fast` keeps eq. 6's tables in two
parts, in-block prefix sums over blocks of 8 sorted keys and their block offsets (a table 8
times smaller), and reads both with the same ``embedding_bag`` (five rows per query), so no
pass adds the offsets into the tables; the values are centred before any sum.  Same
results up to rounding, same conventions (ties, zero denominators, weights, masks,
magnitudes).

**Workspace.**  On the CPU the prefix table of a call and its work buffers are kept for
the next call of the same shape (at most two; :func:`clear_workspace` frees them):
fresh memory would cost a call its first-touch page faults.

**Ties.**  :math:`\mathrm{ReLU}(0) = 0`: a key equal to a query contributes nothing, and
:math:`|0| = 0` in the denominator.  Ranks count keys *strictly* below a query, decided on
the exact float values, so ties (and duplicate scores) contribute exactly zero, as in the
naive formula; the gradients use the same convention as ``torch.relu`` and ``torch.abs``
(derivative 0 at 0).

**Zero denominator.**  If every (unmasked) key equals the query,
:math:`\sum_l |z^q_i - z^k_l| = 0` and the numerator is 0 too.  opsplit returns
:math:`o_i = 0` there (the value of the numerator), with zero gradient through that
query's normalisation: finite values, never NaN.  The same holds for a row whose keys are
all masked.

**Conditioning.**  The formula is invariant under a common shift of all scores; the scores
are shifted by the median key of their row before the tables are built (eqs. 2-3 with key
weights: the median of the heaviest keys, :func:`~opsplit.functional._scale.heaviest`, so
that a heavy key tied with or next to the query cannot cancel the light keys' share of the
denominator: the rounding of :math:`q A - B` stays a multiple of
:math:`\sum_j w_j |q - z_j|`; issue 42), and the values are
centred (for eq. 7 the mean is added back as a rank-one term; for eq. 3 the remainder of
the mean after rounding is), so the prefix sums stay of the size of the result.  Scalar
prefix sums (denominators, kernel masses) are accumulated in float64.  Float32 rows of eqs.
2-3 whose key weights span more than :math:`2^{64}` are summed in float64 (the light keys'
products would leave float32's range, and they carry the denominator where the heavy keys
tie the query).

**Magnitudes** (:mod:`~opsplit.functional._scale`).  The prefix tables multiply scores by
values; every row whose largest score, value or weight lies outside :math:`2^{\pm 32}`
(float32; :math:`2^{\pm 256}` in float64) is rescaled by powers of two first (exact: the
kernels are homogeneous), and the output scaled back; the backward pass does the same with
the incoming gradient.  So the kernels are right at every magnitude the dtype represents,
wherever the result is representable (in float32 scores and values of 1e19 overflowed,
1e-30 underflowed).  **Small
bandwidths** (:mod:`~opsplit.functional._windows`): eq. 7's tables lose about
:math:`\varepsilon\cdot\mathrm{spread}/b` of :math:`\max|v|`; beyond a limit per dtype the
bump is summed pair by pair over the windows in float64, or (float32) read off float64
tables, or refused with a ``ValueError`` naming the bandwidth.

**Weights and masks.**  ``key_weights`` :math:`w_j \ge 0` turn every sum over keys into a
quadrature :math:`\sum_j w_j (\cdot)` (the :math:`\Omega_x` integral of paper 004's eq. 8
on a grid; uniform weights cancel).  ``key_padding_mask`` (``True`` = ignore the key, as in
``torch.nn.MultiheadAttention``) sets :math:`w_j = 0`.  For eq. 7 the :math:`1/n` becomes
:math:`1/\sum_j w_j` (the number of unmasked keys).  As with
``scaled_dot_product_attention``, values at masked keys must be finite.
"""

from __future__ import annotations

import math
import threading

import torch
import torch.nn.functional as F
from torch import Tensor

from .._checks import skip_value_checks
from . import _windows
from ._inputs import bandwidth_rows, check_centered, check_scores_values, scales, transform
from ._inputs import key_weights as combine_key_weights
from ._scale import RELU_SPAN_F32, gradient_in, heaviest, weights_span
from ._sorted import (
    BLOCK,
    PrefixTable,
    _tril,
    embedding_bag_into,
    padded_length,
    sort_and_rank,
    sort_and_rank_one,
    table_index_into,
)
from ._sums import bump_attention_composed, relu_attention_composed

__all__ = ["sliced_relu_attention", "sliced_relu_bump_attention"]

# rows of a reused prefix table per chunk: at most this many bytes
_TABLE_BYTES = 32 << 20
# queries (or keys) per slice of a gather / embedding_bag: small temporaries, reused memory
_STEP = 1 << 13


# --------------------------------------------------------------------------------------
# validation
# --------------------------------------------------------------------------------------
def _check_inputs(fn: str, zq, zk, v, key_padding_mask, key_weights, check_values=True):
    """Metadata checks of ``zq, zk, v`` and the combined key weights (or ``None``); the
    finiteness of the scores and values is checked with their magnitudes
    (:func:`~opsplit.functional._inputs.scales`)."""
    check_scores_values(fn, zq, zk, v)
    return combine_key_weights(fn, key_padding_mask, key_weights, zk.shape, zk.dtype,
                               zk.device, check_values=check_values)


def _graph_mode(*tensors) -> bool:
    """True under ``torch.compile``, ``torch.jit`` tracing, ``torch.func`` transforms
    (``vmap``, ``grad``, ``jacrev``, ``jvp``, ``hessian``, ...) and forward-mode AD: there
    the kernels are evaluated by their composition of differentiable sliced sums
    (:mod:`~opsplit.functional._sums`), which has no data-dependent Python control flow and
    no custom autograd function (the fast kernels chunk their work by sizes read at run
    time, which a graph would freeze, and have a hand-written first-order backward)."""
    return skip_value_checks() or transform(*tensors) is not None


def _rows(x: Tensor, n: int) -> Tensor:
    return x.reshape(-1, n)


def _suffix0(x: Tensor) -> Tensor:
    """``(R, N)`` -> ``(R, N + 1)`` suffix sums: ``[:, p]`` = ``x[:, p:].sum(1)`` (0 at ``p = N``)."""
    return torch.nn.functional.pad(torch.flip(torch.cumsum(torch.flip(x, [1]), 1), [1]), (0, 1))


def _gather0(table64: Tensor, p: Tensor) -> Tensor:
    """``table64[r, p - 1]`` with 0 for ``p = 0`` (exclusive prefix of an inclusive cumsum)."""
    padded = torch.nn.functional.pad(table64, (1, 0))
    return padded.gather(1, p)


class _ATable:
    """A compact copy of the table :math:`A` (eq. 6's :math:`a_i`) of every row, kept for the
    backward pass: ``(R * Np + 1, D)`` with a final row of zeros."""

    def __init__(self, R: int, Np: int, D: int, dtype, device):
        self.R, self.Np = R, Np
        self.flat = torch.empty(R * Np + 1, D, dtype=dtype, device=device)
        self.flat[-1].zero_()

    def copy_from(self, tab: PrefixTable, r0: int, r1: int) -> None:
        n = r1 - r0
        src = tab.flat[: n * tab.nb * 2 * BLOCK].view(n, tab.nb, 2 * BLOCK, -1)[:, :, :BLOCK]
        self.flat[r0 * self.Np : r1 * self.Np].view(n, tab.nb, BLOCK, -1).copy_(src)

    def index(self, p: Tensor) -> Tensor:
        rows = torch.arange(p.shape[0], device=p.device, dtype=torch.int64).unsqueeze(1)
        return torch.where(p > 0, rows * self.Np + p - 1, self.flat.shape[0] - 1)


def _table_rows(N: int, D: int, dtype, R: int) -> int:
    """Rows per chunk of a reused :class:`PrefixTable` (at most ``_TABLE_BYTES``)."""
    per_row = padded_length(N) * 2 * D * torch.empty((), dtype=dtype).element_size()
    return max(1, min(R, _TABLE_BYTES // max(1, per_row)))


# Reused CPU workspaces: a prefix table (and the gather / block-sum buffers it holds) is
# kept after a call for the next call of the same shape, at most _WORKSPACE_MAX tables (each
# at most _TABLE_BYTES plus its work buffers).  Fresh memory costs a page fault per 4 KiB on
# first touch, which at N = 4K is more than half of a call's time; on CUDA torch's caching
# allocator already reuses memory.  clear_workspace() frees them.
_WORKSPACE: dict = {}
_WORKSPACE_MAX = 2
_WORKSPACE_LOCK = threading.Lock()


def clear_workspace() -> None:
    """Free the prefix tables kept for reuse between calls of the sliced kernels (CPU)."""
    with _WORKSPACE_LOCK:
        _WORKSPACE.clear()


def _take_table(R: int, N: int, D: int, n_extra: int, dtype, device) -> PrefixTable:
    key = (R, N, D, n_extra, dtype, str(device))
    if torch.device(device).type == "cpu":
        with _WORKSPACE_LOCK:
            tab = _WORKSPACE.pop(key, None)  # one user at a time (threads)
        if tab is not None:
            return tab
    tab = PrefixTable(R, N, D, n_extra, dtype=dtype, device=device)
    tab._key = key
    return tab


def _give_back(tab: PrefixTable) -> None:
    key = getattr(tab, "_key", None)
    if key is None or tab.flat.device.type != "cpu":
        return
    with _WORKSPACE_LOCK:
        _WORKSPACE.pop(key, None)
        while len(_WORKSPACE) >= _WORKSPACE_MAX:
            _WORKSPACE.pop(next(iter(_WORKSPACE)))
        _WORKSPACE[key] = tab


def _run_tables(R, N, M, D, dtype, device, *, n_extra, build, combine, keep_A=False):
    """Build prefix tables over ``N`` sorted positions and combine them for ``M`` outputs
    per row, chunk of rows by chunk of rows through one reused table.

    ``build(tab, r0, r1)`` fills the tables (and extra rows) of rows ``r0:r1`` as local rows
    ``0..n-1`` and returns a per-row tensor or ``None``; ``combine(tab, r0, r1)`` returns the
    ``embedding_bag`` indices and coefficients ``(n * M, E)``.  Returns ``(out (R, M, D),
    A-table or None, per-row results)``; with ``keep_A`` the table A of every row is kept.
    """
    c = _table_rows(N, D, dtype, R)
    tab = _take_table(c, N, D, c if n_extra else 0, dtype, device)
    keep = _ATable(R, tab.Np, D, dtype, device) if keep_A else None
    if c == R:
        extra = build(tab, 0, R)
        if keep is not None:
            keep.copy_from(tab, 0, R)
        index, coeff = combine(tab, 0, R)
        out = tab.combine(index, coeff).view(R, M, D)
        _give_back(tab)
        return out, keep, extra
    out = torch.empty(R, M, D, dtype=dtype, device=device)
    extras = []
    for r0 in range(0, R, c):
        r1 = min(R, r0 + c)
        extras.append(build(tab, r0, r1))
        if keep is not None:
            keep.copy_from(tab, r0, r1)
        index, coeff = combine(tab, r0, r1)
        tab.combine_into(out[r0:r1].view(-1, D), index, coeff)
    extra = None if extras[0] is None else torch.cat(extras)
    _give_back(tab)
    return out, keep, extra


def _rowdots(flat: Tensor, index: Tensor, other: Tensor, step: int | None = None,
             mean: Tensor | None = None) -> Tensor:
    """``out[m] = <flat[index[m]], other[m]>`` (float64), gathering ``step`` rows at a time
    into one reused buffer, so that the gathered rows never exist all at once.  With
    ``mean`` (``(n, D)``, ``other`` holding ``n`` equal runs of rows):
    ``<flat[index[m]], other[m] - mean[run of m]>``, the difference taken before the
    products (in a second reused buffer)."""
    M = other.shape[0]
    step = step or _STEP
    out = torch.empty(M, dtype=torch.float64, device=other.device)
    buf = flat.new_empty(max(1, min(M, step)), flat.shape[1])
    if mean is not None:
        per = M // max(1, mean.shape[0])
        cbuf = other.new_empty(max(1, min(M, step)), other.shape[1])
    for m0 in range(0, M, step):
        m1 = min(M, m0 + step)
        rows = torch.index_select(flat, 0, index[m0:m1], out=buf[: m1 - m0])
        o = other[m0:m1]
        if mean is not None:
            run = torch.arange(m0, m1, device=other.device) // per
            o = torch.index_select(mean, 0, run, out=cbuf[: m1 - m0])
            torch.sub(other[m0:m1], o, out=o)
        out[m0:m1] = _dot_rows(rows, o)
    return out


def _dot_rows(a: Tensor, b: Tensor) -> Tensor:
    """Row-wise dot products of two ``(M, D)`` tensors."""
    return torch.bmm(a.unsqueeze(1), b.unsqueeze(2)).view(-1)


class _Keys:
    """Sorted keys of each row, their weights, shift and scalar prefix sums (float64)."""

    def __init__(self, zk: Tensor, w: Tensor | None, probes, transpose=False, heavy=False):
        R, N = zk.shape
        self.R, self.N = R, N
        zs = zk if w is None else torch.where(w > 0, zk, torch.full_like(zk, math.inf))
        res = sort_and_rank(zs, probes, transpose=transpose)
        order, ks, counts = res[:3]
        self.tcounts, self.porder = (res[3], res[4]) if transpose else (None, None)
        self.order, self.counts = order, counts
        rows = torch.arange(R, device=zk.device).unsqueeze(1)
        self.order_global = order + rows * N
        if w is None:
            self.n_valid = torch.full((R,), N, device=zk.device, dtype=torch.int64)
            self.ws = None
        else:
            self.ws = w.gather(1, order)
            self.n_valid = (self.ws > 0).sum(1)
        if heavy and w is not None:  # eqs. 2-3: the median of the heaviest keys (_scale.heaviest)
            mid = heaviest(self.ws)
        else:
            mid = ((self.n_valid - 1).clamp_min(0) // 2).unsqueeze(1)
        c = ks.gather(1, mid)
        self.c = torch.where(self.n_valid.unsqueeze(1) > 0, c, torch.zeros_like(c))  # (R, 1)
        ksh = ks - self.c
        if w is not None:
            ksh = torch.where(self.ws > 0, ksh, torch.zeros_like(ksh))
        self.ks = ksh  # shifted sorted keys, 0 at masked keys (dtype of zk)
        ws64 = torch.ones_like(ksh, dtype=torch.float64) if w is None else self.ws.double()
        # exclusive prefix sums of the weights and weighted keys, (R, N + 1): [:, p] = sum_{j<p}
        self.Wc0 = torch.zeros(R, N + 1, dtype=torch.float64, device=zk.device)
        self.Kc0 = torch.zeros(R, N + 1, dtype=torch.float64, device=zk.device)
        torch.cumsum(ws64, 1, out=self.Wc0[:, 1:])
        torch.cumsum(ws64 * ksh.double(), 1, out=self.Kc0[:, 1:])
        self.Wc, self.Kc = self.Wc0[:, 1:], self.Kc0[:, 1:]  # inclusive
        self.W = self.Wc0[:, -1:]
        self.K = self.Kc0[:, -1:]

    def suffix(self) -> Tensor:
        """``(R, N + 1)``: ``[:, p]`` = the weight of the sorted keys ``p, p + 1, ...`` (float64
        suffix sums, no cancellation)."""
        ws64 = torch.ones(self.R, self.N, dtype=torch.float64, device=self.Wc0.device) if self.ws is None \
            else self.ws.double()
        return _suffix0(ws64)

    def W_lt(self, p):
        return self.Wc0.gather(1, p)

    def K_lt(self, p):
        return self.Kc0.gather(1, p)


def _backward_by_recompute(ctx, g: Tensor, fn, inputs) -> tuple:
    """The backward pass when it must itself be differentiable (``create_graph=True``):
    recompute the output as ``fn(*inputs)``, a composition of the differentiable sliced
    sums of :mod:`~opsplit.functional._sums`, and differentiate that with
    ``create_graph=True``.  ``inputs`` are the saved inputs (``None`` where not saved), in
    the order of ``ctx.needs_input_grad``."""
    idx = [i for i, x in enumerate(inputs) if x is not None and ctx.needs_input_grad[i]]
    with torch.enable_grad():
        out = fn(*inputs)
    grads = torch.autograd.grad(out, [inputs[i] for i in idx], g, create_graph=True,
                                allow_unused=True)
    res = [None] * len(inputs)
    for i, gr in zip(idx, grads):
        res[i] = gr
    return tuple(res)


def _gradient_rows(g: Tensor, zq: Tensor, v: Tensor):
    """The incoming gradient of a sliced backward pass: ``g`` ``(R, N_q, D)`` normalised per
    row where extreme, its exponents, ``g`` as rows ``(R N_q, D)``, and the sizes
    ``(R, N_q, N_k, D)`` of the saved ``zq`` ``(R, N_q)`` and ``v`` ``(R, N_k, D)``."""
    R, Nq = zq.shape
    Nk, D = v.shape[1], v.shape[2]
    g, eg = gradient_in(g.contiguous(), R)
    return g, eg, g.view(R * Nq, D), (R, Nq, Nk, D)


def _safe_inv(x64: Tensor) -> Tensor:
    nz = x64 != 0
    return torch.where(nz, 1.0 / torch.where(nz, x64, torch.ones_like(x64)), torch.zeros_like(x64))


# --------------------------------------------------------------------------------------
# sliced ReLU attention without gradients: in-block tables and block offsets in one bag
# --------------------------------------------------------------------------------------
_EXCL_CACHE: dict = {}
#: sorted keys per block of the tables of :func:`_relu_forward_fast` (a power of two)
_FAST_BLOCK = 8
_FAST_SHIFT = _FAST_BLOCK.bit_length() - 1


def _strict_tril(S: int, dtype, device) -> Tensor:
    key = (S, dtype, str(device))
    t = _EXCL_CACHE.get(key)
    if t is None:
        t = torch.tril(torch.ones(S, S, dtype=dtype, device=device), -1)
        _EXCL_CACHE[key] = t
    return t


#: blocks per superblock of :func:`_exclusive_scan`
_SCAN_S = 16


def _exclusive_scan(x: Tensor, out: Tensor) -> Tensor:
    """``out[:, b] = sum_{b' < b} x[:, b']`` for contiguous ``(n, nb, C)`` tensors with ``nb``
    a multiple of :data:`_SCAN_S`: a strictly lower-triangular matmul per superblock of
    :data:`_SCAN_S` rows, then ``torch.cumsum`` of the superblock totals (``n * nb / 16``
    rows), added back (``torch.cumsum`` along a strided axis is several times slower)."""
    n, nb, C = x.shape
    S = _SCAN_S
    ns = nb // S
    xb, ob = x.view(n * ns, S, C), out.view(n * ns, S, C)
    torch.matmul(_strict_tril(S, x.dtype, x.device), xb, out=ob)
    if ns > 1:
        tot = (ob[:, S - 1] + xb[:, S - 1]).view(n, ns, C)
        pre = torch.cumsum(tot[:, :-1], 1)
        out.view(n, ns, S, C)[:, 1:].add_(pre.unsqueeze(2))
    return out


#: bytes of the reused work matrices of :func:`_relu_forward_fast` per chunk of rows
_FAST_BYTES = 64 << 20
#: values gathered at a time by :func:`_relu_forward_fast` (they stay in cache until summed)
_FAST_STEP_ROWS = 1 << 12


class _FastWork:
    """Reused buffers of :func:`_relu_forward_fast` for one shape (CPU workspace)."""

    def __init__(self, n, Np, nb, nbs, Nq, D, E, dtype, device):
        S = _FAST_BLOCK
        e = dict(dtype=dtype, device=device)
        # the bag matrix: in-block tables (n * nb blocks of 2S rows: A then B), block offsets
        # (n * nbs blocks of 2 rows, the exclusive prefix over blocks), the remainders of the
        # mean (n rows)
        self.base_off = n * nb * 2 * S
        self.base_rem = self.base_off + n * nbs * 2
        self.flat = torch.empty(self.base_rem + n, D, **e)
        self.X = torch.empty(min(n * Np, _FAST_STEP_ROWS), D, **e)
        self.Lc = torch.empty(n * nb, 2 * S, S, **e)
        self.tot = torch.zeros(n, nbs, 2 * D, **e)  # block totals, zero past the last block
        self.gi = torch.empty(n, Np, dtype=torch.int64, device=device)
        self.cw = torch.zeros(n, Np, 2, **e)  # the weights c^A, c^B per sorted position
        self.idx = torch.empty(n, Nq, E, dtype=torch.int64, device=device)
        self.cf = torch.empty(n, Nq, E, **e)
        lr = torch.arange(n, device=device).unsqueeze(1)  # local rows
        self.rowA = lr * (nb * 2 * S)  # first table row of each local row
        self.rowB = self.base_off + lr * (nbs * 2)  # its first offset row
        if E == 5:
            self.idx[..., 4] = self.base_rem + lr  # the remainder of the mean, per row
        self.unit_A = False  # whether Lc[:, :S] holds the weights 1 (0 at position 0, padding)


def _relu_forward_fast(zq: Tensor, zk: Tensor, v: Tensor, w: Tensor | None,
                       centered: bool) -> Tensor:
    r"""Eqs. 2-3 on rows when no gradient is recorded: the same sort, shift, centring and
    float64 denominators as :class:`_SlicedReLU`, with eq. 6's tables kept in two parts.
    Blocks of :data:`_FAST_BLOCK` sorted keys, preceded by a key of weight 0 (so that the
    exclusive prefix :math:`\sum_{j<p}` is the inclusive one at position :math:`p`), give
    in-block prefix sums (one ``bmm``) and block totals; their exclusive prefix over the
    blocks (:func:`_exclusive_scan`) is a table :data:`_FAST_BLOCK` times smaller, read as two
    more rows of the same ``embedding_bag``:

    .. math::  q A_p - B_p = q\,(a_p + \alpha_{b}) - (\beta_p + \beta'_{b}),\qquad
               b = \lfloor p / S \rfloor

    (:math:`a, \beta`: in-block sums; :math:`\alpha, \beta'`: block offsets), so no pass
    adds the offsets into the tables.  The values are centred (by the mean rounded to their
    dtype) before any sum, the remainder of the mean enters as a rank-one row, as in
    :class:`_SlicedReLU`.  ``zq (R, N_q)``, ``zk (R, N_k)``, ``v (R, N_k, D)``, ``w (R, N_k)``
    or ``None``, already rescaled (:mod:`._scale`); returns ``(R, N_q, D)``."""
    R, Nq = zq.shape
    Nk, D = v.shape[1], v.shape[2]
    dt, dev = v.dtype, v.device
    S = _FAST_BLOCK
    if centered:  # first, while v may still be in cache from the finiteness check
        vs = _value_sum(v, w)
    zs = zk if w is None else torch.where(w > 0, zk, torch.full_like(zk, math.inf))
    perm, ks, p = sort_and_rank_one(zs, zq)  # perm: flat key index in sorted order
    if w is None:
        c = ks[:, (Nk - 1) // 2 :][:, :1]
        ksh = ks - c
        ws = None
        W = torch.full((R, 1), float(Nk), dtype=torch.float64, device=dev)
        Wlt = p.double()
        kw64 = ksh.double()
    else:  # as _Keys(heavy=True): the median of the heaviest keys, 0 at masked keys
        ws = w.reshape(-1)[perm].view(R, Nk)
        valid = ws > 0
        n_valid = valid.sum(1, keepdim=True)
        c = torch.where(n_valid > 0, ks.gather(1, heaviest(ws)), torch.zeros_like(ks[:, :1]))
        ksh = torch.where(valid, ks - c, torch.zeros_like(ks))
        ws64 = ws.double()
        Wc0 = torch.zeros(R, Nk + 1, dtype=torch.float64, device=dev)
        torch.cumsum(ws64, 1, out=Wc0[:, 1:])
        W = Wc0[:, -1:]
        Wlt = Wc0.gather(1, p)
        kw64 = ws64 * ksh.double()
    Kc0 = torch.zeros(R, Nk + 1, dtype=torch.float64, device=dev)
    torch.cumsum(kw64, 1, out=Kc0[:, 1:])
    K = Kc0[:, -1:]
    Klt = Kc0.gather(1, p)
    q64 = (zq - c).double()
    den = q64 * (2 * Wlt - W) - (2 * Klt - K)  # eq. 6 for sum_l w_l |q - z_l|
    inv = den.reciprocal().masked_fill_(den == 0, 0.0)  # 0 where the denominator vanishes
    Wsafe = W if w is None else torch.where(W > 0, W, torch.ones_like(W))
    if centered:  # the mean, rounded to the dtype: subtracted from the values before any sum
        m32 = _rounded_mean(vs, W, dt)  # (R, D)
    # positions 0 .. Nk of a row: a key of weight 0, then the sorted keys; padded to blocks
    Np = -(-(Nk + 1) // S) * S
    nb = Np // S
    nbs = -(-(nb + 1) // _SCAN_S) * _SCAN_S  # offsets of blocks 0 .. nb (and padding)
    E = 5 if centered else 4
    per_row = (nb * 2 * S + nbs * 2 + 1) * D * v.element_size()
    c_rows = max(1, min(R, _FAST_BYTES // max(1, per_row)))
    key = ("fast", c_rows, Nk, Nq, D, E, _FAST_STEP_ROWS, dt, str(dev))
    with _WORKSPACE_LOCK:
        wk = _WORKSPACE.pop(key, None) if dev.type == "cpu" else None
    if wk is None:
        wk = _FastWork(c_rows, Np, nb, nbs, Nq, D, E, dt, dev)
    flat = wk.flat
    L = _tril(S, dt, dev)
    vflat = v.reshape(R * Nk, D)
    qi = q64 * inv  # coefficients of A_p and B_p (and of their block offsets): q / den, -1 / den
    rem_c = (Klt - q64 * Wlt).mul_(inv) if centered else None  # of the mean's remainder
    out = None if c_rows == R else torch.empty(R * Nq, D, dtype=dt, device=dev)
    for r0 in range(0, R, c_rows):
        r1 = min(R, r0 + c_rows)
        n = r1 - r0
        nblk = n * nb
        # gather the values in sorted order (position 0 and the padding: any row, weight 0)
        gi = wk.gi[:n]
        gi[:, 1 : Nk + 1] = perm.view(R, Nk)[r0:r1]
        gi[:, :1] = gi[:, 1:2]
        gi[:, Nk + 1 :] = gi[:, 1:2]
        # Lc: per block, S rows L * c^A then S rows L * c^B (L lower triangular)
        cw = wk.cw[:n]  # (n, Np, 2): zero at position 0 and the padding
        Lc = wk.Lc[:nblk]
        cwb = cw.view(nblk, S, 2)
        if ws is None:
            cw[:, 1 : Nk + 1, 1] = ksh[r0:r1]
            if not wk.unit_A:  # kept from the last call with this workspace
                wk.cw[:, 1 : Nk + 1, 0] = 1
                torch.mul(L, wk.cw.view(-1, S, 2)[:, :, 0].unsqueeze(1), out=wk.Lc[:, :S])
                wk.unit_A = True
        else:
            cw[:, 1 : Nk + 1, 0] = ws[r0:r1]
            torch.mul(ws[r0:r1], ksh[r0:r1], out=cw[:, 1 : Nk + 1, 1])
            torch.mul(L, cwb[:, :, 0].unsqueeze(1), out=Lc[:, :S])
            wk.unit_A = False
        torch.mul(L, cwb[:, :, 1].unsqueeze(1), out=Lc[:, S:])
        Y = flat[: nblk * 2 * S].view(nblk, 2 * S, D)
        # gather (and centre) the values of a few blocks at a time, then their in-block sums:
        # the gathered values stay in cache between the three passes
        X = wk.X
        step = max(1, min(nb, _FAST_STEP_ROWS // S))
        for lr in range(n):
            for b0 in range(lr * nb, (lr + 1) * nb, step):
                b1 = min((lr + 1) * nb, b0 + step)
                Xs = X[: (b1 - b0) * S]
                torch.index_select(vflat, 0, gi.view(-1)[b0 * S : b1 * S], out=Xs)
                if centered:
                    Xs.sub_(m32[r0 + lr])
                torch.bmm(Lc[b0:b1], Xs.view(b1 - b0, S, D), out=Y[b0:b1])
        # block totals (A, B) -> exclusive prefix over the blocks
        tot = wk.tot[:n]
        tot[:, :nb].view(n, nb, 2, D).copy_(Y.view(n, nb, 2, S, D)[:, :, :, S - 1])
        offs = flat[wk.base_off : wk.base_off + n * nbs * 2].view(n, nbs, 2 * D)
        _exclusive_scan(tot, offs)
        if centered:
            # the exact mean is m32 + (sum of the centred values) / W: the remainder enters
            # with weight sum_j w_j relu(q_i - z_j)
            rem = flat[wk.base_rem : wk.base_rem + n]
            tot_c = offs[:, nb, :D].double()
            if w is None:
                rem.copy_(tot_c.div_(Nk))
            else:
                rem.copy_(torch.where(W[r0:r1] > 0, tot_c / Wsafe[r0:r1], 0.0))
        # per query: in-block rows a_p, beta_p, offsets of block p // S, the remainder
        pp = p[r0:r1]
        t = pp >> _FAST_SHIFT  # block of position p; row t 2S + (p - t S) = p + t S
        idx, cf = wk.idx[:n], wk.cf[:n]
        ia = idx[..., 0]
        torch.add(pp, t, alpha=S, out=ia)
        ia.add_(wk.rowA[:n])
        torch.add(ia, S, out=idx[..., 1])
        torch.add(wk.rowB[:n], t, alpha=2, out=idx[..., 2])
        torch.add(idx[..., 2], 1, out=idx[..., 3])
        cf[..., 0] = qi[r0:r1]
        cf[..., 1] = inv[r0:r1]
        cf[..., 1].neg_()
        cf[..., 2:4] = cf[..., 0:2]
        if centered:
            cf[..., 4] = rem_c[r0:r1]
        if out is None:
            out = F.embedding_bag(idx.view(-1, E), flat, per_sample_weights=cf.view(-1, E),
                                  mode="sum")
        else:  # slices of _STEP queries: a small temporary, reused
            embedding_bag_into(out[r0 * Nq : r1 * Nq], flat, idx.view(-1, E), cf.view(-1, E))
    if dev.type == "cpu":
        with _WORKSPACE_LOCK:
            _WORKSPACE.pop(key, None)
            while len(_WORKSPACE) >= _WORKSPACE_MAX:
                _WORKSPACE.pop(next(iter(_WORKSPACE)))
            _WORKSPACE[key] = wk
    return out.view(R, Nq, D)


# --------------------------------------------------------------------------------------
# sliced ReLU attention (eqs. 2-3)
# --------------------------------------------------------------------------------------
def _value_sum(v: Tensor, w: Tensor | None) -> Tensor:
    """The (weighted) sum of the values of each row, ``(R, D)`` in their dtype: ``torch.sum``'s
    (pairwise), within about a unit in the last place, so that values centred by
    :func:`_rounded_mean` keep no offset of their own to cancel against the remainder the
    kernels add (``bmm`` with the weights is off by about 20 units at 4K keys, 5e-6 of eq. 3
    at values of 1e6; float64 accumulation costs a float64 copy of the values)."""
    return v.sum(1) if w is None else (w.unsqueeze(2) * v).sum(1)


def _rounded_mean(vs: Tensor, W: Tensor, dtype: torch.dtype) -> Tensor:
    """The mean ``vs / W`` of each row rounded to ``dtype``, ``(R, D)``, 0 where the weights
    sum to 0 (``vs``: :func:`_value_sum`; ``W``: ``(R, 1)`` float64 weight totals).  Only a
    shift: the kernels add its remainder, read off the centred tables."""
    return torch.where(W > 0, vs.double() / torch.where(W > 0, W, torch.ones_like(W)), 0.0).to(dtype)


def _centred_rows(v: Tensor, m: Tensor, r0: int, r1: int, tab: PrefixTable) -> Tensor:
    """``v[r0:r1] - m[r0:r1]`` as ``((r1 - r0) N_k, D)`` rows, in a buffer kept with the
    (reused) table ``tab`` for the next chunk of rows and the next call: written in full
    before every use, never read stale."""
    n, Nk, D = r1 - r0, v.shape[1], v.shape[2]
    buf = getattr(tab, "_centred", None)
    if buf is None or buf.shape[0] < n * Nk or buf.shape[1] != D or buf.dtype != v.dtype:
        buf = tab._centred = v.new_empty(n * Nk, D)
    out = buf[: n * Nk]
    torch.sub(v[r0:r1], m[r0:r1].unsqueeze(1), out=out.view(n, Nk, D))
    return out


class _SlicedReLU(torch.autograd.Function):
    @staticmethod
    def forward(ctx, zq, zk, v, w, centered, sc):
        # sc: per-row power-of-two scales (opsplit.functional._scale); the tables are built
        # for the rescaled scores, values and weights, the output is scaled back
        originals = (zq, zk, v, w)
        zq, zk, v, w = sc.scores(zq), sc.scores(zk), sc.values(v), sc.weights(w)
        R, Nq = zq.shape
        Nk, D = v.shape[1], v.shape[2]
        need_grad = any(ctx.needs_input_grad[:3])
        if not need_grad:
            return sc.output(_relu_forward_fast(zq, zk, v, w, centered))
        probes = [(zq, "left")] + ([(zq, "right")] if need_grad else [])
        # with gradients, the same sort also ranks the keys among the queries (transpose)
        keys = _Keys(zk, w, probes, transpose=need_grad, heavy=True)
        p = keys.counts[0]
        q64 = (zq - keys.c).double()
        Wlt, Klt = keys.W_lt(p), keys.K_lt(p)
        den = q64 * (2 * Wlt - keys.W) - (2 * Klt - keys.K)  # eq. 6 for sum_l w_l |q - z_l|
        inv = _safe_inv(den)
        cB = keys.ks if keys.ws is None else keys.ws * keys.ks
        E = 3 if centered else 2
        vflat = v.reshape(R * Nk, D)
        if centered:
            m32 = _rounded_mean(_value_sum(v, w), keys.W, v.dtype)  # (R, D), subtracted before any sum

        def build(tab, r0, r1):
            ws = None if keys.ws is None else keys.ws[r0:r1]
            if not centered:
                tab.build(vflat, keys.order_global[r0:r1], ws, cB[r0:r1], center=False)
                return None
            # the tables of v - m32, centred before the in-block sums (centring the sums
            # afterwards leaves each entry the rounding of a raw sum, eps 8 |m|)
            n = r1 - r0
            vc = _centred_rows(v, m32, r0, r1, tab)
            tab.build(vc, keys.order_global[r0:r1] - r0 * Nk, ws, cB[r0:r1], center=False)
            # the exact mean is m32 + (the centred table's total) / W: its remainder, small
            tot = tab.flat.index_select(0, tab.index(0, torch.full(
                (n, 1), Nk, dtype=torch.int64, device=v.device)).view(-1)).double()
            W = keys.W[r0:r1]
            m_lo = torch.where(W > 0, tot / torch.where(W > 0, W, torch.ones_like(W)), 0.0)
            tab.extra()[:n].copy_(m_lo)
            return m_lo

        def combine(tab, r0, r1):
            pp = p[r0:r1]
            n = r1 - r0
            idx = [tab.index(0, pp), tab.index(1, pp)]
            coeff = torch.empty(n, Nq, E, dtype=v.dtype, device=v.device)
            coeff[..., 0] = q64[r0:r1] * inv[r0:r1]  # (q A_p - B_p) / den
            coeff[..., 1] = -inv[r0:r1]
            if centered:
                # the tables hold v - m32 (m32: the mean rounded to v's dtype); the remainder
                # m - m32 enters as a rank-one term with weight sum_j w_j relu(q_i - z_j)
                rows = torch.arange(n, device=pp.device).unsqueeze(1)
                idx.append((tab.extra_base + rows).expand(n, Nq))
                coeff[..., 2] = (Klt[r0:r1] - q64[r0:r1] * Wlt[r0:r1]) * inv[r0:r1]
            return torch.stack(idx, -1).view(-1, E), coeff.view(-1, E)

        out, keepA, m_lo = _run_tables(R, Nk, Nq, D, v.dtype, v.device, n_extra=centered,
                                       build=build, combine=combine, keep_A=need_grad)
        if need_grad:
            m = None
            if centered:
                m, m_lo = m32, m_lo.to(v.dtype)
            le_k, lt_k = keys.tcounts  # queries <= and < each key
            ctx.save_for_backward(*originals, zq, zk, v, w, out, den, m, m_lo, keepA.flat, p,
                                  keys.counts[1], keys.c, Wlt, Klt, keys.W, keys.suffix(),
                                  keys.porder, lt_k, le_k)
            ctx.Np = keepA.Np
            ctx.centered = centered
            ctx.sc = sc
        return sc.output(out)

    @staticmethod
    def backward(ctx, g):
        (zq0, zk0, v0, w0, zq, zk, v, w, out, den, m, m_lo, Aflat, p, p_le, c, Wlt, Klt, W, Wsuf,
         order_q, lt_k, le_k) = ctx.saved_tensors
        if torch.is_grad_enabled():  # create_graph=True: a differentiable backward pass
            centered = ctx.centered
            return _backward_by_recompute(
                ctx, g, lambda a, b, c_, d, e, f: relu_attention_composed(a, b, c_, d, centered),
                (zq0, zk0, v0, w0, None, None))
        g, eg, gflat, (R, Nq, Nk, D) = _gradient_rows(g, zq, v)
        dt = v.dtype
        inv = _safe_inv(den)  # (R, Nq) float64
        go = _dot_rows(gflat, out.reshape(R * Nq, D)).view(R, Nq).double()
        s = -inv * go  # dL/d den_i
        dzq = dzk = dv = None
        q = zq - c
        q64 = q.double()
        if ctx.centered:  # <g_i, m - m32>
            gm_lo = torch.bmm(g, m_lo.unsqueeze(2)).squeeze(2).double()  # (R, Nq)
        if ctx.needs_input_grad[0]:
            # d num_i/dq_i = A_{p_i} (eq. 6's a_i), d den_i/dq_i = W_< - W_>
            A = _ATable.__new__(_ATable)
            A.flat, A.Np = Aflat, ctx.Np
            idxA = A.index(p).view(-1)
            gA = _rowdots(Aflat, idxA, gflat).view(R, Nq)
            if ctx.centered:  # the table holds v - m32; d num/dq uses v - m
                gA = gA - Wlt * gm_lo
            # d den_i/dq_i = W_< - W_> (a key tied with q_i counts in neither); W_> from suffix
            # sums (W - W_<= cancels where a heavy key ties the query)
            Wgt = Wsuf.gather(1, p_le)
            dzq = (inv * gA + s * (Wlt - Wgt)).to(dt)
        if not (ctx.needs_input_grad[1] or ctx.needs_input_grad[2]):
            return (*ctx.sc.grads(eg, dzq)[:1], None, None, None, None, None)
        # keys and values: sums over the queries above each key, from prefix tables over the
        # queries sorted by decreasing score (the transposed eq. 6)
        rows = torch.arange(R, device=zq.device).unsqueeze(1)
        desc = order_q.flip(1)
        inv_desc = inv.to(dt).gather(1, desc)
        # the transposed tables sum g_i (q_i - z_j) / den_i over queries: shifted by the query of
        # the largest |g_i| / den_i (as the forward tables by the heaviest key: their rounding a
        # multiple of the sum they enter)
        cq = zq.gather(1, (inv * g.abs().sum(-1, dtype=torch.float64)).argmax(1, keepdim=True))
        cBq = inv_desc * (zq - cq).gather(1, desc)
        desc_global = desc + rows * Nq
        n_gt = Nq - le_k  # queries strictly above each key (original key order)
        kq = zk - cq
        wk = torch.ones_like(zk) if w is None else w
        W_d = W.to(dt)
        need_v, need_k = ctx.needs_input_grad[2], ctx.needs_input_grad[1]
        if need_v and ctx.centered:
            # sum_l dgamma_l = sum_i R_i g_i / den_i, R_i = sum_l w_l relu(q_i - z_l)
            Ri = ((q64 * Wlt - Klt) * inv).to(dt)
            csum = torch.bmm(Ri.unsqueeze(1), g).squeeze(1)  # (R, D)
            cw = torch.where(W_d > 0, -wk / torch.where(W_d > 0, W_d, torch.ones_like(W_d)),
                             torch.zeros_like(wk))
        vG = torch.empty(R, Nk, dtype=torch.float64, device=v.device) if need_k else None
        vflat = v.reshape(R * Nk, D)

        def build(tq, r0, r1):
            tq.build(gflat, desc_global[r0:r1], inv_desc[r0:r1], cBq[r0:r1], center=False)
            if need_v and ctx.centered:
                tq.extra()[: r1 - r0].copy_(csum[r0:r1])
            if need_k:  # <v_j (- m32), sum_{q_i > z_j} g_i / den_i>
                ig = tq.index(0, n_gt[r0:r1]).view(-1)
                # centred: v_j - m32 before the products (<v_j, .> - <m32, .> would cancel)
                vG[r0:r1] = _rowdots(tq.flat, ig, vflat[r0 * Nk : r1 * Nk],
                                     mean=m[r0:r1] if ctx.centered else None).view(r1 - r0, Nk)
            return None

        def combine(tq, r0, r1):
            n = r1 - r0
            ng = n_gt[r0:r1]
            idx = [tq.index(1, ng), tq.index(0, ng)]
            cf = [wk[r0:r1], -wk[r0:r1] * kq[r0:r1]]
            if ctx.centered:
                lr = torch.arange(n, device=zq.device).unsqueeze(1)
                idx.append((tq.extra_base + lr).expand(n, Nk))
                cf.append(cw[r0:r1].expand(n, Nk))
            E = len(idx)
            return torch.stack(idx, -1).view(-1, E), torch.stack(cf, -1).view(-1, E)

        if need_v:
            dv, _, _ = _run_tables(R, Nq, Nk, D, dt, v.device, n_extra=ctx.centered,
                                   build=build, combine=combine)
        else:
            c_rows = _table_rows(Nq, D, dt, R)
            tq = _take_table(c_rows, Nq, D, 0, dt, v.device)
            for r0 in range(0, R, c_rows):
                build(tq, r0, min(R, r0 + c_rows))
            _give_back(tq)
        if need_k:
            # scalar prefix sums over the queries in increasing order, and suffix sums for the
            # queries above a key (a total minus a prefix cancels where a query with a tiny
            # denominator, next to a heavy key, lies below it)
            sa = s.gather(1, order_q)
            S_lt = _gather0(torch.cumsum(sa, 1), lt_k)
            S_gt = _suffix0(sa).gather(1, le_k)
            if ctx.centered:
                mg = gm_lo * inv  # <m - m32, g_i> / den_i
                vG = vG - _suffix0(mg.gather(1, order_q)).gather(1, le_k)
            dzk = (-wk.double() * (vG + S_gt - S_lt)).to(dt)
        dzq, dzk, dv, _ = ctx.sc.grads(eg, dzq, dzk, dv)
        return dzq, dzk, dv, None, None, None


def sliced_relu_attention(
    zq: Tensor,
    zk: Tensor,
    v: Tensor,
    *,
    centered: bool = True,
    key_padding_mask: Tensor | None = None,
    key_weights: Tensor | None = None,
) -> Tensor:
    r"""Sliced ReLU attention, paper 004 eq. (3) (eq. (2) with ``centered=False``).

    .. math::  o_i = \frac{\sum_j w_j\,\mathrm{ReLU}(z^q_i - z^k_j)\,(v_j - \bar v)}
                          {\sum_l w_l\,|z^q_i - z^k_l|},\qquad
               \bar v = \frac{\sum_l w_l v_l}{\sum_l w_l}\ (\text{0 if not centered})

    computed exactly in :math:`O((N_q + N_k)\log N_k + (N_q + N_k) D)` time and
    :math:`O((N_q + N_k) D)` memory by sorting the keys and prefix sums (eq. 6).

    Args:
        zq: query scores :math:`\Pi Q x_i`, shape ``(..., N_q)`` (e.g. ``(B, H, N_q)``).
        zk: key scores :math:`\Pi K x_j`, shape ``(..., N_k)``.
        v: values, shape ``(..., N_k, D)``.
        centered: subtract the (weighted) mean of the values (eq. 3); ``False`` is eq. 2.
        key_padding_mask: bool, ``True`` = ignore the key; shape ``(B, N_k)`` (for
            ``(B, H, N_k)`` scores, shared by the heads) or broadcastable to ``zk``.
        key_weights: quadrature weights :math:`w_j \ge 0` broadcastable to ``zk``
            (``None``: all ones; uniform weights cancel).

    Returns:
        ``(..., N_q, D)``.  A query whose denominator vanishes (all unmasked keys equal to
        it, or no unmasked key) gets 0.

    Float32 and float64, any device; differentiable in ``zq``, ``zk`` and ``v`` by a custom
    backward pass that is again sorted prefix sums (no ``N_q x N_k`` tensor).
    """
    fn = "sliced_relu_attention"
    graph = _graph_mode(zq, zk, v, key_weights)
    w = _check_inputs(fn, zq, zk, v, key_padding_mask, key_weights, check_values=not graph)
    centered = check_centered(fn, centered)
    lead = zq.shape[:-1]
    Nq, Nk, D = zq.shape[-1], zk.shape[-1], v.shape[-1]
    R = math.prod(lead)
    if R == 0 or Nq == 0 or D == 0:
        return v.new_zeros(*lead, Nq, D) + 0 * (zq.sum() + zk.sum() + v.sum())
    wr = None if w is None else _rows(w, Nk).contiguous()
    zq, zk, v = _rows(zq, Nq), _rows(zk, Nk), v.reshape(R, Nk, D)
    if graph:
        out = relu_attention_composed(zq, zk, v, wr, centered)
        return out.view(*lead, Nq, D)
    zq, zk, v = zq.contiguous(), zk.contiguous(), v.contiguous()
    sc = scales(fn, zq, zk, v, wr)  # also the finiteness checks
    dtype = v.dtype
    if wr is not None and dtype == torch.float32 and weights_span(wr) > RELU_SPAN_F32:
        # weights beyond float32's range of products (issue 42): the sums in float64
        zq, zk, v, wr = zq.double(), zk.double(), v.double(), wr.double()
        sc = scales(fn, zq, zk, v, wr)
    if torch.is_grad_enabled() and (zq.requires_grad or zk.requires_grad or v.requires_grad):
        out = _SlicedReLU.apply(zq, zk, v, wr, centered, sc)
    else:  # nothing to record: the forward pass without the tables kept for the backward
        out = sc.output(_relu_forward_fast(sc.scores(zq), sc.scores(zk), sc.values(v),
                                           sc.weights(wr), centered))
    return out.to(dtype).view(*lead, Nq, D)


# --------------------------------------------------------------------------------------
# sliced ReLU-bump attention (eq. 7)
# --------------------------------------------------------------------------------------
def _bump_coeffs(q, inv_b):
    """Coefficients of the rows A[a0], A[a1], A[a2], B[a0], B[a1], B[a2] (Lemma B.4)."""
    qb = q * inv_b
    return (qb - 1, -2 * qb, 1 + qb, -inv_b.expand_as(q), 2 * inv_b.expand_as(q),
            -inv_b.expand_as(q))


class _SlicedBump(torch.autograd.Function):
    @staticmethod
    def forward(ctx, zq, zk, v, w, b, sc):
        # b: (R, 1) bandwidths > 0; sc: per-row power-of-two scales (the bandwidth scales
        # with the scores)
        originals = (zq, zk, v, w, b)
        zq, zk, v, w, b = sc.scores(zq), sc.scores(zk), sc.values(v), sc.weights(w), sc.scores(b)
        R, Nq = zq.shape
        Nk, D = v.shape[1], v.shape[2]
        need_grad = any(ctx.needs_input_grad[:3]) or ctx.needs_input_grad[4]
        lo, hi = zq - b, zq + b
        probes = [(lo, "right"), (zq, "right"), (hi, "left")]
        if need_grad:
            # (q, left) first: the same sort then also gives the sorted queries and, for each
            # key, the query windows of the backward pass, classified pair by pair exactly as
            # here (transpose)
            probes = [(zq, "left")] + probes
        keys = _Keys(zk, w, probes, transpose=need_grad)
        a0, a1, a2 = keys.counts[-3:]
        q = zq - keys.c
        q64 = q.double()
        inv_b64 = 1.0 / b.double()
        invW = _safe_inv(keys.W)  # (R, 1)
        cB = keys.ks if keys.ws is None else keys.ws * keys.ks
        vflat = v.reshape(R * Nk, D)

        def build(tab, r0, r1):
            ws = None if keys.ws is None else keys.ws[r0:r1]
            m32, _ = tab.build(vflat, keys.order_global[r0:r1], ws, cB[r0:r1], center=True)
            tab.extra()[: r1 - r0].copy_(m32)  # the tables hold v - m32
            return m32

        bufs = {}

        def combine(tab, r0, r1):
            n = r1 - r0
            if bufs.get("n") != n:  # index / coefficient / work buffers, reused per chunk
                e = dict(device=v.device)
                bufs.update(n=n, index=torch.empty(n, Nq, 7, dtype=torch.int64, **e),
                            coeff=torch.empty(n, Nq, 7, dtype=v.dtype, **e),
                            ti=torch.empty(n, Nq, dtype=torch.int64, **e),
                            qb=torch.empty(n, Nq, dtype=torch.float64, **e),
                            mass=torch.empty(n, Nq, dtype=torch.float64, **e),
                            f=torch.empty(n, Nq, dtype=torch.float64, **e))
            index, coeff, ti = bufs["index"], bufs["coeff"], bufs["ti"]
            qb, mass, f = bufs["qb"], bufs["mass"], bufs["f"]
            rk = [a[r0:r1] for a in (a0, a1, a2)]
            for e, a in enumerate(rk):
                table_index_into(index[..., e], a, 0, tab.nb, tab.zero_row, ti)
                table_index_into(index[..., 3 + e], a, 1, tab.nb, tab.zero_row, ti)
            index[..., 6] = (tab.extra_base + torch.arange(n, device=zq.device)).unsqueeze(1)
            # the hat kernel's rows (Lemma B.4), for A[a0], A[a1], A[a2] and B[a0], B[a1],
            # B[a2]: (q/b - 1, -2 q/b, 1 + q/b) and (-1/b, 2/b, -1/b), divided by W; and the
            # kernel mass sum_j w_j hat(q_i - z_j) from the float64 scalar prefix sums (it
            # cancels strongly, so it stays in float64) as the weight of the mean
            iw, ib = invW[r0:r1], inv_b64[r0:r1]
            torch.mul(q64[r0:r1], ib, out=qb)
            Wc, Kc = keys.Wc0[r0:r1], keys.Kc0[r0:r1]
            torch.gather(Wc, 1, rk[0], out=f)
            torch.mul(f, qb, out=mass)
            mass.sub_(f)
            torch.gather(Wc, 1, rk[1], out=f)
            mass.addcmul_(f, qb, value=-2)
            torch.gather(Wc, 1, rk[2], out=f)
            mass.addcmul_(f, qb)
            mass.add_(f)
            for e, c in ((0, -1.0), (1, 2.0), (2, -1.0)):
                torch.gather(Kc, 1, rk[e], out=f)
                mass.addcmul_(f, ib, value=c)
            torch.mul(mass, iw, out=coeff[..., 6])
            torch.mul(qb, iw, out=f)  # q / (b W)
            torch.sub(f, iw, out=coeff[..., 0])
            torch.mul(f, -2.0, out=coeff[..., 1])
            torch.add(f, iw, out=coeff[..., 2])
            ibw = ib * iw  # (n, 1)
            coeff[..., 3] = -ibw
            coeff[..., 4] = 2 * ibw
            coeff[..., 5] = -ibw
            return index.view(-1, 7), coeff.view(-1, 7)

        out, keepA, m = _run_tables(R, Nk, Nq, D, v.dtype, v.device, n_extra=True, build=build,
                                    combine=combine, keep_A=need_grad)
        if need_grad:
            # per key: t3 = #{q <= z}, t0 = #{q - b < z}, t1 = #{q < z}, t2 = #{q + b <= z}
            t3, t0, t1, t2 = keys.tcounts
            ctx.save_for_backward(*originals, zq, zk, v, w, b, out, m.to(v.dtype), keepA.flat,
                                  a0, a1, a2, keys.counts[0], keys.Wc, keys.W, keys.c,
                                  keys.porder, t0, t1, t2, t3)
            ctx.Np = keepA.Np
            ctx.sc = sc
        return sc.output(out)

    @staticmethod
    def backward(ctx, g):
        (zq0, zk0, v0, w0, b0, zq, zk, v, w, b, out, m, Aflat, a0, a1, a2, alt, Wc, W, c,
         order_q, t0, t1, t2, t3) = ctx.saved_tensors
        if torch.is_grad_enabled():  # create_graph=True: a differentiable backward pass
            return _backward_by_recompute(
                ctx, g, lambda a, b_, c_, d, e, f: bump_attention_composed(a, b_, c_, d, e),
                (zq0, zk0, v0, w0, b0, None))
        g, eg, gflat, (R, Nq, Nk, D) = _gradient_rows(g, zq, v)
        dt = v.dtype
        invW = _safe_inv(W)  # (R, 1) float64
        inv_b64 = 1.0 / b.double()
        dzq = dzk = dv = db = None
        step = _STEP
        if ctx.needs_input_grad[0] or ctx.needs_input_grad[4]:
            # per query: <g_i, A[lt q] - A[a0] - A[a2] + A[a1]> (window (q-b, q) minus (q, q+b))
            #        and <g_i, A[a2] - A[a0]>                   (window (q-b, q+b))
            A = _ATable.__new__(_ATable)
            A.flat, A.Np = Aflat, ctx.Np
            ia = [A.index(x).view(-1) for x in (alt, a0, a1, a2)]
            index = torch.stack([ia[0], ia[1], ia[3], ia[2], ia[3], ia[1], ia[1], ia[1]],
                                -1).view(-1, 4)
            sign = torch.tensor([1.0, -1.0, -1.0, 1.0, 1.0, -1.0, 0.0, 0.0], dtype=dt,
                                device=zq.device).view(2, 4)
            gX = torch.empty(R * Nq, 2, dtype=torch.float64, device=zq.device)
            for q0 in range(0, R * Nq, step):
                q1 = min(R * Nq, q0 + step)
                X = torch.nn.functional.embedding_bag(
                    index[2 * q0 : 2 * q1], Aflat,
                    per_sample_weights=sign.repeat(q1 - q0, 1), mode="sum").view(q1 - q0, 2, D)
                gX[q0:q1] = torch.bmm(X, gflat[q0:q1].unsqueeze(2)).view(q1 - q0, 2)
            gX = gX.view(R, Nq, 2)
            gm = torch.bmm(g, m.unsqueeze(2)).squeeze(2).double()  # <g_i, m>
            W_ = [_gather0(Wc, x) for x in (alt, a0, a1, a2)]
            s_q = gX[..., 0] + gm * (W_[0] - W_[1] - W_[3] + W_[2])
            s_b = gX[..., 1] + gm * (W_[3] - W_[1])
            if ctx.needs_input_grad[0]:
                dzq = (-(inv_b64 * invW) * s_q).to(dt)
            if ctx.needs_input_grad[4]:
                go = _dot_rows(gflat, out.reshape(R * Nq, D)).view(R, Nq).double()
                db = (inv_b64 * invW * s_b - inv_b64 * go).sum(1, keepdim=True).to(b.dtype)
        if ctx.needs_input_grad[1] or ctx.needs_input_grad[2]:
            # sums over the queries near each key: the same tables, built on sorted queries
            # with the queries sorted, the keys' windows are position ranges: queries with
            # q - b < z < q + b are [t2, t0), split at t1 (q < z) and t3 (q <= z)
            b0, b1, b2, blt = t2, t1, t0, t1
            b1k = t3  # for the strict windows of d/dz: (z, z + b) is [t3, t0)
            q_sorted = (zq - c).gather(1, order_q)
            order_global = order_q + torch.arange(R, device=zq.device).unsqueeze(1) * Nq
            ks = (zk - c).double() if w is None else torch.where(w > 0, zk - c, 0.0).double()
            Qc = torch.cumsum(q_sorted.double(), 1)
            Cc = torch.cumsum(torch.ones_like(Qc), 1)
            wk = torch.ones_like(zk) if w is None else w
            wW = wk.double() * invW  # (R, Nk)
            need_v, need_k = ctx.needs_input_grad[2], ctx.needs_input_grad[1]
            vY = torch.empty(R, Nk, dtype=torch.float64, device=v.device) if need_k else None
            gbar_all = []
            vflat = v.reshape(R * Nk, D)
            one4 = torch.tensor([1.0, -1.0, -1.0, 1.0], dtype=dt, device=zq.device)

            def build(tq, r0, r1):
                gbar = tq.build(gflat, order_global[r0:r1], None, q_sorted[r0:r1],
                                center=True)[0]
                tq.extra()[: r1 - r0].copy_(gbar)
                gbar_all.append(gbar)
                if need_k:
                    # (G[b2] - G[b1k]) - (G[blt] - G[b0]): queries in (z, z+b) minus (z-b, z)
                    ix = torch.stack([tq.index(0, x[r0:r1]) for x in (b2, b1k, blt, b0)],
                                     -1).view(-1, 4)
                    M = ix.shape[0]
                    out_ = torch.empty(M, dtype=torch.float64, device=v.device)
                    vsl = vflat[r0 * Nk : r1 * Nk]
                    for k0 in range(0, M, step):
                        k1 = min(M, k0 + step)
                        Y = tq.combine(ix[k0:k1], one4.repeat(k1 - k0, 1))
                        out_[k0:k1] = _dot_rows(Y, vsl[k0:k1])
                    vY[r0:r1] = out_.view(r1 - r0, Nk)
                return gbar

            def combine(tq, r0, r1):
                n = r1 - r0
                lr = torch.arange(n, device=zq.device).unsqueeze(1)
                rk = [x[r0:r1] for x in (b0, b1, b2)]
                index = torch.stack([tq.index(0, x) for x in rk] + [tq.index(1, x) for x in rk]
                                    + [(tq.extra_base + lr).expand(n, Nk)], -1).view(-1, 7)
                k64, ib, ww = ks[r0:r1], inv_b64[r0:r1], wW[r0:r1]
                Ca = [_gather0(Cc[r0:r1], x) for x in rk]
                Qa = [_gather0(Qc[r0:r1], x) for x in rk]
                coeff = torch.empty(n, Nk, 7, dtype=dt, device=v.device)
                mass = torch.zeros_like(k64)
                for e, x in enumerate(_bump_coeffs(k64, ib)):
                    coeff[..., e] = x * ww
                    mass += x * (Ca[e] if e < 3 else Qa[e - 3])
                coeff[..., 6] = mass * ww
                return index, coeff.view(-1, 7)

            if need_v:
                dv, _, _ = _run_tables(R, Nq, Nk, D, dt, v.device, n_extra=True, build=build,
                                       combine=combine)
            else:
                c_rows = _table_rows(Nq, D, dt, R)
                tq = _take_table(c_rows, Nq, D, c_rows, dt, v.device)
                for r0 in range(0, R, c_rows):
                    build(tq, r0, min(R, r0 + c_rows))
                _give_back(tq)
            if need_k:
                gbar = torch.cat(gbar_all)
                cnt = (_gather0(Cc, b2) - _gather0(Cc, b1k)) - (_gather0(Cc, blt) - _gather0(Cc, b0))
                vg = torch.bmm(v, gbar.unsqueeze(2)).squeeze(2).double()
                dzk = (wW * inv_b64 * (vY + vg * cnt)).to(dt)
        dzq, dzk, dv, db = ctx.sc.grads(eg, dzq, dzk, dv, db)
        return dzq, dzk, dv, None, db, None


def sliced_relu_bump_attention(
    zq: Tensor,
    zk: Tensor,
    v: Tensor,
    bandwidth,
    *,
    key_padding_mask: Tensor | None = None,
    key_weights: Tensor | None = None,
) -> Tensor:
    r"""Sliced ReLU-bump (hat-kernel) attention, paper 004 eq. (7).

    .. math::  o_i = \frac{1}{\sum_l w_l}\sum_j w_j\,
               \mathrm{ReLU}\Big(1 - \frac{|z^q_i - z^k_j|}{b}\Big)\, v_j

    (:math:`w_j = 1`: the paper's :math:`\tfrac1n\sum_j`), exactly, in
    :math:`O((N_q + N_k)\log N_k + (N_q + N_k) D)` time: the hat kernel is
    :math:`\tfrac1b[\mathrm{ReLU}(t + b) - 2\,\mathrm{ReLU}(t) + \mathrm{ReLU}(t - b)]`
    (Lemma B.4), three sliced ReLU sums read from one pair of prefix tables.

    Args:
        zq, zk, v: as in :func:`sliced_relu_attention`.
        bandwidth: :math:`b > 0`: a number, or a tensor broadcastable to the leading dims
            of ``zq`` (e.g. ``(H,)`` for one bandwidth per head); differentiable.
        key_padding_mask, key_weights: as in :func:`sliced_relu_attention`.

    Returns:
        ``(..., N_q, D)``; a row with no unmasked key gives 0.
    """
    fn = "sliced_relu_bump_attention"
    graph = _graph_mode(zq, zk, v, bandwidth, key_weights)
    w = _check_inputs(fn, zq, zk, v, key_padding_mask, key_weights, check_values=not graph)
    lead = zq.shape[:-1]
    Nq, Nk, D = zq.shape[-1], zk.shape[-1], v.shape[-1]
    b_full = bandwidth_rows(fn, bandwidth, lead, zq.dtype, zq.device, check_values=not graph)
    R = math.prod(lead)
    if R == 0 or Nq == 0 or D == 0:
        return v.new_zeros(*lead, Nq, D) + 0 * (zq.sum() + zk.sum() + v.sum() + b_full.sum())
    wr = None if w is None else _rows(w, Nk).contiguous()
    zq, zk, v, b = _rows(zq, Nq), _rows(zk, Nk), v.reshape(R, Nk, D), b_full.reshape(R, 1)
    if graph:
        out = bump_attention_composed(zq, zk, v, wr, b)
    else:
        out = _windows.evaluate(fn, zq.contiguous(), zk.contiguous(), v.contiguous(), wr, b,
                                _SlicedBump.apply, causal=False)
    return out.view(*lead, Nq, D)
    out = _SlicedBump.apply(
        _rows(zq, Nq).contiguous(), _rows(zk, Nk).contiguous(),
        v.reshape(R, Nk, D).contiguous(), wr, b_full.reshape(R, 1),
    )
    return out.view(*lead, Nq, D)
