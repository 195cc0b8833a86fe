"""Bad input to the schemes (Lie, Strang, Parallel, Hybrid), their steps, the solvers and
Substep, and the Propagator (constructor and forward)."""

import pytest
import torch
from torch import nn

from opsplit import AdaptivePropagator, Grid, Interval, Propagator
from opsplit.operators import FFNIntegral, ProjectionS1, ProjectionS2
from opsplit.operators.transfer import PrependTokens
from opsplit.schemes import (
    BlanesMoan,
    Hybrid,
    Lie,
    Parallel,
    Relaxation,
    SchemeFlow,
    Stage,
    Stages,
    Strang,
    TripleJump,
)
from opsplit.solvers import (
    RK4,
    CatchUp,
    Exact,
    ExactMidpoint,
    ExplicitEuler,
    Heun,
    Implicit,
    ODESolve,
    ProjectedS1,
    SemiImplicit,
    Substep,
    solver_class,
    solver_for,
)

from ._table import F64, INF, NAN, cases, run_case, u


def ffn(n=5):
    return FFNIntegral(torch.randn(n, n, dtype=F64) / n, torch.randn(n, dtype=F64), bias_axis="y")


def prop(n_steps=2, **kw):
    return Propagator(Lie([ffn(), ProjectionS1()]), n_steps, **kw)


G = Grid.paper(3, 5)

SCHEMES = cases(
    ("lie-empty", lambda: Lie([]), ValueError, r"Lie: a scheme needs at least one operator"),
    ("strang-empty", lambda: Strang([]), ValueError, r"Strang: a scheme needs at least one operator"),
    ("parallel-empty", lambda: Parallel([]), ValueError, r"Parallel: a scheme needs at least one operator"),
    ("hybrid-empty", lambda: Hybrid([]), ValueError, r"Hybrid: a scheme needs at least one operator"),
    ("lie-linear", lambda: Lie([nn.Linear(2, 2)]), TypeError, r"Substep: term 0 is a Linear, expected an opsplit Operator"),
    ("strang-str", lambda: Strang(["relu"]), TypeError, r"term 0 is a str, expected an opsplit Operator"),
    ("parallel-batch", lambda: Parallel([ffn(), ffn()], batch="yes"), ValueError, r"batch: expected True, False or 'auto'"),
    ("hybrid-batch", lambda: Hybrid([[ffn()], [ffn()]], batch=2), ValueError, r"batch: expected True, False or 'auto'"),
    ("hybrid-not-groups", lambda: Hybrid([ffn(), ffn()]), ValueError, r"Hybrid: expected a list of groups"),
    ("hybrid-empty-group", lambda: Hybrid([[ffn()], []]), ValueError, r"Hybrid: group 1 is empty"),
    ("hybrid-index-range", lambda: Hybrid([ffn(), ffn()], groups=[[0], [2]]), ValueError, r"Hybrid\.groups\[1\]: index 2 is out of range"),
    ("hybrid-index-type", lambda: Hybrid([ffn(), ffn()], groups=[[0], ["1"]]), TypeError, r"Hybrid\.groups\[1\]: expected integer"),
    ("hybrid-index-twice", lambda: Hybrid([ffn(), ffn()], groups=[[0, 1], [1]]), ValueError, r"Hybrid\.groups: substep 1 appears in group 0 and in group 1"),
    ("hybrid-missing", lambda: Hybrid([ffn(), ffn()], groups=[[0]]), ValueError, r"Hybrid\.groups do not cover.*\[1\]"),
    ("lie-step-dt=0", lambda: Lie([ffn()])(0.0, 0.0, u(2, 3, 5), G), ValueError, r"Lie: dt: expected a finite number > 0"),
    ("lie-step-dt<0", lambda: Lie([ffn()])(0.0, -0.1, u(2, 3, 5), G), ValueError, r"Lie: dt: expected a finite number > 0"),
    ("strang-step-dt=nan", lambda: Strang([ffn()])(0.0, NAN, u(2, 3, 5), G), ValueError, r"Strang: dt: expected a finite"),
    ("strang-step-dt-tensor-nan", lambda: Strang([ffn()])(0.0, torch.tensor(NAN), u(2, 3, 5), G), ValueError, r"Strang: dt: expected a finite time step > 0"),
    ("parallel-step-dt=inf", lambda: Parallel([ffn(), ffn()])(0.0, INF, u(2, 3, 5), G), ValueError, r"Parallel: dt: expected a finite"),
    ("hybrid-step-t=nan", lambda: Hybrid([[ffn()]])(NAN, 0.5, u(2, 3, 5), G), ValueError, r"Hybrid: t: expected a finite"),
    ("lie-step-dt-int-tensor", lambda: Lie([ffn()])(0.0, torch.tensor(1), u(2, 3, 5), G), TypeError, r"Lie: dt: expected a number or a 0-d floating tensor"),
    ("lie-step-grid-none", lambda: Lie([ffn()])(0.0, 0.5, u(2, 3, 5), None), TypeError, r"Lie: grid: expected an opsplit Grid"),
)

