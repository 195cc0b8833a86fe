r"""Kernel (Nadaraya–Watson) attention as a term of the continuous model (paper 001, §2.3–§3.3).

With :math:`Q, K, V` the integral transforms of paper 002, eqs. (3)–(5), the attention
density is the Nadaraya–Watson weight of a radial kernel :math:`K_h(r) = K(r/h)`
(Gaussian, boxcar or Epanechnikov, paper 001 §2.2) of the :math:`L^2(\Omega_y)` distance
between a query and a key:

.. math::

    \gamma(x, \tilde x, t; u) = \frac{K_h\big(\|Q(x,\cdot) - K(\tilde x,\cdot)\|_{\Omega_y}\big)}
        {\int_{\Omega_x} K_h\big(\|Q(x,\cdot) - K(\eta,\cdot)\|_{\Omega_y}\big)\, d\eta},
    \qquad
    A(t; u)(x, y) = \langle \gamma(x, \cdot, t; u), V(\cdot, y, t; u)\rangle_{\Omega_x}

(paper 001, eq. 5 and the display after eq. 6, with the quadratures of the grid).

**Softmax attention is Gaussian kernel attention after LayerNorm (paper 001, eq. 8).**  With
``qk_norm=True`` the query and key tokens are first projected onto
:math:`S_1(0, 1)` (LayerNorm without affine, Theorem 3.1 of paper 002), so every key has
:math:`\|K(\tilde x, \cdot)\|^2_{\Omega_y} = |\Omega_y|`.  Then
:math:`e^{-\|q - k\|^2/(2h^2)} \propto e^{\langle q, k\rangle / h^2}` for every key, and the
Gaussian kernel attention *is* softmax attention with score scale :math:`s = 1/h^2`
(:meth:`KernelAttention.softmax_scale`); the bandwidth :math:`h = |\Omega_y|^{1/4}`
(paper 001's :math:`\sqrt[4]{d}`) gives paper 002's :math:`s = 1/\sqrt{|\Omega_y|}`.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from .._checks import check_choice
from ..controls import Constant, as_control
from ..functional.kernel import KERNELS, evaluate
from ..grid import Grid
from ._sdpa import nan_carrier
from .base import Operator
from .layernorm import project_s1

__all__ = ["KernelAttention"]


class KernelAttention(Operator):
    r"""Nadaraya–Watson kernel attention integral (paper 001, §2.3–§3.3; paper 002, eqs. 3–5).

    Args:
        WQ, WK, WV: controls (or tensors) for :math:`W^Q, W^K, W^V`, shape ``(N_y, N_y)``.
        kernel: ``"gaussian"``, ``"boxcar"`` or ``"epanechnikov"``.
        bandwidth: :math:`h > 0`, a number or a (scalar) control.
        qk_norm: project queries and keys onto :math:`S_1(0, 1)` first (LayerNorm without
            affine), which makes the Gaussian case softmax attention (paper 001, eq. 8).

    A query with no key inside a compact kernel's support gets 0 (see
    :func:`~opsplit.functional.nadaraya_watson_attention`).
    """

    has_field = True
    default_solver = "explicit"

    def __init__(self, WQ, WK, WV, *, kernel: str = "gaussian", bandwidth=1.0,
                 qk_norm: bool = False):
        super().__init__()
        check_choice(kernel, KERNELS, "KernelAttention.kernel")
        self.kernel = kernel
        self.WQ = as_control(WQ, "KernelAttention.WQ", axes=("y", "y"))
        self.WK = as_control(WK, "KernelAttention.WK", axes=("y", "y"))
        self.WV = as_control(WV, "KernelAttention.WV", axes=("y", "y"))
        if isinstance(bandwidth, (int, float)) and not isinstance(bandwidth, bool):
            h = float(bandwidth)
            if not math.isfinite(h) or h <= 0:
                raise ValueError(f"KernelAttention.bandwidth: expected a number > 0, got {bandwidth!r}")
            bandwidth = Constant(torch.tensor(h, dtype=torch.float64), positive=True)
        elif isinstance(bandwidth, Tensor) and (
                not bool(torch.isfinite(bandwidth).all()) or not bool((bandwidth > 0).all())):
            raise ValueError("KernelAttention.bandwidth: expected finite values > 0")
        self.bandwidth = as_control(bandwidth, "KernelAttention.bandwidth")
        self.qk_norm = bool(qk_norm)

    def check(self, grid: Grid) -> None:
        for name in ("WQ", "WK", "WV", "bandwidth"):
            getattr(self, name).validate(grid, f"KernelAttention.{name}")

    def qkv(self, t, u: Tensor, grid: Grid):
        """The transforms (3)–(5), with ``qk_norm`` the projection of Q and K onto S_1(0,1)."""
        q = grid.kernel_y(u, self.WQ(t, grid))
        k = grid.kernel_y(u, self.WK(t, grid))
        v = grid.kernel_y(u, self.WV(t, grid))
        if self.qk_norm:
            q = project_s1(q, 0.0, 1.0, grid)
            k = project_s1(k, 0.0, 1.0, grid)
        return q, k, v

    def softmax_scale(self, t=0.0, grid: Grid | None = None) -> float:
        r"""The softmax score scale :math:`1/h^2` this operator equals (Gaussian kernel,
        ``qk_norm=True``; paper 001, eq. 8)."""
        return float(1.0 / self.bandwidth(t, grid) ** 2)

    def field(self, t, u: Tensor, grid: Grid) -> Tensor:
        q, k, v = self.qkv(t, u, grid)
        # the L2(Omega_y) distance: fold sqrt(w_y) into the coordinates
        wy = grid.y.uniform_weight
        if wy is None:
            sw = grid.y.weights(u.dtype, u.device).sqrt()
            q, k = q * sw, k * sw
        elif wy != 1.0:
            q, k = q * math.sqrt(wy), k * math.sqrt(wy)
        logw = None if grid.x.uniform_weight is not None else grid.x.weights(u.dtype, u.device).log()
        h = self.bandwidth(t, grid)
        if h.numel() != 1:
            raise ValueError(f"KernelAttention.bandwidth: expected a scalar, got shape {tuple(h.shape)}")
        # the state was validated where it entered the model (finite, on the grid) and the
        # controls by check(): the evaluation itself has no data-dependent branches, so a
        # parallel scheme may batch several of these terms under torch.func.vmap
        # (torch's fused CPU kernel, which the Gaussian float32 path calls, returns zeros for NaN
        # scores: a NaN/inf of q or k, a weight written through .data, is carried to the output)
        return evaluate(q, k, v, self.kernel, h.reshape(()).to(u.dtype), logw) + nan_carrier(q, k)

    def extra_repr(self) -> str:
        return f"kernel={self.kernel!r}, qk_norm={self.qk_norm}"
