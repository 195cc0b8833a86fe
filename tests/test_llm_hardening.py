"""The converted decoder-only LLMs after the writes, conversions and calls that used to go
wrong, each against an independent reference (Hugging Face's model rebuilt with
``to_hf`` from the current weights, or HF's own ``generate``).

* In-place writes to the parameters (``.data`` ops, ``copy_``, ``.data =``,
  ``load_state_dict``, optimizer steps, ``to()``) followed by a forward under
  ``torch.no_grad()`` in eval mode, ``generate`` and a key/value cache: inference reads the
  q/k/v and gate/up kernels side by side, and must read the current weights.
* ``to_hf`` of an untied read-out whose config says tied; ``from_hf`` of a model whose rotary
  frequencies disagree with its config; conversion inside ``torch.inference_mode()``;
  ``generate`` with a huge ``max_new_tokens`` and an eos; ``opsplit convert`` with
  ``new_tokens = 0``; HF's generation defaults (eos from the generation config, the mask
  inferred from ``pad_token_id``).  (The float32 gradient rule with a hidden width of 1 is
  tested in ``tests/test_llm_hf.py``, the clear errors in ``tests/bad_input/test_llm_hardening.py``.)
"""

from __future__ import annotations

import pytest
import torch
from _llm_configs import transformers  # noqa: E402

from opsplit.models import from_hf, to_hf  # noqa: E402
from opsplit.operators import KVCache  # noqa: E402

SMALL = {
    "llama": ("LlamaConfig", "LlamaForCausalLM", dict(
        vocab_size=40, hidden_size=12, intermediate_size=10, num_hidden_layers=2, num_attention_heads=3,
        num_key_value_heads=1, head_dim=4, attention_bias=True, mlp_bias=True, bos_token_id=None, eos_token_id=None,
        pad_token_id=None, max_position_embeddings=64)),
    "gpt2": ("GPT2Config", "GPT2LMHeadModel", dict(
        vocab_size=40, n_embd=12, n_layer=2, n_head=3, n_positions=40, resid_pdrop=0.0, embd_pdrop=0.0,
        attn_pdrop=0.0, bos_token_id=None, eos_token_id=None, pad_token_id=None)),
}


def _small(family, **kw):
    """A small HF causal LM built from a config (no eos/pad ids unless given), weights
    perturbed by 0.3 N(0, 1), eval mode."""
    config, cls, cfg = SMALL[family]
    torch.manual_seed(0)
    hf = getattr(transformers, cls)(getattr(transformers, config)(**{**cfg, **kw})).eval()
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in hf.parameters():
            p.add_(0.3 * torch.randn(p.shape, generator=g))
    return hf


def _small_llama(**kw):
    return _small("llama", **kw)


def _small_gpt2(**kw):
    return _small("gpt2", **kw)


IDS = torch.tensor([[5, 9, 3, 17, 21, 8], [11, 4, 30, 2, 6, 19]])


def _rel(a, b):
    return float((a - b).abs().max().detach() / b.abs().max().detach())


# -- item: in-place writes and the kernels side by side -------------------------------------------
def _scale_params(o):
    with torch.no_grad():
        for p in o.parameters():
            p.data.mul_(1.7)


def _copy_params(o):
    g = torch.Generator().manual_seed(5)
    for p in o.parameters():
        p.data.copy_(0.4 * torch.randn(p.shape, generator=g, dtype=torch.float64).to(p.dtype))


def _assign_params(o):
    for p in o.parameters():
        p.data = p.data * -1.3


def _assign_then_scale(o):
    _assign_params(o)
    _scale_params(o)


def _load_state(o):
    params = dict(o.named_parameters())  # (the state's other entries are constants such as LayerNorm's sigma_2)
    o.load_state_dict({k: 1.5 * v if k in params else v for k, v in o.state_dict().items()})


def _optimizer_steps(o):
    opt = torch.optim.Adam(o.parameters(), lr=0.05)
    for _ in range(2):
        opt.zero_grad()
        o(IDS).logits.square().mean().backward()
        opt.step()
    o.eval()


