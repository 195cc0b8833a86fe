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

:func:`from_hf` converts a Hugging Face ``transformers`` ``ViTModel`` (last hidden state and
pooled output) or ``ViTForImageClassification`` (logits) built from a ``ViTConfig``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from ..operators.activation import activation_fn
from .torch_exact import TorchEncoder

__all__ = ["PatchEmbedding", "ClassTokenReadout", "ViT", "ViTOutput", "from_hf"]


def _pair(v) -> tuple[int, int]:
    if isinstance(v, (tuple, list)):
        if len(v) != 2:
            raise ValueError(f"expected an int or a pair, got {v!r}")
        return int(v[0]), int(v[1])
    return int(v), int(v)


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
        self.image_size, self.patch_size = _pair(image_size), _pair(patch_size)
        (H, W), (ph, pw) = self.image_size, self.patch_size
        if H % ph or W % pw:
            raise ValueError(f"PatchEmbedding: patch size {self.patch_size} does not divide image size {self.image_size}")
        self.num_channels, self.n_y = int(num_channels), int(n_y)
        self.grid_size = (H // ph, W // pw)
        self.num_patches = self.grid_size[0] * self.grid_size[1]
        D = self.num_channels * ph * pw
        self.weight = nn.Parameter(torch.empty(D, self.n_y, **fk))  # E (rows: patch entries)
        self.bias = nn.Parameter(torch.empty(self.n_y, **fk)) if bias else None
        self.cls_token = nn.Parameter(torch.empty(self.n_y, **fk))  # v_0
        self.position = nn.Parameter(torch.empty(self.num_patches + 1, self.n_y, **fk))
        self.dropout = float(dropout)
        self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self) -> None:
        bound = 1.0 / math.sqrt(self.weight.shape[0])
        nn.init.uniform_(self.weight, -bound, bound)
        if self.bias is not None:
            nn.init.uniform_(self.bias, -bound, bound)
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

    def forward(self, pixel_values: Tensor) -> Tensor:
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
        self.weight = nn.Parameter(torch.empty(n_y, d, **fk))
        self.bias = nn.Parameter(torch.empty(d, **fk)) if bias else None
        activation_fn(activation)
        self.activation = activation
        self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self) -> None:
        bound = 1.0 / math.sqrt(self.weight.shape[0])
        nn.init.uniform_(self.weight, -bound, bound)
        if self.bias is not None:
            nn.init.uniform_(self.bias, -bound, bound)

    def forward(self, u: Tensor) -> Tensor:
        z = torch.nn.functional.linear(u[:, 0], self.weight.t(), self.bias)
        return activation_fn(self.activation)(z)

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
        self.embedding, self.encoder, self.pooler, self.classifier = embedding, encoder, pooler, classifier

    def forward(self, pixel_values: Tensor) -> ViTOutput:
        u = self.encoder(self.embedding(pixel_values))
        return ViTOutput(
            last_hidden_state=u,
            pooler_output=None if self.pooler is None else self.pooler(u),
            logits=None if self.classifier is None else self.classifier(u),
        )


# -- Hugging Face ----------------------------------------------------------------------------
_HF_ACTIVATIONS = {
    "gelu": "gelu",
    "relu": "relu",
    "gelu_new": "gelu_tanh",
    "gelu_pytorch_tanh": "gelu_tanh",
    "gelu_fast": "gelu_tanh",
    "silu": "silu",
    "swish": "silu",
    "quick_gelu": "quick_gelu",
    "tanh": "tanh",
    "linear": "identity",
}


def _hf_activation(name, what: str) -> str:
    if not isinstance(name, str) or name not in _HF_ACTIVATIONS:
        raise ValueError(f"from_hf: unsupported {what} {name!r}; supported: {sorted(_HF_ACTIVATIONS)}")
    return _HF_ACTIVATIONS[name]


def _hf_layers(vit):
    """Per layer: (q, k, v, o, ln_before, ln_after, fc1, fc2) for transformers 5.x and 4.x."""
    if hasattr(vit, "layers"):  # transformers >= 5
        return [
            (l.attention.q_proj, l.attention.k_proj, l.attention.v_proj, l.attention.o_proj,
             l.layernorm_before, l.layernorm_after, l.mlp.fc1, l.mlp.fc2)
            for l in vit.layers
        ]
    if hasattr(vit, "encoder") and hasattr(vit.encoder, "layer"):  # transformers 4.x
        return [
            (l.attention.attention.query, l.attention.attention.key, l.attention.attention.value,
             l.attention.output.dense, l.layernorm_before, l.layernorm_after, l.intermediate.dense, l.output.dense)
            for l in vit.encoder.layer
        ]
    raise TypeError("from_hf: unrecognised ViT module layout (expected transformers' ViTModel)")


