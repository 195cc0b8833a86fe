"""Every model the library builds refuses a non-finite parameter by its qualified name, before
producing any output.

For each model of :data:`MODELS` (tiny: the whole file runs in seconds) and each of its
floating parameters and buffers, a NaN and an inf are written into one entry chosen at
random (seeded); the forward must raise a ``ValueError`` from
:func:`opsplit._checks.check_parameters_finite` (not a symptom: an attention-score overflow,
a NaN input of a later map, a NaN output) whose message starts with the model's name and
names exactly that tensor.  The causal decoders are also swept through ``generate``, with the
value written through ``.data`` after a first generation (no version-counter change:
``generate`` re-reads every parameter at its start).

A write through ``.data`` into a model that has already checked its parameters is not seen by
the cached check; :func:`test_a_nan_written_through_data_is_named_or_harmless` asserts what the
library promises there: the call either names the tensor (the NaN reached a checked value and
every parameter was re-read) or returns exactly the output of the unmodified model (the entry
was not used, e.g. the embedding row of a token the input does not hold).
"""

from __future__ import annotations

import math
import os
import random

import pytest
import torch

import opsplit
from opsplit import Grid, Interval
from opsplit.models import (
    ATTENTIONS,
    AttentionDecoder,
    AttentionNeuralOperator,
    ClassTokenReadout,
    ContinuousTransformer,
    CvT,
    CvtStageSpec,
    DecoderConfig,
    DecoderLM,
    ImageClassifier,
    IntegralPatchEmbedding,
    NeuralOperatorTransformer,
    OnPixelGrid,
    PaperTransformer,
    PatchEmbedding,
    SequenceForecaster,
    SplitEncoder,
    TokenClassifier,
    TorchDecoder,
    TorchEncoder,
    ViT,
    one_head_cvt,
)
from opsplit.operators import (
    FeedForward,
    FourierMultiplier,
    GalerkinAttention,
    GatedFeedForward,
    GroupedQueryAttention,
    KernelAttention,
    Lifting,
    MultiHeadAttention,
    Projection,
    SlicedReLUAttention,
    SoftmaxAttention,
    SpectralConvolution,
)

F64 = torch.float64
_CHECKS = os.path.join(os.path.dirname(os.path.abspath(opsplit.__file__)), "_checks.py")


