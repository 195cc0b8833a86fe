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
case :math:`O(n D \log n)` at the steps where all runs merge into one.  The newest
:data:`TAIL` keys wait unsorted in a *tail*, which every query sums directly
(:math:`O(\mathrm{TAIL}\,D)`), and join the runs all at once: most steps merge nothing.  A
query is a binary search and a few table reads per run: :math:`O(D \log n)` per head, plus
:math:`O(\log^2 n)` for the searches.  All rows (batch x head) share the run boundaries,
so every operation is a tensor operation over (row, run[, probe]); only the binary searches
run as one ``searchsorted`` per run.

**Storage** (per row, i.e. per batch element and head, for :math:`n` keys of width
:math:`D`): the sorted scores (dtype), the weights and weighted shifted scores in each run's
units (:math:`w' = w\,2^{-e_w}`, :math:`w'z' = w'(z - c_z)\,2^{-e_z}`, float64, :math:`c_z` the
run's shift), the values
:math:`x = (v - c_v)\,2^{-e_v}` (dtype, :math:`D` each; 0 at keys of weight 0), and prefix
tables every :data:`BLOCK` keys (:math:`2D` in the dtype and 2 in float64 per block; the
:math:`2D` in float64 too once a float32 cache's key weights span more than :math:`2^{64}`,
whose light keys' products would leave float32's range); a
prefix is a block's table plus an in-block sum of at most :data:`BLOCK` keys, so the tables
cost :math:`2D / \mathrm{BLOCK}` per key: in float32 with ``BLOCK = 8``, :math:`5D + 22`
bytes per key and head, in buffers of geometric capacity (at most twice that).  Layout: run
after run, each run a contiguous ``(rows, length)`` block, so that each binary search reads
a contiguous array and one gather reads every run.

**Conditioning and magnitudes.**  The values are shifted by the value of the row's first key
of positive weight (:math:`c_v`), the scores of each run by the score of the run's heaviest
key (:math:`c_z`, per row and run, :func:`~opsplit.functional._scale.heaviest`: the rounding
of a run's :math:`q A - B` is then a multiple of the run's share of the denominator, also
where a heavy key ties the query; issue 42), the tail and the new tokens form :math:`q - z`
from the scores as given; each run keeps
its own powers of two :math:`e_z, e_v, e_w` (per row) that bring its shifted scores, shifted
values and weights to :math:`[\tfrac12, 1)`; a run's sums are exact multiples of
:math:`2^{e_w + e_z + e_v}` etc., so the runs combine in float64 with exact power-of-two
factors, relative to the largest of them per query.  Float32 scores, values and weights of
any magnitude (1e-38 .. 3e38, weights spread over the whole range) keep their relative
precision; so do float64 ones between :math:`2^{-1000}` and :math:`2^{1000}`.  Eq. 7 with a
bandwidth far below the spread of a run's scores (spread / b beyond :data:`~opsplit.functional._windows.KAPPA_FAST`,
where the table differences cancel) is summed pair by pair over the keys inside the windows
(exact; the cost is the number of such keys).

