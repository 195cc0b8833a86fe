"""Generation with opsplit's own causal decoders (AttentionDecoder + TokenClassifier with
softmax, causal sliced ReLU and causal sliced ReLU-bump attention): the key/value cache of
MultiHeadAttention and of the sliced operators, the O(n D) decode sums of causal sliced
attention against the divide-and-conquer kernel, cached generation against recomputing
the whole sequence at every step, left-padded batches against each sample run alone
(AttentionDecoder + TokenClassifier, and DecoderLM with causal sliced ReLU attention), the
frozen terms of the decode steps and the overflow guard of a decode step.  No Hugging Face
model here: the decode steps of the converted models are in tests/test_llm_decode_hf.py."""

from __future__ import annotations

import math

import pytest
import torch
from _decode_helpers import assert_decode_steps_equal_checked_call
from torch.autograd import gradcheck

from opsplit import Grid
from opsplit.functional import causal_sliced_relu_attention, causal_sliced_relu_bump_attention
from opsplit.functional.sliced_decode import (
    decode_sliced_relu_attention,
    decode_sliced_relu_bump_attention,
)
from opsplit.grid import Interval
from opsplit.models import AttentionDecoder, DecoderConfig, DecoderLM, TokenClassifier
from opsplit.operators import (
    FeedForward,
    FieldDropout,
    GatedFeedForward,
    GroupedQueryAttention,
    KVCache,
    MultiHeadAttention,
    PointwiseAffine,
    PreNorm,
    ProjectionS1,
    ProjectionSphere,
)
from opsplit.operators._fused import frozen_field, frozen_map
from opsplit.operators.context import ContextGrid

F64 = torch.float64


@pytest.mark.parametrize("Nq", [1, 3])
@pytest.mark.parametrize("centered", [True, False])
def test_decode_sums_equal_the_causal_kernel(Nq, centered):
    g = torch.Generator().manual_seed(Nq)
    zq, zk, v = torch.randn(2, 3, Nq, dtype=F64, generator=g), torch.randn(2, 3, 40, dtype=F64, generator=g), \
        torch.randn(2, 3, 40, 5, dtype=F64, generator=g)
    w = torch.rand(40, dtype=F64, generator=g)
    ref = causal_sliced_relu_attention(zq, zk, v, centered=centered, key_weights=w)
    out = decode_sliced_relu_attention(zq, zk, v, centered=centered, key_weights=w)
    torch.testing.assert_close(out, ref, rtol=0, atol=1e-12)
    b = torch.tensor([0.5, 1.0, 2.0], dtype=F64)
    ref = causal_sliced_relu_bump_attention(zq, zk, v, b, key_weights=w)
    torch.testing.assert_close(decode_sliced_relu_bump_attention(zq, zk, v, b, key_weights=w), ref, rtol=0, atol=1e-12)


def test_decode_sums_gradcheck():
    g = torch.Generator().manual_seed(9)
    zq = torch.randn(1, 2, 2, dtype=F64, generator=g, requires_grad=True)
    zk = torch.randn(1, 2, 6, dtype=F64, generator=g, requires_grad=True)
    v = torch.randn(1, 2, 6, 3, dtype=F64, generator=g, requires_grad=True)
    assert gradcheck(lambda a, b, c: decode_sliced_relu_attention(a, b, c), (zq, zk, v))
    bw = torch.tensor([1.5, 2.5], dtype=F64, requires_grad=True)
    assert gradcheck(lambda a, b, c, d: decode_sliced_relu_bump_attention(a, b, c, d), (zq, zk, v, bw))


def test_multihead_attention_cache_equals_full(device, dtype):
    torch.manual_seed(1)
    op = MultiHeadAttention.create(12, 3, causal=True, cache="kv", device=device, dtype=dtype)
    u = torch.randn(2, 6, 12, device=device, dtype=dtype)
    full = op.field(0.0, u, Grid.paper(6, 12))
    cache, parts = KVCache(), []
    for a, b in ((0, 2), (2, 5), (5, 6)):
        cache.begin()
        parts.append(op.field(0.0, u[:, a:b], ContextGrid.of(Grid.paper(b - a, 12), kv=cache)))
    torch.testing.assert_close(torch.cat(parts, 1), full, rtol=0, atol=1e-5 if dtype == torch.float32 else 1e-12)


