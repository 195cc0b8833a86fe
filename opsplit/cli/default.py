"""The embedded default job of ``opsplit`` (no arguments): a seeded continuous transformer
solved with Lie, Strang, parallel and hybrid splitting at several N_t and grid sizes, and a
short training on the bundled digits; a report with the convergence plots, the scheme
comparison table and the training curve."""

from __future__ import annotations

import time
from pathlib import Path

from . import budget, compare, frontier_report, solve, threads
from .config import dump_toml, load
from .continuity_report import console_lines
from .output import Output, check_out, new_folder, relpath
from .tasks import Interrupted
from .tasks import digits as train

EXAMPLE = """\
examples:
  opsplit                       # the default job: under a minute on 2 idle CPU cores
  opsplit --quick               # the same job, tiny (seconds)
  opsplit solve --help          # a job's options, config keys and an example
"""

FULL = {
    "compare": {"compare": {"solvers": ["euler", "heun"], "n_t": [4, 8, 16, 32], "n_x": 12,
                            "n_y": 12, "repeats": 3}},
    "solve": {"solve": {"solver": "heun", "n_t": [8, 32], "n_x": [6, 12, 24, 48],
                        "n_y": [6, 12, 24, 48]}},
    # one model for every depth: N_t = 1, 2, 4 drawn (weights 1, 1, 2), a step longer than a
    # control piece reading the pieces' average; the frontier beside models trained at 1, 2, 4 alone
    "train": {"train": {"epochs": 10, "n_steps": [1, 2, 4], "n_steps_weights": [1, 1, 2],
                        "coarse_controls": "average"},
              "frontier": {"enabled": True}},
}
QUICK = {
    "compare": {"model": {"batch": 1}, "compare": {"solvers": ["heun"], "n_t": [2, 4], "n_x": 4,
                                                   "n_y": 4, "repeats": 1}},
    "solve": {"model": {"batch": 1}, "solve": {"solver": "euler", "n_t": [2, 4, 8], "n_x": [4, 6, 8],
                                               "n_y": [4, 6, 8], "reference": "finest"}},
    "train": {"model": {"d_model": 16, "heads": 2, "d_ff": 32},
              "train": {"epochs": 2, "batch_size": 32, "n_steps": [1, 2, 4], "n_steps_weights": [1, 1, 2],
                        "coarse_controls": "average"}, "eval": {"n_steps": [2, 4, 8]},
              "data": {"limit": 256}, "frontier": {"enabled": True, "n_steps": [2, 4, 8]}},
}


def configs(quick: bool) -> dict:
    presets = QUICK if quick else FULL
    return {
        "compare": load(compare.SCHEMA, data=presets["compare"]),
        "solve": load(solve.SCHEMA, data=presets["solve"]),
        "train": load(train.SCHEMA, data=presets["train"]),
    }


PARTS = {"compare": compare, "solve": solve, "train": train}


def run_default(*, quick: bool = False, out=None, progress: bool = True) -> int:
    cfgs = configs(quick)
    check_out(out)
    for name, mod in PARTS.items():
        mod.check(cfgs[name])
        budget.guard(f"opsplit (default job, {name})", mod.SCHEMA, cfgs[name], mod.estimate)
    plans = {name: mod.prepare(cfgs[name]) for name, mod in PARTS.items()}
    # the same job again into its folder continues its training; anything else is refused
    train.check_new_folder(out, None if out is None else Path(out) / "train.toml", cfgs["train"])
    folder = new_folder("default", out)
    for k, c in cfgs.items():
        (folder / f"{k}.toml").write_text(dump_toml(c))
    o = Output(folder, "opsplit: the default job" + (" (quick)" if quick else ""))
    o.text("A seeded continuous transformer (paper 002, eq. 7) solved with Lie, Strang, "
           "parallel and hybrid splitting at several N_t and grid sizes, and a short training "
           "of a model's controls on the bundled digits. The configs of each part are in "
           "compare.toml, solve.toml and train.toml; rerun a part with `opsplit <part> --config <part>.toml`.")
    t0 = time.perf_counter()
    print("opsplit: default job" + (" (quick)" if quick else "") + f" -> {relpath(folder)}/ "
          f"({threads.describe()})")
    print("  1/3 schemes compared (error vs cost) ...", flush=True)
    _, table = compare.run(cfgs["compare"], plans["compare"], o, progress)
    for r in table:
        note = ""
        if r["scheme"] == "parallel" and cfgs["compare"]["model"]["constraint"]:
            note = "  (pre-asymptotic with the S1 constraint: see the report)"
        print(f"      {r['scheme']:>8} / {r['solver']:<5} order {r['order']:.2f} "
              f"(theory {r['theory']}; local orders {r['local orders']}){note}")
    print("  2/3 convergence in time and space ...", flush=True)
    solve.run(cfgs["solve"], plans["solve"], o, progress, heading="Convergence in time and space",
              prefix="solve_")
    print("  3/3 training on the digits ...", flush=True)
    try:
        _, _, cont, front = train.run(cfgs["train"], plans["train"], o, progress)
    except Interrupted as e:
        e.command = f"opsplit{' --quick' if quick else ''} --out {relpath(folder)}"
        raise
    for line in console_lines(cont) + frontier_report.console_lines(front):
        print(f"      {line}")
    html = o.finish()
    print(f"opsplit: done in {time.perf_counter() - t0:.0f} s; report: {relpath(html)} "
          f"(and {relpath(folder / 'report.md')})")
    return 0

