"""The 2-D Fourier neural operator of FNO's Darcy script (Li et al., *Fourier Neural Operator
for Parametric PDEs*, ICLR 2021; ``fourier_2d.py`` of github.com/zongyi-li/fourier_neural_operator),
written here as the peer of ``benchmarks/neural_operator.py`` (not a part of the library).

As the script has it: the input channels (a(x, y), x, y) lifted to ``width`` = 32 channels,
the lifted field padded by ``padding`` = 9 nodes of zeros at the high end of both axes (the
domain is not periodic), four Fourier layers v <- GELU(K v + W v) (no activation after the
last), K a 2-D real FFT keeping the ``modes`` = 12 lowest modes of the first axis in both
corners (non-negative and negative frequencies) and of the second axis (rfft), each corner
with its own complex ``width x width`` weights drawn uniformly in [0, 1/width^2) (real and
imaginary parts), W a 1x1 convolution; the padding cut off; projection 32 -> 128 -> 1 with
a GELU.  The data are normalised per node as the script does (``UnitGaussianNormalizer``:
the training set's mean and standard deviation at every node, eps 1e-5, for a and for u);
the loss is the relative L2 error of the decoded output (``LpLoss``).

Per-node normalisers live on the training grid.  To evaluate a trained peer on another grid
(``--zero-shot``), its normalisers are resampled to that grid by bilinear interpolation
(``F.interpolate(..., align_corners=True)``: the nodes (i, j)/(N - 1) of both grids), and
the padding stays 9 nodes (the script's constant: 9/84 of the domain at 85 nodes, 9/420 at
421) — what the script does when handed another grid.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["SpectralConv2d", "FNO2d", "UnitGaussianNormalizer"]


class SpectralConv2d(nn.Module):
    """FNO's 2-D Fourier layer: rfft2, the ``modes x modes`` lowest modes in the two
    corners (rows 0..m-1 and -m..-1, columns 0..m-1) times complex weights, irfft2."""

    def __init__(self, width: int, modes: int, generator: torch.Generator | None = None):
        super().__init__()
        self.modes = modes
        scale = 1.0 / (width * width)
        shape = (width, width, modes, modes)
        self.w1_re = nn.Parameter(scale * torch.rand(shape, generator=generator))
        self.w1_im = nn.Parameter(scale * torch.rand(shape, generator=generator))
        self.w2_re = nn.Parameter(scale * torch.rand(shape, generator=generator))
        self.w2_im = nn.Parameter(scale * torch.rand(shape, generator=generator))

    def forward(self, v: torch.Tensor) -> torch.Tensor:  # (B, C, n1, n2)
        B, C, n1, n2 = v.shape
        m = self.modes
        V = torch.fft.rfft2(v)
        out = torch.zeros(B, C, n1, n2 // 2 + 1, dtype=V.dtype, device=v.device)
        out[:, :, :m, :m] = torch.einsum("bixy,ioxy->boxy", V[:, :, :m, :m], torch.complex(self.w1_re, self.w1_im))
        out[:, :, -m:, :m] = torch.einsum("bixy,ioxy->boxy", V[:, :, -m:, :m], torch.complex(self.w2_re, self.w2_im))
        return torch.fft.irfft2(out, s=(n1, n2))


class UnitGaussianNormalizer(nn.Module):
    """Per-node mean and standard deviation of a training set ``(n, N, N)``:
    ``encode(x) = (x - mean) / (std + eps)``, ``decode(y) = y (std + eps) + mean``
    (FNO's ``utilities3.UnitGaussianNormalizer``, eps 1e-5).  ``at(N)``: the statistics
    resampled bilinearly to an ``N x N`` grid of the same square."""

    def __init__(self, x: torch.Tensor, eps: float = 1e-5):
        super().__init__()
        self.register_buffer("mean", x.mean(0))
        self.register_buffer("std", x.std(0))
        self.eps = eps

    def _stats(self, n: int):
        if n == self.mean.shape[-1]:
            return self.mean, self.std
        pair = torch.stack([self.mean, self.std])[None]
        m, s = F.interpolate(pair, size=(n, n), mode="bilinear", align_corners=True)[0]
        return m, s

    def encode(self, x: torch.Tensor) -> torch.Tensor:
        m, s = self._stats(x.shape[-1])
        return (x - m) / (s + self.eps)

    def decode(self, y: torch.Tensor) -> torch.Tensor:
        m, s = self._stats(y.shape[-1])
        return y * (s + self.eps) + m


class FNO2d(nn.Module):
    """FNO's Darcy model (module docstring).  ``forward(a)`` takes the raw coefficient
    ``(B, N, N)`` and returns u ``(B, N, N)``: the per-node normalisers of ``a`` and ``u``
    (fitted on the training set by :meth:`fit_normalizers`) are applied inside, so that the
    model is one map a -> u like the library's models."""

    def __init__(self, modes: int = 12, width: int = 32, padding: int = 9, generator: torch.Generator | None = None):
        super().__init__()
        self.modes, self.width, self.padding = modes, width, padding
        self.fc0 = nn.Linear(3, width)
        self.convs = nn.ModuleList(SpectralConv2d(width, modes, generator) for _ in range(4))
        self.ws = nn.ModuleList(nn.Conv2d(width, width, 1) for _ in range(4))
        self.fc1 = nn.Linear(width, 128)
        self.fc2 = nn.Linear(128, 1)
        self.a_norm: UnitGaussianNormalizer | None = None
        self.u_norm: UnitGaussianNormalizer | None = None

    def fit_normalizers(self, a: torch.Tensor, u: torch.Tensor) -> None:
        self.a_norm = UnitGaussianNormalizer(a)
        self.u_norm = UnitGaussianNormalizer(u)

    def forward(self, a: torch.Tensor) -> torch.Tensor:
        if self.a_norm is None:
            raise RuntimeError("FNO2d: call fit_normalizers(train_a, train_u) first (the script's normalisers)")
        B, n, _ = a.shape
        x = torch.linspace(0, 1, n, dtype=a.dtype, device=a.device)
        gx, gy = torch.meshgrid(x, x, indexing="ij")
        h = torch.stack([self.a_norm.encode(a), gx.expand(B, n, n), gy.expand(B, n, n)], dim=-1)
        v = self.fc0(h).permute(0, 3, 1, 2)
        v = F.pad(v, [0, self.padding, 0, self.padding])
        for k, (K, W) in enumerate(zip(self.convs, self.ws)):
            v = K(v) + W(v)
            if k < 3:
                v = F.gelu(v)
        v = v[..., : n, : n].permute(0, 2, 3, 1)
        out = self.fc2(F.gelu(self.fc1(v))).squeeze(-1)
        return self.u_norm.decode(out)
