"""Decoder-only LLMs against Hugging Face transformers: GPT2Model / GPT2LMHeadModel,
LlamaModel / LlamaForCausalLM, Qwen2 and Mistral built from random seeded configs (no
download), converted by ``opsplit.models.from_hf``.

For every config, in float32 and float64, with a left-padded attention mask: the logits (or
the last hidden state of the base models) at *every* position within 1e-5 / 1e-10 of HF's,
relative to the largest one, and the gradient of a random linear functional of them with
respect to every HF parameter (mapped through ``hf_state_dict(..., grads=True)``) within the
same tolerances, relative to the largest entry of that parameter's gradient. In float32 a
parameter outside 1e-5 of HF's gradient passes only if opsplit's gradient is at least as close
as HF's own to the float64 gradient of the same model (HF's float32 round-off exceeds the
tolerance there: ``gpt2`` seed 1, whose HF float32 gradients are 1.0e-5 from float64 and
opsplit's 4.3e-6)."""

from __future__ import annotations

import pytest
import torch
from _llm_configs import build, left_padded, transformers  # noqa: E402

from opsplit.models import DecoderLM, from_hf, hf_state_dict, to_hf  # noqa: E402

TOL = {torch.float32: 1e-5, torch.float64: 1e-10}
CASES = ([("gpt2", s) for s in range(8)] + [("llama", s) for s in range(8)] + [("qwen2", s) for s in range(3)]
         + [("mistral", 0)])


def _loss_grads(model, seed, lm):
    """The gradients of ``_compare``'s seeded linear functional of the HF ``model``'s outputs,
    by parameter name."""
    ids, mask = left_padded(model.config.vocab_size, 3, 9, seed)
    ref = model(input_ids=ids, attention_mask=mask)
    r = ref.logits if lm else ref.last_hidden_state
    w = torch.randn(r.shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64).to(r.dtype)
    (r * w).sum().backward()
    return {n: p.grad for n, p in model.named_parameters()}


def _compare(hf, ours, dtype, seed, lm=True, family=None):
    V = hf.config.vocab_size
    ids, mask = left_padded(V, 3, 9, seed)
    ref = hf(input_ids=ids, attention_mask=mask)
    out = ours(ids, mask)
    r = ref.logits if lm else ref.last_hidden_state
    o = out.logits if lm else out.last_hidden_state
    tol = TOL[dtype]
    err = float((o - r).abs().max().detach() / r.abs().max().detach())
    assert err <= tol, f"outputs differ by {err:.3g} (relative to the largest)"
    w = torch.randn(r.shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64).to(dtype)
    (r * w).sum().backward()
    (o * w).sum().backward()
    ours_g = hf_state_dict(ours, grads=True)
    hf_g = {n: p.grad for n, p in hf.named_parameters()}
    assert set(ours_g) == set(hf_g), f"parameter sets differ: {set(ours_g) ^ set(hf_g)}"
    worst = {}
    for n, g in hf_g.items():
        scale = float(g.abs().max())
        if scale == 0:
            assert float(ours_g[n].abs().max()) == 0, n
            continue
        worst[n] = float((ours_g[n] - g).abs().max()) / scale
    bad = {n: e for n, e in worst.items() if e > tol}
    if bad and dtype == torch.float32 and family is not None:
        # the float64 gradient of the same model referees: HF's float32 round-off, not a
        # difference of the maps, if opsplit's float32 gradient is at least as close to it
        truth = _loss_grads(build(family, seed, dtype=torch.float64, lm=lm), seed, lm)
        for n in list(bad):
            t, scale = truth[n], float(truth[n].abs().max())
            e_hf = float((hf_g[n].double() - t).abs().max()) / scale
            e_ours = float((ours_g[n].double() - t).abs().max()) / scale
            if e_ours <= max(tol, e_hf):
                del bad[n]
    assert not bad, f"gradients differ: {bad}"


@pytest.mark.parametrize("family,seed", CASES, ids=[f"{f}{s}" for f, s in CASES])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["f32", "f64"])
def test_causal_lm_logits_and_gradients(family, seed, dtype):
    hf = build(family, seed, dtype=dtype)
    ours = from_hf(hf)
    assert isinstance(ours, DecoderLM) and not ours.training
    _compare(hf, ours, dtype, seed, family=family)


@pytest.mark.parametrize("family,seed", [("gpt2", 3), ("llama", 4), ("qwen2", 1), ("mistral", 0)])
def test_base_model_last_hidden_state(family, seed):
    hf = build(family, seed, lm=False)
    ours = from_hf(hf)
    assert ours.head_weight is None
    _compare(hf, ours, torch.float64, seed, lm=False)


@pytest.mark.parametrize("family,seed", [("gpt2", 1), ("llama", 2), ("qwen2", 0)])
def test_to_hf_is_a_weight_copy(family, seed):
    hf = build(family, seed)
    back = to_hf(from_hf(hf))
    assert type(back) is type(hf)
    a, b = hf.state_dict(), back.state_dict()
    assert set(a) == set(b)
    assert all(torch.equal(a[k], b[k]) for k in a)
    tied_hf = hf.lm_head.weight is hf.get_input_embeddings().weight
    assert (back.lm_head.weight is back.get_input_embeddings().weight) == tied_hf


def test_requires_grad_and_training_mode_are_kept():
    hf = build("llama", 1)
    hf.train()
    hf.model.embed_tokens.weight.requires_grad_(False)
    ours = from_hf(hf)
    assert ours.training
    assert not ours.embedding.weight.requires_grad
    assert ours.attention.WQ.pieces[0].requires_grad


def test_tied_read_out_is_one_parameter():
    hf = build("llama", 1)  # seed 1: tie_word_embeddings=True
    assert hf.lm_head.weight is hf.model.embed_tokens.weight
    ours = from_hf(hf)
    assert ours.head is None and ours.head_weight is ours.embedding.weight


def test_pad_token_row_gets_no_gradient_as_in_hf():
    hf = build("llama", 1)  # pad_token_id = 0
    ours = from_hf(hf)
    assert ours.embedding.padding_idx == 0
    ids, mask = left_padded(hf.config.vocab_size, 2, 6, 0)
    ours(ids, mask).last_hidden_state.sum().backward()
    assert float(ours.embedding.weight.grad[0].abs().max()) == 0


def test_refined_token_grid_changes_only_the_positions():
    """Rotary positions are defined for every x: on a grid of spacing 1/2 the tokens sit at
    xi = i/2, and the model equals the HF model fed those (real) positions."""
    from opsplit import Grid, Interval

    hf = build("llama", 0)
    ours = from_hf(hf)
    ids, _ = left_padded(hf.config.vocab_size, 1, 6, 0)
    grid = Grid(x=Interval(spacing=0.5), y=Interval.paper(hf.config.hidden_size), h=ours.decoder.grid.h)
    ours.decoder.grid = grid
    out = ours(ids).logits
    # reference: the same model on the paper grid with explicit positions 0, 0.5, 1, ...
    ours.decoder.grid = Grid.paper(None, hf.config.hidden_size, nh=hf.config.num_attention_heads)
    ref = ours(ids, position_ids=torch.arange(6, dtype=torch.float64)[None] * 0.5).logits
    torch.testing.assert_close(out, ref, rtol=0, atol=1e-12)
    assert not torch.allclose(out, ours(ids).logits)
    assert transformers is not None
