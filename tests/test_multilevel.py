"""Multilevel training in time and coarse solves (``opsplit.controls.refine``,
``opsplit.coarse``, ``opsplit.control.multilevel``, ``opsplit.control.frontier``).

The closed-form checks use linear terms u_t = u W(t) (``FFNIntegral``) with W piecewise
constant in t, whose flow is the product of matrix exponentials, computed here by
``scipy.linalg.expm`` independently of opsplit."""

import math
import sys
from pathlib import Path

import numpy as np
import pytest
import scipy.linalg
import torch

from opsplit import Propagator
from opsplit.control import Objective, Trainer, coarse_controls, frontier
from opsplit.control.multilevel import level_at, level_n_steps, level_starts
from opsplit.controls import (
    LayerwiseConstant,
    LeftLimit,
    PieceAverage,
    PiecewiseConstant,
    PiecewiseLinear,
    prolong,
    prolongation_matrix,
    restrict,
    restriction_matrix,
)
from opsplit.operators import FFNIntegral
from opsplit.schemes import Lie
from opsplit.solvers import RK4, ExplicitEuler, Substep

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _train_helpers import TinyClassifier, same_state, state_copy, tiny_config, tiny_data  # noqa: E402

D = torch.float64


def _pieces(k, n=3, seed=0, scale=0.6):
    g = torch.Generator().manual_seed(seed)
    return scale * torch.randn(k, n, n, dtype=D, generator=g) / math.sqrt(n)


def _exact(f, W, T):
    """u(T) of u_t = u W(t), W piecewise constant with the rows of ``W`` on [0, T]: the
    product of scipy's matrix exponentials."""
    h = T / W.shape[0]
    M = np.eye(W.shape[1])
    for Wi in W.numpy():
        M = M @ scipy.linalg.expm(h * Wi)
    return f @ torch.as_tensor(M)


def _model(W, T, solver, n):
    c = PiecewiseConstant(W, t0=0.0, t1=T, axes=("y", "y"))
    return Propagator(Lie([Substep(FFNIntegral(c), solver)]), n, t0=0.0, t1=T)


# -- the matrices against naive transcriptions -------------------------------------------------
@pytest.mark.parametrize("P,r", [(1, 2), (3, 2), (2, 4), (4, 3)])
def test_prolongation_matrices_are_the_interpolations(P, r):
    Q = P * r
    v = np.random.default_rng(P + r).normal(size=P)
    const = prolongation_matrix(P, Q, "constant").numpy() @ v
    assert np.array_equal(const, np.repeat(v, r))
    # linear: the old values at their midpoints, read at the new midpoints (constant beyond the ends)
    lin = prolongation_matrix(P, Q, "linear").numpy() @ v
    want = np.interp((np.arange(Q) + 0.5) / Q, (np.arange(P) + 0.5) / P, v)
    assert np.allclose(lin, want, atol=1e-14)
    M = prolongation_matrix(P, Q, "linear")
    assert bool((M >= 0).all()) and torch.allclose(M.sum(1), torch.ones(Q, dtype=D))
    avg = restriction_matrix(Q, P).numpy() @ np.repeat(v, r)
    assert np.allclose(avg, v)
    w = np.random.default_rng(1).normal(size=Q)
    assert np.allclose(restriction_matrix(Q, P).numpy() @ w, w.reshape(P, r).mean(1))
    assert np.array_equal(restriction_matrix(Q, P, "sample").numpy() @ w, w[::r])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_prolong_constant_is_the_same_function_of_t(dtype):
    W = _pieces(3).to(dtype)
    times = np.linspace(0.0, 3.0, 61)
    for c in (PiecewiseConstant(W, t0=0.0, t1=3.0), LayerwiseConstant(W, t0=0.0, t1=3.0),
              PiecewiseConstant(W.abs() + 0.1, t0=0.0, t1=3.0, positive=True)):
        p = prolong(c, 6)
        assert type(p) is type(c) and p.n_pieces == 6 and p(0.0).dtype == dtype
        for t in times:
            assert torch.allclose(p(float(t)), c(float(t)), rtol=1e-6, atol=1e-7)
        # the left limit of a breakpoint of the old grid reads the old piece that ends there
        assert torch.equal(p(LeftLimit(1.0)), c(LeftLimit(1.0)).to(dtype)) or torch.allclose(
            p(LeftLimit(1.0)), c(LeftLimit(1.0)))
    pl = PiecewiseLinear(W[:, 0], t0=0.0, t1=3.0)  # 3 nodes: 2 intervals
    q = prolong(pl, 6)
    for t in times:
        assert torch.allclose(q(float(t)), pl(float(t)), rtol=1e-6, atol=1e-6)


