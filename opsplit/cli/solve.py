"""``opsplit solve``: one seeded continuous transformer solved at the chosen resolutions
N_t, N_x, N_y by the chosen schemes; errors, fitted orders in time and in space, plots."""

from __future__ import annotations

from . import plots, study
from .config import Field, at_least
from .study import CI_NOTE, GRID_NOTE, REFERENCE_NOTE, statistics_tables

NAME = "solve"
SUMMARY = "solve a seeded continuous transformer at given N_t, N_x, N_y and schemes"
EXAMPLE = """\
examples:
  opsplit solve --n-t 4 8 16 32 --n-x 8 16 32 --n-y 8 16 32 --schemes lie strang
  opsplit solve --schemes strang blanes_moan --solver rk4 --rtol 1e-6   # + an adaptive solve each
  opsplit solve --config solve.toml --out runs/solve

solve.toml:
  [model]
  seed = 0
  constraint = true      # S1 (LayerNorm) as a constraint
  [solve]
  schemes = ["lie", "strang", "parallel", "hybrid"]
  solver = "heun"
  n_t = [4, 8, 16, 32]
  n_x = [8, 16, 32]      # zipped with n_y into grids (8, 8), (16, 16), (32, 32)
  n_y = [8, 16, 32]
"""

SCHEMA = {
    "model": study.MODEL_SCHEMA,
    "solve": {
        "schemes": Field("str_list", ["lie", "strang", "parallel", "hybrid"], "splitting schemes",
                         study.distinct, choices=study.SCHEMES),
        "solver": Field("str", "heun", "substep solver of the smooth terms", choices=study.SOLVERS),
        "n_t": Field("int_list", [4, 8, 16, 32], "time steps N_t (>= 1)", at_least(1)),
        "n_x": Field("int_list", [8, 16, 32], "nodes N_x on Omega_x (zipped with n_y)", at_least(1)),
        "n_y": Field("int_list", [8, 16, 32], "nodes N_y on Omega_y (zipped with n_x)", at_least(1)),
        "rtol": Field("float", 0.0, "also solve by adaptive steps to this relative tolerance "
                      "(step doubling, PI controller; 0: no adaptive solve)",
                      lambda v: None if v == 0 or 0 < v < 1 else "0 (off) or a number in (0, 1)"),
        "atol": Field("float", 0.0, "absolute tolerance of the adaptive solve (0: 1e-3 rtol)",
                      lambda v: None if v >= 0 else "a number >= 0"),
        "reference": Field("str", "unsplit", "error reference: the unsplit model (torchdiffeq) "
                           "or the finest run", choices=("unsplit", "finest")),
    },
}


def add_arguments(p):
    study.add_arguments(p, "solve", several_solvers=False)
    p.add_argument("--n-x", nargs="+", type=int, metavar="N", help="nodes N_x")
    p.add_argument("--n-y", nargs="+", type=int, metavar="N", help="nodes N_y")


def overrides(a) -> dict:
    return {**study.overrides(a, "solve", several_solvers=False), "solve.n_x": a.n_x, "solve.n_y": a.n_y}


def check(cfg) -> None:
    c = cfg["solve"]
    study.check_tolerances(c, "solve")
    gs = study.grids(c["n_x"], c["n_y"], "solve")
    study.check(cfg["model"], gs, sorted(set(c["n_t"])), c["reference"], "solve")


def estimate(cfg):
    c = cfg["solve"]
    gs = study.grids(c["n_x"], c["n_y"], "solve")
    return study.estimate(cfg["model"], gs, c["n_t"], c["schemes"], [c["solver"]], c["reference"],
                          rtol=c["rtol"])


def prepare(cfg) -> dict:
    c = cfg["solve"]
    gs = study.grids(c["n_x"], c["n_y"], "solve")
    n_t = sorted(set(c["n_t"]))
    study.preflight(cfg["model"], gs, n_t, c["schemes"], c["solver"], c["reference"], "solve",
                    rtol=c["rtol"], atol=c["atol"])
    return {"grids": sorted(set(gs)), "n_t": n_t}


def run(cfg, plan, out, progress=True, heading="Solve", prefix=""):
    c, m = cfg["solve"], cfg["model"]
    gs, n_t = plan["grids"], plan["n_t"]
    rows, ref = study.solve_all(m, gs, n_t, c["schemes"], [c["solver"]], c["reference"],
                                progress=progress, desc="solve", rtol=c["rtol"], atol=c["atol"])
    fine = gs[-1]
    out.heading(heading)
    out.text(
        f"A seeded continuous transformer (opsplit.analysis.smooth_transformer: softmax "
        f"attention + {m['J']} FFN integral term(s){', S1 constraint' if m['constraint'] else ''}"
        f"{', ReLU' if m['relu'] else ''}; controls {m['space']} in space, {m['time']} in time; "
        f"T = {m['T']:g}, {m['dtype']}, seed {m['seed']}) solved with {c['solver']} substeps at "
        f"N_t = {n_t} on the grids {gs}. Errors are relative discrete L2 errors against "
        + ("the unsplit model solved by torchdiffeq (dopri5, rtol 1e-10) on the finest grid"
           if ref["reference"] == "unsplit" else
           f"the same scheme at N_t = {max(n_t)} on the finest grid")
        + "; grid_error compares each run with the same scheme and N_t on the finest grid "
        "(cubic-spline resampling), which isolates the spatial error; substeps: the substep solves "
        "of the run (its solve statistics)."
    )
    cols = ["scheme", "solver", "n_t", "n_x", "n_y", "dt", "dx", "dy", "substeps", "rel_error",
            "grid_error", "seconds"]
    out.table(f"{prefix}runs", rows, cols, "every run", kind="runs",
              notes={"rel_error": REFERENCE_NOTE, "grid_error": GRID_NOTE})
    study.adaptive_table(out, ref, prefix)
    statistics_tables(out, rows, ref, prefix)
    t_st = study.studies(rows, "dt", {"n_x": fine[0], "n_y": fine[1]},
                         projections=m["constraint"] or m["relu"])
    s_st = study.studies(rows, "h", {"n_t": max(n_t)}, error="grid_error")
    orders = study.order_rows(t_st, "dt") + study.order_rows(s_st, "max(dx, dy)")
    if orders:
        out.table(f"{prefix}orders", orders, title="fitted orders (least squares on "
                  "log-log, 95% confidence interval; theory: the scheme's order with these substeps)",
                  kind="orders", notes={"ci95_low": CI_NOTE, "ci95_high": CI_NOTE}, key=True)
    for sts, x, y, title, kind, caption in (
            (t_st, plots.DT, plots.REL_ERROR, f"error vs Δt on the {fine[0]} x {fine[1]} grid", "convergence_time",
             "convergence in time: relative error against Δt, fitted orders in the legend"),
            (s_st, plots.H, plots.GRID_ERROR, f"grid error vs max(Δx, Δy) at N_t = {max(n_t)}", "convergence_space",
             "convergence in space: error against the finest grid, fitted orders")):
        if sts:
            out.figure(plots.convergence(sts, x, y, title), f"{prefix}{kind}", caption, kind=kind)
    return rows
