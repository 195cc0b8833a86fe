r"""Explicit (forward) Euler for one substep: paper 002, Appendix C,
:math:`u^{n+k/K} = u^{n+(k-1)/K} + \Delta t\, A_k(t; u^{n+(k-1)/K})`; with
:math:`\Delta t = 1` the attention substep (13)/(19) and the linear part of (23)."""

from __future__ import annotations

from torch import Tensor

from .base import Solver

__all__ = ["ExplicitEuler"]


class ExplicitEuler(Solver):
    """:math:`u \\mapsto u + \\Delta t\\,A(t; u)`. Order 1; needs ``field``."""

    order = 1
    requires = "field"

    def step(self, terms, t, dt: float, u: Tensor, grid) -> Tensor:
        return u + dt * terms[0].field(t, u, grid)
