"""S1 projection (Theorem 3.1) on constant tokens and at extreme magnitudes (issue 8,
finding 3): constant tokens map to sigma_1 with finite gradients, any finite magnitude is
projected without over/underflow, eps > 0 stays torch's layer_norm formula, and the
arguments are validated."""

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import assume, given
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays
from torch.autograd import gradcheck, gradgradcheck

from opsplit import Grid, Interval
from opsplit.controls import PiecewiseConstant
from opsplit.operators import ProjectionS1, project_s1
from opsplit.operators.layernorm import constant_tokens, token_mean_std
from opsplit.solvers import ExplicitEuler, ProjectedS1, tangent_s1

F64 = torch.float64


def naive_projection(x: np.ndarray, s1: float, s2: float) -> np.ndarray:
    """Theorem 3.1 transcribed in float64 numpy (plain means), for moderate tokens."""
    d = x - x.mean(-1, keepdims=True)
    return s2 * d / np.sqrt((d * d).mean(-1, keepdims=True)) + s1


# -- constant tokens -------------------------------------------------------------------------
def test_constant_token_of_the_finding_returns_sigma1_with_finite_gradient():
    v = torch.full((7,), 0.1, dtype=F64, requires_grad=True)
    out = project_s1(v, 0.3, 2.0)
    # main returned 2.3 everywhere (rounding noise of the mean blown up to sigma_2)
    assert torch.equal(out, torch.full((7,), 0.3, dtype=F64))
    w = torch.linspace(-1, 1, 7, dtype=F64)
    (g,) = torch.autograd.grad((out * w).sum(), v)
    assert torch.isfinite(g).all() and g.abs().max() == 0


CONSTANTS = [0.1, 0.3, -0.7, 1 / 3, 2.5e-8, -123.456, 1e10]
LENGTHS = [2, 3, 7, 10, 64]


@pytest.mark.parametrize("dtype", [torch.float32, F64], ids=["f32", "f64"])
@pytest.mark.parametrize("eps", [0.0, 1e-5])
def test_35_constant_tokens_all_return_sigma1(dtype, eps):
    """7 constants x 5 lengths (main: 14/35 wrong in float64, 16/35 in float32)."""
    bad = []
    for c in CONSTANTS:
        for n in LENGTHS:
            v = torch.full((2, n), c, dtype=dtype, requires_grad=True)
            out = project_s1(v, 0.3, 2.0, eps=eps)
            (g,) = torch.autograd.grad((out * torch.arange(n, dtype=dtype)).sum(), v)
            if not (torch.equal(out, torch.full_like(out, 0.3)) and torch.isfinite(g).all()):
                bad.append((c, n))
    assert not bad, f"constant tokens not mapped to sigma_1: {bad}"


@pytest.mark.parametrize("rule", ["midpoint", "trapezoid", "right"])
@pytest.mark.parametrize("n", [2, 5, 100, 1000])
def test_constant_token_on_weighted_grids(rule, n, dtype):
    """The weighted mean of a constant is rounded (by up to ~600 eps for n = 10^4 in
    float64): the rule decides by max - min, which is exact."""
    g = Grid(x=Interval(n=3, length=1.0), y=Interval(n=n, length=2.7, rule=rule))
    v = torch.full((1, 3, n), -0.3, dtype=dtype)
    assert torch.equal(project_s1(v, 0.5, 1.5, g), torch.full_like(v, 0.5))


def test_constant_rule_is_relative_to_the_token_scale():
    eps = torch.finfo(F64).eps
    x = torch.tensor([1.0, 1.0, 1.0 + 4 * eps, 1.0])  # 4 ulp: rounding noise -> constant
    assert constant_tokens(x.double()).item()
    y = torch.tensor([1.0, 1.0, 1.0 + 64 * eps, 1.0], dtype=F64)  # 64 ulp: a real token
    assert not constant_tokens(y).item()
    # the same relative spread at another scale gives the same decision
    assert constant_tokens(x.double() * 2.0**-900).item()
    assert not constant_tokens(y * 2.0**900).item()
    assert constant_tokens(torch.zeros(5, dtype=F64)).item()  # the all-zero token


