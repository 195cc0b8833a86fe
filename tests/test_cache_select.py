"""``KVCache.select`` and ``SlicedDecodeCache.select`` keep the sequences they are asked to keep
(issue 42, findings 2 and 3).

A batch is decoded for a few steps through a :class:`~opsplit.operators.KVCache`, some of its
sequences are kept (a bool mask, a subset, a permutation, a repeated row), and decoding goes on:
every later step's logits must equal those of the kept sequences recomputed from scratch
without a cache (the model run on the whole sequence, an independent path: no cache, the
divide-and-conquer kernels for sliced attention, one dense causal softmax).  For every attention
kind the decoders take — DecoderLM with softmax multi-head attention, grouped-query attention,
causal sliced ReLU attention (sorted runs, and the direct sums: ``KVCache(sorted_runs=False)``
and under autograd); opsplit's own AttentionDecoder with softmax, sliced ReLU and sliced
ReLU-bump attention — in float32 and float64, with left-padded batches (B = 4).  Before the fix
a bool mask was read as the indices 0 and 1 by the sorted runs (the logits of the wrong
sequences, no error) and refused deep inside torch by the tensor entries.
"""

from __future__ import annotations

import contextlib

import pytest
import torch

from opsplit.functional.sliced_runs import SlicedDecodeCache
from opsplit.models import AttentionDecoder, DecoderConfig, DecoderLM, TokenClassifier
from opsplit.operators import KVCache

F32, F64 = torch.float32, torch.float64
VOCAB = 23
B, N = 4, 6


def _decoder_lm(kind, dtype):
    base = dict(vocab_size=VOCAB, d_model=16, n_layers=2, d_ff=24)
    if kind == "multihead":
        cfg = DecoderConfig(**base, n_heads=4, n_kv_heads=4)
    elif kind == "grouped":
        cfg = DecoderConfig(**base, n_heads=4, n_kv_heads=2)
    elif kind == "multiquery_gpt2":  # LayerNorm, learned positions, biases: GPT-2's shape with one kv head
        cfg = DecoderConfig(**base, n_heads=4, n_kv_heads=1, norm="layer", mlp="plain", activation="gelu",
                            positions="learned", max_positions=64, qkv_bias=True, out_bias=True)
    else:  # causal sliced ReLU attention
        cfg = DecoderConfig(**base, n_heads=2, norm="layer", mlp="plain", activation="gelu", positions="learned",
                            max_positions=64, attention="sliced_relu")
    return DecoderLM(cfg, generator=torch.Generator().manual_seed(1), dtype=dtype).eval()


def _own(attention, dtype):
    g = torch.Generator().manual_seed(2)
    enc = AttentionDecoder(16, 2, 24, attention=attention, n_steps=2, causal=True, generator=g, dtype=dtype)
    return TokenClassifier(VOCAB, VOCAB, enc, generator=g, dtype=dtype).eval()


MODELS = {  # name: (constructor(dtype), is a DecoderLM)
    "lm-multihead": (lambda dt: _decoder_lm("multihead", dt), True),
    "lm-grouped": (lambda dt: _decoder_lm("grouped", dt), True),
    "lm-multiquery-gpt2": (lambda dt: _decoder_lm("multiquery_gpt2", dt), True),
    "lm-sliced-relu": (lambda dt: _decoder_lm("sliced", dt), True),
    "own-softmax": (lambda dt: _own("softmax", dt), False),
    "own-sliced-relu": (lambda dt: _own("sliced_relu", dt), False),
    "own-sliced-bump": (lambda dt: _own("sliced_bump", dt), False),
}
_built: dict = {}


def model(name, dtype):
    key = (name, dtype)
    if key not in _built:
        _built[key] = MODELS[name][0](dtype)
    return _built[key]


def _prompt():
    """Ids ``(B, N)`` and a 0/1 mask: sample b has b left pads (pad id 0), sample 0 none."""
    ids = torch.randint(3, VOCAB, (B, N), generator=torch.Generator().manual_seed(5))
    mask = torch.ones(B, N, dtype=torch.long)
    for b in range(B):
        mask[b, :b] = 0
    return ids.masked_fill(mask == 0, 0), mask


def _positions(mask):
    """Positions counted from each sample's first real token (0 at the pads), as generate makes them."""
    return (mask.cumsum(-1) - 1).clamp_min(0)


def _logits(m, is_lm, ids, mask, cache=None, new=None):
    """The last position's logits: with ``cache``, of the ``new`` last tokens run through it;
    without, of the whole sequence recomputed."""
    if is_lm:
        p = _positions(mask)
        if cache is None:
            return m(ids, mask, position_ids=p).logits[:, -1]
        return m.next_token_logits(ids[:, -new:], mask, position_ids=p[:, -new:], cache=cache)
    if cache is None:
        return m(ids, mask)[:, -1]
    return m.next_token_logits(ids[:, -new:], mask, cache=cache)


def _close(a, ref):
    """Within 100 eps of the dtype times max |logit| (measured: 8e-7 max|logit| in float32,
    3e-15 in float64; the wrong rows differ by O(1))."""
    assert a.shape == ref.shape
    tol = 100 * torch.finfo(a.dtype).eps * float(ref.abs().max())
    err = float((a - ref).abs().max())
    assert err <= tol, (err, tol)


