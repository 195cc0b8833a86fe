r"""Dropout on a term's output: :math:`A(t; u) \mapsto \mathrm{Dropout}_p(A(t; u))`.

``nn.TransformerEncoderLayer`` applies dropout to the output of each sub-block before the
residual sum (``x + dropout(F(x))``).  In eval mode it is the identity, so it does not
change the continuous model; in training mode it is a random multiplicative mask on the
vector field (a stochastic perturbation of the explicit step, with mean :math:`A`).
"""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor

from .._checks import check_probability
from ..grid import Grid
from .base import Operator, field_operator

__all__ = ["FieldDropout"]


class FieldDropout(Operator):
    """Dropout (probability ``p``, training mode only) on the field of ``inner``."""

    has_field = True
    default_solver = "explicit"

    def __init__(self, inner: Operator, p: float):
        super().__init__()
        field_operator(inner, "FieldDropout.inner")
        p = check_probability(p, "FieldDropout.p")
        self.inner = inner
        self.p = p

    @property
    def reversible(self) -> bool:
        """A random field (training mode, ``p > 0``) has no negative-time meaning."""
        return not (self.training and self.p > 0) and getattr(self.inner, "reversible", True)

    def check(self, grid: Grid) -> None:
        self.inner.check(grid)

    def field(self, t, u: Tensor, grid: Grid) -> Tensor:
        f = self.inner.field(t, u, grid)
        return F.dropout(f, self.p, True) if self.training and self.p > 0 else f

    def extra_repr(self) -> str:
        return f"p={self.p:g}"
