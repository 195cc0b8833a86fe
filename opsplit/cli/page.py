"""The report a person reads: ``report.html`` and ``report.md`` of an output folder.

The page leads with its findings (:mod:`opsplit.cli.findings`: sentences computed from
the page's own tables, each linking to the table or plot it comes from), then one section
per heading of the manifest: its first paragraph, its plots in a grid (two to a row on a
laptop screen, a wide plot across the row), its other paragraphs, then its tables folded
(HTML ``<details>``; the few-row tables the findings summarise unfolded) with their CSV
files linked.  ``report.md`` has the same order with every table at the end.

``report.html`` is one self-contained file: the plots are embedded (``data:`` URLs; each
links to its PNG in the folder), the style and the one small script (unfolding a table a
link points into) are inline, so the page works when the folder is moved or zipped, or
the file is sent alone.  It has a title, a table of contents, and print styles (plots two
to a row, nothing split across pages, folded tables printed as their titles).
"""

from __future__ import annotations

import base64
import html
import re
import struct
from dataclasses import dataclass, field
from pathlib import Path

from .findings import HOW, collect
from .tables import cell, markdown_table, note_lines, read_csv

__all__ = ["Table", "Figure", "Page", "build", "render"]


@dataclass
class Table:
    """A table of the page: its CSV file's columns and rows (text, as written)."""

    file: str
    title: str
    columns: list
    rows: list
    anchor: str
    kind: str = ""
    notes: dict = field(default_factory=dict)
    key: bool = False

    def number(self, row: dict, column: str) -> float:
        """The cell as a float (NaN when empty or not a number)."""
        try:
            return float(row.get(column, ""))
        except (TypeError, ValueError):
            return float("nan")


@dataclass
class Figure:
    file: str
    caption: str
    anchor: str
    kind: str = ""


@dataclass
class Section:
    heading: str
    anchor: str
    blocks: list  # the manifest's blocks, tables and figures replaced by Table / Figure


@dataclass
class Page:
    """What a report shows: the lead (blocks before the first heading) and the sections;
    the findings read it through :meth:`table`, :meth:`figure` and :meth:`note`."""

    folder: Path
    title: str
    lead: list
    sections: list

    @property
    def tables(self) -> list:
        return [b for s in self.sections for b in s.blocks if isinstance(b, Table)] + \
            [b for b in self.lead if isinstance(b, Table)]

    @property
    def figures(self) -> list:
        return [b for s in self.sections for b in s.blocks if isinstance(b, Figure)] + \
            [b for b in self.lead if isinstance(b, Figure)]

    def table(self, kind: str):
        """The first table of this kind, or ``None``."""
        return next((t for t in self.tables if t.kind == kind), None)

    def figure(self, kind: str):
        """The file of the first figure of this kind, or ``None``."""
        return next((f.file for f in self.figures if f.kind == kind), None)

    def note(self, anchor: str):
        """The text block named ``anchor`` (``Output.text(..., anchor=...)``), or ``None``."""
        for s in self.sections:
            for b in s.blocks:
                if isinstance(b, dict) and b.get("anchor") == anchor:
                    return b
        return None

    def anchor_of(self, file: str):
        """The HTML id of the table or figure written to ``file`` (or of a named paragraph)."""
        for b in self.tables + self.figures:
            if b.file == file:
                return b.anchor
        return file if self.note(file) is not None else None


def _slug(text: str, prefix: str, used: set) -> str:
    base = prefix + (re.sub(r"[^A-Za-z0-9]+", "-", text).strip("-").lower() or "x")
    a, k = base, 1
    while a in used:
        k += 1
        a = f"{base}-{k}"
    used.add(a)
    return a


