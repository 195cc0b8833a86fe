"""nanoGPT's initialisation of a GPT-2-layout :class:`~opsplit.models.DecoderLM`
(``DecoderLM.reset_parameters(generator, init="nanogpt")``).

nanoGPT (Karpathy) initialises every linear and embedding weight normal with standard
deviation 0.02, the residual projections (attention output, feed-forward output) with
:math:`0.02/\\sqrt{2L}` (:math:`L` layers), every bias 0 and every LayerNorm weight 1.  The
weights are drawn as a plain-torch nanoGPT draws them, so that the same seed gives the same
numbers: its modules built in order — token and position ``nn.Embedding`` (their default
draws, ``normal(0, 1)``), per layer the ``nn.Linear`` of q, k, v (one, ``3E x E``), of the
attention output, of the feed-forward input and output (their default draws:
``kaiming_uniform_(a=sqrt(5))`` and a uniform bias), then the draws above over its
parameters in their order (token table, positions, per layer ln1, qkv, proj, ln2, fc, out;
final LayerNorm).  The default draws are thrown away; they only advance the generator as
construction does.  With the same seed (``torch.manual_seed(s)`` before the plain-torch
model, ``torch.Generator().manual_seed(s)`` here) the weights equal those of
``benchmarks/train_text.NanoGPT`` (float32 draws, cast to the model's dtype), laid out as
:func:`benchmarks/train_text.copy_peer_weights` lays them out: layer ``l`` is control piece
``l``, the fused q, k, v rows split into W^Q, W^K, W^V per head.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

__all__ = ["nanogpt_draws", "nanogpt_init", "INITS"]

#: the initialisations of :meth:`DecoderLM.reset_parameters`: GPT-2's (every weight normal
#: with std 0.02, drawn from the generator in the model's parameter order) and nanoGPT's
INITS = ("gpt2", "nanogpt")


def _check_layout(config) -> None:
    """The GPT-2 layout nanoGPT has: LayerNorm, learned positions, a plain feed-forward,
    softmax attention with H_kv = H, the read-out tied to the token table."""
    want = {"norm": "layer", "positions": "learned", "mlp": "plain", "attention": "softmax",
            "tie_embeddings": True, "lm_head": True}
    for k, v in want.items():
        if getattr(config, k) != v:
            raise ValueError(f"DecoderLM.reset_parameters.init: 'nanogpt' initialises nanoGPT's layout (norm='layer', "
                             f"positions='learned', mlp='plain', attention='softmax', tie_embeddings=True); this "
                             f"model has {k}={getattr(config, k)!r}")
    if config.n_kv_heads != config.n_heads or config.head_dim * config.n_heads != config.d_model:
        raise ValueError(f"DecoderLM.reset_parameters.init: 'nanogpt' initialises nanoGPT's attention (H_kv = H "
                         f"heads of d_model / H features); this model has n_kv_heads={config.n_kv_heads}, "
                         f"n_heads={config.n_heads}, head_dim={config.head_dim}, d_model={config.d_model}")


def nanogpt_draws(vocab_size: int, context: int, d_model: int, n_layers: int, d_ff: int,
                  generator: torch.Generator | None = None) -> dict[str, Tensor]:
    """nanoGPT's initial weights in its own names and shapes (module docstring), float32:
    ``tok.weight (V, E)``, ``pos.weight (C, E)``, ``blocks.<l>.{ln1, qkv, proj, ln2, fc,
    out}.{weight, bias}`` (``nn.Linear``'s ``(out, in)`` weights), ``ln_f.{weight, bias}``.
    ``generator=None`` draws from torch's global generator, as ``nn`` modules do."""
    g, f32 = generator, torch.float32
    E, L = d_model, n_layers

    def embedding(n):
        w = torch.empty(n, E, dtype=f32)
        nn.init.normal_(w, generator=g)
        return w

    def linear(n_out, n_in):
        w, b = torch.empty(n_out, n_in, dtype=f32), torch.empty(n_out, dtype=f32)
        nn.init.kaiming_uniform_(w, a=math.sqrt(5), generator=g)
        bound = 1.0 / math.sqrt(n_in)
        nn.init.uniform_(b, -bound, bound, generator=g)
        return w, b

    # construction: the modules' default draws, in nanoGPT's order
    p = {"tok.weight": embedding(vocab_size), "pos.weight": embedding(context)}
    for i in range(L):
        for name, (n_out, n_in) in (("qkv", (3 * E, E)), ("proj", (E, E)), ("fc", (d_ff, E)), ("out", (E, d_ff))):
            p[f"blocks.{i}.{name}.weight"], p[f"blocks.{i}.{name}.bias"] = linear(n_out, n_in)
    # nanoGPT's own initialisation over the parameters in their registration order
    order = ["tok.weight", "pos.weight"]
    for i in range(L):
        order += [f"blocks.{i}.{n}.{w}" for n in ("ln1", "qkv", "proj", "ln2", "fc", "out") for w in ("weight", "bias")]
    order += ["ln_f.weight", "ln_f.bias"]
    residual = 0.02 / math.sqrt(2 * L)
    out = {}
    for name in order:
        if name.endswith("bias"):
            out[name] = torch.zeros(p[name].shape if name in p else E, dtype=f32)
        elif ".ln" in name or name.startswith("ln"):
            out[name] = torch.ones(E, dtype=f32)
        else:
            w = p[name]
            nn.init.normal_(w, 0.0, residual if name.endswith(("proj.weight", "out.weight")) else 0.02, generator=g)
            out[name] = w
    return out


def _piece(control, i: int) -> Tensor:
    """The stored weights of control piece ``i`` (a ``LayerwiseConstant``'s parameter, a
    ``PiecewiseConstant``'s row)."""
    return control.pieces[i] if hasattr(control, "pieces") else control.raw[i]


@torch.no_grad()
def nanogpt_init(model, generator: torch.Generator | None = None) -> None:
    """Set every parameter of ``model`` (a :class:`~opsplit.models.DecoderLM` of nanoGPT's
    layout) to nanoGPT's initial weights (:func:`nanogpt_draws`); a bias or norm the model
    does not have is skipped."""
    c = model.config
    _check_layout(c)
    E, H = c.d_model, c.n_heads
    w = nanogpt_draws(c.vocab_size, c.max_positions, E, c.n_layers, c.d_ff, generator)
    pairs = [(model.embedding.weight, w["tok.weight"]), (model.positions.weight, w["pos.weight"])]
    n1, n2 = (n[0] for n in model.norms)
    a, f = model.attention, model.ffn

    def add(control, i, value):
        if control is not None:
            pairs.append((_piece(control, i), value))

    for i in range(c.n_layers):
        b = f"blocks.{i}."
        for norm, ln in ((n1, "ln1"), (n2, "ln2")):
            add(norm.weight, i, w[b + ln + ".weight"])
            add(norm.bias, i, w[b + ln + ".bias"])
        add(f.W1, i, w[b + "fc.weight"].t())
        add(f.b1, i, w[b + "fc.bias"])
        add(f.W2, i, w[b + "out.weight"].t())
        add(f.b2, i, w[b + "out.bias"])
        for W, bias, cW, cb in zip(w[b + "qkv.weight"].split(E), w[b + "qkv.bias"].split(E), (a.WQ, a.WK, a.WV),
                                   (a.bQ, a.bK, a.bV)):
            add(cW, i, W.t().reshape(E, H, E // H))
            add(cb, i, bias.view(H, E // H))
        add(a.WO, i, w[b + "proj.weight"].t().reshape(H, E // H, E))
        add(a.bO, i, w[b + "proj.bias"])
    fn = model.final_norm[0]
    pairs.append((fn.weight.value, w["ln_f.weight"]))
    if fn.bias is not None:
        pairs.append((fn.bias.value, w["ln_f.bias"]))
    for target, value in pairs:
        target.copy_(value)
