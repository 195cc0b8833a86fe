"""An output folder: tables (CSV + Markdown), plots (PNG) and a report (Markdown + HTML)
that embeds them.

Each run appends blocks (headings, text, tables, figures) to a manifest
(``manifest.json``); :func:`write_report` turns the manifest of a folder into
``report.md`` and ``report.html``.  A folder without a manifest (or with CSV/PNG files
the manifest does not list) gets them listed in file-name order.
"""

from __future__ import annotations

import csv
import datetime as _dt
import html
import json
import math
import os
from pathlib import Path

from .config import ConfigError

__all__ = ["Output", "new_folder", "check_out", "write_report", "markdown_table", "read_csv", "fmt"]

MANIFEST = "manifest.json"


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


def _cell(v) -> str:
    return fmt(v).replace("|", "\\|").replace("\n", " ")


def markdown_table(columns, rows) -> str:
    head = "| " + " | ".join(_cell(c) for c in columns) + " |"
    sep = "|" + "|".join("---" for _ in columns) + "|"
    body = ["| " + " | ".join(_cell(r.get(c)) for c in columns) + " |" for r in rows]
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


def check_writable_folder(path, name: str) -> None:
    """:class:`ConfigError` naming ``name`` unless ``path`` is a folder, or can be created as
    one, in which files can be written: the trainer's check of its output folder
    (:func:`opsplit.control.paths.check_out_dir`, which leaves nothing behind), as a
    command-line error."""
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

    def text(self, text: str):
        self._add({"type": "text", "text": text})

    def code(self, text: str):
        self._add({"type": "code", "text": text})

    def table(self, name: str, rows: list[dict], columns=None, title: str = "") -> Path:
        """Write ``name.csv`` and ``name.md``; the report shows the table."""
        columns = list(columns or (rows[0].keys() if rows else []))
        path = self.folder / f"{name}.csv"
        with open(path, "w", newline="") as fh:
            w = csv.DictWriter(fh, fieldnames=columns, extrasaction="ignore")
            w.writeheader()
            for r in rows:
                w.writerow({c: r.get(c, "") for c in columns})
        md = (f"**{title}**\n\n" if title else "") + markdown_table(columns, rows) + "\n"
        (self.folder / f"{name}.md").write_text(md)
        self._add({"type": "table", "file": path.name, "title": title})
        return path

    def figure(self, fig, name: str, caption: str = "") -> Path:
        """Save a matplotlib figure as ``name.png`` (and close it)."""
        import matplotlib.pyplot as plt

        path = self.folder / f"{name}.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        self._add({"type": "figure", "file": path.name, "caption": caption})
        return path

    def link(self, file: str, caption: str = ""):
        """A figure written by someone else (e.g. the trainer's ``curves.png``)."""
        self._add({"type": "figure", "file": file, "caption": caption})

    def finish(self) -> Path:
        return write_report(self.folder)


#: block type -> its required string keys
_BLOCK_KEYS = {"heading": ("text",), "text": ("text",), "code": ("text",), "table": ("file",),
               "figure": ("file",)}


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
        for k in ("title", "caption"):
            if k in b and not isinstance(b[k], str):
                raise ConfigError(f"{where}.{k}: expected a string, got {b[k]!r}")
        f = b.get("file")
        if f is not None and (Path(f).is_absolute() or ".." in Path(f).parts):
            raise ConfigError(f"{where}.file: expected a path inside the folder, got {f!r}")
    return title, list(blocks)


def _blocks(folder: Path) -> tuple[str, list[dict]]:
    path = folder / MANIFEST
    if path.is_file():
        title, blocks = read_manifest(path)
    else:
        title, blocks = f"opsplit report: {folder.name}", []
    listed = {b.get("file") for b in blocks}
    extra_csv = sorted(p for p in folder.rglob("*.csv") if str(p.relative_to(folder)) not in listed)
    extra_png = sorted(p for p in folder.rglob("*.png") if str(p.relative_to(folder)) not in listed)
    if extra_csv or extra_png:
        blocks.append({"type": "heading", "text": "Other files in this folder"})
        blocks += [{"type": "table", "file": str(p.relative_to(folder)), "title": str(p.relative_to(folder))}
                   for p in extra_csv]
        blocks += [{"type": "figure", "file": str(p.relative_to(folder)), "caption": str(p.relative_to(folder))}
                   for p in extra_png]
    return title, blocks


_CSS = ("body{font-family:sans-serif;max-width:60em;margin:2em auto;padding:0 1em}"
        "table{border-collapse:collapse;margin:1em 0;font-size:90%}"
        "td,th{border:1px solid #bbb;padding:2px 8px;text-align:right}"
        "th{background:#eee}img{max-width:100%}pre{background:#f4f4f4;padding:.5em}")


def write_report(folder, max_rows: int = 60) -> Path:
    """Write ``report.md`` and ``report.html`` in ``folder`` from its manifest (see the
    module docstring); returns the path of ``report.html``."""
    folder = Path(folder)
    if not folder.is_dir():
        raise FileNotFoundError(f"report: no such folder {str(folder)!r}")
    title, blocks = _blocks(folder)
    md = [f"# {title}", ""]
    ht = [f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
          f"<style>{_CSS}</style></head><body>", f"<h1>{html.escape(title)}</h1>"]
    for b in blocks:
        t = b["type"]
        if t == "heading":
            md += [f"## {b['text']}", ""]
            ht.append(f"<h2>{html.escape(b['text'])}</h2>")
        elif t == "text":
            md += [b["text"], ""]
            ht.append(f"<p>{html.escape(b['text'])}</p>")
        elif t == "code":
            md += ["```", b["text"], "```", ""]
            ht.append(f"<pre>{html.escape(b['text'])}</pre>")
        elif t == "table":
            p = folder / b["file"]
            if not p.is_file():
                continue
            cols, rows = read_csv(p)
            more = len(rows) - max_rows
            rows = rows[:max_rows]
            if b.get("title"):
                md += [f"**{b['title']}** ([{b['file']}]({b['file']}))", ""]
                ht.append(f"<p><b>{html.escape(b['title'])}</b> "
                          f"(<a href='{html.escape(b['file'])}'>{html.escape(b['file'])}</a>)</p>")
            md += [markdown_table(cols, rows), ""]
            ht.append("<table><tr>" + "".join(f"<th>{html.escape(c)}</th>" for c in cols) + "</tr>")
            for r in rows:
                ht.append("<tr>" + "".join(f"<td>{html.escape(fmt(r.get(c, '')))}</td>" for c in cols)
                          + "</tr>")
            ht.append("</table>")
            if more > 0:
                md += [f"({more} more rows in {b['file']})", ""]
                ht.append(f"<p>({more} more rows in {html.escape(b['file'])})</p>")
        elif t == "figure":
            if not (folder / b["file"]).is_file():
                continue
            cap = b.get("caption", "")
            md += [f"![{cap}]({b['file']})", ""] + ([f"*{cap}*", ""] if cap else [])
            ht.append(f"<figure><img src='{html.escape(b['file'])}' alt='{html.escape(cap)}'>"
                      f"<figcaption>{html.escape(cap)}</figcaption></figure>")
    ht.append("</body></html>")
    (folder / "report.md").write_text("\n".join(md))
    out = folder / "report.html"
    out.write_text("\n".join(ht))
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
