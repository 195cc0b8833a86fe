"""Substep solvers: *how one substep is advanced* (one solver per file, each with its order)."""

from .base import Solver, Substep, solver_for
from .catch_up import CatchUp
from .euler import ExplicitEuler
from .exact import Exact
from .exact_midpoint import ExactMidpoint
from .heun import Heun
from .implicit import Implicit
from .odeint import ODESolve
from .projected import ProjectedS1, TangentS1, tangent_s1
from .rk4 import RK4
from .semi_implicit import SemiImplicit

__all__ = [
    "Solver",
    "Substep",
    "solver_for",
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
