"""Seeded random Hugging Face decoder configurations (GPT-2, Llama, Qwen2, Mistral), built
from configs only (no download): the cases on which opsplit's converted decoder-only models
are compared with Hugging Face's (the tests of :func:`opsplit.models.from_hf` and
``python benchmarks/llm.py --exactness`` read the same cases).  Every config is a function of
its seed; :func:`build` makes the model in eval mode with its weights perturbed so that
attention is far from uniform, :func:`left_padded` a batch of token ids with left padding.

``transformers`` is imported when a config is built (an optional package).
"""

from __future__ import annotations

import random

import torch

__all__ = ["gpt2_config", "llama_config", "qwen2_config", "mistral_config", "build", "left_padded", "CONFIG",
           "CAUSAL_LM", "BASE"]


def _transformers():
    import transformers  # optional: only a built config needs it

    return transformers


GPT2_ACTS = ["gelu_new", "gelu", "relu", "gelu_pytorch_tanh", "silu", "gelu_fast", "quick_gelu", "tanh"]


def gpt2_config(seed: int):
    r = random.Random(1000 + seed)
    H = r.choice([1, 2, 3, 4])
    E = H * r.choice([2, 4, 6, 8])
    return _transformers().GPT2Config(
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
    return _transformers().LlamaConfig(
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
    return _transformers().Qwen2Config(
        vocab_size=r.choice([45, 64]), hidden_size=E, intermediate_size=2 * E + 1, num_hidden_layers=1 + seed % 3,
        num_attention_heads=H, num_key_value_heads=kv, rope_theta=r.choice([10000.0, 1e6]),
        rms_norm_eps=1e-6, tie_word_embeddings=seed % 2 == 0, bos_token_id=1, eos_token_id=2,
        max_position_embeddings=128,
    )


def mistral_config(seed: int):
    r = random.Random(4000 + seed)
    return _transformers().MistralConfig(
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
    cls = getattr(_transformers(), (CAUSAL_LM if lm else BASE)[family])
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
