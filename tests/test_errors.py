"""Bad input gets a clear error that names what was expected."""

import pytest
import torch

from opsplit import Grid, Propagator
from opsplit.controls import PiecewiseConstant
from opsplit.models import PaperTransformer
from opsplit.operators import FFNIntegral, ProjectionS1, ProjectionS2, SoftmaxAttention
from opsplit.schemes import Lie
from opsplit.solvers import ExplicitEuler, Implicit, SemiImplicit, Substep


@pytest.fixture
def model():
    torch.manual_seed(0)
    return PaperTransformer(6, n_x=4, J=2, n_steps=2, dtype=torch.float64)


def test_wrong_rank(model):
    with pytest.raises(ValueError, match=r"expected shape \(B, N_x, N_y\) = \(B, 4, 6\).*rank 4"):
        model(torch.zeros(1, 2, 4, 6, dtype=torch.float64))
    with pytest.raises(ValueError, match="rank 1"):
        model(torch.zeros(6, dtype=torch.float64))


def test_grid_tensor_mismatch(model):
    with pytest.raises(ValueError, match=r"grid/tensor mismatch.*\(\.\.\., 4, 6\).*\(\.\.\., 4, 5\)"):
        model(torch.zeros(2, 4, 5, dtype=torch.float64))
    with pytest.raises(ValueError, match="N_x differs"):
        model(torch.zeros(2, 3, 6, dtype=torch.float64))


def test_control_grid_mismatch():
    W = PiecewiseConstant(torch.zeros(1, 5, 5), axes=("y", "y"))
    prop = Propagator(Lie([SoftmaxAttention(W, W, W)]), 1)
    with pytest.raises(ValueError, match="SoftmaxAttention.WQ: grid/control mismatch on Omega_y"):
        prop(torch.zeros(2, 3, 4))
    ffn = FFNIntegral(torch.zeros(4, 4), torch.zeros(7), bias_axis="x")
    with pytest.raises(ValueError, match="FFNIntegral.b: grid/control mismatch on Omega_x"):
        Propagator(Lie([ffn]), 1)(torch.zeros(2, 3, 4))


def test_non_finite_input(model):
    f = torch.zeros(2, 4, 6, dtype=torch.float64)
    f[1, 2, 3] = float("nan")
    with pytest.raises(ValueError, match="expected finite values, found 1 NaN/inf"):
        model(f)
    f[1, 2, 3] = float("inf")
    with pytest.raises(ValueError, match="finite"):
        ProjectionS1()(f)


def test_non_float_and_non_tensor_input(model):
    with pytest.raises(TypeError, match="floating-point"):
        model(torch.zeros(2, 4, 6, dtype=torch.long))
    with pytest.raises(TypeError, match="torch.Tensor"):
        model([[0.0] * 6] * 4)


@pytest.mark.parametrize("n", [0, -3])
def test_n_steps_below_one(n, model):
    with pytest.raises(ValueError, match="N_t.*>= 1"):
        PaperTransformer(6, n_x=4, n_steps=n)
    with pytest.raises(ValueError, match="N_t.*>= 1"):
        Propagator(Lie([ProjectionS2()]), n)
    with pytest.raises(ValueError, match="N_t.*>= 1"):
        model(torch.zeros(1, 4, 6, dtype=torch.float64), n_steps=n)


def test_sigma2_not_positive():
    with pytest.raises(ValueError, match="sigma2"):
        PaperTransformer(6, n_x=4, sigma2=0.0)
    with pytest.raises(ValueError, match="> 0"):
        PiecewiseConstant(torch.tensor([1.0, -1.0]), positive=True)


def test_scheme_without_operators():
    with pytest.raises(ValueError, match="at least one operator"):
        Lie([])


def test_solver_that_cannot_advance_the_operator():
    with pytest.raises(ValueError, match="ExplicitEuler needs an operator with a field.*ProjectionS1.*'implicit'"):
        Substep(ProjectionS1(), ExplicitEuler())
    with pytest.raises(ValueError, match="Implicit needs an operator with a resolvent"):
        Substep(SoftmaxAttention(torch.eye(2), torch.eye(2), torch.eye(2)), Implicit())
    with pytest.raises(ValueError, match="SemiImplicit"):
        Substep((ProjectionS2(), ProjectionS2()), SemiImplicit())
    with pytest.raises(TypeError, match="expected an opsplit Operator"):
        Substep(torch.nn.Linear(2, 2))


def test_paper_bias_needs_token_count():
    with pytest.raises(ValueError, match="needs the number of tokens n_x"):
        PaperTransformer(6)


def test_grid_type_checked():
    with pytest.raises(TypeError, match="Grid"):
        Propagator(Lie([ProjectionS2()]), 1, grid="paper")
    with pytest.raises(ValueError, match="t0 < t1"):
        Propagator(Lie([ProjectionS2()]), 1, t0=1.0, t1=0.5)
    g = Grid.paper(None, 4)
    assert Propagator(Lie([ProjectionS2()]), 1, grid=g)(torch.zeros(3, 7, 4)).shape == (3, 7, 4)
