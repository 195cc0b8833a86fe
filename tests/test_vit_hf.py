"""ViT = G o N o F (paper 002 §4.2) against Hugging Face transformers' ViTModel and
ViTForImageClassification built from random ViTConfigs (no download).  Skipped when
transformers is not installed (it is a test-only dependency)."""

from __future__ import annotations

import pytest
import torch
from _helpers import assert_seeded_pass_close, same_draws

transformers = pytest.importorskip("transformers")

from opsplit.models import ViT, from_hf  # noqa: E402
from opsplit.models.vit import PatchEmbedding  # noqa: E402

CONFIGS = [
    # hidden not a power of two, heads 3, intermediate != hidden, non-square image, default eps
    dict(hidden_size=30, num_hidden_layers=2, num_attention_heads=3, intermediate_size=41,
         image_size=(12, 8), patch_size=4, num_channels=3),
    # one head, GELU (tanh), custom eps, no qkv bias, rectangular patches
    dict(hidden_size=18, num_hidden_layers=3, num_attention_heads=1, intermediate_size=25,
         image_size=(12, 12), patch_size=(4, 6), num_channels=2, layer_norm_eps=1e-6,
         hidden_act="gelu_new", qkv_bias=False),
    # four heads, ReLU
    dict(hidden_size=20, num_hidden_layers=1, num_attention_heads=4, intermediate_size=36,
         image_size=8, patch_size=2, num_channels=1, hidden_act="relu", pooler_output_size=7),
]
TOL = {torch.float32: 1e-5, torch.float64: 1e-10}


def _random(model, seed):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.1 * torch.randn(p.shape, generator=g).to(p.dtype))
    return model


@pytest.mark.parametrize("k", range(len(CONFIGS)))
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_vit_model(k, dtype):
    cfg = transformers.ViTConfig(**CONFIGS[k])
    torch.manual_seed(k)
    hf = _random(transformers.ViTModel(cfg).to(dtype).eval(), k)
    model = from_hf(hf)
    assert isinstance(model, ViT)
    H, W = cfg.image_size if isinstance(cfg.image_size, (tuple, list)) else (cfg.image_size,) * 2
    x = torch.randn(2, cfg.num_channels, H, W, dtype=dtype)
    x1, x2 = x.clone().requires_grad_(), x.clone().requires_grad_()
    ref = hf(x1)
    out = model(x2)
    tol = TOL[dtype]
    torch.testing.assert_close(out.last_hidden_state, ref.last_hidden_state, rtol=0, atol=tol)
    torch.testing.assert_close(out.pooler_output, ref.pooler_output, rtol=0, atol=tol)
    w = torch.randn_like(ref.last_hidden_state) * 0.1
    ((ref.last_hidden_state * w).sum() + ref.pooler_output.sum()).backward()
    ((out.last_hidden_state * w).sum() + out.pooler_output.sum()).backward()
    torch.testing.assert_close(x2.grad, x1.grad, rtol=0, atol=tol)


@pytest.mark.parametrize("num_labels", [5, 0])
def test_vit_for_image_classification(num_labels):
    cfg = transformers.ViTConfig(**CONFIGS[0], num_labels=num_labels)
    torch.manual_seed(3)
    hf = _random(transformers.ViTForImageClassification(cfg).double().eval(), 3)
    model = from_hf(hf)
    x = torch.randn(3, 3, 12, 8, dtype=torch.float64)
    ref = hf(x)
    out = model(x)
    assert out.pooler_output is None
    torch.testing.assert_close(out.logits, ref.logits, rtol=0, atol=1e-10)


