r"""The key/value cache of causal attention terms: generation one token at a time.

A causal attention term evaluated at the new tokens :math:`x_{n+1}, \dots, x_{n+m}` of a
sequence needs the keys and values of *every* earlier token at the same time step
:math:`t^k` (the same layer), and nothing else of them: causality makes the state of the
earlier tokens at every time independent of the new ones.  So a decoder that appends
tokens re-uses, at each step :math:`t^k` of the scheme, what the attention term computed
there for the earlier tokens.

:class:`KVCache` holds those tensors, one entry per (attention operator, step start time
:math:`t^k`).  It travels with a call like the masks do — as a call-time input of the grid
(:class:`~opsplit.operators.context.ContextGrid`, under the name the operator was told at
construction, ``cache="kv_cache"``) — so the propagator, the scheme and the solvers stay
unaware of it: an attention operator that finds a cache in its context reads the entry of
its own step, appends the new tokens' keys and values, and attends over the whole prefix.
A substep solver with several stages (Heun, RK4) evaluates an attention term more than once
per step, and a stage may fall on the start time of the next step (Heun's second stage at
:math:`t^k + \Delta t = t^{k+1}`): the :math:`j`-th evaluation of an operator at time
:math:`t` within one call is entry :math:`(\text{operator}, t, j)`.  Every call of a decoder
runs the same substeps in the same order, so the :math:`j`-th evaluation of every call is the
same stage, and its keys continue the keys of that stage (causality: the earlier tokens'
states at every stage do not depend on the new tokens).  A call that evaluates an operator a
different number of times than the calls before (an adaptive solver) leaves entries of
different lengths, and the next call is refused (:meth:`KVCache.begin`).

**Rolling back** (speculative decoding, :mod:`opsplit.models.speculative`): :meth:`mark`
remembers the cache as it is, :meth:`rollback` keeps the first ``n`` tokens after any number
of calls since the mark, exactly as if the calls had appended only those tokens (tensor
entries: a shorter length; sorted runs: an undo log of what the appends overwrote, then the
kept keys appended again, :meth:`SlicedDecodeCache.rollback
<opsplit.functional.sliced_runs.SlicedDecodeCache.rollback>`), and may turn kept tokens into
padding (the rejected draft tokens of a batch row that accepted fewer than another).

The cache costs :math:`O(n)` memory per layer and head (the keys and values of the
:math:`n` tokens so far) and makes one decode step of softmax attention :math:`O(n\,d)`
per head instead of recomputing the whole prefix (:math:`O(n^2 d)` for attention plus
:math:`O(n)` feed-forward evaluations per layer); appending is amortised :math:`O(1)` per
token under ``torch.no_grad()`` (buffers of geometric capacity).

**Sorted runs of causal sliced attention.**  Under ``torch.no_grad()`` a causal sliced
attention term keeps, instead of its scores and values, an object of its own (a
:class:`~opsplit.functional.sliced_runs.SlicedDecodeCache`: the keys as sorted runs with
prefix tables, :math:`O(D \log^2 n)` per decode step) through :meth:`KVCache.state`, with
the same once-per-call rule; :meth:`length`, :meth:`past` and :meth:`select` cover it.

**Bound of the cached keys.**  The overflow guard of softmax attention
(:mod:`opsplit.operators._sdpa`) needs :math:`\max|k|` over every key a query reads.  An
operator that passes ``key_max`` (the max-abs of its new keys) to :meth:`KVCache.update`
gets that maximum over the whole prefix back from :meth:`KVCache.key_max` without a pass
over the cache: the entry keeps it as tokens are appended (computed once from the cached
keys the first time it is asked for; dropped when an append does not give it, and by
:meth:`KVCache.select`).  A maximum is exact, so the bound is the one a full reduction gives.
"""

from __future__ import annotations

import weakref

import torch
from torch import Tensor

from .._checks import check_select_index

__all__ = ["KVCache"]


def _max(a: float | None, b: float) -> float:
    """``max(a, b)`` propagating NaN as ``torch.amax`` does (``a = None``: no cached keys)."""
    if a is None:
        return b
    return a if a != a or a >= b else b


