"""An output folder: tables (CSV + Markdown), plots (PNG) and a report (Markdown + HTML)
that embeds them.

Each run appends blocks (headings, text, tables, figures, linked files) to a manifest
(``manifest.json``); :func:`write_report` turns the manifest of a folder into
``report.md`` and ``report.html`` (:mod:`opsplit.cli.page`: findings first, computed from
the tables by :mod:`opsplit.cli.findings`, then each section's plots, its tables folded).
A folder without a manifest (or with CSV/PNG files the manifest does not list) gets them
listed in file-name order.
"""

from __future__ import annotations

import csv
import datetime as _dt
import json
import os
import re
from pathlib import Path

from .config import ConfigError
from .page import render
from .tables import cell, fmt, markdown_table, note_lines, read_csv

__all__ = ["Output", "new_folder", "check_out", "write_report", "markdown_table", "read_csv", "fmt", "cell"]

MANIFEST = "manifest.json"


def check_writable_folder(path, name: str) -> None:
    """:class:`ConfigError` naming ``name`` unless ``path`` is a folder, or can be created as
    one, in which files can be written: the trainer's check of its output folder
    (:func:`opsplit.control.paths.check_out_dir`, which leaves nothing behind), as a
    command-line error."""
    # opsplit.control loads torch, which writing a report (opsplit report) does not need
    from ..control.paths import check_out_dir

    try:
        check_out_dir(path, name)
    except (TypeError, ValueError) as e:
        raise ConfigError(str(e)) from None


def check_out(out, name: str = "--out") -> None:
    """The output folder ``out`` (``None``: ``opsplit-runs/`` under the current folder) can
    be written; see :func:`check_writable_folder`."""
    check_writable_folder(Path("opsplit-runs") if out is None else out,
                          name if out is not None else "output folder opsplit-runs/ (no --out)")


def new_folder(kind: str, out: str | None = None) -> Path:
    """``out`` if given (created; may exist, e.g. to resume), else a fresh
    ``opsplit-runs/<kind>-<UTC time>`` under the current directory."""
    if out is not None:
        p = Path(out)
    else:
        stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%d-%H%M%S")
        p = Path("opsplit-runs") / f"{kind}-{stamp}"
        k = 1
        while p.exists():
            k += 1
            p = Path("opsplit-runs") / f"{kind}-{stamp}-{k}"
    p.mkdir(parents=True, exist_ok=True)
    return p