def build(folder, title: str, blocks: list) -> Page:
    """The page of a manifest's blocks: tables read (a missing file is left out), figures
    whose file exists, and an HTML id for each section, table and figure."""
    folder = Path(folder)
    used = {"findings", "contents", "tables"} | {b["anchor"] for b in blocks if b.get("anchor")}
    lead, sections, cur = [], [], None
    for b in blocks:
        t = b["type"]
        if t == "heading":
            cur = Section(b["text"], _slug(b["text"], "s-", used), [])
            sections.append(cur)
            continue
        item = b
        if t == "table":
            p = folder / b["file"]
            if not p.is_file():
                continue
            cols, rows = read_csv(p)
            item = Table(b["file"], b.get("title", ""), cols, rows, _slug(b["file"].rsplit(".", 1)[0], "t-", used),
                         b.get("kind", ""), dict(b.get("notes", {})), bool(b.get("key", False)))
        elif t == "figure":
            if not (folder / b["file"]).is_file():
                continue
            item = Figure(b["file"], b.get("caption", ""), _slug(b["file"].rsplit(".", 1)[0], "f-", used),
                          b.get("kind", ""))
        if cur is None and t in ("table", "figure"):  # results before any heading
            cur = Section("Results", _slug("Results", "s-", used), [])
            sections.append(cur)
        (lead if cur is None else cur.blocks).append(item)
    return Page(folder, title, lead, sections)


# -- HTML ----------------------------------------------------------------------------------
_CSS = """
body{font:15px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,Helvetica,Arial,sans-serif;color:#222;
 max-width:1200px;margin:0 auto;padding:.5em 1.5em 3em}
h1{font-size:1.6em;margin:.6em 0 .3em}h2{font-size:1.3em;margin:1.6em 0 .5em;border-bottom:1px solid #ddd;
 padding-bottom:.15em}h3{font-size:1.05em}
p,li,figcaption,summary{overflow-wrap:anywhere}
nav.toc{background:#f5f5f5;border-radius:4px;padding:.4em .8em;margin:.8em 0}
nav.toc ol{display:flex;flex-wrap:wrap;gap:.2em 1.4em;list-style:none;margin:.2em 0 0;padding:0}
section.findings{background:#f4f8fc;border:1px solid #cfe0ef;border-radius:4px;padding:.2em 1em .6em}
section.findings h2{border:0;margin-top:.5em}section.findings ul{padding-left:1.2em;margin:.3em 0}
section.findings li{margin:.35em 0}p.how{font-size:85%;color:#555;margin:.3em 0}
a.ref{font-size:85%;white-space:nowrap}
.figs{display:grid;grid-template-columns:repeat(auto-fill,minmax(min(100%,480px),1fr));gap:1em 1.2em;
 align-items:start;margin:1em 0}
.figs figure.wide{grid-column:1/-1}figure{margin:0}
figure img{display:block;max-width:100%;height:auto;border:1px solid #eee}
figcaption{font-size:88%;color:#444;margin-top:.2em}
p.note{background:#fafaf2;border-left:3px solid #cc9;padding:.4em .8em;font-size:93%}
details{border:1px solid #ddd;border-radius:4px;padding:.3em .7em;margin:.5em 0}
summary{cursor:pointer}summary .meta{color:#555;font-size:90%}
.tw{overflow-x:auto}
table{border-collapse:collapse;margin:.5em 0;font-size:88%}
td,th{border:1px solid #bbb;padding:2px 8px;text-align:right;white-space:nowrap}th{background:#eee}
p.empty{font-size:88%;color:#444;margin:.2em 0}
pre{background:#f4f4f4;padding:.5em;overflow-x:auto}code{background:#f2f2f2;padding:0 .2em}
p.files{font-size:90%}
@media print{
 body{max-width:none;padding:0;font-size:10.5pt}nav.toc{display:none}
 .figs{grid-template-columns:1fr 1fr}figure,tr,section.findings li{break-inside:avoid}
 h2,h3{break-after:avoid}a{color:inherit;text-decoration:none}
 details:not([open])>summary::after{content:" (folded; the CSV file holds it)";color:#777}
}
"""

# a link into a folded table unfolds it (also for browsers that do not do so themselves)
_JS = """
(function(){function u(){var h=decodeURIComponent(location.hash.slice(1));if(!h)return;
var e=document.getElementById(h);for(var d=e;d;d=d.parentElement){if(d.tagName==='DETAILS')d.open=true;}
if(e)e.scrollIntoView();}window.addEventListener('hashchange',u);window.addEventListener('DOMContentLoaded',u);})();
"""


def _inline(text: str) -> str:
    """Escaped text with `code` spans."""
    parts = html.escape(text).split("`")
    return "".join(f"<code>{p}</code>" if i % 2 else p for i, p in enumerate(parts))


def _png_size(data: bytes):
    if data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) >= 24:
        return struct.unpack(">II", data[16:24])
    return None