SELECTIONS = {  # name: (index, rows it keeps)
    "mask": (torch.tensor([True, False, True, True]), [0, 2, 3]),
    "mask-one": (torch.tensor([False, False, False, True]), [3]),
    "subset": (torch.tensor([3, 1]), [3, 1]),
    "permutation": (torch.tensor([2, 0, 3, 1]), [2, 0, 3, 1]),
    "repeated": (torch.tensor([1, 1, 3], dtype=torch.int32), [1, 1, 3]),
}


def _run(name, dtype, selection, cache_kw=None, grad=False, before=2, after=2):
    """Decode ``before`` steps of the padded batch, select, decode ``after`` more: each later
    step's logits against the kept sequences recomputed without a cache."""
    m = model(name, dtype)
    is_lm = MODELS[name][1]
    index, rows = SELECTIONS[selection]
    seq, mask = _prompt()
    cache = KVCache(**(cache_kw or {}))
    with contextlib.nullcontext() if grad else torch.no_grad():
        for step in range(before):
            a = _logits(m, is_lm, seq, mask, cache, new=seq.shape[1] if step == 0 else 1)
            seq = torch.cat([seq, a.argmax(-1, keepdim=True)], 1)
            mask = torch.cat([mask, torch.ones_like(mask[:, :1])], 1)
        cache.select(index)
        seq, mask = seq[rows], mask[rows]
        assert cache.length == seq.shape[1] - 1
        for _ in range(after):
            a = _logits(m, is_lm, seq, mask, cache, new=1)
            ref = _logits(m, is_lm, seq, mask)
            assert a.shape == (len(rows), VOCAB)
            _close(a.detach(), ref.detach())
            seq = torch.cat([seq, ref.argmax(-1, keepdim=True)], 1)
            mask = torch.cat([mask, torch.ones_like(mask[:, :1])], 1)


@pytest.mark.parametrize("dtype", [F32, F64], ids=["f32", "f64"])
@pytest.mark.parametrize("selection", list(SELECTIONS))
@pytest.mark.parametrize("name", list(MODELS))
def test_select_then_decode_equals_recompute(name, selection, dtype):
    _run(name, dtype, selection)


@pytest.mark.parametrize("selection", ["mask", "repeated"])
@pytest.mark.parametrize("name", ["lm-sliced-relu", "own-sliced-relu", "own-sliced-bump"])
def test_select_with_the_direct_sums_of_sliced_attention(name, selection):
    """The sliced terms without sorted runs: their scores and values as tensor entries
    (``KVCache(sorted_runs=False)``), and under autograd (concatenated, differentiable)."""
    _run(name, F64, selection, cache_kw={"sorted_runs": False})
    _run(name, F64, selection, grad=True)


@pytest.mark.parametrize("name", ["lm-grouped", "lm-sliced-relu", "own-sliced-bump"])
def test_select_twice_and_after_more_tokens(name):
    """Two selects in a row compose (the second indexes the rows the first kept), and a select
    after the sorted runs merged into longer runs (40 cached tokens: runs of 32 and 8, a tail)."""
    m, is_lm = model(name, F64), MODELS[name][1]
    seq, mask = _prompt()
    cache = KVCache()
    with torch.no_grad():
        for step in range(36):
            a = _logits(m, is_lm, seq, mask, cache, new=seq.shape[1] if step == 0 else 1)
            seq = torch.cat([seq, a.argmax(-1, keepdim=True)], 1)
            mask = torch.cat([mask, torch.ones_like(mask[:, :1])], 1)
        cache.select(torch.tensor([False, True, True, True]))
        cache.select(torch.tensor([2, 0]))
        seq, mask = seq[[3, 1]], mask[[3, 1]]
        a = _logits(m, is_lm, seq, mask, cache, new=1)
        _close(a, _logits(m, is_lm, seq, mask))


def test_sliced_decode_cache_select_keeps_the_marked_rows():
    """SlicedDecodeCache directly (issue 42, finding 2: ``select(tensor([True, False, True]))``
    kept the rows 1, 0, 1): after a select, queries see the keys of the kept rows, as a cache
    filled with those rows alone does."""
    g = torch.Generator().manual_seed(0)
    zk, v = torch.randn(3, 2, 45, generator=g, dtype=F64), torch.randn(3, 2, 45, 4, generator=g, dtype=F64)
    zq = torch.randn(3, 2, 1, generator=g, dtype=F64)
    for index, rows in ((torch.tensor([True, False, True]), [0, 2]), (torch.tensor([2, 2, 0]), [2, 2, 0])):
        with torch.no_grad():
            c, ref = SlicedDecodeCache(), SlicedDecodeCache()
            c.append(zk, v)
            c.select(index)
            ref.append(zk[rows], v[rows])
            assert c.batch_size == len(rows)
            torch.testing.assert_close(c.relu(zq[rows]), ref.relu(zq[rows]), rtol=0, atol=1e-13)
            torch.testing.assert_close(c.bump(zq[rows], 0.7), ref.bump(zq[rows], 0.7), rtol=0, atol=1e-13)
            new = (zq[rows], zk[rows, :, :1] + 0.1, v[rows, :, :1])
            torch.testing.assert_close(c.step_relu(*new), ref.step_relu(*new), rtol=0, atol=1e-13)