def test_patch_embedding_is_R_E():
    """F(R) = [v0; R E + b] + P, with R the flattened patches (paper 002 §4.2)."""
    emb = PatchEmbedding((4, 6), (2, 3), 2, 5, dtype=torch.float64)
    x = torch.randn(1, 2, 4, 6, dtype=torch.float64)
    R = emb.patches(x)
    assert R.shape == (1, 4, 12)
    torch.testing.assert_close(R[0, 1], x[0, :, 0:2, 3:6].reshape(-1))  # patch (row 0, col 1)
    u = emb(x)
    torch.testing.assert_close(u[0, 0], emb.cls_token + emb.position[0])
    torch.testing.assert_close(u[0, 1:], R[0] @ emb.weight + emb.bias + emb.position[1:])


def test_errors():
    cfg = transformers.ViTConfig(**CONFIGS[2])
    model = from_hf(transformers.ViTModel(cfg).eval())
    with pytest.raises(ValueError, match=r"expected images of size \(8, 8\)"):
        model(torch.randn(1, 1, 10, 10))
    with pytest.raises(ValueError, match="expected 1 channels"):
        model(torch.randn(1, 3, 8, 8))
    bad = transformers.ViTModel(transformers.ViTConfig(**{**CONFIGS[2], "hidden_act": "mish"}))
    with pytest.raises(ValueError, match="unsupported hidden_act='mish'"):
        from_hf(bad)
    with pytest.raises(TypeError, match="unsupported model class Linear.*ViTForImageClassification, ViTModel"):
        from_hf(torch.nn.Linear(2, 2))


# -- the dispatch: exact classes only, refused before any compute ---------------------------------
V = dict(hidden_size=12, num_hidden_layers=1, num_attention_heads=3, intermediate_size=16, image_size=8,
         patch_size=4, num_channels=1)
#: (class, config class, config kwargs): ViT look-alikes and other models, all refused
REFUSED = [
    ("DeiTModel", "DeiTConfig", V),  # distillation token
    ("DeiTForImageClassification", "DeiTConfig", V),
    ("DeiTForImageClassificationWithTeacher", "DeiTConfig", V),
    ("BertModel", "BertConfig", dict(hidden_size=12, num_hidden_layers=1, num_attention_heads=3,
                                     intermediate_size=16, vocab_size=20)),  # text, post-norm
    ("Dinov2Model", "Dinov2Config", V),  # layer scale, interpolated positions
    ("Dinov2WithRegistersModel", "Dinov2WithRegistersConfig", V),
    ("BeitModel", "BeitConfig", V),  # relative position bias, layer scale, mean pooling
    ("Data2VecVisionModel", "Data2VecVisionConfig", V),
    ("IJepaModel", "IJepaConfig", V),  # no class token
    ("IJepaForImageClassification", "IJepaConfig", V),
    ("ViTMAEModel", "ViTMAEConfig", V),  # random masking of patches
    ("ViTMAEForPreTraining", "ViTMAEConfig", dict(V, decoder_hidden_size=12, decoder_num_hidden_layers=1,
                                                  decoder_num_attention_heads=3, decoder_intermediate_size=16)),
    ("ViTMSNModel", "ViTMSNConfig", V),
    ("ViTMSNForImageClassification", "ViTMSNConfig", V),
    ("ViTForMaskedImageModeling", "ViTConfig", V),  # mask token + decoder
    ("YolosModel", "YolosConfig", dict(V, image_size=[8, 8], num_detection_tokens=2)),
    ("ASTModel", "ASTConfig", dict(hidden_size=12, num_hidden_layers=1, num_attention_heads=3,
                                   intermediate_size=16, patch_size=4, max_length=16, num_mel_bins=16,
                                   frequency_stride=4, time_stride=4)),
    ("CLIPVisionModel", "CLIPVisionConfig", V),
    ("SiglipVisionModel", "SiglipVisionConfig", V),
    ("Siglip2VisionModel", "Siglip2VisionConfig", dict(V, num_patches=4)),
    ("DINOv3ViTModel", "DINOv3ViTConfig", V),
    ("VitDetModel", "VitDetConfig", dict(hidden_size=12, num_hidden_layers=1, num_attention_heads=3, mlp_ratio=2,
                                         image_size=8, patch_size=4, num_channels=1, pretrain_image_size=8)),
    ("PixioModel", "PixioConfig", V),
    ("VivitModel", "VivitConfig", dict(hidden_size=12, num_hidden_layers=1, num_attention_heads=3,
                                       intermediate_size=16, image_size=8, num_frames=2, tubelet_size=[1, 4, 4],
                                       num_channels=1)),
    ("TimesformerModel", "TimesformerConfig", dict(V, num_frames=2)),
    ("VideoMAEModel", "VideoMAEConfig", dict(V, num_frames=2, tubelet_size=1)),
    ("Aimv2VisionModel", "Aimv2VisionConfig", V),
    ("MLCDVisionModel", "MLCDVisionConfig", V),
]
SUPPORTED_LIST = r"exactly these transformers classes: .*ViTForImageClassification, ViTModel"


