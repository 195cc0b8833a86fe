r"""ReLU as the projection onto :math:`S_2 = \{u \ge 0\}`: the term
:math:`\partial I_{S_2}(u)` of paper 002, eq. (7).

The resolvent of :math:`\partial I_{S_2}` is the :math:`L^2` projection onto the closed
convex cone :math:`S_2`, which acts pointwise (eq. 24):

.. math::  P_{S_2}(\bar u) = \operatorname*{argmin}_{v \ge 0} \|v - \bar u\|^2
           = \max\{\bar u, 0\} = \mathrm{ReLU}(\bar u).

Because the projection is pointwise it is the same in every weighted :math:`L^2` norm, so
it does not depend on the grid's quadrature.
"""

from __future__ import annotations

from torch import Tensor

from ..grid import Grid
from .base import Operator

__all__ = ["ProjectionS2"]


class ProjectionS2(Operator):
    """Projection onto :math:`S_2 = \\{u \\ge 0\\}` = ReLU (paper 002, eq. 24)."""

    has_resolvent = True
    default_solver = "implicit"
    #: a kink where an entry crosses 0 (``opsplit.adaptive`` refuses it)
    smooth = False

    def resolvent(self, t, dt: float, u: Tensor, grid: Grid) -> Tensor:
        return u.clamp_min(0)
