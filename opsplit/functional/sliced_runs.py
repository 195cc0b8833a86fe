r"""Decode steps of causal sliced attention in :math:`O(D \log^2 n)`: the logarithmic method
(Bentley & Saxe, *Decomposable searching problems I: static-to-dynamic transformation*,
J. Algorithms 1, 1980) on sorted prefix tables (paper 004, eq. 6, Prop. 2.1).

**What a decode step needs.**  A new token appended to :math:`n` cached ones queries
every key (bottom-right alignment: its own key included).  For one query :math:`q` and
keys :math:`(z_j, w_j, v_j)` the sums of eqs. 2, 3 and 7 are

.. math::

    \sum_j w_j\,\mathrm{ReLU}(q - z_j)\,v_j = q\,A_{<} - B_{<},\qquad
    \sum_j w_j\,|q - z_j| = q(2W_{<} - W) - (2K_{<} - K),

with :math:`A_< = \sum_{z_j < q} w_j v_j`, :math:`B_< = \sum_{z_j < q} w_j z_j v_j`,
:math:`W_<, K_<` the same of :math:`w_j, w_j z_j` (prefix sums over the keys sorted by
score, read at the rank of :math:`q`), :math:`W, K` the totals; eq. 3 subtracts
:math:`\bar v \sum_{z_j<q} w_j (q - z_j)` with the running mean :math:`\bar v = \sum_j w_j
v_j / W`; eq. 7 (:math:`\mathrm{hat}_b(t) = \mathrm{ReLU}(1 - |t|/b)`) reads the same
tables at four ranks, :math:`\#\{z \le q - b\}, \#\{z < q\}, \#\{z \le q\}, \#\{z < q + b\}`
(Lemma B.4).  Every one of these sums is *decomposable*: a sum over all keys is the sum of
the sums over any partition of them.

**The runs.**  So the cache is kept as at most :math:`\log_2 n + 1` sorted *runs*, the
binary decomposition of :math:`n`: positions :math:`[0, 2^{k_0})`, then
:math:`[2^{k_0}, 2^{k_0} + 2^{k_1})`, … for the set bits :math:`k_0 > k_1 > \dots` of
:math:`n`, each sorted by score with its prefix tables.  Appending :math:`m` tokens
rebuilds the runs below the highest bit in which :math:`n` and :math:`n + m` differ, like a
binary counter (one token: the runs of sizes :math:`1, 2, \dots, 2^{h-1}` of the trailing
ones of :math:`n` and the new token become one run of :math:`2^h`): amortised
:math:`O(D \log^2 n)` per token (each key is re-sorted :math:`O(\log n)` times), worst
case :math:`O(n D)` at the steps where :math:`n + 1` is a power of two.  A query is a
binary search and a few table reads per run: :math:`O(D \log n)` per head, plus
:math:`O(\log^2 n)` for the searches.  All rows (batch x head) share the run boundaries,
so every operation is a tensor operation over (row, run[, probe]); only the binary searches
run as one ``searchsorted`` per run.

**Storage** (per row, i.e. per batch element and head, for :math:`n` keys of width
:math:`D`): the sorted scores and weights (dtype), the values :math:`x = (v - c_v)\,2^{-e_v}`
(dtype, :math:`D` each), and prefix tables every :data:`BLOCK` keys (:math:`2D` in the
dtype and 2 in float64 per block); a prefix is a block's table plus an in-block sum of at
most :data:`BLOCK` keys, so the tables cost :math:`2D / \mathrm{BLOCK}` per key: in all
:math:`(1 + 2/\mathrm{BLOCK})\,D + 2 + 2/\mathrm{BLOCK}` numbers per key (float32,
``BLOCK = 8``: :math:`5D + 10` bytes), in buffers of geometric capacity.  Layout: run after
run, each run a contiguous ``(rows, length)`` block (so that each binary search reads a
contiguous array).

**Conditioning and magnitudes.**  As in the forward kernels, scores and values are shifted
by those of the row's first key of positive weight (:math:`c_z, c_v`), and each run keeps
its own powers of two :math:`e_z, e_v, e_w` (per row) that bring its shifted scores, shifted
values and weights to :math:`[\tfrac12, 1)`; a run's sums are exact multiples of
:math:`2^{e_w + e_z + e_v}` etc., so the runs combine in float64 with exact power-of-two
factors, relative to the largest of them per query.  Float32 scores, values and weights of
any magnitude (1e-38 .. 3e38, weights spread over the whole range) keep their relative
precision; so do float64 ones within float64's range.  Eq. 7 with a bandwidth far below the
spread of a run's scores (spread / b beyond :data:`~opsplit.functional._windows.KAPPA_FAST`,
where the table differences cancel) is summed pair by pair over the keys inside the windows
(exact; the cost is the number of such keys).

**Autograd.**  The runs are built in place and are not differentiable: calls that would
record a graph are refused (``KVCache`` keeps concatenated tensors and the direct sums of
:mod:`~opsplit.functional.sliced_decode` there).
"""

from __future__ import annotations

import torch
from torch import Tensor

from ._inputs import bandwidth_rows, check_centered
from ._inputs import key_weights as combine_key_weights
from ._scale import exponents
from ._windows import KAPPA_FAST
from .sliced_causal import causal_sliced_relu_attention, causal_sliced_relu_bump_attention

__all__ = ["SlicedDecodeCache", "BLOCK"]

#: keys per block of the prefix tables
BLOCK = 8
#: exponent of a run (or query) without any key of positive weight: its factors vanish
_NONE = -(1 << 20)
#: largest number of runs (2^64 keys)
_MAX_RUNS = 64
#: queries x keys x features per slice of the dense in-chunk sums
_CHUNK_ELEMS = 1 << 22


