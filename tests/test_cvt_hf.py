"""CvT as a multi-stage splitting scheme (paper 002 §6) against Hugging Face transformers'
CvtModel and CvtForImageClassification built from seeded random CvtConfigs (no download):
last hidden state, class token, logits and the gradients with respect to the input and
every parameter.  Skipped when transformers is not installed (a test-only dependency)."""

from __future__ import annotations

import random

import pytest
import torch
from _helpers import assert_seeded_pass_close, same_draws

transformers = pytest.importorskip("transformers")

from opsplit.models import CvT, from_hf  # noqa: E402
from opsplit.models.cvt_hf import _hf_parts, _pairs  # noqa: E402

TOL = {torch.float32: 1e-5, torch.float64: 1e-10}
#: float32 parameter gradients, relative to the largest gradient: HF's own float32 gradients are
#: off from its float64 ones by up to 2.5e-6 of it on these configurations, opsplit's by up to
#: 1.2e-5 (the weight gradient of a 2-channel embedding convolution, a long sum that the two
#: backward passes reduce in different orders)
GRAD_TOL = {1e-5: 3e-5}


def assert_close(actual, expected, tol):
    """``|actual - expected| <= tol * max(1, max|expected|)``: the tolerance is relative to the
    tensor's scale (a 13-layer CvT's states reach ~60, where float32 itself — HF in float32
    against HF in float64 — is off by ~8e-5)."""
    scale = max(1.0, float(expected.detach().abs().max()))
    torch.testing.assert_close(actual, expected, rtol=0, atol=tol * scale)


