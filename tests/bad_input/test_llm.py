"""Bad input to the decoder-only LLMs: unsupported Hugging Face config fields (refused by
from_hf, naming the field), token ids out of range, sequences longer than GPT-2's positions,
empty prompts, masks and positions of the wrong shape, generation arguments, and the new
operators' and configs' arguments — each a clear error raised by opsplit before any
compute."""

import functools
import sys
from pathlib import Path

import pytest
import torch
import transformers

from opsplit import Grid
from opsplit.controls import PositionTable
from opsplit.models import DecoderConfig, DecoderLM, from_hf, to_hf
from opsplit.operators import (
    GatedFeedForward,
    GroupedQueryAttention,
    KVCache,
    ProjectionSphere,
    RotaryEmbedding,
    project_sphere,
)

from ._table import cases, run_case

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from _llm_configs import as_4x  # noqa: E402

LLAMA = dict(vocab_size=30, hidden_size=8, intermediate_size=12, num_hidden_layers=1, num_attention_heads=2,
             num_key_value_heads=1, bos_token_id=1, eos_token_id=2)
GPT2 = dict(vocab_size=30, n_embd=8, n_layer=1, n_head=2, n_positions=6, bos_token_id=1, eos_token_id=2)


def llama(**kw):
    return from_hf(transformers.LlamaForCausalLM(transformers.LlamaConfig(**{**LLAMA, **kw})).eval())


def llama_raw(**kw):
    return transformers.LlamaForCausalLM(transformers.LlamaConfig(**{**LLAMA, **kw}))


@functools.cache
def lm():
    return llama()


@functools.cache
def gpt2():
    return from_hf(transformers.GPT2LMHeadModel(transformers.GPT2Config(**GPT2)).eval())


def gpt2_raw(**kw):
    return transformers.GPT2LMHeadModel(transformers.GPT2Config(**{**GPT2, **kw}))


class LlamaSub(transformers.LlamaForCausalLM):
    pass


IDS = torch.tensor([[3, 4, 5], [6, 7, 8]])
MASK = torch.tensor([[0, 1, 1], [1, 1, 1]])


@functools.cache
def own():
    from opsplit.models import AttentionDecoder, TokenClassifier

    return TokenClassifier(30, 30, AttentionDecoder(8, 2, 8, attention="sliced_relu", n_steps=1)).eval()


def own_plain():
    from opsplit.models import TokenClassifier
    from opsplit.operators import FeedForward
    from opsplit.propagator import Propagator
    from opsplit.schemes import Lie
    from opsplit.solvers import ExplicitEuler, Substep

    enc = Propagator(Lie([Substep(FeedForward.create(8, 8), ExplicitEuler())]), 1, grid=Grid.paper(None, 8))
    return TokenClassifier(30, 30, enc)


@functools.cache
def sliced():
    return DecoderLM(DecoderConfig(30, 8, 1, 2, 8, norm="layer", mlp="plain", positions="learned", max_positions=8,
                                   attention="sliced_relu")).eval()


def sliced_seeded():
    return DecoderLM(DecoderConfig(30, 8, 1, 2, 8, norm="layer", mlp="plain", positions="learned", max_positions=16,
                                   attention="sliced_relu"), generator=torch.Generator().manual_seed(0)).eval()


def llama_seeded(**kw):
    return DecoderLM(DecoderConfig(30, 8, 2, 2, 8, n_kv_heads=1, **kw), generator=torch.Generator().manual_seed(0)).eval()


def nan_row_generated_later(make, *, data=False, value=float("nan")):
    """A model from ``make()`` whose embedding row of a token it generates from ``IDS`` (not a
    prompt token: an untied read-out gives it finite logits) holds ``value`` in one entry, written
    in place, or through ``.data`` after a first generation (the cached check has seen it
    finite)."""
    m = make()
    out = m.generate(IDS, 6)
    tok = next(t for t in out[:, IDS.shape[1]:].flatten().tolist() if t not in IDS.flatten().tolist())
    with torch.no_grad():
        (m.embedding.weight.data if data else m.embedding.weight)[tok, 1] = value
    return m


