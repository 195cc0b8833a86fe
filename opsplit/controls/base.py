r"""The control interface: :math:`\theta(t)` of paper 002, eq. (8).

A control answers *with what* an operator moves :math:`u`: the kernels
:math:`W^Q, W^K, W^V, W_j` (functions of :math:`(\tilde y, y, t)`), the biases
:math:`b_j` (functions of :math:`(x, t)` or :math:`(y, t)`) and the scalars
:math:`\sigma_1(t), \sigma_2(t)`.  A control is an ``nn.Module`` whose ``forward(t, grid)``
returns the control's values at time ``t`` on ``grid``.

``axes`` names, for each trailing dimension of the value, the spatial domain it lives on
(``"x"``, ``"y"`` or ``"h"``); a value on a grid must have one entry per node of that
domain.  Scalars and plain matrices have no axes.

This module is the bottom of :mod:`opsplit.controls` (every control imports it; it imports
none of them): a tensor wrapped as a control, :func:`~opsplit.controls.as_control`, is in
:mod:`opsplit.controls.constant` with the constant control it builds.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from .._checks import check_finite_float, skip_value_checks

__all__ = ["Control"]

_AXES = ("x", "y", "h")


class Control(nn.Module):
    """Base class of time-dependent controls.

    Subclasses implement :meth:`forward` ``(t, grid=None) -> Tensor``.
    """

    axes: tuple[str, ...] = ()

    def __init__(self, axes=()):
        super().__init__()
        axes = tuple(axes)
        for a in axes:
            if a not in _AXES:
                raise ValueError(f"Control.axes: expected names from {_AXES}, got {axes!r}")
        self.axes = axes

    def check_grid(self, value_shape, grid, name: str = "control") -> None:
        """Raise a clear error if a value of ``value_shape`` does not sit on ``grid``."""
        if grid is None or not self.axes:
            return
        trailing = tuple(value_shape)[len(value_shape) - len(self.axes):]
        for size, axis in zip(trailing, self.axes):
            itv = getattr(grid, axis)
            if itv is None:
                raise ValueError(f"{name}: lives on Omega_{axis}, but the grid has no {axis} interval")
            if itv.n is not None and itv.n != size:
                raise ValueError(
                    f"{name}: grid/control mismatch on Omega_{axis}: the control has {size} nodes "
                    f"there, the grid has N_{axis} = {itv.n}"
                )

    def validate(self, grid, name: str = "control") -> None:
        """Check once, before a solve, that this control can be evaluated on ``grid``.

        The default checks that the grid has every axis the control lives on; controls
        stored on fixed nodes also check the node counts.
        """
        for axis in self.axes:
            itv = getattr(grid, axis)
            if itv is None or not itv.is_complete:
                raise ValueError(
                    f"{name}: lives on Omega_{axis}, but the grid has no complete {axis} interval"
                )

    def forward(self, t, grid=None) -> Tensor:  # pragma: no cover - abstract
        raise NotImplementedError

    # -- shared by the controls stored as values over a time interval ----------------------

    def _check_per_row(self, values: Tensor, name: str, per: str = "") -> None:
        """Raise if the control has more axes than ``values`` ``(n_rows, *shape)`` has
        trailing dimensions (``per`` ends the message: ``" per piece"``)."""
        if len(self.axes) > values.dim() - 1:
            raise ValueError(
                f"{name}: {len(self.axes)} axes {self.axes} but values of shape "
                f"{tuple(values.shape[1:])}{per}"
            )

    def _set_interval(self, t0, t1, name: str) -> None:
        """Check and set the time interval ``[t0, t1]`` (finite, ``t0 < t1``)."""
        self.t0 = check_finite_float(t0, f"{name}.t0")
        self.t1 = check_finite_float(t1, f"{name}.t1")
        if self.t1 <= self.t0:
            raise ValueError(f"{name}: expected t0 < t1, got t0={t0}, t1={t1}")

    def _repr_flags(self) -> str:
        """The tail of ``extra_repr`` every control shares: its axes and ``positive``."""
        s = f", axes={self.axes}" if self.axes else ""
        return s + (", positive=True" if getattr(self, "positive", False) else "")


def _time_of(t) -> float:
    if isinstance(t, Tensor):
        if t.numel() != 1:
            raise ValueError(f"control time: expected a scalar time, got shape {tuple(t.shape)}")
        t = float(t.detach())
    elif isinstance(t, (str, bytes, bool)):
        raise TypeError(f"control time: expected a real number, got {t!r}")
    else:
        t = float(t)
    if not skip_value_checks() and not math.isfinite(t):
        raise ValueError(f"control time: expected a finite number, got {t}")
    return t


def _check_values(values, name: str) -> Tensor:
    if not isinstance(values, Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor of values, got {type(values).__name__}")
    if not values.is_floating_point():
        raise TypeError(f"{name}: expected floating-point values, got dtype {values.dtype}")
    if not bool(torch.isfinite(values).all()):
        raise ValueError(f"{name}: expected finite values")
    return values
