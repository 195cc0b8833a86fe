r"""The pre-norm form of a term: :math:`A(t; u) = F(t; N(u))`, a term that reads the
normalised state (``norm_first=True`` in ``torch.nn.TransformerEncoderLayer``; ViT).

Post-norm (the original transformer, and paper 002's scheme 13–17) advances
:math:`u \leftarrow N(u + \Delta t\, F(u))`: the normalisation is a substep of its own (a
projection, eqs. 14 and 17).  Pre-norm advances :math:`u \leftarrow u + \Delta t\, F(N(u))`:
the normalisation is *inside* the vector field and the state itself is never projected
(it leaves :math:`S_1`; only what the term reads lies on it).  As a continuous model,
pre-norm is :math:`u_t = F(N(u))`, whose explicit-Euler step with :math:`\Delta t = 1`
is ``x + F(LN(x))``.

``N`` must be a :math:`\Delta t`-independent map: a projection
(:class:`~opsplit.operators.ProjectionS1`, :class:`~opsplit.operators.ProjectionS2`) or a
map substep (:class:`~opsplit.operators.PointwiseAffine` — with its projection this is
``nn.LayerNorm`` — or :class:`~opsplit.operators.Activation`).
"""

from __future__ import annotations

from torch import Tensor, nn

from ..grid import Grid
from .base import Operator, field_operator
from .layernorm import ProjectionS1
from .relu import ProjectionS2

__all__ = ["PreNorm"]


def _is_map(op) -> bool:
    return isinstance(op, (ProjectionS1, ProjectionS2)) or bool(getattr(op, "is_map", False))


class PreNorm(Operator):
    """:math:`A(t; u) = F(t; N(u))` for an explicit term ``inner`` = :math:`F` and a map ``norm``
    = :math:`N`.

    Args:
        inner: an operator with a ``field`` (attention, feed-forward, ...).
        norm: a Δt-independent map (projection or map substep, see the module docstring), or
            a sequence of them applied in order (e.g. ``[ProjectionS1, PointwiseAffine]``).
    """

    has_field = True
    default_solver = "explicit"

    def __init__(self, inner: Operator, norm: Operator):
        super().__init__()
        field_operator(inner, "PreNorm.inner")
        maps = list(norm) if isinstance(norm, (list, tuple)) else [norm]
        if not maps:
            raise ValueError("PreNorm.norm: expected at least one map")
        for n in maps:
            if not isinstance(n, Operator) or not _is_map(n):
                raise TypeError(
                    "PreNorm.norm: expected a Δt-independent map (ProjectionS1, ProjectionS2, "
                    f"PointwiseAffine, Activation), got {type(n).__name__}"
                )
        self.inner = inner
        self.norm = maps[0] if len(maps) == 1 else nn.ModuleList(maps)

    @property
    def maps(self) -> list:
        return list(self.norm) if isinstance(self.norm, nn.ModuleList) else [self.norm]

    def check(self, grid: Grid) -> None:
        self.inner.check(grid)
        for n in self.maps:
            n.check(grid)

    def normalize(self, t, u: Tensor, grid: Grid) -> Tensor:
        """:math:`N(u)` (the maps are independent of Δt; they are called with Δt = 1)."""
        for n in self.maps:
            u = n.flow(t, 1.0, u, grid) if n.has_flow else n.resolvent(t, 1.0, u, grid)
        return u

    def field(self, t, u: Tensor, grid: Grid) -> Tensor:
        return self.inner.field(t, self.normalize(t, u, grid), grid)
