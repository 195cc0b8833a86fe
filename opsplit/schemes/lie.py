r"""Sequential (Lie) splitting, paper 002 Appendix C eq. (58); the scheme (13)–(17).

Given :math:`u^n`, for :math:`k = 1, \dots, K` solve
:math:`u_t = A_k(t; u)` on :math:`(t^n, t^{n+1}]` from :math:`u^{n+(k-1)/K}` and set
:math:`u^{n+k/K} = u(t^{n+1})`; then :math:`u^{n+1} = u^{n+K/K}`.  First order for
non-commuting terms (with first-order or better substep solvers).
"""

from __future__ import annotations

from torch import Tensor

from .base import Scheme

__all__ = ["Lie"]


class Lie(Scheme):
    """Sequential splitting: the substeps in order, each over the full step. Order 1."""

    order = 1

    def step(self, t, dt: float, u: Tensor, grid) -> Tensor:
        for s in self.substeps:
            u = s(t, dt, u, grid)
        return u
