"""The report a person reads (``report.html`` / ``report.md`` of the default job): findings
first and computed from the page's own tables, plots in a grid, tables folded with their
empty cells explained, one self-contained page -- checked by parsing it and in headless
Chromium (scripts/report_browser.py).

One ``opsplit --quick`` run serves every test here."""

from __future__ import annotations

import html
import math
import os
import re
import shutil
import sys
from html.parser import HTMLParser
from pathlib import Path

import pytest
from _helpers import csv_rows

from opsplit.cli import main

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
import report_browser  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def quick(tmp_path_factory):
    """The folder of one ``opsplit --quick`` run."""
    out = tmp_path_factory.mktemp("report") / "default"
    assert main(["--quick", "--out", str(out), "--no-progress"]) == 0
    return out


class _Page(HTMLParser):
    """The findings (text without their links) and the tables (cells by column) of a page."""

    def __init__(self):
        super().__init__()
        self.findings, self.tables, self.order = [], {}, []
        self._in_findings = self._li = self._ref = False
        self._details = None
        self._row = self._cell = None
        self._cols = []

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "section" and a.get("id") == "findings":
            self._in_findings = True
        elif tag == "li" and self._in_findings:
            self._li, self._text = True, ""
            self.findings.append({"text": "", "links": []})
        elif tag == "a" and self._li and "ref" in (a.get("class") or ""):
            self._ref = True
            self.findings[-1]["links"].append(a["href"])
        elif tag == "details":
            self._details = a.get("id")
            self.tables[self._details] = {"columns": [], "rows": [], "open": "open" in a}
        elif tag == "table":
            self.order.append(("table", self._details))
        elif tag in ("th", "td") and self._details:
            self._cell = ""
        elif tag == "tr" and self._details:
            self._row = []

    def handle_endtag(self, tag):
        if tag == "section" and self._in_findings:
            self._in_findings = False
            self.order.append(("findings", None))
        elif tag == "li" and self._li:
            self._li = False
            self.findings[-1]["text"] = self.findings[-1]["text"].strip().rstrip(" ·")
        elif tag == "a" and self._ref:
            self._ref = False
        elif tag == "details":
            self._details = None
        elif tag in ("th", "td") and self._cell is not None:
            t = self.tables[self._details]
            (t["columns"] if tag == "th" else self._row).append(self._cell)
            self._cell = None
        elif tag == "tr" and self._row is not None:
            t = self.tables[self._details]
            if self._row:
                t["rows"].append(dict(zip(t["columns"], self._row)))
            self._row = None

    def handle_data(self, data):
        if self._li and not self._ref:
            self.findings[-1]["text"] += data
        if self._cell is not None:
            self._cell += data


def _parse(folder) -> _Page:
    p = _Page()
    p.feed((folder / "report.html").read_text())
    return p


def _num(s: str) -> float:
    return float("nan") if s in ("", "—") else float(s)


def _met(order: str, hi: str, theory: str) -> bool:
    o, h, t = _num(order), _num(hi), _num(theory)
    return (o if math.isnan(h) else max(o, h)) >= t - 0.1


def _check_orders(findings: list, table: dict, label, prefix: str) -> None:
    """Every row of ``table`` appears once in the sentences that start with ``prefix``,
    with its order and theory as the table shows them, under the verdict its cells give."""
    seen = {}
    for f in findings:
        if not f["text"].startswith(prefix):
            continue
        verdict = "met" if f["text"].startswith(prefix + " met:") else "below"
        assert f["text"].startswith(f"{prefix} {verdict}:"), f["text"]
        for lab, order, theory in re.findall(r"([a-z_]+ / [a-z0-9]+) (\S+) \(theory (\d+)", f["text"]):
            assert lab not in seen, (lab, f["text"])
            seen[lab] = (order, theory, verdict)
    rows = {label(r): r for r in table["rows"]}
    assert set(seen) == set(rows), (sorted(seen), sorted(rows))
    for lab, (order, theory, verdict) in seen.items():
        r = rows[lab]
        assert (order, theory) == (r["order"], r["theory"]), (lab, order, theory, r)
        assert verdict == ("met" if _met(r["order"], r["ci95_high"], r["theory"]) else "below"), (lab, r)


