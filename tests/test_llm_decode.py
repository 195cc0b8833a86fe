"""Generation with opsplit's own causal decoders (AttentionDecoder + TokenClassifier with
softmax, causal sliced ReLU and causal sliced ReLU-bump attention): the key/value cache of
MultiHeadAttention and of the sliced operators, the O(n D) decode sums of causal sliced
attention against the divide-and-conquer kernel, and cached generation against recomputing
the whole sequence at every step."""

from __future__ import annotations

import pytest
import torch
from torch.autograd import gradcheck

from opsplit import Grid
from opsplit.functional import causal_sliced_relu_attention, causal_sliced_relu_bump_attention
from opsplit.functional.sliced_decode import (
    decode_sliced_relu_attention,
    decode_sliced_relu_bump_attention,
)
from opsplit.models import AttentionDecoder, TokenClassifier
from opsplit.operators import KVCache, MultiHeadAttention
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


@pytest.mark.parametrize("attention", ["softmax", "sliced_relu", "sliced_bump"])
def test_own_decoder_generation_cache_equals_recompute(attention):
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
