"""An empty batch (B = 0) through every public operator and model: an empty output of the
shape torch would give, as ``torch.nn``'s modules do (``nn.Linear``, ``nn.Conv2d``,
``nn.TransformerEncoderLayer`` map a batch of 0 to a batch of 0), still on the autograd graph
of the parameters (a backward pass gives zero gradients), or a clear refusal where there is
no such shape to give.

Finding 4 of the hardening round: ``SpectralConvolution`` and ``FourierMultiplier`` crashed in
MKL's FFT on a batch of 0 ("Inconsistent configuration parameters"), and ``Lifting``,
``CvT`` and ``DecoderLM`` refused it, where torch's modules (and Hugging Face's ``CvtModel``)
return an empty batch.  ``generate`` refuses one (``input_ids: empty batch``): Hugging Face's
fails inside a reshape, and there are no prompts to continue.

The shape is compared with torch's own module where one exists, and otherwise with the
model's output for a batch of 2 (its leading dimension replaced by 0).
"""

from __future__ import annotations

import math

import pytest
import torch
from test_model_parameters import DLM, MODELS, dlm, ids, periodic, token_classifier
from torch import nn

from opsplit import Grid, Interval
from opsplit.grid import ImageGrid
from opsplit.operators import (
    Activation,
    BatchNormMap,
    ConvAttention,
    Convolution2d,
    ConvTransfer,
    DropPath,
    FeedForward,
    FFNIntegral,
    FieldDropout,
    FieldDropPath,
    FourierAttention,
    FourierMultiplier,
    GalerkinAttention,
    GatedFeedForward,
    GroupedQueryAttention,
    KernelAttention,
    KVCache,
    Lifting,
    MultiHeadAttention,
    PointwiseAffine,
    PreNorm,
    PrependTokens,
    Projection,
    ProjectionS1,
    ProjectionS2,
    ProjectionSphere,
    ReLUAttention,
    RotaryEmbedding,
    SlicedReLUAttention,
    SlicedReLUBumpAttention,
    SoftmaxAttention,
    SpectralConvolution,
    StateDropout,
    periodic_positions,
    project_s1,
    project_sphere,
)

F64 = torch.float64
E = 4


def r(*shape):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(len(shape) + sum(shape)), dtype=F64) * 0.3


def image(op, B, size=(4, 4), C=E, prefix=0, train=False):
    g = ImageGrid.paper(size, C, n_prefix=prefix)
    return op.train(train)(r(B, g.nx, C), grid=g)


def bn():
    return BatchNormMap(E, dtype=F64).eval()


def conv_attention():
    def proj(stride):
        return [ConvTransfer(r(E, 1, 3, 3), stride=stride, padding=1, groups="depthwise", prefix="keep"), bn()]

    return ConvAttention(r(E, 2, 2), r(E, 2, 2), r(E, 2, 2), r(2, 2, E), q_proj=proj(1), k_proj=proj(2),
                         v_proj=proj(2))


def ffn_integral():
    return FFNIntegral(r(E, E), r(E), bias_axis="y")


PERIODIC = Grid(x=Interval(length=1.0, rule="left"), y=Interval.paper(E))

