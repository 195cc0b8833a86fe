r"""A gated feed-forward integral operator whose hidden layer holds a periodic convolution
integral over :math:`\Omega_x`, on a 1-D or a 2-D periodic domain.

.. math::

    A(t; u)(x) = W_2(t)^{\!\top}\big[\sigma(a(x)) \odot b(x)\big] + b_2(t), \qquad
    \begin{pmatrix} a \\ b \end{pmatrix}(x)
      = \int_{\Omega_x} \kappa_t(x - \tilde x)^{\!\top} u(\tilde x)\, d\tilde x
        + W_1(t)^{\!\top} u(x) + b_1(t),                                        \tag{SG}

with :math:`u(x) \in \mathbb R^{N_y}`, :math:`a, b \in \mathbb R^{F}` (``hidden`` = F),
:math:`\sigma` the GELU, and a kernel that is a trigonometric polynomial of the physical
offset (its modes :math:`\hat W_m(t) \in \mathbb C^{N_y \times 2F}`):

* **1-D**, :math:`\Omega_x = [0, L)` periodic (a :class:`~opsplit.grid.Grid` whose ``x`` rule is
  ``left``, ``midpoint`` or ``right``): :math:`\kappa(\zeta) = \operatorname{Re}\sum_{m=0}^{M-1}
  c_m \hat W_m e^{2\pi i m \zeta/L}`, :math:`c_0 = 1`, :math:`c_{m>0} = 2`
  (:math:`\hat W_{-m} = \overline{\hat W_m}`, the imaginary part of :math:`\hat W_0` unused);
* **2-D**, :math:`\Omega_x = [0, L_1) \times [0, L_2)` periodic (an
  :class:`~opsplit.grid.ImageGrid` without prefix tokens, the state's tokens row-major):
  :math:`\kappa(\zeta) = \operatorname{Re}\sum_{|m_1| < M,\ 0 \le m_2 < M}
  c_{m_2} \hat W_{m_1 m_2} e^{2\pi i (m_1\zeta_1/L_1 + m_2\zeta_2/L_2)}` — the modes of FNO's
  2-D layer (both signs of the first frequency, the non-negative second ones).

The convolution integral is evaluated by the equal-weight quadrature on the grid's nodes,
exact for the kernel's modes (:mod:`opsplit.operators.spectral_convolution` explains why a
kernel of the physical offset is one operator on every grid): a real DFT along the last axis
keeping :math:`M` modes, then (2-D) a complex DFT along the first axis of those
:math:`M` columns only, keeping :math:`2M - 1` rows — :math:`O(N \log N\, N_y + M^{d} N_y F)`.
A grid needs more than :math:`2(M - 1)` nodes along each periodic axis (fewer are refused:
the kernel's modes would alias).  The sums over features are plain (the paper's
:math:`L_y = N_y`; a grid with another :math:`\Omega_y` weight multiplies them).

The product :math:`\sigma(a) \odot b` of two integral transforms of the state gives the field
products such as :math:`u\,\partial_x u` directly (a gated linear unit, GEGLU); without the
convolution the term is a pointwise gated feed-forward map.

Controls (any :class:`~opsplit.controls.Control` of these shapes; :meth:`create` makes them
Legendre series in :math:`t`, :class:`~opsplit.controls.TimeBasis`, so that
:math:`\theta(t)` is a smooth function of time: one coefficient set is a control constant in
time): ``weight`` ``(2, M, N_y, 2F)`` (1-D) or ``(2, 2M - 1, M, N_y, 2F)`` (2-D; rows
:math:`m_1 = 0, \dots, M-1, -(M-1), \dots, -1`), real and imaginary parts; ``W1``
``(N_y, 2F)``; ``b1`` ``(2F,)``; ``W2`` ``(F, N_y)``; ``b2`` ``(N_y,)``.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .._checks import check_positive_float, check_positive_int
from ..controls import Constant, TimeBasis, as_control
from ..grid import Grid, ImageGrid
from ._heads import control_shape
from .base import Operator
from .spectral_convolution import check_periodic_grid

__all__ = ["SpectralGatedFeedForward", "spectral_conv_1d", "spectral_conv_2d", "time_control"]


def time_control(first: Tensor, time_modes: int, t0: float, t1: float):
    """A trainable control whose value at every :math:`t` starts as ``first``: a
    :class:`~opsplit.controls.Constant` parameter for ``time_modes = 1`` (constant in time),
    else a Legendre series in :math:`t` on ``[t0, t1]``
    (:class:`~opsplit.controls.TimeBasis`) with ``first`` as its constant coefficient and
    the others zero."""
    if time_modes == 1:
        return Constant(nn.Parameter(first.detach().clone()))
    c = torch.zeros(time_modes, *first.shape, dtype=first.dtype, device=first.device)
    c[0] = first
    return TimeBasis(c, t0=t0, t1=t1)


def _spectral(weight: Tensor) -> Tensor:
    """The complex modes of a ``(2, ...)`` real/imaginary weight."""
    return torch.complex(weight[0], weight[1])


def spectral_conv_1d(u: Tensor, W: Tensor, length: float) -> Tensor:
    r"""``u`` ``(B, n, C)``, ``W`` complex ``(M, C, D)`` -> ``(B, n, D)``: the equal-weight
    quadrature of :math:`\int_0^L \kappa(x - \tilde x)^\top u(\tilde x) d\tilde x` (module
    docstring, 1-D).  An empty batch gives an empty batch."""
    B, n, C = u.shape
    M, D = W.shape[0], W.shape[-1]
    if B == 0:
        return u.new_zeros(0, n, D) + 0.0 * W.real.sum()
    U = torch.fft.rfft(u, dim=1)[:, :M]  # (B, M, C)
    W0 = torch.cat([W[:1].real.to(W.dtype), W[1:]], 0)  # a real mean mode
    V = torch.einsum("bmc,mcd->bmd", U, W0)
    return torch.fft.irfft(V, n=n, dim=1) * length


def spectral_conv_2d(u: Tensor, W: Tensor, n1: int, n2: int, area: float) -> Tensor:
    r"""``u`` ``(B, n1 n2, C)`` (row-major), ``W`` complex ``(2M - 1, M, C, D)`` ->
    ``(B, n1 n2, D)``: the equal-weight quadrature of the 2-D convolution integral (module
    docstring); ``area`` = :math:`L_1 L_2`.  Only the :math:`M` kept columns are
    transformed along the rows.  An empty batch gives an empty batch."""
    B, _, C = u.shape
    R, M, D = W.shape[0], W.shape[1], W.shape[-1]
    if B == 0:
        return u.new_zeros(0, n1 * n2, D) + 0.0 * W.real.sum()
    x = u.reshape(B, n1, n2, C).permute(0, 3, 1, 2)  # (B, C, n1, n2): contiguous FFTs
    X = torch.fft.rfft(x, dim=-1)[..., :M]  # (B, C, n1, M)
    X = torch.fft.fft(X, dim=-2)  # (B, C, n1, M)
    h = (R + 1) // 2  # rows 0..M-1 and -(M-1)..-1
    Xk = torch.cat([X[:, :, :h], X[:, :, n1 - (R - h):]], dim=2)  # (B, C, R, M)
    Y = torch.einsum("bcrm,rmcd->bdrm", Xk, W)  # (B, D, R, M)
    full = Y.new_zeros(B, D, n1, M)
    full[:, :, :h] = Y[:, :, :h]
    full[:, :, n1 - (R - h):] = Y[:, :, h:]
    full = torch.fft.ifft(full, dim=-2)  # (B, D, n1, M)
    out = torch.fft.irfft(full, n=n2, dim=-1)  # the column 0 read by its real part (c_0 = 1)
    return (out * area).permute(0, 2, 3, 1).reshape(B, n1 * n2, D)


def _is_2d(grid: Grid) -> bool:
    return isinstance(grid, ImageGrid)


class SpectralGatedFeedForward(Operator):
    """The gated spectral feed-forward term (SG) of the module docstring, an explicit term.

    Args:
        weight: ``(2, M, N_y, 2F)`` (1-D) or ``(2, 2M - 1, M, N_y, 2F)`` (2-D) control.
        W1: ``(N_y, 2F)`` control; b1: ``(2F,)``; W2: ``(F, N_y)``; b2: ``(N_y,)``
            (the biases optional).
    """

    has_field = True
    default_solver = "explicit"

    def __init__(self, weight, W1, W2, b1=None, b2=None):
        super().__init__()
        self.weight = as_control(weight, "SpectralGatedFeedForward.weight")
        self.W1 = as_control(W1, "SpectralGatedFeedForward.W1")
        self.W2 = as_control(W2, "SpectralGatedFeedForward.W2")
        self.b1 = None if b1 is None else as_control(b1, "SpectralGatedFeedForward.b1")
        self.b2 = None if b2 is None else as_control(b2, "SpectralGatedFeedForward.b2")
        s = control_shape(self.weight)
        if s is not None and (len(s) not in (4, 5) or s[0] != 2):
            raise ValueError("SpectralGatedFeedForward.weight: expected shape (2, M, N_y, 2F) (1-D) or "
                             f"(2, 2M - 1, M, N_y, 2F) (2-D), got {s}")
        if s is not None and len(s) == 5 and s[1] != 2 * s[2] - 1:
            raise ValueError(f"SpectralGatedFeedForward.weight: a 2-D kernel has 2M - 1 rows for M columns, got "
                             f"{s[1]} rows and {s[2]} columns")
        w1, w2 = control_shape(self.W1), control_shape(self.W2)
        if s is not None and w1 is not None and (len(w1) != 2 or tuple(w1) != tuple(s[-2:])):
            raise ValueError(f"SpectralGatedFeedForward.W1: expected shape {tuple(s[-2:])} (N_y, 2F), got {w1}")
        if w1 is not None and (w1[1] % 2 or w2 is not None and tuple(w2) != (w1[1] // 2, w1[0])):
            raise ValueError(f"SpectralGatedFeedForward.W2: expected shape (F, N_y) = ({w1[1] // 2}, {w1[0]}) with "
                             f"W1 of shape (N_y, 2F) = {tuple(w1)}, got {w2}")

    @classmethod
    def create(cls, n_y: int, modes: int, *, hidden: int | None = None, dims: int = 1, t0: float = 0.0,
               t1: float = 1.0, time_modes: int = 1, out_scale: float = 1.0, bias: bool = True,
               generator: torch.Generator | None = None, device=None, dtype=None) -> SpectralGatedFeedForward:
        """Trainable controls, Legendre series in :math:`t` on ``[t0, t1]`` with
        ``time_modes`` coefficients (1: constant in time).  Initialised as FNO's layers
        and ``nn.Linear`` for the constant coefficient (the modes uniform in
        :math:`[0, 1/(N_y \\cdot 2F))`, ``W1`` uniform :math:`\\pm 1/\\sqrt{N_y}`, ``W2``
        uniform :math:`\\pm\\,\\text{out\\_scale}/\\sqrt{F}`, biases zero), the higher
        coefficients zero."""
        n_y = check_positive_int(n_y, "SpectralGatedFeedForward.create.n_y")
        modes = check_positive_int(modes, "SpectralGatedFeedForward.create.modes")
        hidden = n_y if hidden is None else check_positive_int(hidden, "SpectralGatedFeedForward.create.hidden")
        time_modes = check_positive_int(time_modes, "SpectralGatedFeedForward.create.time_modes")
        out_scale = check_positive_float(out_scale, "SpectralGatedFeedForward.create.out_scale")
        if dims not in (1, 2):
            raise ValueError(f"SpectralGatedFeedForward.create.dims: expected 1 or 2, got {dims!r}")
        fk = {"dtype": dtype or torch.get_default_dtype(), "device": device}
        P, h2 = time_modes, 2 * hidden
        kshape = (2, modes, n_y, h2) if dims == 1 else (2, 2 * modes - 1, modes, n_y, h2)

        def rand(*shape):
            return torch.rand(shape, generator=generator, dtype=torch.float64)

        def coef(first: Tensor):
            return time_control(first.to(**fk), P, t0, t1)

        w = rand(*kshape) / (n_y * h2)
        W1 = (rand(n_y, h2) * 2 - 1) / math.sqrt(n_y)
        W2 = (rand(hidden, n_y) * 2 - 1) * out_scale / math.sqrt(hidden)
        return cls(coef(w), coef(W1), coef(W2), coef(torch.zeros(h2)) if bias else None,
                   coef(torch.zeros(n_y)) if bias else None)

    @property
    def modes(self) -> int | None:
        """:math:`M` (``None`` when the control's shape is not static)."""
        s = control_shape(self.weight)
        return None if s is None else s[-3]

    @property
    def dims(self) -> int | None:
        s = control_shape(self.weight)
        return None if s is None else len(s) - 3

    def check(self, grid: Grid) -> None:
        M, dims = self.modes, self.dims
        need = 2 * (M - 1) + 1 if M else 1
        if dims == 2 or _is_2d(grid):
            if not _is_2d(grid) or dims == 1:
                raise ValueError(f"SpectralGatedFeedForward: a {dims}-D kernel needs "
                                 f"{'an ImageGrid (a 2-D periodic domain)' if dims == 2 else 'a 1-D grid'}, got "
                                 f"{type(grid).__name__}")
            if grid.n_prefix:
                raise ValueError("SpectralGatedFeedForward: the 2-D convolution needs an ImageGrid without prefix "
                                 f"tokens, got n_prefix = {grid.n_prefix}")
            for name in ("rows", "cols"):
                itv = getattr(grid, name)
                if itv.n < need:
                    raise ValueError(f"SpectralGatedFeedForward: the grid has {itv.n} {name}; the kernel's {M} "
                                     f"modes need at least {need} (more than 2(M - 1): fewer would alias them)")
        else:
            check_periodic_grid(grid, "SpectralGatedFeedForward", need)
        s = control_shape(self.weight)
        if s is not None and grid.y.n is not None and s[-2] != grid.y.n:
            raise ValueError(f"SpectralGatedFeedForward: grid/control mismatch: the kernel acts on N_y = {s[-2]} "
                             f"features, the grid has N_y = {grid.y.n}")
        for name in ("weight", "W1", "W2", "b1", "b2"):
            c = getattr(self, name)
            if c is not None:
                c.validate(grid, f"SpectralGatedFeedForward.{name}")

    def hidden(self, t, u: Tensor, grid: Grid) -> Tensor:
        """:math:`(a, b)` of (SG), ``(B, N_x, 2F)``."""
        w = self.weight(t, grid).to(u.dtype)
        wy = grid.y.uniform_weight
        W = _spectral(w) * (1.0 if wy is None else wy)
        if w.dim() == 4:
            L = grid.x.measure if grid.x.is_complete else u.shape[-2] * grid.x.spacing
            conv = spectral_conv_1d(u, W, L)
        else:
            conv = spectral_conv_2d(u, W, grid.rows.n, grid.cols.n, grid.rows.measure * grid.cols.measure)
        h = conv + grid.kernel_y(u, self.W1(t, grid).to(u.dtype))
        if self.b1 is not None:
            h = h + self.b1(t, grid).to(u.dtype)
        return h

    def field(self, t, u: Tensor, grid: Grid) -> Tensor:
        a, b = self.hidden(t, u, grid).chunk(2, dim=-1)
        out = (F.gelu(a) * b) @ self.W2(t, grid).to(u.dtype)
        if self.b2 is not None:
            out = out + self.b2(t, grid).to(u.dtype)
        return out

    def extra_repr(self) -> str:
        s = control_shape(self.weight)
        return "" if s is None else f"dims={len(s) - 3}, modes={s[-3]}, n_y={s[-2]}, hidden={s[-1] // 2}"