# -- extreme magnitudes ----------------------------------------------------------------------
@pytest.mark.parametrize(
    "dtype,scale",
    [
        (torch.float32, 1e20), (torch.float32, 1e30), (torch.float32, 1e-23),
        (torch.float32, 1e-30), (F64, 1e160), (F64, 1e300), (F64, 1e-170), (F64, 1e-300),
    ],
)
def test_extreme_magnitudes_are_projected_not_collapsed(dtype, scale):
    """main returned sigma_1 everywhere (the variance over/underflowed)."""
    x = torch.randn(4, 9, dtype=F64, generator=torch.Generator().manual_seed(1))
    v = (x * scale).to(dtype)
    out = project_s1(v, 0.3, 2.0)
    ref = naive_projection((v.double() / scale).numpy(), 0.3, 2.0)
    tol = 2e-6 if dtype == torch.float32 else 1e-13
    np.testing.assert_allclose(out.double().numpy(), ref, atol=tol * 2)
    assert torch.isfinite(out).all()


@pytest.mark.parametrize("dtype,scale", [(torch.float32, 1e20), (torch.float32, 1e-23), (F64, 1e200), (F64, 1e-170)])
def test_eps_formula_at_extreme_magnitudes(dtype, scale):
    """eps > 0: sigma_2 (v - mean)/sqrt(var + eps) + sigma_1; large tokens -> eps negligible
    (the eps = 0 projection of the unscaled token), tiny tokens -> (v - mean)/sqrt(eps)."""
    x = torch.randn(3, 8, dtype=F64, generator=torch.Generator().manual_seed(2))
    v = (x * scale).to(dtype)
    eps = 1e-5
    out = project_s1(v, 0.0, 1.0, eps=eps).double()
    vd = v.double() / scale
    if scale > 1:
        ref = torch.from_numpy(naive_projection(vd.numpy(), 0.0, 1.0))
        tol = 1e-5 if dtype == torch.float32 else 1e-12
        assert (out - ref).abs().max() <= tol
    else:
        ref = (vd - vd.mean(-1, keepdim=True)) * (scale / math.sqrt(eps))
        assert ((out - ref).abs().max() / ref.abs().max()) <= (1e-5 if dtype == torch.float32 else 1e-12)
    assert torch.isfinite(out).all()


def test_eps_matches_torch_layer_norm_on_moderate_tokens(dtype):
    g = torch.Generator().manual_seed(3)
    v = torch.randn(5, 6, 11, dtype=dtype, generator=g) * torch.logspace(-3, 3, 11, dtype=dtype)
    for eps in (1e-5, 1e-2, 1.0):
        ours = project_s1(v, 0.0, 1.0, eps=eps)
        ref = F.layer_norm(v, (11,), eps=eps)
        tol = 2e-6 if dtype == torch.float32 else 1e-13
        assert (ours - ref).abs().max() <= tol * ref.abs().max()


magnitude = st.integers(-30, 30)
finite = st.floats(-1e3, 1e3, allow_nan=False, allow_infinity=False, width=64)


def _rel_spread(v: np.ndarray) -> float:
    a = np.abs(v).max(-1)
    return float(np.min((v.max(-1) - v.min(-1)) / np.where(a > 0, a, 1)))


@given(st.integers(2, 12).flatmap(lambda n: arrays(np.float64, (3, n), elements=finite)),
       magnitude, st.floats(-5, 5), st.floats(0.05, 5), st.sampled_from(["f32", "f64"]))
def test_property_on_S1_and_idempotent_over_magnitudes(base, e, s1, s2, dt):
    """For tokens of size 10^e, e in [-30, 30]: finite output with mean sigma_1 and
    standard deviation sigma_2, and projecting twice changes nothing."""
    dtype = torch.float32 if dt == "f32" else F64
    assume(_rel_spread(base) > (1e-3 if dt == "f32" else 1e-9))
    v = torch.from_numpy(base * 10.0**e).to(dtype)
    assume(torch.isfinite(v).all())
    assume(not constant_tokens(v).any())
    u = project_s1(v, s1, s2)
    assert torch.isfinite(u).all()
    tol = 1e-4 if dt == "f32" else 1e-10
    ud = u.double()
    assert torch.allclose(ud.mean(-1), torch.full((3,), s1, dtype=F64), atol=tol * (abs(s1) + s2))
    assert torch.allclose(ud.std(-1, unbiased=False), torch.full((3,), s2, dtype=F64), rtol=tol)
    assert torch.allclose(project_s1(u, s1, s2).double(), ud, atol=tol * (abs(s1) + s2))


