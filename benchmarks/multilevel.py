"""Multilevel training in time and one model for every depth (docs/multilevel.md), on the
digits recipe of benchmarks/train_digits.py and the text recipe of
benchmarks/continuity_text.py.

    # digits: choosing the variants on a validation fifth of the training images (the test images unread)
    OMP_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE python benchmarks/multilevel.py digits-val --variants single multilevel_main multilevel_f70 multilevel_24r70 --splits 0
    # digits, the headline: the single-level recipe and the multilevel one, paired A B A B over split seeds 0-4
    OMP_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE python benchmarks/multilevel.py digits --variants single multilevel_24r70 --splits 0-4 --measure multilevel_24r70 --out benchmarks/out/multilevel/headline
    # digits: the frontier model and models trained at N_t = 4, 2, 1 alone (one@4 and frontier_w paired)
    OMP_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE python benchmarks/multilevel.py digits --variants one@4 frontier_w one@2 one@1 --splits 0-4 --measure frontier_w --out benchmarks/out/multilevel/frontier
    # digits: the paired cost of one optimizer step at each level (40 steps a round, 5 rounds)
    OMP_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE python benchmarks/multilevel.py digits-timing --variants single multilevel_24r70 --chunk 40 --out benchmarks/out/multilevel/headline
    OMP_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE python benchmarks/multilevel.py digits-timing --variants one@4 frontier_w --chunk 40 --out benchmarks/out/multilevel/frontier
    # text (not measured: 40-90 min of one core a run): the first five times (five pairs), then the frontier
    OMP_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE python benchmarks/multilevel.py text --variants single multilevel_48r70
    OMP_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE python benchmarks/multilevel.py text --variants one@8 frontier_w one@4 one@2
    # text: paired training cost of the variants against the first, per level (a prefix of each)
    OMP_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE python benchmarks/multilevel.py text-timing --variants single multilevel_48r70
    # the tables (means, paired CPU ratios) of an output folder
    python benchmarks/multilevel.py report --out benchmarks/out/multilevel/headline

Every run appends one JSON line to ``<out>/<task>.jsonl``: the variant and its settings,
the CPU time of the whole run (``time.process_time``, one thread: model, training with its
evaluations), the accuracy (digits: test accuracy in %; text: bits/char on the
deduplicated validation text) at the training grid, the continuity rows (digits: N_t = 2
to 64 and Heun and RK4 at the grid, as in docs/continuity.md) and the frontier (N_t = T/4, T/2, T, 2T, the
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

from opsplit.control import Trainer, continuity, frontier
from opsplit.data import TensorData, load_digits

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
    # the schedule of the headline figures: 1, 2, 4 pieces for 40 / 30 / 30 % of 80 epochs, the decay restarted
    "multilevel_main": ({"epochs_factor": 0.8}, {"levels": ((1, 0.4), (2, 0.3), (4, 0.3)), "levels_schedule": "level"}),
    "multilevel_rb": ({}, {"levels": ((1, 0.5), (2, 0.25), (4, 0.25)), "levels_schedule": "level"}),
    # no 1-piece level: 2 then 4 pieces for half of the 100 (70) epochs each, the decay restarted
    "multilevel_24r": ({}, {"levels": ((2, 0.5), (4, 0.5)), "levels_schedule": "level"}),
    "multilevel_24r70": ({"epochs_factor": 0.7}, {"levels": ((2, 0.5), (4, 0.5)), "levels_schedule": "level"}),
    # more of the run at the finest level: 1, 2, 4 pieces for 30 / 30 / 40 % of 70 epochs, the decay restarted
    "multilevel_f70": ({"epochs_factor": 0.7}, {"levels": ((1, 0.3), (2, 0.3), (4, 0.4)), "levels_schedule": "level"}),
    # the single-level recipe on 60 % of its epochs (the budget of a multilevel run)
    "single_e60": ({"epochs_factor": 0.6}, {}),
    # every depth: N_t drawn from (1, 2, 4, 8) by cost, a coarse step reading the controls' averages
    "frontier": ({"train_n_steps": (1, 2, 4, 8)}, {"coarse_controls": "average"}),
    "frontier_point": ({"train_n_steps": (1, 2, 4, 8)}, {}),
    # every depth, the draws weighted towards the training grid: N_t = 1, 2, 4 with weights 1, 1, 2
    "frontier_w": ({"train_n_steps": (1, 2, 4)}, {"coarse_controls": "average", "n_steps_weights": (1.0, 1.0, 2.0)}),
    # more of the draws at the coarsest N_t: weights 2, 1, 2 and 1, 1, 1 on N_t = 1, 2, 4
    "frontier_w212": ({"train_n_steps": (1, 2, 4)}, {"coarse_controls": "average",
                                                     "n_steps_weights": (2.0, 1.0, 2.0)}),
    "frontier_w111": ({"train_n_steps": (1, 2, 4)}, {"coarse_controls": "average", "n_steps_weights": None}),
    # frontier_w with self-distillation: a coarse draw fits the grid's outputs with weight 0.5 (1.0), the labels
    # with the rest (TrainConfig.n_steps_distill)
    "frontier_wd": ({"train_n_steps": (1, 2, 4)}, {"coarse_controls": "average", "n_steps_weights": (1.0, 1.0, 2.0),
                                                   "n_steps_distill": 0.5}),
    "frontier_wd1": ({"train_n_steps": (1, 2, 4)}, {"coarse_controls": "average", "n_steps_weights": (1.0, 1.0, 2.0),
                                                    "n_steps_distill": 1.0}),
}
ONE = {"train_n_steps": None, "train_solvers": None, "kinetic": 0.0}


def digits_variant(name: str, epochs: int):
    """``(recipe settings, TrainConfig overrides)`` of a digits variant; ``one@N``: the one-N_t
    recipe at N_t = N (a model of N pieces on [0, 4])."""
    if name.startswith("one@"):
        n = int(name[4:])
        return td.settings(epochs=epochs, n_steps=n, T=4.0, **ONE), {}
    s, c = DIGITS[name]
    s = dict(s)
    epochs = round(epochs * s.pop("epochs_factor", 1.0))
    return td.settings(epochs=epochs, **s), dict(c)


def validation_split(split: int):
    """``(train, val)``: the split's training images with a fifth of every class held out
    (a seeded stratified draw, seed 1000 + split); the split's test images are not read."""
    train, _ = load_digits(seed=split)
    g = torch.Generator().manual_seed(1000 + split)
    val_idx, keep = [], []
    for c in range(10):
        idx = torch.nonzero(train.targets == c).flatten()
        idx = idx[torch.randperm(len(idx), generator=g)]
        k = round(0.2 * len(idx))
        val_idx.append(idx[:k])
        keep.append(idx[k:])
    keep, val_idx = torch.cat(keep).sort().values, torch.cat(val_idx).sort().values
    keep = keep[torch.randperm(len(keep), generator=g)]
    info = dict(train.info, validation="a fifth of every class of the split's training images, seed 1000 + split")
    return (TensorData(train.inputs[keep], train.targets[keep], name="digits_train", info=info),
            TensorData(train.inputs[val_idx], train.targets[val_idx], name="digits_val", info=info))


