r"""Convolution integral operators on a 2-D token grid (paper 002, §6, eq. 42).

On an :class:`~opsplit.grid.ImageGrid` the token variable :math:`x` runs over a 2-D
image domain and :math:`u(x, \cdot)` is a vector of :math:`N_y` channels.  A
translation-invariant integral operator on :math:`\Omega_x` is a convolution (eq. 42):

.. math::  (W * u)(x, y) = \int_{\Omega_x} \sum_{y'} W(\xi;\, y, y')\, u(x - \xi, y')\, d\xi
           + b(y),

with :math:`u = 0` outside :math:`\Omega_x` (zero padding: the integral over the domain).
Its discretisation on the grid (nodes :math:`x_k`, cell area :math:`h_1 h_2`) is

.. math::  (W * u)_k = h_1 h_2 \sum_m \sum_{y'} W(m h;\, y, y')\, u_{k - m}(y') + b(y),

one ``F.conv2d``.  The kernel is given either

* as a **continuous** function of the offset, :class:`ContinuousKernel`: it is sampled at
  the grid's offsets :math:`m h` inside its support and multiplied by the cell area, so
  the operator converges to the integral as the grid is refined (second order with the
  midpoint rule for a smooth kernel and a smooth :math:`u`; measured in
  ``tests/test_convolution.py`` and ``benchmarks/cvt.py --convergence``);
* or as **discrete** weights (a tensor or a control of shape ``(C_out, C_in/groups, k_1,
  k_2)``), torch's cross-correlation layout: ``w[c, c', i, j]`` multiplies
  :math:`u(x + (i - c_1) h_1, \cdot)` with :math:`c_i = (k_i - 1)/2`, i.e. it is the kernel
  value :math:`W(-(i - c_1) h_1, -(j - c_2) h_2)`.  Like every tensor kernel of opsplit they
  are kernel values, multiplied by the quadrature weight (the cell area, 1 on
  ``ImageGrid.paper``).

**Channel mixing.** ``groups=1`` mixes all channels (a full :math:`W(\xi; y, y')`);
``groups="depthwise"`` (or ``groups = N_y``) convolves each channel with its own kernel
:math:`W(\xi; y)` (CvT's Q/K/V projections); a depthwise kernel with a single row (shape
``(1, 1, k_1, k_2)``) is one kernel shared by all channels (eq. 42 as printed: one scalar
kernel :math:`W^Q(\xi, t)`).

:class:`Convolution2d` is the term :math:`A(u) = W * u + b` on the *same* grid (stride 1,
same channels, "same" zero padding), an explicit term whose explicit-Euler step is
:math:`u + \Delta t (W * u + b)` — eq. (44) of the paper.  A strided convolution, or one
that changes the number of channels, moves the state to another grid: that is a grid
transfer, :class:`~opsplit.operators.ConvTransfer`.  Prefix tokens (a class token) are not
on the 2-D grid: the convolution term is zero there.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..controls import Control, as_control
from ..grid import Grid, ImageGrid
from ._linear import fan_in_uniform_
from .base import Operator

__all__ = ["ContinuousKernel", "Convolution2d", "convolve", "image_grid_of", "kernel_shape"]


def _pair_float(v, name: str) -> tuple[float, float]:
    if isinstance(v, (tuple, list)):
        if len(v) != 2:
            raise ValueError(f"{name}: expected a number or a pair, got {v!r}")
        a, b = float(v[0]), float(v[1])
    else:
        a = b = float(v)
    if not (math.isfinite(a) and math.isfinite(b)) or a < 0 or b < 0:
        raise ValueError(f"{name}: expected finite numbers >= 0, got {v!r}")
    return a, b


def image_grid_of(grid, who: str) -> ImageGrid:
    """``grid`` if it is an :class:`~opsplit.grid.ImageGrid`, else a clear error."""
    if not isinstance(grid, ImageGrid):
        raise ValueError(
            f"{who}: expected an ImageGrid (a 2-D token grid, opsplit.grid.ImageGrid), got "
            f"{type(grid).__name__}; build one with ImageGrid.paper((N_1, N_2), N_y)"
        )
    return grid


def kernel_shape(control) -> tuple | None:
    """The static shape of a weight control, or ``None`` (a continuous kernel)."""
    if isinstance(control, ContinuousKernel):
        return None
    s = getattr(control, "shape", None)
    return tuple(s) if s is not None and not callable(s) else None


class ContinuousKernel(Control):
    r"""A convolution kernel given as a function of the offset :math:`\xi = (\xi_1, \xi_2)`.

    ``fn(xi1, xi2)`` receives two tensors of shape ``(k_1, k_2)`` (the offsets of the
    stencil) and returns the kernel values, shape ``(k_1, k_2)`` (one scalar kernel, copied
    to every ``channels`` pair) or ``(C_out, C_in/groups, k_1, k_2)``.  The stencil covers
    the support :math:`|\xi_i| \le r_i`: :math:`k_i = 2\lfloor r_i / h_i\rfloor + 1` taps,
    so it grows as the grid is refined.  An ``nn.Module`` ``fn`` is registered (its
    parameters train with the operator).

    **Quadrature on the stencil.**  The operator is the product rule of
    :math:`\int_{[-r_1, r_1]\times[-r_2, r_2]} W(\xi)\,u(x - \xi)\,d\xi` on the grid's
    offsets: every tap carries the cell area :math:`h_1 h_2` (applied by the operator) times
    the stencil weight returned here.  ``rule="trapezoid"`` (default) halves the weight of
    the outermost taps in each direction: the tensor trapezoid rule, second order for a
    smooth kernel and a smooth :math:`u` when :math:`r_i` is a multiple of :math:`h_i` (the
    outermost taps lie on the support's boundary).  ``rule="rectangle"`` gives every tap the
    same weight: first order for a kernel that does not vanish on the support's boundary
    (both are measured in ``benchmarks/cvt_convergence.py`` and ``tests/test_cvt_operators.py``).
    For a kernel that vanishes on the boundary the two rules coincide.

    Args:
        fn: the kernel :math:`W(\xi_1, \xi_2)`.
        support: :math:`r` or :math:`(r_1, r_2)`, the half-widths of the support (the kernel
            is taken as zero beyond; give the domain length for a kernel without compact
            support).
        channels: ``(C_out, C_in/groups)`` for a scalar ``fn``; default ``(1, 1)``.
        rule: ``"trapezoid"`` or ``"rectangle"`` (see above).
        dtype, device: of the sampled values (they follow ``.to()``).
    """

    def __init__(self, fn, support, *, channels=(1, 1), rule: str = "trapezoid", dtype=None, device=None):
        super().__init__(axes=())
        if not callable(fn):
            raise TypeError(f"ContinuousKernel.fn: expected a callable W(xi1, xi2), got {type(fn).__name__}")
        self.fn = fn  # an nn.Module is registered as a submodule by nn.Module.__setattr__
        self.support = _pair_float(support, "ContinuousKernel.support")
        if not isinstance(channels, (tuple, list)) or len(channels) != 2:
            raise ValueError(f"ContinuousKernel.channels: expected (C_out, C_in/groups), got {channels!r}")
        self.channels = (int(channels[0]), int(channels[1]))
        if self.channels[0] < 1 or self.channels[1] < 1:
            raise ValueError(f"ContinuousKernel.channels: expected positive sizes, got {channels!r}")
        if rule not in ("trapezoid", "rectangle"):
            raise ValueError(f"ContinuousKernel.rule: expected 'trapezoid' or 'rectangle', got {rule!r}")
        self.rule = rule
        self.register_buffer("_ref", torch.zeros((), dtype=dtype or torch.get_default_dtype(), device=device),
                             persistent=False)

    def taps(self, grid: ImageGrid) -> tuple[int, int]:
        """``(m_1, m_2)``: the stencil half-widths on ``grid`` (``k_i = 2 m_i + 1``)."""
        (r1, r2), h1, h2 = self.support, grid.rows.spacing, grid.cols.spacing
        return int(math.floor(r1 / h1 + 1e-9)), int(math.floor(r2 / h2 + 1e-9))

    def forward(self, t=None, grid=None) -> Tensor:
        grid = image_grid_of(grid, "ContinuousKernel")
        m1, m2 = self.taps(grid)
        ref = self._ref
        a1 = torch.arange(-m1, m1 + 1, dtype=ref.dtype, device=ref.device) * grid.rows.spacing
        a2 = torch.arange(-m2, m2 + 1, dtype=ref.dtype, device=ref.device) * grid.cols.spacing
        # cross-correlation weights: w[i, j] = W(-(i - m1) h1, -(j - m2) h2)
        xi1, xi2 = torch.meshgrid(-a1, -a2, indexing="ij")
        w = self.fn(xi1, xi2)
        if not isinstance(w, Tensor):
            raise TypeError(f"ContinuousKernel.fn: expected a tensor of kernel values, got {type(w).__name__}")
        k = (2 * m1 + 1, 2 * m2 + 1)
        if w.shape != k and not (w.dim() == 4 and tuple(w.shape[2:]) == k):
            raise ValueError(
                f"ContinuousKernel.fn: expected values of shape {k} or (C_out, C_in/groups, {k[0]}, {k[1]}), "
                f"got {tuple(w.shape)}"
            )
        if self.rule == "trapezoid":
            q1 = torch.ones(k[0], dtype=w.dtype, device=w.device)
            q2 = torch.ones(k[1], dtype=w.dtype, device=w.device)
            if m1 > 0:
                q1[0] = q1[-1] = 0.5
            if m2 > 0:
                q2[0] = q2[-1] = 0.5
            w = w * (q1[:, None] * q2[None, :])
        return w.expand(*self.channels, *k) if w.shape == k else w

    def validate(self, grid, name: str = "control") -> None:
        image_grid_of(grid, name)

    def extra_repr(self) -> str:
        return f"support={self.support}, channels={self.channels}, rule={self.rule!r}"


def convolve(img: Tensor, weight: Tensor, bias: Tensor | None, *, stride=1, padding=0, groups: int = 1,
             area: float = 1.0) -> Tensor:
    r""":math:`h_1 h_2 \sum_m w_m\, u_{k + m} + b` on an image ``(B, C, N_1, N_2)`` (torch's
    cross-correlation layout; the cell area ``area`` is the quadrature weight)."""
    if area != 1.0:
        weight = weight * area
    return F.conv2d(img, weight, bias, stride, padding, 1, groups)


def _resolve_groups(groups, c_in: int, who: str) -> int:
    if groups == "depthwise":
        return c_in
    if isinstance(groups, bool) or not isinstance(groups, int) or groups < 1:
        raise ValueError(f"{who}.groups: expected a positive integer or 'depthwise', got {groups!r}")
    return groups


def expand_weight(w: Tensor, groups: int, c_in: int) -> Tensor:
    """A shared depthwise kernel ``(1, 1, k1, k2)`` as ``(C, 1, k1, k2)``."""
    if groups == c_in and c_in > 1 and w.shape[0] == 1 and w.shape[1] == 1:
        return w.expand(c_in, 1, *w.shape[2:])
    return w


def check_weight(shape, c_in: int, groups: int, who: str) -> int:
    """Check a weight shape ``(C_out, C_in/groups, k1, k2)`` against ``c_in`` channels;
    return ``C_out``."""
    if len(shape) != 4:
        raise ValueError(f"{who}.weight: expected shape (C_out, C_in/groups, k_1, k_2), got {shape}")
    if c_in % groups:
        raise ValueError(f"{who}: groups = {groups} does not divide the N_y = {c_in} input channels")
    shared = groups == c_in and shape[0] == 1 and shape[1] == 1
    if shape[1] * groups != c_in and not shared:
        raise ValueError(
            f"{who}: channel mismatch: the weight {shape} takes C_in/groups = {shape[1]} channels per "
            f"group ({shape[1] * groups} with groups = {groups}), the state has N_y = {c_in}"
        )
    c_out = c_in if shared else shape[0]
    if c_out % groups:
        raise ValueError(f"{who}: groups = {groups} does not divide the C_out = {c_out} output channels")
    return c_out


class Convolution2d(Operator):
    r"""The convolution term :math:`A(t; u) = W(t) * u + b(t)` on one 2-D grid (eq. 42; its
    explicit-Euler step is eq. 44).

    Args:
        weight: a :class:`ContinuousKernel`, or discrete weights (tensor / control) of shape
            ``(N_y, N_y/groups, k_1, k_2)`` with odd :math:`k_i` (torch's layout; see the
            module docstring), or ``(1, 1, k_1, k_2)`` with ``groups="depthwise"`` for one
            kernel shared by all channels.
        bias: optional control (or tensor) :math:`b(y)`, shape ``(N_y,)``.
        groups: ``1`` (full channel mixing), ``"depthwise"``, or any divisor of :math:`N_y`.

    The output keeps the grid: stride 1 and zero padding :math:`(k_i - 1)/2` ("same").
    The term is zero on prefix (class) tokens.
    """

    has_field = True
    default_solver = "explicit"

    def __init__(self, weight, bias=None, *, groups=1):
        super().__init__()
        self.weight = weight if isinstance(weight, ContinuousKernel) else as_control(weight, "Convolution2d.weight")
        self.bias = None if bias is None else as_control(bias, "Convolution2d.bias", axes=("y",))
        if groups != "depthwise":
            _resolve_groups(groups, 0, "Convolution2d")
        self.groups = groups
        s = kernel_shape(self.weight)
        if s is not None:
            if len(s) != 4:
                raise ValueError(f"Convolution2d.weight: expected shape (C_out, C_in/groups, k_1, k_2), got {s}")
            if s[2] % 2 == 0 or s[3] % 2 == 0:
                raise ValueError(
                    f"Convolution2d.weight: expected odd kernel sizes (a centred stencil keeps the grid), "
                    f"got {s[2]}x{s[3]}"
                )

    @classmethod
    def create(cls, n_y: int, kernel_size, *, groups=1, bias: bool = True, device=None, dtype=None) -> Convolution2d:
        """Trainable discrete weights (one set, time-independent), ``nn.Conv2d``'s init."""
        k1, k2 = (kernel_size, kernel_size) if isinstance(kernel_size, int) else tuple(kernel_size)
        g = n_y if groups == "depthwise" else groups
        fk = {"device": device, "dtype": dtype or torch.get_default_dtype()}
        w = nn.Parameter(torch.zeros(n_y, n_y // g, k1, k2, **fk))
        b = nn.Parameter(torch.zeros(n_y, **fk)) if bias else None
        op = cls(w, b, groups=groups)
        op.reset_parameters()
        return op

    @torch.no_grad()
    def reset_parameters(self) -> None:
        """``nn.Conv2d``'s default initialisation for trainable discrete weights."""
        w = getattr(self.weight, "value", None)
        if isinstance(w, nn.Parameter):
            b = None if self.bias is None else getattr(self.bias, "value", None)
            fan_in_uniform_(w.shape[1] * w.shape[2] * w.shape[3], w, b if isinstance(b, nn.Parameter) else None)

    def check(self, grid: Grid) -> None:
        g = image_grid_of(grid, "Convolution2d")
        c = g.y.n
        s = kernel_shape(self.weight)
        if c is not None:
            groups = _resolve_groups(self.groups, c, "Convolution2d")
            if s is not None:
                c_out = check_weight(s, c, groups, "Convolution2d")
                if c_out != c:
                    raise ValueError(
                        f"Convolution2d: channel mismatch: the term must keep N_y = {c} channels, the "
                        f"weight {s} gives {c_out} (a change of channels is a grid transfer: ConvTransfer)"
                    )
        self.weight.validate(g, "Convolution2d.weight")
        if self.bias is not None:
            self.bias.validate(g, "Convolution2d.bias")

    def kernel(self, t, grid: ImageGrid, dtype=None) -> Tensor:
        """The discrete weights on ``grid`` at time ``t`` (torch's layout, before the cell
        area), shape ``(N_y, N_y/groups, k_1, k_2)``."""
        w = self.weight(t, grid)
        c = grid.y.n
        w = expand_weight(w, _resolve_groups(self.groups, c, "Convolution2d"), c)
        return w if dtype is None else w.to(dtype)

    def field(self, t, u: Tensor, grid: Grid) -> Tensor:
        g = image_grid_of(grid, "Convolution2d")
        c = u.shape[-1]
        groups = _resolve_groups(self.groups, c, "Convolution2d")
        w = self.kernel(t, g, u.dtype)
        b = None if self.bias is None else self.bias(t, g)
        pad = ((w.shape[2] - 1) // 2, (w.shape[3] - 1) // 2)
        out = convolve(g.to_image(u), w, b, padding=pad, groups=groups, area=g.cell_area)
        out = g.from_image(out)
        if g.n_prefix:
            out = torch.cat([out.new_zeros(u.shape[0], g.n_prefix, c), out], dim=1)
        return out

    def extra_repr(self) -> str:
        kind = "continuous" if isinstance(self.weight, ContinuousKernel) else f"weight={kernel_shape(self.weight)}"
        return f"{kind}, groups={self.groups!r}, bias={self.bias is not None}"
