"""torch.autograd.gradcheck in float64 for every operator and for a whole propagator."""

import pytest
import torch
from torch.autograd import gradcheck

from opsplit import Grid, Interval, Propagator
from opsplit.controls import PiecewiseConstant
from opsplit.models import PaperTransformer
from opsplit.operators import (
    FFNIntegral,
    ProjectionS1,
    ProjectionS2,
    SoftmaxAttention,
    project_s1,
)
from opsplit.schemes import Lie, Relaxation
from opsplit.solvers import SemiImplicit, Substep

D = torch.float64
GRIDS = [
    Grid.paper(4, 5),
    Grid(x=Interval(n=4, length=1.0, rule="trapezoid"), y=Interval(n=5, length=2.0, rule="trapezoid")),
]


def _r(*shape, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g, dtype=D).requires_grad_(True)


@pytest.mark.parametrize("g", GRIDS, ids=["paper", "trapezoid"])
def test_attention_field(g):
    u = _r(2, 4, 5)
    Ws = [_r(5, 5, seed=s) for s in (1, 2, 3)]

    def f(u, WQ, WK, WV):
        return SoftmaxAttention(WQ, WK, WV).field(0.0, u, g)

    assert gradcheck(f, (u, *Ws))


@pytest.mark.parametrize("g", GRIDS, ids=["paper", "trapezoid"])
@pytest.mark.parametrize("eps", [0.0, 1e-3])
def test_projection_s1(g, eps):
    u = _r(2, 4, 5)
    s1 = _r((), seed=4)
    s2 = (torch.rand((), dtype=D) + 0.5).requires_grad_(True)
    assert gradcheck(lambda u, a, b: project_s1(u, a, b, g, eps), (u, s1, s2))


def test_projection_s2_away_from_kinks():
    u = _r(2, 4, 5)
    with torch.no_grad():
        u[u.abs() < 0.05] = 0.3  # ReLU is differentiable away from 0
    assert gradcheck(lambda u: ProjectionS2()(u), (u,))


@pytest.mark.parametrize("g", GRIDS, ids=["paper", "trapezoid"])
@pytest.mark.parametrize("bias_axis", ["x", "y"])
@pytest.mark.parametrize("method", ["field", "resolvent", "flow"])
def test_ffn_integral(g, bias_axis, method):
    u = _r(2, 4, 5)
    W = (0.3 * _r(5, 5, seed=5)).detach().requires_grad_(True)
    b = _r(4 if bias_axis == "x" else 5, seed=6)

    def f(u, W, b):
        op = FFNIntegral(W, b, bias_axis=bias_axis)
        if method == "field":
            return op.field(0.0, u, g)
        return getattr(op, method)(0.0, 0.4, u, g)

    assert gradcheck(f, (u, W, b))


def test_relaxation_flow():
    g = GRIDS[0]
    u = _r(2, 4, 5)
    W = (0.3 * _r(5, 5, seed=7)).detach().requires_grad_(True)

    def f(u, W):
        inner = [Substep((FFNIntegral(W, bias_axis="y"), ProjectionS2()), SemiImplicit())]
        return Relaxation(inner, weight=0.5).flow(0.0, 1.0, u, g)

    # inputs away from ReLU kinks of the inner step
    with torch.no_grad():
        pre = u + FFNIntegral(W, bias_axis="y").field(0.0, u, g)
        u[pre.abs() < 0.05] += 0.2
    assert gradcheck(f, (u, W))


def test_whole_paper_propagator_wrt_input_and_controls():
    torch.manual_seed(0)
    model = PaperTransformer(4, n_x=3, J=2, n_steps=2, dtype=D)
    f0 = _r(2, 3, 4, seed=11)

    # gradcheck w.r.t. the input through the module ...
    assert gradcheck(lambda f: model(f), (f0,))
    # ... and w.r.t. every control, via torch.func.functional_call
    names = [n for n, _ in model.named_parameters()]
    leaves = [p.detach().clone().requires_grad_(True) for p in model.parameters()]

    def g(*ps):
        return torch.func.functional_call(model, dict(zip(names, ps)), (f0.detach(),))

    assert gradcheck(g, tuple(leaves))


def test_propagator_with_time_dependent_controls_and_general_grid():
    g = Grid.uniform(3, 4, lx=1.0, ly=2.0)
    WQ, WK, WV = (PiecewiseConstant(0.5 * torch.randn(2, 4, 4, dtype=D), t1=1.0) for _ in range(3))
    scheme = Lie([SoftmaxAttention(WQ, WK, WV), ProjectionS1(eps=0.0)])
    prop = Propagator(scheme, 2, t1=1.0, grid=g)
    assert gradcheck(lambda f: prop(f), (_r(2, 3, 4, seed=12),))