def gqa(**kw):
    args = dict(WQ=torch.zeros(8, 4, 2), WK=torch.zeros(8, 2, 2), WV=torch.zeros(8, 2, 2), WO=torch.zeros(4, 2, 8))
    args.update(kw)
    return GroupedQueryAttention(args.pop("WQ"), args.pop("WK"), args.pop("WV"), args.pop("WO"), **args)


def twice():
    # a second evaluation of a term at the same time in one call is an entry of its own (a stage
    # of a solver); a call that evaluates it more often than the calls before is refused next
    c, op = KVCache(), object()
    c.begin()
    c.update(op, 0.0, torch.zeros(1, 1, 2, 2))
    c.begin()
    c.update(op, 0.0, torch.zeros(1, 1, 1, 2))
    c.update(op, 0.0, torch.zeros(1, 1, 1, 2))
    c.begin()


CONVERT = cases(
    # transformers >= 5 names the field rope_parameters, 4.x rope_scaling
    ("rope-linear", lambda: from_hf(llama_raw(rope_scaling={"rope_type": "linear", "factor": 2.0})), ValueError,
     r"config.rope_(parameters|scaling)\['rope_type'\] = 'linear' \(rope scaling\) is not converted"),
    # a transformers 4.x config (rope_theta, rope_scaling; no rope_parameters), emulated
    ("rope4x-linear", lambda: from_hf(as_4x(llama_raw(), rope_scaling={"rope_type": "linear", "factor": 2.0})),
     ValueError, r"config.rope_scaling\['rope_type'\] = 'linear' \(rope scaling\) is not converted"),
    ("rope4x-type-yarn", lambda: from_hf(as_4x(llama_raw(), rope_scaling={"type": "yarn", "factor": 4.0})),
     ValueError, r"config.rope_scaling\['rope_type'\] = 'yarn'"),
    ("rope4x-factor", lambda: from_hf(as_4x(llama_raw(), rope_scaling={"rope_type": "default", "factor": 2.0})),
     ValueError, r"config.rope_scaling keys \['factor'\] \(rope scaling\) are not converted"),
    ("rope4x-partial", lambda: from_hf(as_4x(llama_raw(), partial_rotary_factor=0.5)), ValueError,
     r"config.partial_rotary_factor = 0.5 \(rotary positions on part of a head\) is not converted"),
    ("rope4x-not-dict", lambda: from_hf(as_4x(llama_raw(), rope_scaling="linear")), ValueError,
     r"config.rope_scaling = 'linear': expected None or a dict"),
    ("rope-missing", lambda: from_hf(as_4x(llama_raw(), rope_theta=None)), ValueError,
     r"config.rope_parameters \(transformers >= 5\) and config.rope_theta \(transformers 4.x\) are both missing"),
    ("rope-dynamic", lambda: from_hf(llama_raw(rope_scaling={"rope_type": "dynamic", "factor": 2.0})), ValueError,
     r"rope_type'\] = 'dynamic'"),
    ("mistral-sliding", lambda: from_hf(transformers.MistralForCausalLM(transformers.MistralConfig(**LLAMA))),
     ValueError, r"config.sliding_window = 4096 \(sliding-window attention\) is not converted"),
    ("qwen2-sliding", lambda: from_hf(transformers.Qwen2Model(transformers.Qwen2Config(
        **LLAMA, use_sliding_window=True, sliding_window=4, max_window_layers=0))), ValueError,
     r"config.use_sliding_window"),
    ("gpt2-cross", lambda: from_hf(gpt2_raw(add_cross_attention=True)), ValueError, r"config.add_cross_attention=True"),
    ("gpt2-inverse-layer", lambda: from_hf(gpt2_raw(scale_attn_by_inverse_layer_idx=True)), ValueError,
     r"config.scale_attn_by_inverse_layer_idx=True"),
    ("gpt2-upcast", lambda: from_hf(gpt2_raw(reorder_and_upcast_attn=True)), ValueError,
     r"config.reorder_and_upcast_attn=True"),
    ("gpt2-activation", lambda: from_hf(gpt2_raw(activation_function="relu6")), ValueError,
     r"unsupported activation_function='relu6'"),
    ("llama-activation", lambda: from_hf(llama_raw(hidden_act="mish")), ValueError, r"unsupported hidden_act='mish'"),
    ("llama-subclass", lambda: from_hf(LlamaSub(transformers.LlamaConfig(**LLAMA))), TypeError,
     r"unsupported model class LlamaSub"),
    ("mixed-dtype", lambda: from_hf(llama_raw().eval().apply(lambda m: m.double() if isinstance(m, torch.nn.Linear)
                                                             else None)), ValueError, r"several dtypes/devices"),
    ("to_hf-own", lambda: to_hf(DecoderLM(DecoderConfig(10, 8, 1, 2, 8))), TypeError,
     r"to_hf: expected a DecoderLM made by from_hf"),
)

