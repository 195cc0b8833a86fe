"""Train a continuous ViT-style model (paper 002, §4.2, eq. 36: patch embedding F, split
encoder, class-token read-out G) on scikit-learn's bundled digits with opsplit's Trainer;
report the held-out test accuracy and the wall time, for one split or over several
(``--splits 0-4``: one run per split seed and weight seed, a table with mean and minimum).

    OMP_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE python benchmarks/train_digits.py --splits 0-4

The recipe (the defaults): d_model 32, 4 heads, d_ff 64, N_t = 4 (hybrid scheme,
piecewise-constant controls), AdamW lr 3e-3, weight decay 0.05, cosine schedule with 50
warm-up steps, gradient clipping at 1, batch 64, 100 epochs, and every training image
moved by a small random affine map (rotation <= 10 degrees, scaling <= 10 %, translation
<= 0.5 pixel; ``opsplit.data.random_affine``).  Continuous in time: every step solves the
model at an N_t drawn from (2, 4, 8) with probability proportional to 1/N_t
(``TrainConfig.n_steps_weights="cost"``) and with a substep solver drawn from (Euler,
Heun) with probability proportional to 1/stages (``TrainConfig.solvers``), and the
objective adds the flow's relative kinetic energy with weight 0.3 (``Objective(kinetic=...)``):
about 1.14 times the field evaluations of one-N_t training; docs/continuity.md.  Each run is then measured
by the solver-swap test (``opsplit.control.continuity``: N_t = 2 ... 64, Heun and RK4
substeps, the logits' convergence order), printed as a second table.  The one-N_t
training of the previous revision is ``--train-n-steps 4 --train-solvers --kinetic 0``; the
recipe before it (60 epochs, no augmentation, one N_t) adds ``--epochs 60 --no-augment``.
Results in docs/training.md and docs/continuity.md.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import _common
import torch

from opsplit.control import Objective, TrainConfig, Trainer
from opsplit.data import load_digits, random_affine, random_shift
from opsplit.models import ImageClassifier, SplitEncoder

#: the recipe (the command-line defaults)
DEFAULTS = dict(
    epochs=100,
    d_model=32,
    heads=4,
    d_ff=64,
    n_steps=4,
    T=None,
    patch=2,
    scheme="hybrid",
    control="piecewise_constant",
    lr=3e-3,
    wd=0.05,
    batch=64,
    warmup=50,
    no_augment=False,
    shift=0,
    rotate=10.0,
    scale=0.1,
    shear=0.0,
    translate=0.5,
    train_n_steps=(2, 4, 8),
    n_steps_weights="cost",
    train_solvers=("euler", "heun"),
    solver_weights="cost",
    kinetic=0.3,
    acceleration=0.0,
    defect=0.0,
    seed=0,
    split_seed=0,
    gradient="backprop",
)


def settings(**overrides) -> argparse.Namespace:
    """The recipe's settings (:data:`DEFAULTS`) with ``overrides``."""
    unknown = set(overrides) - set(DEFAULTS)
    if unknown:
        raise ValueError(f"settings: unknown keys {sorted(unknown)}")
    return argparse.Namespace(**{**DEFAULTS, **overrides})


def build(args):
    g = torch.Generator().manual_seed(args.seed)
    torch.manual_seed(args.seed)
    enc = SplitEncoder(
        args.d_model,
        args.heads,
        args.d_ff,
        n_steps=args.n_steps,
        T=args.T,
        scheme=args.scheme,
        control=args.control,
        generator=g,
    )
    return ImageClassifier(8, args.patch, 1, 10, enc)


def augment(args):
    """The training augmentation of ``args`` (``None``: none, or ``no_augment``): whole-pixel
    shifts (``shift``) or a small random affine map resampled bilinearly (``rotate``,
    ``scale``, ``shear``, ``translate``; the recipe's)."""
    if getattr(args, "no_augment", False):
        return None
    if args.shift:
        return lambda x, g: random_shift(x, g, max_shift=args.shift)
    if args.rotate or args.scale or args.shear or args.translate:
        return random_affine(
            rotate=args.rotate, scale=args.scale, shear=args.shear, shift=args.translate
        )
    return None


