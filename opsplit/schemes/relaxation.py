r"""The relaxation step of paper 002, eq. (16): the skip connection around the FFN.

.. math::  u^{(3+J)/M} = \tfrac12\big(u^{(2+J)/M} + u^{2/M}\big)          \qquad (16, 33)

The FFN substeps (15) map :math:`v = u^{2/M}` to :math:`T(v) = u^{(2+J)/M}`, so (16) is
the averaged (Krasnosel'skii–Mann) map :math:`v \mapsto (1 - \omega) v + \omega T(v)`
with :math:`\omega = 1/2`.  opsplit writes it that way: a :class:`Relaxation` holds the
inner substeps and has this map as its exact "flow", so a scheme needs no memory of
earlier substep states.  It is a step of the scheme (13)–(17), not a term of eq. (7):
it composes substeps (operator, solver), so it lives with the schemes, above the solvers
(an :class:`~opsplit.operators.Operator` subclass, like
:class:`~opsplit.schemes.ScaledOperator`, so that a scheme holds it as one substep).

Consistency for small :math:`\Delta t`: if each inner substep is an explicit step of a
smooth term, :math:`T(v) = v + \Delta t\,F(v) + O(\Delta t^2)`, and the relaxed map is
:math:`v + \omega\Delta t\,F(v) + O(\Delta t^2)`: the relaxation weight scales the rate of
the wrapped terms by :math:`\omega`.
"""

from __future__ import annotations

from torch import Tensor, nn

from .._checks import check_finite_float
from ..grid import Grid
from ..operators.base import Operator
from ..solvers import Substep

__all__ = ["Relaxation"]


class Relaxation(Operator):
    """Averaged map :math:`v \\mapsto (1-\\omega)\\,v + \\omega\\, T(v)` of the inner substeps
    (paper 002, eq. 16 with :math:`\\omega = 1/2`).

    Args:
        steps: the inner substeps (operators or :class:`~opsplit.solvers.Substep`), applied
            in sequence over the same :math:`[t, t + \\Delta t]` to give :math:`T`.
        weight: :math:`\\omega \\in (0, 1]`.
    """

    has_flow = True
    default_solver = "exact"
    #: an averaged map of a step, not a flow: it has no negative-time meaning
    reversible = False

    def __init__(self, steps, weight: float = 0.5):
        super().__init__()
        steps = list(steps)
        if not steps:
            raise ValueError("Relaxation: expected at least one inner substep")
        self.steps = nn.ModuleList(s if isinstance(s, Substep) else Substep(s) for s in steps)
        self.weight = weight

    def __setattr__(self, name, value):
        if name == "weight":  # checked at construction and whenever it is set
            value = check_finite_float(value, "Relaxation.weight")
            if not 0.0 < value <= 1.0:
                raise ValueError(f"Relaxation.weight: expected 0 < weight <= 1, got {value}")
        super().__setattr__(name, value)

    def check(self, grid: Grid) -> None:
        for s in self.steps:
            s.check(grid)

    def flow(self, t, dt: float, u: Tensor, grid: Grid) -> Tensor:
        v = u
        for s in self.steps:
            v = s(t, dt, v, grid)
        w = self.weight
        return (1.0 - w) * u + w * v

    @property
    def order(self) -> int:
        return min(s.order for s in self.steps)

    def extra_repr(self) -> str:
        return f"weight={self.weight:g}"
