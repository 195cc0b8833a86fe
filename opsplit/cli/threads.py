"""Torch's CPU threads for the ``opsplit`` command, chosen before torch is loaded.

The command's jobs are many small tensor operations (grids of tens of nodes, a digits
model of width 32); torch's default of one thread per core, with OpenMP's spinning wait
between parallel regions, makes them several times slower as soon as anything else runs on
the machine (the measurements and their command, ``benchmarks/cli_threads.py``:
docs/getting_started.md#threads).
So the command runs torch on **one thread** with ``OMP_WAIT_POLICY=PASSIVE`` by default;
``--threads N`` or ``OPSPLIT_THREADS=N`` choose another count, and an ``OMP_NUM_THREADS``
of the caller's environment is kept when neither is given.

``OMP_NUM_THREADS``, ``MKL_NUM_THREADS`` and ``OMP_WAIT_POLICY`` are read once, when torch's
OpenMP runtime loads; :func:`configured` sets them when torch is not loaded yet (the
command's own process: ``import opsplit`` and ``import opsplit.cli`` do not import torch)
and otherwise (``main(argv)`` called from a Python session that already imported torch)
sets the count with ``torch.set_num_threads`` for the duration of the call only.
"""

from __future__ import annotations

import os
import sys
from contextlib import contextmanager

from .config import ConfigError

__all__ = ["DEFAULT_THREADS", "ENV", "requested", "configured", "apply_late", "describe"]

#: torch threads of the command when neither --threads, OPSPLIT_THREADS nor OMP_NUM_THREADS is set
DEFAULT_THREADS = 1
#: the environment variable that sets the command's thread count
ENV = "OPSPLIT_THREADS"
_MAX = 4096


def _parse(value: str, name: str) -> int:
    try:
        n = int(str(value).strip())
    except ValueError:
        raise ConfigError(f"{name}: expected a number of threads (an integer >= 1), got {value!r}") from None
    if not 1 <= n <= _MAX:
        raise ConfigError(f"{name}: expected a number of threads from 1 to {_MAX}, got {n}")
    return n


def _scan(argv: list[str]) -> str | None:
    """The value of ``--threads N`` / ``--threads=N`` in ``argv`` (the last one), else None."""
    found = None
    for i, a in enumerate(argv):
        if a == "--":
            break
        if a == "--threads":
            if i + 1 >= len(argv) or argv[i + 1].startswith("--"):
                raise ConfigError("--threads: expected a number of threads (an integer >= 1), got nothing")
            found = argv[i + 1]
        elif a.startswith("--threads="):
            found = a.split("=", 1)[1]
    return found


def requested(argv: list[str], environ=None) -> tuple[int | None, str]:
    """``(threads, source)``: ``--threads`` in ``argv``, else ``OPSPLIT_THREADS``, else
    ``(None, "OMP_NUM_THREADS")`` when the caller set that (torch reads it), else
    :data:`DEFAULT_THREADS`.  Raises :class:`ConfigError` naming the flag or variable."""
    environ = os.environ if environ is None else environ
    flag = _scan(argv)
    if flag is not None:
        return _parse(flag, "--threads"), "--threads"
    if environ.get(ENV, "").strip():
        return _parse(environ[ENV], ENV), ENV
    if environ.get("OMP_NUM_THREADS", "").strip():
        return None, "OMP_NUM_THREADS"
    return DEFAULT_THREADS, "default"


@contextmanager
def configured(argv: list[str]):
    """Apply :func:`requested` for the body of the ``with`` (see the module docstring)."""
    n, source = requested(argv)
    if "torch" not in sys.modules:
        # the command's own process: the OpenMP runtime reads these when torch loads
        os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
        if n is not None:
            os.environ["OMP_NUM_THREADS"] = os.environ["MKL_NUM_THREADS"] = str(n)
        yield n, source
        return
    # already loaded by the caller (this module must not load it: see the docstring)
    import torch

    before = torch.get_num_threads()
    if n is not None and n != before:
        torch.set_num_threads(n)
    try:
        yield n, source
    finally:
        if torch.get_num_threads() != before:
            torch.set_num_threads(before)


def apply_late(n: int) -> None:
    """Set ``n`` threads after torch has loaded (a ``--threads`` that :func:`requested`
    did not see, e.g. abbreviated: the count applies, the wait policy is torch's)."""
    n = _parse(n, "--threads")
    # loaded by now (called after the parser); this module must not load it at import
    import torch

    if torch.get_num_threads() != n:
        torch.set_num_threads(n)


def describe() -> str:
    """The threads the jobs ran with, for reports: ``"1 torch thread (OMP_WAIT_POLICY=PASSIVE)"``."""
    # loaded by now (a job runs); this module must not load it at import
    import torch

    n = torch.get_num_threads()
    policy = os.environ.get("OMP_WAIT_POLICY", "torch's default")
    return f"{n} torch thread{'s' if n != 1 else ''} (OMP_WAIT_POLICY={policy})"
