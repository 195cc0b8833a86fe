"""Controls theta(t) (paper 002, eq. 8): piecewise-constant in time, and continuous in space."""

import math

import pytest
import torch

from opsplit import Grid
from opsplit.controls import Constant, CosineSeries, PiecewiseConstant


def test_piece_at_step_start_times_for_any_step_count():
    vals = torch.arange(6, dtype=torch.float64)
    c = PiecewiseConstant(vals.view(6, 1), t0=0.0, t1=0.3)  # awkward floating-point breakpoints
    for n_steps in (6, 12, 18, 7):
        ts = [0.3 * k / n_steps for k in range(n_steps)]
        got = [int(c(t).item()) for t in ts]
        want = [min(5, math.floor(t / 0.05 + 1e-9)) for t in ts]
        assert got == want
    assert int(c(0.3).item()) == 5  # last piece closed
    assert int(c(torch.tensor(0.1)).item()) == 2  # tensor time


def test_default_time_interval_is_unit_steps():
    c = PiecewiseConstant(torch.zeros(4, 2))
    assert (c.t0, c.t1) == (0.0, 4.0)


def test_positive_control_stays_positive_under_updates():
    c = PiecewiseConstant(torch.tensor([0.5, 2.0]), positive=True)
    assert torch.allclose(c(0.0), torch.tensor(0.5)) and torch.allclose(c(1.0), torch.tensor(2.0))
    with torch.no_grad():
        c.raw -= 10.0  # any update of the raw parameter
    assert (c.values > 0).all()
    with pytest.raises(ValueError, match="> 0"):
        PiecewiseConstant(torch.tensor([1.0, 0.0]), positive=True)


def test_out_of_interval_time_is_an_error():
    c = PiecewiseConstant(torch.zeros(3, 1), t1=1.0)
    with pytest.raises(ValueError, match="outside its time interval"):
        c(1.5)
    with pytest.raises(ValueError, match="outside its time interval"):
        c(-0.1)


def test_constant_keeps_the_given_tensor_and_its_graph():
    w = torch.randn(3, 3, requires_grad=True)
    c = Constant(w)
    (c(0.0) * 2).sum().backward()
    assert torch.equal(w.grad, torch.full((3, 3), 2.0))
    p = torch.nn.Parameter(torch.zeros(2))
    assert list(Constant(p).parameters())[0] is p


def test_grid_validation_names_the_mismatch():
    c = PiecewiseConstant(torch.zeros(2, 5, 5), axes=("y", "y"))
    c.validate(Grid.paper(3, 5))
    with pytest.raises(ValueError, match="grid/control mismatch on Omega_y"):
        c.validate(Grid.paper(3, 6), "W")


def test_cosine_series_is_the_cosine_expansion_at_the_nodes():
    coef = torch.randn(3, 4, dtype=torch.float64)
    c = CosineSeries(Constant(coef), axes=("y", "y"))
    for n in (5, 11):
        g = Grid.uniform(2, n, ly=2.0)
        y = g.y.nodes(torch.float64)
        ref = torch.zeros(n, n, dtype=torch.float64)
        for p in range(3):
            for q in range(4):
                ref += coef[p, q] * torch.outer(torch.cos(p * math.pi * y / 2), torch.cos(q * math.pi * y / 2))
        assert torch.allclose(c(0.0, g), ref, atol=1e-13)
    with pytest.raises(ValueError, match="grid"):
        c(0.0)


def test_bad_values_are_rejected():
    with pytest.raises(TypeError, match="floating-point"):
        PiecewiseConstant(torch.zeros(2, 2, dtype=torch.long))
    with pytest.raises(ValueError, match="finite"):
        PiecewiseConstant(torch.tensor([[float("nan")]]))
    with pytest.raises(ValueError, match="t0 < t1"):
        PiecewiseConstant(torch.zeros(2), t0=1.0, t1=1.0)


def test_layerwise_constant_has_the_piece_ends_of_piecewise_constant():
    """A LayerwiseConstant is PiecewiseConstant's function (a parameter per piece): the same
    breakpoints, read by the adaptive solve's step ends and by the running costs."""
    from opsplit.controls import LayerwiseConstant, PiecewiseConstant
    from opsplit.controls.projection import time_breakpoints

    v = torch.randn(5, 3, dtype=torch.float64)
    for t0, t1 in ((0.0, 5.0), (-1.0, 2.0)):
        a = time_breakpoints(LayerwiseConstant(v, t0=t0, t1=t1))
        assert a == time_breakpoints(PiecewiseConstant(v, t0=t0, t1=t1))
        assert len(a) == 6 and a[0] == t0 and a[-1] == t1