def test_restrict_averages_and_samples():
    W = _pieces(4)
    c = PiecewiseConstant(W, t0=0.0, t1=4.0)
    a = restrict(c, 2)
    assert torch.allclose(a(0.5), (W[0] + W[1]) / 2) and torch.allclose(a(3.9), (W[2] + W[3]) / 2)
    s = restrict(LayerwiseConstant(W, t0=0.0, t1=4.0), 2, "sample")
    assert torch.equal(s(0.5), W[0]) and torch.equal(s(2.5), W[2])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_piece_average_reads_the_step_average_with_left_limits(dtype):
    W = _pieces(4).to(dtype)
    for c in (PiecewiseConstant(W, t0=0.0, t1=2.0), LayerwiseConstant(W, t0=0.0, t1=2.0)):
        v = PieceAverage(c, 2)
        assert torch.allclose(v(0.0), (W[0] + W[1]) / 2) and torch.allclose(v(0.99), (W[0] + W[1]) / 2)
        assert torch.allclose(v(1.0), (W[2] + W[3]) / 2)
        assert torch.allclose(v(LeftLimit(1.0)), (W[0] + W[1]) / 2)  # the step [0, 1] ends at 1: its average
        assert torch.allclose(v(LeftLimit(2.0)), (W[2] + W[3]) / 2)
        assert v(0.3).dtype == dtype


def test_piece_average_gradcheck():
    """The averages are differentiable in the pieces (float64 gradcheck; a control whose rows
    are the tensor checked)."""

    class Rows(PiecewiseConstant):
        def __init__(self, W):
            super().__init__(W.detach(), t0=0.0, t1=2.0)
            del self.raw
            self.raw = W  # the checked tensor in the parameter's place

    W = _pieces(4, n=2).requires_grad_(True)
    for k in (1, 2, 4):
        assert torch.autograd.gradcheck(lambda W, k=k: torch.stack([PieceAverage(Rows(W), k)(0.4),
                                                                    PieceAverage(Rows(W), k)(LeftLimit(2.0))]),
                                        (W,))


# -- the closed form: a prolongation keeps the flow, a wrong one does not ------------------------
def test_prolonged_controls_keep_the_flow_to_the_schemes_order():
    """W with 2 pieces on [0, 1]; the exact flow by scipy's expm.  Prolonged to 4 pieces by
    duplication, RK4 at N_t = 4, 8, 16, 32 converges to the *old* controls' flow at order 4;
    the linear interpolation of the pieces is another function of t: its error stops at a
    floor (the test can fail)."""
    W = _pieces(2, seed=2, scale=1.5)
    T = 1.0
    f = torch.randn(3, 2, 3, dtype=D, generator=torch.Generator().manual_seed(5))
    exact = _exact(f, W, T)
    old = PiecewiseConstant(W, t0=0.0, t1=T, axes=("y", "y"))
    errs = {}
    for kind in ("constant", "linear"):
        c = prolong(old, 4, kind)
        m = Propagator(Lie([Substep(FFNIntegral(c), RK4())]), 4, t0=0.0, t1=T)
        with torch.no_grad():
            errs[kind] = [float((m(f, n_steps=n) - exact).norm() / exact.norm()) for n in (4, 8, 16, 32)]
    rates = [math.log2(a / b) for a, b in zip(errs["constant"][:-1], errs["constant"][1:])]
    assert all(abs(r - 4) < 0.3 for r in rates), (errs, rates)
    assert errs["constant"][-1] < 1e-7
    assert errs["linear"][-1] > 1e-3 and errs["linear"][-1] > 0.5 * errs["linear"][-2], errs
    # Euler on the prolonged controls: order 1 towards the same flow
    m = _model(prolong(old, 4).raw.detach(), T, ExplicitEuler(), 4)
    with torch.no_grad():
        e = [float((m(f, n_steps=n) - exact).norm()) for n in (8, 16, 32, 64)]
    assert all(abs(math.log2(a / b) - 1) < 0.15 for a, b in zip(e[:-1], e[1:])), e


