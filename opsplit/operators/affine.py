r"""The pointwise affine substep :math:`u \mapsto \gamma(y) \odot u + \beta(y)`: the
per-feature weight and bias of ``torch.nn.LayerNorm`` after the :math:`S_1` projection.

Paper 002 normalises onto :math:`S_1(\sigma_1, \sigma_2)` with *scalar*
:math:`\sigma_1(t), \sigma_2(t)` (Theorem 3.1): every token gets mean :math:`\sigma_1`
and standard deviation :math:`\sigma_2`.  ``torch.nn.LayerNorm`` has a weight
:math:`\gamma(y)` and a bias :math:`\beta(y)` per feature:

.. math::  \mathrm{LayerNorm}(u) = \gamma \odot P^{\varepsilon}_{S_1(0, 1)}(u) + \beta,

the projection (with torch's :math:`\varepsilon`, see :class:`~opsplit.operators.ProjectionS1`)
followed by this pointwise affine map.  With constant :math:`\gamma = c > 0`,
:math:`\beta = b` the pair is the projection onto :math:`S_1(b, c)` (the paper's case);
with a :math:`\gamma` that varies over :math:`y` it is a change of variables, not a
projection.  Like the projections it is a map substep, independent of :math:`\Delta t`.

``PointwiseAffine(weight, bias, projection=P)`` is the composition
:math:`\gamma \odot P(u) + \beta` in one substep.  On a grid with equal y-weights and
:math:`\varepsilon > 0` it is computed by ``torch.nn.functional.layer_norm`` — the same
formula (Theorem 3.1 with :math:`\varepsilon`, then the affine map; :math:`\sigma_1,
\sigma_2` folded into :math:`\gamma, \beta`), in one fused kernel.  Otherwise (non-uniform
y-weights, or :math:`\varepsilon = 0` where the zero-variance convention of
:func:`~opsplit.operators.project_s1` applies) it calls :func:`project_s1` and then the
affine map.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from ..controls import as_control
from ..grid import Grid
from .base import Operator
from .layernorm import ProjectionS1, _project_s1

__all__ = ["PointwiseAffine"]


def _shape(control):
    return tuple(control.shape) if hasattr(control, "shape") and not callable(control.shape) else None


class PointwiseAffine(Operator):
    """:math:`u \\mapsto \\gamma(y, t) \\odot P(u) + \\beta(y, t)` (``nn.LayerNorm``'s affine
    part; with ``projection`` the whole ``nn.LayerNorm``).

    Args:
        weight: control (or tensor) for :math:`\\gamma`, shape ``(N_y,)``; ``None`` is 1.
        bias: control (or tensor) for :math:`\\beta`, shape ``(N_y,)``; ``None`` is 0.
        projection: an optional :class:`~opsplit.operators.ProjectionS1` applied first.
    """

    has_flow = True
    default_solver = "exact"
    #: a Δt-independent map (applied once per step, like a projection)
    is_map = True

    def __init__(self, weight=None, bias=None, *, projection: ProjectionS1 | None = None):
        super().__init__()
        self.weight = None if weight is None else as_control(weight, "PointwiseAffine.weight", axes=("y",))
        self.bias = None if bias is None else as_control(bias, "PointwiseAffine.bias", axes=("y",))
        if projection is not None and not isinstance(projection, ProjectionS1):
            raise TypeError(
                f"PointwiseAffine.projection: expected a ProjectionS1 (or None), got {type(projection).__name__}"
            )
        self.projection = projection
        for name in ("weight", "bias"):
            c = getattr(self, name)
            s = None if c is None else _shape(c)
            if s is not None and len(s) != 1:
                raise ValueError(f"PointwiseAffine.{name}: expected shape (N_y,), got {s}")

    @property
    def eps(self) -> float | None:
        return None if self.projection is None else self.projection.eps

    def check(self, grid: Grid) -> None:
        if self.weight is not None:
            self.weight.validate(grid, "PointwiseAffine.weight")
        if self.bias is not None:
            self.bias.validate(grid, "PointwiseAffine.bias")
        if self.projection is not None:
            self.projection.check(grid)

    def flow(self, t, dt: float, u: Tensor, grid: Grid) -> Tensor:
        w = None if self.weight is None else self.weight(t, grid)
        b = None if self.bias is None else self.bias(t, grid)
        P = self.projection
        if P is not None:
            s1, s2 = P.sigma1(t, grid), P.sigma2(t, grid)
            if P.eps > 0 and grid.y.uniform_weight is not None:
                # gamma * (s2 * n + s1) + beta = (gamma s2) * n + (gamma s1 + beta); exact for
                # the defaults s1 = 0, s2 = 1 (multiplying by 1 and adding 0 round nothing)
                n = u.shape[-1]
                s1, s2 = s1.to(u.dtype), s2.to(u.dtype)
                gw = s2.expand(n) if w is None else w * s2
                gb = s1.expand(n) if w is None else w * s1
                if b is not None:
                    gb = gb + b
                return F.layer_norm(u, (n,), gw, gb, P.eps)
            u = _project_s1(u, s1, s2, grid, P.eps)
        if w is not None:
            return torch.addcmul(b, u, w) if b is not None else u * w
        return u if b is None else u + b

    def extra_repr(self) -> str:
        s = f"weight={self.weight is not None}, bias={self.bias is not None}"
        if self.projection is not None:
            s += f", projection=S1(eps={self.projection.eps:g})"
        return s

