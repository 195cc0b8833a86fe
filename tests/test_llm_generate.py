"""Generation with opsplit's decoder-only models against Hugging Face's ``generate``: greedy
decoding token for token (32 new tokens, left-padded batches, with and without the key/value
cache), eos/pad handling, seeded sampling (reproducible with a generator; the same draws as
HF's under the same global seed), and the cache itself (a prompt fed in chunks gives the
logits of the whole prompt)."""

from __future__ import annotations

import pytest
import torch
from _llm_configs import build, left_padded  # noqa: E402

from opsplit.models import from_hf  # noqa: E402
from opsplit.operators import KVCache  # noqa: E402

GREEDY = [("gpt2", 0), ("gpt2", 5), ("llama", 0), ("llama", 3), ("llama", 6), ("qwen2", 2), ("mistral", 0)]


def _hf_generate(hf, ids, mask, n, **kw):
    kw.setdefault("eos_token_id", None)
    kw.setdefault("pad_token_id", 0)
    return hf.generate(ids, attention_mask=mask, max_new_tokens=n, **kw)


@pytest.mark.parametrize("family,seed", GREEDY, ids=[f"{f}{s}" for f, s in GREEDY])
def test_greedy_equals_hf_token_for_token(family, seed):
    hf = build(family, seed, dtype=torch.float32, scale=0.5)
    ours = from_hf(hf)
    ids, mask = left_padded(hf.config.vocab_size, 3, 5, seed)
    ref = _hf_generate(hf, ids, mask, 32, do_sample=False)
    assert ref.shape == (3, 37)
    cached = ours.generate(ids, 32, attention_mask=mask, eos_token_id=None)
    assert torch.equal(cached, ref)
    assert torch.equal(ours.generate(ids, 32, attention_mask=mask, use_cache=False, eos_token_id=None), ref)


def test_generated_tokens_vary():
    """The comparison above is not vacuous: the continuations are not one repeated token."""
    hf = build("llama", 0, dtype=torch.float32, scale=0.5)
    ids, mask = left_padded(hf.config.vocab_size, 3, 5, 0)
    out = from_hf(hf).generate(ids, 32, attention_mask=mask, eos_token_id=None)[:, 5:]
    assert all(len(set(row.tolist())) >= 4 for row in out)


def test_eos_stops_and_pads_as_hf():
    hf = build("llama", 3, dtype=torch.float32, scale=0.5)
    ours = from_hf(hf)
    ids, mask = left_padded(hf.config.vocab_size, 3, 5, 3)
    free = ours.generate(ids, 24, attention_mask=mask, eos_token_id=None)
    eos = int(free[0, 5 + 3])  # a token the first sequence emits at its 4th step
    ref = _hf_generate(hf, ids, mask, 24, do_sample=False, eos_token_id=eos, pad_token_id=7)
    out = ours.generate(ids, 24, attention_mask=mask, eos_token_id=eos, pad_token_id=7)
    assert torch.equal(out, ref)
    assert (out[0, 5 + 4:] == 7).all() or out.shape[1] < 5 + 24


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_seeded_sampling_reproducible_and_as_hf(family):
    hf = build(family, 1, dtype=torch.float64, scale=0.5)
    ours = from_hf(hf)
    ids, mask = left_padded(hf.config.vocab_size, 3, 4, 1)
    kw = dict(do_sample=True, temperature=0.7, top_k=12, top_p=0.9, eos_token_id=None, pad_token_id=0)
    a = ours.generate(ids, 20, attention_mask=mask, generator=torch.Generator().manual_seed(3), **kw)
    b = ours.generate(ids, 20, attention_mask=mask, generator=torch.Generator().manual_seed(3), **kw)
    c = ours.generate(ids, 20, attention_mask=mask, generator=torch.Generator().manual_seed(4), **kw)
    assert torch.equal(a, b) and not torch.equal(a, c)
    torch.manual_seed(11)
    ref = hf.generate(ids, attention_mask=mask, max_new_tokens=20, **kw)
    torch.manual_seed(11)
    assert torch.equal(ours.generate(ids, 20, attention_mask=mask, **kw), ref)


@pytest.mark.parametrize("family,seed", [("gpt2", 2), ("llama", 5), ("qwen2", 1)])
def test_prompt_in_chunks_through_the_cache(family, seed):
    """Feeding the prompt in three chunks through one cache (bottom-right causal alignment,
    positions continued) gives the logits of the whole prompt at once."""
    hf = build(family, seed)
    ours = from_hf(hf)
    ids, mask = left_padded(hf.config.vocab_size, 3, 10, seed)
    cache = KVCache()
    pos = (mask.cumsum(-1) - 1).masked_fill(mask == 0, 0)
    parts = []
    for a, b in ((0, 4), (4, 7), (7, 10)):
        parts.append(ours(ids[:, a:b], mask[:, :b], position_ids=pos[:, a:b], cache=cache).logits)
    assert cache.length == 10
    ref = hf(input_ids=ids, attention_mask=mask, position_ids=pos).logits.detach()
    torch.testing.assert_close(torch.cat(parts, 1), ref, rtol=0, atol=1e-10 * float(ref.abs().max()))
    if family != "gpt2":
        # rotary positions are relative: shifted positions give the same real tokens, up to the
        # rounding of HF's float32 angles (the converted model computes them as HF does)
        full = ours(ids, mask).logits.detach()
        real = mask.bool()
        torch.testing.assert_close(torch.cat(parts, 1)[real], full[real], rtol=0, atol=1e-5 * float(full.abs().max()))