def _figure_html(page: Page, f: Figure) -> str:
    data = (page.folder / f.file).read_bytes()
    size = _png_size(data)
    wide = size is not None and size[0] >= 2 * size[1]
    src = "data:image/png;base64," + base64.b64encode(data).decode("ascii") if size else html.escape(f.file)
    dims = f" width='{size[0]}' height='{size[1]}'" if size else ""
    cap = _inline(f.caption) + (" " if f.caption else "")
    return (f"<figure id='{f.anchor}'{' class=wide' if wide else ''}>"
            f"<a href='{html.escape(f.file)}'><img src='{src}' alt='{html.escape(f.caption or f.file)}'"
            f" data-file='{html.escape(f.file)}'{dims}></a>"
            f"<figcaption>{cap}<span class=meta>({html.escape(f.file)})</span></figcaption></figure>")


def _table_html(t: Table, max_rows: int) -> str:
    rows = t.rows[:max_rows]
    more = len(t.rows) - len(rows)
    n = len(t.rows)
    title = _inline(t.title) if t.title else html.escape(t.file)
    out = [f"<details id='{t.anchor}' class=table{' open' if t.key else ''}>"
           f"<summary><b>{title}</b> <span class=meta>({n} row{'s' if n != 1 else ''} · "
           f"<a href='{html.escape(t.file)}'>{html.escape(t.file)}</a>)</span></summary>",
           "<div class=tw><table><thead><tr>" + "".join(f"<th>{html.escape(c)}</th>" for c in t.columns)
           + "</tr></thead><tbody>"]
    for r in rows:
        out.append("<tr>" + "".join(f"<td>{html.escape(cell(r.get(c, ''), c, t.notes))}</td>"
                                    for c in t.columns) + "</tr>")
    out.append("</tbody></table></div>")
    out += [f"<p class=empty>{html.escape(line)}</p>" for line in note_lines(t.columns, t.rows, t.notes)]
    if more > 0:
        out.append(f"<p class=empty>({more} more rows in <a href='{html.escape(t.file)}'>"
                   f"{html.escape(t.file)}</a>)</p>")
    out.append("</details>")
    return "\n".join(out)


def _text_html(b: dict) -> str:
    if b["type"] == "code":
        return f"<pre>{html.escape(b['text'])}</pre>"
    if b["type"] == "files":
        links = ", ".join(f"<a href='{html.escape(f)}'>{html.escape(f)}</a>" for f in b["files"])
        return f"<p class=files>{_inline(b['text'])}{': ' if b['text'] else ''}{links}</p>"
    if b.get("anchor"):
        return f"<p id='{b['anchor']}' class=note>{_inline(b['text'])}</p>"
    return f"<p>{_inline(b['text'])}</p>"


def _arranged(blocks: list):
    """A section's blocks in the page's order: the first paragraph, the plots, the other
    paragraphs, the tables (those the findings summarise first), the linked files."""
    texts = [b for b in blocks if isinstance(b, dict) and b["type"] in ("text", "code")]
    figs = [b for b in blocks if isinstance(b, Figure)]
    tables = sorted((b for b in blocks if isinstance(b, Table)), key=lambda t: not t.key)  # key tables first
    files = [b for b in blocks if isinstance(b, dict) and b["type"] == "files"]
    return texts[:1], figs, texts[1:], tables, files


def _links(page: Page, finding, md: bool) -> str:
    out = []
    for f in (finding.target, *finding.also):
        a = page.anchor_of(f) if f else None
        if a is None:
            continue
        what = "plot" if f.endswith(".png") else "table" if f.endswith(".csv") else "note"
        out.append(f"[{what}](#{a})" if md else f"<a class=ref href='#{a}'>{what}</a>")
    if not out:
        return ""
    return " (" + ", ".join(out) + ")" if md else " " + " · ".join(out)


