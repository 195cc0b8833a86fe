"""The limits of adaptive steps, each checked against an independent reference: adaptive
``ODESolve`` substeps over negative time steps (the matrix exponential, and the fourth
order of the compositions against the unsplit model), time arithmetic relative to the
interval (the same autonomous problem solved from t0 = 0), the models refused before
compute (the projection with a kink: no substep runs), the controller's arguments, the
triple jump's control margin (the substeps' reach recomputed here from the coefficients)
and the import direction of step control and the propagator."""

from __future__ import annotations

import ast
import math
from pathlib import Path

import numpy as np
import pytest
import torch

import opsplit
from opsplit import Grid, Propagator
from opsplit.adaptive import PIController
from opsplit.analysis import fit_order, relative_error, smooth_transformer
from opsplit.controls import TimeBasis
from opsplit.operators import FFNIntegral
from opsplit.reference import solve_reference
from opsplit.schemes import BlanesMoan, Hybrid, SchemeFlow, Strang, TripleJump
from opsplit.schemes.yoshida import TRIPLE_JUMP_GAMMAS
from opsplit.solvers import RK4, Exact, ODESolve, Substep

D = torch.float64
pytestmark = pytest.mark.usefixtures("one_thread")


def _calls(scheme):
    """Substep calls while a block runs (forward hooks, independent of opsplit's counting)."""
    n = [0]
    for m in scheme.modules():
        if isinstance(m, Substep):
            m.register_forward_hook(lambda *a: n.__setitem__(0, n[0] + 1))
    return n


# -- adaptive ODESolve substeps run backwards (compositions' negative substeps) -------------------
@pytest.mark.parametrize("method", ["dopri5", "bosh3", "dopri8", "fehlberg2", "adaptive_heun"])
def test_an_adaptive_odesolve_substep_runs_backwards(method):
    gen = torch.Generator().manual_seed(2)
    W = torch.randn(4, 4, generator=gen, dtype=D) / 2
    u = torch.randn(2, 3, 4, generator=gen, dtype=D)
    out = Substep(FFNIntegral(W), ODESolve(method, rtol=1e-7, atol=1e-9))(0.4, -0.3, u, Grid.paper(3, 4))
    exact = u @ torch.linalg.matrix_exp(-0.3 * W)  # u_t = u W over [0.4, 0.1]
    assert relative_error(out, exact) < 1e-5


@pytest.mark.parametrize("cls, method", [(BlanesMoan, "dopri5"), (TripleJump, "dopri8")])
def test_compositions_of_adaptive_odesolve_substeps_have_order_four(cls, method):
    # time-dependent controls on [-1, 3] (room for the triple jump's substeps, which read
    # them up to 0.35 dt outside each step); reference: the unsplit model by torchdiffeq
    gen = torch.Generator().manual_seed(0)
    ops = [
        FFNIntegral(TimeBasis(torch.stack([w, 0.5 * w]), t0=-1.0, t1=3.0, axes=("y", "y")))
        for w in (torch.randn(4, 4, generator=gen, dtype=D) / 4 for _ in range(2))
    ]
    f = torch.randn(1, 3, 4, generator=gen, dtype=D)
    g = Grid.paper(3, 4)
    ref = solve_reference(ops, f, t0=0.0, t1=2.0, grid=g, rtol=1e-13, atol=1e-14)
    scheme = cls([Substep(op, ODESolve(method, rtol=1e-10, atol=1e-12)) for op in ops])
    ns = [1, 2, 4]
    errs = [relative_error(Propagator(scheme, n, t1=2.0, grid=g)(f), ref) for n in ns]
    fit = fit_order([2.0 / n for n in ns], errs)
    assert 3.8 < fit.order < 4.5, errs


# -- time arithmetic relative to the interval ----------------------------------------------------
@pytest.mark.parametrize("t0", [1e11, 3e11, 1e12])
def test_adaptive_time_arithmetic_is_relative_to_the_interval(t0):
    gen = torch.Generator().manual_seed(0)
    W1, W2 = (torch.randn(4, 4, generator=gen, dtype=D) / 4 for _ in range(2))
    f = torch.randn(2, 3, 4, generator=gen, dtype=D)

    def solve(a):  # an autonomous problem: the solution on [a, a + 1] does not depend on a
        s = Strang([Substep(FFNIntegral(W1), RK4()), Substep(FFNIntegral(W2), RK4())])
        return Propagator(s, 4, t0=a, t1=a + 1.0, grid=Grid.paper(3, 4)).solve(f, rtol=1e-6, atol=1e-9)

    base, far = solve(0.0), solve(t0)
    assert far.stats.success and far.stats.n_accepted > 10
    assert abs(far.stats.n_accepted - base.stats.n_accepted) <= 2
    assert far.stats.times[0] == t0 and far.stats.times[-1] == t0 + 1.0
    assert (far.u - f).abs().max() > 0.5  # the state moved
    assert relative_error(far.u, base.u) < 1e-5


