"""Multi-head attention (paper 002 eqs. 37-41; seed 000 eqs. 9, 12) against independent
references: a loop transcription of eq. (38) with explicit quadrature, torch's
nn.MultiheadAttention, and eq. (41) written out literally."""

from __future__ import annotations

import math

import pytest
import torch
from attention_reference import naive_multihead
from torch import nn

from opsplit import Grid, Interval, Propagator
from opsplit.controls import PiecewiseConstant
from opsplit.models import from_torch, paper_scheme
from opsplit.operators import (
    ContextGrid,
    FFNIntegral,
    MultiHeadAttention,
    ProjectionS1,
)

F64 = torch.float64


def _op(Ny, H, dk, dv, *, WO=True, bias=True, dtype=F64, seed=0, **kw):
    g = torch.Generator().manual_seed(seed)

    def r(*s):
        return torch.randn(*s, generator=g, dtype=dtype) * 0.5

    ws = dict(WQ=r(Ny, H, dk), WK=r(Ny, H, dk), WV=r(Ny, H, dv), WO=r(H, dv, Ny) if WO else None)
    bs = dict(bQ=r(H, dk), bK=r(H, dk), bV=r(H, dv), bO=r(Ny)) if bias else {}
    return MultiHeadAttention(*ws.values(), **bs, **kw), {**ws, **bs}


GRIDS = {
    "paper L=N": lambda nx, ny, nh: Grid.paper(nx, ny, nh),
    "uniform L fixed": lambda nx, ny, nh: Grid.uniform(nx, ny, lx=2.0, ly=3.0, nh=nh, lh=0.5),
    "trapezoid": lambda nx, ny, nh: Grid.uniform(nx, ny, lx=1.0, ly=1.0, rule="trapezoid", nh=nh, lh=1.0),
}


@pytest.mark.parametrize("grid_name", list(GRIDS))
@pytest.mark.parametrize("bias", [True, False])
def test_field_is_eq38_with_quadrature(grid_name, bias):
    B, N, Ny, H, dk, dv = 2, 5, 6, 3, 2, 4
    g = GRIDS[grid_name](N, Ny, H)
    op, w = _op(Ny, H, dk, dv, bias=bias, scale=0.7)
    u = torch.randn(B, N, Ny, dtype=F64)
    got = op.field(0.0, u, g)
    ref = naive_multihead(
        u, **w, scale=0.7, wy=g.y.weights(F64), wk=g.x.weights(F64), wh=g.h.weights(F64)
    )
    torch.testing.assert_close(got, ref, rtol=1e-12, atol=1e-12)


def test_value_kernels_are_the_folded_products():
    op, w = _op(5, 2, 3, 3)
    K = op.value_kernels()
    for m in range(2):
        torch.testing.assert_close(K[m], w["WV"][:, m, :] @ w["WO"][m])


