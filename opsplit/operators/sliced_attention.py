r"""Sliced ReLU and sliced ReLU-bump attention as terms of the continuous model (paper 004).

The mean-field attention of paper 004, eq. (8), with :math:`\mu` the uniform measure on
:math:`\Omega_x` and the heads integrated over :math:`\Omega_h` as in paper 002, eq. (38):

.. math::

    Q(x, y) &= \int_{\Omega_y} W^Q(\xi, y, t)\, u(x, \xi)\, d\xi,\quad
    K(x, y) = \int_{\Omega_y} W^K(\xi, y, t)\, u(x, \xi)\, d\xi,\quad
    V(x, y, h) = \int_{\Omega_y} W^V(h, \xi, y, t)\, u(x, \xi)\, d\xi, \\
    z^q(x, h) &= \Pi_h\big(Q(x, \cdot)\big),\qquad z^k(x, h) = \Pi_h\big(K(x, \cdot)\big),

and, for sliced ReLU attention (eq. 3 with :math:`S = \mathrm{ReLU}`, :math:`N = |\cdot|`),

.. math::

    A(t; u)(x, y) = \int_{\Omega_h}
      \frac{\int_{\Omega_x} \mathrm{ReLU}\big(z^q(x,h) - z^k(\tilde x,h)\big)
            \big(V(\tilde x, y, h) - \bar V(y, h)\big)\, d\tilde x}
           {\int_{\Omega_x} |z^q(x,h) - z^k(\eta,h)|\, d\eta}\, dh,\qquad
    \bar V(y, h) = \frac{1}{|\Omega_x|}\int_{\Omega_x} V(\eta, y, h)\, d\eta,

for sliced ReLU-bump attention (eq. 7: :math:`S = \mathrm{ReLU}(1 - |\cdot|/b_h)`,
:math:`N = 1`),

.. math::

    A(t; u)(x, y) = \int_{\Omega_h} \frac{1}{|\Omega_x|}\int_{\Omega_x}
      \mathrm{ReLU}\Big(1 - \frac{|z^q(x,h) - z^k(\tilde x,h)|}{b_h(t)}\Big)
      V(\tilde x, y, h)\, d\tilde x\, dh.

The projection :math:`\Pi : L^2(\Omega_y) \to \mathbb R^H` (paper 004, §2.2) is linear,
:math:`\Pi_h(Q) = \int_{\Omega_y} P(h, y)\, Q(y)\, dy`, or a one-hidden-layer MLP with
hidden width :math:`N_y`,
:math:`\Pi_h(Q) = \int_{\Omega_y} P(h, \eta)\,\mathrm{ReLU}\big(\int_{\Omega_y} P_1(y, \eta)
Q(y)\, dy + c_1(\eta)\big)\, d\eta` (an output bias would cancel in the differences).

Discretisation: every :math:`\Omega_y` integral uses the grid's y-quadrature; the
:math:`\Omega_x` integrals are the quadrature weights :math:`w_x` passed to
:func:`~opsplit.functional.sliced_relu_attention` as ``key_weights`` (they cancel on a
uniform grid, where the term is eq. 3 / eq. 7 literally: with ``L_x = N_x`` the bump's
:math:`1/|\Omega_x|` is the paper's :math:`1/n`); the head integral uses the weights of
``grid.h`` when the grid has a head interval, else a plain sum (:math:`L_h = N_h`, as in
paper 002, §5.3).  The evaluation is exact and costs :math:`O(N_x \log N_x)` per head
(sort and prefix sums, Prop. 2.1), with :math:`O(N_x N_y)` memory.

With ``causal=True`` the :math:`\Omega_x` integrals run over :math:`\tilde x \le x` (and
the centring of eq. 3 and the normalisation of eq. 7 over that prefix): a decoder-only
continuous transformer (:mod:`opsplit.functional.sliced_causal`).

Both are explicit terms (``has_field``): in any scheme they take the place of
:class:`~opsplit.operators.SoftmaxAttention`; with ``L = N`` and :math:`\Delta t = 1` the
explicit-Euler substep is the attention block with its skip connection,
:math:`u + \sum_h \mathcal A_h(u)` (paper 004, eq. 33).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from .._checks import check_positive_float, check_positive_int, check_select_index
from ..controls import Constant, Control, PiecewiseConstant, as_control
from ..functional import (
    causal_sliced_relu_attention,
    causal_sliced_relu_bump_attention,
    sliced_relu_attention,
    sliced_relu_bump_attention,
)
from ..functional._inputs import key_weights as combine_key_weights
from ..functional.sliced_decode import (
    decode_sliced_relu_attention,
    decode_sliced_relu_bump_attention,
)
from ..functional.sliced_runs import SlicedDecodeCache
from ..grid import Grid
from .base import Operator
from .context import context_value

__all__ = ["SlicedReLUAttention", "SlicedReLUBumpAttention"]


def _control(x, name, axes, positive=False):
    if isinstance(x, (int, float)) and not isinstance(x, bool):
        x = torch.tensor(float(x), dtype=torch.float64)  # exact; cast to u's dtype in use
    if positive and isinstance(x, Tensor) and not isinstance(x, nn.Parameter):
        if not bool(torch.isfinite(x).all()) or not bool((x > 0).all()):
            raise ValueError(f"{name}: expected finite values > 0, got {x}")
        return Constant(x, axes=axes, positive=True)
    return as_control(x, name, axes=axes)


class _SlicedBase(Operator):
    """Shared parts: controls, projection, head integral."""

    has_field = True
    default_solver = "explicit"
    #: the field sorts its scores (data-dependent control flow): a parallel scheme runs it
    #: unbatched rather than under ``torch.func.vmap``
    batchable = False
    _name = "SlicedAttention"

    def __init__(self, WQ, WK, WV, P, *, P1=None, c1=None, cache: str | None = None,
                 key_padding_mask: str | None = None):
        super().__init__()
        n = self._name
        for name, key in (("cache", cache), ("key_padding_mask", key_padding_mask)):
            if key is not None and not isinstance(key, str):
                raise TypeError(f"{n}.{name}: expected the name (str) of a grid context input, got "
                                f"{type(key).__name__}")
        self.cache, self.key_padding_mask = cache, key_padding_mask
        self.WQ = as_control(WQ, f"{n}.WQ", axes=("y", "y"))
        self.WK = as_control(WK, f"{n}.WK", axes=("y", "y"))
        self.WV = as_control(WV, f"{n}.WV", axes=("y", "y"))
        self.P = as_control(P, f"{n}.P", axes=("y",))
        if (P1 is None) != (c1 is None):
            raise ValueError(f"{n}: an MLP projection needs both P1 and c1 (or neither, for linear)")
        self.P1 = None if P1 is None else as_control(P1, f"{n}.P1", axes=("y", "y"))
        self.c1 = None if c1 is None else as_control(c1, f"{n}.c1", axes=("y",))
        for name in ("WV", "P"):
            shp = getattr(getattr(self, name), "shape", None)
            if shp is not None and len(shp) != (3 if name == "WV" else 2):
                raise ValueError(
                    f"{n}.{name}: expected shape "
                    + ("(H, N_y, N_y)" if name == "WV" else "(H, N_y)") + f", got {tuple(shp)}"
                )
        hv = getattr(self.WV, "shape", None)
        hp = getattr(self.P, "shape", None)
        if hv is not None and hp is not None and hv[0] != hp[0]:
            raise ValueError(
                f"{n}: WV has {hv[0]} heads (shape {tuple(hv)}) but P has {hp[0]} (shape {tuple(hp)})"
            )

    @property
    def projection(self) -> str:
        return "linear" if self.P1 is None else "mlp"

    @property
    def n_heads(self) -> int | None:
        shp = getattr(self.P, "shape", None)
        return None if shp is None else int(shp[0])

    def check(self, grid: Grid) -> None:
        n = self._name
        for name in ("WQ", "WK", "WV", "P", "P1", "c1"):
            c = getattr(self, name)
            if c is not None:
                c.validate(grid, f"{n}.{name}")
        H = self.n_heads
        if grid.h is not None and H is not None and grid.h.n is not None and grid.h.n != H:
            raise ValueError(
                f"{n}: the grid's head interval has N_h = {grid.h.n} nodes, the operator has "
                f"{H} heads"
            )

    # -- the pieces of the field ---------------------------------------------------------
    def project(self, t, Q: Tensor, grid: Grid) -> Tensor:
        r"""The scores :math:`\Pi_h(Q(x, \cdot))`: ``(B, N_x, N_y) -> (B, H, N_x)``."""
        X = Q
        if self.P1 is not None:
            X = torch.relu(grid.kernel_y(X, self.P1(t, grid)) + self.c1(t, grid))
        P = self.P(t, grid)  # (H, N_y)
        return grid.kernel_y(X, P.transpose(0, 1)).transpose(1, 2)

    def scores_and_values(self, t, u: Tensor, grid: Grid):
        """``zq, zk`` of shape ``(B, H, N_x)`` and ``V`` of shape ``(B, H, N_x, N_y)``."""
        WV = self.WV(t, grid)
        P = self.P(t, grid)
        if WV.dim() != 3 or P.dim() != 2 or WV.shape[0] != P.shape[0]:
            raise ValueError(
                f"{self._name}: expected WV (H, N_y, N_y) and P (H, N_y) with the same H, got "
                f"{tuple(WV.shape)} and {tuple(P.shape)}"
            )
        zq = self.project(t, grid.kernel_y(u, self.WQ(t, grid)), grid)
        zk = self.project(t, grid.kernel_y(u, self.WK(t, grid)), grid)
        H, NY = WV.shape[0], WV.shape[-1]
        B, NX, _ = u.shape
        Wv = WV.permute(1, 0, 2).reshape(WV.shape[1], H * NY)  # (N_y, H N_y)
        V = grid.kernel_y(u, Wv).view(B, NX, H, NY).transpose(1, 2)  # (B, H, N_x, N_y)
        return zq, zk, V

    def key_weights(self, grid: Grid, dtype, device) -> Tensor | None:
        """The :math:`\\Omega_x` quadrature weights, or ``None`` when they are equal."""
        if grid.x.uniform_weight is not None:
            return None
        return grid.x.weights(dtype, device)

    def with_cache(self, t, zk: Tensor, V: Tensor, grid: Grid, wx):
        """With a :class:`~opsplit.operators.KVCache` in the context (causal operators only):
        the cached scores and values of the earlier tokens followed by the new ones."""
        cache = context_value(grid, self.cache)
        if cache is None:
            return zk, V
        if not self.causal:
            raise ValueError(f"{self._name}: a key/value cache needs causal=True (generation)")
        if wx is not None:
            raise ValueError(f"{self._name}: a key/value cache needs equal token weights (uniform Omega_x)")
        return cache.update(self, t, zk, V)

    def sorted_runs(self, t, grid: Grid, wx, *xs: Tensor):
        """With a :class:`~opsplit.operators.KVCache` in the context and no autograd recording
        (generation): this step's :class:`_SortedRuns` (the keys as sorted runs,
        :mod:`opsplit.functional.sliced_runs`); ``None`` otherwise (no cache, or autograd:
        the cached scores and values, :meth:`with_cache`)."""
        cache = context_value(grid, self.cache)
        if cache is None:
            return None
        if not self.causal:
            raise ValueError(f"{self._name}: a key/value cache needs causal=True (generation)")
        if wx is not None:
            raise ValueError(f"{self._name}: a key/value cache needs equal token weights (uniform Omega_x)")
        if not cache.sorted_runs or (torch.is_grad_enabled() and any(x.requires_grad for x in xs)):
            return None  # differentiable (or asked for): concatenated scores and values (KVCache.update)
        if cache.past(self, t) and not cache.has_state(self, t):
            return None  # tensors cached under autograd: continue with them
        return self.cache_state(cache, t)

    def cache_state(self, cache, t):
        """The object this term keeps in ``cache`` (a :class:`~opsplit.operators.KVCache`) for
        its next evaluation at step ``t`` of the call under way (made the first time, as
        :meth:`KVCache.state`): ``.runs``, the keys as sorted runs
        (:class:`~opsplit.functional.sliced_runs.SlicedDecodeCache`), and the padding of the
        cached tokens.  A decode step reaches it through :meth:`sorted_runs`; a caller may fill
        it directly (``cache_state(cache, t).runs.append(zk, v)`` after ``cache.begin(n)``: a
        cache of ``n`` given keys, as benchmarks/decode.py builds one)."""
        return cache.state(self, t, _SortedRuns)

    def decode_key_weights(self, grid: Grid, zk: Tensor) -> Tensor | None:
        """For a decode step: the key-padding mask of the call (``(B, N_k)`` over cached and
        new keys, ``True`` = padded) as key weights ``(B, 1, N_k)`` (0 at the pads), or ``None``."""
        kpm = context_value(grid, self.key_padding_mask)
        if kpm is None:
            return None
        return combine_key_weights(self._name, kpm, None, zk.shape, zk.dtype, zk.device)

    def head_sum(self, out: Tensor, grid: Grid) -> Tensor:
        """:math:`\\int_{\\Omega_h} \\cdot\\, dh` of ``(B, H, N_x, N_y)`` -> ``(B, N_x, N_y)``."""
        if grid.h is None:
            return out.sum(1)
        g = grid.h.with_n(out.shape[1]) if grid.h.n is None else grid.h
        w = g.weights(out.dtype, out.device)
        return torch.einsum("bhxy,h->bxy", out, w)

    def extra_repr(self) -> str:
        H = self.n_heads
        return f"heads={H if H is not None else '?'}, projection={self.projection!r}"

    # -- construction ------------------------------------------------------------------
    @classmethod
    def _controls(cls, n_y, n_heads, projection, n_steps, t0, t1, device, dtype):
        n_y = check_positive_int(n_y, f"{cls._name}.build: n_y")
        n_heads = check_positive_int(n_heads, f"{cls._name}.build: n_heads")
        if n_steps is not None:
            n_steps = check_positive_int(n_steps, f"{cls._name}.build: n_steps")
        fk = {"device": device, "dtype": dtype or torch.get_default_dtype()}

        def c(*shape):
            if n_steps is None:
                return Constant(nn.Parameter(torch.zeros(*shape, **fk)))
            return PiecewiseConstant(torch.zeros(n_steps, *shape, **fk), t0=t0, t1=t1)

        ctl = {
            "WQ": c(n_y, n_y), "WK": c(n_y, n_y), "WV": c(n_heads, n_y, n_y), "P": c(n_heads, n_y),
        }
        if projection == "mlp":
            ctl["P1"] = c(n_y, n_y)
            ctl["c1"] = c(n_y)
        elif projection != "linear":
            raise ValueError(f"projection: expected 'linear' or 'mlp', got {projection!r}")
        return ctl

    @torch.no_grad()
    def reset_parameters(self, generator: torch.Generator | None = None, dy: float = 1.0) -> None:
        """Re-initialise the trainable controls like ``nn.Linear`` on the discrete map:
        uniform in :math:`\\pm 1/(\\sqrt{N_y}\\,\\Delta y)` (``dy``: the y-spacing).
        Controls given as plain tensors (buffers) are left as they are."""
        dy = check_positive_float(dy, f"{self._name}.reset_parameters: dy")
        for name in ("WQ", "WK", "WV", "P", "P1", "c1"):
            ctl = getattr(self, name)
            if ctl is None:
                continue
            param = _param_of(ctl)
            if param is None:
                continue
            n_y = param.shape[-1]
            bound = 1.0 / (math.sqrt(n_y) * (1.0 if name == "c1" else dy))
            param.copy_(
                torch.rand(param.shape, generator=generator, dtype=param.dtype).to(param.device)
                * (2 * bound) - bound
            )


class _SortedRuns:
    """What a causal sliced term keeps in a :class:`~opsplit.operators.KVCache` under
    ``torch.no_grad()``: the sorted runs of its keys
    (:class:`~opsplit.functional.sliced_runs.SlicedDecodeCache`) and the padding of every
    cached token, so that a call whose key-padding mask changes the padding of cached
    tokens is refused (their weights are in the runs) rather than served stale."""

    def __init__(self):
        self.runs = SlicedDecodeCache()
        self.padding = None  # (B, n) bool, True = padded; None: no padded token so far

    @property
    def length(self) -> int:
        return self.runs.length

    @property
    def batch_size(self) -> int | None:
        return self.runs.batch_size

    def nbytes(self) -> int:
        """Bytes held for the cached tokens: the runs' (:meth:`SlicedDecodeCache.nbytes`,
        capacity not counted) and the padding's."""
        pad = 0 if self.padding is None else self.padding.numel() * self.padding.element_size()
        return self.runs.nbytes() + pad

    def select(self, index: Tensor) -> None:
        """Keep the batch rows ``index`` (checked by :meth:`SlicedDecodeCache.select`, before
        either part changes)."""
        rows = check_select_index(index, self.runs.batch_size, "KVCache.select: index")
        self.runs.select(rows)
        if self.padding is not None:
            self.padding = self.padding.index_select(0, rows.to(self.padding.device))

    def mark(self) -> None:
        """Remember the runs and the padding for :meth:`rollback` (:meth:`KVCache.mark`)."""
        self.runs.mark()
        self._marked = (self.runs.length, self.padding)

    def check_rollback(self, n: int, padding: Tensor | None) -> None:
        """Refuse, before anything changes, a rollback whose ``padding`` changes the padding of
        the tokens cached before the mark (their weights are in the runs)."""
        n0, old = getattr(self, "_marked", (None, None))
        if n0 is None or padding is None:
            return
        past = padding[:, :n0]
        same = (not bool(past.any())) if old is None else torch.equal(past, old[:, :n0].to(past.device))
        if not same:
            raise ValueError("KVCache.rollback: padding: the padding of the tokens cached before the mark differs "
                             "from the padding they were cached with (their key weights are in the sorted runs)")

    def rollback(self, n: int, padding: Tensor | None) -> None:
        """Keep the first ``n`` tokens; those cached since the mark that ``padding`` pads get
        key weight 0 (:meth:`KVCache.rollback`)."""
        n0, old = self._marked
        keep = None if padding is None or not bool(padding[:, n0:n].any()) else ~padding[:, n0:n]
        self.runs.rollback(n, keep)
        if padding is not None:
            self.padding = padding.clone() if bool(padding.any()) else None
        elif self.padding is not None:
            self.padding = self.padding[:, :n]
        self._marked = (None, None)

    def key_weights(self, name: str, kpm: Tensor | None, zk: Tensor) -> Tensor | None:
        """The weights ``(B, 1, m)`` of the ``m`` new keys from the call's key-padding mask
        ``(B, past + m)`` (``True`` = padded; ``None``: no padding), after checking that it
        pads the cached tokens as before."""
        n, m = self.runs.length, zk.shape[-1]
        if kpm is not None:
            B = zk.shape[0]
            if kpm.dim() != 2 or kpm.shape[0] != B or kpm.shape[1] != n + m:
                raise ValueError(f"{name}: key_padding_mask: expected shape (B, past + N) = ({B}, {n + m}), "
                                 f"got {tuple(kpm.shape)}")
        past = None if kpm is None else kpm[:, :n]
        old = self.padding
        if past is None:
            same = old is None or not bool(old.any())
        elif old is None:
            same = not bool(past.any())
        else:  # another batch size is refused by the runs, naming it
            same = old.shape != past.shape or torch.equal(past, old)
        if not same:
            raise ValueError(f"{name}: key_padding_mask: the padding of the {n} cached tokens differs from "
                             "the padding they were cached with; their key weights are in the cache (start a "
                             "new KVCache to change it)")
        if kpm is None:
            if old is not None:
                self.padding = torch.cat([old, old.new_zeros(old.shape[0], m)], 1)
            return None
        new = kpm[:, n:]
        if old is not None or bool(new.any()):
            self.padding = kpm.clone()
        if not bool(new.any()):
            return None
        return combine_key_weights(name, new, None, zk.shape, zk.dtype, zk.device)


