r"""Hugging Face decoder-only models -> :class:`~opsplit.models.DecoderLM` and back.

Registered with :func:`~opsplit.models.hf.from_hf` (exactly these classes; subclasses and
look-alikes are refused): ``GPT2Model``, ``GPT2LMHeadModel``, ``LlamaModel``,
``LlamaForCausalLM``, ``Qwen2Model``, ``Qwen2ForCausalLM``, ``MistralModel``,
``MistralForCausalLM``.  :func:`to_hf` builds the Hugging Face model of what the converted
model computes (no download): the recorded configuration with the model's sizes and settings
written over it, and the weights (a pure copy: ``to_hf(from_hf(m))`` holds ``m``'s weights
bit for bit); what HF cannot hold is refused, naming it.

**The modules, not the config.**  Sizes are read from the modules, as their forward uses them:
GPT-2's heads from each attention module's ``head_dim`` (``num_heads`` and ``embed_dim``
checked against it), the Llama family's from the projections' widths over ``head_dim``
(``num_key_value_groups`` checked) — a config edited after the build does not change what
the model computes, and does not change the conversion.  The rotary frequencies
(``rotary_emb.inv_freq``) are compared with ``rope_theta``'s in the buffer's precision; a
model cast to float16 or bfloat16 reads them rounded to that dtype, and so does the
converted one (:class:`HFRotaryEmbedding`).

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

from ..controls import Constant
from ..grid import Grid
from ..operators import FieldDropout, ProjectionSphere, RotaryEmbedding
from ..schemes import Lie
from ..solvers import ExplicitEuler
from .decoder_lm import DecoderConfig, DecoderLM
from .hf import _check_layer_norm, register_hf_converter
from .vit import _check_linear, _dropout_p, _hf_act, _is_hf, _need_hf, _one_dtype_device

__all__ = ["decoder_from_hf", "to_hf", "hf_state_dict", "HF_DECODER_CLASSES", "HFRotaryEmbedding"]

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
    E = int(tr.embed_dim)
    blocks = list(tr.h)
    if not blocks:
        raise ValueError(f"from_hf: {cls}: no layers (n_layer = 0) to convert")
    acts, eps, p_attn, p_resid, inner, heads = set(), set(), set(), set(), set(), set()
    for n, blk in enumerate(blocks):
        w = f"{where}.h[{n}]"
        _need_hf(blk, w, "GPT2Block")
        if hasattr(blk, "crossattention"):
            raise ValueError(f"from_hf: {w}: cross-attention (config.add_cross_attention) is not converted")
        _need_hf(blk.attn, w + ".attn", "GPT2Attention")
        _need_hf(blk.mlp, w + ".mlp", "GPT2MLP")
        if blk.attn.is_cross_attention:
            raise ValueError(f"from_hf: {w}.attn: cross-attention is not converted")
        heads.add(_gpt2_heads(blk.attn, w + ".attn", E))
        _check_conv1d(blk.attn.c_attn, w + ".attn.c_attn", E, 3 * E)
        _check_conv1d(blk.attn.c_proj, w + ".attn.c_proj", E, E)
        Fz = int(blk.mlp.c_fc.weight.shape[1])
        _check_conv1d(blk.mlp.c_fc, w + ".mlp.c_fc", E, Fz)
        _check_conv1d(blk.mlp.c_proj, w + ".mlp.c_proj", Fz, E)
        inner.add(Fz)
        acts.add(_hf_act(blk.mlp.act, w + ".mlp.act", "activation_function", cfg))
        eps.add(_check_layer_norm(blk.ln_1, w + ".ln_1", E))
        eps.add(_check_layer_norm(blk.ln_2, w + ".ln_2", E))
        p_attn.add(_dropout_p(blk.attn.attn_dropout, w + ".attn.attn_dropout"))
        p_resid.add(_dropout_p(blk.attn.resid_dropout, w + ".attn.resid_dropout"))
        p_resid.add(_dropout_p(blk.mlp.dropout, w + ".mlp.dropout"))
    eps.add(_check_layer_norm(tr.ln_f, where + ".ln_f", E))
    # the attention modules' own head count (what their forward splits the features by), not
    # config.n_head: a config edited after the build does not change the modules
    H, _ = _one(heads, where, "(num_heads, head_dim) of the attention modules")
    # transformers >= 4.57 keeps the score scale as ``attn.scaling``; before, it follows from
    # scale_attn_weights (scale_attn_by_inverse_layer_idx is refused above)
    scales = {float(getattr(b.attn, "scaling", (E // H) ** -0.5 if b.attn.scale_attn_weights else 1.0))
              for b in blocks}
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


def _gpt2_heads(attn, where: str, E: int) -> tuple:
    """``(num_heads, head_dim)`` of a ``GPT2Attention`` as its forward splits the features
    (``head_dim`` features per head, ``embed_dim / head_dim`` heads), checked against its
    ``num_heads`` and ``embed_dim``."""
    H, d = getattr(attn, "num_heads", None), getattr(attn, "head_dim", None)
    if isinstance(H, bool) or not isinstance(H, int) or isinstance(d, bool) or not isinstance(d, int) or \
            H < 1 or d < 1:
        raise ValueError(f"from_hf: {where}: expected integer num_heads and head_dim attributes, got num_heads = "
                         f"{H!r}, head_dim = {d!r}")
    if H * d != E or int(getattr(attn, "embed_dim", E)) != E:
        raise ValueError(f"from_hf: {where}: num_heads * head_dim = {H} * {d} != embed_dim = {E}; the module's "
                         "attributes disagree with each other")
    return H, d


def _llama_heads(a, where: str, d: int) -> tuple:
    """``(query heads, key/value heads)`` of a Llama-family attention module as its forward
    reads them: the projections' widths over ``head_dim``, checked against its
    ``num_key_value_groups`` (the key/value repeat of its forward)."""
    for nm in ("q_proj", "k_proj"):
        lin = getattr(a, nm, None)
        _need_hf(lin, f"{where}.{nm}", nn.Linear)
        if lin.out_features % d:
            raise ValueError(f"from_hf: {where}.{nm}: {lin.out_features} outputs are not a whole number of heads of "
                             f"head_dim = {d}")
    H, Hkv = a.q_proj.out_features // d, a.k_proj.out_features // d
    groups = getattr(a, "num_key_value_groups", H // Hkv if Hkv and H % Hkv == 0 else None)
    if Hkv < 1 or H % Hkv or groups != H // Hkv:
        raise ValueError(f"from_hf: {where}: {H} query heads and {Hkv} key/value heads (the projections' widths over "
                         f"head_dim = {d}) do not fit num_key_value_groups = {groups!r}")
    return H, Hkv


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


def _check_inv_freq(rot, where: str, cfg, theta: float, d: int):
    """The module's rotary frequencies (``rotary_emb.inv_freq``, what HF's forward reads) must
    be those opsplit computes from the config's ``rope_theta`` and the heads' size (HF's own
    float32 formula, :meth:`~opsplit.operators.RotaryEmbedding.frequencies`), compared in the
    buffer's precision: a model cast to float16 or bfloat16 holds them rounded to that dtype
    (its forward reads the rounded values).  A buffer edited after the build, or a config
    edited after it, is refused naming both.  Returns the buffer's dtype when it holds fewer
    bits than float32 (the converted model rounds its frequencies alike), else ``None``."""
    field = "rope_parameters['rope_theta']" if getattr(cfg, "rope_parameters", None) is not None else "rope_theta"
    buf = getattr(rot, "inv_freq", None)
    if not isinstance(buf, torch.Tensor):
        raise ValueError(f"from_hf: {where}.inv_freq: expected the rotary frequencies as a tensor buffer, got "
                         f"{type(buf).__name__}")
    want = RotaryEmbedding(d, theta, compute_dtype=torch.float32).frequencies(buf.device)
    if tuple(buf.shape) != tuple(want.shape):
        raise ValueError(f"from_hf: {where}.inv_freq: expected {want.numel()} frequencies (head_dim {d} / 2), got "
                         f"shape {tuple(buf.shape)}")
    if not buf.is_floating_point():
        raise ValueError(f"from_hf: {where}.inv_freq: expected floating-point frequencies, got dtype {buf.dtype}")
    half = torch.finfo(buf.dtype).bits < 32
    # HF's float32 frequencies as the buffer's dtype holds them; float32 and float64 hold them exactly
    ref = want.to(buf.dtype).double() if half else want.double()
    tol = (2 * torch.finfo(buf.dtype).eps) if half else 4 * torch.finfo(torch.float32).eps
    have = buf.detach().double()
    rel = float(((have - ref).abs() / ref).max()) if bool(torch.isfinite(have).all()) else float("inf")
    if not rel <= tol:
        raise ValueError(
            f"from_hf: {where}.inv_freq: the module's rotary frequencies differ from those of config.{field} = "
            f"{theta:g} (head_dim {d}) by up to {rel:.3g} relative, compared in the buffer's {buf.dtype}; opsplit "
            f"computes them from rope_theta, so the two must agree (rebuild the model from its config, or set "
            f"{field} to the base the frequencies were made with)"
        )
    return buf.dtype if half else None


class HFRotaryEmbedding(RotaryEmbedding):
    """Rotary positions with the frequencies a Hugging Face Llama-family model cast to a
    half-precision ``frequency_dtype`` reads (``from_hf`` of a ``.half()`` or bfloat16
    model): HF's float32 formula rounded to that dtype (its ``inv_freq`` buffer), then float32
    angles as HF computes them."""

    def __init__(self, head_dim: int, theta: float, *, frequency_dtype: torch.dtype):
        super().__init__(head_dim, theta, compute_dtype=torch.float32)
        if not isinstance(frequency_dtype, torch.dtype) or not frequency_dtype.is_floating_point:
            raise TypeError(f"HFRotaryEmbedding.frequency_dtype: expected a floating-point torch.dtype, got "
                            f"{frequency_dtype!r}")
        self._frequency_dtype = frequency_dtype

    @property
    def frequency_dtype(self) -> torch.dtype:
        """The dtype the frequencies are rounded to (fixed: the cache of frequencies keys on
        ``theta``, ``head_dim`` and ``compute_dtype``)."""
        return self._frequency_dtype

    def _compute_frequencies(self, device):
        return super()._compute_frequencies(device).to(self._frequency_dtype).to(torch.float32)

    def extra_repr(self) -> str:
        return super().extra_repr() + f", frequencies rounded to {self._frequency_dtype} (HF's inv_freq)"


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
    # the sizes the modules hold (what their forward computes with), not the config's: a config
    # edited after the build does not change the modules
    emb = base.embed_tokens
    if type(emb) is not nn.Embedding:
        raise TypeError(f"from_hf: {where}.embed_tokens: expected nn.Embedding, got {type(emb).__name__}")
    E = int(emb.weight.shape[1])
    layers = list(base.layers)
    if not layers:
        raise ValueError(f"from_hf: {cls}: no layers (num_hidden_layers = 0) to convert")
    acts, eps, p_attn, ds, scales, biases, ffs, heads = set(), set(), set(), set(), set(), set(), set(), set()
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
        H, Hkv = _llama_heads(a, w + ".self_attn", d)
        heads.add((H, Hkv))
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
    H, Hkv = _one(heads, where, "(query heads, key/value heads) of the attention modules")
    freq_dtype = _check_inv_freq(rot, f"{where}.rotary_emb", cfg, theta, d)
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
    return dict(config=config, prefix=prefix, kind="llama", frequency_dtype=freq_dtype)


# -- the weight map -----------------------------------------------------------------------------
def _constant_sigma(ctl, where: str):
    r"""The value of a norm's :math:`\sigma` control (a :class:`~opsplit.controls.Constant`
    scalar, what a converted model holds); Hugging Face's norms have no time-dependent one."""
    if not isinstance(ctl, Constant) or ctl.value.dim() != 0:
        raise ValueError(f"to_hf: {where}: expected a constant scalar (a converted model's), got "
                         f"{type(ctl).__name__}; Hugging Face's norm has one weight per layer and no sigma of its own")
    return ctl.value.detach()


