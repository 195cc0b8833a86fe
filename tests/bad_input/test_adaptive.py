"""Bad input to adaptive solves (tolerances, controller, estimator, output times), solve
statistics, and the fourth-order compositions (negative substeps); failures of a solve
(max steps, step-size underflow) end in a clear error, never a hang."""

import numpy as np
import pytest
import torch

from opsplit import AdaptivePropagator, Grid, Propagator
from opsplit.adaptive import (
    AdaptiveStepError,
    EmbeddedPair,
    EulerHeunPair,
    PIController,
    StepDoubling,
    check_adaptive,
    solve_adaptive,
)
from opsplit.controls import TimeBasis
from opsplit.operators import Activation, FFNIntegral, PointwiseAffine, ProjectionS1, ProjectionS2
from opsplit.schemes import BlanesMoan, Lie, Parallel, Strang, TripleJump
from opsplit.solvers import RK4, CatchUp, Exact, Implicit, ProjectedS1, Substep

from ._table import F64, INF, NAN, cases, run_case


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
    ("solve-estimator-str", lambda: solve(rtol=1e-3, estimator="richardson"), TypeError, r"estimator: expected 'doubling', 'extrapolate', 'euler-heun', a companion Scheme"),
    ("solve-on-failure", lambda: solve(rtol=1e-3, on_failure="warn"), ValueError, r"on_failure: expected one of \('raise', 'return'\)"),
    ("solve-euler-heun-strang", lambda: solve(rtol=1e-3, estimator="euler-heun"), ValueError,
     r"^estimator: the Euler-Heun pair needs a step that is explicit Euler on the sum of the scheme's terms: its "
     r"substeps are solved by \['RK4'\]"),
    ("solve-euler-heun-lie", lambda: prop(Lie([Substep(ffn()), Substep(ffn())])).solve(f(), rtol=1e-3, estimator="euler-heun"),
     ValueError, r"^estimator: the Euler-Heun pair needs .*: Lie of 2 substeps \(a splitting, not Euler on the sum\)"),
    ("solve-euler-heun-other-scheme", lambda: solve(rtol=1e-3, estimator=EulerHeunPair(Parallel([Substep(ffn()), Substep(ffn())]))),
     ValueError, r"^estimator: it must be built on the propagator's own scheme"),
    ("controller-stop-at-breakpoints", lambda: PIController(stop_at_breakpoints="no"), TypeError,
     r"^stop_at_breakpoints: expected True or False, got 'no'"),
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


def s1(sigma1=0.0):
    return Substep(ProjectionS1(sigma1, 1.0), CatchUp())


def smooth(n=4):
    return Substep(ffn(n), ProjectedS1(RK4()))


def prop32():
    return Propagator(Strang([FFNIntegral(torch.eye(4) / 4)]), 2, t1=1.0, grid=Grid.paper(3, 4))


def tj_prop(c0, c1):
    W = TimeBasis(torch.stack([torch.eye(4, dtype=F64), 0.1 * torch.eye(4, dtype=F64)]), t0=c0, t1=c1, axes=("y", "y"))
    return Propagator(TripleJump([Substep(FFNIntegral(W), RK4()), Substep(ffn(), RK4())]), 2, t1=1.0, grid=Grid.paper(3, 4))