@torch.no_grad()
def from_hf(model) -> ViT:
    """The opsplit :class:`ViT` of a Hugging Face ``ViTModel`` or ``ViTForImageClassification``
    (same weights; eval/train mode kept).

    ``ViTModel`` -> ``last_hidden_state`` and ``pooler_output`` (when it has a pooler);
    ``ViTForImageClassification`` -> ``last_hidden_state`` and ``logits``.  Not converted
    (clear errors): masked-image-modelling mask tokens, interpolated position encodings,
    activations outside ``gelu``/``relu``/``gelu_new``/``silu``/``quick_gelu``.
    """
    cls = type(model).__name__
    classifier = None
    if hasattr(model, "vit") and hasattr(model, "classifier"):
        vit, head = model.vit, model.classifier
    elif cls.startswith("ViTModel") or hasattr(model, "embeddings"):
        vit, head = model, None
    else:
        raise TypeError(f"from_hf: expected a transformers ViTModel or ViTForImageClassification, got {cls}")
    cfg = vit.config
    layers = _hf_layers(vit)
    E, H = cfg.hidden_size, cfg.num_attention_heads
    d = getattr(cfg, "head_dim", None) or E // H
    act = _hf_activation(cfg.hidden_act, "hidden_act")
    p0 = vit.embeddings.patch_embeddings.projection.weight
    fk = {"device": p0.device, "dtype": p0.dtype}
    eps = {float(l[4].eps) for l in layers} | {float(l[5].eps) for l in layers} | {float(vit.layernorm.eps)}
    if len(eps) != 1:
        raise ValueError(f"from_hf: LayerNorms with different eps {sorted(eps)}")
    if any(l[6].bias is None or l[7].bias is None or l[3].bias is None for l in layers):
        raise ValueError("from_hf: MLP and output projections without bias are not supported")
    qkv_bias = layers[0][0].bias is not None
    encoder = TorchEncoder(
        E, H, cfg.intermediate_size, dropout=float(cfg.hidden_dropout_prob), activation=act,
        layer_norm_eps=eps.pop(), batch_first=True, norm_first=True, bias=True, num_layers=len(layers),
        final_norm=True, head_dim=d, qkv_bias=qkv_bias, **fk,
    )
    encoder.attention.dropout = float(cfg.attention_probs_dropout_prob)
    a, ffn = encoder.attention, encoder.ffn
    for n, (q, k, v, o, ln1, ln2, fc1, fc2) in enumerate(layers):
        a.WQ.raw[n].copy_(q.weight.t().reshape(E, H, d))
        a.WK.raw[n].copy_(k.weight.t().reshape(E, H, d))
        a.WV.raw[n].copy_(v.weight.t().reshape(E, H, d))
        if qkv_bias:
            a.bQ.raw[n].copy_(q.bias.reshape(H, d))
            a.bK.raw[n].copy_(k.bias.reshape(H, d))
            a.bV.raw[n].copy_(v.bias.reshape(H, d))
        a.WO.raw[n].copy_(o.weight.t().reshape(H, d, E))
        a.bO.raw[n].copy_(o.bias)
        ffn.W1.raw[n].copy_(fc1.weight.t())
        ffn.b1.raw[n].copy_(fc1.bias)
        ffn.W2.raw[n].copy_(fc2.weight.t())
        ffn.b2.raw[n].copy_(fc2.bias)
        for norm, ln in ((encoder.norm(1), ln1), (encoder.norm(2), ln2)):
            norm.weight.raw[n].copy_(ln.weight)
            norm.bias.raw[n].copy_(ln.bias)
    encoder.final_affine.weight.value.copy_(vit.layernorm.weight)
    encoder.final_affine.bias.value.copy_(vit.layernorm.bias)

    pe = vit.embeddings.patch_embeddings
    conv = pe.projection
    emb = PatchEmbedding(pe.image_size, pe.patch_size, pe.num_channels, E, bias=conv.bias is not None,
                         dropout=float(cfg.hidden_dropout_prob), **fk)
    if tuple(conv.stride) != tuple(conv.kernel_size) or tuple(conv.kernel_size) != emb.patch_size:
        raise ValueError("from_hf: the patch projection is not a non-overlapping patch convolution")
    emb.weight.copy_(conv.weight.reshape(E, -1).t())
    if conv.bias is not None:
        emb.bias.copy_(conv.bias)
    emb.cls_token.copy_(vit.embeddings.cls_token.reshape(E))
    emb.position.copy_(vit.embeddings.position_embeddings.reshape(-1, E))

    pooler = None
    if getattr(vit, "pooler", None) is not None:
        dense = vit.pooler.dense
        pooler = ClassTokenReadout(E, dense.out_features, bias=dense.bias is not None,
                                   activation=_hf_activation(getattr(cfg, "pooler_act", "tanh"), "pooler_act"), **fk)
        pooler.weight.copy_(dense.weight.t())
        if dense.bias is not None:
            pooler.bias.copy_(dense.bias)
    if head is not None and isinstance(head, nn.Linear):
        classifier = ClassTokenReadout(E, head.out_features, bias=head.bias is not None, **fk)
        classifier.weight.copy_(head.weight.t())
        if head.bias is not None:
            classifier.bias.copy_(head.bias)
    elif isinstance(head, nn.Identity):  # num_labels = 0: the logits are the class token
        classifier = ClassTokenReadout(E, E, bias=False, **fk)
        classifier.weight.copy_(torch.eye(E, **fk))
    elif head is not None:
        raise TypeError(f"from_hf: unsupported classifier {type(head).__name__}")
    out = ViT(emb, encoder, pooler=pooler, classifier=classifier)
    out.train(model.training)
    return out
