r"""The shared part of the softmax-free attention integrals of Cao (NeurIPS 2021): multi-head
:math:`Q, K, V` (the integral transforms of paper 002, eq. 38), two of them layer-normalised
per head, and the :math:`\Omega_x` integral

.. math::  A(u)(x, h, \cdot) = s \int_{\Omega_x}
           \big\langle Q'(x, h, \cdot),\, K'(\tilde x, h, \cdot)\big\rangle\,
           V'(\tilde x, h, \cdot)\, d\tilde x

computed as :math:`s\, Q' \big(\textstyle\sum_j w_j K'_j{}^{\!\top} V'_j\big)`: the
:math:`d \times d` matrix :math:`\int K'^\top V'` first, so the cost is :math:`O(N_x d^2)`
whichever pair is normalised (without a softmax the product is associative).  The primes
mark the normalised inputs: :class:`~opsplit.operators.GalerkinAttention` normalises
:math:`K, V`, :class:`~opsplit.operators.FourierAttention` :math:`Q, K`.

**Normalisation** of a head's vector :math:`z \in \mathbb R^{d}`: the projection onto
:math:`S_1(0, 1)` of paper 002, Theorem 3.1, with ``eps`` (torch's ``layer_norm``, eps
``1e-5`` as ``nn.LayerNorm``), followed by a per-head pointwise affine map
:math:`\gamma_h \odot z + \beta_h` (``nn.LayerNorm(d)`` per head: Cao's implementation).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from .._checks import check_positive_float
from ..controls import PiecewiseConstant, as_control
from ..grid import Grid
from ._heads import control_shape
from .multihead import MultiHeadAttention

__all__ = ["NormedAttention"]


class NormedAttention(MultiHeadAttention):
    """Base class: subclasses set :attr:`normalised` (two of ``"q"``, ``"k"``, ``"v"``)."""

    #: which of the queries, keys and values are layer-normalised per head
    normalised: tuple[str, str] = ("k", "v")

    def __init__(self, WQ, WK, WV, WO=None, *, bQ=None, bK=None, bV=None, bO=None, norm_weights=None,
                 norm_biases=None, eps: float = 1e-5, scale: float = 1.0):
        name = type(self).__name__
        super().__init__(WQ, WK, WV, WO, bQ=bQ, bK=bK, bV=bV, bO=bO, scale=scale, qk_inner="sum")
        self.eps = check_positive_float(eps, f"{name}.eps")
        for what, given in (("norm_weights", norm_weights), ("norm_biases", norm_biases)):
            if given is not None and (not isinstance(given, (tuple, list)) or len(given) != 2):
                raise TypeError(f"{name}.{what}: expected a pair of controls (one per normalised input "
                                f"{self.normalised}) or None, got {type(given).__name__}")
        nw = norm_weights or (None, None)
        nb = norm_biases or (None, None)
        for i, which in enumerate(self.normalised):
            g = None if nw[i] is None else as_control(nw[i], f"{name}.norm_weights[{i}]")
            b = None if nb[i] is None else as_control(nb[i], f"{name}.norm_biases[{i}]")
            setattr(self, f"gamma_{which}", g)
            setattr(self, f"beta_{which}", b)
        heads = {"q": control_shape(self.WQ), "k": control_shape(self.WK), "v": control_shape(self.WV)}
        for which in self.normalised:
            s = heads[which]
            for c, what in ((getattr(self, f"gamma_{which}"), "gamma"), (getattr(self, f"beta_{which}"), "beta")):
                cs = None if c is None else control_shape(c)
                if s is not None and cs is not None and cs != tuple(s[1:]):
                    raise ValueError(f"{name}.{what}_{which}: expected shape (H, d) = {tuple(s[1:])} (one affine "
                                     f"map per head), got {cs}")

    @classmethod
    def create(cls, n_y: int, n_heads: int, *, head_dim: int | None = None, n_pieces: int = 1, t0: float = 0.0,
               t1: float | None = None, bias: bool = True, out_proj: bool = True, device=None, dtype=None,
               **kwargs):
        """Trainable heads, one weight set per time piece (``n_pieces`` = :math:`N_t`), the
        per-head affine maps of the normalisation set to :math:`\\gamma = 1, \\beta = 0`;
        ``scale`` defaults to 1 (Cao's formulas)."""
        kwargs.setdefault("scale", 1.0)
        if head_dim is None:
            if n_y % n_heads:
                raise ValueError(f"{cls.__name__}.create: n_y = {n_y} is not divisible by n_heads = {n_heads}; "
                                 "pass head_dim")
            head_dim = n_y // n_heads
        fk = {"device": device, "dtype": dtype or torch.get_default_dtype()}

        def pc(fill, *shape):
            return PiecewiseConstant(torch.full((n_pieces, *shape), fill, **fk), t0=t0, t1=t1)

        kwargs.setdefault("norm_weights", (pc(1.0, n_heads, head_dim), pc(1.0, n_heads, head_dim)))
        kwargs.setdefault("norm_biases", (pc(0.0, n_heads, head_dim), pc(0.0, n_heads, head_dim)))
        op = cls(pc(0.0, n_y, n_heads, head_dim), pc(0.0, n_y, n_heads, head_dim), pc(0.0, n_y, n_heads, head_dim),
                 pc(0.0, n_heads, head_dim, n_y) if out_proj else None,
                 bQ=pc(0.0, n_heads, head_dim) if bias else None, bK=pc(0.0, n_heads, head_dim) if bias else None,
                 bV=pc(0.0, n_heads, head_dim) if bias else None, bO=pc(0.0, n_y) if bias and out_proj else None,
                 **kwargs)
        op.reset_parameters()
        return op

    def check(self, grid: Grid) -> None:
        super().check(grid)
        for which in self.normalised:
            for what in ("gamma", "beta"):
                c = getattr(self, f"{what}_{which}")
                if c is not None:
                    c.validate(grid, f"{type(self).__name__}.{what}_{which}")

    def normalise(self, t, z: Tensor, which: str, grid: Grid) -> Tensor:
        """The per-head layer normalisation of ``z`` ``(B, H, N, d)`` (``which``: ``"q"``,
        ``"k"`` or ``"v"``)."""
        z = F.layer_norm(z, (z.shape[-1],), eps=self.eps)
        g, b = getattr(self, f"gamma_{which}"), getattr(self, f"beta_{which}")
        if g is not None:
            z = z * g(t, grid).unsqueeze(-2)
        if b is not None:
            z = z + b(t, grid).unsqueeze(-2)
        return z

    def attend(self, q: Tensor, k: Tensor, v: Tensor, grid: Grid) -> Tensor:
        r""":math:`s\,Q'\,\big(\sum_j w_j K'^\top_j V'_j\big)` per head, ``(B, H, N_x, d_v)``,
        on already normalised inputs."""
        wx = grid.x.uniform_weight
        if wx is None:
            v = v * grid.x.weights(v.dtype, v.device).view(1, 1, -1, 1)
            s = self.scale
        else:
            s = self.scale * wx
        kv = k.transpose(-1, -2) @ v  # (B, H, d_k, d_v): the integral over Omega_x
        return (q @ kv) * s if s != 1.0 else q @ kv

    def field(self, t, u: Tensor, grid: Grid) -> Tensor:
        q, k, v = self.heads(t, u, grid)
        parts = {"q": q, "k": k, "v": v}
        for which in self.normalised:
            parts[which] = self.normalise(t, parts[which], which, grid)
        return self.combine_heads(t, self.attend(parts["q"], parts["k"], parts["v"], grid), grid)

    def attention_weights(self, u: Tensor, t: float = 0.0, grid: Grid | None = None) -> Tensor:
        r"""The discrete attention kernel :math:`s\,\langle Q'(x_i), K'(x_j)\rangle\, w_j`,
        shape ``(B, H, N_x, N_x)`` (no softmax: rows do not sum to 1)."""
        g = self.resolve_grid(u, grid)
        q, k, _ = self.heads(t, u, g)
        if "q" in self.normalised:
            q = self.normalise(t, q, "q", g)
        if "k" in self.normalised:
            k = self.normalise(t, k, "k", g)
        w = g.x.weights(q.dtype, q.device)
        return self.scale * (q @ k.transpose(-1, -2)) * w

    def extra_repr(self) -> str:
        parts = [f"scale={self.scale:.6g}" if not math.isclose(self.scale, 1.0) else "scale=1",
                 f"heads={self.n_heads}", f"normalised={''.join(self.normalised).upper()}", f"eps={self.eps:g}"]
        if self.WO is None:
            parts.append("WO=I")
        return ", ".join(parts)