def _s1_sigmas(proj, where: str) -> tuple:
    r"""``(sigma_1, sigma_2)`` of a LayerNorm's :math:`S_1` projection as its fused forward reads
    them (:class:`~opsplit.operators.PointwiseAffine`)."""
    return _constant_sigma(proj.sigma1, where + ".sigma1"), _constant_sigma(proj.sigma2, where + ".sigma2")


def _sphere_sigma(proj, grid, where: str):
    r""":math:`\sigma_2` of an RMS norm's sphere projection as its forward reads it."""
    _constant_sigma(proj.sigma2, where + ".sigma2")
    v = proj._sigma(0.0, grid, torch.float64)
    return v.detach() if isinstance(v, torch.Tensor) else torch.tensor(float(v), dtype=torch.float64)


def _entries(model: DecoderLM, kind: str, prefix: str) -> list:
    r"""``(hf_name, [(our parameter, layer or None)], to_ours, to_hf, grad_to_hf)`` for every HF
    parameter: ``to_ours(hf) -> [tensors in our layouts]``, ``to_hf([ours]) -> hf tensor``,
    ``grad_to_hf([our gradients]) -> the gradient of the HF tensor`` (``None``: ``to_hf``).

    The norms' :math:`\sigma` (the :math:`S_1` projection's :math:`\sigma_1, \sigma_2`, the
    sphere's :math:`\sigma_2`; 0 and 1 in a converted model, exactly HF's norm) are folded
    into HF's weight and bias as the fused forward folds them: weight :math:`\gamma\sigma_2`,
    bias :math:`\gamma\sigma_1 + \beta` (a pure copy at the defaults)."""
    c = model.config
    E, H, Hkv, d, L = c.d_model, c.n_heads, c.n_kv_heads, c.head_dim, c.n_layers
    a, f = model.attention, model.ffn
    n1, n2 = model.norms[0][-1], model.norms[1][-1]
    grid = model.decoder.grid
    out = []

    def add(name, params, to_ours, to_hf, grad_to_hf=None):
        out.append((name, params, to_ours, to_hf, grad_to_hf))

    def layer_norm(name, wp, bp, proj, where):  # gamma * P_S1(sigma1, sigma2) + beta -> HF's LayerNorm
        def sig(t):
            s1, s2 = _s1_sigmas(proj, where)
            return s1.to(t.dtype), s2.to(t.dtype)

        def w_grad(xs):  # d/d(gamma s2) = (dL/dgamma - s1 dL/dbeta) / s2
            s1, s2 = sig(xs[0])
            gb = bp.grad if bp.grad is not None else torch.zeros_like(bp)
            return (xs[0] - s1 * gb) / s2

        add(name + ".weight", [(wp, None)], lambda x: [x], lambda xs: xs[0] * sig(xs[0])[1], w_grad)
        add(name + ".bias", [(bp, None)], lambda x: [x], lambda xs: wp.detach() * sig(xs[0])[0] + xs[0],
            lambda xs: xs[0])

    def rms_norm(name, wp, proj, where):  # gamma * P_sphere(sigma2) -> HF's RMSNorm weight gamma sigma2
        def s2(t):
            return _sphere_sigma(proj, grid, where).to(t.dtype)

        add(name, [(wp, None)], lambda x: [x], lambda xs: xs[0] * s2(xs[0]), lambda xs: xs[0] / s2(xs[0]))

    def same(name, p, n=None):
        add(name, [(p, n)], lambda x: [x], lambda xs: xs[0])

    def tr(name, p, n=None):  # nn.Linear (out, in) <-> our (in, out)
        add(name, [(p, n)], lambda x: [x.t()], lambda xs: xs[0].t())

    if kind == "gpt2":
        for n in range(L):
            h = f"{prefix}h.{n}."
            layer_norm(h + "ln_1", n1.weight.pieces[n], n1.bias.pieces[n], n1.projection, "norms[0].projection")
            layer_norm(h + "ln_2", n2.weight.pieces[n], n2.bias.pieces[n], n2.projection, "norms[1].projection")
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
        fn = model.final_norm[0]
        layer_norm(prefix + "ln_f", fn.weight.value, fn.bias.value, fn.projection, "final_norm[0].projection")
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
            rms_norm(h + "input_layernorm.weight", n1.weight.pieces[n], model.norms[0][0], "norms[0][0]")
            rms_norm(h + "post_attention_layernorm.weight", n2.weight.pieces[n], model.norms[1][0], "norms[1][0]")
        same(prefix + "embed_tokens.weight", model.embedding.weight)
        rms_norm(prefix + "norm.weight", model.final_norm[-1].weight.value, model.final_norm[0], "final_norm[0]")
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
        return {name: (g if grads and g is not None else to_hf)(_views(params, grads)).clone()
                for name, params, _, to_hf, g in _entries(model, info["kind"], info["prefix"])}


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
    dtype, device = _one_dtype_device(model, f"from_hf: {cls}")
    config = parts["config"]
    out = DecoderLM(config, device=device, dtype=dtype)
    if parts.get("frequency_dtype") is not None:  # the rotary frequencies as the half-precision buffer holds them
        out.attention.rotary = HFRotaryEmbedding(config.head_dim, config.rope_theta,
                                                 frequency_dtype=parts["frequency_dtype"])
    hf_params = dict(model.named_parameters(remove_duplicate=False))
    flags: dict = {}
    for name, params, to_ours, *_ in _entries(out, parts["kind"], parts["prefix"]):
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