class _PositiveParameter(Control):
    """A trainable, time-independent positive control stored as its logarithm."""

    def __init__(self, values: Tensor):
        super().__init__(())
        self.raw = nn.Parameter(values.detach().log())

    def forward(self, t=None, grid=None) -> Tensor:
        return self.raw.exp()

    def validate(self, grid, name: str = "control") -> None:
        pass

    def extra_repr(self) -> str:
        return f"shape={tuple(self.raw.shape)}, positive=True"


def _flag(x, name: str) -> bool:
    if not isinstance(x, bool):
        raise TypeError(f"{name}: expected a bool, got {type(x).__name__}")
    return x


def _causal_mask(d: Tensor, causal: bool):
    """1 where key ``j`` is visible from query ``i`` (``j <= i``; all if not causal)."""
    if not causal:
        return 1.0
    n = d.shape[-1]
    return torch.ones(n, n, dtype=d.dtype, device=d.device).tril()


def _param_of(ctl: Control):
    if isinstance(ctl, PiecewiseConstant) and not ctl.positive:
        return ctl.raw
    if isinstance(ctl, Constant) and isinstance(ctl.value, nn.Parameter):
        return ctl.value
    return None


class SlicedReLUAttention(_SlicedBase):
    r"""Multi-head sliced ReLU attention integral (paper 004, eqs. 3 and 8; 2 if not centred).

    Args:
        WQ, WK: controls (or tensors) for :math:`W^Q(\tilde y, y, t)`, :math:`W^K`, shape
            ``(N_y, N_y)`` (row: integration variable).
        WV: values, one kernel per head, shape ``(H, N_y, N_y)``.
        P: the projection's (last) layer, shape ``(H, N_y)``.
        P1, c1: hidden layer of an MLP projection, ``(N_y, N_y)`` and ``(N_y,)``; ``None``
            (both) for a linear projection.
        centered: subtract the :math:`\Omega_x`-mean of the values (eq. 3); ``False`` is eq. 2.
        causal: position :math:`x_i` attends to :math:`x_l \le x_i` only (a decoder), with
            the values centred over that causal prefix
            (:func:`~opsplit.functional.causal_sliced_relu_attention`, exact,
            :math:`O(N_x \log^2 N_x)`).
        cache: context key of a :class:`~opsplit.operators.KVCache` (causal: generation).
        key_padding_mask: context key of a bool mask ``(B, N_k)`` (``True`` = padded: the key
            gets weight 0 in every sum, the left padding of a batch of prompts).

    Use :meth:`build` for an initialised module.
    """

    _name = "SlicedReLUAttention"

    def __init__(self, WQ, WK, WV, P, *, P1=None, c1=None, centered: bool = True,
                 causal: bool = False, cache: str | None = None, key_padding_mask: str | None = None):
        super().__init__(WQ, WK, WV, P, P1=P1, c1=c1, cache=cache, key_padding_mask=key_padding_mask)
        self.centered = _flag(centered, f"{self._name}.centered")
        self.causal = _flag(causal, f"{self._name}.causal")

    @classmethod
    def build(cls, n_y: int, n_heads: int, *, projection: str = "mlp", centered: bool = True,
              causal: bool = False, n_steps: int | None = None, t0: float = 0.0,
              t1: float | None = None, dy: float = 1.0, generator=None, device=None,
              dtype=None, cache: str | None = None, key_padding_mask: str | None = None) -> SlicedReLUAttention:
        """A randomly initialised operator: constant controls (``n_steps=None``) or one value
        per time step (:class:`~opsplit.controls.PiecewiseConstant` on ``[t0, t1]``).
        ``projection="mlp"`` is paper 004's choice for sliced ReLU attention (§2.2)."""
        ctl = cls._controls(n_y, n_heads, projection, n_steps, t0, t1, device, dtype)
        op = cls(ctl["WQ"], ctl["WK"], ctl["WV"], ctl["P"], P1=ctl.get("P1"), c1=ctl.get("c1"),
                 centered=centered, causal=causal, cache=cache, key_padding_mask=key_padding_mask)
        op.reset_parameters(generator, dy)
        return op

    def field(self, t, u: Tensor, grid: Grid) -> Tensor:
        zq, zk, V = self.scores_and_values(t, u, grid)
        wx = self.key_weights(grid, u.dtype, u.device)
        st = self.sorted_runs(t, grid, wx, zq, zk, V)
        if st is not None:  # generation: the sorted runs, O(D log^2 n) per new token
            w = st.key_weights(self._name, context_value(grid, self.key_padding_mask), zk)
            return self.head_sum(st.runs.step_relu(zq, zk, V, key_weights=w, centered=self.centered), grid)
        zk, V = self.with_cache(t, zk, V, grid, wx)
        if zk.shape[-1] > zq.shape[-1]:  # decode steps after a cache: O(N_q N_k D) direct sums
            return self.head_sum(decode_sliced_relu_attention(zq, zk, V, centered=self.centered,
                                                              key_weights=self.decode_key_weights(grid, zk)), grid)
        attn = causal_sliced_relu_attention if self.causal else sliced_relu_attention
        out = attn(zq, zk, V, centered=self.centered, key_weights=wx,
                   key_padding_mask=context_value(grid, self.key_padding_mask))
        return self.head_sum(out, grid)

    def attention_weights(self, u: Tensor, t: float = 0.0, grid: Grid | None = None) -> Tensor:
        r"""The dense discrete kernel :math:`w_j\,\mathrm{ReLU}(z^q_i - z^k_j) / \sum_l w_l
        |z^q_i - z^k_l|`, shape ``(B, H, N_x, N_x)`` (for analysis of small problems; the
        field never forms it)."""
        g = self.resolve_grid(u, grid)
        zq, zk, _ = self.scores_and_values(t, u, g)
        d = zq.unsqueeze(-1) - zk.unsqueeze(-2)
        w = g.x.weights(u.dtype, u.device) * _causal_mask(d, self.causal)
        den = (d.abs() * w).sum(-1, keepdim=True)
        return torch.where(den > 0, torch.relu(d) * w / torch.where(den > 0, den, 1.0), 0.0)

    def extra_repr(self) -> str:
        return super().extra_repr() + f", centered={self.centered}" + (
            ", causal=True" if self.causal else "")


