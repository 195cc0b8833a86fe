r"""Heun's method (explicit trapezoidal rule, RK2) for one substep.

.. math::

    k_1 = A(t; u),\qquad k_2 = A\big((t + \Delta t)^-;\ u + \Delta t\, k_1\big),\qquad
    u \mapsto u + \tfrac{\Delta t}{2}(k_1 + k_2).

Order 2, also for controls that vary in time: the controls are evaluated at the stage
times :math:`t` and :math:`(t + \Delta t)^-` (the left limit, see
:class:`~opsplit.controls.LeftLimit`).  With it, Strang splitting is second order.
"""

from __future__ import annotations

from torch import Tensor

from ._fields import end_time, field_sum
from .solver import Solver

__all__ = ["Heun"]


class Heun(Solver):
    """Explicit trapezoidal rule (RK2). Order 2; needs ``field`` (sums several terms)."""

    order = 2
    stages = 2
    n_terms = None
    reversible = True

    def step(self, terms, t, dt: float, u: Tensor, grid) -> Tensor:
        k1 = field_sum(terms, t, u, grid)
        k2 = field_sum(terms, end_time(t, dt), u + dt * k1, grid)
        return u + (0.5 * dt) * (k1 + k2)