SOLVERS = cases(
    ("substep-empty", lambda: Substep(()), ValueError, r"Substep: expected at least one operator"),
    ("substep-solver-str", lambda: Substep(ffn(), "euler"), TypeError, r"Substep\.solver: expected a Solver"),
    ("substep-two-no-solver", lambda: Substep((ffn(), ProjectionS2())), ValueError, r"Substep: several operators need an explicit solver"),
    ("euler-on-S1", lambda: Substep(ProjectionS1(), ExplicitEuler()), ValueError, r"ExplicitEuler needs an operator with a field"),
    ("heun-on-S2", lambda: Substep(ProjectionS2(), Heun()), ValueError, r"Heun needs operators with an explicit field.*ProjectionS2"),
    ("rk4-on-S1", lambda: Substep(ProjectionS1(), RK4()), ValueError, r"RK4 needs operators with an explicit field.*ProjectionS1"),
    ("euler-two-terms", lambda: Substep((ffn(), ffn()), ExplicitEuler()), ValueError, r"ExplicitEuler"),
    ("implicit-on-relax", lambda: Substep(Relaxation([ffn()]), Implicit()), ValueError, r"Implicit needs an operator with a resolvent"),
    ("exact-on-S1", lambda: Substep(ProjectionS1(), Exact()), ValueError, r"Exact needs an operator with a flow"),
    ("semi-implicit-order", lambda: Substep((ProjectionS2(), ffn()), SemiImplicit()), ValueError, r"SemiImplicit: the first term ProjectionS2 has no explicit field"),
    ("catch-up-ffn", lambda: Substep(ffn(), CatchUp()), ValueError, r"CatchUp advances indicator terms"),
    ("exact-midpoint-relax", lambda: Substep(Relaxation([ffn()]), ExactMidpoint()), ValueError, r"ExactMidpoint"),
    ("projected-base-str", lambda: ProjectedS1("rk4"), TypeError, r"ProjectedS1\.base: expected a Solver"),
    ("projected-base-implicit", lambda: ProjectedS1(Implicit()), ValueError, r"ProjectedS1\.base: expected a solver of explicit fields"),
    ("projected-on-S1", lambda: Substep(ProjectionS1(), ProjectedS1()), ValueError, r"ProjectedS1 needs operators with an explicit field"),
    ("odesolve-method", lambda: ODESolve("euler42"), ValueError, r"ODESolve\.method: expected one of"),
    ("odesolve-rtol=0", lambda: ODESolve(rtol=0.0), ValueError, r"ODESolve\.rtol: expected a finite number > 0"),
    ("odesolve-atol=nan", lambda: ODESolve(atol=NAN), ValueError, r"ODESolve\.atol: expected a finite number > 0"),
    ("odesolve-options", lambda: ODESolve(options=[1]), TypeError, r"ODESolve\.options: expected a dict"),
    ("substep-call-dt=nan", lambda: Substep(ffn())(0.0, NAN, u(2, 3, 5), G), ValueError, r"Substep: dt: expected a finite"),
    ("substep-call-t=inf", lambda: Substep(ffn())(INF, 0.1, u(2, 3, 5), G), ValueError, r"Substep: t: expected a finite"),
)

