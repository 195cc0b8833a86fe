r"""Semi-implicit (forward–backward) Euler for a substep with two terms, a smooth one
:math:`F` taken explicitly and a monotone one :math:`G` taken implicitly:

.. math::  u^{(2+j)/M} - u^{(1+j)/M} = F_j(u^{(1+j)/M}) + G(u^{(2+j)/M}),

paper 002, substep (15), solved exactly by the sequential split (23):
:math:`u^{(2+j)/M} = (I - \Delta t G)^{-1}\big(u^{(1+j)/M} + \Delta t F_j(u^{(1+j)/M})\big)`.
With :math:`G = -\partial I_{S_2}` this is ``ReLU(u + Δt (u W_j + b_j))`` (eqs. 34–35),
a proximal-gradient step."""

from __future__ import annotations

from torch import Tensor

from .solver import Solver

__all__ = ["SemiImplicit"]


class SemiImplicit(Solver):
    """Forward–backward Euler on ``(explicit term, implicit term)``. Order 1."""

    order = 1
    n_terms = 2

    def check(self, terms) -> None:
        if len(terms) != 2:
            raise ValueError(
                f"SemiImplicit advances (explicit term, implicit term), got {len(terms)} operator(s)"
            )
        f, g = terms
        if not f.has_field:
            raise ValueError(f"SemiImplicit: the first term {type(f).__name__} has no explicit field")
        if not g.has_resolvent:
            raise ValueError(f"SemiImplicit: the second term {type(g).__name__} has no resolvent")

    def step(self, terms, t, dt: float, u: Tensor, grid) -> Tensor:
        f, g = terms
        return g.resolvent(t, dt, u + dt * f.field(t, u, grid), grid)