class KVCache:
    """Per-(operator, step) tensors of the tokens already processed.

    An entry is a tuple of tensors whose token dimension is ``dim`` (``2`` for the
    head-major ``(B, H, N, d)`` keys and values of the softmax operators and the
    ``(B, H, N)`` scores of the sliced ones).  ``length`` is the number of cached tokens
    (the same for every entry once a call has finished); a model with no attention term
    caches nothing, and its ``length`` is the number of tokens announced by
    :meth:`begin`.

    **Storage.**  Under ``torch.no_grad()`` (generation) an entry lives in buffers of
    geometric capacity and an append writes the new tokens in place: amortised :math:`O(1)`
    work per new token, and the attention term reads a view of the first ``length``
    tokens.  When autograd records (the new tensors require grad), an append is a
    ``torch.cat`` (:math:`O(n)` copy), so that gradients flow into every cached token.
    """

    def __init__(self, *, sorted_runs: bool = True):
        if not isinstance(sorted_runs, bool):
            raise TypeError(f"KVCache: sorted_runs: expected a bool, got {type(sorted_runs).__name__}")
        #: whether causal sliced attention may keep sorted runs (:meth:`state`); ``False``: it
        #: caches its scores and values and sums over them (O(n D) per step), as under autograd
        self.sorted_runs = sorted_runs
        self._entries: dict = {}  # key -> [op, t, buffers, dim, length, max |tensors[0]| or None]
        self._states: dict = {}  # key -> [op, t, object with .length and .select(index)]
        self._touched: dict = {}  # (id(op), t) -> evaluations in this call
        self._fed = 0  # tokens announced by begin()
        self._use = None  # (weakref to the model, batch size, N_t, dtype, device, solve) of the calls so far
        self._mark = None  # (length, {entry key: (length, key max)}, state keys) of mark()

    def check_use(self, model, batch_size: int, n_steps: int, dtype, device, *, solve: str | None = None) -> None:
        """Validate a call of ``model`` that reads and extends the cache, before any compute:
        a cache holds the tokens of one batch of ``batch_size`` sequences of one model, solved
        with one :math:`N_t` (``n_steps``: its entries belong to those step times) and one
        substep solver and scheme (``solve``: their names, ``None`` for the model's own) in one
        dtype and device.  The first call records them; a later call that differs is refused
        with a ``ValueError`` naming the argument (``cache``, ``input_ids``, ``n_steps``,
        ``solver``).  :meth:`select` changes the batch size it expects."""
        for name, n in (("batch_size", batch_size), ("n_steps", n_steps)):
            if isinstance(n, bool) or not isinstance(n, int):
                raise TypeError(f"KVCache.check_use: {name}: expected an int >= 1, got {n!r}")
            if n < 1:
                raise ValueError(f"KVCache.check_use: {name}: expected an int >= 1, got {n}")
        if solve is not None and not isinstance(solve, str):
            raise TypeError(f"KVCache.check_use: solve: expected a str or None, got {type(solve).__name__}")
        use = self._use
        if use is None or (not self._entries and not self._states and self._fed == 0):
            self._use = (weakref.ref(model), batch_size, n_steps, dtype, device, solve)
            return
        ref, b, n, dt, dev, sv = use
        if ref() is not model:
            raise ValueError(f"cache: this KVCache holds the keys and values of another model; a cache serves one "
                             f"model ({type(model).__name__}): use a new KVCache")
        if batch_size != b:
            raise ValueError(f"input_ids: a batch of {batch_size} sequences, but the cache holds {b} (a KVCache "
                             "continues the sequences it was filled with: use a new KVCache, or KVCache.select)")
        if n_steps != n:
            raise ValueError(f"n_steps: the cache was filled solving with N_t = {n} steps, this call solves with "
                             f"N_t = {n_steps} (its keys and values belong to the other steps' times): use a new "
                             "KVCache")
        if solve != sv:
            raise ValueError(f"solver: the cache was filled solving with {sv or 'the model' + chr(39) + 's own solver and scheme'}, "
                             f"this call solves with {solve or 'the model' + chr(39) + 's own solver and scheme'} (its keys and "
                             "values belong to the other solve's stages): use a new KVCache")
        if (dtype, device) != (dt, dev):
            raise ValueError(f"cache: it holds {dt} keys and values on {dev}, the model now computes in {dtype} on "
                             f"{device}: use a new KVCache")

    @property
    def model(self):
        """The model whose calls filled the cache (``None`` before the first call)."""
        return None if self._use is None else self._use[0]()

    def __len__(self) -> int:
        return self.length

    @property
    def length(self) -> int:
        """The number of tokens in the cache (0 when empty)."""
        for e in self._entries.values():
            return e[4]
        for e in self._states.values():
            return e[2].length
        return self._fed

    def begin(self, n_tokens: int = 0) -> None:
        """Start a call that runs ``n_tokens`` new tokens: every (operator, step) may append
        once until the next ``begin``."""
        if isinstance(n_tokens, bool) or not isinstance(n_tokens, int):
            raise TypeError(f"KVCache.begin: n_tokens: expected an int >= 0 (the tokens of the call), got {n_tokens!r}")
        if n_tokens < 0:
            raise ValueError(f"KVCache.begin: n_tokens: expected an int >= 0 (the tokens of the call), got {n_tokens}")
        lengths = {e[4] for e in self._entries.values()} | {e[2].length for e in self._states.values()}
        if len(lengths) > 1:  # a call failed after some terms had appended its tokens (O(entries) per call)
            raise ValueError(f"cache: its entries hold {sorted(lengths)} tokens: an earlier call failed after some "
                             "attention terms had appended its tokens and others had not, or evaluated a term more "
                             "or fewer times than the calls before (a solver whose stages vary: an adaptive one); "
                             "the cache cannot continue those sequences (use a new KVCache)")
        self._touched = {}
        self._fed += n_tokens

    @staticmethod
    def _base(op, t) -> tuple:
        if isinstance(t, bool) or not isinstance(t, (int, float, Tensor)) or isinstance(t, Tensor) and t.numel() != 1:
            raise TypeError(f"KVCache: t: expected a number (the step's start time), got {type(t).__name__}")
        return id(op), float(t)

    def _key(self, op, t, last: bool = False) -> tuple:
        """The entry of the next evaluation of ``op`` at ``t`` in this call (``last``: of the
        latest one)."""
        base = self._base(op, t)
        j = self._touched.get(base, 0)
        return (*base, max(0, j - 1) if last else j)

    def past(self, op, t) -> int:
        """The number of tokens cached for the next evaluation of ``op`` at step ``t`` in this
        call (0 when none; module docstring: the stages of a solver)."""
        key = self._key(op, t)
        e = self._entries.get(key)
        if e is None:
            st = self._states.get(key)
            return 0 if st is None else st[2].length
        return e[4]

    def has_state(self, op, t) -> bool:
        """Whether the next evaluation of ``op`` at step ``t`` keeps an object of its own
        (:meth:`state`)."""
        return self._key(op, t) in self._states

    def _touch(self, op, t) -> tuple:
        key = self._key(op, t)
        self._touched[key[:2]] = key[2] + 1
        return key

    def state(self, op, t, make):
        """The object ``op`` keeps at step ``t`` instead of tensors (made by ``make()`` the
        first time; it has ``length`` and ``select(index)``), for an append in this call (once
        per call, as :meth:`update`)."""
        if not callable(make):
            raise TypeError(f"KVCache.state: make: expected a callable that makes the state, got {type(make).__name__}")
        key = self._touch(op, t)
        if key in self._entries:
            raise RuntimeError(f"KVCache: {type(op).__name__} at t = {float(t):g} cached tensors already "
                               "(made under autograd); it cannot switch to its own state")
        st = self._states.get(key)
        if st is None:
            st = self._states[key] = [op, float(t), make()]
        return st[2]

    def entries(self) -> list:
        """``(operator, t, tensors, dim)`` of every tensor entry (``tensors``: the cached
        tokens; the objects kept through :meth:`state` are not listed)."""
        return [(op, t, tuple(b.narrow(dim, 0, n) for b in bufs), dim) for op, t, bufs, dim, n, _ in self._entries.values()]

    def states(self) -> list:
        """``(operator, t, state)`` of every object kept through :meth:`state` (the sorted runs
        of causal sliced attention; tensor entries: :meth:`entries`)."""
        return [(op, t, st) for op, t, st in self._states.values()]

    def nbytes(self) -> int:
        """Bytes held for the cached tokens: the used part of every tensor entry (not the
        geometric capacity) and every kept object's ``nbytes()``."""
        n = sum(x.element_size() * x.numel() for _, _, xs, _ in self.entries() for x in xs)
        for _, _, st in self.states():
            fn = getattr(st, "nbytes", None)
            if fn is None:
                raise TypeError(f"KVCache.nbytes: the state {type(st).__name__} does not report its bytes "
                                "(it has no nbytes())")
            n += int(fn())
        return n

    def update(self, op, t, *tensors: Tensor, dim: int = 2, key_max: float | None = None) -> tuple[Tensor, ...]:
        """Append the new tokens' ``tensors`` for ``op`` at step ``t`` and return the whole
        prefix (cached, then new) of each.  ``key_max``: :math:`\\max|\\cdot|` of the new
        ``tensors[0]`` (the keys), kept for :meth:`key_max` (module docstring)."""
        if not tensors or not all(isinstance(x, Tensor) for x in tensors):
            raise TypeError("KVCache.update: tensors: expected one or more torch.Tensors, got "
                            f"{[type(x).__name__ for x in tensors]}")
        if isinstance(dim, bool) or not isinstance(dim, int) or not 0 <= dim < tensors[0].dim():
            raise ValueError(f"KVCache.update: dim: expected the token dimension of the tensors (an int in "
                             f"[0, {tensors[0].dim()})), got {dim!r}")
        if key_max is not None and (isinstance(key_max, bool) or not isinstance(key_max, (int, float, Tensor))):
            raise TypeError(f"KVCache.update: key_max: expected a number or None, got {type(key_max).__name__}")
        key = self._touch(op, t)
        if key in self._states:
            raise RuntimeError(f"KVCache: {type(op).__name__} at t = {float(t):g} keeps sorted runs built without "
                               "autograd; they cannot be extended under autograd (start a new cache, or call "
                               "under torch.no_grad())")
        m = int(tensors[0].shape[dim])
        grad = torch.is_grad_enabled() and any(x.requires_grad for x in tensors)
        e = self._entries.get(key)
        if e is None:
            bufs = tuple(x if grad else self._grow(x, dim, 2 * m) for x in tensors)
            self._entries[key] = [op, float(t), bufs, dim, m, None if key_max is None else float(key_max)]
            return tuple(b.narrow(dim, 0, m) for b in bufs)
        _, _, bufs, _, n, kmax = e
        if len(bufs) != len(tensors):
            raise ValueError(f"KVCache: {type(op).__name__} cached {len(bufs)} tensors, got {len(tensors)}")
        if grad:
            bufs = tuple(torch.cat((b.narrow(dim, 0, n), x.to(b.dtype)), dim=dim) for b, x in zip(bufs, tensors))
        else:
            if n + m > bufs[0].shape[dim]:
                bufs = tuple(self._grow(b.narrow(dim, 0, n), dim, 2 * (n + m)) for b in bufs)
            for b, x in zip(bufs, tensors):
                b.narrow(dim, n, m).copy_(x)
        if key_max is not None and kmax is None and n:
            kmax = float(bufs[0].narrow(dim, 0, n).detach().abs().amax())  # once: the keys cached so far
        e[5] = None if key_max is None else _max(kmax, float(key_max))
        e[2], e[4] = bufs, n + m
        return tuple(b.narrow(dim, 0, n + m) for b in bufs)

    def key_max(self, op, t) -> float | None:
        """:math:`\\max|k|` over the cached keys (``tensors[0]``) of the latest evaluation of
        ``op`` at step ``t``, kept by appends that gave ``key_max``; ``None`` when not kept
        (module docstring)."""
        e = self._entries.get(self._key(op, t, last=True))
        return None if e is None else e[5]

    @staticmethod
    def _grow(x: Tensor, dim: int, capacity: int) -> Tensor:
        """A buffer of ``capacity`` tokens along ``dim`` starting with ``x``."""
        shape = list(x.shape)
        shape[dim] = capacity
        buf = x.new_empty(shape)
        buf.narrow(dim, 0, x.shape[dim]).copy_(x)
        return buf

    def batch_size(self) -> int | None:
        """The number of sequences the cache holds (``None`` while it holds none: no call yet)."""
        if self._use is not None:
            return self._use[1]
        for e in self._entries.values():
            return int(e[2][0].shape[0])
        for e in self._states.values():
            b = getattr(e[2], "batch_size", None)
            if b is not None:
                return b
        return None

    def select(self, index: Tensor) -> None:
        """Keep the batch rows ``index`` of every entry (after dropping finished sequences, or
        reordering beams): a 1-D ``torch.int64`` / ``torch.int32`` tensor of row indices in
        ``[0, B)`` (a subset, a permutation, repeated rows), or a 1-D bool mask of length ``B``
        (``True`` = keep).  Negative indices, an empty selection and anything else are refused
        with an error naming ``index`` (:func:`opsplit._checks.check_select_index`) before the
        cache changes, so a refused select leaves it usable.  The next call continues the kept
        sequences, in the order ``index`` gives them."""
        rows = check_select_index(index, self.batch_size(), "KVCache.select: index")
        on = {}
        for e in self._entries.values():
            dev = e[2][0].device
            r = on.get(dev)
            if r is None:
                r = on[dev] = rows.to(dev)
            e[2] = tuple(x.index_select(0, r) for x in e[2])
            e[5] = None  # the kept maximum may belong to a dropped row
        for st in self._states.values():
            st[2].select(rows)
        if self._use is not None:
            self._use = (self._use[0], int(rows.numel()), *self._use[2:])
        self._mark = None  # the rows changed: nothing to roll back to

    # -- rolling back ------------------------------------------------------------------------
    def mark(self) -> None:
        """Remember the cache as it is now, for :meth:`rollback` (module docstring).  A cache
        holds at least one token when marked (the prompt); an earlier mark is replaced.
        Appends under autograd are not rolled back: the mark is refused while an entry keeps
        tensors that require grad."""
        n = self.length
        if n < 1:
            raise ValueError("KVCache.mark: the cache is empty; mark it after its first call (the prompt)")
        lengths = {e[4] for e in self._entries.values()} | {e[2].length for e in self._states.values()}
        if len(lengths) > 1:
            raise ValueError(f"KVCache.mark: its entries hold {sorted(lengths)} tokens (an earlier call failed half "
                             "way); use a new KVCache")
        if any(b.requires_grad for e in self._entries.values() for b in e[2]):
            raise RuntimeError("KVCache.mark: the cache holds tensors recorded by autograd; mark and roll back a "
                               "cache filled under torch.no_grad()")
        for st in self._states.values():
            fn = getattr(st[2], "mark", None)
            if fn is None:
                raise TypeError(f"KVCache.mark: the state of {type(st[0]).__name__} at t = {st[1]:g} "
                                f"({type(st[2]).__name__}) cannot be rolled back (it has no mark())")
            fn()
        self._mark = (n, {k: (e[4], e[5]) for k, e in self._entries.items()}, set(self._states))

    def rollback(self, n_tokens: int, padding: Tensor | None = None) -> None:
        """Keep the first ``n_tokens`` tokens (at least the marked length, at most
        :attr:`length`), as if the calls since :meth:`mark` had appended only those; the mark
        is used up.  ``padding``: ``(B, n_tokens)`` bool, ``True`` = padded, the padding of the
        kept tokens — those cached since the mark may become padding (their key weights in the
        sorted runs become 0; tensor entries keep them, and the calls that follow mask them
        through their key-padding mask); the tokens before the mark keep theirs (checked).
        Refused before anything changes: no mark, ``n_tokens`` out of range, entries made
        since the mark, a ``padding`` of another shape or dtype."""
        if self._mark is None:
            raise ValueError("KVCache.rollback: no mark to roll back to (KVCache.mark before the calls to undo; a "
                             "mark is used up by a rollback and dropped by select)")
        n0, kept, states = self._mark
        n = self.length
        if isinstance(n_tokens, bool) or not isinstance(n_tokens, int) or not n0 <= n_tokens <= n:
            raise ValueError(f"KVCache.rollback: n_tokens: expected an int in [{n0}, {n}] (the marked length and the "
                             f"length now), got {n_tokens!r}")
        if set(self._entries) - set(kept) or set(self._states) - states:
            raise ValueError("KVCache.rollback: entries were made since the mark (another solve, or a first "
                             "call after the mark); they cannot be rolled back")
        if padding is not None:
            B = self.batch_size()
            if not isinstance(padding, Tensor) or padding.dtype != torch.bool or \
                    tuple(padding.shape) != (B, n_tokens):
                got = tuple(padding.shape) if isinstance(padding, Tensor) else type(padding).__name__
                raise ValueError(f"KVCache.rollback: padding: expected a bool tensor (B, n_tokens) = ({B}, {n_tokens}) "
                                 f"(True = padded), got {got}")
        for st in self._states.values():
            check = getattr(st[2], "check_rollback", None)
            if check is not None:
                check(n_tokens, padding)
        for key, e in self._entries.items():
            m0, kmax0 = kept[key]
            bufs, dim = e[2], e[3]
            if kmax0 is not None and n_tokens > m0:  # the maximum of the kept keys: exact, from the appended ones
                kmax0 = _max(kmax0, float(bufs[0].narrow(dim, m0, n_tokens - m0).abs().amax()))
            e[4], e[5] = n_tokens, kmax0
        for st in self._states.values():
            st[2].rollback(n_tokens, padding)
        self._fed = n_tokens
        self._mark = None

    def __repr__(self) -> str:
        return f"KVCache(entries={len(self._entries) + len(self._states)}, length={self.length})"
