"""``opsplit compare``: Lie, Strang, parallel, hybrid splitting and the fourth-order
compositions (with several substep solvers) on one grid: error against cost (wall time,
substep solves), measured orders; with ``--rtol`` also an adaptive solve of each."""

from __future__ import annotations

import math

from . import plots, study, threads
from .config import Field, at_least
from .study import CI_NOTE, REFERENCE_NOTE, statistics_tables

NAME = "compare"
SUMMARY = "compare splitting schemes: error vs cost, measured orders"
EXAMPLE = """\
examples:
  opsplit compare --schemes lie strang parallel hybrid --solvers euler heun --n-t 4 8 16 32
  opsplit compare --schemes strang triple_jump blanes_moan --solvers rk4 --rtol 1e-5 --margin 0.1
  opsplit compare --config compare.toml --out runs/compare

compare.toml:
  [model]
  seed = 1
  [compare]
  schemes = ["lie", "strang", "parallel", "hybrid"]
  solvers = ["euler", "heun", "rk4"]
  n_t = [4, 8, 16, 32]
  n_x = 12
  n_y = 12
  repeats = 3            # median wall time of 3 solves
"""

SCHEMA = {
    "model": study.MODEL_SCHEMA,
    "compare": {
        "schemes": Field("str_list", ["lie", "strang", "parallel", "hybrid"], "splitting schemes",
                         study.distinct, choices=study.SCHEMES),
        "solvers": Field("str_list", ["euler", "heun"], "substep solvers", study.distinct,
                         choices=study.SOLVERS),
        "n_t": Field("int_list", [4, 8, 16, 32], "time steps N_t (>= 1; at least two)",
                     lambda v: None if min(v) >= 1 and len(set(v)) >= 2
                     else "at least two distinct values >= 1"),
        "n_x": Field("int", 12, "nodes N_x", at_least(1)),
        "n_y": Field("int", 12, "nodes N_y", at_least(1)),
        "rtol": Field("float", 0.0, "also solve by adaptive steps to this relative tolerance "
                      "(step doubling, PI controller; 0: no adaptive solve)",
                      lambda v: None if v == 0 or 0 < v < 1 else "0 (off) or a number in (0, 1)"),
        "atol": Field("float", 0.0, "absolute tolerance of the adaptive solve (0: 1e-3 rtol)",
                      lambda v: None if v >= 0 else "a number >= 0"),
        "reference": Field("str", "unsplit", "the unsplit model (torchdiffeq) or the finest run",
                           choices=("unsplit", "finest")),
        "repeats": Field("int", 3, "solves per run (the median time is reported)", at_least(1)),
    },
}


def add_arguments(p):
    study.add_arguments(p, "compare", several_solvers=True)
    p.add_argument("--n-x", type=int, metavar="N", help="nodes N_x")
    p.add_argument("--n-y", type=int, metavar="N", help="nodes N_y")
    p.add_argument("--repeats", type=int, help="solves per run (median time)")


def overrides(a) -> dict:
    return {**study.overrides(a, "compare", several_solvers=True), "compare.n_x": a.n_x, "compare.n_y": a.n_y,
            "compare.repeats": a.repeats}


def check(cfg) -> None:
    c = cfg["compare"]
    study.check_tolerances(c, "compare")
    study.check(cfg["model"], [(c["n_x"], c["n_y"])], sorted(set(c["n_t"])), c["reference"],
                "compare")


def estimate(cfg):
    c = cfg["compare"]
    return study.estimate(cfg["model"], [(c["n_x"], c["n_y"])], c["n_t"], c["schemes"],
                          c["solvers"], c["reference"], c["repeats"], rtol=c["rtol"])


def prepare(cfg) -> dict:
    c = cfg["compare"]
    n_t = sorted(set(c["n_t"]))
    g = [(c["n_x"], c["n_y"])]
    for solver in c["solvers"]:
        study.preflight(cfg["model"], g, n_t, c["schemes"], solver, c["reference"], "compare",
                        rtol=c["rtol"], atol=c["atol"])
    return {"grids": g, "n_t": n_t}


def local_orders(st) -> str:
    """log2 of the error ratios of successive N_t (log of the ratio over log of the step
    ratio), as text: ``"0.38, 0.50, 0.72"``."""
    h, e = list(st.h), list(st.errors)
    out = [math.log(e[i] / e[i + 1]) / math.log(h[i] / h[i + 1])
           if h[i] != h[i + 1] and e[i] > 0 and e[i + 1] > 0 else math.nan for i in range(len(e) - 1)]
    return ", ".join("-" if math.isnan(x) else f"{x:.2f}" for x in out)


def parallel_note(m: dict) -> str:
    """Why parallel splitting shows less than its order 1 with the S1 constraint."""
    K = 2 + m["J"] + int(m["relu"])
    return (
        f"Parallel splitting and the S1 constraint: a parallel step solves each of its K = {K} "
        "substeps from u^n with the scaled term K A_k and averages them, u^(n+1) = (1/K) "
        "(v_1 + ... + v_K) (paper 002, Appendix C, eq. 59). For the S1 constraint (LayerNorm, "
        "an indicator term) the scaled term is the same indicator (K ∂I_S1 = ∂I_S1), so its "
        "substep is still the projection P_S1(u^n), and the average is u^n + (P_S1(u^n) - u^n)/K "
        "+ O(Δt): each step pulls the state only 1/K of the way back to S1, a relaxation "
        "towards the constraint rather than the constraint (docs/schemes.md, 'Parallel (eq. 59) "
        "and projections'). Appendix C's first order ('with proper conditions') is reached "
        "only at small Δt: on the default problem (seed 0, 12 x 12 grid, Heun substeps; opsplit "
        "compare --schemes parallel --solvers heun --n-t 4 8 16 32 64 128 256 512) the local "
        "orders are 0.38, 0.50, 0.72, 0.86, 0.93, 0.96, 0.98, so a fit over N_t = 4 ... 32 gives "
        "about 0.5; without the constraint (model.constraint = false) they are 1.05, 1.04, "
        "1.03, 1.01, 1.01, 1.00, 1.00. Hybrid splitting keeps S1 in a group of its own and is "
        "first order from the coarsest N_t."
    )