#: name -> f(B): the operator applied to a batch of B (constructed inside: a fresh operator per call)
OPERATORS = {
    "Activation": lambda B: Activation("gelu")(r(B, 3, E)),
    "PointwiseAffine": lambda B: PointwiseAffine(r(E), r(E), projection=ProjectionS1())(r(B, 3, E)),
    "SoftmaxAttention": lambda B: SoftmaxAttention(r(E, E), r(E, E), r(E, E))(r(B, 3, E)),
    "BatchNormMap": lambda B: image(bn(), B),
    "BatchNormMap-train": lambda B: image(bn(), B, train=True),
    "ConvAttention": lambda B: image(conv_attention(), B, prefix=1),
    "Convolution2d": lambda B: image(Convolution2d.create(E, 3, dtype=F64), B),
    "ConvTransfer": lambda B: image(ConvTransfer(r(6, E, 3, 3), r(6), stride=2, padding=1), B),
    "PrependTokens": lambda B: image(PrependTokens.create(E, 1, dtype=F64), B),
    "FieldDropout-train": lambda B: FieldDropout(ffn_integral(), 0.5).train()(r(B, 3, E)),
    "FieldDropPath-train": lambda B: FieldDropPath(ffn_integral(), 0.5).train()(r(B, 3, E)),
    "DropPath-train": lambda B: DropPath(0.5).train()(r(B, 3, E)),
    "StateDropout-train": lambda B: StateDropout(0.5).train()(r(B, 3, E)),
    "FeedForward": lambda B: FeedForward.create(E, 6, dtype=F64)(r(B, 3, E)),
    "FFNIntegral": lambda B: ffn_integral()(r(B, 3, E)),
    "GatedFeedForward": lambda B: GatedFeedForward.create(E, 6, dtype=F64)(r(B, 3, E)),
    "FourierAttention": lambda B: FourierAttention.create(E, 2, dtype=F64)(r(B, 8, E), grid=PERIODIC),
    "GalerkinAttention": lambda B: GalerkinAttention.create(E, 2, dtype=F64)(r(B, 8, E), grid=PERIODIC),
    "GroupedQueryAttention": lambda B: GroupedQueryAttention.create(E, 2, 1, dtype=F64)(r(B, 3, E)),
    "GroupedQueryAttention-causal-rope": lambda B: GroupedQueryAttention.create(
        E, 2, 1, causal=True, dtype=F64)._with_rotary(RotaryEmbedding(2))(r(B, 3, E)),
    "KernelAttention": lambda B: KernelAttention(r(E, E), r(E, E), r(E, E))(r(B, 3, E)),
    "MultiHeadAttention": lambda B: MultiHeadAttention.create(E, 2, dtype=F64)(r(B, 3, E)),
    "MultiHeadAttention-causal": lambda B: MultiHeadAttention.create(E, 2, causal=True, dtype=F64)(r(B, 3, E)),
    "ReLUAttention": lambda B: ReLUAttention(r(E, 2, 2), r(E, 2, 2), r(E, 2, 2), r(2, 2, E))(r(B, 3, E)),
    "PreNorm": lambda B: PreNorm(ffn_integral(), ProjectionS1())(r(B, 3, E)),
    "ProjectionS1": lambda B: ProjectionS1()(r(B, 3, E)),
    "ProjectionS2": lambda B: ProjectionS2()(r(B, 3, E)),
    "ProjectionSphere": lambda B: ProjectionSphere()(r(B, 3, E)),
    "project_s1": lambda B: project_s1(r(B, 3, E), 0.0, 1.0),
    "project_sphere": lambda B: project_sphere(r(B, 3, E), 1.0),
    "SpectralConvolution": lambda B: SpectralConvolution.create(E, 3, dtype=F64)(r(B, 8, E), grid=PERIODIC),
    "SpectralConvolution-local": lambda B: SpectralConvolution.create(E, 3, bias=True, local=True, dtype=F64)(
        r(B, 8, E), grid=PERIODIC),
    "FourierMultiplier": lambda B: FourierMultiplier(3, dtype=F64)(r(B, 8)),
    "FourierMultiplier-channels": lambda B: FourierMultiplier(3, 2, dtype=F64)(r(B, 8, 2)),
    "Lifting": lambda B: Lifting(1, E, n_freq=1, dtype=F64)(periodic(B)),
    "Projection": lambda B: Projection(E, 5, dtype=F64)(r(B, 8, E)),
    "Projection-channels": lambda B: Projection(E, 5, 3, dtype=F64)(r(B, 8, E)),
    # the other helper's files (kv_cache.py, sliced_attention.py): the operators without a cache
    "SlicedReLUAttention": lambda B: SlicedReLUAttention.build(E, 2, dtype=F64)(r(B, 3, E)),
    "SlicedReLUAttention-causal": lambda B: SlicedReLUAttention.build(E, 2, causal=True, dtype=F64)(r(B, 3, E)),
    "SlicedReLUBumpAttention": lambda B: SlicedReLUBumpAttention.build(E, 2, dtype=F64)(r(B, 3, E)),
    "periodic_positions": lambda B: periodic_positions(torch.arange(B, dtype=F64), 2, 1.0),
}


def _with_rotary(op, rotary):
    op.rotary = rotary
    return op


GroupedQueryAttention._with_rotary = _with_rotary  # (a test helper: the rotary map of an operator made by create)


def _grads_finite(out, params):
    """A backward pass through an empty output, as through ``nn.Linear``'s: zero gradients."""
    params = [p for p in params if p.requires_grad]
    if not out.requires_grad or not params:
        return
    grads = torch.autograd.grad(out.sum(), params, allow_unused=True)
    for g in grads:
        assert g is None or (torch.isfinite(g).all() and not g.any())


@pytest.mark.parametrize("name", list(OPERATORS))
def test_operator_maps_an_empty_batch_to_an_empty_batch(name):
    f = OPERATORS[name]
    full = f(2)
    empty = f(0)
    assert empty.shape == (0, *full.shape[1:]) and empty.dtype == full.dtype
    assert empty.requires_grad == full.requires_grad


@pytest.mark.parametrize("name", ["SpectralConvolution", "FourierMultiplier"])
def test_fft_operators_keep_the_graph_of_their_parameters(name):
    # finding 4: both crashed in MKL's FFT ("Inconsistent configuration parameters") on B = 0
    if name == "SpectralConvolution":
        op = SpectralConvolution.create(E, 3, bias=True, local=True, dtype=F64)
        out = op(r(0, 8, E), grid=PERIODIC)
        assert out.shape == (0, 8, E)
    else:
        op = FourierMultiplier(3, 2, dtype=F64)
        out = op(r(0, 9, 2))
        assert out.shape == (0, 9, 2)
    assert out.requires_grad
    _grads_finite(out, op.parameters())


