r"""Hugging Face decoder-only models -> :class:`~opsplit.models.DecoderLM` and back.

Registered with :func:`~opsplit.models.hf.from_hf` (exactly these classes; subclasses and
look-alikes are refused): ``GPT2Model``, ``GPT2LMHeadModel``, ``LlamaModel``,
``LlamaForCausalLM``, ``Qwen2Model``, ``Qwen2ForCausalLM``, ``MistralModel``,
``MistralForCausalLM``.  :func:`to_hf` builds the Hugging Face model back from the recorded
configuration (no download) and copies the weights (a pure copy: ``to_hf(from_hf(m))``
holds ``m``'s weights bit for bit).

**What is recovered** (outputs and every parameter's gradient to round-off, in float32 and
float64, with left-padded attention masks; generation token for token):

* GPT-2: pre-norm LayerNorm (:math:`P_{S_1}` + affine), fused ``c_attn`` Conv1D weights
  (layout ``(in, out)``) split into :math:`W^Q, W^K, W^V`, ``scale_attn_weights``,
  ``n_inner``, the activation (``gelu_new`` and the others of
  :data:`opsplit.models.vit._HF_ACT_NAMES`), learned positions
  (:class:`~opsplit.controls.PositionTable`), tied read-out, the three dropouts;
* Llama, Qwen2, Mistral: RMSNorm (:math:`P_{S_\circ}` + weight, evaluated in float32 as
  HF does), rotary positions (``rope_theta``, ``head_dim``; float32 angles as HF), grouped-
  and multi-query attention (``num_key_value_heads``), ``attention_bias`` (Llama: q, k, v, o;
  Qwen2: q, k, v), ``mlp_bias``, the gated feed-forward with its activation, tied or untied
  read-out, the embedding's ``padding_idx`` (its row gets no gradient, as in HF),
  attention dropout.

**What is refused** (a ``ValueError`` naming the field, before any compute): rotary scaling
(``rope_parameters`` with a ``rope_type`` other than ``"default"``, or any scaling key such
as ``factor`` / ``partial_rotary_factor``; transformers 4.x configs, which have
``rope_theta`` and ``rope_scaling`` instead, are read and refused alike), sliding windows (Mistral ``sliding_window`` not
``None``; Qwen2 ``use_sliding_window`` / ``layer_types`` with ``"sliding_attention"``),
GPT-2's ``add_cross_attention``, ``scale_attn_by_inverse_layer_idx`` and
``reorder_and_upcast_attn``, activations opsplit does not have, modules of unexpected
classes (``TypeError``), parameters on several dtypes or devices.
"""

from __future__ import annotations

import copy

import torch
from torch import nn

from .decoder_lm import DecoderConfig, DecoderLM
from .hf import register_hf_converter
from .vit import _check_linear, _dropout_p, _hf_act, _is_hf, _need_hf, _one_dtype_device

__all__ = ["decoder_from_hf", "to_hf", "hf_state_dict", "HF_DECODER_CLASSES"]

GPT2_CLASSES = ("GPT2Model", "GPT2LMHeadModel")
LLAMA_FAMILY = {
    "LlamaModel": "Llama", "LlamaForCausalLM": "Llama",
    "Qwen2Model": "Qwen2", "Qwen2ForCausalLM": "Qwen2",
    "MistralModel": "Mistral", "MistralForCausalLM": "Mistral",
}
HF_DECODER_CLASSES = GPT2_CLASSES + tuple(LLAMA_FAMILY)


# -- checks (before any compute) ------------------------------------------------------------------
def _check_conv1d(m, where: str, n_in: int, n_out: int) -> None:
    if not _is_hf(m, "Conv1D"):
        raise TypeError(f"from_hf: {where}: expected transformers' Conv1D, got {type(m).__name__}")
    if tuple(m.weight.shape) != (n_in, n_out) or m.bias is None or tuple(m.bias.shape) != (n_out,):
        raise ValueError(f"from_hf: {where}: expected Conv1D weight ({n_in}, {n_out}) with a bias, got "
                         f"{tuple(m.weight.shape)}")


