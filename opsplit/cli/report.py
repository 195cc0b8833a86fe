"""``opsplit report``: assemble an output folder's tables (CSV) and plots (PNG) into
``report.md`` and ``report.html``."""

from __future__ import annotations

from pathlib import Path

from .config import ConfigError
from .output import check_writable_folder, write_report

NAME = "report"
SUMMARY = "assemble an output folder's CSV tables and PNG plots into a Markdown/HTML report"
EXAMPLE = """\
examples:
  opsplit report opsplit-runs/solve-20260101-120000
  opsplit report my-results/          # any folder of .csv and .png files
"""
SCHEMA = None


def add_arguments(p):
    p.add_argument("folder", help="the output folder of an opsplit run (or any folder of CSV/PNG)")


def run_report(a):
    folder = Path(a.folder)
    if not folder.is_dir():
        raise ConfigError(f"folder: expected an existing folder, got {str(folder)!r}")
    if not any(folder.rglob("*.csv")) and not any(folder.rglob("*.png")) \
            and not (folder / "manifest.json").is_file():
        raise ConfigError(f"folder: expected a folder with CSV tables or PNG plots, "
                          f"{str(folder)!r} has none")
    check_writable_folder(folder, "folder")  # report.md and report.html go there
    return write_report(folder)  # reads (and checks) every table before it writes
