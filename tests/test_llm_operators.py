"""The operators of the decoder-only LLMs, each against an independent evaluation:

* ``ProjectionSphere`` / ``project_sphere`` (RMSNorm as the projection onto the sphere
  (1/|Omega_y|) int u^2 = sigma_2^2): on the sphere in the grid's quadrature, the closest
  point (against scipy's constrained minimiser and against perturbations along the
  sphere), idempotent, 0-homogeneous and finite for tokens of size 1e-30 .. 1e30 in float32
  and float64 (reference moments in float64 numpy after a max-abs rescale), the zero-token
  rule, HF's ``LlamaRMSNorm`` formula bit for bit on request;
* ``RotaryEmbedding``: the complex-number form of the rotation, norm preservation, scores
  that depend only on position differences, HF's float32 cos/sin bit for bit;
* ``GatedFeedForward`` against an einsum transcription on a weighted grid and HF's LlamaMLP;
* ``GroupedQueryAttention`` against a naive O(N^2) loop over heads (group map h // g, explicit
  softmax, causal and key-padding masks, non-uniform key weights, complex-number rotary);
* ``PositionTable``: rows at integer positions, interpolation between them;
* gradcheck in float64 of each, float32/float64 and device-generic forward passes."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import assume, given
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays
from scipy.optimize import minimize
from torch.autograd import gradcheck, gradgradcheck

from opsplit import Grid, Interval
from opsplit.controls import PositionTable
from opsplit.operators import (
    GatedFeedForward,
    GroupedQueryAttention,
    KVCache,
    ProjectionSphere,
    RotaryEmbedding,
    project_sphere,
)
from opsplit.operators.context import ContextGrid

F32, F64 = torch.float32, torch.float64
DTYPES = {"f32": F32, "f64": F64}
magnitude = st.integers(-30, 30)
moderate = st.floats(-1e3, 1e3, allow_nan=False, allow_infinity=False, width=64)
rules = st.sampled_from(["midpoint", "trapezoid", "right"])


def mean_square(u: np.ndarray, w: np.ndarray) -> np.ndarray:
    """(1/|Omega|) sum_j w_j u_j^2 in float64 after dividing by the max-abs (no overflow),
    returned at the original scale (as a root: the RMS)."""
    a = np.abs(u).max(-1, keepdims=True)
    a = np.where(a > 0, a, 1.0)
    x = u / a
    return np.sqrt((x * x * w).sum(-1) / w.sum()) * a[..., 0]


# -- the sphere projection --------------------------------------------------------------------
@given(st.integers(1, 9).flatmap(lambda n: arrays(np.float64, (2, 3, n), elements=moderate)),
       magnitude, rules, st.floats(0.3, 7.0), st.floats(0.1, 4), st.sampled_from(["f32", "f64"]))
def test_sphere_on_the_sphere_idempotent_finite(base, e, rule, ly, s2, dt):
    dtype = DTYPES[dt]
    assume(rule != "trapezoid" or base.shape[-1] >= 2)
    v = torch.from_numpy(base * 10.0**e).to(dtype)
    assume(torch.isfinite(v).all() and (v != 0).any(-1).all())
    n = v.shape[-1]
    grid = Grid(x=Interval(n=3, length=1.0), y=Interval(n=n, length=ly, rule=rule))
    P = ProjectionSphere(s2).to(dtype)
    u = P(v, grid=grid)
    assert u.dtype == dtype and torch.isfinite(u).all()
    w = grid.y.weights(F64).numpy()
    tol = 2e-6 if dt == "f32" else 1e-13
    np.testing.assert_allclose(mean_square(u.double().numpy(), w), s2, rtol=tol)
    np.testing.assert_allclose(P(u, grid=grid).double().numpy(), u.double().numpy(), atol=tol * s2)


@given(st.integers(1, 10).flatmap(lambda n: arrays(np.float64, (2, n), elements=moderate)), magnitude,
       st.sampled_from(["f32", "f64"]))
def test_sphere_scale_robust_zero_homogeneous(base, e, dt):
    """P(c v) = P(v) for c = 10^e, e in [-30, 30], in float32 and float64, finite (the mean
    square of a float32 token of size 1e30 overflows, of size 1e-30 underflows: the max-abs
    rescale keeps it of order one)."""
    dtype = DTYPES[dt]
    v = torch.from_numpy(base).to(dtype)
    assume((v != 0).any(-1).all())
    c = torch.tensor(10.0**e, dtype=F64)
    vs = (v.double() * c).to(dtype)
    assume(torch.isfinite(vs).all() and (vs != 0).any(-1).all())
    out = project_sphere(vs, 1.5)
    assert torch.isfinite(out).all()
    # vs is v * c rounded to dtype: compare with the float64 projection of the rounded token
    ref = project_sphere((vs.double() / c), 1.5)
    tol = 2e-6 if dt == "f32" else 1e-13
    assert float((out.double() - ref).abs().max()) <= tol * 1.5 * math.sqrt(v.shape[-1])


@pytest.mark.parametrize("dtype,scale", [(F32, 1e30), (F32, 1e-30), (F32, 1e-40), (F64, 1e300), (F64, 1e-300),
                                         (F64, 1e-310)])
def test_sphere_extreme_magnitudes_against_numpy(dtype, scale):
    x = torch.randn(4, 9, dtype=F64, generator=torch.Generator().manual_seed(1))
    v = (x * scale).to(dtype)
    assert (v != 0).any(-1).all()
    out = project_sphere(v, 2.0)
    vd = v.double().numpy() / scale
    ref = 2.0 * vd / np.sqrt((vd * vd).mean(-1, keepdims=True))
    tol = 2e-6 if dtype == F32 else 1e-12
    if abs(math.log10(scale)) > 35 and dtype == F32 or abs(math.log10(scale)) > 305:
        tol = 1e-3  # subnormal inputs carry few significant bits themselves
    np.testing.assert_allclose(out.double().numpy(), ref, atol=tol * 2)
    # a naive mean(v^2) would be inf (1e60 in float32) or 0 (1e-60): the output would be 0 or NaN
    assert torch.isfinite(out).all() and (out != 0).any()


@pytest.mark.parametrize("seed", range(6))
def test_sphere_is_the_closest_point(seed):
    """Against scipy's SLSQP (min |w - v|^2 s.t. mean_w(w^2) = s2^2, from a random start)
    and against every perturbation along the sphere."""
    g = torch.Generator().manual_seed(seed)
    n = 3 + seed
    grid = Grid(x=Interval(n=1, length=1.0), y=Interval(n=n, length=2.5, rule="trapezoid" if seed % 2 else "midpoint"))
    wts = grid.y.weights(F64).numpy()
    v = torch.randn(1, 1, n, dtype=F64, generator=g) * 3
    s2 = 0.7 + seed
    p = project_sphere(v, s2, grid)[0, 0].numpy()
    vv = v[0, 0].numpy()

    def dist2(w):
        return float(((w - vv) ** 2 * wts).sum())

    cons = {"type": "eq", "fun": lambda w: float((w * w * wts).sum() / wts.sum()) - s2**2}
    start = np.random.default_rng(seed).normal(size=n)
    res = minimize(dist2, start, constraints=[cons], method="SLSQP", options={"ftol": 1e-14, "maxiter": 500})
    assert res.success
    assert dist2(p) <= res.fun + 1e-9
    np.testing.assert_allclose(p, res.x, atol=1e-5 * s2)
    rng = np.random.default_rng(100 + seed)
    for _ in range(200):
        q = p + rng.normal(size=n) * rng.choice([1e-3, 1e-1, 1.0])
        q = q * s2 / math.sqrt(float((q * q * wts).sum() / wts.sum()))  # back onto the sphere
        assert dist2(p) <= dist2(q) + 1e-12


def test_zero_token_maps_to_zero_with_zero_gradient(dtype):
    v = torch.zeros(2, 5, dtype=dtype, requires_grad=True)
    for eps in (0.0, 1e-6):
        out = project_sphere(v, 1.0, eps=eps)
        assert torch.equal(out, torch.zeros_like(out))
        (g,) = torch.autograd.grad((out * torch.arange(5, dtype=dtype)).sum(), v)
        assert torch.isfinite(g).all()
    # a nonzero token as tiny as the smallest subnormal is still projected
    t = torch.zeros(4, dtype=dtype)
    t[1] = torch.finfo(dtype).smallest_normal * torch.finfo(dtype).eps
    assert float(project_sphere(t, 1.0)[1]) == pytest.approx(2.0)


@pytest.mark.parametrize("dtype", [F32, F64], ids=["f32", "f64"])
def test_sphere_eps_is_hf_llama_rmsnorm(dtype):
    transformers = pytest.importorskip("transformers")
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    x = torch.randn(3, 7, 12, dtype=dtype) * torch.logspace(-2, 2, 12, dtype=dtype)
    hf = LlamaRMSNorm(12, eps=1e-5).to(dtype)
    ref = hf(x)
    literal = ProjectionSphere(1.0, eps=1e-5, compute_dtype=F32).to(dtype)(x)
    assert torch.equal(literal, ref)  # HF's float32 formula, bit for bit (also for float64 input)
    robust = project_sphere(x, 1.0, eps=1e-5).detach()
    ref = ref.detach()
    tol = 1e-6 if dtype == F32 else 1e-6  # float64: HF itself rounds to float32
    assert float((robust - ref).abs().max()) <= tol * float(ref.abs().max())
    assert transformers is not None


@pytest.mark.parametrize("rule", ["midpoint", "trapezoid"])
@pytest.mark.parametrize("eps", [0.0, 1e-2])
def test_sphere_gradcheck(rule, eps):
    g = Grid(x=Interval(n=3, length=1.0), y=Interval(n=6, length=2.0, rule=rule))
    v = torch.randn(2, 3, 6, dtype=F64, generator=torch.Generator().manual_seed(4))
    v[0, 0, 1] = -v[0, 0].abs().max()  # max-abs attained twice
    v[0, 0, 4] = v[0, 0].abs().max()
    v.requires_grad_()
    s2 = torch.tensor(1.7, dtype=F64, requires_grad=True)
    assert gradcheck(lambda v, s: project_sphere(v, s, g, eps), (v, s2))
    assert gradgradcheck(lambda v, s: project_sphere(v, s, g, eps), (v, s2))


# -- rotary positions ---------------------------------------------------------------------------
def _rotate_complex(x: torch.Tensor, pos: torch.Tensor, theta: float) -> torch.Tensor:
    """Plane k = (x_k, x_{k+d/2}) as the complex number x_k + i x_{k+d/2}, times e^{i w_k pos}."""
    d = x.shape[-1]
    w = theta ** (-torch.arange(0, d, 2, dtype=F64) / d)
    z = torch.complex(x[..., : d // 2].double(), x[..., d // 2:].double())
    z = z * torch.polar(torch.ones_like(w), pos.double()[..., None] * w)
    return torch.cat([z.real, z.imag], -1)


def test_rope_is_a_rotation_of_planes():
    rope = RotaryEmbedding(8, 500.0)
    x = torch.randn(2, 5, 8, dtype=F64)
    pos = torch.tensor([0.0, 1.0, 2.5, 7.0, 100.0], dtype=F64)
    cos, sin = rope.cos_sin(pos, F64)
    out = rope.rotate(x, cos, sin)
    torch.testing.assert_close(out, _rotate_complex(x, pos, 500.0), rtol=0, atol=1e-12)
    torch.testing.assert_close(out.norm(dim=-1), x.norm(dim=-1), rtol=1e-13, atol=0)


def test_rope_scores_depend_on_position_differences_only():
    rope = RotaryEmbedding(6, 10000.0)
    q, k = torch.randn(6, dtype=F64), torch.randn(6, dtype=F64)
    c1, s1 = rope.cos_sin(torch.tensor([3.0, 10.0], dtype=F64), F64)
    c2, s2 = rope.cos_sin(torch.tensor([103.25, 110.25], dtype=F64), F64)
    a = rope.rotate(q, c1[0], s1[0]) @ rope.rotate(k, c1[1], s1[1])
    b = rope.rotate(q, c2[0], s2[0]) @ rope.rotate(k, c2[1], s2[1])
    assert float(abs(a - b)) < 1e-12


def test_rope_hf_float32_arithmetic_bit_for_bit():
    transformers = pytest.importorskip("transformers")
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding, apply_rotary_pos_emb

    cfg = transformers.LlamaConfig(hidden_size=24, num_attention_heads=2, head_dim=12, rope_theta=777.0)
    hf = LlamaRotaryEmbedding(cfg).double()
    q, k = torch.randn(2, 2, 9, 12, dtype=F64), torch.randn(2, 2, 9, 12, dtype=F64)
    pos = torch.tensor([[0, 0, 0, 1, 2, 3, 4, 5, 6], list(range(9))])
    cos, sin = hf(q, pos)
    rq, rk = apply_rotary_pos_emb(q, k, cos, sin)
    rope = RotaryEmbedding(12, 777.0, compute_dtype=F32)
    c, s = rope.cos_sin(pos, F64)
    assert torch.equal(rope.rotate(q, c[:, None], s[:, None]), rq)
    assert torch.equal(rope.rotate(k, c[:, None], s[:, None]), rk)


def test_rope_on_a_refined_grid():
    rope = RotaryEmbedding(4)
    g = Grid(x=Interval(spacing=0.25), y=Interval.paper(8))
    xi = rope.grid_positions(g, 5)
    torch.testing.assert_close(xi, torch.tensor([0.0, 0.25, 0.5, 0.75, 1.0], dtype=F64))
    assert torch.equal(rope.grid_positions(Grid.paper(None, 8), 4), torch.arange(4, dtype=F64))


def test_rope_gradcheck():
    rope = RotaryEmbedding(6, 50.0)
    x = torch.randn(2, 4, 6, dtype=F64, requires_grad=True)
    pos = torch.tensor([0.0, 0.5, 2.0, 3.0], dtype=F64, requires_grad=True)

    def f(x, p):
        c, s = rope.cos_sin(p, F64)
        return rope.rotate(x, c, s)

    assert gradcheck(f, (x, pos)) and gradgradcheck(f, (x, pos))


# -- gated feed-forward -----------------------------------------------------------------------
def _gated_reference(u, Wg, Wu, Wd, bg, bu, bd, wy, wz):
    g = torch.einsum("bxi,iz->bxz", u * wy, Wg) + bg
    up = torch.einsum("bxi,iz->bxz", u * wy, Wu) + bu
    h = torch.nn.functional.silu(g) * up
    return torch.einsum("bxz,zy->bxy", h * wz, Wd) + bd


def test_gated_ffn_on_a_weighted_grid(dtype):
    gen = torch.Generator().manual_seed(2)
    ny, nz = 5, 7
    Wg, Wu, Wd = (torch.randn(*s, dtype=F64, generator=gen) for s in ((ny, nz), (ny, nz), (nz, ny)))
    bg, bu, bd = (torch.randn(n, dtype=F64, generator=gen) for n in (nz, nz, ny))
    hidden = Interval(n=nz, length=3.0, rule="trapezoid")
    op = GatedFeedForward(Wg, Wu, Wd, b_gate=bg, b_up=bu, b_down=bd, hidden=hidden).to(dtype)
    grid = Grid(x=Interval(n=4, length=1.0), y=Interval(n=ny, length=2.0, rule="trapezoid"))
    u = torch.randn(2, 4, ny, dtype=F64, generator=gen)
    ref = _gated_reference(u, Wg, Wu, Wd, bg, bu, bd, grid.y.weights(F64), hidden.weights(F64))
    out = op(u.to(dtype), grid=grid)
    with torch.no_grad():  # inference: gate and up as one GEMM on the kernels side by side
        out_ng = op(u.to(dtype), grid=grid)
        out_ng2 = op(u.to(dtype), grid=grid)  # the cached kernels again
    tol = 1e-5 if dtype == F32 else 1e-12
    for o in (out, out_ng, out_ng2):
        assert float((o.double() - ref).abs().max()) <= tol * float(ref.abs().max())


def test_gated_ffn_is_hf_llama_mlp():
    transformers = pytest.importorskip("transformers")
    from transformers.models.llama.modeling_llama import LlamaMLP

    cfg = transformers.LlamaConfig(hidden_size=8, intermediate_size=11, num_attention_heads=2, mlp_bias=True)
    mlp = LlamaMLP(cfg).double()
    op = GatedFeedForward(mlp.gate_proj.weight.t(), mlp.up_proj.weight.t(), mlp.down_proj.weight.t(),
                          b_gate=mlp.gate_proj.bias, b_up=mlp.up_proj.bias, b_down=mlp.down_proj.bias)
    x = torch.randn(2, 3, 8, dtype=F64)
    torch.testing.assert_close(op(x.detach()), mlp(x).detach(), rtol=0, atol=1e-13)


def test_gated_ffn_gradcheck():
    gen = torch.Generator().manual_seed(3)
    mk = lambda *s: torch.randn(*s, dtype=F64, generator=gen, requires_grad=True)  # noqa: E731
    Wg, Wu, Wd, bu = mk(4, 6), mk(4, 6), mk(6, 4), mk(6)
    u = mk(2, 3, 4)
    grid = Grid.paper(3, 4)

    def f(u, Wg, Wu, Wd, bu):
        return GatedFeedForward(Wg, Wu, Wd, b_up=bu).field(0.0, u, grid)

    assert gradcheck(f, (u, Wg, Wu, Wd, bu)) and gradgradcheck(f, (u, Wg, Wu, Wd, bu))


def test_gated_ffn_create_trains_per_layer():
    op = GatedFeedForward.create(6, 10, n_pieces=3, bias=True, generator=torch.Generator().manual_seed(0))
    assert op.W1.raw.shape == (3, 6, 10) and op.W_up.raw.shape == (3, 6, 10) and op.b_up.raw.shape == (3, 10)
    u = torch.randn(1, 2, 6)
    assert not torch.allclose(op.field(0.0, u, Grid.paper(2, 6)), op.field(2.0, u, Grid.paper(2, 6)))


# -- grouped-query attention ---------------------------------------------------------------------
def _gqa_reference(u, WQ, WK, WV, WO, bQ, bK, bV, bO, scale, kpm, wx, pos, theta):
    """Naive transcription: per query head h, key/value head h // g, explicit weights."""
    B, N, _ = u.shape
    H, Hkv = WQ.shape[1], WK.shape[1]
    g = H // Hkv
    out = torch.zeros(B, N, WO.shape[-1], dtype=F64)
    for b in range(B):
        for h in range(H):
            j = h // g
            q = u[b] @ WQ[:, h] + bQ[h]
            k = u[b] @ WK[:, j] + bK[j]
            v = u[b] @ WV[:, j] + bV[j]
            q, k = _rotate_complex(q, pos, theta), _rotate_complex(k, pos, theta)
            for i in range(N):
                logits = torch.tensor([scale * float(q[i] @ k[l]) for l in range(N)], dtype=F64)
                allowed = torch.tensor([l <= i and not kpm[b, l] for l in range(N)])
                if not allowed.any():
                    continue  # a query that sees no key: 0 (SDPA's convention for a fully masked row)
                e = torch.where(allowed, wx * torch.exp(logits - logits[allowed].max()), torch.zeros(N, dtype=F64))
                out[b, i] += (e / e.sum()) @ v @ WO[h]
    return out + bO


