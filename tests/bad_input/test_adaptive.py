"""Bad input to adaptive solves (tolerances, controller, estimator, output times), solve
statistics, and the fourth-order compositions (negative substeps); failures of a solve
(max steps, step-size underflow) end in a clear error, never a hang."""

import pytest
import torch

from opsplit import AdaptivePropagator, Grid, Propagator
from opsplit.adaptive import AdaptiveStepError, PIController
from opsplit.controls import TimeBasis
from opsplit.operators import FFNIntegral, ProjectionS1, ProjectionS2
from opsplit.schemes import BlanesMoan, Strang, TripleJump
from opsplit.solvers import RK4, CatchUp, Implicit, Substep

from ._table import cases, run_case

F64 = torch.float64
NAN, INF = float("nan"), float("inf")


def ffn(n=4, t1=None):
    W = torch.randn(n, n, dtype=F64) / n
    if t1 is not None:
        W = TimeBasis(torch.stack([W, 0.5 * W]), t1=t1, axes=("y", "y"))
    return FFNIntegral(W)


def prop(scheme=None, n_steps=2, t1=1.0):
    scheme = scheme or Strang([Substep(ffn(), RK4()), Substep(ffn(), RK4())])
    return Propagator(scheme, n_steps, t1=t1, grid=Grid.paper(3, 4))


def f():
    return torch.randn(2, 3, 4, dtype=F64)


def solve(**kw):
    return prop().solve(f(), **kw)


CONTROLLER = cases(
    ("rtol=0", lambda: PIController(rtol=0.0), ValueError, r"rtol: expected a finite number > 0, got 0.0"),
    ("rtol<0", lambda: PIController(rtol=-1e-3), ValueError, r"rtol: expected a finite number > 0"),
    ("rtol=nan", lambda: PIController(rtol=NAN), ValueError, r"rtol: expected a finite number > 0, got nan"),
    ("rtol=inf", lambda: PIController(rtol=INF), ValueError, r"rtol: expected a finite number > 0"),
    ("rtol-str", lambda: PIController(rtol="1e-3"), TypeError, r"rtol: expected a number, got str"),
    ("rtol-bool", lambda: PIController(rtol=True), TypeError, r"rtol: expected a number, got bool"),
    ("atol=0", lambda: PIController(atol=0.0), ValueError, r"atol: expected a finite number > 0, got 0.0"),
    ("atol=nan", lambda: PIController(atol=NAN), ValueError, r"atol: expected a finite number > 0, got nan"),
    ("first_step=0", lambda: PIController(first_step=0.0), ValueError, r"first_step: expected a finite number > 0"),
    ("min_step<0", lambda: PIController(min_step=-1.0), ValueError, r"min_step: expected a finite number >= 0"),
    ("min>max", lambda: PIController(min_step=0.5, max_step=0.1), ValueError, r"min_step: expected min_step <= max_step"),
    ("max_step=nan", lambda: PIController(max_step=NAN), ValueError, r"max_step: expected a finite number > 0"),
    ("max_steps=0", lambda: PIController(max_steps=0), ValueError, r"max_steps: expected an integer >= 1, got 0"),
    ("max_steps-float", lambda: PIController(max_steps=10.5), ValueError, r"max_steps: expected an integer >= 1"),
    ("safety=0", lambda: PIController(safety=0.0), ValueError, r"safety: expected 0 < safety <= 1"),
    ("factor_min=1", lambda: PIController(factor_min=1.0), ValueError, r"factor_min, factor_max: expected 0 < factor_min < 1 < factor_max"),
    ("pcoeff<0", lambda: PIController(pcoeff=-0.1), ValueError, r"pcoeff: expected a finite number >= 0"),
)

