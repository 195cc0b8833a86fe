"""Bad input to the converters: from_torch, to_torch, torch_state_dict,
load_torch_state_dict, from_hf, and the ViT pieces (ViT, PatchEmbedding,
ClassTokenReadout)."""

import pytest
import torch
import transformers
from torch import nn

from opsplit.models import (
    ClassTokenReadout,
    PaperTransformer,
    PatchEmbedding,
    TorchEncoder,
    ViT,
    from_hf,
    from_torch,
    load_torch_state_dict,
    to_torch,
    torch_state_dict,
)

from ._table import cases, run_case

NAN = float("nan")
VCFG = dict(hidden_size=12, num_hidden_layers=1, num_attention_heads=3, intermediate_size=16, image_size=8,
            patch_size=4, num_channels=1)


def layer(**kw):
    kw.setdefault("batch_first", True)
    return nn.TransformerEncoderLayer(12, 3, 20, **kw)


def hooked():
    m = layer()
    m.register_forward_pre_hook(lambda *a: None)
    return m


def with_bias_kv():
    m = layer()
    m.self_attn = nn.MultiheadAttention(12, 3, add_bias_kv=True, batch_first=True)
    return m


def enc(**kw):
    return TorchEncoder(12, 3, 20, batch_first=True, dropout=0.0, **kw)


def state(**changes):
    m = enc()
    s = torch_state_dict(m)
    for k, v in changes.items():
        s[k.replace("__", ".")] = v(s[k.replace("__", ".")]) if callable(v) else v
    return m, s


def load(**changes):
    m, s = state(**changes)
    load_torch_state_dict(m, s)


def missing_key():
    m, s = state()
    del s["linear1.weight"]
    load_torch_state_dict(m, s)


def vit():
    return from_hf(transformers.ViTModel(transformers.ViTConfig(**VCFG)).eval())


def emb(**kw):
    args = dict(image_size=8, patch_size=4, num_channels=1, n_y=12)
    args.update(kw)
    return PatchEmbedding(**args)


CONVERT = cases(
    ("from_torch-str", lambda: from_torch("layer"), TypeError, r"from_torch: expected a torch.nn.Module"),
    ("from_torch-linear", lambda: from_torch(nn.Linear(3, 3)), TypeError, r"unsupported module Linear"),
    ("from_torch-hooks", lambda: from_torch(hooked()), ValueError, r"from_torch: the module has forward hooks"),
    ("from_torch-tanh", lambda: from_torch(layer(activation=torch.tanh)), ValueError, r"unsupported activation"),
    ("from_torch-bias_kv", lambda: from_torch(with_bias_kv()), ValueError, r"add_bias_kv=True is not supported"),
    ("to_torch-linear", lambda: to_torch(nn.Linear(2, 2)), TypeError, r"expected an opsplit TorchEncoder or TorchDecoder"),
    ("to_torch-paper", lambda: to_torch(PaperTransformer(4, n_x=3)), TypeError, r"expected an opsplit TorchEncoder or TorchDecoder, got PaperTransformer"),
    ("to_torch-kind", lambda: to_torch(enc(), kind="block"), ValueError, r"kind: expected 'layer' or 'stack'"),
    ("to_torch-kind-layer-2", lambda: to_torch(enc(num_layers=2), kind="layer"), ValueError, r"cannot hold 2 layers"),
    ("state_dict-linear", lambda: torch_state_dict(nn.Linear(2, 2)), TypeError, r"expected an opsplit TorchEncoder"),
    ("state_dict-kind", lambda: torch_state_dict(enc(), kind="all"), ValueError, r"kind: expected 'layer' or 'stack'"),
    ("load-missing", missing_key, KeyError, r"load_torch_state_dict: missing torch weights \['linear1.weight'\]"),
    ("load-shape", lambda: load(linear1__weight=lambda w: w[:, :5]), ValueError, r"load_torch_state_dict: state\['linear1.weight'\]: expected shape \(20, 12\)"),
    ("load-not-tensor", lambda: load(norm1__bias=[0.0] * 12), TypeError, r"load_torch_state_dict: state\['norm1.bias'\]: expected a torch.Tensor"),
    ("load-int", lambda: load(norm1__weight=lambda w: w.long()), TypeError, r"load_torch_state_dict: state\['norm1.weight'\]: expected a floating"),
    ("load-nan", lambda: load(linear2__bias=lambda b: b.fill_(NAN)), ValueError, r"load_torch_state_dict: state\['linear2.bias'\]: expected finite values"),
    ("load-state-list", lambda: load_torch_state_dict(enc(), []), TypeError, r"load_torch_state_dict: state: expected a dict"),
    ("from_hf-linear", lambda: from_hf(nn.Linear(2, 2)), TypeError, r"unsupported model class Linear"),
    ("from_hf-mish", lambda: from_hf(transformers.ViTModel(transformers.ViTConfig(**VCFG, hidden_act="mish"))), ValueError, r"unsupported hidden_act='mish'"),
    ("from_hf-mask-token", lambda: from_hf(transformers.ViTModel(transformers.ViTConfig(**VCFG), use_mask_token=True)), ValueError, r"mask"),
)