PROPAGATOR = cases(
    ("scheme-operator", lambda: Propagator(ffn(), 2), TypeError, r"Propagator\.scheme: expected an opsplit Scheme"),
    ("N_t=0", lambda: prop(0), ValueError, r"Propagator\.n_steps \(N_t\).*>= 1"),
    ("N_t<0", lambda: prop(-4), ValueError, r"Propagator\.n_steps \(N_t\).*>= 1"),
    ("N_t-float", lambda: prop(2.5), TypeError, r"Propagator\.n_steps \(N_t\): expected a positive integer"),
    ("N_t-bool", lambda: prop(True), TypeError, r"Propagator\.n_steps \(N_t\): expected a positive integer"),
    ("t0=nan", lambda: prop(t0=NAN), ValueError, r"Propagator\.t0: expected a finite"),
    ("t1=inf", lambda: prop(t1=INF), ValueError, r"Propagator\.t1 \(T\): expected a finite"),
    ("t1<=t0", lambda: prop(t0=1.0, t1=1.0), ValueError, r"Propagator\.t1 \(T\): expected t0 < t1"),
    ("grid-str", lambda: prop(grid="paper"), TypeError, r"Propagator\.grid: expected an opsplit Grid"),
    ("f-rank4", lambda: prop()(u(1, 2, 3, 5)), ValueError, r"f: expected shape \(B, N_x, N_y\).*rank 4"),
    ("f-rank1", lambda: prop()(u(5)), ValueError, r"f: expected shape.*rank 1"),
    ("f-int", lambda: prop()(torch.zeros(2, 3, 5, dtype=torch.int64)), TypeError, r"f: expected a floating"),
    ("f-numpy", lambda: prop()(u(2, 3, 5).numpy()), TypeError, r"f: expected a torch.Tensor"),
    ("f-nan", lambda: prop()(u(2, 3, 5, fill=NAN, at=(1, 1, 1))), ValueError, r"f: expected finite values, found 1"),
    ("f-inf", lambda: prop()(u(2, 3, 5, fill=INF, at=(0, 2, 4))), ValueError, r"f: expected finite values"),
    ("f-f32", lambda: prop()(u(2, 3, 5, dtype=torch.float32)), TypeError, r"f: dtype torch.float32 differs from the Propagator's torch.float64"),
    ("f-meta", lambda: prop()(u(2, 3, 5, device="meta")), ValueError, r"f: device meta differs"),
    ("f-N_y-grid", lambda: prop()(u(2, 3, 4)), ValueError, r"FFNIntegral\.W: grid/control mismatch on Omega_y"),
    ("f-N_x-fixed-grid", lambda: prop(grid=Grid.paper(3, 5))(u(2, 4, 5)), ValueError, r"f: grid/tensor mismatch.*N_x differs"),
    ("f-empty-tokens", lambda: prop()(u(2, 0, 5)), ValueError, r"f: empty tensor: expected N_x >= 1"),
    ("f-empty-features", lambda: Propagator(Lie([ProjectionS2()]), 1)(u(2, 3, 0)), ValueError, r"f: empty tensor: expected N_y >= 1"),
    ("f-trapezoid-1", lambda: prop(grid=Grid(x=Interval(length=1.0, rule="trapezoid"), y=Interval(spacing=1.0)))(u(1, 1, 5)), ValueError, r"f:.*trapezoid.*N_x >= 2"),
    ("n_steps=0", lambda: prop()(u(2, 3, 5), n_steps=0), ValueError, r"n_steps \(N_t\).*>= 1"),
    ("n_steps=str", lambda: prop()(u(2, 3, 5), n_steps="3"), TypeError, r"n_steps \(N_t\): expected a positive integer"),
    ("grid=str", lambda: prop()(u(2, 3, 5), grid="paper"), TypeError, r"grid: expected an opsplit Grid"),
    ("nan-parameter", lambda: _nan_prop()(u(2, 3, 5)), ValueError, r"Propagator: parameters must be finite.*W\.value"),
    ("overflow", lambda: Propagator(Lie([FFNIntegral(100 * torch.eye(5, dtype=F64))]), 4)((u(2, 3, 5).abs() + 1) * 1e305), ValueError, r"Propagator output: expected finite.*left the range"),
    ("dt-method", lambda: prop().dt(0), ValueError, r"n_steps \(N_t\).*>= 1"),
    ("times-method", lambda: prop().times(-1), ValueError, r"n_steps \(N_t\).*>= 1"),
    ("schemeflow-operator", lambda: SchemeFlow(ffn()), TypeError, r"SchemeFlow\.scheme: expected an opsplit Scheme, got FFNIntegral"),
    ("schemeflow-transfer", lambda: SchemeFlow(Hybrid([[ffn()], [PrependTokens(torch.zeros(1, 5, dtype=F64))]])), ValueError, r"SchemeFlow: Hybrid moves the state to another grid \(grid transfer PrependTokens\)"),
    ("solve-fixed-n_steps=0", lambda: prop().solve(u(2, 3, 5), n_steps=0), ValueError, r"n_steps \(N_t\).*>= 1"),
    ("solve-fixed-t_eval-off-grid-large-t0", lambda: prop(t0=1e12, t1=1e12 + 1.0).solve(u(2, 3, 5), n_steps=4, t_eval=[1e12 + 0.3]), ValueError, r"t_eval: 1e\+12 is not a time of the fixed grid of N_t = 4 steps"),
    ("solve-fixed-t_eval-outside", lambda: prop().solve(u(2, 3, 5), t_eval=[3.0]), ValueError, r"t_eval: times must lie in \[t0, t1\] = \[0, 2\]"),
    ("solve-fixed-t_eval-str", lambda: prop().solve(u(2, 3, 5), t_eval="end"), TypeError, r"t_eval: expected a sequence of numbers"),
    ("solve-per_sample-int", lambda: prop().solve(u(2, 3, 5), rtol=1e-3, per_sample=2), TypeError, r"per_sample: expected True or False"),
    ("solve-s1-relu-adaptive", lambda: Propagator(Lie([ffn(), ProjectionS1(), ProjectionS2()]), 2).solve(u(2, 3, 5), rtol=1e-3), ValueError, r"adaptive steps: Lie cannot be solved to a tolerance: its substep 2:ProjectionS2 is not a smooth map"),
)