def run_digits(name: str, split: int, epochs: int, seed: int = 0, val: bool = False, measure: bool = True) -> dict:
    """One run of a digits variant; ``val``: trained on four fifths of the split's training
    images and measured on the fifth held out (:func:`validation_split`), for choosing a
    variant without the test images."""
    args, over = digits_variant(name, epochs)
    args.split_seed, args.seed = split, seed
    train, test = validation_split(split) if val else load_digits(seed=split)
    c0 = time.process_time()
    model = td.build(args)
    cfg = td.config(args).replace(**over)
    trainer = Trainer(model, td.objective(args), cfg, augment=td.augment(args))
    trainer.fit(train, test)
    cpu = time.process_time() - c0
    acc = trainer.evaluate(test)["accuracy"]
    res = {"task": "digits-val" if val else "digits", "variant": name, "split": split, "seed": seed, "epochs": args.epochs, "cpu_s": cpu,
           "config": cfg.to_dict(), "n_steps": args.n_steps, "accuracy": 100 * acc, "load": _common.loadavg()}
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="There is a performance drop")
        if measure and not name.startswith("one@"):
            # the rows of docs/continuity.md: N_t = 2 ... 64 with the trained solver, Heun and RK4 at the grid
            res["continuity"] = {}
            for ns, sv in (([2, 4, 8, 16, 32, 64], ["trained"]), ([4], ["trained", "heun", "rk4"])):
                c = continuity(model, test, n_steps=ns, reference=4, solvers=sv, levels=[])
                res["continuity"].update({f"{r['solver']}@{r['n_steps']}": 100 * r["accuracy"] for r in c.rows})
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
    # the digits choice (multilevel_24r70) carried over: 4 then 8 pieces for half of 70 % of the steps each
    "multilevel_48r70": {"levels": ((4, 0.5), (8, 0.5)), "levels_schedule": "level", "steps_factor": 0.7},
    # the digits frontier_w carried over: N_t = 2, 4, 8 drawn with weights 1, 1, 2, coarse steps averaging
    "frontier_w": {"n_steps": (2, 4, 8), "n_steps_weights": (1.0, 1.0, 2.0), "coarse_controls": "average"},
    # frontier_w with self-distillation (the weight chosen on digits' validation fifth)
    "frontier_wd": {"n_steps": (2, 4, 8), "n_steps_weights": (1.0, 1.0, 2.0), "coarse_controls": "average",
                    "n_steps_distill": 0.5},
    "frontier_wd1": {"n_steps": (2, 4, 8), "n_steps_weights": (1.0, 1.0, 2.0), "coarse_controls": "average",
                     "n_steps_distill": 1.0},
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

    factor = 1.0 if name.startswith("one@") else TEXT[name].get("steps_factor", 1.0)
    ct, args, v = text_setup(name, steps)
    if factor != 1.0:  # a variant on a share of the recipe's steps
        args = ct.main_args(list(TEXT_ARGS) + ["--steps", str(round(factor * args.steps))])
    corpus, _, _, _, val_dedup, _ = ct.data(args)
    c0 = time.process_time()
    train = text_windows(corpus.train, args.context, args.steps * args.batch, seed=args.seed, name="train")
    model, obj = ct.variant(args, corpus.vocab.size, v)
    over = {} if name.startswith("one@") else {k: x for k, x in TEXT[name].items() if k != "steps_factor"}
    if name.startswith("one@"):
        n = int(name[4:])
        from opsplit.control.multilevel import change_level  # noqa: PLC0415
        from opsplit.controls import restrict  # noqa: PLC0415
        change_level(model, n, final_n_steps={model.decoder: args.layers}, final_pieces=args.layers)
        assert restrict  # (a model of n pieces on [0, layers], sampled from the initial layers)
    cfg = ct.config(args, v).replace(**over)
    if cfg.n_steps_distill:
        obj.distill = "kl"  # (the recipe's loss is a callable on logits)
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


