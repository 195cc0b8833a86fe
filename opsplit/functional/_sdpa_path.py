r"""Which ``scaled_dot_product_attention`` implementation runs, the same on every torch.

For 3-D inputs ``(B, N, d)`` (one head) the math path,
``aten::_scaled_dot_product_attention_math`` (scores, softmax, product: differentiable
operations, so autograd differentiates it to any order; memory :math:`O(N_q N_k)`). For
inputs of rank 4 and more (heads) torch's dispatcher, which on the CPU picks its fused
flash kernel (memory linear in the sequence length; its backward has no derivative, so a
double backward through it is refused by torch — see docs/reliability.md).

torch 2.13 sent 3-D inputs to the math path by itself; torch 2.14 sends them to the flash
kernel, which silently removed double backward from every single-head softmax attention.
Choosing here keeps the behaviour, and the documented double-backward support, the same on
every torch version in opsplit's range.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = ["sdpa"]


def sdpa(q: Tensor, k: Tensor, v: Tensor, attn_mask: Tensor | None = None,
         dropout_p: float = 0.0, is_causal: bool = False, scale: float | None = None,
         enable_gqa: bool = False) -> Tensor:
    """``F.scaled_dot_product_attention`` with the path choice of the module docstring
    (``enable_gqa``: fewer key/value heads than query heads, torch >= 2.5, 4-D inputs)."""
    if enable_gqa:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, dropout_p=dropout_p,
                                              is_causal=is_causal, scale=scale, enable_gqa=True)
    if q.dim() == 3:
        return torch.ops.aten._scaled_dot_product_attention_math(
            q, k, v, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal,
            scale=scale)[0]
    return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, dropout_p=dropout_p,
                                          is_causal=is_causal, scale=scale)