# the controller's arguments: numbers of any kind, checked at construction
CONTROLLER_MORE = cases(
    ("rtol-list", lambda: PIController(rtol=[1e-3]), TypeError, r"rtol: expected a number, got list"),
    ("rtol-tensor-2", lambda: PIController(rtol=torch.tensor([1e-3, 1e-3])), TypeError, r"rtol: expected a number, got a torch.float32 tensor of shape \(2,\)"),
    ("rtol-bool-tensor", lambda: PIController(rtol=torch.tensor(True)), TypeError, r"rtol: expected a number, got a torch.bool tensor"),
    ("rtol-np-bool", lambda: PIController(rtol=np.bool_(True)), TypeError, r"rtol: expected a number, got bool"),
    ("rtol-np-nan", lambda: PIController(rtol=np.float64("nan")), ValueError, r"rtol: expected a finite number > 0"),
    ("rtol-np-negative", lambda: PIController(rtol=np.float32(-1e-3)), ValueError, r"rtol: expected a finite number > 0"),
    ("atol-inf", lambda: PIController(atol=INF), ValueError, r"atol: expected a finite number > 0, got inf"),
    ("atol-str", lambda: PIController(atol="1e-9"), TypeError, r"atol: expected a number, got str"),
    ("atol-complex", lambda: PIController(atol=1e-9 + 0j), TypeError, r"atol: expected a number, got complex"),
    ("first_step-nan", lambda: PIController(first_step=NAN), ValueError, r"first_step: expected a finite number > 0"),
    ("first_step-inf", lambda: PIController(first_step=INF), ValueError, r"first_step: expected a finite number > 0"),
    ("first_step<0", lambda: PIController(first_step=-0.1), ValueError, r"first_step: expected a finite number > 0"),
    ("first_step-str", lambda: PIController(first_step="0.1"), TypeError, r"first_step: expected a number, got str"),
    ("min_step-nan", lambda: PIController(min_step=NAN), ValueError, r"min_step: expected a finite number >= 0"),
    ("min_step-inf", lambda: PIController(min_step=INF), ValueError, r"min_step: expected a finite number >= 0"),
    ("min_step-str", lambda: PIController(min_step="0"), TypeError, r"min_step: expected a number, got str"),
    ("min_step>first_step", lambda: PIController(min_step=0.2, first_step=0.1), ValueError, r"min_step: expected min_step <= first_step, got 0.2 > 0.1"),
    ("max_step=0", lambda: PIController(max_step=0.0), ValueError, r"max_step: expected a finite number > 0"),
    ("max_step<0", lambda: PIController(max_step=-1.0), ValueError, r"max_step: expected a finite number > 0"),
    ("max_step-str", lambda: PIController(max_step="inf"), TypeError, r"max_step: expected a number, got str"),
    ("max_steps-np-float", lambda: PIController(max_steps=np.float64(10.0)), ValueError, r"max_steps: expected an integer >= 1, got float64"),
    ("max_steps-np-negative", lambda: PIController(max_steps=np.int64(-3)), ValueError, r"max_steps: expected an integer >= 1, got -3"),
    ("max_steps-bool", lambda: PIController(max_steps=True), ValueError, r"max_steps: expected an integer >= 1, got bool"),
    ("max_steps-str", lambda: PIController(max_steps="10"), ValueError, r"max_steps: expected an integer >= 1, got str"),
    ("safety>1", lambda: PIController(safety=1.5), ValueError, r"safety: expected 0 < safety <= 1, got 1.5"),
    ("safety-str", lambda: PIController(safety="0.9"), TypeError, r"safety: expected a number, got str"),
    ("factor_max=inf", lambda: PIController(factor_max=INF), ValueError, r"factor_min, factor_max: expected 0 < factor_min < 1 < factor_max < inf"),
    ("factor_min=0", lambda: PIController(factor_min=0.0), ValueError, r"factor_min, factor_max: expected"),
    ("icoeff-nan", lambda: PIController(icoeff=NAN), ValueError, r"icoeff: expected a finite number >= 0"),
    ("pcoeff-list", lambda: PIController(pcoeff=[0.4]), TypeError, r"pcoeff: expected a number, got list"),
)

# checked when a solve starts, against the interval and the state's dtype, before compute
SOLVE_START = cases(
    ("min_step>default-first-step", lambda: solve(controller=PIController(min_step=0.1)), ValueError, r"min_step: expected min_step <= the first step, got min_step = 0.1 > the default first step \(t1 - t0\)/16 = 0.0625"),
    ("min_step>interval", lambda: solve(controller=PIController(min_step=2.0, first_step=3.0)), ValueError, r"min_step: expected min_step <= the first step"),
    ("first_step=1e-300", lambda: solve(controller=PIController(first_step=1e-300)), ValueError, r"first_step: first_step = 1e-300 is below the round-off limit of float64"),
    ("max_step=1e-20", lambda: solve(controller=PIController(max_step=1e-20)), ValueError, r"max_step: 1e-20 is below the round-off limit of float64"),
    ("max_step-too-many-steps", lambda: solve(controller=PIController(max_step=1e-5)), ValueError, r"max_step: 1e-05 needs at least \(t1 - t0\)/max_step = 1e\+05 steps .* more than max_steps = 10000"),
    ("rtol=1e-16-float64", lambda: solve(rtol=1e-16), ValueError, r"rtol: 1e-16 is below what float64 can meet \(100 eps = 2.22e-14"),
    ("rtol=1e-15-float64", lambda: solve(rtol=1e-15), ValueError, r"rtol: 1e-15 is below what float64 can meet"),
    ("rtol=1e-9-float32", lambda: prop32().solve(torch.ones(1, 3, 4), rtol=1e-9), ValueError, r"rtol: 1e-09 is below what float32 can meet .* or float64 states"),
    ("rtol=1e-6-float32", lambda: prop32().solve(torch.ones(1, 3, 4), rtol=1e-6), ValueError, r"rtol: 1e-06 is below what float32 can meet"),
    ("interval-too-short", lambda: Propagator(Strang([ffn()]), 2, t0=1e15, t1=1e15 + 1.0).solve(f(), rtol=1e-3), ValueError, r"t0, t1: the default first step \(t1 - t0\)/16 = 0.0625 is below the round-off limit of the times"),
    ("first_step-at-large-t", lambda: Propagator(Strang([ffn()]), 2, t0=1e12, t1=1e12 + 1.0).solve(f(), controller=PIController(first_step=1e-6)), ValueError, r"first_step: first_step = 1e-06 is below the round-off limit of the times \(16 eps \|t\|"),
    ("max_step-at-large-t", lambda: Propagator(Strang([ffn()]), 2, t0=1e12, t1=1e12 + 1.0).solve(f(), controller=PIController(max_step=1e-4)), ValueError, r"max_step: 0.0001 is below the round-off limit of the times"),
)

