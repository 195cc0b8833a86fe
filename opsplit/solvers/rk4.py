r"""The classical fourth-order Runge–Kutta method for one substep.

.. math::

    k_1 &= A(t; u), & k_2 &= A(t + \tfrac{\Delta t}{2};\ u + \tfrac{\Delta t}{2} k_1),\\
    k_3 &= A(t + \tfrac{\Delta t}{2};\ u + \tfrac{\Delta t}{2} k_2), &
    k_4 &= A((t + \Delta t)^-;\ u + \Delta t\, k_3),

:math:`u \mapsto u + \tfrac{\Delta t}{6}(k_1 + 2k_2 + 2k_3 + k_4)`.  Order 4, with the
controls evaluated at the stage times (the last one as the left limit
:math:`(t + \Delta t)^-`).
"""

from __future__ import annotations

from torch import Tensor

from ._fields import end_time, field_sum
from .solver import Solver

__all__ = ["RK4"]


class RK4(Solver):
    """Classical Runge–Kutta. Order 4; needs ``field`` (sums several terms)."""

    order = 4
    stages = 4
    n_terms = None
    reversible = True

    def step(self, terms, t, dt: float, u: Tensor, grid) -> Tensor:
        h = 0.5 * dt
        tm = float(t) + h
        k1 = field_sum(terms, t, u, grid)
        k2 = field_sum(terms, tm, u + h * k1, grid)
        k3 = field_sum(terms, tm, u + h * k2, grid)
        k4 = field_sum(terms, end_time(t, dt), u + dt * k3, grid)
        return u + (dt / 6.0) * (k1 + 2.0 * (k2 + k3) + k4)