def test_operators_against_torch_modules():
    # nn.Conv2d, nn.BatchNorm2d (training: running statistics unchanged, the batch counted),
    # nn.Linear and nn.MultiheadAttention give a batch of 0 for a batch of 0; so do opsplit's
    conv = Convolution2d.create(E, 3, dtype=F64)
    tconv = nn.Conv2d(E, E, 3, padding=1, dtype=F64)
    g = ImageGrid.paper((4, 5), E)
    assert conv(r(0, 20, E), grid=g).shape == (0, 20, E)
    assert tconv(r(0, E, 4, 5)).shape == (0, E, 4, 5)

    op, ref = BatchNormMap(E, dtype=F64).train(), nn.BatchNorm2d(E, dtype=F64).train()
    out, tout = op(r(0, 20, E), grid=g), ref(r(0, E, 4, 5))
    assert out.shape == (0, 20, E) and tout.shape == (0, E, 4, 5)
    torch.testing.assert_close(op.running_mean[0], ref.running_mean, rtol=0, atol=0)
    torch.testing.assert_close(op.running_var[0], ref.running_var, rtol=0, atol=0)
    assert int(op.num_batches_tracked[0]) == int(ref.num_batches_tracked)

    lift = Lifting(1, E, n_freq=2, dtype=F64)
    assert lift(r(0, 8)).shape == nn.Linear(5, E, dtype=F64)(r(0, 8, 5)).shape == (0, 8, E)

    mha = MultiHeadAttention.create(E, 2, dtype=F64)
    tmha = nn.MultiheadAttention(E, 2, batch_first=True, dtype=F64)
    x = r(0, 3, E)
    assert mha(x).shape == tmha(x, x, x, need_weights=False)[0].shape == (0, 3, E)


@pytest.mark.parametrize("name", list(MODELS))
def test_model_maps_an_empty_batch_to_an_empty_batch(name):
    build, inp, call = MODELS[name]
    model = build()
    with torch.no_grad():
        full = call(model, inp(2))
    empty = call(model, inp(0))
    assert empty.shape == (0, *full.shape[1:]) and empty.dtype == full.dtype
    _grads_finite(empty, model.parameters())


def test_torch_exact_models_against_torch():
    from opsplit.models import TorchDecoder, TorchEncoder, from_torch

    layer = nn.TransformerEncoderLayer(E, 2, 8, dropout=0.0, batch_first=True, dtype=F64).eval()
    ours = from_torch(layer)
    x = r(0, 3, E)
    assert ours(x).shape == layer(x).shape == (0, 3, E)
    dlayer = nn.TransformerDecoderLayer(E, 2, 8, dropout=0.0, batch_first=True, dtype=F64).eval()
    dec = from_torch(dlayer)
    assert isinstance(ours, TorchEncoder) and isinstance(dec, TorchDecoder)
    assert dec(x, r(0, 2, E)).shape == dlayer(x, r(0, 2, E)).shape == (0, 3, E)


def test_cvt_against_hugging_face():
    transformers = pytest.importorskip("transformers")
    from opsplit.models import from_hf

    cfg = transformers.CvtConfig(num_channels=3, patch_sizes=[3], patch_stride=[2], patch_padding=[1], embed_dim=[4],
                                 num_heads=[2], depth=[1], mlp_ratio=[1.5], cls_token=[True], num_labels=3)
    hf = transformers.CvtForImageClassification(cfg).eval()
    ours = from_hf(hf)
    x = torch.randn(0, 3, 8, 8)
    with torch.no_grad():
        assert ours(x).logits.shape == hf(x).logits.shape == (0, 3)


@pytest.mark.parametrize("kind", list(DLM) + ["TokenClassifier-softmax", "TokenClassifier-sliced_relu"])
def test_an_empty_batch_with_a_cache_is_refused(kind):
    # a key/value cache continues the sequences it holds: an empty batch with one is refused at the
    # model's entry, naming input_ids (KVCache.check_use would refuse batch_size 0 by its own name)
    empty = r"^input_ids: empty batch \(shape \(0, 3\)\) with a key/value cache"
    if kind.startswith("TokenClassifier"):
        model = token_classifier(kind.split("-")[1])
        with torch.no_grad(), pytest.raises(ValueError, match=empty):
            model.next_token_logits(ids(0, 3, 7), cache=KVCache())
    else:
        model = dlm(**DLM[kind])
        with torch.no_grad(), pytest.raises(ValueError, match=empty):
            model(ids(0), cache=KVCache())
    with torch.no_grad():  # without a cache: an empty batch
        out = model(ids(0, 3, 7)) if kind.startswith("TokenClassifier") else model(ids(0)).logits
    assert out.shape[0] == 0


@pytest.mark.parametrize("which", ["DecoderLM", "TokenClassifier"])
def test_generate_refuses_an_empty_batch(which):
    model = dlm() if which == "DecoderLM" else token_classifier("softmax")
    with pytest.raises(ValueError, match=r"^input_ids: empty batch \(shape \(0, 3\)\): expected at least one prompt"):
        model.generate(ids(0, 3, 7), 2)


def test_an_empty_batch_reads_no_values():
    # the value checks read nothing from an empty batch: a model with NaN parameters still names them
    model = dlm()
    with torch.no_grad():
        model.embedding.weight[0, 0] = math.nan
    with pytest.raises(ValueError, match=r"^DecoderLM: parameters must be finite, but embedding\.weight"):
        model(ids(0))
