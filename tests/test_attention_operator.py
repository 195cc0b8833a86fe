"""The continuous-time attention neural operator (``opsplit.models.AttentionNeuralOperator``)
and its new terms (``SpectralGatedFeedForward``, ``FieldSum``), each against an independent
transcription of its formula: the convolution integrals as O(N^2) quadrature sums of their
kernels written out mode by mode, the gated term and Cao's Galerkin attention written with
``torch.nn.functional``, the 1-D model's solve as an RK4 loop written out here; gradcheck
in float64; float32; the solve at finer N_t converging at RK4's order; the output on other
grids; empty batches."""

import cmath
import math

import pytest
import torch
import torch.nn.functional as F

from opsplit import Grid, Propagator
from opsplit.control import solved_with
from opsplit.grid import ImageGrid, Interval
from opsplit.models import AttentionNeuralOperator
from opsplit.operators import FieldSum, GalerkinAttention, SpectralGatedFeedForward
from opsplit.schemes import Lie
from opsplit.solvers import ExplicitEuler, Substep

D64 = torch.float64


def kernel_1d(W, z, L):
    """kappa(z) = Re sum_m c_m W_m e^{2 pi i m z / L}, c_0 = 1 (real W_0), c_m = 2."""
    k = W[0].real.clone()
    for m in range(1, W.shape[0]):
        k = k + (2 * W[m] * cmath.exp(2j * math.pi * m * z / L)).real
    return k


def kernel_2d(W, z1, z2, L1, L2):
    M = W.shape[1]
    rows = list(range(M)) + list(range(-(M - 1), 0))
    k = 0
    for r, m1 in enumerate(rows):
        for m2 in range(M):
            k = k + ((1 if m2 == 0 else 2) * W[r, m2] * cmath.exp(2j * math.pi * (m1 * z1 / L1 + m2 * z2 / L2))).real
    return k


def conv_1d_naive(u, W, L):
    B, n, _ = u.shape
    x = [j * L / n for j in range(n)]
    out = torch.zeros(B, n, W.shape[-1], dtype=u.dtype)
    for i in range(n):
        for j in range(n):
            out[:, i] += (L / n) * u[:, j] @ kernel_1d(W, x[i] - x[j], L)
    return out


def conv_2d_naive(u, W, n1, n2, L1, L2):
    B = u.shape[0]
    xs = [(i * L1 / n1, j * L2 / n2) for i in range(n1) for j in range(n2)]
    out = torch.zeros(B, n1 * n2, W.shape[-1], dtype=u.dtype)
    for a, (xa, ya) in enumerate(xs):
        for b, (xb, yb) in enumerate(xs):
            out[:, a] += (L1 * L2 / (n1 * n2)) * u[:, b] @ kernel_2d(W, xa - xb, ya - yb, L1, L2)
    return out


def grid_1d(n, d, L=1.0):
    return Grid(x=Interval(n=n, length=L, rule="left"), y=Interval.paper(d))


def grid_2d(n1, n2, d, L1=1.0, L2=1.0):
    return ImageGrid._build(Interval(n=n1, length=L1, rule="left"), Interval(n=n2, length=L2, rule="left"),
                            Interval.paper(d), None, 0)


def sg_naive(op, u, conv):
    """W2^T [gelu(a) * b] + b2, (a, b) = conv + W1^T u + b1 (the term's formula written out)."""
    h = conv + u @ op.W1(0.0) + op.b1(0.0)
    a, b = h.chunk(2, dim=-1)
    return (F.gelu(a) * b) @ op.W2(0.0) + op.b2(0.0)


def _randomise(op, seed=0, scale=0.3):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in op.parameters():
            p.copy_(torch.randn(p.shape, generator=g, dtype=p.dtype) * scale)


def test_gated_term_1d_equals_its_quadrature_sum():
    torch.manual_seed(0)
    op = SpectralGatedFeedForward.create(3, 4, hidden=2, dtype=D64)
    _randomise(op)
    u = torch.randn(2, 11, 3, dtype=D64)
    L = 2.5
    w = op.weight(0.0)
    conv = conv_1d_naive(u, torch.complex(w[0], w[1]), L)
    out = op(u, grid=grid_1d(11, 3, L))
    assert torch.allclose(out, sg_naive(op, u, conv), atol=1e-12, rtol=0)


def test_gated_term_2d_equals_its_quadrature_sum():
    torch.manual_seed(1)
    op = SpectralGatedFeedForward.create(2, 3, hidden=2, dims=2, dtype=D64)
    _randomise(op, 1)
    n1, n2, L1, L2 = 7, 6, 1.3, 0.7
    u = torch.randn(2, n1 * n2, 2, dtype=D64)
    w = op.weight(0.0)
    conv = conv_2d_naive(u, torch.complex(w[0], w[1]), n1, n2, L1, L2)
    out = op(u, grid=grid_2d(n1, n2, 2, L1, L2))
    assert torch.allclose(out, sg_naive(op, u, conv), atol=1e-12, rtol=0)


