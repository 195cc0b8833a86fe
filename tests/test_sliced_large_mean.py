"""sliced_relu_attention with autograd (the kernel that keeps tables for the backward
pass) on values with a large mean, v = m + N(0, 1): outputs and gradients against the
naive O(N_q N_k) formula of opsplit.analysis.formulas, evaluated (and differentiated) in
float64 on the same, already rounded, inputs.

Eq. 3 subtracts the mean from the values, so its result is of the size of v - mean (~1)
whatever m is: tables of the raw values (or centred only after their in-block sums) carry
rounding errors of eps |m| and lose everything at m = 1e6 in float32.  Eq. 2 keeps the
mean (its result is of the size of m).

Tolerances are relative to the largest entry of the reference (per tensor):
float32 2e-6 (16 eps; the kernels measure <= 3e-7 on these cases, against 2.6e-5, 2.5e-3
and 0.28 for the output of eq. 3 at m = 1e2, 1e4, 1e6 before the values were centred ahead
of the sums), float64 1e-12 (the same margin over the float64 results, ~1e-15)."""

import pytest
import torch

import opsplit.functional.sliced as SL
from opsplit.analysis.formulas import naive_sliced_relu
from opsplit.functional import sliced_relu_attention

TOL = {torch.float32: 2e-6, torch.float64: 1e-12}


@pytest.fixture(autouse=True)
def _one_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def rel(a, b):
    return float((a.double() - b).abs().max() / b.abs().max().clamp_min(1e-300))


def make(m, dtype, mode, *, R=3, Nq=70, Nk=90, D=5, seed=0):
    """Scores, values m + N(0, 1), an incoming gradient, and the key weights / mask of
    ``mode`` (None, "weights", "mask": one row fully masked), rounded to ``dtype`` and
    returned in float64 (the exact inputs of both evaluations)."""
    g = torch.Generator().manual_seed(seed)

    def f(*s):
        return torch.randn(*s, generator=g, dtype=torch.float64).to(dtype).double()

    zq, zk, v, go = f(R, Nq), f(R, Nk), f(R, Nk, D), f(R, Nq, D)
    v = (m + v).to(dtype).double()
    kw = {}
    if mode == "weights":
        w = torch.rand(R, Nk, generator=g, dtype=torch.float64) + 0.5
        w[0, ::7] = 0.0  # some keys of weight 0
        kw["key_weights"] = w.to(dtype).double()
    elif mode == "mask":
        mask = torch.rand(R, Nk, generator=g) < 0.3
        mask[1] = True  # a row with no key: output and gradients 0
        kw["key_padding_mask"] = mask
    return zq, zk, v, go, kw


def run(fn, zq, zk, v, go, kw, dtype, centered):
    ins = [t.to(dtype).requires_grad_() for t in (zq, zk, v)]
    kw = {k: (t.to(dtype) if t.is_floating_point() else t) for k, t in kw.items()}
    out = fn(*ins, centered=centered, **kw)
    grads = torch.autograd.grad((out * go.to(dtype)).sum(), ins)
    return [out.detach()] + list(grads)


def naive_shifted(m):
    """The naive formula, for eq. 3 on ``v - m`` (exact: every v lies within a factor 2 of
    m; eq. 3 is invariant under a common shift of the values, and so are its gradients):
    the float64 mean of values of 1e12 is itself off by ~1e-4, far above float64's error of
    the kernel."""
    def fn(zq, zk, v, centered, **kw):
        return naive_sliced_relu(zq, zk, v - m if centered else v, centered=centered, **kw)
    return fn


def check(dtype, m, centered, mode, **shape):
    zq, zk, v, go, kw = make(m, dtype, mode, **shape)
    got = run(sliced_relu_attention, zq, zk, v, go, kw, dtype, centered)
    ref = run(naive_shifted(m), zq, zk, v, go, kw, torch.float64, centered)
    errs = [rel(a, b) for a, b in zip(got, ref)]
    assert all(a.dtype == dtype for a in got)
    return errs


@pytest.mark.parametrize("mode", [None, "weights", "mask"], ids=["plain", "weights", "mask"])
@pytest.mark.parametrize("centered", [True, False], ids=["eq3", "eq2"])
@pytest.mark.parametrize("dtype, m", [(torch.float32, 1e2), (torch.float32, 1e4), (torch.float32, 1e6),
                                      (torch.float64, 0.0), (torch.float64, 1e6), (torch.float64, 1e12)])
