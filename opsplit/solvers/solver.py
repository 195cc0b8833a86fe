r"""The substep-solver interface: *how one substep is advanced*.

A :class:`Solver` advances one substep :math:`u_t = A_k(t; u)` of a splitting scheme from
:math:`t` to :math:`t + \Delta t` (paper 002, Appendix C, eqs. 58–59), using exactly one
capability of the operator (``field``, ``resolvent`` or ``flow``; see
:mod:`opsplit.operators.base`).  Each solver declares its ``order`` (local error
:math:`O(\Delta t^{p+1})`), the capability it requires and its ``stages`` (evaluations of
that capability per substep call and term).  The solvers by name:
:mod:`opsplit.solvers.registry`; the pair (operator, solver) a scheme holds:
:class:`~opsplit.solvers.Substep`.

This module is the bottom of :mod:`opsplit.solvers`: every solver file imports it, and it
imports none of them.
"""

from __future__ import annotations

from torch import Tensor

__all__ = ["Solver", "capabilities"]

_CAPABILITIES = ("field", "resolvent", "flow")


def capabilities(term) -> list[str]:
    """The capabilities ``term`` has, of ``field``, ``resolvent``, ``flow`` (for errors)."""
    return [c for c in _CAPABILITIES if getattr(term, f"has_{c}", False)]


def _refusal(solver, needs: str, term, which: str) -> ValueError:
    """``"<Solver> needs <needs>, but <which> has only [...]; its default solver is ..."``."""
    return ValueError(
        f"{type(solver).__name__} needs {needs}, but {which} has only {capabilities(term) or 'nothing'}; "
        f"its default solver is {getattr(term, 'default_solver', '?')!r}"
    )


class Solver:
    """Base class of substep solvers (stateless; one instance may serve many substeps)."""

    #: order of accuracy of the substep solve
    order: int = 1
    #: operator capability used: "field", "resolvent" or "flow"
    requires: str = "field"
    #: evaluations of that capability per substep call and term (Heun's two stages, RK4's
    #: four); ``None`` where it is not fixed (an adaptive ODE solve)
    stages: int | None = 1
    #: how many operators one substep of this solver takes (SemiImplicit takes 2); ``None``:
    #: any number of operators with explicit fields, advanced as their sum (Heun, RK4,
    #: ODESolve)
    n_terms: int | None = 1
    #: the solver can advance a substep over a negative time step (dt < 0), as the
    #: compositions of order >= 3 need (Sheng-Suzuki): explicit and exact-flow solvers can;
    #: a resolvent (an implicit step, a projection) cannot run backwards
    reversible: bool = False

    def check(self, terms) -> None:
        """Raise a clear error if the solver cannot advance ``terms``."""
        name = type(self).__name__
        if self.n_terms is None:
            if len(terms) < 1:
                raise ValueError(f"{name}: expected at least one operator with an explicit field")
            for k, term in enumerate(terms):
                if not getattr(term, "has_field", False):
                    raise _refusal(self, "operators with an explicit field", term,
                                   f"term {k} ({type(term).__name__})")
            return
        if len(terms) != self.n_terms:
            raise ValueError(f"{name} advances {self.n_terms} operator(s) per substep, got {len(terms)}")
        (term,) = terms
        if not getattr(term, f"has_{self.requires}", False):
            raise _refusal(self, f"an operator with a {self.requires}", term, type(term).__name__)

    def step(self, terms, t, dt: float, u: Tensor, grid) -> Tensor:  # pragma: no cover
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"
