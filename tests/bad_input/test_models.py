"""Bad input to the models: PaperTransformer, ContinuousTransformer, TorchEncoder,
TorchDecoder (constructors and forward)."""

import pytest
import torch

from opsplit import Grid
from opsplit.models import ContinuousTransformer, PaperTransformer, TorchDecoder, TorchEncoder

from ._table import F64, INF, NAN, cases, run_case


def paper(**kw):
    kw.setdefault("n_x", 4)
    kw.setdefault("J", 1)
    kw.setdefault("n_steps", 2)
    kw.setdefault("dtype", F64)
    return PaperTransformer(6, **kw)


def paper_nan_param():
    m = paper()
    with torch.no_grad():
        m.ffn[0].W.raw[1, 2, 3] = NAN
    return m


def cont(**kw):
    kw.setdefault("n_steps", 2)
    kw.setdefault("dtype", F64)
    return ContinuousTransformer(2, **kw)


def enc(**kw):
    kw.setdefault("dim_feedforward", 8)
    kw.setdefault("batch_first", True)
    kw.setdefault("dropout", 0.0)
    return TorchEncoder(4, 2, **kw)


def dec(**kw):
    kw.setdefault("dim_feedforward", 8)
    kw.setdefault("batch_first", True)
    kw.setdefault("dropout", 0.0)
    return TorchDecoder(4, 2, **kw)


def x(*shape, dtype=F64, fill=None, at=None, device=None):
    t = torch.randn(*shape, dtype=dtype, device=device) if device is None else torch.empty(*shape, dtype=dtype, device=device)
    if fill is not None:
        t[at] = fill
    return t


def f32(*shape, **kw):
    return x(*shape, dtype=torch.float32, **kw)


PAPER_CTOR = cases(
    ("n_y=0", lambda: PaperTransformer(0, n_x=4), ValueError, r"PaperTransformer\.n_y.*>= 1"),
    ("n_y<0", lambda: PaperTransformer(-3, n_x=4), ValueError, r"PaperTransformer\.n_y.*>= 1"),
    ("n_y-float", lambda: PaperTransformer(2.5, n_x=4), TypeError, r"PaperTransformer\.n_y"),
    ("n_y-str", lambda: PaperTransformer("6", n_x=4), TypeError, r"PaperTransformer\.n_y"),
    ("n_x=0", lambda: paper(n_x=0), ValueError, r"PaperTransformer\.n_x.*>= 1"),
    ("n_x<0", lambda: paper(n_x=-1), ValueError, r"PaperTransformer\.n_x.*>= 1"),
    ("J=0", lambda: paper(J=0), ValueError, r"PaperTransformer\.J.*>= 1"),
    ("N_t=0", lambda: paper(n_steps=0), ValueError, r"n_steps \(N_t\).*>= 1"),
    ("N_t<0", lambda: paper(n_steps=-2), ValueError, r"n_steps \(N_t\).*>= 1"),
    ("sigma2=0", lambda: paper(sigma2=0.0), ValueError, r"PaperTransformer\.sigma2.*> 0"),
    ("sigma2<0", lambda: paper(sigma2=-1.0), ValueError, r"PaperTransformer\.sigma2.*> 0"),
    ("sigma2=nan", lambda: paper(sigma2=NAN), ValueError, r"PaperTransformer\.sigma2.*finite"),
    ("sigma1=nan", lambda: paper(sigma1=NAN), ValueError, r"PaperTransformer\.sigma1.*finite"),
    ("sigma1=inf", lambda: paper(sigma1=INF), ValueError, r"PaperTransformer\.sigma1.*finite"),
    ("T=0", lambda: paper(T=0.0), ValueError, r"PaperTransformer\.T.*> 0"),
    ("T<0", lambda: paper(T=-1.0), ValueError, r"PaperTransformer\.T.*> 0"),
    ("T=nan", lambda: paper(T=NAN), ValueError, r"PaperTransformer\.T.*finite"),
    ("eps<0", lambda: paper(eps=-1e-5), ValueError, r"eps.*>= 0"),
    ("eps=nan", lambda: paper(eps=NAN), ValueError, r"eps.*finite"),
    ("relax_weight=0", lambda: paper(relax_weight=0.0), ValueError, r"PaperTransformer\.relax_weight.*0 < weight <= 1"),
    ("relax_weight=nan", lambda: paper(relax_weight=NAN), ValueError, r"PaperTransformer\.relax_weight.*finite"),
    ("bias_axis=z", lambda: paper(bias_axis="z"), ValueError, r"bias_axis.*'x' or 'y'"),
    ("no-n_x", lambda: PaperTransformer(6), ValueError, r"n_x"),
    ("grid=str", lambda: paper(grid="paper"), TypeError, r"PaperTransformer\.grid.*Grid"),
    ("grid-mismatch-y", lambda: paper(grid=Grid.paper(4, 5)), ValueError, r"PaperTransformer grid.*mismatch"),
    ("grid-mismatch-x", lambda: paper(grid=Grid.paper(3, 6)), ValueError, r"PaperTransformer grid.*N_x"),
    ("dtype=int", lambda: paper(dtype=torch.int64), TypeError, r"PaperTransformer\.dtype.*floating"),
)