VIT = cases(
    ("vit-size", lambda: vit()(torch.randn(1, 1, 10, 10)), ValueError, r"pixel_values: expected images of size \(8, 8\)"),
    ("vit-channels", lambda: vit()(torch.randn(1, 3, 8, 8)), ValueError, r"pixel_values: expected 1 channels"),
    ("vit-rank3", lambda: vit()(torch.randn(1, 8, 8)), ValueError, r"pixel_values: expected shape \(B, C, H, W\)"),
    ("vit-int", lambda: vit()(torch.zeros(1, 1, 8, 8, dtype=torch.uint8)), TypeError, r"pixel_values: expected a floating"),
    ("vit-list", lambda: vit()([[0.0]]), TypeError, r"pixel_values: expected a torch.Tensor"),
    ("vit-nan", lambda: vit()(torch.full((1, 1, 8, 8), NAN)), ValueError, r"pixel_values: expected finite"),
    ("vit-meta", lambda: vit()(torch.empty(1, 1, 8, 8, device="meta")), TypeError, r"pixel_values.*device"),
    ("vit-empty-batch-ok-but-empty-image", lambda: vit()(torch.randn(1, 1, 0, 0)), ValueError, r"pixel_values: expected images of size"),
    ("vit-masked", lambda: vit()(torch.randn(1, 1, 8, 8), bool_masked_pos=torch.zeros(1, 4, dtype=torch.bool)), ValueError, r"bool_masked_pos"),
    ("vit-interpolate", lambda: vit()(torch.randn(1, 1, 8, 8), interpolate_pos_encoding=True), ValueError, r"interpolate_pos_encoding"),
    ("vit-embedding-type", lambda: ViT(nn.Linear(2, 2), enc()), TypeError, r"ViT\.embedding: expected a PatchEmbedding"),
    ("vit-encoder-layout", lambda: ViT(emb(), TorchEncoder(12, 3, 20)), TypeError, r"ViT\.encoder: expected a TorchEncoder with batch_first=True"),
    ("vit-size-mismatch", lambda: ViT(emb(n_y=6), enc()), ValueError, r"ViT: embedding size 6 != encoder d_model 12"),
    ("vit-pooler", lambda: ViT(emb(), enc(), pooler=ClassTokenReadout(6, 3)), ValueError, r"ViT\.pooler: reads 6 features"),
    ("emb-image_size=0", lambda: emb(image_size=0), ValueError, r"image_size: expected a positive integer"),
    ("emb-image_size-triple", lambda: emb(image_size=(8, 8, 8)), ValueError, r"image_size: expected an int or a pair"),
    ("emb-patch-divides", lambda: emb(patch_size=3), ValueError, r"patch_size: \(3, 3\) does not divide image_size"),
    ("emb-channels=0", lambda: emb(num_channels=0), ValueError, r"num_channels: expected a positive integer"),
    ("emb-n_y<0", lambda: emb(n_y=-1), ValueError, r"n_y: expected a positive integer"),
    ("emb-dropout=1", lambda: emb(dropout=1.0), ValueError, r"PatchEmbedding\.dropout"),
    ("emb-dropout=str", lambda: emb(dropout="x"), TypeError, r"PatchEmbedding\.dropout"),
    ("readout-d=0", lambda: ClassTokenReadout(12, 0), ValueError, r"d: expected a positive integer"),
    ("readout-activation", lambda: ClassTokenReadout(12, 3, activation="mish"), ValueError, r"activation: expected one of"),
    ("readout-u-rank", lambda: ClassTokenReadout(12, 3)(torch.randn(12)), ValueError, r"ClassTokenReadout: u: expected shape \(B, N, 12\)"),
    ("readout-u-features", lambda: ClassTokenReadout(12, 3)(torch.randn(2, 5, 10)), ValueError, r"ClassTokenReadout: u: expected shape \(B, N, 12\)"),
    ("readout-u-empty", lambda: ClassTokenReadout(12, 3)(torch.randn(2, 0, 12)), ValueError, r"ClassTokenReadout: u: expected shape \(B, N, 12\) with N >= 1"),
    ("readout-u-f64", lambda: ClassTokenReadout(12, 3)(torch.randn(2, 5, 12, dtype=torch.float64)), TypeError, r"ClassTokenReadout: u: dtype torch.float64 differs"),
)


@pytest.mark.parametrize("case", CONVERT)
def test_converters(case):
    run_case(case)


@pytest.mark.parametrize("case", VIT)
def test_vit(case):
    run_case(case)
