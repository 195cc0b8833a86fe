r"""Controls continuous in space: smooth basis expansions evaluated on any grid.

A :class:`CosineSeries` represents a control as a function of the spatial variables,

.. math::  W(s_1, \dots, s_d, t) = \sum_{p} c_p(t)\, \prod_{i=1}^d \cos(p_i \pi s_i / L_i),

with coefficients :math:`c(t)` given by any time control (e.g.
:class:`~opsplit.controls.PiecewiseConstant`).  Evaluated on a grid it returns the
function's values at the grid's nodes, so the same continuous model can be solved at any
resolution :math:`N_x, N_y` (the integrals then carry the grid's quadrature weights).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from .base import Control

__all__ = ["CosineSeries"]


def cosine_basis(itv, n_modes: int, dtype, device) -> Tensor:
    """``(N, n_modes)`` matrix of :math:`\\cos(p\\pi s/L)` at the nodes of ``itv``."""
    s = itv.nodes(torch.float64)
    p = torch.arange(n_modes, dtype=torch.float64)
    return torch.cos(torch.outer(s, p) * (math.pi / itv.length)).to(dtype=dtype, device=device)


class _SpatialSeries(Control):
    """A control given by coefficients of a basis over its spatial ``axes`` (one or two):
    ``forward(t, grid)`` evaluates the coefficients at ``t`` and the basis at ``grid``'s
    nodes, :math:`c\\,\\Phi^\\top` (one axis) or :math:`\\Phi_1 c\\,\\Phi_2^\\top` (two).
    Subclasses give ``_basis(itv, n_modes, dtype, device)``, the ``(N, n_modes)`` matrix."""

    def __init__(self, coefficients: Control, axes=("y", "y")):
        super().__init__(axes)
        name = type(self).__name__
        if not isinstance(coefficients, Control):
            raise TypeError(f"{name}.coefficients: expected a Control, got {type(coefficients).__name__}")
        if len(self.axes) not in (1, 2):
            raise ValueError(f"{name}: expected 1 or 2 axes, got {self.axes!r}")
        self.coefficients = coefficients

    def _basis(self, itv, n_modes: int, dtype, device) -> Tensor:  # pragma: no cover - abstract
        raise NotImplementedError

    def forward(self, t, grid=None) -> Tensor:
        name = type(self).__name__
        if grid is None:
            raise ValueError(f"{name}: a grid is needed to evaluate a continuous control")
        c = self.coefficients(t)
        d = len(self.axes)
        if c.dim() < d:
            raise ValueError(f"{name}: coefficients of shape {tuple(c.shape)} for {d} axes")
        mats = []
        for k, axis in enumerate(self.axes):
            itv = getattr(grid, axis)
            if itv is None or not itv.is_complete:
                raise ValueError(f"{name}: the grid needs a complete Omega_{axis} interval")
            mats.append(self._basis(itv, c.shape[c.dim() - d + k], c.dtype, c.device))
        if d == 1:
            return c @ mats[0].T
        return mats[0] @ c @ mats[1].T

    def extra_repr(self) -> str:
        return f"axes={self.axes}"


class CosineSeries(_SpatialSeries):
    """A control given by cosine-series coefficients over its spatial ``axes``.

    Args:
        coefficients: a time control whose value has shape ``(P_1, ..., P_d)`` (one mode
            count per axis), or, for a batch of functions, ``(*lead, P_1, ..., P_d)``.
        axes: the spatial domain of each basis dimension, e.g. ``("y", "y")`` for a kernel
            :math:`W(\tilde y, y)` or ``("x",)`` for a bias :math:`b(x)`.
    """

    def _basis(self, itv, n_modes: int, dtype, device) -> Tensor:
        return cosine_basis(itv, n_modes, dtype, device)