class Output:
    """The results of one run in ``folder``."""

    def __init__(self, folder, title: str, *, append: bool = False):
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        path = self.folder / MANIFEST
        if append and path.is_file():
            title, blocks = read_manifest(path)
            self.manifest = {"title": title, "blocks": blocks}
        else:
            self.manifest = {"title": title, "blocks": []}
        self._save()

    def _save(self):
        (self.folder / MANIFEST).write_text(json.dumps(self.manifest, indent=1))

    def _add(self, block):
        self.manifest["blocks"].append(block)
        self._save()

    def heading(self, text: str):
        self._add({"type": "heading", "text": text})

    def text(self, text: str, *, anchor: str | None = None, summary: str | None = None):
        """A paragraph; ``anchor`` names it (a finding links to it, ``#anchor``) and
        ``summary`` is its gist in a few words, for a finding that cites it."""
        b = {"type": "text", "text": text}
        if anchor is not None:
            b["anchor"] = _anchor_name(anchor, "anchor")
        if summary is not None:
            b["summary"] = summary
        self._add(b)

    def code(self, text: str):
        self._add({"type": "code", "text": text})

    def table(self, name: str, rows: list[dict], columns=None, title: str = "", *,
              kind: str | None = None, notes: dict | None = None, key: bool = False) -> Path:
        """Write ``name.csv`` and ``name.md``; the report shows the table.

        ``kind`` says what the table is (``"comparison"``, ``"orders"``, ...): the report's
        findings (:mod:`opsplit.cli.findings`) are computed from the tables of the kinds
        they know.  ``notes`` (column -> a sentence) explain the NaN cells of a column: the
        report shows them as "—" and the sentence under the table.  ``key``: a table the
        report shows unfolded (a few rows that the findings summarise); the others are
        folded."""
        columns = list(columns or (rows[0].keys() if rows else []))
        path = self.folder / f"{name}.csv"
        with open(path, "w", newline="") as fh:
            w = csv.DictWriter(fh, fieldnames=columns, extrasaction="ignore")
            w.writeheader()
            for r in rows:
                w.writerow({c: r.get(c, "") for c in columns})
        md = (f"**{title}**\n\n" if title else "") + markdown_table(columns, rows, notes) + "\n"
        md += "".join(f"\n{line}\n" for line in note_lines(columns, rows, notes))
        (self.folder / f"{name}.md").write_text(md)
        b = {"type": "table", "file": path.name, "title": title}
        if kind is not None:
            b["kind"] = kind
        if notes:
            b["notes"] = {str(k): str(v) for k, v in notes.items()}
        if key:
            b["key"] = True
        self._add(b)
        return path

    def figure(self, fig, name: str, caption: str = "", *, kind: str | None = None) -> Path:
        """Save a matplotlib figure as ``name.png`` (and close it); ``kind`` names what it
        shows, for the findings that link to it."""
        # slow to import (about 1 s): loaded when a job draws
        import matplotlib.pyplot as plt

        path = self.folder / f"{name}.png"
        fig.savefig(path, dpi=DPI, bbox_inches="tight", pad_inches=0.08)  # a margin round the labels
        plt.close(fig)
        b = {"type": "figure", "file": path.name, "caption": caption}
        if kind is not None:
            b["kind"] = kind
        self._add(b)
        return path

    def link(self, file: str, caption: str = ""):
        """A figure written by someone else (a PNG in the folder), shown as a figure."""
        self._add({"type": "figure", "file": file, "caption": caption})

    def files(self, files, text: str = ""):
        """Files of the folder the report links to without showing them (e.g. the trainer's
        ``train/steps.csv``); ``text`` says what they are."""
        self._add({"type": "files", "files": [str(f) for f in files], "text": text})

    def finish(self) -> Path:
        return write_report(self.folder)


#: the resolution of the report's plots (dots per inch): about 700 x 500 pixels for a
#: 6.4 x 4.4 in figure, sharp in a two-column grid on a laptop screen
DPI = 110


def _anchor_name(name, what: str) -> str:
    if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z][A-Za-z0-9_-]*", name):
        raise ValueError(f"{what}: expected a name of letters, digits, '-' and '_' (an HTML id), got {name!r}")
    return name


#: block type -> its required string keys
_BLOCK_KEYS = {"heading": ("text",), "text": ("text",), "code": ("text",), "table": ("file",),
               "figure": ("file",), "files": ("text",)}


def _inside(f: str) -> bool:
    return not (Path(f).is_absolute() or ".." in Path(f).parts)


