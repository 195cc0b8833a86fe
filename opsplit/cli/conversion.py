"""What ``opsplit convert`` measures of a converted model, for every family
(:mod:`opsplit.cli.convert`: the torch encoder, ViT, CvT; :mod:`opsplit.cli.convert_decoders`:
the decoder-only LLMs): seeded random weights everywhere, and the largest difference of two
outputs."""

from __future__ import annotations

import torch

__all__ = ["perturb", "diff"]


def perturb(module, gen):
    """``module`` with seeded random weights added everywhere (biases and LayerNorm affines
    included), so that a parameter the conversion misses shows in the difference."""
    with torch.no_grad():
        for p in module.parameters():
            p.add_(0.1 * torch.randn(p.shape, generator=gen, dtype=torch.float64).to(p.dtype))
    return module


def diff(a, b) -> tuple[float, float]:
    """``(max |a - b|, max |a - b| / max |b|)``."""
    d = float((a - b).abs().max())
    return d, d / max(float(b.abs().max()), 1e-300)
