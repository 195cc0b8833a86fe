r"""A band-limited Fourier multiplier on :math:`\Omega_x = [0, L)` (periodic): the projection
of a field onto the trigonometric polynomials of degree :math:`M`, each mode scaled by a
trainable complex factor.

.. math::

    (\mathcal P_M^c\, w)(x) = \sum_{|m| \le M} c_m\, \hat w_m\, e^{2\pi i m x / L}, \qquad
    \hat w_m = \frac1L \int_{\Omega_x} w(\tilde x)\, e^{-2\pi i m \tilde x / L}\, d\tilde x,
    \qquad c_{-m} = \overline{c_m}, \; c_0 \in \mathbb R.                         \tag{P}

It is the convolution integral :math:`\int \kappa(x - \tilde x)\, w(\tilde x)\, d\tilde x`
with the kernel :math:`\kappa(\zeta) = \frac1L \sum_{|m| \le M} c_m e^{2\pi i m\zeta/L}` — a
trigonometric polynomial of the physical offset, like the kernel of
:class:`~opsplit.operators.SpectralConvolution`, but acting on each output channel alone
(no mixing) and with no local part: its output lies in the span of the modes
:math:`|m| \le M` whatever its input.  With :math:`c_m = 1` it is the :math:`L^2`-orthogonal
projection onto that span (the truncated Fourier series).

**Quadrature.**  On :math:`N_x` equally spaced nodes :math:`x_j = jL/N_x` the coefficient
is the rectangle rule, :math:`\hat w^h_m = \frac{1}{N_x} \sum_j w(x_j)
e^{-2\pi i m j / N_x}` (one real FFT), exact for the modes :math:`|m| < N_x - M` of
:math:`w` and spectrally accurate for a smooth periodic :math:`w`; the output is the
trigonometric polynomial evaluated at the nodes.  So the same factors are one operator on
every grid: a field of degree :math:`\le M` gives the same function on 64 nodes and on
8192.  A grid needs :math:`N_x > 2M` nodes (fewer would alias the modes: refused).

Used as the last map of :class:`~opsplit.models.NeuralOperatorTransformer` with
``output_modes``: a pointwise projection (G) makes modes above the band of the target from
products of the state (its GELU), and (P) removes them and learns the gain of the ones it
keeps.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from .._checks import (
    check_finite,
    check_float_dtype,
    check_parameters_finite,
    check_positive_int,
    check_tensor,
)
from ._guard import checked_call
from .spectral_convolution import irfft_nodes, rfft_modes

__all__ = ["FourierMultiplier"]


class FourierMultiplier(nn.Module):
    r"""The band-limited multiplier (P) of the module docstring, on ``(B, N_x)`` or
    ``(B, N_x, C)`` fields sampled at :math:`x_j = jL/N_x`.

    Args:
        modes: :math:`M + 1`, the modes :math:`0..M` kept.
        channels: :math:`C`, the channels of the field (each with its own factors);
            ``1`` also accepts ``(B, N_x)``.

    The output does not depend on :math:`L`: (P) acts on the modes of the samples.

    ``forward`` checks the field (shape, node count, floating dtype, finite values) and the
    factors (finite, named) before any compute, and its output after it; an empty batch ``(0, N_x, C)`` gives an empty
    batch, as ``torch.nn`` modules do.

    ``factors`` ``(2, M + 1, C)`` holds the real and imaginary parts of :math:`c_0, \dots,
    c_M` (the imaginary part of :math:`c_0` is not used: a real field has a real mean),
    initialised to :math:`c_m = 1`, the orthogonal projection.
    """

    def __init__(self, modes: int, channels: int = 1, *, device=None, dtype=None):
        super().__init__()
        self.modes = check_positive_int(modes, "FourierMultiplier.modes")
        self.channels = check_positive_int(channels, "FourierMultiplier.channels")
        fk = {"device": device, "dtype": dtype or torch.get_default_dtype()}
        self.factors = nn.Parameter(torch.zeros(2, self.modes, self.channels, **fk))
        self.reset_parameters()

    @property
    def min_nodes(self) -> int:
        """:math:`2M + 1`: the fewest nodes that carry the modes :math:`|m| \\le M`."""
        return 2 * self.modes - 1

    @torch.no_grad()
    def reset_parameters(self) -> None:
        """:math:`c_m = 1`: the orthogonal projection onto the modes :math:`|m| \\le M`."""
        self.factors.zero_()
        self.factors[0].fill_(1.0)

    def forward(self, w: Tensor) -> Tensor:
        w = check_tensor(w, "FourierMultiplier input")
        squeeze = w.dim() == 2
        if squeeze and self.channels == 1:
            w = w.unsqueeze(-1)
        if w.dim() != 3 or w.shape[-1] != self.channels:
            want = "(B, N_x) or (B, N_x, 1)" if self.channels == 1 else f"(B, N_x, {self.channels})"
            raise ValueError(f"FourierMultiplier input: expected shape {want}, got {tuple(w.shape)}")
        n = w.shape[1]
        if n < self.min_nodes:
            raise ValueError(
                f"FourierMultiplier: the field has N_x = {n} nodes; the multiplier keeps "
                f"the modes |m| <= {self.modes - 1} and needs N_x >= {self.min_nodes} (fewer nodes would alias them)")
        check_float_dtype(w, "FourierMultiplier input")
        check_finite(w, "FourierMultiplier input")
        check_parameters_finite(self, "FourierMultiplier")
        out = checked_call(self, "FourierMultiplier", lambda: self._multiply(w))
        return out.squeeze(-1) if squeeze else out

    def _multiply(self, w: Tensor) -> Tensor:
        """(P) on a checked ``(B, N_x, C)`` field (an empty batch gives an empty batch)."""
        n = w.shape[1]
        f = self.factors.to(w.dtype)
        c = torch.complex(f[0], torch.cat([torch.zeros_like(f[1, :1]), f[1, 1:]], 0))  # (M + 1, C), c_0 real
        W = rfft_modes(w.transpose(1, 2), self.modes)  # (B, C, M + 1): N_x * w^h_m
        return irfft_nodes(W * c.transpose(0, 1), n).transpose(1, 2)  # sum_m c_m w^h_m e^{2 pi i m j/n}

    def extra_repr(self) -> str:
        return f"modes={self.modes}, channels={self.channels}, min_nodes={self.min_nodes}"