def test_default_job_quick_writes_its_report(quick, capsys):
    out = quick
    md = (out / "report.md").read_text()
    assert "![" in md and "solve_convergence_time.png" in md  # a convergence plot
    assert "comparison.csv" in md  # the scheme comparison table
    schemes = {r["scheme"] for r in csv_rows(out / "comparison.csv")}
    assert schemes == {"lie", "strang", "parallel", "hybrid"}
    for f in ("solve_convergence_time.png", "solve_convergence_space.png", "error_vs_cost.png"):
        assert (out / f).stat().st_size > 1000
    # the training curve, once: the trainer's own plot of the same curves is linked, not shown
    assert "training_curve.png" in md and (out / "training_curve.png").stat().st_size > 1000
    assert "![" not in "".join(line for line in md.splitlines() if "curves.png" in line)
    assert "[train/curves.png](train/curves.png)" in md
    assert len(csv_rows(out / "train" / "steps.csv")) > 0
    assert "Other files in this folder" not in md  # every file is placed by the manifest


def test_findings_agree_with_the_tables(quick):
    """The sentences, parsed, against the tables of the same page, parsed: every scheme /
    solver's fitted order and verdict, the cheapest runs re-found in the every-run table,
    the training figures and the accuracy at each N_t."""
    page = _parse(quick)
    f = page.findings
    assert len(f) >= 5, f
    texts = [x["text"] for x in f]
    # orders in time: the scheme comparison
    _check_orders(f, page.tables["t-comparison"], lambda r: f"{r['scheme']} / {r['solver']}",
                  "Fitted order in Δt against theory,")
    below = next(t for t in texts if t.startswith("Fitted order in Δt against theory, below:"))
    assert "parallel / heun" in below and "1/K = 1/4 of the way back to S1" in below  # the page's reason
    # orders in space: the solve's fitted orders in max(dx, dy)
    orders = page.tables["t-solve-orders"]
    space = {"rows": [r for r in orders["rows"] if r["variable"] == "max(dx, dy)"]}
    assert len(space["rows"]) == 4
    _check_orders(f, space, lambda r: r["scheme / solver"],
                  "Fitted order in max(Δx, Δy) (grid error against the finest grid) against theory,")
    # the cheapest run at each error level, re-found in the every-run table
    cheap = next(t for t in texts if t.startswith("Cheapest run"))
    runs = [r for r in page.tables["t-compare-runs"]["rows"] if r["rel_error"] not in ("", "—")]
    errors = [float(r["rel_error"]) for r in runs]
    clauses = re.findall(r"((?:≤ 1e-?\d+(?: and )?)+): ([a-z_]+) / ([a-z0-9]+) at N_t = (\d+) \((\S+) s, error (\S+)\)",
                         cheap)
    assert clauses, cheap
    levels = [int(k) for c in clauses for k in re.findall(r"1e(-?\d+)", c[0])]
    assert levels == sorted(levels, reverse=True)
    assert all(min(errors) <= 10.0 ** k <= max(errors) for k in levels), (levels, min(errors), max(errors))
    for lv, scheme, solver, n_t, sec, err in clauses:
        for k in re.findall(r"1e(-?\d+)", lv):
            ok = [r for r in runs if float(r["rel_error"]) <= 10.0 ** int(k)]
            # the cheapest by the table's 4 significant digits: wall times that round alike
            # (their order depends on the machine's load) are all the cheapest run
            fastest = min(float(r["seconds"]) for r in ok)
            best = [(r["scheme"], r["solver"], r["n_t"], r["seconds"], r["rel_error"]) for r in ok
                    if float(r["seconds"]) == fastest]
            assert (scheme, solver, n_t, sec, err) in best, (k, best)
    # training: the history's first and last evaluated epoch
    hist = page.tables["t-train-epochs"]["rows"]
    m = re.search(r"after (\d+) optimizer steps \((\d+) epochs\) the test loss fell from (\S+) to (\S+) and "
                  r"the test accuracy rose from (\S+) to (\S+)\.", next(t for t in texts if t.startswith("Training:")))
    assert m.groups() == (hist[-1]["step"], str(len(hist)), hist[0]["eval_loss"], hist[-1]["eval_loss"],
                          hist[0]["eval_accuracy"], hist[-1]["eval_accuracy"])
    # the trained model on its training grid, at finer N_t and with other substep solvers (the
    # solver-swap table), and at coarser N_t
    ev = page.tables["t-continuity"]["rows"]
    acc = next(t for t in texts if t.startswith("The trained model scores"))
    trained = next(r for r in ev if r["training grid"] == "yes")
    assert (f"scores test accuracy {trained['accuracy']} on its training grid (N_t = {trained['n_t']}, "
            f"{trained['solver']} substeps)") in acc
    refined = [r for r in ev if r is not trained and int(r["n_t"]) >= int(trained["n_t"])]
    drops = {(r["solver"], r["n_t"]): float(trained["accuracy"]) - float(r["accuracy"]) for r in refined}
    worst = max(drops, key=drops.get)
    assert f"({len(refined)} settings)" in acc
    assert ("keeps that accuracy (within 0.02) at every one" in acc) == (drops[worst] <= 0.02)
    assert (f"({worst[0]} at N_t = {worst[1]}), {abs(100 * drops[worst]):.2f} pt "
            f"{'below' if drops[worst] > 0 else 'above'} the training grid") in acc
    coarser = dict((n, a) for n, a in re.findall(r"at the coarser (?:N_t = (\d+) it scores (\S+?)(?:,|\.$))", acc))
    assert coarser == {r["n_t"]: r["accuracy"] for r in ev if int(r["n_t"]) < int(trained["n_t"])
                       and r["solver"] == trained["solver"]}
    # every sentence links to a table of the page; the Markdown says the same
    for x in f:
        assert any(a[1:] in page.tables for a in x["links"]), x
    md = (quick / "report.md").read_text()
    for t in texts:
        assert f"- {t} ([table](#" in md, t


