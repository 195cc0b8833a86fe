"""The memory a new allocation can take, for the size guards that refuse a job before it
allocates (:mod:`opsplit.cli.budget`, :meth:`opsplit.control.Trainer.evaluate`)."""

from __future__ import annotations

import math
import os

__all__ = ["available_memory", "human_bytes"]


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
