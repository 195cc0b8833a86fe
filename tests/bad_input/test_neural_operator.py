"""Bad input to the neural-operator model and its pieces, and to the image embeddings: a
non-finite parameter (written in place, or through ``.data`` after a first call) is named by
its qualified name before any output; a NaN/inf in the input of the projection, the patch
embeddings, the pixel quadrature and the class-token read-out is refused, naming the
argument, before it spreads (one NaN pixel of a 16x16 image made 16 of the 17 tokens of the
integral patch embedding NaN)."""

import math

import pytest
import torch

from opsplit.models import (
    ClassTokenReadout,
    CvT,
    CvtStageSpec,
    IntegralPatchEmbedding,
    NeuralOperatorTransformer,
    OnPixelGrid,
    PatchEmbedding,
    PixelQuadrature,
)
from opsplit.operators import FourierMultiplier, Lifting, Projection

from ._table import F64, INF, NAN, cases, run_case


def field(n=8, B=2):
    x = torch.arange(n, dtype=F64) / n
    return torch.stack([torch.sin(2 * math.pi * (k + 1) * x) for k in range(B)])


def model(attention="galerkin", **kw):
    kw = {**dict(d_model=4, heads=2, n_steps=2, modes=3, d_ff=6, n_freq=1, hidden=5, output_modes=3,
                 generator=torch.Generator().manual_seed(0), dtype=F64), **kw}
    return NeuralOperatorTransformer(attention, **kw)


def poke(module, name, value=NAN, *, data=False, first=None):
    """``module`` with ``value`` written into the last entry of its parameter ``name`` (in
    place, or through ``.data`` after one call ``first(module)``, so that the cached check has
    seen the finite parameters)."""
    if first is not None:
        with torch.no_grad():
            first(module)
    p = dict(module.named_parameters())[name]
    with torch.no_grad():
        (p.data if data else p).view(-1)[-1] = value
    return module


def not_call(name, value=NAN, *, data=False, **kw):
    m = model(**kw)
    return lambda: poke(m, name, value, data=data, first=lambda m: m(field()))(field())


def pixels(n, at=None, value=NAN, C=1):
    x = torch.randn(2, C, n, n, dtype=F64)
    if at is not None:
        x[at] = value
    return x


def cvt():
    specs = [CvtStageSpec(3, 4, 1, 2, patch_size=3, patch_stride=2, patch_padding=1, mlp_hidden=6)]
    return CvT(3, specs, num_labels=3, dtype=F64)


PROJ = "projection.fc2.weight"
CONV = "propagator.scheme.substeps.0.terms.0.weight.pieces.1"

