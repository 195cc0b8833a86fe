"""Random seeded Hugging Face decoder configurations for the tests of opsplit's decoder-only
models (GPT-2, Llama, Qwen2, Mistral), built from configs only (no download)."""

from __future__ import annotations

import random

import torch

transformers = __import__("pytest").importorskip("transformers")

GPT2_ACTS = ["gelu_new", "gelu", "relu", "gelu_pytorch_tanh", "silu", "gelu_fast", "quick_gelu", "tanh"]


def gpt2_config(seed: int):
    r = random.Random(1000 + seed)
    H = r.choice([1, 2, 3, 4])
    E = H * r.choice([2, 4, 6, 8])
    return transformers.GPT2Config(
        vocab_size=r.choice([37, 50, 64]), n_embd=E, n_layer=r.choice([1, 2, 3]), n_head=H,
        n_positions=r.choice([40, 48, 64]), n_inner=r.choice([None, 3 * E + 1]), activation_function=GPT2_ACTS[seed % 8],
        layer_norm_epsilon=r.choice([1e-5, 1e-6, 1e-3]), scale_attn_weights=seed % 5 != 3,
        tie_word_embeddings=seed % 4 != 1, bos_token_id=1, eos_token_id=2, pad_token_id=None,
        resid_pdrop=0.1, embd_pdrop=0.1, attn_pdrop=0.1,
    )


#: rope_theta of Llama seeds 0..7 (every value twice) and their layers (seed 6, grouped-query
#: with 4 key/value heads for 8 query heads, on 3 layers)
LLAMA_THETAS = [10000.0, 500000.0, 100.0, 1e6]
LLAMA_LAYERS = [1, 2, 3, 1, 2, 3, 3, 2]


def llama_config(seed: int):
    r = random.Random(2000 + seed)
    kv = r.choice([1, 2, 4])  # multi-query (1), grouped-query
    H = kv * r.choice([1, 2, 3])
    d = r.choice([2, 4, 6, 8])
    E = H * r.choice([2, 4])
    return transformers.LlamaConfig(
        vocab_size=r.choice([41, 50, 64]), hidden_size=E, intermediate_size=r.choice([E, 2 * E + 3]),
        num_hidden_layers=LLAMA_LAYERS[seed % 8], num_attention_heads=H, num_key_value_heads=kv, head_dim=d,
        rms_norm_eps=r.choice([1e-6, 1e-5, 1e-3]), rope_theta=LLAMA_THETAS[seed % 4],
        attention_bias=seed % 2 == 1, mlp_bias=seed % 3 == 2, tie_word_embeddings=seed % 4 in (1, 2),
        hidden_act=["silu", "silu", "gelu", "relu"][seed % 4], bos_token_id=1, eos_token_id=2,
        pad_token_id=[None, 0][seed % 2], max_position_embeddings=128,
    )


def qwen2_config(seed: int):
    r = random.Random(3000 + seed)
    kv = r.choice([1, 2])
    H = kv * r.choice([2, 3])
    E = H * r.choice([2, 4])
    return transformers.Qwen2Config(
        vocab_size=r.choice([45, 64]), hidden_size=E, intermediate_size=2 * E + 1, num_hidden_layers=1 + seed % 3,
        num_attention_heads=H, num_key_value_heads=kv, rope_theta=r.choice([10000.0, 1e6]),
        rms_norm_eps=1e-6, tie_word_embeddings=seed % 2 == 0, bos_token_id=1, eos_token_id=2,
        max_position_embeddings=128,
    )


def mistral_config(seed: int):
    r = random.Random(4000 + seed)
    return transformers.MistralConfig(
        vocab_size=48, hidden_size=16, intermediate_size=28, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=r.choice([1, 2]), head_dim=6, sliding_window=None, rope_theta=1e6,
        bos_token_id=1, eos_token_id=2, max_position_embeddings=128,
    )


CAUSAL_LM = {"gpt2": "GPT2LMHeadModel", "llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM",
             "mistral": "MistralForCausalLM"}
BASE = {"gpt2": "GPT2Model", "llama": "LlamaModel", "qwen2": "Qwen2Model", "mistral": "MistralModel"}
CONFIG = {"gpt2": gpt2_config, "llama": llama_config, "qwen2": qwen2_config, "mistral": mistral_config}


def build(family: str, seed: int, *, dtype=torch.float64, lm: bool = True, scale: float = 0.3, width1: bool = False):
    """A Hugging Face model of ``family`` from the seeded config, in eval mode, its weights
    perturbed by ``scale`` * N(0, 1) (so that attention is far from uniform); ``width1``: a
    feed-forward hidden width of 1 (``n_inner`` / ``intermediate_size``)."""
    cfg = CONFIG[family](seed)
    if width1:
        setattr(cfg, "n_inner" if family == "gpt2" else "intermediate_size", 1)
    cls = getattr(transformers, (CAUSAL_LM if lm else BASE)[family])
    torch.manual_seed(seed)
    model = cls(cfg).to(dtype).eval()
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(scale * torch.randn(p.shape, generator=g, dtype=torch.float64).to(p.dtype))
    return model


def left_padded(vocab: int, B: int, N: int, seed: int, pad_id: int = 0):
    """Token ids ``(B, N)`` and a 0/1 mask with left padding of different lengths (sample 0
    unpadded, the others 1..N-1 pads)."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, vocab, (B, N), generator=g)
    mask = torch.ones(B, N, dtype=torch.long)
    for b in range(1, B):
        mask[b, : min(N - 1, 2 * b - 1)] = 0
    return ids.masked_fill(mask == 0, pad_id), mask


class _Config4x:
    """A transformers 4.x view of a 5.x config: ``rope_theta`` and ``rope_scaling`` (and any
    other ``extra`` attribute) as 4.x configs have them, no ``rope_parameters``; every other
    attribute read from the wrapped config."""

    def __init__(self, cfg, rope_scaling=None, **extra):
        rp = getattr(cfg, "rope_parameters", None)
        theta = rp["rope_theta"] if rp is not None else cfg.rope_theta
        self.__dict__.update({"_cfg": cfg, "rope_theta": theta, "rope_scaling": rope_scaling, **extra})

    def __getattr__(self, name):
        if name == "rope_parameters":
            raise AttributeError(name)
        return getattr(self.__dict__["_cfg"], name)


def as_4x(hf, **kw):
    """``hf`` with its decoder's config seen as transformers 4.x writes it."""
    base = hf.model if hasattr(hf, "model") else hf
    base.config = _Config4x(base.config, **kw)
    return hf
