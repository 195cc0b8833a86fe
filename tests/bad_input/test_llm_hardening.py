"""Bad input to the decoder-only LLMs, second sweep: ``generate``'s arguments (token dtypes,
temperatures down to 1e-300, eos/pad ids and the model's generation defaults, bounds),
a :class:`~opsplit.operators.KVCache` reused with another batch, model, N_t or dtype,
parameters made non-finite through ``.data``, and ``from_hf`` / ``to_hf`` / ``hf_state_dict``
on models they cannot convert (meta tensors, rotary frequencies that disagree with the
config, replaced modules) — each a clear error raised by opsplit before any compute,
naming the argument."""

import functools
import sys
from pathlib import Path

import pytest
import torch
import transformers

from opsplit.models import DecoderConfig, DecoderLM, from_hf, hf_state_dict, to_hf
from opsplit.models.generate import generate
from opsplit.operators import KVCache

from ._table import cases, run_case

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from _llm_configs import as_4x  # noqa: E402

LLAMA = dict(vocab_size=30, hidden_size=8, intermediate_size=12, num_hidden_layers=2, num_attention_heads=2,
             num_key_value_heads=1, bos_token_id=1, eos_token_id=2)
GPT2 = dict(vocab_size=30, n_embd=8, n_layer=1, n_head=2, n_positions=6, bos_token_id=1, eos_token_id=2)
IDS = torch.tensor([[3, 4, 5], [6, 7, 8]])


def llama_raw(**kw):
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(transformers.LlamaConfig(**{**LLAMA, **kw})).eval()


def gpt2_raw(**kw):
    torch.manual_seed(0)
    return transformers.GPT2LMHeadModel(transformers.GPT2Config(**{**GPT2, **kw})).eval()


@functools.cache
def lm():
    return from_hf(llama_raw())


@functools.cache
def lm2():
    return from_hf(llama_raw())


@functools.cache
def gpt2():
    return from_hf(gpt2_raw())


@functools.cache
def own():
    from opsplit.models import AttentionDecoder, TokenClassifier

    return TokenClassifier(30, 30, AttentionDecoder(8, 2, 8, n_steps=1)).eval()


@functools.cache
def sliced():
    return DecoderLM(DecoderConfig(30, 8, 1, 2, 8, norm="layer", mlp="plain", positions="learned", max_positions=8,
                                   attention="sliced_relu")).eval()


def with_defaults(**defaults):
    m = from_hf(llama_raw())
    m.generation_defaults = defaults
    return m


# -- a KVCache used twice --------------------------------------------------------------------------
def filled(model=None, ids=IDS, **kw):
    """A cache filled by one call of ``model`` (default: the Llama one)."""
    c = KVCache()
    with torch.no_grad():
        (model or lm())(ids, cache=c, **kw)
    return c


def own_filled():
    c = KVCache()
    with torch.no_grad():
        own().next_token_logits(IDS, cache=c)
    return c


def selected():
    c = filled()
    c.select(torch.tensor([0]))
    return c


def two_entries():
    c, op = KVCache(), object()
    c.begin()
    c.update(op, 0.0, torch.zeros(1, 1, 2, 2))
    c.begin()
    c.update(op, 0.0, torch.zeros(1, 1, 1, 2), torch.zeros(1, 1, 1, 2))


def as_float64(model):
    return model.to(torch.float64)


def cache_then_float64():
    m = from_hf(llama_raw())
    c = filled(m)
    with torch.no_grad():
        m.to(torch.float64)(IDS[:, :1], cache=c)


# -- parameters made non-finite through .data (no version-counter bump) ------------------------------
def nan_through_data(model, suffix):
    """``model`` (used once, so its parameter check is cached) with a NaN written into the
    parameter whose name ends with ``suffix`` through ``.data``."""
    with torch.no_grad():
        model(IDS)
    p = next(p for n, p in model.named_parameters() if n.endswith(suffix))
    p.data.view(-1)[0] = float("nan")
    return model