def test_gqa_against_naive_loops():
    gen = torch.Generator().manual_seed(5)
    ny, H, Hkv, d, N, B = 6, 4, 2, 4, 5, 3
    r = lambda *s: torch.randn(*s, dtype=F64, generator=gen)  # noqa: E731
    WQ, WK, WV, WO = r(ny, H, d), r(ny, Hkv, d), r(ny, Hkv, d), r(H, d, ny)
    bQ, bK, bV, bO = r(H, d), r(Hkv, d), r(Hkv, d), r(ny)
    u = r(B, N, ny) * 0.5
    kpm = torch.zeros(B, N, dtype=torch.bool)
    kpm[1, :2] = True
    kpm[2, :4] = True
    op = GroupedQueryAttention(WQ, WK, WV, WO, bQ=bQ, bK=bK, bV=bV, bO=bO, scale=0.4,
                               rotary=RotaryEmbedding(d, 300.0), key_padding_mask="kpm")
    grid = ContextGrid.of(Grid(x=Interval(n=N, length=2.0, rule="trapezoid"), y=Interval.paper(ny)), kpm=kpm)
    out = op(u, grid=grid)
    wx, pos = grid.x.weights(F64), grid.x.nodes(F64) - grid.x.nodes(F64)[0]
    ref = _gqa_reference(u, WQ, WK, WV, WO, bQ, bK, bV, bO, 0.4, kpm, wx, pos, 300.0)
    torch.testing.assert_close(out, ref, rtol=0, atol=1e-12)


