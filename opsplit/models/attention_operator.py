r"""A continuous-time attention neural operator on a 1-D periodic domain or the unit square:
:math:`\mathcal G_\theta = G \circ \bar{\mathcal N}_\theta \circ F` (paper 002, eq. 36) where
the propagator solves one **unsplit** ordinary differential equation in time,

.. math::  v_t = A_{\text{att}}(t; v) + A_{\text{sg}}(t; v), \qquad t \in [0, T],

with controls :math:`\theta(t)` that are smooth functions of :math:`t` (Legendre series;
one coefficient: constant in time), solved by explicit Euler, Heun or RK4 on
:math:`N_t` steps of :math:`\Delta t = T/N_t`:

* :math:`A_{\text{att}}`: an attention integral over :math:`\Omega_x` — Galerkin-type
  (:class:`~opsplit.operators.GalerkinAttention`, Cao 2021: :math:`Q\int\tilde K^\top\tilde V`)
  or Fourier-type (:class:`~opsplit.operators.FourierAttention`), or none;
* :math:`A_{\text{sg}}`: the gated spectral feed-forward term
  (:class:`~opsplit.operators.SpectralGatedFeedForward`): :math:`W_2[\sigma(a)\odot b]`,
  :math:`(a, b) = \kappa * v + W_1 v + b_1`, a convolution integral whose kernel is a
  trigonometric polynomial of the physical offset.

Both terms are summed into one vector field (:class:`~opsplit.operators.FieldSum`), so the
model is a neural ODE in :math:`t`, not a composition of layers: its solves at
:math:`2N_t` and :math:`4N_t`, or with another solver (:func:`opsplit.control.solved_with`),
approximate the same flow.  Whether they give the same answers is a property of the trained
controls, and is measured (``docs/burgers.md``); training with :math:`N_t` drawn per step is
what keeps it (``forward(u, n_steps=...)``).

**The domains.**

* ``dims=1``: :math:`\Omega_x = [0, L)` periodic, inputs ``(B, N)`` or ``(B, N, C)`` at
  :math:`x_j = jL/N`.  The lifting :math:`F` is :class:`~opsplit.operators.Lifting` (the
  field and periodic positions, pointwise).  With ``latent = n`` the lifted field is
  represented by its Fourier modes :math:`|m| < n/2` on a grid of ``n`` nodes (its
  trigonometric interpolant: the :math:`L^2` projection onto those modes, an integral over
  :math:`\Omega_x` whose quadrature converges on every input grid), the flow runs there, and
  the output, a trigonometric polynomial, is evaluated at the input's nodes.  The latent
  grid is a fixed discretisation of the flow in :math:`x`, whatever the input's grid.
* ``dims=2``: :math:`\Omega_x = [0, 1]^2` with nodes :math:`(i, j)/(N - 1)` (boundary
  included; Darcy's layout), inputs ``(B, N, N)`` or ``(B, N, N, C)``.  The lifting maps
  :math:`(u, x, y)` pointwise; the lifted field is extended by zero to the periodic box
  :math:`[0, 1 + \delta)^2` (``padding`` = :math:`\delta`, a length: the same box on every
  grid, :math:`(N - 1)(1 + \delta)` nodes per side, which must be an integer — :math:`\delta
  = 1/7` gives 96, 160, 240, 480 nodes at :math:`N` = 85, 141, 211, 421), the flow runs
  on the box, and the square's nodes are read back.  ``dirichlet=True`` multiplies the output
  by :math:`16\,x(1 - x)\,y(1 - y)`: zero on the boundary, as the solution of a Dirichlet
  problem is.

The projection :math:`G` is :class:`~opsplit.operators.Projection` (pointwise, GELU);
``output_modes`` (1-D) band-limits the output to the modes :math:`0..M-1`.
"""

from __future__ import annotations

import math
from fractions import Fraction

import torch
from torch import Tensor, nn

