"""``opsplit convert`` for the decoder-only LLMs: a Hugging Face GPT-2, Llama, Qwen2 or Mistral
causal LM built from a small config (seeded random weights, no download) converted to
opsplit (:func:`opsplit.models.from_hf`, a :class:`~opsplit.models.DecoderLM`), compared on
the logits of a left-padded batch, the gradients of every parameter and greedy generation
with the key/value cache (:mod:`opsplit.cli.convert` plugs these in beside the torch
encoder, ViT and CvT).

A config section per family (``[gpt2]``, ``[llama]``, ``[qwen2]``, ``[mistral]``) holds the
Hugging Face config keys the command sets (the others keep transformers' defaults; no
sliding window, no rotary scaling) plus ``seq_len`` (prompt tokens) and ``new_tokens``
(greedy tokens generated).  TOML has no null: ``n_inner = 0`` and ``head_dim = 0`` mean
transformers' default (``4 n_embd``, ``hidden_size / num_attention_heads``).
"""

from __future__ import annotations

import torch

from ..models import from_hf, hf_state_dict
from .budget import Estimate
from .config import ConfigError, Field, at_least, positive
from .conversion import diff, perturb

__all__ = ["FAMILIES", "SCHEMA", "check", "estimate", "BUILDERS", "CONVERTERS", "forward_flops"]

FAMILIES = ("gpt2", "llama", "qwen2", "mistral")
#: activations (transformers' names) that the converter maps onto opsplit's
ACTIVATIONS = ("gelu", "gelu_new", "gelu_fast", "gelu_pytorch_tanh", "quick_gelu", "relu", "silu", "tanh")
_CLASSES = {"gpt2": ("GPT2Config", "GPT2LMHeadModel"), "llama": ("LlamaConfig", "LlamaForCausalLM"),
            "qwen2": ("Qwen2Config", "Qwen2ForCausalLM"), "mistral": ("MistralConfig", "MistralForCausalLM")}


def _tokens() -> dict:
    return {
        "seq_len": Field("int", 8, "prompt tokens per sequence (left-padded in a batch)", at_least(1)),
        "new_tokens": Field("int", 16, "greedy tokens generated with the key/value cache", at_least(1)),
    }


def _llama_like(*, kv: int, theta: float, eps: float, tie: bool, head_dim: bool, biases: bool) -> dict:
    s = {
        "vocab_size": Field("int", 64, "token vocabulary", at_least(2)),
        "hidden_size": Field("int", 16, "model width", at_least(1)),
        "intermediate_size": Field("int", 24, "gated FFN hidden width", at_least(1)),
        "num_hidden_layers": Field("int", 2, "decoder layers", at_least(1)),
        "num_attention_heads": Field("int", 4, "query heads", at_least(1)),
        "num_key_value_heads": Field("int", kv, "key/value heads (a divisor of the query heads; 1: multi-query)",
                                     at_least(1)),
    }
    if head_dim:
        s["head_dim"] = Field("int", 0, "head size (0: hidden_size / num_attention_heads)", at_least(0))
    s |= {
        "rope_theta": Field("float", theta, "rotary base theta", positive),
        "rms_norm_eps": Field("float", eps, "RMSNorm eps", positive),
    }
    if biases:
        s |= {"attention_bias": Field("bool", False, "q/k/v/o biases"),
              "mlp_bias": Field("bool", False, "gate/up/down biases")}
    s |= {"tie_word_embeddings": Field("bool", tie, "the read-out is the token table"),
          "hidden_act": Field("str", "silu", "the gate's activation", choices=ACTIVATIONS), **_tokens()}
    return s


SCHEMA = {
    "gpt2": {  # transformers.GPT2LMHeadModel(GPT2Config(...)), dropout 0
        "vocab_size": Field("int", 64, "token vocabulary", at_least(2)),
        "n_embd": Field("int", 16, "model width", at_least(1)),
        "n_layer": Field("int", 2, "decoder layers", at_least(1)),
        "n_head": Field("int", 2, "attention heads (a divisor of n_embd)", at_least(1)),
        "n_inner": Field("int", 0, "FFN hidden width (0: 4 n_embd)", at_least(0)),
        "n_positions": Field("int", 64, "learned positions (at least seq_len + new_tokens)", at_least(1)),
        "activation_function": Field("str", "gelu_new", "FFN activation", choices=ACTIVATIONS),
        "layer_norm_epsilon": Field("float", 1e-5, "LayerNorm eps", positive),
        "tie_word_embeddings": Field("bool", True, "the read-out is the token table"),
        **_tokens(),
    },
    # transformers.LlamaForCausalLM(LlamaConfig(...))
    "llama": _llama_like(kv=2, theta=10000.0, eps=1e-6, tie=False, head_dim=True, biases=True),
    # transformers.Qwen2ForCausalLM(Qwen2Config(...)): q/k/v biases, no sliding window
    "qwen2": _llama_like(kv=2, theta=1e6, eps=1e-6, tie=True, head_dim=False, biases=False),
    # transformers.MistralForCausalLM(MistralConfig(...)): sliding_window None
    "mistral": _llama_like(kv=1, theta=1e6, eps=1e-5, tie=False, head_dim=True, biases=False),
}


