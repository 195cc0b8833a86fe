r"""Stochastic depth (drop path) and dropout on the state: training-mode maps of CvT.

Drop path (stochastic depth) multiplies a whole sample by a Bernoulli variable
:math:`\zeta_b \in \{0, 1/(1 - p)\}` (one per sample :math:`b`, mean 1):

* on a term's vector field, :class:`FieldDropPath`: the explicit step
  :math:`u + \Delta t\,\zeta_b A(t; u)` drops the whole substep for that sample (with mean
  :math:`A`): CvT's (and timm's) drop path on a residual branch;
* on the state, :class:`DropPath`: :math:`u \mapsto \zeta_b u`, a map substep.  Hugging
  Face's ``CvtLayer`` applies its drop path to the *sum* ``x + mlp(x)`` after the second
  residual connection, i.e. to the state; opsplit reproduces that placement with this map.

:class:`StateDropout` is ``nn.Dropout`` on the state (CvT's dropout after the
convolutional token embedding).  All three are the identity in eval mode, so they do not
change the continuous model; in training mode they draw their random numbers exactly as
``transformers``' ``CvtDropPath`` and ``nn.Dropout`` do (same shapes, same order), so a
converted model reproduces a training step for the same seed.

A rate may depend on time: a sequence of rates, one per time piece of ``[t0, t1]`` (one
per layer).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from ..grid import Grid
from .base import Operator, field_operator

__all__ = ["DropPath", "FieldDropPath", "StateDropout", "drop_path"]


def drop_path(x: Tensor, p: float) -> Tensor:
    """``x / (1 - p)`` or ``0``, one draw per sample (``CvtDropPath``'s formula)."""
    keep = 1.0 - p
    shape = (x.shape[0],) + (1,) * (x.dim() - 1)
    r = torch.floor(torch.rand(shape, dtype=x.dtype, device=x.device) + keep)
    return x.div(keep) * r


def _check_rate(p, name: str) -> float:
    p = float(p)
    if not 0.0 <= p < 1.0:
        raise ValueError(f"{name}: expected a rate 0 <= p < 1, got {p}")
    return p


class _Rates:
    """Rates piecewise constant in time (a number, or one per piece of ``[t0, t1]``)."""

    def _init_rates(self, p, t0: float, t1: float | None, name: str) -> None:
        rates = tuple(p) if isinstance(p, (tuple, list)) else (p,)
        if not rates:
            raise ValueError(f"{name}: expected a rate or a non-empty sequence of rates")
        self.rates = tuple(_check_rate(r, name) for r in rates)
        self.t0 = float(t0)
        self.t1 = self.t0 + len(self.rates) if t1 is None else float(t1)
        if not self.t1 > self.t0:
            raise ValueError(f"{name}: expected t0 < t1, got t0={t0}, t1={t1}")

    def rate(self, t) -> float:
        n = len(self.rates)
        if n == 1:
            return self.rates[0]
        s = (float(t) - self.t0) / ((self.t1 - self.t0) / n)
        k = int(math.floor(s + 1e-9 * max(1.0, abs(s))))
        return self.rates[min(max(k, 0), n - 1)]

    def _dropped(self, t, x: Tensor) -> Tensor:
        """``x`` with drop path at the rate of time ``t`` in training mode, else ``x``."""
        if self.training:
            p = self.rate(t)
            if p > 0:
                return drop_path(x, p)
        return x

    def extra_repr(self) -> str:
        return f"p={self.rates[0]:g}" if len(self.rates) == 1 else f"p={list(self.rates)}"


class FieldDropPath(_Rates, Operator):
    """Drop path on the field of ``inner`` (training mode only): :math:`\\zeta_b A(t; u)`.

    Args:
        inner: an operator with a field.
        p: the rate, or one rate per time piece of ``[t0, t1]``.
    """

    has_field = True
    default_solver = "explicit"

    def __init__(self, inner: Operator, p, *, t0: float = 0.0, t1: float | None = None):
        super().__init__()
        field_operator(inner, "FieldDropPath.inner")
        self.inner = inner
        self._init_rates(p, t0, t1, "FieldDropPath.p")

    @property
    def reversible(self) -> bool:
        """A random field (training mode, a rate > 0) has no negative-time meaning."""
        return not (self.training and any(r > 0 for r in self.rates)) and getattr(self.inner, "reversible", True)

    def check(self, grid: Grid) -> None:
        self.inner.check(grid)

    def field(self, t, u: Tensor, grid: Grid) -> Tensor:
        return self._dropped(t, self.inner.field(t, u, grid))


class DropPath(_Rates, Operator):
    """Drop path on the state (training mode only): :math:`u \\mapsto \\zeta_b u`, a map."""

    has_flow = True
    default_solver = "exact"
    is_map = True

    def __init__(self, p, *, t0: float = 0.0, t1: float | None = None):
        super().__init__()
        self._init_rates(p, t0, t1, "DropPath.p")

    def flow(self, t, dt: float, u: Tensor, grid: Grid) -> Tensor:
        return self._dropped(t, u)


class StateDropout(Operator):
    """``nn.Dropout(p)`` on the state (training mode only), a map."""

    has_flow = True
    default_solver = "exact"
    is_map = True

    def __init__(self, p: float):
        super().__init__()
        self.p = _check_rate(p, "StateDropout.p")

    def flow(self, t, dt: float, u: Tensor, grid: Grid) -> Tensor:
        return F.dropout(u, self.p, True) if self.training and self.p > 0 else u

    def extra_repr(self) -> str:
        return f"p={self.p:g}"
