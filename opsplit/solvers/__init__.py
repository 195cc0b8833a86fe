"""Substep solvers: *how one substep is advanced* (one solver per file, each with its order;
the solvers by name: :data:`SOLVERS`, :func:`solver_for`)."""

from .base import Substep
from .catch_up import CatchUp
from .euler import ExplicitEuler
from .exact import Exact
from .exact_midpoint import ExactMidpoint
from .heun import Heun
from .implicit import Implicit
from .odeint import ODESolve
from .projected import ProjectedS1, TangentS1, tangent_s1
from .registry import DEFAULT_SOLVERS, EXPLICIT_SOLVERS, SOLVERS, name_of, solver_class, solver_for
from .rk4 import RK4
from .semi_implicit import SemiImplicit
from .solver import Solver

__all__ = [
    "Solver",
    "Substep",
    "solver_for",
    "solver_class",
    "name_of",
    "SOLVERS",
    "EXPLICIT_SOLVERS",
    "DEFAULT_SOLVERS",
    "ExplicitEuler",
    "Implicit",
    "Exact",
    "SemiImplicit",
    "Heun",
    "RK4",
    "ODESolve",
    "ExactMidpoint",
    "CatchUp",
    "ProjectedS1",
    "TangentS1",
    "tangent_s1",
]
