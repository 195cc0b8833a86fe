"""Bad input to the neural-operator pieces and the Burgers data: a grid the model cannot take
(too few nodes for its Fourier modes, a non-periodic rule), NaN/inf fields, a non-periodic
field where periodicity is assumed, wrong shapes and types, a truncated or edited cache
file, a resolution the data cannot be subsampled to."""

import tempfile
from pathlib import Path

import pytest
import torch

from opsplit import Grid
from opsplit.data import load_burgers
from opsplit.data.burgers import BurgersCacheError
from opsplit.grid import Interval
from opsplit.models import IntegralPatchEmbedding, NeuralOperatorTransformer, PatchEmbedding
from opsplit.models.integral_patch import PixelQuadrature
from opsplit.operators import FourierMultiplier, GalerkinAttention, Lifting, SpectralConvolution

from ._table import cases, run_case


def _model():
    return NeuralOperatorTransformer("galerkin", "lie", d_model=4, heads=2, n_steps=1, modes=4, d_ff=4, hidden=4,
                                     generator=torch.Generator().manual_seed(0))


def _field(n=16, B=2):
    x = torch.arange(n) / n
    return torch.stack([torch.sin(2 * torch.pi * x), torch.cos(4 * torch.pi * x)])[:B]


def _with(value, n=16, where=(0, 3)):
    u = _field(n)
    u[where] = value
    return u


def _conv(n, rule="left"):
    op = SpectralConvolution.create(3, 5)
    return op(torch.randn(1, n, 3), grid=Grid(x=Interval(n=n, length=1.0, rule=rule), y=Interval.paper(3)))


def _cache(edit):
    """A tiny cached data set, edited by ``edit(npz_path, json_path)``, then loaded with
    ``on_corrupt="error"``."""
    d = Path(tempfile.mkdtemp(prefix="opsplit-burgers-"))
    kw = dict(n_train=2, n_test=1, points=64, n_steps=40, cache_dir=d)
    load_burgers(16, **kw)
    edit(next(d.glob("*.npz")), next(d.glob("*.json")))
    return load_burgers(16, on_corrupt="error", **kw)


def _truncate(npz, meta):
    raw = npz.read_bytes()
    npz.write_bytes(raw[: len(raw) - 100])


