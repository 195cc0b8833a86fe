"""The size and cost guard of the ``opsplit`` command: every job estimates, from its config
alone and before anything is allocated, the memory it needs at its peak and the compute it
will take, and a job beyond the machine's available memory or beyond :data:`MAX_SECONDS`
is refused with a message naming the key that makes it so (``--force`` runs it anyway).

An :class:`Estimate` counts

- ``flops``: the floating-point operations of the matrix products (2 per multiply-add:
  the count ``torch.utils.flop_counter.FlopCounterMode`` reports; elementwise work is
  left out),
- ``calls``: operator evaluations (each costs Python and dispatch overhead, which
  dominates on the small grids of the command's jobs),
- ``bytes``: the largest tensors alive at once (states, score matrices, kernel matrices,
  parameters and what autograd keeps), in the job's floating type.

Each job's formulas are next to the job (``estimate`` in :mod:`opsplit.cli.solve`,
:mod:`~opsplit.cli.compare`, :mod:`~opsplit.cli.train`, :mod:`~opsplit.cli.convert`,
:mod:`~opsplit.cli.grid`); tests/test_cli.py checks the flop and call counts against
``FlopCounterMode`` and counted operator calls on small configs.  Seconds are
``flops / FLOP_RATE + calls * CALL_SECONDS`` with constants measured on one core of the
development machine (see their comments): a rough figure (a factor of a few either way),
enough to tell a job of minutes from one of days.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass

from .._memory import available_memory, human_bytes, human_seconds
from .config import ConfigError

__all__ = ["refusal", "Estimate", "guard", "available_memory", "FLOP_RATE", "CALL_SECONDS", "MAX_SECONDS"]

#: matrix-product throughput of one thread (flop/s).  Calibrated with the CPU time (user +
#: sys, one thread, start-up subtracted) of the jobs on the 2-core development machine:
#: train (2 epochs) 1.6e10 flop and 3.0e3 calls in 3.4 s; the small matrices of the
#: command's jobs run at a few 1e9 to 1e10 flop/s, large ones faster (opsplit grid: 9e10
#: flop in about 2.5 s), where the estimate is then on the high side
FLOP_RATE = 1e10
#: Python/dispatch overhead per operator evaluation (s): opsplit compare and opsplit solve
#: with their defaults, 6.1 s for 9.9e3 calls and 4.0 s for 6.5e3 calls (matrix work
#: negligible there), on the same machine
CALL_SECONDS = 6e-4
#: jobs estimated to take longer than this (s) need --force
MAX_SECONDS = 3600.0


@dataclass(frozen=True)
class Estimate:
    flops: float = 0.0
    calls: float = 0.0
    bytes: float = 0.0

    @property
    def seconds(self) -> float:
        return self.flops / FLOP_RATE + self.calls * CALL_SECONDS

    def __add__(self, other: Estimate) -> Estimate:
        # work adds up; memory: the larger peak (the parts run one after the other)
        return Estimate(self.flops + other.flops, self.calls + other.calls, max(self.bytes, other.bytes))

    def times(self, k: float) -> Estimate:
        """``k`` repetitions (same peak memory)."""
        return Estimate(self.flops * k, self.calls * k, self.bytes)


def _clamped(value, default):
    """``value`` brought down to ``default`` (element-wise for lists, keeping the length)."""
    if isinstance(value, bool) or not isinstance(value, (int, float, list)):
        return default
    if isinstance(value, list):
        if not all(isinstance(x, (int, float)) for x in value) or not isinstance(default, list):
            return default
        top = max(default)
        return [min(x, top) for x in value]
    if isinstance(default, (int, float)) and not isinstance(default, bool):
        return min(value, default)
    return default


def _culprits(schema: dict, cfg: dict, estimate: Callable, metric: Callable) -> list[str]:
    """The keys whose value brought down to its default lowers ``metric(estimate(cfg))`` the
    most (every key within a factor 10 of the best), best first."""
    base = metric(estimate(cfg))
    gains = []
    for section, keys in schema.items():
        for key, field in keys.items():
            value = cfg[section][key]
            lower = _clamped(value, field.default)
            if lower == value:
                continue
            trial = copy.deepcopy(cfg)
            trial[section][key] = lower
            try:
                m = metric(estimate(trial))
            except (ConfigError, ValueError, ZeroDivisionError, OverflowError):
                continue
            if m < base:
                name = f"--{key}" if section == "-" else f"{section}.{key}"
                gains.append((base / max(m, 1e-300), f"{name} = {value!r}"))
    if not gains:
        return []
    gains.sort(reverse=True)
    best = gains[0][0]
    return [name for g, name in gains if g >= best / 10 and g > 1.5]


def refusal(job: str, schema: dict, cfg: dict, estimate: Callable, *, memory: float | None = None,
            est: Estimate | None = None) -> str | None:
    """Why :func:`guard` refuses ``cfg`` (its message, naming the key(s) responsible), or
    ``None`` when its estimate fits the available memory and :data:`MAX_SECONDS`."""
    est = estimate(cfg) if est is None else est
    memory = available_memory() if memory is None else memory
    limits = [  # (metric, limit, what is needed, what it exceeds)
        (lambda e: e.bytes, memory, f"{human_bytes(est.bytes)} of memory at its peak",
         f"the {human_bytes(memory)} available; expected a smaller value (or --force to try anyway)"),
        (lambda e: e.seconds, MAX_SECONDS,
         f"{human_seconds(est.seconds)} of compute ({est.flops:.2g} flop, {est.calls:.2g} operator calls)",
         f"the {human_seconds(MAX_SECONDS)} the command runs without asking; expected a smaller "
         f"value (or --force to run it anyway)"),
    ]
    for metric, limit, needed, exceeded in limits:
        if metric(est) > limit:
            names = _culprits(schema, cfg, estimate, metric) if schema else []
            return f"{', '.join(names) or job}: the job needs an estimated {needed}, more than {exceeded}"
    return None


def guard(job: str, schema: dict, cfg: dict, estimate: Callable, force: bool = False,
          *, memory: float | None = None) -> Estimate:
    """``estimate(cfg)``, or :class:`ConfigError` when it exceeds the available memory or
    :data:`MAX_SECONDS` and not ``force``; the message names the key(s) responsible."""
    est = estimate(cfg)
    if force:
        return est
    msg = refusal(job, schema, cfg, estimate, memory=memory, est=est)
    if msg is not None:
        raise ConfigError(msg)
    return est
