r"""Hybrid splitting (PottsMGNet), paper 002 Appendix C: sequential groups, each group a
parallel splitting step (eq. 59) of its own substeps.

With groups :math:`G_1, \dots, G_m` (a partition of the substeps), one step is

.. math::  u^{n + g/m} = \frac{1}{|G_g|} \sum_{k \in G_g} v_k,\qquad
           v_t = |G_g|\, A_k(t; v)\ \text{on } (t^n, t^{n+1}],\ v(t^n) = u^{n + (g-1)/m},

for :math:`g = 1, \dots, m`.  Groups of one substep make it the Lie scheme (eq. 58), a
single group the parallel scheme (eq. 59).  First order.  Each group runs its
independent substeps batched where their structures agree (see
:mod:`opsplit.schemes.parallel`).

**Grid transfers.**  A group may hold a grid transfer (a map to another grid, e.g. the
stage change of a multi-stage model, :mod:`opsplit.operators.transfer`) if it is the only
substep of its group (the states of a parallel group are averaged, so they must live on
one grid); the groups after it run on the transfer's target grid.  :meth:`Hybrid.advance`
returns the state and its grid.
"""

from __future__ import annotations

from torch import Tensor, nn

from .base import Scheme, changes_grid, fixed_at_construction
from .parallel import ParallelGroup, _check_batch

__all__ = ["Hybrid"]


def _is_group(g) -> bool:
    return isinstance(g, (list, tuple)) and not isinstance(g, nn.Module)


class Hybrid(Scheme):
    """Sequential groups of parallel substeps. Order 1.

    Two ways to give the groups:

    * ``Hybrid([[a, b], [c], [d, e]])``: nested lists of operators / substeps, in order;
    * ``Hybrid([a, b, c, d, e], groups=[[0, 1], [2], [3, 4]])``: the substeps and a
      partition of their indices (every index exactly once), in the order the groups run.

    Args:
        batch: run substeps of the same structure inside a group as one vmapped call
            (``True``, ``False`` or ``"auto"``, as in :class:`~opsplit.schemes.Parallel`).
    """

    order = 1
    threads_grid = True

    def __init__(self, substeps, groups=None, *, batch="auto"):
        substeps = list(substeps) if not isinstance(substeps, nn.Module) else [substeps]
        if groups is None:
            if not substeps:
                raise ValueError("Hybrid: a scheme needs at least one operator (got none)")
            if not all(_is_group(g) for g in substeps):
                raise ValueError(
                    "Hybrid: expected a list of groups (lists of operators/substeps), or the "
                    "substeps with groups=[[indices], ...]"
                )
            groups, flat = [], []
            for g in substeps:
                g = list(g)
                if not g:
                    raise ValueError(
                        f"Hybrid: group {len(groups)} is empty; every group needs a substep"
                    )
                groups.append(list(range(len(flat), len(flat) + len(g))))
                flat.extend(g)
            substeps = flat
        super().__init__(substeps)
        self.groups = self._check_groups(groups, len(self.substeps))
        self._transfers = tuple(len(g) == 1 and changes_grid(self.substeps[g[0]]) for g in self.groups)
        for gi, g in enumerate(self.groups):
            if len(g) > 1 and any(changes_grid(self.substeps[i]) for i in g):
                raise ValueError(
                    f"Hybrid.groups[{gi}]: a grid transfer must be the only substep of its group (the states "
                    f"of a parallel group are averaged, so they must live on one grid); got group {list(g)}"
                )
        self._parts = nn.ModuleList(
            ParallelGroup([self.substeps[i] for i in g], batch=_check_batch(batch)) for g in self.groups
        )
        self.batch = batch

    def __setattr__(self, name, value):
        # ``batch`` may change after construction (passed on to every group: new plans); the
        # groups and the parts built from them may not
        if name == "batch":
            value = _check_batch(value, f"{type(self).__name__}.batch")
            for part in self._parts:
                part.batch = value
        elif name in ("groups", "_transfers") and name in self.__dict__:
            raise fixed_at_construction(self, name, "its parallel groups are built from them")
        super().__setattr__(name, value)

    @staticmethod
    def _check_groups(groups, n: int) -> tuple[tuple[int, ...], ...]:
        if not _is_group(groups) or not groups:
            raise ValueError(
                f"Hybrid.groups: expected a non-empty list of index lists covering the {n} "
                f"substeps 0..{n - 1}, got {groups!r}"
            )
        seen: dict[int, int] = {}
        out = []
        for gi, g in enumerate(groups):
            if not _is_group(g) or len(g) == 0:
                raise ValueError(
                    f"Hybrid.groups[{gi}]: expected a non-empty list of substep indices, got {g!r}"
                )
            for i in g:
                if isinstance(i, bool) or not isinstance(i, int):
                    raise TypeError(
                        f"Hybrid.groups[{gi}]: expected integer substep indices, got {i!r}"
                    )
                if not 0 <= i < n:
                    raise ValueError(
                        f"Hybrid.groups[{gi}]: index {i} is out of range; the scheme has {n} "
                        f"substeps (indices 0..{n - 1})"
                    )
                if i in seen:
                    raise ValueError(
                        f"Hybrid.groups: substep {i} appears in group {seen[i]} and in group {gi}; "
                        "every substep must be in exactly one group"
                    )
                seen[i] = gi
            out.append(tuple(int(i) for i in g))
        missing = sorted(set(range(n)) - set(seen))
        if missing:
            raise ValueError(
                f"Hybrid.groups do not cover the operators: substep(s) {missing} are in no group "
                f"(the scheme has {n} substeps; every one must be in exactly one group)"
            )
        return tuple(out)

    def step(self, t, dt: float, u: Tensor, grid) -> Tensor:
        if any(self._transfers):
            return self.advance(t, dt, u, grid)[0]
        for part in self._parts:
            u = part(t, dt, u, grid)
        return u

    def _target(self, gi: int, grid):
        return self.substeps[self.groups[gi][0]].terms[0].target_grid(grid)

    def advance(self, t, dt: float, u: Tensor, grid):
        for gi, part in enumerate(self._parts):
            u = part(t, dt, u, grid)
            if self._transfers[gi]:
                grid = self._target(gi, grid)
        return u, grid

    def output_grid(self, grid):
        for gi in range(len(self.groups)):
            if self._transfers[gi]:
                grid = self._target(gi, grid)
        return grid

    def check(self, grid) -> None:
        for gi, g in enumerate(self.groups):
            for i in g:
                self.substeps[i].check(grid)
            if self._transfers[gi]:
                grid = self._target(gi, grid)

    def extra_repr(self) -> str:
        return (
            super().extra_repr() + f", groups={[list(g) for g in self.groups]}, batch={self.batch}"
        )
