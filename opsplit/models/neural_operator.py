r"""The continuous transformer as a neural operator: a map between functions on
:math:`\Omega_x = [0, L)` (periodic), solvable on any grid of :math:`\Omega_x`.

.. math::  \mathcal G_\theta = G \circ \bar{\mathcal N}_\theta \circ F, \qquad
           u(x) \;\overset{F}{\longmapsto}\; v_0(x, y) \;\overset{\bar{\mathcal N}}{\longmapsto}\;
           v(x, y, T) \;\overset{G}{\longmapsto}\; w(x)

(paper 002, eq. 36).  :math:`F` and :math:`G` are the pointwise lifting and projection of
:mod:`opsplit.operators.lifting` (positions as periodic functions of :math:`x`); the
propagator :math:`\bar{\mathcal N}` solves

.. math::  v_t = A_{\text{att}}(t; v) + A_{\text{conv}}(t; v) + A_{\text{ffn}}(t; v)

by Lie or Strang splitting (explicit-Euler substeps, in the order convolution,
feed-forward, attention: Strang evaluates the last term, the costliest, once per step and
the others twice), :math:`N_t` steps on :math:`[0, T]`, controls piecewise constant in time
(one weight set per step), with

* :math:`A_{\text{att}}`: the attention integral over :math:`\Omega_x` — Galerkin-type
  (:class:`~opsplit.operators.GalerkinAttention`), Fourier-type
  (:class:`~opsplit.operators.FourierAttention`) or softmax
  (:class:`~opsplit.operators.MultiHeadAttention`, scale :math:`1/\sqrt{d}`);
* :math:`A_{\text{conv}}`: the periodic convolution integral with a kernel that is a
  trigonometric polynomial of the physical offset (:class:`~opsplit.operators.SpectralConvolution`,
  ``modes`` modes): derivatives on the band it resolves (``conv=False`` leaves it out);
* :math:`A_{\text{ffn}}`: the pointwise feed-forward integral operator (GELU).

``attention="none"`` leaves :math:`A_{\text{att}}` out: the attention-free flow of the
convolution integral and the pointwise terms (with ``nonlinearity="map"``, a splitting flow
in the place of FNO's layers :math:`v \leftarrow \sigma(Kv + Wv)`) — the ablation that
isolates the attention integral (its measurements: ``docs/burgers.md``).

**Why it is resolution-invariant by construction.**  Every integral over :math:`\Omega_x`
carries the quadrature weight :math:`h = L/N_x` (the attention integrals, the convolution);
the convolution kernel is a function of the offset in units of :math:`L`, not of a grid
index; the positions are functions of :math:`x`; everything else is pointwise in
:math:`x`.  The discrete model on :math:`N_x` nodes is therefore a quadrature of one
continuous operator, and for a smooth periodic integrand the equal-weight rule converges
spectrally: trained on one grid, it is solved on another without retraining
(measured in ``docs/burgers.md``).  Its input must have more than
:math:`2(\text{modes} - 1)` nodes (fewer would alias the kernel's modes: refused).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from .._checks import (
    check_choice,
    check_dtype_arg,
    check_generator,
    check_parameters_finite,
    check_positive_float,
    check_positive_int,
)
from ..controls import LayerwiseConstant, PiecewiseConstant
from ..grid import Grid, Interval
from ..operators import (
    Activation,
    FeedForward,
    FourierAttention,
    FourierMultiplier,
    GalerkinAttention,
    Lifting,
    MultiHeadAttention,
    Projection,
    SpectralConvolution,
)
from ..operators._guard import check_output
from ..propagator import Propagator
from ..schemes import Lie, Strang

__all__ = ["NeuralOperatorTransformer", "ATTENTIONS", "SCHEMES", "NONLINEARITIES"]


def _eye(n: int, h: int, d: int) -> torch.Tensor:
    """The first ``min(n, h d)`` unit vectors of R^n as an ``(n, h, d)`` head kernel."""
    e = torch.zeros(n, h * d, dtype=torch.float64)
    k = min(n, h * d)
    e[:k, :k] = torch.eye(k, dtype=torch.float64)
    return e.reshape(n, h, d)


def _layerwise(module: nn.Module) -> None:
    """Replace every :class:`~opsplit.controls.PiecewiseConstant` control below ``module`` by
    the same function of time stored one parameter per piece
    (:class:`~opsplit.controls.LayerwiseConstant`)."""
    for mod in list(module.modules()):
        for name, child in list(mod.named_children()):
            if isinstance(child, PiecewiseConstant) and not child.positive:
                setattr(mod, name, LayerwiseConstant(child.values.detach(), t0=child.t0, t1=child.t1, axes=child.axes))

#: the attention integrals the model offers (``"none"``: no attention term)
ATTENTIONS = ("galerkin", "fourier", "softmax", "none")
#: the splitting schemes it offers
SCHEMES = ("lie", "strang")
#: where the model's pointwise nonlinearity is: a feed-forward term (``"ffn"``) or an
#: activation map after the convolution and attention substeps (``"map"``)
NONLINEARITIES = ("ffn", "map")


class NeuralOperatorTransformer(nn.Module):
    r"""The continuous transformer :math:`G \circ \bar{\mathcal N}_\theta \circ F` on a
    periodic :math:`\Omega_x` (see the module docstring).

    Args:
        attention: ``"galerkin"``, ``"fourier"``, ``"softmax"`` or ``"none"`` (no attention
            term: the attention-free flow).
        scheme: ``"lie"`` or ``"strang"``.
        d_model: :math:`N_y`, the features of the state.
        heads: attention heads (``d_model`` must be divisible by it).
        n_steps: :math:`N_t` (one weight set per step).
        T: final time (default ``n_steps``: :math:`\Delta t = 1`).
        modes: the number of Fourier modes of the convolution kernel, :math:`0..M` with
            :math:`M = \text{modes} - 1`.
        d_ff: hidden width of the feed-forward term.
        n_freq: frequencies of the positions.
        hidden: hidden width of the projection.
        conv: include the convolution term.
        length: :math:`L`.
        in_channels, out_channels: channels of the input and output fields.
        output_scale: the initial size of the projection's output layer (relative to
            ``nn.Linear``'s), for a target much smaller than the input (the values measured:
            ``docs/burgers.md``).
        output_modes: when given, the output is band-limited to the Fourier modes
            :math:`0..M` (``output_modes`` = :math:`M + 1`) by a trainable multiplier
            (:class:`~opsplit.operators.FourierMultiplier`, initialised to the orthogonal
            projection): the projection :math:`G` becomes the pointwise map followed by
            that integral operator over :math:`\Omega_x`.  ``None``: the pointwise
            projection alone.
        generator: for a reproducible initialisation.
        device, dtype: factory kwargs.

    ``forward(u)`` takes ``(B, N_x)`` (or ``(B, N_x, C)``) samples at :math:`x_j = jL/N_x`,
    any :math:`N_x \ge 2\,\text{modes} - 1`, and returns ``(B, N_x)`` (or
    ``(B, N_x, C_out)``).
    """

    def __init__(self, attention: str = "galerkin", scheme: str = "strang", *, d_model: int = 64, heads: int = 4,
                 n_steps: int = 4, T: float | None = None, modes: int = 16, d_ff: int = 128, n_freq: int = 4,
                 hidden: int = 128, conv: bool = True, length: float = 1.0, in_channels: int = 1,
                 out_channels: int = 1, output_scale: float = 1.0, nonlinearity: str = "ffn",
                 head_dim: int | None = None, output_modes: int | None = None, generator: torch.Generator | None = None, device=None, dtype=None):
        super().__init__()
        check_choice(attention, ATTENTIONS, "NeuralOperatorTransformer.attention")
        check_choice(scheme, SCHEMES, "NeuralOperatorTransformer.scheme")
        check_choice(nonlinearity, NONLINEARITIES, "NeuralOperatorTransformer.nonlinearity")
        d = check_positive_int(d_model, "NeuralOperatorTransformer.d_model")
        H = check_positive_int(heads, "NeuralOperatorTransformer.heads")
        if head_dim is None:
            if d % H:
                raise ValueError(f"NeuralOperatorTransformer: d_model = {d} is not divisible by heads = {H}; "
                                 "pass head_dim")
            head_dim = d // H
        head_dim = check_positive_int(head_dim, "NeuralOperatorTransformer.head_dim")
        n_t = check_positive_int(n_steps, "NeuralOperatorTransformer.n_steps (N_t)")
        T = float(n_t) if T is None else check_positive_float(T, "NeuralOperatorTransformer.T")
        modes = check_positive_int(modes, "NeuralOperatorTransformer.modes")
        d_ff = check_positive_int(d_ff, "NeuralOperatorTransformer.d_ff")
        length = check_positive_float(length, "NeuralOperatorTransformer.length")
        check_generator(generator, "NeuralOperatorTransformer.generator")
        dtype = check_dtype_arg(dtype, "NeuralOperatorTransformer.dtype")
        fk = {"device": device, "dtype": dtype or torch.get_default_dtype()}
        self.output_scale = check_positive_float(output_scale, "NeuralOperatorTransformer.output_scale")
        self.attention_kind, self.scheme_kind, self.nonlinearity = attention, scheme, nonlinearity
        self.d_model, self.heads, self.modes, self.length = d, H, modes, length
        self.min_nodes = 2 * modes - 1 if conv else 1
        if output_modes is not None:
            output_modes = check_positive_int(output_modes, "NeuralOperatorTransformer.output_modes")
            self.min_nodes = max(self.min_nodes, 2 * output_modes - 1)
        self.lifting = Lifting(in_channels, d, n_freq=n_freq, length=length, rule="left",
                               min_nodes=self.min_nodes, **fk)
        pieces = {"n_pieces": n_t, "t0": 0.0, "t1": T}
        if attention == "none":
            att = None
        elif attention == "softmax":
            att = MultiHeadAttention.create(d, H, head_dim=head_dim, scale=1.0 / math.sqrt(head_dim), **pieces, **fk)
        else:
            cls = GalerkinAttention if attention == "galerkin" else FourierAttention
            att = cls.create(d, H, head_dim=head_dim, **pieces, **fk)
        if nonlinearity == "ffn":
            # the attention last: Strang evaluates the middle term once per step and the outer
            # ones twice, and the attention is the costliest term
            terms = [SpectralConvolution.create(d, modes, **pieces, **fk)] if conv else []
            terms += [FeedForward.create(d, d_ff, activation="gelu", **pieces, **fk)] + ([att] if att else [])
        else:
            # the convolution with its local part, the attention, then the activation map (a
            # map substep: in the middle of a Strang step, applied once)
            terms = [SpectralConvolution.create(d, modes, bias=True, local=True, **pieces, **fk)] + \
                ([att] if att else []) + [Activation("gelu")]
        grid = Grid(x=Interval(length=length, rule="left"), y=Interval.paper(d))
        for op in terms:  # one parameter per step (LayerwiseConstant): no full-size gradient per use
            _layerwise(op)
        sch = Lie(terms) if scheme == "lie" else Strang(terms)
        self.propagator = Propagator(sch, n_t, t0=0.0, t1=T, grid=grid)
        self.projection = Projection(d, hidden, out_channels, **fk)
        self.output_filter = (None if output_modes is None else
                              FourierMultiplier(output_modes, out_channels, **fk))
        self.reset_parameters(generator)

    @torch.no_grad()
    def reset_parameters(self, generator: torch.Generator | None = None) -> None:
        r"""Every weight drawn from ``generator``: the lifting and projection as ``nn.Linear``
        (uniform :math:`\pm 1/\sqrt{\text{fan-in}}`, the projection's output layer times
        ``output_scale``); the attention kernels Xavier-uniform
        with gain ``0.1`` plus ``0.1 I`` on the diagonal — small terms, so that the
        initial flow is close to the identity (Cao's initialisation, larger); the
        convolution's modes uniform in :math:`[0, 1/N_y^2)` (FNO's); the feed-forward
        kernels as ``nn.Linear`` with the output layer scaled by 0.1; biases zero; the
        output multiplier (``output_modes``) the orthogonal projection."""
        def rand(shape):
            return torch.rand(shape, generator=generator, dtype=torch.float64)

        def uniform(shape, bound):
            return (rand(shape) * 2 - 1) * bound

        if self.output_filter is not None:
            self.output_filter.reset_parameters()
        for lin, s in ((self.lifting.linear, 1.0), (self.projection.fc1, 1.0), (self.projection.fc2, self.output_scale)):
            b = 1.0 / math.sqrt(lin.weight.shape[1])
            lin.weight.copy_(uniform(lin.weight.shape, s * b))
            lin.bias.copy_(uniform(lin.bias.shape, s * b))
        for sub in self.propagator.scheme.substeps:
            op = sub.terms[0]
            if isinstance(op, MultiHeadAttention):
                for c in (op.WQ, op.WK, op.WV):
                    n_in, h, dk = c.shape
                    c.fill_(uniform((c.n_pieces, *c.shape), 0.1 * math.sqrt(6.0 / (n_in + h * dk))) + 0.1 * _eye(n_in, h, dk))
                if op.WO is not None:
                    h, dk, n_out = op.WO.shape
                    eye = _eye(n_out, h, dk).permute(1, 2, 0)
                    op.WO.fill_(uniform((op.WO.n_pieces, *op.WO.shape), 0.1 * math.sqrt(6.0 / (h * dk + n_out)))
                                + 0.1 * eye)
                for c in (op.bQ, op.bK, op.bV, op.bO):
                    if c is not None:
                        c.fill_(torch.zeros(c.n_pieces, *c.shape))
                for name in ("gamma_q", "gamma_k", "gamma_v", "beta_q", "beta_k", "beta_v"):
                    c = getattr(op, name, None)
                    if c is not None:
                        c.fill_(torch.full((c.n_pieces, *c.shape), 1.0 if name.startswith("gamma") else 0.0))
            elif isinstance(op, SpectralConvolution):
                w = op.weight
                w.fill_(rand((w.n_pieces, *w.shape)) / w.shape[-1] ** 2)
                if op.local is not None:
                    c = op.local
                    c.fill_(uniform((c.n_pieces, *c.shape), 1.0 / math.sqrt(c.shape[0])))
                if op.bias is not None:
                    c = op.bias
                    c.fill_(uniform((c.n_pieces, *c.shape), 1.0 / math.sqrt(c.shape[0])))
            elif isinstance(op, FeedForward):
                for W, b, s in ((op.W1, op.b1, 1.0), (op.W2, op.b2, 0.1)):
                    W.fill_(uniform((W.n_pieces, *W.shape), s / math.sqrt(W.shape[0])))
                    if b is not None:
                        b.fill_(torch.zeros(b.n_pieces, *b.shape))

    def forward(self, u: Tensor, *, n_steps: int | None = None) -> Tensor:
        """``u`` ``(B, N_x)`` at :math:`x_j = jL/N_x` -> ``(B, N_x)`` (see the class docstring).

        Before any compute: every parameter finite (a NaN/inf is named by its qualified name,
        e.g. ``projection.fc2.weight``; re-read only after it changes), then ``u``
        (:meth:`Lifting.check_input <opsplit.operators.Lifting.check_input>`: shape, dtype,
        nodes, finite, periodic) and the grid against every operator.  The output is checked
        finite; a non-finite one re-reads every parameter first (a NaN written through
        ``.data`` changes no version counter), so such a parameter is named rather than the
        output.  An empty batch gives an empty batch."""
        check_parameters_finite(self, "NeuralOperatorTransformer")
        try:
            v = self.lifting._lift(self.lifting.check_input(u))
            # the parameters are checked above, the lifted field's finiteness with the output
            v = self.propagator(v, n_steps=n_steps, check_finite_input=False)
            w = self.projection._project(v)
            if self.output_filter is not None:
                w = self.output_filter._multiply(w.unsqueeze(-1) if w.dim() == 2 else w)
                w = w.squeeze(-1) if self.projection.out_channels == 1 else w
            check_output(w, "NeuralOperatorTransformer output")
        except ValueError:
            check_parameters_finite(self, "NeuralOperatorTransformer", fresh=True)
            raise
        return w

    def extra_repr(self) -> str:
        return (f"attention={self.attention_kind!r}, scheme={self.scheme_kind!r}, d_model={self.d_model}, "
                f"heads={self.heads}, modes={self.modes}, min_nodes={self.min_nodes}")
