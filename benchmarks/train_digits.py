"""Train a continuous ViT-style model (paper 002, §4.2, eq. 36: patch embedding F, split
encoder, class-token read-out G) on scikit-learn's bundled digits with opsplit's Trainer;
report the held-out test accuracy and the wall time.

    OMP_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE python benchmarks/train_digits.py --out benchmarks/out/digits
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from opsplit.control import Objective, TrainConfig, Trainer  # noqa: E402
from opsplit.data import load_digits, random_shift  # noqa: E402
from opsplit.models import ImageClassifier, SplitEncoder  # noqa: E402


def build(args):
    g = torch.Generator().manual_seed(args.seed)
    torch.manual_seed(args.seed)
    enc = SplitEncoder(args.d_model, args.heads, args.d_ff, n_steps=args.n_steps, T=args.T, scheme=args.scheme,
                       control=args.control, generator=g)
    return ImageClassifier(8, args.patch, 1, 10, enc)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--epochs", type=int, default=60)
    p.add_argument("--d-model", type=int, default=32)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--d-ff", type=int, default=64)
    p.add_argument("--n-steps", type=int, default=4)
    p.add_argument("--T", type=float, default=None)
    p.add_argument("--patch", type=int, default=2)
    p.add_argument("--scheme", default="hybrid")
    p.add_argument("--control", default="piecewise_constant")
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--wd", type=float, default=0.05)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--shift", type=int, default=0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--split-seed", type=int, default=0)
    p.add_argument("--gradient", default="backprop")
    p.add_argument("--out", default=None)
    p.add_argument("--progress", action="store_true")
    args = p.parse_args(argv)
    train, test = load_digits(seed=args.split_seed)
    model = build(args)
    cfg = TrainConfig(epochs=args.epochs, batch_size=args.batch, lr=args.lr, weight_decay=args.wd,
                      schedule="cosine", warmup_steps=50, grad_clip=1.0, seed=args.seed, eval_every=5,
                      progress=args.progress, gradient=args.gradient)
    aug = (lambda x, g: random_shift(x, g, max_shift=args.shift)) if args.shift else None
    trainer = Trainer(model, Objective("cross_entropy"), cfg, augment=aug)
    t = time.perf_counter()
    hist = trainer.fit(train, test, out_dir=args.out)
    wall = time.perf_counter() - t
    res = trainer.evaluate(test)
    out = {"test_accuracy": res["accuracy"], "test_loss": res["loss"], "wall_s": wall,
           "train_time_s": trainer.elapsed, "epochs": args.epochs, "split": train.info,
           "threads": torch.get_num_threads(), "params": sum(p.numel() for p in model.parameters()),
           "args": vars(args)}
    for r in hist.epochs:
        print(f"epoch {r['epoch']:3d}  train {r['train_loss']:.4f}  test acc {r.get('eval_accuracy', float('nan')):.4f}"
              f"  t={r['time']:.0f}s")
    print(json.dumps(out, indent=1))
    return out


if __name__ == "__main__":
    main()