from .._checks import (
    check_dtype_arg,
    check_finite,
    check_float_dtype,
    check_generator,
    check_parameters_finite,
    check_positive_float,
    check_positive_int,
    check_tensor,
)
from ..grid import Grid, ImageGrid, Interval
from ..operators import (
    FieldSum,
    FourierAttention,
    GalerkinAttention,
    Lifting,
    Projection,
    SpectralGatedFeedForward,
)
from ..operators._guard import check_output
from ..operators.spectral_gated_ffn import time_control
from ..propagator import Propagator
from ..schemes import Lie
from ..solvers import EXPLICIT_SOLVERS, Substep, solver_class

__all__ = ["AttentionNeuralOperator", "ATTENTIONS", "band_limit"]

#: the attention integrals the model offers (``"none"``: the flow of the feed-forward term alone)
ATTENTIONS = ("galerkin", "fourier", "none")


def band_limit(w: Tensor, n_out: int, modes: int) -> Tensor:
    r"""Samples ``w`` ``(B, n, C)`` of a periodic function -> the samples at ``n_out`` nodes of
    its modes :math:`0..\text{modes}-1` (the trigonometric interpolant of those modes; the
    DFT along dimension 1).  An empty batch gives an empty batch."""
    B, n, C = w.shape
    if B == 0:
        return w.new_zeros(0, n_out, C) + 0.0 * w.sum()
    W = torch.fft.rfft(w, dim=1)[:, :modes]
    return torch.fft.irfft(W, n=n_out, dim=1) * (n_out / n)


def _xavier(shape_in: int, shape_out: int, rand) -> Tensor:
    bound = 0.1 * math.sqrt(6.0 / (shape_in + shape_out))
    return (rand() * 2 - 1) * bound