def paired_steps(runs: dict, train, batches, rounds: int):
    """Each round runs the optimizer steps of ``batches`` on every trainer of ``runs`` in turn
    (CPU time); a warm-up round first.  Returns the times per round and, per run, the median
    over rounds of its time over the first run's."""
    times = {k: [] for k in runs}
    for _ in range(rounds + 1):
        for k, tr in runs.items():
            t = time.process_time()
            for idx in batches:
                tr.train_step(train, idx)
            times[k].append(time.process_time() - t)
    base = next(iter(runs))
    return times, {k: statistics.median(a / b for a, b in zip(times[k][1:], times[base][1:])) for k in runs}


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
        over = {k: x for k, x in TEXT[name].items() if k != "steps_factor"}
        levels = over.get("levels") or ((args.layers, 1.0),)
        for i, (p, f) in enumerate(levels):
            model, obj = ct.variant(args, corpus.vocab.size, v)
            tr = Trainer(model, obj, ct.config(args, v).replace(**over))
            tr.total_steps = args.steps
            if over.get("levels"):
                tr.set_level(i)
            tr.model.train()
            runs[(name, p, f)] = tr
    batches = [torch.arange(i * args.batch, (i + 1) * args.batch) for i in range(chunk)]
    times, ratios = paired_steps(runs, train, batches, rounds)
    per_variant = {}
    for (name, _p, f), r in ratios.items():  # a variant on a share of the steps: that share of the cost
        per_variant[name] = per_variant.get(name, 0.0) + f * r * TEXT[name].get("steps_factor", 1.0)
    return {"rounds": rounds, "chunk": chunk, "per_level": {f"{n}@{p}x{f}": r for (n, p, f), r in ratios.items()},
            "cost_ratio": per_variant, "load": _common.loadavg()}


