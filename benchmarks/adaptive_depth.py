"""Adaptive depth: a continuous model trained at several N_t, solved with a tolerance
instead of an N_t; accuracy and substep calls per input on the digits test set, and the
steps each input takes against its difficulty (the model's margin).

    OMP_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE python benchmarks/adaptive_depth.py [--epochs 12]

The model: the ViT-style classifier of benchmarks/train_digits.py (patch embedding, a
SplitEncoder with 4 heads and a feed-forward term as 5 terms, class-token read-out) with
controls that are Legendre series in t (smooth: the solve can take any step), Strang
splitting with Heun substeps (order 2), T = 4, trained by opsplit's Trainer with N_t drawn
per optimizer step from --train-n-steps (TrainConfig.train_n_steps).  Then on the 360 test
images:

* fixed N_t = 1, 2, 4, 8, 16, 32: accuracy and substep calls per input;
* adaptive steps (step doubling, rtol = atol = --rtols, first step T/2), each input its
  own steps (per_sample=True): accuracy, substep calls per input (mean, min, max),
  accepted steps;
* the margin of each input (top logit minus the runner-up, at N_t = 32) against the steps
  it took (plot: docs/figures/adaptive_depth.png); Spearman's rank correlation printed.

(The text model of the LLM work does not exist in opsplit yet; only digits here.)
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from opsplit.control import Objective, TrainConfig, Trainer  # noqa: E402
from opsplit.data import load_digits  # noqa: E402
from opsplit.models import ImageClassifier, SplitEncoder  # noqa: E402
from opsplit.solvers import Heun  # noqa: E402

FIXED = [1, 2, 4, 8, 16, 32]


def build(seed: int, T: float):
    g = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    enc = SplitEncoder(32, 4, 64, n_steps=4, T=T, scheme="strang", control="legendre", solver=Heun(), generator=g)
    return ImageClassifier(8, 2, 1, 10, enc)


def classify(model, x, **solve):
    """Logits and the solve's statistics (``solve``: Propagator.solve's arguments)."""
    u0 = model.embedding(x)
    sol = model.encoder.solve(u0, **solve)
    u = sol.u if model.norm is None else model.norm(sol.u)
    return model.readout(u), sol.stats


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--epochs", type=int, default=12)
    ap.add_argument("--train-n-steps", type=int, nargs="+", default=[2, 4, 8])
    ap.add_argument("--rtols", type=float, nargs="+", default=[1e-1, 1e-2, 1e-3])
    ap.add_argument("--first-step", type=float, default=None,
                    help="the adaptive solves' first step (default T/2: loose tolerances may take two steps)")
    ap.add_argument("--model", default=str(ROOT / "benchmarks" / "out" / "adaptive_depth_model.pt"),
                    help="the trained weights: loaded if the file exists (same settings), else trained and saved")
    ap.add_argument("--T", type=float, default=4.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--limit", type=int, default=None, help="first test images only (quick runs)")
    ap.add_argument("--figure", default=str(ROOT / "docs" / "figures" / "adaptive_depth.png"))
    ap.add_argument("--json", default=str(ROOT / "benchmarks" / "out" / "adaptive_depth.json"))
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    train, test = load_digits(seed=0)
    model = build(args.seed, args.T)
    cfg = TrainConfig(epochs=args.epochs, batch_size=64, lr=3e-3, weight_decay=0.05, schedule="cosine",
                      warmup_steps=50, grad_clip=1.0, seed=args.seed, eval_every=args.epochs, progress=False,
                      train_n_steps=args.train_n_steps)
    key = {"epochs": args.epochs, "train_n_steps": args.train_n_steps, "T": args.T, "seed": args.seed}
    path = Path(args.model)
    saved = torch.load(path) if path.is_file() else None
    if saved is not None and saved["key"] == key:
        model.load_state_dict(saved["state"])
        print(f"loaded the trained model from {path} ({key})", flush=True)
    else:
        t = time.perf_counter()
        Trainer(model, Objective("cross_entropy"), cfg).fit(train, test)
        print(f"trained {args.epochs} epochs at N_t in {args.train_n_steps} in {time.perf_counter() - t:.0f} s "
              f"(Strang / Heun, Legendre controls in t, T = {args.T:g})", flush=True)
        path.parent.mkdir(parents=True, exist_ok=True)
        torch.save({"key": key, "state": model.state_dict()}, path)
    model.eval()
    x, y = test.inputs, test.targets
    if args.limit:
        x, y = x[: args.limit], y[: args.limit]
    n = len(y)
    rows = []
    print(f"\n{'solve':<24} {'accuracy':>8} {'calls/input':>12} {'min':>5} {'max':>5} {'steps/input':>11} {'s':>6}")
    with torch.no_grad():
        for nt in FIXED:
            t = time.perf_counter()
            logits, stats = classify(model, x, n_steps=nt)
            secs = time.perf_counter() - t
            acc = float((logits.argmax(-1) == y).float().mean())
            calls = stats.n_substep_calls  # the batch shares the steps: the same calls for every input
            rows.append({"solve": f"N_t = {nt}", "accuracy": acc, "calls_per_input": calls, "steps": nt, "seconds": secs})
            print(f"{'fixed N_t = ' + str(nt):<24} {acc:8.4f} {calls:12.1f} {calls:5d} {calls:5d} {nt:11.1f} {secs:6.1f}",
                  flush=True)
            if nt == FIXED[-1]:
                top2 = logits.topk(2, dim=-1).values
                margin = (top2[:, 0] - top2[:, 1]).numpy()
                fine_pred = logits.argmax(-1)
        per_input = {}
        for rtol in args.rtols:
            t = time.perf_counter()
            from opsplit.adaptive import PIController

            ctl = PIController(rtol=rtol, atol=rtol, first_step=args.first_step or args.T / 2)
            logits, stats = classify(model, x, controller=ctl, per_sample=True)
            secs = time.perf_counter() - t
            acc = float((logits.argmax(-1) == y).float().mean())
            calls = np.array([s.n_substep_calls for s in stats.per_sample])
            steps = np.array([s.n_accepted for s in stats.per_sample])
            agree = float((logits.argmax(-1) == fine_pred).float().mean())
            per_input[rtol] = {"calls": calls.tolist(), "steps": steps.tolist()}
            rows.append({"solve": f"rtol = {rtol:g}", "accuracy": acc, "calls_per_input": float(calls.mean()),
                         "calls_min": int(calls.min()), "calls_max": int(calls.max()), "steps": float(steps.mean()),
                         "agree_with_N_t_32": agree, "seconds": secs})
            print(f"{'adaptive rtol = ' + f'{rtol:g}':<24} {acc:8.4f} {calls.mean():12.1f} {calls.min():5d} "
                  f"{calls.max():5d} {steps.mean():11.1f} {secs:6.1f}   (same class as N_t = 32: {agree:.4f})",
                  flush=True)
    from scipy import stats as sps

    print("\nsteps against difficulty (margin at N_t = 32; small margin = hard):")
    for rtol in args.rtols:
        rho = sps.spearmanr(margin, per_input[rtol]["steps"]).statistic
        q = np.quantile(margin, [0.1, 0.9])
        hard = np.mean(np.array(per_input[rtol]["steps"])[margin <= q[0]])
        easy = np.mean(np.array(per_input[rtol]["steps"])[margin >= q[1]])
        print(f"  rtol = {rtol:g}: Spearman rho(margin, steps) = {rho:+.2f}; mean steps, hardest 10% {hard:.1f}, "
              f"easiest 10% {easy:.1f}")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a1, a2) = plt.subplots(1, 2, figsize=(12, 4.4), layout="constrained")
    for rtol in args.rtols:
        a1.scatter(margin, per_input[rtol]["steps"], s=6, alpha=0.5, label=f"rtol = {rtol:g}")
    a1.set_xlabel("margin at N_t = 32 (top logit - runner-up)")
    a1.set_ylabel("accepted steps (each input its own)")
    a1.set_yscale("log")
    a1.legend(fontsize=7)
    a1.set_title("steps against difficulty")
    fx = [r for r in rows if r["solve"].startswith("N_t")]
    ad = [r for r in rows if r["solve"].startswith("rtol")]
    a2.semilogx([r["calls_per_input"] for r in fx], [r["accuracy"] for r in fx], "s-", label="fixed N_t (1..32)")
    a2.semilogx([r["calls_per_input"] for r in ad], [r["accuracy"] for r in ad], "o-", label="adaptive (rtol)")
    a2.set_xlabel("substep calls per input")
    a2.set_ylabel("test accuracy")
    a2.grid(True, which="both", alpha=0.3)
    a2.legend()
    a2.set_title(f"digits test set ({n} images)")
    Path(args.figure).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(args.figure, dpi=110)
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps({"rows": rows, "margin": margin.tolist(),
                                           "per_input": {str(k): v for k, v in per_input.items()},
                                           "args": vars(args)}, indent=1))
    print(f"figure: {args.figure}")
    return rows


if __name__ == "__main__":
    main()