def test_an_interval_too_short_for_its_magnitude_is_refused_before_compute():
    s = Strang([Substep(FFNIntegral(torch.eye(4, dtype=D)), RK4())])
    calls = _calls(s)
    with pytest.raises(ValueError, match=r"t0, t1: the default first step .* float64 times near 1e\+15 are 0\.125 apart"):
        Propagator(s, 4, t0=1e15, t1=1e15 + 1.0).solve(torch.ones(1, 2, 4, dtype=D), rtol=1e-3)
    assert calls[0] == 0


# -- the projected model: refused before compute (the ReLU's kink) -------------------------------
@pytest.mark.parametrize("kind", ["lie", "strang", "parallel", "hybrid", "triple_jump", "blanes_moan"])
def test_the_s1_relu_model_is_refused_before_compute(kind):
    p = smooth_transformer(n_x=4, n_y=4, J=1, seed=0, constraint=True, relu=True, margin=0.5)
    prop = p.propagator(4, kind, "rk4")
    calls = _calls(prop.scheme)
    with pytest.raises(ValueError, match=r"adaptive steps: .* substep \d:ProjectionS2 is not a smooth map .*"
                                         r"\{u >= 0\} \(the ReLU\)"):
        prop.solve(p.f, rtol=1e-4)
    assert calls[0] == 0
    assert prop(p.f).shape == p.f.shape  # fixed steps still solve it


@pytest.mark.parametrize("kind", ["strang"])
def test_the_s1_model_meets_its_tolerance(kind):
    # S1 alone (the projection method): accepted; error against the unsplit model with S1 as
    # a constraint (benchmarks/adaptive_projections.py measures rtol 1e-2 ... 1e-6)
    p = smooth_transformer(n_x=4, n_y=4, J=1, seed=0, constraint=True)
    ref = p.reference()
    for rtol in (1e-2, 1e-4):
        with torch.no_grad():
            sol = p.propagator(1, kind, "rk4").solve(p.f, rtol=rtol, atol=1e-3 * rtol)
        assert relative_error(sol.u, ref) <= 10 * rtol


# -- the controller's arguments ----------------------------------------------------------------
def test_numpy_scalars_are_numbers():
    c = PIController(rtol=np.float32(1e-3), atol=np.float64(1e-6), first_step=np.float32(0.25),
                     min_step=np.float64(0.0), max_step=np.float32(0.5), max_steps=np.int64(10),
                     safety=np.float64(0.9), pcoeff=np.float32(0.4))
    assert type(c.rtol) is float and type(c.max_steps) is int and c.max_steps == 10
    s = Strang([Substep(FFNIntegral(torch.eye(4, dtype=D) / 4), RK4())])
    sol = Propagator(s, 2, t1=1.0).solve(torch.ones(1, 2, 4, dtype=D), controller=c)
    assert sol.stats.success and max(sol.stats.step_sizes) <= 0.5


@pytest.mark.parametrize(
    "kw, match",
    [
        (dict(min_step=0.1), r"min_step: expected min_step <= the first step, got min_step = 0\.1 > the default first step"),
        (dict(first_step=1e-300), r"first_step: first_step = 1e-300 is below the round-off limit of float64"),
        (dict(max_step=1e-20), r"max_step: 1e-20 is below the round-off limit"),
        (dict(rtol=1e-16), r"rtol: 1e-16 is below what float64 can meet"),
    ],
)
def test_controller_limits_are_refused_before_compute(kw, match):
    s = Strang([Substep(FFNIntegral(torch.eye(4, dtype=D) / 4), RK4())])
    calls = _calls(s)
    with pytest.raises(ValueError, match=match):
        Propagator(s, 2, t1=1.0).solve(torch.ones(1, 2, 4, dtype=D), controller=PIController(**kw))
    assert calls[0] == 0


def test_float32_tolerance_below_its_precision_is_refused():
    s = Strang([Substep(FFNIntegral(torch.eye(4) / 4), RK4())])
    with pytest.raises(ValueError, match=r"rtol: 1e-09 is below what float32 can meet .* or float64 states"):
        Propagator(s, 2, t1=1.0).solve(torch.ones(1, 2, 4), rtol=1e-9)
    assert Propagator(s, 2, t1=1.0).solve(torch.ones(1, 2, 4), rtol=1e-4).stats.success


