r"""Multi-stage splitting: a model whose grid changes at given times (paper 002, §6.2).

"For a K-stage CvT, the number of tokens changes from stage to stage.  This property can
be realized by incorporating the new operator-splitting scheme with a hybrid splitting
scheme" (§6.2).  :class:`Stages` is that composition.  The time interval
:math:`[\tau_0, \tau_K]` is cut at the stage changes :math:`\tau_1 < \dots < \tau_{K-1}`;
stage :math:`k` lives on its own grid :math:`G_k` (fewer tokens, more channels) and runs

* its **entry** once, at :math:`t = \tau_{k-1}`: a :class:`~opsplit.schemes.Hybrid` of map
  substeps that begins with a grid transfer :math:`G_{k-1} \to G_k` (CvT: the convolutional
  token embedding, eqs. 44–45, and the class token), each in a group of its own;
* its **body** at every step :math:`[t^n, t^{n+1}] \subset [\tau_{k-1}, \tau_k]`: a scheme on
  :math:`G_k` (CvT: a :class:`~opsplit.schemes.Hybrid` of the attention and feed-forward
  substeps, whose controls are piecewise constant on :math:`[\tau_{k-1}, \tau_k]`).

As a continuous model this is an evolution with jumps at fixed times (the grid transfers)
and a flow in between; the propagator threads the grid from step to step
(:meth:`Scheme.advance`).  The time grid must put a step boundary at every
:math:`\tau_k` (an error says so otherwise); with that, any :math:`N_t` works.  The order
is the bodies' (the jumps are exact maps at grid times).

:meth:`Stages.schedule` lists, for a given input grid, each stage's time interval, grid,
entry substeps and per-step substeps.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from torch import Tensor, nn

from .._checks import check_positive_int
from .base import Scheme, fixed_at_construction

__all__ = ["Stage", "Stages", "Schedule", "describe_substep"]


def _describe_op(op, grid=None) -> str:
    name = type(op).__name__
    inner = getattr(op, "inner", None)
    if isinstance(inner, nn.Module) and hasattr(inner, "has_field"):
        name += f"({_describe_op(inner, grid)})"
    note = getattr(op, "schedule_note", None)
    if grid is not None and callable(note):
        name += f" {{{note(grid)}}}"
    return name


def describe_substep(substep, grid=None) -> str:
    """``"<solver>: <operator chain>"`` for a :class:`~opsplit.solvers.Substep`; operators
    with a ``schedule_note(grid)`` method add what it says on ``grid`` (e.g. the grids of
    an attention's keys and values)."""
    ops = " + ".join(_describe_op(op, grid) for op in substep.terms)
    return f"{type(substep.solver).__name__}: {ops}"


def _labels(labels, n: int, what: str) -> tuple:
    if labels is None:
        return (None,) * n
    labels = tuple(labels)
    if len(labels) != n:
        raise ValueError(f"Stage.{what}: expected {n} labels (one per substep), got {len(labels)}")
    return labels


class Stage(nn.Module):
    """One stage of :class:`Stages`.

    Args:
        body: the scheme of every step of the stage (on the stage's grid).
        n_steps: the stage's number of steps at :math:`\\Delta t = 1` (its layers); the
            stage lasts ``duration`` (default ``n_steps``).
        entry: a scheme applied once at the stage's start (grid transfers and maps), or
            ``None``.
        name: shown by :meth:`Stages.schedule`.
        entry_labels, body_labels: optional descriptions of the substeps (e.g. the paper's
            equation numbers), one per substep.
    """

    def __init__(self, body: Scheme, n_steps: int, *, entry: Scheme | None = None, duration: float | None = None,
                 name: str | None = None, entry_labels=None, body_labels=None):
        super().__init__()
        if not isinstance(body, Scheme):
            raise TypeError(f"Stage.body: expected an opsplit Scheme, got {type(body).__name__}")
        if entry is not None and not isinstance(entry, Scheme):
            raise TypeError(f"Stage.entry: expected an opsplit Scheme or None, got {type(entry).__name__}")
        self.body, self.entry = body, entry
        self.n_steps = check_positive_int(n_steps, "Stage.n_steps")
        self.duration = float(self.n_steps if duration is None else duration)
        if not self.duration > 0:
            raise ValueError(f"Stage.duration: expected a positive time, got {duration}")
        self.name = name
        self.entry_labels = _labels(entry_labels, 0 if entry is None else len(entry.substeps), "entry_labels")
        self.body_labels = _labels(body_labels, len(body.substeps), "body_labels")

    def __setattr__(self, name, value):
        # a Stages holding this stage made its stage boundaries and schedule from these
        if name in ("body", "entry", "n_steps", "duration", "entry_labels", "body_labels") and (
                name in self.__dict__ or name in self.__dict__.get("_modules", {})):
            raise fixed_at_construction(self, name, "a Stages made its stage boundaries and schedule from it")
        super().__setattr__(name, value)

    def extra_repr(self) -> str:
        return f"name={self.name!r}, n_steps={self.n_steps}, duration={self.duration:g}"


@dataclass
class StageInfo:
    """One row of a :class:`Schedule`."""

    name: str
    t0: float
    t1: float
    n_steps: int
    grid_in: object
    grid: object
    entry: list = field(default_factory=list)  # (description, label, grid after)
    body: list = field(default_factory=list)  # (description, label)
    body_scheme: str = ""


@dataclass
class Schedule:
    """What :meth:`Stages.schedule` returns: per stage, its time interval, grid and substeps.
    ``str(schedule)`` is a readable table."""

    stages: list

    @property
    def grids(self) -> list:
        return [s.grid for s in self.stages]

    def substeps_per_step(self) -> list[int]:
        """Per stage: the substeps of one step (the entry counted once, in the first step)."""
        return [len(s.body) for s in self.stages]

    def __str__(self) -> str:
        lines = []
        for k, s in enumerate(self.stages):
            name = f"stage {k + 1}" if s.name == f"stage {k + 1}" else f"stage {k + 1} ({s.name})"
            lines.append(f"{name}: t in [{s.t0:g}, {s.t1:g}], {s.n_steps} step(s), grid {s.grid}")
            if s.entry:
                lines.append(f"  entry, once at t = {s.t0:g} (from {s.grid_in}):")
                for i, (d, label, g) in enumerate(s.entry):
                    lab = f"  [{label}]" if label else ""
                    lines.append(f"    {i + 1}. {d}  -> {g}{lab}")
            lines.append(f"  every step ({s.body_scheme}, {len(s.body)} substeps):")
            for i, (d, label) in enumerate(s.body):
                lab = f"  [{label}]" if label else ""
                lines.append(f"    {i + 1}. {d}{lab}")
        return "\n".join(lines)


class Stages(Scheme):
    """Stages on their own grids, each an entry (grid transfer) and a body, in time order.

    Args:
        stages: :class:`Stage` objects, in order.
        t0: the start time :math:`\\tau_0`; stage :math:`k` covers
            :math:`[\\tau_{k-1}, \\tau_{k-1} + \\text{duration}_k]`.

    Build the propagator with ``Propagator(stages, stages.n_steps, t0=stages.t0,
    t1=stages.t1)``.
    """

    threads_grid = True

    def __init__(self, stages, *, t0: float = 0.0):
        nn.Module.__init__(self)
        stages = [stages] if isinstance(stages, Stage) else list(stages)
        if not stages:
            raise ValueError("Stages: expected at least one Stage")
        for k, s in enumerate(stages):
            if not isinstance(s, Stage):
                raise TypeError(f"Stages: stage {k} is a {type(s).__name__}, expected a Stage")
        self.stages = nn.ModuleList(stages)
        self.t0 = float(t0)
        bounds = [self.t0]
        for s in stages:
            bounds.append(bounds[-1] + s.duration)
        self.bounds = tuple(bounds)

    def __setattr__(self, name, value):
        if name in ("stages", "t0", "bounds") and (name in self.__dict__ or name in self.__dict__.get("_modules", {})):
            raise fixed_at_construction(self, name, "the stage boundaries are made from t0 and the stages' durations")
        super().__setattr__(name, value)

    # -- the Scheme interface -------------------------------------------------------------
    @property
    def substeps(self) -> list:
        out = []
        for s in self.stages:
            if s.entry is not None:
                out.extend(s.entry.substeps)
            out.extend(s.body.substeps)
        return out

    @property
    def order(self) -> int:
        return min(s.body.order for s in self.stages)

    @property
    def effective_order(self) -> int:
        return min(s.body.effective_order for s in self.stages)

    @property
    def n_steps(self) -> int:
        """:math:`N_t` at :math:`\\Delta t = 1` per stage step: the sum of the stages' steps."""
        return sum(s.n_steps for s in self.stages)

    @property
    def t1(self) -> float:
        return self.bounds[-1]

    def _tol(self, t: float) -> float:
        return 1e-9 * max(1.0, abs(t))

    def stage_at(self, t) -> int:
        """Index of the stage whose interval :math:`[\\tau_{k-1}, \\tau_k)` holds ``t``."""
        t = float(t)
        if t < self.bounds[0] - self._tol(self.bounds[0]) or t > self.bounds[-1] + self._tol(self.bounds[-1]):
            raise ValueError(f"Stages: time t = {t:g} is outside [{self.bounds[0]:g}, {self.bounds[-1]:g}]")
        for k in range(len(self.stages)):
            if t < self.bounds[k + 1] - self._tol(self.bounds[k + 1]):
                return k
        return len(self.stages) - 1

    def advance(self, t, dt: float, u: Tensor, grid):
        k = self.stage_at(t)
        st = self.stages[k]
        t0, t1 = self.bounds[k], self.bounds[k + 1]
        if float(t) + float(dt) > t1 + self._tol(t1):
            raise ValueError(
                f"Stages: the step [{float(t):g}, {float(t) + float(dt):g}] crosses the stage change at "
                f"t = {t1:g}; choose N_t so that every stage change {list(self.bounds[1:-1])} is a step time"
            )
        if st.entry is not None and abs(float(t) - t0) <= self._tol(t0):
            u, grid = st.entry.advance(t, dt, u, grid)
        return st.body.advance(t, dt, u, grid)

    def step(self, t, dt: float, u: Tensor, grid) -> Tensor:
        return self.advance(t, dt, u, grid)[0]

    def stage_grids(self, grid) -> list:
        """``[(grid before the entry, stage grid), ...]`` for an input on ``grid``."""
        out = []
        for s in self.stages:
            g_in = grid
            if s.entry is not None:
                grid = s.entry.output_grid(grid)
            out.append((g_in, grid))
            grid = s.body.output_grid(grid)
        return out

    def output_grid(self, grid):
        """The grid after the last stage (the whole solve)."""
        for s in self.stages:
            if s.entry is not None:
                grid = s.entry.output_grid(grid)
            grid = s.body.output_grid(grid)
        return grid

    def check(self, grid) -> None:
        for s in self.stages:
            if s.entry is not None:
                s.entry.check(grid)
                grid = s.entry.output_grid(grid)
            s.body.check(grid)
            grid = s.body.output_grid(grid)

    # -- inspection ----------------------------------------------------------------------------
    def schedule(self, grid) -> Schedule:
        """The schedule for an input on ``grid``: stages, time intervals, grids, substeps."""
        infos = []
        for k, s in enumerate(self.stages):
            g_in = grid
            entry = []
            if s.entry is not None:
                gg = grid
                for sub, label in zip(s.entry.substeps, s.entry_labels):
                    if getattr(sub.terms[0], "changes_grid", False):
                        gg = sub.terms[0].target_grid(gg)
                    entry.append((describe_substep(sub), label, gg))
                grid = s.entry.output_grid(grid)
            body = [(describe_substep(sub, grid), label) for sub, label in zip(s.body.substeps, s.body_labels)]
            body_scheme = type(s.body).__name__
            groups = getattr(s.body, "groups", None)
            if groups is not None:
                body_scheme += f" groups {[list(g) for g in groups]}"
            infos.append(StageInfo(s.name or f"stage {k + 1}", self.bounds[k], self.bounds[k + 1], s.n_steps,
                                   g_in, grid, entry, body, body_scheme))
            grid = s.body.output_grid(grid)
        return Schedule(infos)

    def extra_repr(self) -> str:
        return f"stages={len(self.stages)}, t=[{self.bounds[0]:g}, {self.bounds[-1]:g}]"