def llama_nan(suffix):
    return nan_through_data(from_hf(llama_raw()), suffix)


def gpt2_nan(suffix):
    return nan_through_data(from_hf(gpt2_raw()), suffix)


@functools.cache
def loud():
    """A model with logits of size ~1e3 (the read-out scaled up)."""
    m = from_hf(llama_raw())
    with torch.no_grad():
        m.head.mul_(1e5)
    return m


GENERATE = cases(
    ("ids-uint8", lambda: lm()(IDS.to(torch.uint8)), TypeError,
     r"input_ids: expected token ids of dtype torch.int64 \(or torch.int32\).*got torch.uint8"),
    ("ids-int16", lambda: lm()(IDS.to(torch.int16)), TypeError, r"input_ids: .*got torch.int16"),
    ("ids-int8", lambda: lm()(IDS.to(torch.int8)), TypeError, r"input_ids: .*got torch.int8"),
    ("gen-ids-uint8", lambda: lm().generate(IDS.to(torch.uint8), 2), TypeError, r"input_ids: .*got torch.uint8"),
    ("gen-ids-int16", lambda: gpt2().generate(IDS.to(torch.int16), 2), TypeError, r"input_ids: .*got torch.int16"),
    ("gen-ids-bool", lambda: lm().generate(IDS > 4, 2), TypeError, r"input_ids: expected integer token ids"),
    ("gen-ids-3d", lambda: lm().generate(IDS[None], 2), ValueError, r"input_ids: expected shape \(B, N\)"),
    ("gen-ids-empty-batch", lambda: lm().generate(IDS[:0], 2), ValueError, r"input_ids: empty batch"),
    ("gpt2-negative-positions", lambda: gpt2()(IDS, position_ids=-torch.arange(3)[None]), ValueError,
     r"position_ids: expected positions >= 0 .* got min -2"),
    ("gpt2-negative-position", lambda: gpt2()(IDS, position_ids=torch.tensor([[-1, 0, 1]])), ValueError,
     r"position_ids: expected positions >= 0"),
    ("gpt2-positions-nan", lambda: gpt2()(IDS, position_ids=torch.tensor([[0.0, float("nan"), 1.0]])), ValueError,
     r"position_ids: expected finite positions"),
    ("gen-temperature-1e-40", lambda: lm().generate(IDS, 2, do_sample=True, temperature=1e-40), ValueError,
     r"temperature: expected at least 1.18e-38 \(float32's smallest normal number"),
    ("gen-temperature-1e-300", lambda: lm().generate(IDS, 2, do_sample=True, temperature=1e-300), ValueError,
     r"temperature: expected at least 1.18e-38"),
    ("gen-temperature-overflow", lambda: loud().generate(IDS, 2, do_sample=True, temperature=1e-37), ValueError,
     r"temperature: 1e-37 makes the float32 scores logits / temperature overflow"),
    ("gen-temperature-nan", lambda: lm().generate(IDS, 2, do_sample=True, temperature=float("nan")), ValueError,
     r"temperature: expected a finite number > 0"),
    ("gen-temperature-inf", lambda: lm().generate(IDS, 2, do_sample=True, temperature=float("inf")), ValueError,
     r"temperature: expected a finite number > 0"),
    ("gen-temperature-negative", lambda: lm().generate(IDS, 2, do_sample=True, temperature=-1.0), ValueError,
     r"temperature: expected a finite number > 0"),
    ("gen-temperature-str", lambda: lm().generate(IDS, 2, temperature="hot"), TypeError,
     r"temperature: expected a real number"),
    ("gen-top_p-zero", lambda: lm().generate(IDS, 2, do_sample=True, top_p=0.0), ValueError,
     r"top_p: expected 0 < top_p <= 1"),
    ("gen-top_p-nan", lambda: lm().generate(IDS, 2, do_sample=True, top_p=float("nan")), ValueError, r"top_p"),
    ("gen-top_k-float", lambda: lm().generate(IDS, 2, do_sample=True, top_k=2.5), ValueError,
     r"top_k: expected an integer >= 0"),
    ("gen-top_k-bool", lambda: lm().generate(IDS, 2, do_sample=True, top_k=True), ValueError, r"top_k"),
    ("gen-max-new-float", lambda: lm().generate(IDS, 3.0), ValueError, r"max_new_tokens: expected an integer >= 0"),
    ("gen-max-new-bool", lambda: lm().generate(IDS, True), ValueError, r"max_new_tokens"),
    ("gen-max-new-str", lambda: lm().generate(IDS, "8"), ValueError, r"max_new_tokens"),
    ("gen-huge-gpt2", lambda: gpt2().generate(IDS, 10**13, eos_token_id=2), ValueError,
     r"max_new_tokens: a prompt of 3 positions plus 10000000000000 new tokens exceeds"),
    ("gen-use-cache-int", lambda: lm().generate(IDS, 2, use_cache=1), TypeError, r"use_cache: expected a bool"),
    ("gen-do-sample-str", lambda: lm().generate(IDS, 2, do_sample="yes"), TypeError, r"do_sample: expected a bool"),
    ("gen-eos-list-out", lambda: lm().generate(IDS, 2, eos_token_id=[1, 99]), ValueError,
     r"eos_token_id: expected None or a token id in \[0, 29\], got 99"),
    ("gen-eos-empty-list", lambda: lm().generate(IDS, 2, eos_token_id=[]), ValueError,
     r"eos_token_id: expected None, a token id or a list of token ids, got \[\]"),
    ("gen-eos-float", lambda: lm().generate(IDS, 2, eos_token_id=2.0), ValueError, r"eos_token_id: expected None"),
    ("gen-eos-bool", lambda: lm().generate(IDS, 2, eos_token_id=True), ValueError, r"eos_token_id: expected None"),
    ("gen-eos-tensor", lambda: lm().generate(IDS, 2, eos_token_id=torch.tensor(2)), ValueError, r"eos_token_id"),
    ("gen-pad-negative", lambda: lm().generate(IDS, 2, pad_token_id=-1), ValueError,
     r"pad_token_id: expected None or a token id in \[0, 29\]"),
    ("gen-pad-float", lambda: lm().generate(IDS, 2, pad_token_id=0.0), ValueError, r"pad_token_id"),
    ("gen-n-steps-zero", lambda: lm().generate(IDS, 2, n_steps=0), ValueError, r"n_steps \(N_t\)"),
    ("gen-n-steps-float", lambda: lm().generate(IDS, 2, n_steps=1.5), TypeError, r"n_steps \(N_t\)"),
    ("gen-default-pad-outside", lambda: with_defaults(eos_token_id=2, pad_token_id=99).generate(IDS, 2), ValueError,
     r"pad_token_id: the model's generation config gives 99, not a token id in \[0, 29\]"),
    ("gen-default-eos-str", lambda: with_defaults(eos_token_id="</s>").generate(IDS, 2), ValueError,
     r"eos_token_id: expected None, a token id or a list .*\(the model's generation config\)"),
    ("gen-inferred-mask-gpt2-far", lambda: gpt2().generate(torch.tensor([[0, 3, 4]]), 6, pad_token_id=0), ValueError,
     r"max_new_tokens: a prompt of 2 positions plus 6 new tokens"),
    ("gen-own-ids-uint8", lambda: own().generate(IDS.to(torch.uint8), 2), ValueError,
     r"input_ids: expected integer ids of shape \(B, N\), got shape \(2, 3\) and dtype torch.uint8"),
    ("gen-own-temperature", lambda: own().generate(IDS, 2, do_sample=True, temperature=1e-40), ValueError,
     r"temperature: expected at least"),
    ("gen-nan-data-llama", lambda: llama_nan("WQ.pieces.0").generate(IDS, 2), ValueError,
     r"DecoderLM: parameters must be finite, but decoder.*WQ.pieces.0 hold\(s\) NaN/inf \(.*through .data"),
    ("fwd-nan-data-llama-ffn", lambda: llama_nan("W_up.pieces.1")(IDS), ValueError,
     r"DecoderLM: parameters must be finite, but .*W_up.pieces.1 hold\(s\) NaN/inf"),
    ("fwd-nan-data-gpt2-bias", lambda: gpt2_nan("b2.pieces.0")(IDS), ValueError,
     r"DecoderLM: parameters must be finite, but .*b2.pieces.0 hold\(s\) NaN/inf"),
    ("fwd-nan-data-gpt2-positions", lambda: gpt2_nan("positions.weight")(IDS), ValueError,
     r"DecoderLM: parameters must be finite, but positions.weight hold\(s\) NaN/inf"),
    ("fwd-nan-data-embedding", lambda: llama_nan("embedding.weight")(torch.tensor([[0, 1]])), ValueError,
     r"DecoderLM: parameters must be finite, but embedding.weight hold\(s\) NaN/inf"),
)

