"""Adaptive time steps (opsplit.adaptive) and solve statistics (Propagator.solve).

Independent references: the unsplit model by torchdiffeq at tight tolerance, the
accepted grid replayed here by hand with ``scheme.step`` (not through the adaptive code),
the samples solved one by one, finite differences (gradcheck), and substep counts derived
from each scheme's definition.
"""

from __future__ import annotations

import pytest
import torch

from opsplit import AdaptivePropagator, Grid, Propagator
from opsplit.adaptive import AdaptiveStepError, EmbeddedPair, PIController, StepDoubling
from opsplit.analysis import relative_error, smooth_transformer
from opsplit.control import set_gradient_mode
from opsplit.controls import LayerwiseConstant, PiecewiseConstant, TimeBasis
from opsplit.operators import FFNIntegral, SoftmaxAttention
from opsplit.reference import solve_reference
from opsplit.schemes import BlanesMoan, Hybrid, Lie, Parallel, Strang, TripleJump
from opsplit.solvers import RK4, ODESolve, Substep

D = torch.float64
pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def smooth():
    p = smooth_transformer(n_x=4, n_y=4, J=2, seed=0)
    ref = solve_reference(p.smooth_terms, p.f, t1=p.T, grid=p.grid, rtol=1e-13, atol=1e-15)
    return p, ref


def _prop(p, scheme):
    return Propagator(scheme, 4, t1=p.T, grid=p.grid)


# -- the tolerance is met; against the cheapest fixed step -------------------------------------
@pytest.mark.parametrize("rtol", [1e-3, 1e-4, 1e-5, 1e-6, 1e-7, 1e-8])
def test_adaptive_solve_meets_its_tolerance(smooth, rtol):
    p, ref = smooth
    prop = _prop(p, BlanesMoan(p.substeps("rk4")))
    with torch.no_grad():
        sol = prop.solve(p.f, rtol=rtol, atol=1e-3 * rtol)
    err = relative_error(sol.u, ref)
    assert err <= 10 * rtol, (err, str(sol.stats))
    assert sol.stats.success and sol.stats.times[0] == 0.0 and sol.stats.times[-1] == p.T
    # every step ends where the next begins, and the counts add up: 3 BM steps per attempt
    assert sol.stats.n_substep_calls == 3 * 25 * sol.stats.n_steps


@pytest.mark.parametrize("rtol", [1e-7, 1e-8])
def test_adaptive_uses_fewer_substep_calls_than_the_cheapest_fixed_step(smooth, rtol):
    # Blanes-Moan with step doubling and local extrapolation, against fixed-step Blanes-Moan
    # (the cheapest fixed-step scheme at these errors: Lie, Strang, parallel, hybrid and the
    # triple jump need more calls, benchmarks/work_precision.py).  The fixed-step errors
    # decrease with N_t, so it is enough that the largest N_t costing fewer calls than the
    # adaptive solve misses the adaptive solve's error.
    p, ref = smooth
    prop = _prop(p, BlanesMoan(p.substeps("rk4")))
    with torch.no_grad():
        sol = prop.solve(p.f, rtol=rtol, atol=1e-3 * rtol, estimator="extrapolate")
        err = relative_error(sol.u, ref)
        assert err <= 10 * rtol
        n = (sol.stats.n_substep_calls - 1) // 25  # 25 substep calls per Blanes-Moan step
        fixed = [relative_error(prop(p.f, n_steps=m), ref) for m in (n - 1, n)]
    assert fixed[1] < fixed[0] and fixed[1] > err, (n, fixed, err, str(sol.stats))


