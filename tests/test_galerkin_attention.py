"""Galerkin- and Fourier-type attention (Cao, NeurIPS 2021) against a direct transcription of
Cao's formulas, in float32/float64 on every device, under gradcheck, and as quadratures of
integrals over Omega_x (the same operator on a refined grid converges)."""

from __future__ import annotations

import copy
import math

import pytest
import torch
from torch.func import functional_call

from opsplit import Grid
from opsplit.grid import Interval
from opsplit.operators import FourierAttention, GalerkinAttention

F64 = torch.float64
OPS = {"galerkin": GalerkinAttention, "fourier": FourierAttention}


def _op(kind, ny=6, H=2, *, seed=0, dtype=F64, device="cpu"):
    torch.manual_seed(seed)
    op = OPS[kind].create(ny, H, dtype=dtype, device=device)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in op.parameters():
            p.add_(0.3 * torch.randn(p.shape, generator=g, dtype=F64).to(p))
    return op


def _grid(n, ny, length=1.0):
    return Grid(x=Interval(n=n, length=length, rule="left"), y=Interval.paper(ny))


def _cao(kind, op, u, eps=1e-5):
    """Cao's formulas, written out per head with plain matrices: Q = u W^Q + b, ...,
    LN(z) = (z - mean) / sqrt(var + eps) * gamma + beta per head; Galerkin
    z_h = Q (K~^T V~) / n, Fourier z_h = (Q~ K~^T) V / n; concat(z_h) W^O + b^O."""
    W = {k: getattr(op, k)(0.0).detach() for k in ("WQ", "WK", "WV", "WO", "bQ", "bK", "bV", "bO")}
    H, d = W["bQ"].shape
    n = u.shape[1]

    def ln(z, which, h):
        g, b = getattr(op, f"gamma_{which}")(0.0).detach()[h], getattr(op, f"beta_{which}")(0.0).detach()[h]
        m = z.mean(-1, keepdim=True)
        var = ((z - m) ** 2).mean(-1, keepdim=True)
        return (z - m) / torch.sqrt(var + eps) * g + b

    heads = []
    for h in range(H):
        Q = u @ W["WQ"][:, h] + W["bQ"][h]
        K = u @ W["WK"][:, h] + W["bK"][h]
        V = u @ W["WV"][:, h] + W["bV"][h]
        if kind == "galerkin":
            heads.append(Q @ (ln(K, "k", h).transpose(-1, -2) @ ln(V, "v", h)) / n)
        else:
            heads.append((ln(Q, "q", h) @ ln(K, "k", h).transpose(-1, -2)) @ V / n)
    return torch.cat(heads, -1) @ W["WO"].reshape(H * d, -1) + W["bO"]


