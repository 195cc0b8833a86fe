"""One table of substep solvers (issue 43): ``opsplit.solvers.SOLVERS`` (name -> class), what
each reader needs on the class (``order``, ``stages``, ``requires``), ``solver_for`` by name
or operator, and the solver swap reading it instead of tables of its own.

The declared attributes are checked against measurements, not against the table: the
capability a solver calls and how often (a counting operator), and the order of a solve of
``u' = a u`` (errors at two step sizes)."""

from __future__ import annotations

import ast
import math
from pathlib import Path

import pytest
import torch

import opsplit.solvers as solvers_pkg
from opsplit.control import swap
from opsplit.control.resolution import expected_stages
from opsplit.grid import Grid
from opsplit.operators import FFNIntegral, ProjectionS1, ProjectionS2
from opsplit.operators.base import Operator
from opsplit.solvers import (
    DEFAULT_SOLVERS,
    EXPLICIT_SOLVERS,
    SOLVERS,
    ODESolve,
    ProjectedS1,
    Solver,
    Substep,
    name_of,
    solver_class,
    solver_for,
)

ROOT = Path(__file__).resolve().parents[1] / "opsplit"
D = torch.float64


class _Counting(Operator):
    """``u' = a(t) u``, ``a(t) = a + b t^2``, with every capability, counting the calls of each
    (field: a(t) u; resolvent: u / (1 - dt a(t)); flow with a frozen at t: exp(dt a(t)) u)."""

    has_field = has_resolvent = has_flow = True
    default_solver = "explicit"
    is_projection = True  # CatchUp advances only indicator terms; the map here is what is counted

    def __init__(self, a: float = -0.7, b: float = 0.0):
        super().__init__()
        self.a, self.b = a, b
        self.calls = {"field": 0, "resolvent": 0, "flow": 0}

    def check(self, grid) -> None:
        pass

    def field(self, t, u, grid):
        self.calls["field"] += 1
        return (self.a + self.b * float(t) ** 2) * u

    def resolvent(self, t, dt, u, grid):
        self.calls["resolvent"] += 1
        return u / (1.0 - dt * (self.a + self.b * float(t) ** 2))

    def flow(self, t, dt, u, grid):
        self.calls["flow"] += 1
        return math.exp(dt * (self.a + self.b * float(t) ** 2)) * u


def _terms(cls):
    return (_Counting(), _Counting()) if cls.n_terms == 2 else (_Counting(),)


@pytest.mark.parametrize("name", list(SOLVERS))
def test_a_solver_calls_the_capability_it_declares_as_often_as_it_declares(name):
    cls = SOLVERS[name]
    assert issubclass(cls, Solver) and cls.requires in ("field", "resolvent", "flow")
    solver, terms = cls(), _terms(cls)
    grid = Grid.paper(2, 3)
    u = torch.ones(1, 2, 3, dtype=D)
    solver.check(terms)
    solver.step(terms, 0.0, 0.25, u, grid)
    calls = {k: sum(t.calls[k] for t in terms) for k in ("field", "resolvent", "flow")}
    if cls.n_terms == 2:  # SemiImplicit: one field of the explicit part, one resolvent of the other
        assert calls == {"field": 1, "resolvent": 1, "flow": 0}
        return
    if cls.stages is None:  # an adaptive solve: any number of field evaluations
        assert calls["field"] > 0 and calls["resolvent"] == calls["flow"] == 0
        return
    assert calls == {k: (cls.stages if k == cls.requires else 0) for k in calls}


@pytest.mark.parametrize("name", ["euler", "heun", "rk4", "exact", "exact_midpoint", "implicit"])
def test_the_declared_order_is_the_measured_local_order(name):
    # u' = (a + b t^2) u from u = 1, u(h) = exp(a h + b h^3 / 3): the local error of one step of
    # h is C h^(p+1).  An exact flow (order "unbounded") is exact for a constant in time
    cls = SOLVERS[name]
    grid = Grid.paper(1, 1)
    b = 0.0 if cls.order >= 99 else 1.3

    def err(h):
        u = torch.ones(1, 1, 1, dtype=D)
        return abs(float(cls().step((_Counting(b=b),), 0.0, h, u, grid)) - math.exp(-0.7 * h + b * h ** 3 / 3))

    if cls.order >= 99:
        assert err(0.1) < 1e-15
        return
    p = math.log2(err(0.01) / err(0.005)) - 1
    assert abs(p - cls.order) < 0.1, (name, p)


