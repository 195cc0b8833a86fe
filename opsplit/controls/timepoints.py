r"""Time points with a side: the left limit :math:`t^-` of a control at :math:`t`.

A control that is discontinuous in time (:class:`~opsplit.controls.PiecewiseConstant`)
has two values at a breakpoint :math:`t^n`: the value of the piece that ends there and
the value of the piece that starts there.  A first-order solver evaluates the controls at
a substep's start time, which is inside the substep's piece.  A higher-order solver also
evaluates them at the substep's *end* time :math:`t + \Delta t` (Heun, RK4, torchdiffeq's
stages); there it must see the value the control has *on* the substep, the left limit
:math:`\theta(t + \Delta t^-)`, or a piecewise-constant control aligned with the time grid
would be read one piece ahead and the solver would lose its order.

:class:`LeftLimit` is a ``float`` that carries this side.  Controls that are continuous in
time ignore it (it is an ordinary number); piecewise controls pick the piece that ends at
:math:`t`.  Arithmetic on a :class:`LeftLimit` returns a plain ``float``.
"""

from __future__ import annotations

__all__ = ["LeftLimit", "is_left_limit"]


class LeftLimit(float):
    """A time ``t`` to be read as the left limit :math:`t^-` by discontinuous controls."""

    __slots__ = ()

    def __repr__(self) -> str:
        return f"LeftLimit({float(self)!r})"


def is_left_limit(t) -> bool:
    """Whether ``t`` asks for the left limit (a :class:`LeftLimit`)."""
    return isinstance(t, LeftLimit)
