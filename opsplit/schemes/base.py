r"""The splitting-scheme interface: *in what order* the substeps advance :math:`u`.

A scheme holds the substeps of :math:`u_t = \sum_k A_k(t; u)` (paper 002, eq. 57 with
the sign convention of eq. 7) and maps :math:`u^n` to :math:`u^{n+1}`: one step of the
propagator :math:`\bar{\mathcal N}^n`.  It never looks inside a substep beyond calling it.
Each scheme declares its ``order``; :attr:`Scheme.effective_order` is the order the
composed method can have given its substep solvers (Strang with explicit-Euler substeps
is first order whatever its name).
"""

from __future__ import annotations

from torch import Tensor, nn

from .._checks import check_time, check_time_step
from ..grid import check_grid
from ..solvers import Substep
from ..solvers.catch_up import is_projection

__all__ = ["Scheme", "changes_grid", "fixed_at_construction", "irreversibility"]


def fixed_at_construction(obj, name: str, why: str) -> AttributeError:
    """The error for an attribute that cannot change after construction (derived state was
    built from it): ``raise fixed_at_construction(self, "groups", "its parallel groups ...")``."""
    cls = type(obj).__name__
    return AttributeError(f"{cls}.{name}: fixed at construction ({why}); build a new {cls} instead")


def changes_grid(substep) -> bool:
    """Whether a substep moves the state to another grid (its operator is a grid transfer)."""
    return any(getattr(op, "changes_grid", False) for op in getattr(substep, "terms", (substep,)))


def irreversibility(substep) -> str | None:
    """Why ``substep`` cannot be advanced over a negative time step, or ``None`` if it can."""
    solver = substep.solver
    if not getattr(solver, "reversible", False):
        kind = (
            "a resolvent (an implicit step)"
            if getattr(solver, "requires", "") == "resolvent"
            else "not declared reversible"
        )
        return f"its solver {solver!r} is {kind}"
    for op in substep.terms:
        name = type(op).__name__
        if is_projection(op):
            return f"its operator {name} is a projection (the resolvent of an indicator), which cannot run backwards"
        if getattr(op, "is_map", False):
            return f"its operator {name} is a map applied once per step, not a flow with a negative-time meaning"
        if not getattr(op, "reversible", True):
            return f"its operator {name} cannot run backwards (a random field in training mode, or a map)"
    return None


class Scheme(nn.Module):
    """Base class of splitting schemes.

    Args:
        substeps: operators (advanced by their default solver) or
            :class:`~opsplit.solvers.Substep` objects, in order.
    """

    #: formal order of the splitting with exact substep solves
    order: int = 1
    #: whether the scheme passes a grid transfer's new grid on to the substeps after it
    threads_grid: bool = False

    def __setattr__(self, name, value):
        # what a scheme is cannot be changed on one instance: its order (the order conditions
        # of its coefficients, read by the adaptive step-size controller), whether it threads
        # grids, and its substeps (from which schemes derive their plans)
        if name in ("order", "threads_grid") and not isinstance(getattr(type(self), name, None), property):
            raise AttributeError(f"{type(self).__name__}.{name}: a property of the scheme's class ({name} = "
                                 f"{getattr(type(self), name)!r}), not of one scheme; define a subclass to declare "
                                 "another")
        if name == "substeps" and "substeps" in self.__dict__.get("_modules", {}):
            raise fixed_at_construction(self, name, "the scheme's plan is built from its substeps")
        super().__setattr__(name, value)

    def __init__(self, substeps):
        super().__init__()
        if isinstance(substeps, nn.Module):
            substeps = [substeps]
        substeps = list(substeps)
        if not substeps:
            raise ValueError(f"{type(self).__name__}: a scheme needs at least one operator (got none)")
        self.substeps = nn.ModuleList(s if isinstance(s, Substep) else Substep(s) for s in substeps)
        if not self.threads_grid:
            for k, s in enumerate(self.substeps):
                if changes_grid(s):
                    raise ValueError(
                        f"{type(self).__name__}: substep {k} ({type(s.terms[0]).__name__}) moves the state to "
                        "another grid; use a scheme that threads the grid (Hybrid, with the transfer in a "
                        "group of its own, or Stages)"
                    )

    @property
    def effective_order(self) -> int:
        """``min(scheme order, substep solver orders)``."""
        return min([self.order] + [s.order for s in self.substeps])

    def check(self, grid) -> None:
        for s in self.substeps:
            s.check(grid)

    def step(self, t, dt: float, u: Tensor, grid) -> Tensor:  # pragma: no cover - abstract
        raise NotImplementedError

    def advance(self, t, dt: float, u: Tensor, grid):
        """One step and the grid of the new state: ``(u^{n+1}, grid^{n+1})``.  The same grid
        unless a substep is a grid transfer (schemes with ``threads_grid``)."""
        return self.step(t, dt, u, grid), grid

    def output_grid(self, grid):
        """The grid of the state after one step from ``grid`` (computed without a state)."""
        return grid

    def forward(self, t, dt: float, u: Tensor, grid) -> Tensor:
        """One step :math:`u^n \\mapsto u^{n+1}` over ``[t, t + dt]``: ``t`` finite, ``dt``
        finite and > 0, ``grid`` a complete :class:`~opsplit.grid.Grid` for ``u``.  No
        value checks of ``u`` (that is the propagator's job, once per solve)."""
        check_time(t, f"{type(self).__name__}: t")
        check_time_step(dt, f"{type(self).__name__}: dt")
        grid = check_grid(grid, f"{type(self).__name__}: grid", optional=False)
        return self.step(t, dt, u, grid)

    def extra_repr(self) -> str:
        return f"order={self.order}, effective_order={self.effective_order}"
