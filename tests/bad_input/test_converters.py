"""Bad input to the converters: from_torch, to_torch, torch_state_dict,
load_torch_state_dict, from_hf, the ViT pieces (ViT, PatchEmbedding,
ClassTokenReadout) and CvT (its pixels, CvtStageSpec)."""

import pytest
import torch
import transformers
from _helpers import sigma_state
from torch import nn

from opsplit.controls import PiecewiseConstant
from opsplit.models import (
    ClassTokenReadout,
    CvtStageSpec,
    PaperTransformer,
    PatchEmbedding,
    TorchEncoder,
    ViT,
    cvt_from_hf,
    from_hf,
    from_torch,
    load_torch_state_dict,
    to_torch,
    torch_state_dict,
)
from opsplit.models.cvt_hf import cvt_to_hf

from ._table import NAN, cases, run_case

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

CVT_CFG = dict(depth=[1], num_heads=[2], embed_dim=[8], patch_sizes=[3], patch_stride=[2], patch_padding=[1],
               kernel_qkv=[3], padding_q=[1], padding_kv=[1], stride_kv=[2], stride_q=[1], qkv_bias=[True],
               mlp_ratio=[2.0], cls_token=[True], qkv_projection_method=["dw_bn"], drop_rate=[0.0],
               attention_drop_rate=[0.0], drop_path_rate=[0.0])


def cvt(**changes):
    return from_hf(transformers.CvtModel(transformers.CvtConfig(**{**CVT_CFG, **changes})).eval())


def cvt_px(shape=(1, 3, 8, 8), fill=None, **kw):
    x = torch.randn(*shape, **kw)
    if fill is not None:
        x.view(-1)[0] = fill
    return x


def nan_cvt():
    m = cvt()
    with torch.no_grad():
        m.stage_operators(0)["embed"].weight.value[0, 0, 0, 0] = NAN
    return m


def time_sigma_cvt():
    m = cvt()
    norm = m.stage_operators(0)["norm2"]
    norm.projection.sigma1 = PiecewiseConstant(torch.zeros(1), t0=0.0, t1=1.0)
    return m


def spec(**kw):
    args = dict(in_channels=3, embed_dim=8, depth=1, num_heads=2)
    args.update(kw)
    return CvtStageSpec(**args)


CVT = cases(
    ("cvt-list", lambda: cvt()([[0.0]]), TypeError, r"pixel_values: expected a torch.Tensor"),
    ("cvt-int", lambda: cvt()(torch.zeros(1, 3, 8, 8, dtype=torch.uint8)), TypeError, r"pixel_values: expected a floating-point"),
    ("cvt-f64", lambda: cvt()(cvt_px(dtype=torch.float64)), TypeError, r"pixel_values: dtype torch.float64 differs from the CvT's torch.float32"),
    ("cvt-f16", lambda: cvt()(cvt_px(dtype=torch.float16)), TypeError, r"pixel_values: dtype torch.float16 differs"),
    ("cvt-meta", lambda: cvt()(torch.empty(1, 3, 8, 8, device="meta")), ValueError, r"pixel_values: device meta differs"),
    ("cvt-nan", lambda: cvt()(cvt_px(fill=NAN)), ValueError, r"pixel_values: expected finite values, found 1 NaN/inf"),
    ("cvt-inf", lambda: cvt()(cvt_px(fill=float("inf"))), ValueError, r"pixel_values: expected finite values, found 1 NaN/inf"),
    ("cvt--inf", lambda: cvt()(cvt_px(fill=-float("inf"))), ValueError, r"pixel_values: expected finite values"),
    ("cvt-channels", lambda: cvt()(cvt_px((1, 1, 8, 8))), ValueError, r"pixel_values: channel mismatch: expected 3 channels, got 1"),
    ("cvt-rank3", lambda: cvt()(cvt_px((3, 8, 8))), ValueError, r"pixel_values: expected shape \(B, C, H, W\)"),
    ("cvt-rank5", lambda: cvt()(cvt_px((1, 1, 3, 8, 8))), ValueError, r"pixel_values: expected shape \(B, C, H, W\)"),
    ("cvt-empty-image", lambda: cvt()(cvt_px((1, 3, 8, 0))), ValueError, r"pixel_values: empty images \(H, W\) = \(8, 0\)"),
    ("cvt-stencil-too-big", lambda: cvt(patch_padding=[0])(cvt_px((1, 3, 2, 8))), ValueError, r"pixel_values: images of 2x8 pixels do not fit stage 1's entry.*kernel \(3\) is larger than the padded image \(height N_1 = 2"),
    ("cvt-kv-too-big", lambda: cvt(padding_kv=[0])(cvt_px((1, 3, 2, 2))), ValueError, r"pixel_values: images of 2x2 pixels do not fit stage 1 \(on the 1x1 token grid\): ConvAttention.k_proj"),
    ("cvt-query-grid", lambda: cvt(stride_q=[2])(cvt_px()), ValueError, r"pixel_values: images of 8x8 pixels do not fit stage 1.*the query projection must keep the token grid, got 4x4 -> 2x2"),
    ("cvt-train-batchnorm-1x1", lambda: cvt().train()(cvt_px((1, 3, 2, 2))), ValueError, r"pixel_values: stage 1's [QKV] projection has a 1x1 token grid for 2x2 images"),
    ("cvt-nan-parameter", lambda: nan_cvt()(cvt_px()), ValueError, r"CvT: parameters must be finite, but propagator\.scheme\.stages\.0\.entry.*weight.*hold\(s\) NaN/inf"),
    ("cvt-query-keeps-no-grid", lambda: cvt(padding_q=[0]), ValueError, r"CvtStageSpec: the query projection keeps no token grid"),
    ("cvt-spec-mlp_hidden<0", lambda: spec(mlp_hidden=-1), ValueError, r"CvtStageSpec.mlp_hidden: expected an integer >= 0"),
    ("cvt-spec-mlp_hidden-float", lambda: spec(mlp_hidden=2.5), ValueError, r"CvtStageSpec.mlp_hidden: expected an integer >= 0"),
    ("cvt-spec-even-query", lambda: spec(kernel_qkv=2, padding_q=0), ValueError, r"CvtStageSpec: the query projection keeps no token grid"),
    ("cvt-spec-heads", lambda: spec(num_heads=3), ValueError, r"CvtStageSpec: embed_dim = 8 is not divisible by num_heads = 3"),
    ("cvt-spec-padding<0", lambda: spec(padding_kv=-1), ValueError, r"CvtStageSpec.padding_kv: expected an integer >= 0"),
    ("cvt-spec-stride=0", lambda: spec(stride_kv=0), ValueError, r"CvtStageSpec.stride_kv: expected a positive integer"),
    # the way back (opsplit.models.cvt_hf): what HF's CvT cannot hold
    ("cvt-to_hf-time-sigma", lambda: time_sigma_cvt().to_hf(), ValueError,
     r"^CvT\.to_hf: propagator\.scheme\.stages\.0\.body\.substeps\.1\.terms\.0\.norm\.projection\.sigma1 is a "
     r"PiecewiseConstant; Hugging Face's LayerNorm holds a constant sigma only"),
    ("cvt_to_hf-linear", lambda: cvt_to_hf(nn.Linear(2, 2)), TypeError, r"^cvt_to_hf: model: expected a CvT, got Linear"),
    ("cvt_from_hf-linear", lambda: cvt_from_hf(nn.Linear(2, 2)), TypeError,
     r"^from_hf: cvt_from_hf: model: expected transformers' CvtModel or CvtForImageClassification, got Linear"),
)


