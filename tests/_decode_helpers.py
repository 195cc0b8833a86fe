"""Shared checks of the decoder-only models' generation paths (imported by the decode tests)."""

from __future__ import annotations

import torch

from opsplit.operators import KVCache


def assert_decode_steps_equal_checked_call(m, ids, mask, steps, label=()):
    """Greedy decoding of ``steps`` tokens after a left-padded prompt: DecoderLM.decode_steps
    (what generate runs after the prompt) gives next_token_logits' logits (the checked path
    through the propagator) bit for bit at every step.  Returns the two caches (the decode
    steps', the checked call's)."""
    pos = (mask.cumsum(-1) - 1).masked_fill(mask == 0, 0)
    a, b = KVCache(), KVCache()
    with torch.no_grad():
        la = m.next_token_logits(ids, mask, position_ids=pos, cache=a)
        lb = m.next_token_logits(ids, mask, position_ids=pos, cache=b)
        step = m.decode_steps(a)
        for k in range(steps):
            tok = la.argmax(-1, keepdim=True)
            mask = torch.cat([mask, torch.ones_like(mask[:, :1])], 1)
            pos = pos[:, -1:] + 1
            la = step(tok, pos, mask == 0)
            lb = m.next_token_logits(tok, mask, position_ids=pos, cache=b)
            assert torch.equal(la, lb), (*label, k)
    return a, b
