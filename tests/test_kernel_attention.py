"""Nadaraya-Watson kernel attention (paper 001 §2.3-§3.3): functional and operator against
direct transcriptions, and softmax attention = Gaussian kernel attention after LayerNorm
(paper 001, eq. 8)."""

import math

import pytest
import torch
import torch.nn.functional as F

from opsplit import Grid, Interval
from opsplit.functional import KERNELS, nadaraya_watson_attention
from opsplit.operators import KernelAttention, SoftmaxAttention


def K_of(name, r):
    """paper 001 §2.2, written out."""
    if name == "gaussian":
        return torch.exp(-(r**2) / 2) / math.sqrt(2 * math.pi)
    if name == "boxcar":
        return torch.where(r <= 1, 0.5, 0.0).to(r.dtype)
    return torch.where(r <= 1, 0.75 * (1 - r**2), 0.0).to(r.dtype)


def naive_nw(q, k, v, kernel, h, w=None):
    """m(q) = sum_i K_h(|q - k_i|) v_i / sum_i K_h(|q - k_i|) (paper 001, eq. 5), 0 if empty."""
    r = (q.unsqueeze(-2) - k.unsqueeze(-3)).pow(2).sum(-1).sqrt()
    Kx = K_of(kernel, r / h) / h
    if w is not None:
        Kx = Kx * w
    den = Kx.sum(-1, keepdim=True)
    return torch.where(den > 0, Kx @ v / torch.where(den > 0, den, 1.0), 0.0)


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("h", [0.4, 1.0, 3.0])
def test_functional_matches_naive(kernel, h, dtype, device):
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(2, 3, 11, 4, generator=gen, dtype=torch.float64)
    k = torch.randn(2, 3, 13, 4, generator=gen, dtype=torch.float64)
    v = torch.randn(2, 3, 13, 5, generator=gen, dtype=torch.float64)
    w = torch.rand(13, generator=gen, dtype=torch.float64) + 0.1
    for kw in ({}, {"key_weights": w}):
        out = nadaraya_watson_attention(*[t.to(dtype=dtype, device=device) for t in (q, k, v)],
                                        kernel=kernel, bandwidth=h,
                                        **{a: b.to(dtype=dtype, device=device) for a, b in kw.items()})
        ref = naive_nw(q, k, v, kernel, h, kw.get("key_weights"))
        tol = 1e-12 if dtype == torch.float64 else 2e-5
        assert torch.allclose(out.cpu().double(), ref, rtol=0, atol=tol * float(ref.abs().max()))


def test_masks_and_empty_neighbourhoods():
    gen = torch.Generator().manual_seed(1)
    q = torch.randn(2, 1, 6, 3, generator=gen, dtype=torch.float64)
    k = torch.randn(2, 1, 7, 3, generator=gen, dtype=torch.float64)
    v = torch.randn(2, 1, 7, 2, generator=gen, dtype=torch.float64)
    mask = torch.zeros(2, 7, dtype=torch.bool)
    mask[0, :3] = True
    mask[1] = True  # every key masked: 0
    for kernel in KERNELS:
        out = nadaraya_watson_attention(q, k, v, kernel=kernel, bandwidth=1.5, key_padding_mask=mask)
        ref = naive_nw(q, k, v, kernel, 1.5, (~mask).double().unsqueeze(1).unsqueeze(1))
        assert torch.allclose(out, ref, rtol=0, atol=1e-12)
        assert bool((out[1] == 0).all())
    # a far-away query has no key within a compact support: 0, not NaN
    qf = q.clone()
    qf[0, 0, 0] = 100.0
    for kernel in ("boxcar", "epanechnikov"):
        out = nadaraya_watson_attention(qf, k, v, kernel=kernel, bandwidth=1.0)
        assert bool((out[0, 0, 0] == 0).all()) and bool(torch.isfinite(out).all())


def test_softmax_is_gaussian_kernel_attention_after_layernorm():
    """paper 001 eq. (8): LayerNorm'd keys all have |k| = sqrt(d); then the Gaussian kernel
    with bandwidth d^(1/4) gives softmax(q k^T / sqrt(d)) exactly."""
    gen = torch.Generator().manual_seed(2)
    d = 16
    x = torch.randn(2, 4, 20, d, generator=gen, dtype=torch.float64)
    q = F.layer_norm(torch.randn(2, 4, 20, d, generator=gen, dtype=torch.float64), (d,), eps=0.0)
    k = F.layer_norm(x, (d,), eps=0.0)
    v = torch.randn(2, 4, 20, 3, generator=gen, dtype=torch.float64)
    soft = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(d), -1) @ v
    nw = nadaraya_watson_attention(q, k, v, kernel="gaussian", bandwidth=d**0.25)
    assert torch.allclose(nw, soft, rtol=0, atol=1e-13)
    nw32 = nadaraya_watson_attention(q.float(), k.float(), v.float(), kernel="gaussian",
                                     bandwidth=d**0.25)
    assert torch.allclose(nw32.double(), soft, rtol=0, atol=1e-5)
    # without the normalisation the two differ (the test can fail)
    q2, k2 = torch.randn_like(q), torch.randn_like(k) * 2
    soft2 = torch.softmax(q2 @ k2.transpose(-1, -2) / math.sqrt(d), -1) @ v
    assert not torch.allclose(nadaraya_watson_attention(q2, k2, v, bandwidth=d**0.25), soft2, rtol=0, atol=1e-3)


GRIDS = {
    "paper": Grid.paper(7, 5),
    "trapezoid": Grid(x=Interval(n=7, length=2.0, rule="trapezoid"),
                      y=Interval(n=5, length=0.5, rule="trapezoid")),
}


