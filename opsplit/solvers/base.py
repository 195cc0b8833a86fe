r"""A :class:`Substep` is the pair (operator, solver) a scheme holds.

The solver interface, :class:`~opsplit.solvers.Solver`, is :mod:`opsplit.solvers.solver`
(re-exported here); the solvers by name and an operator's default solver,
:func:`~opsplit.solvers.solver_for`, are :mod:`opsplit.solvers.registry`.  Controls are
evaluated at the substep's start time :math:`t` by the first-order solvers (the paper's
:math:`\theta^n = \theta(t^n)` for every substep of step :math:`n`).
"""

from __future__ import annotations

from torch import Tensor, nn

from .._checks import check_finite_float, check_time, skip_value_checks
from .registry import solver_for
from .solver import Solver

__all__ = ["Solver", "Substep", "solver_for"]


class Substep(nn.Module):
    """One substep of a splitting scheme: operator(s) and the solver that advances them.

    Args:
        terms: an operator, or a tuple of operators for solvers that take several
            (:class:`~opsplit.solvers.SemiImplicit` takes (explicit part, implicit part)).
        solver: a :class:`Solver`; ``None`` picks the operator's default.
    """

    def __init__(self, terms, solver: Solver | None = None):
        super().__init__()
        if isinstance(terms, nn.Module):
            terms = (terms,)
        terms = tuple(terms)
        if not terms:
            raise ValueError("Substep: expected at least one operator")
        for k, op in enumerate(terms):
            if not all(hasattr(op, a) for a in ("has_field", "has_resolvent", "has_flow")):
                raise TypeError(
                    f"Substep: term {k} is a {type(op).__name__}, expected an opsplit Operator"
                )
        if solver is None:
            if len(terms) != 1:
                raise ValueError("Substep: several operators need an explicit solver (SemiImplicit)")
            solver = solver_for(terms[0])
        if not isinstance(solver, Solver):
            raise TypeError(f"Substep.solver: expected a Solver, got {type(solver).__name__}")
        solver.check(terms)
        self.terms = nn.ModuleList(terms)
        self.solver = solver

    @property
    def order(self) -> int:
        """The solver's order, capped by composite operators' own (e.g. a Relaxation)."""
        return min([self.solver.order] + [op.order for op in self.terms if hasattr(op, "order")])

    def check(self, grid) -> None:
        for op in self.terms:
            op.check(grid)

    def forward(self, t, dt: float, u: Tensor, grid) -> Tensor:
        """Advance ``u`` over ``[t, t + dt]``.  ``t`` and ``dt`` must be finite numbers (a
        cheap check on Python numbers; the scheme and the propagator check the sign)."""
        check_time(t, "Substep: t")
        if not isinstance(dt, Tensor) and not skip_value_checks():
            check_finite_float(dt, "Substep: dt")
        return self.solver.step(self.terms, t, dt, u, grid)

    def extra_repr(self) -> str:
        return f"solver={self.solver!r}"
