"""The continuous-time attention neural operator against an FNO peer, on Burgers (1-D) and
Darcy flow (2-D), with equal learning-rate searches on a validation split, a CPU-time
budget per run, several weight seeds and fresh test sets.

    export OMP_NUM_THREADS=1
    # learning-rate search (validation split carved from the training pairs)
    python benchmarks/neural_operator.py train --task burgers --model attention --lr 5e-3 --budget 180 --split val --tag search
    python benchmarks/neural_operator.py search --task burgers --tag search        # the table
    # the comparison (fresh test pairs)
    python benchmarks/neural_operator.py train --task burgers --model fno --lr 2e-3 --budget 360 --seed 0 --tag b360
    python benchmarks/neural_operator.py report --task burgers --tag b360          # per-seed ratios, bootstrap
    python benchmarks/neural_operator.py cost                                      # cost per step and per solve

**Data.**  Burgers: the pairs of ``load_burgers`` (data seed 0): training pairs 0..999 for
training and 1000..1199 for validation; the test pairs are data seed 1's test split (2,000
pairs, never used for a choice).  Darcy: ``load_darcy`` (data seed 0) at 85 x 85: training
samples 0..999 for training, 1000..1199 for validation, the 1,000 test samples for the test.

**Models.**  ``attention``: :class:`opsplit.models.AttentionNeuralOperator` (Galerkin
attention and the gated spectral feed-forward term summed into one vector field, a neural
ODE in t solved by RK4; N_t drawn per step from ``--train-nt``); ``attention-none``: the
same without its attention term (what the attention adds); ``fno``: the peer — FNO's 1-D
Burgers model (``benchmarks/burgers.py``'s ``FNO1d``: width 64, 16 modes, four layers;
output scale 0.1 and output modes 16 as the last round's like-for-like options) or FNO's 2-D
Darcy model (``benchmarks/fno2d.py``: width 32, 12 modes, four layers, per-node
normalisers).

**Training.**  :class:`opsplit.control.Trainer` for every model alike: Adam, weight decay
1e-4, batch 20, relative L2 loss (FNO's ``LpLoss``), a cosine schedule that follows the CPU
time spent (:class:`opsplit.control.CPUTimeBudget`): the run stops at ``--budget`` process CPU
seconds.  Results: ``benchmarks/out/neural_operator/<task>/<model>-lr<lr>-seed<k><tag>.json``
(per-sample errors) and ``.pt`` (weights).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from pathlib import Path

import numpy as np
import torch

from opsplit.analysis import relative_l2
from opsplit.control import CPUTimeBudget, Objective, TrainConfig, Trainer
from opsplit.data import TensorData, load_burgers, load_darcy
from opsplit.models import AttentionNeuralOperator

OUT = Path(__file__).resolve().parent / "out" / "neural_operator"
MODELS = ("attention", "attention-none", "fourier", "fno")
#: Darcy's coefficient is 12 or 3: the models see (a - 7.5) / 4.5 (the FNO peer its per-node normaliser)
A_SHIFT, A_SCALE = 7.5, 4.5

#: the default settings of the attention model per task (overridable by flags)
PRESETS = {
    "burgers": dict(dims=1, d_model=48, heads=1, head_dim=16, modes=16, latent=64, output_scale=0.1,
                    output_modes=16, n_steps=1, solver="rk4"),
    "darcy": dict(dims=2, d_model=32, heads=1, head_dim=16, modes=12, hidden=16, padding=1 / 7, dirichlet=True,
                  output_scale=0.01, n_steps=1, solver="rk4"),
}


# -- data -------------------------------------------------------------------------------------------------
def subset(data: TensorData, lo: int, hi: int, name: str) -> TensorData:
    return TensorData(data.inputs[lo:hi], data.targets[lo:hi], name=name)


def load(task: str, split: str, resolution: int | None = None):
    """``(train, eval)``: the 1,000 training pairs and the validation pairs (``split="val"``)
    or the fresh test pairs (``"test"``), at ``resolution`` (the training grid by default)."""
    if task == "burgers":
        r = resolution or 256
        train, _ = load_burgers(r, n_train=1200, n_test=200, seed=0)
        if split == "val":
            return subset(train, 0, 1000, "train"), subset(train, 1000, 1200, "val")
        _, test = load_burgers(r, n_train=1, n_test=2000, seed=1)
        return subset(train, 0, 1000, "train"), test
    r = resolution or 85
    train, test = load_darcy(r, n_train=1200, n_test=1000)
    ev = subset(train, 1000, 1200, "val") if split == "val" else test
    return subset(train, 0, 1000, "train"), ev


# -- models -------------------------------------------------------------------------------------------------
class Normalised(torch.nn.Module):
    """Darcy: the model applied to (a - 7.5) / 4.5 (a pointwise map of the input, the same on
    every grid); ``n_steps`` passed through."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, a, **kw):
        return self.model((a - A_SHIFT) / A_SCALE, **kw)


