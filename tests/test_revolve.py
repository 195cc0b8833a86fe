"""Binomial checkpointing of the time loop (opsplit.revolve): gradients equal plain
backpropagation, the schedule's counts and bounds against Griewank's binomial formula,
saved-tensor memory independent of N_t (counted by saved-tensor hooks), RNG and
validation."""

import weakref
from math import comb

import pytest
import torch

from opsplit.control import TrainConfig, gradient_mode, set_gradient_mode
from opsplit.models import SplitEncoder
from opsplit.revolve import binomial_reps, revolve_cost
from opsplit.solvers import ODESolve

F64 = torch.float64


def _grads(model, x, target, mode, **kw):
    model.zero_grad()
    x = x.detach().requires_grad_(True)
    with gradient_mode(model, mode, **kw):
        loss = (model(x) - target).square().mean()
        loss.backward()
    return torch.cat([p.grad.flatten() for p in model.parameters()] + [x.grad.flatten()]), loss.detach()


def _model(n, scheme="lie", **kw):
    g = torch.Generator().manual_seed(1)
    return SplitEncoder(6, 2, 12, n_steps=n, T=1.0, scheme=scheme, generator=g, dtype=F64, **kw)


@pytest.mark.parametrize("n", [1, 2, 5, 7, 12, 17])
@pytest.mark.parametrize("snapshots", [1, 2, 3, 8])
def test_gradient_equals_backprop_float64(n, snapshots):
    torch.manual_seed(0)
    m = _model(n)
    x = torch.randn(3, 4, 6, dtype=F64)
    tgt = torch.randn(3, 4, 6, dtype=F64)
    gb, lb = _grads(m, x, tgt, "backprop")
    gc, lc = _grads(m, x, tgt, "checkpoint", snapshots=snapshots)
    assert m.checkpoint_snapshots is None and m.checkpoint_every == 0  # restored
    torch.testing.assert_close(lc, lb, rtol=1e-13, atol=0)
    assert float((gc - gb).norm() / gb.norm()) <= 1e-10


@pytest.mark.parametrize("scheme, k", [("hybrid", 1), ("strang", 2), ("lie", 3)])
def test_gradient_equals_backprop_blocks_and_schemes(scheme, k):
    torch.manual_seed(0)
    m = _model(11, scheme)
    x = torch.randn(2, 5, 6, dtype=F64)
    tgt = torch.randn(2, 5, 6, dtype=F64)
    gb, _ = _grads(m, x, tgt, "backprop")
    gc, _ = _grads(m, x, tgt, "checkpoint", checkpoint_every=k, snapshots=2)
    assert float((gc - gb).norm() / gb.norm()) <= 1e-10


def test_adjoint_with_snapshots_equals_adjoint_storing_every_substep():
    # the snapshot budget only changes how the substeps' initial states are obtained
    # (recomputed instead of stored): the gradient is the same continuous adjoint's
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(2)
    m = SplitEncoder(4, 1, 4, n_steps=13, T=1.0, scheme="lie", control="legendre", n_modes=2, generator=g,
                     dtype=F64, solver=ODESolve("midpoint"))
    x = torch.randn(2, 3, 4, dtype=F64)
    tgt = torch.randn(2, 3, 4, dtype=F64)
    ga0, _ = _grads(m, x, tgt, "adjoint", snapshots=None)
    ga, _ = _grads(m, x, tgt, "adjoint", snapshots=2)
    gb, _ = _grads(m, x, tgt, "backprop")
    assert float((ga - ga0).norm() / ga0.norm()) <= 1e-10
    assert float((ga - gb).norm() / gb.norm()) > 1e-6  # the adjoint's gradient, not backprop's


def _beta(s, r):
    return comb(s + r, s)


@pytest.mark.parametrize("n", [1, 2, 3, 9, 10, 45, 46, 100, 255, 256, 257])
@pytest.mark.parametrize("s", [1, 2, 3, 8])
def test_schedule_bounds(n, s):
    c = revolve_cost(n, s)
    r = binomial_reps(n, s)
    # r is the least integer with binom(s + r, s) >= n (Griewank & Walther)
    assert _beta(s, r) >= n and (r == 1 or _beta(s, r - 1) < n)
    assert c["rerun"] == n and c["forward"] == n
    # every unit evaluated at most r times without a graph (forward pass + recomputations)
    assert c["forward"] + c["recomputed"] <= r * n
    # Griewank's minimal number of graph-free steps, r n - beta(s + 1, r - 1), plus the
    # forward pass's evaluation of the last unit (it produces the output)
    assert c["forward"] + c["recomputed"] == r * n - comb(s + r, s + 1) + 1
    assert c["stored"] <= s + 1  # snapshots and the working state
    assert c["max_held"] <= 2 * s
    if n <= s + 1:
        assert c["recomputed"] <= 1  # enough slots: (almost) nothing recomputed


