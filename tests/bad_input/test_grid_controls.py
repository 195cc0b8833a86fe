"""Bad input to the grid (Interval, Grid), the controls and the analysis tools
(fit_order, the convergence studies, ConvergenceStudy, relative_error)."""

import numpy as np
import pytest
import torch

from opsplit import Grid, Interval
from opsplit.analysis import (
    ConvergenceStudy,
    fit_order,
    relative_error,
    self_convergence,
    spatial_convergence,
    temporal_convergence,
)
from opsplit.controls import (
    Constant,
    CosineSeries,
    PiecewiseConstant,
    PiecewiseLinear,
    PolynomialSeries,
    TimeBasis,
)

from ._table import F64, INF, NAN, cases, run_case

G = Grid.paper(3, 4)

GRID = cases(
    ("interval-n=0", lambda: Interval(n=0, length=1.0), ValueError, r"Interval\.n: expected a positive integer \(>= 1\), got 0"),
    ("interval-n<0", lambda: Interval(n=-2, spacing=1.0), ValueError, r"Interval\.n: expected a positive integer"),
    ("interval-n-float", lambda: Interval(n=2.5, length=1.0), TypeError, r"Interval\.n: expected a positive integer"),
    ("interval-length=0", lambda: Interval(length=0.0), ValueError, r"Interval\.length: expected a finite number > 0"),
    ("interval-length<0", lambda: Interval(n=3, length=-1.0), ValueError, r"Interval\.length: expected a finite number > 0"),
    ("interval-length=nan", lambda: Interval(length=NAN), ValueError, r"Interval\.length: expected a finite number > 0"),
    ("interval-spacing=inf", lambda: Interval(spacing=INF), ValueError, r"Interval\.spacing: expected a finite number > 0"),
    ("interval-rule", lambda: Interval(n=3, length=1.0, rule="simpson"), ValueError, r"Interval\.rule: expected one of"),
    ("interval-trapezoid-1", lambda: Interval(n=1, length=1.0, rule="trapezoid"), ValueError, r"Interval\.n: the trapezoid rule needs n >= 2"),
    ("interval-nothing", lambda: Interval(), ValueError, r"Interval: give two of \(n, length, spacing\)"),
    ("interval-only-n", lambda: Interval(n=3), ValueError, r"Interval: give two of"),
    ("interval-inconsistent", lambda: Interval(n=3, length=1.0, spacing=0.5), ValueError, r"Interval: n=3, length=1.0 and spacing=0.5 are inconsistent"),
    ("interval-length-spacing", lambda: Interval(length=1.0, spacing=0.5), ValueError, r"Interval: length and spacing together fix n"),
    ("interval-open-nodes", lambda: Interval.paper().nodes(), ValueError, r"Interval\.nodes: this interval has no node count yet"),
    ("interval-with_n=0", lambda: Interval(length=1.0).with_n(0), ValueError, r"n: expected a positive integer"),
    ("interval-with_n-mismatch", lambda: Interval(n=3, length=1.0).with_n(4), ValueError, r"grid/tensor mismatch: the grid has 3 nodes, got 4"),
    ("interval-interp-domains", lambda: Interval(n=3, length=1.0).interpolation_matrix(Interval(n=4, length=2.0)), ValueError, r"interpolation_matrix: domains differ"),
    ("grid-no-y", lambda: Grid(x=Interval.paper(3), y=None), ValueError, r"Grid: both x and y intervals are required"),
    ("grid-x-str", lambda: Grid(x="a", y=3), TypeError, r"Grid\.x: expected an Interval or an int"),
    ("grid-paper-nx=0", lambda: Grid.paper(0, 4), ValueError, r"Grid\.paper: nx: expected a positive integer"),
    ("grid-paper-ny<0", lambda: Grid.paper(3, -4), ValueError, r"Grid\.paper: ny: expected a positive integer"),
    ("grid-uniform-ny=0", lambda: Grid.uniform(4, 0), ValueError, r"Grid\.uniform: ny: expected a positive integer"),
    ("grid-uniform-lx=0", lambda: Grid.uniform(4, 5, lx=0.0), ValueError, r"Grid\.uniform: lx: expected a finite number > 0"),
    ("grid-uniform-ly=nan", lambda: Grid.uniform(4, 5, ly=NAN), ValueError, r"Grid\.uniform: ly: expected a finite number > 0"),
    ("grid-with_shape", lambda: G.with_shape(3, 5, "u"), ValueError, r"u: grid/tensor mismatch.*N_y = 4"),
    ("grid-check_shape", lambda: G.check_shape((2, 4), "u"), ValueError, r"u: grid/tensor mismatch"),
    ("grid-kernel_y-W", lambda: G.kernel_y(torch.ones(2, 3, 4), torch.ones(5, 5)), ValueError, r"kernel_y: W: expected shape \(4, M\)"),
    ("grid-kernel_y-u", lambda: G.kernel_y(torch.ones(2, 3, 5), torch.ones(4, 4)), ValueError, r"kernel_y: u: expected N_y = 4"),
    ("grid-integrate_y", lambda: G.integrate_y(torch.ones(2, 3, 5)), ValueError, r"integrate_y: f: expected N_y = 4"),
    ("grid-refine-open", lambda: Grid.paper(None, 4).refine(nx=6), ValueError, r"Interval\.refine: this interval has no node count"),
)

