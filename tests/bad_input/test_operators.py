"""Bad input to the non-attention operators: ProjectionS1 / project_s1 (LayerNorm),
ProjectionS2 (ReLU), PointwiseAffine, FFNIntegral, FeedForward, FieldDropout, PreNorm,
Relaxation, Activation, ContextGrid."""

import pytest
import torch
from torch import nn

from opsplit import Grid, Interval
from opsplit.controls import PiecewiseConstant
from opsplit.operators import (
    Activation,
    ContextGrid,
    FeedForward,
    FFNIntegral,
    FieldDropout,
    PointwiseAffine,
    PreNorm,
    ProjectionS1,
    ProjectionS2,
    project_s1,
)
from opsplit.schemes import Relaxation

from ._table import F64, INF, NAN, cases, run_case, u


def ffn(n=5, **kw):
    return FFNIntegral(torch.randn(n, n, dtype=F64), torch.randn(n, dtype=F64), bias_axis="y", **kw)


def ff(ny=5, nz=3, **kw):
    return FeedForward(torch.randn(ny, nz, dtype=F64), torch.randn(nz, dtype=F64),
                       torch.randn(nz, ny, dtype=F64), torch.randn(ny, dtype=F64), **kw)


S1 = cases(
    ("S1-sigma1=nan", lambda: ProjectionS1(NAN), ValueError, r"ProjectionS1\.sigma1.*finite"),
    ("S1-sigma1=inf", lambda: ProjectionS1(INF), ValueError, r"ProjectionS1\.sigma1.*finite"),
    ("S1-sigma1=str", lambda: ProjectionS1("a"), TypeError, r"ProjectionS1\.sigma1.*real number"),
    ("S1-sigma2=0", lambda: ProjectionS1(0.0, 0.0), ValueError, r"ProjectionS1\.sigma2.*> 0"),
    ("S1-sigma2<0", lambda: ProjectionS1(0.0, -2.0), ValueError, r"ProjectionS1\.sigma2.*> 0"),
    ("S1-sigma2=nan", lambda: ProjectionS1(0.0, NAN), ValueError, r"ProjectionS1\.sigma2.*finite"),
    ("S1-sigma2-tensor<0", lambda: ProjectionS1(0.0, torch.tensor(-1.0)), ValueError, r"ProjectionS1\.sigma2.*> 0"),
    ("S1-sigma2-tensor-nan", lambda: ProjectionS1(0.0, torch.tensor(NAN)), ValueError, r"ProjectionS1\.sigma2"),
    ("S1-sigma1-tensor-nan", lambda: ProjectionS1(torch.tensor(NAN)), ValueError, r"ProjectionS1\.sigma1.*finite"),
    ("S1-sigma2-per-feature", lambda: ProjectionS1(0.0, torch.ones(5)), ValueError, r"ProjectionS1\.sigma2.*scalar"),
    ("S1-sigma1-per-feature", lambda: ProjectionS1(torch.zeros(5)), ValueError, r"ProjectionS1\.sigma1.*scalar"),
    ("S1-sigma2-int-tensor", lambda: ProjectionS1(0.0, torch.tensor(2)), TypeError, r"ProjectionS1\.sigma2.*floating"),
    ("S1-eps<0", lambda: ProjectionS1(eps=-1e-5), ValueError, r"ProjectionS1\.eps.*>= 0"),
    ("S1-eps=nan", lambda: ProjectionS1(eps=NAN), ValueError, r"ProjectionS1\.eps.*finite"),
    ("S1-call-rank2", lambda: ProjectionS1()(u(3, 5)), ValueError, r"ProjectionS1 input.*rank 2"),
    ("S1-call-nan", lambda: ProjectionS1()(u(2, 3, 5, fill=NAN, at=(0, 1, 2))), ValueError, r"ProjectionS1 input.*finite"),
    ("S1-call-int", lambda: ProjectionS1()(torch.ones(2, 3, 5, dtype=torch.int64)), TypeError, r"ProjectionS1 input.*floating"),
    ("S1-call-empty", lambda: ProjectionS1()(u(2, 3, 0)), ValueError, r"ProjectionS1 input.*empty"),
    ("S1-call-grid=str", lambda: ProjectionS1()(u(2, 3, 5), grid="paper"), TypeError, r"grid: expected an opsplit Grid"),
    ("S1-call-grid-mismatch", lambda: ProjectionS1()(u(2, 3, 5), grid=Grid.paper(3, 4)), ValueError, r"ProjectionS1 input.*mismatch"),
    ("S1-call-t=nan", lambda: ProjectionS1()(u(2, 3, 5), t=NAN), ValueError, r"t: expected a finite"),
    ("S1-call-piecewise-nan-param", lambda: _s1_nan_param()(u(2, 3, 5)), ValueError, r"parameters must be finite.*sigma1"),
)


