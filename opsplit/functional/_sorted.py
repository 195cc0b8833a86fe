r"""Sorting, ranking and prefix-sum primitives of the sliced attentions (paper 004, eq. 6).

Everything here works on *rows*: a score tensor of shape ``(R, N)`` is ``R`` independent
one-dimensional problems (batch and heads flattened).

:func:`sort_and_rank`
    sorts one set of scores ("items") row by row and counts, for other score sets
    ("probes"), how many items of the same row are ``<`` (``side="left"``) or ``<=``
    (``side="right"``) each probe.  Float32 scores are ranked by one merged sort of
    order-preserving integer codes ``(row, score bits, tie flag)``, which
    ``torch.sort(stable=True)`` performs with a radix sort on the CPU; the tie flag puts a
    ``"left"`` probe before equal items and a ``"right"`` probe after them, so ties are
    decided on the exact values.  Float64 scores use ``torch.sort`` and
    ``torch.searchsorted``.

:class:`PrefixTable`
    two prefix-sum tables (eq. 6's :math:`a_i` and :math:`b_i`) of gathered, weighted and
    centred rows, built block-wise: blocks of :data:`BLOCK` consecutive sorted rows are
    summed by a batched product with lower-triangular weight matrices (one ``bmm`` that
    produces both tables), and the block offsets and the centring are added by one
    ``baddbmm_``.  The tables live in one flat matrix that
    ``torch.nn.functional.embedding_bag`` reads to combine, per query, a few table rows with
    per-query coefficients in one pass, without an ``N_q x N_k`` tensor.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = ["BLOCK", "sort_and_rank", "sort_and_rank_one", "inclusive_scan", "PrefixTable",
           "table_index"]

#: rows per block of the blocked prefix sums
BLOCK = 8
#: below this many blocks, block totals are summed with ``torch.cumsum``
_CUMSUM_BLOCKS = 256
#: rows per block of :func:`inclusive_scan`
_SCAN_BLOCK = 16
#: bytes of values gathered at a time while building the tables
_BUILD_BYTES = 16 << 20


# --------------------------------------------------------------------------------------
# ranking
# --------------------------------------------------------------------------------------
def _f32_codes_into(out: Tensor, z: Tensor, rows_shifted: Tensor, flag: int) -> None:
    """Write ``(row << 34) | (code(z) << 2) | flag`` into the int64 tensor ``out``
    (shape of ``z``), where ``code`` is an order-preserving map of float32 values to
    ``[0, 2^32)``: the bits of a negative float are flipped (but its sign), then the sign
    bit is moved.  ``-0.0`` is first mapped to ``+0.0`` (``-0.0 + 0.0 = +0.0``), so equal
    values get equal codes."""
    out.copy_((z + 0.0).contiguous().view(torch.int32))  # sign-extended to int64
    out.bitwise_xor_((out >> 31) & 0x7FFFFFFF)
    out.add_(1 << 31)
    out.bitwise_left_shift_(2)
    out.bitwise_or_(rows_shifted)
    if flag:
        out.bitwise_or_(flag)


def sort_and_rank(items: Tensor, probes=(), *, need_order: bool = True, transpose: bool = False):
    """Sort ``items`` row by row and rank ``probes`` among them.

    Args:
        items: ``(R, N)`` scores, finite or ``+inf`` (sorted last).
        probes: sequence of ``(values, side)``, ``values`` of shape ``(R, M)``, ``side``
            ``"left"`` (count items ``< value``) or ``"right"`` (items ``<= value``).
        need_order: also return the sort permutation and the sorted items.
        transpose: also return, for each probe, how many of its values precede each item in
            the same order (``"left"``: values ``<= item``; ``"right"``: values ``< item``),
            and the sort permutation of the first probe's values.

    Returns:
        ``(order, sorted_items, counts)``: ``order`` (``(R, N)`` int64, local indices:
        ``items.gather(1, order)`` is sorted), ``sorted_items`` and a list of ``(R, M)``
        int64 counts, one per probe (``None`` for the first two if not ``need_order``);
        with ``transpose``, also the list of ``(R, N)`` counts per probe and the ``(R, M)``
        permutation of the first probe.
    """
    R, N = items.shape
    if items.dtype == torch.float32 and R * N > 0 and R < (1 << 29):
        return _rank_merged(items, probes, need_order, transpose)
    sorted_items, order = torch.sort(items, dim=-1)
    counts = [
        torch.searchsorted(sorted_items, v.contiguous(), side=side) for v, side in probes
    ]
    if not transpose:
        return order, sorted_items, counts
    tcounts, porder = [], None
    for k, (v, side) in enumerate(probes):
        sv, pv = torch.sort(v, dim=-1)
        if k == 0:
            porder = pv
        other = "right" if side == "left" else "left"
        tcounts.append(torch.searchsorted(sv, items.contiguous(), side=other))
    return order, sorted_items, counts, tcounts, porder


def sort_and_rank_one(items: Tensor, probe: Tensor):
    """:func:`sort_and_rank` with one ``"left"`` probe, for the forward pass of the full
    kernels: ``(perm, sorted_items, counts)`` with ``perm`` the ``(R * N,)`` *flat* indices of
    ``items`` in row-major sorted order (``items.view(-1)[perm]`` is sorted row by row),
    ``counts`` ``(R, M)`` the number of items ``<`` each probe value in its row."""
    R, N = items.shape
    if not (items.dtype == torch.float32 and R * N > 0 and R < (1 << 29)):
        order, sorted_items, (counts,) = sort_and_rank(items, [(probe, "left")])
        rows = torch.arange(R, device=items.device, dtype=torch.int64).unsqueeze(1) * N
        return (order + rows).view(-1), sorted_items, counts
    M = probe.shape[1]
    dev = items.device
    RN = R * N
    rows_n = torch.arange(R, device=dev, dtype=torch.int64).unsqueeze(1)
    rows_shifted = rows_n << 34
    codes = torch.empty(RN + R * M, dtype=torch.int64, device=dev)
    _f32_codes_into(codes[:RN].view(R, N), items, rows_shifted, 1)
    _f32_codes_into(codes[RN:].view(R, M), probe, rows_shifted, 0)
    # stable=True selects the radix sort for integer keys on the CPU
    idx = torch.sort(codes, stable=True)[1]
    del codes
    cum = torch.cumsum(idx < RN, 0)  # items up to and including each position
    rank = torch.empty_like(cum)
    rank.index_copy_(0, idx, cum)  # back to the concatenation order
    del cum
    counts = rank[RN:].view(R, M) - rows_n * N
    pos = rank[:RN].sub_(1)  # row-major sorted position of each item
    perm = torch.empty_like(pos)
    perm.index_copy_(0, pos, torch.arange(RN, device=dev, dtype=torch.int64))
    return perm, torch.index_select(items.reshape(-1), 0, perm).view(R, N), counts


def _rank_merged(items, probes, need_order, transpose=False):
    R, N = items.shape
    dev = items.device
    flag_of = {"left": 0, "right": 2}
    rows_n = torch.arange(R, device=dev, dtype=torch.int64).unsqueeze(1)
    rows_shifted = rows_n << 34
    offs = [0, R * N]
    for v, _side in probes:
        offs.append(offs[-1] + v.numel())
    codes = torch.empty(offs[-1], dtype=torch.int64, device=dev)
    _f32_codes_into(codes[: R * N].view(R, N), items, rows_shifted, 1)
    for k, (v, side) in enumerate(probes):
        _f32_codes_into(codes[offs[k + 1] : offs[k + 2]].view(v.shape), v, rows_shifted,
                        flag_of[side])
    # stable=True selects the radix sort for integer keys on the CPU
    sorted_codes, idx = torch.sort(codes, stable=True)
    del codes
    cum = torch.cumsum((sorted_codes & 3) == 1, 0)  # items up to and including each position
    del sorted_codes
    rank = torch.empty_like(cum)
    rank.index_copy_(0, idx, cum)  # back to the concatenation order
    del cum
    counts = []
    for k, (v, _side) in enumerate(probes):
        M = v.shape[1]
        counts.append(rank[offs[k + 1] : offs[k + 2]].view(R, M) - rows_n * N)
    order = sorted_items = None
    if need_order:
        pos = rank[: R * N] - 1  # global position of each item in the row-major sorted order
        perm = torch.empty_like(pos)
        perm.index_copy_(0, pos, torch.arange(R * N, device=dev, dtype=torch.int64))
        order = perm.view(R, N) - rows_n * N
        sorted_items = items.reshape(-1)[perm].view(R, N)
    if not transpose:
        return order, sorted_items, counts
    tcounts, porder = [], None
    for k, (v, _side) in enumerate(probes):
        M = v.shape[1]
        is_k = (idx >= offs[k + 1]) & (idx < offs[k + 2])
        cum_k = torch.cumsum(is_k, 0)  # probe-k values up to each position
        back = torch.empty_like(cum_k)
        back.index_copy_(0, idx, cum_k)
        tcounts.append(back[: R * N].view(R, N) - rows_n * M)
        if k == 0:
            pos = back[offs[1] : offs[2]] - 1
            perm = torch.empty_like(pos)
            perm.index_copy_(0, pos, torch.arange(R * M, device=dev, dtype=torch.int64))
            porder = perm.view(R, M) - rows_n * M
    return order, sorted_items, counts, tcounts, porder


# --------------------------------------------------------------------------------------
# plain prefix sums
# --------------------------------------------------------------------------------------
_TRIL_CACHE: dict = {}


def _tril(S: int, dtype, device) -> Tensor:
    key = (S, dtype, str(device))
    t = _TRIL_CACHE.get(key)
    if t is None:
        t = torch.tril(torch.ones(S, S, dtype=dtype, device=device))
        _TRIL_CACHE[key] = t
    return t


def padded_length(n: int) -> int:
    """``n`` rounded up to a multiple of :data:`BLOCK` (at least one block)."""
    return max(BLOCK, -(-n // BLOCK) * BLOCK)


def inclusive_scan(x: Tensor, out: Tensor | None = None) -> Tensor:
    """Inclusive prefix sums along dim 1 of ``x`` of shape ``(n, M, C)``.

    On the CPU and for long ``M``: a triangular matmul per block of :data:`_SCAN_BLOCK`
    rows, then ``torch.cumsum`` (which accumulates in double) of the block totals.
    ``torch.cumsum`` elsewhere.  ``out``: an optional contiguous ``(n, M', C)`` buffer,
    ``M'`` = ``M`` rounded up to a multiple of :data:`_SCAN_BLOCK`.
    """
    n, M, C = x.shape
    if x.device.type != "cpu" or M <= _CUMSUM_BLOCKS:
        return torch.cumsum(x, dim=1)
    S = _SCAN_BLOCK
    Mp = -(-M // S) * S
    if Mp != M:
        xp = x.new_zeros(n, Mp, C)
        xp[:, :M] = x
    else:
        xp = x
    nb = Mp // S
    try:
        xb = xp.view(n * nb, S, C)
    except RuntimeError:
        xb = xp.contiguous().view(n * nb, S, C)
    if out is None or tuple(out.shape) != (n, Mp, C) or not out.is_contiguous():
        out = x.new_empty(n, Mp, C)
    o = out
    torch.matmul(_tril(S, x.dtype, x.device), xb, out=o.view(n * nb, S, C))
    ob = o.view(n, nb, S, C)
    ob[:, 1:].add_(torch.cumsum(ob[:, :-1, S - 1, :], dim=1).unsqueeze(2))
    return o[:, :M]


# --------------------------------------------------------------------------------------
# the prefix tables
# --------------------------------------------------------------------------------------
class PrefixTable:
    r"""Two prefix-sum tables over ``R`` rows of ``N`` sorted positions, in one flat matrix.

    :meth:`build` fills, for each row :math:`r` and sorted position :math:`j`,

    .. math::  \mathrm{A}_{r,j} = \sum_{j' \le j} c^A_{r,j'}\,(x_{\sigma_r(j')} - m_r),\qquad
               \mathrm{B}_{r,j} = \sum_{j' \le j} c^B_{r,j'}\,(x_{\sigma_r(j')} - m_r)

    (eq. 6 with :math:`c^A = w`, :math:`c^B = w z`).  Storage: blocks of :data:`BLOCK`
    positions, the A rows of a block followed by its B rows; then ``n_extra`` free rows and
    one row of zeros.  :meth:`index` gives the flat row of the *exclusive* prefix
    :math:`\sum_{j' < p}` (the zero row for ``p = 0``).  A table may be built for fewer rows
    than its capacity ``R`` (the first ``n`` rows), to be reused chunk after chunk.
    """

    def __init__(self, R: int, N: int, D: int, n_extra: int = 0, *, dtype, device):
        self.R, self.N, self.D = R, N, D
        self.Np = padded_length(N)
        self.nb = self.Np // BLOCK
        size = R * self.nb * 2 * BLOCK
        self.flat = torch.empty(size + n_extra + 1, D, dtype=dtype, device=device)
        self.flat[-1].zero_()
        self.extra_base = size
        self.zero_row = size + n_extra
        self._work = None  # gather buffers of build(), reused chunk after chunk
        self._tot = None  # block totals of build(), likewise
        self._scan = None

    def extra(self) -> Tensor:
        return self.flat[self.extra_base : self.zero_row]

    def index(self, t: int, p: Tensor) -> Tensor:
        r"""Flat row of :math:`\sum_{j<p}` in table ``t`` (0: A, 1: B); ``p``: ``(n, M)``
        local positions for the first ``n`` rows."""
        return table_index(p, t, self.nb, self.zero_row)

    def build(self, values: Tensor, order_global: Tensor, cA: Tensor | None, cB: Tensor,
              *, center: bool):
        r"""Gather ``values[order_global]`` and fill both tables of the first ``n`` rows.

        ``values``: ``(*, D)`` source rows; ``order_global``: ``(n, N)`` flat indices into
        ``values`` in sorted order; ``cA`` (``None``: ones) and ``cB``: ``(n, N)`` weights in
        sorted order.  With ``center``, :math:`m_r = \sum_j c^A_{r,j} x_{\sigma_r(j)} /
        \sum_j c^A_{r,j}` (0 where the weights sum to 0) is computed in the table's dtype
        and subtracted; returned are that rounded mean and the float64 mean that adds the
        remainder, the centred table's total divided by the weight (both ``(n, D)``).  Values are gathered ``_BUILD_BYTES`` at a time, so they are
        consumed while still in cache and no sorted copy of ``values`` exists.
        """
        n, N = order_global.shape
        Np, nb, D = self.Np, self.nb, self.D
        S = BLOCK
        dt, dev = self.flat.dtype, self.flat.device
        L = _tril(S, dt, dev)
        if cA is None:
            cA = torch.ones(n, N, dtype=dt, device=dev)
        if Np != N:
            cA = F.pad(cA, (0, Np - N))
            cB = F.pad(cB, (0, Np - N))
            order_global = torch.cat([order_global, order_global[:, :1].expand(n, Np - N)], dim=1)
        cA = cA.to(dt).reshape(n * nb, S)
        cB = cB.to(dt).reshape(n * nb, S)
        order_global = order_global.reshape(n * nb, S)
        Y = self.flat[: n * nb * 2 * S].view(n * nb, 2 * S, D)
        nblk = n * nb
        step = max(1, min(nblk, _BUILD_BYTES // (S * D * self.flat.element_size())))
        if self._work is None or self._work[0].shape[0] < step * S or self._work[0].dtype != dt:
            self._work = (values.new_empty(step * S, D),
                          torch.empty(step, 2 * S, S, dtype=dt, device=dev))
        X, Lc = self._work
        # pass 1: in-block prefix sums of both tables, one bmm with (2S x S) lower-triangular
        # matrices whose columns are weighted by c^A (rows 0..S-1) and c^B (rows S..2S-1)
        for b0 in range(0, nblk, step):
            b1 = min(nblk, b0 + step)
            k = b1 - b0
            torch.index_select(values, 0, order_global[b0:b1].reshape(-1), out=X[: k * S])
            torch.mul(L, cA[b0:b1].unsqueeze(-2), out=Lc[:k, :S])
            torch.mul(L, cB[b0:b1].unsqueeze(-2), out=Lc[:k, S:])
            torch.bmm(Lc[:k], X[: k * S].view(k, S, D), out=Y[b0:b1])
        # block totals -> (centred) exclusive prefix sums over the blocks of each row; the
        # buffers are kept for the next chunk of rows
        ncol = 3 if center else 2
        key = (n, nb, ncol, D, dt)
        if self._tot is None or self._tot[0] != key:
            self._tot = (key, torch.empty(n, nb, ncol, D, dtype=dt, device=dev))
        V = self._tot[1]
        T = V[:, :, :2]
        T[:, :, 0] = Y[:, S - 1].view(n, nb, D)
        T[:, :, 1] = Y[:, 2 * S - 1].view(n, nb, D)
        m64 = None
        if center:
            sAB = torch.stack([cA.sum(-1), cB.sum(-1)], dim=1).view(n, nb, 2, 1)
            W = sAB[:, :, 0, 0].sum(1, keepdim=True, dtype=torch.float64)  # (n, 1)
            Wsafe = torch.where(W > 0, W, torch.ones_like(W))
            m = torch.where(W > 0, T[:, :, 0].sum(1) / Wsafe, 0.0).to(dt)  # (n, D), rounded
            T.addcmul_(sAB, m.view(n, 1, 1, D), value=-1)
            V[:, :, 2] = m.unsqueeze(1)
        nbp = -(-nb // _SCAN_BLOCK) * _SCAN_BLOCK
        if self._scan is None or self._scan.shape != (n, nbp, 2 * D):
            self._scan = torch.empty(n, nbp, 2 * D, dtype=dt, device=dev)
        incl = inclusive_scan(T.reshape(n, nb, 2 * D), out=self._scan)
        if center:
            # the exact mean is m + (sum of the centred values) / W: the remainder is read
            # off the centred table's total, which is small and summed accurately
            m64 = m.double() + torch.where(W > 0, incl[:, -1, :D].double() / Wsafe, 0.0)
        if nb > 1:
            T[:, 1:] = incl[:, :-1].view(n, nb - 1, 2, D)
        T[:, 0] = 0
        del incl
        if not center and nb == 1:
            return None
        # pass 2: add the block offsets and remove the mean: Y += U @ V with
        # U = [[1, 0, -cumsum c^A], [0, 1, -cumsum c^B]] per row of the block
        V = V.view(nblk, ncol, D)
        U = torch.zeros(step, 2 * S, ncol, dtype=dt, device=dev)
        U[:, :S, 0] = 1
        U[:, S:, 1] = 1
        for b0 in range(0, nblk, step):
            b1 = min(nblk, b0 + step)
            k = b1 - b0
            if center:
                torch.cumsum(cA[b0:b1], -1, out=U[:k, :S, 2])
                torch.cumsum(cB[b0:b1], -1, out=U[:k, S:, 2])
                U[:k, :, 2].neg_()
            Y[b0:b1].baddbmm_(U[:k], V[b0:b1])
        return None if m64 is None else (m, m64)

    def combine_into(self, out: Tensor, index: Tensor, coeff: Tensor) -> Tensor:
        """:meth:`combine` written into ``out`` (``(M, D)``, contiguous), without a temporary
        of the size of ``out``."""
        return embedding_bag_into(out, self.flat, index, coeff)

    def combine(self, index: Tensor, coeff: Tensor) -> Tensor:
        """``out[m] = sum_e coeff[m, e] * flat[index[m, e]]`` (one ``embedding_bag``)."""
        return F.embedding_bag(index, self.flat, per_sample_weights=coeff, mode="sum")



def embedding_bag_into(out: Tensor, weight: Tensor, index: Tensor, coeff: Tensor,
                       step: int = 1 << 13) -> Tensor:
    """``out[m] = sum_e coeff[m, e] * weight[index[m, e]]`` written into ``out``, by
    ``embedding_bag`` on slices of ``step`` rows: the temporaries stay small and their memory
    is reused from slice to slice."""
    M = index.shape[0]
    if M <= step:
        out.copy_(F.embedding_bag(index, weight, per_sample_weights=coeff, mode="sum"))
        return out
    for m0 in range(0, M, step):
        m1 = min(M, m0 + step)
        out[m0:m1] = F.embedding_bag(index[m0:m1], weight, per_sample_weights=coeff[m0:m1],
                                     mode="sum")
    return out


def table_index_into(out: Tensor, p: Tensor, t: int, nb: int, zero_row: int,
                     tmp: Tensor) -> Tensor:
    """:func:`table_index` written into the int64 tensor ``out`` (any strides, shape of
    ``p``), with ``tmp`` an int64 work tensor of that shape: no other temporaries."""
    n = p.shape[0]
    row0 = torch.arange(n, device=p.device, dtype=torch.int64).unsqueeze(1) * (nb * 2 * BLOCK)
    out.copy_(p)
    out.sub_(1)  # j = p - 1; row = row0 + j + (j rounded down to the block) + t * BLOCK
    torch.bitwise_and(out, ~(BLOCK - 1), out=tmp)
    out.add_(tmp)
    out.add_(row0 + t * BLOCK)
    torch.eq(p, 0, out=tmp)
    out.masked_fill_(tmp.bool(), zero_row)
    return out


def table_index(p: Tensor, t: int, nb: int, zero_row: int) -> Tensor:
    r"""Flat row of the exclusive prefix :math:`\sum_{j<p}` of table ``t`` for local rows
    ``0..n-1`` (``p``: ``(n, M)``) in a :class:`PrefixTable` layout with ``nb`` blocks."""
    n = p.shape[0]
    row0 = torch.arange(n, device=p.device, dtype=torch.int64).unsqueeze(1) * (nb * 2 * BLOCK)
    j = p - 1
    row = row0 + torch.div(j, BLOCK, rounding_mode="floor") * (2 * BLOCK) + (j & (BLOCK - 1)) + t * BLOCK
    return torch.where(p > 0, row, zero_row)