def _lm(attention, dtype=F64, seed=0):
    g = torch.Generator().manual_seed(seed)
    enc = AttentionDecoder(16, 2, 32, attention=attention, n_steps=2, causal=True, generator=g, dtype=dtype)
    return TokenClassifier(23, 23, enc, generator=g, dtype=dtype).eval()


@pytest.mark.parametrize("attention", ["softmax", "sliced_relu", "sliced_bump", "none"])
def test_own_decoder_generation_cache_equals_recompute(attention):
    """(``"none"``: no attention term, nothing cached; the cache still counts the tokens, so
    that the masks of later steps are checked against the whole sequence.)"""
    m = _lm(attention)
    ids = torch.randint(0, 23, (3, 6), generator=torch.Generator().manual_seed(1))
    cached = m.generate(ids, 20)
    assert torch.equal(cached, m.generate(ids, 20, use_cache=False))
    # the logits of every decode step, not only the argmax
    cache = KVCache()
    seq = ids
    for step in range(8):
        new = seq if step == 0 else seq[:, -1:]
        a = m.next_token_logits(new, cache=cache)
        b = m(seq)[:, -1]
        torch.testing.assert_close(a, b, rtol=0, atol=1e-11)
        seq = torch.cat([seq, a.argmax(-1, keepdim=True)], 1)
    assert cache.length == seq.shape[1] - 1


def test_own_decoder_seeded_sampling():
    m = _lm("sliced_relu", torch.float32, 2)
    ids = torch.randint(0, 23, (2, 4), generator=torch.Generator().manual_seed(3))
    kw = dict(do_sample=True, top_k=8, temperature=0.9)
    a = m.generate(ids, 12, generator=torch.Generator().manual_seed(5), **kw)
    b = m.generate(ids, 12, generator=torch.Generator().manual_seed(5), **kw)
    assert torch.equal(a, b) and a.shape == (2, 16)


# -- left-padded batches and the cache of opsplit's own decoders -------------------------------
def _padded(vocab=23, B=3, N=7, seed=1):
    """Ids ``(B, N)`` and a 0/1 mask: sample 0 unpadded, sample b with 2b + 1 left pads (pad id 0)."""
    ids = torch.randint(3, vocab, (B, N), generator=torch.Generator().manual_seed(seed))
    mask = torch.ones(B, N, dtype=torch.long)
    for b in range(1, B):
        mask[b, : min(N - 1, 2 * b + 1)] = 0
    return ids.masked_fill(mask == 0, 0), mask


def _sliced_lm(scheme="lie", seed=0, dtype=F64):
    """DecoderLM with causal sliced ReLU attention and GPT-2's learned positions."""
    cfg = DecoderConfig(vocab_size=23, d_model=16, n_layers=2, n_heads=2, d_ff=32, norm="layer", mlp="plain",
                        activation="gelu", positions="learned", max_positions=64, attention="sliced_relu",
                        scheme=scheme)
    return DecoderLM(cfg, generator=torch.Generator().manual_seed(seed), dtype=dtype).eval()


@pytest.mark.parametrize("attention", ["softmax", "sliced_relu", "sliced_bump"])
def test_own_decoder_left_padded_batch_equals_each_sample_alone(attention):
    """A left-padded batch (the pads removed from every key measure) gives each sample's real
    tokens the logits of that sample run alone without padding; generation from the padded
    batch (with and without the cache) continues every sample as generating it alone does."""
    m = _lm(attention)
    ids, mask = _padded()
    with torch.no_grad():
        out = m(ids, mask)
        for b in range(ids.shape[0]):
            real = mask[b].bool()
            torch.testing.assert_close(out[b, real], m(ids[b:b + 1, real])[0], rtol=0, atol=1e-12)
        assert not torch.allclose(out[1, mask[1].bool()], m(ids[1:2])[0, mask[1].bool()])  # the pads do matter
        gen = m.generate(ids, 12, attention_mask=mask)
        assert torch.equal(gen, m.generate(ids, 12, attention_mask=mask, use_cache=False))
        for b in range(ids.shape[0]):
            alone = m.generate(ids[b:b + 1, mask[b].bool()], 12)
            assert torch.equal(gen[b, -12:], alone[0, -12:]), b


