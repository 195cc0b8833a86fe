r"""A periodic convolution integral on :math:`\Omega_x = [0, L)` whose kernel is a
trigonometric polynomial of the physical offset.

.. math::

    A(u)(x, y) = \int_{\Omega_x}\int_{\Omega_y} \kappa(x - \tilde x;\, \xi, y)\,
        u(\tilde x, \xi)\, d\xi\, d\tilde x
        + \int_{\Omega_y} W_{\ell}(\xi, y)\, u(x, \xi)\, d\xi + b(y), \qquad
    \kappa(\zeta; \xi, y) = \sum_{|m| \le M} \hat W_m(\xi, y)\, e^{2\pi i m \zeta / L},
    \quad \hat W_{-m} = \overline{\hat W_m}.                                 \tag{S}

The optional local part :math:`W_{\ell}` (``local``) is the Dirac component
:math:`\delta(x - \tilde x)\, W_{\ell}(\xi, y)` of the kernel: a pointwise integral operator in
:math:`y`.  With it, the explicit-Euler step of (S) followed by a pointwise activation map
(:class:`~opsplit.operators.Activation`) is :math:`\sigma\big(u + \Delta t(\kappa * u +
W_{\ell} u + b)\big)`: at :math:`\Delta t = 1` a layer of the Fourier neural operator,
:math:`\sigma(K u + W u + b)` with :math:`W = I + W_{\ell}` — the structure of paper 002's
feed-forward substeps ":math:`I + W_j`" followed by a projection (eqs. 34–35).

The kernel is a function of the offset :math:`x - \tilde x` in the units of the domain,
not of a grid index: the same control is one operator on every grid.  Its quadrature on
:math:`N_x` equally spaced nodes, weights :math:`h = L/N_x`, is exact for the modes
:math:`|m| \le M` of :math:`u`:

.. math::  h \sum_j \kappa(x_i - x_j)\, u_j
         = \sum_{|m| \le M} \hat W_m\, \hat u^{h}_m\, e^{2\pi i m x_i / L}, \qquad
           \hat u^h_m = h \sum_j u_j e^{-2\pi i m x_j / L},

and :math:`\hat u^h_m` differs from the Fourier coefficient of :math:`u` only by the aliased
modes :math:`m \pm N_x, m \pm 2N_x, \dots` (spectral accuracy for a smooth periodic
:math:`u`).  It is evaluated by one real FFT: :math:`O(N_x \log N_x\, N_y + M N_y^2)`.  A grid
needs :math:`N_x > 2M` nodes to carry the kernel's modes (fewer are refused: the highest
modes would alias onto lower ones); the nodes must be equally spaced on a periodic domain
(rules ``left``, ``midpoint``, ``right``; ``trapezoid`` is refused).  This is the kernel
integral operator of the Fourier neural operator (Li et al., ICLR 2021), written as the
convolution integral it is: with :math:`L = 1` its quadrature is FNO's ``SpectralConv1d``.

**Derivatives.**  A multiplier :math:`\hat W_m = 2\pi i m / L\; W` is :math:`W\,\partial_x`
on the modes :math:`|m| \le M`: the term gives a model derivatives of its state on the
band it resolves, the same on every grid.

Layout: ``weight`` ``(2, M + 1, N_y, N_y)`` holds the real and imaginary parts of
:math:`\hat W_0, \dots, \hat W_M` (rows: the integration variable :math:`\xi`; the imaginary
part of :math:`\hat W_0` is not used: a real kernel has a real mean); ``local``
``(N_y, N_y)``; ``bias`` ``(N_y,)``.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from ..controls import PiecewiseConstant, as_control
from ..grid import Grid
from ._heads import control_shape
from .base import Operator

__all__ = ["SpectralConvolution", "check_periodic_grid", "rfft_modes", "irfft_nodes"]


def rfft_modes(x: Tensor, modes: int) -> Tensor:
    """``torch.fft.rfft(x, dim=-1)[..., :modes]``: the first ``modes`` coefficients of the real
    DFT along the last dimension.  A tensor with no rows (an empty batch) gives the empty
    result, on ``x``'s autograd graph, without a transform (MKL's FFT refuses a transform of
    zero rows: "Inconsistent configuration parameters")."""
    if x.numel() == 0:
        return torch.complex(x[..., :modes], x[..., :modes])
    return torch.fft.rfft(x, dim=-1)[..., :modes]


def irfft_nodes(X: Tensor, n: int) -> Tensor:
    """``torch.fft.irfft(X, n=n, dim=-1)``; no rows give the empty result ``(..., n)`` on
    ``X``'s autograd graph (see :func:`rfft_modes`)."""
    if X.numel() == 0:
        return X.real.sum(-1, keepdim=True).expand(*X.shape[:-1], n).clone()
    return torch.fft.irfft(X, n=n, dim=-1)


