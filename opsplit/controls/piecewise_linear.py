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

import torch
from torch import Tensor, nn

from .base import Control, _check_values, _time_of

__all__ = ["PiecewiseLinear"]

_BREAK_TOL = 1e-9


class PiecewiseLinear(Control):
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

    def __init__(
        self,
        values: Tensor,
        *,
        t0: float = 0.0,
        t1: float | None = None,
        axes=(),
        positive: bool = False,
        requires_grad: bool = True,
    ):
        super().__init__(axes)
        values = _check_values(values, "PiecewiseLinear.values")
        if values.dim() < 1 or values.shape[0] < 1:
            raise ValueError(
                "PiecewiseLinear.values: expected shape (n_nodes, *shape) with n_nodes >= 1, "
                f"got {tuple(values.shape)}"
            )
        if len(self.axes) > values.dim() - 1:
            raise ValueError(
                f"PiecewiseLinear: {len(self.axes)} axes {self.axes} but values of shape "
                f"{tuple(values.shape[1:])} per node"
            )
        self.n_nodes = int(values.shape[0])
        self.t0 = float(t0)
        self.t1 = float(t0 + max(self.n_nodes - 1, 1)) if t1 is None else float(t1)
        if not (math.isfinite(self.t0) and math.isfinite(self.t1)) or self.t1 <= self.t0:
            raise ValueError(f"PiecewiseLinear: expected t0 < t1, got t0={t0}, t1={t1}")
        self.positive = bool(positive)
        if self.positive:
            if not bool((values > 0).all()):
                raise ValueError(
                    "PiecewiseLinear(positive=True): expected values > 0, "
                    f"got min {float(values.min()):g}"
                )
            values = values.log()
        self.raw = nn.Parameter(values.detach().clone(), requires_grad=requires_grad)

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.raw.shape[1:])

    @property
    def values(self) -> Tensor:
        """The node values, shape ``(n_nodes, *shape)``."""
        return self.raw.exp() if self.positive else self.raw

    def breakpoints(self) -> list[float]:
        """The node times :math:`t_0, \\dots, t_{n-1}` (where the control has kinks)."""
        n = max(self.n_nodes - 1, 1)
        return [self.t0 + (self.t1 - self.t0) * i / n for i in range(n + 1)]

    def forward(self, t, grid=None) -> Tensor:
        t = _time_of(t)
        n = self.n_nodes - 1
        if n == 0:
            v = self.raw[0]
            return v.exp() if self.positive else v
        s = (t - self.t0) / (self.t1 - self.t0) * n
        if s < -_BREAK_TOL * max(1.0, n) or s > n * (1 + _BREAK_TOL):
            raise ValueError(
                f"control evaluated at t = {t:g}, outside its time interval "
                f"[{self.t0:g}, {self.t1:g}]"
            )
        s = min(max(s, 0.0), float(n))
        i = min(int(math.floor(s)), n - 1)
        lam = s - i
        v = self.raw[i] if lam == 0.0 else (1.0 - lam) * self.raw[i] + lam * self.raw[i + 1]
        return v.exp() if self.positive else v

    def validate(self, grid, name: str = "control") -> None:
        self.check_grid(self.shape, grid, name)

    @torch.no_grad()
    def fill_(self, values: Tensor) -> PiecewiseLinear:
        """Overwrite all nodes (``values`` of shape ``(n_nodes, *shape)`` or ``shape``)."""
        values = torch.as_tensor(values, dtype=self.raw.dtype, device=self.raw.device)
        if self.positive:
            if not bool((values > 0).all()):
                raise ValueError("fill_: a positive control needs values > 0")
            values = values.log()
        self.raw.copy_(values.expand_as(self.raw))
        return self

    def extra_repr(self) -> str:
        s = f"n_nodes={self.n_nodes}, shape={self.shape}, t=[{self.t0:g}, {self.t1:g}]"
        if self.axes:
            s += f", axes={self.axes}"
        if self.positive:
            s += ", positive=True"
        return s