# models whose local error step doubling cannot estimate: refused before compute
MODELS = cases(
    ("s1-relu-strang", lambda: prop(Strang([s1(), smooth(), ProjectionS2()])).solve(f(), rtol=1e-4), ValueError, r"adaptive steps: Strang cannot be solved to a tolerance: its substep 2:ProjectionS2 is not a smooth map .*\{u >= 0\} \(the ReLU\)"),
    ("relu-lie", lambda: prop(Lie([ffn(), ProjectionS2()])).solve(f(), rtol=1e-4), ValueError, r"adaptive steps: Lie cannot .* substep 1:ProjectionS2 is not a smooth map"),
    ("relu-parallel", lambda: prop(Parallel([ffn(), ProjectionS2()])).solve(f(), rtol=1e-4), ValueError, r"ProjectionS2 is not a smooth map"),
    ("relu-activation", lambda: prop(Strang([ffn(), Activation("relu")])).solve(f(), rtol=1e-4), ValueError, r"substep 1:Activation is not a smooth map of the state \(Activation: the projection onto \{u >= 0\} \(the ReLU\)"),
    ("gelu-map", lambda: prop(Strang([ffn(), Activation("gelu")])).solve(f(), rtol=1e-4), ValueError, r"substep 1:Activation is a map applied once per step, not a flow: two half steps apply it twice"),
    ("affine-map", lambda: prop(Lie([ffn(), PointwiseAffine(torch.ones(4, dtype=F64), torch.zeros(4, dtype=F64))])).solve(f(), rtol=1e-4), ValueError, r"substep 1:PointwiseAffine is a map applied once per step"),
    ("two-projections", lambda: prop(Strang([s1(0.0), smooth(), s1(0.5)])).solve(f(), rtol=1e-4), ValueError, r"its substep 0:ProjectionS1 and substep 2:ProjectionS1 project onto two different sets"),
    ("s1-parallel", lambda: prop(Parallel([s1(), smooth()])).solve(f(), rtol=1e-4), ValueError, r"substep 0:ProjectionS1 is a projection averaged with the other substeps of a parallel group"),
    ("relu-embedded-pair", lambda: prop(Strang([ffn(), ProjectionS2()])).solve(f(), rtol=1e-4, estimator=Lie([ffn()])), ValueError, r"EmbeddedPair: the companion's operators"),
    ("relu-adaptive-module", lambda: AdaptivePropagator(Strang([ffn(), ProjectionS2()]), t1=1.0), ValueError, r"adaptive steps: Strang cannot be solved to a tolerance: its substep 1:ProjectionS2"),
    ("rtol-adaptive-module", lambda: AdaptivePropagator(Strang([ffn()]), t1=1.0, rtol=1e-16), ValueError, r"rtol: 1e-16 is below what float64 can meet"),
    ("min_step-adaptive-module", lambda: AdaptivePropagator(Strang([ffn()]), t1=1.0, min_step=0.5), ValueError, r"min_step: expected min_step <= the first step"),
    ("on_failure-adaptive-module", lambda: AdaptivePropagator(Strang([ffn()]), t1=1.0, on_failure="ignore"), ValueError, r"on_failure: expected one of \('raise', 'return'\)"),
    ("per_sample-adaptive-module", lambda: AdaptivePropagator(Strang([ffn()]), t1=1.0, per_sample="yes"), TypeError, r"per_sample: expected True or False"),
    ("triple-jump-controls-start-at-t0", lambda: tj_prop(0.0, 2.0).solve(f(), rtol=1e-4), ValueError, r"scheme: TripleJump's substeps read the controls up to 0.3512 h before each step .* starts at t0 = 0: no step fits"),
    ("triple-jump-controls-end-at-t1", lambda: tj_prop(-1.0, 1.0).solve(f(), rtol=1e-4), ValueError, r"scheme: TripleJump's substeps read the controls up to 0.3512 h after each step .* ends at t1 = 1: no step can end there"),
    ("triple-jump-in-strang-no-margin", lambda: prop(Strang([Substep(ffn(), RK4()), Substep(__import__("opsplit").schemes.SchemeFlow(TripleJump([Substep(ffn(t1=1.0), RK4()), Substep(ffn(), RK4())])), Exact())])).solve(f(), rtol=1e-4), ValueError, r"scheme: Strang's substeps read the controls up to 0.3512 h before each step"),
)

