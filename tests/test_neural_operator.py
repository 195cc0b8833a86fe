"""The pieces of the continuous transformer as a neural operator: the spectral convolution
integral (against the direct quadrature of its kernel, exactness on trigonometric
polynomials, the same values on refined grids, gradcheck), the lifting's positions as
functions of x, and the whole model on grids of different resolution."""

from __future__ import annotations

import copy
import math

import pytest
import torch
from torch.func import functional_call

from opsplit import Grid
from opsplit.grid import Interval
from opsplit.models import NeuralOperatorTransformer
from opsplit.operators import Lifting, SpectralConvolution

F64 = torch.float64


def _conv(ny=4, modes=4, *, seed=0, bias=True):
    torch.manual_seed(seed)
    op = SpectralConvolution.create(ny, modes, bias=bias, dtype=F64)
    with torch.no_grad():
        for p in op.parameters():
            p.copy_(torch.randn_like(p))
    return op


def _grid(n, ny, length=1.0, rule="left", ly=None):
    y = Interval.paper(ny) if ly is None else Interval(n=ny, length=ly)
    return Grid(x=Interval(n=n, length=length, rule=rule), y=y)


def _kernel(op, xi, L):
    """kappa(xi; a, b) = sum_{|m| <= M} W_m(a, b) e^{2 pi i m xi / L}, from the modes, as a
    real (..., N_y, N_y) tensor (W_{-m} = conj W_m, W_0 real)."""
    w = op.weight(0.0).detach()
    K = w[0, 0].expand(*xi.shape, *w.shape[-2:]).clone()
    for m in range(1, w.shape[1]):
        ph = (2 * math.pi * m * xi / L)[..., None, None]
        K = K + 2 * (w[0, m] * torch.cos(ph) - w[1, m] * torch.sin(ph))
    return K


@pytest.mark.parametrize("L,ly", [(1.0, None), (2.5, 3.0)])
def test_spectral_convolution_is_the_quadrature_of_its_kernel(L, ly):
    """A(u)_i = h sum_j int_y kappa(x_i - x_j; xi, y) u_j(xi) dxi + b, written out (O(N^2))."""
    B, n, ny = 2, 13, 4
    op = _conv(ny, 5)
    g = _grid(n, ny, L, ly=ly)
    u = torch.randn(B, n, ny, dtype=F64)
    x = torch.arange(n, dtype=F64) * L / n
    K = _kernel(op, x[:, None] - x[None, :], L)  # (n, n, ny, ny)
    wy = g.y.weights(F64)
    ref = torch.einsum("ijab,zja->zib", K, u * wy) * (L / n) + op.bias(0.0).detach()
    torch.testing.assert_close(op(u, grid=g), ref, rtol=1e-12, atol=1e-12)


def test_spectral_convolution_exact_on_trigonometric_polynomials():
    """For u = cos(2 pi m x / L) a (m <= M) the integral is (L/2)(W_m e^{...} + conj) a,
    exactly, on every grid that carries the modes."""
    ny, M1, L, m = 3, 4, 2.0, 2
    op = _conv(ny, M1, bias=False)
    a = torch.randn(ny, dtype=F64)
    w = op.weight(0.0).detach()
    for n in (7, 8, 31, 64):
        x = torch.arange(n, dtype=F64) * L / n
        u = (torch.cos(2 * math.pi * m * x / L)[:, None] * a)[None]
        ph = 2 * math.pi * m * x / L
        exact = L * (torch.cos(ph)[:, None] * (a @ w[0, m]) - torch.sin(ph)[:, None] * (a @ w[1, m]))
        torch.testing.assert_close(op(u, grid=_grid(n, ny, L))[0], exact, rtol=1e-12, atol=1e-12)