def _s1_nan_param():
    op = ProjectionS1(PiecewiseConstant(torch.zeros(2, dtype=F64)), PiecewiseConstant(torch.ones(2, dtype=F64), positive=True))
    with torch.no_grad():
        op.sigma1.raw[1] = NAN
    return op


PROJECT = cases(
    ("fn-v-list", lambda: project_s1([1.0, 2.0], 0, 1), TypeError, r"v: expected a torch.Tensor"),
    ("fn-v-int", lambda: project_s1(torch.arange(4), 0, 1), TypeError, r"v: expected a floating"),
    ("fn-v-empty", lambda: project_s1(u(3, 0), 0, 1), ValueError, r"v: expected a tensor \(\.\.\., N_y\) with N_y >= 1"),
    ("fn-v-scalar", lambda: project_s1(torch.tensor(1.0), 0, 1), ValueError, r"v: expected a tensor"),
    ("fn-v-nan", lambda: project_s1(u(3, 5, fill=NAN, at=(0, 0)), 0, 1), ValueError, r"v: expected finite"),
    ("fn-v-inf", lambda: project_s1(u(3, 5, fill=INF, at=(2, 4)), 0, 1), ValueError, r"v: expected finite"),
    ("fn-sigma2=-1", lambda: project_s1(u(3, 5), 0, -1), ValueError, r"sigma2: expected a finite number > 0"),
    ("fn-sigma2=0", lambda: project_s1(u(3, 5), 0, 0), ValueError, r"sigma2: expected a finite number > 0"),
    ("fn-sigma2=nan", lambda: project_s1(u(3, 5), 0, NAN), ValueError, r"sigma2: expected a finite"),
    ("fn-sigma2-tensor<0", lambda: project_s1(u(3, 5), 0, torch.tensor([[1.0], [-1.0], [2.0]], dtype=F64)), ValueError, r"sigma2: expected sigma_2 > 0"),
    ("fn-sigma2-per-feature", lambda: project_s1(u(3, 5), 0, torch.ones(5, dtype=F64)), ValueError, r"sigma2: expected a scalar"),
    ("fn-sigma1=inf", lambda: project_s1(u(3, 5), INF, 1), ValueError, r"sigma1: expected a finite"),
    ("fn-sigma1-tensor-nan", lambda: project_s1(u(3, 5), torch.tensor(NAN, dtype=F64), 1), ValueError, r"sigma1: expected finite"),
    ("fn-eps<0", lambda: project_s1(u(3, 5), 0, 1, eps=-1.0), ValueError, r"eps: expected a finite number >= 0"),
    ("fn-grid=str", lambda: project_s1(u(3, 5), 0, 1, grid="paper"), TypeError, r"grid: expected an opsplit Grid"),
    ("fn-grid-mismatch", lambda: project_s1(u(3, 5), 0, 1, grid=Grid.paper(3, 4)), ValueError, r"v:.*N_y"),
)

S2 = cases(
    ("S2-rank4", lambda: ProjectionS2()(u(1, 2, 3, 4)), ValueError, r"ProjectionS2 input.*rank 4"),
    ("S2-nan", lambda: ProjectionS2()(u(1, 3, 4, fill=NAN, at=(0, 0, 0))), ValueError, r"ProjectionS2 input.*finite"),
    ("S2-int", lambda: ProjectionS2()(torch.zeros(1, 3, 4, dtype=torch.int32)), TypeError, r"ProjectionS2 input.*floating"),
    ("S2-empty-tokens", lambda: ProjectionS2()(u(1, 0, 4)), ValueError, r"ProjectionS2 input.*empty"),
    ("S2-t=str", lambda: ProjectionS2()(u(1, 3, 4), t="0"), TypeError, r"t: expected a real number"),
    ("S2-t=inf", lambda: ProjectionS2()(u(1, 3, 4), t=INF), ValueError, r"t: expected a finite"),
    ("S2-grid=int", lambda: ProjectionS2()(u(1, 3, 4), grid=3), TypeError, r"grid: expected an opsplit Grid"),
    ("S2-trapezoid-1", lambda: ProjectionS2()(u(1, 1, 4), grid=Grid(x=Interval(length=1.0, rule="trapezoid"), y=Interval(spacing=1.0))), ValueError, r"ProjectionS2 input.*trapezoid.*N_x >= 2"),
)

