r"""Implicit (backward) Euler for one substep, through the operator's resolvent:
:math:`u^{n+k/K} = (I - \Delta t A_k)^{-1} u^{n+(k-1)/K}` (paper 002, Appendix C).

For the subdifferential of an indicator, :math:`A = -\partial I_S`, the resolvent is the
projection onto :math:`S` for every :math:`\Delta t` (eqs. 20–21, 24): substeps (14) and
(17) (LayerNorm) and the second line of (23) (ReLU).  Controls are frozen at the
substep's start time (the paper's :math:`\sigma_i^n`)."""

from __future__ import annotations

from torch import Tensor

from .solver import Solver

__all__ = ["Implicit"]


class Implicit(Solver):
    """:math:`u \\mapsto (I - \\Delta t A(t; \\cdot))^{-1} u`. Order 1; needs ``resolvent``."""

    order = 1
    requires = "resolvent"

    def step(self, terms, t, dt: float, u: Tensor, grid) -> Tensor:
        return terms[0].resolvent(t, dt, u, grid)