CASES = cases(
    # finding 5: a non-finite parameter of NeuralOperatorTransformer outside the propagator gave NaN
    # outputs with no error (the projection), or was blamed on the input (the lifting: "f: expected
    # finite values"); now every parameter is named by its qualified name
    ("not-projection-nan", not_call(PROJ), ValueError,
     r"^NeuralOperatorTransformer: parameters must be finite, but projection\.fc2\.weight hold\(s\) NaN/inf"),
    ("not-projection-inf", not_call("projection.fc1.bias", INF), ValueError,
     r"^NeuralOperatorTransformer: parameters must be finite, but projection\.fc1\.bias hold"),
    ("not-lifting-nan", not_call("lifting.linear.weight"), ValueError,
     r"^NeuralOperatorTransformer: parameters must be finite, but lifting\.linear\.weight hold"),
    ("not-lifting-bias-inf", not_call("lifting.linear.bias", -INF), ValueError,
     r"^NeuralOperatorTransformer: parameters must be finite, but lifting\.linear\.bias hold"),
    ("not-output-filter-nan", not_call("output_filter.factors"), ValueError,
     r"^NeuralOperatorTransformer: parameters must be finite, but output_filter\.factors hold"),
    ("not-propagator-nan", not_call(CONV), ValueError,
     rf"^NeuralOperatorTransformer: parameters must be finite, but {CONV.replace('.', r'[.]')} hold"),
    # written through .data after a first call (no version change: the cached check passes, the
    # non-finite output re-reads every parameter and names it)
    ("not-projection-nan-data", not_call(PROJ, data=True), ValueError,
     r"^NeuralOperatorTransformer: parameters must be finite, but projection\.fc2\.weight hold.*through \.data"),
    ("not-lifting-nan-data", not_call("lifting.linear.weight", data=True, attention="softmax"), ValueError,
     r"^NeuralOperatorTransformer: parameters must be finite, but lifting\.linear\.weight hold"),
    ("not-filter-inf-data", not_call("output_filter.factors", INF, data=True, attention="none"), ValueError,
     r"^NeuralOperatorTransformer: parameters must be finite, but output_filter\.factors hold"),
    ("not-map-conv-nan-data", not_call("propagator.scheme.substeps.0.terms.0.local.pieces.0", data=True,
                                       nonlinearity="map", output_modes=None), ValueError,
     r"^NeuralOperatorTransformer: parameters must be finite, but propagator\.scheme\.substeps\.0\.terms\.0\.local"),
    # the pieces on their own
    ("lifting-weight-nan", lambda: poke(Lifting(1, 4, dtype=F64), "linear.weight")(field()), ValueError,
     r"^Lifting: parameters must be finite, but linear\.weight hold"),
    ("projection-weight-nan", lambda: poke(Projection(4, 5, dtype=F64), "fc1.weight")(torch.randn(2, 8, 4, dtype=F64)),
     ValueError, r"^Projection: parameters must be finite, but fc1\.weight hold"),
    ("multiplier-factors-nan", lambda: poke(FourierMultiplier(3, dtype=F64), "factors")(field()), ValueError,
     r"^FourierMultiplier: parameters must be finite, but factors hold"),
    # finding 6: the projection passed a NaN/inf input through unchecked (the lifting and the
    # multiplier refuse one)
    ("projection-input-nan", lambda: Projection(4, 5, dtype=F64)(_with(torch.randn(2, 8, 4, dtype=F64), (1, 3, 2), NAN)),
     ValueError, r"^Projection input: expected finite values, found 1 NaN/inf"),
    ("projection-input-inf", lambda: Projection(4, 5, dtype=F64)(_with(torch.randn(2, 8, 4, dtype=F64), (0, 0, 0), INF)),
     ValueError, r"^Projection input: expected finite values, found 1 NaN/inf"),
    ("projection-input-int", lambda: Projection(4, 5)(torch.zeros(2, 8, 4, dtype=torch.long)), TypeError,
     r"^Projection input: expected a floating-point tensor"),
    ("projection-input-dtype", lambda: Projection(4, 5, dtype=F64)(torch.zeros(2, 8, 4)), TypeError,
     r"^Projection input: expected a torch\.float64 tensor"),
    ("projection-input-list", lambda: Projection(4, 5)([[0.0] * 4]), TypeError, r"^Projection input: expected a torch"),
    # finding 6: one NaN pixel of a 16x16 image made 16 of the 17 tokens of the integral patch
    # embedding NaN (1 of 17 on its 8x8 reference grid), with no error
    ("integral-patch-nan-16", lambda: IntegralPatchEmbedding(8, 4, 1, 4, dtype=F64)(pixels(16, (0, 0, 5, 7))),
     ValueError, r"^pixel_values: expected finite values, found 1 NaN/inf"),
    ("integral-patch-nan-8", lambda: IntegralPatchEmbedding(8, 4, 1, 4, dtype=F64)(pixels(8, (1, 0, 0, 0))),
     ValueError, r"^pixel_values: expected finite values, found 1 NaN/inf"),
    ("integral-patch-inf-12", lambda: IntegralPatchEmbedding(8, 4, 1, 4, dtype=F64)(pixels(12, (0, 0, 11, 11), -INF)),
     ValueError, r"^pixel_values: expected finite values, found 1 NaN/inf"),
    ("patch-nan", lambda: PatchEmbedding(8, 4, 1, 4, dtype=F64)(pixels(8, (0, 0, 3, 3))), ValueError,
     r"^pixel_values: expected finite values, found 1 NaN/inf"),
    ("patch-weight-nan", lambda: poke(PatchEmbedding(8, 4, 1, 4, dtype=F64), "weight")(pixels(8)), ValueError,
     r"^PatchEmbedding: parameters must be finite, but weight hold"),
    ("integral-patch-position-inf", lambda: poke(IntegralPatchEmbedding(8, 4, 1, 4, dtype=F64), "position", INF)(
        pixels(16)), ValueError, r"^IntegralPatchEmbedding: parameters must be finite, but position hold"),
    ("quadrature-nan", lambda: PixelQuadrature(8)(pixels(16, (0, 0, 0, 1))), ValueError,
     r"^PixelQuadrature: images: expected finite values, found 1 NaN/inf"),
    ("on-pixel-grid-nan", lambda: OnPixelGrid(cvt(), 8)(pixels(12, (0, 2, 4, 4), C=3)), ValueError,
     r"^PixelQuadrature: images: expected finite values, found 1 NaN/inf"),
    ("on-pixel-grid-param-nan", lambda: poke(OnPixelGrid(cvt(), 8), "model.readout.weight")(pixels(12, C=3)),
     ValueError, r"^OnPixelGrid: parameters must be finite, but model\.readout\.weight hold"),
    ("readout-class-token-nan", lambda: ClassTokenReadout(4, 3, dtype=F64)(_with(torch.randn(2, 3, 4, dtype=F64),
                                                                                  (1, 0, 2), NAN)),
     ValueError, r"^ClassTokenReadout: u: expected finite values, found 1 NaN/inf"),
    ("readout-weight-nan", lambda: poke(ClassTokenReadout(4, 3, dtype=F64), "bias")(torch.randn(2, 3, 4, dtype=F64)),
     ValueError, r"^ClassTokenReadout: parameters must be finite, but bias hold"),
)


def _with(x, at, value):
    x[at] = value
    return x


@pytest.mark.parametrize("case", CASES)
def test_bad_input(case):
    run_case(case)
