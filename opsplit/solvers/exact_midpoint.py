r"""The exact flow of a substep with its controls frozen at the substep's midpoint.

:class:`~opsplit.solvers.Exact` runs an operator's exact flow with the controls frozen
at the substep's start :math:`t`: exact when the controls are constant over the substep
(piecewise-constant controls on the time grid), but only first order in
:math:`\Delta t` when they vary in time.  Freezing them at the midpoint
:math:`t + \Delta t/2` instead is the exponential midpoint rule (the first term of the
Magnus expansion, :math:`\int_t^{t+\Delta t} A(s)\,ds = \Delta t\,A(t + \Delta t/2) +
O(\Delta t^3)`): order 2 for controls smooth in time, and still exact for controls
constant over the substep.
"""

from __future__ import annotations

from torch import Tensor

from .solver import Solver

__all__ = ["ExactMidpoint"]


class ExactMidpoint(Solver):
    """The operator's flow over :math:`[t, t + \\Delta t]` with controls at
    :math:`t + \\Delta t/2`. Order 2 (exact for controls constant in time); needs ``flow``."""

    order = 2
    requires = "flow"
    reversible = True

    def check(self, terms) -> None:
        super().check(terms)
        if hasattr(terms[0], "steps"):
            # a composite (Relaxation) runs its inner substeps over [t, t + dt]: shifting its
            # start time would move that interval, not just the controls' evaluation time
            raise ValueError(
                f"ExactMidpoint cannot advance {type(terms[0]).__name__}: its flow runs inner "
                "substeps over [t, t + dt]; use Exact, or give the inner substeps their own solvers"
            )

    def step(self, terms, t, dt: float, u: Tensor, grid) -> Tensor:
        return terms[0].flow(float(t) + 0.5 * dt, dt, u, grid)