@given(st.integers(2, 10).flatmap(lambda n: arrays(np.float64, (2, n), elements=finite)), magnitude)
def test_property_scale_invariance_and_finite_gradient(base, e):
    """P(c v) = P(v) for c > 0, and the gradient of any loss is finite."""
    v = torch.from_numpy(base)
    scaled = (v * 10.0**e).requires_grad_(True)
    out = project_s1(scaled, 0.2, 1.3)
    assert torch.isfinite(out).all()
    if not constant_tokens(v).any() and _rel_spread(base) > 1e-9:
        assert torch.allclose(out, project_s1(v, 0.2, 1.3), atol=1e-9)
    (g,) = torch.autograd.grad((out * torch.arange(v.shape[-1], dtype=F64)).sum(), scaled)
    assert torch.isfinite(g).all()


# -- derivatives -------------------------------------------------------------------------------
@pytest.mark.parametrize("rule", ["midpoint", "trapezoid"])
@pytest.mark.parametrize("eps", [0.0, 1e-2])
def test_gradcheck_and_gradgradcheck(rule, eps):
    g = Grid(x=Interval(n=3, length=1.0), y=Interval(n=6, length=2.0, rule=rule))
    gen = torch.Generator().manual_seed(4)
    v = torch.randn(2, 3, 6, dtype=F64, generator=gen, requires_grad=True)
    s1 = torch.tensor(0.3, dtype=F64, requires_grad=True)
    s2 = torch.tensor(1.7, dtype=F64, requires_grad=True)

    def f(v, s1, s2):
        return project_s1(v, s1, s2, g, eps)

    assert gradcheck(f, (v, s1, s2))
    assert gradgradcheck(f, (v, s1, s2))


@pytest.mark.parametrize("scale", [1e-150, 1e150])
def test_gradient_at_extreme_magnitudes_is_the_scaled_gradient(scale):
    """d/dx P(c x) = P'(x) (P is 0-homogeneous), so the autograd gradient through a token of
    size 1e+-150 equals the gradcheck-verified one at size 1."""
    x = torch.randn(3, 7, dtype=F64, generator=torch.Generator().manual_seed(5), requires_grad=True)
    w = torch.randn(3, 7, dtype=F64, generator=torch.Generator().manual_seed(6))
    (g1,) = torch.autograd.grad((project_s1(x, 0.0, 1.0) * w).sum(), x)
    (gc,) = torch.autograd.grad((project_s1(x * scale, 0.0, 1.0) * w).sum(), x)
    assert torch.allclose(gc, g1, rtol=1e-10, atol=1e-12)


def test_gradient_on_constant_tokens_is_finite_and_second_order_too():
    v = torch.randn(3, 5, dtype=F64)
    v[1] = 0.1
    v.requires_grad_(True)
    out = project_s1(v, 0.3, 2.0)
    (g,) = torch.autograd.grad((out * torch.arange(5.0, dtype=F64)).sum(), v, create_graph=True)
    assert torch.isfinite(g).all() and g[1].abs().max() == 0
    (h,) = torch.autograd.grad((g * g).sum(), v)
    assert torch.isfinite(h).all()


# -- moments, tangent projection, projection method at extreme magnitudes ---------------------
@pytest.mark.parametrize("scale", [1e-170, 1.0, 1e170])
def test_token_stats_tangent_and_projected_solver_are_scale_free(scale):
    x = torch.randn(2, 3, 6, dtype=F64, generator=torch.Generator().manual_seed(7))
    mean, std, const = token_mean_std(x * scale)
    assert not const.any()
    ref_std = x.std(-1, unbiased=False, keepdim=True) * scale
    assert torch.allclose(std, ref_std, rtol=1e-12)
    assert torch.allclose(mean, x.mean(-1, keepdim=True) * scale, rtol=1e-12, atol=1e-14 * scale)
    v = torch.randn(2, 3, 6, dtype=F64, generator=torch.Generator().manual_seed(8))
    # P_T(u) v is 0-homogeneous in u
    assert torch.allclose(tangent_s1(x * scale, v), tangent_s1(x, v), atol=1e-13)


