r"""The substep-solver interface: *how one substep is advanced*.

A :class:`Solver` advances one substep :math:`u_t = A_k(t; u)` of a splitting scheme from
:math:`t` to :math:`t + \Delta t` (paper 002, Appendix C, eqs. 58–59), using exactly one
capability of the operator (``field``, ``resolvent`` or ``flow``; see
:mod:`opsplit.operators.base`).  Each solver declares its ``order`` (local error
:math:`O(\Delta t^{p+1})`) and which capability it requires.

A :class:`Substep` is the pair (operator, solver) a scheme holds.  Controls are evaluated
at the substep's start time :math:`t` by the first-order solvers (the paper's
:math:`\theta^n = \theta(t^n)` for every substep of step :math:`n`).
"""

from __future__ import annotations

from torch import Tensor, nn

from .._checks import check_finite_float, check_time, skip_value_checks

__all__ = ["Solver", "Substep", "solver_for"]


class Solver:
    """Base class of substep solvers (stateless; one instance may serve many substeps)."""

    #: order of accuracy of the substep solve
    order: int = 1
    #: operator capability used: "field", "resolvent" or "flow"
    requires: str = "field"
    #: how many operators one substep of this solver takes (SemiImplicit takes 2)
    n_terms: int = 1
    #: the solver can advance a substep over a negative time step (dt < 0), as the
    #: compositions of order >= 3 need (Sheng-Suzuki): explicit and exact-flow solvers can;
    #: a resolvent (an implicit step, a projection) cannot run backwards
    reversible: bool = False

    def check(self, terms) -> None:
        """Raise a clear error if the solver cannot advance ``terms``."""
        if len(terms) != self.n_terms:
            raise ValueError(
                f"{type(self).__name__} advances {self.n_terms} operator(s) per substep, got {len(terms)}"
            )
        (term,) = terms
        if not getattr(term, f"has_{self.requires}", False):
            caps = [c for c in ("field", "resolvent", "flow") if getattr(term, f"has_{c}", False)]
            raise ValueError(
                f"{type(self).__name__} needs an operator with a {self.requires}, but "
                f"{type(term).__name__} has only {caps or 'nothing'}; "
                f"its default solver is {getattr(term, 'default_solver', '?')!r}"
            )

    def step(self, terms, t, dt: float, u: Tensor, grid) -> Tensor:  # pragma: no cover
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


def solver_for(term) -> Solver:
    """The default solver of an operator (its ``default_solver`` attribute)."""
    from .euler import ExplicitEuler
    from .exact import Exact
    from .implicit import Implicit

    kind = getattr(term, "default_solver", None)
    table = {"explicit": ExplicitEuler, "implicit": Implicit, "exact": Exact}
    if kind not in table:
        raise ValueError(f"{type(term).__name__}: unknown default_solver {kind!r}")
    return table[kind]()


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