def test_gqa_inference_kernels_follow_parameter_updates():
    """Under no_grad the q/k/v kernels are applied side by side from a cached copy: an in-place
    update of a weight (an optimiser step) must invalidate it."""
    torch.manual_seed(4)
    op = GroupedQueryAttention.create(8, 4, 2, qkv_bias=True, dtype=F64)
    u = torch.randn(2, 3, 8, dtype=F64)
    g = Grid.paper(3, 8)
    with torch.no_grad():
        a = op.field(0.0, u, g)
        torch.testing.assert_close(a, op.field(0.0, u, g), rtol=0, atol=0)  # the cached kernels again
        op.WK.raw.add_(0.5)
        op.bV.raw.mul_(-1.0)
        b = op.field(0.0, u, g)
    torch.testing.assert_close(b, op.field(0.0, u, g).detach(), rtol=0, atol=1e-13)  # autograd path
    assert not torch.allclose(a, b)


@pytest.mark.parametrize("Hkv", [1, 2, 6])
def test_gqa_decode_with_cache_equals_full(Hkv, device, dtype):
    torch.manual_seed(0)
    op = GroupedQueryAttention.create(12, 6, Hkv, head_dim=4, qkv_bias=True, out_bias=True,
                                      cache="c", device=device, dtype=dtype)
    u = torch.randn(2, 7, 12, device=device, dtype=dtype)
    grid = Grid.paper(None, 12)
    full = op.field(0.0, u, grid.with_shape(7, 12))
    cache = KVCache()
    parts = []
    for a, b in ((0, 3), (3, 4), (4, 5), (5, 7)):
        cache.begin()
        g = ContextGrid.of(grid, c=cache).with_shape(b - a, 12)
        parts.append(op.field(0.0, u[:, a:b], g))
    tol = 1e-5 if dtype == F32 else 1e-12
    torch.testing.assert_close(torch.cat(parts, 1), full, rtol=0, atol=tol)


