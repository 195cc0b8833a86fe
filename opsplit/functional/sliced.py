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
and read their two (ReLU) or six (bump) table rows with one ``embedding_bag``, so queries
and keys may differ in number (cross-attention) and no ``N_q x N_k`` tensor exists.

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
are shifted by the median key of their row before the tables are built, and the values are
centred (the mean is added back exactly as a rank-one term for eq. 2 and eq. 7), so the
prefix sums stay of the size of the result.  Scalar prefix sums (denominators, kernel
masses) are accumulated in float64.

**Weights and masks.**  ``key_weights`` :math:`w_j \ge 0` turn every sum over keys into a
quadrature :math:`\sum_j w_j (\cdot)` (the :math:`\Omega_x` integral of paper 004's eq. 8
on a grid; uniform weights cancel).  ``key_padding_mask`` (``True`` = ignore the key, as in
``torch.nn.MultiheadAttention``) sets :math:`w_j = 0`.  For eq. 7 the :math:`1/n` becomes
:math:`1/\sum_j w_j` (the number of unmasked keys).  As with
``scaled_dot_product_attention``, values at masked keys must be finite.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from ._sorted import PrefixTable, padded_length, sort_and_rank, table_index

__all__ = ["sliced_relu_attention", "sliced_relu_bump_attention"]

# prefix tables without autograd: rows per chunk so that a chunk holds at most this
_TABLE_BYTES = 32 << 20


# --------------------------------------------------------------------------------------
# validation
# --------------------------------------------------------------------------------------
def _check_inputs(fn: str, zq, zk, v, key_padding_mask, key_weights):
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
    for name, x in (("zq", zq), ("zk", zk)):
        if not bool(torch.isfinite(x).all()):
            n_bad = int((~torch.isfinite(x)).sum())
            raise ValueError(
                f"{fn}: {name}: expected finite scores, found {n_bad} NaN/inf entries"
            )
    w = None
    if key_weights is not None:
        if not isinstance(key_weights, Tensor):
            key_weights = torch.as_tensor(key_weights, dtype=zk.dtype, device=zk.device)
        if not key_weights.is_floating_point():
            raise TypeError(f"{fn}: key_weights: expected a floating-point tensor, got {key_weights.dtype}")
        try:
            w = key_weights.to(dtype=zk.dtype, device=zk.device).expand(zk.shape)
        except RuntimeError:
            raise ValueError(
                f"{fn}: key_weights: expected a shape broadcastable to zk {tuple(zk.shape)}, "
                f"got {tuple(key_weights.shape)}"
            ) from None
        if not bool(torch.isfinite(w).all()) or bool((w < 0).any()):
            raise ValueError(f"{fn}: key_weights: expected finite weights >= 0")
    if key_padding_mask is not None:
        m = key_padding_mask
        if not isinstance(m, Tensor) or m.dtype != torch.bool:
            raise TypeError(
                f"{fn}: key_padding_mask: expected a bool tensor (True = ignore the key), got "
                f"{type(m).__name__ if not isinstance(m, Tensor) else m.dtype}"
            )
        if m.dim() == 2 and zk.dim() == 3 and m.shape == (zk.shape[0], zk.shape[2]):
            m = m.unsqueeze(1)  # (B, N_k): the same mask for every head
        try:
            m = m.to(zk.device).expand(zk.shape)
        except RuntimeError:
            raise ValueError(
                f"{fn}: key_padding_mask: expected shape (B, N_k) or one broadcastable to zk "
                f"{tuple(zk.shape)}, got {tuple(key_padding_mask.shape)}"
            ) from None
        keep = (~m).to(zk.dtype)
        w = keep if w is None else w * keep
    return w


def _rows(x: Tensor, n: int) -> Tensor:
    return x.reshape(-1, n)


