r"""Controls stored on a reference grid, resampled to the grid a model is solved on.

A kernel :math:`W(\tilde y, y, t)` or a bias :math:`b(x, t)` is a *function*.  An
:class:`OnReferenceGrid` control stores its values at the nodes of reference intervals
(one per spatial axis) and, asked for its value on another grid of the same domains,
returns the function's values at that grid's nodes:

.. math::  W_{\text{target}} = P_1\, W_{\text{ref}}\, P_2^\top,\qquad
           P_k = \texttt{ref}_k\texttt{.interpolation\_matrix(target}_k\texttt{)},

piecewise-linear interpolation of the node values (error :math:`O(h_{\text{ref}}^2)`,
exact when the target grid is the reference grid).  **What is resampled is the function,
not the discrete operator**: the quadrature weights of an integral
:math:`\int W(\xi, y) u(\xi)\, d\xi` are not part of the control; they come from the
*target* grid, where the operator applies them (``Grid.kernel_y``).  A kernel trained on
a grid with spacing :math:`\Delta y` therefore gives, on a grid with spacing
:math:`\Delta y'`, the discrete operator :math:`u \mapsto \sum_i \Delta y'\,
W(\tilde y_i, y)\, u_i` — the same integral operator at another resolution.  (Resampling
the matrix :math:`\Delta y\,W` instead would change the operator by the factor
:math:`\Delta y'/\Delta y`.)

The domains must agree: a control on :math:`\Omega_y = [0, L]` cannot be evaluated on a
grid of :math:`[0, L']` (with ``L = N`` grids, changing :math:`N` changes the domain; for a
resolution study keep :math:`L` fixed, ``Grid.uniform`` / ``Grid.refine``).
"""

from __future__ import annotations

import math

from torch import Tensor

from ..grid import Interval
from .base import Control
from .constant import as_control

__all__ = ["OnReferenceGrid"]


def _same_interval(a: Interval, b: Interval) -> bool:
    return a.n == b.n and a.rule == b.rule and math.isclose(a.length, b.length, rel_tol=1e-12)


class OnReferenceGrid(Control):
    """A control whose values live on the nodes of reference intervals.

    Args:
        values: a time control (or a tensor, taken as constant in time) whose value has
            shape ``(*lead, n_1, ..., n_d)`` with ``n_k`` the node count of the ``k``-th
            reference interval.
        reference: the reference :class:`~opsplit.grid.Interval` of each axis (complete:
            node count and length), one per entry of ``axes``.
        axes: the spatial domain of each trailing dimension, e.g. ``("y", "y")``.
    """

    def __init__(self, values, reference, axes=("y", "y")):
        super().__init__(axes)
        if isinstance(reference, Interval):
            reference = (reference,)
        reference = tuple(reference)
        if len(reference) != len(self.axes):
            raise ValueError(
                f"OnReferenceGrid: expected one reference interval per axis {self.axes}, "
                f"got {len(reference)}"
            )
        for k, itv in enumerate(reference):
            if not isinstance(itv, Interval) or not itv.is_complete:
                raise ValueError(
                    f"OnReferenceGrid.reference[{k}]: expected a complete opsplit Interval "
                    f"(node count and length), got {itv!r}"
                )
        if not self.axes:
            raise ValueError("OnReferenceGrid: expected at least one spatial axis")
        self.reference = reference
        self.values = as_control(values, "OnReferenceGrid.values")
        shape = getattr(self.values, "shape", None)
        if shape is not None:
            self._check_value_shape(tuple(shape))
        self._cache: dict = {}

    def _check_value_shape(self, shape) -> None:
        d = len(self.axes)
        want = tuple(itv.n for itv in self.reference)
        if len(shape) < d or tuple(shape[len(shape) - d :]) != want:
            raise ValueError(
                f"OnReferenceGrid.values: expected trailing shape {want} (the reference nodes "
                f"of axes {self.axes}), got {tuple(shape)}"
            )

    def _target(self, grid, axis: str, k: int) -> Interval:
        itv = getattr(grid, axis, None) if grid is not None else None
        if itv is None or not itv.is_complete:
            raise ValueError(
                f"OnReferenceGrid: lives on Omega_{axis}, the grid needs a complete {axis} interval"
            )
        ref = self.reference[k]
        if not math.isclose(itv.length, ref.length, rel_tol=1e-12):
            raise ValueError(
                f"grid/control mismatch on Omega_{axis}: the control is defined on "
                f"[0, {ref.length:g}] (reference {ref}), the grid on [0, {itv.length:g}] ({itv}); "
                "resample only between grids of the same domain"
            )
        return itv

    def validate(self, grid, name: str = "control") -> None:
        for k, axis in enumerate(self.axes):
            try:
                self._target(grid, axis, k)
            except ValueError as e:
                raise ValueError(f"{name}: {e}") from None

    def matrix(self, k: int, target: Interval, dtype, device) -> Tensor | None:
        """The resampling matrix of axis ``k`` onto ``target`` (``None``: identity)."""
        ref = self.reference[k]
        if _same_interval(ref, target):
            return None
        key = (k, target, dtype, device)
        P = self._cache.get(key)
        if P is None:
            P = ref.interpolation_matrix(target, dtype=dtype, device=device)
            self._cache[key] = P
        return P

    def forward(self, t, grid=None) -> Tensor:
        v = self.values(t, None)
        self._check_value_shape(tuple(v.shape))
        d = len(self.axes)
        for k, axis in enumerate(self.axes):
            P = self.matrix(k, self._target(grid, axis, k), v.dtype, v.device)
            if P is None:
                continue
            dim = v.dim() - d + k
            v = (P @ v.movedim(dim, -2)).movedim(-2, dim) if dim != v.dim() - 1 else v @ P.T
        return v

    def extra_repr(self) -> str:
        refs = ", ".join(str(r) for r in self.reference)
        return f"axes={self.axes}, reference=({refs})"