class AttentionNeuralOperator(nn.Module):
    r"""The continuous-time attention neural operator of the module docstring.

    Args:
        dims: 1 (periodic :math:`[0, L)`) or 2 (the unit square).
        attention: ``"galerkin"``, ``"fourier"`` or ``"none"``.
        d_model: :math:`N_y`, the state's features.
        heads, head_dim: attention heads and their size.
        modes: :math:`M`, the convolution kernel's modes per axis.
        hidden: :math:`F`, the gated term's hidden width (default ``d_model``).
        n_steps: :math:`N_t` of the default solve; T: the final time.
        solver: ``"euler"``, ``"heun"`` or ``"rk4"``.
        time_modes: Legendre coefficients in :math:`t` of every control (1: constant in time).
        in_channels, out_channels: channels of the input and output fields.
        latent: (1-D) nodes of the latent grid (``None``: the flow runs on the input's grid).
        n_freq: (1-D) frequencies of the periodic positions; length: (1-D) :math:`L`.
        padding: (2-D) :math:`\delta`, the periodic box's extension (a length).
        dirichlet: (2-D) multiply the output by :math:`16x(1-x)y(1-y)`.
        proj_hidden: hidden width of the projection.
        output_scale: initial size of the projection's output layer (relative to
            ``nn.Linear``'s).
        output_modes: (1-D) band-limit the output to the modes :math:`0..M-1`.
        ffn_out_scale: the initial size of the gated term's output map ``W2``.
        generator, device, dtype: initialisation and factory kwargs.
    """

    def __init__(self, dims: int = 1, attention: str = "galerkin", *, d_model: int = 48, heads: int = 1,
                 head_dim: int = 16, modes: int = 16, hidden: int | None = None, n_steps: int = 1, T: float = 1.0,
                 solver: str = "rk4", time_modes: int = 1, in_channels: int = 1, out_channels: int = 1,
                 latent: int | None = None, n_freq: int = 4, length: float = 1.0, padding: float = 1 / 7,
                 dirichlet: bool = False, proj_hidden: int = 128, output_scale: float = 1.0,
                 output_modes: int | None = None, ffn_out_scale: float = 1.0,
                 generator: torch.Generator | None = None, device=None, dtype=None):
        super().__init__()
        who = "AttentionNeuralOperator"
        if dims not in (1, 2) or isinstance(dims, bool):
            raise ValueError(f"{who}.dims: expected 1 or 2, got {dims!r}")
        if attention not in ATTENTIONS:
            raise ValueError(f"{who}.attention: expected one of {ATTENTIONS}, got {attention!r}")
        if solver not in EXPLICIT_SOLVERS:
            raise ValueError(f"{who}.solver: expected one of {EXPLICIT_SOLVERS}, got {solver!r}")
        d = check_positive_int(d_model, f"{who}.d_model")
        H = check_positive_int(heads, f"{who}.heads")
        dh = check_positive_int(head_dim, f"{who}.head_dim")
        modes = check_positive_int(modes, f"{who}.modes")
        hidden = d if hidden is None else check_positive_int(hidden, f"{who}.hidden")
        self.n_steps = check_positive_int(n_steps, f"{who}.n_steps (N_t)")
        T = check_positive_float(T, f"{who}.T")
        time_modes = check_positive_int(time_modes, f"{who}.time_modes")
        in_channels = check_positive_int(in_channels, f"{who}.in_channels")
        out_channels = check_positive_int(out_channels, f"{who}.out_channels")
        proj_hidden = check_positive_int(proj_hidden, f"{who}.proj_hidden")
        self.output_scale = check_positive_float(output_scale, f"{who}.output_scale")
        ffn_out_scale = check_positive_float(ffn_out_scale, f"{who}.ffn_out_scale")
        check_generator(generator, f"{who}.generator")
        dtype = check_dtype_arg(dtype, f"{who}.dtype") or torch.get_default_dtype()
        fk = {"device": device, "dtype": dtype}
        self.dims, self.attention_kind, self.solver_name = dims, attention, solver
        self.d_model, self.modes, self.in_channels, self.out_channels = d, modes, in_channels, out_channels
        self.T = T
        if dims == 1:
            if latent is not None:
                latent = check_positive_int(latent, f"{who}.latent")
                if latent < 2 * modes:
                    raise ValueError(f"{who}.latent: expected at least 2 * modes = {2 * modes} nodes (the latent "
                                     f"grid must carry the kernel's {modes} modes), got {latent}")
            if output_modes is not None:
                output_modes = check_positive_int(output_modes, f"{who}.output_modes")
            self.latent, self.output_modes = latent, output_modes
            self.length = check_positive_float(length, f"{who}.length")
            need = [2 * modes - 1] if latent is None else [latent - 1]
            if output_modes is not None:
                need.append(2 * output_modes - 1)
            self.min_nodes = max(need)
            self.lifting = Lifting(in_channels, d, n_freq=n_freq, length=self.length, rule="left",
                                   min_nodes=self.min_nodes, **fk)
            self.padding, self.dirichlet = None, False
        else:
            if latent is not None or output_modes is not None:
                raise ValueError(f"{who}: latent and output_modes are options of the 1-D model (dims=1)")
            self.padding = check_positive_float(padding, f"{who}.padding")
            self._pad = Fraction(self.padding).limit_denominator(1000)
            if not math.isclose(float(self._pad), self.padding, rel_tol=1e-12, abs_tol=1e-15):
                raise ValueError(f"{who}.padding: expected a rational length p/q with q <= 1000 (the box must have "
                                 f"a whole number of nodes on some grids), got {padding!r}")
            if not isinstance(dirichlet, bool):
                raise TypeError(f"{who}.dirichlet: expected true or false, got {dirichlet!r}")
            self.dirichlet, self.latent, self.output_modes = dirichlet, None, None
            self.min_nodes = self._pad.denominator + 1
            self.lifting2d = nn.Linear(in_channels + 2, d, **fk)
        ffn = SpectralGatedFeedForward.create(d, modes, hidden=hidden, dims=dims, t1=T, time_modes=time_modes,
                                              out_scale=ffn_out_scale, generator=generator, **fk)
        terms = [ffn]
        if attention != "none":
            terms.append(self._attention(attention, d, H, dh, T, time_modes, generator, fk))
        self.field = FieldSum(*terms)
        scheme = Lie([Substep(self.field, solver_class(solver, f"{who}.solver")())])
        grid = Grid(x=Interval(length=self.length, rule="left"), y=Interval.paper(d)) if dims == 1 else None
        self.propagator = Propagator(scheme, self.n_steps, t0=0.0, t1=T, grid=grid)
        self.projection = Projection(d, proj_hidden, out_channels, **fk)
        self._reset_io(generator)

    @staticmethod
    def _attention(kind, d, H, dh, T, P, generator, fk):
        def rand(*shape):
            return torch.rand(shape, generator=generator, dtype=torch.float64)

        def tb(first: Tensor):
            return time_control(first.to(**fk), P, 0.0, T)

        eye = torch.zeros(d, H * dh, dtype=torch.float64)
        k = min(d, H * dh)
        eye[:k, :k] = torch.eye(k, dtype=torch.float64)
        eye = eye.reshape(d, H, dh)

        def w_in():
            return tb(_xavier(d, H * dh, lambda: rand(d, H, dh)) + 0.1 * eye)

        WO = tb(_xavier(H * dh, d, lambda: rand(H, dh, d)) + 0.1 * eye.permute(1, 2, 0))
        zeros = torch.zeros(H, dh, dtype=torch.float64)
        cls = GalerkinAttention if kind == "galerkin" else FourierAttention
        return cls(w_in(), w_in(), w_in(), WO, bQ=tb(zeros), bK=tb(zeros), bV=tb(zeros),
                   bO=tb(torch.zeros(d, dtype=torch.float64)),
                   norm_weights=(tb(zeros + 1), tb(zeros + 1)), norm_biases=(tb(zeros), tb(zeros)))

    @torch.no_grad()
    def _reset_io(self, generator) -> None:
        """The lifting and the projection as ``nn.Linear`` (uniform :math:`\\pm 1/\\sqrt{\\text{fan-in}}`),
        drawn from ``generator``; the projection's output layer times ``output_scale``."""
        lift = self.lifting.linear if self.dims == 1 else self.lifting2d
        for lin, s in ((lift, 1.0), (self.projection.fc1, 1.0), (self.projection.fc2, self.output_scale)):
            b = s / math.sqrt(lin.weight.shape[1])
            for p in (lin.weight, lin.bias):
                p.copy_((torch.rand(p.shape, generator=generator, dtype=torch.float64) * 2 - 1) * b)

    # -- the 2-D box ------------------------------------------------------------------------------
    def box_nodes(self, n: int) -> int:
        """Nodes per side of the periodic box for an ``n x n`` input (2-D)."""
        m = (n - 1) * self._pad
        if m.denominator != 1:
            raise ValueError(f"AttentionNeuralOperator: u: an {n} x {n} grid has spacing 1/{n - 1}; the box "
                             f"[0, 1 + {self._pad})^2 needs (N - 1) * {self._pad} to be a whole number of nodes, "
                             f"which N - 1 = {n - 1} does not give (grids with N - 1 divisible by "
                             f"{self._pad.denominator} work)")
        return n - 1 + int(m)

    def box_grid(self, n: int) -> ImageGrid:
        nb = self.box_nodes(n)
        L = nb / (n - 1)
        itv = Interval(n=nb, length=L, rule="left")
        return ImageGrid._build(itv, itv, Interval.paper(self.d_model), None, 0)

    # -- input checks -------------------------------------------------------------------------------
    def _check_input(self, u) -> Tensor:
        if self.dims == 1:
            return self.lifting.check_input(u)
        u = check_tensor(u, "u")
        check_float_dtype(u, "u")
        if u.dim() == 3:
            u = u.unsqueeze(-1)
        if u.dim() != 4:
            raise ValueError(f"u: expected a field on the unit square of shape (B, N, N) or (B, N, N, C), got shape "
                             f"{tuple(u.shape)}")
        if u.shape[1] != u.shape[2]:
            raise ValueError(f"u: expected a square grid (B, N, N), got {u.shape[1]} x {u.shape[2]} nodes")
        if u.shape[-1] != self.in_channels:
            raise ValueError(f"u: expected {self.in_channels} channel(s), got shape {tuple(u.shape)}")
        n = u.shape[1]
        if n < self.min_nodes:
            raise ValueError(f"u: the grid has N = {n} nodes per side; this model needs N >= {self.min_nodes}")
        nb = self.box_nodes(n)
        if nb < 2 * self.modes - 1:
            raise ValueError(f"u: the periodic box has {nb} nodes per side at N = {n}; the kernel's {self.modes} "
                             f"modes need at least {2 * self.modes - 1}")
        p = self.lifting2d.weight
        if u.dtype != p.dtype or u.device != p.device:
            raise TypeError(f"u: expected a {p.dtype} tensor on {p.device} (the model's), got {u.dtype} on {u.device}")
        check_finite(u, "u")
        return u

    # -- forward ------------------------------------------------------------------------------------------
    def forward(self, u: Tensor, *, n_steps: int | None = None) -> Tensor:
        """``u`` -> the output field on the same nodes (1-D ``(B, N)`` / ``(B, N, C)``; 2-D
        ``(B, N, N)`` / ``(B, N, N, C)``), solved with ``n_steps`` steps (default the
        model's :math:`N_t`).  The parameters and ``u`` are checked before any compute
        (shape, dtype, nodes, finite; 1-D: periodic), the output after it; an empty batch
        gives an empty batch."""
        check_parameters_finite(self, "AttentionNeuralOperator")
        if n_steps is not None:
            n_steps = check_positive_int(n_steps, "n_steps (N_t)")
        u = self._check_input(u)
        try:
            w = self._forward_1d(u, n_steps) if self.dims == 1 else self._forward_2d(u, n_steps)
            check_output(w, "AttentionNeuralOperator output")
        except ValueError:
            check_parameters_finite(self, "AttentionNeuralOperator", fresh=True)
            raise
        return w

    def _flow(self, v: Tensor, grid: Grid, n_steps) -> Tensor:
        if v.shape[0] == 0:  # an empty batch: the flow's parameters stay on the graph
            return v + 0.0 * sum(p.sum() for p in self.field.parameters())
        return self.propagator(v, n_steps=n_steps, grid=grid, check_finite_input=False)

    def _forward_1d(self, u: Tensor, n_steps) -> Tensor:
        B, n, _ = u.shape
        v = self.lifting._lift(u)
        m = self.latent or n
        if self.latent:
            v = band_limit(v, m, self.latent // 2)
        grid = Grid(x=Interval(n=m, length=self.length, rule="left"), y=Interval.paper(self.d_model))
        v = self._flow(v, grid, n_steps)
        w = self.projection._project(v)
        w = w.unsqueeze(-1) if w.dim() == 2 else w
        if self.output_modes is not None or m != n:
            w = band_limit(w, n, self.output_modes or m // 2)
        return w.squeeze(-1) if self.out_channels == 1 else w

    def _forward_2d(self, u: Tensor, n_steps) -> Tensor:
        B, n, _, _ = u.shape
        x = torch.linspace(0.0, 1.0, n, dtype=torch.float64).to(u.dtype).to(u.device)
        gx, gy = torch.meshgrid(x, x, indexing="ij")
        pos = torch.stack([gx, gy], -1).expand(B, n, n, 2)
        v = self.lifting2d(torch.cat([u, pos], dim=-1))  # (B, n, n, d)
        grid = self.box_grid(n)
        nb = grid.rows.n
        v = nn.functional.pad(v, (0, 0, 0, nb - n, 0, nb - n)).reshape(B, nb * nb, self.d_model)
        v = self._flow(v, grid, n_steps)
        v = v.reshape(B, nb, nb, self.d_model)[:, :n, :n]
        w = self.projection._project(v.reshape(B, n * n, self.d_model)).reshape(B, n, n, self.out_channels)
        if self.dirichlet:
            w = w * (16 * gx * (1 - gx) * gy * (1 - gy)).unsqueeze(-1)
        return w.squeeze(-1) if self.out_channels == 1 else w

    def extra_repr(self) -> str:
        s = (f"dims={self.dims}, attention={self.attention_kind!r}, d_model={self.d_model}, modes={self.modes}, "
             f"n_steps={self.n_steps}, T={self.T:g}, solver={self.solver_name!r}")
        if self.dims == 1:
            s += f", latent={self.latent}, output_modes={self.output_modes}, min_nodes={self.min_nodes}"
        else:
            s += f", padding={self._pad}, dirichlet={self.dirichlet}"
        return s