PAPER_CALL = cases(
    ("rank4", lambda: paper()(x(1, 2, 4, 6)), ValueError, r"f: expected shape \(B, N_x, N_y\).*rank 4"),
    ("rank1", lambda: paper()(x(6)), ValueError, r"f: expected shape.*rank 1"),
    ("N_y-mismatch", lambda: paper()(x(2, 4, 5)), ValueError, r"f.*grid/tensor mismatch"),
    ("N_x-mismatch", lambda: paper()(x(2, 3, 6)), ValueError, r"f.*N_x"),
    ("empty-tokens", lambda: paper(bias_axis="y", n_x=None)(x(2, 0, 6)), ValueError, r"f.*N_x >= 1"),
    ("empty-features", lambda: paper()(x(2, 4, 0)), ValueError, r"f: grid/tensor mismatch.*N_y differs"),
    ("nan-input", lambda: paper()(x(2, 4, 6, fill=NAN, at=(1, 2, 3))), ValueError, r"f: expected finite.*1 NaN"),
    ("inf-input", lambda: paper()(x(2, 4, 6, fill=-INF, at=(0, 0, 0))), ValueError, r"f: expected finite"),
    ("int-input", lambda: paper()(torch.zeros(2, 4, 6, dtype=torch.long)), TypeError, r"f: expected a floating"),
    ("list-input", lambda: paper()([[0.0] * 6] * 4), TypeError, r"f: expected a torch.Tensor"),
    ("f32-into-f64", lambda: paper()(f32(2, 4, 6)), TypeError, r"f: dtype torch.float32 differs.*float64"),
    ("f64-into-f32", lambda: paper(dtype=torch.float32)(x(2, 4, 6)), TypeError, r"f: dtype torch.float64 differs"),
    ("meta-device", lambda: paper()(x(2, 4, 6, device="meta")), ValueError, r"f: device meta differs"),
    ("n_steps=0", lambda: paper()(x(2, 4, 6), n_steps=0), ValueError, r"n_steps \(N_t\).*>= 1"),
    ("n_steps-float", lambda: paper()(x(2, 4, 6), n_steps=1.5), TypeError, r"n_steps \(N_t\)"),
    ("grid=str", lambda: paper()(x(2, 4, 6), grid="paper"), TypeError, r"grid: expected an opsplit Grid"),
    ("nan-parameter", lambda: paper_nan_param()(x(2, 4, 6)), ValueError, r"parameters must be finite.*W\.raw"),
    # the softmax attention's score bound refuses it first (opsplit/operators/_sdpa.py)
    ("overflow", lambda: paper()(x(2, 4, 6) * 1e300), ValueError, r"attention scores .* beyond the range of torch.float64"),
)