class _Counter:
    """Counts the scheme's steps with and without a graph, and the most states produced by
    graph-free steps alive at once (weak references)."""

    def __init__(self, scheme):
        self.orig = scheme.advance
        self.calls = {"grad": 0, "nograd": 0}
        self.per_step = {}
        self.alive = 0
        self.max_alive = 0
        scheme.advance = self

    def __call__(self, t, dt, u, g):
        out, g2 = self.orig(t, dt, u, g)
        if torch.is_grad_enabled():
            self.calls["grad"] += 1
        else:
            self.calls["nograd"] += 1
            self.per_step[t] = self.per_step.get(t, 0) + 1
            self.alive += 1
            self.max_alive = max(self.max_alive, self.alive)
            weakref.finalize(out, self._dead)
        return out, g2

    def _dead(self):
        self.alive -= 1


@pytest.mark.parametrize("n, s", [(17, 2), (30, 3), (9, 1), (40, 8)])
def test_schedule_matches_the_steps_run(n, s):
    torch.manual_seed(0)
    m = _model(n)
    x = torch.randn(2, 3, 6, dtype=F64)
    counter = _Counter(m.scheme)
    with gradient_mode(m, "checkpoint", snapshots=s):
        m(x).square().sum().backward()
    c = revolve_cost(n, s)
    assert counter.calls == {"grad": n, "nograd": c["forward"] + c["recomputed"]}
    assert max(counter.per_step.values()) <= binomial_reps(n, s)
    # held states plus one working state (the output is held by the caller until the end)
    assert counter.max_alive <= c["max_held"] + 2


def _saved_bytes(model, x, mode, **kw):
    """Bytes of the distinct storages autograd saves in the forward pass (parameters and
    the input excluded), at their peak."""
    held = {p.untyped_storage().data_ptr() for p in model.parameters()} | {x.untyped_storage().data_ptr()}
    refs, live = {}, [0, 0]

    class Saved:
        def __init__(self, t):
            self.t = t
            st = t.untyped_storage()
            self.key, self.n = st.data_ptr(), (0 if st.data_ptr() in held else st.nbytes())
            refs[self.key] = refs.get(self.key, 0) + 1
            if refs[self.key] == 1:
                live[0] += self.n
                live[1] = max(live)

        def __del__(self):
            refs[self.key] -= 1
            if refs[self.key] == 0:
                live[0] -= self.n

    with gradient_mode(model, mode, **kw):
        with torch.autograd.graph.saved_tensors_hooks(Saved, lambda s: s.t):
            loss = model(x).square().mean()
    del loss  # (the backward pass is not needed to count what the forward pass saves)
    return live[1]


def test_saved_memory_flat_in_n_steps():
    torch.manual_seed(0)
    x = torch.randn(4, 8, 8)
    out = {}
    for n in (64, 256):
        g = torch.Generator().manual_seed(0)
        m = SplitEncoder(8, 2, 8, n_steps=n, T=1.0, scheme="lie", control="legendre", n_modes=2, generator=g,
                         solver=ODESolve("euler"))
        for mode, kw in (("backprop", {}), ("checkpoint", {"snapshots": 4}), ("adjoint", {"snapshots": 4}),
                         ("checkpoint", {"snapshots": None})):
            out[mode, kw.get("snapshots"), n] = _saved_bytes(m, x, mode, **kw)
    state = x.numel() * x.element_size()
    rng = torch.get_rng_state().numel()
    for mode in ("checkpoint", "adjoint"):
        a, b = out[mode, 4, 64], out[mode, 4, 256]
        assert b <= a * 1.05 + 1024, (mode, a, b)
        # at most 4 snapshots + the working state, each with its RNG state, and a few
        # tensors saved outside the time loop (the loss)
        assert b <= 5 * (state + rng) + 4 * state, (mode, b)
    # plain backprop and one state per step grow linearly
    assert out["backprop", None, 256] > 3.5 * out["backprop", None, 64]
    assert out["checkpoint", None, 256] > 3.5 * out["checkpoint", None, 64]