CALLS = cases(
    ("ids-high", lambda: lm()(torch.tensor([[3, 30]])), ValueError, r"input_ids: token ids must lie in \[0, 29\]"),
    ("ids-negative", lambda: lm()(torch.tensor([[-1, 3]])), ValueError, r"input_ids: token ids must lie in"),
    ("ids-float", lambda: lm()(torch.tensor([[1.0, 2.0]])), TypeError, r"input_ids: expected integer token ids"),
    ("ids-1d", lambda: lm()(torch.tensor([1, 2])), ValueError, r"input_ids: expected shape \(B, N\)"),
    ("ids-list", lambda: lm()([[1, 2]]), TypeError, r"input_ids: expected a torch.Tensor"),
    ("empty-prompt", lambda: lm()(torch.zeros(2, 0, dtype=torch.long)), ValueError, r"input_ids: empty prompt"),
    ("gpt2-too-long", lambda: gpt2()(torch.ones(1, 7, dtype=torch.long)), ValueError,
     r"exceed the learned positions of the model: max_positions = 6 \(GPT-2's n_positions\)"),
    ("gpt2-positions-too-far", lambda: gpt2()(IDS, position_ids=torch.tensor([[4, 5, 6]])), ValueError,
     r"max_positions = 6"),
    ("mask-shape", lambda: lm()(IDS, torch.ones(2, 4, dtype=torch.long)), ValueError,
     r"attention_mask: expected shape \(B, past \+ N\) = \(2, 3\)"),
    ("mask-values", lambda: lm()(IDS, MASK * 2), ValueError, r"attention_mask: expected values 0 \(padding\) and 1"),
    ("mask-list", lambda: lm()(IDS, [[1, 1, 1]]), TypeError, r"attention_mask: expected a torch.Tensor"),
    ("mask-with-cache", lambda: (lambda c: (lm()(IDS, MASK, cache=c), lm()(IDS[:, :1], MASK, cache=c)))(KVCache()),
     ValueError, r"attention_mask: expected shape \(B, past \+ N\) = \(2, 4\).*3 tokens cached"),
    ("positions-shape", lambda: lm()(IDS, position_ids=torch.arange(4)[None]), ValueError,
     r"position_ids: expected shape \(B, N\) = \(2, 3\)"),
    ("cache-type", lambda: lm()(IDS, cache={}), TypeError, r"cache: expected an opsplit KVCache"),
    ("gen-empty", lambda: lm().generate(torch.zeros(1, 0, dtype=torch.long), 3), ValueError, r"input_ids: empty prompt"),
    ("gen-mask-shape", lambda: lm().generate(IDS, 3, attention_mask=torch.ones(2, 2)), ValueError,
     r"attention_mask: expected shape"),
    ("gen-ids-high", lambda: lm().generate(IDS + 27, 3), ValueError, r"input_ids: token ids must lie in"),
    ("gen-too-long", lambda: gpt2().generate(IDS, 5), ValueError,
     r"max_new_tokens: a prompt of 3 positions plus 5 new tokens exceeds the model's learned positions"),
    ("gen-max-new", lambda: lm().generate(IDS, -1), ValueError, r"max_new_tokens: expected an integer >= 0"),
    ("gen-temperature", lambda: lm().generate(IDS, 2, do_sample=True, temperature=0.0), ValueError, r"temperature"),
    ("gen-top_p", lambda: lm().generate(IDS, 2, do_sample=True, top_p=1.5), ValueError, r"top_p: expected 0 < top_p"),
    ("gen-top_k", lambda: lm().generate(IDS, 2, do_sample=True, top_k=-2), ValueError, r"top_k: expected an integer"),
    ("gen-generator", lambda: lm().generate(IDS, 2, generator=3), TypeError, r"generator: expected a torch.Generator"),
    ("gen-eos", lambda: lm().generate(IDS, 2, eos_token_id=99), ValueError, r"eos_token_id: expected None or a token id"),
    ("gen-sample-flag", lambda: lm().generate(IDS, 2, do_sample=1), TypeError, r"do_sample: expected a bool"),
    ("gen-model", lambda: __import__("opsplit.models.generate", fromlist=["generate"]).generate(torch.nn.Linear(2, 2), IDS, 2),
     TypeError, r"generate: model: expected an opsplit causal decoder"),
    # opsplit's own decoder (TokenClassifier over a causal AttentionDecoder) and the sliced DecoderLM
    ("own-mask-values", lambda: own()(IDS, MASK * 2), ValueError, r"attention_mask: expected values 0 \(padding\) and 1"),
    ("own-mask-shape", lambda: own().generate(IDS, 2, attention_mask=torch.ones(2, 4)), ValueError,
     r"attention_mask: expected shape \(B, past \+ N\) = \(2, 3\)"),
    ("own-mask-list", lambda: own()(IDS, [[1, 1, 1]]), TypeError, r"attention_mask: expected a torch.Tensor"),
    ("own-mask-encoder", lambda: own_plain()(IDS, MASK), ValueError,
     r"attention_mask: padding needs an AttentionDecoder encoder .* got Propagator"),
    ("sliced-mask-shape", lambda: sliced()(IDS, torch.ones(2, 2)), ValueError,
     r"attention_mask: expected shape \(B, past \+ N\) = \(2, 3\)"),
    # finding 11a: a NaN in the embedding row of a token the prompt does not use stopped the
    # sliced decoder's generation mid-way ("SlicedDecodeCache.step_relu: zq: expected finite
    # scores"); every parameter is now checked, by name, at generate's start
    ("gen-nan-row-unused-sliced", lambda: nan_row_generated_later(sliced_seeded).generate(IDS, 6), ValueError,
     r"^DecoderLM: parameters must be finite, but embedding\.weight hold\(s\) NaN/inf"),
    ("gen-nan-row-unused-sliced-data", lambda: nan_row_generated_later(sliced_seeded, data=True).generate(IDS, 6),
     ValueError, r"^DecoderLM: parameters must be finite, but embedding\.weight hold\(s\) NaN/inf"),
    # finding 13g: the same row of a softmax (Llama-style) decoder surfaced as "the attention
    # scores s*<q, k> may reach nan"
    ("gen-nan-row-generated-llama", lambda: nan_row_generated_later(llama_seeded).generate(IDS, 6), ValueError,
     r"^DecoderLM: parameters must be finite, but embedding\.weight hold\(s\) NaN/inf"),
    ("gen-inf-row-generated-llama-data",
     lambda: nan_row_generated_later(llama_seeded, data=True, value=float("inf")).generate(IDS, 6), ValueError,
     r"^DecoderLM: parameters must be finite, but embedding\.weight hold\(s\) NaN/inf"),
    ("gen-nan-row-own", lambda: nan_row_generated_later(
        lambda: __import__("opsplit.models", fromlist=["x"]).TokenClassifier(
            30, 30, __import__("opsplit.models", fromlist=["x"]).AttentionDecoder(8, 2, 8, n_steps=1),
            generator=torch.Generator().manual_seed(0)).eval()).generate(IDS, 6), ValueError,
     r"^TokenClassifier: parameters must be finite, but embedding\.weight hold\(s\) NaN/inf"),
    # the forward names the read-out's and the final norm's parameters too (their NaN gave NaN logits)
    ("fwd-nan-head", lambda: _poke(llama_seeded(), "head")(IDS), ValueError,
     r"^DecoderLM: parameters must be finite, but head hold\(s\) NaN/inf"),
    ("fwd-nan-final-norm", lambda: _poke(llama_seeded(), "final_norm.1.weight.value")(IDS), ValueError,
     r"^DecoderLM: parameters must be finite, but final_norm\.1\.weight\.value hold"),
    ("fwd-nan-head-data", lambda: _poke(llama_seeded(), "head", data=True)(IDS), ValueError,
     r"^DecoderLM: parameters must be finite, but head hold\(s\) NaN/inf"),
    ("gen-empty-batch", lambda: lm().generate(IDS[:0], 2), ValueError, r"^input_ids: empty batch"),
    # an absurd N_t ran 40-85 s into a MemoryError: the key/value cache keeps every attention call's keys
    # and values, so it grows with N_t; refused before the first step (here with 100 MB available)
    ("gen-n_steps-cache", lambda: tight(lambda: llama_seeded().generate(IDS, 2, n_steps=10**6)), ValueError,
     r"^n_steps \(N_t\): a key/value cache over N_t = 1000000 steps holds at least .* GB .*more than the 100 MB "
     r"available; expected a smaller n_steps \(the model's own is 2\)"),
    ("gen-n_steps-cache-sliced", lambda: tight(lambda: sliced_seeded().generate(IDS, 2, n_steps=10**6)), ValueError,
     r"^n_steps \(N_t\): a key/value cache over N_t = 1000000 steps"),
    ("fwd-n_steps-cache", lambda: tight(lambda: llama_seeded()(IDS, cache=KVCache(), n_steps=10**7)), ValueError,
     r"^n_steps \(N_t\): a key/value cache over N_t = 10000000 steps holds at least"),
    ("decode-steps-n_steps", lambda: tight(lambda: _no_grad(lambda: llama_seeded().decode_steps(KVCache(),
                                                                                             n_steps=10**7))),
     ValueError, r"^n_steps \(N_t\): a key/value cache over N_t = 10000000 steps holds at least .*decode kernels"),
    ("gen-max-new-cache", lambda: tight(lambda: llama_seeded().generate(IDS, 4 * 10**6, eos_token_id=None)), ValueError,
     r"^max_new_tokens: a key/value cache over N_t = 2 steps holds at least"),
)