def _one_value(values: dict, what: str, field: str):
    """The one value of ``values`` (``{where: value}``), or a refusal naming where they differ."""
    distinct = sorted(set(values.values()), key=str)
    if len(distinct) != 1:
        listed = ", ".join(f"{k} = {v!r}" for k, v in values.items())
        raise ValueError(f"to_hf: the model's {what} differ ({listed}); Hugging Face's config holds one {field}")
    return distinct[0]


def _check_solve(model: DecoderLM) -> None:
    r"""The converted model solves Hugging Face's network: :math:`N_t` = number of layers steps
    of :math:`\Delta t = 1` from :math:`t = 0`, the Lie scheme of its two terms with
    explicit-Euler substeps, on the paper's token grid (spacing 1)."""
    p, L = model.decoder, model.config.n_layers
    if p.n_steps != L or p.t0 != 0.0 or p.t1 != float(L):
        raise ValueError(f"to_hf: model.decoder solves N_t = {p.n_steps} steps on [{p.t0:g}, {p.t1:g}]; Hugging "
                         f"Face's network is N_t = n_layers = {L} steps of dt = 1 on [0, {L}] (set "
                         f"model.decoder.n_steps = {L}, or call the model with n_steps= instead)")
    sch = p.scheme
    if type(sch) is not Lie or len(sch.substeps) != 2:
        raise ValueError(f"to_hf: model.decoder.scheme is {type(sch).__name__}; Hugging Face's layer is the Lie "
                         "scheme of its attention and feed-forward terms")
    for i, sub in enumerate(sch.substeps):
        solver = getattr(sub, "solver", None)
        if type(solver) is not ExplicitEuler:
            raise ValueError(f"to_hf: model.decoder.scheme.substeps[{i}] is solved by {type(solver).__name__}; "
                             "Hugging Face's layer is an explicit-Euler step of each term (a residual connection)")
    g, ref = p.grid, Grid.paper(None, model.config.d_model, nh=model.config.n_heads)
    if g.y != ref.y or g.h != ref.h or g.x.rule != ref.x.rule or g.x.spacing not in (None, 1.0):
        raise ValueError(f"to_hf: model.decoder.grid is {g}; Hugging Face's model is the paper's grid (token "
                         f"spacing 1, plain sums): {ref}")