def test_rng_restored_for_dropout():
    from opsplit.models import TorchEncoder

    m = TorchEncoder(8, 2, 16, dropout=0.3, num_layers=7, batch_first=True, dtype=F64)
    m.train()
    x = torch.randn(2, 5, 8, dtype=F64)
    tgt = torch.randn(2, 5, 8, dtype=F64)
    torch.manual_seed(3)
    gb, lb = _grads(m, x, tgt, "backprop")
    after_b = torch.rand(3)
    torch.manual_seed(3)
    gc, lc = _grads(m, x, tgt, "checkpoint", snapshots=2)
    after_c = torch.rand(3)
    torch.testing.assert_close(lc, lb, rtol=1e-13, atol=0)
    assert float((gc - gb).norm() / gb.norm()) <= 1e-10
    assert torch.equal(after_b, after_c)  # the global RNG is where backprop leaves it


def test_tensor_from_outside_the_scheme_is_refused():
    torch.manual_seed(0)
    m = _model(6)
    w = torch.randn(6, dtype=F64, requires_grad=True)
    orig = m.scheme.advance
    m.scheme.advance = lambda t, dt, u, g: (orig(t, dt, u, g)[0] + dt * w, g)
    x = torch.randn(2, 3, 6, dtype=F64)
    with gradient_mode(m, "checkpoint", snapshots=2):
        y = m(x).square().sum()
        with pytest.raises(RuntimeError, match="not a parameter or buffer of the scheme"):
            y.backward()
    # one state per block (torch.utils.checkpoint) follows the whole graph
    w.grad = None
    with gradient_mode(m, "checkpoint", snapshots=None):
        m(x).square().sum().backward()
    gw = w.grad.clone()
    w.grad = None
    m(x).square().sum().backward()
    torch.testing.assert_close(gw, w.grad, rtol=1e-12, atol=0)


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, "4"])
def test_bad_snapshots(bad):
    m = _model(3)
    with pytest.raises(ValueError, match="snapshots"):
        set_gradient_mode(m, "checkpoint", snapshots=bad)
    assert m.checkpoint_every == 0  # nothing changed
    with pytest.raises((ValueError, TypeError), match="checkpoint_snapshots"):
        TrainConfig(checkpoint_snapshots=bad)
    with pytest.raises(ValueError, match="snapshots"):
        revolve_cost(5, bad)


def test_config_default_and_none():
    assert TrainConfig().checkpoint_snapshots == 8
    c = TrainConfig(checkpoint_snapshots=None)
    assert TrainConfig.from_dict(c.to_dict()).checkpoint_snapshots is None


def test_devices_and_dtypes(device, dtype):
    # gradients equal backprop on every device and dtype (float32: to round-off), with
    # dropout on (the device's RNG state is stored and restored)
    from opsplit.models import TorchEncoder

    m = TorchEncoder(8, 2, 16, dropout=0.2, num_layers=9, batch_first=True, device=device, dtype=dtype)
    m.train()
    x = torch.randn(2, 5, 8, device=device, dtype=dtype)
    tgt = torch.randn(2, 5, 8, device=device, dtype=dtype)
    torch.manual_seed(4)
    gb, lb = _grads(m, x, tgt, "backprop")
    torch.manual_seed(4)
    gc, lc = _grads(m, x, tgt, "checkpoint", snapshots=2)
    tol = 1e-10 if dtype == torch.float64 else 1e-4
    assert gc.device == gb.device and gc.dtype == dtype
    assert float((gc - gb).norm() / gb.norm()) <= tol
    torch.testing.assert_close(lc, lb)


@pytest.mark.parametrize("snapshots", [2, None])
def test_grid_transfers_cvt(snapshots):
    # CvT: stage entries move the state to coarser token grids inside the time loop; the
    # grid is threaded through the checkpointed solve (regression: both checkpoint paths
    # used to derive the output grid from Scheme.output_grid, which is the whole solve's
    # for a staged scheme)
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parent))
    from test_cvt_hf import hf_model, random_config

    from opsplit.models import from_hf

    cfg, size = random_config(0)
    m = from_hf(hf_model(cfg, "CvtForImageClassification", F64, 0)).eval()
    x = torch.randn(2, 3, size, size, dtype=F64)

    def grads(mode, **kw):
        m.zero_grad()
        with gradient_mode(m, mode, **kw):
            out = m(x)
            (out.logits if hasattr(out, "logits") else out).square().sum().backward()
        return torch.cat([p.grad.flatten() for p in m.parameters() if p.grad is not None])

    gb = grads("backprop")
    gc = grads("checkpoint", snapshots=snapshots)
    assert gc.shape == gb.shape
    assert float((gc - gb).norm() / gb.norm()) <= 1e-10