def build(task: str, name: str, seed: int, options: dict, train: TensorData | None = None):
    g = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    if name == "fno":
        if task == "burgers":
            from burgers import FNO1d

            return FNO1d(generator=g, output_scale=0.1, output_modes=16)
        from fno2d import FNO2d

        model = FNO2d(generator=g, padding=options.get("fno_padding", 9))
        if train is not None:
            model.fit_normalizers(train.inputs, train.targets)
        return model
    kw = {**PRESETS[task], **{k: v for k, v in options.items() if k in AttentionNeuralOperator.__init__.__code__.co_varnames}}
    kw["attention"] = {"attention": "galerkin", "attention-none": "none", "fourier": "fourier"}[name]
    model = AttentionNeuralOperator(generator=g, **kw)
    return Normalised(model) if task == "darcy" else model


@torch.no_grad()
def errors(model, data: TensorData, batch: int = 20, **kw) -> list:
    model.eval()
    out = [relative_l2(model(data.inputs[i:i + batch], **kw), data.targets[i:i + batch], reduction="none")
           for i in range(0, len(data), batch)]
    return torch.cat(out).tolist()


# -- training ---------------------------------------------------------------------------------------------
def train(args) -> dict:
    task, name = args.task, args.model
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    torch.set_flush_denormal(True)
    tr, ev = load(task, args.split)
    options = {k: v for k, v in vars(args).items() if v is not None and k in (
        "d_model", "heads", "head_dim", "modes", "hidden", "latent", "time_modes", "output_scale", "output_modes",
        "n_steps", "solver", "ffn_out_scale", "fno_padding", "padding")}
    model = build(task, name, args.seed, options, tr)
    ours = name != "fno"
    cfg = dict(epochs=10**6, batch_size=args.batch, optimizer="adam", lr=args.lr, weight_decay=1e-4,
               schedule="cosine", warmup_steps=0, seed=args.seed, eval_every=10**6, progress=False)
    base_nt = getattr(model, "n_steps", None) or getattr(getattr(model, "model", None), "n_steps", None)
    if ours and args.train_nt:
        cfg["n_steps"] = tuple(args.train_nt)
    trainer = Trainer(model, Objective("relative_l2"), TrainConfig(**cfg), callbacks=[CPUTimeBudget(args.budget)])
    t_cpu, t_wall, load0 = time.process_time(), time.perf_counter(), _loadavg()
    trainer.fit(tr, plot=False)
    cpu, wall = time.process_time() - t_cpu, time.perf_counter() - t_wall
    hist = trainer.history.steps
    res = {"task": task, "model": name, "seed": args.seed, "lr": args.lr, "budget_cpu_s": args.budget,
           "split": args.split, "steps": trainer.step, "train_cpu_s": cpu, "train_wall_s": wall,
           "params": sum(p.numel() for p in model.parameters()), "options": options,
           "train_nt": list(args.train_nt) if ours and args.train_nt else None, "n_steps": base_nt,
           "final_train_loss": float(np.mean([r["loss"] for r in hist[-50:]])),
           "curve": [(r["step"], r["loss"]) for r in hist[:: max(1, len(hist) // 200)]],
           "loadavg": [load0, _loadavg()], "torch": torch.__version__, "python": platform.python_version()}
    t_eval = time.process_time()
    res["errors"] = {"grid": errors(model, ev)}
    if ours:  # the same flow solved with 2x and 4x the steps
        for k in (2, 4):
            res["errors"][f"nt{k}x"] = errors(model, ev, n_steps=base_nt * k)
    if args.split == "test":
        res["zero_shot"] = zero_shot(task, model, args.zero_shot_n)
    res["eval_cpu_s"] = time.process_time() - t_eval
    out = OUT / task
    out.mkdir(parents=True, exist_ok=True)
    stem = f"{name}-lr{args.lr:g}-seed{args.seed}{args.tag}"
    (out / f"{stem}.json").write_text(json.dumps(res))
    torch.save(model.state_dict(), out / f"{stem}.pt")
    e = res["errors"]
    print(json.dumps({"run": stem, "steps": res["steps"], "cpu": round(cpu, 1), "wall": round(wall, 1),
                      **{k: float(np.mean(v)) for k, v in e.items()}}), flush=True)
    return res


def zero_shot(task: str, model, n: int) -> dict:
    """Mean relative L2 error on the first ``n`` test pairs at the other grids (no retraining)."""
    out = {}
    grids = (1024, 4096) if task == "burgers" else (141, 211, 421)
    for r in grids:
        if task == "burgers":
            _, test = load_burgers(r, n_train=1, n_test=2000, seed=1)
        else:  # the first n test samples only (a prefix of the cached set: at 421 x 421 the whole set is 1.4 GB)
            _, test = load_darcy(r, n_train=1, n_test=n)
        out[str(r)] = errors(model, subset(test, 0, n, "test"), batch=10 if r < 400 else 2)
    return out


def _loadavg() -> str:
    try:
        return " ".join(f"{x:.1f}" for x in os.getloadavg())
    except OSError:  # pragma: no cover
        return "n/a"


# -- reports ----------------------------------------------------------------------------------------------
def runs(task: str, tag: str) -> list:
    return [json.loads(p.read_text()) for p in sorted((OUT / task).glob(f"*{tag}.json"))
            if p.name.endswith(f"{tag}.json")]


def search_table(args) -> None:
    """The learning-rate search: validation error per model and learning rate."""
    rs = [r for r in runs(args.task, args.tag) if r["split"] == "val"]
    print("| model | lr | seed | steps | CPU s | val error | 2x N_t | 4x N_t |")
    print("|---|---|---|---|---|---|---|---|")
    for r in sorted(rs, key=lambda r: (r["model"], r["lr"], r["seed"])):
        e = r["errors"]
        cells = [f"{np.mean(e[k]):.3e}" if k in e else "" for k in ("grid", "nt2x", "nt4x")]
        print(f"| {r['model']} | {r['lr']:g} | {r['seed']} | {r['steps']} | {r['train_cpu_s']:.0f} | " + " | ".join(cells)
              + " |")
    best = {}
    for r in rs:
        m = float(np.mean(r["errors"]["grid"]))
        if r["model"] not in best or m < best[r["model"]][1]:
            best[r["model"]] = (r["lr"], m)
    for k, (lr, m) in sorted(best.items()):
        print(f"best {k}: lr {lr:g} ({m:.3e})")


def geo(x) -> float:
    return float(np.exp(np.mean(np.log(x))))


def compare(ours: dict, peer: dict, key: str = "grid", n_boot: int = 2000, rng_seed: int = 0) -> dict:
    """Per-seed ratios of the mean test errors (ours / peer, same seed, same pairs), their
    geometric mean, and its bootstrap interval over the test pairs and the seeds."""
    seeds = sorted(set(ours) & set(peer))
    A = np.array([ours[s]["errors"][key] for s in seeds])  # (seeds, pairs)
    P = np.array([peer[s]["errors"]["grid"] for s in seeds])
    ratios = A.mean(1) / P.mean(1)
    rng = np.random.default_rng(rng_seed)
    boot = []
    for _ in range(n_boot):
        si = rng.integers(0, len(seeds), len(seeds))
        pi = rng.integers(0, A.shape[1], A.shape[1])
        boot.append(geo(A[si][:, pi].mean(1) / P[si][:, pi].mean(1)))
    lo, hi = np.percentile(boot, [2.5, 97.5])
    return {"seeds": seeds, "ratios": ratios.tolist(), "geo": geo(ratios), "ci": (float(lo), float(hi)),
            "ahead": int((ratios < 1).sum()), "pairs_ahead": float((A.mean(0) < P.mean(0)).mean()),
            "ours_mean": float(A.mean()), "peer_mean": float(P.mean())}


def report(args) -> None:
    rs = [r for r in runs(args.task, args.tag) if r["split"] == "test"]
    by = {}
    for r in rs:
        by.setdefault(r["model"], {})[r["seed"]] = r
    print(f"| model | lr | seeds | CPU s | steps | test error (mean of seeds) | 2x N_t | 4x N_t | "
          f"{' | '.join('zero-shot ' + k for k in sorted(next(iter(rs))['zero_shot'], key=int))} |" if rs else "no runs")
    for name, d in sorted(by.items()):
        def e(k, d=d):
            return np.mean([np.mean(r["errors"][k]) for r in d.values()]) if all(
                k in r["errors"] for r in d.values()) else None

        zs = sorted(next(iter(d.values()))["zero_shot"], key=int)
        z = [np.mean([np.mean(r["zero_shot"][k]) for r in d.values()]) for k in zs]
        cells = [f"{v:.3e}" if v is not None else "" for v in (e("grid"), e("nt2x"), e("nt4x"))]
        r0 = next(iter(d.values()))
        print(f"| {name} | {r0['lr']:g} | {', '.join(map(str, sorted(d)))} | "
              f"{np.mean([r['train_cpu_s'] for r in d.values()]):.0f} | "
              f"{int(np.mean([r['steps'] for r in d.values()]))} | " + " | ".join(cells) + " | "
              + " | ".join(f"{v:.3e}" for v in z) + " |")
    if "fno" not in by:
        return
    for name in sorted(set(by) - {"fno"}):
        for key in ("grid", "nt2x", "nt4x"):
            if not all(key in r["errors"] for r in by[name].values()):
                continue
            c = compare(by[name], by["fno"], key)
            print(f"{name} ({key}) / fno: per seed {', '.join(f'{x:.3f}' for x in c['ratios'])} (seeds "
                  f"{c['seeds']}); geometric mean {c['geo']:.3f}, bootstrap 95 % {c['ci'][0]:.3f}-{c['ci'][1]:.3f}; "
                  f"ahead on {c['ahead']} of {len(c['seeds'])} seeds, on {100 * c['pairs_ahead']:.0f} % of the "
                  f"pairs (seed-mean); means {c['ours_mean']:.3e} / {c['peer_mean']:.3e}")
        d = by[name]
        for k in ("nt2x", "nt4x"):
            if all(k in r["errors"] for r in d.values()):
                q = [np.mean(r["errors"][k]) / np.mean(r["errors"]["grid"]) for r in d.values()]
                print(f"{name}: error at {k[2]}x N_t / training grid, per seed: {', '.join(f'{x:.3f}' for x in q)}")


# -- cost -------------------------------------------------------------------------------------------------
#: the grids of the cost table and the batch of a training step there
COST_GRIDS = {"burgers": ((256, 20), (8192, 2)), "darcy": ((85, 20), (421, 2))}


def _cost_data(task: str, g: int):
    """A few pairs at grid ``g`` (Darcy: the first training samples at g x g, a prefix of the
    cached set; Burgers: test pairs of data seed 1)."""
    if task == "burgers":
        return load_burgers(g, n_train=1, n_test=20, seed=1)[1]
    return load_darcy(g, n_train=20, n_test=1)[0]


def cost(args) -> None:
    """CPU seconds per training step (Adam, relative L2 loss; batch 20 at the training grid,
    2 at the finest) and per solve of one sample, at Darcy's 85 x 85 and 421 x 421 grids
    (Burgers: 256 and 8192 nodes), weight seed 0.  Paired: each round times every model once
    in turn (A B C A B C ...), the ratio to the FNO peer is taken within a round, and the
    table gives the median over ``--reps`` rounds (a first round is discarded) of the times
    and of the ratios, with the load average before and after."""
    torch.set_num_threads(1)
    torch.set_flush_denormal(True)
    rows = []
    load0 = _loadavg()
    for task in ("burgers", "darcy"):
        tr, _ = load(task, "val")
        models = {n: build(task, n, 0, {}, tr) for n in ("fno", "attention", "attention-none")}
        for g, batch in COST_GRIDS[task]:
            data = _cost_data(task, g)
            x, y, x1 = data.inputs[:batch], data.targets[:batch], data.inputs[:1]
            opts = {n: torch.optim.Adam(m.parameters(), 1e-6) for n, m in models.items()}
            step = {n: [] for n in models}
            solve = {n: [] for n in models}
            for _ in range(args.reps + 1):
                for n, m in models.items():
                    m.train()
                    t = time.process_time()
                    opts[n].zero_grad()
                    relative_l2(m(x), y).backward()
                    opts[n].step()
                    step[n].append(time.process_time() - t)
                    m.eval()
                    with torch.no_grad():
                        t = time.process_time()
                        m(x1)
                        solve[n].append(time.process_time() - t)
            where = f"{g} x {g}" if task == "darcy" else f"{g} nodes"
            for what, tab in ((f"training step, batch {batch}, {where}", step), (f"solve, one sample, {where}", solve)):
                for n in models:
                    ratio = np.median(np.array(tab[n][1:]) / np.array(tab["fno"][1:]))
                    rows.append((task, n, what, float(np.median(tab[n][1:])), float(ratio)))
            del opts
    print(f"load average {load0} -> {_loadavg()}; {args.reps} paired rounds; torch {torch.__version__}, one thread")
    print("| task | model | what | CPU s (median) | ÷ FNO peer (median of paired ratios) |")
    print("|---|---|---|---|---|")
    for task, n, what, v, r in rows:
        print(f"| {task} | {n} | {what} | {v:.4f} | {r:.2f} |")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("command", choices=("train", "search", "report", "cost"))
    p.add_argument("--task", choices=("burgers", "darcy"), default="burgers")
    p.add_argument("--model", choices=MODELS, default="attention")
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--budget", type=float, default=360.0, help="CPU seconds of training (process time)")
    p.add_argument("--seed", type=int, default=0, help="weights and data order")
    p.add_argument("--split", choices=("val", "test"), default="test")
    p.add_argument("--batch", type=int, default=20)
    p.add_argument("--train-nt", type=int, nargs="+", default=[1, 2],
                   help="N_t drawn (uniformly) per training step of the attention models")
    p.add_argument("--zero-shot-n", type=int, default=100, help="test pairs evaluated at the other grids")
    p.add_argument("--tag", default="")
    p.add_argument("--reps", type=int, default=5)
    for k in ("d-model", "heads", "head-dim", "modes", "hidden", "latent", "time-modes", "output-modes", "n-steps",
              "fno-padding"):
        p.add_argument(f"--{k}", type=int, default=None)
    for k in ("output-scale", "ffn-out-scale", "padding"):
        p.add_argument(f"--{k}", type=float, default=None)
    p.add_argument("--solver", choices=("euler", "heun", "rk4"), default=None)
    args = p.parse_args(argv)
    {"train": train, "search": search_table, "report": report, "cost": cost}[args.command](args)


if __name__ == "__main__":
    main()
