"""Drafts that read the controls averaged over each step (``DraftSolve(controls="average")``,
opsplit.coarse): the draft of a model trained with ``coarse_controls="average"``.

Checked against an independent construction: a copy of the model whose layer pieces are
replaced, by plain arithmetic on its state dict, with the mean of the pieces each coarse step
covers, solved at the coarse N_t with its controls read at the steps' start.  With one draft
token a round (k = 1), every round's acceptance is whether that copy's greedy next token
after the round's prefix is the target's: simulated by hand from plain forward passes and
compared round by round with what ``speculative_generate`` reports.  The output itself stays
plain greedy decoding's, token for token."""

from __future__ import annotations

import copy
import re

import pytest
import torch

from opsplit.models import DecoderConfig, DecoderLM
from opsplit.models.speculative import DraftSolve, speculative_generate

pytestmark = pytest.mark.usefixtures("one_thread")


def _model(attention="softmax", scheme="lie", seed=0, layers=4, scale=0.3, out_scale=1.0):
    """A random decoder; ``out_scale`` scales the layers' output weights (WO, W2): at 0.5 the
    coarse and the fine solves agree on about half the greedy tokens, so acceptances vary."""
    kw = dict(positions="learned", max_positions=64) if attention == "sliced_relu" else {}
    cfg = DecoderConfig(vocab_size=11, d_model=16, n_layers=layers, n_heads=2, d_ff=24, attention=attention,
                        scheme=scheme, **kw)
    m = DecoderLM(cfg, generator=torch.Generator().manual_seed(seed), dtype=torch.float64).eval()
    g = torch.Generator().manual_seed(100 + seed)
    with torch.no_grad():
        for p in m.parameters():
            p.add_(scale * torch.randn(p.shape, generator=g, dtype=torch.float64))
        for k, p in m.named_parameters():
            if re.search(r"\.(WO|W2)\.pieces\.", k):
                p.mul_(out_scale)
    return m


def _averaged_copy(m: DecoderLM, coarse: int) -> DecoderLM:
    """``m`` with every layer piece i replaced by the mean of the pieces of its coarse step:
    the layerwise weights (``pieces.i``) and the stacked piecewise controls (``raw``, whose
    values are ``exp(raw)`` where the control is positive) of sliced attention."""
    r = m.config.n_layers // coarse
    c = copy.deepcopy(m)
    sd = c.state_dict()
    new = {}
    for k, v in sd.items():
        hit = re.match(r"(.*\.pieces\.)(\d+)$", k)
        if hit is not None:
            first = int(hit.group(2)) // r * r
            new[k] = sum(sd[f"{hit.group(1)}{j}"] for j in range(first, first + r)) / r
        else:
            new[k] = v
    with torch.no_grad():
        for name, mod in c.named_modules():
            raw = getattr(mod, "raw", None)
            if not isinstance(raw, torch.Tensor) or raw.shape[0] != m.config.n_layers:
                continue
            vals = raw.exp() if getattr(mod, "positive", False) else raw
            mean = vals.reshape(coarse, r, *vals.shape[1:]).mean(1).repeat_interleave(r, 0)
            new[f"{name}.raw"] = mean.log() if getattr(mod, "positive", False) else mean
    c.load_state_dict(new)
    return c


def _greedy(m, ids, n, new_tokens):
    with torch.no_grad():
        return m.generate(ids, new_tokens, do_sample=False, n_steps=n)


def _next(m, ids, n) -> int:
    with torch.no_grad():
        return int(m(ids, n_steps=n).logits[0, -1].argmax())


def _simulated_acceptance(target_seq, n_prompt, draft_model, draft_n):
    """k = 1: round r drafts one token after the accepted prefix and the target's token (no
    draft when one token is left)."""
    flags, pos = [], n_prompt + 1  # the prompt and the target's first token
    while pos < target_seq.shape[1]:
        if pos == target_seq.shape[1] - 1:  # one token left: a round without a draft, the target's token
            flags.append(0)
            break
        guess = _next(draft_model, target_seq[:, :pos], draft_n)
        ok = guess == int(target_seq[0, pos])
        flags.append(int(ok))
        pos += 1 + (1 if ok else 0)
    return flags


@pytest.mark.parametrize("attention, scheme", [("softmax", "lie"), ("softmax", "parallel"), ("sliced_relu", "lie")])
def test_averaged_draft_proposes_the_averaged_models_tokens(attention, scheme):
    m = _model(attention, scheme, scale=0.15, out_scale=0.5)
    ids = torch.randint(0, 11, (1, 6), generator=torch.Generator().manual_seed(3))
    new = 24
    plain = _greedy(m, ids, None, new)
    flags = {}
    for controls in ("average", "point"):
        out = speculative_generate(m, ids, new, draft=DraftSolve(n_steps=2, controls=controls), num_draft_tokens=1)
        assert torch.equal(out.sequences, plain)  # the target's own greedy tokens whatever the draft reads
        flags[controls] = out.accepted
    avg = _averaged_copy(m, 2)
    want = _simulated_acceptance(plain, ids.shape[1], avg, 2)
    assert flags["average"] == want
    assert 0 < sum(want) < len(want)  # drafts accepted and rejected: the rounds' prefixes differ
    # the point reading (the pieces at the coarse steps' starts) is another draft: the test tells them apart
    assert flags["point"] != flags["average"]
    assert flags["point"] == _simulated_acceptance(plain, ids.shape[1], m, 2)
    # the model is left as it was: its own solve at N_t = 2 is the point reading again
    assert _next(m, plain[:, :8], 2) == _next(copy.deepcopy(m), plain[:, :8], 2)
    assert not any(type(x).__name__ == "PieceAverage" for x in m.modules())


def test_averaged_draft_batch_with_padding_equals_plain_greedy():
    m = _model("softmax", "lie", scale=0.15, out_scale=0.5)
    ids = torch.randint(0, 11, (3, 7), generator=torch.Generator().manual_seed(5))
    mask = torch.ones(3, 7, dtype=torch.long)
    mask[1, :2] = 0
    mask[2, :4] = 0
    with torch.no_grad():
        plain = m.generate(ids, 12, do_sample=False, attention_mask=mask)
    out = speculative_generate(m, ids, 12, draft={"n_steps": 1, "controls": "average"}, num_draft_tokens="auto",
                               attention_mask=mask)
    assert torch.equal(out.sequences, plain)


@pytest.mark.parametrize("draft, exc, message", [
    (DraftSolve(n_steps=3, controls="average"), ValueError, "draft.n_steps: N_t = 3 steps cannot average the 4 pieces"),
    (DraftSolve(n_steps=2, controls="mean"), ValueError, r"draft.controls: expected one of \('point', 'average'\)"),
    ({"n_steps": 2, "controls": None}, ValueError, "draft.controls: expected one of"),
    ({"n_steps": 2, "reading": "average"}, ValueError, "draft: unknown keys"),
])
def test_bad_averaged_drafts_are_refused_before_decoding(draft, exc, message):
    m = _model()
    ids = torch.zeros(1, 3, dtype=torch.long)
    with pytest.raises(exc, match=message):
        speculative_generate(m, ids, 4, draft=draft, num_draft_tokens=2)
    assert not any(type(x).__name__ == "PieceAverage" for x in m.modules())
