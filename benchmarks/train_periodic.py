"""Seed 001's periodic-function experiment (§5, Table 1) with an opsplit model: a causal
split encoder (SequenceForecaster: per-window normalisation F, lift, encoder, read-out G)
trained by opsplit's Trainer on fragments of length 100 (next value at every position,
Gaussian noise of std 0.1 on the training inputs: opsplit.data.input_noise), then
predicting 200 future steps autoregressively from unseen contexts; test MSE against
Table 1 and prediction-vs-truth plots.  The defaults are the settings of docs/training.md
(Lie scheme, sinusoidal positions, a lift of the last 64 values, 60 epochs; ~45 s per
function on one thread).

    OMP_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE python benchmarks/train_periodic.py [--functions sin sin_exp square] [--seed 1] [--floor]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import _common
import torch

from opsplit.control import Objective, TrainConfig, Trainer
from opsplit.data import TABLE1_MSE, input_noise, periodic_task, rollout
from opsplit.models import SequenceForecaster, SplitEncoder


def build(args, window, scheme=None, seed=None):
    seed = args.seed if seed is None else seed
    g = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    enc = SplitEncoder(args.d_model, args.heads, args.d_ff, n_steps=args.n_steps, T=args.T,
                       scheme=scheme or args.scheme, control=args.control, causal=True, generator=g)
    return SequenceForecaster(window, enc, delay=args.delay, center=args.center, final_norm=args.final_norm,
                              positions=getattr(args, "positions", "learned"))


def config(args):
    return TrainConfig(epochs=args.epochs, batch_size=args.batch, lr=args.lr, weight_decay=0.0,
                       schedule="cosine", warmup_steps=20, grad_clip=1.0, seed=args.seed, eval_every=args.epochs,
                       progress=args.progress)


def objective(args):
    k = args.loss_from

    def late_positions_mse(out, target):
        """MSE of the next-value predictions at positions >= k (enough context)."""
        return (out[:, k:] - target[:, k:]).square().mean()

    return Objective(late_positions_mse)


def test_mse(model, task, n_steps=None):
    model.eval()
    pred = rollout(lambda w: model(w, n_steps=n_steps), task.contexts, task.horizon)
    return float((pred - task.futures).square().mean()), pred


def square_floor(task, n_phases=200_000):
    """The Bayes-optimal 200-step MSE of the square wave from the test contexts alone: every
    phase phi (grid of n_phases on [0, 2 pi)) for which sign(sin(x + phi)) reproduces a
    context's samples is equally likely; predicting their mean (``soft``) or its sign
    (``hard``) is the best any predictor reading the context can do on average."""
    import math

    phis = torch.arange(n_phases, dtype=torch.float64) * (2 * math.pi / n_phases)
    soft = hard = 0.0
    for c, f in zip(task.contexts.double(), task.futures.double()):
        x = torch.arange(task.window + task.horizon, dtype=torch.float64) * task.dx
        ok = torch.ones(n_phases, dtype=torch.bool)
        for k in range(task.window):
            ok &= torch.sign(torch.sin(x[k] + phis)) == c[k]
        mean = torch.sign(torch.sin(x[None, task.window:] + phis[ok, None])).mean(0)
        soft += float((mean - f).square().mean()) / len(task.contexts)
        hard += float((torch.sign(mean) - f).square().mean()) / len(task.contexts)
    return soft, hard


def plot(task, pred, mse, path):
    plt = _common.pyplot()
    fig, ax = plt.subplots(figsize=(8, 2.8))
    a = task.starts[0]
    xs = torch.arange(a, a + task.window + task.horizon) * task.dx
    ax.plot(xs[:task.window], task.contexts[0], color="tab:blue", label="context (source)")
    ax.plot(xs[task.window:], task.futures[0], color="tab:green", label="truth (target)")
    ax.plot(xs[task.window:], pred[0], "--", color="tab:red", label="prediction")
    ax.set_title(f"{task.name}: 200-step test MSE {mse:.4f} (seed 001 Table 1: {TABLE1_MSE[task.name]})")
    ax.set_xlabel("x")
    ax.legend(fontsize=7, loc="upper left")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def parser():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--functions", nargs="+", default=["sin", "sin_exp", "square"])
    p.add_argument("--epochs", type=int, default=60)
    p.add_argument("--d-model", type=int, default=32)
    p.add_argument("--heads", type=int, default=2)
    p.add_argument("--d-ff", type=int, default=64)
    p.add_argument("--n-steps", type=int, default=2)
    p.add_argument("--T", type=float, default=None)
    p.add_argument("--scheme", default="lie")
    p.add_argument("--control", default="piecewise_constant")
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--delay", type=int, default=64)
    p.add_argument("--positions", default="sinusoidal", choices=["learned", "sinusoidal"])
    p.add_argument("--center", action=argparse.BooleanOptionalAction, default=False)
    p.add_argument("--final-norm", action=argparse.BooleanOptionalAction, default=False)
    p.add_argument("--loss-from", type=int, default=50, help="positions >= this enter the loss")
    p.add_argument("--noise", type=float, default=0.1,
                   help="std of Gaussian noise added to the training inputs (opsplit.data.input_noise)")
    p.add_argument("--figures", default="docs/figures")
    p.add_argument("--floor", action="store_true", help="print the square wave's Bayes floor on the test contexts")
    p.add_argument("--progress", action="store_true")
    return p


def settings(**overrides):
    """This script's defaults (the forecaster and training of docs/training.md) with
    ``overrides``: the one recipe the other training benchmarks reuse."""
    args = parser().parse_args([])
    for k, v in overrides.items():
        if not hasattr(args, k):
            raise AttributeError(f"train_periodic.settings: no setting {k!r}")
        setattr(args, k, v)
    return args


def augment(args):
    """The training augmentation of ``args``: input noise of std ``args.noise`` (or none)."""
    return input_noise(args.noise) if args.noise else None


def main(argv=None):
    args = parser().parse_args(argv)
    rows = []
    if args.floor:
        soft, hard = square_floor(periodic_task("square"))
        print(f"square wave, Bayes-optimal 200-step MSE from the contexts: {soft:.4f} (mean), {hard:.4f} (sign)")
    for name in args.functions:
        task = periodic_task(name)
        model = build(args, task.window)
        tr = Trainer(model, objective(args), config(args), augment=augment(args))
        t = time.perf_counter()
        tr.fit(task.train)
        wall = time.perf_counter() - t
        mse, pred = test_mse(model, task)
        Path(args.figures).mkdir(parents=True, exist_ok=True)
        plot(task, pred, mse, Path(args.figures) / f"periodic_{name}.png")
        rows.append({"function": name, "test_mse_200": mse, "table1": TABLE1_MSE[name],
                     "train_loss_last": tr.history.steps[-1]["loss"], "train_s": wall})
        print(json.dumps(rows[-1]), flush=True)
    print("| function | 200-step test MSE | seed 001 Table 1 | at or below | train time (s) |")
    print("|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['function']} | {r['test_mse_200']:.4f} | {r['table1']:.4f} | "
              f"{'yes' if r['test_mse_200'] <= r['table1'] else 'NO'} | {r['train_s']:.0f} |")
    print(json.dumps({"args": vars(args)}))
    return rows


if __name__ == "__main__":
    main()