def test_coarse_average_is_the_integral_of_commuting_pieces():
    """Diagonal (commuting) pieces: the flow over a coarse step is exp(dt W̄) with W̄ the
    step's average, exactly; RK4 with the averages is within its truncation error of the
    exact flow, RK4 reading the step's first piece is not."""
    g = torch.Generator().manual_seed(7)
    W = 0.5 * torch.diag_embed(torch.randn(4, 3, dtype=D, generator=g))
    T = 1.0
    f = torch.randn(2, 2, 3, dtype=D, generator=g)
    exact = _exact(f, W, T)
    m = _model(W, T, RK4(), 4)
    with torch.no_grad():
        point = m(f, n_steps=2)
        with coarse_controls(m, 2):
            avg = m(f, n_steps=2)
        restored = m(f, n_steps=2)
    assert float((avg - exact).norm() / exact.norm()) < 1e-4
    assert float((point - exact).norm() / exact.norm()) > 1e-2
    assert torch.equal(restored, point)  # the swap was undone
    assert isinstance(m.scheme.substeps[0].terms[0].W, PiecewiseConstant)


def test_coarse_solve_equals_a_model_built_with_the_averages():
    """An ImageClassifier-like model (SplitEncoder, 4 pieces) solved at N_t = 2 with averaged
    controls equals the same encoder built with 2 pieces holding the pieces' averages."""
    from opsplit.models import SplitEncoder

    enc = SplitEncoder(8, 2, 16, n_steps=4, T=4.0, scheme="hybrid", generator=torch.Generator().manual_seed(0))
    enc2 = SplitEncoder(8, 2, 16, n_steps=2, T=4.0, scheme="hybrid", generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        for (n1, p1), (n2, p2) in zip(enc.named_parameters(), enc2.named_parameters()):
            assert n1 == n2
            p2.copy_(p1.reshape(2, 2, *p1.shape[1:]).mean(1))
    x = torch.randn(3, 5, 8, generator=torch.Generator().manual_seed(2))
    with torch.no_grad(), coarse_controls(enc, 2):
        a = enc(x, n_steps=2)
    with torch.no_grad():
        b = enc2(x)
    assert torch.allclose(a, b, atol=1e-6)


def test_one_swap_entered_many_times_reads_the_averages_and_restores():
    """coarse_controls(...) built once and entered again (a speculative draft's rounds): every
    entry equals a fresh swap, every exit leaves the model's own controls; entering it while
    it is in place is refused."""
    from opsplit.models import SplitEncoder

    enc = SplitEncoder(8, 2, 16, n_steps=4, T=4.0, scheme="hybrid", generator=torch.Generator().manual_seed(0))
    x = torch.randn(3, 5, 8, generator=torch.Generator().manual_seed(2))
    own = list(enc.modules())
    with torch.no_grad():
        with coarse_controls(enc, 2):
            want = enc(x, n_steps=2)
        plain = enc(x, n_steps=2)
        swap = coarse_controls(enc, 2)
        for _ in range(3):
            with swap:
                assert torch.equal(enc(x, n_steps=2), want)
                with pytest.raises(RuntimeError, match="coarse_controls: already in place"):
                    swap.__enter__()
            assert torch.equal(enc(x, n_steps=2), plain) and list(enc.modules()) == own
    assert not torch.equal(want, plain)


def test_a_level_change_reaches_the_parallel_schemes_batched_path():
    """change_level replaces the controls of a hybrid model whose parallel group had batched
    (and planned) its terms: the next forward uses the new controls — equal to a fresh copy
    of the model that never planned — and every new piece gets a gradient."""
    import copy

    from opsplit.control.multilevel import change_level
    from opsplit.models import SplitEncoder

    enc = SplitEncoder(8, 2, 16, n_steps=2, T=4.0, scheme="hybrid", generator=torch.Generator().manual_seed(0))
    x = torch.randn(3, 5, 8, generator=torch.Generator().manual_seed(2))
    enc(x).sum().backward()  # a small state: the parallel group plans its batched terms
    props = [m for m in enc.modules() if type(m).__name__ == "Propagator"]
    change_level(enc, 4, final_n_steps={p: 2 for p in props}, final_pieces=2)
    with torch.no_grad():
        for p in enc.parameters():
            p.add_(0.1 * torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel())))
    fresh = copy.deepcopy(enc)
    for m in fresh.modules():
        if hasattr(m, "reset_plan"):
            m.reset_plan()
    enc.zero_grad(set_to_none=True)
    out = enc(x)
    out.sum().backward()
    assert torch.equal(out, fresh(x))
    assert all(p.grad is not None for p in enc.parameters())