def _html(page: Page, findings: list, how: str, max_rows: int) -> str:
    t = html.escape(page.title)
    h = ["<!doctype html>", "<html lang=en><head><meta charset='utf-8'>",
         "<meta name=viewport content='width=device-width, initial-scale=1'>",
         f"<title>{t}</title><style>{_CSS}</style></head><body>", f"<header><h1>{t}</h1>"]
    h += [_text_html(b) for b in page.lead if isinstance(b, dict)]
    h.append("</header>")
    toc = ([("findings", "Findings")] if findings else []) + [(s.anchor, s.heading) for s in page.sections]
    if toc:
        h.append("<nav class=toc id=contents aria-label='Contents'><b>Contents</b><ol>"
                 + "".join(f"<li><a href='#{a}'>{html.escape(x)}</a></li>" for a, x in toc) + "</ol></nav>")
    if findings:
        h.append("<section id=findings class=findings><h2>Findings</h2><ul>")
        h += [f"<li>{html.escape(f.text)}{_links(page, f, False)}</li>" for f in findings]
        h.append(f"</ul><p class=how>{_inline(how)}</p></section>")
    for s in page.sections:
        first, figs, texts, tables, files = _arranged(s.blocks)
        h.append(f"<section id='{s.anchor}'><h2>{html.escape(s.heading)}</h2>")
        h += [_text_html(b) for b in first]
        if figs:
            h.append("<div class=figs>" + "".join(_figure_html(page, f) for f in figs) + "</div>")
        h += [_text_html(b) for b in texts]
        h += [_table_html(x, max_rows) for x in tables]
        h += [_text_html(b) for b in files]
        h.append("</section>")
    h.append(f"<script>{_JS}</script></body></html>")
    return "\n".join(h)


# -- Markdown ------------------------------------------------------------------------------
def _text_md(b: dict) -> list:
    if b["type"] == "code":
        return ["```", b["text"], "```", ""]
    if b["type"] == "files":
        links = ", ".join(f"[{f}]({f})" for f in b["files"])
        return [f"{b['text']}{': ' if b['text'] else ''}{links}", ""]
    anchor = [f'<a id="{b["anchor"]}"></a>', ""] if b.get("anchor") else []
    return anchor + [b["text"], ""]


def _markdown(page: Page, findings: list, how: str, max_rows: int) -> str:
    md = [f"# {page.title}", ""]
    for b in page.lead:
        if isinstance(b, dict):
            md += _text_md(b)
    toc = ([("findings", "Findings")] if findings else []) + [(s.anchor, s.heading) for s in page.sections]
    has_tables = bool(page.tables)
    toc += [("tables", "Tables")] if has_tables else []
    if toc:
        md += ["**Contents:** " + " · ".join(f"[{x}](#{a})" for a, x in toc), ""]
    if findings:
        md += ['<a id="findings"></a>', "", "## Findings", ""]
        md += [f"- {f.text}{_links(page, f, True)}" for f in findings]
        md += ["", f"*{how}*", ""]
    for s in page.sections:
        first, figs, texts, tables, files = _arranged(s.blocks)
        md += [f'<a id="{s.anchor}"></a>', "", f"## {s.heading}", ""]
        for b in first:
            md += _text_md(b)
        for f in figs:
            md += [f'<a id="{f.anchor}"></a>', "", f"![{f.caption}]({f.file})", ""]
            md += [f"*{f.caption}*", ""] if f.caption else []
        for b in texts:
            md += _text_md(b)
        if tables:
            md += ["Tables: " + ", ".join(f"[{x.title or x.file}](#{x.anchor}) ([{x.file}]({x.file}))"
                                          for x in tables), ""]
        for b in files:
            md += _text_md(b)
    if has_tables:
        md += ['<a id="tables"></a>', "", "## Tables", ""]
        for s in [None, *page.sections]:
            tables = [b for b in (page.lead if s is None else s.blocks) if isinstance(b, Table)]
            if not tables:
                continue
            if s is not None:
                md += [f"### {s.heading}", ""]
            for x in tables:
                rows = x.rows[:max_rows]
                more = len(x.rows) - len(rows)
                md += [f'<a id="{x.anchor}"></a>', ""]
                md += [f"**{x.title}** ([{x.file}]({x.file}))" if x.title else f"[{x.file}]({x.file})", ""]
                md += [markdown_table(x.columns, rows, x.notes), ""]
                md += [line for note in note_lines(x.columns, x.rows, x.notes) for line in (note, "")]
                if more > 0:
                    md += [f"({more} more rows in {x.file})", ""]
    return "\n".join(md)


def render(folder, title: str, blocks: list, max_rows: int = 60) -> tuple[str, str]:
    """``(report.md, report.html)`` of a manifest's blocks (see the module docstring)."""
    page = build(folder, title, blocks)
    findings = collect(page)
    return _markdown(page, findings, HOW, max_rows), _html(page, findings, HOW, max_rows)