def check_periodic_grid(grid: Grid, who: str, min_nodes: int = 1) -> None:
    """Equally spaced nodes on a periodic :math:`\\Omega_x` with at least ``min_nodes``."""
    if grid.x.rule == "trapezoid":
        raise ValueError(
            f"{who}: a periodic domain needs equally spaced nodes with equal weights (rule 'left', "
            "'midpoint' or 'right'); the trapezoid rule counts both ends of [0, L] and is not periodic"
        )
    if grid.x.n is not None and grid.x.n < min_nodes:
        raise ValueError(
            f"{who}: the grid has N_x = {grid.x.n} nodes; the operator needs N_x >= {min_nodes} "
            f"(more than twice its {(min_nodes - 1) // 2} Fourier modes: fewer nodes would alias them)"
        )


class SpectralConvolution(Operator):
    r"""The convolution integral (S) of the module docstring, an explicit term.

    Args:
        weight: control (or tensor) ``(2, M + 1, N_y, N_y)``: real and imaginary parts of
            :math:`\hat W_m`, :math:`m = 0..M`.
        bias: optional control ``(N_y,)``.
        local: optional control ``(N_y, N_y)``: the pointwise part :math:`W_{\ell}`.
    """

    has_field = True
    default_solver = "explicit"

    def __init__(self, weight, bias=None, *, local=None):
        super().__init__()
        self.weight = as_control(weight, "SpectralConvolution.weight")
        self.bias = None if bias is None else as_control(bias, "SpectralConvolution.bias", axes=("y",))
        self.local = None if local is None else as_control(local, "SpectralConvolution.local", axes=("y", "y"))
        s = control_shape(self.weight)
        if s is not None and (len(s) != 4 or s[0] != 2 or s[2] != s[3]):
            raise ValueError(
                f"SpectralConvolution.weight: expected shape (2, M + 1, N_y, N_y) (real and imaginary parts of "
                f"the modes 0..M), got {s}"
            )

    @classmethod
    def create(cls, n_y: int, modes: int, *, n_pieces: int = 1, t0: float = 0.0, t1: float | None = None,
               bias: bool = False, local: bool = False, device=None, dtype=None) -> SpectralConvolution:
        """Trainable modes :math:`0..M` (``modes`` = :math:`M + 1`), one set per time piece,
        initialised as FNO's ``SpectralConv1d`` (uniform in :math:`[0, 1/N_y^2)`); with
        ``local`` a pointwise part, initialised as ``nn.Linear``."""
        if isinstance(modes, bool) or not isinstance(modes, int) or modes < 1:
            raise ValueError(f"SpectralConvolution.create: modes: expected an integer >= 1, got {modes!r}")
        fk = {"device": device, "dtype": dtype or torch.get_default_dtype()}
        w = PiecewiseConstant(torch.zeros(n_pieces, 2, modes, n_y, n_y, **fk), t0=t0, t1=t1)
        b = PiecewiseConstant(torch.zeros(n_pieces, n_y, **fk), t0=t0, t1=t1, axes=("y",)) if bias else None
        W0 = PiecewiseConstant(torch.zeros(n_pieces, n_y, n_y, **fk), t0=t0, t1=t1, axes=("y", "y")) if local else None
        op = cls(w, b, local=W0)
        op.reset_parameters()
        return op

    @torch.no_grad()
    def reset_parameters(self) -> None:
        w = getattr(self.weight, "raw", None)
        if isinstance(w, nn.Parameter):
            n_y = w.shape[-1]
            w.uniform_(0.0, 1.0 / n_y**2)
        b = None if self.bias is None else getattr(self.bias, "raw", None)
        if isinstance(b, nn.Parameter):
            b.zero_()
        W0 = None if self.local is None else getattr(self.local, "raw", None)
        if isinstance(W0, nn.Parameter):
            bound = 1.0 / W0.shape[-1] ** 0.5
            W0.uniform_(-bound, bound)

    @property
    def modes(self) -> int | None:
        """:math:`M + 1`, the number of modes :math:`0..M` (``None`` when not static)."""
        s = control_shape(self.weight)
        return None if s is None else s[1]

    def check(self, grid: Grid) -> None:
        M1 = self.modes
        check_periodic_grid(grid, "SpectralConvolution", 2 * (M1 - 1) + 1 if M1 else 1)
        s = control_shape(self.weight)
        if s is not None and grid.y.n is not None and s[2] != grid.y.n:
            raise ValueError(
                f"SpectralConvolution: grid/control mismatch: the kernel acts on N_y = {s[2]} features, the grid "
                f"has N_y = {grid.y.n}"
            )
        self.weight.validate(grid, "SpectralConvolution.weight")
        if self.bias is not None:
            self.bias.validate(grid, "SpectralConvolution.bias")
        if self.local is not None:
            self.local.validate(grid, "SpectralConvolution.local")

    def kernel_modes(self, t, grid: Grid, dtype=None) -> Tensor:
        r""":math:`\hat W_m`, ``(M + 1, N_y, N_y)`` complex, with the y-quadrature weights
        folded into the rows."""
        w = self.weight(t, grid)
        if dtype is not None:
            w = w.to(dtype)
        W = torch.complex(w[0], w[1])
        W = torch.cat([W[:1].real.to(W.dtype), W[1:]], 0)  # a real mean mode
        wy = grid.y.uniform_weight
        if wy is None:
            W = W * grid.y.weights(w.dtype, w.device).view(1, -1, 1)
        elif wy != 1.0:
            W = W * wy
        return W

    def field(self, t, u: Tensor, grid: Grid) -> Tensor:
        n = u.shape[-2]
        W = self.kernel_modes(t, grid, u.dtype)
        M1 = W.shape[0]
        if n < 2 * M1 - 1:
            check_periodic_grid(grid.with_shape(n, u.shape[-1]), "SpectralConvolution", 2 * M1 - 1)
        L = grid.x.measure if grid.x.is_complete else n * grid.x.spacing
        if L != 1.0:  # h * n = L: the quadrature weight h = L / n, on the (M + 1, N_y, N_y) modes
            W = W * L
        # the transforms along the last dimension (channels first): contiguous FFTs
        U = rfft_modes(u.transpose(-1, -2), M1)  # (B, N_y, M + 1): sum_j u_j e^{-2 pi i m j/n}
        V = torch.einsum("bim,mio->bom", U, W)
        out = irfft_nodes(V, n).transpose(-1, -2)  # (1/n) sum_m V_m e^{2 pi i m j / n} (+ conj)
        if self.local is not None:
            out = out + grid.kernel_y(u, self.local(t, grid))
        if self.bias is not None:
            out = out + self.bias(t, grid)
        return out

    def extra_repr(self) -> str:
        m = self.modes
        return f"modes={'?' if m is None else m}, bias={self.bias is not None}, local={self.local is not None}" + (
            "" if m is None else f", min_nodes={2 * m - 1}")