def test_gated_term_kernel_is_one_operator_on_every_grid():
    """A trigonometric polynomial of degree < M in x: the term's output on 9 and on 36 nodes
    agree at the shared nodes (the quadrature is exact for the kernel's modes)."""
    op = SpectralGatedFeedForward.create(2, 3, dtype=D64, generator=torch.Generator().manual_seed(0))

    def field(n):
        x = torch.arange(n, dtype=D64) / n
        return torch.stack([torch.sin(2 * math.pi * x), torch.cos(4 * math.pi * x)], -1)[None]

    a = op(field(9), grid=grid_1d(9, 2))
    b = op(field(36), grid=grid_1d(36, 2))
    assert torch.allclose(a, b[:, ::4], atol=1e-12, rtol=0)


@pytest.mark.parametrize("dims", [1, 2])
def test_gated_term_gradcheck_float32_and_empty_batch(dims):
    g = torch.Generator().manual_seed(2)
    op = SpectralGatedFeedForward.create(2, 2, hidden=2, dims=dims, dtype=D64, generator=g, time_modes=2)
    grid = grid_1d(5, 2) if dims == 1 else grid_2d(4, 3, 2)
    n = 5 if dims == 1 else 12
    u = torch.randn(1, n, 2, dtype=D64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda v: op.field(0.3, v, grid), (u,))
    params = [p for p in op.parameters()]
    assert torch.autograd.gradcheck(lambda *ps: _field_with(op, ps, u.detach(), grid), params)
    op32 = SpectralGatedFeedForward.create(2, 2, hidden=2, dims=dims, dtype=torch.float32, generator=g)
    assert op32(torch.randn(2, n, 2), grid=grid).dtype == torch.float32
    e = op32(torch.zeros(0, n, 2), grid=grid)
    assert e.shape == (0, n, 2)


def _field_with(op, ps, u, grid):
    names = [n for n, _ in op.named_parameters()]
    return torch.func.functional_call(op, dict(zip(names, ps)), (u, 0.3, grid))