def _set(obj, **attrs):
    """Set attributes after construction (issue 42, finding 13e: they were not checked)."""
    def call():
        o = obj()
        for k, v in attrs.items():
            setattr(o, k, v)
    return call


def _solved(make, **attrs):
    """Set attributes, then solve: the solve must not start (it used to run)."""
    def call():
        p = make()
        for k, v in attrs.items():
            setattr(p, k, v)
        return p(u(2, 3, 5))
    return call


def _adaptive():
    return AdaptivePropagator(Strang([ffn(), ffn()]), t1=1.0, rtol=1e-3)


# issue 42, finding 13e: attributes set after construction are checked as the constructor checks them
AFTER_CONSTRUCTION = cases(
    ("set-n_steps=-2", _solved(prop, n_steps=-2), ValueError, r"^Propagator\.n_steps \(N_t\): expected a positive integer \(>= 1\), got -2"),
    ("set-n_steps=0", _solved(prop, n_steps=0), ValueError, r"^Propagator\.n_steps \(N_t\): expected a positive integer \(>= 1\), got 0"),
    ("set-n_steps-float", _set(prop, n_steps=2.5), TypeError, r"^Propagator\.n_steps \(N_t\): expected a positive integer, got 2\.5"),
    ("set-n_steps-str", _set(prop, n_steps="4"), TypeError, r"^Propagator\.n_steps \(N_t\): expected a positive integer"),
    ("set-t1-below-t0-lie", _solved(prop, t1=-1.0), ValueError, r"^Propagator\.t1 \(T\): expected t0 < t1, got t0=0, t1=-1"),
    ("set-t1-below-t0-strang", _solved(lambda: Propagator(Strang([ffn(), ffn()]), 2), t1=-1.0), ValueError, r"^Propagator\.t1 \(T\): expected t0 < t1"),
    ("set-t1-below-t0-blanes-moan", _solved(lambda: Propagator(BlanesMoan([ffn(), ffn()]), 2), t1=-1.0), ValueError, r"^Propagator\.t1 \(T\): expected t0 < t1"),
    ("set-t1-below-t0-triple-jump", _solved(lambda: Propagator(TripleJump([ffn(), ffn()]), 2), t1=-1.0), ValueError, r"^Propagator\.t1 \(T\): expected t0 < t1"),
    ("set-t1-equal-t0", _set(prop, t1=0.0), ValueError, r"^Propagator\.t1 \(T\): expected t0 < t1, got t0=0, t1=0"),
    ("set-t0-above-t1", _solved(prop, t0=3.0), ValueError, r"^Propagator\.t0: expected t0 < t1 = 2, got t0=3 \(to move the interval past t1, set t1 first\)"),
    ("set-t1-nan", _set(prop, t1=NAN), ValueError, r"^Propagator\.t1 \(T\): expected a finite number, got nan"),
    ("set-t0-inf", _set(prop, t0=-INF), ValueError, r"^Propagator\.t0: expected a finite number"),
    ("set-t1-str", _set(prop, t1="2"), TypeError, r"^Propagator\.t1 \(T\)"),
    ("set-grid-str", _set(prop, grid="paper"), TypeError, r"^Propagator\.grid: expected an opsplit Grid"),
    ("set-scheme-operator", _set(prop, scheme=ffn()), TypeError, r"^Propagator\.scheme: expected an opsplit Scheme, got FFNIntegral"),
    ("set-scheme-none", _set(prop, scheme=None), TypeError, r"^Propagator\.scheme: expected an opsplit Scheme, got NoneType"),
    ("set-checkpoint_every=-1", _set(prop, checkpoint_every=-1), ValueError, r"^Propagator\.checkpoint_every: expected an integer >= 0, got -1"),
    ("set-checkpoint_every-float", _set(prop, checkpoint_every=1.5), TypeError, r"^Propagator\.checkpoint_every: expected an integer >= 0"),
    ("set-checkpoint_snapshots=0", _set(prop, checkpoint_snapshots=0), ValueError, r"^Propagator\.checkpoint_snapshots: expected None or an integer >= 1, got 0"),
    ("set-checkpoint_snapshots-bool", _set(prop, checkpoint_snapshots=True), TypeError, r"^Propagator\.checkpoint_snapshots"),
    ("adaptive-set-controller", _set(_adaptive, controller={"rtol": 1e-3}), TypeError, r"^AdaptivePropagator\.controller: expected an opsplit\.adaptive\.PIController, got dict"),
    ("adaptive-set-per_sample", _set(_adaptive, per_sample=2), TypeError, r"^AdaptivePropagator\.per_sample: expected True or False, got 2"),
    ("adaptive-set-on_failure", _set(_adaptive, on_failure="ignore"), ValueError, r"^AdaptivePropagator\.on_failure: expected one of \('raise', 'return'\), got 'ignore'"),
    ("adaptive-set-estimator", _set(_adaptive, estimator=3), TypeError, r"^AdaptivePropagator\.estimator: expected 'doubling', 'extrapolate', 'euler-heun', a companion Scheme"),
    ("adaptive-set-t1-below-t0", _set(_adaptive, t1=-2.0), ValueError, r"^Propagator\.t1 \(T\): expected t0 < t1"),
    ("scheme-set-order", _set(lambda: Lie([ffn()]), order=2), AttributeError, r"^Lie\.order: a property of the scheme's class \(order = 1\)"),
    ("scheme-set-threads_grid", _set(lambda: Strang([ffn()]), threads_grid=True), AttributeError, r"^Strang\.threads_grid: a property of the scheme's class"),
    ("scheme-set-substeps", _set(lambda: Parallel([ffn(), ffn()]), substeps=nn.ModuleList([Substep(ffn())])), AttributeError, r"^Parallel\.substeps: fixed at construction"),
    ("composition-set-merge-str", _set(lambda: TripleJump([ffn(), ffn()]), merge="no"), TypeError, r"^TripleJump\.merge: expected True or False, got 'no'"),
    ("composition-set-calls", _set(lambda: BlanesMoan([ffn(), ffn()]), calls=[]), AttributeError, r"^BlanesMoan\.calls: made from the sweeps and merge"),
    ("parallel-set-batch", _set(lambda: Parallel([ffn(), ffn()]), batch="yes"), ValueError, r"^Parallel\.batch: expected True, False or 'auto', got 'yes'"),
    ("parallel-set-batch-int", _set(lambda: Parallel([ffn(), ffn()]), batch=0), ValueError, r"^Parallel\.batch: expected True, False or 'auto', got 0"),
    ("hybrid-set-batch", _set(lambda: Hybrid([[ffn(), ffn()]]), batch=2), ValueError, r"^Hybrid\.batch: expected True, False or 'auto', got 2"),
    ("hybrid-set-groups", _set(lambda: Hybrid([ffn(), ffn()], groups=[[0, 1]]), groups=((0,), (1,))), AttributeError, r"^Hybrid\.groups: fixed at construction"),
    ("stage-set-duration", _set(lambda: Stage(Lie([ffn()]), 2), duration=5.0), AttributeError, r"^Stage\.duration: fixed at construction"),
    ("stage-set-n_steps", _set(lambda: Stage(Lie([ffn()]), 2), n_steps=0), AttributeError, r"^Stage\.n_steps: fixed at construction"),
    ("stages-set-t0", _set(lambda: Stages([Stage(Lie([ffn()]), 2)]), t0=1.0), AttributeError, r"^Stages\.t0: fixed at construction"),
    ("relaxation-set-weight=0", _set(lambda: Relaxation([ffn()]), weight=0.0), ValueError, r"^Relaxation\.weight: expected 0 < weight <= 1, got 0\.0"),
    ("relaxation-set-weight-nan", _set(lambda: Relaxation([ffn()]), weight=NAN), ValueError, r"^Relaxation\.weight: expected a finite number"),
    ("schemeflow-set-operator", _set(lambda: SchemeFlow(Lie([ffn()])), scheme=ffn()), TypeError, r"^SchemeFlow\.scheme: expected an opsplit Scheme, got FFNIntegral"),
)