def _flip_byte(npz, meta):
    raw = bytearray(npz.read_bytes())
    raw[len(raw) // 2] ^= 1
    npz.write_bytes(bytes(raw))


def _drop_meta(npz, meta):
    meta.write_text("{not json")


CASES = cases(
    ("model-too-few-nodes", lambda: _model()(_field(6)), ValueError, r"N_x = 6 nodes; this model needs N_x >= 7"),
    ("model-nan-field", lambda: _model()(_with(float("nan"))), ValueError, r"u: expected finite values, found 1 NaN"),
    ("model-inf-field", lambda: _model()(_with(float("inf"))), ValueError, r"u: expected finite values"),
    ("model-non-periodic-field", lambda: _model()(torch.linspace(0, 1, 16).expand(2, 16) + 0.0), ValueError,
     r"expected a periodic field .* jumps by .* across the seam"),
    ("model-both-ends-sampled",
     lambda: _model()(torch.sin(2 * torch.pi * torch.linspace(0, 1, 16)).expand(2, 16) + 0.0), ValueError,
     r"first and last samples are equal .* drop the last node"),
    ("model-rank-4", lambda: _model()(torch.zeros(1, 2, 16, 1)), ValueError, r"u: expected a field of shape \(B, N_x\)"),
    ("model-two-channels", lambda: _model()(torch.zeros(2, 16, 2)), ValueError, r"expected 1 channel"),
    ("model-int-field", lambda: _model()(torch.zeros(2, 16, dtype=torch.long)), TypeError, r"floating-point"),
    ("model-float64-field", lambda: _model()(_field().double()), TypeError, r"expected a torch.float32 tensor"),
    ("model-attention-name", lambda: NeuralOperatorTransformer("linear"), ValueError,
     r"attention: expected one of \('galerkin', 'fourier', 'softmax', 'none'\)"),
    ("model-heads-divide", lambda: NeuralOperatorTransformer(d_model=6, heads=4), ValueError,
     r"d_model = 6 is not divisible by heads = 4"),
    ("spectral-too-few-nodes", lambda: _conv(8), ValueError, r"N_x = 8 nodes; the operator needs N_x >= 9"),
    ("spectral-trapezoid-grid", lambda: _conv(16, "trapezoid"), ValueError, r"trapezoid rule .* not periodic"),
    ("spectral-weight-shape", lambda: SpectralConvolution(torch.zeros(3, 4, 2, 2)), ValueError,
     r"weight: expected shape \(2, M \+ 1, N_y, N_y\)"),
    ("spectral-channels", lambda: SpectralConvolution.create(3, 2)(torch.zeros(1, 8, 4)), ValueError,
     r"kernel acts on N_y = 3 features, the grid has N_y = 4"),
    ("galerkin-norm-shape", lambda: GalerkinAttention(torch.zeros(4, 2, 2), torch.zeros(4, 2, 2), torch.zeros(4, 2, 2),
                                                      torch.zeros(2, 2, 4), norm_weights=(torch.ones(2, 3), None)),
     ValueError, r"gamma_k: expected shape \(H, d\) = \(2, 2\)"),
    ("galerkin-norm-not-pair", lambda: GalerkinAttention(torch.zeros(4, 2, 2), torch.zeros(4, 2, 2),
                                                         torch.zeros(4, 2, 2), torch.zeros(2, 2, 4),
                                                         norm_weights=torch.ones(2, 2)),
     TypeError, r"norm_weights: expected a pair"),
    ("galerkin-eps", lambda: GalerkinAttention.create(4, 2, eps=0.0), ValueError, r"eps: expected a finite number > 0"),
    ("model-output-modes-nodes",
     lambda: NeuralOperatorTransformer("none", "lie", d_model=4, heads=1, modes=4, output_modes=6)(_field(10)),
     ValueError, r"N_x = 10 nodes; this model needs N_x >= 11"),
    ("model-output-modes-zero", lambda: NeuralOperatorTransformer(output_modes=0), ValueError, r"output_modes"),
    ("multiplier-too-few-nodes", lambda: FourierMultiplier(8)(torch.zeros(1, 14)), ValueError,
     r"N_x = 14 nodes; the multiplier keeps the modes \|m\| <= 7 and needs N_x >= 15"),
    ("multiplier-nan-field", lambda: FourierMultiplier(4)(_with(float("nan"))), ValueError,
     r"FourierMultiplier input: expected finite values, found 1 NaN"),
    ("multiplier-channels", lambda: FourierMultiplier(4, 2)(torch.zeros(1, 16, 3)), ValueError,
     r"expected shape \(B, N_x, 2\)"),
    ("multiplier-int-field", lambda: FourierMultiplier(4)(torch.zeros(1, 16, dtype=torch.long)), TypeError,
     r"floating-point"),
    ("multiplier-modes", lambda: FourierMultiplier(0), ValueError, r"FourierMultiplier.modes"),
    ("lifting-trapezoid", lambda: Lifting(1, 4, rule="trapezoid"), ValueError, r"periodic grid"),
    ("data-resolution-divides", lambda: load_burgers(300, n_train=1, n_test=1, points=64), ValueError,
     r"resolution: expected a divisor of points = 64 .* got 300"),
    ("data-points-odd", lambda: load_burgers(9, points=63), ValueError, r"points: expected an even number"),
    ("data-on-corrupt", lambda: load_burgers(16, points=32, on_corrupt="ignore"), ValueError,
     r"on_corrupt: expected 'regenerate' or 'error'"),
    ("data-cache-truncated", lambda: _cache(_truncate), BurgersCacheError, r"checksum mismatch .* truncated or edited"),
    ("data-cache-edited", lambda: _cache(_flip_byte), BurgersCacheError, r"checksum mismatch"),
    ("data-cache-metadata", lambda: _cache(_drop_meta), BurgersCacheError, r"unreadable metadata"),
    ("pixel-quadrature-rank", lambda: PixelQuadrature(8)(torch.zeros(8, 8)), ValueError, r"expected shape \(B, C, H, W\)"),
    ("integral-patch-not-embedding", lambda: IntegralPatchEmbedding.from_patch_embedding(torch.nn.Linear(2, 2)),
     TypeError, r"expected a PatchEmbedding"),
    ("integral-patch-channels",
     lambda: IntegralPatchEmbedding.from_patch_embedding(PatchEmbedding(8, 2, 1, 4))(torch.zeros(1, 2, 16, 16)),
     ValueError, r"expected 1 channels"),
)


@pytest.mark.parametrize("case", CASES)
def test_bad_input(case):
    run_case(case)