def _exp(m: Tensor) -> Tensor:
    """int64 exponents of non-negative float64 maxima (0 where ``m = 0``)."""
    return exponents(m)


def _pow2(x: Tensor, e: Tensor) -> Tensor:
    """``x 2^e`` for float64 ``x`` and int64 ``e`` (broadcastable), exactly: two factors,
    each a normal float64; ``e`` is clamped to +-2000 (beyond, the result is 0 or inf
    anyway).  No host synchronisation (unlike :func:`~opsplit.functional._scale.ldexp`)."""
    e = e.clamp(-2000, 2000)
    e1 = torch.div(e, 2, rounding_mode="floor")
    return x * torch.exp2(e1.double()) * torch.exp2((e - e1).double())


class SlicedDecodeCache:
    r"""The keys and values of causal sliced attention (eqs. 2, 3, 7 of paper 004) as sorted
    runs with prefix tables (module docstring), for one attention term and step.

    Shapes: scores ``(B, H, N)``, values ``(B, H, N, D)``, key weights broadcastable to
    ``(B, H, N)`` (0 = masked key: left padding), bandwidth a number or broadcastable to
    ``(B, H)``.  Float32 or float64, any device; calls under autograd are refused.

    * :meth:`append` ``(zk, v, key_weights=None)``: add keys;
    * :meth:`relu` ``(zq, centered=True)``, :meth:`bump` ``(zq, bandwidth)``: queries that
      see every cached key;
    * :meth:`step_relu`, :meth:`step_bump` ``(zq, zk, v, ..., key_weights=None)``: the causal
      attention of ``m`` new tokens (query :math:`i` sees the cached keys and the new keys
      up to its own), then their keys appended: a decode step.  On an empty cache this is
      the causal forward (:func:`~opsplit.functional.causal_sliced_relu_attention`); after
      it, :math:`O(D \log^2 n)` per new token for the cached keys plus the
      :math:`O(m^2 D)` sums among the new ones.
    """

    def __init__(self):
        self.n = 0
        self.B = self.H = self.D = None
        self.dtype = self.device = None
        self.runs: list[tuple[int, int]] = []  # (offset, length), in position order
        self.cap = 0

    # -- public ----------------------------------------------------------------------------
    def __len__(self) -> int:
        return self.n

    @property
    def length(self) -> int:
        """The number of cached keys."""
        return self.n

    def __repr__(self) -> str:
        return (f"SlicedDecodeCache(n={self.n}, runs={[L for _, L in self.runs]}, "
                f"B={self.B}, H={self.H}, D={self.D}, dtype={self.dtype})")

    def nbytes(self, allocated: bool = False) -> int:
        """Bytes held for the ``n`` cached keys (``allocated``: the whole capacity)."""
        if self.n == 0:
            return 0
        keys = self.cap if allocated else self.n
        R, D, es = self.R, self.D, self.z.element_size()
        per_key = 2 * es + D * es  # z, w, x
        per_block = 2 * 8 + 2 * D * es  # Ps (float64), Pv (dtype)
        return R * (keys * per_key + -(-keys // BLOCK) * per_block)

    def append(self, zk: Tensor, v: Tensor, key_weights: Tensor | None = None) -> None:
        """Add keys: scores ``zk`` ``(B, H, m)``, values ``v`` ``(B, H, m, D)``, key weights
        broadcastable to ``(B, H, m)`` (``None``: 1)."""
        fn = "SlicedDecodeCache.append"
        z, x, w = self._check_keys(fn, zk, v, key_weights)
        if z.shape[1]:
            self._append_rows(z, x, w)

    def relu(self, zq: Tensor, *, centered: bool = True) -> Tensor:
        """Eq. 3 (eq. 2 if not ``centered``) of queries ``zq`` ``(B, H, M)`` over every cached
        key -> ``(B, H, M, D)``."""
        fn = "SlicedDecodeCache.relu"
        centered = check_centered(fn, centered)
        q = self._check_queries(fn, zq, need_keys=True)
        return self._out(self._combine_relu([self._runs_relu(q)], centered), zq.shape)

    def bump(self, zq: Tensor, bandwidth) -> Tensor:
        """Eq. 7 of queries ``zq`` ``(B, H, M)`` over every cached key -> ``(B, H, M, D)``."""
        fn = "SlicedDecodeCache.bump"
        q = self._check_queries(fn, zq, need_keys=True)
        b = self._bandwidth(fn, bandwidth)
        return self._out(self._combine_bump([self._runs_bump(q, b)]), zq.shape)

    def step_relu(self, zq: Tensor, zk: Tensor, v: Tensor, *, key_weights: Tensor | None = None,
                  centered: bool = True) -> Tensor:
        """The causal eq. 3 (eq. 2) of ``m`` new tokens (queries ``zq`` ``(B, H, m)``, keys
        ``zk``, values ``v``, weights as :meth:`append`) over the cached and the new keys;
        then the new keys are appended.  ``(B, H, m, D)``."""
        fn = "SlicedDecodeCache.step_relu"
        centered = check_centered(fn, centered)
        return self._step(fn, zq, zk, v, key_weights, centered=centered)

    def step_bump(self, zq: Tensor, zk: Tensor, v: Tensor, bandwidth, *,
                  key_weights: Tensor | None = None) -> Tensor:
        """:meth:`step_relu` for eq. 7 with bandwidth ``b > 0``."""
        return self._step("SlicedDecodeCache.step_bump", zq, zk, v, key_weights, bandwidth=bandwidth)

    def select(self, index: Tensor) -> None:
        """Keep the batch rows ``index`` (e.g. after dropping finished sequences)."""
        if self.n == 0 and self.B is None:
            return
        index = index.to(self.device)
        rows = (index.unsqueeze(1) * self.H + torch.arange(self.H, device=self.device)).reshape(-1)
        R, Rn = self.R, rows.numel()
        newz = self.z.new_empty(Rn * self.cap)
        neww = self.w.new_empty(Rn * self.cap)
        newx = self.x.new_empty(Rn * self.cap, self.D)
        nb = self.cap // BLOCK
        newPs = self.Ps.new_empty(Rn * nb, 2)
        newPv = self.Pv.new_empty(Rn * nb, 2, self.D)
        for o, L in self.runs:
            newz[Rn * o: Rn * (o + L)] = self.z[R * o: R * (o + L)].view(R, L)[rows].reshape(-1)
            neww[Rn * o: Rn * (o + L)] = self.w[R * o: R * (o + L)].view(R, L)[rows].reshape(-1)
            newx[Rn * o: Rn * (o + L)] = self.x[R * o: R * (o + L)].view(R, L, -1)[rows].reshape(-1, self.D)
            if L >= BLOCK:
                bo, bl = o // BLOCK, L // BLOCK
                newPs[Rn * bo: Rn * (bo + bl)] = self.Ps[R * bo: R * (bo + bl)].view(R, bl, 2)[rows].reshape(-1, 2)
                newPv[Rn * bo: Rn * (bo + bl)] = self.Pv[R * bo: R * (bo + bl)].view(R, bl, 2, -1)[rows] \
                    .reshape(-1, 2, self.D)
        self.z, self.w, self.x, self.Ps, self.Pv = newz, neww, newx, newPs, newPv
        for name in ("ez", "ev", "ew", "Ts", "Tv", "cz", "cv", "has_ref"):
            setattr(self, name, getattr(self, name)[rows])
        self.B, self.R = index.numel(), Rn
        self._all_ref = bool(self.has_ref.all())

    # -- checks -----------------------------------------------------------------------------
    def _check_grad(self, fn, *xs):
        if torch.is_grad_enabled() and any(isinstance(x, Tensor) and x.requires_grad for x in xs):
            raise RuntimeError(
                f"{fn}: the sorted runs are built in place and are not differentiable; call under "
                "torch.no_grad(), or use the direct sums of opsplit.functional.sliced_decode (the "
                "KVCache does so when autograd records)"
            )

    def _check_same(self, fn: str, name: str, x: Tensor, what: str):
        if self.B is None:
            return
        B, H = x.shape[0], x.shape[1]
        if B != self.B:
            raise ValueError(f"{fn}: {name}: batch size {B}, the cache holds {self.B} (shape {tuple(x.shape)})")
        if H != self.H:
            raise ValueError(f"{fn}: {name}: {H} heads, the cache holds {self.H} (shape {tuple(x.shape)})")
        if x.dtype != self.dtype:
            raise TypeError(f"{fn}: {name}: dtype {x.dtype}, the cache holds {self.dtype}")
        if x.device != self.device:
            raise ValueError(f"{fn}: {name}: on device {x.device}, the cache is on {self.device}")

    @staticmethod
    def _check_tensor(fn: str, name: str, x, dim: int, shape: str):
        if not isinstance(x, Tensor):
            raise TypeError(f"{fn}: {name}: expected a torch.Tensor, got {type(x).__name__}")
        if x.dtype not in (torch.float32, torch.float64):
            raise TypeError(f"{fn}: {name}: expected a float32 or float64 tensor, got dtype {x.dtype}")
        if x.dim() != dim:
            raise ValueError(f"{fn}: {name}: expected shape {shape}, got {tuple(x.shape)}")

    @staticmethod
    def _check_finite(fn: str, name: str, x: Tensor, what: str):
        if x.numel() and not bool(torch.isfinite(x.sum())) and not bool(torch.isfinite(x).all()):
            n_bad = int((~torch.isfinite(x)).sum())
            raise ValueError(f"{fn}: {name}: expected finite {what}, found {n_bad} NaN/inf entries")

    def _check_keys(self, fn, zk, v, key_weights):
        self._check_tensor(fn, "zk", zk, 3, "(B, H, m)")
        self._check_tensor(fn, "v", v, 4, "(B, H, m, D)")
        if v.shape[:3] != zk.shape:
            raise ValueError(f"{fn}: v: expected shape (B, H, m, D) = {tuple(zk.shape)} + (D,), got "
                             f"{tuple(v.shape)}")
        if v.dtype != zk.dtype or v.device != zk.device:
            raise TypeError(f"{fn}: zk and v must share one dtype and device, got {zk.dtype} on {zk.device} "
                            f"and {v.dtype} on {v.device}")
        self._check_grad(fn, zk, v, key_weights)
        self._check_same(fn, "zk", zk, "keys")
        if self.D is not None and v.shape[3] != self.D:
            raise ValueError(f"{fn}: v: {v.shape[3]} features, the cache holds D = {self.D}")
        if v.shape[3] == 0 or zk.shape[0] == 0 or zk.shape[1] == 0:
            raise ValueError(f"{fn}: v: expected B, H, D >= 1, got {tuple(v.shape)}")
        self._check_finite(fn, "zk", zk, "scores")
        self._check_finite(fn, "v", v, "values")
        w = combine_key_weights(fn, None, key_weights, zk.shape, zk.dtype, zk.device)
        if self.B is None:
            self._init(zk, v)
        R, m = self.R, zk.shape[2]
        z = zk.reshape(R, m)
        x = v.reshape(R, m, self.D)
        w = torch.ones_like(z) if w is None else w.reshape(R, m)
        return z, x, w

    def _check_queries(self, fn, zq, need_keys: bool):
        self._check_tensor(fn, "zq", zq, 3, "(B, H, M)")
        self._check_grad(fn, zq)
        if need_keys and self.n == 0:
            raise ValueError(f"{fn}: zq: a query before any key: the cache is empty (append keys first)")
        self._check_same(fn, "zq", zq, "queries")
        self._check_finite(fn, "zq", zq, "scores")
        return zq.reshape(self.R, zq.shape[2])

    def _bandwidth(self, fn, bandwidth) -> Tensor:
        return bandwidth_rows(fn, bandwidth, (self.B, self.H), self.dtype, self.device).reshape(self.R)

    # -- storage ----------------------------------------------------------------------------
    def _init(self, zk: Tensor, v: Tensor):
        self.B, self.H, self.D = zk.shape[0], zk.shape[1], v.shape[3]
        self.R = self.B * self.H
        self.dtype, self.device = zk.dtype, zk.device
        R, dev = self.R, self.device
        i64 = dict(dtype=torch.int64, device=dev)
        self.ez = torch.zeros(R, _MAX_RUNS, **i64)
        self.ev = torch.zeros(R, _MAX_RUNS, **i64)
        self.ew = torch.full((R, _MAX_RUNS), _NONE, **i64)
        self.Ts = torch.zeros(R, _MAX_RUNS, 2, dtype=torch.float64, device=dev)
        self.Tv = torch.zeros(R, _MAX_RUNS, 2, self.D, dtype=torch.float64, device=dev)
        self.cz = torch.zeros(R, dtype=torch.float64, device=dev)
        self.cv = torch.zeros(R, self.D, dtype=torch.float64, device=dev)
        self.has_ref = torch.zeros(R, dtype=torch.bool, device=dev)
        self._all_ref = False
        self.cap = 0
        self.z = self.w = self.x = self.Ps = self.Pv = None

    def _reserve(self, n: int, keep: int):
        """Capacity for ``n`` keys; the first ``keep`` positions (whole runs) are kept."""
        if n <= self.cap:
            return
        cap = max(BLOCK, -(-2 * n // BLOCK) * BLOCK)
        R, D, dt, dev = self.R, self.D, self.dtype, self.device
        z = torch.empty(R * cap, dtype=dt, device=dev)
        w = torch.empty(R * cap, dtype=dt, device=dev)
        x = torch.empty(R * cap, D, dtype=dt, device=dev)
        Ps = torch.empty(R * (cap // BLOCK), 2, dtype=torch.float64, device=dev)
        Pv = torch.empty(R * (cap // BLOCK), 2, D, dtype=dt, device=dev)
        if keep:
            z[: R * keep] = self.z[: R * keep]
            w[: R * keep] = self.w[: R * keep]
            x[: R * keep] = self.x[: R * keep]
            kb = R * (keep // BLOCK)
            Ps[:kb] = self.Ps[:kb]
            Pv[:kb] = self.Pv[:kb]
        self.z, self.w, self.x, self.Ps, self.Pv, self.cap = z, w, x, Ps, Pv, cap

    def _set_refs(self, z: Tensor, x: Tensor, w: Tensor):
        """The score and value of each row's first key of positive weight (once per row)."""
        if self._all_ref:
            return
        pos = w > 0
        need = ~self.has_ref & pos.any(1)
        if bool(need.any()):
            first = pos.to(torch.int8).argmax(1)
            r = torch.nonzero(need).flatten()
            self.cz[r] = z[r, first[r]].double()
            self.cv[r] = x[r, first[r]].double()
            self.has_ref[r] = True
        self._all_ref = bool(self.has_ref.all())

    # -- appending: the binary counter ---------------------------------------------------------
    def _append_rows(self, z: Tensor, v: Tensor, w: Tensor):
        """``z (R, m)``, ``v (R, m, D)`` (raw values), ``w (R, m)``."""
        self._set_refs(z, v, w)
        n, m = self.n, z.shape[1]
        n2 = n + m
        h = (n ^ n2).bit_length() - 1  # the highest bit in which n and n + m differ
        keep = [(o, L) for o, L in self.runs if L > (1 << h)]
        s = sum(L for _, L in keep)  # runs of n above bit h stay
        R, D = self.R, self.D
        # the old tail [s, n) and its exponents, read before the buffers are overwritten
        tail = self.runs[len(keep):]
        if tail:
            tz = self.z[R * s: R * n]
            tw = self.w[R * s: R * n]
            tx = self.x[R * s: R * n]
            parts_z, parts_w, parts_x, parts_ev = [], [], [], []
            for i, (o, L) in enumerate(tail):
                a = R * (o - s)
                parts_z.append(tz[a: a + R * L].view(R, L))
                parts_w.append(tw[a: a + R * L].view(R, L))
                parts_x.append(tx[a: a + R * L].view(R, L, D))
                parts_ev.append(self.ev[:, len(keep) + i: len(keep) + i + 1].expand(R, L))
            oz = torch.cat(parts_z, 1)
            ow = torch.cat(parts_w, 1)
            ox = torch.cat(parts_x, 1)
            oev = torch.cat(parts_ev, 1)  # (R, n - s): each old key's value exponent
        self._reserve(n2, s)
        self.runs = keep
        # the new runs: the set bits of n + m at and below h, in decreasing size
        sizes = [1 << k for k in range(h, -1, -1) if (n2 >> k) & 1]
        used = 0  # new tokens consumed
        off = s
        for i, L in enumerate(sizes):
            if i == 0 and tail:
                take = L - (n - s)
                self._build(len(self.runs), off, L, z[:, :take], v[:, :take], w[:, :take],
                            old=(oz, ow, ox, oev))
            else:
                take = L
                self._build(len(self.runs), off, L, z[:, used: used + take], v[:, used: used + take],
                            w[:, used: used + take])
            used += take
            off += L
        self.n = n2

    def _build(self, idx: int, off: int, L: int, z: Tensor, v: Tensor, w: Tensor, old=None):
        """Run ``idx`` at positions ``[off, off + L)`` from new keys ``(z, v, w)`` (raw values)
        and, with ``old``, keys of old runs ``(z, w, x, e_v)`` (scaled values)."""
        R, D = self.R, self.D
        pos = w > 0
        dv = torch.where(pos.unsqueeze(-1), v.double() - self.cv.unsqueeze(1), 0.0)  # (R, k, D)
        ev = _exp(dv.abs().amax((1, 2)) if dv.numel() else torch.zeros(R, dtype=torch.float64, device=self.device))
        if old is not None:
            oz, ow, ox, oev = old
            has = (ow > 0).any(1)
            ev = torch.where(has, torch.maximum(ev, torch.where(ow > 0, oev, -(1 << 30)).amax(1)), ev)
            xo = _pow2(ox.double(), (oev - ev.unsqueeze(1)).unsqueeze(-1)).to(self.dtype)
            xo = torch.where((ow > 0).unsqueeze(-1), xo, torch.zeros((), dtype=xo.dtype, device=xo.device))
            xn = _pow2(dv, -ev.view(R, 1, 1)).to(self.dtype)
            zz = torch.cat([oz, z], 1)
            ww = torch.cat([ow, w], 1)
            xx = torch.cat([xo, xn], 1)
        else:
            zz, ww, xx = z, w, _pow2(dv, -ev.view(R, 1, 1)).to(self.dtype)
        zs, order = torch.sort(zz, dim=1, stable=True)
        ws = ww.gather(1, order)
        xs = xx.gather(1, order.unsqueeze(-1).expand(R, L, D))
        a = R * off
        self.z[a: a + R * L] = zs.reshape(-1)
        self.w[a: a + R * L] = ws.reshape(-1)
        self.x[a: a + R * L] = xs.reshape(-1, D)
        # exponents of the run: weights, shifted scores (positive weights only)
        pw = ws > 0
        wmax = ws.amax(1).double()
        ew = torch.where(wmax > 0, _exp(wmax), torch.full_like(ev, _NONE))
        dz = torch.where(pw, zs.double() - self.cz.unsqueeze(1), 0.0)
        ez = _exp(dz.abs().amax(1))
        self.ez[:, idx], self.ev[:, idx], self.ew[:, idx] = ez, ev, ew
        # prefix tables every BLOCK keys, and the totals (float64)
        w1 = torch.where(pw, _pow2(ws.double(), -ew.unsqueeze(1)), 0.0)  # (R, L)
        z1 = _pow2(dz, -ez.unsqueeze(1))
        wz = w1 * z1
        x64 = xs.double()
        if L >= BLOCK:
            nb = L // BLOCK
            sc = torch.stack([w1, wz], -1).view(R, nb, BLOCK, 2).sum(2)  # (R, nb, 2)
            vc = torch.stack([torch.einsum("rbs,rbsd->rbd", w1.view(R, nb, BLOCK), x64.view(R, nb, BLOCK, D)),
                              torch.einsum("rbs,rbsd->rbd", wz.view(R, nb, BLOCK), x64.view(R, nb, BLOCK, D))],
                             2)  # (R, nb, 2, D)
            cs = torch.cumsum(sc, 1)
            cv = torch.cumsum(vc, 1)
            b0 = R * (off // BLOCK)
            Ps = self.Ps[b0: b0 + R * nb].view(R, nb, 2)
            Pv = self.Pv[b0: b0 + R * nb].view(R, nb, 2, D)
            Ps[:, 0] = 0
            Pv[:, 0] = 0
            if nb > 1:
                Ps[:, 1:] = cs[:, :-1]
                Pv[:, 1:] = cv[:, :-1].to(self.dtype)
            self.Ts[:, idx] = cs[:, -1]
            self.Tv[:, idx] = cv[:, -1]
        else:
            self.Ts[:, idx] = torch.stack([w1.sum(1), wz.sum(1)], -1)
            self.Tv[:, idx, 0] = torch.einsum("rs,rsd->rd", w1, x64)
            self.Tv[:, idx, 1] = torch.einsum("rs,rsd->rd", wz, x64)
        self.runs.append((off, L))

    # -- queries over the runs ------------------------------------------------------------------
    def _ranks(self, probes: list[tuple[Tensor, str]]) -> Tensor:
        """``(R, n_runs, P)`` counts of keys ``<`` (``"left"``) or ``<=`` (``"right"``) each probe
        ``(R, M)`` in every run (``P`` = probes x M), by one binary search per run."""
        R = self.R
        out = []
        for o, L in self.runs:
            zr = self.z[R * o: R * (o + L)].view(R, L)
            ranks = []
            for p, side in probes:
                ranks.append(torch.searchsorted(zr, p, side=side))
            out.append(torch.cat(ranks, 1))
        return torch.stack(out, 1)

    def _prefix(self, p: Tensor):
        """Prefix sums of the first ``p`` keys of every run, ``p (R, n_runs, P)``: scalars
        ``(R, n_runs, P, 2)`` (of :math:`w', w'z'`) and vectors ``(R, n_runs, P, 2, D)`` (of
        :math:`w'x, w'z'x`), float64, in each run's units."""
        R, S = self.R, BLOCK
        dev = self.device
        nr = len(self.runs)
        offs = torch.tensor([o for o, _ in self.runs], device=dev)
        lens = torch.tensor([L for _, L in self.runs], device=dev)
        big = (lens >= S).view(1, nr, 1)
        rows = torch.arange(R, device=dev).view(R, 1, 1)
        blk = torch.div(p - 1, S, rounding_mode="floor").clamp_min(0)
        use = big & (p > 0)
        lo = torch.where(big, blk * S, 0)
        bidx = torch.div(offs, S, rounding_mode="floor").view(1, nr, 1) * R \
            + rows * torch.div(lens, S, rounding_mode="floor").view(1, nr, 1) + blk
        bidx = torch.where(use, bidx, 0)
        ps = self.Ps[bidx] * use.unsqueeze(-1)
        pv = self.Pv[bidx].double() * use.view(*use.shape, 1, 1)
        j = lo.unsqueeze(-1) + torch.arange(S, device=dev)  # (R, nr, P, S) local positions
        valid = j < p.unsqueeze(-1)
        flat = (offs.view(1, nr, 1, 1) * R + rows.unsqueeze(-1) * lens.view(1, nr, 1, 1)
                + torch.minimum(j, lens.view(1, nr, 1, 1) - 1))
        zj, wj, xj = self.z[flat], self.w[flat], self.x[flat]  # (R, nr, P, S[, D])
        ew = self.ew[:, :nr].view(R, nr, 1, 1)
        ez = self.ez[:, :nr].view(R, nr, 1, 1)
        pw = valid & (wj > 0)
        w1 = torch.where(pw, _pow2(wj.double(), -ew), 0.0)
        z1 = torch.where(pw, _pow2(zj.double() - self.cz.view(R, 1, 1, 1), -ez), 0.0)
        wz = w1 * z1
        x64 = xj.double()
        ps = ps + torch.stack([w1.sum(-1), wz.sum(-1)], -1)
        pv = pv + torch.stack([torch.einsum("rkps,rkpsd->rkpd", w1, x64),
                               torch.einsum("rkps,rkpsd->rkpd", wz, x64)], -2)
        return ps, pv

    def _queries_scaled(self, q: Tensor) -> Tensor:
        """``(q - c_z) 2^-e_z`` per run: ``(R, n_runs, M)`` float64."""
        nr = len(self.runs)
        return _pow2(q.double().unsqueeze(1) - self.cz.view(-1, 1, 1), -self.ez[:, :nr].unsqueeze(-1))

    def _runs_relu(self, q: Tensor) -> dict:
        """The eq. 2/3 moments of queries ``q (R, M)`` over every run (module docstring)."""
        nr, M = len(self.runs), q.shape[1]
        p = self._ranks([(q.contiguous(), "left")])  # (R, nr, M)
        ps, pv = self._prefix(p)
        Q = self._queries_scaled(q)  # (R, nr, M)
        Ts, Tv = self.Ts[:, :nr].unsqueeze(2), self.Tv[:, :nr].unsqueeze(2)  # (R, nr, 1, 2[, D])
        Wl, Kl = ps[..., 0], ps[..., 1]
        A, Bv = pv[..., 0, :], pv[..., 1, :]
        return {
            "N": Q.unsqueeze(-1) * A - Bv,
            "Rm": Q * Wl - Kl,
            "den": Q * (2 * Wl - Ts[..., 0]) - (2 * Kl - Ts[..., 1]),
            "W": Ts[..., 0].expand(-1, -1, M),
            "S": Tv[..., 0, :].expand(-1, -1, M, -1),
            "ew": self.ew[:, :nr].unsqueeze(-1), "ez": self.ez[:, :nr].unsqueeze(-1),
            "ev": self.ev[:, :nr].unsqueeze(-1),
        }

    def _runs_bump(self, q: Tensor, b: Tensor) -> dict:
        """The eq. 7 moments of queries ``q (R, M)`` with bandwidths ``b (R,)`` over every run."""
        R, nr, M = self.R, len(self.runs), q.shape[1]
        q64, b64 = q.double(), b.double().unsqueeze(1)
        lo = (q64 - b64).to(self.dtype).contiguous()
        hi = (q64 + b64).to(self.dtype).contiguous()
        q = q.contiguous()
        r = self._ranks([(lo, "right"), (q, "left"), (q, "right"), (hi, "left")])  # (R, nr, 4M)
        r0, rlt, rle, r2 = r.split(M, -1)
        r0 = torch.minimum(r0, rlt)
        r2 = torch.maximum(r2, rle)
        ew = self.ew[:, :nr].unsqueeze(-1)
        ez = self.ez[:, :nr].unsqueeze(-1)
        ev = self.ev[:, :nr].unsqueeze(-1)
        W = self.Ts[:, :nr, 0].unsqueeze(-1).expand(-1, -1, M)
        if self._well_conditioned(q64, b64):
            ps, pv = self._prefix(torch.cat([r0, rle, r2], -1))
            (s0, s1, s2), (v0, v1, v2) = ps.split(M, 2), pv.split(M, 2)
            Q = self._queries_scaled(q)
            beta = _pow2(b64.view(R, 1, 1), -ez)  # b 2^-e_z
            lo_c, hi_c = (beta - Q).unsqueeze(-1), (beta + Q).unsqueeze(-1)
            # beta sum_window w' hat x = (beta - Q)(A1 - A0) + (B1 - B0) + (beta + Q)(A2 - A1) - (B2 - B1)
            Mv = (lo_c * (v1[..., 0, :] - v0[..., 0, :]) + (v1[..., 1, :] - v0[..., 1, :])
                  + hi_c * (v2[..., 0, :] - v1[..., 0, :]) - (v2[..., 1, :] - v1[..., 1, :]))
            Ms = (lo_c[..., 0] * (s1[..., 0] - s0[..., 0]) + (s1[..., 1] - s0[..., 1])
                  + hi_c[..., 0] * (s2[..., 0] - s1[..., 0]) - (s2[..., 1] - s1[..., 1]))
            Mv = Mv / beta.unsqueeze(-1)
            Ms = Ms / beta
        else:
            Mv, Ms = self._window_pairs(q64, b64, r0, r2)
        return {"M": Mv, "mass": Ms, "W": W, "ew": ew, "ev": ev}

    def _well_conditioned(self, q64: Tensor, b64: Tensor) -> bool:
        """Whether every run's spread of scores (with the queries) over the bandwidth is at most
        ``KAPPA_FAST`` of the dtype, and ``b`` at least 8 ulps of the largest score (else the
        window differences of the tables cancel: :mod:`~opsplit.functional._windows`)."""
        R = self.R
        zmin = torch.stack([self.z[R * o: R * (o + L)].view(R, L)[:, 0] for o, L in self.runs], 1).double()
        zmax = torch.stack([self.z[R * o: R * (o + L)].view(R, L)[:, -1] for o, L in self.runs], 1).double()
        hi = torch.maximum(zmax, q64.amax(1, keepdim=True))
        lo = torch.minimum(zmin, q64.amin(1, keepdim=True))
        kappa = (hi - lo) / b64
        big = torch.maximum(hi.abs(), lo.abs())
        ok = (kappa <= KAPPA_FAST[self.dtype]) & (b64 >= big * (8 * torch.finfo(self.dtype).eps))
        return bool(ok.all())

    def _window_pairs(self, q64: Tensor, b64: Tensor, r0: Tensor, r2: Tensor):
        """Eq. 7's window sums pair by pair: for every (row, run, query), the keys of ranks
        ``[r0, r2)`` (those with ``q - b < z < q + b``), the hat kernel in float64 from the
        scores themselves.  Returns ``(R, n_runs, M, D)`` and ``(R, n_runs, M)`` in each run's
        units (as the table path)."""
        R, D, nr, M = self.R, self.D, len(self.runs), q64.shape[1]
        dev = self.device
        offs = torch.tensor([o for o, _ in self.runs], device=dev).view(1, nr, 1)
        lens = torch.tensor([L for _, L in self.runs], device=dev).view(1, nr, 1)
        rows = torch.arange(R, device=dev).view(R, 1, 1)
        cnt = (r2 - r0).reshape(-1)
        F_ = cnt.numel()
        fq = torch.repeat_interleave(torch.arange(F_, device=dev), cnt)
        first = torch.cumsum(cnt, 0) - cnt
        k = torch.arange(fq.numel(), device=dev) - first[fq]
        base = (offs * R + rows * lens).expand(R, nr, M).reshape(-1)
        flat = base[fq] + r0.reshape(-1)[fq] + k
        zj = self.z[flat].double()
        wj = self.w[flat]
        xj = self.x[flat].double()
        rq = torch.div(fq, nr * M, rounding_mode="floor")  # row of each pair
        rk = torch.div(fq, M, rounding_mode="floor") % nr  # run of each pair
        qi = q64.reshape(-1)[rq * M + fq % M]
        hat = torch.relu(1 - (qi - zj).abs() / b64.view(-1)[rq])
        w1 = torch.where(wj > 0, _pow2(wj.double(), -self.ew[rq, rk]), 0.0) * hat
        Mv = torch.zeros(F_, D, dtype=torch.float64, device=dev).index_add_(0, fq, w1.unsqueeze(-1) * xj)
        Ms = torch.zeros(F_, dtype=torch.float64, device=dev).index_add_(0, fq, w1)
        return Mv.view(R, nr, M, D), Ms.view(R, nr, M)

    # -- the new keys among themselves -------------------------------------------------------------
    def _chunk(self, q: Tensor, z: Tensor, v: Tensor, w: Tensor, b: Tensor | None):
        """Moments of the new queries ``q (R, M)`` over the new keys ``(z, v, w)`` ``(R, m)``
        (query ``i`` sees keys ``j <= i + m - M``), by dense sums in float64, in the units of
        one part: its own exponents, the weights per query."""
        R, D = self.R, self.D
        M, m = q.shape[1], z.shape[1]
        pos = w > 0
        dz = torch.where(pos, z.double() - self.cz.unsqueeze(1), 0.0)
        dv = torch.where(pos.unsqueeze(-1), v.double() - self.cv.unsqueeze(1), 0.0)
        ez = _exp(dz.abs().amax(1))
        ev = _exp(dv.abs().amax((1, 2)))
        z1 = _pow2(dz, -ez.unsqueeze(1))
        x = _pow2(dv, -ev.view(R, 1, 1))
        Q = _pow2(q.double() - self.cz.unsqueeze(1), -ez.unsqueeze(1))
        step = max(1, _CHUNK_ELEMS // max(1, m * D))
        keys = {k: [] for k in ("N", "Rm", "den", "W", "S", "M", "mass", "ew")}
        vis_all = torch.ones(M, m, dtype=torch.bool, device=self.device).tril_(m - M)
        for i0 in range(0, M, step):
            i1 = min(M, i0 + step)
            Wq = torch.where(vis_all[i0:i1], w.double().unsqueeze(1), 0.0)  # (R, k, m)
            wmax = Wq.amax(-1)
            ew = torch.where(wmax > 0, _exp(wmax), torch.full_like(wmax, _NONE, dtype=torch.int64))
            W1 = _pow2(Wq, -torch.where(wmax > 0, ew, 0).unsqueeze(-1))
            keys["ew"].append(ew)
            keys["W"].append(W1.sum(-1))
            keys["S"].append(W1 @ x)
            if b is None:
                d = Q[:, i0:i1].unsqueeze(-1) - z1.unsqueeze(1)
                K = W1 * torch.relu(d)
                keys["N"].append(K @ x)
                keys["Rm"].append(K.sum(-1))
                keys["den"].append((W1 * d.abs()).sum(-1))
            else:
                hat = torch.relu(1 - (q[:, i0:i1].double().unsqueeze(-1) - z.double().unsqueeze(1)).abs()
                                 / b.double().view(R, 1, 1))
                K = W1 * hat
                keys["M"].append(K @ x)
                keys["mass"].append(K.sum(-1))
        out = {k: torch.cat(t, 1).unsqueeze(1) for k, t in keys.items() if t}
        out["ev"] = ev.view(R, 1, 1)
        if b is None:
            out["ez"] = ez.view(R, 1, 1)
        return out

    # -- combining the parts ---------------------------------------------------------------------------
    @staticmethod
    def _cat(parts: list, key: str, M: int):
        R = parts[0]["ew"].shape[0]
        xs = []
        for p in parts:
            t = p[key]
            xs.append(t.expand(R, t.shape[1], M) if t.dim() == 3 else t)
        return torch.cat(xs, 1)

    def _factors(self, parts: list, M: int):
        """Per part and query the factors ``2^(e - E)`` of the weights, scores (``None`` for
        eq. 7, whose moments carry no score unit) and values, ``E`` the largest exponent of
        the query's parts, and the values' ``E`` ``(R, M)``."""
        ew = self._cat(parts, "ew", M)
        ev = self._cat(parts, "ev", M)
        fw = torch.exp2((ew - ew.amax(1, keepdim=True)).clamp_min(-4000).double())
        Ev = ev.amax(1, keepdim=True)
        fv = torch.exp2((ev - Ev).clamp_min(-4000).double())
        fz = None
        if "ez" in parts[0]:
            ez = self._cat(parts, "ez", M)
            fz = torch.exp2((ez - ez.amax(1, keepdim=True)).clamp_min(-4000).double())
        return fw, fz, fv, Ev.squeeze(1)

    def _combine_relu(self, parts: list, centered: bool) -> Tensor:
        M = parts[0]["den"].shape[2]
        fw, fz, fv, Ev = self._factors(parts, M)
        N = (self._cat(parts, "N", M) * (fw * fz * fv).unsqueeze(-1)).sum(1)  # (R, M, D)
        Rm = (self._cat(parts, "Rm", M) * fw * fz).sum(1)
        den = (self._cat(parts, "den", M) * fw * fz).sum(1)
        ok = den > 0
        inv = torch.where(ok, 1.0 / torch.where(ok, den, 1.0), 0.0)
        if centered:
            W = (self._cat(parts, "W", M) * fw).sum(1)
            Sv = (self._cat(parts, "S", M) * (fw * fv).unsqueeze(-1)).sum(1)
            mean = torch.where((W > 0).unsqueeze(-1), Sv / torch.where(W > 0, W, 1.0).unsqueeze(-1), 0.0)
            out = _pow2((N - Rm.unsqueeze(-1) * mean) * inv.unsqueeze(-1), Ev.unsqueeze(-1))
        else:
            out = _pow2(N * inv.unsqueeze(-1), Ev.unsqueeze(-1)) + (Rm * inv).unsqueeze(-1) * self.cv.unsqueeze(1)
        return out

    def _combine_bump(self, parts: list) -> Tensor:
        M = parts[0]["mass"].shape[2]
        fw, _, fv, Ev = self._factors(parts, M)
        Mv = (self._cat(parts, "M", M) * (fw * fv).unsqueeze(-1)).sum(1)
        mass = (self._cat(parts, "mass", M) * fw).sum(1)
        W = (self._cat(parts, "W", M) * fw).sum(1)
        ok = W > 0
        inv = torch.where(ok, 1.0 / torch.where(ok, W, 1.0), 0.0)
        return _pow2(Mv * inv.unsqueeze(-1), Ev.unsqueeze(-1)) + (mass * inv).unsqueeze(-1) * self.cv.unsqueeze(1)

    def _out(self, o: Tensor, shape) -> Tensor:
        return o.to(self.dtype).view(*shape, self.D)

    # -- a decode step -------------------------------------------------------------------------------
    def _step(self, fn, zq, zk, v, key_weights, *, centered=True, bandwidth=None):
        self._check_tensor(fn, "zq", zq, 3, "(B, H, m)")
        self._check_grad(fn, zq)
        z, x, w = self._check_keys(fn, zk, v, key_weights)
        if zq.shape != zk.shape:
            raise ValueError(f"{fn}: zq: expected the shape of zk {tuple(zk.shape)} (one query per new "
                             f"token), got {tuple(zq.shape)}")
        self._check_same(fn, "zq", zq, "queries")
        self._check_finite(fn, "zq", zq, "scores")
        b = None if bandwidth is None else self._bandwidth(fn, bandwidth)
        shape = zq.shape
        if self.n == 0:  # the prefill: the causal forward kernel, then the runs
            kw = None if key_weights is None else w.view(shape)
            if b is None:
                out = causal_sliced_relu_attention(zq, zk, v, centered=centered, key_weights=kw)
            else:
                out = causal_sliced_relu_bump_attention(zq, zk, v, b.view(shape[:2]), key_weights=kw)
            self._append_rows(z, x, w)
            return out
        q = zq.reshape(self.R, shape[2])
        self._set_refs(z, x, w)
        if b is None:
            o = self._combine_relu([self._runs_relu(q), self._chunk(q, z, x, w, None)], centered)
        else:
            o = self._combine_bump([self._runs_bump(q, b), self._chunk(q, z, x, w, b)])
        self._append_rows(z, x, w)
        return self._out(o, shape)
