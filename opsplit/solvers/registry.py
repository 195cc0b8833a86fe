r"""The substep solvers by name: one table for every reader.

:data:`SOLVERS` maps a name to a :class:`~opsplit.solvers.Solver` class; what a reader
needs is on the class (one solver a file, each declaring it, as diffrax's solvers declare
``order()``):

* ``order``: the order of the substep solve (local error :math:`O(\Delta t^{p+1})`);
* ``stages``: evaluations of the operator per substep call and term (Heun 2, RK4 4;
  ``None`` where not fixed: ``odeint``'s adaptive default);
* ``requires``: the operator capability used, ``"field"``, ``"resolvent"`` or ``"flow"``;
* ``n_terms``: operators per substep (``None``: any number of fields, advanced as their
  sum), ``reversible``: whether it runs over a negative time step.

The class attributes describe the solver built with its defaults (``ODESolve()`` is
dopri5); an instance may refine them (``ODESolve("rk4").order == 4``).

:data:`EXPLICIT_SOLVERS` are the explicit Runge–Kutta solvers of a fixed number of stages
(``"euler"``, ``"heun"``, ``"rk4"``, in order of accuracy): the ones a solver swap
(:func:`opsplit.control.solved_with`), a training draw and a comparison take by name.
:func:`solver_for` gives a solver by name, or an operator's default solver;
:func:`solver_class` the class, with an error that lists the names.

Adding a solver: one file with its :class:`~opsplit.solvers.Solver` subclass, one row in
:data:`SOLVERS`.
"""

from __future__ import annotations

from types import MappingProxyType

from .catch_up import CatchUp
from .euler import ExplicitEuler
from .exact import Exact
from .exact_midpoint import ExactMidpoint
from .heun import Heun
from .implicit import Implicit
from .odeint import ODESolve
from .rk4 import RK4
from .semi_implicit import SemiImplicit
from .solver import Solver

__all__ = ["SOLVERS", "EXPLICIT_SOLVERS", "DEFAULT_SOLVERS", "solver_class", "solver_for", "name_of"]

#: name -> Solver class (read-only)
SOLVERS = MappingProxyType({
    "euler": ExplicitEuler,
    "heun": Heun,
    "rk4": RK4,
    "odeint": ODESolve,
    "implicit": Implicit,
    "semi_implicit": SemiImplicit,
    "catch_up": CatchUp,
    "exact": Exact,
    "exact_midpoint": ExactMidpoint,
})

#: the explicit Runge–Kutta solvers of a fixed number of stages, in order of accuracy (the
#: names a solver swap, a training draw and a comparison take)
EXPLICIT_SOLVERS: tuple[str, ...] = ("euler", "heun", "rk4")

#: an operator's ``default_solver`` kind -> the name of the solver it means
DEFAULT_SOLVERS = MappingProxyType({"explicit": "euler", "implicit": "implicit", "exact": "exact"})

_BY_CLASS = {cls: name for name, cls in SOLVERS.items()}


def solver_class(name, where: str = "solver") -> type[Solver]:
    """The :class:`~opsplit.solvers.Solver` class named ``name`` in :data:`SOLVERS`; an
    unknown name is refused naming ``where`` and listing the names."""
    if not isinstance(name, str):
        raise TypeError(f"{where}: expected a substep solver name (a str), got {type(name).__name__}")
    cls = SOLVERS.get(name)
    if cls is None:
        raise ValueError(f"{where}: expected a substep solver name, one of {', '.join(map(repr, SOLVERS))}; "
                         f"got {name!r}")
    return cls


def solver_for(term) -> Solver:
    """A solver with its default options: ``term`` a name of :data:`SOLVERS`
    (``solver_for("heun")``), or an operator, whose ``default_solver`` kind
    (``"explicit"``, ``"implicit"``, ``"exact"``) names it (:data:`DEFAULT_SOLVERS`)."""
    if isinstance(term, str):
        return solver_class(term, "solver_for")()
    if not hasattr(term, "default_solver"):
        raise TypeError(f"solver_for: expected a solver name or an opsplit Operator, got {type(term).__name__}")
    kind = term.default_solver
    if not isinstance(kind, str) or kind not in DEFAULT_SOLVERS:
        raise ValueError(f"{type(term).__name__}: unknown default_solver {kind!r}; expected one of "
                         f"{', '.join(map(repr, DEFAULT_SOLVERS))}")
    return SOLVERS[DEFAULT_SOLVERS[kind]]()


def name_of(solver) -> str | None:
    """The name in :data:`SOLVERS` of ``solver``'s class (an instance or a class; subclasses
    have none), else ``None``."""
    return _BY_CLASS.get(solver if isinstance(solver, type) else type(solver))
