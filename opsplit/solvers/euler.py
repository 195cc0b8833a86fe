r"""Explicit (forward) Euler for one substep: paper 002, Appendix C,
:math:`u^{n+k/K} = u^{n+(k-1)/K} + \Delta t\, A_k(t; u^{n+(k-1)/K})`; with
:math:`\Delta t = 1` the attention substep (13)/(19) and the linear part of (23)."""

from __future__ import annotations

import torch
from torch import Tensor

from .solver import Solver

__all__ = ["ExplicitEuler"]


class ExplicitEuler(Solver):
    """:math:`u \\mapsto u + \\Delta t\\,A(t; u)`. Order 1; needs ``field``."""

    order = 1
    requires = "field"
    reversible = True

    def step(self, terms, t, dt: float, u: Tensor, grid) -> Tensor:
        f = terms[0].field(t, u, grid)
        if isinstance(dt, Tensor):
            return u + dt * f
        # one fused pass (u + dt * f without the intermediate dt * f; bitwise u + f for dt = 1)
        return torch.add(u, f, alpha=dt)
