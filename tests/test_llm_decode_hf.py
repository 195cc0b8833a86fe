"""The decode steps of a generation with the models converted from Hugging Face (controls
evaluated once, no per-step checks): DecoderLM.decode_steps against next_token_logits, bit
for bit, on left-padded batches."""

from __future__ import annotations

import pytest
import torch
from _decode_helpers import assert_decode_steps_equal_checked_call
from _llm_configs import build, left_padded

from opsplit.models import from_hf
from opsplit.operators import KVCache

F64 = torch.float64

# GPT-2: gelu_new tied, relu (in-place) untied, gelu_fast; Llama: plain, q/k/v/o and MLP biases
# untied, GELU with MLP bias tied; Qwen2 (q/k/v biases), Mistral
DECODE = [("gpt2", 0), ("gpt2", 2), ("gpt2", 5), ("llama", 0), ("llama", 5), ("llama", 2), ("qwen2", 1),
          ("mistral", 0)]


@pytest.mark.parametrize("family,seed", DECODE, ids=[f"{f}{s}" for f, s in DECODE])
def test_decode_steps_equal_the_checked_call_bit_for_bit(family, seed, dtype):
    """DecoderLM.decode_steps (what generate runs after the prompt) gives the logits of
    next_token_logits (the checked path through the propagator) bit for bit, step by step,
    on a left-padded batch."""
    hf = build(family, seed, dtype=dtype, scale=0.5)
    m = from_hf(hf)
    ids, mask = left_padded(hf.config.vocab_size, 3, 5, seed)
    a, b = assert_decode_steps_equal_checked_call(m, ids, mask, 6, label=(family, seed))
    assert a.length == b.length == 5 + 6


def test_decode_steps_need_no_grad():
    m = from_hf(build("llama", 0, dtype=F64))
    with pytest.raises(RuntimeError, match="without autograd"):
        m.decode_steps(KVCache())