AFFINE = cases(
    ("affine-weight-rank2", lambda: PointwiseAffine(torch.ones(2, 3)), ValueError, r"PointwiseAffine\.weight: expected shape \(N_y,\)"),
    ("affine-bias-rank0", lambda: PointwiseAffine(None, torch.tensor(1.0)), ValueError, r"PointwiseAffine\.bias: expected a tensor of rank >= 1"),
    ("affine-weight-str", lambda: PointwiseAffine("w"), TypeError, r"PointwiseAffine\.weight: expected a Control or a torch.Tensor"),
    ("affine-weight-nan", lambda: PointwiseAffine(torch.tensor([1.0, NAN])), ValueError, r"PointwiseAffine\.weight.*finite"),
    ("affine-weight-int", lambda: PointwiseAffine(torch.tensor([1, 2])), TypeError, r"PointwiseAffine\.weight.*floating"),
    ("affine-projection-S2", lambda: PointwiseAffine(projection=ProjectionS2()), TypeError, r"PointwiseAffine\.projection"),
    ("affine-grid-mismatch", lambda: PointwiseAffine(torch.ones(4, dtype=F64))(u(2, 3, 5)), ValueError, r"PointwiseAffine\.weight.*mismatch"),
    ("affine-f32-into-f64", lambda: PointwiseAffine(torch.ones(5, dtype=F64))(u(2, 3, 5, dtype=torch.float32)), TypeError, r"PointwiseAffine input: dtype torch.float32 differs"),
    ("affine-meta", lambda: PointwiseAffine(torch.ones(5, dtype=F64))(u(2, 3, 5, device="meta")), ValueError, r"PointwiseAffine input: device meta differs"),
)

FFN = cases(
    ("ffn-bias_axis", lambda: FFNIntegral(torch.eye(3), torch.zeros(3), bias_axis="z"), ValueError, r"FFNIntegral\.bias_axis"),
    ("ffn-W-str", lambda: FFNIntegral("W"), TypeError, r"FFNIntegral\.W: expected a Control or a torch.Tensor"),
    ("ffn-W-nan", lambda: FFNIntegral(torch.full((3, 3), NAN)), ValueError, r"FFNIntegral\.W.*finite"),
    ("ffn-W-rank1", lambda: FFNIntegral(torch.ones(3)), ValueError, r"FFNIntegral\.W"),
    ("ffn-W-grid", lambda: ffn(4)(u(2, 3, 5)), ValueError, r"FFNIntegral\.W: grid/control mismatch"),
    ("ffn-b-grid", lambda: FFNIntegral(torch.eye(5, dtype=F64), torch.zeros(4, dtype=F64), bias_axis="x")(u(2, 3, 5)), ValueError, r"FFNIntegral\.b: grid/control mismatch on Omega_x"),
    ("ffn-f32-into-f64", lambda: ffn()(u(2, 3, 5, dtype=torch.float32)), TypeError, r"FFNIntegral input: dtype"),
    ("ffn-meta", lambda: ffn()(u(2, 3, 5, device="meta")), ValueError, r"FFNIntegral input: device meta"),
    ("ffn-nan-input", lambda: ffn()(u(2, 3, 5, fill=NAN, at=(0, 0, 0))), ValueError, r"FFNIntegral input.*finite"),
)

FF = cases(
    ("ff-W1-rank1", lambda: FeedForward(torch.ones(3), None, torch.ones(3, 5), None), ValueError, r"FeedForward\.W1: expected shape \(N_y, N_z\)"),
    ("ff-W2-misfit", lambda: FeedForward(torch.ones(5, 3), None, torch.ones(4, 5), None), ValueError, r"FeedForward: W1.*W2.*do not fit"),
    ("ff-b1-shape", lambda: FeedForward(torch.ones(5, 3), torch.ones(4), torch.ones(3, 5), None), ValueError, r"FeedForward\.b1: expected shape \(3,\)"),
    ("ff-b2-shape", lambda: FeedForward(torch.ones(5, 3), None, torch.ones(3, 5), torch.ones(3)), ValueError, r"FeedForward\.b2: expected shape \(5,\)"),
    ("ff-activation", lambda: ff(activation="swishy"), ValueError, r"activation: expected one of"),
    ("ff-hidden-str", lambda: ff(hidden="z"), TypeError, r"FeedForward\.hidden: expected an Interval"),
    ("ff-hidden-n", lambda: ff(hidden=Interval(n=4, length=1.0)), ValueError, r"FeedForward\.hidden: 4 nodes"),
    ("ff-dropout=1", lambda: ff(dropout=1.0), ValueError, r"FeedForward\.dropout"),
    ("ff-dropout=nan", lambda: ff(dropout=NAN), ValueError, r"FeedForward\.dropout"),
    ("ff-dropout=str", lambda: ff(dropout="a"), TypeError, r"FeedForward\.dropout"),
    ("ff-grid", lambda: ff()(u(2, 3, 4)), ValueError, r"FeedForward: grid/control mismatch.*N_y = 5"),
    ("ff-create-n_y=0", lambda: FeedForward.create(0, 3), ValueError, r"FeedForward\.create.*n_y.*>= 1"),
    ("ff-create-n_z<0", lambda: FeedForward.create(4, -3), ValueError, r"FeedForward\.create.*n_z.*>= 1"),
)