CACHE = cases(
    ("cache-batch", lambda: lm()(IDS[:1], cache=filled()), ValueError,
     r"input_ids: a batch of 1 sequences, but the cache holds 2 \(a KVCache continues the sequences"),
    ("cache-batch-larger", lambda: lm()(torch.cat([IDS, IDS]), cache=filled()), ValueError,
     r"input_ids: a batch of 4 sequences, but the cache holds 2"),
    ("cache-after-select", lambda: lm()(IDS[:, :1], cache=selected()), ValueError,
     r"input_ids: a batch of 2 sequences, but the cache holds 1"),
    ("cache-other-model", lambda: lm2()(IDS[:, :1], cache=filled()), ValueError,
     r"cache: this KVCache holds the keys and values of another model"),
    ("cache-other-family", lambda: gpt2()(IDS[:, :1], cache=filled()), ValueError,
     r"cache: this KVCache holds the keys and values of another model"),
    ("cache-n-steps", lambda: lm()(IDS[:, :1], cache=filled(), n_steps=4), ValueError,
     r"n_steps: the cache was filled solving with N_t = 2 steps, this call solves with N_t = 4"),
    ("cache-n-steps-first", lambda: lm()(IDS[:, :1], cache=filled(n_steps=4)), ValueError,
     r"n_steps: the cache was filled solving with N_t = 4 steps, this call solves with N_t = 2"),
    ("cache-n-steps-zero", lambda: lm()(IDS, cache=KVCache(), n_steps=0), ValueError, r"n_steps \(N_t\)"),
    ("cache-dtype", cache_then_float64, ValueError,
     r"cache: it holds torch.float32 keys and values on cpu, the model now computes in torch.float64"),
    ("cache-class", lambda: lm()(IDS, cache=KVCache), TypeError, r"cache: expected an opsplit KVCache or None"),
    ("cache-list", lambda: lm()(IDS, cache=[]), TypeError, r"cache: expected an opsplit KVCache or None"),
    ("cache-own-batch", lambda: own().next_token_logits(IDS[:1], cache=own_filled()), ValueError,
     r"input_ids: a batch of 1 sequences, but the cache holds 2"),
    ("cache-own-n-steps", lambda: own().next_token_logits(IDS, cache=own_filled(), n_steps=3), ValueError,
     r"n_steps: the cache was filled solving with N_t = 1 steps"),
    ("cache-own-type", lambda: own().next_token_logits(IDS, cache={}), TypeError,
     r"cache: expected an opsplit KVCache or None"),
    ("cache-own-other-model", lambda: own().next_token_logits(IDS, cache=filled()), ValueError,
     r"cache: this KVCache holds the keys and values of another model"),
    ("cache-sliced-batch", lambda: sliced()(IDS[:1], cache=filled(sliced())), ValueError,
     r"input_ids: a batch of 1 sequences, but the cache holds 2"),
    ("cache-gpt2-past-table", lambda: gpt2()(torch.cat([IDS, IDS[:, :1]], 1), cache=filled(gpt2())), ValueError,
     r"input_ids: positions up to 6 \(sequence of 4 tokens after 3 cached\) exceed the learned positions"),
    ("cache-mask-shape", lambda: lm()(IDS[:, :1], torch.ones(2, 1), cache=filled()), ValueError,
     r"attention_mask: expected shape \(B, past \+ N\) = \(2, 4\)"),
    ("cache-tensor-count", two_entries, ValueError, r"KVCache: object cached 1 tensors, got 2"),
)