def config(args, *, progress=False, eval_every=5):
    tns = tuple(args.train_n_steps) if args.train_n_steps else None
    if tns == (args.n_steps,):
        tns = None
    return TrainConfig(
        epochs=args.epochs,
        batch_size=args.batch,
        lr=args.lr,
        weight_decay=args.wd,
        schedule="cosine",
        warmup_steps=args.warmup,
        grad_clip=1.0,
        seed=args.seed,
        eval_every=eval_every,
        progress=progress,
        gradient=args.gradient,
        n_steps=tns,
        n_steps_weights=(None if args.n_steps_weights == "uniform" else args.n_steps_weights) if tns else None,
        solvers=tuple(args.train_solvers) if args.train_solvers else None,
        solvers_weights=(None if args.solver_weights == "uniform" else args.solver_weights)
        if args.train_solvers else None,
    )


def objective(args) -> Objective:
    """Cross-entropy and the flow costs of ``args`` (``kinetic``, ``acceleration``, ``defect``)."""
    return Objective("cross_entropy", kinetic=args.kinetic, acceleration=args.acceleration, defect=args.defect)


#: the solver-swap test of every run: N_t, substep solvers (besides the model's own), levels
CONTINUITY_N = (2, 4, 8, 16, 32, 64)


def measure_continuity(model, test, n_steps: int) -> dict:
    """``opsplit.control.continuity`` of a trained model: the test accuracy at N_t = 2 ... 64
    with Euler, at N_t >= the training grid with Heun and RK4, the logits' convergence to the
    N_t = 16 x n_steps solution; a dict of its table and summary."""
    import warnings

    from opsplit.control import continuity

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="There is a performance drop")
        c = continuity(model, test, n_steps=[n for n in CONTINUITY_N], reference=n_steps,
                       solvers=["trained", "heun", "rk4"])
    d = c.to_dict()
    d["markdown"] = c.markdown()
    return d


def run(args, *, out_dir=None, progress=False, verbose=True, continuity=True, save=None) -> dict:
    """One training run (split ``args.split_seed``, weights and data order ``args.seed``)."""
    train, test = load_digits(seed=args.split_seed)
    model = build(args)
    trainer = Trainer(model, objective(args), config(args, progress=progress), augment=augment(args))
    t = time.perf_counter()
    hist = trainer.fit(train, test, out_dir=out_dir)
    wall = time.perf_counter() - t
    if save is not None:  # the trained weights (a state dict), for later measurements
        Path(save).parent.mkdir(parents=True, exist_ok=True)
        torch.save(model.state_dict(), save)
    res = trainer.evaluate(test)
    if verbose:
        for r in hist.epochs:
            print(
                f"epoch {r['epoch']:3d}  train {r['train_loss']:.4f}  test acc "
                f"{r.get('eval_accuracy', float('nan')):.4f}  t={r['time']:.0f}s"
            )
    n = len(test)
    return {
        "split_seed": args.split_seed,
        "seed": args.seed,
        "test_accuracy": res["accuracy"],
        "test_errors": round(n * (1 - res["accuracy"])),
        "n_test": n,
        "test_loss": res["loss"],
        "wall_s": wall,
        "train_time_s": trainer.elapsed,
        "threads": torch.get_num_threads(),
        "params": sum(p.numel() for p in model.parameters()),
        "loadavg": _common.loadavg(),
        "nearest_neighbour_accuracy": nearest_neighbour_accuracy(train, test.inputs, test.targets),
        "continuity": measure_continuity(model, test, args.n_steps) if continuity else None,
    }


def nearest_neighbour_accuracy(train, images, targets) -> float:
    """Accuracy of the 1-nearest-neighbour classifier on the training images (Euclidean
    pixel distance; no training): the reference column of the table."""
    d = torch.cdist(images.flatten(1).double(), train.inputs.flatten(1).double())
    return float((train.targets[d.argmin(1)] == targets).double().mean())


