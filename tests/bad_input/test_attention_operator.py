"""Bad input to the continuous-time attention neural operator and its terms: settings out of
range (dims, attention, solver, a latent grid that cannot carry the kernel's modes, a padding
that is no rational length, 1-D options on the 2-D model), fields that are not square, too
small, on a grid whose box has no whole number of nodes, with NaN, of another dtype or with a
wrong channel count, N_t < 1; the gated spectral term's shapes and grids; a FieldSum of
nothing, of a non-operator, of a term without a field."""

import math

import pytest
import torch

from opsplit import Grid
from opsplit.grid import ImageGrid, Interval
from opsplit.models import AttentionNeuralOperator
from opsplit.operators import FieldSum, ProjectionS2, SpectralGatedFeedForward

from ._table import cases, run_case


def _m1(**kw):
    return AttentionNeuralOperator(1, d_model=4, head_dim=2, modes=3, hidden=2, proj_hidden=4, n_freq=1, **kw)


def _m2(**kw):
    return AttentionNeuralOperator(2, d_model=4, head_dim=2, modes=3, hidden=2, proj_hidden=4, **kw)


def _with_nan(shape):
    u = torch.randn(*shape)
    u.view(-1)[3] = float("nan")
    return u


def _g1(n, d=2):
    return Grid(x=Interval(n=n, length=1.0, rule="left"), y=Interval.paper(d))


def _g2(n1, n2, d=2):
    return ImageGrid._build(Interval(n=n1, length=1.0, rule="left"), Interval(n=n2, length=1.0, rule="left"),
                            Interval.paper(d), None, 0)


ROWS = cases(
    ("ano-dims", lambda: AttentionNeuralOperator(3), ValueError, r"^AttentionNeuralOperator\.dims: expected 1 or 2"),
    ("ano-attention", lambda: AttentionNeuralOperator(1, "softmax"), ValueError,
     r"^AttentionNeuralOperator\.attention: expected one of"),
    ("ano-solver", lambda: AttentionNeuralOperator(1, solver="rk5"), ValueError,
     r"^AttentionNeuralOperator\.solver: expected one of"),
    ("ano-latent-too-small", lambda: _m1(latent=4), ValueError, r"^AttentionNeuralOperator\.latent: expected at least 2 \* modes = 6"),
    ("ano-padding-irrational", lambda: _m2(padding=math.pi / 10), ValueError,
     r"^AttentionNeuralOperator\.padding: expected a rational length"),
    ("ano-padding-negative", lambda: _m2(padding=-0.1), ValueError, r"^AttentionNeuralOperator\.padding"),
    ("ano-2d-latent", lambda: _m2(latent=8), ValueError, r"^AttentionNeuralOperator: latent and output_modes"),
    ("ano-2d-dirichlet-type", lambda: _m2(dirichlet=1), TypeError, r"^AttentionNeuralOperator\.dirichlet"),
    ("ano-d-model-zero", lambda: AttentionNeuralOperator(1, d_model=0), ValueError,
     r"^AttentionNeuralOperator\.d_model"),
    ("ano-2d-not-square", lambda: _m2()(torch.randn(2, 15, 22)), ValueError, r"^u: expected a square grid"),
    ("ano-2d-box-not-whole", lambda: _m2()(torch.randn(2, 16, 16)), ValueError,
     r"^AttentionNeuralOperator: u: an 16 x 16 grid"),
    ("ano-2d-too-small", lambda: _m2()(torch.randn(2, 7, 7)), ValueError, r"^u: the grid has N = 7 nodes per side"),
    ("ano-2d-nan", lambda: _m2()(_with_nan((2, 15, 15))), ValueError, r"^u: expected finite values"),
    ("ano-2d-dtype", lambda: _m2()(torch.randn(2, 15, 15, dtype=torch.float64)), TypeError,
     r"^u: expected a torch.float32 tensor"),
    ("ano-2d-channels", lambda: _m2()(torch.randn(2, 15, 15, 3)), ValueError, r"^u: expected 1 channel"),
    ("ano-2d-rank", lambda: _m2()(torch.randn(15, 15)), ValueError, r"^u: expected a field on the unit square"),
    ("ano-1d-too-few-nodes", lambda: _m1()(torch.randn(2, 4)), ValueError, r"^u: the field has N_x = 4 nodes"),
    ("ano-1d-nan", lambda: _m1()(_with_nan((2, 16))), ValueError, r"^u: expected finite values"),
    ("ano-n-steps-zero", lambda: _m1()(torch.randn(2, 16), n_steps=0), ValueError, r"^n_steps \(N_t\)"),
    ("sg-weight-shape", lambda: SpectralGatedFeedForward(torch.zeros(2, 3, 4), torch.zeros(4, 4), torch.zeros(2, 4)),
     ValueError, r"^SpectralGatedFeedForward\.weight: expected shape"),
    ("sg-2d-rows", lambda: SpectralGatedFeedForward(torch.zeros(2, 4, 3, 2, 4), torch.zeros(2, 4), torch.zeros(2, 2)),
     ValueError, r"^SpectralGatedFeedForward\.weight: a 2-D kernel has 2M - 1 rows"),
    ("sg-W2-shape", lambda: SpectralGatedFeedForward(torch.zeros(2, 3, 2, 4), torch.zeros(2, 4), torch.zeros(4, 2)),
     ValueError, r"^SpectralGatedFeedForward\.W2: expected shape \(F, N_y\)"),
    ("sg-too-coarse", lambda: SpectralGatedFeedForward.create(2, 4)(torch.randn(1, 5, 2), grid=_g1(5)), ValueError,
     r"^SpectralGatedFeedForward: grid has N_x = 5|SpectralGatedFeedForward: the grid has N_x = 5"),
    ("sg-2d-on-1d-grid", lambda: SpectralGatedFeedForward.create(2, 2, dims=2)(torch.randn(1, 6, 2), grid=_g1(6)),
     ValueError, r"^SpectralGatedFeedForward: a 2-D kernel needs an ImageGrid"),
    ("sg-1d-on-2d-grid", lambda: SpectralGatedFeedForward.create(2, 2)(torch.randn(1, 12, 2), grid=_g2(4, 3)),
     ValueError, r"^SpectralGatedFeedForward: a 1-D kernel needs a 1-D grid"),
    ("sg-2d-too-coarse", lambda: SpectralGatedFeedForward.create(2, 3, dims=2)(torch.randn(1, 12, 2), grid=_g2(4, 3)),
     ValueError, r"^SpectralGatedFeedForward: the grid has 4 rows"),
    ("sg-dims", lambda: SpectralGatedFeedForward.create(2, 3, dims=3), ValueError,
     r"^SpectralGatedFeedForward\.create\.dims"),
    ("sg-modes", lambda: SpectralGatedFeedForward.create(2, 0), ValueError, r"^SpectralGatedFeedForward\.create\.modes"),
    ("sg-nan-input", lambda: SpectralGatedFeedForward.create(2, 2)(_with_nan((1, 6, 2)), grid=_g1(6)), ValueError,
     r"SpectralGatedFeedForward input: expected finite values"),
    ("fieldsum-empty", lambda: FieldSum(), ValueError, r"^FieldSum\.terms: expected at least one"),
    ("fieldsum-not-operator", lambda: FieldSum(torch.nn.Linear(2, 2)), TypeError, r"^FieldSum\.terms\[0\]"),
    ("fieldsum-no-field", lambda: FieldSum(ProjectionS2()), ValueError, r"^FieldSum\.terms\[0\]: ProjectionS2 has no"),
)


@pytest.mark.parametrize("case", ROWS)
def test_bad_input(case):
    run_case(case)