# issue 42, finding 13f: an N_t whose solve cannot fit in memory is refused before the time grid
# is made (it ran into a MemoryError after minutes), naming n_steps, with the memory and the work
_FITS = r"before the first step, more than the .* available; expected a smaller n_steps$"
SIZE = cases(
    ("forward-n_steps=1e12", lambda: prop()(u(2, 3, 5), n_steps=10**12), ValueError,
     r"^n_steps \(N_t\): N_t = 1000000000000 steps of Lie on a state \(2, 3, 5\): at least 32 TB of memory \(a time grid "
     r"of 1000000000001 times: 32 TB\) and 2e\+12 substep calls " + _FITS),
    ("solve-n_steps=1e12", lambda: prop().solve(u(2, 3, 5), n_steps=10**12), ValueError,
     r"^n_steps \(N_t\): N_t = 1000000000000 steps of Lie on a state \(2, 3, 5\): at least 32 TB " + r".*" + _FITS),
    ("times-1e12", lambda: prop().times(10**12), ValueError,
     r"^n_steps \(N_t\): N_t = 1000000000000 steps: at least 32 TB of memory \(a time grid of 1000000000001 times"),
    ("own-n_steps=1e12", _solved(prop, n_steps=10**12), ValueError,
     r"^Propagator\.n_steps \(N_t\): N_t = 1000000000000 steps of Lie" + r".*" + _FITS),
    ("trajectory-1e10", lambda: prop()(u(2, 3, 5), n_steps=10**10, return_trajectory=True), ValueError,
     r"^n_steps \(N_t\): N_t = 10000000000 steps .*a trajectory of 10000000001 states: 4\.8 TB\)" + r".*" + _FITS),
    ("strang-1e12-calls", lambda: Propagator(Strang([ffn(), ffn(), ffn()]), 2)(u(2, 3, 5), n_steps=10**12), ValueError,
     r"^n_steps \(N_t\): N_t = 1000000000000 steps of Strang .* and 5e\+12 substep calls"),
    ("adaptive-forward-n_steps=1e12", lambda: _adaptive()(u(2, 3, 5), n_steps=10**12), ValueError,
     r"^n_steps \(N_t\): N_t = 1000000000000 steps of Strang"),
)


