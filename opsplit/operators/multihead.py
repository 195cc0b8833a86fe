r"""Continuous multi-head attention: term I-a of paper 002, eq. (38), discretised by eq. (41);
with masks (seed 000, eq. 9) and encoder–decoder attention (seed 000, eq. 12).

For every head :math:`h \in \Omega_h` (paper 002, §5.1)

.. math::

    Q(x, h, k) &= \int_{\Omega_y} W^Q(\xi, h, k)\, u(x, \xi)\, d\xi + b^Q(h, k), \qquad
    K, V \text{ likewise (from } u \text{, or from the memory } m \text{)},\\
    \gamma(x, \tilde x, h) &= \mathrm{Softmax}_2\big(s\, \langle Q(x, h, \cdot), K(\tilde x, h, \cdot)\rangle\big)
        \quad\text{w.r.t. the key measure } d\mu(\tilde x) &(37)\\
    A(u)(x, y) &= \int_{\Omega_h} \int_{\Omega_x} \gamma(x, \tilde x, h)\,
        \Big[\textstyle\sum_k V(\tilde x, h, k)\, W^O(h, k, y)\Big]\, d\mu(\tilde x)\, dh + b^O(y).  &(38, \text{I-a})

The explicit-Euler step :math:`u + \Delta t\,A(u)` with :math:`L = N` and
:math:`\Delta t = 1` is eq. (41) plus torch's output projection:
:math:`u + \sum_m \mathrm{Softmax}(s\,Q_m K_m^\top) V_m W^O_m + b^O`.

**Standard heads and the output projection.**  The index :math:`k` is the *rank index* of
a head (``d_k`` of them for queries/keys, ``d_v`` for values).  The paper's eq. (38) has
:math:`k = y \in \Omega_y` and no :math:`W^O`; a standard head (``nn.MultiheadAttention``)
has :math:`d_k = d_v = N_y / H` and an output projection.  Both are this operator:

* the paper: ``WO=None`` (every head's :math:`W^O_m = I`, needs ``d_v = N_y``) and
  ``qk_inner="y"`` (the inner product of eq. 37 is the :math:`\Omega_y` integral);
* torch: ``WO`` given; the head's value kernel of eq. (38) is then the product
  :math:`W^V_m W^O_m` (an :math:`N_y \times N_y` kernel of rank :math:`d_v`, see
  :meth:`MultiHeadAttention.value_kernels`), computed in factored form
  (``concat_m(A_m V_m) @ W^O``: the same sum, never the :math:`N_y \times N_y` products).

**Scale.**  ``scale=None`` is eq. (37)'s :math:`1/\sqrt{|\Omega_y|}`; standard heads use
:math:`1/\sqrt{d_k}` (pass it; the converters do).  Eq. (41) prints :math:`1/\sqrt{L_x}`,
which opsplit reads as a typo for eq. (37)'s scale.

**Quadrature.**  The :math:`\Omega_y` integrals carry the y-weights (folded into the
kernels when they are equal); the :math:`\Omega_h` integral carries the head weights
(folded into :math:`W^O`); the key measure :math:`d\mu` is the :math:`\Omega_x` (or
memory :math:`\Omega_s`) quadrature times the masks (:mod:`opsplit.operators.context`).
With ``L = N`` (``Grid.paper``) every weight is 1 and the operator is exactly
``nn.MultiheadAttention`` (``batch_first=True``) in eval mode.

**Layouts** (head-major, so that reshapes are free views; rows are integration variables
as in :meth:`opsplit.grid.Grid.kernel_y`): ``WQ, WK`` of shape ``(N_y, H, d_k)``, ``WV``
``(N_y, H, d_v)``, ``WO`` ``(H, d_v, N_y)``, ``bQ, bK`` ``(H, d_k)``, ``bV`` ``(H, d_v)``,
``bO`` ``(N_y,)``.  Controls may be time-dependent (one weight set per layer: a
:class:`~opsplit.controls.PiecewiseConstant`).

Computation: one GEMM for :math:`Q, K, V` (self-attention), ``F.scaled_dot_product_attention``
for :math:`\gamma V`, one GEMM for :math:`W^O`.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .._checks import check_positive_float
from ..controls import PiecewiseConstant, as_control
from ..grid import Grid, Interval
from ._heads import check_control_shapes, check_head_controls, control_dim, control_shape
from ._masks import attention_log_weights
from ._sdpa import attention, check_scores
from .base import Operator
from .context import cached, context_value

__all__ = ["MultiHeadAttention"]




class MultiHeadAttention(Operator):
    r"""Multi-head (masked, cross-) attention integral (paper 002, eqs. 37–41; seed 000,
    eqs. 3, 5, 9, 12).

    Args:
        WQ, WK, WV: controls (or tensors) for the head kernels, shapes ``(N_y, H, d_k)``,
            ``(N_y, H, d_k)``, ``(N_y, H, d_v)``.
        WO: output kernel ``(H, d_v, N_y)``; ``None`` is :math:`W^O_m = I` (paper eq. 41,
            needs ``d_v = N_y``).
        bQ, bK, bV, bO: optional biases ``(H, d_k)``, ``(H, d_k)``, ``(H, d_v)``, ``(N_y,)``.
        scale: score scale :math:`s`; ``None`` is :math:`1/\sqrt{|\Omega_y|}` (eq. 37).
        qk_inner: ``"sum"`` (plain sum over the rank index: standard heads) or ``"y"`` (the
            :math:`\Omega_y` inner product of eq. 37, with its quadrature weights; needs
            ``d_k = N_y``).
        causal: restrict every query to keys at or before it (seed 000, eq. 9).
        dropout: dropout probability on the attention weights in training mode (as
            ``nn.MultiheadAttention``); identity in eval mode.
        memory: context key of the second state for encoder–decoder attention
            (seed 000, eq. 12): keys and values are read from ``grid.context[memory]``,
            shape ``(B, N_s, N_y)``; ``None`` is self-attention.
        attn_mask, key_padding_mask: context keys of the call-time masks (torch
            conventions; see :mod:`opsplit.operators.context`).
        source: the memory's token domain :math:`\Omega_s` (an :class:`~opsplit.grid.Interval`
            with ``n`` open or equal to ``N_s``); ``None`` is an interval of the kind of
            :math:`\Omega_x` with ``N_s`` nodes.
        cache: context key of a :class:`~opsplit.operators.KVCache` (self-attention): the new
            tokens' keys and values are appended to those cached for this operator at this
            time step and the causal mask is aligned at the bottom right (generation,
            :mod:`opsplit.operators.kv_cache`).
    """

    has_field = True
    default_solver = "explicit"

    def __init__(
        self,
        WQ,
        WK,
        WV,
        WO=None,
        *,
        bQ=None,
        bK=None,
        bV=None,
        bO=None,
        scale: float | None = None,
        qk_inner: str = "sum",
        causal: bool = False,
        dropout: float = 0.0,
        memory: str | None = None,
        attn_mask: str | None = None,
        key_padding_mask: str | None = None,
        source: Interval | None = None,
        cache: str | None = None,
    ):
        super().__init__()
        self.WQ = as_control(WQ, "MultiHeadAttention.WQ")
        self.WK = as_control(WK, "MultiHeadAttention.WK")
        self.WV = as_control(WV, "MultiHeadAttention.WV")
        self.WO = None if WO is None else as_control(WO, "MultiHeadAttention.WO")
        self.bQ = None if bQ is None else as_control(bQ, "MultiHeadAttention.bQ")
        self.bK = None if bK is None else as_control(bK, "MultiHeadAttention.bK")
        self.bV = None if bV is None else as_control(bV, "MultiHeadAttention.bV")
        self.bO = None if bO is None else as_control(bO, "MultiHeadAttention.bO")
        if scale is not None:
            scale = check_positive_float(scale, "MultiHeadAttention.scale")
        self.scale = scale
        if qk_inner not in ("sum", "y"):
            raise ValueError(f"MultiHeadAttention.qk_inner: expected 'sum' or 'y', got {qk_inner!r}")
        self.qk_inner = qk_inner
        self.causal = bool(causal)
        dropout = float(dropout)
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"MultiHeadAttention.dropout: expected 0 <= p < 1, got {dropout}")
        self.dropout = dropout
        for name, key in (("memory", memory), ("attn_mask", attn_mask), ("key_padding_mask", key_padding_mask),
                          ("cache", cache)):
            if key is not None and not isinstance(key, str):
                raise TypeError(
                    f"MultiHeadAttention.{name}: expected the name (str) of a grid context input, "
                    f"got {type(key).__name__}"
                )
        self.memory, self.attn_mask, self.key_padding_mask = memory, attn_mask, key_padding_mask
        if cache is not None and memory is not None:
            raise ValueError("MultiHeadAttention.cache: a key/value cache is for self-attention (memory=None)")
        self.cache = cache
        if source is not None and not isinstance(source, Interval):
            raise TypeError(f"MultiHeadAttention.source: expected an Interval, got {type(source).__name__}")
        self.source = source
        self._check_static_shapes()

    # -- construction helpers --------------------------------------------------------------
    @classmethod
    def create(
        cls,
        n_y: int,
        n_heads: int,
        *,
        head_dim: int | None = None,
        n_pieces: int = 1,
        t0: float = 0.0,
        t1: float | None = None,
        bias: bool = True,
        out_proj: bool = True,
        device=None,
        dtype=None,
        **kwargs,
    ) -> MultiHeadAttention:
        """Trainable heads with one weight set per time piece (``n_pieces`` =
        :math:`N_t` layers), initialised like ``nn.MultiheadAttention``.

        ``head_dim`` defaults to ``n_y // n_heads`` (which must then divide ``n_y``).
        Other keyword arguments go to the constructor (``scale``, ``causal``, ``memory``, ...);
        ``scale`` defaults here to the standard :math:`1/\\sqrt{d_k}`.
        """
        if head_dim is None:
            if n_y % n_heads:
                raise ValueError(
                    f"MultiHeadAttention.create: n_y = {n_y} is not divisible by n_heads = {n_heads}; "
                    "pass head_dim"
                )
            head_dim = n_y // n_heads
        fk = {"device": device, "dtype": dtype or torch.get_default_dtype()}

        def pc(*shape):
            return PiecewiseConstant(torch.zeros(n_pieces, *shape, **fk), t0=t0, t1=t1)

        kwargs.setdefault("scale", 1.0 / math.sqrt(head_dim))
        op = cls(
            pc(n_y, n_heads, head_dim), pc(n_y, n_heads, head_dim), pc(n_y, n_heads, head_dim),
            pc(n_heads, head_dim, n_y) if out_proj else None,
            bQ=pc(n_heads, head_dim) if bias else None,
            bK=pc(n_heads, head_dim) if bias else None,
            bV=pc(n_heads, head_dim) if bias else None,
            bO=pc(n_y) if bias and out_proj else None,
            **kwargs,
        )
        op.reset_parameters()
        return op

    @torch.no_grad()
    def reset_parameters(self) -> None:
        """``nn.MultiheadAttention``'s initialisation for trainable (piecewise-constant)
        controls: Xavier-uniform :math:`W^Q, W^K, W^V` (as one in-projection), the
        ``nn.Linear`` default for :math:`W^O`, zero biases."""
        for c in (self.WQ, self.WK, self.WV):
            if isinstance(c, PiecewiseConstant) and not c.positive:
                n_in, h, d = c.shape
                bound = math.sqrt(6.0 / (n_in + 3 * h * d))  # xavier on the (3E, E) in_proj
                nn.init.uniform_(c.raw, -bound, bound)
        if isinstance(self.WO, PiecewiseConstant):
            h, d, _ = self.WO.shape
            bound = 1.0 / math.sqrt(h * d)
            nn.init.uniform_(self.WO.raw, -bound, bound)
        for c in (self.bQ, self.bK, self.bV, self.bO):
            if isinstance(c, PiecewiseConstant):
                c.raw.zero_()

    # -- shapes ----------------------------------------------------------------------------
    def _check_static_shapes(self) -> None:
        sq, sk, sv = control_shape(self.WQ), control_shape(self.WK), control_shape(self.WV)
        for name, s in (("WQ", sq), ("WK", sk), ("WV", sv)):
            if s is not None and len(s) != 3:
                raise ValueError(
                    f"MultiHeadAttention.{name}: expected a kernel of shape (N_y, H, d) (per time "
                    f"piece), got {s}"
                )
        if sq is None or sk is None or sv is None:
            return
        if sq[1:] != sk[1:]:
            raise ValueError(f"MultiHeadAttention: WQ {sq} and WK {sk} must have the same (H, d_k)")
        if sk[:2] != sv[:2]:
            raise ValueError(f"MultiHeadAttention: WK {sk} and WV {sv} must have the same (N_y, H)")
        if self.memory is None and sq[0] != sk[0]:
            raise ValueError(f"MultiHeadAttention: self-attention needs WQ {sq} and WK {sk} on the same N_y")
        H, dk, dv, ny = sq[1], sq[2], sv[2], sq[0]
        if self.WO is None:
            if dv != ny:
                raise ValueError(
                    f"MultiHeadAttention: WO=None (W^O_m = I, paper eq. 41) needs d_v = N_y, got "
                    f"d_v = {dv}, N_y = {ny}"
                )
        else:
            so = control_shape(self.WO)
            if so is not None and so != (H, dv, ny):
                raise ValueError(f"MultiHeadAttention.WO: expected shape (H, d_v, N_y) = {(H, dv, ny)}, got {so}")
        check_control_shapes("MultiHeadAttention", (("bQ", self.bQ, (H, dk)), ("bK", self.bK, (H, dk)),
                                                     ("bV", self.bV, (H, dv)), ("bO", self.bO, (ny,))))
        if self.qk_inner == "y" and dk != ny:
            raise ValueError(f"MultiHeadAttention: qk_inner='y' needs d_k = N_y, got d_k = {dk}, N_y = {ny}")

    @property
    def n_heads(self) -> int | None:
        return control_dim(self.WQ, 1)

    def check(self, grid: Grid) -> None:
        check_head_controls(self, grid, name="MultiHeadAttention", features="features (d_model)", heads="heads")

    # -- quadrature --------------------------------------------------------------------------
    def _head_weights(self, H: int, grid: Grid, dtype, device):
        """The Omega_h weights: a float when equal (1 for L_h = N_h), else a (H,) tensor."""
        itv = grid.h
        if itv is None:
            return 1.0
        itv = itv.with_n(H) if itv.n is None else itv
        w = itv.uniform_weight
        return w if w is not None else itv.weights(dtype, device)

    def _source_log_weights(self, grid: Grid, n_s: int, dtype, device):
        itv = self.source
        if itv is None:
            if grid.x.uniform_weight is not None:
                return None
            itv = Interval(n=n_s, length=grid.x.length, rule=grid.x.rule)
        itv = itv.with_n(n_s)
        if itv.uniform_weight is not None:
            return None
        return itv.weights(dtype, device).log()

    def score_scale(self, grid: Grid) -> float:
        """:math:`s` (eq. 37 default :math:`1/\\sqrt{|\\Omega_y|}`), times the uniform
        y-weight when ``qk_inner="y"``."""
        s = self.scale if self.scale is not None else 1.0 / math.sqrt(grid.y.measure)
        if self.qk_inner == "y":
            w = grid.y.uniform_weight
            if w is not None:
                s = s * w
        return s

    # -- the term ------------------------------------------------------------------------------
    def _memory(self, grid: Grid, u: Tensor) -> Tensor:
        m = context_value(grid, self.memory)
        if m is None:
            raise ValueError(
                f"MultiHeadAttention (encoder-decoder): expected the memory as grid context input "
                f"{self.memory!r} (shape (B, N_s, N_y)); pass ContextGrid.of(grid, {self.memory}=memory)"
            )
        if not isinstance(m, Tensor) or m.dim() != 3 or m.shape[0] != u.shape[0] or m.shape[2] != u.shape[2]:
            shape = tuple(m.shape) if isinstance(m, Tensor) else type(m).__name__
            raise ValueError(
                f"MultiHeadAttention: memory {self.memory!r}: expected shape (B, N_s, N_y) = "
                f"({u.shape[0]}, N_s, {u.shape[2]}), got {shape}"
            )
        if m.dtype != u.dtype:
            raise TypeError(f"MultiHeadAttention: memory dtype {m.dtype} differs from the state's {u.dtype}")
        return m

    def _key_log_weights(self, grid: Grid, Nk: int, dtype, device):
        """logs of the (non-uniform) key quadrature weights, or ``None`` when they are equal."""
        if self.memory is None:
            return grid.log_weights_x(dtype, device)
        return self._source_log_weights(grid, Nk, dtype, device)

    def _log_weights(self, grid: Grid, B: int, H: int, Nq: int, Nk: int, dtype, device, *, quadrature: bool = True):
        """(bias, is_causal) for SDPA: the masks (and, with ``quadrature``, the logs of
        non-uniform key weights) as one additive log-weight, built once per call and cached
        on a :class:`~opsplit.operators.context.ContextGrid`."""
        am = context_value(grid, self.attn_mask)
        kpm = context_value(grid, self.key_padding_mask)
        past = Nk - Nq if self.memory is None else 0  # keys cached before the queries' own
        logw = self._key_log_weights(grid, Nk, dtype, device) if quadrature else None
        if logw is not None and past:
            raise ValueError("MultiHeadAttention: a key/value cache needs equal token weights (uniform Omega_x)")
        if am is None and kpm is None and logw is None:
            if self.causal and Nq == Nk:
                return None, True
            if not self.causal or Nq == 1 and past:
                return None, False

        def build():
            return attention_log_weights(
                B=B, H=H, Nq=Nq, Nk=Nk, dtype=dtype, device=device, attn_mask=am,
                key_padding_mask=kpm, causal=self.causal, log_wx=logw,
                names=(self.attn_mask or "attn_mask", self.key_padding_mask or "key_padding_mask"),
                causal_offset=past,
            )

        key = ("mha", id(self), quadrature, B, H, Nq, Nk, dtype, str(device))
        return cached(grid, key, build), False

    def _weights(self, t, grid: Grid, ny: int, dtype):
        """Evaluate the controls at ``t``; fold the uniform y-weight into the kernels."""
        WQ, WK, WV = self.WQ(t, grid), self.WK(t, grid), self.WV(t, grid)
        bQ = None if self.bQ is None else self.bQ(t, grid)
        bK = None if self.bK is None else self.bK(t, grid)
        bV = None if self.bV is None else self.bV(t, grid)
        if WQ.shape[0] != ny or WK.shape[0] != ny:
            raise ValueError(
                f"MultiHeadAttention: the kernels act on N_y = {WQ.shape[0]} features, the state has {ny}"
            )
        return WQ, WK, WV, bQ, bK, bV

    def _project(self, x: Tensor, Ws, bs, grid: Grid) -> Tensor:
        """:math:`\\int_{\\Omega_y} W(\\xi, \\cdot)\\, x(\\cdot, \\xi)\\, d\\xi + b` for the
        concatenated kernels ``Ws`` (one GEMM)."""
        ny = x.shape[-1]
        W = Ws[0].reshape(ny, -1) if len(Ws) == 1 else torch.cat([w.reshape(ny, -1) for w in Ws], 1)
        wy = grid.y.uniform_weight
        if wy is None:
            x = x * grid.y.weights(x.dtype, x.device)
        elif wy != 1.0:
            W = W * wy
        if all(b is None for b in bs):
            b = None
        elif len(bs) == 1:
            b = bs[0].reshape(-1)
        else:
            b = torch.cat(
                [
                    (b.reshape(-1) if b is not None else W.new_zeros(w.shape[1] * w.shape[2]))
                    for w, b in zip(Ws, bs)
                ]
            )
        return F.linear(x, W.t(), b)

    def heads(self, t, u: Tensor, grid: Grid):
        """:math:`Q, K, V` per head, shapes ``(B, H, N_x, d_k)``, ``(B, H, N_s, d_k)``,
        ``(B, H, N_s, d_v)`` (``N_s = N_x`` for self-attention)."""
        B, N, ny = u.shape
        WQ, WK, WV, bQ, bK, bV = self._weights(t, grid, ny, u.dtype)
        H, dk, dv = WQ.shape[1], WQ.shape[2], WV.shape[2]
        if self.memory is None:
            qkv = self._project(u, (WQ, WK, WV), (bQ, bK, bV), grid)
            q, k, v = qkv.split((H * dk, H * dk, H * dv), dim=-1)
            Ns = N
        else:
            m = self._memory(grid, u)
            Ns = m.shape[1]
            q = self._project(u, (WQ,), (bQ,), grid)
            kv = self._project(m, (WK, WV), (bK, bV), grid)
            k, v = kv.split((H * dk, H * dv), dim=-1)
        q = q.view(B, N, H, dk).transpose(1, 2)
        k = k.view(B, Ns, H, dk).transpose(1, 2)
        v = v.view(B, Ns, H, dv).transpose(1, 2)
        if self.qk_inner == "y" and grid.y.uniform_weight is None:
            q = q * grid.y.weights(q.dtype, q.device)
        return q, k, v

    def attend(self, q: Tensor, k: Tensor, v: Tensor, grid: Grid) -> Tensor:
        r""":math:`\int_{\Omega_x} \gamma(x, \tilde x, h) V(\tilde x, h, \cdot) d\mu(\tilde x)`
        per head, ``(B, H, N_x, d_v)``: softmax attention (eq. 37) by SDPA."""
        B, H, N, _ = q.shape
        bias, is_causal = self._log_weights(grid, B, H, N, k.shape[2], q.dtype, q.device)
        p = self.dropout if self.training else 0.0
        return attention(q, k, v, attn_mask=bias, dropout_p=p, is_causal=is_causal,
                         scale=self.score_scale(grid), name="MultiHeadAttention")

    def combine_heads(self, t, o: Tensor, grid: Grid) -> Tensor:
        r""":math:`\int_{\Omega_h} [\cdot] W^O(h, \cdot, y) dh + b^O(y)` from per-head outputs
        ``o`` of shape ``(B, H, N_x, d_v)`` to ``(B, N_x, N_y)``."""
        B, H, N, dv = o.shape
        wh = self._head_weights(H, grid, o.dtype, o.device)
        bO = None if self.bO is None else self.bO(t, grid)
        if self.WO is None:  # paper eq. (41): sum over heads
            if isinstance(wh, Tensor):
                out = (o * wh.view(1, H, 1, 1)).sum(1)
            else:
                out = o.sum(1) if wh == 1.0 else o.sum(1) * wh
            return out if bO is None else out + bO
        WO = self.WO(t, grid)
        ny = WO.shape[-1]
        if isinstance(wh, Tensor):
            WO = WO * wh.view(H, 1, 1)
        elif wh != 1.0:
            WO = WO * wh
        o = o.transpose(1, 2).reshape(B, N, H * dv)
        return F.linear(o, WO.reshape(H * dv, ny).t(), bO)

    def field(self, t, u: Tensor, grid: Grid) -> Tensor:
        q, k, v = self.heads(t, u, grid)
        cache = context_value(grid, self.cache)
        if cache is not None:
            k, v = cache.update(self, t, k, v)
        return self.combine_heads(t, self.attend(q, k, v, grid), grid)

    # -- analysis --------------------------------------------------------------------------
    def value_kernels(self, t=0.0, grid: Grid | None = None) -> Tensor:
        r"""The per-head value kernels of eq. (38), :math:`W^V_m W^O_m`, shape ``(H, N_y, N_y)``
        (row: integration variable :math:`\xi`).  With ``WO=None`` they are :math:`W^V_m`."""
        WV = self.WV(t, grid)
        if self.WO is None:
            return WV.permute(1, 0, 2)
        return torch.einsum("ahk,hky->hay", WV, self.WO(t, grid))

    def attention_weights(self, u: Tensor, t: float = 0.0, grid: Grid | None = None) -> Tensor:
        r"""The discrete attention map :math:`\gamma(x, \tilde x, h)\,\mu(\tilde x)` (rows sum
        to 1), shape ``(B, H, N_x, N_s)``, masks included."""
        g = self.resolve_grid(u, grid)
        q, k, _ = self.heads(t, u, g)
        B, H, N, _ = q.shape
        a = check_scores(self.score_scale(g) * (q @ k.transpose(-1, -2)),
                         "MultiHeadAttention.attention_weights")
        bias, is_causal = self._log_weights(g, B, H, N, k.shape[2], u.dtype, u.device)
        if is_causal:
            bias = torch.full((N, N), float("-inf"), dtype=u.dtype, device=u.device).triu_(1)
        if bias is not None:
            a = a + bias
        return a.softmax(-1)

    def extra_repr(self) -> str:
        s = "scale=1/sqrt(|Omega_y|)" if self.scale is None else f"scale={self.scale:.6g}"
        parts = [s, f"heads={self.n_heads}"]
        if self.WO is None:
            parts.append("WO=I (paper eq. 41)")
        if self.qk_inner != "sum":
            parts.append(f"qk_inner={self.qk_inner!r}")
        if self.causal:
            parts.append("causal=True")
        if self.dropout:
            parts.append(f"dropout={self.dropout:g}")
        if self.memory is not None:
            parts.append(f"memory={self.memory!r}")
        if self.attn_mask is not None:
            parts.append(f"attn_mask={self.attn_mask!r}")
        if self.key_padding_mask is not None:
            parts.append(f"key_padding_mask={self.key_padding_mask!r}")
        if self.cache is not None:
            parts.append(f"cache={self.cache!r}")
        return ", ".join(parts)
