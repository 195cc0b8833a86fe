r"""Symmetric (Strang) splitting: second order.

For :math:`u_t = \sum_{k=1}^K A_k(t; u)` one step :math:`t \to t + \Delta t` is the
symmetric composition

.. math::  \Phi^{1}_{\Delta t/2} \circ \dots \circ \Phi^{K-1}_{\Delta t/2} \circ
           \Phi^{K}_{\Delta t} \circ \Phi^{K-1}_{\Delta t/2} \circ \dots \circ
           \Phi^{1}_{\Delta t/2}

(read right to left: substeps :math:`1, \dots, K-1` over half a step, substep :math:`K`
over the full step, then :math:`K-1, \dots, 1` again over half a step).  It is second
order for non-commuting terms when every substep is solved to at least second order; with
first-order substeps (explicit Euler, the paper's choices) it is first order.

**Time intervals.**  The first half-substeps advance over :math:`[t, t + \Delta t/2]`,
the middle one over :math:`[t, t + \Delta t]`, the second half-substeps over
:math:`[t + \Delta t/2, t + \Delta t]`, each called as ``substep(start, length, u, grid)``.
For controls varying in time this keeps second order: a substep over an interval agrees
to :math:`O(\Delta t^3)` with the same substep with its controls frozen at the interval's
midpoint, and the two half-substeps of term :math:`k` (midpoints :math:`t + \Delta t/4`,
:math:`t + 3\Delta t/4`) together integrate :math:`A_k` over :math:`[t, t + \Delta t]`
to :math:`O(\Delta t^3)`, which is what the symmetric composition needs.  The substep
solvers must then see the time dependence inside their interval (``Heun``, ``RK4``,
``ODESolve``, ``ExactMidpoint``); solvers that freeze the controls at the interval's
start (``ExplicitEuler``, ``Implicit``, ``Exact`` of the core) are first order in time
whenever the controls vary within a step.
"""

from __future__ import annotations

from torch import Tensor

from .base import Scheme

__all__ = ["Strang"]


class Strang(Scheme):
    """Symmetric splitting: substeps ``1..K-1`` over half steps, ``K`` over the full step,
    ``K-1..1`` over half steps. Order 2 (``effective_order`` is 1 with first-order
    substeps)."""

    order = 2

    @property
    def n_calls(self) -> int:
        """Substep calls per step: :math:`2K - 1`."""
        return 2 * len(self.substeps) - 1

    def step(self, t, dt: float, u: Tensor, grid) -> Tensor:
        *outer, middle = self.substeps
        h = 0.5 * dt
        for s in outer:
            u = s(t, h, u, grid)
        u = middle(t, dt, u, grid)
        tm = float(t) + h
        for s in reversed(outer):
            u = s(tm, h, u, grid)
        return u
