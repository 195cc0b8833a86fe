"""Helpers shared by the explicit multi-stage substep solvers (Heun, RK4, ODESolve).

A substep advanced by one of these solvers (``n_terms = None``, checked by
``Solver.check``) may hold several operators with
explicit fields; it then advances their sum :math:`u_t = \\sum_k A_k(t; u)` (unsplit).  Stage
times are the solver's own: the end of the substep is passed as the left limit
:math:`(t + \\Delta t)^-` (:class:`~opsplit.controls.LeftLimit`), so controls that are
piecewise constant on the time grid are seen as constant on each substep.
"""

from __future__ import annotations

from torch import Tensor

from .._compile import constant_under_compile
from ..controls.timepoints import LeftLimit

__all__ = ["field_sum", "end_time", "stage_time"]


def field_sum(terms, t, u: Tensor, grid) -> Tensor:
    """:math:`\\sum_k A_k(t; u)`."""
    out = terms[0].field(t, u, grid)
    for term in terms[1:]:
        out = out + term.field(t, u, grid)
    return out


@constant_under_compile
def end_time(t, dt) -> LeftLimit:
    """The substep's end :math:`(t + \\Delta t)^-`.  (Times are Python numbers; under
    ``torch.compile`` the result is computed at trace time, since dynamo cannot build a
    ``float`` subclass inside the graph.)"""
    return LeftLimit(float(t) + float(dt))


def stage_time(t_start: float, t_end: float, s: float):
    """A stage time ``s`` of a substep over ``[t_start, t_end]``, read from inside it.

    Times at or before the start are the start (read from the right, as the first-order
    solvers do); times at or after the end are the end's left limit; a time in the second
    half of the interval is read as a left limit too, so that a stage a round-off below
    the end (``t_end - 1 ulp``) is not rounded up into the next piece of a
    piecewise-constant control.
    """
    lo, hi = (t_start, t_end) if t_start <= t_end else (t_end, t_start)
    if s <= lo:
        return float(lo)
    if s >= hi:
        return LeftLimit(hi)
    return LeftLimit(s) if s >= 0.5 * (lo + hi) else float(s)
