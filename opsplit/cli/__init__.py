"""The ``opsplit`` command: the jobs of a user of opsplit, each writing its tables (CSV and
Markdown), plots (PNG) and a report (Markdown and HTML) into an output folder.

    opsplit                      the embedded default job (under a minute on 2 idle CPU cores)
    opsplit solve ...            a seeded continuous transformer at given N_t, N_x, N_y, schemes
    opsplit compare ...          Lie / Strang / parallel / hybrid: error vs cost, orders
    opsplit convert ...          torch / Hugging Face models -> opsplit, error tables
    opsplit train ...            training as an optimal-control problem (resumable)
    opsplit generate FOLDER ...  sample text from a run of opsplit train with task = "text"
    opsplit report FOLDER        (re)assemble a folder's tables and plots into a report
    opsplit grid                 nested-grid convergence of the paper's scheme (text)

Each job reads a small TOML config (``--config``) and/or flags; the config is checked
against the job's schema, its keys against each other and its size against the machine
(:mod:`opsplit.cli.budget`) before anything is written (:mod:`opsplit.cli.config`).  The
CLI has no math of its own: it calls the library and writes what it returns.

Torch runs on one thread with ``OMP_WAIT_POLICY=PASSIVE`` unless ``--threads N`` or
``OPSPLIT_THREADS`` says otherwise (:mod:`opsplit.cli.threads`); this module does not
import torch, so that those settings are in place when torch loads.
"""

from __future__ import annotations

import importlib
import sys

from . import threads
from .config import ConfigError

__all__ = ["main", "ConfigError", "COMMANDS", "Output", "new_folder", "build_parser", "grid_study"]


def main(argv=None) -> int:
    """Entry point of the ``opsplit`` console script and ``python -m opsplit``; returns the
    exit status: 0, 2 for a usage or config error (one line on stderr, nothing written),
    130 for an interrupt (``opsplit train`` saves a checkpoint first and prints how to
    resume)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        threads.requested(argv)  # a bad --threads / OPSPLIT_THREADS: before anything loads
    except ConfigError as e:
        print(f"opsplit: error: {e}", file=sys.stderr)
        return 2
    with threads.configured(argv):
        # loads torch: after the thread settings are in place (see the docstring)
        from .app import run

        return run(argv)


_LAZY = {"COMMANDS": "app", "build_parser": "app", "grid_study": "grid", "Output": "output",
         "new_folder": "output"}


def __getattr__(name: str):
    # torch-importing parts load on first use (see the module docstring)
    if name in _LAZY:
        return getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
