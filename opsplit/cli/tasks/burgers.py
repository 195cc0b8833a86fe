"""``opsplit train`` with ``task = "burgers"``: the continuous transformer as a neural operator
(:class:`~opsplit.models.NeuralOperatorTransformer`: lifting, Galerkin / Fourier / softmax
attention with a spectral convolution integral and a feed-forward term, Lie or Strang
splitting, projection) trained as an optimal-control problem on 1-D viscous Burgers' equation
(:func:`opsplit.data.load_burgers`, generated and cached on first use) at one resolution, then
evaluated without retraining at ``eval.resolutions`` (docs/burgers.md).

The run folder holds ``config.toml`` (``task = "burgers"``), the trainer's checkpoints under
``train/``, the table ``eval_resolution.csv`` (relative L2 test error per resolution) and its
plot.  Resumable like the other tasks (``opsplit train --resume FOLDER``)."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import torch

from ...analysis import relative_l2
from ...control import Trainer
from ...data import load_burgers
from ...data.burgers import (
    NU,
    data_least_sizes,
    data_viscosity_range,
    generation_cost,
    grf_initial_conditions,
)
from ...models import NeuralOperatorTransformer
from ...models.neural_operator import ATTENTIONS, NONLINEARITIES, SCHEMES
from ..budget import FLOP_RATE, Estimate
from ..config import TOP, ConfigError, Field, at_least, positive, seed_field
from . import base
from .base import Interrupted, check_new_folder, train_key

__all__ = ["SCHEMA", "RENAMED", "check", "estimate", "prepare", "run", "build_model", "forward_flops",
           "check_new_folder"]

NAME = base.NAME
EXAMPLE = """\
burgers.toml:
  task = "burgers"        # the continuous transformer as a neural operator (docs/burgers.md)
  [model]
  attention = "galerkin"  # galerkin, fourier, softmax or none (no attention term)
  scheme = "strang"       # lie or strang
  [train]
  epochs = 20
  [data]
  resolution = 256        # the grid of training
  [eval]
  resolutions = [256, 512, 1024, 2048, 4096, 8192]
"""

#: the keys of an earlier version -> their names now (refused, naming the new one)
RENAMED = {"train.resolution": "data.resolution", "train.eval_resolutions": "eval.resolutions"}

SCHEMA = {
    TOP: {"task": base.task_field("burgers", "the training task: digits, text or burgers (a neural operator on "
                                  "Burgers' equation, docs/burgers.md)")},
    "model": {
        "attention": Field("str", "galerkin", "the attention integral over Omega_x (none: no attention term)",
                           choices=ATTENTIONS),
        "scheme": Field("str", "strang", "the splitting of convolution, feed-forward and attention",
                        choices=SCHEMES),
        "d_model": Field("int", 64, "features N_y of the state", at_least(1)),
        "heads": Field("int", 4, "attention heads", at_least(1)),
        "head_dim": Field("int", 0, "features per head (0: d_model / heads, which must then divide)", at_least(0)),
        "nonlinearity": Field("str", "ffn", "the pointwise nonlinearity: a feed-forward term (ffn) or an activation "
                              "map after the convolution and the attention (map)", choices=NONLINEARITIES),
        "n_steps": Field("int", 4, "time steps N_t (one weight set per step, dt = 1)", at_least(1)),
        "modes": Field("int", 16, "Fourier modes 0..M of the convolution kernel (M + 1 of them)", at_least(1)),
        "d_ff": Field("int", 128, "hidden width of the feed-forward term", at_least(1)),
        "n_freq": Field("int", 4, "frequencies of the periodic positions", at_least(0)),
        "output_scale": Field("float", 1.0, "initial size of the projection's output layer relative to nn.Linear's "
                              "(for a target much smaller than the input; the values measured: docs/burgers.md)", positive),
        "output_modes": Field("int", 0, "band-limit the output to the Fourier modes 0..M, this many of them, by a "
                              "trainable multiplier (opsplit.operators.FourierMultiplier; 0: no band limit)",
                              at_least(0)),
        "seed": seed_field("seed of the initial weights"),
    },
    "train": {
        "epochs": train_key("epochs", 20, "passes over the training pairs"),
        "batch_size": train_key("batch_size", 20, "pairs per step"),
        "lr": train_key("lr", 1e-3, "peak learning rate (Adam, cosine schedule)"),
        "weight_decay": train_key("weight_decay", 1e-4, "Adam weight decay"),
        "save_every": train_key("save_every", 50, "checkpoint every this many steps (for --resume)"),
        "seed": train_key("seed", 0, "seed of the data order"),
    },
    "eval": {
        "resolutions": Field("int_list", [256, 512, 1024, 2048, 4096, 8192], "grids N_x at which the trained "
                             "model is evaluated (divisors of data.points)", at_least(1)),
    },
    "data": {
        "resolution": Field("int", 256, "grid nodes N_x of training (a divisor of data.points)", at_least(1)),
        "n_train": Field("int", 1000, "training pairs", at_least(1)),
        "n_test": Field("int", 200, "test pairs", at_least(1)),
        "points": Field("int", 8192, "the generation grid (even; from 42 nodes on its modes resolve the data at "
                        "nu = 0.1)", at_least(8)),
        "solver_steps": Field("int", 1000, "ETDRK4 steps of the data's solver on [0, 1] (32 give a stable step at "
                              "any data.points)", at_least(1)),
        "seed": seed_field("seed of the initial conditions"),
    },
}


def overrides(a) -> dict:
    """The keys of ``opsplit train``'s flags."""
    if a.gradient is not None and a.gradient != "backprop":
        raise ConfigError(f"--gradient: the burgers task trains by backpropagation, got {a.gradient!r}")
    return {"train.epochs": a.epochs, "model.n_steps": a.n_steps, "model.scheme": a.scheme}


