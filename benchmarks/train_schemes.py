"""The same model trained with the Lie, Strang, parallel and hybrid schemes on digits and
on seed 001's periodic tasks: same architecture, initial layer weights, data, optimizer,
budget and seeds.  Writes a markdown table (test accuracy / 200-step MSE, time per epoch,
peak memory) and learning-curve plots.

Every (task, scheme) run is a fresh subprocess, so its peak RSS (ru_maxrss) is its own.
"saved MB/step" is autograd's saved-tensor memory of one training step on one batch,
counted with torch.autograd.graph.saved_tensors_hooks (as in train_memory.py).

    OMP_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE python benchmarks/train_schemes.py \
        [--digits-epochs 12] [--periodic-epochs 60] [--tasks ...] [--out docs/figures]

The periodic tasks use the forecaster of benchmarks/train_periodic.py (a lift of the last 64
values, sinusoidal positions, input noise 0.1) with each scheme.
"""

from __future__ import annotations

import argparse
import json
import resource
import time
from pathlib import Path

import _common
import torch

SCHEMES = ["lie", "strang", "parallel", "hybrid"]
TASKS = ["digits", "sin", "sin_exp", "square"]


def saved_mb(model, x, loss_fn) -> float:
    """Autograd's saved-tensor memory of one training step, MiB (parameters and input not counted)."""
    model.zero_grad(set_to_none=True)
    with _common.SavedTensors(held=[*model.parameters(), x]) as saved:
        loss_fn(model(x)).backward()
    model.zero_grad(set_to_none=True)
    return saved.peak_mb


def run_one(task: str, scheme: str, args) -> dict:
    from opsplit.control import Trainer

    if task == "digits":
        import train_digits as td

        from opsplit.control import Objective, TrainConfig
        from opsplit.data import load_digits

        ns = argparse.Namespace(seed=args.seed, d_model=32, heads=4, d_ff=64, n_steps=4, T=None, scheme=scheme,
                                control="piecewise_constant", patch=2)
        train, test = load_digits(seed=0)
        model = td.build(ns)
        cfg = TrainConfig(epochs=args.digits_epochs, batch_size=64, lr=3e-3, weight_decay=0.05, schedule="cosine",
                          warmup_steps=50, grad_clip=1.0, seed=args.seed, eval_every=1, progress=False)
        tr = Trainer(model, Objective("cross_entropy"), cfg)
        smb = saved_mb(model, train.inputs[:64], lambda o: torch.nn.functional.cross_entropy(o, train.targets[:64]))
        t = time.perf_counter()
        h = tr.fit(train, test)
        wall = time.perf_counter() - t
        metric = {"test_accuracy": tr.evaluate(test)["accuracy"]}
    else:
        import train_periodic as tp

        from opsplit.data import periodic_task

        ns = tp.settings(seed=args.seed, scheme=scheme, epochs=args.periodic_epochs)
        task_ = periodic_task(task)
        model = tp.build(ns, task_.window)
        obj = tp.objective(ns)
        tr = Trainer(model, obj, tp.config(ns).replace(eval_every=1), augment=tp.augment(ns))
        x0, y0 = task_.train[torch.arange(32)]
        smb = saved_mb(model, x0, lambda o: obj.data_term(o, y0))
        t = time.perf_counter()
        h = tr.fit(task_.train)
        wall = time.perf_counter() - t
        mse, pred = tp.test_mse(model, task_)
        metric = {"test_mse_200": mse}
    ep = [r["epoch_time"] for r in h.epochs]
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {"task": task, "scheme": scheme, **metric, "time_per_epoch_s": sorted(ep)[len(ep) // 2],
            "train_s": wall, "peak_rss_mb": rss, "saved_mb_per_step": smb, "history": h.to_dict(),
            "threads": torch.get_num_threads()}


def plot(rows, task, path):
    plt = _common.pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.5))
    for r in rows:
        if r["task"] != task:
            continue
        st = r["history"]["steps"]
        axes[0].plot([s["step"] for s in st], [s["loss"] for s in st], lw=0.8, label=r["scheme"])
        ep = r["history"]["epochs"]
        key = "eval_accuracy" if task == "digits" else "train_loss"
        axes[1].plot([e["epoch"] for e in ep], [e.get(key) for e in ep], "o-", ms=3, label=r["scheme"])
    axes[0].set_yscale("log")
    axes[0].set_xlabel("optimizer step")
    axes[0].set_ylabel("training objective (batch)")
    axes[1].set_xlabel("epoch")
    axes[1].set_ylabel("test accuracy" if task == "digits" else "train loss (epoch mean)")
    if task != "digits":
        axes[1].set_yscale("log")
    for a in axes:
        a.grid(alpha=0.3)
        a.legend(fontsize=8)
    fig.suptitle(f"{task}: schemes on the same budget")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--tasks", nargs="+", default=TASKS)
    p.add_argument("--schemes", nargs="+", default=SCHEMES)
    p.add_argument("--digits-epochs", type=int, default=12)
    p.add_argument("--periodic-epochs", type=int, default=60)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default="docs/figures")
    p.add_argument("--json", default=str(_common.OUT / "train_schemes.json"))
    p.add_argument("--one", nargs=2, metavar=("TASK", "SCHEME"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.one:
        _common.print_result(run_one(args.one[0], args.one[1], args))
        return None
    rows = []
    for task in args.tasks:
        for scheme in args.schemes:
            r = _common.in_fresh_process(__file__, ["--one", task, scheme, "--digits-epochs", str(args.digits_epochs),
                                                    "--periodic-epochs", str(args.periodic_epochs),
                                                    "--seed", str(args.seed)])
            rows.append(r)
            print(json.dumps({k: v for k, v in r.items() if k != "history"}), flush=True)
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(rows))
    Path(args.out).mkdir(parents=True, exist_ok=True)
    for task in args.tasks:
        plot(rows, task, Path(args.out) / f"train_schemes_{task}.png")
    print("\n| task | scheme | test metric | time / epoch (s) | peak RSS (MB) | saved MB / step |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        m = (f"accuracy {r['test_accuracy']:.4f}" if "test_accuracy" in r else f"200-step MSE {r['test_mse_200']:.4f}")
        print(f"| {r['task']} | {r['scheme']} | {m} | {r['time_per_epoch_s']:.2f} | {r['peak_rss_mb']:.0f} | "
              f"{r['saved_mb_per_step']:.1f} |")
    return rows


if __name__ == "__main__":
    main()