def _export_config(model: DecoderLM, info: dict):
    """The Hugging Face config of what the converted model computes now: the recorded config
    with every size and every setting the modules compute with written over it (the attention
    modules' head counts, the norms' eps, the score scale, the rotary base, the dropouts);
    what Hugging Face's config cannot hold is refused, naming the module and its value."""
    _check_solve(model)
    c, a, kind = model.config, model.attention, info["kind"]
    config = copy.deepcopy(info["config"])
    if getattr(model.ffn, "activation", c.activation) != c.activation:
        raise ValueError(f"to_hf: model.ffn.activation = {model.ffn.activation!r} differs from the converted "
                         f"{c.activation!r}; the Hugging Face config's activation name is recorded for the latter")
    d = c.head_dim
    resid = {f"model.decoder.scheme.substeps[{i}] dropout": float(m.p)
             for i, m in enumerate(x for x in model.decoder.modules() if isinstance(x, FieldDropout))}
    resid = _one_value(resid, "residual dropouts", "residual dropout") if resid else 0.0
    if kind == "gpt2":
        n1, n2, fn = model.norms[0][-1], model.norms[1][-1], model.final_norm[0]
        eps = _one_value({"norms[0]": n1.projection.eps, "norms[1]": n2.projection.eps,
                          "final_norm[0]": fn.projection.eps}, "LayerNorm eps", "layer_norm_epsilon")
        if a.scale == d ** -0.5:
            scaled = True
        elif a.scale == 1.0:
            scaled = False
        else:
            raise ValueError(f"to_hf: model.attention.scale = {a.scale!r}; Hugging Face's GPT-2 scales the scores by "
                             f"head_dim ** -0.5 = {d ** -0.5!r} (scale_attn_weights=True) or 1 (False)")
        for k, v in (("vocab_size", c.vocab_size), ("n_embd", c.d_model), ("n_layer", c.n_layers),
                     ("n_head", c.n_heads), ("n_positions", model.positions.n_positions), ("n_inner", c.d_ff),
                     ("layer_norm_epsilon", eps), ("scale_attn_weights", scaled), ("attn_pdrop", float(a.dropout)),
                     ("resid_pdrop", resid), ("embd_pdrop", float(c.embedding_dropout))):
            setattr(config, k, v)
        return config
    norms = {"norms[0][0]": model.norms[0][0], "norms[1][0]": model.norms[1][0], "final_norm[0]": model.final_norm[0]}
    for k, m in norms.items():
        if not isinstance(m, ProjectionSphere) or m.compute_dtype != torch.float32:
            raise ValueError(f"to_hf: model.{k}: the RMS norm is computed in "
                             f"{getattr(m, 'compute_dtype', None)}; Hugging Face's computes it in torch.float32 "
                             "(compute_dtype=torch.float32)")
    eps = _one_value({k: m.eps for k, m in norms.items()}, "RMS norm eps", "rms_norm_eps")
    if a.scale != d ** -0.5:
        raise ValueError(f"to_hf: model.attention.scale = {a.scale!r}; Hugging Face's {info['class']} scales the "
                         f"scores by head_dim ** -0.5 = {d ** -0.5!r}")
    for what, p in (("residual dropout (model.decoder's FieldDropout)", resid),
                    ("embedding dropout (model.config.embedding_dropout)", float(c.embedding_dropout))):
        if p:
            raise ValueError(f"to_hf: the model's {what} is {p!r}; Hugging Face's {info['class']} has none")
    rot = a.rotary
    if rot is None or rot.head_dim != d or rot.compute_dtype != torch.float32:
        raise ValueError(f"to_hf: model.attention.rotary is {rot!r}; Hugging Face's {info['class']} rotates heads of "
                         f"head_dim {d} with float32 angles (compute_dtype=torch.float32)")
    for k, v in (("vocab_size", c.vocab_size), ("hidden_size", c.d_model), ("num_hidden_layers", c.n_layers),
                 ("num_attention_heads", c.n_heads), ("num_key_value_heads", c.n_kv_heads), ("head_dim", d),
                 ("intermediate_size", c.d_ff), ("rms_norm_eps", eps), ("attention_dropout", float(a.dropout))):
        setattr(config, k, v)
    if getattr(config, "rope_parameters", None) is not None:
        config.rope_parameters = {**config.rope_parameters, "rope_theta": float(rot.theta)}
    else:
        config.rope_theta = float(rot.theta)
    return config


