r"""Grouped-query attention: multi-head attention (paper 002, eqs. 37–38) whose keys and
values live on a coarser head grid, with rotary positions and a key/value cache.

The query heads :math:`h \in \Omega_h` (:math:`H` nodes) are grouped: :math:`g = H / H_{kv}`
consecutive query heads share one key/value head :math:`\pi(h) \in \Omega_h^{kv}`
(:math:`H_{kv}` nodes, :math:`\pi(h) = \lfloor h/g \rfloor`, a piecewise-constant map
between the two head grids).  For every query head

.. math::

    Q(x, h, k) &= \int_{\Omega_y} W^Q(\xi, h, k)\, u(x, \xi)\, d\xi + b^Q(h, k),\\
    K(x, j, k) &= \int_{\Omega_y} W^K(\xi, j, k)\, u(x, \xi)\, d\xi + b^K(j, k),\quad
    V(x, j, k) \text{ likewise},\quad j \in \Omega_h^{kv},\\
    \gamma(x, \tilde x, h) &= \mathrm{Softmax}_2\big(s\,\langle R(x) Q(x, h, \cdot),\,
        R(\tilde x) K(\tilde x, \pi(h), \cdot)\rangle\big)\quad(\tilde x \le x), \\
    A(u)(x, y) &= \int_{\Omega_h} \int_{\Omega_x} \gamma(x, \tilde x, h)\,
        \Big[\textstyle\sum_k V(\tilde x, \pi(h), k)\, W^O(h, k, y)\Big]\, d\tilde x\, dh + b^O(y),

with :math:`R(x)` the rotary position map (:mod:`opsplit.operators.rope`, optional).
:math:`H_{kv} = H` is multi-head attention, :math:`H_{kv} = 1` multi-query attention.  With
``L = N`` the explicit-Euler step is ``x + o_proj(SDPA(R q, R k, v))`` of Llama, Qwen2 and
Mistral (Qwen2: ``bQ, bK, bV`` and no ``bO``; Llama's ``attention_bias``: all four).

**Masks** are changes of the key measure (:mod:`opsplit.operators.context`): ``causal``
restricts :math:`\tilde x \le x`; a key-padding mask (context input, ``True`` = padded, as
torch's ``key_padding_mask``) removes a sample's padded tokens — left padding of a batch of
prompts.  A query that sees no key at all (a left pad) gets 0, as
``F.scaled_dot_product_attention`` returns for a fully masked row.

**Cache** (:mod:`opsplit.operators.kv_cache`): with a :class:`~opsplit.operators.KVCache`
in the context, the keys and values of the new tokens are appended to those cached for
this operator at this step, the causal restriction is aligned at the bottom right (new
token :math:`i` of :math:`m` after :math:`n` cached ones sees keys :math:`\le n + i`), and
the rotary positions continue at :math:`\xi = n\,h + (x_i - x_1)` unless the call gives
them.  One decode step then costs :math:`O(n\, d)` per head.

**Quadrature** as in :class:`~opsplit.operators.MultiHeadAttention`: y-weights folded into
the kernels, head weights into :math:`W^O`, non-uniform x-weights as log-weights of the
keys (not with a cache).

**Layouts** (head-major): ``WQ`` ``(N_y, H, d)``, ``WK, WV`` ``(N_y, H_kv, d)``, ``WO``
``(H, d, N_y)``, ``bQ`` ``(H, d)``, ``bK, bV`` ``(H_kv, d)``, ``bO`` ``(N_y,)``.
Computation: three GEMMs (one, on the three kernels side by side, when autograd does not
record: a copy made at the call, :func:`~opsplit.operators._linear.side_by_side`), the
rotation, ``F.scaled_dot_product_attention`` (through the overflow guard of :mod:`opsplit.operators._sdpa`) — with ``enable_gqa`` when no mask is
needed, with the :math:`g` query heads of a group as :math:`g` queries of their
key/value head for a single query (a decode step: no copy of the cache), else on the
key/value heads repeated over their groups — and one GEMM for :math:`W^O`.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from .._checks import check_positive_float, check_probability
from ..controls import PiecewiseConstant, as_control
from ..grid import Grid
from ._heads import check_control_shapes, check_head_controls, control_dim, control_shape
from ._linear import linear_y, side_by_side
from ._masks import attention_log_weights
from ._sdpa import attention, bound_from, max_abs, values_unchecked
from .base import Operator
from .context import cached, context_value
from .rope import RotaryEmbedding

__all__ = ["GroupedQueryAttention"]

#: below this many query/key entries the guard's maxima are one reduction (a decode step)
_SMALL = 1 << 14




class GroupedQueryAttention(Operator):
    r"""Grouped-query (causal) attention integral with rotary positions (module docstring).

    Args:
        WQ, WK, WV, WO: controls (or tensors) of shapes ``(N_y, H, d)``, ``(N_y, H_kv, d)``,
            ``(N_y, H_kv, d)``, ``(H, d, N_y)``; ``H_kv`` must divide ``H``.
        bQ, bK, bV, bO: optional biases ``(H, d)``, ``(H_kv, d)``, ``(H_kv, d)``, ``(N_y,)``.
        scale: score scale :math:`s`; ``None`` is :math:`1/\sqrt{|\Omega_y|}` (eq. 37);
            standard heads use :math:`1/\sqrt d`.
        causal: restrict every query to the keys at or before it.
        rotary: a :class:`~opsplit.operators.rope.RotaryEmbedding` applied to queries and
            keys, or ``None`` (no rotation: GPT-2's learned positions enter the state instead).
        dropout: dropout probability on the attention weights in training mode.
        key_padding_mask: context key of a ``(B, N_k)`` mask (``True`` / ``-inf`` = padded).
        positions: context key of explicit coordinates :math:`\xi` ``(B or 1, N_x)`` of the
            new tokens (default: the grid's, continued after a cache).
        cache: context key of a :class:`~opsplit.operators.KVCache`.
    """

    has_field = True
    default_solver = "explicit"

    def __init__(self, WQ, WK, WV, WO, *, bQ=None, bK=None, bV=None, bO=None, scale: float | None = None,
                 causal: bool = True, rotary: RotaryEmbedding | None = None, dropout: float = 0.0,
                 key_padding_mask: str | None = None, positions: str | None = None, cache: str | None = None):
        super().__init__()
        n = "GroupedQueryAttention"
        self.WQ = as_control(WQ, f"{n}.WQ")
        self.WK = as_control(WK, f"{n}.WK")
        self.WV = as_control(WV, f"{n}.WV")
        self.WO = as_control(WO, f"{n}.WO")
        self.bQ = None if bQ is None else as_control(bQ, f"{n}.bQ")
        self.bK = None if bK is None else as_control(bK, f"{n}.bK")
        self.bV = None if bV is None else as_control(bV, f"{n}.bV")
        self.bO = None if bO is None else as_control(bO, f"{n}.bO", axes=("y",))
        self.scale = None if scale is None else check_positive_float(scale, f"{n}.scale")
        if not isinstance(causal, bool):
            raise TypeError(f"{n}.causal: expected a bool, got {type(causal).__name__}")
        self.causal = causal
        if rotary is not None and not isinstance(rotary, RotaryEmbedding):
            raise TypeError(f"{n}.rotary: expected a RotaryEmbedding or None, got {type(rotary).__name__}")
        self.rotary = rotary
        self.dropout = check_probability(dropout, f"{n}.dropout")
        for name, key in (("key_padding_mask", key_padding_mask), ("positions", positions), ("cache", cache)):
            if key is not None and not isinstance(key, str):
                raise TypeError(f"{n}.{name}: expected the name (str) of a grid context input, got {type(key).__name__}")
        self.key_padding_mask, self.positions, self.cache = key_padding_mask, positions, cache
        self._check_static_shapes()

    # -- construction ------------------------------------------------------------------------
    @classmethod
    def create(cls, n_y: int, n_heads: int, n_kv_heads: int | None = None, *, head_dim: int | None = None,
               n_pieces: int = 1, t0: float = 0.0, t1: float | None = None, qkv_bias: bool = False,
               out_bias: bool = False, rope_theta: float | None = 10000.0, generator=None, device=None,
               dtype=None, **kwargs) -> GroupedQueryAttention:
        """Trainable controls with one weight set per time piece (``n_pieces`` layers),
        initialised as ``nn.Linear`` (uniform :math:`\\pm 1/\\sqrt{N_y}`, output
        :math:`\\pm 1/\\sqrt{H d}`), zero biases; rotary positions with ``rope_theta``
        (``None``: none).  ``scale`` defaults to :math:`1/\\sqrt d`."""
        n_kv_heads = n_heads if n_kv_heads is None else n_kv_heads
        head_dim = head_dim or n_y // n_heads
        fk = {"device": device, "dtype": dtype or torch.get_default_dtype()}

        def pc(*shape, bound=0.0):
            v = (torch.rand((n_pieces, *shape), generator=generator, dtype=torch.float64) * 2 - 1) * bound
            return PiecewiseConstant(v.to(**fk), t0=t0, t1=t1)

        kwargs.setdefault("scale", 1.0 / math.sqrt(head_dim))
        b_in, b_out = 1.0 / math.sqrt(n_y), 1.0 / math.sqrt(n_heads * head_dim)
        rotary = None if rope_theta is None else RotaryEmbedding(head_dim, rope_theta)
        return cls(
            pc(n_y, n_heads, head_dim, bound=b_in), pc(n_y, n_kv_heads, head_dim, bound=b_in),
            pc(n_y, n_kv_heads, head_dim, bound=b_in), pc(n_heads, head_dim, n_y, bound=b_out),
            bQ=pc(n_heads, head_dim) if qkv_bias else None, bK=pc(n_kv_heads, head_dim) if qkv_bias else None,
            bV=pc(n_kv_heads, head_dim) if qkv_bias else None, bO=pc(n_y) if out_bias else None,
            rotary=rotary, **kwargs,
        )

    def _check_static_shapes(self) -> None:
        n = "GroupedQueryAttention"
        sq, sk, sv, so = (control_shape(c) for c in (self.WQ, self.WK, self.WV, self.WO))
        for name, s, rank in (("WQ", sq, 3), ("WK", sk, 3), ("WV", sv, 3), ("WO", so, 3)):
            if s is not None and len(s) != rank:
                raise ValueError(f"{n}.{name}: expected a kernel of rank {rank} (per time piece), got shape {s}")
        if None in (sq, sk, sv, so):
            return
        ny, H, d = sq
        if sk != sv or sk[0] != ny or sk[2] != d:
            raise ValueError(f"{n}: WK {sk} and WV {sv} must both be (N_y, H_kv, d) = ({ny}, H_kv, {d})")
        if H % sk[1]:
            raise ValueError(
                f"{n}: the {sk[1]} key/value heads must divide the {H} query heads (groups of equal size)"
            )
        if so != (H, d, ny):
            raise ValueError(f"{n}.WO: expected shape (H, d, N_y) = {(H, d, ny)}, got {so}")
        check_control_shapes(n, (("bQ", self.bQ, (H, d)), ("bK", self.bK, sk[1:]), ("bV", self.bV, sk[1:]),
                                 ("bO", self.bO, (ny,))))
        if self.rotary is not None and self.rotary.head_dim != d:
            raise ValueError(f"{n}.rotary: head_dim {self.rotary.head_dim} != the heads' d = {d}")

    @property
    def n_heads(self) -> int | None:
        return control_dim(self.WQ, 1)

    @property
    def n_kv_heads(self) -> int | None:
        return control_dim(self.WK, 1)

    def check(self, grid: Grid) -> None:
        check_head_controls(self, grid, name="GroupedQueryAttention", features="features", heads="query heads")

    # -- pieces of the field -------------------------------------------------------------------
    def score_scale(self, grid: Grid) -> float:
        return self.scale if self.scale is not None else 1.0 / math.sqrt(grid.y.measure)

    def _positions(self, grid: Grid, B: int, N: int, past: int, device) -> Tensor:
        p = context_value(grid, self.positions)
        if p is None:
            key = ("rope-grid", N, past, str(device))
            return cached(grid, key, lambda: self.rotary.token_positions(grid, N, past, device))
        if not isinstance(p, Tensor) or p.dim() != 2 or p.shape[0] not in (1, B) or p.shape[1] != N:
            shape = tuple(p.shape) if isinstance(p, Tensor) else type(p).__name__
            raise ValueError(
                f"GroupedQueryAttention: positions {self.positions!r}: expected shape (B, N_x) = ({B}, {N}) or "
                f"(1, {N}), got {shape}"
            )
        return p

    def heads(self, t, u: Tensor, grid: Grid, past: int = 0):
        """:math:`R Q, R K, V` of the state's tokens: ``(B, H, N, d)``, ``(B, H_kv, N, d)``,
        ``(B, H_kv, N, d)`` (rotated when the operator has rotary positions)."""
        if not torch.is_grad_enabled():
            W, b, (H, Hkv, d) = self._in_kernel(t, grid)
            qk, v = self._qkv(t, u, grid, past, W, b, H, Hkv, d)
            return qk[:, :, :H].transpose(1, 2), qk[:, :, H:].transpose(1, 2), v.transpose(1, 2)
        B, N, ny = u.shape
        WQ, WK, WV = self.WQ(t, grid), self.WK(t, grid), self.WV(t, grid)
        H, Hkv, d = WQ.shape[1], WK.shape[1], WQ.shape[2]
        bias = [None if c is None else c(t, grid).reshape(-1) for c in (self.bQ, self.bK, self.bV)]
        q = linear_y(u, WQ.reshape(ny, H * d), bias[0], grid).view(B, N, H, d)
        k = linear_y(u, WK.reshape(ny, Hkv * d), bias[1], grid).view(B, N, Hkv, d)
        v = linear_y(u, WV.reshape(ny, Hkv * d), bias[2], grid).view(B, N, Hkv, d)
        if self.rotary is not None:
            cos, sin = self._cos_sin(grid, B, N, past, u)
            q, k = self.rotary.rotate(q, cos, sin), self.rotary.rotate(k, cos, sin)
        return q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)

    def kernels(self, t, grid: Grid) -> tuple:
        """The kernels at time ``t`` for a call without autograd: ``(W, b, (H, H_kv, d), W_O,
        b_O)`` with :math:`W^Q, W^K, W^V` side by side ``(N_y, (H + 2 H_kv) d)`` and their
        biases (one GEMM), and :math:`W^O` as ``(H d, N_y)`` with the head weights folded in."""
        return self._in_kernel(t, grid) + self._out_kernel(t, grid)

    def _in_kernel(self, t, grid: Grid) -> tuple:
        WQ, WK, WV = self.WQ(t, grid), self.WK(t, grid), self.WV(t, grid)
        bias = [None if c is None else c(t, grid).reshape(-1) for c in (self.bQ, self.bK, self.bV)]
        W, b = side_by_side((WQ, WK, WV), bias)
        return W, b, (WQ.shape[1], WK.shape[1], WQ.shape[2])

    def _qkv(self, t, u: Tensor, grid: Grid, past: int, W: Tensor, b: Tensor | None, H: int, Hkv: int,
             d: int) -> tuple:
        """Without autograd: the rotated query and key heads together ``(B, N, H + H_kv, d)``
        and the value heads ``(B, N, H_kv, d)``, token-major, from one GEMM and one rotation
        (elementwise: the same numbers as two)."""
        B, N, _ = u.shape
        qkv = linear_y(u, W, b, grid).view(B, N, H + 2 * Hkv, d)
        qk, v = qkv[:, :, : H + Hkv], qkv[:, :, H + Hkv:]
        if self.rotary is not None:
            cos, sin = self._cos_sin(grid, B, N, past, u)
            qk = self.rotary.rotate(qk, cos, sin)
        return qk, v

    def _cos_sin(self, grid: Grid, B: int, N: int, past: int, u: Tensor):
        """cos, sin of the rotary angles of the new tokens, shaped ``(B or 1, N, 1, d)`` (one per
        call, shared by the layers through the grid's per-call cache)."""
        pos = self._positions(grid, B, N, past, u.device)
        key = ("rope", id(self.rotary), N, past, u.dtype, str(u.device), id(pos))

        def build():
            cos, sin = self.rotary.cos_sin(pos, u.dtype)
            if cos.dim() == 1 + pos.dim() and pos.dim() == 1:  # grid positions (N,) -> (1, N, 1, d)
                return cos[None, :, None], sin[None, :, None]
            return cos.unsqueeze(-2), sin.unsqueeze(-2)  # (B, N, d) -> (B, N, 1, d)

        return cached(grid, key, build)

    def _log_weights(self, grid: Grid, B: int, Nq: int, Nk: int, dtype, device):
        """(bias, is_causal) for SDPA: causal (bottom-right aligned after a cache), key padding
        and non-uniform key weights as one additive log-weight, built once per call."""
        kpm = context_value(grid, self.key_padding_mask)
        past = Nk - Nq
        logw = grid.log_weights_x(dtype, device)
        if logw is not None and past:
            raise ValueError(
                "GroupedQueryAttention: a key/value cache needs equal token weights (a grid with uniform Omega_x "
                "quadrature)"
            )
        if kpm is None and logw is None:
            if not self.causal or Nq == 1:
                return None, False
            if past == 0:
                return None, True

        def build():
            return attention_log_weights(
                B=B, H=1, Nq=Nq, Nk=Nk, dtype=dtype, device=device, key_padding_mask=kpm, log_wx=logw,
                causal=self.causal and Nq > 1, causal_offset=past,
                names=("attn_mask", self.key_padding_mask or "key_padding_mask"),
            )

        return cached(grid, ("gqa-mask", id(self), B, Nq, Nk, dtype, str(device)), build), False

    def attend(self, q: Tensor, k: Tensor, v: Tensor, grid: Grid, *, bound: float | None = None) -> Tensor:
        r""":math:`\int_{\Omega_x}\gamma(x,\tilde x,h) V(\tilde x, \pi(h), \cdot)\, d\tilde x`,
        ``(B, H, N_q, d)``, from queries ``(B, H, N_q, d)`` and key/value heads
        ``(B, H_kv, N_k, d)`` (``bound``: the overflow guard's bound of the scores, when known)."""
        B, H, Nq, d = q.shape
        Hkv, Nk = k.shape[1], k.shape[2]
        bias, is_causal = self._log_weights(grid, B, Nq, Nk, q.dtype, q.device)
        p = self.dropout if self.training else 0.0
        s = self.score_scale(grid)
        if Hkv == H:
            return attention(q, k, v, attn_mask=bias, dropout_p=p, is_causal=is_causal, scale=s,
                             name="GroupedQueryAttention", bound=bound)
        # the group map pi: query head h reads key/value head h // g
        g = H // Hkv
        if Nq == 1:
            # one query (a decode step): the g query heads of a group become g queries of their
            # key/value head, (B, H, 1, d) -> (B, H_kv, g, d); every one sees every key
            o = attention(q.reshape(B, Hkv, g, d), k, v, attn_mask=bias, dropout_p=p, is_causal=False, scale=s,
                          name="GroupedQueryAttention", bound=bound)
            return o.reshape(B, H, 1, v.shape[-1])
        if bias is None and q.dim() == 4:
            return attention(q, k, v, attn_mask=None, dropout_p=p, is_causal=is_causal, scale=s,
                             name="GroupedQueryAttention", enable_gqa=True, bound=bound)
        k = k[:, :, None].expand(B, Hkv, g, Nk, d).reshape(B, H, Nk, d)
        v = v[:, :, None].expand(B, Hkv, g, Nk, v.shape[-1]).reshape(B, H, Nk, v.shape[-1])
        return attention(q, k, v, attn_mask=bias, dropout_p=p, is_causal=is_causal, scale=s,
                         name="GroupedQueryAttention", bound=bound)

    def _out_kernel(self, t, grid: Grid) -> tuple:
        """``(W_O (H d, N_y), b_O)`` at time ``t``, the head weights of :math:`\\Omega_h` folded in."""
        WO = self.WO(t, grid)
        H = WO.shape[0]
        itv = grid.h
        if itv is not None:
            itv = itv.with_n(H) if itv.n is None else itv
            wh = itv.uniform_weight
            if wh is None:
                WO = WO * itv.weights(WO.dtype, WO.device).view(H, 1, 1)
            elif wh != 1.0:
                WO = WO * wh
        return WO.reshape(H * WO.shape[1], -1).t(), None if self.bO is None else self.bO(t, grid)

    def combine_heads(self, t, o: Tensor, grid: Grid) -> Tensor:
        r""":math:`\int_{\Omega_h}[\cdot] W^O(h, \cdot, y)\,dh + b^O(y)`: ``(B, H, N, d)`` ->
        ``(B, N, N_y)``."""
        B, H, N, d = o.shape
        WO, bO = self._out_kernel(t, grid)
        return F.linear(o.transpose(1, 2).reshape(B, N, H * d), WO, bO)

    def field(self, t, u: Tensor, grid: Grid) -> Tensor:
        if not torch.is_grad_enabled():
            return self._field(t, u, grid, self.kernels(t, grid))
        cache = context_value(grid, self.cache)
        past = 0 if cache is None else cache.past(self, t)
        q, k, v = self.heads(t, u, grid, past)
        if cache is not None:
            k, v = cache.update(self, t, k, v)
        return self.combine_heads(t, self.attend(q, k, v, grid), grid)

    def frozen_field(self, t, grid: Grid):
        """The field at time ``t`` as a function ``f(u, grid)`` with the kernels evaluated once
        (:meth:`kernels`): for repeated calls without autograd while the parameters do not
        change — the decode steps of one generation.  The same operations as :meth:`field`."""
        kernels = self.kernels(t, grid)

        def f(u: Tensor, g: Grid) -> Tensor:
            return self._field(t, u, g, kernels)

        return f

    def _field(self, t, u: Tensor, grid: Grid, kernels) -> Tensor:
        """The field without autograd, from :meth:`kernels`.  The overflow guard's bound comes
        from one reduction over the new queries and keys; with a cache, the maximum of the
        cached keys is kept by the cache as they are appended (no pass over the cache)."""
        W, b, (H, Hkv, d), WO, bO = kernels
        B, N, _ = u.shape
        cache = context_value(grid, self.cache)
        past = 0 if cache is None else cache.past(self, t)
        qk, v = self._qkv(t, u, grid, past, W, b, H, Hkv, d)
        mq = mk = None
        if qk.numel() and not values_unchecked(qk):
            if qk.numel() <= _SMALL:  # a decode step: one reduction to the H + H_kv heads' maxima
                m = qk.abs().amax(dim=(0, 1, 3)).tolist()
                nan = any(x != x for x in m)  # propagate NaN as torch.amax does
                mq, mk = (math.nan, math.nan) if nan else (max(m[:H]), max(m[H:]))
            else:  # max|x| = max(max x, -min x): plain max and min passes, no |x| copy of a large input
                mq, mk = max_abs(qk[:, :, :H], qk[:, :, H:])
                if mq != mq or mk != mk:  # propagate NaN to both, as the decode-step reduction does
                    mq = mk = math.nan
        q, k, v = qk[:, :, :H].transpose(1, 2), qk[:, :, H:].transpose(1, 2), v.transpose(1, 2)
        if cache is not None:
            k, v = cache.update(self, t, k, v, key_max=mk)
            if mk is not None:
                mk = cache.key_max(self, t)
        bound = None if mq is None else bound_from(mq, mk, d, self.score_scale(grid))
        o = self.attend(q, k, v, grid, bound=bound)
        return F.linear(o.transpose(1, 2).reshape(B, N, H * d), WO, bO)

    def extra_repr(self) -> str:
        s = "scale=1/sqrt(|Omega_y|)" if self.scale is None else f"scale={self.scale:.6g}"
        parts = [s, f"heads={self.n_heads}", f"kv_heads={self.n_kv_heads}"]
        if self.causal:
            parts.append("causal=True")
        if self.dropout:
            parts.append(f"dropout={self.dropout:g}")
        for name in ("key_padding_mask", "positions", "cache"):
            if getattr(self, name) is not None:
                parts.append(f"{name}={getattr(self, name)!r}")
        return ", ".join(parts)