def _head_dim(name: str, s: dict) -> int:
    """The head size of a Llama-family section (checked: a whole, even number)."""
    H, E = s["num_attention_heads"], s["hidden_size"]
    if s.get("head_dim", 0):
        d, what = s["head_dim"], f"{name}.head_dim"
    else:
        if E % H:
            raise ConfigError(f"{name}.num_attention_heads: expected a divisor of {name}.hidden_size = {E}"
                              + (f" (or set {name}.head_dim)" if "head_dim" in s else "") + f", got {H}")
        d, what = E // H, f"{name}.hidden_size / {name}.num_attention_heads"
    if d % 2:
        raise ConfigError(f"{what}: rotary positions turn pairs of features; expected an even head size, got {d}")
    return d


def check(cfg, models) -> None:
    """The cross-key checks of the requested decoder families (no model built)."""
    for name in models:
        s = cfg[name]
        if name == "gpt2":
            if s["n_embd"] % s["n_head"]:
                raise ConfigError(f"gpt2.n_head: expected a divisor of gpt2.n_embd = {s['n_embd']}, got {s['n_head']}")
            if s["seq_len"] + s["new_tokens"] > s["n_positions"]:
                raise ConfigError(
                    f"gpt2.new_tokens: a prompt of gpt2.seq_len = {s['seq_len']} tokens plus {s['new_tokens']} new "
                    f"ones exceeds GPT-2's learned positions, gpt2.n_positions = {s['n_positions']}; expected "
                    f"seq_len + new_tokens <= n_positions"
                )
            continue
        H, kv = s["num_attention_heads"], s["num_key_value_heads"]
        if H % kv:
            raise ConfigError(f"{name}.num_key_value_heads: expected a divisor of {name}.num_attention_heads = {H} "
                              f"(groups of equal size), got {kv}")
        _head_dim(name, s)


