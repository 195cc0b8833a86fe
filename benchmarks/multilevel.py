"""Multilevel training in time and one model for every depth (docs/multilevel.md), on the
digits recipe of benchmarks/train_digits.py and the text recipe of
benchmarks/continuity_text.py.

    # digits: the single-level recipe and the multilevel one, paired A B A B over split seeds 0-4
    OMP_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE python benchmarks/multilevel.py digits --variants single multilevel --splits 0-4
    # digits: the frontier model and models trained at N_t = 1, 2, 4 alone
    OMP_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE python benchmarks/multilevel.py digits --variants one@4 frontier one@1 one@2 --splits 0-4
    # text: one run of a variant of the documented text recipe
    OMP_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE python benchmarks/multilevel.py text --variants multilevel
    # text: paired training cost of the variants against the first, per level (a prefix of each)
    OMP_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE python benchmarks/multilevel.py text-timing --variants single multilevel
    python benchmarks/multilevel.py report

Every run appends one JSON line to ``<out>/<task>.jsonl``: the variant and its settings,
the CPU time of the whole run (``time.process_time``, one thread: model, training with its
evaluations), the accuracy (digits: test accuracy in %; text: bits/char on the
deduplicated validation text) at the training grid, the continuity rows (N_t from 2x to
16x the grid, Heun and RK4 at the grid) and the frontier (N_t = T/4, T/2, T, 2T, the
controls averaged over a step longer than a piece).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
import warnings
from pathlib import Path

import _common
import torch
import train_digits as td

from opsplit.control import Objective, Trainer, continuity, frontier
from opsplit.data import load_digits

#: the digits variants: overrides of the train_digits recipe, and of its TrainConfig
DIGITS = {
    # the single-level continuous recipe (docs/continuity.md): N_t from (2, 4, 8), Euler/Heun, kinetic 0.3
    "single": ({}, {}),
    # the same recipe trained on 1, then 2, then 4 pieces in t
    "multilevel": ({}, {"levels": ((1, 0.4), (2, 0.3), (4, 0.3))}),
    "multilevel_b": ({}, {"levels": ((1, 0.5), (2, 0.25), (4, 0.25))}),
    "multilevel_lin": ({}, {"levels": ((1, 0.4), (2, 0.3), (4, 0.3)), "levels_prolongation": "linear"}),
    "multilevel_24": ({}, {"levels": ((2, 0.5), (4, 0.5))}),
    # the learning-rate decay restarted at every level
    "multilevel_r": ({}, {"levels": ((1, 0.4), (2, 0.3), (4, 0.3)), "levels_schedule": "level"}),
    "multilevel_rb": ({}, {"levels": ((1, 0.5), (2, 0.25), (4, 0.25)), "levels_schedule": "level"}),
    # every depth: N_t drawn from (1, 2, 4, 8) by cost, a coarse step reading the controls' averages
    "frontier": ({"train_n_steps": (1, 2, 4, 8)}, {"coarse_controls": "average"}),
    "frontier_point": ({"train_n_steps": (1, 2, 4, 8)}, {}),
}
ONE = {"train_n_steps": None, "train_solvers": None, "kinetic": 0.0}


def digits_variant(name: str, epochs: int):
    """``(recipe settings, TrainConfig overrides)`` of a digits variant; ``one@N``: the one-N_t
    recipe at N_t = N (a model of N pieces on [0, 4])."""
    if name.startswith("one@"):
        n = int(name[4:])
        return td.settings(epochs=epochs, n_steps=n, T=4.0, **ONE), {}
    s, c = DIGITS[name]
    return td.settings(epochs=epochs, **s), dict(c)


def run_digits(name: str, split: int, epochs: int, seed: int = 0) -> dict:
    args, over = digits_variant(name, epochs)
    args.split_seed, args.seed = split, seed
    train, test = load_digits(seed=split)
    c0 = time.process_time()
    model = td.build(args)
    cfg = td.config(args).replace(**over)
    trainer = Trainer(model, td.objective(args), cfg, augment=td.augment(args))
    trainer.fit(train, test)
    cpu = time.process_time() - c0
    acc = trainer.evaluate(test)["accuracy"]
    res = {"task": "digits", "variant": name, "split": split, "seed": seed, "epochs": epochs, "cpu_s": cpu,
           "config": cfg.to_dict(), "n_steps": args.n_steps, "accuracy": 100 * acc, "load": _common.loadavg()}
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="There is a performance drop")
        if not name.startswith("one@"):
            c = continuity(model, test, n_steps=[2, 4, 8, 16, 32, 64], reference=4, solvers=["trained", "heun", "rk4"],
                           levels=[])
            res["continuity"] = {f"{r['solver']}@{r['n_steps']}": 100 * r["accuracy"] for r in c.rows}
            for mode in ("average", "point"):
                f = frontier(model, test, n_steps=[1, 2, 4, 8], coarse=mode)
                res[f"frontier_{mode}"] = {r["n_steps"]: 100 * r["accuracy"] for r in f.rows}
                res["calls"] = {r["n_steps"]: r["calls"] for r in f.rows}
    return res


# -- text -----------------------------------------------------------------------------------------
TEXT = {
    "single": {},
    "multilevel": {"levels": ((2, 0.4), (4, 0.3), (8, 0.3))},
    "multilevel_b": {"levels": ((2, 0.5), (4, 0.25), (8, 0.25))},
    "frontier": {"n_steps": (2, 4, 8, 16), "n_steps_weights": "cost", "coarse_controls": "average"},
}
#: the documented text recipe (docs/continuity.md): benchmarks/continuity_text.py's settings
TEXT_ARGS = ["--corpus", "pydoc_docstrings", "--variants", "par_splitw0.3_k0.01", "--steps", "2000", "--batch", "64",
             "--layers", "8", "--d-model", "88", "--lr", "6e-3"]


def text_setup(name: str, steps: int | None = None):
    import continuity_text as ct  # noqa: PLC0415 - the text recipe; imports the corpus tools

    argv = list(TEXT_ARGS) + (["--steps", str(steps)] if steps else [])
    if name.startswith("one@"):
        argv[argv.index("par_splitw0.3_k0.01")] = "par"  # the one-N_t recipe, parallel scheme
    args = ct.main_args(argv)
    v = ct.VARIANTS[args.variants[0]]
    return ct, args, v


def run_text(name: str, steps: int | None = None) -> dict:
    from opsplit.data import bits_per_char, text_windows  # noqa: PLC0415

    ct, args, v = text_setup(name, steps)
    corpus, _, _, _, val_dedup, _ = ct.data(args)
    c0 = time.process_time()
    train = text_windows(corpus.train, args.context, args.steps * args.batch, seed=args.seed, name="train")
    model, obj = ct.variant(args, corpus.vocab.size, v)
    over = {} if name.startswith("one@") else dict(TEXT[name])
    if name.startswith("one@"):
        n = int(name[4:])
        from opsplit.controls import restrict  # noqa: PLC0415
        from opsplit.control.multilevel import change_level  # noqa: PLC0415
        change_level(model, n, final_n_steps={model.decoder: args.layers}, final_pieces=args.layers)
        assert restrict  # (a model of n pieces on [0, layers], sampled from the initial layers)
    cfg = ct.config(args, v).replace(**over)
    trainer = Trainer(model, obj, cfg)
    trainer.fit(train, None)
    cpu = time.process_time() - c0
    val_d = text_windows(val_dedup, args.context, name="val_dedup")
    bits = bits_per_char(trainer.evaluate(val_d)["loss"])
    res = {"task": "text", "variant": name, "steps": args.steps, "cpu_s": cpu, "config": cfg.to_dict(),
           "bits": bits, "load": _common.loadavg()}
    if not name.startswith("one@"):
        c = continuity(model, val_d, loss=ct.tt.lm_loss, output="logits", metric="bits", reference=args.layers,
                       n_steps=[8, 16, 32, 64, 128], solvers=("trained", "heun", "rk4"), levels=[],
                       batch_size=args.eval_batch)
        res["continuity"] = {f"{r['solver']}@{r['n_steps']}": r["bits"] for r in c.rows}
        for mode in ("average", "point"):
            f = frontier(model, val_d, loss=ct.tt.lm_loss, output="logits", metric="bits", n_steps=[2, 4, 8],
                         coarse=mode, batch_size=args.eval_batch)
            res[f"frontier_{mode}"] = {r["n_steps"]: r["bits"] for r in f.rows}
    out = _common.out_dir("multilevel")
    torch.save(model.state_dict(), out / f"text_{name}_{args.steps}.pt")
    return res


def text_timing(names, rounds: int, chunk: int) -> dict:
    """Paired training cost per level: each round runs ``chunk`` optimizer steps of every
    (variant, level) in turn (the same windows), CPU time; the median over ``rounds`` of the
    ratio to the first variant's single level.  A multilevel variant's cost is the sum over
    its levels of fraction x ratio."""
    from opsplit.data import load_text, text_windows  # noqa: PLC0415

    ct, args, v = text_setup("single")
    corpus = load_text(args.corpus, seed=args.split_seed, val_fraction=args.val_fraction)
    train = text_windows(corpus.train, args.context, chunk * args.batch, seed=args.seed, name="train")
    runs = {}
    for name in names:
        over = dict(TEXT[name])
        levels = over.get("levels") or ((args.layers, 1.0),)
        for i, (p, f) in enumerate(levels):
            model, obj = ct.variant(args, corpus.vocab.size, v)
            tr = Trainer(model, obj, ct.config(args, v).replace(**over))
            tr._total_steps = args.steps
            if over.get("levels"):
                tr.set_level(i)
            tr.model.train()
            runs[(name, p, f)] = tr
    batches = [torch.arange(i * args.batch, (i + 1) * args.batch) for i in range(chunk)]
    times = {k: [] for k in runs}
    for _ in range(rounds + 1):
        for k, tr in runs.items():
            t = time.process_time()
            for idx in batches:
                tr.train_step(train, idx)
            times[k].append(time.process_time() - t)
    base = next(iter(runs))
    ratios = {k: statistics.median(a / b for a, b in zip(times[k][1:], times[base][1:])) for k in runs}
    per_variant = {}
    for (name, p, f), r in ratios.items():
        per_variant[name] = per_variant.get(name, 0.0) + f * r
    return {"rounds": rounds, "chunk": chunk, "per_level": {f"{n}@{p}x{f}": r for (n, p, f), r in ratios.items()},
            "cost_ratio": per_variant, "load": _common.loadavg()}


def splits(text: str) -> list[int]:
    if "-" in text:
        a, b = text.split("-")
        return list(range(int(a), int(b) + 1))
    return [int(x) for x in text.split(",")]


def report(out: Path) -> None:
    rows = [json.loads(line) for line in (out / "digits.jsonl").read_text().splitlines()] \
        if (out / "digits.jsonl").exists() else []
    by = {}
    for r in rows:
        by.setdefault((r["variant"], r["epochs"]), []).append(r)
    for (v, e), rs in sorted(by.items()):
        acc = statistics.fmean(r["accuracy"] for r in rs)
        cpu = statistics.fmean(r["cpu_s"] for r in rs)
        print(f"digits {v:>16} e{e} splits {sorted(r['split'] for r in rs)}: accuracy {acc:.2f} %  cpu {cpu:.0f} s")
    if (out / "text.jsonl").exists():
        for line in (out / "text.jsonl").read_text().splitlines():
            r = json.loads(line)
            print(f"text {r['variant']:>12} {r['steps']} steps: {r['bits']:.4f} bits/char  cpu {r['cpu_s']:.0f} s  "
                  f"{r.get('continuity', '')}")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("task", choices=("digits", "text", "text-timing", "report"))
    p.add_argument("--variants", nargs="+", default=["single", "multilevel"])
    p.add_argument("--splits", default="0", help="digits split seeds: 0-4 or 0,2")
    p.add_argument("--epochs", type=int, default=100)
    p.add_argument("--steps", type=int, default=None, help="text: optimizer steps (default the recipe's 2000)")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--chunk", type=int, default=4)
    p.add_argument("--out", default=str(_common.OUT / "multilevel"))
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.task == "report":
        report(out)
        return
    if args.task == "text-timing":
        res = text_timing(args.variants, args.rounds, args.chunk)
        print(json.dumps(res), flush=True)
        with open(out / "text_timing.jsonl", "a") as fh:
            fh.write(json.dumps(res) + "\n")
        return
    for split in splits(args.splits) if args.task == "digits" else [None]:
        for name in args.variants:  # A B A B: every variant of a split before the next split
            res = run_digits(name, split, args.epochs) if args.task == "digits" else run_text(name, args.steps)
            print(json.dumps(res), flush=True)
            with open(out / f"{args.task}.jsonl", "a") as fh:
                fh.write(json.dumps(res) + "\n")


if __name__ == "__main__":
    main()
