r"""Controls piecewise-linear in time: values at nodes, linear in between.

With nodes :math:`t_i = t_0 + i\,(t_1 - t_0)/(n - 1)`, :math:`i = 0, \dots, n - 1`,

.. math::  \theta(t) = (1 - \lambda)\, \theta_i + \lambda\, \theta_{i+1},\qquad
           t = t_i + \lambda (t_{i+1} - t_i),\ \lambda \in [0, 1].

The control is continuous in :math:`t` (Lipschitz, with kinks at the nodes).  A model
trained with :math:`N_t` steps on a grid aligned with the nodes (``n = N_t + 1``) can be
solved with :math:`2N_t, 4N_t, \dots` steps: every step then lies between two nodes,
where the control is smooth, and a scheme of order :math:`p` converges at order
:math:`p` (the kinks only cost order when a step straddles one).
"""

from __future__ import annotations

import math

from torch import Tensor

from .base import _time_of
from .table import TimeTable

__all__ = ["PiecewiseLinear"]

_BREAK_TOL = 1e-9


class PiecewiseLinear(TimeTable):
    r"""A control given by its values at equispaced time nodes, linear in between.

    Args:
        values: tensor of shape ``(n_nodes, *shape)``; becomes a ``Parameter``.
        t0, t1: first and last node; ``t1`` defaults to ``t0 + n_nodes - 1``
            (:math:`\Delta t = 1` between nodes, the paper's time step).
        axes: spatial domain of each trailing dimension (see :class:`Control`).
        positive: interpolate :math:`\log\theta` (geometric interpolation), so the control
            stays :math:`> 0` under any training update (for :math:`\sigma_2`); the given
            values must be ``> 0``.
        requires_grad: whether the values are trained.
    """

    _row = "node"

    @staticmethod
    def _default_span(n_rows: int) -> float:
        return float(max(n_rows - 1, 1))

    @property
    def n_nodes(self) -> int:
        return int(self.raw.shape[0])

    def breakpoints(self) -> list[float]:
        """The node times :math:`t_0, \\dots, t_{n-1}` (where the control has kinks)."""
        n = max(self.n_nodes - 1, 1)
        return [self.t0 + (self.t1 - self.t0) * i / n for i in range(n + 1)]

    def forward(self, t, grid=None) -> Tensor:
        t = _time_of(t)
        n = self.n_nodes - 1
        if n == 0:
            return self._out(self.raw[0])
        s = (t - self.t0) / (self.t1 - self.t0) * n
        if s < -_BREAK_TOL * max(1.0, n) or s > n * (1 + _BREAK_TOL):
            raise ValueError(
                f"control evaluated at t = {t:g}, outside its time interval "
                f"[{self.t0:g}, {self.t1:g}]"
            )
        s = min(max(s, 0.0), float(n))
        i = min(int(math.floor(s)), n - 1)
        lam = s - i
        return self._out(self.raw[i] if lam == 0.0 else (1.0 - lam) * self.raw[i] + lam * self.raw[i + 1])