def test_large_mean(dtype, m, centered, mode):
    errs = check(dtype, m, centered, mode)
    assert max(errs) <= TOL[dtype], dict(zip(["out", "dzq", "dzk", "dv"], errs))


@pytest.mark.parametrize("mode", [None, "weights"], ids=["plain", "weights"])
def test_rows_in_chunks(monkeypatch, mode):
    # one row per table chunk: the centred copy of the values, its buffer and the remainder
    # of the mean are per chunk of rows
    monkeypatch.setattr(SL, "_TABLE_BYTES", 1)
    errs = check(torch.float32, 1e6, True, mode, R=4, Nq=33, Nk=50, D=3, seed=3)
    assert max(errs) <= TOL[torch.float32], errs


def test_chunk_buffer_shorter_last_chunk(monkeypatch):
    # three rows, two per chunk: the last chunk reuses a longer buffer
    Nk, D = 40, 4
    per_row = SL.padded_length(Nk) * 2 * D * 4
    monkeypatch.setattr(SL, "_TABLE_BYTES", 2 * per_row)
    errs = check(torch.float32, 1e5, True, "mask", R=3, Nq=21, Nk=Nk, D=D, seed=5)
    assert max(errs) <= TOL[torch.float32], errs


@pytest.mark.parametrize("mode", [None, "weights", "mask"], ids=["plain", "weights", "mask"])
@pytest.mark.parametrize("centered", [True, False], ids=["eq3", "eq2"])
def test_gradcheck_offset_values(centered, mode):
    # the centred tables and the remainder row are the same function of v: gradcheck in
    # float64 with values of mean 30 (distinct scores, away from ties)
    zq, zk, v, _, kw = make(30.0, torch.float64, mode, R=3, Nq=6, Nk=7, D=2, seed=7)
    ins = [t.clone().requires_grad_() for t in (zq, zk, v)]

    def fn(a, b, c):
        return sliced_relu_attention(a, b, c, centered=centered, **kw)

    assert torch.autograd.gradcheck(fn, ins, atol=1e-7, rtol=1e-6)


@pytest.mark.parametrize("mode", [None, "weights"], ids=["plain", "weights"])
def test_many_blocks(mode):
    # more than 256 blocks of 8 keys: the block totals go through the blocked scan
    errs = check(torch.float32, 1e6, True, mode, R=2, Nq=40, Nk=2100, D=3, seed=11)
    assert max(errs) <= TOL[torch.float32], errs


@pytest.mark.parametrize("mode", [None, "weights"], ids=["plain", "weights"])
@pytest.mark.parametrize("centered", [True, False], ids=["eq3", "eq2"])
@pytest.mark.parametrize("m", [1e4, 1e6])
def test_a_differentiable_backward_keeps_the_accuracy(m, centered, mode):
    """``create_graph=True``: the backward recomputes through the composed form
    (``relu_attention_composed``, also what torch.func and torch.compile differentiate); its
    gradients at large value means as accurate as the kernel's (float32)."""
    zq, zk, v, go, kw = make(m, torch.float32, mode)
    ins = [t.float().requires_grad_() for t in (zq, zk, v)]
    kwf = {k: (t.float() if t.is_floating_point() else t) for k, t in kw.items()}
    out = sliced_relu_attention(*ins, centered=centered, **kwf)
    got = torch.autograd.grad((out * go.float()).sum(), ins, create_graph=True)
    ref = run(naive_shifted(m), zq, zk, v, go, kw, torch.float64, centered)[1:]
    errs = [rel(a.detach(), b) for a, b in zip(got, ref)]
    assert max(errs) <= TOL[torch.float32], dict(zip(["dzq", "dzk", "dv"], errs))


@pytest.mark.parametrize("mode", [None, "weights", "mask"], ids=["plain", "weights", "mask"])
@pytest.mark.parametrize("centered", [True, False], ids=["eq3", "eq2"])
def test_the_forward_without_autograd_keeps_the_accuracy(centered, mode):
    """The no-grad fast path (``_relu_forward_fast``) at m = 1e6 in float32, weighted too."""
    zq, zk, v, go, kw = make(1e6, torch.float32, mode, Nk=4100)
    kwf = {k: (t.float() if t.is_floating_point() else t) for k, t in kw.items()}
    with torch.no_grad():
        out = sliced_relu_attention(zq.float(), zk.float(), v.float(), centered=centered, **kwf)
    ref = naive_shifted(1e6)(zq, zk, v, centered, **kw)
    assert rel(out, ref) <= TOL[torch.float32]