def meta(model):
    return model.to("meta")


def swap(model, path, new):
    parent, name = model, path
    *head, name = path.split(".")
    for h in head:
        parent = getattr(parent, h)
    setattr(parent, name, new)
    return model


def with_theta(model, theta):
    model.config.rope_parameters["rope_theta"] = theta
    return model


def scaled_inv_freq(model, factor):
    model.model.rotary_emb.inv_freq.mul_(factor)
    return model


def inv_freq(model, value):
    model.model.rotary_emb.inv_freq = value
    return model


CONVERT = cases(
    ("meta-llama", lambda: from_hf(meta(llama_raw())), ValueError,
     r"from_hf: LlamaForCausalLM: model.embed_tokens.weight \(and .* more\) on the meta device hold no values"),
    ("meta-gpt2", lambda: from_hf(meta(gpt2_raw())), ValueError,
     r"from_hf: GPT2LMHeadModel: transformer.wte.weight .* on the meta device"),
    ("meta-qwen2-base", lambda: from_hf(meta(transformers.Qwen2Model(transformers.Qwen2Config(**LLAMA)))), ValueError,
     r"from_hf: Qwen2Model: .* on the meta device"),
    ("rope-theta-edited", lambda: from_hf(with_theta(llama_raw(), 10.0)), ValueError,
     r"from_hf: LlamaForCausalLM.model.rotary_emb.inv_freq: the module's rotary frequencies differ from those of "
     r"config.rope_parameters\['rope_theta'\] = 10"),
    ("rope-inv-freq-scaled", lambda: from_hf(scaled_inv_freq(llama_raw(), 1.5)), ValueError,
     r"rotary_emb.inv_freq: .* by up to 0.5 relative"),
    ("rope-inv-freq-tiny-change", lambda: from_hf(scaled_inv_freq(llama_raw(), 1.0 + 1e-5)), ValueError,
     r"rotary_emb.inv_freq: .* differ"),
    ("rope-inv-freq-nan", lambda: from_hf(inv_freq(llama_raw(), torch.full((2,), float("nan")))), ValueError,
     r"rotary_emb.inv_freq: .* by up to inf relative"),
    ("rope-inv-freq-length", lambda: from_hf(inv_freq(llama_raw(), torch.ones(3))), ValueError,
     r"rotary_emb.inv_freq: expected 2 frequencies \(head_dim 4 / 2\), got shape \(3,\)"),
    ("rope-inv-freq-none", lambda: from_hf(inv_freq(llama_raw(), None)), ValueError,
     r"rotary_emb.inv_freq: expected the rotary frequencies as a tensor buffer, got NoneType"),
    ("rope-4x-theta", lambda: from_hf(as_4x(llama_raw(), rope_theta=123.0)), ValueError,
     r"differ from those of config.rope_theta = 123"),
    ("rope-qwen2-scaled", lambda: from_hf(scaled_inv_freq(transformers.Qwen2ForCausalLM(
        transformers.Qwen2Config(**LLAMA)), 2.0)), ValueError, r"Qwen2ForCausalLM.model.rotary_emb.inv_freq"),
    ("rope-mistral-theta", lambda: from_hf(with_theta(transformers.MistralForCausalLM(
        transformers.MistralConfig(**LLAMA, sliding_window=None)), 5.0)), ValueError,
     r"MistralForCausalLM.model.rotary_emb.inv_freq: .*\['rope_theta'\] = 5 "),
    ("rope-type-attribute", lambda: from_hf(swap(llama_raw(), "model.rotary_emb.rope_type", "linear")), ValueError,
     r"rotary_emb: rope_type 'linear' is not converted"),
    ("rope-attention-scaling", lambda: from_hf(swap(llama_raw(), "model.rotary_emb.attention_scaling", 2.0)),
     ValueError, r"rotary_emb: rope_type 'default' is not converted"),
    ("from-none", lambda: from_hf(None), TypeError, r"from_hf: model: expected a transformers model"),
    ("from-linear", lambda: from_hf(torch.nn.Linear(2, 2)), TypeError, r"from_hf: unsupported model class Linear"),
    ("llama-no-layers", lambda: from_hf(llama_raw(num_hidden_layers=0)), ValueError,
     r"from_hf: LlamaForCausalLM: no layers \(num_hidden_layers = 0\)"),
    ("gpt2-no-layers", lambda: from_hf(gpt2_raw(n_layer=0)), ValueError, r"from_hf: GPT2LMHeadModel: no layers"),
    ("gpt2-head-bias", lambda: from_hf(swap(gpt2_raw(), "lm_head", torch.nn.Linear(8, 30))), TypeError,
     r"from_hf: GPT2LMHeadModel.lm_head: expected nn.Linear without bias"),
    ("llama-head-shape", lambda: from_hf(swap(llama_raw(), "lm_head", torch.nn.Linear(8, 29, bias=False))),
     ValueError, r"LlamaForCausalLM.lm_head"),
    ("llama-q-proj-shape", lambda: from_hf(swap(llama_raw(), "model.layers.1.self_attn.q_proj",
                                                torch.nn.Linear(8, 6, bias=False))), ValueError,
     r"layers\[1\].self_attn.q_proj"),
    ("gpt2-c-attn-linear", lambda: from_hf(swap(gpt2_raw(), "transformer.h.0.attn.c_attn", torch.nn.Linear(8, 24))),
     TypeError, r"h\[0\].attn.c_attn: expected transformers' Conv1D"),
    ("gpt2-ln-no-bias", lambda: from_hf(swap(gpt2_raw(), "transformer.h.0.ln_2", torch.nn.LayerNorm(8, bias=False))),
     ValueError, r"h\[0\].ln_2: expected nn.LayerNorm\(8\) with weight and bias"),
    ("gpt2-wte-padding", lambda: from_hf(swap(gpt2_raw(), "transformer.wte", torch.nn.Embedding(30, 8, padding_idx=0))),
     ValueError, r"wte: an embedding with padding_idx is not GPT-2's"),
    ("to-hf-none", lambda: to_hf(None), TypeError, r"to_hf: expected a DecoderLM made by from_hf"),
    ("to-hf-sliced", lambda: to_hf(sliced()), TypeError, r"to_hf: expected a DecoderLM made by from_hf"),
    ("hf-state-dict-own", lambda: hf_state_dict(sliced()), TypeError,
     r"hf_state_dict: expected a DecoderLM made by from_hf"),
    ("generate-on-base", lambda: generate(from_hf(transformers.LlamaModel(transformers.LlamaConfig(**LLAMA))), IDS, 2),
     ValueError, r"DecoderLM.next_token_logits: the model has no read-out \(lm_head=False\)"),
)


