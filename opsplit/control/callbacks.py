r"""Callbacks: what a script adds to a training run without subclassing the trainer.

A :class:`Callback` is handed to ``Trainer(..., callbacks=[...])`` and called at the run's
points (each hook receives the trainer first)::

    on_fit_start(trainer)            before the first step of fit (after a resume is loaded)
    on_step_start(trainer)           before each optimizer step (a step boundary)
    on_step_end(trainer, row)        after it: row is the step's history row
    on_evaluate(trainer, metrics)    after each evaluated epoch: its history row
    on_fit_end(trainer)              after the last step (also when a callback stopped the run)

**Stopping.**  ``on_step_end`` and ``on_evaluate`` stop the run by returning ``True`` (or by
setting ``trainer.should_stop = True``): the loop ends after the current step (the current
epoch's evaluation row is still written), and ``fit`` saves its last checkpoint as usual.

**The learning-rate schedule** is a function of the run's *progress* :math:`p \in [0, 1]`
(:meth:`~opsplit.control.Trainer.progress`): after ``warmup_steps`` of linear warm-up the
factor is :math:`r + (1 - r)\,\tfrac12(1 + \cos \pi p)` (``"cosine"``) or
:math:`r + (1 - r)(1 - p)` (``"linear"``), :math:`r` = ``min_lr_ratio``.  By default
:math:`p` = (step − warm-up) / (total steps − warm-up); a callback whose :meth:`Callback.progress`
returns a number drives it instead (the largest one when several do) — :class:`CPUTimeBudget`
makes the schedule follow the CPU time spent.

**At a step boundary** (``on_step_start`` / ``on_step_end``) a callback may change the model
— its :math:`N_t`, or its controls for new ones on a finer time grid — and hand the new
parameters to the optimizer with :meth:`~opsplit.control.Trainer.replace_parameters`, their
optimizer state (Adam's moments) mapped the same way.

**Resuming.**  A callback's :meth:`Callback.state_dict` (JSON values) is saved in every
checkpoint under its class name and restored by :meth:`Callback.load_state_dict` when the
run is resumed with a callback of the same class.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

__all__ = ["Callback", "CPUTimeBudget"]


class Callback:
    """The base class: every hook does nothing; override the ones you need."""

    def on_fit_start(self, trainer) -> None:
        """Before the first optimizer step of :meth:`~opsplit.control.Trainer.fit`."""

    def on_step_start(self, trainer) -> None:
        """Before each optimizer step (``trainer.step`` steps are done)."""

    def on_step_end(self, trainer, row: dict) -> bool | None:
        """After each optimizer step; ``row`` is its history row (``step``, ``loss``, ``lr``,
        ...; keys added here are recorded).  ``True`` stops the run."""

    def on_evaluate(self, trainer, metrics: dict) -> bool | None:
        """After each evaluated epoch; ``metrics`` is its history row (``train_loss``,
        ``eval_*``, ...).  ``True`` stops the run."""

    def on_fit_end(self, trainer) -> None:
        """After the last optimizer step of :meth:`~opsplit.control.Trainer.fit`."""

    def progress(self, trainer) -> float | None:
        """The run's progress in [0, 1] that drives the learning-rate schedule, or ``None``
        (the default: step count / total steps)."""
        return None

    def state_dict(self) -> dict:
        """What a checkpoint keeps of this callback (JSON values)."""
        return {}

    def load_state_dict(self, state: dict) -> None:
        """Restore what :meth:`state_dict` returned (on resume)."""


class CPUTimeBudget(Callback):
    """Train for ``seconds`` of process CPU time: the schedule's progress is the fraction of
    the budget used, ``p = CPU used / seconds`` (so a cosine schedule follows CPU time), and
    the run stops at the first optimizer step that ends with the budget used up.

    Every model of a comparison so gets the same CPU time, whatever the load of the machine
    does to its cost per step.  The CPU time is counted from the start of
    :meth:`~opsplit.control.Trainer.fit`'s loop (the checks before it are not counted), is
    summed over resumed segments (saved in checkpoints) and over later ``fit`` calls of the
    same trainer.

    Args:
        seconds: the budget, > 0.
        clock: the clock read, in seconds (default ``time.process_time``: the process's CPU
            time, all threads).
    """

    def __init__(self, seconds: float, *, clock: Callable[[], float] = time.process_time):
        if isinstance(seconds, bool) or not isinstance(seconds, (int, float)):
            raise TypeError(f"CPUTimeBudget.seconds: expected a number of seconds, got {seconds!r}")
        if not math.isfinite(seconds) or seconds <= 0:
            raise ValueError(f"CPUTimeBudget.seconds: expected a finite number of seconds > 0, got {seconds!r}")
        if not callable(clock):
            raise TypeError(f"CPUTimeBudget.clock: expected a callable returning seconds, got {clock!r}")
        self.seconds = float(seconds)
        self.clock = clock
        self.spent = 0.0  # CPU seconds of earlier segments
        self._start = None

    def used(self) -> float:
        """CPU seconds used so far (this segment and the earlier ones)."""
        return self.spent + (self.clock() - self._start if self._start is not None else 0.0)

    def on_fit_start(self, trainer) -> None:
        self._start = self.clock()

    def on_fit_end(self, trainer) -> None:
        self.spent, self._start = self.used(), None

    def on_step_end(self, trainer, row: dict) -> bool:
        return self.used() >= self.seconds

    def progress(self, trainer) -> float:
        return min(1.0, self.used() / self.seconds)

    def state_dict(self) -> dict:
        return {"spent": self.used()}

    def load_state_dict(self, state: dict) -> None:
        spent = state.get("spent") if isinstance(state, dict) else None
        if isinstance(spent, bool) or not isinstance(spent, (int, float)) or not math.isfinite(spent) or spent < 0:
            raise ValueError(f"CPUTimeBudget.load_state_dict: expected {{'spent': seconds >= 0}}, got {state!r}")
        self.spent, self._start = float(spent), None

    def __repr__(self) -> str:
        return f"CPUTimeBudget(seconds={self.seconds:g})"