def digits_timing(names, rounds: int, steps: int) -> dict:
    """Paired training cost per level on digits: each round runs ``steps`` optimizer steps of
    every (variant, level) in turn (the same batches), CPU time; the median over ``rounds``
    of the ratio to the first variant.  A multilevel variant's predicted cost is the sum over
    its levels of fraction x ratio, times its share of the recipe's epochs (the run's
    evaluations not included)."""
    train, _ = load_digits(seed=0)
    runs = {}
    for name in names:
        args, over = digits_variant(name, 100)
        levels = over.get("levels") or ((args.n_steps, 1.0),)
        for i, (p, f) in enumerate(levels):
            model = td.build(args)
            tr = Trainer(model, td.objective(args), td.config(args).replace(**over), augment=td.augment(args))
            tr.total_steps = 10**6
            if over.get("levels"):
                tr.set_level(i)
            tr.model.train()
            runs[(name, p, f)] = tr
    g = torch.Generator().manual_seed(0)
    batches = [torch.randperm(len(train), generator=g)[:64] for _ in range(steps)]
    times, ratios = paired_steps(runs, train, batches, rounds)
    per_variant = {}
    for (name, _p, f), r in ratios.items():  # a variant on a share of the epochs: that share of the cost
        per_variant[name] = per_variant.get(name, 0.0) + f * r * digits_variant(name, 100)[0].epochs / 100
    return {"rounds": rounds, "steps": steps, "per_level": {f"{n}@{p}x{f}": r for (n, p, f), r in ratios.items()},
            "cost_ratio": per_variant, "step_s": {f"{n}@{p}": statistics.median(times[(n, p, f)][1:]) / steps
                                                  for (n, p, f) in runs}, "load": _common.loadavg()}


def splits(text: str) -> list[int]:
    if "-" in text:
        a, b = text.split("-")
        return list(range(int(a), int(b) + 1))
    return [int(x) for x in text.split(",")]


def _paired(rows, a: str, b: str) -> list[tuple[int, float]]:
    """``(split, cpu_s of b / cpu_s of a)`` for every split run with both variants, the
    runs of one split paired in the order they were run."""
    out = []
    for split in sorted({r["split"] for r in rows}):
        ra = [r for r in rows if r["split"] == split and r["variant"] == a]
        rb = [r for r in rows if r["split"] == split and r["variant"] == b]
        out += [(split, y["cpu_s"] / x["cpu_s"]) for x, y in zip(ra, rb)]
    return out


