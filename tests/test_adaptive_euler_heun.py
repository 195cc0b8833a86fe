"""The embedded Euler-Heun pair (opsplit.adaptive.EulerHeunPair) and steps across control
pieces (PIController(stop_at_breakpoints=False)), on linear terms whose flow is known in
closed form (u_t = u (W1 + W2), u(T) = u(0) exp(T (W1 + W2)))."""

from __future__ import annotations

import pytest
import torch

from opsplit import Propagator
from opsplit.adaptive import EulerHeunPair, PIController
from opsplit.controls import PiecewiseConstant
from opsplit.operators import FFNIntegral
from opsplit.schemes import Lie, Parallel
from opsplit.solvers import ExplicitEuler, Heun, Substep

E = torch.linalg.matrix_exp


def _ws(seed=0, n=3):
    g = torch.Generator().manual_seed(seed)
    return [0.6 * torch.randn(n, n, generator=g, dtype=torch.float64) for _ in range(2)]


def _parallel(W1, W2, solver=ExplicitEuler):
    return Parallel([Substep(FFNIntegral(W1), solver()), Substep(FFNIntegral(W2), solver())], batch=False)


def test_the_estimate_is_heun_minus_euler_and_asymptotically_exact():
    W1, W2 = _ws()
    W = W1 + W2
    scheme = _parallel(W1, W2)
    pair = EulerHeunPair(scheme)
    u = torch.randn(2, 4, 3, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    prop = Propagator(scheme, 1, t1=1.0)
    grid = prop.resolve_grid(u)
    ratios = []
    for h in (0.1, 0.01, 0.001):
        w, err = pair.attempt(0.0, h, u, grid, record=False)
        euler = u + h * (u @ W)
        heun = u + 0.5 * h * (u @ W + euler @ W)
        assert torch.allclose(w, euler, rtol=0, atol=1e-14)
        assert torch.allclose(err, heun - euler, rtol=1e-9, atol=1e-15)
        exact = u @ E(h * W)
        ratios.append(float(err.norm() / (euler - exact).norm()))
    # Heun - Euler estimates Euler's local error (h^2/2) u W^2 up to O(h^3): its norm over the
    # true local error's tends to 1
    assert abs(ratios[-1] - 1.0) < 2e-3 and abs(ratios[-1] - 1) < abs(ratios[0] - 1)


def test_an_accepted_step_costs_one_scheme_step():
    W1, W2 = _ws(2)
    scheme = _parallel(W1, W2)
    prop = Propagator(scheme, 4, t1=2.0)
    f = torch.randn(1, 4, 3, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    sol = prop.solve(f, rtol=1e-4, atol=1e-6, estimator="euler-heun")
    doubling = prop.solve(f, rtol=1e-4, atol=1e-6)
    s = sol.stats
    # K = 2 substep calls per scheme step; the steps: the first step, then one per attempt
    assert s.n_substep_calls == 2 * (s.n_steps + 1), s
    # vs three scheme steps per attempt for step doubling
    assert doubling.stats.n_substep_calls == 2 * 3 * doubling.stats.n_steps
    # the tolerance is met: the global error stays within a few times rtol
    exact = f @ E(2.0 * (W1 + W2))
    assert float((sol.u - exact).abs().max() / exact.abs().max()) < 2e-2
    # the same solve without the reuse (every attempt evaluates its own Euler step) gives the same grid
    ref = EulerHeunPair(scheme)
    ref.attempt = _without_reuse(ref)
    again = prop.solve(f, rtol=1e-4, atol=1e-6, estimator=ref)
    assert again.stats.n_accepted == s.n_accepted
    assert torch.allclose(again.u, sol.u, rtol=1e-10, atol=1e-12)


def _without_reuse(pair):
    def attempt(t, t_next, u, grid, record):
        pair._last = pair._next = None
        return EulerHeunPair.attempt(pair, t, t_next, u, grid, record)

    return attempt


def test_steps_cross_control_pieces_only_when_allowed():
    """Eight pieces, nearly equal: stopping at the breakpoints takes at least eight steps;
    allowed across them, a loose tolerance takes fewer, and the estimate (left limit of the
    controls at the step's end) sees the pieces' difference."""
    W1, W2 = _ws(4)
    g = torch.Generator().manual_seed(5)
    P1 = PiecewiseConstant(W1 * 0.05 + 0.004 * torch.randn(8, 3, 3, generator=g, dtype=torch.float64), t0=0.0,
                           t1=8.0)
    P2 = PiecewiseConstant(W2 * 0.05 + 0.004 * torch.randn(8, 3, 3, generator=g, dtype=torch.float64), t0=0.0,
                           t1=8.0)
    prop = Propagator(_parallel(P1, P2), 8, t1=8.0)
    f = torch.randn(1, 4, 3, generator=torch.Generator().manual_seed(6), dtype=torch.float64)
    loose = dict(rtol=0.3, atol=1e-3, first_step=1.5)
    with torch.no_grad():  # inference: the field reused (the pieces are parameters)
        stops = prop.solve(f, controller=PIController(**loose), estimator="euler-heun")
        cross = prop.solve(f, controller=PIController(**loose, stop_at_breakpoints=False), estimator="euler-heun")
    graded = prop.solve(f, controller=PIController(**loose, stop_at_breakpoints=False), estimator="euler-heun")
    # autograd records: every attempt is its own Euler step (two scheme steps an attempt, still below doubling's 3)
    assert graded.stats.n_substep_calls == 2 * 2 * graded.stats.n_steps
    assert graded.u.requires_grad and torch.allclose(graded.u.detach(), cross.u, rtol=1e-10, atol=1e-12)
    assert stops.stats.n_accepted >= 8
    assert cross.stats.n_accepted < 8
    assert any(abs(t - round(t)) > 1e-9 for t in cross.stats.times)  # steps that end inside a piece
    assert cross.stats.n_substep_calls < prop.solve(f).stats.n_substep_calls  # fewer calls than the grid's 16
    # the pieces differ: a tight tolerance makes the crossing solve step within the pieces again
    with torch.no_grad():
        tight = prop.solve(f, controller=PIController(rtol=1e-5, atol=1e-8, first_step=1.0, stop_at_breakpoints=False),
                           estimator="euler-heun")
    assert tight.stats.n_accepted > 8
    grid8 = prop.solve(f, n_steps=512).u  # the fine grid: the continuous model
    assert float((tight.u - grid8).abs().max()) < float((cross.u - grid8).abs().max())


@pytest.mark.parametrize("scheme", ["lie", "heun", "multi"])
def test_the_pair_refuses_a_step_that_is_not_euler_on_a_sum(scheme):
    W1, W2 = _ws()
    if scheme == "lie":
        s, match = Lie([Substep(FFNIntegral(W1), ExplicitEuler()), Substep(FFNIntegral(W2), ExplicitEuler())]), \
            "Lie of 2 substeps"
    elif scheme == "heun":
        s, match = _parallel(W1, W2, Heun), r"solved by \['Heun'\]"
    else:
        s, match = Lie([Substep((FFNIntegral(W1), FFNIntegral(W2)), Heun())]), r"solved by \['Heun'\]"
    with pytest.raises(ValueError, match=r"^estimator: the Euler-Heun pair needs .*" + match):
        EulerHeunPair(s)
    with pytest.raises(ValueError, match="^estimator: the Euler-Heun pair"):
        Propagator(s, 2).solve(torch.zeros(1, 2, 3, dtype=torch.float64), rtol=1e-3, estimator="euler-heun")


def test_stop_at_breakpoints_is_a_bool():
    with pytest.raises(TypeError, match="^stop_at_breakpoints: expected True or False"):
        PIController(stop_at_breakpoints=1)
