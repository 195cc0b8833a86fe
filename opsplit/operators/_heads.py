"""Shared checks of the head-weight controls of the attention operators (multi-head and
grouped-query): the features and heads of the kernels against the grid's Omega_y and
Omega_h."""

from __future__ import annotations

from ..grid import Grid


def control_shape(control) -> tuple | None:
    """The static shape of a control's values, or None where it has none."""
    return tuple(control.shape) if hasattr(control, "shape") and not callable(control.shape) else None


def control_dim(control, i: int) -> int | None:
    """Size ``i`` of a control's static shape, or None where it has none."""
    s = control_shape(control)
    return None if s is None else s[i]


def check_control_shapes(owner: str, expected) -> None:
    """``ValueError`` for the first ``(attr, control, want)`` of ``expected`` whose control has
    a static shape other than ``want`` (absent controls, ``None``, pass)."""
    for attr, c, want in expected:
        s = None if c is None else control_shape(c)
        if s is not None and s != want:
            raise ValueError(f"{owner}.{attr}: expected shape {want}, got {s}")


def check_head_controls(op, grid: Grid, *, name: str, features: str, heads: str) -> None:
    """``ValueError`` unless ``op.WQ``'s (N_y, N_h) shape matches the grid, then every head
    control's own check against it.  ``name`` is the operator the messages name;
    ``features`` / ``heads`` what its N_y features and N_h heads are."""
    s = control_shape(op.WQ)
    if s is not None:
        if grid.y.n is not None and s[0] != grid.y.n:
            raise ValueError(
                f"{name}: grid/control mismatch: the kernels act on N_y = {s[0]} {features}, "
                f"the grid has N_y = {grid.y.n}"
            )
        if grid.h is not None and grid.h.n is not None and grid.h.n != s[1]:
            raise ValueError(f"{name}: grid/control mismatch on Omega_h: {s[1]} {heads}, the grid has N_h = {grid.h.n}")
    for attr in ("WQ", "WK", "WV", "WO", "bQ", "bK", "bV", "bO"):
        c = getattr(op, attr)
        if c is not None:
            c.validate(grid, f"{name}.{attr}")