def _hf_config(name: str, s: dict):
    # optional (checked by convert.check), and slow to import
    import transformers

    kw = {k: v for k, v in s.items() if k not in ("seq_len", "new_tokens")}
    kw |= {"bos_token_id": None, "eos_token_id": None, "pad_token_id": None}
    if name == "gpt2":
        kw["n_inner"] = kw["n_inner"] or None
        kw |= {"resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0}
    else:
        if "head_dim" in kw:
            kw["head_dim"] = kw["head_dim"] or None
        kw["max_position_embeddings"] = s["seq_len"] + s["new_tokens"]
        if name == "mistral":
            kw["sliding_window"] = None
    return getattr(transformers, _CLASSES[name][0])(**kw)


def reference(name: str, s: dict, seed: int):
    """The Hugging Face causal LM of section ``s`` with seeded random weights (eval mode)."""
    # optional (checked by convert.check), and slow to import
    import transformers

    torch.manual_seed(seed)
    return getattr(transformers, _CLASSES[name][1])(_hf_config(name, s)).eval()


def _build(name):
    def build(s: dict, seed: int):
        return from_hf(reference(name, s, seed))

    return build


BUILDERS = {name: _build(name) for name in FAMILIES}


def _sizes(name: str, s: dict) -> tuple:
    """``(E, layers, H, H_kv, d, F, V, gated, tied, n_pos)`` of a section."""
    if name == "gpt2":
        E, H = s["n_embd"], s["n_head"]
        return (E, s["n_layer"], H, H, max(E // H, 1), s["n_inner"] or 4 * E, s["vocab_size"], False,
                s["tie_word_embeddings"], s["n_positions"])
    H = s["num_attention_heads"]
    d = s.get("head_dim", 0) or max(s["hidden_size"] // H, 1)
    return (s["hidden_size"], s["num_hidden_layers"], H, s["num_key_value_heads"], d, s["intermediate_size"],
            s["vocab_size"], True, s["tie_word_embeddings"], 0)


def forward_flops(name: str, s: dict, B: int, N: int) -> float:
    """Matrix-product flops of one forward pass over ``B x N`` tokens (projections,
    feed-forward, scores and their weighted sums, the read-out)."""
    E, L, H, kv, d, Fz, V, gated, _, _ = _sizes(name, s)
    per_token = 2.0 * E * (H + 2 * kv) * d + 2.0 * H * d * E + (3 if gated else 2) * 2.0 * E * Fz
    return L * (B * N * per_token + 4.0 * B * H * N * N * d) + 2.0 * B * N * E * V


def estimate(cfg, name: str, B: int) -> Estimate:
    """Per dtype: both models' forward and backward (3 forward passes' flops each) and greedy
    generation on both sides (one token a step after the prompt); both models' parameters
    and one autograd graph each at the peak."""
    s = cfg[name]
    E, L, H, kv, d, Fz, V, gated, tied, P = _sizes(name, s)
    N, new = s["seq_len"], s["new_tokens"]
    f = 6.0 * forward_flops(name, s, B, N)
    ctx = N + new
    step = forward_flops(name, s, B, 1) - L * 4.0 * B * H * d  # one new token, attention counted below
    f += 2.0 * (forward_flops(name, s, B, N) + new * step + L * 4.0 * B * H * d * new * ctx)
    params = V * E * (1 if tied else 2) + P * E + L * (E * (H + 2 * kv) * d + H * d * E
                                                      + (3 if gated else 2) * E * Fz + 4.0 * E)
    act = L * (B * N * (10.0 * E + 3.0 * Fz) + 3.0 * B * H * N * N) + B * N * V
    cache = 2.0 * L * B * kv * d * ctx
    calls = 6 * L * 8 + 2 * new * (L * 4 + 2)
    return Estimate(f, float(calls), 2.0 * params + 2.0 * act + 2.0 * cache)


def _left_padded(V: int, B: int, N: int, gen) -> tuple:
    """Token ids ``(B, N)`` and a 0/1 mask: sample ``b`` has ``min(N - 1, 2b - 1)`` left pads."""
    ids = torch.randint(0, V, (B, N), generator=gen)
    mask = torch.ones(B, N, dtype=torch.long)
    for b in range(1, B):
        mask[b, : min(N - 1, 2 * b - 1)] = 0
    return ids.masked_fill(mask == 0, 0), mask


def convert_decoder(name: str, s: dict, batch: int, seed: int, dtype) -> dict:
    """Build the HF model, convert it, compare the logits of every position of a left-padded
    batch, the gradients of a random linear functional of them with respect to every
    parameter (relative to the largest entry of each HF gradient), and greedy generation."""
    gen = torch.Generator().manual_seed(seed)
    ref = perturb(reference(name, s, seed), gen).to(dtype)
    model = from_hf(ref).eval()
    V, N = s["vocab_size"], s["seq_len"]
    ids, mask = _left_padded(V, batch, N, gen)
    r = ref(input_ids=ids, attention_mask=mask).logits
    o = model(ids, mask).logits
    w = torch.randn(r.shape, generator=gen, dtype=torch.float64).to(dtype)
    (r * w).sum().backward()
    (o * w).sum().backward()
    out_abs, out_rel = diff(o.detach(), r.detach())
    ours = hf_state_dict(model, grads=True)
    worst = 0.0
    for n, p in ref.named_parameters():
        g = torch.zeros_like(p) if p.grad is None else p.grad
        worst = max(worst, float((ours[n] - g).abs().max()) / max(float(g.abs().max()), 1e-300))
    new = s["new_tokens"]
    with torch.no_grad():
        a = model.generate(ids, new, attention_mask=mask, eos_token_id=None)
        b = ref.generate(ids, attention_mask=mask, max_new_tokens=new, do_sample=False, eos_token_id=None,
                         pad_token_id=0)
    same = int((a[:, N:] == b[:, N:]).sum()) if a.shape == b.shape else 0
    E, L, H, kv = _sizes(name, s)[:4]
    heads = f"{H} heads" if name == "gpt2" else f"{H} heads / {kv} key-value"
    return {"model": f"HF {_CLASSES[name][1]} ({L} layers, width {E}, {heads})",
            "opsplit class": type(model).__name__, "dtype": str(dtype).replace("torch.", ""),
            "max abs diff (output)": out_abs, "relative diff (output)": out_rel,
            "max abs diff (input grad)": "", "relative diff (parameter grads)": worst,
            "greedy tokens equal": f"{same}/{batch * new}", "round trip": "",
            "parameters": sum(p.numel() for p in ref.parameters())}


CONVERTERS = {name: (lambda s, batch, seed, dtype, name=name: convert_decoder(name, s, batch, seed, dtype))
              for name in FAMILIES}
