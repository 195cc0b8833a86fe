"""Resolution of a trained model in time: the digits model (and the periodic sin task) is
trained at N_t = 4 with each kind of control in t and evaluated, without retraining, at
N_t = 2, 4, 8, 16, 32 on the same interval [0, T] (the controls are functions of t, so
the model is solved with another time step; for piecewise-constant controls a finer N_t
uses every layer's weights on several shorter steps).

    OMP_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE python benchmarks/train_resolution.py [--epochs 8] [--T 1] [--train-n-steps 4 8 16]

``--T`` sets the interval, hence the training time step dt = T / 4 (default T = 4: dt = 1,
the paper's choice); ``--train-n-steps 2 4 8`` trains at several N_t instead (one drawn per
optimizer step, TrainConfig.n_steps).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import _common

from opsplit.control import Objective, TrainConfig, Trainer
from opsplit.data import load_digits, periodic_task

KINDS = ["piecewise_constant", "piecewise_linear", "legendre"]
LEVELS = [2, 4, 8, 16, 32]


def digits(kind, args):
    import train_digits as td

    ns = argparse.Namespace(seed=args.seed, d_model=32, heads=4, d_ff=64, n_steps=4, T=args.T, scheme="hybrid",
                            control=kind, patch=2)
    train, test = load_digits(seed=0)
    model = td.build(ns)
    cfg = TrainConfig(epochs=args.epochs, batch_size=64, lr=3e-3, weight_decay=0.05, schedule="cosine",
                      warmup_steps=50, grad_clip=1.0, seed=args.seed, eval_every=args.epochs, progress=False,
                      n_steps=args.train_n_steps)
    tr = Trainer(model, Objective("cross_entropy"), cfg)
    t = time.perf_counter()
    tr.fit(train, test)
    wall = time.perf_counter() - t
    return {n: tr.evaluate(test, n_steps=n)["accuracy"] for n in LEVELS}, wall


def periodic(kind, args):
    import train_periodic as tp

    ns = tp.settings(seed=args.seed, n_steps=4, T=args.T / 2, control=kind, epochs=args.periodic_epochs)
    task = periodic_task("sin")
    model = tp.build(ns, task.window)
    tr = Trainer(model, tp.objective(ns), tp.config(ns).replace(n_steps=args.train_n_steps),
                 augment=tp.augment(ns))
    t = time.perf_counter()
    tr.fit(task.train)
    wall = time.perf_counter() - t
    return {n: tp.test_mse(model, task, n_steps=n)[0] for n in LEVELS}, wall


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--epochs", type=int, default=8)
    p.add_argument("--periodic-epochs", type=int, default=30)
    p.add_argument("--kinds", nargs="+", default=KINDS)
    p.add_argument("--tasks", nargs="+", default=["digits", "sin"])
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--T", type=float, default=4.0,
                   help="final time of the digits model (dt = T/4 in training); the sin model uses T/2")
    p.add_argument("--train-n-steps", type=int, nargs="+", default=None,
                   help="multi-resolution training: N_t drawn per step from these (TrainConfig.n_steps)")
    p.add_argument("--json", default=str(_common.OUT / "train_resolution.json"))
    args = p.parse_args(argv)
    rows = []
    for task in args.tasks:
        for kind in args.kinds:
            res, wall = (digits if task == "digits" else periodic)(kind, args)
            rows.append({"task": task, "control": kind, "train_s": wall, **{str(k): v for k, v in res.items()}})
            print(json.dumps(rows[-1]), flush=True)
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(rows, indent=1))
    trained = set(args.train_n_steps or [4])
    print("\n| task (metric) | control in t | " + " | ".join(f"N_t = {n}" for n in LEVELS) + " |")
    print("|---|---|" + "---|" * len(LEVELS))
    for r in rows:
        metric = "test accuracy" if r["task"] == "digits" else "200-step MSE"
        fmt = "{:.4f}"
        print(f"| {r['task']} ({metric}) | {r['control']} | " + " | ".join(
            fmt.format(r[str(n)]) + (" (trained)" if n in trained else "") for n in LEVELS) + " |")
    return rows


if __name__ == "__main__":
    main()
