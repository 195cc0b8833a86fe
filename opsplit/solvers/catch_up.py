r"""Moreau's catching-up step: the projection onto the constraint set at the substep's end.

For an indicator term :math:`u_t \in -\partial I_{S(t)}(u)` whose set moves with its
controls (:math:`S_1(\sigma_1(t), \sigma_2(t))`), the solution is the *sweeping process*
(Moreau): a point on :math:`S(t)` is carried along the normal directions so that it stays
on :math:`S(t)`.  The catching-up algorithm
:math:`u^{n+1} = P_{S(t^{n+1})}(u^n)` is backward Euler with the operator at the end of
the step, :math:`(I + \Delta t\,\partial I_{S(t + \Delta t)})^{-1}`.

For :math:`S_1`, a point :math:`u \in S_1(\sigma_1(a), \sigma_2(a))` has normal space
:math:`\mathrm{span}\{1, u - \sigma_1\}` and the sweeping flow is the affine map
:math:`u \mapsto \sigma_2(b)/\sigma_2(a)\,(u - \sigma_1(a)) + \sigma_1(b)`, which is exactly
:math:`P_{S_1(\sigma(b))}(u)` (Theorem 3.1).  So the step is the **exact** flow of the
term for points on the set: declared order unbounded, like
:class:`~opsplit.solvers.Exact`.  For a fixed set (:math:`S_2`, or :math:`\sigma`
constant) it is the projection, as :class:`~opsplit.solvers.Implicit`; it differs from
``Implicit`` (controls at the start :math:`t`, the paper's :math:`\sigma^n`) only when the
controls vary inside the step, where it reads them as the left limit
:math:`(t + \Delta t)^-` (so it agrees with ``Implicit`` for piecewise-constant controls
on the time grid).
"""

from __future__ import annotations

from torch import Tensor

from ..operators import ProjectionS1, ProjectionS2
from ._fields import end_time
from .solver import Solver

__all__ = ["CatchUp", "is_projection"]


def is_projection(term) -> bool:
    """Whether ``term`` is an indicator term whose resolvent is a projection."""
    if getattr(term, "is_projection", False):
        return True
    return isinstance(term, (ProjectionS1, ProjectionS2))


class CatchUp(Solver):
    """Projection onto the set at the substep's end (Moreau's catching-up step).
    Exact for the sweeping process of a projection term; needs ``resolvent``."""

    order = 99
    requires = "resolvent"

    def check(self, terms) -> None:
        super().check(terms)
        if not is_projection(terms[0]):
            raise ValueError(
                f"CatchUp advances indicator terms (projections such as ProjectionS1, "
                f"ProjectionS2), got {type(terms[0]).__name__}; use Implicit for a general "
                "resolvent"
            )

    def step(self, terms, t, dt: float, u: Tensor, grid) -> Tensor:
        return terms[0].resolvent(end_time(t, dt), dt, u, grid)