def train_config(cfg, progress: bool = True):
    """The run's TrainConfig (:func:`opsplit.cli.tasks.base.train_config`): Adam with a
    cosine schedule, evaluated by the command after training (not per epoch)."""
    return base.train_config(cfg, SCHEMA, own={}, fixed={"optimizer": "adam", "schedule": "cosine",
                                                          "warmup_steps": 0, "eval_every": 10**6},
                             progress=progress)


def objective(cfg):
    """The objective: the relative L2 error of the output, averaged over the batch
    (:func:`opsplit.analysis.relative_l2`; no running cost)."""
    return base.objective(cfg, "relative_l2")


def check(cfg) -> None:
    """The cross-key checks (no data generated, no model built); the ``[train]`` keys are
    checked by TrainConfig."""
    m, t, e, d = cfg["model"], cfg["train"], cfg["eval"], cfg["data"]
    if cfg[TOP]["task"] != "burgers":
        raise ConfigError(f"task: expected 'burgers' for this schema, got {cfg[TOP]['task']!r}")
    train_config(cfg, progress=False)
    if not m["head_dim"] and m["d_model"] % m["heads"]:
        raise ConfigError(f"model.heads: expected a divisor of model.d_model = {m['d_model']} (or a model.head_dim), "
                          f"got {m['heads']}")
    if d["points"] % 2:
        raise ConfigError(f"data.points: expected an even number of nodes, got {d['points']}")
    need = 2 * m["modes"] - 1
    what = f"convolution has {m['modes']} Fourier modes"
    if 2 * m["output_modes"] - 1 > need:
        need, what = 2 * m["output_modes"] - 1, f"output keeps {m['output_modes']} Fourier modes (model.output_modes)"
    for key, values in (("data.resolution", [d["resolution"]]), ("eval.resolutions", e["resolutions"])):
        for r in values:
            if d["points"] % r:
                raise ConfigError(f"{key}: expected divisors of data.points = {d['points']} (the data is "
                                  f"subsampled), got {r}")
            if r < need:
                raise ConfigError(f"{key}: the model's {what} and needs grids of at least "
                                  f"2 * {(need + 1) // 2} - 1 = {need} nodes, got {r}")
    if t["batch_size"] > d["n_train"]:
        raise ConfigError(f"train.batch_size: expected at most data.n_train = {d['n_train']}, got {t['batch_size']}")
    check_data_sizes(d)


def check_data_sizes(d: dict) -> None:
    """``data.points`` and ``data.solver_steps`` against the viscosity range of the data's
    solver at the benchmark's viscosity (:func:`opsplit.data.burgers.data_viscosity_range`):
    enough nodes to resolve the steepest viscous front, enough steps for a stable ETDRK4 step."""
    allowed = data_viscosity_range(d["points"], d["solver_steps"])
    if NU in allowed:
        return
    least_points, least_steps = data_least_sizes(d["points"])
    if allowed.resolved > NU or allowed.largest < NU:
        raise ConfigError(f"data.points: expected at least {least_points} nodes: fewer modes do not resolve the "
                          f"steepest viscous front of the data at nu = {NU} (modes decaying like "
                          f"exp(-4 pi nu m / max|u0|), max|u0| <= {allowed.amplitude:g}; opsplit.data.burgers_solver), "
                          f"got {d['points']}")
    raise ConfigError(f"data.solver_steps: expected at least {least_steps} steps at data.points = {d['points']}: "
                      f"with fewer the data solver's ETDRK4 step is unstable for the advection of its top modes at "
                      f"nu = {NU} (dt max_k (k max|u0| - 0.34 nu k^2) <= 2.82, max|u0| <= {allowed.amplitude:g}), "
                      f"got {d['solver_steps']}")


