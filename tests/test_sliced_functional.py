"""opsplit.functional.sliced_relu_attention / sliced_relu_bump_attention (paper 004, eqs. 2,
3, 6, 7) against the naive O(N_q N_k) transcriptions in sliced_reference.py."""

import math

import pytest
import torch
from _helpers import output_and_grads
from hypothesis import given
from hypothesis import strategies as st

import opsplit.functional._sorted as S
import opsplit.functional.sliced as SL
from opsplit.analysis.formulas import naive_sliced_bump, naive_sliced_relu
from opsplit.functional import sliced_relu_attention, sliced_relu_bump_attention

TOL = {torch.float32: 1e-5, torch.float64: 1e-10}


def rel_err(out, ref, v=None):
    """max |out - ref| / max |ref|: the relative error of the whole result.

    For eq. (7), whose outputs are averages of the values with kernel weights <= 1, pass
    ``v``: the error is then relative to max(max |ref|, 1e-3 max |v|), so that a result that
    is exactly 0 (no key in any window) is compared with the scale of the values."""
    den = ref.abs().max()
    if v is not None:
        den = torch.maximum(den, 1e-3 * v.double().abs().max().cpu())
    return float((out.double() - ref).abs().max() / den.clamp_min(1e-300))


def make(B, H, Nq, Nk, D, dtype, device, *, ties=False, seed=0):
    g = torch.Generator().manual_seed(seed)
    zq = torch.randn(B, H, Nq, generator=g, dtype=torch.float64)
    zk = torch.randn(B, H, Nk, generator=g, dtype=torch.float64)
    v = torch.randn(B, H, Nk, D, generator=g, dtype=torch.float64) + 0.5
    if ties:
        # scores on a coarse grid: duplicate keys, duplicate queries, query = key
        zq = (zq * 2).round() / 2
        zk = (zk * 2).round() / 2
        zq[..., : min(3, Nq)] = zk[..., :1]
    return [t.to(dtype=dtype, device=device) for t in (zq, zk, v)]


def ref64(fn, *tensors, **kw):
    return fn(*[t.double().cpu() for t in tensors], **kw)


CASES = [(2, 3, 17, 29, 5), (1, 2, 64, 40, 8), (2, 1, 100, 7, 3), (1, 1, 1, 1, 2), (1, 2, 9, 200, 4)]


@pytest.mark.parametrize("shape", CASES)
@pytest.mark.parametrize("ties", [False, True], ids=["distinct", "ties"])
@pytest.mark.parametrize("centered", [True, False], ids=["eq3", "eq2"])
def test_relu_matches_naive(shape, ties, centered, dtype, device):
    zq, zk, v = make(*shape, dtype, device, ties=ties)
    out = sliced_relu_attention(zq, zk, v, centered=centered)
    assert out.shape == (*shape[:3], shape[4]) and out.dtype == dtype
    ref = ref64(naive_sliced_relu, zq, zk, v, centered=centered)
    assert rel_err(out.cpu(), ref) <= TOL[dtype]


@pytest.mark.parametrize("shape", CASES)
@pytest.mark.parametrize("ties", [False, True], ids=["distinct", "ties"])
@pytest.mark.parametrize("b", [0.3, 1.0, 5.0])
def test_bump_matches_naive(shape, ties, b, dtype, device):
    zq, zk, v = make(*shape, dtype, device, ties=ties, seed=1)
    out = sliced_relu_bump_attention(zq, zk, v, b)
    ref = ref64(naive_sliced_bump, zq, zk, v, bandwidth=b)
    assert rel_err(out.cpu(), ref, v) <= TOL[dtype]


def test_bump_at_exact_support_edges():
    # |zq - zk| = b exactly: the kernel is 0 there; = 0: it is 1
    zq = torch.tensor([[[0.0, 1.0, 2.0, 0.5]]], dtype=torch.float64)
    zk = torch.tensor([[[1.0, 1.0, 3.0]]], dtype=torch.float64)
    v = torch.tensor([[[[1.0], [2.0], [4.0]]]], dtype=torch.float64)
    out = sliced_relu_bump_attention(zq, zk, v, 1.0)
    # q=0: keys at 1 are on the edge -> 0; q=1: keys at 1 count 1, key at 3 is out;
    # q=2: keys at 1 and 3 on the edges -> 0; q=0.5: 0.5*(1+2)
    expected = torch.tensor([0.0, 3.0, 0.0, 1.5], dtype=torch.float64) / 3
    assert torch.allclose(out.flatten(), expected, rtol=0, atol=1e-15)