def test_paper_eq41_literally():
    """WO=None, qk_inner='y', L=N: u + sum_m Softmax(s Q_m K_m^T) V_m with N_y x N_y kernels."""
    B, N, Ny, H = 2, 4, 5, 3
    torch.manual_seed(1)
    Wq, Wk, Wv = (torch.randn(Ny, Ny, H, dtype=F64) * 0.4 for _ in range(3))  # paper layout W(xi, y, h)
    op = MultiHeadAttention(*(W.permute(0, 2, 1) for W in (Wq, Wk, Wv)), None, qk_inner="y")
    u = torch.randn(B, N, Ny, dtype=F64)
    s = 1 / math.sqrt(Ny)  # eq. (37): 1/sqrt(|Omega_y|), L_y = N_y
    ref = u.clone()
    for m in range(H):
        Q, K, V = u @ Wq[..., m], u @ Wk[..., m], u @ Wv[..., m]
        ref = ref + torch.softmax(s * Q @ K.transpose(1, 2), -1) @ V
    got = u + op.field(0.0, u, Grid.paper(N, Ny))
    torch.testing.assert_close(got, ref, rtol=1e-12, atol=1e-12)
    # on a refined grid the Omega_y inner product carries the y-weight (eq. 37)
    g = Grid.uniform(N, Ny, ly=2.0)
    ref2 = naive_multihead(u, Wq.permute(0, 2, 1), Wk.permute(0, 2, 1), Wv.permute(0, 2, 1), None,
                           scale=1 / math.sqrt(2.0), wy=g.y.weights(F64), qk_weights=g.y.weights(F64))
    torch.testing.assert_close(op.field(0.0, u, g), ref2, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("mask_kind", ["none", "bool", "float", "causal+padding", "3d per head"])
def test_matches_nn_multiheadattention(dtype, mask_kind):
    torch.manual_seed(2)
    E, H, B, N = 12, 3, 3, 6
    mha = nn.MultiheadAttention(E, H, batch_first=True, dtype=dtype).eval()
    with torch.no_grad():
        mha.in_proj_bias.normal_()
        mha.out_proj.bias.normal_()
    op = from_torch(mha)
    x = torch.randn(B, N, E, dtype=dtype, requires_grad=True)
    am = kpm = None
    if mask_kind == "bool":
        am = torch.rand(N, N) < 0.3
        am.fill_diagonal_(False)
    elif mask_kind == "float":
        am = torch.randn(N, N, dtype=dtype)
    elif mask_kind == "causal+padding":
        am = nn.Transformer.generate_square_subsequent_mask(N, dtype=dtype)
        kpm = torch.zeros(B, N, dtype=torch.bool)
        kpm[1, -2:] = True
        kpm = torch.zeros(B, N, dtype=dtype).masked_fill(kpm, float("-inf"))
    elif mask_kind == "3d per head":
        am = torch.rand(B * H, N, N) < 0.3
        am[:, :, 0] = False
    ref = mha(x, x, x, attn_mask=am, key_padding_mask=kpm, need_weights=False)[0]
    g = ContextGrid.of(Grid.paper(N, E), attn_mask=am, key_padding_mask=kpm)
    got = op.field(0.0, x, g)
    tol = dict(rtol=0, atol=1e-5) if dtype == torch.float32 else dict(rtol=0, atol=1e-10)
    torch.testing.assert_close(got, ref, **tol)
    (gx_ref,) = torch.autograd.grad((ref * torch.cos(ref)).sum(), x)
    (gx,) = torch.autograd.grad((got * torch.cos(got)).sum(), x)
    torch.testing.assert_close(gx, gx_ref, **tol)


def test_causal_flag_is_autoregressive_and_matches_mask():
    """seed 000 eq. (9): the output at token i depends on tokens j <= i only."""
    B, N, Ny, H = 2, 6, 4, 2
    op, w = _op(Ny, H, 2, 2, causal=True, scale=0.5)
    u = torch.randn(B, N, Ny, dtype=F64)
    g = Grid.paper(N, Ny, H)
    y = op.field(0.0, u, g)
    allowed = torch.ones(B, H, N, N, dtype=torch.bool).tril_()
    torch.testing.assert_close(y, naive_multihead(u, **w, scale=0.5, allowed=allowed), rtol=1e-12, atol=1e-12)
    v = u.clone()
    v[:, 3:] += torch.randn(B, N - 3, Ny, dtype=F64)
    torch.testing.assert_close(op.field(0.0, v, g)[:, :3], y[:, :3], rtol=0, atol=0)
    assert (op.field(0.0, v, g)[:, 3:] - y[:, 3:]).abs().max() > 1e-3


@pytest.mark.parametrize("source", [None, Interval(length=1.0, rule="trapezoid")])
def test_cross_attention_reads_memory_on_its_own_domain(source):
    """seed 000 eq. (12): queries from u, keys/values from the memory m on Omega_s (N_s != N_x)."""
    B, N, Ns, Ny, H = 2, 4, 7, 6, 2
    op, w = _op(Ny, H, 3, 3, memory="mem", key_padding_mask="mkpm", scale=0.6, source=source)
    u = torch.randn(B, N, Ny, dtype=F64)
    m = torch.randn(B, Ns, Ny, dtype=F64)
    kpm = torch.zeros(B, Ns, dtype=torch.bool)
    kpm[0, -3:] = True
    g = ContextGrid.of(Grid.paper(N, Ny), mem=m, mkpm=kpm)
    allowed = (~kpm).view(B, 1, 1, Ns).expand(B, H, N, Ns)
    wk = None if source is None else source.with_n(Ns).weights(F64)
    ref = naive_multihead(u, **w, scale=0.6, memory=m, allowed=allowed, wk=wk)
    torch.testing.assert_close(op.field(0.0, u, g), ref, rtol=1e-12, atol=1e-12)


def test_attention_weights_are_a_probability_map():
    op, _ = _op(6, 3, 2, 2, causal=True)
    u = torch.randn(2, 5, 6, dtype=F64)
    A = op.attention_weights(u, grid=Grid.uniform(5, 6, rule="trapezoid"))
    assert A.shape == (2, 3, 5, 5)
    torch.testing.assert_close(A.sum(-1), torch.ones(2, 3, 5, dtype=F64))
    assert bool((A.triu(1) == 0).all())


def test_gradcheck_self_and_cross():
    op, _ = _op(4, 2, 2, 3, causal=True)
    u = torch.randn(2, 3, 4, dtype=F64, requires_grad=True)
    g = Grid.uniform(3, 4, rule="trapezoid", nh=2)
    assert torch.autograd.gradcheck(lambda u: op.field(0.0, u, g), (u,))
    cross, _ = _op(4, 2, 2, 3, memory="m")
    m = torch.randn(2, 5, 4, dtype=F64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda u, m: cross.field(0.0, u, ContextGrid.of(Grid.paper(3, 4), m=m)), (u, m))
    W = cross.WQ.value.detach().clone().requires_grad_()

    def f(W):
        c = MultiHeadAttention(W, cross.WK.value, cross.WV.value, cross.WO.value, memory="m")
        return c.field(0.0, u.detach(), ContextGrid.of(Grid.paper(3, 4), m=m.detach()))

    assert torch.autograd.gradcheck(f, (W,))


def test_dropout_is_identity_in_eval_only():
    op, _ = _op(6, 2, 3, 3, dropout=0.5)
    u = torch.randn(2, 5, 6, dtype=F64)
    g = Grid.paper(5, 6)
    op.eval()
    torch.testing.assert_close(op.field(0.0, u, g), op.field(0.0, u, g))
    op.train()
    torch.manual_seed(0)
    a = op.field(0.0, u, g)
    torch.manual_seed(1)
    assert (a - op.field(0.0, u, g)).abs().max() > 1e-6


def test_multihead_in_the_papers_scheme():
    """Paper 002 §5.2: the scheme (13)-(17) with substep 1 replaced by the multi-head
    substep (39); the operator is usable in any scheme."""
    Nt, N, Ny, H = 2, 4, 6, 3
    torch.manual_seed(0)

    def pc(*s, scale=0.3):
        return PiecewiseConstant(torch.randn(Nt, *s, dtype=F64) * scale)

    attn = MultiHeadAttention(pc(Ny, H, Ny), pc(Ny, H, Ny), pc(Ny, H, Ny), None, qk_inner="y")
    norm = ProjectionS1(0.0, 1.0)
    ffn = [FFNIntegral(pc(Ny, Ny), pc(N), bias_axis="x") for _ in range(2)]
    prop = Propagator(paper_scheme(attn, norm, ffn), Nt, grid=Grid.paper(N, Ny, H))
    u = torch.randn(2, N, Ny, dtype=F64, requires_grad=True)
    out = prop(u)
    # the paper's literal step, written out (eqs. 41, 30-35) for the same controls
    v = u
    for n in range(Nt):
        s = 1 / math.sqrt(Ny)
        a = v.clone()
        for m in range(H):
            Q, K, V = (v @ c.raw[n][:, m, :] for c in (attn.WQ, attn.WK, attn.WV))
            a = a + torch.softmax(s * Q @ K.transpose(1, 2), -1) @ V
        a = (a - a.mean(-1, keepdim=True)) / a.var(-1, unbiased=False, keepdim=True).sqrt()
        z = a
        for layer in ffn:
            z = torch.relu(z + z @ layer.W.raw[n] + layer.b.raw[n][:, None])
        z = 0.5 * (z + a)
        v = (z - z.mean(-1, keepdim=True)) / z.var(-1, unbiased=False, keepdim=True).sqrt()
    torch.testing.assert_close(out, v, rtol=1e-12, atol=1e-12)
    out.sum().backward()
    assert attn.WQ.raw.grad is not None and torch.isfinite(attn.WQ.raw.grad).all()


def test_cpu_and_device_agree(device):
    op, _ = _op(6, 3, 2, 2, causal=True, dtype=torch.float32)
    u = torch.randn(2, 5, 6)
    ref = op.field(0.0, u, Grid.paper(5, 6))
    got = op.to(device).field(0.0, u.to(device), Grid.paper(5, 6))
    torch.testing.assert_close(got.cpu(), ref, rtol=1e-5, atol=1e-5)


# -- bad input --------------------------------------------------------------------------------
def test_errors():
    op, w = _op(6, 3, 2, 2, attn_mask="am", key_padding_mask="kpm")
    u = torch.randn(2, 5, 6, dtype=F64)
    with pytest.raises(ValueError, match=r"am: expected shape \(N_q, N_k\) = \(5, 5\)"):
        op.field(0.0, u, ContextGrid.of(Grid.paper(5, 6), am=torch.zeros(4, 5, dtype=torch.bool)))
    with pytest.raises(TypeError, match="am: expected a bool mask .* got dtype torch.int64"):
        op.field(0.0, u, ContextGrid.of(Grid.paper(5, 6), am=torch.zeros(5, 5, dtype=torch.long)))
    with pytest.raises(ValueError, match=r"kpm: expected shape \(B, N_k\) = \(2, 5\)"):
        op.field(0.0, u, ContextGrid.of(Grid.paper(5, 6), kpm=torch.zeros(2, 4, dtype=torch.bool)))
    with pytest.raises(ValueError, match="N_y = 6 features .* the grid has N_y = 7"):
        op.check(Grid.paper(5, 7))
    with pytest.raises(ValueError, match="3 heads, the grid has N_h = 2"):
        op.check(Grid.paper(5, 6, 2))
    with pytest.raises(ValueError, match=r"WO: expected shape \(H, d_v, N_y\)"):
        MultiHeadAttention(w["WQ"], w["WK"], w["WV"], torch.zeros(3, 2, 5, dtype=F64))
    with pytest.raises(ValueError, match="needs d_v = N_y"):
        MultiHeadAttention(w["WQ"], w["WK"], w["WV"], None)
    with pytest.raises(ValueError, match="qk_inner"):
        MultiHeadAttention(w["WQ"], w["WK"], w["WV"], w["WO"], qk_inner="x")
    cross = MultiHeadAttention(w["WQ"], w["WK"], w["WV"], w["WO"], memory="m")
    with pytest.raises(ValueError, match="expected the memory as grid context input 'm'"):
        cross.field(0.0, u, Grid.paper(5, 6))
    with pytest.raises(ValueError, match=r"memory 'm': expected shape \(B, N_s, N_y\) = \(2, N_s, 6\)"):
        cross.field(0.0, u, ContextGrid.of(Grid.paper(5, 6), m=torch.zeros(2, 3, 5, dtype=F64)))
    with pytest.raises(TypeError, match="memory dtype"):
        cross.field(0.0, u, ContextGrid.of(Grid.paper(5, 6), m=torch.zeros(2, 3, 6)))
    with pytest.raises(ValueError, match="grid/tensor mismatch"):
        op(torch.randn(2, 5, 7, dtype=F64), grid=Grid.paper(5, 6))
