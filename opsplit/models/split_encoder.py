r"""A pre-norm encoder whose splitting scheme and control kind are arguments, and the
pre/post-processing models built on it (paper 002, §4.2, eq. 36).

**Terms.**  One step of the continuous pre-norm encoder
:math:`u_t = \sum_{m=1}^H A_m(\mathrm{LN}_1(u)) + F(\mathrm{LN}_2(u))` has :math:`H + 1`
terms: each attention head :math:`A_m` (a one-head
:class:`~opsplit.operators.MultiHeadAttention` with its own output projection, reading the
normalised state through a shared :class:`~opsplit.operators.PreNorm`) and the
feed-forward term :math:`F` (:class:`~opsplit.operators.FeedForward`).  The sum over heads
is multi-head attention (eq. 38): the heads are terms of the equation.

**Schemes** (``scheme=``), each step of length :math:`\Delta t` with explicit-Euler
substeps unless ``solver`` says otherwise:

======== ============================================================================
lie      every head in turn, then :math:`F` (Appendix C, eq. 58)
strang   heads and :math:`F` in the symmetric order (second-order splitting)
parallel every term from :math:`u^n` with weight :math:`K`, averaged (eq. 59):
         :math:`u + \Delta t(\sum_m A_m + F)` with explicit Euler — the "parallel block"
hybrid   the heads as one parallel group, then :math:`F`: the standard pre-norm layer
         ``x + MHA(LN(x))``, ``x + FFN(LN(x))``
======== ============================================================================

**Controls in time** (``control=``): ``"piecewise_constant"`` (one weight set per step of
:math:`[0, T]` — layers), ``"piecewise_linear"`` (values at :math:`N_t + 1` nodes,
continuous in :math:`t`), ``"legendre"`` / ``"chebyshev"`` / ``"cosine"`` (``n_modes``
coefficients of a smooth basis in :math:`t`; independent of :math:`N_t`).  All start from
the same random layer weights, projected onto the chosen kind
(:func:`opsplit.controls.projection.project_time`).

**Pre/post-processing** (§4.2, eq. 36): :class:`ImageClassifier` is
:math:`G \circ \bar{\mathcal N} \circ F` with :math:`F` the patch embedding with class token
(:class:`~opsplit.models.PatchEmbedding`) and :math:`G` a final LayerNorm and the class-token
read-out (:class:`~opsplit.models.ClassTokenReadout`);  :class:`SequenceForecaster` maps a
window of a scalar series to the next value at every position (seed 001, §5) with a causal
encoder, :math:`F` = per-window normalisation, a linear lift and learned positions, and
:math:`G` = LayerNorm, a linear read-out and the inverse normalisation.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from .._checks import (
    check_choice,
    check_finite,
    check_float_dtype,
    check_like_module,
    check_parameters_finite,
    check_positive_float,
    check_positive_int,
)
from ..controls import LayerwiseConstant, PiecewiseConstant, PiecewiseLinear, TimeBasis
from ..controls.projection import project_time
from ..grid import Grid
from ..operators import FeedForward, MultiHeadAttention, PointwiseAffine, PreNorm, ProjectionS1
from ..operators._guard import check_output
from ..propagator import Propagator
from ..schemes import Hybrid, Lie, Parallel, Strang
from ..solvers import ExplicitEuler, Substep
from .vit import ClassTokenReadout, PatchEmbedding

__all__ = [
    "SCHEMES",
    "CONTROL_KINDS",
    "SplitEncoder",
    "ImageClassifier",
    "SequenceForecaster",
    "convert_time_controls",
]

SCHEMES = ("lie", "strang", "parallel", "hybrid")
CONTROL_KINDS = ("piecewise_constant", "piecewise_linear", "legendre", "chebyshev", "cosine")


def _new_control(kind: str, old: PiecewiseConstant | LayerwiseConstant, n_steps: int, n_modes: int):
    if isinstance(old, LayerwiseConstant):  # the same function of t: its pieces as one table
        old = PiecewiseConstant(torch.stack([p.detach() for p in old.pieces]), t0=old.t0, t1=old.t1,
                                axes=old.axes, requires_grad=False)
    rows = old.raw.detach()
    fk = {"dtype": rows.dtype, "device": rows.device}
    kw = dict(t0=old.t0, t1=old.t1, axes=old.axes)
    if kind == "piecewise_linear":
        new = PiecewiseLinear(torch.zeros(n_steps + 1, *rows.shape[1:], **fk), **kw)
    else:
        new = TimeBasis(torch.zeros(n_modes, *rows.shape[1:], **fk), basis=kind, **kw)
    with torch.no_grad():
        (new.raw if kind == "piecewise_linear" else new.coefficients).copy_(project_time(old, new))
    return new


def convert_time_controls(module: nn.Module, kind: str, *, n_steps: int, n_modes: int = 3) -> nn.Module:
    """Replace every (non-positive) :class:`~opsplit.controls.PiecewiseConstant` or
    :class:`~opsplit.controls.LayerwiseConstant` control inside ``module`` (a
    :class:`~opsplit.models.DecoderLM`'s layer weights are the latter) by a control of
    ``kind`` (:data:`CONTROL_KINDS`), the :math:`L^2` projection of the old one in time.
    Shared controls stay shared.  Returns ``module``."""
    check_choice(kind, CONTROL_KINDS, "control")
    if kind == "piecewise_constant":
        return module
    n_modes = check_positive_int(n_modes, "n_modes")
    memo: dict = {}
    for parent in list(module.modules()):
        for name, child in list(parent.named_children()):
            if (isinstance(child, LayerwiseConstant)
                    or (isinstance(child, PiecewiseConstant) and not child.positive)):
                if id(child) not in memo:
                    memo[id(child)] = _new_control(kind, child, n_steps, n_modes)
                setattr(parent, name, memo[id(child)])
    return module


class SplitEncoder(Propagator):
    r"""The pre-norm encoder of the module docstring as a propagator.

    Args:
        d_model: :math:`N_y`.
        n_heads: :math:`H` (each head a term; ``head_dim = d_model // n_heads``).
        d_ff: hidden width :math:`N_z` of the feed-forward term.
        n_steps: :math:`N_t`.
        T: final time; default ``n_steps`` (:math:`\Delta t = 1`).
        scheme: one of :data:`SCHEMES`.
        control: one of :data:`CONTROL_KINDS`; ``n_modes`` for the smooth bases.
        activation: feed-forward activation (``"gelu"``, ``"relu"``, ...).
        causal: causal attention (each token attends to itself and earlier tokens).
        solver: a substep solver for every term (default explicit Euler; e.g.
            ``ODESolve("rk4")`` for the adjoint gradient mode).
        layer_norm_eps: the LayerNorms' :math:`\varepsilon`.
        batch: the parallel schemes' batching (see :class:`~opsplit.schemes.Parallel`).
        generator: ``torch.Generator`` for the initialisation.
        device, dtype: factory kwargs.
    """

    def __init__(self, d_model: int, n_heads: int, d_ff: int, *, n_steps: int = 4, T: float | None = None,
                 scheme: str = "hybrid", control: str = "piecewise_constant", n_modes: int = 3,
                 activation: str = "gelu", causal: bool = False, solver=None, layer_norm_eps: float = 1e-5,
                 batch="auto", generator: torch.Generator | None = None, device=None, dtype=None):
        d_model = check_positive_int(d_model, "SplitEncoder.d_model")
        n_heads = check_positive_int(n_heads, "SplitEncoder.n_heads")
        d_ff = check_positive_int(d_ff, "SplitEncoder.d_ff")
        n_steps = check_positive_int(n_steps, "SplitEncoder.n_steps (N_t)")
        if d_model % n_heads:
            raise ValueError(f"SplitEncoder: d_model = {d_model} is not divisible by n_heads = {n_heads}")
        check_choice(scheme, SCHEMES, "SplitEncoder.scheme")
        check_choice(control, CONTROL_KINDS, "SplitEncoder.control")
        T = float(n_steps) if T is None else check_positive_float(T, "SplitEncoder.T")
        fk = {"device": device, "dtype": dtype or torch.get_default_dtype()}
        hd = d_model // n_heads

        def pc(*shape, fill=0.0):
            return PiecewiseConstant(torch.full((n_steps, *shape), fill, **fk), t0=0.0, t1=T)

        def layer_norm():
            return PointwiseAffine(pc(d_model, fill=1.0), pc(d_model), projection=ProjectionS1(0.0, 1.0, eps=layer_norm_eps))

        ln1, ln2 = layer_norm(), layer_norm()
        heads = [
            MultiHeadAttention.create(d_model, 1, head_dim=hd, n_pieces=n_steps, t0=0.0, t1=T, causal=causal, **fk)
            for _ in range(n_heads)
        ]
        ffn = FeedForward.create(d_model, d_ff, n_pieces=n_steps, t0=0.0, t1=T, activation=activation, **fk)
        solver = solver if solver is not None else ExplicitEuler()
        head_terms = [Substep(PreNorm(h, ln1), solver) for h in heads]
        ffn_term = Substep(PreNorm(ffn, ln2), solver)
        if scheme == "lie":
            sch = Lie(head_terms + [ffn_term])
        elif scheme == "strang":
            sch = Strang(head_terms + [ffn_term])
        elif scheme == "parallel":
            sch = Parallel(head_terms + [ffn_term], batch=batch)
        else:
            sch = Hybrid([head_terms, [ffn_term]], batch=batch)
        super().__init__(sch, n_steps, t0=0.0, t1=T, grid=Grid.paper(None, d_model))
        self.d_model, self.n_heads, self.d_ff = d_model, n_heads, d_ff
        self.scheme_name, self.control_kind, self.n_modes = scheme, control, n_modes
        # named access (not registered again: the operators live in the scheme)
        self.__dict__.update(_heads=heads, _ffn=ffn, _norms=(ln1, ln2))
        convert_time_controls(self, control, n_steps=n_steps, n_modes=n_modes)
        self.reset_parameters(generator)

    @torch.no_grad()
    def reset_parameters(self, generator: torch.Generator | None = None) -> None:
        """Heads and feed-forward drawn as ``nn.MultiheadAttention`` / ``nn.Linear`` layer
        weights (one draw per step), LayerNorm weight 1 / bias 0; controls of another kind get
        the :math:`L^2` projection of those layer weights."""
        g, n = generator, self.n_steps

        def init(c, bound=None, fill=None):
            shape = (n, *c.shape)
            v = torch.full(shape, float(fill)) if fill is not None else torch.empty(shape, dtype=torch.float64).uniform_(
                -bound, bound, generator=g)
            if isinstance(c, PiecewiseConstant) and c.n_pieces == n:
                c.raw.copy_(v)
                return
            src = PiecewiseConstant(v.to(torch.float64), t0=self.t0, t1=self.t1, requires_grad=False)
            rows = project_time(src, c)
            (c.raw if hasattr(c, "raw") else c.coefficients).copy_(rows)

        for h in self._heads:
            for c in (h.WQ, h.WK, h.WV):
                n_in, hh, d = c.shape
                init(c, math.sqrt(6.0 / (n_in + 3 * hh * d)))
            init(h.WO, 1.0 / math.sqrt(self.d_model))
            for c in (h.bQ, h.bK, h.bV, h.bO):
                init(c, fill=0.0)
        f = self._ffn
        for W, b in ((f.W1, f.b1), (f.W2, f.b2)):
            bound = 1.0 / math.sqrt(W.shape[0])
            init(W, bound)
            init(b, bound)
        for ln in self._norms:
            init(ln.weight, fill=1.0)
            init(ln.bias, fill=0.0)

    def extra_repr(self) -> str:
        return (f"d_model={self.d_model}, n_heads={self.n_heads}, d_ff={self.d_ff}, scheme={self.scheme_name!r}, "
                f"control={self.control_kind!r}, " + super().extra_repr())


class ImageClassifier(nn.Module):
    r""":math:`G \circ \bar{\mathcal N} \circ F` for images (paper 002, §4.2, eq. 36).

    Args:
        image_size, patch_size, num_channels: the patch embedding :math:`F` (a
            :class:`~opsplit.models.PatchEmbedding`).
        n_classes: output size of the read-out :math:`G`.
        encoder: the propagator :math:`\bar{\mathcal N}` (e.g. a :class:`SplitEncoder`);
            its ``d_model`` is the embedding size.
        final_norm: a LayerNorm before the read-out (as ViT).
    """

    def __init__(self, image_size, patch_size, num_channels: int, n_classes: int, encoder: Propagator, *,
                 final_norm: bool = True, device=None, dtype=None):
        super().__init__()
        if not isinstance(encoder, Propagator):
            raise TypeError(f"ImageClassifier.encoder: expected an opsplit Propagator, got {type(encoder).__name__}")
        d = encoder.grid.y.n if encoder.grid.y.n is not None else getattr(encoder, "d_model", None)
        if d is None:
            raise ValueError("ImageClassifier: the encoder's grid must fix N_y (the embedding size)")
        fk = {"device": device, "dtype": dtype}
        self.embedding = PatchEmbedding(image_size, patch_size, num_channels, d, **fk)  # F
        self.encoder = encoder
        self.norm = nn.LayerNorm(d, **fk) if final_norm else None
        self.readout = ClassTokenReadout(d, n_classes, **fk)  # G

    def forward(self, images: Tensor, *, n_steps: int | None = None) -> Tensor:
        """Logits ``(B, n_classes)`` of images ``(B, C, H, W)``.  Every parameter is checked
        finite first (named by its qualified name), then the pixels (``pixel_values``, by the
        embedding); the logits are checked finite, and a non-finite value found anywhere
        re-reads every parameter first (a NaN written through ``.data`` is named)."""
        check_parameters_finite(self, "ImageClassifier")
        try:
            u = self.encoder(self.embedding(images), n_steps=n_steps)
            if self.norm is not None:
                u = self.norm(u)
            out = self.readout(u)
            check_output(out, "ImageClassifier output")
        except ValueError:
            check_parameters_finite(self, "ImageClassifier", fresh=True)
            raise
        return out


class SequenceForecaster(nn.Module):
    r"""Next-value prediction on windows of a scalar series, at every position (causal).

    :math:`F`: the window :math:`x \in \mathbb R^{L}` is normalised,
    :math:`\tilde x = (x - \mu)/s` with the window's mean and standard deviation plus ``eps``
    (``center=False``: :math:`\mu = 0` and :math:`s` the root mean square — the map is then
    equivariant under scaling only, so a homogeneous linear recurrence such as
    :math:`x_{k+1} = 2\cos(h) x_k - x_{k-1}` is representable exactly), lifted :math:`u_0(k, \cdot) = E(\tilde x_{k-p+1}, \dots, \tilde x_k) + b + P_k`
    (a linear map :math:`E` of the last ``delay`` = :math:`p` values — the 1-D analogue of
    ViT's patches, the window's first value repeated before its start — and learned
    positions :math:`P`).
    :math:`\bar{\mathcal N}`: a causal propagator.  :math:`G`: LayerNorm (``final_norm``), a linear read-out
    :math:`r_k`, and :math:`\hat x_{k+1} = \mu + s(\tilde x_k + r_k)` (the read-out predicts
    the normalised increment).

    Args:
        window: :math:`L`, the number of tokens.
        encoder: the propagator (causal attention, e.g. ``SplitEncoder(causal=True)``).
        delay: :math:`p`, the number of past values each token's lift reads (``1``: the value only).
        center: subtract the window mean (else scale by the root mean square only).
        positions: ``"learned"`` (a parameter, initialised small) or ``"sinusoidal"`` (fixed
            sines and cosines of the position, as in the original transformer: relative
            offsets are rotations, which attention can read).
        final_norm: a LayerNorm before the read-out.
    """

    def __init__(self, window: int, encoder: Propagator, *, delay: int = 1, center: bool = True,
                 final_norm: bool = True, positions: str = "learned", eps: float = 1e-3, device=None, dtype=None):
        super().__init__()
        window = check_positive_int(window, "SequenceForecaster.window")
        if not isinstance(encoder, Propagator):
            raise TypeError(f"SequenceForecaster.encoder: expected an opsplit Propagator, got {type(encoder).__name__}")
        d = encoder.grid.y.n if encoder.grid.y.n is not None else getattr(encoder, "d_model", None)
        fk = {"device": device, "dtype": dtype or torch.get_default_dtype()}
        self.window, self.eps = window, float(eps)
        self.delay = check_positive_int(delay, "SequenceForecaster.delay")
        self.lift = nn.Linear(self.delay, d, **fk)
        if positions not in ("learned", "sinusoidal"):
            raise ValueError(f"SequenceForecaster.positions: expected 'learned' or 'sinusoidal', got {positions!r}")
        self.positions = positions
        if positions == "learned":
            self.position = nn.Parameter(torch.empty(window, d, **fk))
        else:
            k = torch.arange(window, dtype=torch.float64)[:, None]
            freq = torch.exp(-math.log(1e4) * torch.arange(0, d, 2, dtype=torch.float64) / d)
            pe = torch.zeros(window, d, dtype=torch.float64)
            pe[:, 0::2] = torch.sin(k * freq)
            pe[:, 1::2] = torch.cos(k * freq)[:, : d // 2]
            self.register_buffer("position", pe.to(**fk))
        self.encoder = encoder
        self.center = bool(center)
        self.norm = nn.LayerNorm(d, **fk) if final_norm else None
        self.readout = nn.Linear(d, 1, **fk)
        self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self) -> None:
        self.lift.reset_parameters()
        if self.positions == "learned":
            nn.init.normal_(self.position, std=0.02)
        if self.norm is not None:
            self.norm.reset_parameters()
        self.readout.reset_parameters()
        self.readout.weight.mul_(0.1)
        self.readout.bias.zero_()

    def forward(self, x: Tensor, *, n_steps: int | None = None) -> Tensor:
        """Predictions ``(B, L)`` from windows ``x`` ``(B, L)``.  Before any compute: every
        parameter finite (named by its qualified name), ``x``'s shape, floating dtype (the
        model's), device and finite values; the output is checked finite (a non-finite one
        re-reads every parameter first)."""
        if not isinstance(x, Tensor) or x.dim() != 2 or x.shape[1] != self.window:
            shape = tuple(x.shape) if isinstance(x, Tensor) else type(x).__name__
            raise ValueError(f"SequenceForecaster: expected windows of shape (B, {self.window}), got {shape}")
        check_float_dtype(x, "SequenceForecaster: x")
        check_like_module(x, self, "SequenceForecaster: x", "the SequenceForecaster")
        check_parameters_finite(self, "SequenceForecaster")
        check_finite(x, "SequenceForecaster: x")
        try:
            out = self._forecast(x, n_steps)
            check_output(out, "SequenceForecaster output")
        except ValueError:
            check_parameters_finite(self, "SequenceForecaster", fresh=True)
            raise
        return out

    def _forecast(self, x: Tensor, n_steps: int | None) -> Tensor:
        if self.center:
            mu = x.mean(1, keepdim=True)
            # (an empty batch: torch's std warns of zero degrees of freedom; its result is empty)
            s = (x.std(1, keepdim=True) if x.shape[0] else x[:, :1]) + self.eps
        else:
            mu = torch.zeros_like(x[:, :1])
            s = x.square().mean(1, keepdim=True).sqrt() + self.eps
        xt = (x - mu) / s
        if self.delay > 1:
            pad = xt[:, :1].expand(-1, self.delay - 1)
            lagged = torch.cat([pad, xt], dim=1).unfold(1, self.delay, 1)  # (B, L, p), last = x_k
        else:
            lagged = xt.unsqueeze(-1)
        u = self.lift(lagged) + self.position
        u = self.encoder(u, n_steps=n_steps)
        r = self.readout(u if self.norm is None else self.norm(u)).squeeze(-1)
        return mu + s * (xt + r)