def test_gqa_cache_under_autograd_passes_gradients_to_cached_tokens():
    """With autograd recording, the cache concatenates (no in-place buffers): the gradient of
    the last chunk's output reaches the cached tokens' inputs as in the full evaluation."""
    torch.manual_seed(2)
    op = GroupedQueryAttention.create(8, 4, 2, cache="c", dtype=F64)
    u = torch.randn(1, 5, 8, dtype=F64, requires_grad=True)
    w = torch.randn(1, 2, 8, dtype=F64)
    (g_full,) = torch.autograd.grad((op.field(0.0, u, Grid.paper(5, 8))[:, 3:] * w).sum(), u)
    cache = KVCache()
    cache.begin()
    op.field(0.0, u[:, :3], ContextGrid.of(Grid.paper(3, 8), c=cache))
    cache.begin()
    out = op.field(0.0, u[:, 3:], ContextGrid.of(Grid.paper(2, 8), c=cache))
    (g,) = torch.autograd.grad((out * w).sum(), u)
    torch.testing.assert_close(g, g_full, rtol=0, atol=1e-12)
    assert float(g[:, :3].abs().max()) > 0


def test_gqa_gradcheck():
    gen = torch.Generator().manual_seed(6)
    r = lambda *s: torch.randn(*s, dtype=F64, generator=gen, requires_grad=True)  # noqa: E731
    WQ, WK, WV, WO, bQ = r(4, 4, 2), r(4, 2, 2), r(4, 2, 2), r(4, 2, 4), r(4, 2)
    u = r(2, 4, 4)
    kpm = torch.tensor([[False] * 4, [True, False, False, False]])
    grid = ContextGrid.of(Grid.paper(4, 4), m=kpm)

    def f(u, WQ, WK, WV, WO, bQ):
        op = GroupedQueryAttention(WQ, WK, WV, WO, bQ=bQ, scale=0.7, rotary=RotaryEmbedding(2), key_padding_mask="m")
        return op.field(0.0, u, grid)

    assert gradcheck(f, (u, WQ, WK, WV, WO, bQ))


