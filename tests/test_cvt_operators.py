"""The pieces of the convolutional transformer (paper 002 §6): 2-D token grids, convolution
integral operators (continuous and discrete kernels), grid transfers, batch norm, attention
with convolutional projections, drop path, the Stages scheme, and §6.2's one-head CvT —
against direct transcriptions (explicit sums over offsets, not F.conv2d), torch modules and
the grid-convergence order of the quadrature."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch import nn

from opsplit import Propagator
from opsplit.controls import LayerwiseConstant, PiecewiseConstant
from opsplit.grid import Grid, ImageGrid, Interval
from opsplit.models import CvT, CvtStageSpec, one_head_cvt
from opsplit.operators import (
    BatchNormMap,
    ContinuousKernel,
    ConvAttention,
    Convolution2d,
    ConvTransfer,
    DropPath,
    FieldDropPath,
    PrependTokens,
    StateDropout,
)
from opsplit.schemes import Hybrid, Lie, Stage, Stages


def naive_conv(u, grid, w, b=None, stride=1, pad=0, groups=1, area=1.0):
    """out[k, c] = area * sum_{offsets, c'} w[c, c', i, j] u[k*s + i - p, c'] + b[c]: torch's
    cross-correlation layout, as explicit sums over the stencil (zero outside the image)."""
    B, _, C = u.shape
    N1, N2 = grid.size
    img = u[:, grid.n_prefix:].reshape(B, N1, N2, C)
    Co, Cg, k1, k2 = w.shape
    M1, M2 = (N1 + 2 * pad - k1) // stride + 1, (N2 + 2 * pad - k2) // stride + 1
    out = torch.zeros(B, M1, M2, Co, dtype=u.dtype)
    per_in, per_out = C // groups, Co // groups
    for m1 in range(M1):
        for m2 in range(M2):
            for i in range(k1):
                for j in range(k2):
                    r, c = m1 * stride + i - pad, m2 * stride + j - pad
                    if 0 <= r < N1 and 0 <= c < N2:
                        for g in range(groups):
                            x = img[:, r, c, g * per_in:(g + 1) * per_in]  # (B, Cg)
                            wg = w[g * per_out:(g + 1) * per_out, :, i, j]  # (per_out, Cg)
                            out[:, m1, m2, g * per_out:(g + 1) * per_out] += x @ wg.t()
    out = area * out
    if b is not None:
        out = out + b
    return out.reshape(B, M1 * M2, Co)


# -- ImageGrid ----------------------------------------------------------------------------------------------
def test_image_grid_layout():
    g = ImageGrid.paper((2, 3), 4, n_prefix=1)
    assert isinstance(g, Grid) and g.nx == 7 and g.ny == 4 and g.size == (2, 3) and g.cell_area == 1.0
    u = torch.arange(2 * 7 * 4, dtype=torch.float64).reshape(2, 7, 4)
    img = g.to_image(u)
    assert img.shape == (2, 4, 2, 3)
    assert img[1, 2, 1, 0] == u[1, 1 + 3 * 1 + 0, 2]  # row-major tokens after the prefix
    back = ImageGrid.from_image(img, u[:, :1])
    assert torch.equal(back, u)
    x1, x2 = ImageGrid.uniform((2, 4), 1, length=(1.0, 2.0)).nodes_2d(torch.float64)
    assert torch.allclose(x1, torch.tensor([0.25] * 4 + [0.75] * 4, dtype=torch.float64))
    assert torch.allclose(x2, torch.tensor([0.25, 0.75, 1.25, 1.75] * 2, dtype=torch.float64))


def test_image_grid_errors():
    with pytest.raises(ValueError, match="trapezoid"):
        ImageGrid.uniform(4, 2, rule="trapezoid")
    with pytest.raises(ValueError, match="n_prefix"):
        ImageGrid.paper(4, 2, n_prefix=-1)
    with pytest.raises(ValueError, match="x interval has 5 nodes"):
        ImageGrid(x=Interval.paper(5), y=Interval.paper(2), rows=Interval.paper(2), cols=Interval.paper(3))
    g = ImageGrid.paper((2, 3), 4)
    with pytest.raises(ValueError, match=r"u: grid/tensor mismatch.*2x3 image"):
        g.with_shape(7, 4, "u")
    with pytest.raises(ValueError, match="N_y = 4 channels, the tensor has 5"):
        g.with_shape(6, 5)


# -- convolution operators -----------------------------------------------------------------------------------
@pytest.mark.parametrize("groups", [1, 2, "depthwise"])
def test_convolution2d_is_the_discrete_integral(groups):
    torch.manual_seed(0)
    C = 4
    g = ImageGrid.uniform((5, 6), C, length=(1.0, 1.5), n_prefix=1)  # h = (0.2, 0.25)
    G = C if groups == "depthwise" else groups
    w, b = torch.randn(C, C // G, 3, 5, dtype=torch.float64), torch.randn(C, dtype=torch.float64)
    u = torch.randn(2, g.nx, C, dtype=torch.float64)
    out = Convolution2d(w, b, groups=groups)(u, grid=g)
    # padding (1, 2) for a 3x5 stencil: explicit per-axis sums
    want = torch.zeros(2, 30, C, dtype=torch.float64)
    img = u[:, 1:].reshape(2, 5, 6, C)
    per = C // G
    for m1 in range(5):
        for m2 in range(6):
            for i in range(3):
                for j in range(5):
                    r, c = m1 + i - 1, m2 + j - 2
                    if 0 <= r < 5 and 0 <= c < 6:
                        for gg in range(G):
                            x = img[:, r, c, gg * per:(gg + 1) * per]
                            want[:, m1 * 6 + m2, gg * per:(gg + 1) * per] += 0.05 * x @ w[gg * per:(gg + 1) * per, :, i, j].t()
    want = want + b
    assert torch.equal(out[:, :1], torch.zeros(2, 1, C, dtype=torch.float64))  # zero on the class token
    torch.testing.assert_close(out[:, 1:], want, rtol=0, atol=1e-12)


def test_shared_depthwise_kernel_and_continuous_orientation():
    """A (1, 1, k, k) depthwise kernel is one scalar kernel for every channel (eq. 42); a
    continuous kernel W(xi) samples (W * u)(x) = sum_m h^2 W(m h) u(x - m h)."""
    g = ImageGrid.uniform((4, 4), 2, length=1.0)
    u = torch.zeros(1, 16, 2, dtype=torch.float64)
    u[0, 5, 0] = 1.0  # a delta at node (1, 1), channel 0
    W = ContinuousKernel(lambda a, b: 1.0 + 10 * a + 100 * b, 0.25, rule="rectangle", dtype=torch.float64)
    out = Convolution2d(W, groups="depthwise")(u, grid=g).reshape(4, 4, 2)
    # (W * delta)(x) = h^2 W(x - x_delta): at node (2, 1) the offset is (+h, 0)
    h = 0.25
    assert out[2, 1, 0] == pytest.approx(h * h * (1 + 10 * h))
    assert out[1, 2, 0] == pytest.approx(h * h * (1 + 100 * h))
    assert out[0, 1, 0] == pytest.approx(h * h * (1 - 10 * h))
    assert torch.all(out[..., 1] == 0)
    w = torch.randn(1, 1, 3, 3, dtype=torch.float64)
    v = torch.randn(2, 16, 2, dtype=torch.float64)
    shared = Convolution2d(w, groups="depthwise")(v, grid=g)
    full = Convolution2d(w.expand(2, 1, 3, 3).clone(), groups="depthwise")(v, grid=g)
    torch.testing.assert_close(shared, full, rtol=0, atol=0)


SIGMA, R = 0.15, 0.25


def _conv_error(n: int, rule: str) -> float:
    """Max nodal error of the continuous-kernel operator against the exact integral (separable
    kernel and data: two 1-D integrals by composite Gauss-Legendre), see
    benchmarks/cvt_convergence.py."""

    def g1(x):
        return torch.exp(-x * x / (2 * SIGMA**2)) * (1 + x)

    def g2(x):
        return torch.exp(-x * x / (2 * SIGMA**2)) * (1 - 0.5 * x)

    def a(s):
        return np.where((s > 0) & (s < 1), np.sin(np.pi * s) ** 4, 0.0)

    def bb(s):
        return np.where((s > 0) & (s < 1), np.sin(np.pi * s) ** 4 * (1 + s), 0.0)

    def ref(g, f, x):
        xg, wg = np.polynomial.legendre.leggauss(50)
        edges = np.linspace(-R, R, 9)
        tot = np.zeros_like(x)
        for lo, hi in zip(edges[:-1], edges[1:]):
            xi, w = 0.5 * (hi - lo) * xg + 0.5 * (hi + lo), 0.5 * (hi - lo) * wg
            tot += (f(x[:, None] - xi[None, :]) * (g(torch.from_numpy(xi)).numpy() * w)[None, :]).sum(1)
        return tot

    grid = ImageGrid.uniform(n, 1, length=1.0)
    op = Convolution2d(ContinuousKernel(lambda x1, x2: g1(x1) * g2(x2), R, rule=rule, dtype=torch.float64),
                       groups="depthwise")
    x = grid.rows.nodes(torch.float64).numpy()
    u = torch.from_numpy(np.outer(a(x), bb(x))).reshape(1, n * n, 1)
    out = op(u, grid=grid).reshape(n, n).numpy()
    return float(np.abs(out - np.outer(ref(g1, a, x), ref(g2, bb, x))).max())


@pytest.mark.parametrize("rule,order", [("trapezoid", 2), ("rectangle", 1)])
def test_continuous_kernel_converges_at_the_rule_order(rule, order):
    errs = [_conv_error(n, rule) for n in (32, 64, 128)]
    measured = math.log2(errs[-2] / errs[-1])
    assert abs(measured - order) <= 0.15, (rule, errs, measured)
    assert errs[-1] < errs[0]


def test_conv_transfer_is_a_strided_restriction():
    torch.manual_seed(1)
    g = ImageGrid.paper((8, 4), 3, n_prefix=1)
    w, b = torch.randn(5, 3, 3, 3, dtype=torch.float64), torch.randn(5, dtype=torch.float64)
    op = ConvTransfer(w, b, stride=2, padding=1)
    u = torch.randn(2, g.nx, 3, dtype=torch.float64)
    tg = op.target_grid(g)
    assert tg.size == (4, 2) and tg.ny == 5 and tg.n_prefix == 0  # the class token ends with its stage
    out = op(u, grid=g)
    torch.testing.assert_close(out, naive_conv(u, g, w, b, stride=2, pad=1), rtol=0, atol=1e-12)
    keep = ConvTransfer(w[:3, :1], stride=2, padding=1, groups="depthwise", prefix="keep")
    out = keep(u, grid=g)
    assert keep.target_grid(g).n_prefix == 1 and torch.equal(out[:, :1], u[:, :1])
    torch.testing.assert_close(out[:, 1:], naive_conv(u, g, w[:3, :1], stride=2, pad=1, groups=3), rtol=0,
                               atol=1e-12)
    mg = ConvTransfer(w, b, stride=2, padding=1, spacing="stride").target_grid(ImageGrid.uniform((8, 4), 3))
    assert mg.rows.length == pytest.approx(1.0) and mg.rows.n == 4  # the multigrid view: same length (shifted)


@pytest.mark.parametrize("n1, n2, k, s, p", [(7, 5, 3, 2, 1), (15, 15, 3, 2, 1), (10, 13, 4, 3, 0), (9, 6, 7, 4, 2),
                                             (5, 11, 2, 2, 2), (6, 6, 1, 3, 0), (2, 3, 3, 2, 1), (1, 1, 3, 2, 1)])
def test_conv_transfer_on_any_size(n1, n2, k, s, p):
    """Sizes the stride does not divide: N' = the number of stencil positions that fit in the
    padded grid, the values are the explicit stencil sums, and the coarse nodes are the
    stencil centres x_0 + (ms - p + (k - 1)/2) h (a box average of affine data returns the
    data at ``node_positions`` wherever the stencil lies inside the image)."""
    torch.manual_seed(3)
    g = ImageGrid.paper((n1, n2), 2, n_prefix=1)
    w, b = torch.randn(3, 2, k, k, dtype=torch.float64), torch.randn(3, dtype=torch.float64)
    op = ConvTransfer(w, b, stride=s, padding=p)
    fits = [len([m for m in range(n + 2 * p) if m * s + k <= n + 2 * p]) for n in (n1, n2)]
    assert op.target_grid(g).size == tuple(fits)
    u = torch.randn(2, g.nx, 2, dtype=torch.float64)
    torch.testing.assert_close(op(u, grid=g), naive_conv(u, g, w, b, stride=s, pad=p), rtol=0, atol=1e-12)
    # node positions, on a grid of spacing h = (1.3 / n1, 0.7 / n2)
    gu = ImageGrid.uniform((n1, n2), 1, length=(1.3, 0.7))
    h1, h2 = gu.rows.spacing, gu.cols.spacing
    box = ConvTransfer(torch.full((1, 1, k, k), 1.0 / (k * k * h1 * h2), dtype=torch.float64), stride=s, padding=p)
    x1, x2 = gu.nodes_2d(torch.float64)
    data = (2.0 + 3.0 * x1 - 5.0 * x2).reshape(1, -1, 1)
    out = box(data, grid=gu)
    m1, m2 = fits
    out = out.reshape(m1, m2)
    r, c = box.node_positions(gu, torch.float64)
    assert r.shape == (m1,) and c.shape == (m2,)
    inside1 = [m for m in range(m1) if m * s - p >= 0 and m * s - p + k <= n1]
    inside2 = [m for m in range(m2) if m * s - p >= 0 and m * s - p + k <= n2]
    want = 2.0 + 3.0 * r[:, None] - 5.0 * c[None, :]
    torch.testing.assert_close(out[inside1][:, inside2], want[inside1][:, inside2], rtol=0, atol=1e-12)
    # the multigrid view: spacing s h, the coarse Interval a translation of the stencil centres by
    # a = ((k - s)/2 - p) h (cell-centred nodes)
    st = ConvTransfer(box.weight.value, stride=s, padding=p, spacing="stride")
    tg = st.target_grid(gu)
    assert tg.rows.spacing == pytest.approx(s * h1) and tg.cols.spacing == pytest.approx(s * h2)
    torch.testing.assert_close(r - tg.rows.nodes(torch.float64), torch.full((m1,), ((k - s) / 2 - p) * h1,
                                                                            dtype=torch.float64), rtol=0, atol=1e-12)
    torch.testing.assert_close(c - tg.cols.nodes(torch.float64), torch.full((m2,), ((k - s) / 2 - p) * h2,
                                                                            dtype=torch.float64), rtol=0, atol=1e-12)


def test_transfer_errors():
    g = ImageGrid.paper((6, 4), 3)
    with pytest.raises(ValueError, match=r"the kernel \(9\) is larger than the padded image \(height N_1 = 6"):
        ConvTransfer(torch.zeros(5, 3, 9, 3), stride=4, padding=1).check(g)
    with pytest.raises(ValueError, match=r"kernel \(6\) is larger than the padded image \(width N_2 = 4"):
        ConvTransfer(torch.zeros(5, 3, 3, 6), stride=4).check(g)
    with pytest.raises(ValueError, match="channel mismatch.*the state has N_y = 3"):
        ConvTransfer(torch.zeros(5, 2, 3, 3)).check(g)
    with pytest.raises(ValueError, match="continuous kernel needs stride 1"):
        ConvTransfer(ContinuousKernel(lambda a, b: a + b, 1.0), stride=2)
    with pytest.raises(ValueError, match="expected an ImageGrid"):
        ConvTransfer(torch.zeros(5, 3, 3, 3)).check(Grid.paper(4, 3))
    with pytest.raises(ValueError, match="channel mismatch: the tokens have 4 channels"):
        PrependTokens(torch.zeros(1, 4)).check(g)
    with pytest.raises(ValueError, match="odd kernel sizes"):
        Convolution2d(torch.zeros(3, 3, 2, 3))
    with pytest.raises(ValueError, match="must keep N_y = 3"):
        Convolution2d(torch.zeros(4, 3, 3, 3)).check(g)
    with pytest.raises(ValueError, match="groups"):
        Convolution2d(torch.zeros(3, 3, 3, 3), groups=0)
    with pytest.raises(ValueError, match="finite"):
        Convolution2d(torch.tensor([[[[float("nan")]]]]))
    op = Convolution2d(torch.zeros(3, 3, 3, 3))
    with pytest.raises(ValueError, match="grid/tensor mismatch"):
        op(torch.zeros(1, 23, 3), grid=g)


# -- batch norm, drop path ------------------------------------------------------------------------------------
def test_batchnorm_map_is_batchnorm2d():
    torch.manual_seed(2)
    C = 3
    ref = nn.BatchNorm2d(C, momentum=0.2).double()
    with torch.no_grad():
        ref.weight.uniform_(0.5, 1.5)
        ref.bias.normal_()
    op = BatchNormMap(C, n_pieces=2, momentum=0.2, dtype=torch.float64)
    with torch.no_grad():
        op.weight.raw[1].copy_(ref.weight)
        op.bias.raw[1].copy_(ref.bias)
    g = ImageGrid.paper((4, 5), C, n_prefix=1)
    u = torch.randn(2, g.nx, C, dtype=torch.float64)
    for mode in (True, False):
        ref.train(mode)
        op.train(mode)
        out = op.flow(1.5, 1.0, u, g)  # t = 1.5: piece 1
        want = ref(g.to_image(u))
        torch.testing.assert_close(g.to_image(out), want, rtol=0, atol=1e-12)
        assert torch.equal(out[:, :1], u[:, :1])
        torch.testing.assert_close(op.running_mean[1], ref.running_mean, rtol=0, atol=1e-14)
        torch.testing.assert_close(op.running_var[1], ref.running_var, rtol=0, atol=1e-14)
    assert torch.equal(op.running_mean[0], torch.zeros(C, dtype=torch.float64))  # piece 0 untouched
    a, c = op.affine(1.5)
    torch.testing.assert_close(g.to_image(out), a.view(1, C, 1, 1) * g.to_image(u) + c.view(1, C, 1, 1))
    with pytest.raises(ValueError, match="channel mismatch: 3 channels, the grid has N_y = 4"):
        op.check(ImageGrid.paper(2, 4))


def test_drop_path_maps():
    u = torch.ones(4000, 1, 1, dtype=torch.float64)
    g = ImageGrid.paper(1, 1)
    dp = DropPath([0.0, 0.5], t0=0.0, t1=2.0).eval()
    assert torch.equal(dp.flow(1.2, 1.0, u, g), u)  # eval: identity
    dp.train()
    assert torch.equal(dp.flow(0.5, 1.0, u, g), u)  # rate 0 on the first piece
    out = dp.flow(1.5, 1.0, u, g)
    assert set(out.unique().tolist()) == {0.0, 2.0} and abs(out.mean().item() - 1.0) < 0.1
    sd = StateDropout(0.25).train()
    assert abs(sd.flow(0, 1.0, torch.ones(1, 4000, 1), g).mean().item() - 1.0) < 0.1
    with pytest.raises(ValueError, match="rate 0 <= p < 1"):
        DropPath(1.0)
    with pytest.raises(TypeError, match="with a field"):
        FieldDropPath(dp, 0.1)


# -- attention with convolutional projections -------------------------------------------------------------------
def test_conv_attention_is_eq_42_with_cvt_projections():
    """Q, K, V: depthwise convolution (strided for K and V), batch norm (eval: affine), pointwise
    linear maps; softmax over the coarse keys with scale 1/sqrt(N_y); class token skips the
    convolutions — written out with explicit sums."""
    torch.manual_seed(3)
    E, H = 6, 2
    d = E // H
    g = ImageGrid.paper((4, 4), E, n_prefix=1)
    wq, wk, wv = (torch.randn(E, 1, 3, 3, dtype=torch.float64) for _ in range(3))
    bn = [BatchNormMap(E, dtype=torch.float64).eval() for _ in range(3)]
    with torch.no_grad():
        for m in bn:
            m.weight.raw.uniform_(0.5, 1.5)
            m.bias.raw.normal_()
            m.running_mean.normal_()
            m.running_var.uniform_(0.5, 2.0)
    W = [torch.randn(E, H, d, dtype=torch.float64) for _ in range(3)]
    WO, bO = torch.randn(H, d, E, dtype=torch.float64), torch.randn(E, dtype=torch.float64)
    op = ConvAttention(*W, WO, bO=bO,
                       q_proj=[ConvTransfer(wq, padding=1, groups="depthwise", prefix="keep"), bn[0]],
                       k_proj=[ConvTransfer(wk, stride=2, padding=1, groups="depthwise", prefix="keep"), bn[1]],
                       v_proj=[ConvTransfer(wv, stride=2, padding=1, groups="depthwise", prefix="keep"), bn[2]])
    u = torch.randn(2, g.nx, E, dtype=torch.float64)
    out = op(u, grid=g)

    def proj(w, stride, m):
        a, c = m.affine(0.0)
        x = naive_conv(u, g, w, stride=stride, pad=1, groups=E) * a + c
        return torch.cat([u[:, :1], x], 1)

    q, k, v = proj(wq, 1, bn[0]), proj(wk, 2, bn[1]), proj(wv, 2, bn[2])
    assert k.shape[1] == 1 + 4
    Q = torch.einsum("bne,ehd->bhnd", q, W[0])
    K = torch.einsum("bne,ehd->bhnd", k, W[1])
    V = torch.einsum("bne,ehd->bhnd", v, W[2])
    gamma = torch.softmax(Q @ K.transpose(-1, -2) / math.sqrt(E), -1)
    want = torch.einsum("bhnd,hde->bne", gamma @ V, WO) + bO
    torch.testing.assert_close(out, want, rtol=0, atol=1e-12)
    with pytest.raises(ValueError, match="must keep the prefix"):
        ConvAttention(*W, WO, q_proj=ConvTransfer(wq, padding=1, groups="depthwise"))
    strided = ConvTransfer(wk, stride=2, padding=1, groups="depthwise", prefix="keep")
    with pytest.raises(ValueError, match="key and value projections give different token grids"):
        ConvAttention(*W, WO, k_proj=strided)(u, grid=g)  # values on the fine grid, keys on the coarse one
    with pytest.raises(ValueError, match="query projection must keep the token grid"):
        ConvAttention(*W, WO, q_proj=strided, k_proj=strided, v_proj=strided)(u, grid=g)


# -- gradcheck (float64) --------------------------------------------------------------------------------------
def _gradcheck(fn, *inputs, fast=False):
    assert torch.autograd.gradcheck(fn, inputs, eps=1e-6, atol=1e-7, rtol=1e-5, fast_mode=fast)


def test_gradcheck_convolutions():
    torch.manual_seed(4)
    g = ImageGrid.uniform((3, 4), 2, length=1.0, n_prefix=1)
    u = torch.randn(1, g.nx, 2, dtype=torch.float64, requires_grad=True)
    w = torch.randn(2, 1, 3, 3, dtype=torch.float64, requires_grad=True)
    b = torch.randn(2, dtype=torch.float64, requires_grad=True)
    _gradcheck(lambda u, w, b: Convolution2d(w, b, groups="depthwise").field(0.0, u, g), u, w, b)
    w2 = torch.randn(3, 2, 3, 3, dtype=torch.float64, requires_grad=True)
    _gradcheck(lambda u, w, b: ConvTransfer(w, b[:1].expand(3), stride=(1, 2), padding=1).flow(0.0, 1.0, u, g),
               u, w2, b)

    class Gauss(nn.Module):
        def __init__(self):
            super().__init__()
            self.s = nn.Parameter(torch.tensor(0.3, dtype=torch.float64))

        def forward(self, a, c):
            return torch.exp(-(a * a + c * c) / self.s**2)

    k = ContinuousKernel(Gauss(), 0.5, channels=(2, 1), dtype=torch.float64)
    op = Convolution2d(k, groups="depthwise")
    assert any(p is k.fn.s for p in op.parameters())  # an nn.Module kernel trains with the operator
    _gradcheck(lambda u: op.field(0.0, u, g), u)

    def through_kernel(u, s):
        kk = ContinuousKernel(lambda a, c: torch.exp(-(a * a + c * c) / s**2) * (1 + a), 0.5, channels=(2, 1),
                              dtype=torch.float64)
        return Convolution2d(kk, groups="depthwise").field(0.0, u, g)

    _gradcheck(through_kernel, u, torch.tensor(0.3, dtype=torch.float64, requires_grad=True))
    tokens = torch.randn(1, 2, dtype=torch.float64, requires_grad=True)
    _gradcheck(lambda u, v: PrependTokens(v).flow(0.0, 1.0, u, g), u, tokens)


@pytest.mark.parametrize("train", [False, True])
def test_gradcheck_batchnorm_and_attention(train):
    torch.manual_seed(5)
    E = 4
    g = ImageGrid.paper((2, 4), E, n_prefix=1)
    u = torch.randn(3, g.nx, E, dtype=torch.float64, requires_grad=True)
    bn = BatchNormMap(E, dtype=torch.float64).train(train)
    _gradcheck(lambda u: bn.flow(0.0, 1.0, u, g), u, fast=True)
    wk = torch.randn(E, 1, 3, 3, dtype=torch.float64, requires_grad=True)
    W = torch.randn(E, 2, 2, dtype=torch.float64, requires_grad=True)
    WO = torch.randn(2, 2, E, dtype=torch.float64)

    def attn(u, wk, W):
        def kv():
            return [ConvTransfer(wk, stride=2, padding=1, groups="depthwise", prefix="keep"),
                    BatchNormMap(E, dtype=torch.float64).train(train)]

        op = ConvAttention(W, W * 0.5, W * 0.7, WO, k_proj=kv(), v_proj=kv())
        op.check(g)
        return op.field(0.0, u, g)

    _gradcheck(attn, u, wk, W, fast=True)


def test_gradcheck_drop_path_in_training():
    g = ImageGrid.paper((2, 2), 3)
    u = torch.randn(4, 4, 3, dtype=torch.float64, requires_grad=True)
    dp, sd = DropPath(0.5).train(), StateDropout(0.3).train()

    def fn(u):  # one fixed draw per evaluation
        torch.manual_seed(0)
        return sd.flow(0.0, 1.0, dp.flow(0.0, 1.0, u, g), g)

    _gradcheck(fn, u)


def test_layerwise_constant_is_piecewise_constant():
    v = torch.randn(3, 2, 4, dtype=torch.float64)
    a, b = LayerwiseConstant(v, t0=1.0, t1=4.0), PiecewiseConstant(v, t0=1.0, t1=4.0)
    for t in (1.0, 1.5, 2.0, 2.999, 3.0, 4.0):
        assert torch.equal(a(t), b(t)) and a.piece(t) == b.piece(t)
    assert a.shape == (2, 4) and a.n_pieces == 3 and torch.equal(a.values, v)
    assert len(list(a.parameters())) == 3  # one parameter per piece
    (a(1.2).sum() + 2 * a(3.5).sum()).backward()
    assert torch.equal(a.pieces[0].grad, torch.ones(2, 4, dtype=torch.float64)) and a.pieces[1].grad is None
    with pytest.raises(ValueError, match="outside its time interval"):
        a(4.5)
    with pytest.raises(ValueError, match="finite"):
        LayerwiseConstant(torch.tensor([[float("inf")]]))
    with pytest.raises(ValueError, match="t0 < t1"):
        LayerwiseConstant(v, t0=1.0, t1=1.0)


# -- the Stages scheme and grid-threading -----------------------------------------------------------------------
def _tiny_stages():
    w = torch.randn(3, 2, 3, 3, dtype=torch.float64) * 0.3
    conv = ConvTransfer(w, stride=2, padding=1)
    body1 = Lie([Convolution2d(torch.randn(2, 2, 3, 3, dtype=torch.float64) * 0.1)])
    body2 = Lie([Convolution2d(torch.randn(3, 1, 3, 3, dtype=torch.float64) * 0.1, groups="depthwise")])
    return Stages([Stage(body1, 2), Stage(body2, 1, entry=Hybrid([[conv]]))])


def test_stages_thread_the_grid():
    torch.manual_seed(6)
    st = _tiny_stages()
    g = ImageGrid.paper((4, 4), 2)
    prop = Propagator(st, st.n_steps, t1=st.t1, grid=g)
    f = torch.randn(2, 16, 2, dtype=torch.float64)
    out = prop(f)
    assert out.shape == (2, 4, 3)
    # by hand: two Euler steps of stage 1, the transfer, one Euler step of stage 2
    c1 = st.stages[0].body.substeps[0].terms[0]
    c2 = st.stages[1].body.substeps[0].terms[0]
    tr = st.stages[1].entry.substeps[0].terms[0]
    u = f
    for _ in range(2):
        u = u + c1.field(0.0, u, g)
    g2 = tr.target_grid(g)
    u = tr.flow(2.0, 1.0, u, g)
    u = u + c2.field(2.0, u, g2)
    torch.testing.assert_close(out, u, rtol=0, atol=0)
    # N_t = 6 (dt = 1/2) puts a step boundary at the stage change; N_t = 2 does not
    assert prop(f, n_steps=6).shape == (2, 4, 3)
    with pytest.raises(ValueError, match="crosses the stage change at t = 2"):
        prop(f, n_steps=2)
    with pytest.raises(ValueError, match="return_trajectory"):
        prop(f, return_trajectory=True)
    sched = str(st.schedule(g))
    assert "ImageGrid(2x2, h=(1, 1), N_y=3)" in sched and "ConvTransfer" in sched


def test_grid_transfer_needs_a_threading_scheme():
    conv = ConvTransfer(torch.zeros(3, 2, 3, 3), stride=2, padding=1)
    with pytest.raises(ValueError, match="moves the state to another grid"):
        Lie([conv])
    with pytest.raises(ValueError, match="only substep of its group"):
        Hybrid([[conv, Convolution2d(torch.zeros(2, 2, 1, 1))]])
    with pytest.raises(TypeError, match="Stage.body"):
        Stage(conv, 1)


# -- a CvT built without Hugging Face: dtype, device, autograd --------------------------------------------------
def test_cvt_from_specs(device, dtype):
    torch.manual_seed(7)
    specs = [CvtStageSpec(3, 8, 1, 2, patch_size=3, patch_stride=2, patch_padding=1),
             CvtStageSpec(8, 12, 2, 3, patch_size=3, patch_stride=2, patch_padding=1, cls_token=True)]
    model = CvT(3, specs, num_labels=4, device=device, dtype=dtype)
    x = torch.randn(2, 3, 16, 16, device=device, dtype=dtype, requires_grad=True)
    out = model(x)
    assert out.last_hidden_state.shape == (2, 12, 4, 4) and out.cls_token_value.shape == (2, 1, 12)
    assert out.logits.shape == (2, 4) and out.logits.dtype == dtype and out.logits.device.type == device.type
    out.logits.sum().backward()
    assert x.grad is not None and all(p.grad is not None for p in model.parameters() if p.requires_grad)
    assert "stage 2" in str(model.schedule(16))


# -- paper 002 §6.2: the one-head CvT ------------------------------------------------------------------------------
def _shared_conv(u, size, w):
    """Each channel convolved with the one scalar kernel w (k x k), zero padding, explicit sums."""
    B, _, C = u.shape
    N1, N2 = size
    img = u.reshape(B, N1, N2, C)
    k = w.shape[0]
    p = k // 2
    out = torch.zeros_like(img)
    for i in range(k):
        for j in range(k):
            di, dj = i - p, j - p
            src = torch.zeros_like(img)
            r0, r1 = max(0, -di), min(N1, N1 - di)
            c0, c1 = max(0, -dj), min(N2, N2 - dj)
            src[:, r0:r1, c0:c1] = img[:, r0 + di:r1 + di, c0 + dj:c1 + dj]
            out = out + w[i, j] * src
    return out.reshape(B, N1 * N2, C)


def test_one_head_cvt_is_eqs_42_and_13_to_17():
    """§6.2's one-head, one-stage CvT without convolutional token embedding: eq. (42)'s
    Q = W^Q * u (one scalar kernel), softmax attention with 1/sqrt(|Omega_y|), then eqs.
    (14)-(17) as in paper_reference.py (with the LayerNorm eps and a per-feature bias)."""
    torch.manual_seed(8)
    size, C, J, n = (3, 4), 5, 2, 2
    model = one_head_cvt(size, C, J=J, n_steps=n, dtype=torch.float64)
    f = torch.randn(2, 12, C, dtype=torch.float64)
    out = model(f)
    attn = model.scheme.substeps[0].terms[0]
    ffn = [s.terms[0] for s in model.scheme.substeps[2].terms[0].steps]

    def ln(v, eps=1e-5):
        m = v.mean(-1, keepdim=True)
        return (v - m) / torch.sqrt(((v - m) ** 2).mean(-1, keepdim=True) + eps)

    u = f
    for s in range(n):
        q = _shared_conv(u, size, attn.q_proj[0].weight.pieces[s][0, 0])
        k = _shared_conv(u, size, attn.k_proj[0].weight.pieces[s][0, 0])
        v = _shared_conv(u, size, attn.v_proj[0].weight.pieces[s][0, 0])
        u1 = u + torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(C), -1) @ v  # (42), (13)
        u2 = ln(u1)  # (14)
        z = u2
        for layer in ffn:
            z = torch.relu(z + z @ layer.W.pieces[s] + layer.b.pieces[s])  # (15)
        u = ln(0.5 * (z + u2))  # (16), (17)
    torch.testing.assert_close(out, u, rtol=0, atol=1e-12)
    torch.manual_seed(8)
    again = one_head_cvt(size, C, J=J, n_steps=n, dtype=torch.float64)
    assert torch.equal(again(f), out)  # seeded: reproducible
    assert isinstance(attn, ConvAttention)


def test_cvt_converges_in_dt_at_the_scheme_order():
    """The CvT is a continuous model: refining N_t (every stage change stays a step time)
    converges at the order of its scheme (Lie splitting with explicit-Euler substeps: 1);
    measured from successive differences, dt = 1/2 ... 1/16."""
    torch.manual_seed(0)
    specs = [CvtStageSpec(3, 8, 1, 2, patch_size=3, patch_stride=2, patch_padding=1),
             CvtStageSpec(8, 12, 2, 3, patch_size=3, patch_stride=2, patch_padding=1, cls_token=True)]
    model = CvT(3, specs, dtype=torch.float64).eval()
    assert model.scheme.effective_order == 1
    g = model.input_grid((16, 16))
    f = ImageGrid.from_image(torch.randn(2, 3, 16, 16, dtype=torch.float64))
    with torch.no_grad():
        us = [model.propagator(f, grid=g, n_steps=3 * 2**k) for k in range(1, 5)]
    d = [float((a - b).abs().max()) for a, b in zip(us[:-1], us[1:])]
    order = math.log2(d[-2] / d[-1])
    assert abs(order - 1) <= 0.15, (d, order)
