"""Property tests (hypothesis) of the two projections over magnitudes 10^-30 .. 10^30 in
float32 and float64 (issue 8, finding 3), completing tests/test_s1_robust.py, which covers
``project_s1`` with plain means on non-constant tokens:

* S1 (LayerNorm, Theorem 3.1) through the *operator* ``ProjectionS1`` on weighted grids
  (midpoint, trapezoid, right; ``L != N``): the result is on S1 in the grid's quadrature
  (weighted mean sigma_1, weighted standard deviation sigma_2), idempotent, finite;
* the documented constant-token rule at every magnitude: a token whose spread is at most
  ``S1_CONSTANT_ULPS`` ulps of its max-abs maps to sigma_1 exactly, with a zero gradient;
* tokens mixing constant and non-constant rows in one batch;
* S2 (ReLU, eq. 24) in float32 and float64 at every magnitude: max(u, 0) exactly,
  idempotent, non-negative, non-expansive, finite, with the 0/1 derivative.

The reference moments are computed in float64 numpy after rescaling by the token's
max-abs (an independent evaluation of the weighted mean and variance)."""

import numpy as np
import pytest
import torch
from hypothesis import assume, given
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from opsplit import Grid, Interval
from opsplit.operators import ProjectionS1, ProjectionS2
from opsplit.operators.layernorm import S1_CONSTANT_ULPS

F32, F64 = torch.float32, torch.float64
DTYPES = {"f32": F32, "f64": F64}

magnitude = st.integers(-30, 30)
moderate = st.floats(-1e3, 1e3, allow_nan=False, allow_infinity=False, width=64)
rules = st.sampled_from(["midpoint", "trapezoid", "right"])


def weighted_moments(u: np.ndarray, w: np.ndarray):
    """Weighted mean and standard deviation over the last axis, float64, after dividing by
    the max-abs of each token (so nothing overflows); returned at the original scale."""
    a = np.abs(u).max(-1, keepdims=True)
    a = np.where(a > 0, a, 1.0)
    x = u / a
    L = w.sum()
    m = (x * w).sum(-1, keepdims=True) / L
    var = (((x - m) ** 2) * w).sum(-1, keepdims=True) / L
    return (m * a)[..., 0], (np.sqrt(var) * a)[..., 0]


def rel_spread(v: np.ndarray) -> float:
    a = np.abs(v).max(-1)
    return float(np.min((v.max(-1) - v.min(-1)) / np.where(a > 0, a, 1)))


@given(st.integers(2, 9).flatmap(lambda n: arrays(np.float64, (2, 3, n), elements=moderate)),
       magnitude, rules, st.floats(0.3, 7.0), st.floats(-3, 3), st.floats(0.1, 4),
       st.sampled_from(["f32", "f64"]))
def test_operator_on_weighted_grid_is_on_S1_idempotent_finite(base, e, rule, ly, s1, s2, dt):
    dtype = DTYPES[dt]
    assume(rel_spread(base) > (1e-3 if dt == "f32" else 1e-9))
    v = torch.from_numpy(base * 10.0**e).to(dtype)
    assume(torch.isfinite(v).all() and (v != 0).any(-1).all())
    n = v.shape[-1]
    grid = Grid(x=Interval(n=3, length=1.0), y=Interval(n=n, length=ly, rule=rule))
    P = ProjectionS1(s1, s2).to(dtype)
    u = P(v, grid=grid)
    assert u.dtype == dtype and torch.isfinite(u).all()
    w = grid.y.weights(F64).numpy()
    mean, std = weighted_moments(u.double().numpy(), w)
    tol = 2e-4 if dt == "f32" else 1e-10
    np.testing.assert_allclose(mean, s1, atol=tol * (abs(s1) + s2))
    np.testing.assert_allclose(std, s2, rtol=tol)
    np.testing.assert_allclose(P(u, grid=grid).double().numpy(), u.double().numpy(), atol=tol * (abs(s1) + s2))


@given(st.floats(-9.0, 9.0).filter(lambda c: abs(c) > 1e-3), magnitude, st.integers(1, 12),
       st.integers(0, S1_CONSTANT_ULPS), rules, st.sampled_from(["f32", "f64"]))