@pytest.mark.parametrize("kind", list(OPS))
def test_equals_cao_transcription_f64(kind):
    B, n, ny, H = 3, 23, 8, 2
    op = _op(kind, ny, H)
    u = torch.randn(B, n, ny, dtype=F64)
    got = op(u, grid=_grid(n, ny))
    torch.testing.assert_close(got, _cao(kind, op, u), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("kind", list(OPS))
def test_dtypes_and_devices(kind, dtype, device):
    B, n, ny, H = 2, 17, 6, 3
    ref_op = _op(kind, ny, H)
    op = copy.deepcopy(ref_op).to(device=device, dtype=dtype)
    u = torch.randn(B, n, ny, dtype=F64)
    got = op(u.to(device=device, dtype=dtype), grid=_grid(n, ny))
    assert got.dtype == dtype and got.device.type == device.type
    tol = 1e-12 if dtype == F64 else 2e-5
    torch.testing.assert_close(got.double().cpu(), _cao(kind, ref_op, u), rtol=tol, atol=tol)


@pytest.mark.parametrize("kind", list(OPS))
def test_gradcheck(kind):
    B, n, ny, H = 1, 5, 4, 2
    op = _op(kind, ny, H, seed=3)
    u = torch.randn(B, n, ny, dtype=F64, requires_grad=True)
    params = list(op.parameters())
    g = _grid(n, ny)
    names = [k for k, _ in op.named_parameters()]

    def fp(u, *ps):
        return functional_call(op, dict(zip(names, ps)), (u,), {"grid": g})

    leaves = [p.detach().clone().requires_grad_(True) for p in params]
    assert torch.autograd.gradcheck(fp, (u, *leaves), eps=1e-6, atol=1e-7)


@pytest.mark.parametrize("kind", list(OPS))
def test_quadrature_converges_on_refined_grids(kind):
    """The operator is an integral over Omega_x = [0, 2): on a smooth periodic state its
    values at the shared nodes converge (spectrally: the equal-weight rule on a periodic
    integrand) as the grid is refined; without the quadrature weight 1/n they would grow
    with n."""
    ny, H, L = 6, 2, 2.0
    op = _op(kind, ny, H, seed=2)
    a = torch.randn(3, ny, dtype=F64, generator=torch.Generator().manual_seed(5))

    def state(n):
        x = torch.arange(n, dtype=F64) * L / n
        t = 2 * math.pi * x / L
        return (a[0] + 0.5 * torch.cos(t)[:, None] * a[1] + 0.5 * torch.sin(2 * t)[:, None] * a[2]).unsqueeze(0)

    with torch.no_grad():
        ref = op(state(512), grid=_grid(512, ny, L))[:, ::64]
        errs = []
        for n in (16, 32, 64):
            out = op(state(n), grid=_grid(n, ny, L))[:, :: n // 8]
            errs.append(float((out - ref).abs().max() / ref.abs().max()))
    # faster than any fixed order (100x per halving of h; second order gains 4x), to 1e-8 at 64
    # nodes.  (The constant depends on the state: where a head's variance nearly vanishes the
    # layer normalisation is steep and the pre-asymptotic range is longer.)
    assert errs[0] > 100 * errs[1] and errs[1] > 100 * errs[2] and errs[2] < 1e-8, errs


@pytest.mark.parametrize("kind", list(OPS))
def test_attention_weights_are_the_kernel_of_the_field(kind):
    """``attention_weights`` is the discrete kernel s <Q'(x_i), K'(x_j)> w_j: applied to the
    (normalised) values and combined over heads it reproduces the field, which the operator
    computes without forming it (the N_x x N_x matrix exists only here)."""
    B, n, ny, H = 2, 11, 6, 3
    op = _op(kind, ny, H, seed=2)
    u = torch.randn(B, n, ny, dtype=F64)
    g = _grid(n, ny, 3.0)
    A = op.attention_weights(u, grid=g)
    assert A.shape == (B, H, n, n)
    _, _, v = op.heads(0.0, u, g)
    if "v" in op.normalised:
        v = op.normalise(0.0, v, "v", g)
    torch.testing.assert_close(op.combine_heads(0.0, A @ v, g), op(u, grid=g), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("kind", list(OPS))
def test_second_derivatives(kind):
    """Double backward through the layer norms and the O(n d^2) products (gradgradcheck)."""
    B, n, ny, H = 1, 4, 4, 2
    op = _op(kind, ny, H, seed=5)
    g = _grid(n, ny)
    u = torch.randn(B, n, ny, dtype=F64, requires_grad=True)
    assert torch.autograd.gradgradcheck(lambda u: op(u, grid=g), (u,), eps=1e-6, atol=1e-6)


@pytest.mark.parametrize("kind", list(OPS))
def test_compile_with_a_changed_batch_size(kind):
    """torch.compile (one graph, dynamic shapes) gives Cao's values, and again after the batch
    size changes."""
    n, ny, H = 9, 6, 2
    op = _op(kind, ny, H, seed=7)
    g = _grid(n, ny)
    torch._dynamo.reset()
    compiled = torch.compile(lambda u: op(u, grid=g), fullgraph=True, backend="eager")
    for B in (2, 5):
        u = torch.randn(B, n, ny, dtype=F64)
        torch._dynamo.mark_dynamic(u, 0)  # the batch size changes: one graph for all
        torch.testing.assert_close(compiled(u), _cao(kind, op, u), rtol=1e-12, atol=1e-12)