class _Linear(torch.nn.Module):
    has_field, has_resolvent, has_flow = True, False, False
    default_solver = "explicit"

    def __init__(self, A):
        super().__init__()
        self.A = A

    def check(self, grid):
        pass

    def field(self, t, u, grid):
        return u @ self.A


@pytest.mark.parametrize("scale", [1e-170, 1e170])
def test_projected_solver_keeps_mean_and_std_at_extreme_magnitudes(scale):
    A = torch.randn(6, 6, dtype=F64, generator=torch.Generator().manual_seed(9)) * 0.1
    u = torch.randn(2, 3, 6, dtype=F64, generator=torch.Generator().manual_seed(10)) * scale
    g = Grid.paper(3, 6)
    out = ProjectedS1(ExplicitEuler()).step((_Linear(A),), 0.0, 0.1, u, g)
    m0, s0, _ = token_mean_std(u)
    m1, s1, _ = token_mean_std(out)
    assert torch.isfinite(out).all()
    assert torch.allclose(s1, s0, rtol=1e-12) and torch.allclose(m1, m0, rtol=1e-10, atol=1e-13 * scale)


# -- argument validation -------------------------------------------------------------------------
def test_sigma2_must_be_positive_in_the_function():
    v = torch.randn(4, 5)
    with pytest.raises(ValueError, match=r"sigma2: expected a finite number > 0, got -1"):
        project_s1(v, 0, -1)  # main returned the farthest point of S1
    with pytest.raises(ValueError, match="sigma2: expected a finite number > 0"):
        project_s1(v, 0, 0.0)
    with pytest.raises(ValueError, match="sigma2: expected sigma_2 > 0"):
        project_s1(v, 0, torch.tensor(-2.0))
    with pytest.raises(ValueError, match="sigma1: expected a finite number"):
        project_s1(v, float("nan"), 1.0)
    with pytest.raises(ValueError, match="eps: expected a finite number >= 0"):
        project_s1(v, 0.0, 1.0, eps=float("nan"))


def test_per_feature_sigma_is_refused():
    """A per-feature sigma_2 of shape (5,) was accepted and the output was not on S1."""
    with pytest.raises(ValueError, match=r"ProjectionS1.sigma2: expected a scalar control.*\(5,\)"):
        ProjectionS1(0.0, torch.full((5,), 2.0))
    with pytest.raises(ValueError, match=r"ProjectionS1.sigma1: expected a scalar control"):
        ProjectionS1(PiecewiseConstant(torch.zeros(3, 5)), 1.0)
    with pytest.raises(ValueError, match=r"sigma2: expected a scalar.*\(5,\)"):
        project_s1(torch.randn(2, 5), 0.0, torch.full((5,), 2.0))
    # one value per token is a scalar per token: allowed
    out = project_s1(torch.randn(3, 5, dtype=F64), 0.0, torch.tensor([[1.0], [2.0], [3.0]], dtype=F64))
    assert torch.allclose(out.std(-1, unbiased=False), torch.tensor([1.0, 2.0, 3.0], dtype=F64))


def test_sigma_nan_and_non_positive_controls_are_refused():
    with pytest.raises(ValueError, match="ProjectionS1.sigma1: expected a finite number"):
        ProjectionS1(float("nan"))
    with pytest.raises(ValueError, match="ProjectionS1.sigma2: expected a finite number > 0"):
        ProjectionS1(0.0, float("inf"))
    # a sigma_2 control stored as plain values that became <= 0 is caught once per solve
    c = PiecewiseConstant(torch.ones(2))
    op = ProjectionS1(0.0, c)
    with torch.no_grad():
        c.raw[1] = -1.0
    with pytest.raises(ValueError, match="ProjectionS1.sigma2: expected sigma_2 > 0, got min -1"):
        op(torch.randn(1, 2, 4))


def test_grid_argument_must_be_a_grid():
    u = torch.randn(1, 2, 5)
    with pytest.raises(TypeError, match=r"grid: expected an opsplit Grid or None.*str"):
        ProjectionS1()(u, grid="paper")  # main: AttributeError
    with pytest.raises(TypeError, match="grid: expected an opsplit Grid"):
        project_s1(u, grid="paper")
    with pytest.raises(ValueError, match="v: grid/tensor mismatch: the grid has N_y = 4"):
        project_s1(u, grid=Grid.paper(2, 4))