def test_the_page_layout(quick):
    text = (quick / "report.html").read_text()
    page = _parse(quick)
    # findings before any table; a title and a table of contents
    assert page.order[0] == ("findings", None)
    assert "<title>opsplit: the default job (quick)</title>" in text and "<nav class=toc" in text
    # the raw tables folded, the few-row tables the findings summarise open
    assert not page.tables["t-compare-runs"]["open"] and not page.tables["t-substep-calls"]["open"]
    assert page.tables["t-comparison"]["open"] and page.tables["t-continuity"]["open"]
    # no nan cell: the empty cells are explained under their table
    for name, t in page.tables.items():
        for r in t["rows"]:
            assert "nan" not in r.values(), (name, r)
    assert "— in ci95_low, ci95_high: a 95 % confidence interval needs at least three points" in text
    assert "— in grid_error: the finest grid is the reference of the grid error" in text
    assert "nan" not in re.sub(r"!\[.*?\]\(.*?\)", "", (quick / "report.md").read_text()).replace("nan_", "")
    # self-contained: every plot embedded (linked to its PNG), every linked file in the folder
    srcs = re.findall(r"<img src='([^']*)'", text)
    assert srcs and all(s.startswith("data:image/png;base64,") for s in srcs)
    for href in re.findall(r"href='([^'#][^']*)'", text):
        assert (quick / html.unescape(href)).is_file(), href
    # Markdown: the same order, with every table after every plot
    md = (quick / "report.md").read_text().splitlines()
    last_plot = max(i for i, line in enumerate(md) if line.startswith("!["))
    first_table = min(i for i, line in enumerate(md) if line.startswith("|"))
    assert md.index("## Findings") < last_plot < first_table


def _browser_or_skip():
    b = report_browser.find_browser()
    if b is None:
        if os.environ.get("OPSPLIT_REQUIRE_BROWSER") == "1":
            pytest.fail("OPSPLIT_REQUIRE_BROWSER=1 and no Chromium found (apt-get install chromium)")
        pytest.skip("no Chromium on this machine (apt-get install chromium, or set OPSPLIT_CHROMIUM): "
                    "the report is not checked in a browser")
    return b


def test_report_in_a_browser(quick, tmp_path):
    """The page alone, moved to another folder (self-contained), at 1280 x 800: every
    image loads, the findings are above the first table, no horizontal overflow (tables
    folded and unfolded), no link without a target; screenshots in tmp_path."""
    browser = _browser_or_skip()
    moved = tmp_path / "moved" / "report.html"
    moved.parent.mkdir()
    shutil.copy(quick / "report.html", moved)
    shots = {tmp_path / "top.png": None, tmp_path / "training.png": "s-training"}
    r = report_browser.check_page(moved, shots, browser=browser)
    assert report_browser.problems(r) == [], r
    # the frontier plot and its finding beside the job's others
    assert r["images"] == 7 and r["findings"] >= 6 and r["viewport"] == [1280, 800]
    assert r["findingsTop"] < 800  # on the first screen
    for p in shots:
        assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_browser_check_catches_a_broken_page(quick, tmp_path):
    """The checker fails a page with a broken image path, a table above the findings, an
    element wider than the screen and a link without a target."""
    browser = _browser_or_skip()
    text = (quick / "report.html").read_text()
    text = re.sub(r"<img src='data:image/png;base64,[^']*'", "<img src='no_such_plot.png'", text, count=1)
    text = text.replace("<section id=findings", "<table><tr><td>x</td></tr></table><section id=findings", 1)
    text = text.replace("</header>", "<div style='width:3000px'>wide</div><a href='#gone'>x</a></header>", 1)
    bad = tmp_path / "report.html"
    bad.write_text(text)
    r = report_browser.check_page(bad, browser=browser)
    found = "\n".join(report_browser.problems(r))
    assert "images that do not load" in found and "training_curve.png" not in found
    assert r["broken"] == ["no_such_plot.png"]
    assert "the findings are not above the first table" in found
    assert "horizontal overflow" in found and "links to missing targets: ['gone']" in found


