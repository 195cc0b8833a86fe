r"""Controls continuous in space: polynomial expansions evaluated on any grid.

A :class:`PolynomialSeries` represents a control as a function of the spatial variables,

.. math::  W(s_1, \dots, s_d, t) = \sum_{p} c_p(t) \prod_{i=1}^d \varphi_{p_i}(2 s_i/L_i - 1),

with :math:`\varphi` Legendre or Chebyshev polynomials (``opsplit.controls.basis_matrix``)
and coefficients :math:`c(t)` given by any time control.  It complements
:class:`~opsplit.controls.CosineSeries`: a cosine series has vanishing odd derivatives
at both ends of :math:`[0, L]`, which makes the midpoint rule super-convergent on it; a
polynomial series is a generic smooth function, on which the grid's quadrature shows its
nominal order (2 for the midpoint rule).  Evaluated on a grid, the control returns the
function's values at the grid's nodes; the integrals then carry the grid's weights.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .base import Control
from .basis import _SpatialSeries
from .time_basis import basis_matrix

__all__ = ["PolynomialSeries"]


def polynomial_basis(itv, n_modes: int, kind: str, dtype, device) -> Tensor:
    """``(N, n_modes)`` matrix of :math:`\\varphi_p(2 s/L - 1)` at the nodes of ``itv``."""
    s = itv.nodes(torch.float64) * (2.0 / itv.length) - 1.0
    return basis_matrix(kind, s, n_modes).to(dtype=dtype, device=device)


class PolynomialSeries(_SpatialSeries):
    """A control given by Legendre/Chebyshev coefficients over its spatial ``axes``.

    Args:
        coefficients: a time control whose value has shape ``(P_1, ..., P_d)`` (one mode
            count per axis), or ``(*lead, P_1, ..., P_d)``.
        axes: the spatial domain of each basis dimension, e.g. ``("y", "y")`` for a kernel
            :math:`W(\\tilde y, y)` or ``("x",)`` for a bias :math:`b(x)`.
        basis: ``"legendre"`` (default) or ``"chebyshev"``.
    """

    def __init__(self, coefficients: Control, axes=("y", "y"), basis: str = "legendre"):
        super().__init__(coefficients, axes)
        if basis not in ("legendre", "chebyshev"):
            raise ValueError(
                f"PolynomialSeries.basis: expected 'legendre' or 'chebyshev', got {basis!r}"
            )
        self.basis = basis

    def _basis(self, itv, n_modes: int, dtype, device) -> Tensor:
        return polynomial_basis(itv, n_modes, self.basis, dtype, device)

    def extra_repr(self) -> str:
        return f"axes={self.axes}, basis={self.basis!r}"
