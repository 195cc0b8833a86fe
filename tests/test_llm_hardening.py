"""The converted decoder-only LLMs after the writes, conversions and calls that used to go
wrong, each against an independent reference (Hugging Face's model rebuilt with
``to_hf`` from the current weights, or HF's own ``generate``).

* In-place writes to the parameters (``.data`` ops, ``copy_``, ``.data =``,
  ``load_state_dict``, optimizer steps, ``to()``) followed by a forward under
  ``torch.no_grad()`` in eval mode, ``generate`` and a key/value cache: inference reads the
  q/k/v and gate/up kernels side by side, and must read the current weights.
* ``to_hf`` of an untied read-out whose config says tied; ``from_hf`` of a model whose rotary
  frequencies disagree with its config; conversion inside ``torch.inference_mode()``;
  ``generate`` with a huge ``max_new_tokens`` and an eos; HF's generation defaults (eos from
  the generation config, the mask inferred from ``pad_token_id``); the float32 gradient rule
  with a hidden width of 1.
"""

from __future__ import annotations

import pytest
import torch
from _llm_configs import build, left_padded, transformers  # noqa: E402

from opsplit.models import from_hf, to_hf  # noqa: E402
from opsplit.operators import KVCache  # noqa: E402
from opsplit.operators._linear import side_by_side  # noqa: E402


def _small_llama(**kw):
    cfg = dict(vocab_size=40, hidden_size=12, intermediate_size=10, num_hidden_layers=2, num_attention_heads=3,
               num_key_value_heads=1, head_dim=4, attention_bias=True, mlp_bias=True, bos_token_id=None,
               eos_token_id=None, pad_token_id=None, max_position_embeddings=64)
    cfg.update(kw)
    torch.manual_seed(0)
    hf = transformers.LlamaForCausalLM(transformers.LlamaConfig(**cfg)).eval()
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in hf.parameters():
            p.add_(0.3 * torch.randn(p.shape, generator=g))
    return hf


def _small_gpt2(**kw):
    cfg = dict(vocab_size=40, n_embd=12, n_layer=2, n_head=3, n_positions=40, resid_pdrop=0.0, embd_pdrop=0.0,
               attn_pdrop=0.0, bos_token_id=None, eos_token_id=None, pad_token_id=None)
    cfg.update(kw)
    torch.manual_seed(0)
    hf = transformers.GPT2LMHeadModel(transformers.GPT2Config(**cfg)).eval()
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in hf.parameters():
            p.add_(0.3 * torch.randn(p.shape, generator=g))
    return hf


IDS = torch.tensor([[5, 9, 3, 17, 21, 8], [11, 4, 30, 2, 6, 19]])


def _rel(a, b):
    return float((a - b).abs().max() / b.abs().max())


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
    weights mixed with the new (0.77 relative off here)."""
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


def test_kernels_side_by_side_are_the_parameters_storage():
    """The mechanism: after conversion and after ``.to()`` the q/k/v (gate/up) kernels of a
    call without autograd are a view of the parameters (no copy to go stale); after a write
    that replaced a parameter's storage they are a copy made at the call."""
    o = from_hf(_small_llama())
    a, f = o.attention, o.ffn

    def fused(layer):
        with torch.no_grad():
            W, b = side_by_side([c.pieces[layer] for c in (a.WQ, a.WK, a.WV)],
                                [c.pieces[layer] for c in (a.bQ, a.bK, a.bV)])
            Wf, bf = side_by_side([f.W1.pieces[layer], f.W_up.pieces[layer]], [f.b1.pieces[layer], f.b_up.pieces[layer]])
        return W, b, Wf, bf

    def shares(x, p):
        return x.untyped_storage().data_ptr() == p.untyped_storage().data_ptr()

    for layer in (0, 1):
        W, b, Wf, bf = fused(layer)
        assert shares(W, a.WV.pieces[layer]) and shares(b, a.bK.pieces[layer])
        assert shares(Wf, f.W_up.pieces[layer]) and shares(bf, f.b1.pieces[layer])
    o.to(torch.float64)
    W, b, Wf, bf = fused(1)
    assert W.dtype == torch.float64 and shares(W, a.WK.pieces[1]) and shares(Wf, f.W1.pieces[1])
    a.WK.pieces[1].data = a.WK.pieces[1].data.clone()
    W, *_ = fused(1)
    assert not shares(W, a.WK.pieces[1])
    assert torch.equal(W[:, 12:16], a.WK.pieces[1].reshape(12, 4))