def _gather0(table64: Tensor, p: Tensor) -> Tensor:
    """``table64[r, p - 1]`` with 0 for ``p = 0`` (exclusive prefix of an inclusive cumsum)."""
    padded = torch.nn.functional.pad(table64, (1, 0))
    return padded.gather(1, p)


def _run_tables(R, Nk, Nq, D, dtype, device, *, keep, n_extra, build, combine):
    """Build the prefix tables and combine them for the queries.

    ``build(tab, r0, r1)`` fills the tables of rows ``r0:r1`` (as local rows ``0..n-1``)
    and returns a per-row tensor (or ``None``); ``combine(tab, r0, r1)`` returns the
    ``embedding_bag`` indices and coefficients ``(n * Nq, E)`` of those rows' queries.  With ``keep`` (needed by the backward pass) one
    table holds all rows; otherwise the rows go through one reused table chunk by chunk,
    so the extra memory is that of a few rows.
    """
    Np = padded_length(Nk)
    per_row = Np * 2 * D * torch.empty((), dtype=dtype).element_size()
    c = R if keep else max(1, min(R, _TABLE_BYTES // max(1, per_row)))
    tab = PrefixTable(c, Nk, D, c if n_extra else 0, dtype=dtype, device=device)
    if c == R:
        extra = build(tab, 0, R)
        index, coeff = combine(tab, 0, R)
        if keep:
            return tab.combine(index, coeff).view(R, Nq, D), tab, extra
        out = torch.empty(R, Nq, D, dtype=dtype, device=device)
        tab.combine_into(out.view(-1, D), index, coeff)
        return out, None, extra
    out = torch.empty(R, Nq, D, dtype=dtype, device=device)
    extras = []
    for r0 in range(0, R, c):
        r1 = min(R, r0 + c)
        extras.append(build(tab, r0, r1))
        index, coeff = combine(tab, r0, r1)
        tab.combine_into(out[r0:r1].view(-1, D), index, coeff)
    extra = None if extras[0] is None else torch.cat(extras)
    return out, None, extra


def _dot_rows(a: Tensor, b: Tensor) -> Tensor:
    """Row-wise dot products of two ``(M, D)`` tensors."""
    return torch.bmm(a.unsqueeze(1), b.unsqueeze(2)).view(-1)


class _Keys:
    """Sorted keys of each row, their weights, shift and scalar prefix sums (float64)."""

    def __init__(self, zk: Tensor, w: Tensor | None, probes, need_order=True):
        R, N = zk.shape
        self.R, self.N = R, N
        zs = zk if w is None else torch.where(w > 0, zk, torch.full_like(zk, math.inf))
        order, ks, counts = sort_and_rank(zs, probes)
        self.order, self.counts = order, counts
        rows = torch.arange(R, device=zk.device).unsqueeze(1)
        self.order_global = order + rows * N
        if w is None:
            self.n_valid = torch.full((R,), N, device=zk.device, dtype=torch.int64)
            self.ws = None
        else:
            self.ws = w.gather(1, order)
            self.n_valid = (self.ws > 0).sum(1)
        mid = ((self.n_valid - 1).clamp_min(0) // 2).unsqueeze(1)
        c = ks.gather(1, mid)
        self.c = torch.where(self.n_valid.unsqueeze(1) > 0, c, torch.zeros_like(c))  # (R, 1)
        ksh = ks - self.c
        if w is not None:
            ksh = torch.where(self.ws > 0, ksh, torch.zeros_like(ksh))
        self.ks = ksh  # shifted sorted keys, 0 at masked keys (dtype of zk)
        ws64 = torch.ones_like(ksh, dtype=torch.float64) if w is None else self.ws.double()
        self.Wc = torch.cumsum(ws64, 1)  # inclusive prefix of weights
        self.Kc = torch.cumsum(ws64 * ksh.double(), 1)
        self.W = self.Wc[:, -1:]
        self.K = self.Kc[:, -1:]

    def W_lt(self, p):
        return _gather0(self.Wc, p)

    def K_lt(self, p):
        return _gather0(self.Kc, p)


def _safe_inv(x64: Tensor) -> Tensor:
    nz = x64 != 0
    return torch.where(nz, 1.0 / torch.where(nz, x64, torch.ones_like(x64)), torch.zeros_like(x64))


# --------------------------------------------------------------------------------------
# sliced ReLU attention (eqs. 2-3)
# --------------------------------------------------------------------------------------
class _SlicedReLU(torch.autograd.Function):
    @staticmethod
    def forward(ctx, zq, zk, v, w, centered):
        R, Nq = zq.shape
        Nk, D = v.shape[1], v.shape[2]
        need_grad = any(ctx.needs_input_grad[:3])
        probes = [(zq, "left")] + ([(zq, "right")] if need_grad else [])
        keys = _Keys(zk, w, probes)
        p = keys.counts[0]
        q = zq - keys.c
        q64 = q.double()
        Wlt, Klt = keys.W_lt(p), keys.K_lt(p)
        den = q64 * (2 * Wlt - keys.W) - (2 * Klt - keys.K)
        inv = _safe_inv(den)
        cB = keys.ks if keys.ws is None else keys.ws * keys.ks
        E = 3 if centered else 2
        cf = [q64 * inv, -inv]
        if centered:
            # the tables hold v - m32 (m32: the mean rounded to v's dtype); the remainder
            # m - m32 enters as a rank-one term with the weight sum_j w_j relu(q_i - z_j)
            cf.append(-(q64 * Wlt - Klt) * inv)
        coeff = torch.stack(cf, -1).to(v.dtype)  # (R, Nq, E)
        vflat = v.reshape(R * Nk, D)

        def build(tab, r0, r1):
            ws = None if keys.ws is None else keys.ws[r0:r1]
            m64 = tab.build(vflat, keys.order_global[r0:r1], ws, cB[r0:r1], center=centered)
            if centered:
                tab.extra()[: r1 - r0].copy_(m64 - m64.to(v.dtype).double())
            return m64

        def combine(tab, r0, r1):
            pp = p[r0:r1]
            n = r1 - r0
            idx = [tab.index(0, pp), tab.index(1, pp)]
            if centered:
                rows = torch.arange(n, device=pp.device).unsqueeze(1)
                idx.append((tab.extra_base + rows).expand(n, Nq))
            return torch.stack(idx, -1).view(-1, E), coeff[r0:r1].reshape(-1, E)

        out, tab, m64 = _run_tables(R, Nk, Nq, D, v.dtype, v.device, keep=need_grad,
                                    n_extra=centered, build=build, combine=combine)
        m = m_lo = None
        if m64 is not None:
            m = m64.to(v.dtype)
            m_lo = (m64 - m.double()).to(v.dtype)
        if need_grad:
            ctx.save_for_backward(zq, zk, v, w, out, den, m, m_lo, tab.flat, p, keys.counts[1],
                                  keys.c, Wlt, Klt, keys.W, keys.Wc)
            ctx.layout = (tab.nb, tab.zero_row)
            ctx.centered = centered
        return out

    @staticmethod
    def backward(ctx, g):
        zq, zk, v, w, out, den, m, m_lo, flat, p, p_le, c, Wlt, Klt, W, Wc = ctx.saved_tensors
        nb, zero_row = ctx.layout
        R, Nq = zq.shape
        Nk, D = v.shape[1], v.shape[2]
        dt = v.dtype
        g = g.contiguous()
        inv = _safe_inv(den)  # (R, Nq) float64
        inv_d = inv.to(dt)
        gflat = g.view(R * Nq, D)
        go = _dot_rows(gflat, out.reshape(R * Nq, D)).view(R, Nq).double()
        s = -inv * go  # dL/d den_i
        dzq = dzk = dv = None
        q = zq - c
        q64 = q.double()
        # ---- queries: d num/dq = A_p, d den/dq = W_< - W_> ----
        if ctx.needs_input_grad[0]:
            idxA = table_index(p, 0, nb, zero_row).view(-1)
            gA = _dot_rows(gflat, flat.index_select(0, idxA)).view(R, Nq).double()
            if ctx.centered:  # the tables hold v - m32; d num/dq uses v - m
                gA = gA - Wlt * torch.bmm(g, m_lo.unsqueeze(2)).squeeze(2).double()
            Wle = _gather0(Wc, p_le)
            dzq = (inv * gA + s * (Wlt + Wle - W)).to(dt)
        if not (ctx.needs_input_grad[1] or ctx.needs_input_grad[2]):
            return dzq, None, None, None, None
        # ---- keys and values: sums over queries above each key ----
        zs = zk if w is None else torch.where(w > 0, zk, torch.full_like(zk, math.inf))
        order_q, _, (lt_k, le_k) = sort_and_rank(zq, [(zs, "left"), (zs, "right")])
        rows = torch.arange(R, device=zq.device).unsqueeze(1)
        desc = order_q.flip(1)  # queries by decreasing score
        tq = PrefixTable(R, Nq, D, R if ctx.centered else 0, dtype=dt, device=v.device)
        inv_desc = inv_d.gather(1, desc)
        q_desc = q.gather(1, desc)
        tq.build(gflat, desc + rows * Nq, inv_desc, inv_desc * q_desc, center=False)
        # table 0: prefix sums of g/den over the largest queries; table 1: of q g/den
        n_gt = Nq - le_k  # queries strictly above each key (original key order)
        kq = zk - c  # shifted keys, original order
        wk = torch.ones_like(zk) if w is None else w
        W_d = W.to(dt)
        W_safe = torch.where(W_d > 0, W_d, torch.ones_like(W_d))
        if ctx.needs_input_grad[2]:
            idx = [tq.index(1, n_gt), tq.index(0, n_gt)]
            cf = [wk, -wk * kq]
            if ctx.centered:
                # sum_l dgamma_l = sum_i R_i g_i / den_i, R_i = sum_l w_l relu(q_i - z_l)
                Ri = (q64 * Wlt - Klt) * inv
                tq.extra().copy_(torch.bmm(Ri.to(dt).unsqueeze(1), g).squeeze(1))
                idx.append((tq.extra_base + rows).expand(R, Nk))
                cf.append(torch.where(W_d > 0, -wk / W_safe, torch.zeros_like(wk)))
            dv = tq.combine(torch.stack(idx, -1).view(R * Nk, -1),
                            torch.stack(cf, -1).view(R * Nk, -1)).view(R, Nk, D)
        if ctx.needs_input_grad[1]:
            Ggt = tq.gather(tq.index(0, n_gt))
            vG = _dot_rows(v.reshape(R * Nk, D), Ggt).view(R, Nk).double()
            # scalar prefix sums over queries in increasing order
            s_sorted = s.gather(1, order_q)
            Sc = torch.cumsum(s_sorted, 1)
            S_lt = _gather0(Sc, lt_k)
            S_gt = Sc[:, -1:] - _gather0(Sc, le_k)
            if ctx.centered:
                mg = (torch.bmm(g, m.unsqueeze(2)).squeeze(2).double()
                      + torch.bmm(g, m_lo.unsqueeze(2)).squeeze(2).double()) * inv  # <m, g_i>/den_i
                Mc = torch.cumsum(mg.gather(1, order_q), 1)
                vG = vG - (Mc[:, -1:] - _gather0(Mc, le_k))
            dzk = (-wk.double() * (vG + S_gt - S_lt)).to(dt)
        return dzq, dzk, dv, None, None


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
    w = _check_inputs("sliced_relu_attention", zq, zk, v, key_padding_mask, key_weights)
    lead = zq.shape[:-1]
    Nq, Nk, D = zq.shape[-1], zk.shape[-1], v.shape[-1]
    R = math.prod(lead)
    if R == 0 or Nq == 0 or D == 0:
        return v.new_zeros(*lead, Nq, D) + 0 * (zq.sum() + zk.sum() + v.sum())
    wr = None if w is None else _rows(w, Nk).contiguous()
    out = _SlicedReLU.apply(
        _rows(zq, Nq).contiguous(), _rows(zk, Nk).contiguous(),
        v.reshape(R, Nk, D).contiguous(), wr, bool(centered),
    )
    return out.view(*lead, Nq, D)


# --------------------------------------------------------------------------------------
# sliced ReLU-bump attention (eq. 7)
# --------------------------------------------------------------------------------------
def _bump_coeffs(q, inv_b):
    """Coefficients of the rows A[a0], A[a1], A[a2], B[a0], B[a1], B[a2] (Lemma B.4)."""
    qb = q * inv_b
    return (qb - 1, -2 * qb, 1 + qb, -inv_b.expand_as(q), 2 * inv_b.expand_as(q),
            -inv_b.expand_as(q))


def _bump_mass(q64, keys: _Keys, a0, a1, a2, inv_b64):
    """:math:`\\sum_j w_j\\,\\mathrm{hat}(q_i - k_j)` from the scalar prefix sums."""
    c = _bump_coeffs(q64, inv_b64)
    Wa = [keys.W_lt(a) for a in (a0, a1, a2)]
    Ka = [keys.K_lt(a) for a in (a0, a1, a2)]
    return c[0] * Wa[0] + c[1] * Wa[1] + c[2] * Wa[2] + c[3] * Ka[0] + c[4] * Ka[1] + c[5] * Ka[2]


class _SlicedBump(torch.autograd.Function):
    @staticmethod
    def forward(ctx, zq, zk, v, w, b):
        # b: (R, 1) bandwidths > 0
        R, Nq = zq.shape
        Nk, D = v.shape[1], v.shape[2]
        need_grad = any(ctx.needs_input_grad[:3]) or ctx.needs_input_grad[4]
        lo, hi = zq - b, zq + b
        probes = [(lo, "right"), (zq, "right"), (hi, "left")]
        if need_grad:
            probes.append((zq, "left"))
        keys = _Keys(zk, w, probes)
        a0, a1, a2 = keys.counts[:3]
        q = zq - keys.c
        q64 = q.double()
        inv_b64 = 1.0 / b.double()
        invW = _safe_inv(keys.W)  # (R, 1)
        mass = _bump_mass(q64, keys, a0, a1, a2, inv_b64)  # (R, Nq) float64
        cB = keys.ks if keys.ws is None else keys.ws * keys.ks
        cf = _bump_coeffs(q64, inv_b64)
        coeff = torch.stack([x * invW for x in cf] + [mass * invW], -1).to(v.dtype)  # (R, Nq, 7)
        vflat = v.reshape(R * Nk, D)

        def build(tab, r0, r1):
            ws = None if keys.ws is None else keys.ws[r0:r1]
            m64 = tab.build(vflat, keys.order_global[r0:r1], ws, cB[r0:r1], center=True)
            tab.extra()[: r1 - r0].copy_(m64)  # the tables hold v - m, rounded as copied here
            return m64

        def combine(tab, r0, r1):
            n = r1 - r0
            rows = torch.arange(n, device=zq.device).unsqueeze(1)
            A = [tab.index(0, a[r0:r1]) for a in (a0, a1, a2)]
            B = [tab.index(1, a[r0:r1]) for a in (a0, a1, a2)]
            index = torch.stack(A + B + [(tab.extra_base + rows).expand(n, Nq)], -1).view(-1, 7)
            return index, coeff[r0:r1].reshape(-1, 7)

        out, tab, m = _run_tables(R, Nk, Nq, D, v.dtype, v.device, keep=need_grad, n_extra=True,
                                  build=build, combine=combine)
        m = m.to(v.dtype)
        if need_grad:
            ctx.save_for_backward(zq, zk, v, w, b, out, m, tab.flat, a0, a1, a2,
                                  keys.counts[3], keys.Wc, keys.W, keys.c)
            ctx.layout = (tab.nb, tab.zero_row)
        return out

    @staticmethod
    def backward(ctx, g):
        zq, zk, v, w, b, out, m, flat, a0, a1, a2, alt, Wc, W, c = ctx.saved_tensors
        nb, zero_row = ctx.layout
        R, Nq = zq.shape
        Nk, D = v.shape[1], v.shape[2]
        dt = v.dtype
        g = g.contiguous()
        gflat = g.view(R * Nq, D)
        invW = _safe_inv(W)  # (R, 1) float64
        inv_b64 = 1.0 / b.double()
        rows = torch.arange(R, device=zq.device).unsqueeze(1)
        dzq = dzk = dv = db = None

        def iA(p):
            return table_index(p, 0, nb, zero_row)

        if ctx.needs_input_grad[0] or ctx.needs_input_grad[4]:
            # bag 2i:   A[lt q] - A[a0] - A[a2] + A[a1]  (window (q-b, q) minus (q, q+b))
            # bag 2i+1: A[a2] - A[a0]                    (window (q-b, q+b))
            one = torch.ones(R, Nq, dtype=dt, device=zq.device)
            index = torch.stack([iA(alt), iA(a0), iA(a2), iA(a1),
                                 iA(a2), iA(a0), iA(a0), iA(a0)], -1).view(-1, 4)
            coeff = torch.stack([one, -one, -one, one, one, -one, 0 * one, 0 * one],
                                -1).view(-1, 4)
            X = torch.nn.functional.embedding_bag(index, flat, per_sample_weights=coeff,
                                                  mode="sum").view(R * Nq, 2, D)
            gX = torch.bmm(X, gflat.unsqueeze(2)).view(R, Nq, 2).double()
            gm = torch.bmm(g, m.unsqueeze(2)).squeeze(2).double()  # <g_i, m>
            W_ = [_gather0(Wc, p) for p in (alt, a0, a1, a2)]
            dW1 = W_[0] - W_[1] - W_[3] + W_[2]
            dW2 = W_[3] - W_[1]
            t1 = gX[..., 0] + gm * dW1
            t2 = gX[..., 1] + gm * dW2
            if ctx.needs_input_grad[0]:
                dzq = (-(inv_b64 * invW) * t1).to(dt)
            if ctx.needs_input_grad[4]:
                go = _dot_rows(gflat, out.reshape(R * Nq, D)).view(R, Nq).double()
                db_rows = (inv_b64 * invW * t2 - inv_b64 * go).sum(1, keepdim=True)
                db = db_rows.to(b.dtype)
        if ctx.needs_input_grad[1] or ctx.needs_input_grad[2]:
            # sums over queries near each key: the same tables, built on the sorted queries
            zs = zk if w is None else torch.where(w > 0, zk, torch.full_like(zk, math.inf))
            lo, hi = zs - b, zs + b
            qsh = zq - c
            ks = torch.where(torch.isfinite(zs), zk - c, torch.zeros_like(zk))
            qkeys = _Keys(zq, None, [(lo, "right"), (zs, "right"), (hi, "left"), (zs, "left")])
            b0, b1, b2, blt = qkeys.counts
            # re-centre the query tables on the key shift c
            tq = PrefixTable(R, Nq, D, R, dtype=dt, device=v.device)
            q_sorted = qsh.gather(1, qkeys.order)
            gbar = tq.build(gflat, qkeys.order_global, None, q_sorted, center=True).to(dt)
            tq.extra().copy_(gbar)
            Qc = torch.cumsum(q_sorted.double(), 1)
            Cc = torch.cumsum(torch.ones_like(Qc), 1)
            wk = torch.ones_like(zk) if w is None else w
            wW = wk.double() * invW  # (R, Nk)
            if ctx.needs_input_grad[2]:
                k64 = ks.double()
                cf = _bump_coeffs(k64, inv_b64)
                Ca = [_gather0(Cc, p) for p in (b0, b1, b2)]
                Qa = [_gather0(Qc, p) for p in (b0, b1, b2)]
                massk = (cf[0] * Ca[0] + cf[1] * Ca[1] + cf[2] * Ca[2]
                         + cf[3] * Qa[0] + cf[4] * Qa[1] + cf[5] * Qa[2])
                index = torch.stack(
                    [tq.index(0, b0), tq.index(0, b1), tq.index(0, b2),
                     tq.index(1, b0), tq.index(1, b1), tq.index(1, b2),
                     (tq.extra_base + rows).expand(R, Nk)], -1).view(-1, 7)
                coeff = torch.stack([x * wW for x in cf] + [massk * wW], -1).to(dt).view(-1, 7)
                dv = tq.combine(index, coeff).view(R, Nk, D)
            if ctx.needs_input_grad[1]:
                # (G[b2] - G[b1]) - (G[blt] - G[b0]): queries in (k, k+b) minus in (k-b, k)
                one = torch.ones(R, Nk, dtype=dt, device=zq.device)
                index = torch.stack([tq.index(0, b2), tq.index(0, b1), tq.index(0, blt),
                                     tq.index(0, b0)], -1).view(-1, 4)
                coeff = torch.stack([one, -one, -one, one], -1).view(-1, 4)
                Y = tq.combine(index, coeff)
                vY = _dot_rows(v.reshape(R * Nk, D), Y).view(R, Nk).double()
                cnt = (_gather0(Cc, b2) - _gather0(Cc, b1)) - (_gather0(Cc, blt) - _gather0(Cc, b0))
                vg = torch.bmm(v, gbar.unsqueeze(2)).squeeze(2).double()
                dzk = (wW * inv_b64 * (vY + vg * cnt)).to(dt)
        return dzq, dzk, dv, None, db


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
    w = _check_inputs(fn, zq, zk, v, key_padding_mask, key_weights)
    lead = zq.shape[:-1]
    Nq, Nk, D = zq.shape[-1], zk.shape[-1], v.shape[-1]
    if isinstance(bandwidth, Tensor):
        if not bandwidth.is_floating_point():
            raise TypeError(f"{fn}: bandwidth: expected a floating-point tensor, got {bandwidth.dtype}")
        bt = bandwidth.to(device=zq.device, dtype=zq.dtype)
    else:
        try:
            bt = torch.tensor(float(bandwidth), dtype=zq.dtype, device=zq.device)
        except (TypeError, ValueError):
            raise TypeError(f"{fn}: bandwidth: expected a number or a tensor, got {bandwidth!r}") from None
    if not bool(torch.isfinite(bt).all()) or bool((bt <= 0).any()):
        raise ValueError(f"{fn}: bandwidth: expected finite values > 0, got {bandwidth!r}")
    try:
        b_full = bt.expand(lead) if bt.dim() <= len(lead) else None
    except RuntimeError:
        b_full = None
    if b_full is None:
        raise ValueError(
            f"{fn}: bandwidth: expected a number or a shape broadcastable to the leading dims "
            f"{tuple(lead)} of zq, got {tuple(bt.shape)}"
        )
    R = math.prod(lead)
    if R == 0 or Nq == 0 or D == 0:
        return v.new_zeros(*lead, Nq, D) + 0 * (zq.sum() + zk.sum() + v.sum() + bt.sum())
    wr = None if w is None else _rows(w, Nk).contiguous()
    out = _SlicedBump.apply(
        _rows(zq, Nq).contiguous(), _rows(zk, Nk).contiguous(),
        v.reshape(R, Nk, D).contiguous(), wr, b_full.reshape(R, 1),
    )
    return out.view(*lead, Nq, D)