@pytest.mark.parametrize("fn", ["relu", "bump"])
def test_masks_and_weights_match_naive(fn, dtype, device):
    B, H, Nq, Nk, D = 3, 2, 21, 33, 4
    zq, zk, v = make(B, H, Nq, Nk, D, dtype, device, ties=True, seed=2)
    g = torch.Generator().manual_seed(3)
    mask = torch.rand(B, Nk, generator=g) < 0.4
    mask[1] = True  # a row with every key masked: output 0
    w = (torch.rand(Nk, generator=g, dtype=torch.float64) + 0.2).to(dtype)
    for kw in ({"key_padding_mask": mask.to(device)}, {"key_weights": w.to(device)},
               {"key_padding_mask": mask.to(device), "key_weights": w.to(device)}):
        if fn == "relu":
            out = sliced_relu_attention(zq, zk, v, **kw)
            ref = ref64(naive_sliced_relu, zq, zk, v, **{k: x.cpu() for k, x in kw.items()})
        else:
            out = sliced_relu_bump_attention(zq, zk, v, 0.7, **kw)
            ref = ref64(naive_sliced_bump, zq, zk, v, bandwidth=0.7,
                        **{k: x.cpu() for k, x in kw.items()})
        assert rel_err(out.cpu(), ref, v if fn == "bump" else None) <= TOL[dtype]
        if "key_padding_mask" in kw:
            assert bool((out[1] == 0).all())


def test_per_head_bandwidth_broadcasts():
    zq, zk, v = make(2, 3, 11, 13, 2, torch.float64, "cpu")
    b = torch.tensor([0.2, 1.0, 3.0], dtype=torch.float64)
    out = sliced_relu_bump_attention(zq, zk, v, b)
    for h in range(3):
        ref = naive_sliced_bump(zq[:, h], zk[:, h], v[:, h], float(b[h]))
        assert torch.allclose(out[:, h], ref, rtol=0, atol=1e-13)


@given(
    B=st.integers(1, 2), H=st.integers(1, 3), Nq=st.integers(1, 40), Nk=st.integers(1, 40),
    D=st.integers(1, 4), scale=st.sampled_from([0.5, 2.0, 1e3]), quant=st.booleans(),
    seed=st.integers(0, 10_000),
)
def test_property_random_shapes_ties_and_scales(B, H, Nq, Nk, D, scale, quant, seed):
    g = torch.Generator().manual_seed(seed)
    zq = torch.randn(B, H, Nq, generator=g, dtype=torch.float64) * scale + 3 * scale
    zk = torch.randn(B, H, Nk, generator=g, dtype=torch.float64) * scale + 3 * scale
    if quant:
        zq, zk = zq.round(), zk.round()
    v = torch.randn(B, H, Nk, D, generator=g, dtype=torch.float64)
    for dt in (torch.float32, torch.float64):
        a = [t.to(dt) for t in (zq, zk, v)]
        ref = naive_sliced_relu(*[t.double() for t in a])
        if float(ref.abs().max()) > 0:
            assert rel_err(sliced_relu_attention(*a), ref) <= TOL[dt]
        refb = naive_sliced_bump(*[t.double() for t in a], bandwidth=scale)
        assert rel_err(sliced_relu_bump_attention(*a, scale), refb, a[2]) <= TOL[dt]


# ---------------------------------------------------------------------------------- grads
def _grads(fn, inputs, g):
    ins = [t.detach().clone().requires_grad_() for t in inputs]
    (fn(*ins) * g).sum().backward()
    return [t.grad for t in ins]


@pytest.mark.parametrize("ties", [False, True], ids=["distinct", "ties"])
@pytest.mark.parametrize("kw", [{}, {"centered": False}, {"mask": True}, {"weights": True}],
                         ids=["eq3", "eq2", "mask", "weights"])
def test_relu_gradients_match_autograd_of_naive(ties, kw, device):
    B, H, Nq, Nk, D = 2, 2, 19, 23, 3
    zq, zk, v = make(B, H, Nq, Nk, D, torch.float64, device, ties=ties, seed=4)
    gen = torch.Generator().manual_seed(5)
    extra = {}
    if kw.get("mask"):
        extra["key_padding_mask"] = (torch.rand(B, Nk, generator=gen) < 0.3).to(device)
    if kw.get("weights"):
        extra["key_weights"] = (torch.rand(Nk, generator=gen, dtype=torch.float64) + 0.1).to(device)
    c = kw.get("centered", True)
    g = torch.randn(B, H, Nq, D, generator=gen, dtype=torch.float64).to(device)
    ours = _grads(lambda a, b, x: sliced_relu_attention(a, b, x, centered=c, **extra), (zq, zk, v), g)
    ref = _grads(lambda a, b, x: naive_sliced_relu(a, b, x, centered=c, **extra), (zq, zk, v), g)
    for a, b in zip(ours, ref, strict=True):
        assert rel_err(a.cpu(), b.cpu()) <= 1e-10


