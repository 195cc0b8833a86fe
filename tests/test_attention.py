"""Softmax attention integral (paper 002, eqs. 3-6, 19) against a naive quadrature loop."""

import math

import pytest
import torch

from opsplit import Grid, Interval
from opsplit.operators import SoftmaxAttention

GRIDS = {
    "paper": Grid.paper(5, 4),
    "midpoint": Grid.uniform(5, 4, lx=2.0, ly=0.5),
    "trapezoid": Grid(
        x=Interval(n=5, length=2.0, rule="trapezoid"), y=Interval(n=4, length=0.5, rule="trapezoid")
    ),
}


def naive_attention(u, WQ, WK, WV, g, scale):
    """Eqs. (3)-(6) and the Omega_x integral, written as explicit quadrature sums."""
    wx, wy = g.x.weights(u.dtype), g.y.weights(u.dtype)
    B, NX, NY = u.shape
    Q = torch.zeros_like(u)
    K = torch.zeros_like(u)
    V = torch.zeros_like(u)
    for b in range(B):
        for k in range(NX):
            for m in range(NY):
                Q[b, k, m] = sum(wy[l] * WQ[l, m] * u[b, k, l] for l in range(NY))
                K[b, k, m] = sum(wy[l] * WK[l, m] * u[b, k, l] for l in range(NY))
                V[b, k, m] = sum(wy[l] * WV[l, m] * u[b, k, l] for l in range(NY))
    out = torch.zeros_like(u)
    for b in range(B):
        for k in range(NX):
            a = [scale * sum(wy[l] * Q[b, k, l] * K[b, j, l] for l in range(NY)) for j in range(NX)]
            z = sum(wx[j] * math.exp(a[j]) for j in range(NX))
            for m in range(NY):
                out[b, k, m] = sum(wx[j] * math.exp(a[j]) / z * V[b, j, m] for j in range(NX))
    return out


@pytest.mark.parametrize("gname", list(GRIDS))
@pytest.mark.parametrize("scale", [None, 0.7])
def test_field_matches_naive_quadrature(gname, scale):
    g = GRIDS[gname]
    gen = torch.Generator().manual_seed(7)
    Ws = [torch.randn(g.ny, g.ny, generator=gen, dtype=torch.float64) for _ in range(3)]
    u = torch.randn(2, g.nx, g.ny, generator=gen, dtype=torch.float64)
    op = SoftmaxAttention(*Ws, scale=scale)
    s = 1 / math.sqrt(g.y.measure) if scale is None else scale
    ref = naive_attention(u, *Ws, g, s)
    assert torch.allclose(op(u, grid=g), ref, atol=1e-12)


def test_attention_weights_are_a_quadrature_of_a_probability_density():
    g = GRIDS["trapezoid"]
    gen = torch.Generator().manual_seed(8)
    op = SoftmaxAttention(*[torch.randn(4, 4, generator=gen, dtype=torch.float64) for _ in range(3)])
    u = torch.randn(3, 5, 4, generator=gen, dtype=torch.float64)
    A = op.attention_weights(u, grid=g)
    assert A.shape == (3, 5, 5) and (A >= 0).all()
    assert torch.allclose(A.sum(-1), torch.ones(3, 5, dtype=torch.float64), atol=1e-14)
    # the field is the weights applied to V
    _, _, v = op.qkv(0.0, u, g)
    assert torch.allclose(op(u, grid=g), A @ v, atol=1e-13)


def test_uniform_x_weights_cancel():
    """Softmax attention does not depend on L_x when the x-weights are equal."""
    gen = torch.Generator().manual_seed(9)
    op = SoftmaxAttention(*[torch.randn(4, 4, generator=gen, dtype=torch.float64) for _ in range(3)])
    u = torch.randn(2, 6, 4, generator=gen, dtype=torch.float64)
    a = op(u, grid=Grid.uniform(6, 4, lx=1.0, ly=3.0))
    b = op(u, grid=Grid.uniform(6, 4, lx=50.0, ly=3.0))
    assert torch.allclose(a, b, atol=1e-14)


def test_scale_is_validated():
    with pytest.raises(ValueError, match="scale"):
        SoftmaxAttention(torch.eye(2), torch.eye(2), torch.eye(2), scale=-1.0)