def to_hf(model: DecoderLM):
    r"""The Hugging Face model a :class:`DecoderLM` was converted from, rebuilt (no download)
    with what the converted model computes now, in its dtype, device and training mode.

    The config is the recorded one with every size and setting the modules compute with
    written over it (:func:`_export_config`: head counts, the norms' eps, the score scale,
    the rotary base — the rebuilt rotary buffer holds the model's own frequencies — the
    dropouts); the weights are :func:`hf_state_dict` (a pure copy, with the norms'
    :math:`\sigma` folded into HF's weight and bias when they are not 0 and 1).  What HF
    cannot hold is refused before anything is built, naming it: another :math:`N_t`, scheme,
    substep solver or token grid, a score scale HF's class does not have, norms of different
    eps, an RMS norm or rotary angles not in float32, dropout where HF's class has none.

    The read-out is tied in the rebuilt model exactly when it is one tensor with the token
    table in the converted one (``tie_word_embeddings`` of the rebuilt config follows the
    tensors, not the recorded flag: an HF model whose ``lm_head`` was replaced by a parameter
    of its own comes back untied); every HF parameter is then compared with the value written
    to it, and a mismatch (two names on one tensor that hold different values) is refused,
    naming both."""
    info = getattr(model, "_hf", None)
    if not isinstance(model, DecoderLM) or info is None:
        raise TypeError("to_hf: expected a DecoderLM made by from_hf (to_hf rebuilds that Hugging Face class)")
    import transformers  # optional (opsplit[test]) and slow to import (~0.6 s): loaded only to export

    p = model.embedding.weight
    config = _export_config(model, info)
    if model.config.lm_head:
        config.tie_word_embeddings = model.head is None
    with torch.inference_mode(False):
        state = hf_state_dict(model)
        hf = getattr(transformers, info["class"])(config).to(dtype=p.dtype, device=p.device)
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
            if info["kind"] != "gpt2":
                _set_frequencies(hf.model if hasattr(hf, "model") else hf, model.attention.rotary)
    hf.train(model.training)
    return hf


def _set_frequencies(base, rotary) -> None:
    """The rebuilt model's rotary buffers hold the converted model's frequencies (HF's forward
    reads ``inv_freq`` in float32): in the buffer's dtype when it holds them exactly, else as a
    float32 buffer (a model cast to another precision after the conversion)."""
    rot = base.rotary_emb
    for name in ("inv_freq", "original_inv_freq"):
        buf = getattr(rot, name, None)
        if not isinstance(buf, torch.Tensor):
            continue
        want = rotary.frequencies(buf.device)
        if torch.equal(buf.float(), want):
            continue
        if torch.equal(want.to(buf.dtype).float(), want):
            buf.copy_(want)
        else:
            setattr(rot, name, want.clone())


for _name in HF_DECODER_CLASSES:
    register_hf_converter(_name, decoder_from_hf)