@pytest.mark.parametrize("case", CONVERT)
def test_converters(case):
    run_case(case)


@pytest.mark.parametrize("case", VIT)
def test_vit(case):
    run_case(case)


@pytest.mark.parametrize("case", CVT)
def test_cvt(case):
    run_case(case)


# -- to_torch: what torch's layers cannot hold is refused ------------------------------------------
def with_sigmas(model, s1=0.0, s2=1.0):
    model.load_state_dict(sigma_state(model, s1, s2))
    return model


def heun(model):
    from opsplit.solvers import Heun

    model.scheme.substeps[0].solver = Heun()
    return model


def scaled(model, scale):
    model.attention.scale = scale
    return model


def time_sigma(model):
    from opsplit.controls import PiecewiseConstant

    model.norm(1).projection.sigma2 = PiecewiseConstant(torch.ones(2, dtype=torch.float64), t0=0.0, t1=1.0)
    return model


def no_affine(**kw):
    m = layer(dropout=0.0)
    m.norm1 = nn.LayerNorm(12, **kw)
    m.norm2 = nn.LayerNorm(12, **kw)
    return from_torch(m)


EXPORT = cases(
    ("to_torch-heun", lambda: to_torch(heun(from_torch(layer()))), ValueError,
     r"to_torch: model\.scheme\.substeps\[0\] is solved by Heun; torch's layer is an explicit-Euler step"),
    ("to_torch-scale", lambda: to_torch(scaled(from_torch(layer()), 0.25)), ValueError,
     r"to_torch: model\.attention\.scale = 0\.25; torch's nn\.MultiheadAttention scales the scores by "
     r"1/sqrt\(head_dim\) = 0\.5"),
    ("to_torch-scale-none", lambda: to_torch(scaled(from_torch(layer()), None)), ValueError,
     r"to_torch: model\.attention\.scale = None"),
    ("to_torch-sigma-no-affine", lambda: to_torch(with_sigmas(no_affine(elementwise_affine=False), s2=2.0)),
     ValueError, r"torch_state_dict: norm1: sigma1 = 0, sigma2 = 2; torch's LayerNorm without elementwise_affine "
                 r"cannot hold them"),
    ("to_torch-sigma1-no-bias", lambda: to_torch(with_sigmas(no_affine(bias=False), s1=0.5)), ValueError,
     r"torch_state_dict: norm1: sigma1 = 0\.5, sigma2 = 1; torch's LayerNorm without bias cannot hold them"),
    ("state_dict-time-sigma", lambda: torch_state_dict(time_sigma(from_torch(layer()))), ValueError,
     r"torch_state_dict: norm1\.sigma2: expected a constant scalar, got PiecewiseConstant"),
    ("load-time-sigma", lambda: load_torch_state_dict(time_sigma(from_torch(layer())), torch_state_dict(
        from_torch(layer()))), ValueError, r"load_torch_state_dict: norm1\.sigma2: expected a constant scalar"),
)


@pytest.mark.parametrize("case", EXPORT)
def test_export(case):
    run_case(case)