CONTROLS = cases(
    ("pc-list", lambda: PiecewiseConstant([1.0, 2.0]), TypeError, r"PiecewiseConstant\.values: expected a torch.Tensor"),
    ("pc-int", lambda: PiecewiseConstant(torch.tensor([1, 2])), TypeError, r"PiecewiseConstant\.values: expected floating-point"),
    ("pc-nan", lambda: PiecewiseConstant(torch.tensor([1.0, NAN])), ValueError, r"PiecewiseConstant\.values: expected finite"),
    ("pc-inf", lambda: PiecewiseConstant(torch.tensor([[INF]])), ValueError, r"PiecewiseConstant\.values: expected finite"),
    ("pc-no-rows", lambda: PiecewiseConstant(torch.zeros(0, 3)), ValueError, r"PiecewiseConstant\.values: expected shape \(n_pieces, \*shape\) with at least one piece"),
    ("pc-scalar", lambda: PiecewiseConstant(torch.tensor(1.0)), ValueError, r"PiecewiseConstant\.values: expected shape \(n_pieces"),
    ("pc-axes-rank", lambda: PiecewiseConstant(torch.zeros(2), axes=("y",)), ValueError, r"PiecewiseConstant: 1 axes \('y',\) but values of shape \(\)"),
    ("pc-axes-name", lambda: PiecewiseConstant(torch.zeros(2, 3), axes=("z",)), ValueError, r"Control\.axes: expected names from"),
    ("pc-t0=t1", lambda: PiecewiseConstant(torch.zeros(2), t0=1.0, t1=1.0), ValueError, r"PiecewiseConstant: expected t0 < t1"),
    ("pc-t1=nan", lambda: PiecewiseConstant(torch.zeros(2), t1=NAN), ValueError, r"PiecewiseConstant\.t1: expected a finite number"),
    ("pc-t0=str", lambda: PiecewiseConstant(torch.zeros(2), t0="0"), TypeError, r"PiecewiseConstant\.t0: expected a real number"),
    ("pc-positive", lambda: PiecewiseConstant(torch.tensor([1.0, -1.0]), positive=True), ValueError, r"PiecewiseConstant\(positive=True\): expected values > 0"),
    ("pc-outside", lambda: PiecewiseConstant(torch.zeros(2))(5.0), ValueError, r"control evaluated at t = 5, outside its time interval \[0, 2\]"),
    ("pc-t-nan", lambda: PiecewiseConstant(torch.zeros(2))(NAN), ValueError, r"control time: expected a finite"),
    ("pc-t-vector", lambda: PiecewiseConstant(torch.zeros(2))(torch.zeros(2)), ValueError, r"control time: expected a scalar time"),
    ("pc-fill-positive", lambda: PiecewiseConstant(torch.ones(2), positive=True).fill_(torch.zeros(2)), ValueError, r"fill_: a positive control needs values > 0"),
    ("pc-grid-mismatch", lambda: PiecewiseConstant(torch.zeros(2, 5), axes=("y",)).validate(G, "W"), ValueError, r"W: grid/control mismatch on Omega_y"),
    ("pl-t-outside", lambda: PiecewiseLinear(torch.zeros(3))(-1.0), ValueError, r"outside"),
    ("pl-empty", lambda: PiecewiseLinear(torch.zeros(0)), ValueError, r"PiecewiseLinear\.values: expected shape"),
    ("const-list", lambda: Constant([1.0]), TypeError, r"Constant\.value: expected a torch.Tensor"),
    ("const-positive", lambda: Constant(torch.tensor([0.0]), positive=True), ValueError, r"expected values > 0"),
    ("cos-coeff-tensor", lambda: CosineSeries(torch.zeros(2, 2)), TypeError, r"CosineSeries"),
    ("cos-axes", lambda: CosineSeries(Constant(torch.zeros(2, 2, 2)), axes=("x", "y", "h")), ValueError, r"CosineSeries: expected 1 or 2 axes"),
    ("cos-no-grid", lambda: CosineSeries(Constant(torch.zeros(2, 2)))(0.0), ValueError, r"CosineSeries: a grid is needed"),
    ("poly-basis", lambda: PolynomialSeries(Constant(torch.zeros(2, 2)), basis="fourier"), ValueError, r"PolynomialSeries.*basis"),
    ("tb-basis", lambda: TimeBasis(torch.zeros(2), basis="fourier"), ValueError, r"TimeBasis\.basis: expected one of"),
    ("tb-t0=t1", lambda: TimeBasis(torch.zeros(2), t0=1.0, t1=1.0), ValueError, r"TimeBasis: expected t0 < t1"),
    ("tb-empty", lambda: TimeBasis(torch.zeros(0, 2)), ValueError, r"TimeBasis\.coefficients: expected shape \(n_modes"),
    ("tb-nan", lambda: TimeBasis(torch.tensor([NAN])), ValueError, r"TimeBasis\.coefficients: expected finite"),
    ("tb-outside", lambda: TimeBasis(torch.zeros(2))(2.0), ValueError, r"outside"),
)