def _to_float64(o):
    o.to(torch.float64)


WRITES = {"data.mul_": _scale_params, "data.copy_": _copy_params, "data=": _assign_params,
          "data=,then.data.mul_": _assign_then_scale, "load_state_dict": _load_state, "optimizer": _optimizer_steps,
          "to(float64)": _to_float64}


def _use(o):
    """Every inference path once (the forward, generation, a cache), as a user would before a write."""
    with torch.no_grad():
        o(IDS)
        o.generate(IDS, 3)
        c = KVCache()
        o(IDS[:, :4], cache=c)
        o(IDS[:, 4:], cache=c)


@pytest.mark.parametrize("family", ["llama", "gpt2"])
@pytest.mark.parametrize("write", list(WRITES))
def test_inference_reads_the_weights_after_every_write(family, write):
    """Caught: the q/k/v and gate/up kernels side by side were a copy cached under the
    parameters' version counter, which ``.data`` writes do not bump: after ``p.data.mul_``
    the logits of a no-grad forward, ``generate`` and the cached prompt were those of the old
    weights mixed with the new (relative to the largest logit, 0.79 off for this Llama, 0.42 for
    this GPT-2)."""
    hf = _small_llama() if family == "llama" else _small_gpt2()
    o = from_hf(hf)
    _use(o)
    WRITES[write](o)
    ref_model = to_hf(o).eval()  # HF's model from the weights as they are now
    dtype = o.embedding.weight.dtype
    tol = 1e-10 if dtype == torch.float64 else 2e-5
    with torch.no_grad():
        ref = ref_model(IDS).logits
        assert _rel(o(IDS).logits, ref) < tol
        c = KVCache()
        o(IDS[:, :4], cache=c)
        assert _rel(o(IDS[:, 4:], cache=c).logits, ref[:, 4:]) < tol
        new = ref_model.generate(IDS, max_new_tokens=6, do_sample=False, eos_token_id=None, pad_token_id=None)
        assert torch.equal(o.generate(IDS, 6, eos_token_id=None), new)
        assert torch.equal(from_hf(ref_model).generate(IDS, 6, eos_token_id=None), new)  # a fresh conversion


def test_inference_keeps_no_copy_of_the_weights():
    """The mechanism: after every inference path (forward, cache, generation) no module holds
    a tensor besides its parameters and buffers — nothing that a write could leave stale — and
    the parameters keep their own contiguous storage (``parameters_to_vector`` and
    safetensors' ``save_file`` of the state work, as for any module)."""
    o = from_hf(_small_llama())
    _use(o)

    def tensors(x):
        if isinstance(x, torch.Tensor):
            return 1
        if isinstance(x, dict):
            return sum(tensors(v) for v in x.values())
        if isinstance(x, (list, tuple)):
            return sum(tensors(v) for v in x)
        return 0

    # allowed: the rotary frequencies (computed from theta and the head size, plain attributes,
    # under a key of both) and the references the value checks keep to tell a tensor they passed
    skip = ("_parameters", "_buffers", "_modules", "_frequencies")
    held = {name: k for name, m in o.named_modules() for k, v in vars(m).items()
            if k not in skip and not k.startswith("_opsplit_checked") and tensors(v)}
    assert not held, held
    assert all(p.is_contiguous() for p in o.parameters())
    torch.nn.utils.parameters_to_vector(o.parameters())
    safetensors = pytest.importorskip("safetensors.torch")
    safetensors.save(o.state_dict())