SOLVE = cases(
    ("solve-rtol=0", lambda: solve(rtol=0.0), ValueError, r"rtol: expected a finite number > 0"),
    ("solve-atol=nan", lambda: solve(atol=NAN), ValueError, r"atol: expected a finite number > 0, got nan"),
    ("solve-rtol-and-nsteps", lambda: solve(rtol=1e-3, n_steps=4), ValueError, r"n_steps: a fixed N_t and adaptive steps"),
    ("solve-rtol-and-controller", lambda: solve(rtol=1e-3, controller=PIController()), ValueError, r"rtol/atol: give the tolerances in the controller or as arguments"),
    ("solve-controller-type", lambda: solve(controller={"rtol": 1e-3}), TypeError, r"controller: expected a PIController, got dict"),
    ("solve-estimator-fixed", lambda: solve(estimator="doubling"), ValueError, r"estimator: only for adaptive steps"),
    ("solve-per-sample-fixed", lambda: solve(per_sample=True), ValueError, r"per_sample: only for adaptive steps"),
    ("solve-per-sample-str", lambda: solve(rtol=1e-3, per_sample="yes"), TypeError, r"per_sample: expected True or False"),
    ("solve-estimator-str", lambda: solve(rtol=1e-3, estimator="richardson"), TypeError, r"estimator: expected 'doubling', 'extrapolate', a companion Scheme"),
    ("solve-on-failure", lambda: solve(rtol=1e-3, on_failure="warn"), ValueError, r"on_failure: expected one of \('raise', 'return'\)"),
    ("t_eval-unsorted", lambda: solve(rtol=1e-3, t_eval=[0.5, 0.2]), ValueError, r"t_eval: expected strictly increasing times"),
    ("t_eval-outside", lambda: solve(rtol=1e-3, t_eval=[0.5, 1.5]), ValueError, r"t_eval: times must lie in \[t0, t1\] = \[0, 1\]"),
    ("t_eval-nan", lambda: solve(rtol=1e-3, t_eval=[NAN]), ValueError, r"t_eval: expected finite times"),
    ("t_eval-empty", lambda: solve(rtol=1e-3, t_eval=[]), ValueError, r"t_eval: expected at least one output time"),
    ("t_eval-str", lambda: solve(rtol=1e-3, t_eval=["a"]), TypeError, r"t_eval: expected a sequence of numbers"),
    ("t_eval-off-grid", lambda: solve(n_steps=4, t_eval=[0.3]), ValueError, r"t_eval: 0.3 is not a time of the fixed grid of N_t = 4 steps"),
    ("solve-f-nan", lambda: prop().solve(torch.full((1, 3, 4), NAN, dtype=F64), rtol=1e-3), ValueError, r"f: .*NaN|f: .*finite"),
    ("solve-f-rank", lambda: prop().solve(torch.zeros(3, dtype=F64), rtol=1e-3), ValueError, r"f: expected shape \(B, N_x, N_y\)"),
    ("adaptive-module-trajectory", lambda: AdaptivePropagator(Strang([ffn()]), t1=1.0)(f(), return_trajectory=True), ValueError, r"return_trajectory: adaptive steps have no fixed grid"),
    ("adaptive-module-rtol", lambda: AdaptivePropagator(Strang([ffn()]), t1=1.0, rtol=-1.0), ValueError, r"rtol: expected a finite number > 0"),
    ("adaptive-module-estimator", lambda: AdaptivePropagator(Strang([ffn()]), t1=1.0, estimator=3), TypeError, r"estimator: expected 'doubling'"),
    ("max-steps-reached", lambda: solve(controller=PIController(rtol=1e-12, atol=1e-14, max_steps=2)), AdaptiveStepError, r"max_steps = 2 attempts reached at t = .* raise max_steps or loosen rtol/atol"),
    ("step-underflow-min-step", lambda: solve(controller=PIController(rtol=1e-12, atol=1e-14, min_step=0.3, first_step=0.5)), AdaptiveStepError, r"step size underflow at t = .* below min_step 0.3"),
)

COMPOSITIONS = cases(
    ("triple-jump-S1", lambda: TripleJump([Substep(ProjectionS1(0.0, 1.0), CatchUp()), Substep(ffn(), RK4())]), ValueError, r"TripleJump: substep 0 \(ProjectionS1\) would be advanced over a negative time step .*Sheng-Suzuki"),
    ("blanes-moan-S2", lambda: BlanesMoan([Substep(ffn(), RK4()), Substep(ProjectionS2(), Implicit())]), ValueError, r"BlanesMoan: substep 1 \(ProjectionS2\) would be advanced over a negative time step \(-0.14385"),
    ("blanes-moan-implicit", lambda: BlanesMoan([Substep(ffn(), Implicit()), Substep(ffn(), RK4())]), ValueError, r"substep 0 \(FFNIntegral\) .* its solver Implicit\(\) is a resolvent"),
    ("triple-jump-empty", lambda: TripleJump([]), ValueError, r"TripleJump: a scheme needs at least one operator"),
    ("triple-jump-outside-controls", lambda: prop(TripleJump([Substep(ffn(t1=1.0), RK4()), Substep(ffn(), RK4())]))(f()), ValueError, r"TripleJump: a step over \[0, 0.5\] runs substeps over .* defined on \[0, 1\] only"),
)


@pytest.mark.parametrize("case", CONTROLLER + SOLVE + COMPOSITIONS)
def test_bad_input(case):
    run_case(case)