def table(results: list[dict]) -> str:
    """Markdown table: one row per split seed, one column per weight seed, the
    1-nearest-neighbour reference, wall times and load; mean and minimum over the splits."""
    splits = sorted({r["split_seed"] for r in results})
    seeds = sorted({r["seed"] for r in results})
    acc = {(r["split_seed"], r["seed"]): r for r in results}
    lines = [
        "| split seed | "
        + " | ".join(f"weight seed {s}" for s in seeds)
        + " | 1-nearest neighbour | wall (s) | load |",
        "|---" * (len(seeds) + 4) + "|",
    ]
    for sp in splits:
        cells = [
            f"{100 * acc[sp, s]['test_accuracy']:.2f} % ({acc[sp, s]['test_errors']})"
            if (sp, s) in acc
            else ""
            for s in seeds
        ]
        runs = [acc[sp, s] for s in seeds if (sp, s) in acc]
        nn = f"{100 * runs[0]['nearest_neighbour_accuracy']:.2f} %"
        walls = ", ".join(f"{r['wall_s']:.0f}" for r in runs)
        loads = ", ".join(f"{r['loadavg']:.1f}" for r in runs)
        lines.append(f"| {sp} | " + " | ".join(cells) + f" | {nn} | {walls} | {loads} |")
    nn_all = [
        next(r for r in results if r["split_seed"] == sp)["nearest_neighbour_accuracy"]
        for sp in splits
    ]
    for name, f in (("mean", statistics.fmean), ("min", min), ("max", max)):
        cells = []
        for s in seeds:
            v = [acc[sp, s]["test_accuracy"] for sp in splits if (sp, s) in acc]
            cells.append(f"{100 * f(v):.2f} %" if v else "")
        lines.append(f"| {name} | " + " | ".join(cells) + f" | {100 * f(nn_all):.2f} % | | |")
    return "\n".join(lines)