@pytest.mark.parametrize("attention", ["softmax", "sliced_relu", "sliced_bump", "none"])
def test_own_decoder_padded_cache_steps_equal_recompute(attention):
    """Every decode step through the cache of a left-padded batch gives the logits of the whole
    padded sequence recomputed (logit for logit, not only the argmax)."""
    m = _lm(attention, seed=3)
    seq, mask = _padded(seed=4)
    cache = KVCache()
    with torch.no_grad():
        for step in range(8):
            new = seq if step == 0 else seq[:, -1:]
            a = m.next_token_logits(new, mask, cache=cache)
            torch.testing.assert_close(a, m(seq, mask)[:, -1], rtol=0, atol=1e-11)
            seq = torch.cat([seq, a.argmax(-1, keepdim=True)], 1)
            mask = torch.cat([mask, torch.ones_like(mask[:, :1])], 1)
    assert cache.length == seq.shape[1] - 1


@pytest.mark.parametrize("scheme", ["lie", "strang", "parallel"])
def test_sliced_decoder_lm_cache_and_padding(scheme):
    """DecoderLM(attention="sliced_relu"): a left-padded batch with positions counted from the
    first real token (as generate makes them) gives each sample's logits alone; cached
    generation (the O(n D) decode sums over the cached scores, the pads at key weight 0)
    equals recomputing the sequence at every step, token for token and logit for logit, and
    continues every padded sample as generating it alone does."""
    m = _sliced_lm(scheme)
    ids, mask = _padded()
    pos = (mask.cumsum(-1) - 1).masked_fill(mask == 0, 0)
    with torch.no_grad():
        out = m(ids, mask, position_ids=pos).logits
        for b in range(ids.shape[0]):
            real = mask[b].bool()
            torch.testing.assert_close(out[b, real], m(ids[b:b + 1, real]).logits[0], rtol=0, atol=1e-12)
        gen = m.generate(ids, 16, attention_mask=mask)
        assert torch.equal(gen, m.generate(ids, 16, attention_mask=mask, use_cache=False))
        for b in range(ids.shape[0]):
            assert torch.equal(gen[b, -16:], m.generate(ids[b:b + 1, mask[b].bool()], 16)[0, -16:]), b
        assert len(set(gen[:, -16:].flatten().tolist())) >= 4  # not one repeated token
        # every step's logits: the cache against the full padded sequence
        cache, seq = KVCache(), ids
        for step in range(6):
            p = (mask.cumsum(-1) - 1).masked_fill(mask == 0, 0)
            new = seq if step == 0 else seq[:, -1:]
            a = m.next_token_logits(new, mask, position_ids=p[:, -new.shape[1]:], cache=cache)
            torch.testing.assert_close(a, m(seq, mask, position_ids=p).logits[:, -1], rtol=0, atol=1e-11)
            seq = torch.cat([seq, a.argmax(-1, keepdim=True)], 1)
            mask = torch.cat([mask, torch.ones_like(mask[:, :1])], 1)


def test_sliced_decoder_lm_decode_steps_equal_the_checked_call():
    """The decode steps generate runs for the sliced decoder (DecoderLM.decode_steps: the sliced
    term called as it is) give next_token_logits' logits bit for bit on a left-padded batch."""
    m = _sliced_lm()
    ids, mask = _padded()
    assert_decode_steps_equal_checked_call(m, ids, mask, 5)


def test_decode_steps_need_no_grad():
    with pytest.raises(RuntimeError, match="without autograd"):
        _sliced_lm().decode_steps(KVCache())


