r"""The sum of several explicit terms as one term:

.. math::  A(t; u) = \sum_k A_k(t; u),

so that a single-term substep solver (explicit Euler) advances the unsplit sum, and the
solver swaps of :func:`opsplit.control.solved_with` (Euler, Heun, RK4) act on the whole
right-hand side, with no splitting error between its terms.  (Heun and RK4 also take several
terms in one :class:`~opsplit.solvers.Substep`; explicit Euler takes one.)
"""

from __future__ import annotations

from torch import Tensor, nn

from ..grid import Grid
from .base import Operator

__all__ = ["FieldSum"]


class FieldSum(Operator):
    """:math:`\\sum_k A_k(t; u)` of the explicit terms ``terms`` (opsplit operators with a
    ``field``), in their order.

    Args:
        terms: one or more operators with an explicit field.
    """

    has_field = True
    default_solver = "explicit"

    def __init__(self, *terms):
        super().__init__()
        if len(terms) == 1 and isinstance(terms[0], (list, tuple)):
            terms = tuple(terms[0])
        if not terms:
            raise ValueError("FieldSum.terms: expected at least one operator with an explicit field, got none")
        for k, op in enumerate(terms):
            if not isinstance(op, Operator):
                raise TypeError(f"FieldSum.terms[{k}]: expected an opsplit Operator, got {type(op).__name__}")
            if not getattr(op, "has_field", False):
                raise ValueError(f"FieldSum.terms[{k}]: {type(op).__name__} has no explicit field (a projection or "
                                 "a map cannot be summed into a vector field)")
        self.terms = nn.ModuleList(terms)
        self.reversible = all(getattr(op, "reversible", True) for op in terms)
        self.smooth = all(getattr(op, "smooth", True) for op in terms)

    def check(self, grid: Grid) -> None:
        for op in self.terms:
            op.check(grid)

    def field(self, t, u: Tensor, grid: Grid) -> Tensor:
        out = self.terms[0].field(t, u, grid)
        for op in self.terms[1:]:
            out = out + op.field(t, u, grid)
        return out

    def extra_repr(self) -> str:
        return " + ".join(type(op).__name__ for op in self.terms)