COMPOSITE = cases(
    ("dropout-inner-S1", lambda: FieldDropout(ProjectionS1(), 0.1), TypeError, r"FieldDropout\.inner.*with a field"),
    ("dropout-inner-linear", lambda: FieldDropout(nn.Linear(2, 2), 0.1), TypeError, r"FieldDropout\.inner"),
    ("dropout-p=1", lambda: FieldDropout(ffn(), 1.0), ValueError, r"FieldDropout\.p: expected a probability 0 <= p < 1"),
    ("dropout-p<0", lambda: FieldDropout(ffn(), -0.5), ValueError, r"FieldDropout\.p"),
    ("dropout-p=nan", lambda: FieldDropout(ffn(), NAN), ValueError, r"FieldDropout\.p"),
    ("dropout-p=str", lambda: FieldDropout(ffn(), "a"), TypeError, r"FieldDropout\.p"),
    ("prenorm-inner-S2", lambda: PreNorm(ProjectionS2(), ProjectionS1()), TypeError, r"PreNorm\.inner"),
    ("prenorm-norm-empty", lambda: PreNorm(ffn(), []), ValueError, r"PreNorm\.norm: expected at least one"),
    ("prenorm-norm-ffn", lambda: PreNorm(ffn(), ffn()), TypeError, r"PreNorm\.norm: expected a .*map"),
    ("prenorm-grid", lambda: PreNorm(ffn(4), ProjectionS1())(u(2, 3, 5)), ValueError, r"FFNIntegral\.W: grid/control mismatch"),
    ("relax-empty", lambda: Relaxation([]), ValueError, r"Relaxation: expected at least one inner substep"),
    ("relax-weight=0", lambda: Relaxation([ProjectionS2()], weight=0.0), ValueError, r"Relaxation\.weight"),
    ("relax-weight>1", lambda: Relaxation([ProjectionS2()], weight=1.5), ValueError, r"Relaxation\.weight"),
    ("relax-weight=nan", lambda: Relaxation([ProjectionS2()], weight=NAN), ValueError, r"Relaxation\.weight"),
    ("relax-weight=str", lambda: Relaxation([ProjectionS2()], weight="half"), TypeError, r"Relaxation\.weight"),
    ("relax-step-linear", lambda: Relaxation([nn.Linear(2, 2)]), TypeError, r"expected an opsplit Operator"),
    ("activation-name", lambda: Activation("swishy"), ValueError, r"activation: expected one of"),
    ("activation-nan", lambda: Activation("gelu")(u(1, 2, 3, fill=NAN, at=(0, 0, 0))), ValueError, r"Activation input.*finite"),
    ("context-not-mapping", lambda: ContextGrid(x=Interval.paper(), y=Interval.paper(), context=[1]), TypeError, r"ContextGrid\.context"),
    ("context-of-str", lambda: ContextGrid.of("grid", m=1), TypeError, r"ContextGrid\.of: expected an opsplit Grid"),
)


@pytest.mark.parametrize("case", S1)
def test_projection_s1(case):
    run_case(case)


@pytest.mark.parametrize("case", PROJECT)
def test_project_s1_function(case):
    run_case(case)


@pytest.mark.parametrize("case", S2)
def test_projection_s2(case):
    run_case(case)


@pytest.mark.parametrize("case", AFFINE)
def test_pointwise_affine(case):
    run_case(case)


@pytest.mark.parametrize("case", FFN)
def test_ffn_integral(case):
    run_case(case)


@pytest.mark.parametrize("case", FF)
def test_feedforward(case):
    run_case(case)


@pytest.mark.parametrize("case", COMPOSITE)
def test_composite_operators(case):
    run_case(case)