@pytest.mark.parametrize("ties", [False, True], ids=["distinct", "ties"])
@pytest.mark.parametrize("kw", [{}, {"mask": True}, {"weights": True}], ids=["plain", "mask", "weights"])
def test_bump_gradients_match_autograd_of_naive(ties, kw, device):
    B, H, Nq, Nk, D = 2, 3, 17, 21, 2
    zq, zk, v = make(B, H, Nq, Nk, D, torch.float64, device, ties=ties, seed=6)
    gen = torch.Generator().manual_seed(7)
    b = (torch.rand(H, generator=gen, dtype=torch.float64) + 0.5).to(device)
    extra = {}
    if kw.get("mask"):
        extra["key_padding_mask"] = (torch.rand(B, Nk, generator=gen) < 0.3).to(device)
    if kw.get("weights"):
        extra["key_weights"] = (torch.rand(Nk, generator=gen, dtype=torch.float64) + 0.1).to(device)
    g = torch.randn(B, H, Nq, D, generator=gen, dtype=torch.float64).to(device)
    ours = _grads(lambda a, c, x, bw: sliced_relu_bump_attention(a, c, x, bw, **extra), (zq, zk, v, b), g)
    ref = _grads(lambda a, c, x, bw: naive_sliced_bump(a, c, x, bw, **extra), (zq, zk, v, b), g)
    for a, r in zip(ours, ref, strict=True):
        assert rel_err(a.cpu(), r.cpu()) <= 1e-10


@pytest.mark.parametrize("fn", ["relu", "bump"])
def test_float32_gradients_match_float64_naive(fn, device):
    # float32 takes the merged radix ranking path, including the transposed ranks
    B, H, Nq, Nk, D = 2, 2, 300, 257, 4
    zq, zk, v = make(B, H, Nq, Nk, D, torch.float64, device, ties=True, seed=12)
    mask = (torch.rand(B, Nk, generator=torch.Generator().manual_seed(13)) < 0.2).to(device)
    g = torch.randn(B, H, Nq, D, generator=torch.Generator().manual_seed(14), dtype=torch.float64)
    g = g.to(device)
    if fn == "relu":
        f = lambda a, b, x: sliced_relu_attention(a, b, x, key_padding_mask=mask)  # noqa: E731
        r = lambda a, b, x: naive_sliced_relu(a, b, x, key_padding_mask=mask)  # noqa: E731
    else:
        f = lambda a, b, x: sliced_relu_bump_attention(a, b, x, 0.6, key_padding_mask=mask)  # noqa: E731
        r = lambda a, b, x: naive_sliced_bump(a, b, x, 0.6, key_padding_mask=mask)  # noqa: E731
    ours = _grads(f, [t.float() for t in (zq, zk, v)], g.float())
    ref = _grads(r, [t.float().double() for t in (zq, zk, v)], g.float().double())
    for a, b in zip(ours, ref, strict=True):
        assert rel_err(a.cpu(), b.cpu()) <= 1e-5


def test_gradcheck_float64():
    gen = torch.Generator().manual_seed(8)
    zq = torch.randn(2, 2, 7, generator=gen, dtype=torch.float64, requires_grad=True)
    zk = torch.randn(2, 2, 9, generator=gen, dtype=torch.float64, requires_grad=True)
    v = torch.randn(2, 2, 9, 3, generator=gen, dtype=torch.float64, requires_grad=True)
    b = torch.tensor([0.9, 1.7], dtype=torch.float64, requires_grad=True)
    mask = torch.tensor([[False] * 8 + [True], [True] + [False] * 8])
    w = torch.rand(9, generator=gen, dtype=torch.float64) + 0.5
    assert torch.autograd.gradcheck(lambda a, c, x: sliced_relu_attention(a, c, x), (zq, zk, v))
    assert torch.autograd.gradcheck(
        lambda a, c, x: sliced_relu_attention(a, c, x, centered=False, key_padding_mask=mask,
                                              key_weights=w), (zq, zk, v))
    assert torch.autograd.gradcheck(lambda a, c, x, bw: sliced_relu_bump_attention(a, c, x, bw),
                                    (zq, zk, v, b))
    assert torch.autograd.gradcheck(
        lambda a, c, x: sliced_relu_bump_attention(a, c, x, 1.3, key_padding_mask=mask, key_weights=w),
        (zq, zk, v))


