"""Which training makes a model of its controls theta(t) rather than of its training grid?
Optimal-control tools compared on the digits recipe (benchmarks/train_digits.py) at the
same budget, each trained model measured by the solver-swap test
(``opsplit.control.continuity``: the test accuracy at N_t from half to 16x the training
N_t, with Euler, Heun and RK4 substeps, and the convergence of the logits).

    OMP_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE python benchmarks/continuity.py --variants baseline multi_cost --epochs 40
    OMP_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE python benchmarks/continuity.py --report   # the table of every saved run

Every run writes ``<out>/<variant>_e<epochs>_s<split>.json`` (its settings, training time,
the continuity table) and the trained weights (``.pt``), so the table can be recomputed
(``--reanalyse``).  ``--timing`` runs the paired training-step timing of a variant
against the baseline (A B A B, median of the ratios).

Variants (``VARIANTS``): each is the recipe with a few settings changed; the names say
which (``multi``: ``TrainConfig.n_steps``; ``cost``: drawn with probability
proportional to 1/N_t; ``kin``/``acc``: the kinetic-energy / acceleration running costs of
``opsplit.control.flow_costs`` with the weight after the name; ``pl``: piecewise-linear
controls in t; ``heun2``: trained at N_t = 2 with Heun substeps — the same cost per step as
N_t = 4 with Euler).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

import _common
import torch
import train_digits as td

from opsplit.control import Objective, TrainConfig, Trainer, continuity
from opsplit.data import load_digits
from opsplit.models import ImageClassifier, SplitEncoder
from opsplit.solvers import RK4, ExplicitEuler, Heun

#: the tools compared: overrides of the recipe (model / trainer / objective settings)
VARIANTS = {
    "baseline": {},
    "multi_248": {"train_n_steps": (2, 4, 8)},
    "multi_cost_248": {"train_n_steps": (2, 4, 8), "weights": "cost"},
    "multi_cost_2_16": {"train_n_steps": (2, 4, 8, 16), "weights": "cost"},
    "multi_cost_4_16": {"train_n_steps": (4, 8, 16), "weights": "cost"},
    "kin0.01": {"kinetic": 0.01},
    "kin0.1": {"kinetic": 0.1},
    "kin1": {"kinetic": 1.0},
    "acc0.01": {"acceleration": 0.01},
    "acc0.1": {"acceleration": 0.1},
    "acc1": {"acceleration": 1.0},
    "smooth0.1": {"smoothness": 0.1},
    "pl_multi_cost_2_16": {"control": "piecewise_linear", "train_n_steps": (2, 4, 8, 16), "weights": "cost"},
    "heun2": {"solver": "heun", "train_n_steps": (2,), "reference": 2},
    "multi_cost_2_16_kin0.1": {"train_n_steps": (2, 4, 8, 16), "weights": "cost", "kinetic": 0.1},
    "multi_cost_2_16_kin0.3": {"train_n_steps": (2, 4, 8, 16), "weights": "cost", "kinetic": 0.3},
    "multi_cost_2_16_kin1": {"train_n_steps": (2, 4, 8, 16), "weights": "cost", "kinetic": 1.0},
    "kin0.3": {"kinetic": 0.3},
    "kin1_def1": {"kinetic": 1.0, "defect": 1.0},
    "mc216_kin0.3_def1": {"train_n_steps": (2, 4, 8, 16), "weights": "cost", "kinetic": 0.3, "defect": 1.0},
    "mc216_kin1_def1": {"train_n_steps": (2, 4, 8, 16), "weights": "cost", "kinetic": 1.0, "defect": 1.0},
    "mc248_kin1": {"train_n_steps": (2, 4, 8), "weights": "cost", "kinetic": 1.0},
    "kin3": {"kinetic": 3.0},
    "mc248_heun_kin0.3": {"train_n_steps": (2, 4, 8), "weights": "cost", "solvers": ("euler", "heun"),
                           "solver_weights": "cost", "kinetic": 0.3},
    "mc248_kin0.3": {"train_n_steps": (2, 4, 8), "weights": "cost", "kinetic": 0.3},
    "mc216_heun_kin0.3": {"train_n_steps": (2, 4, 8, 16), "weights": "cost", "solvers": ("euler", "heun"),
                          "solver_weights": "cost", "kinetic": 0.3},
    "kin1_m248w": {"train_n_steps": (2, 4, 8), "weights": (1, 4, 1), "kinetic": 1.0},
    "kin1_m24w": {"train_n_steps": (2, 4), "weights": (1, 3), "kinetic": 1.0},
    "kin1_smooth0.01": {"kinetic": 1.0, "smoothness": 0.01},
    "kin1_smooth0.1": {"kinetic": 1.0, "smoothness": 0.1},
    "defect0.1": {"defect": 0.1},
    "defect1": {"defect": 1.0},
    "multi_cost_2_16_defect0.1": {"train_n_steps": (2, 4, 8, 16), "weights": "cost", "defect": 0.1},
    "multi_cost_2_16_defect1": {"train_n_steps": (2, 4, 8, 16), "weights": "cost", "defect": 1.0},
    "multi_cost_2_16_acc0.1": {"train_n_steps": (2, 4, 8, 16), "weights": "cost", "acceleration": 0.1},
}

SOLVER = {"euler": ExplicitEuler, "heun": Heun, "rk4": RK4}


def build(args, v: dict):
    g = torch.Generator().manual_seed(args.seed)
    torch.manual_seed(args.seed)
    enc = SplitEncoder(args.d_model, args.heads, args.d_ff, n_steps=args.n_steps, T=args.T, scheme=args.scheme,
                       control=v.get("control", args.control), solver=SOLVER[v.get("solver", "euler")](),
                       generator=g)
    return ImageClassifier(8, args.patch, 1, 10, enc)


def objective(v: dict) -> Objective:
    return Objective("cross_entropy", smoothness=v.get("smoothness", 0.0), kinetic=v.get("kinetic", 0.0),
                     acceleration=v.get("acceleration", 0.0), defect=v.get("defect", 0.0),
                     defect_fraction=v.get("defect_fraction", 0.25))


def train_config(args, v: dict) -> TrainConfig:
    tns = v.get("train_n_steps")
    tns = tuple(tns) if tns else None
    sol = tuple(v["solvers"]) if v.get("solvers") else None
    return TrainConfig(solvers=sol, solvers_weights=v.get("solver_weights") if sol else None,
                       epochs=args.epochs, batch_size=args.batch, lr=args.lr, weight_decay=args.wd,
                       schedule="cosine", warmup_steps=args.warmup, grad_clip=1.0, seed=args.seed, eval_every=10**6,
                       progress=False, n_steps=tns, n_steps_weights=(tuple(v["weights"]) if isinstance(v.get("weights"), (list, tuple))
                                              else v.get("weights")) if tns else None)


def analyse(model, test, args) -> dict:
    t = time.perf_counter()
    c = continuity(model, test, reference=args.n_steps, n_steps=args.eval_n, solvers=("trained", "heun", "rk4"),
                   schemes=tuple(args.schemes))
    d = c.to_dict()
    d["seconds"] = time.perf_counter() - t
    d["markdown"] = c.markdown()
    return d


def run_one(name: str, args) -> dict:
    v = VARIANTS[name]
    a = td.settings(epochs=args.epochs, split_seed=args.split, seed=args.seed)
    a.eval_n = args.eval_n
    train, test = load_digits(seed=args.split)
    model = build(a, v)
    trainer = Trainer(model, objective(v), train_config(a, v), augment=td.augment(a))
    load0 = os.getloadavg()[0]
    t = time.perf_counter()
    trainer.fit(train, None)
    wall = time.perf_counter() - t
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stem = f"{name}_e{args.epochs}_s{args.split}"
    torch.save(model.state_dict(), out / f"{stem}.pt")
    res = {"variant": name, "overrides": {k: list(x) if isinstance(x, tuple) else x for k, x in v.items()},
           "epochs": args.epochs, "split": args.split, "seed": args.seed, "train_s": trainer.elapsed, "wall_s": wall,
           "load": [load0, os.getloadavg()[0]], "final_loss": statistics.fmean(r["loss"] for r in trainer.history.steps[-20:])}
    args.n_steps = v.get("reference", a.n_steps)
    res["continuity"] = analyse(model, test, args)
    (out / f"{stem}.json").write_text(json.dumps(res, indent=1))
    return res


def summary(res: dict) -> str:
    c = res["continuity"]
    rows = c["rows"]
    ref = c["reference"]["accuracy"]

    def acc(solver, n):
        for r in rows:
            if r["solver"] == solver and r["n_steps"] == n and r["scheme"] != "strang":
                return r["accuracy"]
        return float("nan")

    tr = c["reference"]["solver"]
    ns = sorted({r["n_steps"] for r in rows})
    cells = " ".join(f"{n}:{100 * acc(tr, n):.2f}" for n in ns)
    return (f"{res['variant']:>24} e{res['epochs']} s{res['split']}  train {res['train_s']:6.1f}s  "
            f"ref {100 * ref:.2f}  [{cells}]  heun@N {100 * acc('heun', 4):.2f} rk4@N {100 * acc('rk4', 4):.2f} "
            f"rk4@16 {100 * acc('rk4', 16):.2f}  order {c['order']:.2f}  err {[f'{e:.2g}' for e in c['errors']]}")


def markdown(results: list[dict]) -> str:
    """The comparison table of docs/continuity.md: per run, the test accuracy at every N_t with
    the model's own solver, with Heun and RK4 at the training grid, the worst refined setting
    (N_t >= the training grid, any solver) and the logits' fitted order."""
    lines = ["| variant | N_t = 2 | **N_t = 4** | 8 | 16 | 32 | 64 | Heun (4) | RK4 (4) | worst refined | order |",
             "|---" * 11 + "|"]
    for res in results:
        c = res["continuity"]
        ref = c["reference"]
        own = {r["n_steps"]: r["accuracy"] for r in c["rows"] if r["solver"] == ref["solver"]
               and r["scheme"] == ref["scheme"]}
        at = {(r["solver"], r["n_steps"]): r["accuracy"] for r in c["rows"]}
        refined = [r for r in c["rows"] if r["n_steps"] >= ref["n_steps"] and not r["reference"]]
        worst = min(refined, key=lambda r: r["delta"])
        cells = [f"{100 * own.get(n, float('nan')):.2f}" for n in (2, 4, 8, 16, 32, 64)]
        cells[1] = f"**{cells[1]}**"
        cells += [f"{100 * at.get(('heun', ref['n_steps']), float('nan')):.2f}",
                  f"{100 * at.get(('rk4', ref['n_steps']), float('nan')):.2f}",
                  f"{100 * worst['delta']:+.2f} ({worst['solver']}, {worst['n_steps']})", f"{c['order']:.2f}"]
        lines.append(f"| {res['variant']} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def timing(args, names, rounds: int, chunk: int = 23) -> dict:
    """Training cost of each variant against the first (the baseline): each round runs
    ``chunk`` optimizer steps (one epoch of the recipe: 23 batches of 64) of every variant
    in turn on the same batches, each variant drawing its own N_t; the median over
    ``rounds`` of the per-round time ratios to the first variant."""
    from opsplit.data import TensorData

    a = td.settings(epochs=1, split_seed=args.split, seed=args.seed)
    train, _ = load_digits(seed=args.split)
    runs = {}
    for name in names:
        v = VARIANTS[name]
        m = build(a, v)
        tr = Trainer(m, objective(v), train_config(a, v), augment=td.augment(a))
        tr.model.train()
        runs[name] = tr
    batches = [torch.arange(i * a.batch, (i + 1) * a.batch) % len(train) for i in range(chunk)]
    return paired_steps(runs, TensorData(train.inputs, train.targets), batches, rounds)


def paired_steps(runs: dict, data, batches: list, rounds: int) -> dict:
    """Paired training cost: each round runs the optimizer steps of ``batches`` on ``data``
    with every trainer of ``runs`` in turn (A B A B ...); per trainer the median round time
    and the median, min and max over ``rounds`` of its per-round time ratio to the first
    trainer (one warm-up round not counted)."""
    def steps(tr):
        for idx in batches:
            tr.train_step(data, idx)

    times = _common.interleaved({k: lambda tr=tr: steps(tr) for k, tr in runs.items()}, rounds, warmup=1)
    base = next(iter(runs))
    out = {}
    for k in runs:
        p = _common.paired(times[k], times[base])
        out[k] = {"median_s": p["a_median_s"], "ratio_median": p["ratio"], "ratio_min": p["ratio_min"],
                  "ratio_max": p["ratio_max"]}
    return out


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--variants", nargs="+", default=["baseline"], choices=sorted(VARIANTS))
    p.add_argument("--epochs", type=int, default=100)
    p.add_argument("--split", type=int, default=0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--eval-n", type=int, nargs="+", default=[2, 4, 8, 16, 32, 64])
    p.add_argument("--schemes", nargs="+", default=["trained"])
    p.add_argument("--out", default="benchmarks/out/continuity")
    p.add_argument("--report", action="store_true")
    p.add_argument("--reanalyse", action="store_true", help="recompute the continuity tables of the saved runs "
                   "of --variants (--epochs, --split) from their weights")
    p.add_argument("--timing", type=int, default=0, help="paired step timing, this many rounds")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    if args.report:
        results = [json.loads(f.read_text()) for f in sorted(Path(args.out).glob(f"*_e{args.epochs}_s{args.split}.json"))]
        order = {k: i for i, k in enumerate(VARIANTS)}
        results.sort(key=lambda r: order.get(r["variant"], 999))
        for r in results:
            print(summary(r))
        print()
        print(markdown(results))
        return
    if args.reanalyse:
        for name in args.variants:
            v = VARIANTS[name]
            stem = str(Path(args.out) / f"{name}_e{args.epochs}_s{args.split}")
            res = json.loads(Path(stem + ".json").read_text())
            a = td.settings(epochs=args.epochs, split_seed=args.split, seed=args.seed)
            model = build(a, v)
            model.load_state_dict(torch.load(stem + ".pt"))
            args.n_steps = v.get("reference", a.n_steps)
            res["continuity"] = analyse(model, load_digits(seed=args.split)[1], args)
            Path(stem + ".json").write_text(json.dumps(res, indent=1))
            print(summary(res), flush=True)
        return
    if args.timing:
        print(json.dumps(timing(args, args.variants, args.timing), indent=1), f"load {os.getloadavg()}")
        return
    for name in args.variants:
        res = run_one(name, args)
        print(summary(res), flush=True)


if __name__ == "__main__":
    main()