def test_spectral_convolution_same_values_on_refined_grids():
    """A band-limited u sampled on 9, 27 and 81 nodes: the outputs agree at the shared nodes
    to rounding (the kernel is a function of the physical offset, not of an index)."""
    ny, L = 3, 1.5
    op = _conv(ny, 3)
    c = torch.randn(3, ny, dtype=F64)

    def u(n):
        x = torch.arange(n, dtype=F64) * L / n
        t = 2 * math.pi * x / L
        return (c[0] + torch.cos(t)[:, None] * c[1] + torch.sin(4 * t)[:, None] * c[2])[None]

    out9 = op(u(9), grid=_grid(9, ny, L))
    for n in (27, 81):
        torch.testing.assert_close(op(u(n), grid=_grid(n, ny, L))[:, :: n // 9], out9, rtol=1e-12, atol=1e-12)


def test_spectral_convolution_dtypes_devices(dtype, device):
    ny, n = 4, 10
    ref = _conv(ny, 3)
    op = copy.deepcopy(ref).to(device=device, dtype=dtype)
    u = torch.randn(2, n, ny, dtype=F64)
    got = op(u.to(device=device, dtype=dtype), grid=_grid(n, ny))
    assert got.dtype == dtype
    tol = 1e-12 if dtype == F64 else 1e-4
    torch.testing.assert_close(got.double().cpu(), ref(u, grid=_grid(n, ny)), rtol=tol, atol=tol)


def test_spectral_convolution_gradcheck():
    ny, n = 3, 7
    op = _conv(ny, 3)
    g = _grid(n, ny)
    names = [k for k, _ in op.named_parameters()]
    leaves = [p.detach().clone().requires_grad_(True) for p in op.parameters()]
    u = torch.randn(1, n, ny, dtype=F64, requires_grad=True)

    def f(u, *ps):
        return functional_call(op, dict(zip(names, ps)), (u,), {"grid": g})

    assert torch.autograd.gradcheck(f, (u, *leaves))


def test_lifting_positions_are_functions_of_x():
    """The lifting at 8 and 32 nodes agrees at the shared nodes: the positions are sampled
    at the nodes x_j = j L / N_x, not indexed by j."""
    torch.manual_seed(0)
    lift = Lifting(1, 6, n_freq=3, length=2.0, dtype=F64)
    u32 = torch.randn(2, 32, dtype=F64)
    torch.testing.assert_close(lift(u32)[:, ::4], lift(u32[:, ::4]), rtol=1e-14, atol=1e-14)


def _smooth_field(n, B=2, seed=0):
    g = torch.Generator().manual_seed(seed)
    c = torch.randn(B, 6, dtype=F64, generator=g) / torch.arange(1, 7, dtype=F64) ** 2
    x = torch.arange(n, dtype=F64) / n
    k = torch.arange(1, 4, dtype=F64)
    t = 2 * math.pi * x[:, None] * k
    return (c[:, None, :3] * torch.cos(t) + c[:, None, 3:] * torch.sin(t)).sum(-1)


@pytest.mark.parametrize("attention,scheme", [("galerkin", "strang"), ("fourier", "lie"), ("softmax", "lie")])
def test_model_on_refined_grids(attention, scheme):
    """One model (random weights) on 32, 64 and 128 nodes of a smooth periodic field: the
    outputs at the shared nodes converge (spectrally) to those on 512 nodes, every Omega_x
    integral being a quadrature of the same continuous operator.  (The per-head layer
    normalisations of the Galerkin and Fourier types are steep where a head's variance is
    small, which lengthens the pre-asymptotic range: one head of 8 features here; softmax
    attention converges to rounding by 64 nodes.)"""
    torch.manual_seed(0)
    m = NeuralOperatorTransformer(attention, scheme, d_model=8, heads=1, n_steps=2, modes=4, d_ff=8, hidden=8,
                                  generator=torch.Generator().manual_seed(1), dtype=F64)
    with torch.no_grad():
        ref = m(_smooth_field(512))[:, ::64]
        errs = [float((m(_smooth_field(n))[:, :: n // 8] - ref).abs().max() / ref.abs().max()) for n in (32, 64, 128)]
    # faster than fourth order (16x per halving of h) until rounding, to 1e-7 at 128 nodes
    assert errs[1] <= max(errs[0] / 16, 1e-13) and errs[2] <= max(errs[1] / 16, 1e-13) and errs[2] < 1e-7, errs


def test_model_dtypes_and_shapes(dtype, device):
    m = NeuralOperatorTransformer("galerkin", "strang", d_model=8, heads=2, n_steps=2, modes=4, d_ff=8, hidden=8,
                                  generator=torch.Generator().manual_seed(1), dtype=dtype, device=device)
    out = m(_smooth_field(16).to(device=device, dtype=dtype))
    assert out.shape == (2, 16) and out.dtype == dtype
    assert m.min_nodes == 7


def test_model_gradcheck_input():
    m = NeuralOperatorTransformer("fourier", "strang", d_model=4, heads=2, n_steps=2, modes=2, d_ff=4, hidden=4,
                                  generator=torch.Generator().manual_seed(2), dtype=F64)
    u = _smooth_field(6, B=1).requires_grad_(True)
    assert torch.autograd.gradcheck(m, (u,))


def test_spectral_convolution_second_derivatives():
    """Double backward through the FFTs (gradgradcheck)."""
    ny, n = 3, 7
    op = _conv(ny, 3)
    g = _grid(n, ny)
    u = torch.randn(1, n, ny, dtype=F64, requires_grad=True)
    assert torch.autograd.gradgradcheck(lambda u: op(u, grid=g), (u,))


def test_attention_free_model_is_a_residual_fno_layer_per_step():
    """``attention="none"``, ``nonlinearity="map"``, Lie: per step v <- gelu(v + h sum_j
    kappa(x_i - x_j) v_j + v W_l + b) with the piece of that step (eq. S, Delta t = 1),
    written out as the O(N^2) kernel sum, between the lifting and the projection."""
    n_t, d, M1, n = 3, 5, 4, 11
    m = NeuralOperatorTransformer("none", "lie", d_model=d, heads=1, n_steps=n_t, modes=M1, hidden=6,
                                  nonlinearity="map", generator=torch.Generator().manual_seed(3), dtype=F64)
    assert [type(s.terms[0]).__name__ for s in m.propagator.scheme.substeps] == ["SpectralConvolution", "Activation"]
    conv = m.propagator.scheme.substeps[0].terms[0]
    u = _smooth_field(n)
    x = torch.arange(n, dtype=F64) / n
    with torch.no_grad():
        v = m.lifting(u)
        for k in range(n_t):
            w, wl, b = conv.weight.pieces[k], conv.local.pieces[k], conv.bias.pieces[k]
            K = w[0, 0].expand(n, n, d, d).clone()
            for mm in range(1, M1):
                ph = (2 * math.pi * mm * (x[:, None] - x[None, :]))[..., None, None]
                K = K + 2 * (w[0, mm] * torch.cos(ph) - w[1, mm] * torch.sin(ph))
            v = torch.nn.functional.gelu(v + torch.einsum("ijab,zja->zib", K, v) / n + v @ wl + b)
        ref = m.projection(v)
        torch.testing.assert_close(m(u), ref, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("attention", ["none", "galerkin", "softmax"])
def test_model_without_positions_commutes_with_shifts(attention):
    """``n_freq=0`` (no position features): every term is a convolution, a pointwise map or
    an attention integral over all of Omega_x, so the discrete model commutes with the shift
    by any number of nodes, as the solution operator of a translation-invariant PDE on a
    periodic domain does (Burgers); with position features it does not."""
    n = 24
    u = torch.randn(3, n, dtype=F64, generator=torch.Generator().manual_seed(5))
    for n_freq, equivariant in ((0, True), (2, False)):
        m = NeuralOperatorTransformer(attention, "lie", d_model=6, heads=1, n_steps=2, modes=5, hidden=6,
                                      nonlinearity="map", n_freq=n_freq, generator=torch.Generator().manual_seed(4),
                                      dtype=F64)
        with torch.no_grad():
            out = m(u)
            for s in (1, 7):
                shifted = m(torch.roll(u, s, dims=1))
                if equivariant:
                    torch.testing.assert_close(shifted, torch.roll(out, s, dims=1), rtol=1e-12, atol=1e-12)
                else:
                    assert (shifted - torch.roll(out, s, dims=1)).abs().max() > 1e-6
