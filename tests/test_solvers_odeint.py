"""Substep solvers: torchdiffeq ODE solves, Heun, RK4, exact-midpoint, catch-up, and the
projection method on S1.

Independent references: scipy's ``solve_ivp`` on the flattened linear system with the
time-dependent kernel evaluated by numpy's Legendre module; matrix exponentials; the
tangent projection computed by a least-squares solve in the weighted inner product.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from numpy.polynomial import legendre as npleg
from scipy.integrate import solve_ivp

from opsplit import Grid, Propagator
from opsplit.analysis import temporal_convergence
from opsplit.controls import Constant, PiecewiseConstant, TimeBasis
from opsplit.operators import FFNIntegral, ProjectionS1, ProjectionS2, SoftmaxAttention
from opsplit.schemes import Lie
from opsplit.solvers import (
    RK4,
    CatchUp,
    Exact,
    ExactMidpoint,
    ExplicitEuler,
    Heun,
    ODESolve,
    ProjectedS1,
    Substep,
    tangent_s1,
)

D = torch.float64


# tiny tensors: one thread keeps OpenMP start-up from dominating every op
pytestmark = pytest.mark.usefixtures("one_thread")


# -- a linear non-autonomous substep with an independent reference ------------------------------
@pytest.fixture(scope="module")
def linear():
    g = Grid.uniform(2, 3)
    gen = torch.Generator().manual_seed(0)
    C = torch.randn(3, 3, 3, generator=gen, dtype=D)
    b = torch.randn(3, 2, generator=gen, dtype=D)
    ffn = FFNIntegral(TimeBasis(C, t1=1.0, axes=("y", "y")), TimeBasis(b, t1=1.0, axes=("x",)))
    u0 = torch.randn(2, 2, 3, generator=gen, dtype=D)
    Cn, bn, dy = C.numpy(), b.numpy(), g.y.spacing

    def rhs(t, y):
        phi = npleg.legvander(np.array(2 * t - 1), 2)[0]
        W, bb = np.tensordot(phi, Cn, 1), np.tensordot(phi, bn, 1)
        return (dy * y.reshape(2, 2, 3) @ W + bb[:, None]).ravel()

    sol = solve_ivp(rhs, (0.0, 1.0), u0.numpy().ravel(), rtol=1e-13, atol=1e-14, method="DOP853")
    ref = torch.tensor(sol.y[:, -1].reshape(2, 2, 3))
    return g, ffn, u0, ref


@pytest.mark.parametrize(
    "solver, expected",
    [
        (Heun(), 2),
        (RK4(), 4),
        (ExactMidpoint(), 2),
        (Exact(), 1),
        (ODESolve("midpoint"), 2),
        (ODESolve("heun3"), 3),
        (ODESolve("rk4"), 4),
        (ODESolve("explicit_adams"), 4),
    ],
    ids=[
        "heun",
        "rk4",
        "exact_midpoint",
        "exact_frozen",
        "tdq_midpoint",
        "tdq_heun3",
        "tdq_rk4",
        "tdq_adams",
    ],
)
def test_solver_orders_with_time_dependent_controls(linear, solver, expected):
    g, ffn, u0, ref = linear
    prop = Propagator(Lie([Substep(ffn, solver)]), 4, t1=1.0, grid=g)
    ns = [8, 16, 32] if expected < 4 else [4, 8, 16]
    st = temporal_convergence(lambda n: prop(u0, n_steps=n), ns, ref)
    assert st.fit.within(expected, 0.15), str(st)
    if expected != 1:
        assert solver.order == expected


def test_odeint_adaptive_substep_is_tolerance_accurate(linear):
    g, ffn, u0, ref = linear
    solver = ODESolve("dopri5", rtol=1e-11, atol=1e-12)
    assert solver.order == 99 and solver.adaptive
    out = Propagator(Lie([Substep(ffn, solver)]), 3, t1=1.0, grid=g)(u0)
    torch.testing.assert_close(out, ref, rtol=1e-8, atol=1e-8)
    loose = Propagator(
        Lie([Substep(ffn, ODESolve("dopri5", rtol=1e-3, atol=1e-4))]), 3, t1=1.0, grid=g
    )(u0)
    assert (loose - ref).abs().max() > (out - ref).abs().max()


def test_odeint_options_are_passed_through(linear):
    g, ffn, u0, ref = linear
    coarse = Propagator(Lie([Substep(ffn, ODESolve("euler"))]), 2, t1=1.0, grid=g)(u0)
    fine = Propagator(
        Lie([Substep(ffn, ODESolve("euler", options={"step_size": 0.05}))]), 2, t1=1.0, grid=g
    )(u0)
    assert (fine - ref).abs().max() < 0.2 * (coarse - ref).abs().max()


def test_odeint_matches_matrix_exponential_and_sums_terms():
    g = Grid.paper(3, 4)
    gen = torch.Generator().manual_seed(1)
    W1, W2 = (torch.randn(4, 4, generator=gen, dtype=D) / 2 for _ in range(2))
    f1, f2 = FFNIntegral(W1), FFNIntegral(W2)
    u = torch.randn(2, 3, 4, generator=gen, dtype=D)
    out = Substep((f1, f2), ODESolve("dopri8", rtol=1e-12, atol=1e-13))(0.0, 0.7, u, g)
    torch.testing.assert_close(
        out, u @ torch.linalg.matrix_exp(0.7 * (W1 + W2)), rtol=1e-10, atol=1e-10
    )


def test_odeint_adjoint_gradients_match_direct(linear):
    g, ffn, u0, _ = linear
    grads = []
    for adjoint in (False, True):
        ffn.zero_grad()
        x = u0.clone().requires_grad_(True)
        solver = ODESolve("dopri5", rtol=1e-10, atol=1e-11, adjoint=adjoint)
        out = Substep(ffn, solver)(0.1, 0.5, x, g)
        out.square().sum().backward()
        grads.append(
            (x.grad.clone(), ffn.W.coefficients.grad.clone(), ffn.b.coefficients.grad.clone())
        )
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)


def test_odeint_bad_arguments():
    with pytest.raises(ValueError, match="ODESolve.method"):
        ODESolve("rk45")
    with pytest.raises(ValueError, match="ODESolve.rtol"):
        ODESolve(rtol=0.0)
    with pytest.raises(TypeError, match="ODESolve.options"):
        ODESolve(options=[1])
    with pytest.raises(ValueError, match="explicit field"):
        Substep(ProjectionS2(), ODESolve())
    with pytest.raises(ValueError, match="explicit field"):
        Substep(ProjectionS2(), Heun())


# -- piecewise-constant controls: the end stage reads the left limit ------------------------------
@pytest.mark.parametrize(
    "solver",
    [Heun(), RK4(), ODESolve("rk4"), ODESolve("dopri5", rtol=1e-12, atol=1e-13)],
    ids=["heun", "rk4", "tdq_rk4", "tdq_dopri5"],
)
def test_stages_stay_inside_the_piece(solver):
    # a substep over piece k of a piecewise-constant kernel equals the same substep with
    # that piece as a constant control (the end stage must not read piece k + 1)
    g = Grid.uniform(2, 3)
    vals = torch.randn(3, 3, 3, dtype=D, generator=torch.Generator().manual_seed(2))
    pc = FFNIntegral(PiecewiseConstant(vals, t1=3.0, axes=("y", "y")))
    u = torch.randn(2, 2, 3, dtype=D)
    for k in range(3):
        const = FFNIntegral(Constant(vals[k]))
        a = Substep(pc, solver)(float(k), 1.0, u, g)
        b = Substep(const, solver)(float(k), 1.0, u, g)
        torch.testing.assert_close(a, b, rtol=1e-13, atol=1e-13)


# -- the S1 manifold ----------------------------------------------------------------------------
def _weighted_tangent_lstsq(u, v, w):
    """Remove from v its weighted-L2 projection onto span{1, u - mean(u)}, per token, by a
    least-squares solve (independent of the closed form)."""
    out = torch.empty_like(v)
    sw = w.sqrt()
    for idx in np.ndindex(*u.shape[:-1]):
        uu, vv = u[idx], v[idx]
        m = (uu * w).sum() / w.sum()
        B = torch.stack([torch.ones_like(uu), uu - m], 1)
        coef = torch.linalg.lstsq(sw[:, None] * B, sw * vv).solution
        out[idx] = vv - B @ coef
    return out


@pytest.mark.parametrize("rule", ["midpoint", "trapezoid"])
def test_tangent_projection_matches_least_squares(rule):
    g = Grid.uniform(3, 6, rule=rule)
    u = torch.randn(2, 3, 6, dtype=D)
    v = torch.randn(2, 3, 6, dtype=D)
    P = tangent_s1(u, v, g)
    torch.testing.assert_close(
        P, _weighted_tangent_lstsq(u, v, g.y.weights(D)), rtol=1e-10, atol=1e-12
    )
    torch.testing.assert_close(tangent_s1(u, P, g), P, rtol=1e-10, atol=1e-12)  # idempotent


def test_projected_substep_keeps_the_manifold_through_the_start_and_its_order():
    g = Grid.uniform(3, 5)
    gen = torch.Generator().manual_seed(3)
    att = SoftmaxAttention(
        *(
            TimeBasis(torch.randn(2, 5, 5, generator=gen, dtype=D), t1=1.0, axes=("y", "y"))
            for _ in range(3)
        )
    )
    u = torch.randn(2, 3, 5, generator=gen, dtype=D)
    for base in (ExplicitEuler(), Heun(), RK4(), ODESolve("rk4")):
        out = Substep(att, ProjectedS1(base))(0.0, 0.3, u, g)
        torch.testing.assert_close(out.mean(-1), u.mean(-1), rtol=0, atol=1e-13)
        torch.testing.assert_close(out.var(-1), u.var(-1), rtol=1e-12, atol=0)
        assert ProjectedS1(base).order == base.order
    # order on the manifold against the constrained reference (sigma constant)
    from opsplit.reference import solve_reference

    norm = ProjectionS1(0.0, 1.0)
    f = ProjectionS1(0.0, 1.0)(u, grid=g)
    ref = solve_reference([att, norm], f, t1=1.0, grid=g)
    for base, p in ((ExplicitEuler(), 1), (Heun(), 2), (RK4(), 4)):
        prop = Propagator(Lie([Substep(att, ProjectedS1(base))]), 4, t1=1.0, grid=g)
        st = temporal_convergence(lambda n, prop=prop: prop(f, n_steps=n), [8, 16, 32], ref)
        assert st.fit.within(p, 0.15), f"{base}: {st}"


def test_projected_rejects_terms_without_field_and_non_field_base():
    with pytest.raises(ValueError, match="explicit field"):
        Substep(ProjectionS2(), ProjectedS1(Heun()))
    with pytest.raises(ValueError, match="solver of explicit fields"):
        ProjectedS1(Exact())


def test_catch_up_projects_onto_the_set_at_the_end():
    g = Grid.uniform(2, 6)
    s1 = TimeBasis(torch.tensor([0.1, 0.4], dtype=D), t1=1.0)
    s2 = TimeBasis(torch.tensor([0.0, 0.5], dtype=D), t1=1.0, positive=True)
    norm = ProjectionS1(s1, s2)
    u = torch.randn(2, 2, 6, dtype=D)
    out = Substep(norm, CatchUp())(0.2, 0.3, u, g)
    m = out.mean(-1)
    torch.testing.assert_close(m, torch.full_like(m, float(s1(0.5).detach())))
    torch.testing.assert_close(
        ((out - m[..., None]) ** 2).mean(-1).sqrt(), torch.full_like(m, float(s2(0.5).detach()))
    )
    # the sweeping flow from a point on S1(sigma(a)) is the affine map of the module docstring
    on = ProjectionS1(s1, s2).resolvent(0.2, 0.0, u, g)
    want = s2(0.5) / s2(0.2) * (on - s1(0.2)) + s1(0.5)
    torch.testing.assert_close(Substep(norm, CatchUp())(0.2, 0.3, on, g), want)
    with pytest.raises(ValueError, match="indicator terms"):
        Substep(FFNIntegral(torch.eye(6, dtype=D)), CatchUp())


# -- dtypes, gradcheck ----------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize(
    "solver",
    [
        Heun(),
        RK4(),
        ODESolve("rk4"),
        ODESolve("dopri5", rtol=1e-5, atol=1e-6),
        ProjectedS1(Heun()),
        ExactMidpoint(),
    ],
    ids=["heun", "rk4", "tdq_rk4", "tdq_dopri5", "projected", "exact_midpoint"],
)
def test_solvers_dtypes_and_gradcheck(dtype, solver):
    g = Grid.uniform(2, 3)
    gen = torch.Generator().manual_seed(4)
    W = TimeBasis(torch.randn(2, 3, 3, generator=gen, dtype=D).to(dtype), t1=1.0, axes=("y", "y"))
    op = FFNIntegral(W, torch.randn(2, generator=gen, dtype=D).to(dtype))
    u = torch.randn(1, 2, 3, generator=gen, dtype=D).to(dtype).requires_grad_(True)
    sub = Substep(op, solver)
    out = sub(0.0, 0.4, u, g)
    assert out.dtype == dtype and torch.isfinite(out).all()
    out.sum().backward()
    assert u.grad is not None and W.coefficients.grad is not None
    if dtype == torch.float64 and not (isinstance(solver, ODESolve) and solver.adaptive):
        assert torch.autograd.gradcheck(
            lambda x: sub(0.0, 0.4, x, g), (u.detach().requires_grad_(True),)
        )


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_odeint_substep_cuda():
    g = Grid.uniform(2, 3)
    op = FFNIntegral(torch.randn(3, 3, dtype=D))
    u = torch.randn(2, 2, 3, dtype=D)
    cpu = Substep(op, ODESolve("dopri5", rtol=1e-10, atol=1e-12))(0.0, 0.5, u, g)
    gpu = Substep(op.to("cuda"), ODESolve("dopri5", rtol=1e-10, atol=1e-12))(0.0, 0.5, u.cuda(), g)
    torch.testing.assert_close(gpu.cpu(), cpu, rtol=1e-8, atol=1e-8)