def test_coarse_solve_differentiates_every_piece():
    W = _pieces(4, n=2)
    m = _model(W, 1.0, ExplicitEuler(), 4)
    f = torch.randn(1, 2, 2, dtype=D, generator=torch.Generator().manual_seed(3))
    with coarse_controls(m, 1):
        m(f, n_steps=1).sum().backward()
    g = m.scheme.substeps[0].terms[0].W.raw.grad
    # one Euler step u + T u W̄: d/dW_i = (T / 4) f^T 1 for every piece i
    want = (1.0 / 4) * f[0].T @ torch.ones(2, 2, dtype=D)
    for i in range(4):
        assert torch.allclose(g[i], want)


# -- the schedule -------------------------------------------------------------------------------
def test_level_starts_and_draws():
    lv = ((1, 0.3), (2, 0.3), (4, 0.4))
    assert level_starts(lv, 100) == [0, 30, 60]
    assert [level_at(lv, 100, s) for s in (0, 29, 30, 59, 60, 99)] == [0, 0, 1, 1, 2, 2]
    assert level_n_steps((2, 4, 8), "cost", 2, 4) == ((1, 2, 4), "cost")
    assert level_n_steps((2, 4, 8), (1.0, 2.0, 3.0), 1, 4) == ((1, 2), (2.0, 3.0))


def _fit(tmp, levels, *, resume=None, max_steps=12, save_every=None, **kw):
    model = TinyClassifier(n_steps=4, T=2.0)
    cfg = tiny_config(levels=levels, max_steps=max_steps, save_every=save_every, keep_checkpoints=10, **kw)
    tr = Trainer(model, Objective("cross_entropy", kinetic=0.1), cfg)
    tr.fit(tiny_data(), tiny_data(n=12, seed=2), out_dir=tmp, resume=resume, plot=False)
    return model, tr


def test_multilevel_run_changes_level_and_carries_adam_moments(tmp_path):
    levels = ((1, 0.25), (2, 0.25), (4, 0.5))
    model = TinyClassifier(n_steps=4, T=2.0)
    tr = Trainer(model, Objective("cross_entropy"), tiny_config(levels=levels, max_steps=8))
    tr._total_steps = 8
    data = tiny_data()
    tr.set_level(0)
    assert model.encoder.n_steps == 1
    assert all(p.shape[0] == 1 for n, p in model.encoder.named_parameters())
    tr.train_step(data, torch.arange(16))
    tr.train_step(data, torch.arange(16, 32))
    c = model.encoder._ffn.W1  # the first feed-forward kernel
    old = tr.optimizer.state[c.raw]
    m, v, step = old["exp_avg"].clone(), old["exp_avg_sq"].clone(), old["step"].clone()
    tr.set_level(1)
    new = model.encoder._ffn.W1
    assert new is not c and new.n_pieces == 2 and model.encoder.n_steps == 2
    st = tr.optimizer.state[new.raw]
    assert torch.equal(st["exp_avg"], m.repeat_interleave(2, 0) / 2)
    assert torch.equal(st["exp_avg_sq"], v.repeat_interleave(2, 0) / 4)
    assert torch.equal(st["step"], step)
    assert [id(p) for p in tr.optimizer.param_groups[0]["params"]] == [id(p) for p in model.parameters()]
    # the same function of t: the trained map at the level change changes only by the grid
    assert torch.equal(new(0.3), c(0.3))
    tr.train_step(data, torch.arange(16))  # the optimizer steps the new parameters
    assert not torch.equal(new.raw[0], c.raw[0])


