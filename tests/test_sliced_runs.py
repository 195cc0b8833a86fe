"""The sorted-run decode cache of causal sliced attention (opsplit/functional/sliced_runs.py,
the logarithmic method): every decode step against the direct O(n) formula of paper 004
(tests/sliced_reference.py, float64) and against the causal kernel recomputing the whole
sequence, with left padding, key weights, eqs. 2, 3 and 7; float32 within the forward
kernels' tolerance; a property over magnitudes; the KV cache of DecoderLM and
AttentionDecoder using it (greedy text equal to recomputation, the padding of cached tokens
checked, rows dropped, autograd); the memory constant."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from opsplit.analysis.formulas import causal_rescaled, naive_sliced_bump, naive_sliced_relu
from opsplit.functional import causal_sliced_relu_attention, causal_sliced_relu_bump_attention
from opsplit.functional.sliced_runs import BLOCK, TAIL, SlicedDecodeCache
from opsplit.models import AttentionDecoder, DecoderConfig, DecoderLM, TokenClassifier
from opsplit.operators import KVCache

F32, F64 = torch.float32, torch.float64
KINDS = ["eq3", "eq2", "eq7"]


def _seq(B, H, T, D, seed, dtype=F64, device="cpu", pads=True):
    g = torch.Generator().manual_seed(seed)
    zq, zk = torch.randn(B, H, T, generator=g, dtype=F64), torch.randn(B, H, T, generator=g, dtype=F64)
    v = torch.randn(B, H, T, D, generator=g, dtype=F64) + 0.5
    w = 0.1 + torch.rand(B, 1, T, generator=g, dtype=F64)  # quadrature-like weights
    if pads:
        w[-1, :, : min(5, T - 1)] = 0  # the last sample left-padded
    return [x.to(dtype=dtype, device=device) for x in (zq, zk, v, w)]


def _bw(H, dtype, device="cpu"):
    return torch.linspace(0.6, 1.8, H, dtype=dtype, device=device)


def _naive_last(kind, zq, zk, v, w, b):
    """The new query (the last position) over every key, by the direct formula (float64)."""
    a = [x.double() for x in (zq[..., -1:], zk, v)]
    if kind == "eq7":
        return naive_sliced_bump(*a, b.double(), key_weights=w.double())
    return naive_sliced_relu(*a, centered=kind == "eq3", key_weights=w.double())


def _step(cache, kind, zq, zk, v, w, b):
    if kind == "eq7":
        return cache.step_bump(zq, zk, v, b, key_weights=w)
    return cache.step_relu(zq, zk, v, key_weights=w, centered=kind == "eq3")


def _causal(kind, zq, zk, v, w, b):
    if kind == "eq7":
        return causal_sliced_relu_bump_attention(zq, zk, v, b, key_weights=w)
    return causal_sliced_relu_attention(zq, zk, v, key_weights=w, centered=kind == "eq3")


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("P", [1, 37, 5000])
def test_every_decode_step_equals_recomputation(P, kind, device):
    """64 decode steps after a prompt of P tokens (B = 2, H = 2, D = 3; the second sample
    left-padded, all keys weighted): every step's output equals the direct formula over the
    whole prefix (float64, 1e-12 of max|v|), and the last step the causal kernel recomputing
    the whole sequence; the prompt's outputs are the causal kernel's."""
    H = 2
    zq, zk, v, w = _seq(2, H, P + 64, 3, seed=P, device=device)
    b = _bw(H, F64, device)
    scale = float(v.abs().max())
    cache = SlicedDecodeCache()
    with torch.no_grad():
        out = _step(cache, kind, zq[..., :P], zk[..., :P], v[:, :, :P], w[..., :P], b)
        assert torch.equal(out, _causal(kind, zq[..., :P], zk[..., :P], v[:, :, :P], w[..., :P], b))
        worst = 0.0
        for t in range(P, P + 64):
            s = slice(t, t + 1)
            out = _step(cache, kind, zq[..., s], zk[..., s], v[:, :, s], w[..., s], b)
            ref = _naive_last(kind, zq[..., : t + 1], zk[..., : t + 1], v[:, :, : t + 1], w[..., : t + 1], b)
            worst = max(worst, float((out - ref).abs().max()))
        full = _causal(kind, zq, zk, v, w, b)[..., -1:, :]
    assert worst <= 1e-12 * scale, worst / scale
    assert float((out - full).abs().max()) <= 1e-12 * scale
    assert cache.length == P + 64


@pytest.mark.parametrize("kind", KINDS)
def test_chunked_steps_and_queries(kind):
    """Steps of several new tokens (each sees the cached keys and the new ones up to its own)
    equal the causal kernel on the whole sequence; queries that see every key (relu, bump)
    equal the direct formula; keys appended without queries."""
    H = 2
    zq, zk, v, w = _seq(2, H, 150, 4, seed=3)
    b = _bw(H, F64)
    full = _causal(kind, zq, zk, v, w, b)
    cache = SlicedDecodeCache()
    with torch.no_grad():
        t = 0
        for m in (10, 3, 1, 29, 1, 1, 40, 66):  # tail merges and run merges in between
            s = slice(t, t + m)
            out = _step(cache, kind, zq[..., s], zk[..., s], v[:, :, s], w[..., s], b)
            torch.testing.assert_close(out, full[..., s, :], rtol=0, atol=1e-12)
            t += m
        q = torch.randn(2, H, 5, dtype=F64)
        if kind == "eq7":
            got, ref = cache.bump(q, b), naive_sliced_bump(q, zk, v, b, key_weights=w)
        else:
            got = cache.relu(q, centered=kind == "eq3")
            ref = naive_sliced_relu(q, zk, v, centered=kind == "eq3", key_weights=w)
        torch.testing.assert_close(got, ref, rtol=0, atol=1e-12)
        c2 = SlicedDecodeCache()
        for a in range(0, 150, 50):
            c2.append(zk[..., a: a + 50], v[:, :, a: a + 50], key_weights=w[..., a: a + 50])
        got2 = c2.bump(q, b) if kind == "eq7" else c2.relu(q, centered=kind == "eq3")
        torch.testing.assert_close(got2, ref, rtol=0, atol=1e-12)


@pytest.mark.parametrize("kind", KINDS)
def test_float32_steps_within_the_kernels_tolerance(kind):
    """Float32 steps after a prompt of 300 tokens: within 1e-5 of max|v| of the float64
    formula on the same rounded inputs (the forward kernels' tolerance)."""
    H = 3
    zq, zk, v, w = _seq(2, H, 340, 8, seed=11, dtype=F32)
    b = _bw(H, F32)
    cache = SlicedDecodeCache()
    with torch.no_grad():
        _step(cache, kind, zq[..., :300], zk[..., :300], v[:, :, :300], w[..., :300], b)
        for t in range(300, 340):
            s = slice(t, t + 1)
            out = _step(cache, kind, zq[..., s], zk[..., s], v[:, :, s], w[..., s], b)
            ref = _naive_last(kind, zq[..., : t + 1], zk[..., : t + 1], v[:, :, : t + 1], w[..., : t + 1], b)
            assert out.dtype == F32
            assert float((out.double() - ref).abs().max()) <= 1e-5 * float(v.abs().max())


EXP = st.one_of(st.sampled_from([-36, -30, -19, 0, 19, 30, 36]), st.integers(-36, 36))


@settings(max_examples=30)
@given(e_z=EXP, e_v=EXP, e_w=st.sampled_from([0, 10, 30]), P=st.sampled_from([1, 5, 40, 130]),
       steps=st.integers(1, 40), kind=st.sampled_from(KINDS), order=st.sampled_from(["random", "growing"]),
       f32=st.booleans(), seed=st.integers(0, 10**6))
def test_decode_steps_over_magnitudes(e_z, e_v, e_w, P, steps, kind, order, f32, seed):
    """Scores scaled by 10^e_z (the bandwidth with them), values by 10^e_v, key weights
    10^U(-e_w, e_w) (random or growing along the sequence, some 0): every decode step is
    finite and equals the direct float64 formula (each query's weights divided by the largest
    it sees) within the dtype's tolerance of max|v|."""
    dt = F32 if f32 else F64
    T = P + steps
    zq, zk, v, _ = _seq(1, 2, T, 3, seed=seed, pads=False)
    g = torch.Generator().manual_seed(seed + 1)
    w = 10.0 ** (torch.rand(1, 2, T, generator=g, dtype=F64) * 2 * e_w - e_w)
    if order == "growing":
        w = w.sort(-1)[0]
    w = w * (torch.rand(1, 2, T, generator=g, dtype=F64) > 0.2)
    zq, zk, b = zq * 10.0**e_z, zk * 10.0**e_z, _bw(2, F64) * 10.0**e_z
    v = v * 10.0**e_v
    zq, zk, v, w, b = (x.to(dt) for x in (zq, zk, v, w, b))
    cache = SlicedDecodeCache()
    ref_fn = {"eq7": lambda *a: causal_rescaled(naive_sliced_bump, *a, bandwidth=b.double()),
              "eq3": lambda *a: causal_rescaled(naive_sliced_relu, *a),
              "eq2": lambda *a: causal_rescaled(naive_sliced_relu, *a, centered=False)}[kind]
    with torch.no_grad():
        _step(cache, kind, zq[..., :P], zk[..., :P], v[:, :, :P], w[..., :P], b)
        outs = [_step(cache, kind, zq[..., t: t + 1], zk[..., t: t + 1], v[:, :, t: t + 1], w[..., t: t + 1], b)
                for t in range(P, T)]
    out = torch.cat(outs, -2).double()
    assert bool(torch.isfinite(out).all())
    ref = ref_fn(zq.double()[..., P:], zk.double(), v.double(), w.double())
    tol = 1e-5 if f32 else 1e-10
    assert float((out - ref).abs().max()) <= tol * float(v.double().abs().max())


def test_bump_with_a_bandwidth_far_below_the_spread():
    """b far below the spread of the scores (spread / b ~ 1e9): the window differences of the
    tables would cancel, so the windows are summed pair by pair (exact), with ties so that
    windows are not empty."""
    zq, zk, v, w = _seq(1, 2, 260, 3, seed=5)
    zk = zk.round()
    zq = zk + 1e-9 * torch.randn(zk.shape, dtype=F64, generator=torch.Generator().manual_seed(1))
    b = torch.tensor([3e-9, 1e-9], dtype=F64)
    cache = SlicedDecodeCache()
    with torch.no_grad():
        cache.append(zk[..., :250], v[:, :, :250], key_weights=w[..., :250])
        for t in range(250, 260):
            s = slice(t, t + 1)
            out = cache.step_bump(zq[..., s], zk[..., s], v[:, :, s], b, key_weights=w[..., s])
            ref = _naive_last("eq7", zq[..., : t + 1], zk[..., : t + 1], v[:, :, : t + 1], w[..., : t + 1], b)
            assert float(ref.abs().max()) > 1e-3  # the windows hold keys
            torch.testing.assert_close(out, ref, rtol=0, atol=1e-12)


def test_runs_are_the_binary_decomposition_and_memory():
    """The runs are the set bits of n (after the tail of up to TAIL keys), each sorted by
    score; the bytes held are (D + 2) per key in the dtype plus 2 float64 and the tables
    (2D in the dtype + 2 float64 per BLOCK keys): float32, D = 64, BLOCK = 8: 5D + 22 =
    342 bytes per key and head, 2.67 x the softmax cache of a 4-head model of width 64."""
    cache = SlicedDecodeCache()
    zk, v = torch.randn(1, 4, 1000), torch.randn(1, 4, 1000, 64)
    with torch.no_grad():
        cache.append(zk, v)
        assert [L for _, L in cache.runs] == [512, 256, 128, 64, 32, 8] and cache.nt == 0
        for _ in range(40):
            cache.append(torch.randn(1, 4, 1), torch.randn(1, 4, 1, 64))
        assert cache.length == 1040 and cache.n + cache.nt == 1040 and cache.nt <= TAIL
        assert [L for _, L in cache.runs] == [1 << k for k in range(10, -1, -1) if (cache.n >> k) & 1]
        for o, L in cache.runs:
            zr = cache.z[4 * o: 4 * (o + L)].view(4, L)
            assert bool((zr[:, 1:] >= zr[:, :-1]).all())
    assert BLOCK == 8
    per_key = cache.nbytes() - cache.nt * 4 * (2 + 64) * 4
    assert per_key == 4 * (cache.n * (4 + 16 + 64 * 4) + (cache.n // 8) * (16 + 2 * 64 * 4))
    per_token_layer = 4 * (5 * 64 + 22)  # 4 heads
    softmax = 2 * 64 * 4  # keys and values, float32
    assert per_token_layer / softmax == pytest.approx(2.67, abs=0.01)


def test_select_keeps_rows():
    """select(index) keeps batch rows: later steps equal those of a cache of those rows alone."""
    zq, zk, v, w = _seq(3, 2, 90, 3, seed=8)
    a, b = SlicedDecodeCache(), SlicedDecodeCache()
    keep = torch.tensor([2, 0])
    with torch.no_grad():
        a.step_relu(zq[..., :70], zk[..., :70], v[:, :, :70], key_weights=w[..., :70])
        b.step_relu(zq[keep, :, :70], zk[keep, :, :70], v[keep, :, :70], key_weights=w[keep, :, :70])
        a.select(keep)
        for t in range(70, 90):
            s = slice(t, t + 1)
            oa = a.step_relu(zq[keep][..., s], zk[keep][..., s], v[keep][:, :, s], key_weights=w[keep][..., s])
            ob = b.step_relu(zq[keep][..., s], zk[keep][..., s], v[keep][:, :, s], key_weights=w[keep][..., s])
            torch.testing.assert_close(oa, ob, rtol=0, atol=1e-13)


def test_select_with_a_mask_and_repeated_rows():
    """Issue 42: a bool mask keeps the rows it marks (it was read as the indices 0 and 1), and a
    repeated index duplicates a row: later steps equal those of a cache of those rows alone."""
    zq, zk, v, w = _seq(3, 2, 90, 3, seed=9)
    for index, keep in ((torch.tensor([True, False, True]), torch.tensor([0, 2])),
                        (torch.tensor([1, 1, 0]), torch.tensor([1, 1, 0]))):
        a, b = SlicedDecodeCache(), SlicedDecodeCache()
        with torch.no_grad():
            a.step_relu(zq[..., :70], zk[..., :70], v[:, :, :70], key_weights=w[..., :70])
            b.step_relu(zq[keep, :, :70], zk[keep, :, :70], v[keep, :, :70], key_weights=w[keep, :, :70])
            a.select(index)
            assert a.batch_size == len(keep)
            for t in range(70, 80):
                s = slice(t, t + 1)
                args = (zq[keep][..., s], zk[keep][..., s], v[keep][:, :, s])
                oa = a.step_relu(*args, key_weights=w[keep][..., s])
                ob = b.step_relu(*args, key_weights=w[keep][..., s])
                torch.testing.assert_close(oa, ob, rtol=0, atol=1e-13)


def test_float32_cache_with_weights_1e30_apart_keeps_the_light_keys():
    """Issue 42: a float32 cache whose key weights span 1e-30 .. 1e30 (beyond float32's range of
    products) moves its block tables to float64, exactly, when such weights arrive (nbytes
    counts 8 bytes per table entry then); a query on the heavy key reads the light keys' share,
    which is all of its denominator: eq. 2 equals the exact value (the light keys' mean value
    weighted by their distances) after 100 steps, through the runs and the tail."""
    g = torch.Generator().manual_seed(3)
    N = 100
    zk = torch.rand(1, 1, N, generator=g) * 0.5  # the light keys below 1
    v = torch.randn(1, 1, N, 2, generator=g)
    w = torch.full((1, 1, N), 1e-30)
    zk[..., 10], w[..., 10] = 1.0, 1e30  # the heavy key at 1
    c = SlicedDecodeCache()
    with torch.no_grad():
        c.step_relu(zk[..., :8], zk[..., :8], v[:, :, :8], key_weights=w[..., :8], centered=False)
        assert c.pv_dtype == torch.float32 or c.Pv is None
        for t in range(8, N):
            s = slice(t, t + 1)
            c.step_relu(zk[..., s], zk[..., s], v[:, :, s], key_weights=w[..., s], centered=False)
        assert c.pv_dtype == torch.float64 and c.Pv.dtype == torch.float64
        assert c.n >= 64 and max(L for _, L in c.runs) >= 64  # block tables in use
        out = c.relu(torch.ones(1, 1, 1), centered=False)
    d = (1 - zk.double()).clamp_min(0) * (w.double() < 1)  # the light keys' distances to the query
    want = (d.unsqueeze(-1) * v.double()).sum(2) / d.sum(2).unsqueeze(-1)
    torch.testing.assert_close(out[0, 0, 0].double(), want[0, 0], rtol=0, atol=8 * torch.finfo(torch.float32).eps)
    D = 2
    per_key = c.nbytes() - c.nt * (2 + D) * 4
    assert per_key == c.n * (4 + 16 + D * 4) + (c.n // 8) * (16 + 2 * D * 8)


# -- the KV cache of the models ---------------------------------------------------------------
def _sliced_lm(scheme="lie", dtype=F64, heads=2):
    cfg = DecoderConfig(vocab_size=23, d_model=16, n_layers=2, n_heads=heads, d_ff=32, norm="layer", mlp="plain",
                        activation="gelu", positions="learned", max_positions=200, attention="sliced_relu",
                        scheme=scheme)
    return DecoderLM(cfg, generator=torch.Generator().manual_seed(4), dtype=dtype).eval()


@pytest.mark.parametrize("scheme", ["lie", "strang", "parallel"])
def test_greedy_text_with_the_runs_equals_recomputation(scheme):
    """DecoderLM(attention="sliced_relu"), Lie and Strang: greedy generation of 128 tokens with
    the cache (sorted runs: its entries are SlicedDecodeCache states) equals generation that
    recomputes the sequence at every step, token for token, on a left-padded batch."""
    m = _sliced_lm(scheme)
    ids = torch.randint(3, 23, (2, 9), generator=torch.Generator().manual_seed(2))
    mask = torch.ones(2, 9, dtype=torch.long)
    mask[1, :4] = 0
    with torch.no_grad():
        a = m.generate(ids, 128, attention_mask=mask)
        b = m.generate(ids, 128, attention_mask=mask, use_cache=False)
    assert torch.equal(a, b)
    assert len(set(a[:, 9:].flatten().tolist())) >= 4


@pytest.mark.parametrize("attention", ["sliced_relu", "sliced_bump"])
def test_attention_decoder_keeps_sorted_runs(attention):
    """AttentionDecoder + TokenClassifier with sliced terms: under no_grad the cache holds
    sorted runs, and every step's logits equal the whole sequence's (float64, 1e-11) and
    those of the old cache (scores and values, KVCache(sorted_runs=False))."""
    g = torch.Generator().manual_seed(6)
    enc = AttentionDecoder(16, 2, 32, attention=attention, n_steps=2, causal=True, generator=g, dtype=F64)
    m = TokenClassifier(23, 23, enc, generator=g, dtype=F64).eval()
    seq = torch.randint(0, 23, (2, 40), generator=torch.Generator().manual_seed(1))
    new, old = KVCache(), KVCache(sorted_runs=False)
    with torch.no_grad():
        for step in range(40):
            x = seq if step == 0 else seq[:, -1:]
            a, b = m.next_token_logits(x, cache=new), m.next_token_logits(x, cache=old)
            torch.testing.assert_close(a, m(seq)[:, -1], rtol=0, atol=1e-11)
            torch.testing.assert_close(a, b, rtol=0, atol=1e-11)
            seq = torch.cat([seq, a.argmax(-1, keepdim=True)], 1)
    assert new._states and not new._entries and old._entries and not old._states


def test_cache_refuses_changed_padding_and_autograd_after_runs():
    """The padding of cached tokens is in the runs' key weights: a later call that pads them
    differently is refused, naming the mask; a cache of sorted runs cannot continue under
    autograd; under autograd the cache keeps differentiable scores and values."""
    m = _sliced_lm()
    ids = torch.randint(3, 23, (2, 6), generator=torch.Generator().manual_seed(2))
    mask = torch.ones(2, 6, dtype=torch.long)
    mask[1, :2] = 0
    cache = KVCache()
    with torch.no_grad():
        m.next_token_logits(ids, mask, cache=cache)
        moved = torch.ones(2, 7, dtype=torch.long)
        moved[1, :3] = 0
        with pytest.raises(ValueError, match="key_padding_mask: the padding of the 6 cached tokens differs"):
            m.next_token_logits(ids[:, :1], moved, cache=cache)
    cache = KVCache()
    with torch.no_grad():
        m.next_token_logits(ids, cache=cache)
    with pytest.raises(RuntimeError, match="keeps sorted runs built without autograd"):
        m.next_token_logits(ids[:, :1], cache=cache)
    cache = KVCache()
    m.next_token_logits(ids, cache=cache).sum().backward()
    assert cache._entries and not cache._states


def test_sorted_runs_refuse_autograd():
    cache = SlicedDecodeCache()
    zk = torch.randn(1, 2, 4, requires_grad=True)
    with pytest.raises(RuntimeError, match="not differentiable"):
        cache.append(zk, torch.randn(1, 2, 4, 3))


@pytest.mark.parametrize("kind", ["relu", "bump"])
@pytest.mark.parametrize("n", [200, 1000])
def test_prefill_runs_take_the_forward_sort(kind, n):
    """The prefill builds its runs from the causal forward's sorts (no run of BASE keys or more
    is sorted again): the same runs as appending the keys to an empty cache, bit for bit."""
    from opsplit.functional.sliced_causal import BASE, keep_sorts

    g = torch.Generator().manual_seed(n)
    zq, zk = torch.randn(2, 3, n, generator=g, dtype=torch.float64), torch.randn(2, 3, n, generator=g,
                                                                                   dtype=torch.float64)
    v = torch.randn(2, 3, n, 4, generator=g, dtype=torch.float64)
    with torch.no_grad(), keep_sorts() as sorts:
        (causal_sliced_relu_attention if kind == "relu" else
         lambda *a: causal_sliced_relu_bump_attention(*a, 0.5))(zq, zk, v)
    big = [1 << k for k in range(11) if (n >> k) & 1 and (1 << k) >= BASE and (1 << k) < n]  # runs the forward sorts
    assert big and all(L in sorts for L in big), sorted(k for k in sorts if isinstance(k, int))
    a, b = SlicedDecodeCache(), SlicedDecodeCache()
    with torch.no_grad():
        if kind == "relu":
            a.step_relu(zq, zk, v)
        else:
            a.step_bump(zq, zk, v, 0.5)
        b.append(zk, v)
        assert a.runs == b.runs
        R, nr = 6, len(a.runs)
        for name, used in (("z", R * n), ("w1", R * n), ("wz", R * n), ("x", R * n), ("Ps", R * (n // BLOCK)),
                           ("Pv", R * (n // BLOCK))):
            assert torch.equal(getattr(a, name)[:used], getattr(b, name)[:used]), name
        for name in ("E", "F", "Tv"):
            assert torch.equal(getattr(a, name)[:, :nr], getattr(b, name)[:, :nr]), name


def test_prefill_runs_resort_where_the_forward_tied_scores():
    """Float32 scores 1e30 and 1e-30 apart in a row: the forward rescales the row by a power of
    two, the tiny scores underflow to one tied value and its order of them is arbitrary; the
    runs check it and sort the scores as they are."""
    from opsplit.functional.sliced_causal import keep_sorts

    n = 384  # runs of 256 (sorted: no level of the forward) and 128 (node 1 of the forward's level 128)
    g = torch.Generator().manual_seed(0)
    zk = (torch.randperm(n, generator=g).float() + 1) * 1e-30
    zk[0] = 1e30
    zk = zk.view(1, 1, n)
    v = torch.randn(1, 1, n, 2, generator=g)
    with torch.no_grad(), keep_sorts() as sorts:
        causal_sliced_relu_attention(zk.clone(), zk, v)
    tied = zk.view(1, n)[:, 256:].gather(1, sorts[128].view(1, 2, 128)[:, 1])
    assert not bool((tied[:, 1:] >= tied[:, :-1]).all())  # the forward's order is not the scores' order
    a, b = SlicedDecodeCache(), SlicedDecodeCache()
    with torch.no_grad():
        a.step_relu(zk.clone(), zk, v)
        b.append(zk, v)
    assert a.runs == b.runs
    run = a.z[256:n]  # the second run (one row), sorted by the scores as they are
    assert torch.equal(a.z[:n], b.z[:n]) and bool((run[1:] >= run[:-1]).all())
    assert torch.equal(a.x[:n], b.x[:n])