# -- item: to_hf compares the tensors, not the config's tie flag ------------------------------------
@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_to_hf_keeps_an_untied_read_out_untied(family):
    """Caught: a model whose config says ``tie_word_embeddings=True`` but whose ``lm_head`` is a
    parameter of its own converted exactly, then came back from ``to_hf`` tied, the embedding
    overwritten by the read-out (logits 1.33 / 0.85 relative off, no error)."""
    hf = _small_llama(tie_word_embeddings=True) if family == "llama" else _small_gpt2(tie_word_embeddings=True)
    hf.lm_head.weight = torch.nn.Parameter(0.5 * torch.randn(hf.lm_head.weight.shape,
                                                             generator=torch.Generator().manual_seed(3)))
    emb = hf.get_input_embeddings().weight.detach().clone()
    back = to_hf(from_hf(hf))
    assert back.lm_head.weight is not back.get_input_embeddings().weight
    assert torch.equal(back.get_input_embeddings().weight, emb)
    assert torch.equal(back.lm_head.weight, hf.lm_head.weight)
    with torch.no_grad():
        assert torch.equal(back(IDS).logits, hf(IDS).logits)


@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_to_hf_keeps_a_tied_read_out_tied(family):
    """Caught: the other way round — a read-out tied by hand to the token table of a model
    whose config says untied came back with a freshly initialised ``lm_head``."""
    hf = _small_llama(tie_word_embeddings=False) if family == "llama" else _small_gpt2(tie_word_embeddings=False)
    hf.lm_head.weight = hf.get_input_embeddings().weight
    back = to_hf(from_hf(hf))
    assert back.lm_head.weight is back.get_input_embeddings().weight
    with torch.no_grad():
        assert torch.equal(back(IDS).logits, hf(IDS).logits)


# -- item: from_hf reads what the module computes with ---------------------------------------------
def test_from_hf_refuses_rotary_frequencies_that_disagree_with_the_config():
    """Caught: ``from_hf`` computed the rotary frequencies from ``rope_theta`` and ignored the
    module's ``rotary_emb.inv_freq`` (what HF's forward reads): ``rope_theta`` edited after the
    build gave logits 0.087 relative off, ``inv_freq`` scaled 1.39, both without an error."""
    hf = _small_llama(rope_theta=100.0)
    with torch.no_grad():
        ref = hf(IDS).logits
    assert _rel(from_hf(hf)(IDS).logits, ref) < 2e-5  # agreeing buffers convert
    hf.config.rope_parameters["rope_theta"] = 10.0
    with pytest.raises(ValueError, match=r"rotary_emb.inv_freq: .* differ from those of "
                                         r"config.rope_parameters\['rope_theta'\] = 10 \(head_dim 4\)"):
        from_hf(hf)
    hf = _small_llama(rope_theta=100.0)
    hf.model.rotary_emb.inv_freq.mul_(1.5)
    with pytest.raises(ValueError, match=r"rotary_emb.inv_freq: .* by up to 0.5 relative"):
        from_hf(hf)


# -- item: crashes --------------------------------------------------------------------------------
def test_conversion_inside_inference_mode_leaves_a_usable_model():
    """Caught: ``from_hf`` inside ``torch.inference_mode()`` made inference tensors of the
    parameters, and every later forward raised "Inference tensors do not track version
    counter" (the parameter check's cache key), training could never record them."""
    hf = _small_llama()
    with torch.inference_mode():
        o = from_hf(hf)
    assert not any(p.is_inference() for p in o.parameters())
    with torch.no_grad():
        ref = hf(IDS).logits
        assert _rel(o(IDS).logits, ref) < 2e-5
    with torch.inference_mode():
        assert _rel(o(IDS).logits, ref) < 2e-5
        o.generate(IDS, 3)
    o(IDS).logits.sum().backward()
    assert o.embedding.weight.grad is not None
    with torch.inference_mode():
        back = to_hf(o)
    assert not any(p.is_inference() for p in back.parameters())