CONT = cases(
    ("n_modes=0", lambda: ContinuousTransformer(0), ValueError, r"ContinuousTransformer\.n_modes.*>= 1"),
    ("J=0", lambda: cont(J=0), ValueError, r"ContinuousTransformer\.J.*>= 1"),
    ("N_t=0", lambda: cont(n_steps=0), ValueError, r"n_steps \(N_t\).*>= 1"),
    ("T=0", lambda: cont(T=0.0), ValueError, r"ContinuousTransformer\.T.*> 0"),
    ("T=nan", lambda: cont(T=NAN), ValueError, r"ContinuousTransformer\.T.*finite"),
    ("lx=0", lambda: cont(lx=0.0), ValueError, r"ContinuousTransformer\.lx.*> 0"),
    ("ly<0", lambda: cont(ly=-1.0), ValueError, r"ContinuousTransformer\.ly.*> 0"),
    ("lx=inf", lambda: cont(lx=INF), ValueError, r"ContinuousTransformer\.lx.*finite"),
    ("rule", lambda: cont(rule="simpson"), ValueError, r"rule.*midpoint"),
    ("eps<0", lambda: cont(eps=-1.0), ValueError, r"eps.*>= 0"),
    ("kernel_scale=nan", lambda: cont(kernel_scale=NAN), ValueError, r"ContinuousTransformer\.kernel_scale.*finite"),
    ("kernel_scale=inf", lambda: cont(kernel_scale=INF), ValueError, r"ContinuousTransformer\.kernel_scale.*finite"),
    ("kernel_scale<0", lambda: cont(kernel_scale=-1.0), ValueError, r"ContinuousTransformer\.kernel_scale.*>= 0"),
    ("generator", lambda: cont(generator=0), TypeError, r"ContinuousTransformer\.generator.*torch.Generator"),
    ("dtype=int", lambda: cont(dtype=torch.int32), TypeError, r"ContinuousTransformer\.dtype.*floating"),
    ("trapezoid-1-token", lambda: cont(rule="trapezoid")(x(1, 1, 5)), ValueError, r"f:.*trapezoid.*N_x >= 2"),
    ("rank2-unbatched-bad", lambda: cont()(x(3)), ValueError, r"f: expected shape.*rank 1"),
    ("nan-input", lambda: cont()(x(1, 3, 5, fill=NAN, at=(0, 1, 1))), ValueError, r"f: expected finite"),
    ("f32-into-f64", lambda: cont()(f32(1, 3, 5)), TypeError, r"f: dtype torch.float32 differs"),
    ("sample-nx=0", lambda: cont().sample(x(1, 2, 2), 0, 5), ValueError, r"n.*>= 1"),
)

ENC = cases(
    ("d_model=0", lambda: TorchEncoder(0, 1), ValueError, r"d_model.*>= 1"),
    ("nhead=0", lambda: TorchEncoder(4, 0), ValueError, r"nhead.*>= 1"),
    ("nhead-divides", lambda: TorchEncoder(5, 2), ValueError, r"d_model = 5 must be divisible by nhead = 2"),
    ("dim_feedforward=0", lambda: enc(dim_feedforward=0), ValueError, r"dim_feedforward.*>= 1"),
    ("num_layers=0", lambda: enc(num_layers=0), ValueError, r"num_layers.*>= 1"),
    ("dropout=1", lambda: enc(dropout=1.0), ValueError, r"dropout"),
    ("dropout<0", lambda: enc(dropout=-0.1), ValueError, r"dropout"),
    ("dropout=nan", lambda: enc(dropout=NAN), ValueError, r"dropout"),
    ("activation", lambda: enc(activation="swishy"), ValueError, r"activation.*expected one of"),
    ("layer_norm_eps=0", lambda: enc(layer_norm_eps=0.0), ValueError, r"layer_norm_eps.*> 0"),
    ("layer_norm_eps=nan", lambda: enc(layer_norm_eps=NAN), ValueError, r"layer_norm_eps"),
    ("layer_norm_eps=inf", lambda: enc(layer_norm_eps=INF), ValueError, r"layer_norm_eps.*finite"),
    ("batch_first-str", lambda: enc(batch_first="yes"), TypeError, r"batch_first"),
    ("head_dim=0", lambda: enc(head_dim=0), ValueError, r"head_dim.*>= 1"),
    ("src-rank4", lambda: enc()(x(1, 2, 3, 4, dtype=torch.float32)), ValueError, r"src: expected shape \(B, N, d_model\)"),
    ("src-d_model", lambda: enc()(f32(2, 3, 5)), ValueError, r"src: expected d_model = 4"),
    ("src-empty", lambda: enc()(f32(2, 0, 4)), ValueError, r"src: expected at least one token"),
    ("src-f64", lambda: enc()(x(2, 3, 4)), TypeError, r"src: dtype torch.float64 differs"),
    ("src-int", lambda: enc()(torch.zeros(2, 3, 4, dtype=torch.int32)), TypeError, r"src: expected a floating"),
    ("src-meta", lambda: enc()(f32(2, 3, 4, device="meta")), TypeError, r"src: on device meta"),
    ("src-nan", lambda: enc()(f32(2, 3, 4, fill=NAN, at=(0, 0, 0))), ValueError, r"f: expected finite"),
    ("mask-shape", lambda: enc()(f32(2, 3, 4), mask=torch.zeros(3, 2, dtype=torch.bool)), ValueError, r"src_mask"),
    ("mask-int", lambda: enc()(f32(2, 3, 4), mask=torch.zeros(3, 3, dtype=torch.long)), TypeError, r"src_mask.*dtype torch.int64"),
    ("mask-nan", lambda: enc()(f32(2, 3, 4), mask=torch.full((3, 3), NAN)), ValueError, r"src_mask.*NaN"),
    ("mask-list", lambda: enc()(f32(2, 3, 4), mask=[[0.0]]), TypeError, r"src_mask: expected a torch.Tensor"),
    ("kpm-shape", lambda: enc()(f32(2, 3, 4), src_key_padding_mask=torch.zeros(2, 4, dtype=torch.bool)), ValueError, r"src_key_padding_mask"),
    ("kpm-int", lambda: enc()(f32(2, 3, 4), src_key_padding_mask=torch.zeros(2, 3, dtype=torch.int8)), TypeError, r"src_key_padding_mask.*dtype"),
    ("is_causal-str", lambda: enc()(f32(2, 3, 4), is_causal="yes"), TypeError, r"is_causal"),
    ("mask-and-src_mask", lambda: enc()(f32(2, 3, 4), mask=torch.zeros(3, 3), src_mask=torch.zeros(3, 3)), ValueError, r"`mask` or `src_mask`"),
    ("n_steps=0", lambda: enc()(f32(2, 3, 4), n_steps=0), ValueError, r"n_steps \(N_t\)"),
)

