"""``python -m opsplit``: the same as the ``opsplit`` command (:mod:`opsplit.cli`)."""

import sys

from .cli import grid_study, main

__all__ = ["main", "grid_study"]

if __name__ == "__main__":
    sys.exit(main())