def continuity_table(results: list[dict]) -> str:
    """Markdown: per run, the test accuracy at every N_t with the model's own solver, with Heun
    and RK4 at the training N_t, the worst refined setting (N_t >= the training grid, any
    solver) and the logits' fitted order; the mean over runs."""
    ns = list(CONTINUITY_N)
    head = ("| split | " + " | ".join(f"N_t = {n}" for n in ns)
            + " | Heun (N) | RK4 (N) | worst refined | order |")
    lines = [head, "|---" * (len(ns) + 5) + "|"]
    cols = []
    for r in results:
        c = r["continuity"]
        ref = c["reference"]
        own = {x["n_steps"]: x["accuracy"] for x in c["rows"] if x["solver"] == ref["solver"]
               and x["scheme"] == ref["scheme"]}
        at = {(x["solver"], x["n_steps"]): x["accuracy"] for x in c["rows"] if x["scheme"] == ref["scheme"]}
        refined = [x for x in c["rows"] if x["n_steps"] >= ref["n_steps"] and not x["reference"]]
        worst = min(x["delta"] for x in refined)
        row = [own.get(n, float("nan")) for n in ns] + [at.get(("heun", ref["n_steps"]), float("nan")),
                                                         at.get(("rk4", ref["n_steps"]), float("nan")),
                                                         worst, c["order"]]
        cols.append(row)
        cells = [f"{100 * v:.2f}" for v in row[:-2]] + [f"{100 * row[-2]:+.2f} pt", f"{row[-1]:.2f}"]
        lines.append(f"| {r['split_seed']} (seed {r['seed']}) | " + " | ".join(cells) + " |")
    mean = [statistics.fmean(c[i] for c in cols) for i in range(len(cols[0]))]
    cells = [f"{100 * v:.2f}" for v in mean[:-2]] + [f"{100 * mean[-2]:+.2f} pt", f"{mean[-1]:.2f}"]
    lines.append("| mean | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    d = DEFAULTS
    p.add_argument("--epochs", type=int, default=d["epochs"])
    p.add_argument("--d-model", type=int, default=d["d_model"])
    p.add_argument("--heads", type=int, default=d["heads"])
    p.add_argument("--d-ff", type=int, default=d["d_ff"])
    p.add_argument("--n-steps", type=int, default=d["n_steps"], help="N_t")
    p.add_argument("--T", type=float, default=d["T"])
    p.add_argument("--patch", type=int, default=d["patch"])
    p.add_argument("--scheme", default=d["scheme"])
    p.add_argument("--control", default=d["control"])
    p.add_argument("--lr", type=float, default=d["lr"])
    p.add_argument("--wd", type=float, default=d["wd"])
    p.add_argument("--batch", type=int, default=d["batch"])
    p.add_argument(
        "--warmup", type=int, default=d["warmup"], help="warm-up steps of the cosine schedule"
    )
    p.add_argument("--no-augment", action="store_true", help="train on the images as they are")
    p.add_argument(
        "--shift",
        type=int,
        default=d["shift"],
        help="whole-pixel random shifts (random_shift) instead of the affine augmentation",
    )
    p.add_argument("--rotate", type=float, default=d["rotate"], help="random_affine: degrees")
    p.add_argument(
        "--scale", type=float, default=d["scale"], help="random_affine: relative scaling"
    )
    p.add_argument("--shear", type=float, default=d["shear"], help="random_affine: shear factor")
    p.add_argument("--translate", type=float, default=d["translate"], help="random_affine: pixels")
    p.add_argument(
        "--train-n-steps",
        type=int,
        nargs="+",
        default=d["train_n_steps"],
        help="multi-resolution training: N_t drawn per step from these (--train-n-steps 4: one N_t)",
    )
    p.add_argument("--n-steps-weights", default=d["n_steps_weights"], choices=("cost", "uniform"),
                   help="how the N_t of --train-n-steps are drawn (cost: probability proportional to 1/N_t)")
    p.add_argument("--train-solvers", nargs="*", default=d["train_solvers"], choices=("euler", "heun", "rk4"),
                   help="substep solvers drawn per step (none: the model's own, explicit Euler)")
    p.add_argument("--solver-weights", default=d["solver_weights"], choices=("cost", "uniform"),
                   help="how they are drawn (cost: probability proportional to 1/stages)")
    p.add_argument("--kinetic", type=float, default=d["kinetic"], help="weight of the flow's relative kinetic energy")
    p.add_argument("--acceleration", type=float, default=d["acceleration"], help="weight of its acceleration")
    p.add_argument("--defect", type=float, default=d["defect"], help="weight of the steps' local error estimate")
    p.add_argument("--seed", type=int, default=d["seed"], help="weights, data order, augmentation")
    p.add_argument(
        "--split-seed", type=int, default=d["split_seed"], help="the stratified train/test split"
    )
    p.add_argument(
        "--splits",
        type=_common.seed_list,
        default=None,
        help="several split seeds, e.g. 0-4 (overrides --split-seed): a table with mean / min",
    )
    p.add_argument(
        "--seeds",
        type=_common.seed_list,
        default=None,
        help="several weight seeds, e.g. 0-2 (overrides --seed)",
    )
    p.add_argument("--gradient", default=d["gradient"])
    p.add_argument(
        "--threads", type=int, default=None, help="torch.set_num_threads (default: torch's)"
    )
    p.add_argument(
        "--out", default=None, help="output folder (one run) / JSON of the results (several)"
    )
    p.add_argument("--progress", action="store_true")
    return p


def main(argv=None):
    args = parser().parse_args(argv)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    if args.splits is None and args.seeds is None:
        out = run(args, out_dir=args.out, progress=args.progress)
        out["args"] = vars(args)
        print(json.dumps(out, indent=1))
        return out
    results = []
    for sp in args.splits or [args.split_seed]:
        for s in args.seeds or [args.seed]:
            a = argparse.Namespace(**{**vars(args), "split_seed": sp, "seed": s})
            save = None if not args.out else str(Path(args.out).with_suffix("")) + f"_split{sp}_seed{s}.pt"
            r = run(a, verbose=False, save=save)
            results.append(r)
            print(
                f"split seed {sp}  weight seed {s}  test accuracy {100 * r['test_accuracy']:.2f} % "
                f"({r['test_errors']} / {r['n_test']} wrong)  {r['wall_s']:.0f} s  load {r['loadavg']:.2f}",
                flush=True,
            )
    print(table(results))
    if all(r.get("continuity") for r in results):
        print()
        print(continuity_table(results))
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps({"args": vars(args), "results": results}, indent=1))
    return results


if __name__ == "__main__":
    main()