def test_constant_token_rule_at_every_magnitude(c, e, n, ulps, rule, dt):
    """A constant token, or one that differs from a constant by at most
    ``S1_CONSTANT_ULPS / 2`` ulps of its max-abs at one entry, maps to sigma_1 exactly, on
    every grid, with a zero gradient (documented rule, module docstring of layernorm)."""
    dtype = DTYPES[dt]
    value = torch.tensor(c * 10.0**e, dtype=F64).to(dtype)
    assume(torch.isfinite(value) and value != 0)
    v = value.repeat(2, n).clone()
    if n > 1 and ulps:
        # one entry moved by ulps/2 units in the last place of the max-abs (inside the rule)
        step = torch.finfo(dtype).eps * value.abs() * (ulps // 2)
        v[1, 0] = value + step
    v.requires_grad_(True)
    grid = Grid(x=Interval(n=2, length=1.0), y=Interval(n=max(n, 2), length=2.0, rule=rule)) if n > 1 else None
    u = ProjectionS1(0.25, 1.5).to(dtype)(v.unsqueeze(0), grid=grid)
    assert torch.equal(u, torch.full_like(u, 0.25))
    (g,) = torch.autograd.grad((u * torch.arange(n, dtype=dtype)).sum(), v)
    assert torch.isfinite(g).all() and g.abs().max() == 0


@given(st.integers(3, 8).flatmap(lambda n: arrays(np.float64, (4, n), elements=moderate)),
       magnitude, st.sampled_from(["f32", "f64"]))
def test_mixed_batch_constant_and_regular_tokens(base, e, dt):
    """Constant rows and regular rows in one tensor do not affect each other."""
    dtype = DTYPES[dt]
    assume(rel_spread(base[:2]) > (1e-3 if dt == "f32" else 1e-9))
    b = base.copy()
    b[2:] = b[2:, :1]  # rows 2, 3 constant
    v = torch.from_numpy(b * 10.0**e).to(dtype)
    assume(torch.isfinite(v).all() and (v[:2] != 0).any(-1).all())
    u = ProjectionS1(-0.5, 2.0).to(dtype)(v.unsqueeze(0))[0]
    assert torch.isfinite(u).all()
    assert torch.equal(u[2:], torch.full_like(u[2:], -0.5))
    alone = ProjectionS1(-0.5, 2.0).to(dtype)(v[:2].unsqueeze(0))[0]
    assert torch.equal(u[:2], alone)


# -- S2 ---------------------------------------------------------------------------------------
@given(arrays(np.float64, (2, 3, 5), elements=moderate), arrays(np.float64, (2, 3, 5), elements=moderate),
       magnitude, st.sampled_from(["f32", "f64"]))
def test_relu_projection_over_magnitudes(a, b, e, dt):
    dtype = DTYPES[dt]
    P = ProjectionS2()
    v = torch.from_numpy(a * 10.0**e).to(dtype)
    w = torch.from_numpy(b * 10.0**e).to(dtype)
    assume(torch.isfinite(v).all() and torch.isfinite(w).all())
    pv = P(v)
    assert pv.dtype == dtype and torch.isfinite(pv).all()
    assert torch.equal(pv, torch.where(v > 0, v, torch.zeros_like(v)))  # max(v, 0), exactly
    assert (pv >= 0).all()
    assert torch.equal(P(pv), pv)  # idempotent
    # non-expansive, measured in float64 after a common rescaling (no overflow)
    s = 10.0**e
    d_out = ((pv.double() - P(w).double()) / s).norm()
    d_in = ((v.double() - w.double()) / s).norm()
    assert d_out <= d_in * (1 + 1e-12) + 1e-300
    # derivative: 1 where v > 0, 0 where v < 0
    vg = v.clone().requires_grad_(True)
    (g,) = torch.autograd.grad(P(vg).sum(), vg)
    assert torch.equal(g[v > 0], torch.ones_like(g[v > 0]))
    assert torch.equal(g[v < 0], torch.zeros_like(g[v < 0]))


@pytest.mark.parametrize("dtype", [F32, F64], ids=["f32", "f64"])
def test_relu_projection_at_the_float_range_edges(dtype):
    fi = torch.finfo(dtype)
    v = torch.tensor([[[fi.max, -fi.max, fi.tiny, -fi.tiny, fi.tiny / 4, -fi.tiny / 4, 0.0, -0.0]]], dtype=dtype)
    out = ProjectionS2()(v)
    expected = torch.tensor([[[fi.max, 0.0, fi.tiny, 0.0, fi.tiny / 4, 0.0, 0.0, 0.0]]], dtype=dtype)
    assert torch.equal(out, expected)
