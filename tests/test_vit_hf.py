"""ViT = G o N o F (paper 002 §4.2) against Hugging Face transformers' ViTModel and
ViTForImageClassification built from random ViTConfigs (no download).  Skipped when
transformers is not installed (it is a test-only dependency)."""

from __future__ import annotations

import pytest
import torch

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
    with pytest.raises(ValueError, match="unsupported hidden_act 'mish'"):
        from_hf(bad)
    with pytest.raises(TypeError, match="expected a transformers ViTModel"):
        from_hf(torch.nn.Linear(2, 2))
