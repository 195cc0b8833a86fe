"""``python -m opsplit``: the same as the ``opsplit`` command (:mod:`opsplit.cli`)."""

import sys

from .cli import main

__all__ = ["main", "grid_study"]  # noqa: F822 (grid_study: module __getattr__)


def __getattr__(name):
    # grid_study imports torch: loaded on first use, after main() has set torch's threads
    if name == "grid_study":
        from .cli.grid import grid_study

        return grid_study
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


if __name__ == "__main__":
    sys.exit(main())