def _solve(n):
    return torch.full((1, 3, 4), 1.0 + 1.0 / n, dtype=F64)


REF = torch.ones(1, 3, 4, dtype=F64)


def _fit():
    return fit_order([0.5, 0.25], [1e-2, 2.5e-3])


ANALYSIS = cases(
    ("fit-lengths", lambda: fit_order([1.0, 0.5], [1.0]), ValueError, r"fit_order: expected at least two \(h, error\) pairs of equal length"),
    ("fit-h<=0", lambda: fit_order([0.0, 0.5], [1.0, 0.5]), ValueError, r"fit_order: step sizes must be finite and > 0"),
    ("fit-errors-nan", lambda: fit_order([1.0, 0.5], [NAN, 0.5]), ValueError, r"fit_order: errors must be finite and > 0"),
    ("fit-errors-zero", lambda: fit_order([1.0, 0.5], [0.0, 0.5]), ValueError, r"fit_order: errors must be finite and > 0"),
    ("fit-confidence", lambda: fit_order([1.0, 0.5], [1.0, 0.5], confidence=1.5), ValueError, r"fit_order: confidence must be in \(0, 1\)"),
    ("fit-same-h", lambda: fit_order([1.0, 1.0], [1.0, 0.5]), ValueError, r"fit_order: expected at least two distinct step sizes"),
    ("temporal-one-N_t", lambda: temporal_convergence(_solve, [4], REF), ValueError, r"temporal_convergence: expected at least two N_t >= 1"),
    ("temporal-N_t=0", lambda: temporal_convergence(_solve, [0, 2], REF), ValueError, r"temporal_convergence: expected at least two N_t >= 1"),
    ("temporal-t1<=t0", lambda: temporal_convergence(_solve, [2, 4], REF, t0=1.0, t1=0.0), ValueError, r"temporal_convergence: expected t0 < t1"),
    ("temporal-ref-shape", lambda: temporal_convergence(_solve, [2, 4], REF[:, :2]), ValueError, r"relative_error: shapes differ"),
    ("self-two-N_t", lambda: self_convergence(_solve, [2, 4]), ValueError, r"self_convergence: expected at least three N_t"),
    ("spatial-axis", lambda: spatial_convergence(lambda n: (REF, G), [2, 4], (REF, G), axis="z"), ValueError, r"spatial_convergence: axis must be 'x', 'y' or 'xy'"),
    ("relerr-shapes", lambda: relative_error(REF, REF[..., :3]), ValueError, r"relative_error: shapes differ"),
    ("study-variable", lambda: ConvergenceStudy("a", "dz", [2, 4], np.array([0.5, 0.25]), np.array([1e-2, 2.5e-3]), _fit()), ValueError, r"ConvergenceStudy\.variable: expected one of"),
    ("study-lengths", lambda: ConvergenceStudy("a", "dt", [2, 4, 8], np.array([0.5, 0.25]), np.array([1e-2, 2.5e-3]), _fit()), ValueError, r"ConvergenceStudy: n, h and errors must have the same length"),
    ("study-fit", lambda: ConvergenceStudy("a", "dt", [2, 4], np.array([0.5, 0.25]), np.array([1e-2, 2.5e-3]), 2.0), TypeError, r"ConvergenceStudy\.fit: expected an OrderFit"),
)


@pytest.mark.parametrize("case", GRID)
def test_grid(case):
    run_case(case)


@pytest.mark.parametrize("case", CONTROLS)
def test_controls(case):
    run_case(case)


@pytest.mark.parametrize("case", ANALYSIS)
def test_analysis(case):
    run_case(case)