def test_at_loose_tolerance_extrapolated_strang_is_cheaper_than_the_cheapest_fixed_step(smooth):
    # rtol = 1e-3: Blanes-Moan with step doubling cannot beat fixed Blanes-Moan (three steps
    # per attempt, and at steps of 1/4-1/2 of the interval the extrapolation gains only 2-3x,
    # docs/work_precision.md); Strang/RK4 with local extrapolation (order 4 from three Strang
    # steps, 15 calls per attempt) does.  The fixed-step errors decrease with N_t: it is
    # enough that the largest N_t costing fewer calls misses the adaptive error, for
    # Blanes-Moan (25 calls per step) and for fixed Strang/RK4 (5 calls per step).
    p, ref = smooth
    subs = p.substeps("rk4")
    prop = _prop(p, Strang(subs))
    with torch.no_grad():
        sol = prop.solve(p.f, rtol=1e-3, atol=1e-6, estimator="extrapolate")
        err = relative_error(sol.u, ref)
        assert err <= 1e-2 and sol.stats.n_substep_calls == 15 * sol.stats.n_steps
        calls = sol.stats.n_substep_calls
        bm = relative_error(_prop(p, BlanesMoan(subs))(p.f, n_steps=(calls - 1) // 25), ref)
        strang = relative_error(prop(p.f, n_steps=(calls - 1) // 5), ref)
    assert bm > err and strang > err, (err, bm, strang, str(sol.stats))


@pytest.fixture(scope="module")
def work_precision_problem():
    """The smooth problem of docs/work_precision.md (benchmarks/work_precision.py): controls on
    [0, 2], solved on [0.5, 1.5]; the reference by torchdiffeq at rtol 1e-13."""
    p = smooth_transformer(n_x=4, n_y=4, J=2, seed=0, T=2.0)
    ref = solve_reference(p.smooth_terms, p.f, t0=0.5, t1=1.5, grid=p.grid, rtol=1e-13, atol=1e-15)
    return p, ref


@pytest.mark.parametrize(
    "adaptive, rtol",
    [("strang", 1e-3)] + [("blanes_moan", r) for r in (1e-4, 1e-5, 1e-6, 1e-7, 1e-8)],
)
def test_the_work_precision_table_rows_claimed_met(work_precision_problem, adaptive, rtol):
    # docs/work_precision.md, "Against the cheapest fixed-step run reaching the same error": the
    # adaptive solve with local extrapolation (Strang/RK4 at rtol 1e-3, Blanes-Moan/RK4 below)
    # reaches an error that no fixed-step run of any scheme reaches with fewer substep calls.
    # Each scheme's fixed-step error decreases with N_t, so it is enough that the largest N_t
    # costing fewer calls than the adaptive solve misses the adaptive error (its calls per step
    # from its own statistics).
    p, ref = work_precision_problem
    subs = p.substeps("rk4")
    make = {"strang": Strang, "blanes_moan": BlanesMoan}[adaptive]
    with torch.no_grad():
        sol = Propagator(make(subs), 1, t0=0.5, t1=1.5, grid=p.grid).solve(
            p.f, rtol=rtol, atol=1e-3 * rtol, estimator="extrapolate"
        )
        err, calls = relative_error(sol.u, ref), sol.stats.n_substep_calls
        assert err <= 10 * rtol
        fixed = {
            "lie": Lie(subs),
            "strang": Strang(subs),
            "parallel": Parallel(subs),
            "hybrid": Hybrid([[subs[0]], subs[1:]]),
            "triple_jump": TripleJump(subs),
            "blanes_moan": BlanesMoan(subs),
        }
        for name, scheme in fixed.items():
            prop = Propagator(scheme, 1, t0=0.5, t1=1.5, grid=p.grid)
            per_step = prop.solve(p.f, n_steps=1).stats.n_substep_calls
            n = (calls - 1) // per_step
            errs = [relative_error(prop(p.f, n_steps=m), ref) for m in (max(1, n - 1), n)]
            assert errs[1] <= errs[0] and errs[1] > err, (name, n, errs, err, str(sol.stats))


# -- per sample --------------------------------------------------------------------------------
def test_per_sample_steps_equal_solving_each_sample_alone():
    p = smooth_transformer(n_x=3, n_y=4, J=1, seed=2, batch=3)
    f = p.f * torch.tensor([0.3, 1.0, 2.5], dtype=D)[:, None, None]
    prop = _prop(p, Strang(p.substeps("rk4")))
    kw = dict(rtol=1e-3, atol=1e-6, t_eval=[0.0, 0.5, 1.0])
    sol = prop.solve(f, per_sample=True, **kw)
    steps = []
    for i in range(3):
        alone = prop.solve(f[i : i + 1], **kw)
        torch.testing.assert_close(sol.u[i : i + 1], alone.u, rtol=0, atol=0)
        torch.testing.assert_close(sol.ys[i : i + 1], alone.ys, rtol=0, atol=0)
        assert sol.stats.per_sample[i].times == alone.stats.times
        steps.append(alone.stats.n_accepted)
    assert sol.stats.n_accepted == sum(steps) and sol.stats.times is None
    assert len(set(steps)) > 1  # the samples took different steps
    batch = prop.solve(f, **kw)  # one step sequence for the batch: not each sample's own
    assert batch.stats.times not in [s.times for s in sol.stats.per_sample]
    assert not torch.equal(batch.u, sol.u)


# -- output times, breakpoints -------------------------------------------------------------------
def test_outputs_at_requested_times(smooth):
    p, _ = smooth
    ts = [0.0, 0.3, 0.75, 1.0]
    ref = solve_reference(
        p.smooth_terms, p.f, t1=p.T, grid=p.grid, times=ts, rtol=1e-10, atol=1e-12
    )
    sol = _prop(p, BlanesMoan(p.substeps("rk4"))).solve(p.f, rtol=1e-6, atol=1e-9, t_eval=ts)
    assert sol.ts == ts and sol.ys.shape == (2, 4, 4, 4)
    assert set(ts) <= set(sol.stats.times)  # steps end exactly there
    torch.testing.assert_close(sol.ys[:, 0], p.f, rtol=0, atol=0)
    for j in range(1, 4):
        assert relative_error(sol.ys[:, j], ref[j]) < 1e-5
    torch.testing.assert_close(sol.ys[:, -1], sol.u, rtol=0, atol=0)
    unbatched = _prop(p, BlanesMoan(p.substeps("rk4"))).solve(
        p.f[0], rtol=1e-6, atol=1e-9, t_eval=ts
    )
    assert unbatched.u.shape == (4, 4) and unbatched.ys.shape == (4, 4, 4)


@pytest.mark.parametrize("table", [PiecewiseConstant, LayerwiseConstant])
def test_steps_end_at_the_breakpoints_of_piecewise_controls(table):
    # LayerwiseConstant: PiecewiseConstant's function with one parameter per piece (a decoder's layers)
    g = torch.Generator().manual_seed(4)
    W = table(torch.randn(3, 4, 4, generator=g, dtype=D) / 2, t1=1.5, axes=("y", "y"))
    V = TimeBasis(torch.randn(2, 4, 4, generator=g, dtype=D) / 2, t1=1.5, axes=("y", "y"))
    prop = Propagator(
        Strang([Substep(FFNIntegral(W), RK4()), Substep(FFNIntegral(V), RK4())]), 3, t1=1.5
    )
    f = torch.randn(2, 3, 4, dtype=D)
    sol = prop.solve(f, rtol=1e-6, atol=1e-9)
    assert {0.5, 1.0} <= set(sol.stats.times)
    ref = solve_reference(prop, f, rtol=1e-12, atol=1e-14)
    assert relative_error(sol.u, ref) < 1e-5


def test_a_decoders_adaptive_steps_end_at_its_layers():
    """DecoderLM's controls are one piece per layer (LayerwiseConstant on [0, L]): every
    sample's accepted steps end at t = 1, ..., L - 1, and the solve converges to the fine
    fixed-step solve of the same continuous model."""
    from opsplit.models import DecoderConfig, DecoderLM

    cfg = DecoderConfig(vocab_size=11, d_model=8, n_layers=3, n_heads=2, d_ff=16, norm="layer", mlp="plain",
                        activation="gelu", positions="learned", max_positions=8, qkv_bias=True, norm_bias=True)
    m = DecoderLM(cfg, generator=torch.Generator().manual_seed(0), dtype=D)
    with torch.no_grad():
        for q in m.parameters():  # O(1) weights: the field is not negligible
            q.mul_(20.0 if q.dim() > 1 else 1.0)
        u = m.embed(torch.randint(0, 11, (2, 6), generator=torch.Generator().manual_seed(1)))
        sol = m.decoder.solve(u, rtol=1e-4, atol=1e-4, per_sample=True)
        # explicit-Euler substeps (first order): Richardson's extrapolation of 3 * 512 and 3 * 1024
        # fixed steps (7.5e-6 from that of 3 * 1024 and 3 * 2048)
        coarse, fine = (m.decoder.solve(u, n_steps=3 * 2**k).u for k in (9, 10))
        ref = 2 * fine - coarse
    for st in sol.stats.per_sample:
        assert {1.0, 2.0} <= set(st.times) and st.times[-1] == 3.0
        assert st.n_accepted > 100  # the tolerance asks for more than one step per layer
    # a first-order method accumulates its local errors: 8.3e-3 (fixed 3 * 1024 steps: 1.4e-3)
    assert relative_error(sol.u, ref) < 2e-2


# -- statistics of fixed-step solves -------------------------------------------------------------
@pytest.mark.parametrize(
    "kind, per_step",
    [
        ("lie", [1, 1, 1]),
        ("strang", [2, 2, 1]),
        ("parallel", [1, 1, 1]),
        ("hybrid", [1, 1, 1]),
        ("triple_jump", [4, 6, 3]),
        ("blanes_moan", [7, 12, 6]),
    ],
)
def test_fixed_step_statistics(kind, per_step):
    # K = 3 substeps (attention, FFN_1, FFN_2); calls per step from each scheme's definition
    # (Strang: outer terms twice, the last once; the triple jump: three Strang steps with
    # the ends merged; Blanes-Moan S6 as 12 Lie/adjoint sweeps, ends merged)
    # controls on [0, 2], solved on [0.5, 1.5]: the triple jump reads them 0.35 dt outside a step
    p = smooth_transformer(n_x=3, n_y=4, J=2, seed=1, T=2.0)
    subs = p.substeps("heun")
    scheme = {
        "lie": lambda: Lie(subs),
        "strang": lambda: Strang(subs),
        "parallel": lambda: Parallel(subs),
        "hybrid": lambda: Hybrid([[subs[0]], subs[1:]]),
        "triple_jump": lambda: TripleJump(subs),
        "blanes_moan": lambda: BlanesMoan(subs),
    }[kind]()
    prop = Propagator(scheme, 4, t0=0.5, t1=1.5, grid=p.grid)
    sol = prop.solve(p.f, n_steps=5)
    assert sol.stats.n_accepted == 5 and sol.stats.n_rejected == 0
    assert sol.stats.times == prop.times(5)
    assert list(sol.stats.substep_calls.values()) == [5 * c for c in per_step]
    assert list(sol.stats.substep_calls) == ["0:SoftmaxAttention", "1:FFNIntegral", "2:FFNIntegral"]
    torch.testing.assert_close(sol.u, prop(p.f, n_steps=5), rtol=0, atol=0)  # forward unchanged
    sol = prop.solve(p.f, n_steps=4, t_eval=[0.5, 1.0])
    _, traj = prop(p.f, n_steps=4, return_trajectory=True)
    torch.testing.assert_close(sol.ys, traj[:, [0, 2]], rtol=0, atol=0)
    with pytest.raises(
        ValueError, match=r"t_eval: 0.6 is not a time of the fixed grid of N_t = 4 steps"
    ):
        prop.solve(p.f, n_steps=4, t_eval=[0.6])


# -- gradients ------------------------------------------------------------------------------------
def _small(seed=5):
    g = torch.Generator().manual_seed(seed)

    def Wt():
        return TimeBasis(0.5 * torch.randn(2, 3, 3, generator=g, dtype=D), t1=1.0, axes=("y", "y"))

    att = SoftmaxAttention(Wt(), Wt(), Wt())
    return Propagator(
        Strang([Substep(att, RK4()), Substep(FFNIntegral(Wt()), RK4())]),
        2,
        t1=1.0,
        grid=Grid.uniform(2, 3),
    ), att


def _replay_by_hand(scheme, times, f, grid):
    """Two half steps per accepted step (step doubling's propagated value)."""
    u = f
    for a, b in zip(times[:-1], times[1:]):
        mid = a + 0.5 * (b - a)
        u = scheme.step(mid, b - mid, scheme.step(a, mid - a, u, grid), grid)
    return u


def test_gradient_is_the_gradient_on_the_accepted_grid():
    prop, att = _small()
    f = torch.randn(2, 2, 3, dtype=D, requires_grad=True)
    sol = prop.solve(f, rtol=1e-5, atol=1e-8)
    times = sol.stats.times
    g = prop.resolve_grid(f)
    by_hand = _replay_by_hand(prop.scheme, times, f, g)
    torch.testing.assert_close(sol.u, by_hand, rtol=0, atol=0)
    w = torch.randn_like(by_hand)
    ga = torch.autograd.grad((sol.u * w).sum(), (f, att.WV.coefficients))
    gb = torch.autograd.grad((by_hand * w).sum(), (f, att.WV.coefficients))
    for a, b in zip(ga, gb):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


def test_gradcheck_through_an_adaptive_solve():
    from torch.func import functional_call

    prop, att = _small()
    prop = Propagator(BlanesMoan(list(prop.scheme.substeps)), 1, t1=1.0, grid=prop.grid)
    f = torch.randn(1, 2, 3, dtype=D, requires_grad=True)
    # tight tolerance: the step sizes depend on f (not differentiated), but only at the
    # level of the tolerance, far below gradcheck's
    kw = dict(rtol=1e-9, atol=1e-12)
    assert prop.solve(f, **kw).stats.n_accepted > 3
    # the whole Jacobian (6 x 6) against central finite differences
    assert torch.autograd.gradcheck(lambda x: prop.solve(x, **kw).u, (f,))
    # a parameter: the attention query kernel's time coefficients, along a random direction
    key = next(k for k, q in prop.named_parameters() if q is att.WQ.coefficients)
    w0 = att.WQ.coefficients.detach()
    d = torch.randn_like(w0)
    adaptive = AdaptivePropagator.from_propagator(prop, **kw)
    s = torch.zeros(1, dtype=D, requires_grad=True)
    assert torch.autograd.gradcheck(
        lambda s: functional_call(adaptive, {key: w0 + s * d}, (f.detach(),)), (s,)
    )


@pytest.mark.parametrize("estimator", ["doubling", "extrapolate"])
def test_checkpointed_gradient_mode_gives_the_backprop_gradient(estimator):
    prop, att = _small()
    f = torch.randn(2, 2, 3, dtype=D, requires_grad=True)
    grads = {}
    for mode, kw in (
        ("backprop", {}),
        ("checkpoint", {"snapshots": None}),
        ("revolve", {"snapshots": 2}),
    ):
        set_gradient_mode(prop, "backprop" if mode == "backprop" else "checkpoint", **kw)
        sol = prop.solve(f, rtol=1e-4, atol=1e-7, estimator=estimator, t_eval=[0.5, 1.0])
        loss = sol.u.square().sum() + sol.ys[:, 0].sum()
        grads[mode] = (sol.u.detach(), torch.autograd.grad(loss, (f, att.WK.coefficients)))
    set_gradient_mode(prop, "backprop")
    for mode in ("checkpoint", "revolve"):
        torch.testing.assert_close(grads[mode][0], grads["backprop"][0], rtol=0, atol=0)
        for a, b in zip(grads[mode][1], grads["backprop"][1]):
            torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


def test_adjoint_and_backprop_gradients_agree_as_the_tolerance_shrinks():
    g = torch.Generator().manual_seed(6)

    def Wt():
        return TimeBasis(0.6 * torch.randn(2, 3, 3, generator=g, dtype=D), t1=1.0, axes=("y", "y"))

    att, ffn = SoftmaxAttention(Wt(), Wt(), Wt()), FFNIntegral(Wt())
    # ODESolve substeps: the adjoint mode solves their continuous adjoint (odeint_adjoint)
    scheme = Strang([Substep(att, ODESolve("rk4")), Substep(ffn, ODESolve("rk4"))])
    prop = AdaptivePropagator(scheme, t1=1.0, grid=Grid.uniform(2, 3))
    f = torch.randn(2, 2, 3, dtype=D)
    diffs = []
    for rtol in (1e-2, 1e-4, 1e-6):
        prop.controller = PIController(rtol=rtol, atol=1e-3 * rtol)
        out = {}
        for mode in ("backprop", "adjoint"):
            set_gradient_mode(prop, mode, snapshots=None)
            loss = prop(f).square().sum()
            out[mode] = torch.autograd.grad(loss, (att.WV.coefficients, ffn.W.coefficients))
        set_gradient_mode(prop, "backprop")
        diffs.append(
            max(float((a - b).norm() / b.norm()) for a, b in zip(out["adjoint"], out["backprop"]))
        )
    assert diffs[0] > diffs[1] > diffs[2] and diffs[2] < 1e-6, diffs


# -- estimators, the module, float32, CUDA -------------------------------------------------------
def test_embedded_pair(smooth):
    p, ref = smooth
    subs = p.substeps("rk4")
    prop = _prop(p, BlanesMoan(subs))
    sol = prop.solve(p.f, rtol=1e-3, atol=1e-6, estimator=Strang(subs))
    # the estimate is Strang's error (order 2): pessimistic for the propagated order-4 value
    assert relative_error(sol.u, ref) <= 1e-4
    # 25 + 5 calls per attempt (the companion computes no half steps)
    assert sol.stats.n_substep_calls == 30 * sol.stats.n_steps
    with pytest.raises(ValueError, match="same effective order 4"):
        EmbeddedPair(BlanesMoan(subs), TripleJump(subs))
    other = smooth_transformer(n_x=4, n_y=4, J=2, seed=9).substeps("rk4")
    with pytest.raises(ValueError, match="companion's operators"):
        EmbeddedPair(BlanesMoan(subs), Strang(other))
    with pytest.raises(ValueError, match="must be built on the propagator's own scheme"):
        prop.solve(p.f, rtol=1e-3, estimator=StepDoubling(Strang(subs)))


def test_adaptive_propagator_module(smooth):
    p, _ = smooth
    base = _prop(p, Strang(p.substeps("rk4")))
    ad = AdaptivePropagator.from_propagator(base, rtol=1e-3, atol=1e-6)
    assert ad.scheme is base.scheme and ad.last_stats is None
    u = ad(p.f)
    torch.testing.assert_close(u, base.solve(p.f, rtol=1e-3, atol=1e-6).u, rtol=0, atol=0)
    assert ad.last_stats.n_accepted > 1
    torch.testing.assert_close(ad(p.f, n_steps=3), base(p.f, n_steps=3), rtol=0, atol=0)
    assert "rtol=0.001" in repr(ad)
    assert sum(1 for _ in ad.parameters()) == sum(1 for _ in base.parameters())


def test_float32():
    p = smooth_transformer(n_x=3, n_y=4, J=1, seed=3, dtype=torch.float32)
    prop = _prop(p, Strang(p.substeps("rk4")))
    f = p.f.clone().requires_grad_(True)
    sol = prop.solve(f, rtol=1e-4, atol=1e-6)
    assert sol.u.dtype == torch.float32 and torch.isfinite(sol.u).all()
    sol.u.sum().backward()
    assert torch.isfinite(f.grad).all()
    ref = p.reference(rtol=1e-6, atol=1e-8)
    assert relative_error(sol.u, ref) < 1e-3


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_matches_cpu():
    prop, _ = _small()
    f = torch.randn(2, 2, 3, dtype=D)
    cpu = prop.solve(f, rtol=1e-6, atol=1e-9)
    gpu = prop.to("cuda").solve(f.cuda(), rtol=1e-6, atol=1e-9)
    assert gpu.stats.times == pytest.approx(cpu.stats.times, rel=1e-9)
    torch.testing.assert_close(gpu.u.cpu(), cpu.u, rtol=1e-9, atol=1e-9)


# -- failures: documented behaviour, never a hang -------------------------------------------------
def test_max_steps_raise_or_return(smooth):
    p, _ = smooth
    prop = _prop(p, Strang(p.substeps("rk4")))
    with pytest.raises(AdaptiveStepError, match=r"max_steps = 3 attempts reached at t = "):
        prop.solve(p.f, controller=PIController(rtol=1e-9, atol=1e-12, max_steps=3))
    sol = prop.solve(
        p.f,
        controller=PIController(rtol=1e-9, atol=1e-12, max_steps=3),
        on_failure="return",
        t_eval=[1.0],
    )
    assert not sol.stats.success and "max_steps = 3" in sol.stats.message
    t_end = sol.stats.times[-1]
    assert sol.stats.n_steps == 3 and t_end < 1.0 and sol.ys is None
    # the returned state is the state at the last accepted time
    g = prop.resolve_grid(p.f)
    torch.testing.assert_close(
        sol.u, _replay_by_hand(prop.scheme, sol.stats.times, p.f, g), rtol=0, atol=0
    )


def test_step_size_underflow_and_min_step(smooth):
    p, _ = smooth
    prop = _prop(p, Strang(p.substeps("rk4")))
    with pytest.raises(
        AdaptiveStepError, match=r"step size underflow at t = 0: .* below min_step 0.1"
    ):
        prop.solve(
            p.f, controller=PIController(rtol=1e-10, atol=1e-13, min_step=0.1, first_step=0.2)
        )


class _Blowup(FFNIntegral):
    """u_t = u^3 W: the state leaves the float range in finite time (t ~ 0.5 here)."""

    def field(self, t, u, grid):
        return super().field(t, u.pow(3), grid)


def test_blow_up_ends_in_an_error_not_a_hang():
    op = _Blowup(torch.eye(3, dtype=D))
    prop = Propagator(Strang([Substep(op, RK4())]), 1, t1=2.0, grid=Grid.paper(2, 3))
    f = torch.ones(1, 2, 3, dtype=D)
    with pytest.raises(AdaptiveStepError, match="step size underflow"):
        prop.solve(f, rtol=1e-6, atol=1e-9)


@pytest.mark.parametrize("scheme, expected", [(Lie, 2.0), (Strang, 4.0), (TripleJump, 6.0)])
def test_local_extrapolation_gains_one_order_or_two_for_symmetric_schemes(scheme, expected):
    # the extrapolated step map on a uniform grid, exact flows of u_t = u (W_1 + W_2 + W_3):
    # order p + 1 (Lie), p + 2 for symmetric schemes (Strang, the triple jump)
    import numpy as np
    import scipy.linalg as sla

    from opsplit.analysis import fit_order
    from opsplit.solvers import Exact

    g = torch.Generator().manual_seed(4)
    Ws = [torch.randn(4, 4, generator=g, dtype=D) / 2 for _ in range(3)]
    est = StepDoubling(
        scheme([Substep(FFNIntegral(W.clone()), Exact()) for W in Ws]), extrapolate=True
    )
    u = torch.randn(2, 3, 4, dtype=D)
    exact = torch.from_numpy(u.numpy() @ sla.expm(sum(W.numpy() for W in Ws)))
    errs = []
    for n in (2, 4, 8, 16):
        ts, v = np.linspace(0.0, 1.0, n + 1), u
        for a, b in zip(ts[:-1], ts[1:]):
            v = est.propagate(float(a), float(b), v, Grid.paper(3, 4))
        errs.append(relative_error(v, exact))
    assert fit_order([1 / n for n in (2, 4, 8, 16)], errs).within(expected, 0.15), errs


def test_training_with_adaptive_steps_in_the_checkpointed_mode():
    # opsplit.control's Trainer on a model whose encoder solves to a tolerance: the
    # checkpointed gradient mode trains to the same parameters as backprop (the adjoint mode
    # goes through the same set_gradient_mode: test_adjoint_and_backprop_gradients_agree...)
    import sys
    from pathlib import Path

    from opsplit.control import Objective, Trainer

    sys.path.insert(0, str(Path(__file__).parent))
    from _train_helpers import TinyClassifier, state_copy, tiny_config, tiny_data

    data = tiny_data(n=16)
    states = {}
    for mode in ("backprop", "checkpoint"):
        model = TinyClassifier(scheme="strang", control="legendre", solver=RK4(), T=0.5).double()
        model.encoder = AdaptivePropagator.from_propagator(model.encoder, rtol=1e-2, atol=1e-3)
        x = data.inputs.double()
        Trainer(model, Objective("cross_entropy"), tiny_config(epochs=1, gradient=mode)).fit(
            type(data)(x, data.targets)
        )
        assert model.encoder.last_stats.n_accepted > 1
        states[mode] = state_copy(model)
    for k, v in states["backprop"].items():
        torch.testing.assert_close(states["checkpoint"][k], v, rtol=1e-10, atol=1e-12)