@pytest.mark.parametrize("case", GENERATE)
def test_generate(case):
    run_case(case)


@pytest.mark.parametrize("case", CACHE)
def test_cache(case):
    run_case(case)


@pytest.mark.parametrize("case", CONVERT)
def test_convert(case):
    run_case(case)


# -- from_hf reads the modules; to_hf exports what the converted model computes, or refuses ---------
def gpt2_attn_attr(**attrs):
    m = gpt2_raw(n_layer=2)
    for k, v in attrs.items():
        layer, name = k.split("__")
        setattr(m.transformer.h[int(layer)].attn, name, v)
    return m


def llama_attn_attr(name, value):
    m = llama_raw()
    setattr(m.model.layers[1].self_attn, name, value)
    return m


def half_scaled_inv_freq(dtype, factor):
    m = llama_raw(rope_theta=500000.0).to(dtype)
    m.model.rotary_emb.inv_freq.mul_(factor)
    return m


def edited(kind="llama", **changes):
    """A converted model with ``changes`` made after the conversion (attribute paths with
    ``__`` for ``.``; ``norms0``/``norms1`` the first map of each pre-norm)."""
    m = from_hf(llama_raw() if kind == "llama" else gpt2_raw())
    for path, v in changes.items():
        obj, *rest = path.split("__")
        target = {"norms0": m.norms[0][0], "norms1": m.norms[1][-1]}.get(obj, getattr(m, obj, None))
        for r in rest[:-1]:
            target = getattr(target, r)
        setattr(target, rest[-1], v)
    return m