class _AtenOps(torch.utils._python_dispatch.TorchDispatchMode):
    """Records every aten op run (a refusal 'before any compute' runs none)."""

    def __init__(self):
        super().__init__()
        self.ops = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append(func.overloadpacket.__name__)
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("name,config,kwargs", REFUSED, ids=[r[0] for r in REFUSED])
def test_unsupported_classes_are_refused_before_compute(name, config, kwargs):
    if not hasattr(transformers, name):
        pytest.skip(f"transformers {transformers.__version__} has no {name}")
    model = getattr(transformers, name)(getattr(transformers, config)(**kwargs))
    with _AtenOps() as rec, pytest.raises(TypeError, match=rf"unsupported model class {name} .*{SUPPORTED_LIST}"):
        from_hf(model)
    assert rec.ops == []


def test_subclasses_and_borrowed_names_are_refused():
    cfg = transformers.ViTConfig(**V)

    class MyViT(transformers.ViTModel):
        pass

    with pytest.raises(TypeError, match=rf"unsupported model class MyViT .*{SUPPORTED_LIST}"):
        from_hf(MyViT(cfg))
    ViTModel = type("ViTModel", (torch.nn.Module,), {})  # a class outside transformers with the name
    with pytest.raises(TypeError, match="a class outside transformers that borrows a supported name"):
        from_hf(ViTModel())
    with pytest.raises(TypeError, match="model: expected a transformers model"):
        from_hf("ViTModel")


def test_mask_token_is_refused():
    """``use_mask_token=True`` adds the ``bool_masked_pos`` replacement, not converted."""
    model = transformers.ViTModel(transformers.ViTConfig(**V), use_mask_token=True)
    with _AtenOps() as rec, pytest.raises(ValueError, match="use_mask_token=True"):
        from_hf(model)
    assert rec.ops == []


def test_registry():
    from opsplit.models import hf_converters, register_hf_converter

    table = hf_converters()
    assert {"ViTModel", "ViTForImageClassification"} <= set(table)
    with pytest.raises(ValueError, match="ViTModel already has a converter"):
        register_hf_converter("ViTModel", lambda m: m)
    register_hf_converter("ViTModel", table["ViTModel"])  # the same function again: a no-op
    with pytest.raises(TypeError, match="hf_class_name: expected a class name"):
        register_hf_converter("not a name", lambda m: m)
    with pytest.raises(TypeError, match="fn: expected a callable"):
        register_hf_converter("SomeModel", 3)


@pytest.mark.parametrize("hidden_act", ["gelu", "gelu_python", "gelu_new", "gelu_fast", "gelu_pytorch_tanh",
                                        "gelu_python_tanh", "gelu_accurate", "quick_gelu", "relu", "silu",
                                        "swish", "tanh", "linear"])