def _frozen_cases(dtype):
    g = torch.Generator().manual_seed(7)

    def r(*s):
        return torch.randn(*s, generator=g, dtype=F64).to(dtype)

    ny, nz = 6, 10
    ffn_relu = FeedForward(r(ny, nz), r(nz), r(nz, ny), r(ny), activation="relu")
    ffn_hidden = FeedForward(r(ny, nz), None, r(nz, ny), None, activation="gelu", hidden=Interval(length=2.5))
    ffn_trap = FeedForward(r(ny, nz), r(nz), r(nz, ny), r(ny), activation="tanh",
                           hidden=Interval(length=3.0, rule="trapezoid"))  # unequal hidden weights
    gated = GatedFeedForward(r(ny, nz), r(ny, nz), r(nz, ny), b_gate=r(nz), b_up=r(nz), b_down=r(ny))
    ln = [PointwiseAffine(r(ny), r(ny), projection=ProjectionS1(0.0, 1.0, eps=1e-5))]
    ln0 = [PointwiseAffine(r(ny), r(ny), projection=ProjectionS1(0.0, 1.0, eps=0.0))]  # eps = 0: as it is
    rms = [ProjectionSphere(1.0, eps=1e-6), PointwiseAffine(r(ny), None)]
    rms32 = [ProjectionSphere(2.0, eps=1e-6, compute_dtype=torch.float32), PointwiseAffine(None, r(ny))]
    drop = FieldDropout(ffn_relu, 0.3).eval()
    return {"prenorm-ffn-relu-ln": PreNorm(ffn_relu, ln), "prenorm-ffn-hidden-ln0": PreNorm(ffn_hidden, ln0),
            "ffn-trapezoid": ffn_trap, "prenorm-gated-rms": PreNorm(gated, rms),
            "prenorm-dropout-rms32": PreNorm(drop, rms32), "gated": gated}


@pytest.mark.parametrize("name", ["prenorm-ffn-relu-ln", "prenorm-ffn-hidden-ln0", "ffn-trapezoid",
                                  "prenorm-gated-rms", "prenorm-dropout-rms32", "gated"])
def test_frozen_terms_equal_the_terms_bit_for_bit(name, dtype):
    op = _frozen_cases(dtype)[name]
    grid = Grid.paper(None, 6).with_shape(4, 6)
    u = torch.randn(2, 4, 6, dtype=F64, generator=torch.Generator().manual_seed(8)).to(dtype) * 3
    with torch.no_grad():
        f = frozen_field(op, 0.0, grid, dtype)
        assert torch.equal(f(u, grid), op.field(0.0, u, grid))
        if isinstance(op, PreNorm):
            for n in op.maps:
                assert torch.equal(frozen_map(n, 0.0, grid, dtype)(u, grid),
                                   n.flow(0.0, 1.0, u, grid) if n.has_flow else n.resolvent(0.0, 1.0, u, grid))


def test_frozen_dropout_in_training_mode_stays_random():
    op = FieldDropout(FeedForward.create(4, 8), 0.5).train()
    grid = Grid.paper(3, 4)
    u = torch.randn(1, 3, 4)
    with torch.no_grad():
        f = frozen_field(op, 0.0, grid, torch.float32)
        assert not torch.equal(f(u, grid), f(u, grid))


# -- the overflow guard of a decode step: the maximum of the cached keys ----------------------
def test_kv_cache_keeps_the_maximum_of_its_keys():
    op, g = object(), torch.Generator().manual_seed(2)
    cache = KVCache()
    chunks = [torch.randn(2, 3, n, 4, generator=g, dtype=F64) * s for n, s in ((5, 1.0), (1, 7.0), (2, 0.1))]
    cache.update(op, 0.0, chunks[0], chunks[0])  # no maximum given: computed from the cache when first asked
    assert cache.key_max(op, 0.0) is None
    for x in chunks[1:]:
        cache.begin()
        k, _ = cache.update(op, 0.0, x, x, key_max=float(x.abs().amax()))
        assert cache.key_max(op, 0.0) == float(k.abs().amax())
    cache.begin()
    cache.update(op, 0.0, chunks[0], chunks[0])  # an append without it drops the kept maximum
    assert cache.key_max(op, 0.0) is None
    cache.begin()  # asked again: computed once from the cached keys, then kept
    k, _ = cache.update(op, 0.0, chunks[2], chunks[2], key_max=float(chunks[2].abs().amax()))
    assert cache.key_max(op, 0.0) == float(k.abs().amax()) == float(chunks[1].abs().amax())
    cache.select(torch.tensor([1]))  # rows dropped: the maximum may have been theirs
    assert cache.key_max(op, 0.0) is None