def test_partial_requires_grad():
    zq, zk, v = make(1, 2, 8, 9, 3, torch.float64, "cpu")
    for i in range(3):
        ins = [zq, zk, v]
        ins[i] = ins[i].clone().requires_grad_()
        sliced_relu_attention(*ins).sum().backward()
        sliced_relu_bump_attention(*ins, 0.8).sum().backward()
        assert ins[i].grad is not None and bool(torch.isfinite(ins[i].grad).all())


# ------------------------------------------------------------------------ degenerate cases
def test_all_equal_scores_give_zero_and_finite_gradients(dtype):
    zq = torch.full((1, 2, 5), 0.3, dtype=dtype, requires_grad=True)
    zk = torch.full((1, 2, 6), 0.3, dtype=dtype, requires_grad=True)
    v = torch.randn(1, 2, 6, 4, dtype=dtype, requires_grad=True)
    out = sliced_relu_attention(zq, zk, v)
    assert bool((out == 0).all())  # zero denominator: documented result 0
    out.sum().backward()
    for t in (zq, zk, v):
        assert bool(torch.isfinite(t.grad).all())
    # the bump at all-equal scores is the mean of the values
    outb = sliced_relu_bump_attention(zq, zk, v, 0.5)
    assert torch.allclose(outb, v.mean(-2, keepdim=True).expand_as(outb), rtol=0, atol=1e-6)


def test_no_nq_by_nk_tensor_is_formed(monkeypatch):
    # every torch allocation of the forward and backward pass must be O(N_q + N_k)
    N = 3000
    zq, zk, v = make(1, 1, N, N, 2, torch.float64, "cpu")
    zq.requires_grad_()
    zk.requires_grad_()
    v.requires_grad_()
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        sliced_relu_attention(zq, zk, v).sum().backward()
        sliced_relu_bump_attention(zq, zk, v, 0.5).sum().backward()
    biggest = max(e.cpu_memory_usage for e in prof.events() if e.cpu_memory_usage > 0)
    assert biggest < 64 * N * 8  # bytes; an N x N float64 matrix would be 72 MB


@pytest.mark.parametrize("fn", ["relu", "bump"])
def test_chunked_tables_and_blocked_scans_agree(fn, monkeypatch):
    # force several row chunks, several gather steps and the blocked scan of block totals,
    # in the forward and the backward pass
    B, H, N, D = 2, 2, 1500, 3
    zq, zk, v = make(B, H, N, N - 5, D, torch.float64, "cpu", ties=True, seed=9)
    g = torch.randn(B, H, N, D, generator=torch.Generator().manual_seed(1), dtype=torch.float64)

    def run():
        attention = sliced_relu_attention if fn == "relu" else lambda *ins: sliced_relu_bump_attention(*ins, 0.2)
        return output_and_grads(attention, (zq, zk, v), g)

    ref = run()
    with monkeypatch.context() as mp:  # one chunk of rows, blocked scans of the block totals
        mp.setattr(S, "_CUMSUM_BLOCKS", 4)
        mp.setattr(S, "_SCAN_BLOCK", 16)
        for a, b in zip(run(), ref, strict=True):
            assert torch.allclose(a, b, rtol=0, atol=1e-12 * float(b.abs().max()))
    monkeypatch.setattr(SL, "_TABLE_BYTES", 1)
    monkeypatch.setattr(SL, "_STEP", 100)
    monkeypatch.setattr(S, "_BUILD_BYTES", 4096)
    monkeypatch.setattr(S, "_CUMSUM_BLOCKS", 4)
    monkeypatch.setattr(S, "_SCAN_BLOCK", 8)
    for a, b in zip(run(), ref, strict=True):
        assert torch.allclose(a, b, rtol=0, atol=1e-12 * float(b.abs().max()))
    with torch.no_grad():
        out = (sliced_relu_attention(zq, zk, v) if fn == "relu"
               else sliced_relu_bump_attention(zq, zk, v, 0.2))
    naive = (naive_sliced_relu(zq, zk, v) if fn == "relu" else naive_sliced_bump(zq, zk, v, 0.2))
    assert rel_err(out, naive) <= 1e-10


