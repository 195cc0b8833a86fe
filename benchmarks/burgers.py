"""Burgers' equation as an operator-learning benchmark: opsplit's continuous transformer
(Galerkin, Fourier and softmax attention; Lie and Strang splitting) against a Fourier
neural operator written here (FNO's 1-D Burgers recipe: 16 modes, width 64, four Fourier
layers), trained on the same data, seeds, loss and CPU-time budget at one resolution and
evaluated without retraining at 256, 512, ..., 8192 nodes.

    OMP_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE python benchmarks/burgers.py --budget 900
    python benchmarks/burgers.py --report          # the table and the plot from the saved runs
    python benchmarks/burgers.py --check-solver    # self-convergence and energy of the data
    python benchmarks/burgers.py --reevaluate --eval-res 64 128   # saved models on coarser grids

Each model is trained in its own call (``--models fno galerkin-strang ...``, one process
per model is fine; the results land in ``benchmarks/out/burgers/<model>-seed<k>.json``,
checkpoints beside them) and ``--report`` assembles the table (``docs/burgers.md``) and
``docs/figures/burgers_resolution.png``.

**Budget.**  CPU seconds of one thread (``time.process_time``), not wall time: the
development machine is shared, and CPU time is what a model gets to use.  Each model runs a
few calibration steps, then trains for as many optimizer steps as fit into the budget
(cosine schedule over exactly those steps); the table reports the CPU time and the wall
time actually taken.  With ``--cpu-schedule`` the schedule follows the CPU time spent
instead (:class:`opsplit.control.CPUTimeBudget`) and every model stops at exactly its budget.  Loss: the mean relative L2 error per sample, the test metric (FNO's
``LpLoss``).  Optimizer: Adam, learning rate 1e-3, weight decay 1e-4 (FNO's), batch 20.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from opsplit.analysis import relative_l2
from opsplit.control import CPUTimeBudget, Objective, TrainConfig, Trainer
from opsplit.data.burgers import RESOLUTIONS, load_burgers
from opsplit.data.burgers_solver import solve_burgers
from opsplit.models import NeuralOperatorTransformer
from opsplit.operators import FourierMultiplier

OUT = Path(__file__).resolve().parent / "out" / "burgers"
FIG = Path(__file__).resolve().parents[1] / "docs" / "figures" / "burgers_resolution.png"

#: opsplit's variants: name -> (attention, scheme)
#: ("none": no attention term, the attention-free splitting flow: what the attention adds)
VARIANTS = {f"{a}-{s}": (a, s) for a in ("galerkin", "fourier", "softmax", "none") for s in ("lie", "strang")}
MODELS = ("fno", *VARIANTS)

#: published figures (relative L2 test error), with their budgets
PUBLISHED = {
    "FNO, published (Li et al. 2021; 500 epochs, GPU)": {
        256: 0.0149, 512: 0.0158, 1024: 0.0160, 2048: 0.0146, 4096: 0.0142, 8192: 0.0139},
    "Galerkin Transformer, published (Cao 2021: ~1e-3; 100 epochs, GPU)": {512: 1e-3, 2048: 1e-3, 8192: 1e-3},
}


# -- the FNO peer ---------------------------------------------------------------------------------
class FourierLayer(nn.Module):
    """FNO's kernel integral: the lowest ``modes`` Fourier modes of the ``width`` channels
    multiplied by complex ``width x width`` matrices (rfft -> mix -> irfft)."""

    def __init__(self, width: int, modes: int, generator=None):
        super().__init__()
        self.modes = modes
        scale = 1.0 / (width * width)
        self.w_re = nn.Parameter(scale * torch.rand(width, width, modes, generator=generator))
        self.w_im = nn.Parameter(scale * torch.rand(width, width, modes, generator=generator))

    def forward(self, v):  # (B, C, n)
        n = v.shape[-1]
        V = torch.fft.rfft(v)[..., : self.modes]
        W = torch.complex(self.w_re, self.w_im)
        out = torch.einsum("bim,iom->bom", V, W)
        return torch.fft.irfft(out, n=n)  # the modes above `modes` are zero


class FNO1d(nn.Module):
    """The peer: lift (u(x), x) to ``width`` channels, four layers v <- gelu(K v + W v) (no
    activation after the last), project by two pointwise layers (128 hidden, GELU).  The
    grid feature is ``linspace(0, 1, n)``, as in FNO's script.  ``output_scale`` scales the
    last layer's initial weights and bias (1: FNO's script; the same knob as
    :class:`~opsplit.models.NeuralOperatorTransformer`'s, for a like-for-like check);
    ``output_modes`` band-limits the output as that model's option does (``None``: FNO's
    script)."""

    def __init__(self, modes: int = 16, width: int = 64, layers: int = 4, generator=None, output_scale: float = 1.0,
                 output_modes: int | None = None):
        super().__init__()
        if not (math.isfinite(output_scale) and output_scale > 0):
            raise ValueError(f"FNO1d.output_scale: expected a finite number > 0, got {output_scale!r}")
        self.lift = nn.Linear(2, width)
        self.spectral = nn.ModuleList(FourierLayer(width, modes, generator) for _ in range(layers))
        self.pointwise = nn.ModuleList(nn.Conv1d(width, width, 1) for _ in range(layers))
        self.proj1 = nn.Linear(width, 128)
        self.proj2 = nn.Linear(128, 1)
        self.output_filter = None if output_modes is None else FourierMultiplier(output_modes)
        if output_scale != 1.0:
            with torch.no_grad():
                self.proj2.weight.mul_(output_scale)
                self.proj2.bias.mul_(output_scale)

    def forward(self, u):  # (B, n)
        B, n = u.shape
        x = torch.linspace(0, 1, n, dtype=u.dtype).expand(B, n)
        v = self.lift(torch.stack([u, x], dim=-1)).transpose(1, 2)
        for k, (K, W) in enumerate(zip(self.spectral, self.pointwise)):
            v = K(v) + W(v)
            if k < len(self.spectral) - 1:
                v = F.gelu(v)
        w = self.proj2(F.gelu(self.proj1(v.transpose(1, 2)))).squeeze(-1)
        return w if self.output_filter is None else self.output_filter(w)


# -- models, loss, training ------------------------------------------------------------------------
def build(name: str, seed: int, **kw) -> nn.Module:
    torch.manual_seed(seed)
    g = torch.Generator().manual_seed(seed)
    if name == "fno":
        return FNO1d(generator=g, output_scale=kw.get("output_scale", 1.0), output_modes=kw.get("output_modes"))
    att, sch = VARIANTS[name]
    return NeuralOperatorTransformer(att, sch, generator=g, **kw)


def n_params(model) -> int:
    return sum(p.numel() for p in model.parameters())


def loadavg() -> str:
    try:
        return " ".join(f"{x:.1f}" for x in os.getloadavg())
    except OSError:  # pragma: no cover
        return "n/a"


def calibrate(model, train, batch: int, steps: int = 12) -> float:
    """CPU seconds per optimizer step (forward, backward, Adam), the median of ``steps``."""
    opt = torch.optim.Adam(model.parameters(), lr=0.0)
    times = []
    for k in range(steps + 1):
        idx = torch.arange(k * batch, (k + 1) * batch) % len(train)
        x, y = train[idx]
        t = time.process_time()
        opt.zero_grad()
        relative_l2(model(x), y).backward()
        opt.step()
        if k:  # the first step warms up
            times.append(time.process_time() - t)
    return float(np.median(times))


@torch.no_grad()
def evaluate(model, resolutions, *, n_test: int, seed: int, batch: int = 20, subset: dict | None = None) -> dict:
    """``{resolution: per-sample relative L2 errors}`` on the test pairs (``subset``:
    ``{resolution: k}`` evaluates only the first k there)."""
    model.eval()
    out = {}
    for r in resolutions:
        _, test = load_burgers(r, n_test=n_test, seed=seed)
        k = min(len(test), (subset or {}).get(r, len(test)))
        errs = torch.cat([relative_l2(model(test.inputs[i:min(i + batch, k)]), test.targets[i:min(i + batch, k)],
                                      reduction="none")
                          for i in range(0, k, batch)])
        out[r] = errs.tolist()
    return out


def run_model(name: str, args) -> dict:
    train, test = load_burgers(args.train_res, n_train=args.n_train, n_test=args.n_test, seed=args.data_seed)
    model = build(name, args.seed, **model_kwargs(args))
    # the step count of the budget (--cpu-schedule: none; the CPU time itself ends the run)
    per_step = None if args.cpu_schedule else calibrate(build(name, args.seed, **model_kwargs(args)), train, args.batch)
    config = TrainConfig(epochs=10**6, max_steps=10**9 if args.cpu_schedule else max(1, int(args.budget / per_step)),
                         batch_size=args.batch, optimizer="adam", lr=args.lr,
                         weight_decay=1e-4, schedule="cosine", warmup_steps=0, seed=args.seed,
                         eval_every=10**6, progress=False, grad_clip=args.grad_clip)
    # --cpu-schedule: the cosine schedule follows the CPU time spent, the run stops at the budget
    callbacks = [CPUTimeBudget(args.budget)] if args.cpu_schedule else None
    trainer = Trainer(model, Objective("relative_l2"), config, callbacks=callbacks)
    t_cpu, t_wall, load0 = time.process_time(), time.perf_counter(), loadavg()
    trainer.fit(train)
    cpu, wall = time.process_time() - t_cpu, time.perf_counter() - t_wall
    hist = trainer.history.steps
    curve = [(r["step"], r["loss"]) for r in hist[:: max(1, len(hist) // 200)]]
    # softmax attention costs O(N^2) per evaluation: above 2048 nodes only the first
    # --softmax-subset test pairs (the table compares like with like on that subset)
    subset = {r: args.softmax_subset for r in args.eval_res if r > 2048} if name.startswith("softmax") else None
    per_sample = evaluate(model, args.eval_res, n_test=args.n_test, seed=args.data_seed, subset=subset)
    errors = {r: float(np.mean(e)) for r, e in per_sample.items()}
    res = {"model": name, "seed": args.seed, "params": n_params(model), "train_res": args.train_res,
           "budget_cpu_s": args.budget, "schedule": "cpu-time" if args.cpu_schedule else "steps",
           "calibrated_s_per_step": per_step, "steps": trainer.step,
           "epochs": trainer.step * args.batch / len(train), "train_cpu_s": cpu, "train_wall_s": wall,
           "final_train_loss": float(np.mean([r["loss"] for r in hist[-50:]])), "test_error": errors,
           "test_errors_per_sample": per_sample,
           "loadavg_start": load0, "loadavg_end": loadavg(), "threads": torch.get_num_threads(),
           "torch": torch.__version__, "flush_denormal": args.flush_denormal, "python": platform.python_version(), "lr": args.lr, "batch": args.batch,
           "model_kwargs": model_kwargs(args) if name != "fno" else (
               {k: v for k, v in (("output_scale", args.output_scale), ("output_modes", args.output_modes))
                if v != {"output_scale": 1.0, "output_modes": None}[k]}), "curve": curve}
    OUT.mkdir(parents=True, exist_ok=True)
    tag = f"{name}-seed{args.seed}{args.tag}"
    (OUT / f"{tag}.json").write_text(json.dumps(res, indent=1))
    torch.save(model.state_dict(), OUT / f"{tag}.pt")
    return res


def model_kwargs(args) -> dict:
    return {"d_model": args.d_model, "heads": args.heads, "n_steps": args.n_steps, "d_ff": args.d_ff,
            "modes": args.modes, "n_freq": args.n_freq, "output_scale": args.output_scale,
            "nonlinearity": args.nonlinearity, "head_dim": args.head_dim,
            **({"output_modes": args.output_modes} if args.output_modes is not None else {}),
            **({"T": args.T} if args.T else {})}


def saved_runs(tag: str):
    """``(path, result, model)`` of every saved run whose file name ends with ``tag``: the
    result file read, the model built as it was and its trained weights loaded."""
    for path in sorted(OUT.glob(f"*-seed*{tag}.json")):
        if not path.name.endswith(f"{tag}.json"):
            continue
        res = json.loads(path.read_text())
        model = build(res["model"], res["seed"], **res["model_kwargs"])
        model.load_state_dict(torch.load(path.with_suffix(".pt"), weights_only=True))
        yield path, res, model


def reevaluate(args) -> None:
    """Evaluate the saved models of ``--tag`` at ``--eval-res`` as well (e.g. grids coarser
    than the training grid), merged into their result files; nothing is retrained."""
    for path, res, model in saved_runs(args.tag):
        subset = ({r: args.softmax_subset for r in args.eval_res if r > 2048}
                  if res["model"].startswith("softmax") else None)
        per = evaluate(model, args.eval_res, n_test=len(res["test_errors_per_sample"][str(res["train_res"])]),
                       seed=args.data_seed, subset=subset)
        for r, e in per.items():
            res["test_errors_per_sample"][str(r)] = e
            res["test_error"][str(r)] = float(np.mean(e))
        path.write_text(json.dumps(res, indent=1))
        print(path.name, {r: f"{np.mean(e):.3e}" for r, e in per.items()}, flush=True)


def error_spectrum(args) -> None:
    """For the saved models of ``--tag`` (and ``--also-tags``): the share of each test pair's
    squared error (at the training grid) in the Fourier modes 3 and above, averaged over the
    pairs — where a pointwise projection leaves its errors (the target holds almost no
    energy there)."""
    _, test = load_burgers(args.train_res, n_test=args.n_test, seed=args.data_seed)
    mag = torch.fft.rfft(test.targets).abs().mean(0)
    print("the targets' mean mode magnitudes relative to mode 1, modes 0..4: "
          + ", ".join(f"{float(v):.1e}" for v in mag[:5] / mag[1]))
    for t in (args.tag, *args.also_tags):
        for path, _, model in saved_runs(t):
            model.eval()
            with torch.no_grad():
                e2 = torch.fft.rfft(model(test.inputs) - test.targets).abs().square()
            share = float((e2[:, 3:].sum(-1) / e2.sum(-1)).mean())
            print(f"{path.stem}: share of the squared error in modes >= 3: {share:.3f}", flush=True)


# -- the data checks ---------------------------------------------------------------------------------
def check_solver(n: int = 50, seed: int = 0) -> None:
    """Self-convergence of the stored fields and the energy identity."""
    from opsplit.data.burgers import burgers_pairs

    train, _ = load_burgers(8192, n_train=1000, n_test=200, seed=seed)
    a = train.inputs[:n].double().numpy()
    stored = train.targets[:n].double().numpy()
    t = time.process_time()
    fine = solve_burgers(a, n_steps=2000, grid_factor=2)
    print(f"reference solve (2x grid, dt/2): {time.process_time() - t:.1f} s CPU")
    coarse = solve_burgers(a, n_steps=1000)
    rel = lambda u, v: float(np.linalg.norm(u - v) / np.linalg.norm(v))  # noqa: E731
    print(f"self-convergence, {n} training pairs at 8192 nodes (relative L2 against 2x finer grid and step):")
    print(f"  solver output (float64): {rel(coarse, fine):.2e}")
    print(f"  stored fields (float32): {rel(stored, fine):.2e}")
    _, ref = burgers_pairs(n, split="train", seed=seed)
    print(f"  regenerated pairs equal the stored ones: max |diff| = {np.abs(ref.astype(np.float32) - stored).max():.1e}")
    # energy identity: E(T) - E(0) = -nu int_0^T ||u_x||^2 dt, from the 1001 time levels of
    # the solve.  The dissipation of the rough initial data is stiff (mode m decays like
    # exp(-2 nu (2 pi m)^2 t)), so it is integrated mode by mode with the logarithmic mean
    # of |c_m|^2 over each step (exact for exponential decay, second order otherwise)
    u, (times, c) = solve_burgers(a, n_steps=1000, save_times=1000)
    m = np.arange(c.shape[-1])
    w = np.where(m == 0, 1.0, 2.0)  # ||u||^2 = |c_0|^2 + 2 sum_{m>0} |c_m|^2
    P = w * np.abs(c) ** 2  # (times, B, modes)
    E = 0.5 * P.sum(-1)  # (times, B)
    a0, a1 = P[:-1], P[1:]
    with np.errstate(divide="ignore", invalid="ignore"):
        logmean = np.where(np.abs(a0 - a1) > 1e-12 * np.maximum(a0, a1), (a0 - a1) / np.log(a0 / a1), a0)
    logmean = np.nan_to_num(logmean)  # modes that are exactly zero
    dt = times[1] - times[0]
    diss = 0.1 * ((2 * np.pi * m) ** 2 * logmean).sum((0, -1)) * dt  # nu int ||u_x||^2 dt, per sample
    print(f"energy: E(0) = {E[0].mean():.4f}, E(1) = {E[-1].mean():.3e} (mean over {n}); decreasing at every "
          f"step: {bool((np.diff(E, axis=0) < 0).all())}")
    print(f"  |E(1) - E(0) + nu int ||u_x||^2 dt| / (E(0) - E(1)) = "
          f"{float(np.max(np.abs(E[-1] - E[0] + diss) / (E[0] - E[-1]))):.2e} (per-mode logarithmic mean in t)")


def label(run: dict) -> str:
    what = ", no attention term" if run["model"].startswith("none-") else ""
    sched = ", CPU-time schedule" if run.get("schedule") == "cpu-time" else ""
    os_ = run["model_kwargs"].get("output_scale", 1.0)
    what += f", output scale {os_:g}" if os_ != 1.0 else ""
    om = run["model_kwargs"].get("output_modes")
    what += f", output modes 0..{om - 1}" if om else ""
    return (f"{run['model']} (seed {run['seed']}, lr {run['lr']:g}{what}"
            f"{', subnormals flushed' if run.get('flush_denormal') else ''}{sched})")


# -- report ---------------------------------------------------------------------------------------------
def seed_means(runs) -> None:
    """Rows of the mean over weight seeds of the runs with the same model and settings (the
    seeds listed)."""
    groups: dict = {}
    for run in runs:
        key = (run["model"], run["lr"], run.get("schedule", "steps"), json.dumps(run["model_kwargs"], sort_keys=True),
               bool(run.get("flush_denormal")))
        groups.setdefault(key, []).append(run)
    print("\n| model | learning rate | schedule | output scale | output modes | seeds | "
          + " | ".join(str(r) for r in RESOLUTIONS) + " |")
    print("|" + "---|" * (6 + len(RESOLUTIONS)))
    for (model, lr, sched, kw, _), rs in sorted(groups.items(), key=lambda kv: (kv[0][0] != "fno", kv[0])):
        cells = [f"{np.mean([r['test_error'][str(k)] for r in rs]):.2e}" if all(str(k) in r["test_error"] for r in rs)
                 else "" for k in RESOLUTIONS]
        kwd = json.loads(kw)
        print(f"| {model} | {lr:g} | {sched} | {kwd.get('output_scale', 1.0):g} | {kwd.get('output_modes') or 'all'} | "
              f"{', '.join(str(r['seed']) for r in sorted(rs, key=lambda r: r['seed']))} | " + " | ".join(cells) + " |")
    paired_ratios(groups)


def paired_ratios(groups: dict, res: str = "256") -> None:
    """Every opsplit setting against every FNO setting on the weight seeds both ran: the
    per-seed ratios of the test error at ``res`` nodes, their geometric mean and the ratio of
    the means (< 1: opsplit ahead)."""
    peers = {k: {r["seed"]: r for r in rs} for k, rs in groups.items() if k[0] == "fno"}
    ours = {k: {r["seed"]: r for r in rs} for k, rs in groups.items() if k[0] != "fno"}

    def name(key) -> str:  # the settings that tell the groups of the seed-means table apart
        kwd = json.loads(key[3]) if len(key) > 3 else {}
        return (f"{key[0]} (lr {key[1]:g}, output scale {kwd.get('output_scale', 1.0):g}, "
                f"output modes {kwd.get('output_modes') or 'all'})")

    for pk, p in sorted(peers.items()):
        for ok, o in sorted(ours.items()):
            seeds = sorted(set(p) & set(o))
            if not seeds or not all(res in p[s]["test_error"] and res in o[s]["test_error"] for s in seeds):
                continue
            r = [o[s]["test_error"][res] / p[s]["test_error"][res] for s in seeds]
            mean = np.mean([o[s]["test_error"][res] for s in seeds]) / np.mean([p[s]["test_error"][res] for s in seeds])
            print(f"{name(ok)} / {name(pk)} at {res} nodes, seeds {', '.join(map(str, seeds))}: "
                  f"per seed {', '.join(f'{x:.2f}' for x in r)}; geometric mean {float(np.exp(np.mean(np.log(r)))):.2f}, "
                  f"ratio of the means {mean:.2f}, ahead on {sum(x < 1 for x in r)} of {len(r)}")


def report(tag: str = "", extra_tags=(), figure: Path | None = None) -> None:
    """The table and the plot (``figure``, default ``docs/figures/burgers_resolution.png``)
    of the saved runs whose file name ends with ``tag`` (or with one of ``extra_tags``), and
    the means over seeds."""
    runs = [json.loads(p.read_text()) for t in (tag, *extra_tags) for p in sorted(OUT.glob(f"*-seed*{t}.json"))
            if p.name.endswith(f"{t}.json") and (t or p.stem.split("-seed")[1].isdigit())]
    if not runs:
        print("no runs under", OUT)
        return
    res = sorted({int(r) for run in runs for r in run["test_error"]})
    head = "| model | params | steps (epochs) | CPU s | wall s | " + " | ".join(str(r) for r in res) + " | max/train (256-8192) |"
    print(head)
    print("|" + "---|" * (head.count("|") - 1))
    for run in sorted(runs, key=lambda r: (r["model"] != "fno", r["model"], r["seed"])):
        e = {int(k): v for k, v in run["test_error"].items()}
        per = {int(k): v for k, v in run.get("test_errors_per_sample", {}).items()}
        tr = per.get(run["train_res"])
        # the ratio to the training grid's error on the same test pairs (a subset for softmax)
        # the target's range: 256 ... 8192 (coarser grids are shown, not part of it)
        ratios = ({r: float(np.mean(v)) / float(np.mean(tr[: len(v)])) for r, v in per.items() if r >= 256}
                  if tr else {})
        worst = max(ratios.values()) if ratios else float("nan")
        cells = []
        for r in res:
            if r not in e:
                cells.append("")
                continue
            star = f" ({len(per[r])})" if r in per and tr and len(per[r]) < len(tr) else ""
            cells.append(f"{e[r]:.2e}{star}")
        print(f"| {label(run)} | {run['params']:,} | {run['steps']} ({run['epochs']:.0f}) | "
              f"{run['train_cpu_s']:.0f} | {run['train_wall_s']:.0f} | " + " | ".join(cells) + f" | {worst:.3f} |")
    for name, tab in PUBLISHED.items():
        print(f"| {name} | | | | | " + " | ".join(f"{tab[r]:.2e}" if r in tab else "" for r in res) + " | |")
    seed_means(runs)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.2))
    for run in runs:
        e = {int(k): v for k, v in run["test_error"].items()}
        ks = sorted(e)
        style = dict(lw=2.2, color="k") if run["model"] == "fno" else dict(lw=1.3)
        fmt = "o--" if run["model"] == "fno" and run.get("flush_denormal") else "o-"
        ax.plot(ks, [e[k] for k in ks], fmt, label=label(run), ms=3, **style)
    for name, tab in PUBLISHED.items():
        ks = sorted(tab)
        ax.plot(ks, [tab[k] for k in ks], "x--", color="gray" if "FNO" in name else "tab:brown", label=name)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel(f"evaluation grid N_x (trained at {runs[0]['train_res']})")
    ax.set_ylabel("relative L2 test error")
    ax.set_title("Burgers, nu = 0.1: one trained model per curve, no retraining")
    ax.legend(fontsize=6.5, ncol=2)
    ax.grid(alpha=0.3, which="both")
    fig.tight_layout()
    fig_path = Path(figure) if figure else FIG
    fig_path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(fig_path, dpi=120)
    print("wrote", fig_path)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", nargs="+", default=list(MODELS), choices=MODELS)
    p.add_argument("--budget", type=float, default=900.0, help="CPU seconds of training per model (one thread)")
    p.add_argument("--train-res", type=int, default=256)
    p.add_argument("--eval-res", type=int, nargs="+", default=list(RESOLUTIONS))
    p.add_argument("--n-train", type=int, default=1000)
    p.add_argument("--n-test", type=int, default=200)
    p.add_argument("--seed", type=int, default=0, help="weights and data order")
    p.add_argument("--data-seed", type=int, default=0)
    p.add_argument("--batch", type=int, default=20)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--grad-clip", type=float, default=None)
    p.add_argument("--d-model", type=int, default=64)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--n-steps", type=int, default=4)
    p.add_argument("--T", type=float, default=None)
    p.add_argument("--d-ff", type=int, default=128)
    p.add_argument("--modes", type=int, default=16)
    p.add_argument("--n-freq", type=int, default=4)
    p.add_argument("--output-scale", type=float, default=1.0, help="initial scale of the last projection layer (the "
                   "target, u at t = 1, has 1.6 %% of the input's L2 norm on the training pairs); for the FNO peer "
                   "too (1: its script's)")
    p.add_argument("--output-modes", type=int, default=None, help="band-limit the output to the Fourier modes "
                   "0..M (this many modes) by a trainable multiplier, initialised to the orthogonal projection "
                   "(opsplit.operators.FourierMultiplier); for the FNO peer too (default: none, its script's)")
    p.add_argument("--nonlinearity", choices=("ffn", "map"), default="ffn")
    p.add_argument("--head-dim", type=int, default=None)
    p.add_argument("--softmax-subset", type=int, default=40,
                   help="test pairs the softmax variants are evaluated on above 2048 nodes")
    p.add_argument("--flush-denormal", action="store_true",
                   help="flush subnormal floats to zero (torch.set_flush_denormal): softmax attention's "
                        "small probabilities otherwise slow the matrix products many times over")
    p.add_argument("--cpu-schedule", action="store_true",
                   help="the cosine schedule follows the CPU time used and training stops at the budget "
                        "(instead of a step count calibrated on the first steps)")
    p.add_argument("--tag", default="", help="suffix of the result files")
    p.add_argument("--report", action="store_true")
    p.add_argument("--figure", default=None, help="--report: where the plot goes (default: docs/figures/"
                   "burgers_resolution.png)")
    p.add_argument("--also-tags", nargs="+", action="extend", default=[], help="--report: the runs of these tags as well (repeatable: --also-tags=-a --also-tags=-b)")
    p.add_argument("--check-solver", action="store_true")
    p.add_argument("--reevaluate", action="store_true",
                   help="evaluate the saved models of --tag at --eval-res too (no training)")
    p.add_argument("--error-spectrum", action="store_true",
                   help="the saved models of --tag (and --also-tags): the share of the test error in modes >= 3")
    args = p.parse_args(argv)
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    if args.flush_denormal:
        torch.set_flush_denormal(True)
    if args.report:
        return report(args.tag, args.also_tags, args.figure)
    if args.check_solver:
        return check_solver()
    if args.reevaluate:
        return reevaluate(args)
    if args.error_spectrum:
        return error_spectrum(args)
    for name in args.models:
        r = run_model(name, args)
        print(json.dumps({k: v for k, v in r.items() if k != "curve"}), flush=True)


if __name__ == "__main__":
    main()