**Autograd.**  The runs are built in place and are not differentiable: calls that would
record a graph are refused (``KVCache`` keeps concatenated tensors and the direct sums of
:mod:`~opsplit.functional.sliced_decode` there).
"""

from __future__ import annotations

import torch
from torch import Tensor

from .._checks import check_select_index
from ._inputs import bandwidth_rows, check_centered
from ._inputs import key_weights as combine_key_weights
from ._scale import RELU_SPAN_F32, heaviest
from ._windows import KAPPA_FAST
from .sliced_causal import (
    causal_sliced_relu_attention,
    causal_sliced_relu_bump_attention,
    keep_sorts,
)

__all__ = ["SlicedDecodeCache", "BLOCK", "TAIL"]

#: keys per block of the prefix tables
BLOCK = 8
_LOG_BLOCK = 3
#: exponent of a run (or query) without any key of positive weight: its factors vanish
_NONE = -(1 << 20)
#: exponents are clamped to +-_EMAX (then 2^-e is a normal float64; a clamped exponent only
#: leaves numbers below 2^-1000 unnormalised)
_EMAX = 1000
#: keys kept unsorted after the runs (summed directly by each query) until they are merged
#: into the runs all at once
TAIL = 32
#: largest number of runs (2^64 keys)
_MAX_RUNS = 64
#: queries x keys x features per slice of the dense in-chunk sums
_CHUNK_ELEMS = 1 << 22


def _exp(m: Tensor) -> Tensor:
    """int64 exponents ``e`` of non-negative maxima: ``m 2^-e`` in ``[1/2, 1)``, clamped to
    ``+-_EMAX`` (0 where ``m = 0``)."""
    return torch.frexp(m.double())[1].to(torch.int64).clamp_(-_EMAX, _EMAX)


def _p2(e: Tensor) -> Tensor:
    """``2^e`` in float64 for int64 ``e`` (0 below ``2^-1074``)."""
    return torch.exp2(e.clamp(-1100, 1100).double())


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
      the causal forward (:func:`~opsplit.functional.causal_sliced_relu_attention`); one
      new token is appended first and then queries every run, :math:`O(D \log^2 n)`; more
      new tokens query the runs and sum among themselves (:math:`O(m^2 D)`) before they are
      appended.
    """

    def __init__(self):
        self.n = 0  # keys in the runs
        self.nt = 0  # keys in the tail
        self.B = self.H = self.D = self.R = None
        self.dtype = self.device = None
        self.runs: list[tuple[int, int]] = []  # (offset, length), in position order
        self.cap = 0
        self._mark = None  # the undo log of mark() / rollback()

    # -- public ----------------------------------------------------------------------------
    def __len__(self) -> int:
        return self.n + self.nt

    @property
    def length(self) -> int:
        """The number of cached keys."""
        return self.n + self.nt

    def __repr__(self) -> str:
        return (f"SlicedDecodeCache(n={self.length}, runs={[L for _, L in self.runs]}, tail={self.nt}, "
                f"B={self.B}, H={self.H}, D={self.D}, dtype={self.dtype})")

    def nbytes(self, allocated: bool = False) -> int:
        """Bytes held for the cached keys (``allocated``: for the whole capacity), without the
        per-run constants (``O(log n)``)."""
        if not isinstance(allocated, bool):
            raise TypeError(f"SlicedDecodeCache.nbytes: allocated: expected a bool, got {allocated!r}")
        if self.R is None:
            return 0
        keys = self.cap if allocated else self.n
        es = self.tz.element_size()
        per_key = es + 8 + 8 + self.D * es  # z, w', w'z', x
        per_block = 2 * 8 + 2 * self.D * (torch.finfo(self.pv_dtype).bits // 8)  # Ps (float64), Pv
        tail = (TAIL if allocated else self.nt) * (2 + self.D) * es
        return self.R * (keys * per_key + (keys // BLOCK) * per_block + tail)

    def append(self, zk: Tensor, v: Tensor, key_weights: Tensor | None = None) -> None:
        """Add keys: scores ``zk`` ``(B, H, m)``, values ``v`` ``(B, H, m, D)``, key weights
        broadcastable to ``(B, H, m)`` (``None``: 1)."""
        z, x, w = self._check_keys("SlicedDecodeCache.append", zk, v, key_weights)
        if z.shape[1]:
            self._add(z, x, w)

    def relu(self, zq: Tensor, *, centered: bool = True) -> Tensor:
        """Eq. 3 (eq. 2 if not ``centered``) of queries ``zq`` ``(B, H, M)`` over every cached
        key -> ``(B, H, M, D)``."""
        fn = "SlicedDecodeCache.relu"
        centered = check_centered(fn, centered)
        q = self._check_queries(fn, zq)
        return self._out(self._combine_relu(self._parts(q, None, centered=centered), centered), zq.shape)

    def bump(self, zq: Tensor, bandwidth) -> Tensor:
        """Eq. 7 of queries ``zq`` ``(B, H, M)`` over every cached key -> ``(B, H, M, D)``."""
        fn = "SlicedDecodeCache.bump"
        q = self._check_queries(fn, zq)
        self._check_grad(fn, bandwidth)
        b = self._bandwidth(fn, bandwidth)
        return self._out(self._combine_bump(self._parts(q, None, b=b)), zq.shape)

    def step_relu(self, zq: Tensor, zk: Tensor, v: Tensor, *, key_weights: Tensor | None = None,
                  centered: bool = True) -> Tensor:
        """The causal eq. 3 (eq. 2) of ``m`` new tokens (queries ``zq`` ``(B, H, m)``, keys
        ``zk``, values ``v``, weights as :meth:`append`) over the cached and the new keys;
        the new keys are appended.  ``(B, H, m, D)``."""
        fn = "SlicedDecodeCache.step_relu"
        centered = check_centered(fn, centered)
        return self._step(fn, zq, zk, v, key_weights, centered=centered)

    def step_bump(self, zq: Tensor, zk: Tensor, v: Tensor, bandwidth, *,
                  key_weights: Tensor | None = None) -> Tensor:
        """:meth:`step_relu` for eq. 7 with bandwidth ``b > 0``."""
        return self._step("SlicedDecodeCache.step_bump", zq, zk, v, key_weights, bump=True, bandwidth=bandwidth)

    @property
    def batch_size(self) -> int | None:
        """The number of sequences ``B`` (``None`` before the first keys)."""
        return self.B

    def select(self, index: Tensor) -> None:
        """Keep the batch rows ``index`` (after dropping finished sequences, or reordering
        beams): a 1-D ``torch.int64`` / ``torch.int32`` tensor of row indices in ``[0, B)`` (a
        subset, a permutation, repeated rows) or a 1-D bool mask of length ``B`` (``True`` =
        keep).  Anything else (negative indices, an empty selection, another dtype or rank) is
        refused with an error naming ``index`` before the cache changes
        (:func:`opsplit._checks.check_select_index`)."""
        index = check_select_index(index, self.B, "SlicedDecodeCache.select: index")
        if self.R is None:
            return
        index = index.to(self.device)
        rows = (index.unsqueeze(1) * self.H + torch.arange(self.H, device=self.device)).reshape(-1)
        R, Rn = self.R, rows.numel()
        if self.n:
            new = {}
            for name in ("z", "w1", "wz", "x", "Ps", "Pv"):
                buf = getattr(self, name)
                per = buf.shape[0] // R  # positions (or blocks) per row
                out = buf.new_empty(Rn * per, *buf.shape[1:])
                for o, L in self.runs:
                    if name in ("Ps", "Pv"):
                        if L < BLOCK:
                            continue
                        o, L = o >> _LOG_BLOCK, L >> _LOG_BLOCK
                    out[Rn * o: Rn * (o + L)] = buf[R * o: R * (o + L)].view(R, L, *buf.shape[1:])[rows] \
                        .reshape(-1, *buf.shape[1:])
                new[name] = out
            for name, t in new.items():
                setattr(self, name, t)
        for name in ("E", "F", "Tv", "cz", "cv", "has_ref", "tz", "tw", "tv"):
            setattr(self, name, getattr(self, name)[rows])
        self.B, self.R = index.numel(), Rn
        self._mark = None  # the rows changed: nothing to roll back to
        self._rows = torch.arange(Rn, device=self.device).view(Rn, 1, 1)
        self._all_ref = bool(self.has_ref.all())
        if self.n:
            self._refresh()

    def mark(self) -> None:
        """Remember the cache as it is now, for :meth:`rollback` (an earlier mark is replaced).

        Nothing is copied here: the appends that follow save, the first time they overwrite
        them, the positions, block tables and run constants below the marked length that they
        rebuild (an undo log: its size is at most what those appends rewrite), the tail once
        they flush it, and they keep their new keys as given."""
        if self.R is None:
            raise ValueError("SlicedDecodeCache.mark: the cache is empty; mark it after its first keys")
        refs = None if self._all_ref else (self.cz.clone(), self.cv.clone(), self.has_ref.clone())
        self._mark = {"n": self.n, "nt": self.nt, "runs": list(self.runs), "pos": self.n, "nruns": len(self.runs),
                      "saved": [], "tail": None, "refs": refs, "pv_dtype": self.pv_dtype, "wexp": self._wexp,
                      "keys": []}

    def rollback(self, n: int, keep: Tensor | None = None) -> None:
        """Keep the first ``n`` keys (``marked length <= n <= length``) after any number of
        appends since :meth:`mark`: the overwritten parts are restored from the undo log and
        the kept keys appended since the mark are appended again, in one append — the cache is
        then exactly one that appended those keys at once after the mark (no run is rebuilt
        beyond what an append of them rebuilds).  ``keep``: ``(B, n - marked length)`` bool,
        ``False`` gives a kept key weight 0 (it becomes padding).  The mark is used up."""
        fn = "SlicedDecodeCache.rollback"
        m = self._mark
        if m is None:
            raise ValueError(f"{fn}: no mark to roll back to (mark() before the appends to undo; a mark is used up "
                             "by a rollback and dropped by select)")
        n0 = m["n"] + m["nt"]
        if isinstance(n, bool) or not isinstance(n, int) or not n0 <= n <= self.length:
            raise ValueError(f"{fn}: n: expected an int in [{n0}, {self.length}] (the marked length and the length "
                             f"now), got {n!r}")
        if keep is not None and (not isinstance(keep, Tensor) or keep.dtype != torch.bool
                                 or tuple(keep.shape) != (self.B, n - n0)):
            got = tuple(keep.shape) if isinstance(keep, Tensor) else type(keep).__name__
            raise ValueError(f"{fn}: keep: expected a bool tensor (B, n - marked length) = ({self.B}, {n - n0}), "
                             f"got {got}")
        self._mark = None
        keys = m["keys"]
        if n == self.length and keep is None:  # every key kept as it was appended
            return
        for name, a, saved in m["saved"]:
            buf = getattr(self, name)
            buf[a: a + saved.shape[0]] = saved.to(buf.dtype)
        if self.pv_dtype != m["pv_dtype"]:  # back to the tables' dtype (exact: they held it before)
            self.pv_dtype = m["pv_dtype"]
            self.Pv = self.Pv.to(self.pv_dtype)
        self._wexp = m["wexp"]
        for name, (a, saved) in m.get("consts", {}).items():
            getattr(self, name)[:, a: a + saved.shape[1]] = saved
        if m["tail"] is not None:
            t = m["nt"]
            self.tz[:, :t], self.tw[:, :t], self.tv[:, :t] = m["tail"]
        if m["refs"] is not None:
            self.cz, self.cv, self.has_ref = m["refs"]
            self._all_ref = bool(self.has_ref.all())
        self.n, self.nt, self.runs = m["n"], m["nt"], m["runs"]
        if self.n:
            self._refresh()
        if n == n0:
            return
        z = torch.cat([k[0] for k in keys], 1)[:, : n - n0]
        v = torch.cat([k[1] for k in keys], 1)[:, : n - n0]
        w = None
        if keep is not None or any(k[2] is not None for k in keys):
            w = torch.cat([torch.ones_like(k[0]) if k[2] is None else k[2] for k in keys], 1)[:, : n - n0]
            if keep is not None:
                rows = keep.to(self.device).repeat_interleave(self.H, 0)  # (B, m) -> (R, m), row b * H + h
                w = torch.where(rows, w, 0)
        self._add(z, v, w)

    def _save(self, s: int, nkeep: int) -> None:
        """The undo log (:meth:`mark`): before an append rebuilds the positions from ``s`` and
        the runs from index ``nkeep``, save what of them lies below the marked length and was
        not saved yet."""
        m = self._mark
        R = self.R
        top = min(m["pos"], m["n"])
        if s < top:
            for name in ("z", "w1", "wz", "x"):
                m["saved"].append((name, R * s, getattr(self, name)[R * s: R * top].clone()))
            b0, b1 = s >> _LOG_BLOCK, top >> _LOG_BLOCK
            if b1 > b0:
                for name in ("Ps", "Pv"):
                    m["saved"].append((name, R * b0, getattr(self, name)[R * b0: R * b1].clone()))
            m["pos"] = s
        if nkeep < m["nruns"]:
            consts = m.setdefault("consts", {})
            a, b = nkeep, m["nruns"]
            for name in ("E", "F", "Tv"):
                old = consts.get(name)
                new = getattr(self, name)[:, a: (b if old is None else old[0])].clone()
                consts[name] = (a, new if old is None else torch.cat([new, old[1]], 1))
            m["nruns"] = nkeep

    # -- checks -----------------------------------------------------------------------------
    @staticmethod
    def _check_grad(fn, *xs):
        if torch.is_grad_enabled() and any(isinstance(x, Tensor) and x.requires_grad for x in xs):
            raise RuntimeError(
                f"{fn}: the sorted runs are built in place and are not differentiable; call under "
                "torch.no_grad(), or use the direct sums of opsplit.functional.sliced_decode (the "
                "KVCache does so when autograd records)"
            )

    def _check_same(self, fn: str, name: str, x: Tensor):
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
    def _check_finite(fn: str, *named):
        """``named``: ``(name, tensor, what)``; one reduction for all in the common case."""
        total = sum(x.sum() for _, x, _ in named if x.numel())
        if isinstance(total, Tensor) and not bool(torch.isfinite(total)):
            for name, x, what in named:
                if not bool(torch.isfinite(x).all()):
                    n_bad = int((~torch.isfinite(x)).sum())
                    raise ValueError(f"{fn}: {name}: expected finite {what}, found {n_bad} NaN/inf entries")

    def _check_keys(self, fn, zk, v, key_weights, zq=None, bump=False, bandwidth=None):
        """Every check of new keys (and the queries and bandwidth of a step) before the cache
        changes: returns ``(z (R, m), x (R, m, D), w (R, m) or None)`` and, with ``bump``, the
        bandwidths ``(R,)``."""
        if zq is not None:
            self._check_tensor(fn, "zq", zq, 3, "(B, H, m)")
        self._check_tensor(fn, "zk", zk, 3, "(B, H, m)")
        self._check_tensor(fn, "v", v, 4, "(B, H, m, D)")
        if v.shape[:3] != zk.shape:
            raise ValueError(f"{fn}: v: expected shape (B, H, m, D) = {tuple(zk.shape)} + (D,), got "
                             f"{tuple(v.shape)}")
        if v.dtype != zk.dtype or v.device != zk.device:
            raise TypeError(f"{fn}: zk and v must share one dtype and device, got {zk.dtype} on {zk.device} "
                            f"and {v.dtype} on {v.device}")
        if zq is not None and zq.shape != zk.shape:
            raise ValueError(f"{fn}: zq: expected the shape of zk {tuple(zk.shape)} (one query per new "
                             f"token), got {tuple(zq.shape)}")
        self._check_grad(fn, zq, zk, v, key_weights, bandwidth)
        self._check_same(fn, "zk", zk)
        if zq is not None:
            self._check_same(fn, "zq", zq)
        if self.D is not None and v.shape[3] != self.D:
            raise ValueError(f"{fn}: v: {v.shape[3]} features, the cache holds D = {self.D}")
        if v.shape[3] == 0 or zk.shape[0] == 0 or zk.shape[1] == 0:
            raise ValueError(f"{fn}: v: expected B, H, D >= 1, got {tuple(v.shape)}")
        if zq is not None and zk.shape[2] == 0:
            raise ValueError(f"{fn}: zk: expected at least one new token (m >= 1), got shape {tuple(zk.shape)}")
        named = [("zk", zk, "scores"), ("v", v, "values")]
        self._check_finite(fn, *([("zq", zq, "scores")] if zq is not None else []), *named)
        w = combine_key_weights(fn, None, key_weights, zk.shape, zk.dtype, zk.device)
        b = None
        if bump:  # a missing bandwidth is refused as in bump(), not read as eq. 3
            b = bandwidth_rows(fn, bandwidth, zk.shape[:2], zk.dtype, zk.device).reshape(-1)
        if self.B is None:
            self._init(zk, v)
        R, m = self.R, zk.shape[2]
        z = zk.reshape(R, m)
        x = v.reshape(R, m, self.D)
        w = None if w is None else w.reshape(R, m)
        return (z, x, w, b) if bump else (z, x, w)

    def _check_queries(self, fn, zq):
        self._check_tensor(fn, "zq", zq, 3, "(B, H, M)")
        self._check_grad(fn, zq)
        if self.length == 0:
            raise ValueError(f"{fn}: zq: a query before any key: the cache is empty (append keys first)")
        self._check_same(fn, "zq", zq)
        self._check_finite(fn, ("zq", zq, "scores"))
        return zq.reshape(self.R, zq.shape[2])

    def _bandwidth(self, fn, bandwidth) -> Tensor:
        return bandwidth_rows(fn, bandwidth, (self.B, self.H), self.dtype, self.device).reshape(self.R)

    # -- storage ----------------------------------------------------------------------------
    def _init(self, zk: Tensor, v: Tensor):
        self.B, self.H, self.D = zk.shape[0], zk.shape[1], v.shape[3]
        self.R = R = self.B * self.H
        self.dtype, self.device = zk.dtype, zk.device
        f64 = dict(dtype=torch.float64, device=self.device)
        # per row and run: the exponents [e_w, e_z, e_v] (a run without weight: [_NONE,
        # -_EMAX, -_EMAX]), [2^-e_z, c_z 2^-e_z, min z, max z, W', K'] and the totals of w'x,
        # w'z'x
        self.E = torch.tensor([_NONE, -_EMAX, -_EMAX], dtype=torch.int64, device=self.device) \
            .repeat(R, _MAX_RUNS, 1)
        self.F = torch.zeros(R, _MAX_RUNS, 6, **f64)
        self.Tv = torch.zeros(R, _MAX_RUNS, 2, self.D, **f64)
        self.cz = torch.zeros(R, **f64)
        self.cv = torch.zeros(R, self.D, **f64)
        self.has_ref = torch.zeros(R, dtype=torch.bool, device=self.device)
        self._all_ref = False
        self.z = self.w1 = self.wz = self.x = self.Ps = self.Pv = None
        # the block tables of w'x, w'z'x: in the dtype, or float64 once a float32 cache's key
        # weights span more than 2^RELU_SPAN_F32 (the light keys' products would underflow
        # float32, and they carry eq. 2's denominator where the heavy keys tie the query)
        self.pv_dtype = self.dtype
        self._wexp = None  # (smallest, largest) exponent of the positive weights so far
        # the tail: the newest keys, not yet in a run (raw scores, weights, values)
        self.tz = zk.new_empty(R, TAIL)
        self.tw = zk.new_empty(R, TAIL)
        self.tv = v.new_empty(R, TAIL, self.D)
        self._arange_s = torch.arange(BLOCK, device=self.device)
        self._rows = torch.arange(R, device=self.device).view(R, 1, 1)

    def _reserve(self, n: int, keep: int):
        """Capacity for ``n`` keys; the first ``keep`` positions (whole runs) are kept."""
        if n <= self.cap:
            return
        cap = max(BLOCK, -(-2 * n // BLOCK) * BLOCK)
        R, D, dt, dev = self.R, self.D, self.dtype, self.device
        f64 = dict(dtype=torch.float64, device=dev)
        new = {"z": torch.empty(R * cap, dtype=dt, device=dev), "w1": torch.empty(R * cap, **f64),
               "wz": torch.empty(R * cap, **f64), "x": torch.empty(R * cap, D, dtype=dt, device=dev),
               "Ps": torch.zeros(R * (cap // BLOCK), 2, **f64),
               "Pv": torch.zeros(R * (cap // BLOCK), 2, D, dtype=self.pv_dtype, device=dev)}
        for name, buf in new.items():
            k = R * (keep // BLOCK if name in ("Ps", "Pv") else keep)
            if k:
                buf[:k] = getattr(self, name)[:k]
            setattr(self, name, buf)
        self.cap = cap

    def _set_refs(self, z: Tensor, v: Tensor, w: Tensor | None):
        """The score and value of each row's first key of positive weight (once per row)."""
        if self._all_ref:
            return
        if w is None:
            need = ~self.has_ref
            first = torch.zeros(self.R, dtype=torch.int64, device=self.device)
        else:
            pos = w > 0
            need = ~self.has_ref & pos.any(1)
            first = pos.to(torch.int8).argmax(1)
        r = torch.nonzero(need).flatten()
        if r.numel():
            self.cz[r] = z[r, first[r]].double()
            self.cv[r] = v[r, first[r]].double()
            self.has_ref[r] = True
        self._all_ref = bool(self.has_ref.all())

    def _refresh(self):
        """Index bases of the current runs, for :meth:`_prefix` and :meth:`_window_pairs`."""
        nr = len(self.runs)
        ol = torch.tensor(self.runs, dtype=torch.int64, device=self.device).view(1, nr, 2)
        offs, lens = ol[..., :1], ol[..., 1:]
        self._base = offs * self.R + self._rows * lens  # (R, nr, 1): a run's first key, per row
        self._base_blk = (offs >> _LOG_BLOCK) * self.R + self._rows * (lens >> _LOG_BLOCK)
        self._big = lens >= BLOCK
        self._last = (lens - 1).unsqueeze(-1)

    # -- appending: the binary counter ---------------------------------------------------------
    def _append_rows(self, z: Tensor, v: Tensor, w: Tensor | None, sorts: dict | None = None):
        """``z (R, m)``, ``v (R, m, D)`` (raw values), ``w (R, m)`` or ``None`` (all 1).
        ``sorts``: on an empty cache, the causal forward's sorts of these keys
        (:func:`~opsplit.functional.sliced_causal.keep_sorts`): a run that is a left half of a
        level takes its order from there instead of sorting again."""
        if z.shape[1] == 0:
            return
        self._set_refs(z, v, w)
        self._note_weights(w)
        n, m = self.n, z.shape[1]
        n2 = n + m
        h = (n ^ n2).bit_length() - 1  # the highest bit in which n and n + m differ
        nkeep = sum(1 for _, L in self.runs if L > (1 << h))
        s = sum(L for _, L in self.runs[:nkeep])  # the runs of n above bit h stay
        if self._mark is not None:
            self._save(s, nkeep)
        R, D = self.R, self.D
        old = None
        if nkeep < len(self.runs):  # the old tail [s, n), copied before the buffers are rewritten
            a, b = R * s, R * n
            tail = self.runs[nkeep:]
            lens = torch.tensor([L for _, L in tail], device=self.device)
            views = [(R * (o - s), L) for o, L in tail]
            cat = lambda buf, *sh: torch.cat([buf[a + i: a + i + R * L].view(R, L, *sh) for i, L in views], 1)  # noqa: E731
            old = (cat(self.z), cat(self.w1), cat(self.x, D),
                   torch.repeat_interleave(self.E[:, nkeep: len(self.runs)], lens, dim=1))
            del b
        self._reserve(n2, s)
        self.runs = self.runs[:nkeep]
        # the new runs: the set bits of n + m at and below h, in decreasing size
        used, off = 0, s
        for k in range(h, -1, -1):
            if not (n2 >> k) & 1:
                continue
            L = 1 << k
            take = L - (n - s) if old is not None else L
            order = None
            if sorts is not None and n == 0 and L in sorts and off % (2 * L) == 0:
                M = sorts[L].shape[0] // self.R  # nodes of 2L positions per row; this run is node off / 2L
                order = sorts[L].view(self.R, M, L)[:, off // (2 * L)]
            self._build(off, L, z[:, used: used + take], v[:, used: used + take],
                        None if w is None else w[:, used: used + take], old, order)
            old = None
            used += take
            off += L
        self.n = n2
        self._refresh()

    def _note_weights(self, w: Tensor | None):
        """Track the span of the positive key weights of a float32 cache; beyond
        2^RELU_SPAN_F32 the block tables of the values move to float64 (at once, exactly)."""
        if w is None or self.pv_dtype == torch.float64:
            return
        pos = w > 0
        if not bool(pos.any()):
            return
        e = _exp(w)
        lo = int(torch.where(pos, e, _EMAX).amin())
        hi = int(torch.where(pos, e, -_EMAX).amax())
        if self._wexp is not None:
            lo, hi = min(lo, self._wexp[0]), max(hi, self._wexp[1])
        self._wexp = (lo, hi)
        if hi - lo > RELU_SPAN_F32:
            self.pv_dtype = torch.float64
            if self.Pv is not None:
                self.Pv = self.Pv.double()

    def _build(self, off: int, L: int, z: Tensor, v: Tensor, w: Tensor | None, old, order: Tensor | None = None):
        """The next run, at positions ``[off, off + L)``, from new keys ``(z, v, w)`` (raw) and
        ``old = (z, w', x, E)`` keys of old runs (in their runs' units) or ``None``;
        ``order``: the keys' sort (``(R, L)``, from the forward), used when it sorts the
        scores as they are (a power of two per row may have tied distinct scores: then sorted
        again)."""
        R, D, dt = self.R, self.D, self.dtype
        idx = len(self.runs)
        w64 = torch.ones_like(z, dtype=torch.float64) if w is None else w.double()
        pos = w64 > 0
        # exponents of the new keys: weights, shifted scores, and the values with c_v (so that
        # v 2^-e_v and c_v 2^-e_v are exact and x is rounded once, as the forward kernels shift)
        if w is None:  # max |v| per row without a copy of |v|
            vmax = torch.maximum(v.amax((1, 2)), v.amin((1, 2)).neg())
        else:
            vmax = torch.where(pos, v.abs().amax(2), 0).amax(1)
        wmax = w64.amax(1)
        e_new = torch.stack([torch.where(wmax > 0, _exp(wmax), _NONE),
                             _exp(torch.where(pos, (z.double() - self.cz.unsqueeze(1)).abs(), 0.0).amax(1)),
                             _exp(torch.maximum(vmax.double(), self.cv.abs().amax(1))) + 1], 1)
        if w is not None:
            e_new[:, 1:] = torch.where((wmax > 0).unsqueeze(1), e_new[:, 1:], -_EMAX)
        if old is not None:
            oz, ow1, ox, oE = old
            oE = torch.where((ow1 > 0).unsqueeze(-1), oE, oE.new_tensor([_NONE, -_EMAX, -_EMAX]))
            E = torch.maximum(e_new, oE.amax(1))
        else:
            E = e_new
        ew, ez, ev = E[:, 0:1], E[:, 1:2], E[:, 2:3]
        sv = _p2(-ev).to(dt).unsqueeze(-1)
        a = R * off
        w1 = w64 * torch.where(ew > _NONE, _p2(-ew), 0.0)
        if old is None:
            # new keys only: sorted first, then gathered straight into the run's buffer and
            # shifted and scaled there (the operations of v 2^-e_v - c_v 2^-e_v, in place)
            if L > 1:
                zo = None if order is None else z.gather(1, order)
                if zo is not None and bool((zo[:, 1:] >= zo[:, :-1]).all()):
                    z = zo
                else:
                    z, order = torch.sort(z, dim=1, stable=True)
                w1 = w1.gather(1, order)
                pos = pos.gather(1, order)
                src = (order + self._rows.view(R, 1) * L).reshape(-1)
                torch.index_select(v.reshape(R * L, D), 0, src, out=self.x[a: a + R * L])
            else:
                self.x[a: a + R * L] = v.reshape(R * L, D)
            x = self.x[a: a + R * L].view(R, L, D)
            x.mul_(sv)
            x.sub_(self.cv.to(dt).unsqueeze(1) * sv)
            if w is not None:
                x.masked_fill_(~pos.unsqueeze(-1), 0)
        else:
            x = v * sv - self.cv.to(dt).unsqueeze(1) * sv
            if w is not None:
                x = torch.where(pos.unsqueeze(-1), x, 0)
            w1 = torch.cat([ow1 * _p2((oE[..., 0] - ew).clamp_max(0)), w1], 1)
            xo = ox * _p2((oE[..., 2] - ev).clamp_max(0)).to(dt).unsqueeze(-1)
            z, x = torch.cat([oz, z], 1), torch.cat([xo, x], 1)
            z, order = torch.sort(z, dim=1, stable=True)
            w1 = w1.gather(1, order)
            x = x.reshape(R * L, D).index_select(0, (order + self._rows.view(R, 1) * L).reshape(-1)).view(R, L, D)
            self.x[a: a + R * L] = x.reshape(-1, D)
        # the run's tables are shifted by the score of its heaviest key (_scale.heaviest): every
        # table term's rounding is then a multiple of the run's share of the denominator, also
        # where a heavy key ties the query (issue 42); e_z brings the shifted scores to [1/2, 1)
        cr = z.gather(1, heaviest(w1)).double()  # (R, 1)
        zr = z.double() - cr
        ez = torch.where(ew > _NONE, _exp(torch.where(w1 > 0, zr.abs(), 0.0).amax(1, keepdim=True)), -_EMAX)
        E = E.clone()
        E[:, 1:2] = ez
        fz = _p2(-torch.where(ew > _NONE, ez, 0))  # a run without weight: 1 (its sums are 0)
        wz = torch.where(w1 > 0, w1 * (zr * fz), 0.0)
        self.z[a: a + R * L] = z.reshape(-1)
        self.w1[a: a + R * L] = w1.reshape(-1)
        self.wz[a: a + R * L] = wz.reshape(-1)
        # prefix tables every BLOCK keys (exclusive, at each block's start) and the totals
        if L >= BLOCK:
            nb = L >> _LOG_BLOCK
            Wb = torch.stack([w1.view(R * nb, BLOCK), wz.view(R * nb, BLOCK)], 1)  # (R nb, 2, S)
            pdt = self.Pv.dtype
            vb = torch.bmm(Wb.to(pdt), x.view(R * nb, BLOCK, D).to(pdt)).view(R, nb, 2, D).double()
            cs, cvs = torch.cumsum(Wb.sum(-1).view(R, nb, 2), 1), torch.cumsum(vb, 1)
            b0 = R * (off >> _LOG_BLOCK)
            Ps = self.Ps[b0: b0 + R * nb].view(R, nb, 2)
            Pv = self.Pv[b0: b0 + R * nb].view(R, nb, 2, D)
            Ps[:, 0] = 0
            Pv[:, 0] = 0
            if nb > 1:
                Ps[:, 1:] = cs[:, :-1]
                Pv[:, 1:] = cvs[:, :-1]
            tot, totv = cs[:, -1], cvs[:, -1]
        else:
            W2 = torch.stack([w1, wz], 1)  # (R, 2, L)
            tot, totv = W2.sum(-1), W2 @ x.double()
        self.E[:, idx] = E
        self.F[:, idx] = torch.cat([fz, cr * fz, z[:, :1].double(), z[:, -1:].double(), tot], 1)
        self.Tv[:, idx] = totv
        self.runs.append((off, L))

    # -- queries over the runs ------------------------------------------------------------------
    def _ranks(self, probes: list[tuple[Tensor, str]]) -> Tensor:
        """``(R, n_runs, K)`` counts of the keys ``<`` (``"left"``) or ``<=`` (``"right"``) the
        probes in every run: ``probes`` lists ``(values (R, M), side)``, their columns follow
        each other in ``K``.  One binary search per run and probe."""
        R = self.R
        probes = [(p.contiguous(), side) for p, side in probes]
        out = []
        for o, L in self.runs:
            zr = self.z[R * o: R * (o + L)].view(R, L)
            parts = [torch.searchsorted(zr, p, side=side) for p, side in probes]
            out.append(parts[0] if len(parts) == 1 else torch.cat(parts, 1))
        return torch.stack(out, 1)

    def _prefix(self, p: Tensor):
        """The prefix sums of the first ``p`` keys of every run, ``p (R, n_runs, K)``: scalars
        ``(R, n_runs, K, 2)`` (of :math:`w', w'z'`) and vectors ``(R, n_runs, K, 2, D)`` (of
        :math:`w'x, w'z'x`), float64, in each run's units: a block table plus the keys of the
        block before the ``p``-th."""
        blk = (p - 1).clamp_min_(0) >> _LOG_BLOCK
        use = self._big & (p > 0)
        bidx = torch.where(use, self._base_blk + blk, 0)
        ps = torch.where(use.unsqueeze(-1), self.Ps[bidx], 0.0)
        pv = torch.where(use.view(*use.shape, 1, 1), self.Pv[bidx].double(), 0.0)
        j = torch.where(self._big, blk << _LOG_BLOCK, 0).unsqueeze(-1) + self._arange_s  # (R, nr, K, S)
        flat = self._base.unsqueeze(-1) + torch.minimum(j, self._last)
        W2 = torch.where((j < p.unsqueeze(-1)).unsqueeze(-2), torch.stack([self.w1[flat], self.wz[flat]], -2), 0.0)
        return ps + W2.sum(-1), pv + W2 @ self.x[flat].double()

    def _scaled_queries(self, q64: Tensor) -> Tensor:
        """``(q - c_z) 2^-e_z`` per run: ``(R, n_runs, M)`` float64."""
        F = self.F[:, :len(self.runs)]
        return q64.unsqueeze(1) * F[..., 0:1] - F[..., 1:2]

    def _runs_relu(self, q: Tensor) -> dict:
        """The eq. 2/3 moments of queries ``q (R, M)`` over every run (module docstring)."""
        nr = len(self.runs)
        ps, pv = self._prefix(self._ranks([(q, "left")]))  # ranks (R, nr, M)
        Q = self._scaled_queries(q.double())
        F = self.F[:, :nr, None]  # (R, nr, 1, 6)
        Wl, Kl = ps[..., 0], ps[..., 1]
        return {"N": Q.unsqueeze(-1) * pv[..., 0, :] - pv[..., 1, :], "Rm": Q * Wl - Kl,
                "den": Q * (2 * Wl - F[..., 4]) - (2 * Kl - F[..., 5]),
                "W": F[..., 4], "S": self.Tv[:, :nr, None, 0], "E": self.E[:, :nr, None]}

    def _runs_bump(self, q: Tensor, b: Tensor) -> dict:
        """The eq. 7 moments of queries ``q (R, M)`` with bandwidths ``b (R,)`` over every run."""
        R, nr, M = self.R, len(self.runs), q.shape[1]
        q64, b64 = q.double(), b.double().unsqueeze(1)
        r = self._ranks([((q64 - b64).to(self.dtype), "right"), (q, "left"), (q, "right"),
                         ((q64 + b64).to(self.dtype), "left")])
        r0, rlt, rle, r2 = r.split(M, -1)
        r0 = torch.minimum(r0, rlt)
        r2 = torch.maximum(r2, rle)
        if self._well_conditioned(q64, b64):
            ps, pv = self._prefix(torch.cat([r0, rle, r2], -1))
            (s0, s1, s2), (v0, v1, v2) = ps.split(M, 2), pv.split(M, 2)
            Q = self._scaled_queries(q64)
            beta = b64.view(R, 1, 1) * self.F[:, :nr, 0:1]  # b 2^-e_z
            lo, hi = beta - Q, beta + Q
            # beta sum_window w' hat x = (beta - Q)(A1 - A0) + (B1 - B0) + (beta + Q)(A2 - A1) - (B2 - B1)
            d1, d2 = v1 - v0, v2 - v1
            Mv = lo.unsqueeze(-1) * d1[..., 0, :] + d1[..., 1, :] + hi.unsqueeze(-1) * d2[..., 0, :] - d2[..., 1, :]
            e1, e2 = s1 - s0, s2 - s1
            Ms = lo * e1[..., 0] + e1[..., 1] + hi * e2[..., 0] - e2[..., 1]
            Mv, Ms = Mv / beta.unsqueeze(-1), Ms / beta
        else:
            Mv, Ms = self._window_pairs(q64, b64, r0, r2)
        return {"M": Mv, "mass": Ms, "W": self.F[:, :nr, None, 4], "E": self.E[:, :nr, None]}

    def _well_conditioned(self, q64: Tensor, b64: Tensor) -> bool:
        """Whether every run's spread of scores (with the queries) over the bandwidth is at most
        ``KAPPA_FAST`` of the dtype, and ``b`` at least 8 ulps of the largest score (else the
        window differences of the tables cancel: :mod:`~opsplit.functional._windows`)."""
        F = self.F[:, :len(self.runs)]
        hi = torch.maximum(F[..., 3], q64.amax(1, keepdim=True))
        lo = torch.minimum(F[..., 2], q64.amin(1, keepdim=True))
        big = torch.maximum(hi.abs(), lo.abs())
        ok = ((hi - lo) <= KAPPA_FAST[self.dtype] * b64) & (b64 >= big * (8 * torch.finfo(self.dtype).eps))
        return bool(ok.all())

    def _window_pairs(self, q64: Tensor, b64: Tensor, r0: Tensor, r2: Tensor):
        """Eq. 7's window sums pair by pair: for every (row, run, query), the keys of ranks
        ``[r0, r2)`` (those with ``q - b < z < q + b``), the hat kernel in float64 from the
        scores themselves.  Returns ``(R, n_runs, M, D)`` and ``(R, n_runs, M)`` in each run's
        units (as the table path)."""
        R, D, nr, M = self.R, self.D, len(self.runs), q64.shape[1]
        dev = self.device
        cnt = (r2 - r0).reshape(-1)
        F_ = cnt.numel()
        fq = torch.repeat_interleave(torch.arange(F_, device=dev), cnt)
        first = torch.cumsum(cnt, 0) - cnt
        k = torch.arange(fq.numel(), device=dev) - first[fq]
        flat = self._base.expand(R, nr, M).reshape(-1)[fq] + r0.reshape(-1)[fq] + k
        rq = torch.div(fq, nr * M, rounding_mode="floor")  # row of each pair
        hat = torch.relu(1 - (q64.reshape(-1)[rq * M + fq % M] - self.z[flat].double()).abs() / b64.view(-1)[rq])
        w1 = self.w1[flat] * hat
        Mv = torch.zeros(F_, D, dtype=torch.float64, device=dev).index_add_(
            0, fq, w1.unsqueeze(-1) * self.x[flat].double())
        Ms = torch.zeros(F_, dtype=torch.float64, device=dev).index_add_(0, fq, w1)
        return Mv.view(R, nr, M, D), Ms.view(R, nr, M)

    # -- the new keys among themselves -------------------------------------------------------------
    def _chunk(self, q: Tensor, z: Tensor, v: Tensor, w: Tensor, b: Tensor | None, causal: bool = True):
        """Moments of the queries ``q (R, M)`` over the keys ``(z, v, w)`` ``(R, m)`` of the
        tail and the new tokens (query ``i`` sees keys ``j <= i + m - M``, or all if not
        ``causal``), by dense sums in float64, as one part.  Float32 inputs are summed as they
        are (products of three float32 numbers and their sums lie far inside float64's
        range: exponents 0); float64 inputs in the part's own units, the weights per query."""
        R, D = self.R, self.D
        M, m = q.shape[1], z.shape[1]
        scaled = self.dtype != torch.float32
        w64 = w.double()
        pos = w64 > 0
        dz = torch.where(pos, z.double() - self.cz.unsqueeze(1), 0.0)
        dv = torch.where(pos.unsqueeze(-1), v.double() - self.cv.unsqueeze(1), 0.0)
        Qs = q.double() - self.cz.unsqueeze(1)
        if scaled:
            ez, ev = _exp(dz.abs().amax(1)), _exp(dv.abs().amax((1, 2)))
            fz = _p2(-ez).unsqueeze(1)
            dz, Qs, dv = dz * fz, Qs * fz, dv * _p2(-ev).view(R, 1, 1)
        step = max(1, _CHUNK_ELEMS // max(1, m * D))
        out = []
        for i0 in range(0, M, step):
            i1 = min(M, i0 + step)
            Wq = w64.unsqueeze(1).expand(R, i1 - i0, m)
            if causal:
                Wq = torch.where(torch.ones(i1 - i0, m, dtype=torch.bool, device=self.device).tril_(m - M + i0),
                                 Wq, 0.0)
            if scaled:
                wmax = Wq.amax(-1)
                ew = torch.where(wmax > 0, _exp(wmax), _NONE)
                Wq = Wq * torch.where(wmax > 0, _p2(-ew), 0.0).unsqueeze(-1)
            if b is None:
                # q - z of the scores as given (rounded once; (q - c) - (z - c) would add the
                # rounding of both shifts, far above |q - z| where a heavy key nearly ties q)
                d = q[:, i0:i1].double().unsqueeze(-1) - z.double().unsqueeze(1)
                if scaled:
                    d = d * fz.unsqueeze(1)
                K = Wq * torch.relu(d)
                sc = torch.stack([K.sum(-1), (Wq * d.abs()).sum(-1), Wq.sum(-1)], -1)  # R, den, W
                vec = torch.stack([K, Wq], -2) @ dv.unsqueeze(1)  # (R, k, 2, D): N, S
            else:
                hat = torch.relu(1 - (q[:, i0:i1].double().unsqueeze(-1) - z.double().unsqueeze(1)).abs()
                                 / b.double().view(R, 1, 1))
                K = Wq * hat
                sc = torch.stack([K.sum(-1), Wq.sum(-1)], -1)  # mass, W
                vec = K @ dv  # M
            E = torch.stack([ew, torch.where(ew > _NONE, ez.view(R, 1), -_EMAX),
                             torch.where(ew > _NONE, ev.view(R, 1), -_EMAX)], -1) if scaled else None
            out.append((sc, vec, E))
        sc, vec = torch.cat([o[0] for o in out], 1).unsqueeze(1), torch.cat([o[1] for o in out], 1).unsqueeze(1)
        E = torch.cat([o[2] for o in out], 1).unsqueeze(1) if scaled else \
            torch.zeros(R, 1, 1, 3, dtype=torch.int64, device=self.device)
        if b is None:
            return {"Rm": sc[..., 0], "den": sc[..., 1], "W": sc[..., 2], "N": vec[..., 0, :], "S": vec[..., 1, :],
                    "E": E}
        return {"mass": sc[..., 0], "W": sc[..., 1], "M": vec, "E": E}

    # -- combining the parts ---------------------------------------------------------------------------
    @staticmethod
    def _cat(parts: list, key: str, M: int) -> Tensor:
        if len(parts) == 1:
            return parts[0][key]
        xs = []
        for p in parts:
            t = p[key]
            xs.append(t.expand(t.shape[0], t.shape[1], M, *t.shape[3:]))
        return torch.cat(xs, 1)

    def _factors(self, parts: list, M: int):
        """Per part and query the factors ``2^(e - E)`` ``(R, P, 1|M, 3)`` of the weights,
        scores and values, ``E`` the largest exponent over the parts (those without weight
        carry the smallest), and ``2^E`` of the values ``(R, 1|M, 1)``."""
        E = self._cat(parts, "E", M)
        Emax = E.amax(1, keepdim=True)
        return _p2(E - Emax), _p2(Emax[:, 0, :, 2:3])

    def _combine_relu(self, parts: list, centered: bool) -> Tensor:
        M = parts[0]["den"].shape[2]
        f, scale = self._factors(parts, M)
        fw, fz, fv = f[..., 0], f[..., 1], f[..., 2]
        gR = fw * fz
        N = (self._cat(parts, "N", M) * (gR * fv).unsqueeze(-1)).sum(1)  # (R, M, D)
        Rm = (self._cat(parts, "Rm", M) * gR).sum(1)
        den = (self._cat(parts, "den", M) * gR).sum(1)
        ok = den > 0
        inv = torch.where(ok, 1.0 / torch.where(ok, den, 1.0), 0.0).unsqueeze(-1)
        if centered:
            W = (self._cat(parts, "W", M) * fw).sum(1)
            Sv = (self._cat(parts, "S", M) * (fw * fv).unsqueeze(-1)).sum(1)
            mean = Sv / torch.where(W > 0, W, 1.0).unsqueeze(-1)
            return (N - Rm.unsqueeze(-1) * mean) * (inv * scale)
        return N * (inv * scale) + (Rm.unsqueeze(-1) * inv) * self.cv.unsqueeze(1)

    def _combine_bump(self, parts: list) -> Tensor:
        M = parts[0]["mass"].shape[2]
        f, scale = self._factors(parts, M)
        fw, fv = f[..., 0], f[..., 2]
        Mv = (self._cat(parts, "M", M) * (fw * fv).unsqueeze(-1)).sum(1)
        mass = (self._cat(parts, "mass", M) * fw).sum(1)
        W = (self._cat(parts, "W", M) * fw).sum(1)
        ok = W > 0
        inv = torch.where(ok, 1.0 / torch.where(ok, W, 1.0), 0.0).unsqueeze(-1)
        return Mv * (inv * scale) + (mass.unsqueeze(-1) * inv) * self.cv.unsqueeze(1)

    def _out(self, o: Tensor, shape) -> Tensor:
        return o.to(self.dtype).view(*shape, self.D)

    # -- a decode step -------------------------------------------------------------------------------
    def _parts(self, q: Tensor, new, *, centered: bool = True, b: Tensor | None = None) -> list:
        """The moments of queries ``q (R, M)`` over the runs and, by direct sums, over the tail
        and the ``new = (z, v, w)`` keys (or ``None``), which the queries see causally
        (bottom-right aligned)."""
        parts = []
        if self.n:
            parts.append(self._runs_relu(q) if b is None else self._runs_bump(q, b))
        t = self.nt
        if new is not None or t:
            z, v, w = self.tz[:, :t], self.tv[:, :t], self.tw[:, :t]
            if new is not None:
                nz, nv, nw = new
                z, v = torch.cat([z, nz], 1), torch.cat([v, nv], 1)
                w = torch.cat([w, torch.ones_like(nz) if nw is None else nw], 1)
            parts.append(self._chunk(q, z, v, w, b, causal=new is not None))
        return parts

    def _add(self, z: Tensor, v: Tensor, w: Tensor | None):
        """New keys into the tail, or, when it overflows, the tail and them into the runs."""
        self._set_refs(z, v, w)
        t, m = self.nt, z.shape[1]
        if m == 0:
            return
        mk = self._mark
        if mk is not None:
            mk["keys"].append((z, v, w))
            if mk["tail"] is None and t + m > TAIL and mk["nt"]:  # the marked tail is flushed: saved once
                nt0 = mk["nt"]
                mk["tail"] = (self.tz[:, :nt0].clone(), self.tw[:, :nt0].clone(), self.tv[:, :nt0].clone())
        if t + m <= TAIL:
            self.tz[:, t: t + m] = z
            self.tv[:, t: t + m] = v
            self.tw[:, t: t + m] = 1 if w is None else w
            self.nt = t + m
            return
        if t:
            z = torch.cat([self.tz[:, :t], z], 1)
            v = torch.cat([self.tv[:, :t], v], 1)
            w = torch.cat([self.tw[:, :t], torch.ones_like(z[:, t:]) if w is None else w], 1)
            self.nt = 0
        self._append_rows(z, v, w)

    def _step(self, fn, zq, zk, v, key_weights, *, centered=True, bump=False, bandwidth=None):
        if bump:
            z, x, w, b = self._check_keys(fn, zk, v, key_weights, zq=zq, bump=True, bandwidth=bandwidth)
        else:
            z, x, w = self._check_keys(fn, zk, v, key_weights, zq=zq)
            b = None
        shape = zq.shape
        if self.length == 0:  # the prefill: the causal forward kernel, then the runs from its sorts
            kw = None if w is None else w.view(shape)
            with keep_sorts() as sorts:
                if b is None:
                    out = causal_sliced_relu_attention(zq, zk, v, centered=centered, key_weights=kw)
                else:
                    out = causal_sliced_relu_bump_attention(zq, zk, v, b.view(shape[:2]), key_weights=kw)
            self._append_rows(z, x, w, None if "unusable" in sorts else sorts)
            return out
        q = zq.reshape(self.R, shape[2])
        self._set_refs(z, x, w)
        parts = self._parts(q, (z, x, w), b=b)
        o = self._combine_relu(parts, centered) if b is None else self._combine_bump(parts)
        self._add(z, x, w)
        return self._out(o, shape)
