"""Sliced ReLU attention against softmax attention on a long-range task, same budget.

Task (``opsplit.data.flag_retrieval``, generated): sequences of ``--length`` tokens, each a
random symbol of ``--symbols``; one position in the first half is flagged, and every later
position must output the flagged symbol (chance: 1 / symbols).  Model
(``opsplit.models.TokenClassifier`` over ``AttentionDecoder``): embedding, a causal
pre-norm decoder (Lie scheme: attention then a GELU feed-forward term, ``--n-steps``
steps), LayerNorm and a linear read-out at every token.  Every attention variant is built
from the same seed (same embedding, feed-forward, LayerNorm and read-out weights), trained
by ``opsplit.control.Trainer`` on the same sequences in the same order with the same
optimizer, schedule and number of steps, and tested on the same held-out sequences.

Reported per variant: held-out accuracy over all positions after the flag and over those
at least length/2 tokens after it, final training loss, the median wall time per training
step during the run (the trainer's own timer; runs are sequential, so the machine's load
may differ between them), and — after training — one training step of every variant
timed interleaved A B A B in this process (median of ``--pairs`` rounds, and the median
of the per-round ratios to the first variant).  ``--time-lengths`` adds rows of paired
step times only (no training) at other lengths.

    OMP_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE python benchmarks/train_long.py
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from functools import partial
from pathlib import Path

import _common
import torch

from opsplit.control import Objective, TrainConfig, Trainer
from opsplit.data import flag_retrieval, retrieval_accuracy, retrieval_loss
from opsplit.models import AttentionDecoder, TokenClassifier


def build(args, attention: str) -> TokenClassifier:
    g = torch.Generator().manual_seed(args.seed)
    dec = AttentionDecoder(args.d_model, args.heads, args.d_ff, attention=attention, n_steps=args.n_steps,
                           causal=True, bandwidth=args.bandwidth, generator=g)
    return TokenClassifier(2 * args.symbols, args.symbols, dec, generator=torch.Generator().manual_seed(args.seed + 1))


def config(args) -> TrainConfig:
    return TrainConfig(epochs=1, batch_size=args.batch, lr=args.lr, weight_decay=0.0, schedule="cosine",
                       warmup_steps=args.warmup, grad_clip=1.0, seed=args.seed, eval_every=1,
                       eval_batch_size=args.batch, shuffle=False, progress=args.progress)


def step_times(history) -> list[float]:
    t = [r["time"] for r in history.steps]
    return [b - a for a, b in zip([0.0] + t[:-1], t)]


def paired_step_times(args, attentions, length: int, pairs: int) -> dict:
    """One training step (forward, backward, optimizer) of every variant on the same batch,
    interleaved A B A B; one warm-up step each."""
    data = flag_retrieval(args.batch, length, n_symbols=args.symbols, flag_length=args.flag_length, seed=args.seed + 7)
    x, y = data.inputs, data.targets
    runs = {}
    for a in attentions:
        m = build(args, a)
        runs[a] = (m, torch.optim.AdamW(m.parameters(), lr=1e-4))

    def one(a):
        m, opt = runs[a]
        opt.zero_grad(set_to_none=True)
        retrieval_loss(m(x), y).backward()
        opt.step()

    times = _common.interleaved({a: partial(one, a) for a in attentions}, pairs)
    ref = attentions[0]
    out = {}
    for a in attentions:
        r = _common.paired(times[a], times[ref])
        out[a] = {"median_s": r["a_median_s"], "min_s": min(times[a]), "max_s": max(times[a]),
                  "ratio_to_" + ref: r["ratio"], "ratio_min": r["ratio_min"], "ratio_max": r["ratio_max"],
                  "n": pairs}
    return out


def plot_curves(out_dir, attentions, path, title: str) -> None:
    """Training loss per step (30-step running mean) of every variant, from the
    ``steps.csv`` files the trainer wrote under ``out_dir/<attention>/``."""
    import csv

    plt = _common.pyplot()
    fig, ax = plt.subplots(figsize=(6.4, 3.2))
    for a in attentions:
        f = Path(out_dir) / a / "steps.csv"
        if not f.is_file():
            continue
        loss = [float(r["loss"]) for r in csv.DictReader(f.open())]
        k = 30
        smooth = [statistics.mean(loss[max(0, i - k + 1):i + 1]) for i in range(len(loss))]
        ax.plot(range(1, len(loss) + 1), smooth, label=a)
    ax.set_xlabel("training step")
    ax.set_ylabel("training loss (30-step mean)")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--attentions", nargs="+", default=["sliced_relu", "softmax", "none"],
                   choices=["sliced_relu", "softmax", "sliced_bump", "none"])
    p.add_argument("--flag-length", type=int, default=32, help="tokens in the flagged span")
    p.add_argument("--n-steps", type=int, default=1, help="N_t (layers)")
    p.add_argument("--bandwidth", type=float, default=1.0, help="initial bandwidth of sliced_bump")
    p.add_argument("--pairs", type=int, default=7, help="interleaved rounds of the paired step timing")
    _common.options(p, length=4096, steps=300, batch=4, symbols=8, d_model=32, heads=2, d_ff=64, lr=1e-2, warmup=20,
                    seed=0, eval_samples=64, time_pairs=3)
    p.add_argument("--time-lengths", type=int, nargs="*", default=[],
                   help="extra lengths: paired step times only, no training")
    p.add_argument("--time-attentions", nargs="+", default=None,
                   help="variants timed at --time-lengths (default: the trained ones with attention)")
    p.add_argument("--out", default=str(_common.OUT / "train_long"))
    p.add_argument("--figure", default=None, help="write the learning curves here (png)")
    p.add_argument("--plot-only", action="store_true",
                   help="no training: draw --figure from the steps.csv files under --out")
    p.add_argument("--progress", action="store_true")
    args = p.parse_args(argv)
    title = (f"flag retrieval, length {args.length}, flagged span {args.flag_length}, {args.steps} steps x "
             f"batch {args.batch}")
    if args.plot_only:
        if not args.figure:
            p.error("--plot-only needs --figure")
        plot_curves(args.out, args.attentions, args.figure, title)
        return None
    torch.manual_seed(args.seed)
    n_train = args.steps * args.batch
    t = time.perf_counter()
    train = flag_retrieval(n_train, args.length, n_symbols=args.symbols, flag_length=args.flag_length,
                           seed=args.seed, name="train")
    test = flag_retrieval(args.eval_samples, args.length, n_symbols=args.symbols, flag_length=args.flag_length,
                          seed=args.seed + 1000, name="test")
    print(f"data: {n_train} training / {args.eval_samples} test sequences of {args.length} tokens "
          f"({time.perf_counter() - t:.1f} s)", flush=True)
    far = args.length // 2
    metrics = {"accuracy": retrieval_accuracy, "accuracy_far": partial(retrieval_accuracy, min_distance=far)}
    rows = {}
    for a in args.attentions:
        model = build(args, a)
        n_par = sum(q.numel() for q in model.parameters())
        tr = Trainer(model, Objective(retrieval_loss), config(args), metrics=metrics)
        t = time.perf_counter()
        tr.fit(train, test, out_dir=Path(args.out) / a, plot=False)
        wall = time.perf_counter() - t
        ev = tr.history.epochs[-1]
        st = step_times(tr.history)
        losses = [r["loss"] for r in tr.history.steps]
        rows[a] = {"attention": a, "params": n_par, "test_accuracy": ev["eval_accuracy"],
                   "test_accuracy_far": ev["eval_accuracy_far"], "test_loss": ev["eval_loss"],
                   "train_loss_last20": statistics.mean(losses[-20:]), "median_step_s": statistics.median(st),
                   "train_s": sum(st), "wall_s": wall}
        print(json.dumps(rows[a]), flush=True)
    trained = [a for a in args.attentions if a != "none"] or args.attentions
    timing = {args.length: paired_step_times(args, trained, args.length, args.pairs)}
    print(json.dumps({"paired": {str(k): v for k, v in timing.items()}}), flush=True)
    for L in args.time_lengths:
        timing[L] = paired_step_times(args, args.time_attentions or trained, L, args.time_pairs)
        print(json.dumps({"paired": {str(L): timing[L]}}), flush=True)
    print()
    ref = trained[0]
    print(f"length {args.length}, {args.steps} steps x batch {args.batch}, chance {1 / args.symbols:.3f}")
    print(f"| attention | params | test accuracy (all after flag) | test accuracy (>= {far} after flag) | "
          f"final train loss | median s/step (run) | paired s/step | paired ratio to {ref} |")
    print("|---|---|---|---|---|---|---|---|")
    for a, r in rows.items():
        pt = timing[args.length].get(a)
        paired = (f"{pt['median_s']:.3f} | {pt['ratio_to_' + ref]:.2f} ({pt['ratio_min']:.2f}–{pt['ratio_max']:.2f})"
                  if pt else "– | –")
        print(f"| {a} | {r['params']} | {r['test_accuracy']:.3f} | {r['test_accuracy_far']:.3f} | "
              f"{r['train_loss_last20']:.3f} | {r['median_step_s']:.3f} | {paired} |")
    if args.time_lengths:
        print()
        print(f"| length | attention | paired s/step (median, min–max) | ratio to {ref} |")
        print("|---|---|---|---|")
        for L in args.time_lengths:
            for a, pt in timing[L].items():
                print(f"| {L} | {a} | {pt['median_s']:.3f} ({pt['min_s']:.3f}–{pt['max_s']:.3f}), n = {pt['n']} | "
                      f"{pt['ratio_to_' + (args.time_attentions or trained)[0]]:.2f} |")
    if args.figure:
        plot_curves(args.out, args.attentions, args.figure, title)
    print(json.dumps({"args": vars(args)}))
    return rows, timing


if __name__ == "__main__":
    main()
