"""Convergence analysis, the continuous-time reference, and the resolution studies:
a model trained at N_t = 6 solved at N_t = 12, 24, 48, and one continuous model solved at
several N_y and N_x.

Independent references: synthetic power laws for the fit, scipy's ``linregress``,
matrix exponentials for the smooth reference, and membership in S1 for the constrained one.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from opsplit import Grid, Propagator
from opsplit.analysis import (
    fit_order,
    plot_convergence,
    relative_error,
    resample,
    self_convergence,
    smooth_transformer,
    spatial_convergence,
    temporal_convergence,
)
from opsplit.controls import PiecewiseConstant
from opsplit.operators import FFNIntegral, ProjectionS1, ProjectionS2, SoftmaxAttention
from opsplit.reference import solve_reference
from opsplit.schemes import Lie, Relaxation

D = torch.float64


# tiny tensors: one thread keeps OpenMP start-up from dominating every op
pytestmark = pytest.mark.usefixtures("one_thread")


# -- the fit --------------------------------------------------------------------------------
def test_fit_order_recovers_power_laws_and_matches_linregress():
    from scipy import stats

    h = np.array([0.1, 0.05, 0.025, 0.0125])
    fit = fit_order(h, 3.0 * h**2)
    assert fit.order == pytest.approx(2.0, abs=1e-12) and fit.stderr < 1e-10
    assert math.exp(fit.intercept) == pytest.approx(3.0)
    rng = np.random.default_rng(0)
    e = 0.7 * h**1.5 * np.exp(0.05 * rng.standard_normal(h.size))
    fit = fit_order(h, e, confidence=0.9)
    lr = stats.linregress(np.log(h), np.log(e))
    assert fit.order == pytest.approx(lr.slope) and fit.stderr == pytest.approx(lr.stderr)
    q = stats.t.ppf(0.95, h.size - 2)
    assert fit.ci_low == pytest.approx(lr.slope - q * lr.stderr)
    assert fit.ci_high == pytest.approx(lr.slope + q * lr.stderr)
    two = fit_order([0.1, 0.05], [1e-2, 2.5e-3])
    assert two.order == pytest.approx(2.0) and math.isnan(two.stderr)


def test_fit_order_bad_input():
    with pytest.raises(ValueError, match="errors must be finite and > 0"):
        fit_order([0.1, 0.05], [1e-2, 0.0])
    with pytest.raises(ValueError, match="at least two"):
        fit_order([0.1], [1e-2])
    with pytest.raises(ValueError, match="distinct step sizes"):
        fit_order([0.1, 0.1], [1e-2, 2e-2])
    with pytest.raises(ValueError, match="step sizes must be finite"):
        fit_order([0.1, -0.05], [1e-2, 2e-2])


def test_relative_error_uses_both_quadratures():
    g = Grid.uniform(3, 4, rule="trapezoid", lx=2.0)
    u, r = torch.randn(2, 3, 4, dtype=D), torch.randn(2, 3, 4, dtype=D)
    wx = np.array([0.5, 1.0, 0.5]) * 1.0
    wy = np.array([0.5, 1.0, 1.0, 0.5]) / 3
    w = wx[:, None] * wy[None, :]
    num = ((u - r).numpy() ** 2 * w).sum()
    den = (r.numpy() ** 2 * w).sum()
    assert relative_error(u, r, g) == pytest.approx(math.sqrt(num / den))
    assert relative_error(u, r) == pytest.approx(float((u - r).norm() / r.norm()))


def test_resample_is_exact_for_cubics():
    src, dst = Grid.uniform(6, 9), Grid.uniform(4, 5)
    f = lambda x, y: 1 + x - 2 * x**3 + y**2 * x - 3 * y**3  # noqa: E731
    xs, ys = src.x.nodes(D), src.y.nodes(D)
    xd, yd = dst.x.nodes(D), dst.y.nodes(D)
    u = f(xs[:, None], ys[None, :])[None]
    torch.testing.assert_close(
        resample(u, src, dst)[0], f(xd[:, None], yd[None, :]), rtol=1e-12, atol=1e-12
    )


# -- the reference --------------------------------------------------------------------------
def test_smooth_reference_matches_matrix_exponential():
    g = Grid.paper(3, 4)
    W = torch.randn(4, 4, dtype=D) / 3
    f = torch.randn(2, 3, 4, dtype=D)
    out = solve_reference([FFNIntegral(W)], f, t1=1.3, grid=g)
    torch.testing.assert_close(out, f @ torch.linalg.matrix_exp(1.3 * W), rtol=1e-9, atol=1e-9)
    traj = solve_reference([FFNIntegral(W)], f, t1=1.3, grid=g, times=[0.0, 0.65, 1.3])
    torch.testing.assert_close(traj[1], f @ torch.linalg.matrix_exp(0.65 * W), rtol=1e-9, atol=1e-9)
    torch.testing.assert_close(traj[0], f)


def test_reference_with_piecewise_constant_controls_is_piecewise_exponential():
    g = Grid.paper(2, 3)
    vals = torch.randn(3, 3, 3, dtype=D) / 3
    op = FFNIntegral(PiecewiseConstant(vals, t1=3.0, axes=("y", "y")))
    f = torch.randn(2, 2, 3, dtype=D)
    E = torch.linalg.matrix_exp
    want = f @ E(vals[0]) @ E(vals[1]) @ E(vals[2])
    torch.testing.assert_close(solve_reference([op], f, t1=3.0, grid=g), want, rtol=1e-9, atol=1e-9)


def test_constrained_reference_stays_on_moving_s1():
    p = smooth_transformer(n_x=3, n_y=5, constraint=True, moving=True, seed=2)
    ts = [0.0, 0.4, 1.0]
    traj = solve_reference([*p.smooth_terms, p.norm], p.f, t1=1.0, grid=p.grid, times=ts)
    for u, t in zip(traj, ts):
        m = u.mean(-1)
        s1 = float(p.norm.sigma1(t).detach())
        s2 = float(p.norm.sigma2(t).detach())
        torch.testing.assert_close(m, torch.full_like(m, s1), rtol=0, atol=1e-12)
        torch.testing.assert_close(
            ((u - m[..., None]) ** 2).mean(-1).sqrt(), torch.full_like(m, s2)
        )


def test_reference_bad_input():
    W = torch.eye(3, dtype=D)
    f = torch.randn(1, 2, 3, dtype=D)
    with pytest.raises(ValueError, match="differential inclusion"):
        solve_reference([FFNIntegral(W), ProjectionS2()], f)
    with pytest.raises(ValueError, match="not a term of eq. 7"):
        solve_reference([Relaxation([FFNIntegral(W)])], f)
    with pytest.raises(ValueError, match="eps=0"):
        solve_reference([FFNIntegral(W), ProjectionS1(eps=1e-5)], f)
    with pytest.raises(ValueError, match="zero variance"):
        solve_reference([FFNIntegral(W), ProjectionS1()], torch.ones(1, 2, 3, dtype=D))
    with pytest.raises(ValueError, match="t0 < t1"):
        solve_reference([FFNIntegral(W)], f, t0=1.0, t1=1.0)


# -- trained at N_t = 6, solved at 12, 24, 48 ------------------------------------------------
def test_model_trained_at_6_steps_converges_at_finer_steps(tmp_path):
    # controls piecewise-linear in time with nodes at t^n = n/6 (the N_t = 6 grid)
    p = smooth_transformer(
        n_x=4, n_y=4, J=1, time="piecewise_linear", n_time=7, constraint=True, moving=True, seed=3
    )
    train = p.propagator(6, "lie", "euler")
    torch.manual_seed(0)
    target = torch.randn_like(p.f)
    opt = torch.optim.Adam(train.parameters(), lr=1e-2)
    losses = []
    for _ in range(10):
        opt.zero_grad()
        loss = (train(p.f) - target).square().mean()
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    assert losses[-1] < losses[0]
    with torch.no_grad():
        ref = p.reference()
        ns = [6, 12, 24, 48]
        lie, strang = (
            temporal_convergence(lambda n, s=scheme, v=solver: p.propagator(6, s, v)(p.f, n_steps=n), ns, ref,
                                 label=label, expected=order)
            for scheme, solver, label, order in [("lie", "euler", "Lie, projected Euler", 1),
                                                 ("strang", "heun", "Strang, projected Heun", 2)]
        )
    assert lie.fit.within(1, 0.15), str(lie)
    assert (strang.errors[1:] < strang.errors[:-1]).all()
    # pre-asymptotic at N_t = 6; from 12 on within the tolerance
    assert fit_order(strang.h[1:], strang.errors[1:]).within(2, 0.2), str(strang)
    assert 3.6 < strang.errors[-2] / strang.errors[-1] < 4.6
    fig = plot_convergence([lie, strang], tmp_path / "nt.png", title="trained at N_t = 6")
    assert (tmp_path / "nt.png").stat().st_size > 0 and len(fig.axes[0].lines) == 4
    d = lie.to_dict()
    assert d["n"] == ns and len(d["errors"]) == 4 and d["expected"] == 1


# -- the same continuous model at several grids -----------------------------------------------
@pytest.mark.parametrize("axis", ["y", "x"])
def test_spatial_convergence_at_quadrature_order(axis):
    def solve(n):
        kw = dict(n_x=4, n_y=n) if axis == "y" else dict(n_x=n, n_y=4)
        p = smooth_transformer(**kw, space="polynomial", J=1, T=0.5, seed=4)
        return p.reference(rtol=1e-11, atol=1e-13), p.grid

    st = spatial_convergence(solve, [8, 16, 32], solve(128), axis=axis, expected=2)
    assert st.fit.within(2, 0.15), str(st)
    assert st.variable == "d" + axis


def test_self_convergence_with_relu_reports_an_order():
    p = smooth_transformer(n_x=3, n_y=4, J=1, relu=True, seed=5)
    st = self_convergence(lambda n: p.propagator(n, "lie", "euler")(p.f), [8, 16, 32, 64])
    assert np.isfinite(st.order) and st.meta["self_convergence"]
    with pytest.raises(ValueError, match="differential inclusion"):
        p.reference()


def test_convergence_study_plot_returns_axes():
    st = temporal_convergence(
        lambda n: torch.full((1, 1, 1), 1.0 + 1.0 / n, dtype=D),
        [2, 4, 8],
        torch.ones(1, 1, 1, dtype=D),
        label="1/n",
        expected=1,
    )
    assert st.fit.within(1, 1e-9)
    ax = st.plot()
    assert ax.get_xscale() == "log" and ax.get_yscale() == "log"
    assert "1/n" in str(st)


def test_plots_are_pyplot_figures_that_show_and_save(tmp_path):
    """Issue 8, finding 9: ``study.plot()`` drew on a figure pyplot did not know, so
    ``plt.show()``/``plt.savefig`` and a notebook saw nothing; ``str`` of an unlabelled
    study began with a stray colon."""
    import matplotlib.pyplot as plt

    st = temporal_convergence(
        lambda n: torch.full((1, 1, 1), 1.0 + 1.0 / n, dtype=D),
        [2, 4, 8],
        torch.ones(1, 1, 1, dtype=D),
    )
    assert str(st).startswith("order 1.00")
    plt.close("all")
    ax = st.plot(path=tmp_path / "one.png")
    assert plt.get_fignums() == [ax.figure.number]
    assert (tmp_path / "one.png").stat().st_size > 0
    plt.savefig(tmp_path / "current.png")  # pyplot's current figure is the study's
    assert (tmp_path / "current.png").stat().st_size > 0
    fig = plot_convergence([st])
    assert fig.number in plt.get_fignums()
    plt.close("all")


def test_propagator_reference_defaults():
    g = Grid.uniform(3, 4)
    att = SoftmaxAttention(*(torch.randn(4, 4, dtype=D) for _ in range(3)))
    prop = Propagator(Lie([att]), 4, t0=0.5, t1=1.5, grid=g)
    f = torch.randn(2, 3, 4, dtype=D)
    a = solve_reference(prop, f)
    b = solve_reference([att], f, t0=0.5, t1=1.5, grid=g)
    torch.testing.assert_close(a, b)