DEC = cases(
    ("memory-d_model", lambda: dec()(f32(2, 3, 4), f32(2, 5, 3)), ValueError, r"memory: expected d_model = 4"),
    ("memory-empty", lambda: dec()(f32(2, 3, 4), f32(2, 0, 4)), ValueError, r"memory.*at least one"),
    ("memory-f64", lambda: dec()(f32(2, 3, 4), x(2, 5, 4)), TypeError, r"memory: dtype torch.float64"),
    ("memory-batch", lambda: dec()(f32(2, 3, 4), f32(3, 5, 4)), ValueError, r"memory.*batch"),
    ("tgt-rank1", lambda: dec()(f32(4), f32(2, 5, 4)), ValueError, r"tgt: expected shape"),
    ("tgt_mask-shape", lambda: dec()(f32(2, 3, 4), f32(2, 5, 4), tgt_mask=torch.zeros(3, 5)), ValueError, r"tgt_mask"),
    ("memory_mask-shape", lambda: dec()(f32(2, 3, 4), f32(2, 5, 4), memory_mask=torch.zeros(3, 3)), ValueError, r"memory_mask"),
    ("memory_kpm-shape", lambda: dec()(f32(2, 3, 4), f32(2, 5, 4), memory_key_padding_mask=torch.zeros(2, 3, dtype=torch.bool)), ValueError, r"memory_key_padding_mask"),
    ("memory-nan", lambda: dec()(f32(2, 3, 4), f32(2, 5, 4, fill=NAN, at=(1, 1, 1))), ValueError, r"memory.*finite"),
)


@pytest.mark.parametrize("case", PAPER_CTOR)
def test_paper_transformer_constructor(case):
    run_case(case)


@pytest.mark.parametrize("case", PAPER_CALL)
def test_paper_transformer_call(case):
    run_case(case)


@pytest.mark.parametrize("case", CONT)
def test_continuous_transformer(case):
    run_case(case)


@pytest.mark.parametrize("case", ENC)
def test_torch_encoder(case):
    run_case(case)


@pytest.mark.parametrize("case", DEC)
def test_torch_decoder(case):
    run_case(case)
