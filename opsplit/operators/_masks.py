r"""Attention masks as log-weights of the key measure (see :mod:`opsplit.operators.context`).

One place converts every mask convention to an additive *log-weight* ``bias`` that
broadcasts to ``(B, H, N_q, N_k)``: ``softmax(s + bias)`` integrates against
:math:`e^{\mathrm{bias}} w\, d\tilde x`.  Conventions are torch's
(``nn.MultiheadAttention``): a boolean mask is ``True`` where attention is *not* allowed
(log-weight :math:`-\infty`), a float mask is added to the scores.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["canonical_mask", "attention_log_weights", "check_attn_mask", "check_key_padding_mask"]


def canonical_mask(mask, name: str, dtype: torch.dtype) -> Tensor | None:
    """Bool (``True`` = masked out) or float (additive) mask -> additive float mask of
    ``dtype``; anything else is a clear ``TypeError``."""
    if mask is None:
        return None
    if not isinstance(mask, Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor (bool or float) or None, got {type(mask).__name__}")
    if mask.dtype == torch.bool:
        return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill_(mask, float("-inf"))
    if mask.is_floating_point():
        return mask if mask.dtype == dtype else mask.to(dtype)
    raise TypeError(
        f"{name}: expected a bool mask (True = not attended) or a float mask (added to the "
        f"scores), got dtype {mask.dtype}"
    )


def check_attn_mask(mask: Tensor, name: str, B: int, H: int, Nq: int, Nk: int) -> None:
    """Shapes torch accepts for an attention mask: (N_q, N_k), (B*H, N_q, N_k); opsplit also
    takes (B or 1, H or 1, N_q, N_k)."""
    shape = tuple(mask.shape)
    ok = (
        (mask.dim() == 2 and shape == (Nq, Nk))
        or (mask.dim() == 3 and shape == (B * H, Nq, Nk))
        or (mask.dim() == 4 and shape[0] in (1, B) and shape[1] in (1, H) and shape[2:] == (Nq, Nk))
    )
    if not ok:
        raise ValueError(
            f"{name}: expected shape (N_q, N_k) = ({Nq}, {Nk}), (B*nhead, N_q, N_k) = "
            f"({B * H}, {Nq}, {Nk}) or (B, nhead, N_q, N_k) = ({B}, {H}, {Nq}, {Nk}), "
            f"got {shape}"
        )


def check_key_padding_mask(mask: Tensor, name: str, B: int, Nk: int) -> None:
    if tuple(mask.shape) != (B, Nk):
        raise ValueError(
            f"{name}: expected shape (B, N_k) = ({B}, {Nk}) (True / -inf marks a padded key), "
            f"got {tuple(mask.shape)}"
        )


def attention_log_weights(
    *,
    B: int,
    H: int,
    Nq: int,
    Nk: int,
    dtype: torch.dtype,
    device,
    attn_mask: Tensor | None = None,
    key_padding_mask: Tensor | None = None,
    causal: bool = False,
    log_wx: Tensor | None = None,
    names: tuple[str, str] = ("attn_mask", "key_padding_mask"),
    causal_offset: int = 0,
) -> Tensor | None:
    """The additive log-weight of the key measure, broadcastable to ``(B, H, N_q, N_k)``, or
    ``None`` when the measure is the plain (uniform) one.

    ``causal`` restricts query ``i`` to keys ``j <= i + causal_offset`` (seed 000, eq. 9;
    ``causal_offset`` = the number of cached keys before the queries' own, a decoder's key/value
    cache: the alignment is then bottom-right); ``log_wx`` holds the logs of non-uniform
    Omega_x quadrature weights of the keys.
    """
    bias = None
    if attn_mask is not None:
        check_attn_mask(attn_mask, names[0], B, H, Nq, Nk)
        m = canonical_mask(attn_mask, names[0], dtype).to(device)
        if m.dim() == 2:
            m = m.view(1, 1, Nq, Nk)
        elif m.dim() == 3:
            m = m.view(B, H, Nq, Nk)
        bias = m
    if key_padding_mask is not None:
        check_key_padding_mask(key_padding_mask, names[1], B, Nk)
        k = canonical_mask(key_padding_mask, names[1], dtype).to(device).view(B, 1, 1, Nk)
        bias = k if bias is None else bias + k
    if causal:
        c = torch.full((Nq, Nk), float("-inf"), dtype=dtype, device=device).triu_(1 + causal_offset).view(1, 1, Nq, Nk)
        bias = c if bias is None else bias + c
    if log_wx is not None:
        w = log_wx.to(dtype=dtype, device=device).view(1, 1, 1, Nk)
        bias = w if bias is None else bias + w
    return bias
