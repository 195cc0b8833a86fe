"""The memory a new allocation can take, and the size guard that refuses a job before it
allocates (:mod:`opsplit.cli.budget`, :meth:`opsplit.Propagator.forward` and ``solve``,
:class:`opsplit.control.Trainer`): :func:`check_fits` raises a ``ValueError`` naming the
argument that makes the job too large, with the estimated memory (and work), instead of a
``MemoryError`` minutes into the job.

The estimates a guard compares are **lower bounds** of what the job holds at its peak (the
arrays it certainly keeps alive at once), so a job is refused only when it cannot fit;
:data:`GUARD_FROM` spares the small jobs even the read of ``/proc/meminfo``."""

from __future__ import annotations

import math
import os

__all__ = ["available_memory", "human_bytes", "human_seconds", "check_fits", "steps_memory", "FLOAT_LIST_ENTRY", "GUARD_FROM"]

#: bytes per entry of a Python list of floats (the float object, 24 bytes, and the list's
#: pointer to it): a time grid of N_t steps holds N_t + 1 of them
FLOAT_LIST_ENTRY = 32
#: estimates below this many bytes are never compared with the available memory (a job this
#: small always fits; the guard then costs a few arithmetic operations)
GUARD_FROM = 256e6


def available_memory() -> float:
    """Bytes of memory available to a new allocation: ``MemAvailable`` of /proc/meminfo,
    else the physical memory, else infinity (no memory guard)."""
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return float(line.split()[1]) * 1024.0
    except OSError:
        pass
    try:
        return float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return math.inf


def human_bytes(b: float) -> str:
    for unit, k in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if b >= k:
            return f"{b / k:.3g} {unit}" if b < 1e15 else f"{b:.2e} bytes"
    return f"{b:.0f} bytes"


def steps_memory(n_steps: int, *, state_bytes: float = 0.0, calls_per_step: int = 1, grad: bool = False,
                 stored_states: float | None = None, trajectory: bool = False) -> tuple[float, list[str]]:
    """A lower bound of the memory a time loop of ``n_steps`` steps holds at its peak, and its
    parts in words: the time grid (``n_steps + 1`` Python floats), the trajectory
    (``trajectory``: ``n_steps + 1`` states and their stacked copy), and for the backward
    pass (``grad``) one state per substep call of every step (``calls_per_step``), or
    ``stored_states`` states when the loop is checkpointed.  ``state_bytes``: one state."""
    n = int(n_steps)
    parts = [(FLOAT_LIST_ENTRY * (n + 1.0), f"a time grid of {n + 1} times")]
    if trajectory:
        parts.append((2.0 * (n + 1.0) * state_bytes, f"a trajectory of {n + 1} states"))
    if grad:
        kept = float(n) * calls_per_step if stored_states is None else float(stored_states)
        parts.append((kept * state_bytes, f"{kept:.3g} states of {human_bytes(state_bytes)} kept for the backward "
                                          "pass"))
    return sum(b for b, _ in parts), [f"{what}: {human_bytes(b)}" for b, what in parts if b]


def check_fits(name: str, need: float, what: str, expected: str, *, parts=(), work: str | None = None) -> None:
    """Raise a ``ValueError`` starting with ``name`` when ``need`` bytes (a lower bound of what
    the job ``what`` holds at its peak; ``parts``: its terms in words) exceed the available
    memory; ``work`` (e.g. ``"1e+12 substep calls"``) says how long the job would run,
    ``expected`` what to pass instead.  Nothing is read below :data:`GUARD_FROM` bytes."""
    if need < GUARD_FROM:
        return
    free = available_memory()
    if need > free:
        detail = f" ({'; '.join(parts)})" if parts else ""
        raise ValueError(f"{name}: {what}: at least {human_bytes(need)} of memory{detail}"
                         f"{f' and {work}' if work else ''} before the first step, more than the "
                         f"{human_bytes(free)} available; expected {expected}")


def human_seconds(s: float) -> str:
    if s >= 86400 * 365 * 100:
        return f"{s / (86400 * 365):.2e} years"
    for unit, k in (("days", 86400), ("hours", 3600), ("minutes", 60)):
        if s >= k:
            return f"{s / k:.3g} {unit}"
    return f"{s:.3g} s"
