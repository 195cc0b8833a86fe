"""The findings that open a report: a few sentences computed from the report's own tables.

A job gives each table it writes a kind (``Output.table(name, rows, kind="comparison")``);
when the report is written (:func:`opsplit.cli.output.write_report`, also by ``opsplit
report FOLDER``), every table of a kind registered here is read back from its CSV file and
turned into :class:`Finding` s -- so the sentences and the tables come from the same data,
and a folder's report says the same whoever writes it.  Each finding links to the table
(and plot) it was computed from and keeps the numbers it used.

A new table joins the findings through one function::

    from opsplit.cli.findings import Finding, finder

    @finder("continuity")                      # the kind given to Output.table
    def continuity(table, page):
        rows = table.rows                      # the CSV rows, as text; table.number(row, col)
        ...
        return [Finding("The trained model ...", table.file, {"worst": worst},
                        also=(page.figure("continuity"),))]

Findings appear in the order of their tables on the page.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from .tables import fmt

__all__ = ["Finding", "finder", "collect", "FINDERS", "TOL", "KEEP", "HOW", "order_verdict"]

#: a fitted order "meets" its theory when it, or the top of its 95 % confidence interval,
#: is at most this much below the theory
TOL = 0.1
#: an accuracy is "kept" at another N_t when it is at most this much below the accuracy at
#: the N_t of training
KEEP = 0.02

HOW = (f"Computed from the linked tables when this report was written. A fitted order meets its theory "
       f"when it, or the top of its 95 % confidence interval, is at most {TOL:g} below the theory; an "
       f"accuracy is kept at another N_t when it is at most {KEEP:g} below the accuracy at the N_t of training.")


@dataclass(frozen=True)
class Finding:
    """One sentence of the findings.

    Attributes:
        text: the sentence (plain text; numbers formatted as the tables format them).
        target: the file of the table (or plot) it was computed from; the report links to it.
        numbers: the values it was computed from, by name.
        also: further files or paragraph anchors it links to (a plot of the same numbers).
    """

    text: str
    target: str
    numbers: dict = field(default_factory=dict)
    also: tuple = ()


#: table kind -> function(table, page) -> list of findings
FINDERS: dict = {}


def finder(kind: str):
    """Register ``fn(table, page) -> list[Finding]`` for the tables of ``kind``."""
    def register(fn):
        FINDERS[kind] = fn
        return fn
    return register


def collect(page) -> list:
    """The findings of a page (:class:`opsplit.cli.page.Page`), in the order of its tables."""
    out = []
    for t in page.tables:
        fn = FINDERS.get(t.kind)
        if fn is not None:
            out += [f for f in fn(t, page) if f is not None]
    return out


def _finite(x: float) -> bool:
    return isinstance(x, float) and math.isfinite(x)


def order_verdict(order: float, ci_high: float, theory: float) -> str:
    """``"met"`` or ``"below"`` (see :data:`TOL`)."""
    best = max(order, ci_high) if _finite(ci_high) else order
    return "met" if best >= theory - TOL else "below"


def _local_orders(text: str) -> list:
    """The local orders of a comparison row ("0.38, 0.50, -": NaN where undefined)."""
    out = []
    for x in str(text).split(","):
        if x.strip():
            try:
                out.append(float(x))
            except ValueError:
                out.append(float("nan"))
    return out


def _greek(variable: str) -> str:
    return variable.replace("dt", "Δt").replace("dx", "Δx").replace("dy", "Δy")


def _orders(t, page, rows, label, what: str, also=()) -> list:
    """Fitted orders against theory: one sentence for those that meet it, one per reason
    for those below it (a paragraph ``<scheme>-note`` of the page gives the reason of a
    scheme; else local orders still rising say pre-asymptotic)."""
    items = []
    for r in rows:
        order, hi, theory = t.number(r, "order"), t.number(r, "ci95_high"), t.number(r, "theory")
        if _finite(order) and _finite(theory):
            items.append({"label": label(r), "row": r, "order": order, "ci95_high": hi, "theory": theory,
                          "verdict": order_verdict(order, hi, theory),
                          "local_orders": _local_orders(r.get("local orders", ""))})

    def numbers(group):
        return {i["label"]: {k: i[k] for k in ("order", "ci95_high", "theory", "verdict", "local_orders")}
                for i in group}

    out = []
    met = [i for i in items if i["verdict"] == "met"]
    if met:
        out.append(Finding(
            f"Fitted order {what} against theory, met: "
            + ", ".join(f"{i['label']} {fmt(i['row']['order'])} (theory {fmt(i['row']['theory'])})" for i in met)
            + ".", t.file, numbers(met), also))
    below: dict = {}
    for i in items:
        if i["verdict"] != "below":
            continue
        local = i["local_orders"]
        note = page.note(f"{i['label'].split(' / ')[0]}-note")
        if note is not None and note.get("summary"):
            reason, link = note["summary"], (note["anchor"],)
        elif len(local) >= 2 and all(a < b for a, b in zip(local, local[1:])):
            reason, link = "the local orders still rise towards the theory (pre-asymptotic)", ()
        else:
            reason, link = "", ()
        below.setdefault((reason, link), []).append(i)
    for (reason, link), group in below.items():
        parts = [f"{i['label']} {fmt(i['row']['order'])} (theory {fmt(i['row']['theory'])}"
                 + (f"; local orders {i['row']['local orders']}" if i["local_orders"] else "") + ")"
                 for i in group]
        out.append(Finding(
            f"Fitted order {what} against theory, below: " + ", ".join(parts) + (f": {reason}" if reason else "")
            + ".", t.file, numbers(group), (*also, *link)))
    return out


@finder("comparison")
def _comparison(t, page):
    fig = page.figure("error_vs_dt")
    return _orders(t, page, t.rows, lambda r: f"{r['scheme']} / {r['solver']}", "in Δt",
                   (fig,) if fig else ())


@finder("orders")
def _fitted_orders(t, page):
    out = []
    by_var: dict = {}
    for r in t.rows:
        by_var.setdefault(r.get("variable", ""), []).append(r)
    for var, rows in by_var.items():
        if var == "dt" and page.table("comparison") is not None:
            continue  # the scheme comparison states the orders in time
        fig = page.figure("convergence_time" if var == "dt" else "convergence_space")
        what = f"in {_greek(var)}" + ("" if var == "dt" else " (grid error against the finest grid)")
        out += _orders(t, page, rows, lambda r: r["scheme / solver"], what, (fig,) if fig else ())
    return out


def _levels(errors) -> list:
    """Up to four decades 10^k between the smallest and the largest error."""
    lo, hi = min(errors), max(errors)
    ks = list(range(math.floor(math.log10(hi)), math.ceil(math.log10(lo)) - 1, -1))
    if len(ks) > 4:
        ks = [ks[round(i * (len(ks) - 1) / 3)] for i in range(4)]
    return ks


@finder("compare_runs")
def _cheapest(t, page):
    runs = []
    for r in t.rows:
        e, s = t.number(r, "rel_error"), t.number(r, "seconds")
        if _finite(e) and e > 0 and _finite(s):
            runs.append((e, s, r))
    if not runs:
        return []
    best = []  # (levels, run): consecutive levels with the same cheapest run share a clause
    for k in _levels([e for e, _, _ in runs]):
        ok = [x for x in runs if x[0] <= 10.0 ** k]
        if not ok:
            continue
        run = min(ok, key=lambda x: x[1])
        if best and best[-1][1] is run:
            best[-1][0].append(k)
        else:
            best.append(([k], run))
    parts, numbers = [], []
    for ks, (e, s, r) in best:
        parts.append(" and ".join(f"≤ 1e{k}" for k in ks) + f": {r['scheme']} / {r['solver']} at N_t = "
                     f"{r['n_t']} ({fmt(r['seconds'])} s, error {fmt(r['rel_error'])})")
        numbers += [{"level": 10.0 ** k, "scheme": r["scheme"], "solver": r["solver"], "n_t": int(r["n_t"]),
                     "seconds": s, "rel_error": e} for k in ks]
    if not parts:
        return []
    fig = page.figure("error_vs_cost")
    return [Finding("Cheapest run (wall time per solve on this machine) to reach a relative error "
                    + "; ".join(parts) + ".", t.file, {"levels": numbers}, (fig,) if fig else ())]


@finder("train_epochs")
def _training(t, page):
    rows = [r for r in t.rows if _finite(t.number(r, "eval_accuracy"))]
    if not rows:
        return []
    first, last = rows[0], rows[-1]
    fig = page.figure("training_curve")
    return [Finding(
        f"Training: after {last['step']} optimizer steps ({len(t.rows)} epochs) the test loss fell from "
        f"{fmt(first['eval_loss'])} to {fmt(last['eval_loss'])} and the test accuracy rose from "
        f"{fmt(first['eval_accuracy'])} to {fmt(last['eval_accuracy'])}.",
        t.file, {"steps": int(last["step"]), "eval_loss": (t.number(first, "eval_loss"), t.number(last, "eval_loss")),
                 "eval_accuracy": (t.number(first, "eval_accuracy"), t.number(last, "eval_accuracy"))},
        (fig,) if fig else ())]


@finder("eval_n_t")
def _accuracy_over_n_t(t, page):
    rows = [r for r in t.rows if _finite(t.number(r, "test_accuracy"))]
    trained = [r for r in rows if str(r.get("trained_at", "")).strip() == "yes"]
    fig = page.figure("accuracy_vs_n_t")
    also = (fig,) if fig else ()
    if not rows:
        return []
    if not trained:
        return [Finding("Test accuracy of the trained model: "
                        + ", ".join(f"{fmt(r['test_accuracy'])} at N_t = {r['n_t']}" for r in rows) + ".",
                        t.file, {int(r["n_t"]): t.number(r, "test_accuracy") for r in rows}, also)]
    r0 = trained[0]
    a0 = t.number(r0, "test_accuracy")
    others = [r for r in rows if r is not r0]
    text = f"The trained model scores test accuracy {fmt(r0['test_accuracy'])} at N_t = {r0['n_t']}, the N_t it was trained at"
    numbers = {"trained_n_t": int(r0["n_t"]), "accuracy": a0, "others": {}}
    if others:
        drops = {r["n_t"]: a0 - t.number(r, "test_accuracy") for r in others}
        numbers["others"] = {int(r["n_t"]): t.number(r, "test_accuracy") for r in others}
        kept = [n for n, d in drops.items() if d <= KEEP]
        lost = [n for n, d in drops.items() if d > KEEP]
        text += ("; at the other N_t evaluated it scores "
                 + ", ".join(f"{fmt(r['test_accuracy'])} (N_t = {r['n_t']})" for r in others))
        if not lost:
            text += f": it keeps that accuracy (within {KEEP:g}) at every one"
        else:
            worst = max(lost, key=lambda n: drops[n])
            text += (f": it keeps it (within {KEEP:g}) at N_t = {', '.join(kept)} and not at N_t = {', '.join(lost)}"
                     if kept else f": it does not keep it (within {KEEP:g}) at any of them")
            text += f" (largest drop {fmt(drops[worst])} at N_t = {worst})"
    return [Finding(text + ".", t.file, numbers, also)]


@finder("continuity")
def _continuity(t, page):
    """The solver-swap table (:mod:`opsplit.cli.continuity_report`): the training grid's
    accuracy, and whether the finer N_t and the other substep solvers keep it."""
    rows = [r for r in t.rows if _finite(t.number(r, "accuracy"))]
    trained = [r for r in rows if str(r.get("training grid", "")).strip() == "yes"]
    if not trained:
        return []
    r0 = trained[0]
    a0, n0 = t.number(r0, "accuracy"), int(r0["n_t"])
    fig = page.figure("continuity")
    also = (fig,) if fig else ()
    refined = [r for r in rows if r is not r0 and int(r["n_t"]) >= n0]
    coarser = [r for r in rows if int(r["n_t"]) < n0 and r["solver"] == r0["solver"] and r["scheme"] == r0["scheme"]]
    text = (f"The trained model scores test accuracy {fmt(r0['accuracy'])} on its training grid (N_t = {n0}, "
            f"{r0['solver']} substeps)")
    numbers = {"trained_n_t": n0, "accuracy": a0, "refined": {}, "coarser": {}}
    if refined:
        drops = {(r["solver"], int(r["n_t"]), r["scheme"]): a0 - t.number(r, "accuracy") for r in refined}
        numbers["refined"] = {f"{s} / {sc} / {n}": a0 - d for (s, n, sc), d in drops.items()}
        worst = max(drops, key=drops.get)
        solvers = sorted({r["solver"] for r in refined})
        verdict = (f"keeps that accuracy (within {KEEP:g}) at every one" if drops[worst] <= KEEP else
                   f"does not keep it (within {KEEP:g}) at every one")
        text += (f"; solved without retraining at finer N_t and with {', '.join(solvers)} substeps "
                 f"({len(refined)} settings) it {verdict}: the lowest is {fmt(a0 - drops[worst])} "
                 f"({worst[0]} at N_t = {worst[1]}), {abs(100 * drops[worst]):.2f} pt "
                 f"{'below' if drops[worst] > 0 else 'above'} the training grid")
    for r in coarser:
        numbers["coarser"][int(r["n_t"])] = t.number(r, "accuracy")
    if coarser:
        text += "; at the coarser " + ", ".join(f"N_t = {r['n_t']} it scores {fmt(r['accuracy'])}" for r in coarser)
    return [Finding(text + ".", t.file, numbers, also)]


@finder("frontier")
def _frontier(t, page):
    """The frontier table (:mod:`opsplit.cli.frontier_report`): the one model at every N_t
    against the models trained at one N_t alone."""
    one = next((c for c in t.columns if c.endswith("(one model)")), None)
    alone = next((c for c in t.columns if c.endswith("(trained at this N_t alone)")), None)
    if one is None:
        return []
    rows = [r for r in t.rows if _finite(t.number(r, one))]
    if not rows:
        return []
    fig = page.figure("frontier")
    also = (fig,) if fig else ()
    what = one[: -len(" (one model)")]
    text = ("One trained model solved at N_t = " + ", ".join(str(r["n_t"]) for r in rows) + " (substep calls "
            + ", ".join(str(r["calls"]) for r in rows) + f" per input) scores {what} "
            + ", ".join(fmt(r[one]) for r in rows))
    numbers = {"one model": {int(r["n_t"]): t.number(r, one) for r in rows}, "alone": {}}
    paired = [r for r in rows if alone is not None and _finite(t.number(r, alone))]
    if paired:
        numbers["alone"] = {int(r["n_t"]): t.number(r, alone) for r in paired}
        gaps = {r["n_t"]: t.number(r, one) - t.number(r, alone) for r in paired}
        worst = min(gaps, key=gaps.get)
        text += ("; models trained at one N_t alone score " + ", ".join(
            f"{fmt(r[alone])} (N_t = {r['n_t']})" for r in paired)
            + f": the largest shortfall of the one model is {abs(100 * gaps[worst]):.2f} pt at N_t = {worst}"
            if gaps[worst] < 0 else "; the one model is at or above every model trained at one N_t alone")
    return [Finding(text + ".", t.file, numbers, also)]
