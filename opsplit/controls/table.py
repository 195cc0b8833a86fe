"""A control stored as a table of values over time (pieces, nodes): the shared storage of
:class:`~opsplit.controls.PiecewiseConstant` and :class:`~opsplit.controls.PiecewiseLinear`."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from .._checks import check_finite_float
from .base import Control, _check_values

__all__ = ["TimeTable"]


class TimeTable(Control):
    """Values ``(n_rows, *shape)`` on a time interval ``[t0, t1]``, as a ``Parameter``.

    Subclasses set ``_row`` (what a row is called: ``"piece"``, ``"node"``) and
    ``_default_span(n_rows)`` (the length of ``[t0, t1]`` when ``t1`` is not given), and
    implement ``forward``.  ``positive=True`` stores :math:`\\log` of the values, so the
    control stays :math:`> 0` under any training update (used for :math:`\\sigma_2`).
    """

    _row = "row"

    @staticmethod
    def _default_span(n_rows: int) -> float:
        return float(n_rows)

    def __init__(self, values: Tensor, *, t0=0.0, t1=None, axes=(), positive=False,
                 requires_grad=True):
        super().__init__(axes)
        name = type(self).__name__
        values = _check_values(values, f"{name}.values")
        if values.dim() < 1 or values.shape[0] < 1:
            raise ValueError(
                f"{name}.values: expected shape (n_{self._row}s, *shape) with at least one "
                f"{self._row}, got {tuple(values.shape)}"
            )
        self._check_per_row(values, name, f" per {self._row}")
        if t1 is None:
            t1 = check_finite_float(t0, f"{name}.t0") + self._default_span(int(values.shape[0]))
        self._set_interval(t0, t1, name)
        self.positive = bool(positive)
        if self.positive:
            if not bool((values > 0).all()):
                raise ValueError(
                    f"{name}(positive=True): expected values > 0 (e.g. sigma_2 > 0), "
                    f"got min {float(values.min()):g}"
                )
            values = values.log()
        self.raw = nn.Parameter(values.detach().clone(), requires_grad=requires_grad)

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.raw.shape[1:])

    @property
    def values(self) -> Tensor:
        """All rows, shape ``(n_rows, *shape)``."""
        return self.raw.exp() if self.positive else self.raw

    def _out(self, v: Tensor) -> Tensor:
        return v.exp() if self.positive else v

    def validate(self, grid, name: str = "control") -> None:
        self.check_grid(self.shape, grid, name)

    @torch.no_grad()
    def fill_(self, values: Tensor):
        """Overwrite all rows (``values`` of shape ``(n_rows, *shape)`` or ``shape``)."""
        values = torch.as_tensor(values, dtype=self.raw.dtype, device=self.raw.device)
        if self.positive:
            if not bool((values > 0).all()):
                raise ValueError("fill_: a positive control needs values > 0")
            values = values.log()
        self.raw.copy_(values.expand_as(self.raw))
        return self

    def extra_repr(self) -> str:
        return (f"n_{self._row}s={self.raw.shape[0]}, shape={self.shape}, t=[{self.t0:g}, {self.t1:g}]"
                + self._repr_flags())