# the adaptive entry points called directly
ENTRY_POINTS = cases(
    ("solve_adaptive-prop", lambda: solve_adaptive(object(), f(), Grid.paper(3, 4)), TypeError, r"prop: expected a Propagator \(with an opsplit Scheme\), got object"),
    ("solve_adaptive-f-numpy", lambda: solve_adaptive(prop(), f().numpy(), Grid.paper(3, 4)), TypeError, r"f: expected a floating tensor of shape \(B, N_x, N_y\)"),
    ("solve_adaptive-f-rank2", lambda: solve_adaptive(prop(), f()[0], Grid.paper(3, 4)), TypeError, r"f: expected a floating tensor of shape \(B, N_x, N_y\)"),
    ("solve_adaptive-per_sample", lambda: solve_adaptive(prop(), f(), Grid.paper(3, 4), per_sample=1), TypeError, r"per_sample: expected True or False"),
    ("solve_adaptive-controller", lambda: solve_adaptive(prop(), f(), Grid.paper(3, 4), controller=1e-3), TypeError, r"controller: expected a PIController, got float"),
    ("check_adaptive-scheme", lambda: check_adaptive(ffn(), 0.0, 1.0, PIController(), F64), TypeError, r"scheme: expected an opsplit Scheme, got FFNIntegral"),
    ("check_adaptive-dtype", lambda: check_adaptive(Strang([ffn()]), 0.0, 1.0, PIController(), torch.int64), TypeError, r"dtype: expected a floating torch.dtype, got torch.int64"),
    ("check_adaptive-t1<t0", lambda: check_adaptive(Strang([ffn()]), 1.0, 0.0, PIController(), F64), ValueError, r"t0, t1: expected finite times t0 < t1"),
    ("check_adaptive-t-nan", lambda: check_adaptive(Strang([ffn()]), 0.0, NAN, PIController(), F64), ValueError, r"t0, t1: expected finite times t0 < t1"),
    ("step-doubling-scheme", lambda: StepDoubling(ffn()), TypeError, r"StepDoubling.scheme: expected an opsplit Scheme, got FFNIntegral"),
    ("step-doubling-extrapolate", lambda: StepDoubling(Strang([ffn()]), extrapolate="yes"), TypeError, r"StepDoubling.extrapolate: expected True or False"),
    ("embedded-pair-type", lambda: EmbeddedPair(Strang([ffn()]), "lie"), TypeError, r"EmbeddedPair.companion: expected an opsplit Scheme, got str"),
    ("embedded-pair-same-order", lambda: (lambda a: EmbeddedPair(Strang([a]), Strang([a])))(ffn()), ValueError, r"EmbeddedPair: the scheme and the companion have the same effective order 1"),
    ("estimator-other-scheme", lambda: solve(rtol=1e-3, estimator=StepDoubling(Strang([ffn()]))), ValueError, r"estimator: it must be built on the propagator's own scheme"),
    ("solve-controller-and-n_steps", lambda: solve(controller=PIController(), n_steps=4), ValueError, r"n_steps: a fixed N_t and adaptive steps"),
    ("solve-on_failure-none", lambda: solve(rtol=1e-3, on_failure=None), ValueError, r"on_failure: expected one of"),
    ("solve-t_eval-scalar", lambda: solve(rtol=1e-3, t_eval=0.5), TypeError, r"t_eval: expected a sequence of numbers"),
    ("solve-t_eval-2d", lambda: solve(rtol=1e-3, t_eval=torch.zeros(2, 2)), TypeError, r"t_eval: expected a sequence of numbers"),
    ("solve-f-int-adaptive", lambda: prop().solve(torch.zeros(1, 3, 4, dtype=torch.int64), rtol=1e-3), TypeError, r"f: expected a floating"),
    ("solve-f32-on-f64-adaptive", lambda: prop().solve(torch.zeros(1, 3, 4), rtol=1e-3), TypeError, r"f: dtype torch.float32 differs from the Propagator's torch.float64"),
    ("solve-grid-str-adaptive", lambda: prop().solve(f(), rtol=1e-3, grid="paper"), TypeError, r"grid: expected an opsplit Grid"),
)


@pytest.mark.parametrize("case", CONTROLLER + SOLVE + COMPOSITIONS)
def test_bad_input(case):
    run_case(case)


@pytest.mark.parametrize("case", CONTROLLER_MORE + SOLVE_START + MODELS + ENTRY_POINTS)
def test_adaptive_limits(case):
    run_case(case)