def _check_ln(ln, where: str, E: int) -> float:
    if type(ln) is not nn.LayerNorm:
        raise TypeError(f"from_hf: {where}: expected nn.LayerNorm, got {type(ln).__name__}")
    if tuple(ln.normalized_shape) != (E,) or ln.weight is None or ln.bias is None:
        raise ValueError(f"from_hf: {where}: expected nn.LayerNorm({E}) with weight and bias, got {ln!r}")
    return float(ln.eps)


def _check_rms(norm, where: str, E: int, family: str) -> float:
    _need_hf(norm, where, f"{family}RMSNorm")
    if tuple(norm.weight.shape) != (E,):
        raise ValueError(f"from_hf: {where}: expected a weight of shape ({E},), got {tuple(norm.weight.shape)}")
    return float(norm.variance_epsilon)


def _one(values: set, where: str, what: str):
    if len(values) != 1:
        raise ValueError(f"from_hf: {where}: layers differ in {what} {sorted(map(str, values))}")
    return values.pop()


def _gpt2_parts(model) -> dict:
    cls = type(model).__name__
    if cls == "GPT2LMHeadModel":
        tr, head, prefix, where = model.transformer, model.lm_head, "transformer.", f"{cls}.transformer"
        _need_hf(tr, where, "GPT2Model")
        if type(head) is not nn.Linear or head.bias is not None:
            raise TypeError(f"from_hf: {cls}.lm_head: expected nn.Linear without bias, got {head!r}")
    else:
        tr, head, prefix, where = model, None, "", cls
    cfg = tr.config
    for field, bad in (("add_cross_attention", True), ("scale_attn_by_inverse_layer_idx", True),
                       ("reorder_and_upcast_attn", True)):
        if bool(getattr(cfg, field, False)) is bad:
            raise ValueError(
                f"from_hf: {cls}: config.{field}={getattr(cfg, field)!r} is not converted (opsplit recovers "
                f"GPT-2 with {field}=False)"
            )
    E, H = int(tr.embed_dim), int(cfg.n_head)
    if E % H:
        raise ValueError(f"from_hf: {cls}: n_embd = {E} is not divisible by n_head = {H}")
    blocks = list(tr.h)
    if not blocks:
        raise ValueError(f"from_hf: {cls}: no layers (n_layer = 0) to convert")
    acts, eps, p_attn, p_resid, inner = set(), set(), set(), set(), set()
    for n, blk in enumerate(blocks):
        w = f"{where}.h[{n}]"
        _need_hf(blk, w, "GPT2Block")
        if hasattr(blk, "crossattention"):
            raise ValueError(f"from_hf: {w}: cross-attention (config.add_cross_attention) is not converted")
        _need_hf(blk.attn, w + ".attn", "GPT2Attention")
        _need_hf(blk.mlp, w + ".mlp", "GPT2MLP")
        if blk.attn.is_cross_attention:
            raise ValueError(f"from_hf: {w}.attn: cross-attention is not converted")
        _check_conv1d(blk.attn.c_attn, w + ".attn.c_attn", E, 3 * E)
        _check_conv1d(blk.attn.c_proj, w + ".attn.c_proj", E, E)
        Fz = int(blk.mlp.c_fc.weight.shape[1])
        _check_conv1d(blk.mlp.c_fc, w + ".mlp.c_fc", E, Fz)
        _check_conv1d(blk.mlp.c_proj, w + ".mlp.c_proj", Fz, E)
        inner.add(Fz)
        acts.add(_hf_act(blk.mlp.act, w + ".mlp.act", "activation_function", cfg))
        eps.add(_check_ln(blk.ln_1, w + ".ln_1", E))
        eps.add(_check_ln(blk.ln_2, w + ".ln_2", E))
        p_attn.add(_dropout_p(blk.attn.attn_dropout, w + ".attn.attn_dropout"))
        p_resid.add(_dropout_p(blk.attn.resid_dropout, w + ".attn.resid_dropout"))
        p_resid.add(_dropout_p(blk.mlp.dropout, w + ".mlp.dropout"))
    eps.add(_check_ln(tr.ln_f, where + ".ln_f", E))
    # transformers >= 4.57 keeps the score scale as ``attn.scaling``; before, it follows from
    # scale_attn_weights (scale_attn_by_inverse_layer_idx is refused above)
    scales = {float(getattr(b.attn, "scaling", (E // H) ** -0.5 if cfg.scale_attn_weights else 1.0)) for b in blocks}
    V, P = tr.wte.weight.shape[0], tr.wpe.weight.shape[0]
    tied = head is not None and head.weight is tr.wte.weight
    if head is not None and not tied:
        _check_linear(head, f"{cls}.lm_head", E, V, bias=False)
    config = DecoderConfig(
        vocab_size=V, d_model=E, n_layers=len(blocks), n_heads=H, d_ff=_one(inner, where, "n_inner"),
        norm="layer", norm_eps=_one(eps, where, "layer_norm_epsilon"), norm_bias=True, mlp="plain",
        activation=_one(acts, where, "activation_function"), positions="learned", max_positions=P,
        qkv_bias=True, out_bias=True, mlp_bias=True, tie_embeddings=tied or head is None,
        lm_head=head is not None, scale=_one(scales, where, "attention scale"),
        attention_dropout=_one(p_attn, where, "attn_pdrop"), residual_dropout=_one(p_resid, where, "resid_pdrop"),
        embedding_dropout=_dropout_p(tr.drop, where + ".drop"),
    )
    if tr.wte.padding_idx is not None:
        raise ValueError(f"from_hf: {where}.wte: an embedding with padding_idx is not GPT-2's")
    return dict(config=config, prefix=prefix, kind="gpt2")


def _rope_checks(cfg, cls: str) -> float:
    """``rope_theta`` of a config with plain rotary positions; scaling of any kind refused.

    transformers >= 5 keeps the rotary settings in one dict, ``config.rope_parameters``
    (``rope_theta``, ``rope_type``, scaling keys); transformers 4.x in ``config.rope_theta``
    and ``config.rope_scaling`` (``None`` or a dict with ``rope_type`` / ``type`` and the
    scaling keys), with ``partial_rotary_factor`` an attribute of the config when present."""
    rp = getattr(cfg, "rope_parameters", None)
    if rp is None:  # transformers 4.x
        if getattr(cfg, "rope_theta", None) is None:
            raise ValueError(f"from_hf: {cls}: config.rope_parameters (transformers >= 5) and config.rope_theta "
                             "(transformers 4.x) are both missing")
        prf = getattr(cfg, "partial_rotary_factor", 1.0)
        if prf not in (None, 1.0):
            raise ValueError(f"from_hf: {cls}: config.partial_rotary_factor = {prf!r} (rotary positions on part of "
                             "a head) is not converted; opsplit rotates the whole head (1.0)")
        rs = getattr(cfg, "rope_scaling", None)
        if rs is not None and not isinstance(rs, dict):
            raise ValueError(f"from_hf: {cls}: config.rope_scaling = {rs!r}: expected None or a dict")
        rp, field = {**(rs or {}), "rope_theta": cfg.rope_theta}, "rope_scaling"
    else:
        field = "rope_parameters"
    if any(isinstance(v, dict) for v in rp.values()):
        raise ValueError(f"from_hf: {cls}: per-layer-type config.{field} {rp!r} are not converted")
    rtype = rp.get("rope_type", rp.get("type", "default"))
    if rtype != "default":
        raise ValueError(
            f"from_hf: {cls}: config.{field}['rope_type'] = {rtype!r} (rope scaling) is not converted; "
            "opsplit recovers rope_type 'default' (plain rotary positions with rope_theta)"
        )
    extra = {k: v for k, v in rp.items() if k not in ("rope_type", "type", "rope_theta")
             and not (k == "partial_rotary_factor" and v == 1.0)}
    if extra:
        raise ValueError(f"from_hf: {cls}: config.{field} keys {sorted(extra)} (rope scaling) are not converted")
    return float(rp["rope_theta"])


def _check_inv_freq(rot, where: str, cfg, theta: float, d: int) -> None:
    """The module's rotary frequencies (``rotary_emb.inv_freq``, what HF's forward reads) must
    be those opsplit computes from the config's ``rope_theta`` and the heads' size (HF's own
    float32 formula, :meth:`~opsplit.operators.RotaryEmbedding.frequencies`): a buffer edited
    after the build, or a config edited after it, is refused naming both."""
    from ..operators import RotaryEmbedding

    field = "rope_parameters['rope_theta']" if getattr(cfg, "rope_parameters", None) is not None else "rope_theta"
    buf = getattr(rot, "inv_freq", None)
    if not isinstance(buf, torch.Tensor):
        raise ValueError(f"from_hf: {where}.inv_freq: expected the rotary frequencies as a tensor buffer, got "
                         f"{type(buf).__name__}")
    want = RotaryEmbedding(d, theta, compute_dtype=torch.float32).frequencies(buf.device)
    if tuple(buf.shape) != tuple(want.shape):
        raise ValueError(f"from_hf: {where}.inv_freq: expected {want.numel()} frequencies (head_dim {d} / 2), got "
                         f"shape {tuple(buf.shape)}")
    have = buf.detach().float()
    rel = float(((have - want).abs() / want).max()) if bool(torch.isfinite(have).all()) else float("inf")
    if not rel <= 4 * torch.finfo(torch.float32).eps:
        raise ValueError(
            f"from_hf: {where}.inv_freq: the module's rotary frequencies differ from those of config.{field} = "
            f"{theta:g} (head_dim {d}) by up to {rel:.3g} relative; opsplit computes them from rope_theta, so "
            f"the two must agree (rebuild the model from its config, or set {field} to the base the frequencies "
            "were made with)"
        )


def _llama_parts(model) -> dict:
    cls = type(model).__name__
    family = LLAMA_FAMILY[cls]
    if cls.endswith("ForCausalLM"):
        base, head, prefix, where = model.model, model.lm_head, "model.", f"{cls}.model"
        _need_hf(base, where, f"{family}Model")
    else:
        base, head, prefix, where = model, None, "", cls
    cfg = base.config
    theta = _rope_checks(cfg, cls)
    if family == "Mistral" and getattr(cfg, "sliding_window", None) is not None:
        raise ValueError(
            f"from_hf: {cls}: config.sliding_window = {cfg.sliding_window} (sliding-window attention) is not "
            "converted; build the config with sliding_window=None"
        )
    if family == "Qwen2":
        types = list(getattr(cfg, "layer_types", None) or [])
        if getattr(cfg, "use_sliding_window", False) or "sliding_attention" in types:
            raise ValueError(
                f"from_hf: {cls}: config.use_sliding_window / config.layer_types with 'sliding_attention' "
                "(sliding-window attention) is not converted"
            )
    rot = base.rotary_emb
    if getattr(rot, "rope_type", "default") != "default" or float(getattr(rot, "attention_scaling", 1.0)) != 1.0:
        raise ValueError(f"from_hf: {where}.rotary_emb: rope_type {rot.rope_type!r} is not converted")
    E = int(cfg.hidden_size)
    layers = list(base.layers)
    if not layers:
        raise ValueError(f"from_hf: {cls}: no layers (num_hidden_layers = 0) to convert")
    H, Hkv = int(cfg.num_attention_heads), int(cfg.num_key_value_heads)
    acts, eps, p_attn, ds, scales, biases, ffs = set(), set(), set(), set(), set(), set(), set()
    for n, layer in enumerate(layers):
        w = f"{where}.layers[{n}]"
        _need_hf(layer, w, f"{family}DecoderLayer")
        a, mlp = layer.self_attn, layer.mlp
        _need_hf(a, w + ".self_attn", f"{family}Attention")
        _need_hf(mlp, w + ".mlp", f"{family}MLP")
        if getattr(a, "sliding_window", None) is not None:
            raise ValueError(f"from_hf: {w}.self_attn: sliding_window = {a.sliding_window} is not converted")
        d = int(a.head_dim)
        ds.add(d)
        scales.add(float(a.scaling))
        qb, ob = a.q_proj.bias is not None, a.o_proj.bias is not None
        biases.add((qb, ob))
        _check_linear(a.q_proj, w + ".self_attn.q_proj", E, H * d, bias=qb)
        _check_linear(a.k_proj, w + ".self_attn.k_proj", E, Hkv * d, bias=qb)
        _check_linear(a.v_proj, w + ".self_attn.v_proj", E, Hkv * d, bias=qb)
        _check_linear(a.o_proj, w + ".self_attn.o_proj", H * d, E, bias=ob)
        mb = mlp.gate_proj.bias is not None
        Fz = int(mlp.gate_proj.out_features)
        ffs.add((Fz, mb))
        _check_linear(mlp.gate_proj, w + ".mlp.gate_proj", E, Fz, bias=mb)
        _check_linear(mlp.up_proj, w + ".mlp.up_proj", E, Fz, bias=mb)
        _check_linear(mlp.down_proj, w + ".mlp.down_proj", Fz, E, bias=mb)
        acts.add(_hf_act(mlp.act_fn, w + ".mlp.act_fn", "hidden_act", cfg))
        eps.add(_check_rms(layer.input_layernorm, w + ".input_layernorm", E, family))
        eps.add(_check_rms(layer.post_attention_layernorm, w + ".post_attention_layernorm", E, family))
        p_attn.add(float(a.attention_dropout))
    eps.add(_check_rms(base.norm, where + ".norm", E, family))
    d = _one(ds, where, "head_dim")
    _check_inv_freq(rot, f"{where}.rotary_emb", cfg, theta, d)
    qb, ob = _one(biases, where, "attention biases")
    Fz, mb = _one(ffs, where, "intermediate_size / mlp_bias")
    V = int(base.embed_tokens.weight.shape[0])
    tied = head is not None and head.weight is base.embed_tokens.weight
    if head is not None and not tied:
        _check_linear(head, f"{cls}.lm_head", E, V, bias=False)
    config = DecoderConfig(
        vocab_size=V, d_model=E, n_layers=len(layers), n_heads=H, n_kv_heads=Hkv, head_dim=d, d_ff=Fz,
        norm="rms", norm_eps=_one(eps, where, "rms_norm_eps"), mlp="gated",
        activation=_one(acts, where, "hidden_act"), positions="rope", rope_theta=theta, qkv_bias=qb,
        out_bias=ob, mlp_bias=mb, tie_embeddings=tied or head is None, lm_head=head is not None,
        scale=_one(scales, where, "attention scale"), attention_dropout=_one(p_attn, where, "attention_dropout"),
        hf_arithmetic=True, padding_idx=base.embed_tokens.padding_idx,
    )
    return dict(config=config, prefix=prefix, kind="llama")


# -- the weight map -----------------------------------------------------------------------------
def _entries(model: DecoderLM, kind: str, prefix: str) -> list:
    """``(hf_name, [(our parameter, layer or None)], to_ours, to_hf)`` for every HF parameter:
    ``to_ours(hf) -> [tensors in our layouts]``, ``to_hf([ours]) -> hf tensor``."""
    c = model.config
    E, H, Hkv, d, L = c.d_model, c.n_heads, c.n_kv_heads, c.head_dim, c.n_layers
    a, f = model.attention, model.ffn
    n1, n2 = model.norms[0][-1], model.norms[1][-1]
    out = []

    def add(name, params, to_ours, to_hf):
        out.append((name, params, to_ours, to_hf))

    def same(name, p, n=None):
        add(name, [(p, n)], lambda x: [x], lambda xs: xs[0])

    def tr(name, p, n=None):  # nn.Linear (out, in) <-> our (in, out)
        add(name, [(p, n)], lambda x: [x.t()], lambda xs: xs[0].t())

    if kind == "gpt2":
        for n in range(L):
            h = f"{prefix}h.{n}."
            same(h + "ln_1.weight", n1.weight.pieces[n], None)
            same(h + "ln_1.bias", n1.bias.pieces[n], None)
            same(h + "ln_2.weight", n2.weight.pieces[n], None)
            same(h + "ln_2.bias", n2.bias.pieces[n], None)
            add(h + "attn.c_attn.weight", [(a.WQ.pieces[n], None), (a.WK.pieces[n], None), (a.WV.pieces[n], None)],
                lambda x: [w.reshape(E, H, d) for w in x.split(E, 1)],
                lambda xs: torch.cat([w.reshape(E, E) for w in xs], 1))
            add(h + "attn.c_attn.bias", [(a.bQ.pieces[n], None), (a.bK.pieces[n], None), (a.bV.pieces[n], None)],
                lambda x: [b.reshape(H, d) for b in x.split(E)], lambda xs: torch.cat([b.reshape(E) for b in xs]))
            add(h + "attn.c_proj.weight", [(a.WO.pieces[n], None)], lambda x: [x.reshape(H, d, E)],
                lambda xs: xs[0].reshape(E, E))
            same(h + "attn.c_proj.bias", a.bO.pieces[n], None)
            same(h + "mlp.c_fc.weight", f.W1.pieces[n], None)
            same(h + "mlp.c_fc.bias", f.b1.pieces[n], None)
            same(h + "mlp.c_proj.weight", f.W2.pieces[n], None)
            same(h + "mlp.c_proj.bias", f.b2.pieces[n], None)
        same(prefix + "wte.weight", model.embedding.weight)
        same(prefix + "wpe.weight", model.positions.weight)
        same(prefix + "ln_f.weight", model.final_norm[0].weight.value)
        same(prefix + "ln_f.bias", model.final_norm[0].bias.value)
    else:
        for n in range(L):
            h = f"{prefix}layers.{n}."
            for nm, W, heads in (("q", a.WQ, H), ("k", a.WK, Hkv), ("v", a.WV, Hkv)):
                add(h + f"self_attn.{nm}_proj.weight", [(W.pieces[n], None)],
                    lambda x, k=heads: [x.t().reshape(E, k, d)], lambda xs, k=heads: xs[0].reshape(E, k * d).t())
            add(h + "self_attn.o_proj.weight", [(a.WO.pieces[n], None)], lambda x: [x.t().reshape(H, d, E)],
                lambda xs: xs[0].reshape(H * d, E).t())
            if c.qkv_bias:
                for nm, b, heads in (("q", a.bQ, H), ("k", a.bK, Hkv), ("v", a.bV, Hkv)):
                    add(h + f"self_attn.{nm}_proj.bias", [(b.pieces[n], None)], lambda x, k=heads: [x.reshape(k, d)],
                        lambda xs: xs[0].reshape(-1))
            if c.out_bias:
                same(h + "self_attn.o_proj.bias", a.bO.pieces[n], None)
            tr(h + "mlp.gate_proj.weight", f.W1.pieces[n], None)
            tr(h + "mlp.up_proj.weight", f.W_up.pieces[n], None)
            tr(h + "mlp.down_proj.weight", f.W2.pieces[n], None)
            if c.mlp_bias:
                same(h + "mlp.gate_proj.bias", f.b1.pieces[n], None)
                same(h + "mlp.up_proj.bias", f.b_up.pieces[n], None)
                same(h + "mlp.down_proj.bias", f.b2.pieces[n], None)
            same(h + "input_layernorm.weight", n1.weight.pieces[n], None)
            same(h + "post_attention_layernorm.weight", n2.weight.pieces[n], None)
        same(prefix + "embed_tokens.weight", model.embedding.weight)
        same(prefix + "norm.weight", model.final_norm[-1].weight.value)
    if model.head is not None:
        same("lm_head.weight", model.head)
    return out


def _views(params, grads: bool) -> list:
    out = []
    for p, n in params:
        t = p.grad if grads else p
        if t is None:
            t = torch.zeros_like(p)
        out.append(t if n is None else t[n])
    return out


def hf_state_dict(model: DecoderLM, *, grads: bool = False) -> dict:
    """The converted model's parameters (or their gradients, ``grads=True``; zeros where
    none) in the Hugging Face layout, keyed by HF's parameter names (tied read-outs appear
    once, under the embedding's name)."""
    info = getattr(model, "_hf", None)
    if not isinstance(model, DecoderLM) or info is None:
        raise TypeError("hf_state_dict: expected a DecoderLM made by from_hf (it records the Hugging Face layout)")
    with torch.no_grad():
        return {name: to_hf(_views(params, grads)).clone() for name, params, _, to_hf in
                _entries(model, info["kind"], info["prefix"])}


def decoder_from_hf(model) -> DecoderLM:
    """A Hugging Face GPT-2 / Llama / Qwen2 / Mistral model -> :class:`DecoderLM` (see the
    module docstring; registered with :func:`~opsplit.models.hf.from_hf`).  The parameters
    are ordinary tensors even when called inside ``torch.inference_mode()`` (inference
    tensors could never be used by a later forward that records autograd)."""
    with torch.inference_mode(False), torch.no_grad():
        return _decoder_from_hf(model)


def _decoder_from_hf(model) -> DecoderLM:
    cls = type(model).__name__
    meta = [n for n, t in list(model.named_parameters()) + list(model.named_buffers()) if t.is_meta]
    if meta:
        raise ValueError(f"from_hf: {cls}: {meta[0]} (and {len(meta) - 1} more) on the meta device hold no values to "
                         "convert; materialise the model first (model.to_empty(device=...) and load its weights)")
    parts = _gpt2_parts(model) if cls in GPT2_CLASSES else _llama_parts(model)
    dtype, device = _one_dtype_device(model, cls)
    config = parts["config"]
    out = DecoderLM(config, device=device, dtype=dtype)
    hf_params = dict(model.named_parameters(remove_duplicate=False))
    flags: dict = {}
    for name, params, to_ours, _ in _entries(out, parts["kind"], parts["prefix"]):
        src = hf_params.get(name)
        if src is None:
            raise ValueError(f"from_hf: {cls}: expected a parameter {name!r}, not found")
        for (p, _), dst, val in zip(params, _views(params, False), to_ours(src)):
            dst.copy_(val)
            flags.setdefault(id(p), (p, set()))[1].add(src.requires_grad)
    for p, fl in flags.values():
        if len(fl) != 1:  # an HF tensor split into several of ours never gets two flags; this guards the map
            raise ValueError(f"from_hf: {cls}: one parameter mapped from HF tensors with different requires_grad")
        p.requires_grad_(fl.pop())
    out._hf = {"class": cls, "config": copy.deepcopy(model.config), "kind": parts["kind"], "prefix": parts["prefix"]}
    # what HF's generate reads when its arguments are not given (opsplit.models.generate)
    gen = getattr(model, "generation_config", None) or model.config
    out.generation_defaults = {k: copy.deepcopy(getattr(gen, k, None)) for k in ("eos_token_id", "pad_token_id")}
    out.train(model.training)
    return out


def to_hf(model: DecoderLM):
    """The Hugging Face model a :class:`DecoderLM` was converted from, rebuilt from the
    recorded configuration (no download) with the converted model's current weights (a pure
    weight copy), in its dtype, device and training mode.

    The read-out is tied in the rebuilt model exactly when it is one tensor with the token
    table in the converted one (``tie_word_embeddings`` of the rebuilt config follows the
    tensors, not the recorded flag: an HF model whose ``lm_head`` was replaced by a parameter
    of its own comes back untied); every HF parameter is then compared with the value written
    to it, and a mismatch (two names on one tensor that hold different values) is refused,
    naming both."""
    info = getattr(model, "_hf", None)
    if not isinstance(model, DecoderLM) or info is None:
        raise TypeError("to_hf: expected a DecoderLM made by from_hf (to_hf rebuilds that Hugging Face class)")
    import transformers

    p = model.embedding.weight
    config = copy.deepcopy(info["config"])
    if model.config.lm_head:
        config.tie_word_embeddings = model.head is None
    with torch.inference_mode(False):
        hf = getattr(transformers, info["class"])(config).to(dtype=p.dtype, device=p.device)
        state = hf_state_dict(model)
        with torch.no_grad():
            own = dict(hf.named_parameters(remove_duplicate=False))
            for name, value in state.items():
                own[name].copy_(value)
            embed = info["prefix"] + ("wte.weight" if info["kind"] == "gpt2" else "embed_tokens.weight")
            for name, t in own.items():
                src = state.get(name, state[embed] if name == "lm_head.weight" and model.head is None else None)
                if src is None or not torch.equal(t, src):
                    other = [n for n, u in own.items() if u is t and n != name]
                    raise ValueError(f"to_hf: the rebuilt {info['class']}'s {name} does not hold the converted "
                                     f"model's value" + (f" (it is one tensor with {other[0]})" if other else ""))
    hf.train(model.training)
    return hf


for _name in HF_DECODER_CLASSES:
    register_hf_converter(_name, decoder_from_hf)
