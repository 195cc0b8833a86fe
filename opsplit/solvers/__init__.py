"""Substep solvers: *how one substep is advanced* (one solver per file, each with its order)."""

from .base import Solver, Substep, solver_for
from .euler import ExplicitEuler
from .exact import Exact
from .implicit import Implicit
from .semi_implicit import SemiImplicit

__all__ = ["Solver", "Substep", "solver_for", "ExplicitEuler", "Implicit", "Exact", "SemiImplicit"]