def report(out: Path) -> None:
    """The digits runs of ``out``: per variant the mean over its splits (accuracy at the
    grid, CPU time, the continuity rows' worst refined setting, the frontier), and the
    paired CPU-time ratios against ``single`` and ``one@4`` (median of per-split ratios)."""
    for task in ("digits-val", "digits"):
        f = out / f"{task}.jsonl"
        if not f.exists():
            continue
        rows = [json.loads(line) for line in f.read_text().splitlines()]
        by = {}
        for r in rows:
            by.setdefault(r["variant"], []).append(r)
        for v, rs in by.items():
            acc = statistics.fmean(r["accuracy"] for r in rs)
            cpu = statistics.fmean(r["cpu_s"] for r in rs)
            line = f"{task} {v:>16} e{rs[0]['epochs']} splits {[r['split'] for r in rs]}: {acc:.2f} %  cpu {cpu:.0f} s"
            if rs[0].get("continuity"):
                grid = f"euler@{rs[0]['n_steps']}"  # the refined settings: N_t >= the grid, or another solver
                keys = [k for k in rs[0]["continuity"] if int(k.split("@")[1]) >= rs[0]["n_steps"] and k != grid]
                mean = {k: statistics.fmean(r["continuity"][k] for r in rs) for k in rs[0]["continuity"]}
                worst = min(keys, key=lambda k: mean[k])
                line += (f"  continuity (mean): N_t=2 {mean.get('euler@2', float('nan')) - acc:+.2f}, worst refined "
                         f"{worst} {mean[worst] - acc:+.2f}")
            if rs[0].get("frontier_average"):
                fa = {k: statistics.fmean(r["frontier_average"][k] for r in rs) for k in rs[0]["frontier_average"]}
                line += "  frontier (averaged controls) " + " ".join(f"{k}:{x:.2f}" for k, x in fa.items())
            print(line)
        for base in ("single", "one@4"):
            for v in by:
                if v != base and base in by:
                    pr = _paired(rows, base, v)
                    if pr:
                        d = [statistics.fmean(r["accuracy"] for r in by[v] if r["split"] == s)
                             - statistics.fmean(r["accuracy"] for r in by[base] if r["split"] == s)
                             for s in sorted({s for s, _ in pr})]
                        print(f"{task} {v} / {base}: cpu ratios {[round(x, 3) for _, x in pr]} median "
                              f"{statistics.median(x for _, x in pr):.3f}; accuracy difference per split "
                              f"{[round(x, 2) for x in d]} mean {statistics.fmean(d):+.2f} pt")
    if (out / "text.jsonl").exists():
        for line in (out / "text.jsonl").read_text().splitlines():
            r = json.loads(line)
            print(f"text {r['variant']:>12} {r['steps']} steps: {r['bits']:.4f} bits/char  cpu {r['cpu_s']:.0f} s  "
                  f"{r.get('continuity', '')}")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("task", choices=("digits", "digits-val", "digits-timing", "text", "text-timing", "report"))
    p.add_argument("--variants", nargs="+", default=["single", "multilevel"])
    p.add_argument("--splits", default="0", help="digits split seeds: 0-4 or 0,2")
    p.add_argument("--epochs", type=int, default=100)
    p.add_argument("--steps", type=int, default=None, help="text: optimizer steps (default the recipe's 2000)")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--chunk", type=int, default=4)
    p.add_argument("--out", default=str(_common.OUT / "multilevel"))
    p.add_argument("--measure", nargs="*", default=None,
                   help="digits: the variants whose continuity rows and frontier are measured (default: all but one@N)")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.task == "report":
        report(out)
        return
    if args.task in ("text-timing", "digits-timing"):
        res = (text_timing(args.variants, args.rounds, args.chunk) if args.task == "text-timing" else
               digits_timing(args.variants, args.rounds, args.chunk))
        print(json.dumps(res), flush=True)
        with open(out / f"{args.task}.jsonl", "a") as fh:
            fh.write(json.dumps(res) + "\n")
        return
    digits = args.task in ("digits", "digits-val")
    for split in splits(args.splits) if digits else [None]:
        for name in args.variants:  # A B A B: every variant of a split before the next split
            res = (run_digits(name, split, args.epochs, val=args.task == "digits-val",
                              measure=args.measure is None or name in args.measure) if digits
                   else run_text(name, args.steps))
            print(json.dumps(res), flush=True)
            with open(out / f"{args.task}.jsonl", "a") as fh:
                fh.write(json.dumps(res) + "\n")


if __name__ == "__main__":
    main()
