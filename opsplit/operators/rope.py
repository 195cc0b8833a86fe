r"""Rotary positions (RoPE) as a rotation of the query and key features that depends on the
token position :math:`x \in \Omega_x`.

A head's rank index :math:`k \in \{0, \dots, d-1\}` (:mod:`opsplit.operators.multihead`)
is split into :math:`d/2` planes :math:`(k, k + d/2)` (Hugging Face's ``rotate_half``
convention).  Plane :math:`k` turns by the angle :math:`\omega_k\,\xi(x)`:

.. math::

    (R(x) q)_k &= q_k \cos(\omega_k \xi) - q_{k+d/2} \sin(\omega_k \xi),\\
    (R(x) q)_{k+d/2} &= q_{k+d/2} \cos(\omega_k \xi) + q_k \sin(\omega_k \xi),
    \qquad \omega_k = \theta^{-2k/d},\quad k < d/2,

and the attention scores of eq. (37) become :math:`s\,\langle R(x) Q(x,h,\cdot),\,
R(\tilde x) K(\tilde x,h,\cdot)\rangle = s\,\langle Q(x,h,\cdot),\, R(\tilde x - x)
K(\tilde x,h,\cdot)\rangle`: they depend on the positions only through :math:`\tilde x - x`
(rotations of one plane commute and :math:`R(a)^\top R(b) = R(b - a)`).

:math:`\xi(x)` is the token's coordinate in :math:`\Omega_x` measured from the first token,
:math:`\xi(x) = x - x_1`, defined for every real :math:`x`, so a model keeps its meaning on a
refined token grid (:math:`L_x` fixed, :math:`N_x` growing: :math:`\xi_i = i\,h`).  Any other
origin gives the same attention (the relative form above); this one makes the paper's grid
:math:`L = N` (:math:`h = 1`) give Hugging Face's positions :math:`\xi_i = i` exactly.  A
call may instead give the coordinates explicitly (a ``positions`` context input of shape
``(B, N_x)``: Hugging Face's ``position_ids`` in generation with left padding, where each
sample's positions start at its first real token).

**Arithmetic.**  By default the angles and their cosines and sines are computed in float64
and rounded to the state's dtype.  ``compute_dtype=torch.float32`` evaluates Hugging Face's
``LlamaRotaryEmbedding`` literally: ``inv_freq = 1 / theta ** (arange(0, d, 2) / d)`` in
float32, ``angle = position.float() * inv_freq``, ``cos``/``sin`` in float32, then cast — what
a float64 HF model computes (so the converters ask for it to be exact against HF in float64).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from .._checks import check_positive_float, check_positive_int
from ..grid import Grid

__all__ = ["RotaryEmbedding", "rotate_half"]


def rotate_half(x: Tensor) -> Tensor:
    """:math:`(q_k, q_{k+d/2}) \\mapsto (-q_{k+d/2}, q_k)`: the quarter turn of every plane."""
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


class RotaryEmbedding(nn.Module):
    """The rotation :math:`R(x)` of the module docstring for heads of size ``head_dim``.

    Args:
        head_dim: :math:`d` (even).
        theta: the base :math:`\\theta > 0` (HF's ``rope_theta``).
        compute_dtype: ``None`` (angles in float64) or ``torch.float32`` (HF's literal
            float32 arithmetic).
    """

    def __init__(self, head_dim: int, theta: float = 10000.0, *, compute_dtype=None):
        super().__init__()
        self.head_dim = check_positive_int(head_dim, "RotaryEmbedding.head_dim")
        if self.head_dim % 2:
            raise ValueError(f"RotaryEmbedding.head_dim: expected an even head size, got {head_dim}")
        self.theta = check_positive_float(theta, "RotaryEmbedding.theta")
        if compute_dtype not in (None, torch.float32, torch.float64):
            raise ValueError(
                f"RotaryEmbedding.compute_dtype: expected None, torch.float32 or torch.float64, got {compute_dtype!r}"
            )
        self.compute_dtype = compute_dtype
        self._frequencies: dict = {}  # (theta, head_dim, compute_dtype, device) -> omega

    def frequencies(self, device=None) -> Tensor:
        """:math:`\\omega_k = \\theta^{-2k/d}`, ``k < d/2`` (float32 as HF computes them with
        ``compute_dtype=torch.float32``, else float64); computed once per device and kept (a
        new tensor is made when ``theta``, ``head_dim`` or ``compute_dtype`` change)."""
        key = (self.theta, self.head_dim, self.compute_dtype, str(device))
        w = self._frequencies.get(key)
        if w is None:
            w = self._frequencies[key] = self._compute_frequencies(device)
        return w

    def _compute_frequencies(self, device) -> Tensor:
        d = self.head_dim
        if self.compute_dtype == torch.float32:
            return 1.0 / (self.theta ** (torch.arange(0, d, 2, dtype=torch.float32, device=device) / d))
        k = torch.arange(0, d, 2, dtype=torch.float64, device=device)
        return torch.exp(-(k / d) * math.log(self.theta))

    def cos_sin(self, positions: Tensor, dtype) -> tuple[Tensor, Tensor]:
        """:math:`\\cos(\\omega \\xi)`, :math:`\\sin(\\omega \\xi)` of shape ``positions.shape + (d,)``
        (each plane's angle twice, for ``rotate_half``), in ``dtype``."""
        w = self.frequencies(positions.device)
        p = positions.to(w.dtype)
        ang = p[..., None] * w
        ang = torch.cat((ang, ang), dim=-1)
        return ang.cos().to(dtype), ang.sin().to(dtype)

    @staticmethod
    def grid_positions(grid: Grid, n: int, offset: float = 0.0, device=None) -> Tensor:
        """:math:`\\xi_i = x_i - x_1 + \\text{offset}` for the ``n`` nodes of ``grid.x`` (float64)."""
        itv = grid.x if grid.x.n == n else grid.x.with_n(n)
        x = itv.nodes(torch.float64, device)
        return x - x[0] + offset

    @staticmethod
    def token_positions(grid: Grid, n: int, past: int = 0, device=None) -> Tensor:
        """The coordinates :math:`\\xi_i = n_{past} h + x_i - x_1` of ``n`` new tokens after
        ``past`` earlier ones (a key/value cache) on ``grid.x`` of spacing :math:`h` (1 when
        the grid leaves it open), float64: :math:`0, 1, 2, \\dots` on the paper's grid,
        :math:`0, h, 2h, \\dots` on a refined one (module docstring).  The learned positions
        of :class:`~opsplit.models.DecoderLM` read the same coordinates."""
        h = grid.x.spacing if grid.x.spacing is not None else 1.0
        return RotaryEmbedding.grid_positions(grid, n, past * h, device)

    @staticmethod
    def rotate(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
        """:math:`R(x)\\,q` for features ``x`` ``(..., N_x, d)`` and ``cos``, ``sin`` that
        broadcast to it (HF's ``q * cos + rotate_half(q) * sin``)."""
        return (x * cos) + (rotate_half(x) * sin)

    def extra_repr(self) -> str:
        s = f"head_dim={self.head_dim}, theta={self.theta:g}"
        if self.compute_dtype is not None:
            s += f", compute_dtype={self.compute_dtype}"
        return s