def parallel_summary(m: dict) -> str:
    """:func:`parallel_note` in a few words, for the report's findings."""
    K = 2 + m["J"] + int(m["relu"])
    return (f"with the S1 constraint each parallel step pulls the state only 1/K = 1/{K} of the way back to S1 "
            "(a relaxation towards the constraint, not the projection), so Appendix C's first order is reached "
            "only at small Δt")


def run(cfg, plan, out, progress=True, heading="Scheme comparison", prefix=""):
    # slow to import (about 1 s): loaded when the job draws
    import matplotlib.pyplot as plt

    c, m = cfg["compare"], cfg["model"]
    n_t = plan["n_t"]
    rows, ref = study.solve_all(m, plan["grids"], n_t, c["schemes"], c["solvers"], c["reference"],
                                repeats=c["repeats"], progress=progress, desc="compare",
                                rtol=c["rtol"], atol=c["atol"])
    sts = study.studies(rows, "dt", {}, projections=m["constraint"] or m["relu"])
    out.heading(heading)
    out.text(
        f"Splitting schemes ({', '.join(c['schemes'])}) of one seeded continuous transformer "
        f"(seed {m['seed']}, {m['J']} FFN term(s){', S1 constraint' if m['constraint'] else ''}"
        f"{', ReLU' if m['relu'] else ''}, {m['dtype']}) on the {c['n_x']} x {c['n_y']} grid, "
        f"N_t = {n_t}. Error: relative discrete L2 error against "
        + ("the unsplit model (torchdiffeq, dopri5, rtol 1e-10)" if ref["reference"] == "unsplit"
           else f"the same scheme at N_t = {max(n_t)}")
        + f". Cost: median wall time of {c['repeats']} solve(s) on this machine with "
        f"{threads.describe()}, and the number of substep solves. Theory: the scheme's order "
        "when its substeps are solved to at least that order; explicit-Euler substeps make "
        "every scheme first order. Local orders: log2 of the error ratios of successive N_t "
        "(a fitted order below theory with local orders still rising is pre-asymptotic)."
    )
    table = []
    for st in sts:
        s, v = st.label.split(" / ")
        last = [r for r in rows if r["scheme"] == s and r["solver"] == v and r["n_t"] == max(st.n)]
        r = last[0]
        table.append({
            "scheme": s, "solver": v, "order": st.fit.order, "ci95_low": st.fit.ci_low,
            "ci95_high": st.fit.ci_high, "theory": st.expected, "local orders":
            local_orders(st), f"error at N_t={r['n_t']}": r["rel_error"], "seconds": r["seconds"],
            "substep solves": r["substeps"],
        })
    out.table(f"{prefix}comparison", table, title="schemes compared (fitted order in Δt, 95% CI)",
              kind="comparison", notes={"ci95_low": CI_NOTE, "ci95_high": CI_NOTE}, key=True)
    if "parallel" in c["schemes"] and m["constraint"]:
        out.text(parallel_note(m), anchor="parallel-note", summary=parallel_summary(m))
    study.adaptive_table(out, ref, prefix)
    statistics_tables(out, rows, ref, prefix)
    out.table(f"{prefix}compare_runs", rows,
              ["scheme", "solver", "n_t", "dt", "substeps", "rel_error", "seconds"], "every run",
              kind="compare_runs", notes={"rel_error": REFERENCE_NOTE})
    if sts:
        fig = plots.convergence(sts, plots.DT, plots.REL_ERROR,
                                f"error vs Δt ({c['n_x']} x {c['n_y']} grid)")
        out.figure(fig, f"{prefix}error_vs_dt", "error against Δt; fitted orders in the legend",
                   kind="error_vs_dt")
        fig, ax = plt.subplots(figsize=plots.SIZE, layout="constrained")
        for st in sts:
            s, v = st.label.split(" / ")
            rs = sorted((r for r in rows if r["scheme"] == s and r["solver"] == v
                         and r["rel_error"] == r["rel_error"]), key=lambda r: r["seconds"])
            ax.loglog([r["seconds"] for r in rs], [r["rel_error"] for r in rs], "o-", label=st.label)
        for r in ref.get("adaptive", []):
            ax.loglog([r["seconds"]], [r["rel_error"]], "*", markersize=10,
                      label=f"{r['scheme']} / {r['solver']}, adaptive rtol {r['rtol']:g}")
        ax.grid(True, which="both", alpha=0.3)
        plots.label(ax, plots.SECONDS, plots.REL_ERROR, "accuracy against cost")
        out.figure(fig, f"{prefix}error_vs_cost", "error against wall time: lower left is better",
                   kind="error_vs_cost")
    return rows, table