def test_the_solvers_of_the_package_are_in_the_table():
    # every Solver exported by opsplit.solvers, but the projection method (a wrapper of a solver)
    exported = [getattr(solvers_pkg, n) for n in solvers_pkg.__all__]
    classes = {c for c in exported if isinstance(c, type) and issubclass(c, Solver) and c is not Solver}
    assert classes - {ProjectedS1} == set(SOLVERS.values())
    assert all(name_of(cls) == n and name_of(cls()) == n for n, cls in SOLVERS.items())
    assert name_of(ProjectedS1()) is None
    with pytest.raises(TypeError):
        SOLVERS["mine"] = ODESolve  # read-only


def test_explicit_solvers_are_the_fixed_stage_runge_kutta_methods():
    assert EXPLICIT_SOLVERS == ("euler", "heun", "rk4")
    # Euler, the explicit trapezoidal rule and classical RK4: 1, 2, 4 stages, orders 1, 2, 4
    assert [(SOLVERS[n].stages, SOLVERS[n].order, SOLVERS[n].requires) for n in EXPLICIT_SOLVERS] == [
        (1, 1, "field"), (2, 2, "field"), (4, 4, "field")]
    assert ODESolve().stages is None and ODESolve("rk4").order == 4
    assert ProjectedS1(solver_for("rk4")).stages == 4 and ProjectedS1().stages == 1


def test_solver_for_takes_a_name_or_an_operator():
    assert type(solver_for("heun")) is SOLVERS["heun"]
    assert type(solver_for(FFNIntegral(torch.zeros(2, 2)))) is SOLVERS["euler"]
    assert type(solver_for(ProjectionS1())) is SOLVERS["implicit"]
    assert type(Substep(ProjectionS2()).solver) is SOLVERS["implicit"]
    assert dict(DEFAULT_SOLVERS) == {"explicit": "euler", "implicit": "implicit", "exact": "exact"}
    names = ", ".join(map(repr, SOLVERS))
    with pytest.raises(ValueError, match=rf"^solver_for: expected a substep solver name, one of {names}; got 'dopri5'"):
        solver_for("dopri5")
    with pytest.raises(ValueError, match=r"^train\.solver: expected a substep solver name, one of 'euler'"):
        solver_class("Euler", "train.solver")
    with pytest.raises(TypeError, match=r"^train\.solver: expected a substep solver name \(a str\), got NoneType"):
        solver_class(None, "train.solver")

    class Odd(_Counting):
        default_solver = "sideways"

    with pytest.raises(ValueError, match=r"^Odd: unknown default_solver 'sideways'; expected one of 'explicit'"):
        solver_for(Odd())


def test_the_swap_reads_the_table():
    assert swap.SOLVERS == EXPLICIT_SOLVERS
    assert swap.STAGES == {"euler": 1, "heun": 2, "rk4": 4}
    assert expected_stages(("euler", "rk4")) == 2.5
    for n in EXPLICIT_SOLVERS:
        assert type(swap.as_solver(n, "x")) is SOLVERS[n] and swap.solver_name(SOLVERS[n]()) == n
    assert swap.solver_name(ODESolve("bosh3")) == "odeint:bosh3"
    with pytest.raises(ValueError, match=r"^train\.solvers: expected solver names from \('euler', 'heun', 'rk4'\)"):
        swap.check_solver_names(["euler", "midpoint"], "train.solvers")


def _string_constants(path: Path) -> set:
    tree = ast.parse(path.read_text())
    docs = {id(n.body[0].value) for n in ast.walk(tree)
            if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef)) and n.body
            and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}
    return {n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)
            and id(n) not in docs}


def test_no_second_table_of_solver_names():
    # the names of the table appear as strings in code only where it is defined; the readers
    # (the swap, Substep's default, the convergence problems) look them up.  (opsplit/cli and
    # the training modules other than the swap are outside this check for now.)
    owners = []
    for p in sorted(ROOT.rglob("*.py")):
        rel = p.relative_to(ROOT).as_posix()
        if rel.startswith("cli/") or (rel.startswith("control/") and rel != "control/swap.py"):
            continue
        if {"heun", "semi_implicit", "exact_midpoint"} & _string_constants(p):
            owners.append(rel)
    assert owners == ["solvers/registry.py"]