def test_kv_cache_key_maximum_propagates_nan():
    op, cache = object(), KVCache()
    x = torch.ones(1, 1, 2, 2)
    cache.update(op, 0.0, x, x, key_max=float("nan"))
    cache.begin()
    cache.update(op, 0.0, x, x, key_max=1.0)
    assert math.isnan(cache.key_max(op, 0.0))
    cache = KVCache()
    cache.update(op, 0.0, x, x, key_max=1.0)
    cache.begin()
    cache.update(op, 0.0, x, x, key_max=float("nan"))
    assert math.isnan(cache.key_max(op, 0.0))


@pytest.mark.parametrize("n_kv,n_prompt", [(1, 5), (2, 5), (2, 700)])  # 700: the prompt's large-input reduction
def test_decode_step_guard_sees_the_cached_keys(n_kv, n_prompt):
    """float32 keys of size 1e21 in the cache and a new token of size 1e18: the new token's own
    queries and keys bound the scores by ~1e36 (finite), but its scores against the cached keys
    reach ~1e39 (beyond float32).  The guard's bound must include the cached keys (kept by the
    cache as they were appended) so that the step falls back to float64: finite and right."""
    torch.manual_seed(3)
    op = GroupedQueryAttention.create(8, 4, n_kv, causal=True, cache="kv", rope_theta=10000.0)
    op64 = GroupedQueryAttention.create(8, 4, n_kv, causal=True, cache="kv", rope_theta=10000.0, dtype=F64)
    op64.load_state_dict({k: v.double() for k, v in op.state_dict().items()})
    g = torch.Generator().manual_seed(4)
    prompt, new = torch.randn(1, n_prompt, 8, generator=g) * 1e21, torch.randn(1, 1, 8, generator=g) * 1e18
    outs = []
    with torch.no_grad():
        for o, dt in ((op, torch.float32), (op64, F64)):
            cache = KVCache()
            first = o.field(0.0, prompt.to(dt), ContextGrid.of(Grid.paper(n_prompt, 8), kv=cache))
            assert bool(torch.isfinite(first).all())
            cache.begin()
            outs.append(o.field(0.0, new.to(dt), ContextGrid.of(Grid.paper(1, 8), kv=cache)))
            if dt == torch.float32:
                # the premise: the new token alone would not trigger the fallback
                q, k, _ = o.heads(0.0, new, Grid.paper(1, 8), past=n_prompt)
                assert o.score_scale(None) * 2 * float(q.abs().amax()) * float(k.abs().amax()) < 3.4e38 / 4
    assert bool(torch.isfinite(outs[0]).all())
    assert float((outs[0].double() - outs[1]).abs().max() / outs[1].abs().max()) < 1e-5


@pytest.mark.parametrize("n", [3, 700])  # the decode-step reduction and the large-input one
def test_guard_propagates_nan(n):
    """A NaN in the queries or keys makes the bound NaN, and the operator says so (as the full
    reduction of score_bound does), in both of the guard's reductions."""
    op = GroupedQueryAttention.create(8, 4, 2, causal=True)
    x = torch.randn(1, n, 8)
    x[0, n // 2, 3] = float("nan")
    with torch.no_grad(), pytest.raises(ValueError, match="attention scores s\\*<q, k> may reach nan"):
        op.field(0.0, x, Grid.paper(n, 8))
