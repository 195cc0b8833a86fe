"""The cells and tables of the command's reports: numbers as the tables show them, Markdown
tables, CSV tables read back (for :mod:`opsplit.cli.output`, :mod:`opsplit.cli.page` and
:mod:`opsplit.cli.findings`, which all format the same numbers the same way)."""

from __future__ import annotations

import csv
import math

from .config import ConfigError

__all__ = ["fmt", "EMPTY", "is_nan", "cell", "note_lines", "markdown_table", "read_csv"]


def fmt(v) -> str:
    """A table cell: floats in 4 significant digits (scientific when small or large)."""
    if isinstance(v, bool) or v is None:
        return "" if v is None else str(v)
    if isinstance(v, str):  # a CSV cell: numbers are formatted like numbers
        try:
            int(v)
            return v
        except ValueError:
            pass
        try:
            v = float(v)
        except ValueError:
            return v
    if isinstance(v, float):
        if math.isnan(v):
            return "nan"
        if v == 0 or 1e-3 <= abs(v) < 1e5:
            return f"{v:.4g}"
        return f"{v:.3e}"
    return str(v)


#: what a table shows in a cell that is not a number for a reason the table states (a
#: confidence interval of a two-point fit, the error of the reference run itself)
EMPTY = "—"


def is_nan(v) -> bool:
    """A NaN cell, as a float or as its CSV text."""
    if isinstance(v, float):
        return math.isnan(v)
    return isinstance(v, str) and v.strip().lower() == "nan"


def cell(v, column: str = "", notes=None) -> str:
    """A table cell as shown: :func:`fmt`, and :data:`EMPTY` for a NaN in a column whose
    ``notes`` say why it is not a number."""
    if notes and column in notes and is_nan(v):
        return EMPTY
    return fmt(v)


def note_lines(columns, rows, notes) -> list[str]:
    """The sentences that explain the :data:`EMPTY` cells of a table: one per note that
    applies to a NaN cell, naming its columns."""
    if not notes:
        return []
    used: dict[str, list[str]] = {}
    for c in columns:
        if c in notes and any(is_nan(r.get(c)) for r in rows):
            used.setdefault(notes[c], []).append(c)
    return [f"{EMPTY} in {', '.join(cs)}: {why}" for why, cs in used.items()]


def _cell(v, column: str = "", notes=None) -> str:
    return cell(v, column, notes).replace("|", "\\|").replace("\n", " ")


def markdown_table(columns, rows, notes=None) -> str:
    """A Markdown table; ``notes`` (column -> why) show a NaN there as :data:`EMPTY`."""
    head = "| " + " | ".join(_cell(c) for c in columns) + " |"
    sep = "|" + "|".join("---" for _ in columns) + "|"
    body = ["| " + " | ".join(_cell(r.get(c), c, notes) for c in columns) + " |" for r in rows]
    return "\n".join([head, sep, *body])


def read_csv(path) -> tuple[list[str], list[dict]]:
    """The columns and rows of a CSV table; :class:`ConfigError` naming the file when it is
    not UTF-8 text or not CSV."""
    try:
        with open(path, newline="", encoding="utf-8") as fh:
            rd = csv.DictReader(fh)
            rows = list(rd)
            return list(rd.fieldnames or []), rows
    except UnicodeDecodeError as e:
        raise ConfigError(f"{path}: expected a CSV table (UTF-8 text), found byte {e.object[e.start]:#04x} "
                          f"at offset {e.start}") from None
    except csv.Error as e:
        raise ConfigError(f"{path}: expected a CSV table, {e}") from None
    except OSError as e:
        raise ConfigError(f"{path}: cannot read it ({e.strerror or e})") from None