def read_manifest(path: Path) -> tuple[str, list[dict]]:
    """The title and blocks of a manifest, checked: :class:`ConfigError` naming the file and
    the entry that is not what :class:`Output` writes."""
    try:
        m = json.loads(path.read_bytes().decode("utf-8"))
    except UnicodeDecodeError as e:
        raise ConfigError(f"{path}: expected a manifest (UTF-8 JSON), found byte {e.object[e.start]:#04x} "
                          f"at offset {e.start}; remove the file to report the folder's CSV/PNG files") from None
    except json.JSONDecodeError as e:
        raise ConfigError(f"{path}: expected a manifest (JSON), {e}; remove the file to report the "
                          f"folder's CSV/PNG files") from None
    except OSError as e:
        raise ConfigError(f"{path}: cannot read it ({e.strerror or e})") from None
    if not isinstance(m, dict):
        raise ConfigError(f"{path}: expected a JSON object with 'title' and 'blocks', got {type(m).__name__}")
    title, blocks = m.get("title", "opsplit report"), m.get("blocks", [])
    if not isinstance(title, str):
        raise ConfigError(f"{path}: title: expected a string, got {title!r}")
    if not isinstance(blocks, list):
        raise ConfigError(f"{path}: blocks: expected a list, got {type(blocks).__name__}")
    for i, b in enumerate(blocks):
        where = f"{path}: blocks[{i}]"
        if not isinstance(b, dict) or b.get("type") not in _BLOCK_KEYS:
            raise ConfigError(f"{where}: expected an object whose type is one of "
                              f"{', '.join(map(repr, _BLOCK_KEYS))}, got {b!r}"[:300])
        for k in _BLOCK_KEYS[b["type"]]:
            if not isinstance(b.get(k), str):
                raise ConfigError(f"{where}.{k}: expected a string, got {b.get(k)!r}")
        for k in ("title", "caption", "kind", "summary"):
            if k in b and not isinstance(b[k], str):
                raise ConfigError(f"{where}.{k}: expected a string, got {b[k]!r}")
        if "anchor" in b:
            try:
                _anchor_name(b["anchor"], f"{where}.anchor")
            except ValueError as e:
                raise ConfigError(str(e)) from None
        if "notes" in b and not (isinstance(b["notes"], dict)
                                 and all(isinstance(v, str) for v in b["notes"].values())):
            raise ConfigError(f"{where}.notes: expected an object of column -> sentence, got {b['notes']!r}"[:300])
        if "key" in b and not isinstance(b["key"], bool):
            raise ConfigError(f"{where}.key: expected true or false, got {b['key']!r}")
        f = b.get("file")
        if f is not None and not _inside(f):
            raise ConfigError(f"{where}.file: expected a path inside the folder, got {f!r}")
        if b["type"] == "files":
            fs = b.get("files")
            if not isinstance(fs, list) or not all(isinstance(x, str) and _inside(x) for x in fs):
                raise ConfigError(f"{where}.files: expected a list of paths inside the folder, got {fs!r}"[:300])
    return title, list(blocks)


def _blocks(folder: Path) -> tuple[str, list[dict]]:
    path = folder / MANIFEST
    if path.is_file():
        title, blocks = read_manifest(path)
    else:
        title, blocks = f"opsplit report: {folder.name}", []
    listed = {b.get("file") for b in blocks} | {f for b in blocks for f in b.get("files", [])}
    extra_csv = sorted(p for p in folder.rglob("*.csv") if str(p.relative_to(folder)) not in listed)
    extra_png = sorted(p for p in folder.rglob("*.png") if str(p.relative_to(folder)) not in listed)
    if extra_csv or extra_png:
        blocks.append({"type": "heading", "text": "Other files in this folder"})
        blocks += [{"type": "table", "file": str(p.relative_to(folder)), "title": str(p.relative_to(folder))}
                   for p in extra_csv]
        blocks += [{"type": "figure", "file": str(p.relative_to(folder)), "caption": str(p.relative_to(folder))}
                   for p in extra_png]
    return title, blocks


def write_report(folder, max_rows: int = 60) -> Path:
    """Write ``report.md`` and ``report.html`` in ``folder`` from its manifest (see the
    module docstring; the page itself: :mod:`opsplit.cli.page`); returns the path of
    ``report.html``."""
    folder = Path(folder)
    if not folder.is_dir():
        raise FileNotFoundError(f"report: no such folder {str(folder)!r}")
    title, blocks = _blocks(folder)
    md, ht = render(folder, title, blocks, max_rows)
    (folder / "report.md").write_text(md)
    out = folder / "report.html"
    out.write_text(ht)
    return out


def relpath(p) -> str:
    """``p`` as the command shows it: an absolute path (an absolute ``--out``) as it is; a
    relative one relative to the current folder, or absolute if it leads out of it."""
    if Path(p).is_absolute():
        return str(p)
    try:
        r = os.path.relpath(p)
    except ValueError:  # pragma: no cover - another drive on Windows
        return str(p)
    return str(Path(p).resolve()) if r.startswith("..") else r
