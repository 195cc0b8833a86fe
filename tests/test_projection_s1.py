"""Projection onto S1(sigma1, sigma2) (paper 002, Theorem 3.1, eq. 22)."""

import numpy as np
import pytest
import torch
from hypothesis import assume, given
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays
from scipy.optimize import minimize

from opsplit import Grid, Interval
from opsplit.operators import ProjectionS1, project_s1

finite = st.floats(-1e3, 1e3, allow_nan=False, allow_infinity=False, width=64)
sig1 = st.floats(-5, 5, allow_nan=False)
sig2 = st.floats(0.05, 5, allow_nan=False)


def tokens(n_min=2, n_max=12):
    return st.integers(n_min, n_max).flatmap(
        lambda n: arrays(np.float64, (3, n), elements=finite)
    )


def _spread(v):
    return float(np.min(np.var(v, axis=-1)))


@given(tokens(), sig1, sig2)
def test_output_has_mean_sigma1_and_variance_sigma2_squared(v, s1, s2):
    assume(_spread(v) > 1e-6)
    u = project_s1(torch.from_numpy(v), s1, s2)
    assert torch.allclose(u.mean(-1), torch.full((3,), s1, dtype=u.dtype), atol=1e-9 * (1 + abs(s1)))
    assert torch.allclose(
        u.var(-1, unbiased=False), torch.full((3,), s2**2, dtype=u.dtype), rtol=1e-9
    )


@given(tokens(), sig1, sig2)
def test_projection_is_idempotent(v, s1, s2):
    assume(_spread(v) > 1e-6)
    u = project_s1(torch.from_numpy(v), s1, s2)
    assert torch.allclose(project_s1(u, s1, s2), u, atol=1e-9 * (1 + abs(s1) + s2))


@given(st.integers(3, 9), st.integers(0, 10_000), sig1, sig2)
def test_weighted_grid_output_is_on_discrete_S1(n, seed, s1, s2):
    """With trapezoid weights the means are quadrature means: the output is on the
    discrete S1 of that quadrature."""
    g = Grid(x=Interval(n=1, length=1.0), y=Interval(n=n, length=2.0, rule="trapezoid"))
    v = torch.randn(4, 1, n, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    u = project_s1(v, s1, s2, grid=g)
    w = g.y.weights(torch.float64)
    mean = (u * w).sum(-1) / w.sum()
    var = ((u - s1) ** 2 * w).sum(-1) / w.sum()
    assert torch.allclose(mean, torch.full_like(mean, s1), atol=1e-10)
    assert torch.allclose(var, torch.full_like(var, s2**2), rtol=1e-10)


def _scipy_closest_point(v, s1, s2, w, starts):
    """min sum_l w_l (u_l - v_l)^2 s.t. the two S1 constraints, by SLSQP from several
    starts (S1 is not convex): the best local minimum found."""
    W = w.sum()
    cons = [
        {"type": "eq", "fun": lambda u: (w * u).sum() / W - s1},
        {"type": "eq", "fun": lambda u: (w * (u - s1) ** 2).sum() / W - s2**2},
    ]
    best = None
    for x0 in starts:
        r = minimize(
            lambda u: (w * (u - v) ** 2).sum(),
            x0,
            jac=lambda u: 2 * w * (u - v),
            constraints=cons,
            method="SLSQP",
            options={"ftol": 1e-14, "maxiter": 500},
        )
        if r.success and (best is None or r.fun < best.fun):
            best = r
    return best


@pytest.mark.parametrize("rule", ["midpoint", "trapezoid"])
@pytest.mark.parametrize("seed", range(6))
def test_closest_point_matches_constrained_minimisation(rule, seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(3, 7))
    v = rng.normal(size=n) * rng.uniform(0.3, 3)
    s1, s2 = float(rng.normal()), float(rng.uniform(0.3, 2))
    g = Grid(x=Interval(n=1, length=1.0), y=Interval(n=n, length=float(n), rule=rule))
    w = g.y.weights(torch.float64).numpy()
    u = project_s1(torch.from_numpy(v).view(1, 1, n), s1, s2, grid=g).view(n).numpy()
    starts = [s1 + s2 * rng.normal(size=n) for _ in range(8)] + [u + 0.3 * rng.normal(size=n)]
    best = _scipy_closest_point(v, s1, s2, w, starts)
    assert best is not None, "SLSQP found no feasible point"
    ours = float((w * (u - v) ** 2).sum())
    assert ours <= best.fun + 1e-9, f"closed form {ours} is farther than SLSQP's {best.fun}"
    assert np.allclose(best.x, u, atol=1e-5), f"SLSQP minimiser {best.x} differs from {u}"


def test_eps_matches_torch_layer_norm(dtype):
    torch.manual_seed(0)
    v = torch.randn(3, 5, 7, dtype=dtype) * 3 + 1
    for eps in (1e-5, 1e-2):
        ours = ProjectionS1(eps=eps)(v)
        ref = torch.nn.functional.layer_norm(v, (7,), eps=eps)
        tol = 1e-6 if dtype == torch.float32 else 1e-13
        assert (ours - ref).abs().max() < tol


@pytest.mark.parametrize("eps", [0.0, 1e-5])
def test_zero_variance_token_is_finite_and_documented(eps, dtype):
    v = torch.randn(2, 4, 6, dtype=dtype)
    v[0, 1] = 3.25  # a constant token
    v.requires_grad_(True)
    u = ProjectionS1(sigma1=0.5, sigma2=2.0, eps=eps)(v)
    assert torch.isfinite(u).all()
    # documented value: the constant sigma_1 (the eps -> 0 limit)
    assert torch.equal(u[0, 1], torch.full((6,), 0.5, dtype=dtype))
    u.sum().backward()
    assert torch.isfinite(v.grad).all()


def test_sigma2_must_be_positive():
    with pytest.raises(ValueError, match="sigma_2 > 0|> 0"):
        ProjectionS1(sigma2=0.0)
    with pytest.raises(ValueError, match="sigma_2 > 0"):
        ProjectionS1(sigma2=torch.tensor(-1.0))
    with pytest.raises(ValueError, match="eps"):
        ProjectionS1(eps=-1.0)