# -- learned positions ---------------------------------------------------------------------------
def test_position_table_lookup_and_interpolation():
    P = PositionTable(torch.arange(12.0, dtype=F64).reshape(4, 3))
    torch.testing.assert_close(P.at(torch.tensor([[0, 3]])), torch.tensor([[[0.0, 1, 2], [9, 10, 11]]], dtype=F64))
    torch.testing.assert_close(P.at(torch.tensor([1.5], dtype=F64)), torch.tensor([[4.5, 5.5, 6.5]], dtype=F64))
    g = Grid(x=Interval(n=5, spacing=0.5), y=Interval.paper(3))
    torch.testing.assert_close(P(0.0, g)[:, 0], torch.tensor([0.0, 1.5, 3.0, 4.5, 6.0], dtype=F64))
    with pytest.raises(ValueError, match="outside the learned position table"):
        P.at(torch.tensor([4]))
    x = torch.tensor([0.25, 1.5, 2.75], dtype=F64, requires_grad=True)
    W = torch.randn(4, 3, dtype=F64, requires_grad=True)

    def f(x, W):
        t = PositionTable(torch.zeros(4, 3, dtype=F64))
        t._parameters["weight"] = W
        return t.at(x)

    assert gradcheck(f, (x, W)) and gradgradcheck(f, (x, W))