def _nan_prop():
    p = prop()
    p.scheme.substeps[0].terms[0].W.value[0, 0] = NAN
    return p


@pytest.mark.parametrize("case", SCHEMES)
def test_schemes(case):
    run_case(case)


@pytest.mark.parametrize("case", SOLVERS)
def test_solvers(case):
    run_case(case)


@pytest.mark.parametrize("case", PROPAGATOR)
def test_propagator(case):
    run_case(case)


@pytest.mark.parametrize("case", AFTER_CONSTRUCTION)
def test_attributes_set_after_construction(case):
    run_case(case)


@pytest.mark.parametrize("case", SIZE)
def test_size_guard(case):
    run_case(case)


# the solvers by name (opsplit.solvers.SOLVERS)
REGISTRY = cases(
    ("solver_for-unknown", lambda: solver_for("dopri5"), ValueError,
     r"^solver_for: expected a substep solver name, one of 'euler', 'heun', 'rk4', 'odeint', 'implicit'"),
    ("solver_for-case", lambda: solver_for("Euler"), ValueError, r"^solver_for: expected a substep solver name"),
    ("solver_for-none", lambda: solver_for(None), TypeError,
     r"^solver_for: expected a solver name or an opsplit Operator, got NoneType"),
    ("solver_for-kind", lambda: solver_for(_odd_kind()), ValueError,
     r"^FFNIntegral: unknown default_solver 'sideways'; expected one of 'explicit', 'implicit', 'exact'"),
    ("solver_class-int", lambda: solver_class(4, "train.solver"), TypeError,
     r"^train\.solver: expected a substep solver name \(a str\), got int"),
)


def _odd_kind():
    op = ffn()
    op.default_solver = "sideways"
    return op


@pytest.mark.parametrize("case", REGISTRY)
def test_registry(case):
    run_case(case)
