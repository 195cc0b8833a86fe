"""Grids and quadrature (paper 002, §3.4, eqs. 25-26)."""

import math

import numpy as np
import pytest
import torch

from opsplit import Grid, Interval


def test_paper_grid_gives_plain_sums():
    g = Grid.paper(4, 6)
    f = torch.randn(3, 4, 6, dtype=torch.float64)
    assert torch.equal(g.integrate_y(f), f.sum(-1))
    W = torch.randn(6, 6, dtype=torch.float64)
    assert torch.equal(g.kernel_y(f, W), f @ W)
    assert g.x.measure == 4 and g.y.measure == 6 and g.log_weights_x() is None


@pytest.mark.parametrize("rule", ["midpoint", "right", "trapezoid"])
def test_weights_sum_to_the_length(rule):
    itv = Interval(n=9, length=2.5, rule=rule)
    assert math.isclose(float(itv.weights(torch.float64).sum()), 2.5, rel_tol=1e-14)
    x = itv.nodes(torch.float64)
    assert 0 <= float(x.min()) and float(x.max()) <= 2.5 + 1e-14


@pytest.mark.parametrize("rule,order", [("midpoint", 2), ("right", 1), ("trapezoid", 2)])
def test_quadrature_order_on_a_smooth_integrand(rule, order):
    ns = [8, 16, 32, 64]
    exact = 1 - math.cos(3.0) + 4.5  # int_0^3 (sin x + x) dx
    errs = []
    for n in ns:
        itv = Interval(n=n, length=3.0, rule=rule)
        g = Grid(x=Interval(n=1, length=1.0), y=itv)
        y = itv.nodes(torch.float64)
        errs.append(abs(float(g.integrate_y(torch.sin(y) + y)) - exact))
    p = -np.polyfit(np.log(ns), np.log(errs), 1)[0]
    assert abs(p - order) < 0.15, f"{rule}: measured order {p:.3f}, declared {order}"
    assert Interval(n=4, length=1.0, rule=rule).order == order


def test_open_interval_reads_n_from_data():
    g = Grid(x=Interval(spacing=1.0), y=Interval(length=2.0))
    h = g.with_shape(7, 4)
    assert h.nx == 7 and h.x.length == 7.0 and h.ny == 4 and h.y.spacing == 0.5
    with pytest.raises(ValueError, match="grid/tensor mismatch"):
        Grid.paper(5, 4).with_shape(6, 4)


def test_interpolation_is_exact_for_linear_functions_and_second_order():
    a = Interval(n=7, length=2.0)
    b = Interval(n=12, length=2.0)
    P = a.interpolation_matrix(b, torch.float64)
    xa, xb = a.nodes(torch.float64), b.nodes(torch.float64)
    assert torch.allclose(P @ (3 * xa - 1), 3 * xb - 1, atol=1e-13)  # incl. extrapolation
    errs = []
    for n in (8, 16, 32, 64):
        c = Interval(n=n, length=2.0)
        Pc = c.interpolation_matrix(b, torch.float64)
        errs.append(float((Pc @ torch.sin(2 * c.nodes(torch.float64)) - torch.sin(2 * xb)).abs().max()))
    p = -np.polyfit(np.log([8, 16, 32, 64]), np.log(errs), 1)[0]
    assert abs(p - 2) < 0.25, f"interpolation order {p:.3f}"


def test_refine_keeps_the_domain():
    g = Grid.uniform(4, 8, lx=1.5, ly=3.0).refine(nx=16, ny=32)
    assert (g.nx, g.ny, g.x.length, g.y.length) == (16, 32, 1.5, 3.0)


@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({}, "give two of"),
        ({"n": 4}, "give two of"),
        ({"n": 0, "length": 1.0}, "positive integer"),
        ({"n": 4, "length": -1.0}, "> 0"),
        ({"n": 4, "length": 1.0, "spacing": 0.3}, "inconsistent"),
        ({"n": 4, "length": 1.0, "rule": "simpson"}, "rule"),
        ({"n": 1, "length": 1.0, "rule": "trapezoid"}, "n >= 2"),
        ({"n": 4, "length": float("nan")}, "> 0"),
    ],
)
def test_interval_rejects_bad_input(kwargs, match):
    with pytest.raises((ValueError, TypeError), match=match):
        Interval(**kwargs)


def test_grid_rejects_bad_input():
    with pytest.raises(TypeError, match="Interval or an int"):
        Grid(x="four", y=4)
    with pytest.raises(ValueError, match="different|domains differ"):
        Interval(n=3, length=1.0).interpolation_matrix(Interval(n=3, length=2.0))
