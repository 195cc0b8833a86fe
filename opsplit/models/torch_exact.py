r"""Torch-exact transformer layers as splitting schemes: ``nn.TransformerEncoderLayer``,
``nn.TransformerEncoder``, ``nn.TransformerDecoderLayer`` and ``nn.TransformerDecoder``
recovered *exactly* (to round-off) as propagators of opsplit.

One time step :math:`u^n \mapsto u^{n+1}` (:math:`\Delta t = 1`, ``L = N``) is one layer;
the per-layer weights are the values of piecewise-constant controls
:math:`\theta(t) = \theta^n` on :math:`[n, n+1)`, so :math:`N_t` = number of layers.

**Encoder layer, post-norm** (``norm_first=False``; the original transformer and the
ordering of paper 002's scheme 13–17), a Lie scheme with 4 substeps:

====  ===================================================  ====================================
 #    substep                                              opsplit
====  ===================================================  ====================================
 1    :math:`u \leftarrow u + \Delta t\, A(u)`              explicit Euler, :class:`~opsplit.operators.MultiHeadAttention`
 2    :math:`u \leftarrow \gamma_1 \odot P^\varepsilon_{S_1}(u) + \beta_1`  :class:`~opsplit.operators.PointwiseAffine` with a :class:`~opsplit.operators.ProjectionS1`
 3    :math:`u \leftarrow u + \Delta t\, F(u)`              explicit Euler, :class:`~opsplit.operators.FeedForward` (hidden grid, no final activation)
 4    :math:`u \leftarrow \gamma_2 \odot P^\varepsilon_{S_1}(u) + \beta_2`  as 2
====  ===================================================  ====================================

(with ``fused_norm=False`` substeps 2 and 4 are each two substeps: the core projection's
resolvent, then the affine map.)

**Encoder layer, pre-norm** (``norm_first=True``; ViT): 2 substeps, each an explicit-Euler
step of a term that reads the normalised state (:class:`~opsplit.operators.PreNorm`):
:math:`u \leftarrow u + \Delta t\, A(\mathrm{LN}_1(u))`, :math:`u \leftarrow u + \Delta t\,
F(\mathrm{LN}_2(u))`.

**Decoder layer**: the same with a third term, encoder–decoder attention (seed 000,
eq. 12) reading the memory :math:`m` on its own token domain :math:`\Omega_s`.  The
decoder is the coupled evolution

.. math::  u_t = A_{\text{self}}(u) + A_{\text{cross}}(u; m) + F(u) + \text{(norms)},\qquad m_t = 0,

on the decoder's time interval, with :math:`m` the encoder's final state: a block-triangular
system, solved by first running the encoder and then the decoder with :math:`m` frozen
(the memory is handed to the cross-attention term through the grid's call-time context,
:mod:`opsplit.operators.context`).

**Dropout** (``FieldDropout`` on each term, attention-weight dropout in the attention,
hidden dropout in the FFN) is applied in training mode only, at the places torch applies
it; in eval mode it is the identity and the model is deterministic.

A final ``norm`` of ``nn.TransformerEncoder`` / ``nn.TransformerDecoder`` is applied once
after the last step: a post-processing map :math:`G` (as ViT's read-out, paper 002 §4.2),
not a step of the scheme.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from .._checks import (
    check_finite,
    check_positive_float,
    check_positive_int,
    check_probability,
    skip_value_checks,
)
from ..controls import PiecewiseConstant
from ..grid import Grid
from ..operators import (
    FeedForward,
    FieldDropout,
    MultiHeadAttention,
    PointwiseAffine,
    PreNorm,
    ProjectionS1,
)
from ..operators._masks import check_attn_mask, check_key_padding_mask
from ..operators.activation import activation_fn
from ..operators.context import ContextGrid
from ..propagator import Propagator
from ..schemes import Lie
from ..solvers import Exact, ExplicitEuler, Implicit, Substep

__all__ = ["TorchEncoder", "TorchDecoder", "LayerConfig", "encoder_layer_scheme", "decoder_layer_scheme"]


def _check_bool(v, name: str) -> bool:
    if not isinstance(v, bool):
        raise TypeError(f"{name}: expected a bool, got {type(v).__name__} {v!r}")
    return v


def _norm_substeps(norm) -> list:
    """A norm given as one map or as (projection, affine) -> the substeps that apply it."""
    if isinstance(norm, (list, tuple)):
        return [Substep(n, Implicit()) if isinstance(n, ProjectionS1) else Substep(n, Exact()) for n in norm]
    return [Substep(norm, Exact())]


def _with_dropout(op, p: float):
    return FieldDropout(op, p) if p else op


def encoder_layer_scheme(attention, ffn, norm1, norm2, *, norm_first: bool = False, dropout: float = 0.0) -> Lie:
    """One step = one ``nn.TransformerEncoderLayer`` (see the module docstring)."""
    a, f = _with_dropout(attention, dropout), _with_dropout(ffn, dropout)
    if norm_first:
        return Lie([Substep(PreNorm(a, norm1), ExplicitEuler()), Substep(PreNorm(f, norm2), ExplicitEuler())])
    return Lie([Substep(a, ExplicitEuler()), *_norm_substeps(norm1), Substep(f, ExplicitEuler()), *_norm_substeps(norm2)])


def decoder_layer_scheme(
    self_attention, cross_attention, ffn, norm1, norm2, norm3, *, norm_first: bool = False, dropout: float = 0.0
) -> Lie:
    """One step = one ``nn.TransformerDecoderLayer``: self-attention, encoder–decoder
    attention, feed-forward, each with its norm (pre or post)."""
    sa, ca, f = (_with_dropout(op, dropout) for op in (self_attention, cross_attention, ffn))
    if norm_first:
        return Lie(
            [
                Substep(PreNorm(sa, norm1), ExplicitEuler()),
                Substep(PreNorm(ca, norm2), ExplicitEuler()),
                Substep(PreNorm(f, norm3), ExplicitEuler()),
            ]
        )
    return Lie(
        [
            Substep(sa, ExplicitEuler()), *_norm_substeps(norm1),
            Substep(ca, ExplicitEuler()), *_norm_substeps(norm2),
            Substep(f, ExplicitEuler()), *_norm_substeps(norm3),
        ]
    )


@dataclass
class LayerConfig:
    """The configuration of a torch-exact layer (``nn.TransformerEncoderLayer``'s arguments
    plus ``num_layers``, ``head_dim``, ``qkv_bias``, ``fused_norm``, ``final_norm``), and the
    builders of its operators (controls with one value per layer)."""

    d_model: int
    nhead: int
    dim_feedforward: int = 2048
    dropout: float = 0.1
    activation: str = "relu"
    layer_norm_eps: float = 1e-5
    batch_first: bool = False
    norm_first: bool = False
    bias: bool = True
    num_layers: int = 1
    head_dim: int | None = None
    qkv_bias: bool | None = None
    fused_norm: bool = True
    final_norm: bool = False
    device: object = None
    dtype: object = None
    attention_dropout: float | None = None
    activation_dropout: float | None = None
    norm_affine: bool = True
    norm_bias: bool | None = None
    final_norm_affine: bool | None = None
    final_norm_bias: bool | None = None

    def __post_init__(self):
        self.d_model = check_positive_int(self.d_model, "d_model")
        self.nhead = check_positive_int(self.nhead, "nhead")
        self.dim_feedforward = check_positive_int(self.dim_feedforward, "dim_feedforward")
        self.num_layers = check_positive_int(self.num_layers, "num_layers")
        if self.head_dim is None:
            if self.d_model % self.nhead:
                raise ValueError(
                    f"d_model = {self.d_model} must be divisible by nhead = {self.nhead} (or pass head_dim)"
                )
            self.head_dim = self.d_model // self.nhead
        self.head_dim = check_positive_int(self.head_dim, "head_dim")
        self.dropout = check_probability(self.dropout, "dropout")
        self.attention_dropout = check_probability(
            self.dropout if self.attention_dropout is None else self.attention_dropout, "attention_dropout"
        )
        self.activation_dropout = check_probability(
            self.dropout if self.activation_dropout is None else self.activation_dropout, "activation_dropout"
        )
        activation_fn(self.activation)
        self.layer_norm_eps = check_positive_float(self.layer_norm_eps, "layer_norm_eps (torch's LayerNorm eps)")
        for name in ("batch_first", "norm_first", "bias", "fused_norm", "final_norm", "norm_affine"):
            _check_bool(getattr(self, name), name)
        self.qkv_bias = self.bias if self.qkv_bias is None else _check_bool(self.qkv_bias, "qkv_bias")
        # torch's nn.LayerNorm(elementwise_affine=False) has neither weight nor bias
        self.norm_bias = (self.bias if self.norm_bias is None else _check_bool(self.norm_bias, "norm_bias")) \
            and self.norm_affine
        if self.final_norm_affine is None:
            self.final_norm_affine = self.norm_affine
        _check_bool(self.final_norm_affine, "final_norm_affine")
        self.final_norm_bias = (
            self.norm_bias if self.final_norm_bias is None else _check_bool(self.final_norm_bias, "final_norm_bias")
        ) and self.final_norm_affine
        self.dtype = self.dtype or torch.get_default_dtype()

    # -- builders ---------------------------------------------------------------------------
    def pc(self, *shape, fill=0.0) -> PiecewiseConstant:
        n = self.num_layers
        return PiecewiseConstant(
            torch.full((n, *shape), fill, device=self.device, dtype=self.dtype), t0=0.0, t1=float(n)
        )

    def attention(self, **kwargs) -> MultiHeadAttention:
        E, H, d, qb = self.d_model, self.nhead, self.head_dim, self.qkv_bias
        return MultiHeadAttention(
            self.pc(E, H, d), self.pc(E, H, d), self.pc(E, H, d), self.pc(H, d, E),
            bQ=self.pc(H, d) if qb else None, bK=self.pc(H, d) if qb else None,
            bV=self.pc(H, d) if qb else None, bO=self.pc(E) if self.bias else None,
            scale=1.0 / math.sqrt(d), dropout=self.attention_dropout, **kwargs,
        )

    def ffn(self) -> FeedForward:
        E, Fz = self.d_model, self.dim_feedforward
        return FeedForward(
            self.pc(E, Fz), self.pc(Fz) if self.bias else None, self.pc(Fz, E), self.pc(E) if self.bias else None,
            activation=self.activation, dropout=self.activation_dropout,
        )

    def layer_norm(self, stacked: bool = True):
        """``nn.LayerNorm(d_model, eps, elementwise_affine, bias)``: projection + affine, fused
        (one ``F.layer_norm``) or as two maps (the core projection's resolvent, then the
        affine).  The layers' norms (``stacked=True``, one value per layer) follow
        ``norm_affine`` / ``norm_bias``; the final norm (``stacked=False``) follows
        ``final_norm_affine`` / ``final_norm_bias``.  Without ``elementwise_affine`` the norm
        is exactly the :math:`S_1(0, 1)` projection with :math:`\varepsilon` (unfused: that
        projection alone); without bias the affine map has no shift."""
        E = self.d_model
        affine, bias = (self.norm_affine, self.norm_bias) if stacked else (self.final_norm_affine, self.final_norm_bias)
        w = b = None
        if stacked:
            if affine:
                w = self.pc(E, fill=1.0)
            if bias:
                b = self.pc(E)
        else:
            if affine:
                w = nn.Parameter(torch.ones(E, device=self.device, dtype=self.dtype))
            if bias:
                b = nn.Parameter(torch.zeros(E, device=self.device, dtype=self.dtype))
        P = ProjectionS1(0.0, 1.0, eps=self.layer_norm_eps)
        if not self.fused_norm:
            return [P, PointwiseAffine(w, b)] if affine else [P]
        return PointwiseAffine(w, b, projection=P)


def _check_mask_kind(mask, name: str, true_means: str, float_means: str) -> None:
    """A torch mask is a bool tensor (``true_means``) or a float one (``float_means``)."""
    if not isinstance(mask, Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor (bool or float) or None, got {type(mask).__name__}")
    if mask.dtype != torch.bool and not mask.is_floating_point():
        raise TypeError(f"{name}: expected a bool mask ({true_means}) or a float mask{float_means}, got dtype "
                        f"{mask.dtype}")


class _TorchExact(Propagator):
    """Shared construction (torch's layer arguments, plus opsplit's) and input handling of
    the torch-exact models (layouts, masks, checks); a subclass builds its scheme from the
    :class:`LayerConfig` (``_build``)."""

    def __init__(
        self,
        d_model: int,
        nhead: int,
        dim_feedforward: int = 2048,
        dropout: float = 0.1,
        activation: str = "relu",
        layer_norm_eps: float = 1e-5,
        batch_first: bool = False,
        norm_first: bool = False,
        bias: bool = True,
        *,
        num_layers: int = 1,
        final_norm: bool = False,
        head_dim: int | None = None,
        qkv_bias: bool | None = None,
        fused_norm: bool = True,
        attention_dropout: float | None = None,
        activation_dropout: float | None = None,
        norm_affine: bool = True,
        norm_bias: bool | None = None,
        final_norm_affine: bool | None = None,
        final_norm_bias: bool | None = None,
        device=None,
        dtype=None,
    ):
        cfg = LayerConfig(
            d_model, nhead, dim_feedforward, dropout, activation, layer_norm_eps, batch_first, norm_first, bias,
            num_layers=num_layers, head_dim=head_dim, qkv_bias=qkv_bias, fused_norm=fused_norm,
            final_norm=final_norm, device=device, dtype=dtype, attention_dropout=attention_dropout,
            activation_dropout=activation_dropout, norm_affine=norm_affine, norm_bias=norm_bias,
            final_norm_affine=final_norm_affine, final_norm_bias=final_norm_bias,
        )
        scheme, norms, parts = self._build(cfg)
        super().__init__(scheme, cfg.num_layers, t0=0.0, t1=float(cfg.num_layers),
                         grid=Grid.paper(None, cfg.d_model, nh=cfg.nhead))
        self.config = cfg
        for k in ("d_model", "nhead", "dim_feedforward", "num_layers", "head_dim", "activation",
                  "layer_norm_eps", "batch_first", "norm_first", "bias", "qkv_bias", "fused_norm",
                  "attention_dropout", "activation_dropout", "norm_affine", "norm_bias",
                  "final_norm_affine", "final_norm_bias"):
            setattr(self, k, getattr(cfg, k))
        self.dropout_p = cfg.dropout
        # named access to the scheme's operators (not registered twice: they live in the scheme)
        self.__dict__["_parts"] = {"norms": tuple(norms)}
        fn = cfg.layer_norm(stacked=False) if cfg.final_norm else None
        self.final_norm = nn.ModuleList(fn) if isinstance(fn, list) else fn
        self.check_finite_input = True
        self._parts.update(parts)
        self.reset_parameters()

    def _build(self, cfg: LayerConfig) -> tuple:  # pragma: no cover - abstract
        """``(scheme, norms, named operators)`` of one layer built from ``cfg``."""
        raise NotImplementedError

    @staticmethod
    def _affine_of(norm) -> PointwiseAffine | None:
        n = norm[-1] if isinstance(norm, (list, tuple, nn.ModuleList)) else norm
        return n if isinstance(n, PointwiseAffine) else None

    @property
    def final_affine(self) -> PointwiseAffine | None:
        """The affine map of the final LayerNorm (``None`` without a final norm, or for an
        unfused one without ``elementwise_affine``)."""
        fn = self.final_norm
        return None if fn is None else self._affine_of(fn)

    @property
    def final_projection(self) -> ProjectionS1 | None:
        """The S1 projection of the final LayerNorm (its ``eps`` is torch's)."""
        fn = self.final_norm
        if fn is None:
            return None
        return fn[0] if isinstance(fn, nn.ModuleList) else fn.projection

    @property
    def ffn(self) -> FeedForward:
        return self._parts["ffn"]

    def norm(self, i: int) -> PointwiseAffine | None:
        """The affine part (with the projection when fused) of the layer's ``i``-th LayerNorm
        (1-based, as torch's ``norm1``, ``norm2``, ``norm3``); ``None`` for an unfused norm
        without ``elementwise_affine`` (the projection alone)."""
        return self._affine_of(self._parts["norms"][i - 1])

    # -- inputs ---------------------------------------------------------------------------------
    def _check_dtype(self, x: Tensor, name: str) -> None:
        if not isinstance(x, Tensor):
            raise TypeError(f"{name}: expected a torch.Tensor, got {type(x).__name__}")
        if not x.is_floating_point():
            raise TypeError(f"{name}: expected a floating-point tensor, got dtype {x.dtype}")
        p = next(self.parameters(), None)
        if p is not None and p.dtype != x.dtype:
            raise TypeError(
                f"{name}: dtype {x.dtype} differs from the model's {p.dtype} "
                f"(convert the model with .to({x.dtype}) or the input with .to({p.dtype}))"
            )
        self._check_device(x, name)

    def _check_device(self, x: Tensor, name: str) -> None:
        p = next(self.parameters(), None)
        if p is not None and x.device != p.device:
            raise TypeError(
                f"{name}: on device {x.device}, the model is on {p.device} (move one with .to(device))"
            )

    def _check_mask_values(self, mask: Tensor, name: str) -> None:
        """Device, and no NaN or +inf in a float mask (it is added to the scores: -inf masks a
        key out, NaN or +inf would make the attention weights NaN)."""
        self._check_device(mask, name)
        if (self.check_finite_input and mask.is_floating_point() and not skip_value_checks()
                and bool(torch.any(torch.isnan(mask) | (mask == float("inf"))))):
            raise ValueError(f"{name}: a float mask must hold finite values or -inf, found NaN or +inf")

    @staticmethod
    def _check_causal(flag, name: str) -> bool:
        if flag is not None and not isinstance(flag, bool):
            raise TypeError(f"{name}: expected a bool or None, got {type(flag).__name__} {flag!r}")
        return bool(flag)

    def _to_state(self, x: Tensor, name: str) -> tuple[Tensor, bool]:
        """torch layout -> opsplit state (B, N, E); returns (state, unbatched)."""
        self._check_dtype(x, name)
        if x.dim() == 2:
            x, unbatched = x.unsqueeze(0), True
        elif x.dim() == 3:
            unbatched = False
            if not self.batch_first:
                x = x.transpose(0, 1)
        else:
            layout = "(B, N, d_model)" if self.batch_first else "(N, B, d_model)"
            raise ValueError(
                f"{name}: expected shape {layout} or unbatched (N, d_model), got {tuple(x.shape)}"
            )
        if x.shape[-1] != self.d_model:
            raise ValueError(
                f"{name}: expected d_model = {self.d_model} features in the last dimension, got "
                f"{x.shape[-1]} (shape {tuple(x.shape)})"
            )
        if x.shape[1] == 0:
            raise ValueError(f"{name}: expected at least one token (N >= 1), got shape {tuple(x.shape)}")
        return x, unbatched

    def _from_state(self, u: Tensor, unbatched: bool) -> Tensor:
        if unbatched:
            return u.squeeze(0)
        return u if self.batch_first else u.transpose(0, 1)

    def _mask(self, mask, name: str, B: int, Nq: int, Nk: int, unbatched: bool, causal: bool, device):
        """Validate a torch attention mask; build the causal one when asked with none given."""
        if mask is None:
            if causal:
                return torch.ones(Nq, Nk, dtype=torch.bool, device=device).triu_(1)
            return None
        _check_mask_kind(mask, name, "True = not attended", " (added to the scores)")
        check_attn_mask(mask, name, B, self.nhead, Nq, Nk)
        self._check_mask_values(mask, name)
        return mask

    def _kpm(self, mask, name: str, B: int, Nk: int, unbatched: bool):
        if mask is None:
            return None
        _check_mask_kind(mask, name, "True = padding", "")
        if unbatched and mask.dim() == 1:
            mask = mask.unsqueeze(0)
        check_key_padding_mask(mask, name, B, Nk)
        self._check_mask_values(mask, name)
        return mask

    def _finish(self, u: Tensor, grid) -> Tensor:
        fn = getattr(self, "final_norm", None)
        if fn is None:
            return u
        for n in fn if isinstance(fn, nn.ModuleList) else [fn]:
            u = n.flow(self.t1, 1.0, u, grid) if n.has_flow else n.resolvent(self.t1, 1.0, u, grid)
        return u

    # -- parameters -----------------------------------------------------------------------------
    @torch.no_grad()
    def reset_parameters(self) -> None:
        """torch's initialisation (in distribution): Xavier-uniform in-projections, zero
        attention biases, ``nn.Linear`` defaults elsewhere, LayerNorm weight 1 / bias 0."""
        for m in self.modules():
            if isinstance(m, (MultiHeadAttention, FeedForward)):
                m.reset_parameters()
        for m in self.modules():
            if isinstance(m, PointwiseAffine):
                for c, v in ((m.weight, 1.0), (m.bias, 0.0)):
                    if isinstance(c, PiecewiseConstant):
                        c.raw.fill_(v)
                    elif isinstance(c, nn.Parameter):
                        c.fill_(v)

    def extra_repr(self) -> str:
        return (
            f"d_model={self.d_model}, nhead={self.nhead}, dim_feedforward={self.dim_feedforward}, "
            f"num_layers={self.num_layers}, activation={self.activation!r}, norm_first={self.norm_first}, "
            f"batch_first={self.batch_first}, bias={self.bias}, " + super().extra_repr()
        )


class TorchEncoder(_TorchExact):
    r"""``nn.TransformerEncoderLayer`` / ``nn.TransformerEncoder`` as an opsplit propagator:
    :math:`N_t` = ``num_layers`` steps of :func:`encoder_layer_scheme`.

    The constructor takes ``nn.TransformerEncoderLayer``'s arguments, plus:

    Args:
        num_layers: :math:`N_t` (``nn.TransformerEncoder``'s ``num_layers``).
        final_norm: apply a final LayerNorm after the last step (``nn.TransformerEncoder``'s
            ``norm``).
        head_dim: head size (default ``d_model // nhead``; ViT configs may differ).
        qkv_bias: bias of the Q/K/V projections (default ``bias``).
        fused_norm: compute each LayerNorm with ``F.layer_norm`` (the same formula, one
            kernel) or as the core projection's resolvent followed by the affine map.
        attention_dropout: dropout on the attention weights (default ``dropout``, as torch).
        activation_dropout: dropout on the FFN's hidden activation (default ``dropout``, as
            torch; 0 for Hugging Face ViT, whose MLP has none).
        norm_affine, norm_bias: the layers' LayerNorms have a weight (``elementwise_affine``)
            and a bias (default ``bias``; never without ``norm_affine``).
        final_norm_affine, final_norm_bias: the same for the final LayerNorm (default: as the
            layers').

    ``forward(src, mask=None, src_key_padding_mask=None, is_causal=None)`` takes and returns
    what torch's module does (layout per ``batch_first``; unbatched ``(N, d_model)`` too).
    Masks follow torch's conventions.  ``is_causal=True`` without a mask applies the causal
    mask (torch requires the mask itself).  ``n_steps=`` solves the same continuous model
    with another :math:`N_t`.
    """

    def _build(self, cfg: LayerConfig) -> tuple:
        attention = cfg.attention(attn_mask="src_mask", key_padding_mask="src_key_padding_mask")
        ffn = cfg.ffn()
        norm1, norm2 = cfg.layer_norm(), cfg.layer_norm()
        scheme = encoder_layer_scheme(attention, ffn, norm1, norm2, norm_first=cfg.norm_first, dropout=cfg.dropout)
        return scheme, (norm1, norm2), {"attention": attention, "ffn": ffn}

    @property
    def attention(self) -> MultiHeadAttention:
        return self._parts["attention"]

    def forward(self, src: Tensor, mask: Tensor | None = None, src_key_padding_mask: Tensor | None = None,
                is_causal: bool | None = None, *, src_mask: Tensor | None = None, n_steps: int | None = None) -> Tensor:
        if src_mask is not None:
            if mask is not None:
                raise ValueError("TorchEncoder: give the attention mask as `mask` or `src_mask`, not both")
            mask = src_mask
        u, unbatched = self._to_state(src, "src")
        B, N = u.shape[0], u.shape[1]
        mask = self._mask(mask, "src_mask", B, N, N, unbatched, self._check_causal(is_causal, "is_causal"), u.device)
        kpm = self._kpm(src_key_padding_mask, "src_key_padding_mask", B, N, unbatched)
        grid = self.grid
        if mask is not None or kpm is not None:
            grid = ContextGrid.of(grid, src_mask=mask, src_key_padding_mask=kpm)
        g = grid.with_shape(N, self.d_model)
        u = super().forward(u, n_steps=n_steps, grid=g, check_finite_input=self.check_finite_input)
        return self._from_state(self._finish(u, g), unbatched)


class TorchDecoder(_TorchExact):
    r"""``nn.TransformerDecoderLayer`` / ``nn.TransformerDecoder`` as an opsplit propagator
    (the coupled evolution of the module docstring, memory frozen).

    Constructor as :class:`TorchEncoder`.  ``forward(tgt, memory, tgt_mask=None,
    memory_mask=None, tgt_key_padding_mask=None, memory_key_padding_mask=None,
    tgt_is_causal=None, memory_is_causal=False)`` as torch's module.
    """

    def _build(self, cfg: LayerConfig) -> tuple:
        self_attention = cfg.attention(attn_mask="tgt_mask", key_padding_mask="tgt_key_padding_mask")
        cross_attention = cfg.attention(
            memory="memory", attn_mask="memory_mask", key_padding_mask="memory_key_padding_mask"
        )
        ffn = cfg.ffn()
        norms = (cfg.layer_norm(), cfg.layer_norm(), cfg.layer_norm())
        scheme = decoder_layer_scheme(self_attention, cross_attention, ffn, *norms, norm_first=cfg.norm_first,
                                      dropout=cfg.dropout)
        return scheme, norms, {"self_attention": self_attention, "cross_attention": cross_attention, "ffn": ffn}

    @property
    def self_attention(self) -> MultiHeadAttention:
        return self._parts["self_attention"]

    @property
    def cross_attention(self) -> MultiHeadAttention:
        return self._parts["cross_attention"]

    def forward(
        self,
        tgt: Tensor,
        memory: Tensor,
        tgt_mask: Tensor | None = None,
        memory_mask: Tensor | None = None,
        tgt_key_padding_mask: Tensor | None = None,
        memory_key_padding_mask: Tensor | None = None,
        tgt_is_causal: bool | None = None,
        memory_is_causal: bool = False,
        *,
        n_steps: int | None = None,
    ) -> Tensor:
        u, unbatched = self._to_state(tgt, "tgt")
        m, m_unbatched = self._to_state(memory, "memory")
        if m_unbatched != unbatched or m.shape[0] != u.shape[0]:
            raise ValueError(
                f"memory: expected the batch of tgt ({'unbatched' if unbatched else u.shape[0]}), got "
                f"shape {tuple(memory.shape)} (batch_first={self.batch_first})"
            )
        B, N, S = u.shape[0], u.shape[1], m.shape[1]
        tgt_mask = self._mask(tgt_mask, "tgt_mask", B, N, N, unbatched, self._check_causal(tgt_is_causal, "tgt_is_causal"),
                              u.device)
        memory_mask = self._mask(memory_mask, "memory_mask", B, N, S, unbatched,
                                 self._check_causal(memory_is_causal, "memory_is_causal"), u.device)
        tkpm = self._kpm(tgt_key_padding_mask, "tgt_key_padding_mask", B, N, unbatched)
        mkpm = self._kpm(memory_key_padding_mask, "memory_key_padding_mask", B, S, unbatched)
        if self.check_finite_input:
            check_finite(m, "memory")
        grid = ContextGrid.of(
            self.grid, memory=m, tgt_mask=tgt_mask, memory_mask=memory_mask,
            tgt_key_padding_mask=tkpm, memory_key_padding_mask=mkpm,
        )
        g = grid.with_shape(N, self.d_model)
        u = Propagator.forward(self, u, n_steps=n_steps, grid=g, check_finite_input=self.check_finite_input)
        return self._from_state(self._finish(u, g), unbatched)