def test_multilevel_resume_across_a_level_change_is_bit_exact(tmp_path):
    levels = ((1, 0.25), (2, 0.25), (4, 0.5))
    full, tr_full = _fit(tmp_path / "a", levels, save_every=2)
    assert [r["level"] for r in tr_full.history.steps] == [0] * 3 + [1] * 3 + [2] * 6
    import shutil

    (tmp_path / "b" / "checkpoints").mkdir(parents=True)
    for step in (2, 4):  # at level 0 (before the change at step 3) and at level 1
        shutil.rmtree(tmp_path / "b", ignore_errors=True)
        shutil.copytree(tmp_path / "a" / "checkpoints" / f"step-{step:08d}",
                        tmp_path / "b" / "checkpoints" / f"step-{step:08d}")
        part, tr_part = _fit(tmp_path / "b", levels, resume=tmp_path / "b")
        assert same_state(state_copy(full), state_copy(part)), step
        assert [r["loss"] for r in tr_part.history.steps] == [r["loss"] for r in tr_full.history.steps]


def test_a_resume_with_other_levels_is_refused(tmp_path):
    _fit(tmp_path / "a", ((2, 0.5), (4, 0.5)), max_steps=4)
    with pytest.raises(ValueError, match="TrainConfig.levels"):
        _fit(tmp_path / "a", ((1, 0.5), (4, 0.5)), max_steps=6, resume=tmp_path / "a")


def test_frontier_rows_and_references(tmp_path):
    model = TinyClassifier(n_steps=4, T=2.0)
    ref = TinyClassifier(n_steps=2, T=2.0, seed=1)
    data = tiny_data(n=24)
    fr = frontier(model, data, n_steps=[1, 2, 4], references={2: ref})
    assert [r["n_steps"] for r in fr.rows] == [1, 2, 4]
    model.eval()
    ref.eval()
    with torch.no_grad():
        with coarse_controls(model, 1):
            acc1 = float((model(data.inputs, n_steps=1).argmax(-1) == data.targets).double().mean())
        acc_ref = float((ref(data.inputs).argmax(-1) == data.targets).double().mean())
    assert fr.rows[0]["accuracy"] == pytest.approx(acc1)
    assert fr.references[0]["accuracy"] == pytest.approx(acc_ref)
    assert fr.gaps()[2] == pytest.approx(fr.rows[1]["accuracy"] - acc_ref)
    # substep calls: Lie with 3 terms (2 heads, the FFN) and the norms ... scale with N_t
    assert fr.rows[2]["calls"] == pytest.approx(4 * fr.rows[0]["calls"])
    fr.plot(tmp_path / "f.png")
    assert (tmp_path / "f.png").stat().st_size > 0
    assert "| 2 |" in fr.markdown()


def test_training_with_coarse_averages_uses_them(tmp_path):
    """coarse_controls='average': a step at N_t = 1 of a 4-piece model is the solve of the
    pieces' average (the trainer's evaluate at N_t = 1 equals the coarse_controls solve)."""
    model = TinyClassifier(n_steps=4, T=2.0)
    tr = Trainer(model, Objective("cross_entropy"), tiny_config(n_steps=(1, 2, 4), coarse_controls="average",
                                                               max_steps=3))
    tr.fit(tiny_data(), None, plot=False)
    data = tiny_data(n=12, seed=2)
    loss = tr.evaluate(data, n_steps=1)["loss"]
    model.eval()
    with torch.no_grad(), coarse_controls(model, 1):
        want = float(torch.nn.functional.cross_entropy(model(data.inputs, n_steps=1), data.targets))
    assert loss == pytest.approx(want, rel=1e-6)


def test_the_schedule_restarts_at_every_level():
    """levels_schedule='level': the cosine's progress runs from 0 to 1 within each level
    (the warm-up only in the first), against the formula written out."""
    tr = Trainer(TinyClassifier(n_steps=4), Objective("cross_entropy"),
                 tiny_config(levels=((1, 0.4), (2, 0.2), (4, 0.4)), levels_schedule="level", warmup_steps=2))
    tr._total_steps = 20  # levels start at steps 0, 8, 12
    want = [0.0] * 3 + [(s - 2) / 6 for s in range(3, 8)] + [(s - 8) / 4 for s in range(8, 12)] + \
        [(s - 12) / 8 for s in range(12, 20)]
    assert [tr.progress(s) for s in range(20)] == pytest.approx(want)
    one = Trainer(TinyClassifier(n_steps=4), Objective("cross_entropy"),
                  tiny_config(levels=((1, 0.4), (2, 0.2), (4, 0.4)), warmup_steps=2))
    one._total_steps = 20
    assert [one.progress(s) for s in range(20)] == pytest.approx([max(0.0, (s - 2) / 18) for s in range(20)])
