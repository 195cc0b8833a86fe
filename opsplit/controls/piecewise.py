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

import torch
from torch import Tensor, nn

from .base import Control, _check_values, _time_of
from .timepoints import is_left_limit

__all__ = ["PiecewiseConstant", "Constant"]

# tolerance (in units of one piece) for a time that lands on a breakpoint up to round-off
_BREAK_TOL = 1e-9


class PiecewiseConstant(Control):
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
        values = _check_values(values, "PiecewiseConstant.values")
        if values.dim() < 1 or values.shape[0] < 1:
            raise ValueError(
                "PiecewiseConstant.values: expected shape (n_pieces, *shape) with n_pieces >= 1, "
                f"got {tuple(values.shape)}"
            )
        if len(self.axes) > values.dim() - 1:
            raise ValueError(
                f"PiecewiseConstant: {len(self.axes)} axes {self.axes} but values of shape "
                f"{tuple(values.shape[1:])} per piece"
            )
        self.n_pieces = int(values.shape[0])
        self.t0 = float(t0)
        self.t1 = float(t0 + self.n_pieces) if t1 is None else float(t1)
        if not (math.isfinite(self.t0) and math.isfinite(self.t1)) or self.t1 <= self.t0:
            raise ValueError(f"PiecewiseConstant: expected t0 < t1, got t0={t0}, t1={t1}")
        self.positive = bool(positive)
        if self.positive:
            if not bool((values > 0).all()):
                raise ValueError(
                    "PiecewiseConstant(positive=True): expected values > 0 "
                    f"(e.g. sigma_2 > 0), got min {float(values.min()):g}"
                )
            values = values.log()
        self.raw = nn.Parameter(values.detach().clone(), requires_grad=requires_grad)

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.raw.shape[1:])

    @property
    def values(self) -> Tensor:
        """All pieces, shape ``(n_pieces, *shape)``."""
        return self.raw.exp() if self.positive else self.raw

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
        v = self.raw[self.piece(t)]
        return v.exp() if self.positive else v

    def validate(self, grid, name: str = "control") -> None:
        self.check_grid(self.shape, grid, name)

    @torch.no_grad()
    def fill_(self, values: Tensor) -> PiecewiseConstant:
        """Overwrite all pieces (``values`` of shape ``(n_pieces, *shape)`` or ``shape``)."""
        values = torch.as_tensor(values, dtype=self.raw.dtype, device=self.raw.device)
        if self.positive:
            if not bool((values > 0).all()):
                raise ValueError("fill_: a positive control needs values > 0")
            values = values.log()
        self.raw.copy_(values.expand_as(self.raw))
        return self

    def extra_repr(self) -> str:
        s = f"n_pieces={self.n_pieces}, shape={self.shape}, t=[{self.t0:g}, {self.t1:g}]"
        if self.axes:
            s += f", axes={self.axes}"
        if self.positive:
            s += ", positive=True"
        return s


class Constant(Control):
    """A time-independent control, holding the given tensor as it is.

    An ``nn.Parameter`` is registered as a parameter (trained with the module); any other
    tensor as a buffer, used without a copy, so autograd reaches it when it requires grad.
    For a trainable positive control use ``PiecewiseConstant(..., positive=True)``.
    """

    def __init__(self, value: Tensor, *, axes=(), positive: bool = False):
        super().__init__(axes)
        value = _check_values(value, "Constant.value")
        if len(self.axes) > value.dim():
            raise ValueError(
                f"Constant: {len(self.axes)} axes {self.axes} for a value of shape {tuple(value.shape)}"
            )
        if positive and not bool((value > 0).all()):
            raise ValueError(f"Constant(positive=True): expected values > 0, got min {float(value.min()):g}")
        if isinstance(value, nn.Parameter):
            self.value = value
        else:
            self.register_buffer("value", value, persistent=True)

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.value.shape)

    def forward(self, t=None, grid=None) -> Tensor:
        return self.value

    def validate(self, grid, name: str = "control") -> None:
        self.check_grid(self.shape, grid, name)

    def extra_repr(self) -> str:
        s = f"shape={self.shape}"
        if self.axes:
            s += f", axes={self.axes}"
        return s