def test_the_triple_jumps_control_margin_caps_the_step():
    # controls on [-0.01, 1.01]: each step's substeps must stay inside, so the steps near the
    # ends are capped by the margin (not an error after some substep calls)
    p = smooth_transformer(n_x=3, n_y=3, J=1, seed=0, margin=0.01)
    prop = p.propagator(1, "triple_jump", "rk4")
    with torch.no_grad():
        sol = prop.solve(p.f, rtol=1e-4, atol=1e-7)
    # the substeps' clocks, from the coefficients: Strang steps of gamma_1, gamma_2, gamma_1
    g1, g2, _ = TRIPLE_JUMP_GAMMAS
    lo, hi = g1 + g2, g1  # every clock reaches g1 after the first step and g1 + g2 after the second
    assert lo < 0 and hi > 1
    for a, b in zip(sol.stats.times[:-1], sol.stats.times[1:]):
        assert a + lo * (b - a) >= -0.01 - 1e-12 and a + hi * (b - a) <= 1.01 + 1e-12
    assert sol.stats.times[1] < 0.01 / -lo + 1e-12  # the first step was capped
    assert relative_error(sol.u, p.reference()) <= 10 * 1e-4
    no_margin = smooth_transformer(n_x=3, n_y=3, J=1, seed=0)
    with pytest.raises(ValueError, match=r"scheme: TripleJump's substeps read the controls up to 0\.3512 h before "
                                         r"each step .* no step fits"):
        no_margin.propagator(1, "triple_jump", "rk4").solve(no_margin.f, rtol=1e-4)


def test_a_scheme_flow_takes_a_hybrid_without_grid_transfers():
    gen = torch.Generator().manual_seed(3)
    ops = [FFNIntegral(torch.randn(4, 4, generator=gen, dtype=D) / 4) for _ in range(3)]
    inner = Hybrid(ops, groups=[[0], [1, 2]])
    f = torch.randn(2, 3, 4, generator=gen, dtype=D)
    outer = Propagator(Strang([Substep(SchemeFlow(inner), Exact())]), 4, t1=1.0)
    # Strang over one substep is its flow: the inner Hybrid's steps
    assert torch.equal(outer(f), Propagator(inner, 4, t1=1.0)(f))
    assert outer.solve(f, rtol=1e-5).stats.success


# -- Blanes-Moan's negative sweeps, counted from the coefficients ---------------------------------
def test_blanes_moan_has_two_negative_sweeps_of_twelve():
    from opsplit.schemes.blanes_moan import BLANES_MOAN_A, BLANES_MOAN_B

    # the composition L*_{alpha_6} L_{beta_6} ... L*_{alpha_1} L_{beta_1} of a two-term splitting
    # (McLachlan 1995): beta_1 = a_1, alpha_i = b_i - beta_i, beta_{i+1} = a_{i+1} - alpha_i
    sweeps, beta = [], BLANES_MOAN_A[0]
    for i, b in enumerate(BLANES_MOAN_B):
        alpha = b - beta
        sweeps += [beta, alpha]
        beta = BLANES_MOAN_A[i + 1] - alpha
    assert len(sweeps) == 12 and abs(beta) < 1e-12
    negative = [i for i, c in enumerate(sweeps) if c < 0]
    assert negative == [3, 8]  # alpha_2 and beta_5, both -0.3667
    assert sum(c < 0 for c in BLANES_MOAN_A + BLANES_MOAN_B) == 4  # a_3 = a_5, b_2 = b_5
    root = Path(opsplit.__file__).parents[1]
    module_doc = " ".join((root / "opsplit" / "schemes" / "blanes_moan.py").read_text().split())
    docs = " ".join((root / "docs" / "schemes.md").read_text().split())
    assert "Two of the twelve sweep coefficients are negative" in module_doc
    assert "two of Blanes–Moan's twelve sweeps" in docs
    assert "our of the twelve" not in module_doc and "four of Blanes–Moan's twelve" not in docs


# -- one direction: step control below the propagator ---------------------------------------------
def _imports(path: Path, pkg: str) -> set[str]:
    """Every opsplit module a file imports (module level and inside functions)."""
    mod = ".".join(path.relative_to(Path(opsplit.__file__).parents[1]).with_suffix("").parts)
    base = mod.rsplit(".", 1)[0] if path.name != "__init__.py" else mod
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                parts = base.split(".")
                parent = ".".join(parts[: len(parts) - node.level + 1])
                target = f"{parent}.{node.module}" if node.module else parent
            else:
                target = node.module or ""
            if target.startswith(pkg):
                out.add(target)
                out |= {f"{target}.{a.name}" for a in node.names}
        elif isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name.startswith(pkg)}
    return out


def test_step_control_does_not_import_the_propagator():
    root = Path(opsplit.__file__).parent
    files = {".".join(p.relative_to(root.parent).with_suffix("").parts).removesuffix(".__init__"): p
             for p in root.rglob("*.py")}
    reach, todo = set(), ["opsplit.adaptive"]
    while todo:  # every module opsplit.adaptive imports, directly or through others
        for t in _imports(files[todo.pop()], "opsplit"):
            if t in files and t not in reach:
                reach.add(t)
                todo.append(t)
    assert "opsplit.propagator" not in reach, "opsplit.adaptive imports opsplit.propagator (directly or through others)"
    assert "opsplit.adaptive" in _imports(files["opsplit.propagator"], "opsplit")  # the one direction
    assert opsplit.AdaptivePropagator.__module__ == "opsplit.propagator"
    assert math.isfinite(PIController().rtol)