def _g(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def periodic(B: int, n: int = 8) -> torch.Tensor:
    """``B`` smooth periodic samples on ``n`` nodes of [0, 1) (the lifting's seam check passes)."""
    x = torch.arange(n, dtype=F64) / n
    k = torch.arange(B, dtype=F64)[:, None]
    return torch.sin(2 * math.pi * (k + 1) * x) + 0.1 * k


def ids(B: int, N: int = 3, vocab: int = 11) -> torch.Tensor:
    return (torch.arange(B * N).reshape(B, N) * 3 + 1) % vocab


def _randn(*shape):
    return torch.randn(*shape, generator=_g(sum(shape) + len(shape)), dtype=F64)


def tiny_cvt() -> CvT:
    specs = [CvtStageSpec(3, 4, 1, 2, patch_size=3, patch_stride=2, patch_padding=1, mlp_hidden=6),
             CvtStageSpec(4, 4, 1, 2, patch_size=3, patch_stride=2, patch_padding=1, cls_token=True, mlp_hidden=6)]
    torch.manual_seed(0)
    return CvT(3, specs, num_labels=3, dtype=F64)


def vit() -> ViT:
    torch.manual_seed(0)
    emb = PatchEmbedding(8, 4, 1, 4, dtype=F64)
    enc = TorchEncoder(4, 2, dim_feedforward=8, batch_first=True, dropout=0.0, norm_first=True, activation="gelu",
                       final_norm=True, dtype=F64)
    return ViT(emb, enc, ClassTokenReadout(4, 4, activation="tanh", dtype=F64), ClassTokenReadout(4, 3, dtype=F64))


DLM = {
    "gpt2": dict(norm="layer", mlp="plain", activation="gelu_tanh", positions="learned", max_positions=16,
                 qkv_bias=True, out_bias=True, mlp_bias=True, norm_bias=True, tie_embeddings=True),
    "llama-gqa": dict(n_heads=4, n_kv_heads=2, d_model=8),
    "llama-strang": dict(scheme="strang"),
    "llama-parallel": dict(scheme="parallel", mlp_bias=True),
    "sliced": dict(attention="sliced_relu", positions="learned", max_positions=16),
    "sliced-parallel": dict(attention="sliced_relu", positions="learned", max_positions=16, scheme="parallel",
                            norm="layer", mlp="plain"),
}


def dlm(**kw) -> DecoderLM:
    cfg = {**dict(vocab_size=11, d_model=4, n_layers=2, n_heads=2, d_ff=6), **kw}
    return DecoderLM(DecoderConfig(**cfg), generator=_g(), dtype=F64).eval()


def token_classifier(att: str) -> TokenClassifier:
    return TokenClassifier(7, 7, AttentionDecoder(4, 2, 6, attention=att, generator=_g(), dtype=F64),
                           generator=_g(1), dtype=F64).eval()


def _logits(m, x):
    return m(x).logits


def _star(m, x):
    return m(*x)


#: name -> (build, input of a batch of B, call(model, input) -> output tensor)
MODELS: dict = {}


def _model(name, build, inp, call=None):
    MODELS[name] = (build, inp, call or (lambda m, x: m(x)))


_model("PaperTransformer", lambda: PaperTransformer(6, n_x=4, J=1, n_steps=2, dtype=F64), lambda B: _randn(B, 4, 6))
_model("ContinuousTransformer", lambda: ContinuousTransformer(2, J=1, n_steps=2, dtype=F64, generator=_g()),
       lambda B: _randn(B, 4, 5))
_model("TorchEncoder", lambda: TorchEncoder(4, 2, dim_feedforward=8, batch_first=True, dropout=0.0, num_layers=2,
                                            final_norm=True, dtype=F64), lambda B: _randn(B, 3, 4))
_model("TorchEncoder-unfused-norm-first", lambda: TorchEncoder(4, 2, dim_feedforward=8, batch_first=True, dropout=0.0,
                                                               norm_first=True, fused_norm=False, dtype=F64),
       lambda B: _randn(B, 3, 4))
_model("TorchDecoder", lambda: TorchDecoder(4, 2, dim_feedforward=8, batch_first=True, dropout=0.0, dtype=F64),
       lambda B: (_randn(B, 3, 4), _randn(B, 2, 4)), _star)
for _s in ("lie", "strang", "parallel", "hybrid"):
    _model(f"SplitEncoder-{_s}", lambda s=_s: SplitEncoder(4, 2, 6, n_steps=2, scheme=s, generator=_g(), dtype=F64),
           lambda B: _randn(B, 3, 4))
_model("SplitEncoder-legendre", lambda: SplitEncoder(4, 2, 6, n_steps=2, control="legendre", n_modes=2, generator=_g(),
                                                     dtype=F64), lambda B: _randn(B, 3, 4))
_model("ImageClassifier", lambda: ImageClassifier(8, 4, 1, 3, SplitEncoder(4, 2, 6, n_steps=2, generator=_g(),
                                                                           dtype=F64), dtype=F64),
       lambda B: _randn(B, 1, 8, 8))
_model("SequenceForecaster", lambda: SequenceForecaster(5, SplitEncoder(4, 2, 6, n_steps=2, causal=True, generator=_g(),
                                                                        dtype=F64), delay=2, dtype=F64),
       lambda B: _randn(B, 5))
_model("SequenceForecaster-sinusoidal", lambda: SequenceForecaster(5, SplitEncoder(4, 2, 6, n_steps=2, causal=True,
                                                                                   generator=_g(), dtype=F64),
                                                                   positions="sinusoidal", dtype=F64),
       lambda B: _randn(B, 5))
for _a in ATTENTIONS:
    _model(f"AttentionDecoder-{_a}", lambda a=_a: AttentionDecoder(4, 2, 6, attention=a, generator=_g(), dtype=F64),
           lambda B: _randn(B, 3, 4))
    _model(f"TokenClassifier-{_a}", lambda a=_a: token_classifier(a), lambda B: ids(B, 3, 7))
_model("ViT", vit, lambda B: _randn(B, 1, 8, 8), _logits)
_model("CvT", tiny_cvt, lambda B: _randn(B, 3, 8, 8), _logits)
_model("OnPixelGrid-CvT", lambda: OnPixelGrid(tiny_cvt(), 8), lambda B: _randn(B, 3, 12, 12), _logits)
_model("one_head_cvt", lambda: one_head_cvt((3, 3), 4, dtype=F64), lambda B: _randn(B, 9, 4))
_model("PatchEmbedding", lambda: PatchEmbedding(8, 4, 1, 4, dtype=F64), lambda B: _randn(B, 1, 8, 8))
_model("IntegralPatchEmbedding", lambda: IntegralPatchEmbedding(8, 4, 1, 4, dtype=F64), lambda B: _randn(B, 1, 16, 16))
_model("ClassTokenReadout", lambda: ClassTokenReadout(4, 3, dtype=F64), lambda B: _randn(B, 3, 4))
for _k, _kw in DLM.items():
    _model(f"DecoderLM-{_k}", lambda kw=_kw: dlm(**kw), lambda B: ids(B), _logits)
for _a in ("galerkin", "fourier", "softmax", "none"):
    for _nl in ("ffn", "map"):
        _model(f"NeuralOperatorTransformer-{_a}-{_nl}",
               lambda a=_a, nl=_nl: NeuralOperatorTransformer(
                   a, "strang" if nl == "ffn" else "lie", d_model=4, heads=2, n_steps=2, modes=3, d_ff=6, n_freq=1,
                   hidden=5, nonlinearity=nl, output_modes=3 if nl == "ffn" else None, out_channels=1 if nl == "ffn"
                   else 2, generator=_g(), dtype=F64),
               lambda B: periodic(B))
for _a in ("galerkin", "fourier", "none"):
    _model(f"AttentionNeuralOperator-1d-{_a}",
           lambda a=_a: AttentionNeuralOperator(1, a, d_model=4, head_dim=2, modes=3, hidden=3, n_freq=1, proj_hidden=5,
                                                latent=6, output_modes=3, generator=_g(), dtype=F64),
           lambda B: periodic(B))
_model("AttentionNeuralOperator-2d", lambda: AttentionNeuralOperator(2, d_model=4, head_dim=2, modes=3, hidden=2,
                                                                      proj_hidden=4, dirichlet=True, generator=_g(),
                                                                      dtype=F64),
       lambda B: _randn(B, 15, 15))
_model("Lifting", lambda: Lifting(1, 4, n_freq=2, dtype=F64), lambda B: periodic(B))
_model("Projection", lambda: Projection(4, 5, 2, dtype=F64), lambda B: _randn(B, 8, 4))
_model("FourierMultiplier", lambda: FourierMultiplier(3, 2, dtype=F64), lambda B: _randn(B, 8, 2))

#: the causal decoders, swept through generate too
GENERATORS = [n for n in MODELS if n.startswith("DecoderLM") or n in
              ("TokenClassifier-softmax", "TokenClassifier-sliced_relu", "TokenClassifier-sliced_bump",
               "TokenClassifier-none")]


def tensors(model) -> list:
    """The floating parameters and buffers, by qualified name (what the check reads)."""
    named = list(model.named_parameters()) + list(model.named_buffers())
    return [(n, t) for n, t in named if t.is_floating_point() and t.numel() > 0]


def _expect_named(model, name, call):
    what = type(model).__name__
    with pytest.raises(ValueError) as info:
        call()
    msg = str(info.value)
    assert msg.startswith(f"{what}: parameters must be finite, but {name} hold(s) NaN/inf"), (name, msg)
    # raised by the parameter check itself, not by a check of a value the parameter spoiled
    frame = info.traceback[-1]
    assert os.path.abspath(str(frame.path)) == _CHECKS and frame.name == "check_parameters_finite", (name, msg)


def _write(t, value, rng, *, data=False):
    """Write ``value`` into one entry of ``t`` chosen by ``rng``; return the restoring function."""
    flat = (t.data if data else t).view(-1)
    i = rng.randrange(flat.numel())
    old = flat[i].item()
    with torch.no_grad():
        flat[i] = value

    def restore():
        with torch.no_grad():
            t.view(-1)[i] = old  # (in place: the version changes, the next call re-reads)

    return restore


@pytest.mark.parametrize("name", list(MODELS))
def test_every_parameter_is_named_when_not_finite(name):
    build, inp, call = MODELS[name]
    model = build()
    x = inp(2)
    with torch.no_grad():
        clean = call(model, x)
    assert torch.isfinite(clean).all()
    rng = random.Random(name)
    swept = tensors(model)
    assert swept
    for pname, t in swept:
        for value in (float("nan"), float("inf")):
            restore = _write(t, value, rng)
            _expect_named(model, pname, lambda: call(model, x))
            restore()
    with torch.no_grad():  # restored: the model runs again, with the same output
        torch.testing.assert_close(call(model, x), clean, rtol=0, atol=0)


@pytest.mark.parametrize("name", GENERATORS)
def test_generate_names_a_parameter_written_through_data(name):
    build, inp, _ = MODELS[name]
    model = build()
    prompt = inp(2)
    clean = model.generate(prompt, 2)  # the cached check has seen every parameter finite
    rng = random.Random("generate " + name)
    for pname, t in tensors(model):
        value = rng.choice([float("nan"), float("inf"), float("-inf")])
        restore = _write(t, value, rng, data=True)
        _expect_named(model, pname, lambda: model.generate(prompt, 2))
        restore()
    assert torch.equal(model.generate(prompt, 2), clean)


@pytest.mark.parametrize("name", list(MODELS))
def test_a_nan_written_through_data_is_named_or_harmless(name):
    build, inp, call = MODELS[name]
    model = build()
    x = inp(2)
    with torch.no_grad():
        clean = call(model, x)  # the cached check has seen every parameter finite
    rng = random.Random("data " + name)
    for pname, t in tensors(model):
        restore = _write(t, float("nan"), rng, data=True)
        try:
            with torch.no_grad():
                out = call(model, x)
        except ValueError as e:
            named = str(e).startswith(f"{type(model).__name__}: parameters must be finite, but {pname} hold")
            assert named, (pname, e)
        else:  # the entry took no part in this call: exactly the clean output, never a silent NaN
            torch.testing.assert_close(out, clean, rtol=0, atol=0, msg=lambda m, p=pname: f"{p}: {m}")
        restore()


#: operators called on their own (``op(u, grid=...)``): name -> (build, input of a batch of 2, grid)
_PERIODIC = Grid(x=Interval(length=1.0, rule="left"), y=Interval.paper(4))
OPERATORS = {
    "MultiHeadAttention": (lambda: MultiHeadAttention.create(4, 2, dtype=F64), lambda: _randn(2, 3, 4), None),
    "GroupedQueryAttention": (lambda: GroupedQueryAttention.create(4, 2, 1, causal=True, dtype=F64),
                              lambda: _randn(2, 3, 4), None),
    "SoftmaxAttention": (lambda: SoftmaxAttention(_randn(4, 4), _randn(4, 4), _randn(4, 4)), lambda: _randn(2, 3, 4),
                         None),
    "KernelAttention": (lambda: KernelAttention(_randn(4, 4), _randn(4, 4), _randn(4, 4)), lambda: _randn(2, 3, 4),
                        None),
    "GalerkinAttention": (lambda: GalerkinAttention.create(4, 2, dtype=F64), lambda: _randn(2, 8, 4), _PERIODIC),
    "SpectralConvolution": (lambda: SpectralConvolution.create(4, 3, bias=True, local=True, dtype=F64),
                            lambda: _randn(2, 8, 4), _PERIODIC),
    "FeedForward": (lambda: FeedForward.create(4, 6, dtype=F64), lambda: _randn(2, 3, 4), None),
    "GatedFeedForward": (lambda: GatedFeedForward.create(4, 6, dtype=F64), lambda: _randn(2, 3, 4), None),
    "SlicedReLUAttention": (lambda: SlicedReLUAttention.build(4, 2, causal=True, dtype=F64), lambda: _randn(2, 3, 4),
                            None),
}


@pytest.mark.parametrize("name", list(OPERATORS))
def test_an_operator_names_a_parameter_written_through_data(name):
    """``op(u)`` checks the parameters (cached) before the call, and re-reads them when the call
    raises a ``ValueError`` (an attention-score check) or returns a non-finite value."""
    build, inp, grid = OPERATORS[name]
    op = build()
    u = inp()
    with torch.no_grad():
        clean = op(u, grid=grid)
    rng = random.Random("operator " + name)
    for pname, t in tensors(op):
        restore = _write(t, float("nan"), rng, data=True)
        try:
            with torch.no_grad():
                out = op(u, grid=grid)
        except ValueError as e:
            assert str(e).startswith(f"{type(op).__name__}: parameters must be finite, but {pname} hold"), (pname, e)
        else:
            torch.testing.assert_close(out, clean, rtol=0, atol=0, msg=lambda m, p=pname: f"{p}: {m}")
        restore()