class SlicedReLUBumpAttention(_SlicedBase):
    r"""Multi-head sliced ReLU-bump (hat-kernel) attention integral (paper 004, eq. 7).

    Args:
        WQ, WK, WV, P, P1, c1: as in :class:`SlicedReLUAttention` (paper 004 uses a linear
            projection for the bump, the default of :meth:`build`).
        bandwidth: :math:`b_h(t) > 0`: a number, a tensor of shape ``(H,)`` or ``()``, or a
            control (e.g. ``PiecewiseConstant(..., positive=True)`` to train it).
        causal: position :math:`x_i` attends to :math:`x_l \le x_i` only, normalised by
            their number (:func:`~opsplit.functional.causal_sliced_relu_bump_attention`).
    """

    _name = "SlicedReLUBumpAttention"

    def __init__(self, WQ, WK, WV, P, *, bandwidth=1.0, P1=None, c1=None, causal: bool = False,
                 cache: str | None = None, key_padding_mask: str | None = None):
        super().__init__(WQ, WK, WV, P, P1=P1, c1=c1, cache=cache, key_padding_mask=key_padding_mask)
        self.causal = _flag(causal, f"{self._name}.causal")
        self.bandwidth = _control(bandwidth, f"{self._name}.bandwidth", (), positive=True)

    @classmethod
    def build(cls, n_y: int, n_heads: int, *, bandwidth: float = 1.0, projection: str = "linear",
              causal: bool = False, n_steps: int | None = None, t0: float = 0.0,
              t1: float | None = None, dy: float = 1.0, generator=None, device=None,
              dtype=None, cache: str | None = None, key_padding_mask: str | None = None) -> SlicedReLUBumpAttention:
        """A randomly initialised operator with a trainable bandwidth per head (log-
        parametrised, so it stays positive)."""
        ctl = cls._controls(n_y, n_heads, projection, n_steps, t0, t1, device, dtype)
        fk = {"device": device, "dtype": dtype or torch.get_default_dtype()}
        bandwidth = check_positive_float(bandwidth, f"{cls._name}.build: bandwidth")
        if n_steps is None:
            b = _PositiveParameter(torch.full((n_heads,), float(bandwidth), **fk))
        else:
            b = PiecewiseConstant(torch.full((n_steps, n_heads), float(bandwidth), **fk), t0=t0,
                                  t1=t1, positive=True)
        op = cls(ctl["WQ"], ctl["WK"], ctl["WV"], ctl["P"], bandwidth=b, P1=ctl.get("P1"),
                 c1=ctl.get("c1"), causal=causal, cache=cache, key_padding_mask=key_padding_mask)
        op.reset_parameters(generator, dy)
        return op

    def check(self, grid: Grid) -> None:
        super().check(grid)
        self.bandwidth.validate(grid, f"{self._name}.bandwidth")

    def extra_repr(self) -> str:
        return super().extra_repr() + (", causal=True" if self.causal else "")

    def field(self, t, u: Tensor, grid: Grid) -> Tensor:
        zq, zk, V = self.scores_and_values(t, u, grid)
        b = self.bandwidth(t, grid)
        if b.dim() > 1 or (b.dim() == 1 and b.shape[0] not in (1, zq.shape[1])):
            raise ValueError(
                f"{self._name}.bandwidth: expected a scalar or one value per head ({zq.shape[1]}), "
                f"got shape {tuple(b.shape)}"
            )
        wx = self.key_weights(grid, u.dtype, u.device)
        st = self.sorted_runs(t, grid, wx, zq, zk, V, b)
        if st is not None:  # generation: the sorted runs, O(D log^2 n) per new token
            w = st.key_weights(self._name, context_value(grid, self.key_padding_mask), zk)
            return self.head_sum(st.runs.step_bump(zq, zk, V, b.to(u.dtype), key_weights=w), grid)
        zk, V = self.with_cache(t, zk, V, grid, wx)
        if zk.shape[-1] > zq.shape[-1]:  # decode steps after a cache: O(N_q N_k D) direct sums
            return self.head_sum(decode_sliced_relu_bump_attention(
                zq, zk, V, b.to(u.dtype), key_weights=self.decode_key_weights(grid, zk)), grid)
        attn = causal_sliced_relu_bump_attention if self.causal else sliced_relu_bump_attention
        out = attn(zq, zk, V, b.to(u.dtype), key_weights=wx,
                   key_padding_mask=context_value(grid, self.key_padding_mask))
        return self.head_sum(out, grid)

    def attention_weights(self, u: Tensor, t: float = 0.0, grid: Grid | None = None) -> Tensor:
        r"""The dense discrete kernel :math:`w_j\,\mathrm{ReLU}(1 - |z^q_i - z^k_j|/b_h) /
        \sum_l w_l`, shape ``(B, H, N_x, N_x)`` (small problems only)."""
        g = self.resolve_grid(u, grid)
        zq, zk, _ = self.scores_and_values(t, u, g)
        b = self.bandwidth(t, g).to(u.dtype)
        b = b.view(1, -1, 1, 1) if b.dim() == 1 else b
        d = zq.unsqueeze(-1) - zk.unsqueeze(-2)
        w = g.x.weights(u.dtype, u.device) * _causal_mask(d, self.causal)
        K = torch.relu(1 - d.abs() / b)
        W = w.sum(-1, keepdim=True)
        return K * w / W