def test_large_n_float32_accuracy_against_float64_naive():
    # N = 2^16 keys in float32: sampled queries against the exact float64 sum over all keys
    N, D = 1 << 15, 8
    g = torch.Generator().manual_seed(10)
    zq = torch.randn(1, 1, N, generator=g)
    zk = torch.randn(1, 1, N, generator=g)
    v = torch.randn(1, 1, N, D, generator=g) + 1.0
    with torch.no_grad():
        out = sliced_relu_attention(zq, zk, v)
        outb = sliced_relu_bump_attention(zq, zk, v, 0.1)
    idx = torch.randint(0, N, (64,), generator=g)
    ref = naive_sliced_relu(zq[..., idx].double(), zk.double(), v.double())
    refb = naive_sliced_bump(zq[..., idx].double(), zk.double(), v.double(), 0.1)
    assert rel_err(out[..., idx, :], ref) <= 1e-5
    assert rel_err(outb[..., idx, :], refb) <= 1e-5


@pytest.mark.parametrize("with_probes", [True, False])
def test_merged_radix_ranking_matches_searchsorted(with_probes):
    g = torch.Generator().manual_seed(11)
    items = (torch.randn(3, 50, generator=g) * 2).round() / 2
    items[0, :5] = 0.0
    items[0, 5:8] = -0.0
    items[1, :4] = math.inf
    probes = (torch.randn(3, 30, generator=g) * 2).round() / 2
    probes[0, :3] = -0.0
    pr = [(probes, "left"), (probes, "right")] if with_probes else []
    o32, s32, c32, t32, p32 = S.sort_and_rank(items, pr, transpose=True)  # merged radix path
    o64, s64, c64, t64, p64 = S.sort_and_rank(items.double(), [(p.double(), sd) for p, sd in pr],
                                              transpose=True)
    assert torch.equal(s32.double(), s64)
    assert torch.equal(items.gather(1, o32), s32)
    for a, b in zip(c32 + t32, c64 + t64, strict=True):
        assert torch.equal(a, b)
    if with_probes:
        assert torch.equal(probes.gather(1, p32), probes.gather(1, p64))
        # the transposed counts, written out: probes <= item ("left") and < item ("right")
        assert torch.equal(t32[0], (probes.unsqueeze(1) <= items.unsqueeze(2)).sum(-1))
        assert torch.equal(t32[1], (probes.unsqueeze(1) < items.unsqueeze(2)).sum(-1))


# -------------------------------------------------------------------------------- errors
def test_errors_are_clear():
    zq, zk, v = make(1, 2, 5, 6, 3, torch.float32, "cpu")
    with pytest.raises(ValueError, match="shape mismatch|expected zq"):
        sliced_relu_attention(zq, zk, v[..., :5, :])
    with pytest.raises(ValueError, match="expected zq of shape"):
        sliced_relu_attention(zq, zk[0], v)
    with pytest.raises(TypeError, match="share one dtype"):
        sliced_relu_attention(zq, zk.double(), v)
    with pytest.raises(TypeError, match="float32 or float64"):
        sliced_relu_attention(zq.long(), zk, v)
    bad = zq.clone()
    bad[0, 0, 1] = float("nan")
    with pytest.raises(ValueError, match="zq: expected finite scores, found 1"):
        sliced_relu_attention(bad, zk, v)
    bad = zk.clone()
    bad[0, 1, 0] = float("inf")
    with pytest.raises(ValueError, match="zk: expected finite"):
        sliced_relu_bump_attention(zq, bad, v, 1.0)
    for b in (0.0, -1.0, float("nan"), torch.tensor([1.0, -2.0])):
        with pytest.raises(ValueError, match="bandwidth: expected finite values > 0"):
            sliced_relu_bump_attention(zq, zk, v, b)
    with pytest.raises(ValueError, match="bandwidth: expected a number or a shape"):
        sliced_relu_bump_attention(zq, zk, v, torch.ones(5))
    with pytest.raises(TypeError, match="key_padding_mask: expected a bool"):
        sliced_relu_attention(zq, zk, v, key_padding_mask=torch.zeros(1, 6))
    with pytest.raises(ValueError, match="key_padding_mask: expected shape"):
        sliced_relu_attention(zq, zk, v, key_padding_mask=torch.zeros(1, 5, dtype=torch.bool))
    with pytest.raises(ValueError, match="key_weights: expected finite weights >= 0"):
        sliced_relu_attention(zq, zk, v, key_weights=-torch.ones(6))
    with pytest.raises(ValueError, match="at least one key"):
        sliced_relu_attention(zq, zk[..., :0], v[..., :0, :])


def test_empty_queries_and_batches():
    zq, zk, v = make(1, 2, 0, 6, 3, torch.float32, "cpu")
    assert sliced_relu_attention(zq, zk, v).shape == (1, 2, 0, 3)
    assert sliced_relu_bump_attention(zq, zk, v, 1.0).shape == (1, 2, 0, 3)