# -- the cost guard -------------------------------------------------------------------------------
def forward_flops(m: dict, n: int) -> tuple[float, float]:
    """``(flops, calls)`` of one field's forward pass on ``n`` nodes: per step the convolution
    (two real FFTs of the N_y channels, the mode mixing), the feed-forward term and the
    attention (Q, K, V, output projections; Galerkin / Fourier: the d x d integral per head;
    softmax: the n x n scores) — the first two twice for Strang — then lifting and projection."""
    d, f, h, M = m["d_model"], m["d_ff"], m["heads"], m["modes"]
    k = h * (m["head_dim"] or d // h)  # the heads' features together
    conv = 2 * 5.0 * n * math.log2(max(n, 2)) * d + 8.0 * M * d * d
    if m["nonlinearity"] == "map":
        conv += 2.0 * n * d * d  # the local part
    ffn = 4.0 * n * d * f if m["nonlinearity"] == "ffn" else 0.0
    attn = 8.0 * n * d * k + (4.0 * n * k * k / h if m["attention"] != "softmax" else 4.0 * n * n * k)
    n_att = 0 if m["attention"] == "none" else 1
    attn *= n_att
    twice = 2 if m["scheme"] == "strang" else 1
    if m["nonlinearity"] == "ffn":  # convolution and feed-forward outer, the attention in the middle
        per_step, calls = twice * (conv + ffn) + attn, 2 * twice + n_att
    else:  # convolution and attention outer, the activation map in the middle
        per_step, calls = twice * (conv + attn), twice * (1 + n_att) + 1
    edge = 2.0 * n * (1 + 2 * m["n_freq"]) * d + 2.0 * n * d * 128 + 2.0 * n * 128
    return m["n_steps"] * per_step + edge, float(m["n_steps"] * calls + 2)


def estimate(cfg) -> Estimate:
    """Data generation (first use only; :func:`opsplit.data.burgers.generation_cost` of
    data.n_train, data.n_test, data.points and data.solver_steps, its seconds counted as
    flops at :data:`~opsplit.cli.budget.FLOP_RATE`) and the data read at every grid,
    training (forward and backward: 3 forward passes), the evaluations; memory: the data's
    generation, parameters with Adam state, and the activations of a batch (and of an
    evaluation batch at the finest grid: softmax keeps its n x n scores)."""
    m, t, e, d = cfg["model"], cfg["train"], cfg["eval"], cfg["data"]
    n = d["resolution"]
    steps = t["epochs"] * math.ceil(d["n_train"] / t["batch_size"])
    fwd, calls = forward_flops(m, n)
    gen_seconds, gen_bytes = generation_cost(d["n_train"], d["n_test"], d["points"], d["solver_steps"])
    reads = (1 + len(e["resolutions"])) * 3 * 8.0 * (d["n_train"] + d["n_test"]) * d["points"] * 1e-9
    work = Estimate((gen_seconds + reads) * FLOP_RATE, (d["n_train"] + d["n_test"]) * 4.0)
    work += Estimate(steps * t["batch_size"] * 3 * fwd, steps * 3 * calls)
    for r in e["resolutions"]:
        f_r, c_r = forward_flops(m, r)
        work += Estimate(d["n_test"] * f_r, math.ceil(d["n_test"] / 20) * c_r)
    dm, f = m["d_model"], m["d_ff"]
    params = m["n_steps"] * (2.0 * m["modes"] * dm * dm + 4 * dm * dm + 2 * dm * f) + 200.0 * dm
    twice = 2 if m["scheme"] == "strang" else 1
    act = t["batch_size"] * m["n_steps"] * n * (twice * (4 * dm + 2 * f) + 8 * dm)
    top = max(e["resolutions"])
    eval_act = 20 * top * (4 * dm + f) + (20 * m["heads"] * top * top if m["attention"] == "softmax" else 0)
    return Estimate(work.flops, work.calls, 4.0 * (4.0 * params + act) + max(gen_bytes, 4.0 * eval_act))


# -- the job --------------------------------------------------------------------------------------
def load_data(cfg, resolution: int):
    d = cfg["data"]
    try:  # force: the command's own guard (estimate) has decided
        return load_burgers(resolution, n_train=d["n_train"], n_test=d["n_test"], seed=d["seed"],
                            points=d["points"], n_steps=d["solver_steps"], force=True)
    except (ValueError, TypeError) as e:
        raise ConfigError(f"data: {e}") from None


def build_model(m: dict):
    try:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(m["seed"])
            return NeuralOperatorTransformer(m["attention"], m["scheme"], d_model=m["d_model"], heads=m["heads"],
                                             head_dim=m["head_dim"] or None, nonlinearity=m["nonlinearity"],
                                             n_steps=m["n_steps"], modes=m["modes"], d_ff=m["d_ff"],
                                             n_freq=m["n_freq"], output_scale=m.get("output_scale", 1.0),
                                             output_modes=m.get("output_modes") or None,
                                             generator=torch.Generator().manual_seed(m["seed"]))
    except (ValueError, TypeError) as e:
        raise ConfigError(f"model: {e}") from None


def prepare(cfg) -> dict:
    """The library's own checks: the model is built, the untrained model is finite on two
    draws of the data's random initial conditions at the training grid, and the trainer's
    checks before its first step pass (:func:`~opsplit.cli.tasks.base.preflight`).  The
    data itself is loaded (generated and cached on first use) by :func:`run`:
    ``--print-config`` never generates it (its sizes are checked by :func:`check`)."""
    model = build_model(cfg["model"])
    r = cfg["data"]["resolution"]
    q = r * max(1, math.ceil(8 / r))  # at least 8 nodes drawn, every (q / r)-th kept
    u0 = torch.from_numpy(grf_initial_conditions(2, q, np.random.default_rng(0))[:, :: q // r].copy()).float()
    with torch.no_grad():
        out = model.eval()(u0)
    model.train()
    if not bool(torch.isfinite(out).all()):
        raise ConfigError("model: the untrained model's output on two fields is not finite")
    base.preflight(model, objective(cfg), train_config(cfg, progress=False), u0, u0, "fields")
    return {"model": model}


def fit(cfg, plan, folder: Path, progress: bool):
    """Train (:func:`~opsplit.cli.tasks.base.fit`: resumable, an interrupt saves a
    checkpoint); returns ``(trainer, history, resumed)``."""
    return base.fit(lambda callbacks: Trainer(plan["model"], objective(cfg), train_config(cfg, progress),
                                              callbacks=callbacks), folder, plan["train"], None)


def run(cfg, plan, out, progress=True):
    # slow to import (about 1 s): loaded when the job draws
    import matplotlib.pyplot as plt

    m, e, d = cfg["model"], cfg["eval"], cfg["data"]
    model = plan["model"]
    plan["train"], plan["test"] = load_data(cfg, d["resolution"])
    try:
        trainer, history, resumed = fit(cfg, plan, out.folder / "train", progress)
    except Interrupted as err:
        err.folder = out.folder
        raise
    model.eval()
    rows = []
    with torch.no_grad():
        for r in e["resolutions"]:
            _, test = load_data(cfg, r)
            errs = torch.cat([relative_l2(model(test.inputs[i:i + 20]), test.targets[i:i + 20], reduction="none")
                              for i in range(0, len(test), 20)])
            rows.append({"resolution": r, "relative_l2": float(errs.mean()), "max_relative_l2": float(errs.max()),
                         "trained_at": "yes" if r == d["resolution"] else ""})
    out.heading("A neural operator on Burgers' equation")
    out.text(
        f"The continuous transformer as a neural operator (opsplit.models.NeuralOperatorTransformer: periodic "
        f"positions, {m['attention']} attention, a spectral convolution integral with {m['modes']} modes and a "
        f"feed-forward term, {m['scheme']} splitting, N_t = {m['n_steps']}, d_model {m['d_model']}) trained as an "
        f"optimal-control problem on u_t + (u^2/2)_x = 0.1 u_xx ({d['n_train']} training and {d['n_test']} test "
        f"pairs, u_0 -> u(1)) at {d['resolution']} nodes: Adam, {trainer.step} steps"
        + (" (resumed from a checkpoint)" if resumed else "")
        + ", relative L2 loss. Then evaluated, without retraining, on the grids below."
    )
    out.table("eval_resolution", rows, title="relative L2 test error per grid (mean and worst over the test pairs)")
    steps = history.steps
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(10, 3.8), layout="constrained")
    a1.semilogy([r["step"] for r in steps], [r["loss"] for r in steps], lw=0.8)
    a1.set_xlabel("optimizer step")
    a1.set_ylabel("training loss (relative L2)")
    a1.set_title("training curve")
    a2.loglog([r["resolution"] for r in rows], [r["relative_l2"] for r in rows], "o-", base=2)
    a2.axvline(d["resolution"], color="gray", ls=":", lw=0.8)
    a2.set_xlabel("evaluation grid N_x (dotted: trained at)")
    a2.set_ylabel("relative L2 test error")
    a2.set_title("one trained model on other grids")
    out.figure(fig, "burgers_training", "training loss per step; test error against the evaluation grid")
    out.link("train/curves.png", "the trainer's own plot of its history (opsplit.control)")
    return trainer, history, rows