def test_every_converted_activation_is_hf_exact(hidden_act):
    from transformers.activations import ACT2CLS

    if hidden_act not in ACT2CLS:
        pytest.skip(f"transformers {transformers.__version__} has no {hidden_act}")
    cfg = transformers.ViTConfig(**V, hidden_act=hidden_act, pooler_act=hidden_act if hidden_act != "tanh" else "relu")
    hf = _random(transformers.ViTModel(cfg).double().eval(), 7)
    model = from_hf(hf)
    x = torch.randn(2, 1, 8, 8, dtype=torch.float64) * 3  # reach the tails of the activations
    ref, out = hf(x), model(x)
    torch.testing.assert_close(out.last_hidden_state, ref.last_hidden_state, rtol=0, atol=1e-10)
    torch.testing.assert_close(out.pooler_output, ref.pooler_output, rtol=0, atol=1e-10)


@pytest.mark.parametrize("hidden_act", ["mish", "gelu_10", "leaky_relu", "relu6", "sigmoid", "relu2", "laplace"])
def test_other_activations_are_refused(hidden_act):
    from transformers.activations import ACT2CLS

    if hidden_act not in ACT2CLS:
        pytest.skip(f"transformers {transformers.__version__} has no {hidden_act}")
    hf = transformers.ViTModel(transformers.ViTConfig(**V, hidden_act=hidden_act))
    with pytest.raises(ValueError, match=rf"unsupported hidden_act='{hidden_act}'"):
        from_hf(hf)


# -- training mode: dropout exactly where HF has it ----------------------------------------------
@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_train_mode_dropout_is_hfs(attn):
    """HF ViT draws dropout on the embeddings, then per layer on the attention weights, after
    the attention and after the MLP: the converted model draws the same masks in the same
    order (no dropout inside the MLP), so with one seed the outputs and gradients agree."""
    cfg = transformers.ViTConfig(**{**CONFIGS[0], "hidden_dropout_prob": 0.5, "attention_probs_dropout_prob": 0.3})
    cfg._attn_implementation = attn
    torch.manual_seed(0)
    hf = _random(transformers.ViTForImageClassification(cfg).double().train(), 1)
    model = from_hf(hf)
    assert model.training
    x = torch.randn(3, 3, 12, 8, dtype=torch.float64)
    assert len(same_draws(hf, model, x)) == 1 + 3 * cfg.num_hidden_layers
    tol = 1e-10 if attn == "sdpa" else 1e-6  # HF's eager attention takes the softmax in float32
    assert_seeded_pass_close(hf, model, x, seed=5, atol=tol, out=lambda y: y.logits)


# -- requires_grad ------------------------------------------------------------------------------------
def test_requires_grad_is_kept():
    hf = transformers.ViTForImageClassification(transformers.ViTConfig(**CONFIGS[0], num_labels=4)).double()
    frozen = {"vit.embeddings.patch_embeddings.projection.weight", "vit.embeddings.cls_token",
              "vit.layernorm.weight"}
    for layer in hf.vit.layers:
        layer.mlp.fc1.weight.requires_grad_(False)
        layer.attention.q_proj.bias.requires_grad_(False)
    for name, p in hf.named_parameters():
        if name in frozen:
            p.requires_grad_(False)
    model = from_hf(hf)
    assert not model.embedding.weight.requires_grad and not model.embedding.cls_token.requires_grad
    assert model.embedding.position.requires_grad and model.embedding.bias.requires_grad
    enc = model.encoder
    assert not enc.ffn.W1.raw.requires_grad and enc.ffn.W2.raw.requires_grad
    assert not enc.attention.bQ.raw.requires_grad and enc.attention.bK.raw.requires_grad
    assert not enc.final_affine.weight.value.requires_grad and enc.final_affine.bias.value.requires_grad
    assert model.classifier.weight.requires_grad
    n_hf = sum(p.numel() for p in hf.parameters() if p.requires_grad)
    n_ops = sum(p.numel() for p in model.parameters() if p.requires_grad)
    assert n_ops == n_hf
    hf.vit.layers[1].mlp.fc2.weight.requires_grad_(False)  # frozen in layer 1 only
    with pytest.raises(ValueError, match=r"fc2.weight.requires_grad differs between layers \(\[True, False\]\)"):
        from_hf(hf)
