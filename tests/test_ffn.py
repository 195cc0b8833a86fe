"""The FFN integral operator (paper 002, eq. 7 term III; steps 23, 34): explicit field,
implicit resolvent and exact flow, checked against independent computations."""

import pytest
import torch
from torchdiffeq import odeint

from opsplit import Grid, Interval
from opsplit.operators import FFNIntegral

GRIDS = {
    "paper": Grid.paper(5, 6),
    "midpoint": Grid.uniform(5, 6, lx=2.0, ly=3.0),
    "trapezoid": Grid(x=Interval(n=5, length=2.0), y=Interval(n=6, length=3.0, rule="trapezoid")),
}


def _op(bias_axis, g, gen):
    n = g.nx if bias_axis == "x" else g.ny
    W = 0.4 * torch.randn(g.ny, g.ny, generator=gen, dtype=torch.float64)
    b = torch.randn(n, generator=gen, dtype=torch.float64)
    return FFNIntegral(W, b, bias_axis=bias_axis), W, b


@pytest.mark.parametrize("gname", list(GRIDS))
@pytest.mark.parametrize("bias_axis", ["x", "y"])
def test_field_is_the_weighted_sum(gname, bias_axis):
    g = GRIDS[gname]
    gen = torch.Generator().manual_seed(1)
    op, W, b = _op(bias_axis, g, gen)
    u = torch.randn(2, g.nx, g.ny, generator=gen, dtype=torch.float64)
    w = g.y.weights(torch.float64)
    # naive loops over the quadrature sum
    ref = torch.zeros_like(u)
    for bb in range(2):
        for k in range(g.nx):
            for m in range(g.ny):
                s = sum(w[l] * W[l, m] * u[bb, k, l] for l in range(g.ny))
                ref[bb, k, m] = s + (b[k] if bias_axis == "x" else b[m])
    assert torch.allclose(op(u, grid=g), ref, atol=1e-13)


@pytest.mark.parametrize("gname", list(GRIDS))
@pytest.mark.parametrize("bias_axis", ["x", "y"])
def test_resolvent_solves_the_implicit_equation(gname, bias_axis):
    g = GRIDS[gname]
    gen = torch.Generator().manual_seed(2)
    op, _, _ = _op(bias_axis, g, gen)
    v = torch.randn(3, g.nx, g.ny, generator=gen, dtype=torch.float64)
    dt = 0.37
    w = op.resolvent(0.0, dt, v, g)
    assert torch.allclose(w - dt * op.field(0.0, w, g), v, atol=1e-12)


@pytest.mark.parametrize("gname", list(GRIDS))
@pytest.mark.parametrize("bias_axis", ["x", "y", None])
def test_exact_flow_matches_an_ode_solve(gname, bias_axis):
    g = GRIDS[gname]
    gen = torch.Generator().manual_seed(3)
    if bias_axis is None:
        op = FFNIntegral(0.4 * torch.randn(g.ny, g.ny, generator=gen, dtype=torch.float64))
    else:
        op, _, _ = _op(bias_axis, g, gen)
    u0 = torch.randn(2, g.nx, g.ny, generator=gen, dtype=torch.float64)
    dt = 0.8
    ts = torch.tensor([0.0, dt], dtype=torch.float64)
    ref = odeint(lambda t, u: op.field(0.0, u, g), u0, ts, method="dopri5", rtol=1e-12, atol=1e-12)[-1]
    assert torch.allclose(op.flow(0.0, dt, u0, g), ref, atol=1e-9)
    # semigroup property
    half = op.flow(0.0, dt / 2, op.flow(0.0, dt / 2, u0, g), g)
    assert torch.allclose(half, op.flow(0.0, dt, u0, g), atol=1e-11)


def test_bias_axis_is_validated():
    with pytest.raises(ValueError, match="bias_axis"):
        FFNIntegral(torch.zeros(3, 3), torch.zeros(3), bias_axis="z")
