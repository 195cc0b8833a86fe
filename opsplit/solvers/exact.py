r"""The exact solution map of a substep, for operators that know it (an affine term with
frozen controls, a relaxation map): :math:`u \mapsto \Phi^{A}_{\Delta t}(u)`.

Operators' flows freeze their controls at the substep's start time ``t``.  The flow is
then exact when the controls are constant over the substep (piecewise-constant controls
aligned with the time grid, the paper's case), and the declared order is unbounded (a
large number, so that a scheme's order is set by the scheme and its other substeps).
When the controls vary inside a substep, freezing them at ``t`` is first order in time:
use :class:`~opsplit.solvers.ExactMidpoint` (order 2) or
:class:`~opsplit.solvers.ODESolve` there."""

from __future__ import annotations

from torch import Tensor

from .solver import Solver

__all__ = ["Exact"]


class Exact(Solver):
    """The operator's own exact flow over :math:`[t, t + \\Delta t]`; needs ``flow``."""

    order = 99
    requires = "flow"
    #: runs backwards where the operator's flow does (see ``Operator.reversible``)
    reversible = True

    def step(self, terms, t, dt: float, u: Tensor, grid) -> Tensor:
        return terms[0].flow(t, dt, u, grid)