def test_gated_term_smooth_in_time():
    """time_modes = 2: a Legendre series in t, the same as the coefficients written out."""
    op = SpectralGatedFeedForward.create(2, 2, dtype=D64, time_modes=2, t1=2.0,
                                        generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        op.W1.coefficients[1].copy_(torch.randn_like(op.W1.coefficients[1]))
    for t in (0.0, 0.5, 2.0):
        s = 2 * t / 2.0 - 1  # Legendre P1 on [0, 2]
        expect = op.W1.coefficients[0] + s * op.W1.coefficients[1]
        assert torch.allclose(op.W1(t), expect, atol=1e-14)


def test_field_sum_is_the_sum_and_euler_advances_it():
    g = torch.Generator().manual_seed(4)
    a = SpectralGatedFeedForward.create(4, 2, dtype=D64, generator=g)
    b = GalerkinAttention.create(4, 2, dtype=D64)
    s = FieldSum(a, b)
    grid = grid_1d(6, 4)
    u = torch.randn(2, 6, 4, dtype=D64)
    assert torch.allclose(s.field(0.0, u, grid), a.field(0.0, u, grid) + b.field(0.0, u, grid), atol=1e-14)
    prop = Propagator(Lie([Substep(s, ExplicitEuler())]), 3, t0=0.0, t1=1.0, grid=grid)
    v = u.clone()
    for k in range(3):
        v = v + (1 / 3) * (a.field(k / 3, v, grid) + b.field(k / 3, v, grid))
    assert torch.allclose(prop(u), v, atol=1e-12)
    with pytest.raises(TypeError, match=r"FieldSum.terms\[1\]"):
        FieldSum(a, torch.nn.Linear(2, 2))


def _model_1d(**kw):
    base = dict(d_model=4, heads=1, head_dim=2, modes=3, hidden=3, n_freq=1, proj_hidden=5, dtype=D64,
                generator=torch.Generator().manual_seed(0))
    return AttentionNeuralOperator(1, **{**base, **kw})


def _periodic(B, n, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.arange(n, dtype=D64) / n
    c = torch.randn(B, 4, generator=g, dtype=D64)
    return (c[:, :1] * torch.sin(2 * math.pi * x) + c[:, 1:2] * torch.cos(2 * math.pi * x)
            + c[:, 2:3] * torch.sin(4 * math.pi * x) + c[:, 3:] * torch.cos(6 * math.pi * x))


def test_model_1d_equals_rk4_written_out():
    """lift, (no latent grid), RK4 on v_t = A_sg(v) + Cao's Galerkin attention, projection:
    the model against the loop written out with the terms' formulas (float64)."""
    m = _model_1d(n_steps=2, T=0.7)
    _randomise(m.field, 5)
    u = _periodic(2, 9)
    n = 9
    x = torch.arange(n, dtype=D64) / n
    pos = torch.stack([torch.cos(2 * math.pi * x), torch.sin(2 * math.pi * x)], -1)
    v = torch.cat([u[..., None], pos.expand(2, n, 2)], -1) @ m.lifting.linear.weight.T + m.lifting.linear.bias
    sg, att = m.field.terms

    def cao(v):  # Galerkin: z = Q (K~^T V~) / n, per-head nn.LayerNorm (affine), heads combined by W^O
        def proj(Wc, bc):
            return torch.einsum("bnc,chd->bhnd", v, Wc(0.0)) + bc(0.0)[None, :, None]

        q, k, val = proj(att.WQ, att.bQ), proj(att.WK, att.bK), proj(att.WV, att.bV)
        k = F.layer_norm(k, (k.shape[-1],), att.gamma_k(0.0)[0], att.beta_k(0.0)[0], eps=1e-5)
        val = F.layer_norm(val, (val.shape[-1],), att.gamma_v(0.0)[0], att.beta_v(0.0)[0], eps=1e-5)
        z = q @ (k.transpose(-1, -2) @ val) / n
        return torch.einsum("bhnd,hdc->bnc", z, att.WO(0.0)) + att.bO(0.0)

    def f(v):
        w = sg.weight(0.0)
        return sg_naive(sg, v, conv_1d_naive(v, torch.complex(w[0], w[1]), 1.0)) + cao(v)

    h = 0.35
    for _ in range(2):
        k1 = f(v)
        k2 = f(v + h / 2 * k1)
        k3 = f(v + h / 2 * k2)
        k4 = f(v + h * k3)
        v = v + h / 6 * (k1 + 2 * k2 + 2 * k3 + k4)
    w = F.gelu(v @ m.projection.fc1.weight.T + m.projection.fc1.bias) @ m.projection.fc2.weight.T + m.projection.fc2.bias
    assert torch.allclose(m(u), w.squeeze(-1), atol=1e-11, rtol=0)


def test_model_refined_in_time_converges_at_rk4_order():
    m = _model_1d(n_steps=1, T=1.0)
    _randomise(m.field, 6, 0.1)
    u = _periodic(2, 16)
    with torch.no_grad():
        ref = m(u, n_steps=128)
        err = [float((m(u, n_steps=k) - ref).norm()) for k in (2, 4, 8)]
    orders = [math.log2(a / b) for a, b in zip(err, err[1:])]
    assert all(3.5 < p < 6.0 for p in orders), (err, orders)  # RK4: at least fourth order
    with torch.no_grad(), solved_with(m, solver="euler"):  # one term: Euler advances the unsplit sum
        e1, e2 = (float((m(u, n_steps=k) - ref).norm()) for k in (16, 32))
    assert 0.8 < math.log2(e1 / e2) < 1.2


def test_model_latent_grid_output_is_the_same_function_on_every_grid():
    m = _model_1d(latent=8, output_modes=3)
    a = m(_periodic(2, 16))
    b = m(_periodic(2, 64))
    assert torch.allclose(a, b[:, ::4], atol=1e-12, rtol=0)
    assert m(torch.zeros(0, 16, dtype=D64)).shape == (0, 16)


def test_model_2d_box_dirichlet_and_grids():
    m = AttentionNeuralOperator(2, d_model=4, head_dim=2, modes=3, hidden=2, proj_hidden=4, padding=1 / 7,
                                dirichlet=True, dtype=D64, generator=torch.Generator().manual_seed(0))
    assert m.box_nodes(15) == 16 and m.box_nodes(29) == 32
    a = torch.randn(2, 15, 15, dtype=D64)
    w = m(a)
    assert w.shape == (2, 15, 15)
    w = w.detach()
    assert float(w[:, 0].abs().max()) == 0 and float(w[:, :, -1].abs().max()) < 1e-15
    assert m(torch.zeros(0, 15, 15, dtype=D64)).shape == (0, 15, 15)
    # a coefficient constant on the square: the same output at the shared nodes of 15 and 29 nodes
    c = torch.full((1, 15, 15), 0.3, dtype=D64)
    f = torch.full((1, 29, 29), 0.3, dtype=D64)
    # both grids hold the same box [0, 8/7)^2; the padded zero region differs only below the
    # resolution of the kernel's 3 modes, so the outputs agree to the quadrature's error
    assert float((m(c) - m(f)[:, ::2, ::2]).abs().max()) < 0.05 * float(m(c).abs().max())
    u32 = AttentionNeuralOperator(2, d_model=4, head_dim=2, modes=3, hidden=2, proj_hidden=4)
    assert u32(torch.randn(1, 15, 15)).dtype == torch.float32


def test_model_gradcheck_float64():
    m = _model_1d(latent=6, output_modes=2)
    u = _periodic(1, 8).requires_grad_(True)
    assert torch.autograd.gradcheck(lambda v: m(v), (u,))