def _no_grad(call):
    with torch.no_grad():
        return call()


def tight(call):
    """``call()`` with 100 MB of memory available to the size guards, and the solve replaced by
    an error: a guard that refuses the job does so before any step."""
    from unittest import mock

    from opsplit.propagator import Propagator

    with mock.patch("opsplit.models.decoder_lm.available_memory", return_value=1e8), \
            mock.patch.object(Propagator, "forward", side_effect=AssertionError("the solve was reached")):
        return call()


def _poke(model, name, *, data=False):
    """``model`` with a NaN in the first entry of its parameter ``name`` (through ``.data`` after
    a first call)."""
    if data:
        with torch.no_grad():
            model(IDS)
    p = dict(model.named_parameters())[name]
    with torch.no_grad():
        (p.data if data else p).view(-1)[0] = float("nan")
    return model

PARTS = cases(
    ("cfg-kv-heads", lambda: DecoderConfig(10, 8, 1, 4, 8, n_kv_heads=3), ValueError,
     r"DecoderConfig.n_kv_heads: 3 key/value heads must divide n_heads = 4"),
    ("cfg-odd-rope", lambda: DecoderConfig(10, 9, 1, 3, 8), ValueError, r"rotary positions need an even head size"),
    ("cfg-learned", lambda: DecoderConfig(10, 8, 1, 2, 8, positions="learned"), ValueError,
     r"DecoderConfig.max_positions: learned positions need the table size"),
    ("cfg-norm", lambda: DecoderConfig(10, 8, 1, 2, 8, norm="batch"), ValueError, r"DecoderConfig.norm: expected one of"),
    ("cfg-norm-bias", lambda: DecoderConfig(10, 8, 1, 2, 8, norm_bias=True), ValueError, r"only a LayerNorm has a bias"),
    ("cfg-padding", lambda: DecoderConfig(10, 8, 1, 2, 8, padding_idx=10), ValueError, r"DecoderConfig.padding_idx"),
    ("lm-config", lambda: DecoderLM({"vocab_size": 3}), TypeError, r"DecoderLM.config: expected a DecoderConfig"),
    ("gqa-groups", lambda: gqa(WK=torch.zeros(8, 3, 2), WV=torch.zeros(8, 3, 2)), ValueError,
     r"the 3 key/value heads must divide the 4 query heads"),
    ("gqa-wo", lambda: gqa(WO=torch.zeros(4, 2, 7)), ValueError, r"GroupedQueryAttention.WO: expected shape"),
    ("gqa-rotary-dim", lambda: gqa(rotary=RotaryEmbedding(4)), ValueError, r"rotary: head_dim 4 != the heads' d = 2"),
    ("gqa-rotary-type", lambda: gqa(rotary=3), TypeError, r"GroupedQueryAttention.rotary: expected a RotaryEmbedding"),
    ("gqa-grid", lambda: gqa()(torch.zeros(1, 3, 6)), ValueError, r"the kernels act on N_y = 8 features"),
    ("gqa-positions", lambda: gqa(positions="p", rotary=RotaryEmbedding(2))(
        torch.zeros(1, 3, 8), grid=__import__("opsplit.operators.context", fromlist=["x"]).ContextGrid.of(
            Grid.paper(None, 8), p=torch.zeros(1, 4))), ValueError, r"positions 'p': expected shape \(B, N_x\)"),
    ("rope-odd", lambda: RotaryEmbedding(5), ValueError, r"RotaryEmbedding.head_dim: expected an even head size"),
    ("rope-theta", lambda: RotaryEmbedding(4, -1.0), ValueError, r"RotaryEmbedding.theta"),
    ("rope-dtype", lambda: RotaryEmbedding(4, compute_dtype=torch.float16), ValueError, r"compute_dtype"),
    ("sphere-sigma", lambda: ProjectionSphere(0.0), ValueError, r"ProjectionSphere.sigma2"),
    ("sphere-vector-sigma", lambda: ProjectionSphere(torch.ones(3)), ValueError, r"expected a scalar control"),
    ("sphere-eps", lambda: project_sphere(torch.ones(3), eps=-1.0), ValueError, r"eps"),
    ("sphere-nan", lambda: project_sphere(torch.tensor([1.0, float("nan")])), ValueError, r"v: expected finite values"),
    ("sphere-int", lambda: project_sphere(torch.ones(3, dtype=torch.long)), TypeError, r"v: expected a floating-point"),
    ("sphere-dtype", lambda: project_sphere(torch.ones(3), compute_dtype=torch.int32), ValueError, r"compute_dtype"),
    ("gated-up-shape", lambda: GatedFeedForward(torch.zeros(4, 6), torch.zeros(4, 5), torch.zeros(6, 4)), ValueError,
     r"GatedFeedForward: W_up \(4, 5\) must have the shape of W_gate"),
    ("table-shape", lambda: PositionTable(torch.zeros(5)), ValueError, r"PositionTable.values: expected shape"),
    ("table-far", lambda: PositionTable(torch.zeros(4, 2)).at(torch.tensor([5])), ValueError,
     r"positions in \[5, 5\] lie outside the learned position table \[0, 3\]"),
    ("cache-twice", twice, ValueError, r"cache: its entries hold \[1, 3\] tokens: .* evaluated a term more or fewer "
     r"times than the calls before"),
)


@pytest.mark.parametrize("case", CONVERT)
def test_converters(case):
    run_case(case)


@pytest.mark.parametrize("case", CALLS)
def test_calls(case):
    run_case(case)


@pytest.mark.parametrize("case", PARTS)
def test_parts(case):
    run_case(case)