def test_generate_with_a_huge_bound_stops_at_eos_without_allocating_it():
    """Caught: ``generate(ids, 10**13, eos_token_id=...)`` allocated the 10**13 tokens up
    front and died in the allocator; HF stops at the eos.  The buffers now grow by doubling
    (checked past two doublings against HF, 150 tokens)."""
    hf = _small_llama()
    o = from_hf(hf)
    ids = IDS[:1]
    eos = int(o.generate(ids, 4, eos_token_id=None)[0, 8])  # the third new token
    out = o.generate(ids, 10**13, eos_token_id=eos)
    ref = hf.generate(ids, max_new_tokens=10, do_sample=False, eos_token_id=eos, pad_token_id=0)
    assert out.shape[1] <= 9 and torch.equal(out, ref)
    long = o.generate(IDS[:1], 150, eos_token_id=None)
    assert long.shape == (1, 156)
    assert torch.equal(long, hf.generate(IDS[:1], max_new_tokens=150, do_sample=False, eos_token_id=None,
                                         pad_token_id=None))


def test_convert_refuses_zero_new_tokens_at_the_config_check(tmp_path, capsys):
    """Caught: ``[llama] new_tokens = 0`` passed ``--print-config`` and died in HF's
    ``generate`` with a traceback."""
    from opsplit.cli import main

    cfg = tmp_path / "c.toml"
    cfg.write_text('[convert]\nmodels = ["llama"]\n[llama]\nnew_tokens = 0\n')
    assert main(["convert", "--config", str(cfg), "--print-config"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "llama.new_tokens" in err[0] and ">= 1" in err[0]


# -- item: HF's generation defaults ---------------------------------------------------------------
def _with_generation_config(hf, **kw):
    for k, v in kw.items():
        setattr(hf.generation_config, k, v)
        setattr(hf.config, k, v)
    return hf


def test_generate_follows_hf_defaults_eos_and_inferred_padding():
    """Caught: opsplit's ``generate`` ignored the converted model's eos and pad ids, where HF's
    ``generate`` stops at the generation config's eos and infers the padding of a batch from
    ``pad_token_id``: the same call gave other text.  Compared with HF's own ``generate``
    called with no arguments but the prompt (left-padded with the pad id, no mask)."""
    hf = _small_llama()
    probe = from_hf(hf).generate(IDS, 8, eos_token_id=None)
    eos = int(probe[1, 8])  # the second sequence stops after 3 tokens, the first later or never
    ids = IDS.clone()
    ids[1, :2] = 0  # left padding with the pad id
    _with_generation_config(hf, eos_token_id=eos, pad_token_id=0)
    o = from_hf(hf)
    ref = hf.generate(ids, max_new_tokens=12, do_sample=False)
    out = o.generate(ids, 12)
    assert torch.equal(out, ref)
    mask = (ids != 0).long()
    assert torch.equal(out, o.generate(ids, 12, attention_mask=mask))  # the inferred mask is the padding
    # without the eos: the padding still inferred from the model's pad id, as HF does, and it matters
    free = o.generate(ids, 12, eos_token_id=None)
    assert torch.equal(free, hf.generate(ids, max_new_tokens=12, do_sample=False, eos_token_id=None))
    assert not torch.equal(free, o.generate(ids, 12, eos_token_id=None, attention_mask=torch.ones_like(ids)))
    # several eos ids, as a generation config may list them
    _with_generation_config(hf, eos_token_id=[39, eos])
    assert torch.equal(from_hf(hf).generate(ids, 12), hf.generate(ids, max_new_tokens=12, do_sample=False))
    # explicit None: no eos, no inferred padding, as HF
    assert torch.equal(o.generate(ids, 12, eos_token_id=None, pad_token_id=None),
                       hf.generate(ids, max_new_tokens=12, do_sample=False, eos_token_id=None, pad_token_id=None))


def test_generate_does_not_infer_padding_when_pad_is_eos():
    """HF infers no padding when the pad id is an eos id (it cannot tell them apart); neither
    does opsplit (GPT-2's usual setting, pad = eos)."""
    hf = _small_gpt2()
    probe = from_hf(hf).generate(IDS, 4, eos_token_id=None)
    eos = int(probe[0, 7])
    ids = IDS.clone()
    ids[1, 0] = eos
    _with_generation_config(hf, eos_token_id=eos, pad_token_id=eos)
    assert torch.equal(from_hf(hf).generate(ids, 10), hf.generate(ids, max_new_tokens=10, do_sample=False))