def in_solved_with(model, **kw):
    from opsplit.control import solved_with

    with solved_with(model, **kw):
        return to_hf(model)


def refined_grid(model):
    from opsplit.grid import Grid, Interval

    g = model.decoder.grid
    model.decoder.grid = Grid(Interval(spacing=0.5), g.y, g.h)
    return model


def sigma_control(model):
    from opsplit.controls import PiecewiseConstant

    model.final_norm[0].projection.sigma2 = PiecewiseConstant(torch.ones(2, dtype=torch.float32), t0=0.0, t1=1.0)
    return model


EXPORT = cases(
    ("gpt2-attn-heads-attribute", lambda: from_hf(gpt2_attn_attr(**{"0__num_heads": 3})), ValueError,
     r"from_hf: GPT2LMHeadModel\.transformer\.h\[0\]\.attn: num_heads \* head_dim = 3 \* 4 != embed_dim = 8"),
    ("gpt2-attn-head-dim-str", lambda: from_hf(gpt2_attn_attr(**{"1__head_dim": "4"})), ValueError,
     r"h\[1\]\.attn: expected integer num_heads and head_dim attributes, got num_heads = 2, head_dim = '4'"),
    ("gpt2-layers-differ-in-heads", lambda: from_hf(gpt2_attn_attr(**{"1__num_heads": 1, "1__head_dim": 8})),
     ValueError, r"from_hf: GPT2LMHeadModel\.transformer: layers differ in \(num_heads, head_dim\) of the attention "
                 r"modules \['\(1, 8\)', '\(2, 4\)'\]"),
    ("llama-kv-groups-attribute", lambda: from_hf(llama_attn_attr("num_key_value_groups", 1)), ValueError,
     r"layers\[1\]\.self_attn: 2 query heads and 1 key/value heads .* do not fit num_key_value_groups = 1"),
    ("llama-head-dim-attribute", lambda: from_hf(llama_attn_attr("head_dim", 3)), ValueError,
     r"layers\[1\]\.self_attn\.q_proj: 8 outputs are not a whole number of heads of head_dim = 3"),
    ("rope-half-inv-freq-scaled", lambda: from_hf(half_scaled_inv_freq(torch.float16, 1.01)), ValueError,
     r"rotary_emb\.inv_freq: .* by up to 0\.01\d* relative, compared in the buffer's torch\.float16"),
    ("rope-bf16-inv-freq-scaled", lambda: from_hf(half_scaled_inv_freq(torch.bfloat16, 1.05)), ValueError,
     r"rotary_emb\.inv_freq: .* relative, compared in the buffer's torch\.bfloat16"),
    ("to-hf-n-steps", lambda: to_hf(edited(decoder__n_steps=4)), ValueError,
     r"to_hf: model\.decoder solves N_t = 4 steps on \[0, 2\]; Hugging Face's network is N_t = n_layers = 2 steps"),
    ("to-hf-heun", lambda: in_solved_with(from_hf(llama_raw()), solver="heun"), ValueError,
     r"to_hf: model\.decoder\.scheme\.substeps\[0\] is solved by Heun"),
    ("to-hf-strang", lambda: in_solved_with(from_hf(gpt2_raw()), scheme="strang"), ValueError,
     r"to_hf: model\.decoder\.scheme is Strang; Hugging Face's layer is the Lie scheme"),
    ("to-hf-refined-grid", lambda: to_hf(refined_grid(from_hf(llama_raw()))), ValueError,
     r"to_hf: model\.decoder\.grid is Grid\(x=\[N nodes, h=0\.5, midpoint\].*; Hugging Face's model is the "
     r"paper's grid"),
    ("to-hf-llama-scale", lambda: to_hf(edited(attention__scale=0.3)), ValueError,
     r"to_hf: model\.attention\.scale = 0\.3; Hugging Face's LlamaForCausalLM scales the scores by head_dim \*\* "
     r"-0\.5 = 0\.5"),
    ("to-hf-gpt2-scale", lambda: to_hf(edited("gpt2", attention__scale=0.3)), ValueError,
     r"to_hf: model\.attention\.scale = 0\.3; Hugging Face's GPT-2 scales the scores by head_dim \*\* -0\.5 = 0\.5 "
     r"\(scale_attn_weights=True\) or 1"),
    ("to-hf-gpt2-eps-differ", lambda: to_hf(edited("gpt2", norms1__projection__eps=1e-3)), ValueError,
     r"to_hf: the model's LayerNorm eps differ \(norms\[0\] = 1e-05, norms\[1\] = 0\.001, final_norm\[0\] = 1e-05\); "
     r"Hugging Face's config holds one layer_norm_epsilon"),
    ("to-hf-llama-eps-differ", lambda: to_hf(edited(norms0__eps=1e-3)), ValueError,
     r"to_hf: the model's RMS norm eps differ \(norms\[0\]\[0\] = 0\.001, norms\[1\]\[0\] = 1e-06"),
    ("to-hf-rms-compute-dtype", lambda: to_hf(edited(norms0__compute_dtype=None)), ValueError,
     r"to_hf: model\.norms\[0\]\[0\]: the RMS norm is computed in None; Hugging Face's computes it in torch\.float32"),
    ("to-hf-rotary-compute-dtype", lambda: to_hf(edited(attention__rotary__compute_dtype=None)), ValueError,
     r"to_hf: model\.attention\.rotary is RotaryEmbedding\(head_dim=4, theta=10000\); Hugging Face's "
     r"LlamaForCausalLM rotates heads of head_dim 4 with float32 angles"),
    ("to-hf-llama-embedding-dropout", lambda: to_hf(edited(config__embedding_dropout=0.1)), ValueError,
     r"to_hf: the model's embedding dropout \(model\.config\.embedding_dropout\) is 0\.1; Hugging Face's "
     r"LlamaForCausalLM has none"),
    ("to-hf-activation", lambda: to_hf(edited(ffn__activation="relu")), ValueError,
     r"to_hf: model\.ffn\.activation = 'relu' differs from the converted 'silu'"),
    ("to-hf-sigma-control", lambda: to_hf(sigma_control(from_hf(gpt2_raw()))), ValueError,
     r"to_hf: final_norm\[0\]\.projection\.sigma2: expected a constant scalar .*got PiecewiseConstant"),
)


@pytest.mark.parametrize("case", EXPORT)
def test_export(case):
    run_case(case)