def random_config(seed: int) -> tuple[dict, int]:
    """A seeded random CvtConfig (as kwargs) and an image size its strides divide.

    transformers' CvtStage indexes ``linspace(0, rate, depth)[stage]``, so stage k needs
    depth > k; its class token is sized by ``embed_dim[-1]``, so only the last stage has one."""
    r = random.Random(seed)
    K = r.choice([1, 2, 3])
    size = r.choice([16, 24, 32])
    n = size
    cfg = {k: [] for k in ("depth", "num_heads", "embed_dim", "patch_sizes", "patch_stride", "patch_padding",
                           "kernel_qkv", "padding_q", "padding_kv", "stride_kv", "stride_q", "qkv_bias",
                           "mlp_ratio", "cls_token", "qkv_projection_method", "drop_rate", "attention_drop_rate",
                           "drop_path_rate")}
    for k in range(K):
        stride = r.choice([s for s in (1, 2, 4) if n % s == 0 and n // s >= 2] or [1])
        p = r.choice([3, 5, 7]) if stride > 1 else r.choice([1, 3])
        n //= stride
        H = r.choice([1, 2, 3])
        kq = r.choice([1, 3, 5])
        skv = r.choice([s for s in (1, 2) if n % s == 0])
        cfg["depth"].append(r.choice([k + 1, k + 2]))
        cfg["num_heads"].append(H)
        cfg["embed_dim"].append(H * r.choice([2, 4, 6]))
        cfg["patch_sizes"].append(p)
        cfg["patch_stride"].append(stride)
        cfg["patch_padding"].append((p - 1) // 2)
        cfg["kernel_qkv"].append(kq)
        cfg["padding_q"].append((kq - 1) // 2)
        cfg["padding_kv"].append(r.choice([0, (kq - 1) // 2]) if n + 2 * 0 - kq >= 0 else (kq - 1) // 2)
        cfg["stride_kv"].append(skv)
        cfg["stride_q"].append(1)
        cfg["qkv_bias"].append(r.random() < 0.6)
        cfg["mlp_ratio"].append(r.choice([1.5, 2.0, 4.0]))
        cfg["cls_token"].append(k == K - 1 and r.random() < 0.6)
        cfg["qkv_projection_method"].append("dw_bn")
        for key in ("drop_rate", "attention_drop_rate", "drop_path_rate"):
            cfg[key].append(0.0)
    cfg["num_channels"] = r.choice([1, 3])
    cfg["num_labels"] = r.choice([0, 3, 7])
    return cfg, size


def randomized(model, seed: int):
    """Perturb every parameter and the batch-norm statistics (so no map is the identity)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.1 * torch.randn(p.shape, generator=g).to(p.dtype))
        for m in model.modules():
            if isinstance(m, torch.nn.BatchNorm2d):
                m.running_mean.copy_(0.1 * torch.randn(m.running_mean.shape, generator=g))
                m.running_var.copy_(0.5 + torch.rand(m.running_var.shape, generator=g))
    return model


def hf_model(cfg: dict, cls: str, dtype, seed: int):
    torch.manual_seed(seed)
    return randomized(getattr(transformers, cls)(transformers.CvtConfig(**cfg)).to(dtype).eval(), seed)


def _grads_as_data(module):
    """Replace every parameter's data by its gradient (zeros where none)."""
    for p in module.parameters():
        p.data = p.grad.detach().clone() if p.grad is not None else torch.zeros_like(p)


def compare(hf, model, x, tol):
    """Outputs and gradients (input and every parameter) of the HF model and the converted one."""
    cls = type(hf).__name__
    x1, x2 = x.clone().requires_grad_(), x.clone().requires_grad_()
    base = hf.cvt if cls == "CvtForImageClassification" else hf
    ref = base(x1)
    out = model(x2)
    assert_close(out.last_hidden_state, ref.last_hidden_state, tol)
    if ref.cls_token_value is None:
        assert out.cls_token_value is None
    else:
        assert_close(out.cls_token_value, ref.cls_token_value, tol)
    g = torch.Generator().manual_seed(3)
    w = torch.randn(ref.last_hidden_state.shape, generator=g).to(x.dtype)
    loss_ref = (ref.last_hidden_state * w).sum()
    loss_out = (out.last_hidden_state * w).sum()
    if ref.cls_token_value is not None:
        loss_ref = loss_ref + ref.cls_token_value.sum()
        loss_out = loss_out + out.cls_token_value.sum()
    if cls == "CvtForImageClassification":
        logits = hf(x1).logits
        assert_close(out.logits, logits, tol)
        loss_ref = loss_ref + logits.square().sum()
        loss_out = loss_out + out.logits.square().sum()
    loss_ref.backward()
    loss_out.backward()
    assert_close(x2.grad, x1.grad, tol)
    # every parameter: read the gradients through the same (exact) weight correspondence
    # the gradient tolerance is relative to the largest gradient of the model: in float32, HF's own
    # gradients (float32 against float64) are off by up to ~1e-6 of it (a bias whose exact gradient
    # is zero, e.g. b^K under the softmax, gets round-off of that size)
    gscale = max(1.0, max(float(p.grad.abs().max()) for p in hf.parameters() if p.grad is not None))
    _grads_as_data(hf)
    _grads_as_data(model)
    P = _hf_parts(hf)
    params = {id(p) for p in hf.parameters()}
    n = 0
    for ours, theirs, view in _pairs(model, P["parts"], P["head"], P["ln"]):
        if id(theirs) not in params:
            continue  # batch-norm statistics: buffers
        torch.testing.assert_close(ours, view(theirs), rtol=0, atol=GRAD_TOL.get(tol, tol) * gscale)
        n += 1
    assert n == len(params)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["f32", "f64"])
def test_default_cvt(dtype):
    """The default CvtConfig (3 stages: depths 1, 2, 10; embed dims 64, 192, 384; class token in
    the last stage) on 64 x 64 images (token grids 16x16, 8x8, 4x4 + class token)."""
    hf = hf_model({"num_labels": 5}, "CvtForImageClassification", dtype, 0)
    model = from_hf(hf)
    assert isinstance(model, CvT) and not model.training
    x = torch.randn(2, 3, 64, 64, generator=torch.Generator().manual_seed(1)).to(dtype)
    compare(hf, model, x, TOL[dtype])
    if dtype == torch.float32:  # the schedule of the default CvT on 224 x 224 images
        text = str(model.schedule(224))
        for want in ("stage 1", "ImageGrid(56x56, h=(1, 1), N_y=64)", "ImageGrid(28x28, h=(1, 1), N_y=192)",
                     "ImageGrid(14x14 + 1 prefix, h=(1, 1), N_y=384)", "eq. 44", "eq. 45", "PrependTokens",
                     "ConvAttention", "FeedForward", "t in [3, 13]", "10 step(s)"):
            assert want in text, want


@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["f32", "f64"])
def test_random_configs(seed, dtype):
    cfg, size = random_config(seed)
    cls = "CvtForImageClassification" if seed % 2 else "CvtModel"
    hf = hf_model(cfg, cls, dtype, 10 + seed)
    model = from_hf(hf)
    x = torch.randn(3, cfg["num_channels"], size, size, generator=torch.Generator().manual_seed(seed)).to(dtype)
    compare(hf, model, x, TOL[dtype])


def test_random_configs_cover_the_options():
    """The seeded configurations above exercise what the issue asks for."""
    cfgs = [random_config(s)[0] for s in range(8)]
    flat = lambda key: {v for c in cfgs for v in c[key]}  # noqa: E731
    assert {len(c["depth"]) for c in cfgs} == {1, 2, 3}
    assert len(flat("num_heads")) >= 2 and len(flat("embed_dim")) >= 3 and len(flat("kernel_qkv")) >= 2
    assert flat("stride_kv") == {1, 2} and len(flat("patch_stride")) >= 2
    assert {c["cls_token"][-1] for c in cfgs} == {True, False}
    assert flat("qkv_bias") == {True, False}


def test_non_square_image():
    hf = hf_model(dict(depth=[1, 2], num_heads=[1, 2], embed_dim=[8, 12], patch_sizes=[3, 3], patch_stride=[2, 2],
                       patch_padding=[1, 1], kernel_qkv=[3, 3], padding_q=[1, 1], padding_kv=[1, 1],
                       stride_kv=[2, 1], stride_q=[1, 1], qkv_bias=[True, True], mlp_ratio=[2.0, 2.0],
                       cls_token=[False, True], qkv_projection_method=["dw_bn"] * 2, drop_rate=[0.0] * 2,
                       attention_drop_rate=[0.0] * 2, drop_path_rate=[0.0] * 2, num_labels=4),
                  "CvtForImageClassification", torch.float64, 5)
    model = from_hf(hf)
    x = torch.randn(2, 3, 16, 24, dtype=torch.float64)
    compare(hf, model, x, 1e-10)
    assert model.output_grid((16, 24)).size == (4, 6)


# -- training mode ----------------------------------------------------------------------------------------
# (the embedding's dropout draws on HF's (B, C, H, W) view of the same channels-last memory as
# opsplit's (B, N_x, N_y) state)
def test_train_mode_matches_hf():
    """Dropout after the embedding, on the attention weights, after the attention and after
    the MLP; drop path on the attention branch and on the state after the MLP's residual sum
    (HF's placement); batch norm with batch statistics and running-statistics updates.  Same
    draws in the same order, so with one seed the outputs, gradients and statistics agree."""
    cfg = dict(depth=[1, 2], num_heads=[1, 2], embed_dim=[8, 12], patch_sizes=[3, 3], patch_stride=[2, 2],
               patch_padding=[1, 1], kernel_qkv=[3, 3], padding_q=[1, 1], padding_kv=[1, 1], stride_kv=[2, 2],
               stride_q=[1, 1], qkv_bias=[True, False], mlp_ratio=[2.0, 4.0], cls_token=[False, True],
               qkv_projection_method=["dw_bn"] * 2, drop_rate=[0.2, 0.3], attention_drop_rate=[0.1, 0.25],
               drop_path_rate=[0.0, 0.4], num_labels=3)
    hf = hf_model(cfg, "CvtForImageClassification", torch.float64, 7).train()
    model = from_hf(hf)
    assert model.training
    x = torch.randn(4, 3, 16, 16, dtype=torch.float64)
    draws = same_draws(hf, model, x)
    # stage 1: embedding dropout + per layer (attn weights, attn output, MLP output); stage 2: the same
    # plus two drop-path draws per layer
    assert len(draws) == (1 + 3) + (1 + 2 * 5)
    hf = hf_model(cfg, "CvtForImageClassification", torch.float64, 7).train()
    model = from_hf(hf)
    assert_seeded_pass_close(hf, model, x, seed=11, atol=1e-10, out=lambda y: y.logits)
    P = _hf_parts(hf)
    params = {id(p) for p in hf.parameters()}
    for ours, theirs, view in _pairs(model, P["parts"], P["head"], P["ln"]):
        if id(theirs) not in params:  # running statistics after one step
            torch.testing.assert_close(ours, view(theirs), rtol=0, atol=1e-12)


# -- conversion details ------------------------------------------------------------------------------------
def test_to_hf_is_a_weight_copy():
    cfg, size = random_config(3)
    hf = hf_model(cfg, "CvtForImageClassification", torch.float64, 1)
    model = from_hf(hf)
    back = model.to_hf()
    assert type(back) is type(hf) and not back.training
    sd0, sd1 = hf.state_dict(), back.state_dict()
    assert sd0.keys() == sd1.keys()
    for k in sd0:
        assert torch.equal(sd0[k], sd1[k]), k
    x = torch.randn(2, cfg["num_channels"], size, size, dtype=torch.float64)
    torch.testing.assert_close(back(x).logits, hf(x).logits, rtol=0, atol=0)


@pytest.mark.filterwarnings("ignore:Initializing zero-element tensors")
@pytest.mark.parametrize("E, F", [(11, 15), (22, 49), (21, 59), (8, 0), (6, 1)])
def test_to_hf_hidden_widths(E, F):
    """A model built from specs whose hidden width F is not int(E * (F / E)) in floating point
    (int(11 * (15 / 11)) == 14), or 0, goes to transformers with its own width: to_hf picks a
    mlp_ratio that transformers' int(embed_dim * mlp_ratio) maps back to F."""
    from opsplit.models import CvtStageSpec

    torch.manual_seed(0)
    spec = CvtStageSpec(3, E, 1, 1, patch_size=3, patch_stride=2, patch_padding=1, mlp_hidden=F)
    model = CvT(3, [spec], num_labels=2, dtype=torch.float64).eval()
    hf = model.to_hf()
    assert hf.cvt.encoder.stages[0].layers[0].intermediate.dense.out_features == F
    x = torch.randn(2, 3, 9, 7, dtype=torch.float64)
    torch.testing.assert_close(model(x).logits, _hf_logits(hf, x), rtol=0, atol=1e-12)


def _hf_logits(hf, x, base=None):
    """``CvtForImageClassification``'s logits from its modules, as its forward computes them
    (transformers 5.x's forward fails with an IndexError when the last stage has no class
    token: its ``ModelOutput`` drops the ``None`` class token before ``outputs[1]``);
    ``base``: the output of ``hf.cvt(x)`` if already computed (one forward in training mode)."""
    base = hf.cvt(x) if base is None else base
    if base.cls_token_value is not None:
        seq = hf.layernorm(base.cls_token_value)
    else:
        seq = hf.layernorm(base.last_hidden_state.flatten(2).transpose(1, 2))
    return hf.classifier(seq.mean(dim=1))


def test_requires_grad_is_kept():
    cfg, _ = random_config(2)
    hf = hf_model(cfg, "CvtModel", torch.float64, 1)
    st = hf.encoder.stages[0]
    st.embedding.convolution_embeddings.projection.weight.requires_grad_(False)
    st.layers[0].intermediate.dense.weight.requires_grad_(False)
    model = from_hf(hf)
    ops = model.stage_operators(0)
    assert not ops["embed"].weight.value.requires_grad and ops["embed"].bias.value.requires_grad
    W1 = ops["ffn"].W1.pieces  # one parameter per layer: per-layer flags
    assert not W1[0].requires_grad and all(p.requires_grad for p in W1[1:]) and ops["ffn"].W2.pieces[0].requires_grad
    # the batch-norm parameters of a stage are one stacked parameter: one flag for all layers
    bn = st.layers[0].attention.attention.convolution_projection_query.convolution_projection.normalization
    bn.weight.requires_grad_(False)
    if len(st.layers) > 1:
        with pytest.raises(ValueError, match="requires_grad differs"):
            from_hf(hf)
    else:
        assert not from_hf(hf).stage_operators(0)["attention"].q_proj[1].weight.raw.requires_grad


# -- bad input ------------------------------------------------------------------------------------------------
SMALL = dict(depth=[1], num_heads=[2], embed_dim=[8], patch_sizes=[3], patch_stride=[2], patch_padding=[1],
             kernel_qkv=[3], padding_q=[1], padding_kv=[1], stride_kv=[2], stride_q=[1], qkv_bias=[True],
             mlp_ratio=[2.0], cls_token=[True], qkv_projection_method=["dw_bn"], drop_rate=[0.0],
             attention_drop_rate=[0.0], drop_path_rate=[0.0])


def test_unsupported_model_class():
    with pytest.raises(TypeError, match="unsupported model class"):
        from_hf(transformers.ResNetModel(transformers.ResNetConfig(hidden_sizes=[8], depths=[1], embedding_size=8)))

    class MyCvt(transformers.CvtModel):
        pass

    with pytest.raises(TypeError, match="unsupported model class MyCvt"):
        from_hf(MyCvt(transformers.CvtConfig(**SMALL)))


def test_avg_projection_refused():
    """transformers' 'avg' builds no convolution (its forward fails): refused before compute."""
    hf = transformers.CvtModel(transformers.CvtConfig(**{**SMALL, "qkv_projection_method": ["avg"]}))
    with pytest.raises(AttributeError):
        hf(torch.randn(1, 3, 8, 8))
    with pytest.raises(ValueError, match="qkv_projection_method='avg' is not converted"):
        from_hf(hf)


def test_query_projection_that_changes_the_grid():
    """A query projection that keeps no token grid (stride 1 without 'same' padding) is
    refused at conversion; a strided one keeps the grid of a few sizes only (here the 1x1
    token grid of 1x1 and 2x2 images, which HF runs): the model takes those, and refuses the
    others naming pixel_values (HF fails on them, its residual sum mixing two grids)."""
    hf = transformers.CvtModel(transformers.CvtConfig(**{**SMALL, "padding_q": [0]}))
    with pytest.raises(ValueError, match="query projection keeps no token grid"):
        from_hf(hf)
    hf = hf_model({**SMALL, "stride_q": [2]}, "CvtModel", torch.float64, 3)
    model = from_hf(hf)
    for n in (1, 2):
        x = torch.randn(2, 3, n, n, dtype=torch.float64)
        compare(hf, model, x, 1e-10)
    x = torch.randn(2, 3, 8, 8, dtype=torch.float64)
    with pytest.raises(RuntimeError):
        hf(x)
    with pytest.raises(ValueError, match=r"pixel_values: images of 8x8 pixels do not fit stage 1 \(on the 4x4 token "
                                         r"grid\): ConvAttention.q_proj: the query projection must keep the token grid"):
        model(x)


def test_bad_pixels():
    model = from_hf(transformers.CvtForImageClassification(transformers.CvtConfig(**SMALL, num_labels=2)).eval())
    model(torch.randn(1, 3, 18, 15))  # 18 x 15 -> 9 x 8 tokens, K/V 5 x 4: any size HF runs
    big = transformers.CvtModel(transformers.CvtConfig(**{**SMALL, "kernel_qkv": [9], "padding_q": [4]})).eval()
    x = torch.randn(1, 3, 10, 12)  # 5 x 6 tokens: the 9 x 9 K/V stencil does not fit 5 + 2*1 rows
    with pytest.raises(RuntimeError):
        big(x)
    with pytest.raises(ValueError, match=r"pixel_values: images of 10x12 pixels do not fit stage 1 \(on the 5x6 token "
                                         r"grid\): ConvAttention.k_proj: ConvTransfer: the kernel \(9\) is larger than "
                                         r"the padded image \(height N_1 = 5, \+ 2\*1 padding = 7\)"):
        from_hf(big)(x)
    with pytest.raises(ValueError, match=r"pixel_values: images of 1x16 pixels do not fit stage 1's entry \(from the "
                                         r"1x16 grid\): ConvTransfer: the kernel \(3\) is larger"):
        from_hf(transformers.CvtModel(transformers.CvtConfig(**{**SMALL, "patch_padding": [0]})).eval())(
            torch.randn(1, 3, 1, 16))
    with pytest.raises(ValueError, match=r"pixel_values: empty images"):
        model(torch.randn(1, 3, 0, 16))
    with pytest.raises(ValueError, match="pixel_values: channel mismatch: expected 3 channels, got 1"):
        model(torch.randn(1, 1, 16, 16))
    with pytest.raises(TypeError, match="pixel_values: expected a floating-point"):
        model(torch.ones(1, 3, 16, 16, dtype=torch.long))
    with pytest.raises(TypeError, match="pixel_values: dtype torch.float64 differs from the CvT's torch.float32"):
        model(torch.randn(1, 3, 16, 16, dtype=torch.float64))
    with pytest.raises(ValueError, match=r"pixel_values: expected shape \(B, C, H, W\)"):
        model(torch.randn(3, 16, 16))
    for bad in (float("nan"), float("inf"), -float("inf")):
        x = torch.randn(1, 3, 16, 16)
        x[0, 0, 0, 0] = bad
        with pytest.raises(ValueError, match="pixel_values: expected finite values"):
            model(x)


def test_channel_mismatch_between_stages_refused():
    from opsplit.models import CvtStageSpec

    with pytest.raises(ValueError, match="channel mismatch: in_channels = 5"):
        CvT(3, [CvtStageSpec(3, 8, 1, 2), CvtStageSpec(5, 8, 1, 2)])
    with pytest.raises(ValueError, match="channel mismatch: in_channels = 1"):
        CvT(3, [CvtStageSpec(1, 8, 1, 2)])
