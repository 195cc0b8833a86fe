"""The patch embedding as a convolution integral whose quadrature follows the pixel grid:
exact area weights (against average pooling and a brute-force refinement), the reference
tokens from a nearest-upsampled image, second-order convergence to the integral for a smooth
image, and the CvT behind the same quadrature."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from opsplit.models import (
    CvtStageSpec,
    IntegralPatchEmbedding,
    OnPixelGrid,
    PatchEmbedding,
    build_cvt,
)
from opsplit.models.integral_patch import area_weights

F64 = torch.float64


@pytest.mark.parametrize("n_in,n_out", [(16, 8), (32, 8), (12, 8), (8, 12), (5, 3)])
def test_area_weights(n_in, n_out):
    A = area_weights(n_in, n_out, F64)
    torch.testing.assert_close(A.sum(1), torch.ones(n_out, dtype=F64), rtol=0, atol=1e-15)
    x = torch.randn(n_in, dtype=F64)
    # brute force: both grids refined to the common n_in * n_out cells, then averaged
    fine = x.repeat_interleave(n_out)
    ref = fine.view(n_out, n_in).mean(1)
    torch.testing.assert_close(A @ x, ref, rtol=1e-13, atol=1e-13)
    if n_in % n_out == 0:  # integer ratios: average pooling
        torch.testing.assert_close(A @ x, F.avg_pool1d(x.view(1, 1, -1), n_in // n_out).flatten(), rtol=1e-14,
                                   atol=1e-14)


def _emb(dtype=F64):
    torch.manual_seed(0)
    return PatchEmbedding(8, 2, 1, 6, dtype=dtype)


def test_reference_grid_is_the_plain_embedding():
    plain = _emb()
    integral = IntegralPatchEmbedding.from_patch_embedding(plain)
    x = torch.randn(3, 1, 8, 8, dtype=F64)
    torch.testing.assert_close(integral(x), plain(x), rtol=0, atol=0)


@pytest.mark.parametrize("factor", [2, 4])
def test_nearest_upsampled_image_gives_the_reference_tokens(factor, dtype):
    integral = IntegralPatchEmbedding.from_patch_embedding(_emb(dtype))
    x = torch.randn(2, 1, 8, 8, dtype=dtype)
    up = x.repeat_interleave(factor, 2).repeat_interleave(factor, 3)
    tol = 1e-14 if dtype == F64 else 1e-6
    torch.testing.assert_close(integral(up), integral(x), rtol=tol, atol=tol)


def test_smooth_image_converges_at_second_order():
    """Pixel values at the cell midpoints of a smooth f on 8, 16, ..., 128 pixels: the tokens
    converge to those of the exact cell averages (the integral P) like h^2."""
    integral = IntegralPatchEmbedding.from_patch_embedding(_emb())

    def F_(a, b):  # an antiderivative in both variables of f(x, y) = sin(2 pi x) cos(3 y) + x y
        return -torch.cos(2 * math.pi * a) / (2 * math.pi) * torch.sin(3 * b) / 3 + a * a * b * b / 4

    e = torch.linspace(0, 1, 9, dtype=F64)
    exact = (F_(e[1:, None], e[None, 1:]) - F_(e[:-1, None], e[None, 1:]) - F_(e[1:, None], e[None, :-1])
             + F_(e[:-1, None], e[None, :-1])) * 64  # cell averages on the 8 x 8 grid
    ref = integral(exact.view(1, 1, 8, 8))
    errs = []
    for n in (8, 16, 32, 64, 128):
        c = (torch.arange(n, dtype=F64) + 0.5) / n
        img = torch.sin(2 * math.pi * c[:, None]) * torch.cos(3 * c[None, :]) + c[:, None] * c[None, :]
        errs.append(float((integral(img.view(1, 1, n, n)) - ref).abs().max().detach()))
    rates = [errs[k] / errs[k + 1] for k in range(len(errs) - 1)]
    assert all(3.8 < r < 4.2 for r in rates[1:]), (errs, rates)


def test_cvt_behind_the_pixel_quadrature():
    torch.manual_seed(0)
    cvt = build_cvt(1, [CvtStageSpec(in_channels=1, embed_dim=8, depth=1, num_heads=2, patch_size=3, patch_stride=2,
                                     patch_padding=1)], num_labels=10, dtype=F64)
    model = OnPixelGrid(cvt, 8).eval()
    x = torch.randn(2, 1, 8, 8, dtype=F64)
    up = x.repeat_interleave(4, 2).repeat_interleave(4, 3)
    with torch.no_grad():
        torch.testing.assert_close(model(up).logits, cvt(x).logits, rtol=1e-13, atol=1e-13)
        assert cvt(up).logits.shape == (2, 10)  # the bare CvT takes 32 x 32 too: 16x more tokens, other logits