def test_a_table_joins_the_findings_through_one_function(tmp_path):
    """A new kind of table: one registered function, its sentence at the top of the page
    with a link to the table (the way the continuity table joins)."""
    from opsplit.cli.findings import FINDERS, Finding, finder
    from opsplit.cli.output import Output

    o = Output(tmp_path, "t")
    o.heading("Section")
    o.table("metric", [{"n_t": 2, "metric": 0.5}, {"n_t": 4, "metric": 0.75}], kind="test_metric")

    @finder("test_metric")
    def _metric(table, page):
        best = max(table.rows, key=lambda r: table.number(r, "metric"))
        return [Finding(f"Best metric {best['metric']} at N_t = {best['n_t']}.", table.file,
                        {"best": table.number(best, "metric")})]

    try:
        o.finish()
    finally:
        FINDERS.pop("test_metric")
    page = _parse(tmp_path)
    assert [x["text"] for x in page.findings] == ["Best metric 0.75 at N_t = 4."]
    assert page.findings[0]["links"] == ["#t-metric"] and page.order[0] == ("findings", None)


def test_order_verdicts_and_reasons(tmp_path):
    """met / below against theory (the top of the CI, or the order without one, within
    0.1), and the reason of a below-theory order: a paragraph <scheme>-note of the page,
    else rising local orders."""
    from opsplit.cli.findings import order_verdict
    from opsplit.cli.output import Output

    nan = float("nan")
    assert order_verdict(0.95, nan, 1) == "met" and order_verdict(0.85, nan, 1) == "below"
    assert order_verdict(0.8, 0.95, 1) == "met" and order_verdict(0.5, 0.76, 1) == "below"
    assert order_verdict(2.4, 2.6, 2) == "met"
    o = Output(tmp_path, "t")
    o.heading("S")
    rows = [{"scheme": "lie", "solver": "euler", "order": 0.6, "ci95_high": nan, "theory": 1,
             "local orders": "0.40, 0.55, 0.70"},
            {"scheme": "strang", "solver": "heun", "order": 1.5, "ci95_high": 1.6, "theory": 2,
             "local orders": "1.60, 1.50, 1.40"},
            {"scheme": "odd", "solver": "heun", "order": 0.2, "ci95_high": nan, "theory": 1, "local orders": ""}]
    o.table("comparison", rows, kind="comparison")
    o.text("Why odd is slow.", anchor="odd-note", summary="odd has a reason")
    texts = [x["text"] for x in _parse(Path(o.finish()).parent).findings]
    assert any("lie / euler 0.6 (theory 1; local orders 0.40, 0.55, 0.70): the local orders still rise" in t
               for t in texts), texts
    assert any("strang / heun 1.5 (theory 2; local orders 1.60, 1.50, 1.40)." in t for t in texts), texts
    assert any("odd / heun 0.2 (theory 1): odd has a reason." in t for t in texts), texts


def test_report_legends_stay_off_the_data():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from opsplit.cli import plots

    fig, ax = plt.subplots(figsize=plots.SIZE, layout="constrained")
    for k in range(8):
        ax.loglog([1, 2, 4], [1, 2.0 ** -k, 4.0 ** -k], "o-", label=f"scheme {k} / heun: 1.00")
    plots.label(ax, plots.DT, plots.REL_ERROR, "t")
    fig.canvas.draw()
    r = fig.canvas.get_renderer()
    leg, box = ax.get_legend().get_window_extent(r), ax.get_window_extent(r)
    assert leg.x0 >= box.x1 and leg.x1 <= fig.bbox.x1 + 1  # beside the axes, inside the figure
    assert "(s)" in plots.SECONDS and "Δt" in ax.get_xlabel()
    plt.close(fig)