@pytest.mark.parametrize("gname", list(GRIDS))
@pytest.mark.parametrize("kernel", KERNELS)
def test_operator_matches_quadrature_loops(gname, kernel):
    g = GRIDS[gname]
    gen = torch.Generator().manual_seed(3)
    W = [torch.randn(g.ny, g.ny, generator=gen, dtype=torch.float64) for _ in range(3)]
    u = torch.randn(2, g.nx, g.ny, generator=gen, dtype=torch.float64)
    h = 2.5
    op = KernelAttention(*W, kernel=kernel, bandwidth=h)
    wx, wy = g.x.weights(torch.float64), g.y.weights(torch.float64)
    Q, K, V = [torch.einsum("bxl,lm,l->bxm", u, Wm, wy) for Wm in W]
    ref = torch.zeros_like(u)
    for b in range(2):
        for i in range(g.nx):
            r = torch.stack([((Q[b, i] - K[b, j]) ** 2 * wy).sum().sqrt() for j in range(g.nx)])
            kern = K_of(kernel, r / h) * wx
            if kern.sum() > 0:
                ref[b, i] = (kern[:, None] * V[b]).sum(0) / kern.sum()
    assert torch.allclose(op(u, grid=g), ref, rtol=0, atol=1e-12)


@pytest.mark.parametrize("gname", list(GRIDS))
def test_operator_with_layernorm_equals_softmax_attention(gname):
    """KernelAttention(gaussian, h = |Omega_y|^(1/4), qk_norm) equals softmax attention on the
    S1-projected queries and keys with opsplit's default scale 1/sqrt(|Omega_y|) (eq. 6)."""
    g = GRIDS[gname]
    gen = torch.Generator().manual_seed(4)
    W = [torch.randn(g.ny, g.ny, generator=gen, dtype=torch.float64) for _ in range(3)]
    u = torch.randn(2, g.nx, g.ny, generator=gen, dtype=torch.float64)
    h = g.y.measure ** 0.25
    op = KernelAttention(*W, kernel="gaussian", bandwidth=h, qk_norm=True)
    assert math.isclose(op.softmax_scale(), 1 / math.sqrt(g.y.measure))
    # independent: LayerNorm (weighted mean / variance over Omega_y) and an explicit softmax
    wx, wy = g.x.weights(torch.float64), g.y.weights(torch.float64)
    Q, K, V = [torch.einsum("bxl,lm,l->bxm", u, Wm, wy) for Wm in W]

    def ln(z):
        m = (z * wy).sum(-1, keepdim=True) / wy.sum()
        s = (((z - m) ** 2) * wy).sum(-1, keepdim=True) / wy.sum()
        return (z - m) / s.sqrt()

    Qn, Kn = ln(Q), ln(K)
    scores = torch.einsum("bil,bjl,l->bij", Qn, Kn, wy) / math.sqrt(g.y.measure)
    A = torch.softmax(scores + wx.log(), -1)
    assert torch.allclose(op(u, grid=g), A @ V, rtol=0, atol=1e-12)
    # and through opsplit's own SoftmaxAttention when u is already normalised and W^Q = W^K = I
    eye = torch.eye(g.ny, dtype=torch.float64) / wy  # kernel_y(u, eye) = u
    un = ln(u)
    soft = SoftmaxAttention(eye, eye, W[2])
    kern = KernelAttention(eye, eye, W[2], kernel="gaussian", bandwidth=h)
    assert torch.allclose(kern(un, grid=g), soft(un, grid=g), rtol=0, atol=1e-12)


def test_gradients(device):
    gen = torch.Generator().manual_seed(5)
    q = torch.randn(1, 2, 5, 3, generator=gen, dtype=torch.float64, requires_grad=True)
    k = torch.randn(1, 2, 6, 3, generator=gen, dtype=torch.float64, requires_grad=True)
    v = torch.randn(1, 2, 6, 2, generator=gen, dtype=torch.float64, requires_grad=True)
    for kernel in ("gaussian", "epanechnikov"):
        assert torch.autograd.gradcheck(
            lambda a, b, c, kernel=kernel: nadaraya_watson_attention(a, b, c, kernel=kernel,
                                                                     bandwidth=2.0), (q, k, v))
    assert torch.autograd.gradcheck(
        lambda c: nadaraya_watson_attention(q.detach(), k.detach(), c, kernel="boxcar", bandwidth=2.0),
        (v,))
    g = Grid.paper(6, 3)
    W = [torch.randn(3, 3, generator=gen, dtype=torch.float64, requires_grad=True) for _ in range(3)]
    u = torch.randn(1, 6, 3, generator=gen, dtype=torch.float64, requires_grad=True)
    op = KernelAttention(*W, bandwidth=1.3, qk_norm=True)
    assert torch.autograd.gradcheck(lambda x, *ws: op(x, grid=g), (u, *W))


def test_errors_are_clear():
    q = torch.randn(1, 4, 3)
    with pytest.raises(ValueError, match="kernel: expected one of"):
        nadaraya_watson_attention(q, q, q, kernel="cosine")
    for h in (0.0, -1.0, float("nan")):
        with pytest.raises(ValueError, match="bandwidth: expected finite values > 0"):
            nadaraya_watson_attention(q, q, q, bandwidth=h)
    with pytest.raises(ValueError, match="shape mismatch"):
        nadaraya_watson_attention(q, q[..., :2], q)
    bad = q.clone()
    bad[0, 0, 0] = float("nan")
    with pytest.raises(ValueError, match="q: expected finite"):
        nadaraya_watson_attention(bad, q, q)
    W = torch.randn(3, 3)
    with pytest.raises(ValueError, match="KernelAttention.kernel"):
        KernelAttention(W, W, W, kernel="tricube")
    with pytest.raises(ValueError, match="KernelAttention.bandwidth"):
        KernelAttention(W, W, W, bandwidth=0.0)
