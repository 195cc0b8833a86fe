"""Controls continuous in time (piecewise-linear, smooth bases) and in space (polynomial
series, values on a reference grid resampled with the target grid's quadrature).

Independent references: ``numpy.interp``, numpy's Legendre/Chebyshev modules, and exact
integrals of polynomial kernels.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from numpy.polynomial import chebyshev as npcheb
from numpy.polynomial import legendre as npleg

from opsplit import Grid, Interval, Propagator
from opsplit.controls import (
    Constant,
    LeftLimit,
    OnReferenceGrid,
    PiecewiseConstant,
    PiecewiseLinear,
    PolynomialSeries,
    TimeBasis,
)
from opsplit.operators import FFNIntegral, SoftmaxAttention
from opsplit.schemes import Lie, Strang
from opsplit.solvers import Heun, Substep

D = torch.float64


# tiny tensors: one thread keeps OpenMP start-up from dominating every op
pytestmark = pytest.mark.usefixtures("one_thread")


# -- time ---------------------------------------------------------------------------------------
def test_piecewise_linear_matches_numpy_interp():
    vals = torch.randn(5, 2, 3, dtype=D)
    c = PiecewiseLinear(vals, t0=1.0, t1=3.0)
    nodes = np.linspace(1.0, 3.0, 5)
    for t in [1.0, 1.2, 1.5, 2.0, 2.77, 3.0, LeftLimit(2.5)]:
        want = np.stack(
            [np.interp(t, nodes, vals[:, i, j].numpy()) for i in range(2) for j in range(3)]
        )
        torch.testing.assert_close(c(t).reshape(-1), torch.tensor(want), rtol=1e-14, atol=1e-14)
    assert c.breakpoints() == pytest.approx(list(nodes))
    with pytest.raises(ValueError, match="outside its time interval"):
        c(3.1)
    with pytest.raises(ValueError, match="t0 < t1"):
        PiecewiseLinear(vals, t0=1.0, t1=1.0)


def test_piecewise_linear_positive_is_geometric_and_trainable():
    c = PiecewiseLinear(torch.tensor([1.0, 4.0], dtype=D), t1=1.0, positive=True)
    torch.testing.assert_close(c(0.5), torch.tensor(2.0, dtype=D))
    with pytest.raises(ValueError, match="values > 0"):
        PiecewiseLinear(torch.tensor([1.0, -1.0]), positive=True)
    x = torch.tensor([0.3, -0.7, 1.1], dtype=D, requires_grad=True)

    def f(v):
        c = PiecewiseLinear(torch.zeros(3, dtype=D), t1=2.0)
        from torch.func import functional_call

        return functional_call(c, {"raw": v}, (1.3,))

    assert torch.autograd.gradcheck(f, (x,))


@pytest.mark.parametrize("basis", ["legendre", "chebyshev", "cosine"])
def test_time_basis_matches_numpy(basis):
    c = torch.randn(4, 3, dtype=D)
    tb = TimeBasis(c, t0=0.5, t1=2.5, basis=basis)
    for t in [0.5, 0.9, 1.5, 2.5]:
        if basis == "cosine":
            s = (t - 0.5) / 2.0
            want = sum(c[p].numpy() * np.cos(p * np.pi * s) for p in range(4))
        else:
            s = 2 * (t - 0.5) / 2.0 - 1
            mod = npleg if basis == "legendre" else npcheb
            want = mod.legval(s, c.numpy()) if basis == "legendre" else mod.chebval(s, c.numpy())
        torch.testing.assert_close(tb(t), torch.tensor(want), rtol=1e-13, atol=1e-13)
    with pytest.raises(ValueError, match="outside its time interval"):
        tb(0.4)
    with pytest.raises(ValueError, match="TimeBasis.basis"):
        TimeBasis(c, basis="fourier")


def test_time_and_space_series_gradcheck():
    from torch.func import functional_call

    tb = TimeBasis(torch.zeros(3, 2, 2, dtype=D), t1=1.0)
    c = torch.randn(3, 2, 2, dtype=D, requires_grad=True)
    assert torch.autograd.gradcheck(
        lambda v: functional_call(tb, {"coefficients": v}, (0.37,)), (c,)
    )
    ps = PolynomialSeries(TimeBasis(torch.zeros(2, 3, 2, dtype=D), t1=1.0), axes=("y", "y"))
    g = Grid.uniform(2, 5)
    c2 = torch.randn(2, 3, 2, dtype=D, requires_grad=True)
    fn = lambda v: functional_call(ps, {"coefficients.coefficients": v}, (0.6, g))  # noqa: E731
    assert torch.autograd.gradcheck(fn, (c2,))


def test_time_basis_positive():
    tb = TimeBasis(torch.tensor([0.0, 2.0], dtype=D), t1=1.0, positive=True)
    torch.testing.assert_close(tb(0.0), torch.tensor(np.exp(-2.0), dtype=D))
    torch.testing.assert_close(tb(1.0), torch.tensor(np.exp(2.0), dtype=D))


def test_left_limit_on_piecewise_constant():
    pc = PiecewiseConstant(torch.arange(3.0, dtype=D)[:, None], t1=3.0)
    assert [pc.piece(t) for t in (0.0, 1.0, 2.5, 3.0)] == [0, 1, 2, 2]
    assert [pc.piece(LeftLimit(t)) for t in (0.0, 1.0, 2.0, 2.5, 3.0)] == [0, 0, 1, 2, 2]
    # round-off around a breakpoint
    assert pc.piece(LeftLimit(1.0 + 1e-15)) == 0 and pc.piece(1.0 - 1e-15) == 1
    assert isinstance(LeftLimit(1.0) + 1.0, float) and not isinstance(
        LeftLimit(1.0) + 1.0, LeftLimit
    )


def test_model_built_at_nt_evaluated_at_multiples_uses_the_right_pieces():
    # Lie with Euler at N_t = 2 N: each piece's controls are used on both its half steps
    g = Grid.paper(3, 4)
    vals = torch.randn(3, 4, 4, dtype=D) / 4
    op = FFNIntegral(PiecewiseConstant(vals, t1=3.0, axes=("y", "y")))
    u = torch.randn(2, 3, 4, dtype=D)
    out = Propagator(Lie([op]), 3, grid=g)(u, n_steps=6)
    want = u
    for k in range(3):
        M = torch.eye(4, dtype=D) + 0.5 * vals[k]
        want = want @ M @ M
    torch.testing.assert_close(out, want)
    # and Strang with Heun substeps (stages at 1/4, 1/2 ends read the left limit)
    out = Propagator(Strang([Substep(op, Heun())]), 3, grid=g)(u, n_steps=6)
    want = u
    for k in range(3):
        A = 0.5 * vals[k]
        M = torch.eye(4, dtype=D) + A + 0.5 * A @ A
        want = want @ M @ M
    torch.testing.assert_close(out, want)


# -- space ------------------------------------------------------------------------------------
def test_polynomial_series_matches_numpy_at_grid_nodes():
    C = torch.randn(3, 4, dtype=D)
    ps = PolynomialSeries(Constant(C), axes=("y", "y"))
    g = Grid.uniform(2, 5, ly=2.0)
    s = (g.y.nodes(D).numpy() / 2.0) * 2 - 1
    want = npleg.leggrid2d(s, s, C.numpy())
    torch.testing.assert_close(ps(0.0, g), torch.tensor(want), rtol=1e-13, atol=1e-13)
    b = PolynomialSeries(Constant(torch.randn(3, dtype=D)), axes=("x",), basis="chebyshev")
    assert b(0.0, Grid.uniform(7, 2)).shape == (7,)


def test_reference_grid_identity_and_linear_resampling_of_function_values():
    ref = Interval(n=6, length=2.0)
    W = torch.randn(6, 6, dtype=D)
    c = OnReferenceGrid(W, (ref, ref))
    torch.testing.assert_close(c(0.0, Grid(Interval(n=3, length=1.0), ref)), W)  # same grid: exact
    tgt = Interval(n=11, length=2.0, rule="trapezoid")
    xs, xt = ref.nodes(D).numpy(), tgt.nodes(D).numpy()

    def interp1(v):  # linear interpolation with linear extrapolation beyond the end nodes
        out = np.interp(xt, xs, v)
        lo, hi = xt < xs[0], xt > xs[-1]
        out[lo] = v[0] + (xt[lo] - xs[0]) * (v[1] - v[0]) / (xs[1] - xs[0])
        out[hi] = v[-1] + (xt[hi] - xs[-1]) * (v[-1] - v[-2]) / (xs[-1] - xs[-2])
        return out

    rows = np.stack([interp1(W[:, j].numpy()) for j in range(6)], 1)
    want = np.stack([interp1(rows[i]) for i in range(11)], 0)
    got = c(0.0, Grid(Interval(n=2, length=1.0), tgt))
    torch.testing.assert_close(got, torch.tensor(want), rtol=1e-12, atol=1e-12)


def test_reference_grid_kernel_integral_uses_target_quadrature():
    # W(yt, y) = 1 + 2 yt + 3 y + yt y is bilinear: linear resampling is exact, so the
    # discrete integral int_0^1 W(xi, y) u(xi) dxi, u(xi) = xi, converges at the target
    # midpoint rule's order 2 to the exact 1/2 + 2/3 + (3/2 + 1/3) y
    ref = Interval(n=4, length=1.0)
    yr = ref.nodes(D)
    W = 1 + 2 * yr[:, None] + 3 * yr[None, :] + yr[:, None] * yr[None, :]
    ffn = FFNIntegral(OnReferenceGrid(W, (ref, ref)))
    errs = []
    for n in (8, 16, 32, 64):
        g = Grid.uniform(1, n)
        y = g.y.nodes(D)
        out = ffn.field(0.0, y[None, None, :], g)[0, 0]
        exact = 0.5 + 2.0 / 3.0 + (1.5 + 1.0 / 3.0) * y
        errs.append(float((out - exact).abs().max()))
    rates = np.log2(np.array(errs[:-1]) / np.array(errs[1:]))
    assert np.all(np.abs(rates - 2) < 0.1), rates


def test_reference_grid_time_dependent_values_and_gradcheck():
    ref = Interval(n=3, length=1.0)
    vals = torch.randn(2, 3, 3, dtype=D)
    c = OnReferenceGrid(PiecewiseLinear(vals, t1=1.0), (ref, ref))
    g = Grid.uniform(2, 5)
    P = ref.interpolation_matrix(g.y, dtype=D)
    torch.testing.assert_close(c(0.25, g), P @ (0.75 * vals[0] + 0.25 * vals[1]) @ P.T)
    x = vals.clone().requires_grad_(True)
    from torch.func import functional_call

    assert torch.autograd.gradcheck(lambda v: functional_call(c, {"values.raw": v}, (0.3, g)), (x,))


def test_reference_grid_bad_input():
    ref = Interval(n=4, length=1.0)
    with pytest.raises(ValueError, match="trailing shape"):
        OnReferenceGrid(torch.randn(4, 5), (ref, ref))
    with pytest.raises(ValueError, match="one reference interval per axis"):
        OnReferenceGrid(torch.randn(4, 4), (ref,), axes=("y", "y"))
    with pytest.raises(ValueError, match="complete opsplit Interval"):
        OnReferenceGrid(torch.randn(4, 4), (ref, Interval(length=1.0)))
    c = OnReferenceGrid(torch.randn(4, 4, dtype=D), (ref, ref))
    att = SoftmaxAttention(c, c, c)
    prop = Propagator(Lie([att]), 2, t1=1.0, grid=Grid.paper(None, 6))  # L = N = 6, not 1
    with pytest.raises(ValueError, match=r"grid/control mismatch on Omega_y.*\[0, 1\].*\[0, 6\]"):
        prop(torch.randn(1, 3, 6, dtype=D))


def test_same_continuous_model_on_several_grids():
    # kernels as functions (reference grid, polynomial series): the model runs at any N_y
    gen = torch.Generator().manual_seed(0)
    ref = Interval(n=5, length=1.0)
    mk = lambda: OnReferenceGrid(torch.randn(5, 5, generator=gen, dtype=D), (ref, ref))  # noqa: E731
    att = SoftmaxAttention(mk(), mk(), mk())
    ffn = FFNIntegral(
        PolynomialSeries(TimeBasis(torch.randn(2, 3, 3, generator=gen, dtype=D), t1=1.0))
    )
    prop = Propagator(
        Strang([Substep(att, Heun()), Substep(ffn, Heun())]),
        4,
        t1=1.0,
        grid=Grid(Interval(length=1.0), Interval(length=1.0)),
    )
    for ny in (5, 8, 13):
        y = (torch.arange(ny, dtype=D) + 0.5) / ny
        f = torch.sin(3 * y)[None, None, :] * torch.ones(2, 4, 1, dtype=D)
        out = prop(f)
        assert out.shape == (2, 4, ny) and torch.isfinite(out).all()


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_continuous_controls_cuda():
    ref = Interval(n=4, length=1.0)
    c = OnReferenceGrid(PiecewiseLinear(torch.randn(2, 4, 4, dtype=D), t1=1.0), (ref, ref))
    g = Grid.uniform(2, 7)
    cpu = c(0.4, g)
    torch.testing.assert_close(c.to("cuda")(0.4, g).cpu(), cpu)
    tb = TimeBasis(torch.randn(3, 2, dtype=D), t1=1.0)
    torch.testing.assert_close(tb.to("cuda")(0.3).cpu(), tb.to("cpu")(0.3))
