r"""The vision transformer as pre- and post-processing around a propagator (paper 002, §4.2).

.. math::  \bar{\mathcal N}^{\text{ViT}}_{\tilde\theta} = G \circ \bar{\mathcal N} \circ F,

* :math:`F` (:class:`PatchEmbedding`): the image is cut into :math:`N_x - 1` patches, the
  rows of :math:`\mathbf R \in \mathbb R^{(N_x - 1)\times D}`; then
  :math:`\mathbf u_0 = F(\mathbf R) = [\mathbf v_0;\ \mathbf R \mathbf E] (+ \mathbf P)`
  with the class token :math:`\mathbf v_0`, the embedding :math:`\mathbf E` (plus its bias)
  and — not in the paper's formula, but in every ViT — learned positions :math:`\mathbf P`;
* :math:`\bar{\mathcal N}`: the encoder, a :class:`~opsplit.models.TorchEncoder` in its
  pre-norm form (ViT layers are ``x + MHA(LN(x))``, ``x + MLP(LN(x))`` with GELU), whose
  final LayerNorm is the first part of :math:`G`;
* :math:`G` (:class:`ClassTokenReadout`): :math:`G(\mathbf B; \mathbf u) =
  [1\ \mathbf 0]\,\mathbf u\,\mathbf B` — the class token's row times a matrix (plus a bias
  and, for the pooler, a tanh).

:func:`~opsplit.models.hf.from_hf` converts a Hugging Face ``transformers`` ``ViTModel``
(last hidden state and pooled output) or ``ViTForImageClassification`` (logits); this
module registers those two classes (exactly those: subclasses and look-alikes such as
DeiT, DINOv2, BEiT, I-JEPA or ViTMAE are refused).  Before any compute the converter checks
every sub-module's class and every option that changes the math: the activation modules
(``hidden_act``, ``pooler_act``), ``use_mask_token`` (refused), LayerNorms with weight and
bias and one ``eps``, a non-overlapping patch convolution, learned positions of the right
size, one configuration for all layers, one dtype and device.  Dropout sits where HF puts
it: on the embeddings, on the attention weights, after the attention and after the MLP —
none inside the MLP (``activation_dropout=0``).  ``requires_grad`` is kept per parameter
(a weight that some layers freeze and others train is refused: opsplit stacks it over the
layers in one parameter).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from .._checks import (
    check_finite,
    check_like_module,
    check_parameters_finite,
    check_positive_int,
    check_probability,
    check_tensor,
)
from ..operators._guard import check_output, checked_call
from ..operators._linear import fan_in_uniform_
from ..operators.activation import activation_fn
from .hf import (
    _check_layer_norm,
    _check_linear,
    _dropout_p,
    _is_hf,
    _need_hf,
    _one_dtype_device,
    from_hf,
    register_hf_converter,
)
from .torch_exact import TorchEncoder

__all__ = ["PatchEmbedding", "ClassTokenReadout", "ViT", "ViTOutput", "from_hf"]


def _pair(v, name: str = "size") -> tuple[int, int]:
    """A positive int or a pair of them -> (height, width)."""
    vals = tuple(v) if isinstance(v, (tuple, list)) else (v, v)
    if len(vals) != 2:
        raise ValueError(f"{name}: expected an int or a pair (height, width), got {v!r}")
    return tuple(check_positive_int(x, name) for x in vals)


class PatchEmbedding(nn.Module):
    r""":math:`F(\mathbf R) = [\mathbf v_0;\ \mathbf R \mathbf E + \mathbf b] + \mathbf P`
    (paper 002 §4.2, with ViT's bias and positions).

    Args:
        image_size, patch_size: ints or (height, width) pairs; the patch size must divide
            the image size.
        num_channels: :math:`C`; a patch has :math:`D = C\,p_h\,p_w` entries, flattened in the
            order (channel, row, column).
        n_y: embedding size :math:`N_y`.
        dropout: dropout on :math:`\mathbf u_0` in training mode.
    """

    def __init__(self, image_size, patch_size, num_channels: int, n_y: int, *, bias: bool = True,
                 dropout: float = 0.0, device=None, dtype=None):
        super().__init__()
        fk = {"device": device, "dtype": dtype}
        self.image_size, self.patch_size = _pair(image_size, "image_size"), _pair(patch_size, "patch_size")
        (H, W), (ph, pw) = self.image_size, self.patch_size
        if H % ph or W % pw:
            raise ValueError(
                f"patch_size: {self.patch_size} does not divide image_size {self.image_size} (PatchEmbedding)"
            )
        self.num_channels = check_positive_int(num_channels, "num_channels")
        self.n_y = check_positive_int(n_y, "n_y")
        dropout = check_probability(dropout, "PatchEmbedding.dropout")
        self.grid_size = (H // ph, W // pw)
        self.num_patches = self.grid_size[0] * self.grid_size[1]
        D = self.num_channels * ph * pw
        self.weight = nn.Parameter(torch.empty(D, self.n_y, **fk))  # E (rows: patch entries)
        self.bias = nn.Parameter(torch.empty(self.n_y, **fk)) if bias else None
        self.cls_token = nn.Parameter(torch.empty(self.n_y, **fk))  # v_0
        self.position = nn.Parameter(torch.empty(self.num_patches + 1, self.n_y, **fk))
        self.dropout = dropout
        self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self) -> None:
        fan_in_uniform_(self.weight.shape[0], self.weight, self.bias)
        nn.init.trunc_normal_(self.cls_token, std=0.02)
        nn.init.trunc_normal_(self.position, std=0.02)

    def patches(self, pixel_values: Tensor) -> Tensor:
        r""":math:`\mathbf R`: ``(B, C, H, W)`` -> ``(B, N_x - 1, D)``, patches in row-major
        order, each flattened as (channel, row, column)."""
        if not isinstance(pixel_values, Tensor) or pixel_values.dim() != 4:
            shape = tuple(pixel_values.shape) if isinstance(pixel_values, Tensor) else type(pixel_values).__name__
            raise ValueError(f"pixel_values: expected shape (B, C, H, W), got {shape}")
        B, C, H, W = pixel_values.shape
        if C != self.num_channels:
            raise ValueError(f"pixel_values: expected {self.num_channels} channels, got {C}")
        if (H, W) != self.image_size:
            raise ValueError(f"pixel_values: expected images of size {self.image_size}, got {(H, W)}")
        (gh, gw), (ph, pw) = self.grid_size, self.patch_size
        x = pixel_values.reshape(B, C, gh, ph, gw, pw).permute(0, 2, 4, 1, 3, 5)
        return x.reshape(B, gh * gw, C * ph * pw)

    def check_input(self, pixel_values) -> None:
        """Type, dtype and device of the pixels (shapes: :meth:`patches`)."""
        if not isinstance(pixel_values, Tensor):
            raise TypeError(f"pixel_values: expected a torch.Tensor (B, C, H, W), got {type(pixel_values).__name__}")
        if not pixel_values.is_floating_point():
            raise TypeError(
                f"pixel_values: expected a floating-point tensor, got dtype {pixel_values.dtype} (normalise "
                "the image and convert it with .float() first)"
            )
        if pixel_values.device != self.weight.device:
            raise TypeError(
                f"pixel_values: on device {pixel_values.device}, the model is on {self.weight.device} "
                "(move one with .to(device))"
            )

    def forward(self, pixel_values: Tensor) -> Tensor:
        r"""``(B, C, H, W)`` floating-point pixels (cast to the model's dtype, as Hugging Face's
        ViT does) -> :math:`\mathbf u_0`, shape ``(B, N_x, N_y)``.  Before any compute: the
        parameters finite (named), the pixels' type, device and finite values
        (``pixel_values: expected finite values``); an empty batch gives an empty batch."""
        self.check_input(pixel_values)
        what = type(self).__name__
        check_parameters_finite(self, what)
        check_finite(pixel_values, "pixel_values")
        return checked_call(self, what, lambda: self._embed(pixel_values))

    def _embed(self, pixel_values: Tensor) -> Tensor:
        """:math:`F` on checked pixels."""
        pixel_values = pixel_values.to(self.weight.dtype)
        R = self.patches(pixel_values)
        u = torch.nn.functional.linear(R, self.weight.t(), self.bias)  # R E + b
        v0 = self.cls_token.view(1, 1, -1).expand(u.shape[0], 1, -1)
        u = torch.cat([v0, u], dim=1) + self.position
        if self.dropout and self.training:
            u = torch.nn.functional.dropout(u, self.dropout, True)
        return u

    def extra_repr(self) -> str:
        return (f"image_size={self.image_size}, patch_size={self.patch_size}, num_channels={self.num_channels}, "
                f"n_y={self.n_y}, num_patches={self.num_patches}")


class ClassTokenReadout(nn.Module):
    r""":math:`G(\mathbf B; \mathbf u) = \sigma([1\ \mathbf 0]\,\mathbf u\,\mathbf B + \mathbf b)`
    (paper 002 §4.2; :math:`\sigma` = identity for a classifier, tanh for ViT's pooler).

    ``weight`` :math:`\mathbf B` has shape ``(N_y, d)`` (rows: features of the class token).
    """

    def __init__(self, n_y: int, d: int, *, bias: bool = True, activation: str = "identity",
                 device=None, dtype=None):
        super().__init__()
        fk = {"device": device, "dtype": dtype}
        n_y, d = check_positive_int(n_y, "n_y"), check_positive_int(d, "d")
        self.weight = nn.Parameter(torch.empty(n_y, d, **fk))
        self.bias = nn.Parameter(torch.empty(d, **fk)) if bias else None
        activation_fn(activation)
        self.activation = activation
        self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self) -> None:
        fan_in_uniform_(self.weight.shape[0], self.weight, self.bias)

    def forward(self, u: Tensor) -> Tensor:
        """``u`` of shape ``(B, N, N_y)``: reads the class token ``u[:, 0]``."""
        check_tensor(u, "ClassTokenReadout: u")
        n_y = self.weight.shape[0]
        if u.dim() != 3 or u.shape[-1] != n_y or u.shape[1] < 1:
            raise ValueError(
                f"ClassTokenReadout: u: expected shape (B, N, {n_y}) with N >= 1 (token 0 is the "
                f"class token), got {tuple(u.shape)}"
            )
        check_like_module(u, self, "ClassTokenReadout: u", "the ClassTokenReadout")
        check_parameters_finite(self, "ClassTokenReadout")
        check_finite(u[:, 0], "ClassTokenReadout: u", "in the class token u[:, 0], the row it reads")
        return checked_call(self, "ClassTokenReadout", lambda: activation_fn(self.activation)(
            torch.nn.functional.linear(u[:, 0], self.weight.t(), self.bias)))

    def extra_repr(self) -> str:
        return f"n_y={self.weight.shape[0]}, d={self.weight.shape[1]}, activation={self.activation!r}"


@dataclass
class ViTOutput:
    """What :class:`ViT` returns: the normalised final state, and the read-outs that exist."""

    last_hidden_state: Tensor
    pooler_output: Tensor | None = None
    logits: Tensor | None = None


class ViT(nn.Module):
    r""":math:`G \circ \bar{\mathcal N} \circ F` (paper 002, §4.2).

    Args:
        embedding: :math:`F`, a :class:`PatchEmbedding`.
        encoder: :math:`\bar{\mathcal N}`, a :class:`~opsplit.models.TorchEncoder` with
            ``batch_first=True`` (ViT: ``norm_first=True``, GELU, ``final_norm=True``).
        pooler: optional :class:`ClassTokenReadout` (``ViTModel``'s pooler: dense + tanh).
        classifier: optional :class:`ClassTokenReadout` (``ViTForImageClassification``).
    """

    def __init__(self, embedding: PatchEmbedding, encoder: TorchEncoder, pooler: ClassTokenReadout | None = None,
                 classifier: ClassTokenReadout | None = None):
        super().__init__()
        if not isinstance(embedding, PatchEmbedding):
            raise TypeError(f"ViT.embedding: expected a PatchEmbedding, got {type(embedding).__name__}")
        if not isinstance(encoder, TorchEncoder) or not encoder.batch_first:
            raise TypeError("ViT.encoder: expected a TorchEncoder with batch_first=True")
        if embedding.n_y != encoder.d_model:
            raise ValueError(f"ViT: embedding size {embedding.n_y} != encoder d_model {encoder.d_model}")
        for name, head in (("pooler", pooler), ("classifier", classifier)):
            if head is not None and not isinstance(head, ClassTokenReadout):
                raise TypeError(f"ViT.{name}: expected a ClassTokenReadout or None, got {type(head).__name__}")
            if head is not None and head.weight.shape[0] != encoder.d_model:
                raise ValueError(f"ViT.{name}: reads {head.weight.shape[0]} features, the encoder has d_model = "
                                 f"{encoder.d_model}")
        self.embedding, self.encoder, self.pooler, self.classifier = embedding, encoder, pooler, classifier

    def forward(self, pixel_values: Tensor, *, bool_masked_pos=None, interpolate_pos_encoding=None) -> ViTOutput:
        """``pixel_values`` ``(B, C, H, W)`` (floating point, on the model's device; cast to its
        dtype as Hugging Face does).  Every parameter is checked finite (named by its qualified
        name) and so are the pixels, before any compute (skipped with
        ``encoder.check_finite_input = False``); the encoder checks its output, each read-out
        its class token; a non-finite value found there re-reads every parameter first, so
        that one written through ``.data`` is named.  ``bool_masked_pos`` and ``interpolate_pos_encoding``
        (Hugging Face's options) are refused: not converted."""
        if bool_masked_pos is not None:
            raise ValueError("bool_masked_pos: masked image modelling (the mask token) is not converted")
        if interpolate_pos_encoding:
            raise ValueError(
                f"interpolate_pos_encoding: not converted; the model takes images of size {self.embedding.image_size}"
            )
        self.embedding.check_input(pixel_values)
        values = self.encoder.check_finite_input
        if values:  # every parameter, by its qualified name (re-read only after it changes)
            check_parameters_finite(self, "ViT")
            check_finite(pixel_values, "pixel_values")
        try:
            u = self.encoder(self.embedding._embed(pixel_values))
            out = ViTOutput(
                last_hidden_state=u,
                pooler_output=None if self.pooler is None else self.pooler(u),
                logits=None if self.classifier is None else self.classifier(u),
            )
            if values:
                for name in ("pooler_output", "logits"):
                    if getattr(out, name) is not None:
                        check_output(getattr(out, name), f"ViT {name}")
        except ValueError:
            if values:  # a NaN written through .data (no version change) is named first
                check_parameters_finite(self, "ViT", fresh=True)
            raise
        return out


# -- Hugging Face ----------------------------------------------------------------------------
#: transformers activation modules (by class name) -> opsplit activation; the same function
#: (to round-off: the tanh-GELU variants differ only in how the constant is written)
_HF_ACTIVATIONS = {
    "GELUActivation": "gelu",  # hidden_act "gelu", "gelu_python"
    "NewGELUActivation": "gelu_tanh",  # "gelu_new"
    "FastGELUActivation": "gelu_tanh",  # "gelu_fast"
    "GELUTanh": "gelu_tanh",  # "gelu_pytorch_tanh", "gelu_python_tanh"
    "PytorchGELUTanh": "gelu_tanh",  # transformers 4.x name of GELUTanh
    "AccurateGELUActivation": "gelu_tanh",  # "gelu_accurate"
    "QuickGELUActivation": "quick_gelu",  # "quick_gelu"
    "SiLUActivation": "silu",  # "silu"
    "LinearActivation": "identity",  # "linear"
}
#: torch.nn activation modules transformers' ACT2FN returns
_TORCH_ACTIVATIONS = {nn.ReLU: "relu", nn.SiLU: "silu", nn.Tanh: "tanh"}
#: hidden_act names whose modules are converted (for the error message)
_HF_ACT_NAMES = ("gelu", "gelu_python", "gelu_new", "gelu_fast", "gelu_pytorch_tanh", "gelu_python_tanh",
                 "gelu_accurate", "quick_gelu", "relu", "silu", "swish", "tanh", "linear")


def _hf_act(act, where: str, option: str, config) -> str:
    if type(act) in _TORCH_ACTIVATIONS:
        return _TORCH_ACTIVATIONS[type(act)]
    if _is_hf(act, *_HF_ACTIVATIONS):
        return _HF_ACTIVATIONS[type(act).__name__]
    raise ValueError(
        f"from_hf: {where}: unsupported {option}={getattr(config, option, None)!r} (module "
        f"{type(act).__name__}); opsplit converts {option} in {list(_HF_ACT_NAMES)}"
    )


def _hf_layer(layer, where: str, E: int, config) -> dict:
    """One ViT layer's modules and options (transformers 5.x layout; 4.x read, untested)."""
    _need_hf(layer, where, "ViTLayer")
    if hasattr(layer, "mlp"):  # transformers >= 5
        att = layer.attention
        _need_hf(att, where + ".attention", "ViTAttention")
        _need_hf(layer.mlp, where + ".mlp", "ViTMLP")
        H, d = int(att.num_attention_heads), int(att.head_dim)
        if getattr(att, "is_causal", False):
            raise ValueError(f"from_hf: {where}.attention: is_causal=True is not a ViT")
        scaling = float(att.scaling)
        q, k, v, o = att.q_proj, att.k_proj, att.v_proj, att.o_proj
        fc1, fc2 = layer.mlp.fc1, layer.mlp.fc2
        act = _hf_act(layer.mlp.activation_fn, where + ".mlp.activation_fn", "hidden_act", config)
        p_attn = float(att.attention_dropout)
        p_hidden = [_dropout_p(layer.dropout, where + ".dropout")] * 2
    elif hasattr(layer, "intermediate"):  # transformers 4.x
        sa = layer.attention.attention
        _need_hf(sa, where + ".attention.attention", "ViTSelfAttention", "ViTSdpaSelfAttention")
        _need_hf(layer.intermediate, where + ".intermediate", "ViTIntermediate")
        _need_hf(layer.output, where + ".output", "ViTOutput")
        H, d = int(sa.num_attention_heads), int(sa.attention_head_size)
        scaling = d ** -0.5
        q, k, v, o = sa.query, sa.key, sa.value, layer.attention.output.dense
        fc1, fc2 = layer.intermediate.dense, layer.output.dense
        act = _hf_act(layer.intermediate.intermediate_act_fn, where + ".intermediate", "hidden_act", config)
        p_attn = _dropout_p(sa.dropout, where + ".attention.attention.dropout")
        p_hidden = [_dropout_p(layer.attention.output.dropout, where + ".attention.output.dropout"),
                    _dropout_p(layer.output.dropout, where + ".output.dropout")]
    else:
        raise TypeError(f"from_hf: {where}: unrecognised ViTLayer layout (neither transformers 5.x nor 4.x)")
    if abs(scaling - d ** -0.5) > 1e-12 * d ** -0.5:
        raise ValueError(f"from_hf: {where}.attention: score scale {scaling} is not head_dim**-0.5 = {d ** -0.5}")
    qkv_bias = q.bias is not None
    for name, lin in (("q", q), ("k", k), ("v", v)):
        _check_linear(lin, f"{where}.attention.{name}", E, H * d, bias=qkv_bias)
    _check_linear(o, f"{where}.attention.output projection", H * d, E)
    _check_linear(fc1, f"{where} MLP fc1", E)
    _check_linear(fc2, f"{where} MLP fc2", fc1.out_features, E)
    eps = {_check_layer_norm(layer.layernorm_before, where + ".layernorm_before", E),
           _check_layer_norm(layer.layernorm_after, where + ".layernorm_after", E)}
    if len(set(p_hidden)) != 1:
        raise ValueError(f"from_hf: {where}: different hidden dropout probabilities {p_hidden}")
    return dict(
        modules=dict(q=q, k=k, v=v, o=o, ln1=layer.layernorm_before, ln2=layer.layernorm_after, fc1=fc1, fc2=fc2),
        options=dict(H=H, d=d, F=fc1.out_features, act=act, qkv_bias=qkv_bias, p_attn=p_attn,
                     p_hidden=p_hidden[0], eps=eps),
    )


def _hf_vit_parts(model) -> dict:
    """Everything from_hf reads, checked before any tensor is computed."""
    cls = type(model).__name__
    if cls == "ViTForImageClassification":
        vit, head = model.vit, model.classifier
        if type(head) not in (nn.Linear, nn.Identity):
            raise TypeError(f"from_hf: {cls}.classifier: expected nn.Linear or nn.Identity, got {type(head).__name__}")
        where = f"{cls}.vit"
    else:
        vit, head, where = model, None, cls
    _need_hf(vit, where, "ViTModel")
    emb = vit.embeddings
    _need_hf(emb, where + ".embeddings", "ViTEmbeddings")
    if getattr(emb, "mask_token", None) is not None:
        raise ValueError(
            f"from_hf: {where}: use_mask_token=True (a masked-image-modelling mask token for bool_masked_pos) "
            "is not converted; build the ViTModel with use_mask_token=False"
        )
    ln = vit.layernorm
    if type(ln) is not nn.LayerNorm:
        raise TypeError(f"from_hf: {where}.layernorm: expected nn.LayerNorm, got {type(ln).__name__}")
    E = int(ln.normalized_shape[0])
    final_eps = _check_layer_norm(ln, where + ".layernorm", E)
    layers = list(vit.layers) if hasattr(vit, "layers") else list(getattr(getattr(vit, "encoder", None), "layer", []))
    if not layers:
        raise ValueError(f"from_hf: {where}: no transformer layers (num_hidden_layers = 0) to convert")
    parsed = [_hf_layer(layer, f"{where}.layers[{n}]", E, vit.config) for n, layer in enumerate(layers)]
    opts = parsed[0]["options"]
    for n, p in enumerate(parsed[1:], 1):
        if p["options"] != opts:
            diff = {k: (opts[k], v) for k, v in p["options"].items() if opts[k] != v}
            raise ValueError(f"from_hf: {where}: layer {n} differs from layer 0 in {diff}")
    eps = opts["eps"] | {final_eps}
    if len(eps) != 1:
        raise ValueError(f"from_hf: {where}: LayerNorms with different eps {sorted(eps)} are not supported")
    # embeddings: a non-overlapping patch convolution, class token, learned positions
    pe = emb.patch_embeddings
    _need_hf(pe, where + ".embeddings.patch_embeddings", "ViTPatchEmbeddings")
    conv = pe.projection
    ps = _pair(pe.patch_size)
    if (type(conv) is not nn.Conv2d or tuple(conv.kernel_size) != ps or tuple(conv.stride) != ps
            or tuple(conv.padding) != (0, 0) or tuple(conv.dilation) != (1, 1) or conv.groups != 1
            or conv.in_channels != pe.num_channels or conv.out_channels != E):
        raise ValueError(
            f"from_hf: {where}.embeddings.patch_embeddings.projection: expected a non-overlapping patch "
            f"convolution nn.Conv2d({pe.num_channels}, {E}, kernel_size={ps}, stride={ps}), got {conv!r}"
        )
    image = _pair(pe.image_size)
    if image[0] % ps[0] or image[1] % ps[1]:
        raise ValueError(f"from_hf: {where}: patch size {ps} does not divide image size {image}")
    n_patches = (image[0] // ps[0]) * (image[1] // ps[1])
    if tuple(emb.cls_token.shape) != (1, 1, E):
        raise ValueError(f"from_hf: {where}.embeddings.cls_token: expected shape (1, 1, {E}), got {tuple(emb.cls_token.shape)}")
    pos = getattr(emb, "position_embeddings", None)
    if not isinstance(pos, Tensor) or tuple(pos.shape) != (1, n_patches + 1, E):
        raise ValueError(
            f"from_hf: {where}.embeddings.position_embeddings: expected learned positions of shape "
            f"(1, {n_patches + 1}, {E}), got {None if not isinstance(pos, Tensor) else tuple(pos.shape)}"
        )
    p_emb = _dropout_p(emb.dropout, where + ".embeddings.dropout")
    pooler = getattr(vit, "pooler", None)
    pool_act = None
    if pooler is not None:
        _need_hf(pooler, where + ".pooler", "ViTPooler")
        _check_linear(pooler.dense, where + ".pooler.dense", E, bias=None)
        pool_act = _hf_act(pooler.activation, where + ".pooler.activation", "pooler_act", vit.config)
    if isinstance(head, nn.Linear):
        _check_linear(head, f"{cls}.classifier", E, bias=None)
    dtype, device = _one_dtype_device(model, f"from_hf: {cls}")
    return dict(vit=vit, head=head, layers=[p["modules"] for p in parsed], opts=opts, eps=eps.pop(), E=E,
                emb=emb, conv=conv, image=image, patch=ps, p_emb=p_emb, pooler=pooler, pool_act=pool_act,
                fk={"dtype": dtype, "device": device}, where=where)


def _stacked_rg(layers, key: str, attr: str, where: str) -> bool:
    """The one ``requires_grad`` of a weight stacked over the layers (refused when they differ)."""
    flags = [getattr(layer[key], attr).requires_grad for layer in layers]
    if len(set(flags)) != 1:
        raise ValueError(
            f"from_hf: {where}: {key}.{attr}.requires_grad differs between layers ({flags}); opsplit holds a "
            "weight of all layers in one parameter (piecewise constant in t), with one requires_grad"
        )
    return flags[0]


@torch.no_grad()
def _vit_from_hf(model) -> ViT:
    """``ViTModel`` / ``ViTForImageClassification`` -> :class:`ViT` (registered with
    :func:`~opsplit.models.hf.register_hf_converter`)."""
    P = _hf_vit_parts(model)
    layers, o, E, fk = P["layers"], P["opts"], P["E"], P["fk"]
    H, d = o["H"], o["d"]
    where = P["where"]
    names = [("WQ", "q", "weight"), ("WK", "k", "weight"), ("WV", "v", "weight"), ("WO", "o", "weight"),
             ("bO", "o", "bias"), ("W1", "fc1", "weight"), ("b1", "fc1", "bias"), ("W2", "fc2", "weight"),
             ("b2", "fc2", "bias"), ("g1", "ln1", "weight"), ("be1", "ln1", "bias"), ("g2", "ln2", "weight"),
             ("be2", "ln2", "bias")]
    if o["qkv_bias"]:
        names += [("bQ", "q", "bias"), ("bK", "k", "bias"), ("bV", "v", "bias")]
    rg = {ours: _stacked_rg(layers, key, attr, where) for ours, key, attr in names}

    # HF ViT has three dropouts per layer (attention weights, after attention, after the MLP)
    # and none inside the MLP: activation_dropout = 0
    encoder = TorchEncoder(
        E, H, o["F"], dropout=o["p_hidden"], attention_dropout=o["p_attn"], activation_dropout=0.0,
        activation=o["act"], layer_norm_eps=P["eps"], batch_first=True, norm_first=True, bias=True,
        num_layers=len(layers), final_norm=True, head_dim=d, qkv_bias=o["qkv_bias"], **fk,
    )
    a, ffn, n1, n2 = encoder.attention, encoder.ffn, encoder.norm(1), encoder.norm(2)
    ours = {"WQ": a.WQ, "WK": a.WK, "WV": a.WV, "WO": a.WO, "bO": a.bO, "bQ": a.bQ, "bK": a.bK, "bV": a.bV,
            "W1": ffn.W1, "b1": ffn.b1, "W2": ffn.W2, "b2": ffn.b2,
            "g1": n1.weight, "be1": n1.bias, "g2": n2.weight, "be2": n2.bias}
    for n, m in enumerate(layers):
        a.WQ.raw[n].copy_(m["q"].weight.t().reshape(E, H, d))
        a.WK.raw[n].copy_(m["k"].weight.t().reshape(E, H, d))
        a.WV.raw[n].copy_(m["v"].weight.t().reshape(E, H, d))
        if o["qkv_bias"]:
            a.bQ.raw[n].copy_(m["q"].bias.reshape(H, d))
            a.bK.raw[n].copy_(m["k"].bias.reshape(H, d))
            a.bV.raw[n].copy_(m["v"].bias.reshape(H, d))
        a.WO.raw[n].copy_(m["o"].weight.t().reshape(H, d, E))
        a.bO.raw[n].copy_(m["o"].bias)
        ffn.W1.raw[n].copy_(m["fc1"].weight.t())
        ffn.b1.raw[n].copy_(m["fc1"].bias)
        ffn.W2.raw[n].copy_(m["fc2"].weight.t())
        ffn.b2.raw[n].copy_(m["fc2"].bias)
        for norm, ln in ((n1, m["ln1"]), (n2, m["ln2"])):
            norm.weight.raw[n].copy_(ln.weight)
            norm.bias.raw[n].copy_(ln.bias)
    for key, flag in rg.items():
        ours[key].raw.requires_grad_(flag)
    ln = P["vit"].layernorm
    fa = encoder.final_affine
    for c, src in ((fa.weight, ln.weight), (fa.bias, ln.bias)):
        c.value.copy_(src)
        c.value.requires_grad_(src.requires_grad)

    emb_hf, conv = P["emb"], P["conv"]
    emb = PatchEmbedding(P["image"], P["patch"], conv.in_channels, E, bias=conv.bias is not None,
                         dropout=P["p_emb"], **fk)
    pairs = [(emb.weight, conv.weight, conv.weight.reshape(E, -1).t()),
             (emb.cls_token, emb_hf.cls_token, emb_hf.cls_token.reshape(E)),
             (emb.position, emb_hf.position_embeddings, emb_hf.position_embeddings.reshape(-1, E))]
    if conv.bias is not None:
        pairs.append((emb.bias, conv.bias, conv.bias))

    pooler = None
    if P["pooler"] is not None:
        dense = P["pooler"].dense
        pooler = ClassTokenReadout(E, dense.out_features, bias=dense.bias is not None, activation=P["pool_act"], **fk)
        pairs.append((pooler.weight, dense.weight, dense.weight.t()))
        if dense.bias is not None:
            pairs.append((pooler.bias, dense.bias, dense.bias))
    classifier = None
    head = P["head"]
    if isinstance(head, nn.Linear):
        classifier = ClassTokenReadout(E, head.out_features, bias=head.bias is not None, **fk)
        pairs.append((classifier.weight, head.weight, head.weight.t()))
        if head.bias is not None:
            pairs.append((classifier.bias, head.bias, head.bias))
    elif isinstance(head, nn.Identity):  # num_labels = 0: the logits are the class token
        classifier = ClassTokenReadout(E, E, bias=False, **fk)
        classifier.weight.copy_(torch.eye(E, **fk))
        classifier.weight.requires_grad_(False)  # not a weight of the HF model
    for dst, src, value in pairs:
        dst.copy_(value)
        dst.requires_grad_(src.requires_grad)
    out = ViT(emb, encoder, pooler=pooler, classifier=classifier)
    out.train(model.training)
    return out


register_hf_converter("ViTModel", _vit_from_hf)
register_hf_converter("ViTForImageClassification", _vit_from_hf)
