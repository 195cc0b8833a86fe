"""``DecoderLM.reset_parameters(init="nanogpt")`` against an independent transcription of
nanoGPT (plain torch, written here): its modules built under ``torch.manual_seed``, then
nanoGPT's ``_init_weights`` — normal(0, 0.02) for the linear and embedding weights, zero
biases, LayerNorm weights 1, the residual projections (attention output, feed-forward
output) normal(0, 0.02 / sqrt(2 n_layer)) — over its parameters in their order, as
benchmarks/train_text.py's peer does.  The library's model is compared through its
outputs (the logits of the same ids), not through a weight copy."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from opsplit.models import DecoderConfig, DecoderLM


class Block(nn.Module):
    def __init__(self, d, h, d_ff):
        super().__init__()
        self.h = h
        self.ln1 = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.ln2 = nn.LayerNorm(d)
        self.fc = nn.Linear(d, d_ff)
        self.out = nn.Linear(d_ff, d)

    def forward(self, x, parallel=False):
        B, N, D = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(D, -1)
        q, k, v = (t.view(B, N, self.h, D // self.h).transpose(1, 2) for t in (q, k, v))
        a = self.proj(F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(B, N, D))
        if parallel:  # GPT-J's block: both terms from the same state
            return x + a + self.out(F.gelu(self.fc(self.ln2(x))))
        x = x + a
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


class NanoGPT(nn.Module):
    def __init__(self, V, C, E, L, H, d_ff):
        super().__init__()
        self.tok = nn.Embedding(V, E)
        self.pos = nn.Embedding(C, E)
        self.blocks = nn.ModuleList(Block(E, H, d_ff) for _ in range(L))
        self.ln_f = nn.LayerNorm(E)
        # nanoGPT's _init_weights, then its scaled residual projections (c_proj: proj, out here)
        with torch.no_grad():
            for name, p in self.named_parameters():
                if name.endswith("bias"):
                    p.zero_()
                elif "ln" in name:
                    p.fill_(1.0)
                else:
                    p.normal_(0.0, 0.02 / math.sqrt(2 * L) if name.endswith(("proj.weight", "out.weight")) else 0.02)

    def forward(self, idx, parallel=False):
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1]))
        for b in self.blocks:
            x = b(x, parallel)
        return F.linear(self.ln_f(x), self.tok.weight)


def config(V, C, E, L, H, d_ff, scheme="lie", **kw):
    return DecoderConfig(vocab_size=V, d_model=E, n_layers=L, n_heads=H, d_ff=d_ff, norm="layer", norm_eps=1e-5,
                         norm_bias=True, mlp="plain", activation="gelu", positions="learned", max_positions=C,
                         qkv_bias=True, out_bias=True, mlp_bias=True, tie_embeddings=True, scheme=scheme, **kw)


def peer(seed, *shape):
    torch.manual_seed(seed)
    return NanoGPT(*shape)


@pytest.mark.parametrize("scheme", ["lie", "parallel"])
@pytest.mark.parametrize("seed", [0, 5])
def test_nanogpt_init_is_the_transcriptions_model(seed, scheme):
    """The same seed gives the transcription's weights: the logits of the same ids agree to
    float32 round-off at N_t = layers (GPT-2's block for Lie, GPT-J's for parallel), and the
    token and position tables are bitwise equal."""
    shape = (13, 12, 16, 3, 4, 40)
    ref = peer(seed, *shape)
    model = DecoderLM(config(*shape, scheme=scheme))
    model.reset_parameters(torch.Generator().manual_seed(seed), init="nanogpt")
    assert torch.equal(model.embedding.weight, ref.tok.weight)
    assert torch.equal(model.positions.weight, ref.pos.weight)
    ids = torch.randint(13, (2, 12), generator=torch.Generator().manual_seed(9))
    with torch.no_grad():
        want = ref(ids, parallel=scheme == "parallel")
        got = model.eval()(ids).logits
    assert (got - want).abs().max() < 1e-6 * want.abs().max()
    # another seed is another model
    other = DecoderLM(config(*shape, scheme=scheme))
    other.reset_parameters(torch.Generator().manual_seed(seed + 1), init="nanogpt")
    assert not torch.equal(other.embedding.weight, model.embedding.weight)


def test_nanogpt_init_float64_holds_the_float32_draws():
    """A float64 model holds the float32 draws of the transcription (cast), and its logits
    equal the transcription's in float64."""
    shape = (11, 8, 8, 2, 2, 32)
    ref = peer(2, *shape).double()
    model = DecoderLM(config(*shape), dtype=torch.float64)
    model.reset_parameters(torch.Generator().manual_seed(2), init="nanogpt")
    assert model.embedding.weight.dtype == torch.float64
    assert torch.equal(model.embedding.weight, ref.tok.weight)
    ids = torch.randint(11, (3, 8), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert torch.allclose(model.eval()(ids).logits, ref(ids), rtol=0, atol=1e-12)


def test_nanogpt_init_distribution():
    """The distribution of nanoGPT's _init_weights on a wider model: every weight's sample
    std within 3 % of 0.02, the residual projections' of 0.02 / sqrt(2 L); biases 0, norm
    weights 1 (the model's own tensors, read by name)."""
    E, L, H, d_ff = 96, 4, 4, 384
    model = DecoderLM(config(97, 64, E, L, H, d_ff))
    model.reset_parameters(torch.Generator().manual_seed(0), init="nanogpt")
    a, f = model.attention, model.ffn
    (n1,), (n2,) = model.norms
    res = 0.02 / math.sqrt(2 * L)

    def stack(ctl):
        return torch.stack(list(ctl.pieces)).detach()

    for t, std in ((model.embedding.weight.detach(), 0.02), (model.positions.weight.detach(), 0.02), (stack(a.WQ), 0.02),
                   (stack(a.WK), 0.02), (stack(a.WV), 0.02), (stack(f.W1), 0.02), (stack(a.WO), res),
                   (stack(f.W2), res)):
        assert abs(float(t.std()) / std - 1) < 0.03, (t.shape, float(t.std()), std)
        assert abs(float(t.mean())) < 0.1 * std
    for c in (a.bQ, a.bK, a.bV, a.bO, f.b1, f.b2, n1.bias, n2.bias):
        assert not stack(c).any()
    for c in (n1.weight, n2.weight):
        assert bool((stack(c) == 1).all())
    assert bool((model.final_norm[0].weight.value == 1).all()) and not model.final_norm[0].bias.value.any()


def test_nanogpt_init_global_generator_and_default_unchanged():
    """``generator=None`` draws from torch's global generator (as nn modules do); a passed
    generator leaves the global one untouched; the default initialisation is GPT-2's as
    before (every weight std 0.02: the residual projections too)."""
    shape = (13, 12, 16, 3, 4, 40)
    ref = peer(4, *shape)
    torch.manual_seed(4)
    model = DecoderLM(config(*shape))
    torch.manual_seed(4)
    model.reset_parameters(init="nanogpt")
    assert torch.equal(model.embedding.weight, ref.tok.weight)
    torch.manual_seed(1)
    state = torch.get_rng_state()
    model.reset_parameters(torch.Generator().manual_seed(4), init="nanogpt")
    assert torch.equal(torch.get_rng_state(), state)
    d1 = DecoderLM(config(*shape), generator=torch.Generator().manual_seed(0))
    d2 = DecoderLM(config(*shape))
    d2.reset_parameters(torch.Generator().manual_seed(0))
    assert all(torch.equal(x, y) for x, y in zip(d1.state_dict().values(), d2.state_dict().values()))
    W2 = torch.stack(list(d2.ffn.W2.pieces)).detach()
    assert abs(float(W2.std()) / 0.02 - 1) < 0.1  # GPT-2's: no residual scaling
