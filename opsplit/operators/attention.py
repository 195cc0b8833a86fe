r"""Softmax attention as a non-local integral operator: term I of paper 002, eq. (7).

.. math::

    Q(x, y, t; u) &= \int_{\Omega_y} W^Q(\xi, y, t)\, u(x, \xi, t)\, d\xi   &(3)\\
    K(x, y, t; u) &= \int_{\Omega_y} W^K(\xi, y, t)\, u(x, \xi, t)\, d\xi   &(4)\\
    V(x, y, t; u) &= \int_{\Omega_y} W^V(\xi, y, t)\, u(x, \xi, t)\, d\xi   &(5)\\
    \gamma(x, \tilde x, t; u) &= \mathrm{Softmax}_2\Big(s\,
        \langle Q(x, \cdot), K(\tilde x, \cdot)\rangle_{\Omega_y}\Big),
        \quad s = 1/\sqrt{|\Omega_y|}                                          &(6)\\
    A(t; u)(x, y) &= \langle \gamma(x, \cdot, t; u), V(\cdot, y, t; u)\rangle_{\Omega_x}, &(7, \text{I})

where :math:`\mathrm{Softmax}_2(a)(x, \tilde x) = e^{a(x, \tilde x)} / \int_{\Omega_x}
e^{a(x, \eta)} d\eta`.  The explicit-Euler step of this term is eq. (19); with
``L = N`` and :math:`\Delta t = 1` it is eqs. (27)–(29): a single attention head with
its skip connection.

Discretisation: the :math:`\Omega_y` integrals carry the y-quadrature weights; the
:math:`\Omega_x` quadrature weights enter the softmax as :math:`\log w_x` and cancel when
they are equal.  The result is computed with
``torch.nn.functional.scaled_dot_product_attention``, guarded against scores that overflow
the dtype (float32 evaluated in float64 there, float64 refused with a clear error; see
:mod:`opsplit.operators._sdpa`).

On the scale: eq. (6) (and (19), (37)) scale the scores by :math:`1/\sqrt{|\Omega_y|}`;
eq. (29) as printed has no scale, and eq. (41) prints :math:`1/\sqrt{L_x}`.  opsplit
follows eq. (6) by default (``scale=None``) and takes any other value as an argument —
``scale=1.0`` is eq. (29) literally; standard heads use :math:`1/\sqrt{d_{head}}`.
"""

from __future__ import annotations

import math

from torch import Tensor

from ..controls import as_control
from ..grid import Grid
from ._sdpa import attention, check_scores
from .base import Operator

__all__ = ["SoftmaxAttention"]


class SoftmaxAttention(Operator):
    """Single-head softmax attention integral (paper 002, eqs. 3–6; step eq. 19/29).

    Args:
        WQ, WK, WV: controls (or tensors, taken as constant in time) for the kernels
            :math:`W^Q(\\tilde y, y, t)`, :math:`W^K`, :math:`W^V`, each of shape
            ``(N_y, N_y)`` on the grid (row: integration variable :math:`\\tilde y`).
        scale: score scale :math:`s`; ``None`` is :math:`1/\\sqrt{|\\Omega_y|}` (eq. 6).
    """

    has_field = True
    default_solver = "explicit"

    def __init__(self, WQ, WK, WV, *, scale: float | None = None):
        super().__init__()
        self.WQ = as_control(WQ, "SoftmaxAttention.WQ", axes=("y", "y"))
        self.WK = as_control(WK, "SoftmaxAttention.WK", axes=("y", "y"))
        self.WV = as_control(WV, "SoftmaxAttention.WV", axes=("y", "y"))
        if scale is not None:
            scale = float(scale)
            if not math.isfinite(scale) or scale <= 0:
                raise ValueError(f"SoftmaxAttention.scale: expected a finite number > 0, got {scale}")
        self.scale = scale

    def score_scale(self, grid: Grid) -> float:
        """The scale :math:`s` of eq. (6) on ``grid``."""
        return self.scale if self.scale is not None else 1.0 / math.sqrt(grid.y.measure)

    def check(self, grid: Grid) -> None:
        for name in ("WQ", "WK", "WV"):
            getattr(self, name).validate(grid, f"SoftmaxAttention.{name}")

    def qkv(self, t, u: Tensor, grid: Grid) -> tuple[Tensor, Tensor, Tensor]:
        """The integral transforms (3)–(5), each of shape (B, N_x, N_y)."""
        q = grid.kernel_y(u, self.WQ(t, grid))
        k = grid.kernel_y(u, self.WK(t, grid))
        v = grid.kernel_y(u, self.WV(t, grid))
        return q, k, v

    def field(self, t, u: Tensor, grid: Grid) -> Tensor:
        q, k, v = self.qkv(t, u, grid)
        s = self.score_scale(grid)
        # <q, k>_{Omega_y} carries the y weights: fold them into q
        wy = grid.y.uniform_weight
        if wy is None:
            q = q * grid.y.weights(q.dtype, q.device)
        else:
            s = s * wy
        logw = grid.log_weights_x(q.dtype, q.device)
        return attention(q, k, v, attn_mask=logw, scale=s, name="SoftmaxAttention")

    def attention_weights(self, u: Tensor, t: float = 0.0, grid: Grid | None = None) -> Tensor:
        r"""The discrete attention map :math:`\gamma(x_k, \tilde x_j) w_j` (rows sum to 1),
        shape (B, N_x, N_x): the quadrature weights times the density of eq. (6)."""
        g = self.resolve_grid(u, grid)
        q, k, _ = self.qkv(t, u, g)
        a = check_scores(self.score_scale(g) * g.inner_y(q, k),
                         "SoftmaxAttention.attention_weights")
        logw = g.log_weights_x(a.dtype, a.device)
        if logw is not None:
            a = a + logw
        return a.softmax(-1)

    def extra_repr(self) -> str:
        return "scale=1/sqrt(|Omega_y|)" if self.scale is None else f"scale={self.scale:g}"
