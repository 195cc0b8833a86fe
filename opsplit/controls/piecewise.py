r"""Controls piecewise-constant in time: one value set per time interval.

With ``n_pieces = N_t`` pieces on :math:`[t_0, t_1]` this is the paper's discrete
control :math:`\bar\theta = \{\theta^n\}_{n=1}^{N_t}` (§3.1): the step from
:math:`t^{n-1}` to :math:`t^n` uses :math:`\theta^n = \theta(t^{n-1})`.  The pieces are
the half-open intervals :math:`[t^{n-1}, t^n)` (the last one closed), so evaluating at a
step's start time picks that step's piece.  Because the control is a function of
continuous time, the same control can be evaluated by a propagator with a different
number of steps (a step that starts inside piece ``n`` uses piece ``n``).
"""

from __future__ import annotations

import math

from torch import Tensor

from .base import _time_of
from .constant import Constant
from .table import TimeTable
from .timepoints import is_left_limit

__all__ = ["PiecewiseConstant", "Constant"]  # Constant: re-exported from .constant

# tolerance (in units of one piece) for a time that lands on a breakpoint up to round-off
_BREAK_TOL = 1e-9


class PiecewiseConstant(TimeTable):
    r"""A control with one value per time interval.

    Args:
        values: tensor of shape ``(n_pieces, *shape)``; becomes a ``Parameter`` (trainable
            unless ``requires_grad=False``).
        t0, t1: the time interval covered; ``t1`` defaults to ``t0 + n_pieces``
            (:math:`\Delta t = 1`, the paper's choice).
        axes: spatial domain of each trailing dimension (see :class:`Control`).
        positive: store :math:`\log` of the values so they stay :math:`> 0` under any
            training update (used for :math:`\sigma_2`); the given values must be ``> 0``.
        requires_grad: whether the values are trained.
    """

    _row = "piece"

    @property
    def n_pieces(self) -> int:
        return int(self.raw.shape[0])

    def piece(self, t) -> int:
        """Index of the piece that holds time ``t`` (``[t^{n-1}, t^n)``, last one closed).

        A :class:`~opsplit.controls.LeftLimit` time ``t`` reads the left limit: the piece
        ``(t^{n-1}, t^n]`` that ends at ``t`` (the first piece at ``t0``)."""
        left = is_left_limit(t)
        t = _time_of(t)
        h = (self.t1 - self.t0) / self.n_pieces
        s = (t - self.t0) / h
        if s < -_BREAK_TOL * max(1.0, abs(s)) or s > self.n_pieces * (1 + _BREAK_TOL) + _BREAK_TOL:
            raise ValueError(
                f"control evaluated at t = {t:g}, outside its time interval "
                f"[{self.t0:g}, {self.t1:g}]"
            )
        if left:
            k = int(math.ceil(s - _BREAK_TOL * max(1.0, abs(s)))) - 1
        else:
            k = int(math.floor(s + _BREAK_TOL * max(1.0, abs(s))))
        return min(max(k, 0), self.n_pieces - 1)

    def forward(self, t, grid=None) -> Tensor:
        return self._out(self.raw[self.piece(t)])
