"""``opsplit train`` (``task = "digits"``, the default): training as an optimal-control problem
(paper 002, eqs. 10-12) through :mod:`opsplit.control`: a ViT-style model (patch embedding F,
split encoder N_theta, class-token read-out G; eq. 36) on scikit-learn's bundled digits,
then evaluated at other N_t and with other substep solvers than it was trained with (the
solver-swap table).  Resumable: ``opsplit train --resume FOLDER`` continues from the
folder's config and latest checkpoint; an interrupt (Ctrl-C) stops at the end of the current
optimizer step, saves a checkpoint there and prints the command that continues the run."""

from __future__ import annotations

import math
import warnings
from pathlib import Path

import numpy as np
import torch

from ...control import Trainer
from ...control.continuity import SCHEMES as EVAL_SCHEMES
from ...control.frontier import default_frontier_n_steps
from ...control.resolution import expected_n_steps, expected_stages
from ...data import TensorData, load_digits, random_shift
from ...models import ImageClassifier, SplitEncoder
from ...models.split_encoder import CONTROL_KINDS, SCHEMES
from ...solvers import EXPLICIT_SOLVERS, ODESolve, solver_class, solver_for
from .. import continuity_report, frontier_report
from ..budget import Estimate
from ..config import (
    TOP,
    ConfigError,
    Field,
    at_least,
    between,
    both,
    distinct,
    positive,
    seed_field,
)
from ..train_report import report_training
from . import base
from .base import Interrupted, check_new_folder, level_keys, objective_key, train_key

__all__ = ["SCHEMA", "RENAMED", "check", "estimate", "prepare", "run", "build_model", "forward_flops",
           "Interrupted", "check_new_folder"]

NAME = base.NAME
EXAMPLE = """\
train.toml:
  [model]                 # ImageClassifier(SplitEncoder): F, N_theta, G of paper 002, eq. 36
  d_model = 32
  n_steps = 4             # N_t of training
  scheme = "hybrid"       # lie, strang, parallel, hybrid
  control = "piecewise_constant"
  solver = "euler"        # the substeps: euler (a transformer layer per step) or rk4
  [train]
  epochs = 10
  gradient = "backprop"   # backprop, checkpoint, adjoint (adjoint: model.solver = "rk4")
  [eval]
  n_steps = [2, 4, 8, 16]   # N_t at which the trained model is evaluated
"""

#: the digits are 8 x 8 images
SIDE = 8
#: model.solver -> the encoder's substeps: explicit Euler (a transformer layer per step) or
#: one classical RK4 step by torchdiffeq (ODE substeps: what the adjoint gradient solves)
MODEL_SOLVERS = {"euler": lambda: solver_for("euler"), "rk4": lambda: ODESolve("rk4")}
#: the keys that fix what a digits run trains on, beyond TrainConfig (TrainConfig.extra:
#: recorded in the run's checkpoints; an edit is refused on --resume like one of train.lr)
DATA_KEYS = ("data.test_fraction", "data.split_seed", "data.limit", "data.shift")
#: the keys of an earlier version -> their names now (refused, naming the new one)
RENAMED = {"train.train_n_steps": "train.n_steps", "train.train_solvers": "train.solvers",
           "train.kinetic": "objective.kinetic", "train.acceleration": "objective.acceleration",
           "train.defect": "objective.defect", "train.eval_n_steps": "eval.n_steps",
           "train.eval_solvers": "eval.solvers", "train.eval_schemes": "eval.schemes", "train.shift": "data.shift"}

SCHEMA = {
    TOP: {"task": base.task_field("digits", "the training task: digits (a ViT on the bundled digits), text (a "
                                  "character-level GPT, docs/text.md) or burgers (a neural operator, docs/burgers.md)")},
    "model": {
        "d_model": Field("int", 32, "embedding size N_y (a multiple of heads)", at_least(1)),
        "heads": Field("int", 4, "attention heads", at_least(1)),
        "d_ff": Field("int", 64, "FFN hidden width", at_least(1)),
        "n_steps": Field("int", 4, "time steps N_t of training", at_least(1)),
        "T": Field("float", 4.0, "final time (T = n_steps: dt = 1, the paper's choice)", positive),
        "patch": Field("int", 2, "patch side (a divisor of 8, the digits' side)", at_least(1)),
        "scheme": Field("str", "hybrid", "splitting scheme of the encoder", choices=SCHEMES),
        "control": Field("str", "piecewise_constant", "time dependence of the controls", choices=CONTROL_KINDS),
        "solver": Field("str", "euler", "substep solver: explicit Euler (the transformer's layer) or one classical "
                        "RK4 step (torchdiffeq; needed by the adjoint)", choices=tuple(MODEL_SOLVERS)),
        "seed": seed_field("seed of the initial weights"),
    },
    "train": {
        "epochs": train_key("epochs", 10),
        "max_steps": train_key("max_steps"),
        "batch_size": train_key("batch_size", 64, "images per step"),
        "lr": train_key("lr", 1e-2, "peak learning rate (AdamW, cosine schedule)"),
        "weight_decay": train_key("weight_decay", 0.05, "AdamW weight decay"),
        "warmup_steps": train_key("warmup_steps", 10),
        "gradient": train_key("gradient", "backprop"),
        "save_every": train_key("save_every", 20, "checkpoint every this many steps (for --resume)"),
        "seed": train_key("seed", 0, "seed of the data order, augmentation and dropout"),
        "n_steps": train_key("n_steps", [2, 4, 8], "multi-resolution training: every step solves the model at an "
                             "N_t drawn from this list ([model.n_steps]: one N_t)"),
        "n_steps_weights": train_key("n_steps_weights", "cost", "how the N_t of n_steps are drawn: cost "
                                     "(probability proportional to 1/N_t: each resolution the same compute), uniform "
                                     "or one weight per N_t"),
        "solvers": train_key("solvers", ["euler", "heun"], "every step also draws the substep solver from this "
                             "list ([model.solver]: its own only)"),
        "solvers_weights": train_key("solvers_weights", "cost", "how the solvers are drawn: cost (probability "
                                     "proportional to 1/stages), uniform or one weight per solver"),
        "solvers_split": train_key("solvers_split", False),
        "solvers_split_weights": train_key("solvers_split_weights", "shares"),
        **level_keys(),
    },
    "objective": {
        "kinetic": objective_key("kinetic", 0.3, "weight of the flow's relative kinetic energy (a running cost "
                                 "that makes the flow easy to solve; docs/continuity.md)"),
        "acceleration": objective_key("acceleration", 0.0, "weight of the flow's relative acceleration"),
        "defect": objective_key("defect", 0.0, "weight of the steps' local error estimate (one extra step on a "
                                "quarter of each batch)"),
    },
    "eval": {
        "n_steps": Field("int_list", [2, 4, 8, 16, 32], "N_t at which the trained model is evaluated on the test "
                         "set (the solver-swap table)", both(at_least(1), distinct)),
        "solvers": Field("str_list", ["heun", "rk4"], "substep solvers the trained model is also solved with, at "
                         "N_t >= model.n_steps (besides its own)", distinct, choices=EXPLICIT_SOLVERS),
        "schemes": Field("str_list", ["trained"], "schemes of the solver-swap table: trained (the model's) "
                         "and/or strang", choices=EVAL_SCHEMES),
    },
    "frontier": {
        "enabled": Field("bool", False, "after training, also measure one model at every depth: the trained model "
                         "solved at frontier.n_steps (a step longer than a control piece reads the pieces' average) "
                         "beside models trained at one N_t alone (the frontier table and plot, docs/multilevel.md)"),
        "n_steps": Field("int_list", [1, 2, 4, 8], "N_t of the frontier (default: a quarter, half, one and two times "
                         "model.n_steps); those below model.n_steps divide it", both(at_least(1), distinct),
                         derive=lambda cfg: default_frontier_n_steps(cfg["model"]["n_steps"])),
        "references": Field("bool", True, "train a model at each N_t of frontier.n_steps up to model.n_steps alone "
                            "(its controls in N_t pieces, its own N_t and solver only, the same epochs, batch, "
                            "learning rate, seeds and objective) for the frontier's points"),
    },
    "data": {
        "test_fraction": Field("float", 0.2, "held-out fraction (stratified)",
                               lambda v: None if 0 < v < 1 else "a number in (0, 1)"),
        "split_seed": seed_field("seed of the train/test split"),
        "limit": Field("int", 0, "use only this many training images (0: all)", at_least(0)),
        "shift": Field("int", 0, "random-shift augmentation of the training images in pixels (0: none)",
                       between(0, SIDE - 1, "a shift in pixels")),
    },
}


def overrides(a) -> dict:
    """The keys of ``opsplit train``'s flags."""
    return {"train.epochs": a.epochs, "model.n_steps": a.n_steps, "model.scheme": a.scheme,
            "train.gradient": a.gradient}


def train_config(cfg, progress: bool = True):
    """The run's TrainConfig (:func:`opsplit.cli.tasks.base.train_config`): AdamW with a
    cosine schedule, the gradient norm clipped to 1."""
    m = cfg["model"]
    return base.train_config(cfg, SCHEMA, own={"n_steps": [m["n_steps"]], "solvers": [m["solver"]]},
                             fixed={"schedule": "cosine", "grad_clip": 1.0}, progress=progress, extra=DATA_KEYS)


def objective(cfg):
    """The objective: cross-entropy and the flow costs of ``[objective]``."""
    return base.objective(cfg, "cross_entropy")


def _digits_split(d: dict):
    return load_digits(test_fraction=d["test_fraction"], seed=d["split_seed"])


def _train_split(d: dict):
    train, test = _digits_split(d)
    if d["limit"]:
        train = TensorData(train.inputs[: d["limit"]], train.targets[: d["limit"]],
                           name="digits_train", info=train.info)
    return train, test


def check(cfg) -> None:
    """The cross-key checks (no model built); the ``[train]`` and ``[objective]`` keys are
    checked by TrainConfig and Objective."""
    m, t, d = cfg["model"], cfg["train"], cfg["data"]
    if cfg[TOP]["task"] != "digits":
        raise ConfigError(f"task: expected 'digits' for this schema, got {cfg[TOP]['task']!r}")
    if m["d_model"] % m["heads"]:
        raise ConfigError(f"model.heads: expected a divisor of model.d_model = {m['d_model']}, "
                          f"got {m['heads']}")
    if SIDE % m["patch"]:
        raise ConfigError(f"model.patch: expected a divisor of {SIDE} (the digits are {SIDE} x {SIDE} "
                          f"images), got {m['patch']}")
    train_config(cfg, progress=False)
    objective(cfg)
    if m["solver"] != "euler" and t["solvers"] != [m["solver"]]:
        raise ConfigError(f"train.solvers: the drawn solvers replace explicit-Euler substeps; with model.solver "
                          f"= {m['solver']!r} expected [{m['solver']!r}] (its own only), got {t['solvers']}")
    try:
        # slow to import: loaded when the digits task runs (a dependency, checked for a clear message)
        import sklearn  # noqa: F401
    except ImportError:
        raise ConfigError("train: the bundled digits need scikit-learn (pip install scikit-learn)") from None
    # slow to import: loaded when the digits task runs
    from sklearn.datasets import load_digits as sk_digits

    f = d["test_fraction"]
    counts = np.bincount(sk_digits(return_X_y=True)[1], minlength=10)
    # load_digits puts round(f n_c) images of digit c in the test set: each side keeps every
    # digit for f in (0.5 / n_min, 1 - 0.5 / n_min)
    lo, hi = 0.5 / counts.min(), 1 - 0.5 / counts.min()
    try:
        with warnings.catch_warnings():  # an empty side: torch's std() warns before the error
            warnings.simplefilter("ignore")
            train, test = _digits_split(d)
        n_tr, n_te = np.bincount(train.targets.numpy(), minlength=10), np.bincount(test.targets.numpy(), minlength=10)
    except ValueError:  # an empty side
        n_te = np.array([round(f * n) for n in counts])
        n_tr = counts - n_te
    for c in range(10):
        if n_tr[c] == 0 or n_te[c] == 0:
            raise ConfigError(
                f"data.test_fraction: the stratified split puts {int(n_te[c])} of the {counts[c]} "
                f"images of digit {c} in the test set, leaving "
                f"{'no training image' if n_tr[c] == 0 else 'no test image'}; expected a fraction "
                f"that keeps every digit on both sides (between {lo:.4f} and {hi:.4f}), got {f}")
    dt = m["T"] / m["n_steps"]
    if dt > 1e30:
        raise ConfigError(f"model.T: the model runs in float32, and its steps T / n_steps = {dt:.3g} "
                          f"leave no room for the states (float32 ends at 3.4e38); expected a smaller "
                          f"model.T, got {m['T']:g}")


# -- the cost guard -------------------------------------------------------------------------------
def tokens(m: dict) -> int:
    """Tokens of the model: the patches and the class token."""
    return (SIDE // m["patch"]) ** 2 + 1


def forward_flops(m: dict, n_steps: int) -> tuple[float, float]:
    """``(flops, calls)`` of one image's forward pass at N_t = ``n_steps``: per step and
    solver stage, the heads (Q, K, V and output projections, scores and the weighted sum)
    and the feed-forward term; the patch embedding and the read-out once."""
    L, d, f, h = tokens(m), m["d_model"], m["d_ff"], m["heads"]
    heads, ffn = 8.0 * L * d * d + 4.0 * L * L * d, 4.0 * L * d * f
    stages = solver_class(m["solver"]).stages
    if m["scheme"] == "strang":
        per_step, calls = 2 * heads + ffn, 2 * h + 1
    else:
        per_step, calls = heads + ffn, h + 1
    edge = 2.0 * (L - 1) * m["patch"] ** 2 * d + 2.0 * d * 10
    return n_steps * stages * per_step + edge, float(n_steps * stages * calls)


def estimate(cfg) -> Estimate:
    """The training (forward, backward: 3 forward passes' flops; 4 with recomputation) and
    the evaluations; memory: parameters with their gradients and AdamW state, and the
    activations autograd keeps for a batch."""
    m, t, e, d = cfg["model"], cfg["train"], cfg["eval"], cfg["data"]
    n_test = max(1, round(d["test_fraction"] * 1797))
    n_train = 1797 - n_test
    if d["limit"]:
        n_train = min(n_train, d["limit"])
    steps = t["epochs"] * math.ceil(n_train / t["batch_size"])
    if t["max_steps"]:
        steps = min(steps, t["max_steps"])
    # training: the mean cost of a step over the draws of train.n_steps and train.solvers
    draws = t["n_steps"]
    own_stages = solver_class(m["solver"]).stages
    n_draw = expected_n_steps(draws, t["n_steps_weights"])
    n_draw *= expected_stages(t["solvers"], t["solvers_weights"]) / own_stages \
        if t["solvers"] != [m["solver"]] else 1.0
    fwd, calls = forward_flops(m, m["n_steps"])
    f_draw, c_draw = (fwd * n_draw / m["n_steps"], calls * n_draw / m["n_steps"])
    passes = 3 if t["gradient"] == "backprop" else 4
    batch = min(t["batch_size"], n_train)
    work = Estimate(steps * batch * passes * f_draw, steps * passes * c_draw)
    evals = min(t["epochs"], math.ceil(steps * batch / max(n_train, 1)) + 1)
    work += Estimate(evals * n_test * fwd, evals * math.ceil(n_test / 512) * calls)
    # the solver-swap table: every eval N_t with the model's solver, the finer ones with each
    # eval solver, and the output convergence levels N_t x 2 ... 16
    own = set(e["n_steps"]) | {m["n_steps"] * k for k in (1, 2, 4, 8, 16)}
    runs = [(n, 1.0) for n in own] + [(n, solver_class(s).stages / own_stages)
                                      for s in e["solvers"] for n in e["n_steps"] if n >= m["n_steps"]]
    for n, k in runs:
        f_n, c_n = forward_flops(m, n)
        work += Estimate(k * n_test * f_n, k * math.ceil(n_test / 512) * c_n)
    L, dm, f, h = tokens(m), m["d_model"], m["d_ff"], m["heads"]
    pieces = m["n_steps"] if m["control"] in ("piecewise_constant", "piecewise_linear") else 3
    params = pieces * (4.0 * dm * dm + 2.0 * dm * f + 10.0 * dm + f) + m["patch"] ** 2 * dm + 11.0 * dm
    per_image = max(draws) * own_stages * (3.0 * h * L * L + 12.0 * L * dm + 3.0 * L * f)
    eval_n = max([m["n_steps"], *e["n_steps"]])
    eval_image = own_stages * (3.0 * h * L * L + 4.0 * L * dm + 2.0 * L * f)
    act = max(batch * per_image, min(512, n_test) * eval_image * min(eval_n, 2))
    if cfg["frontier"]["enabled"]:  # the one model at every N_t of the frontier, and the references' training
        for n in cfg["frontier"]["n_steps"]:
            f_n, c_n = forward_flops(m, n)
            work += Estimate(n_test * f_n, math.ceil(n_test / 512) * c_n)
        for n in reference_n_steps(cfg):
            r = estimate(reference_config(cfg, n))
            work += Estimate(r.flops, r.calls)
    return Estimate(work.flops, work.calls, 4.0 * (5.0 * params + act))


# -- the job --------------------------------------------------------------------------------------
def build_model(m: dict):
    g = torch.Generator().manual_seed(m["seed"])
    solver = MODEL_SOLVERS[m.get("solver", "euler")]()
    try:
        # F and G initialise from torch's global generator (as torch.nn modules do): seed it
        # with model.seed for the construction only, leaving the caller's RNG state as it was
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(m["seed"])
            enc = SplitEncoder(m["d_model"], m["heads"], m["d_ff"], n_steps=m["n_steps"], T=m["T"],
                               scheme=m["scheme"], control=m["control"], solver=solver, generator=g)
            return ImageClassifier(SIDE, m["patch"], 1, 10, enc)
    except (ValueError, TypeError) as e:
        raise ConfigError(f"model: {e}") from None


def prepare(cfg) -> dict:
    """The library's own checks: the model is built, the untrained model gives finite
    outputs, and the trainer's checks before its first step pass (the gradient mode, the
    objective's weights, the drawn solvers: :func:`~opsplit.cli.tasks.base.preflight`)."""
    m = cfg["model"]
    model = build_model(m)
    train, _ = _digits_split(cfg["data"])
    try:
        with torch.no_grad(), warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="There is a performance drop")
            out = model.eval()(train.inputs[:2])
    except (RuntimeError, ValueError) as e:
        raise ConfigError(f"model: the untrained model fails on two digits: {e}") from None
    finally:
        model.train()
    if not bool(torch.isfinite(out).all()):
        raise ConfigError(
            f"model.T: the untrained model's output on two digits is not finite (T = {m['T']:g}, "
            f"N_t = {m['n_steps']}: steps of {m['T'] / m['n_steps']:g}); expected a smaller model.T"
        )
    base.preflight(model, objective(cfg), train_config(cfg, progress=False), train.inputs[:2], train.targets[:2],
                   "digits", gradient_hint=" (here: model.solver = 'rk4' makes the substeps ODE solves)")
    base.check_coarse_keys(model, cfg)
    for n in reference_n_steps(cfg):  # the frontier's references: their settings pass the same checks
        train_config(reference_config(cfg, n), progress=False)
    return {"model": model}


def check_resumed(cfg, plan, folder: Path, allow=None) -> None:
    """``--resume``: the folder's checkpoint against this config, before anything is
    written (:func:`~opsplit.cli.tasks.base.check_checkpoint`)."""
    c = train_config(cfg, progress=False)
    n = len(_train_split(cfg["data"])[0])
    total = -(-n // c.batch_size) * c.epochs
    base.check_checkpoint(plan, folder, allow, trainer=Trainer(plan["model"], objective(cfg), c),
                          total_steps=min(total, c.max_steps) if c.max_steps else total,
                          keys=base.run_keys(cfg), data_keys=DATA_KEYS, renamed=RENAMED)


def augment(shift: int):
    """The trainer's augmentation: a random shift of up to ``shift`` pixels (``None``: none)."""
    if not shift:
        return None
    return lambda x, g: random_shift(x, g, max_shift=shift)


def fit(cfg, model, folder: Path, progress: bool = True, allow=False):
    """Train ``model`` with the config's trainer settings (:func:`~opsplit.cli.tasks.base.fit`:
    resumable, an interrupt saves a checkpoint); returns ``(trainer, history, train, test,
    resumed)``."""
    train, test = _train_split(cfg["data"])
    trainer, history, resumed = base.fit(
        lambda callbacks: Trainer(model, objective(cfg), train_config(cfg, progress),
                                  augment=augment(cfg["data"]["shift"]), callbacks=callbacks),
        folder, train, test, allow=allow)
    return trainer, history, train, test, resumed


def run(cfg, plan, out, progress=True, heading="Training", prefix=""):
    m, t, o, e = cfg["model"], cfg["train"], cfg["objective"], cfg["eval"]
    model = plan["model"]
    sub = out.folder / f"{prefix}train"
    try:
        trainer, history, train, test, resumed = fit(cfg, model, sub, progress, plan.get("allow_changes", False))
    except Interrupted as err:
        err.folder = out.folder
        raise
    with base.resumable_after_training(trainer, out.folder, f"{prefix}train"):
        cont = continuity_report.measure(model, test, n_steps=e["n_steps"], reference=m["n_steps"],
                                         solvers=["trained", *e["solvers"]], schemes=e["schemes"],
                                         coarse=t["coarse_controls"] or "point")
    split_weighted = t["solvers_split"] and isinstance(t["solvers_split_weights"], list)
    out.heading(heading)
    out.text(
        f"Training as an optimal-control problem (paper 002, eq. 12): the controls of a "
        f"ViT-style model (patch embedding F, a {m['scheme']} split encoder with "
        f"{m['control']} controls, d_model {m['d_model']}, {m['heads']} heads, N_t = "
        f"{m['n_steps']} on [0, {m['T']:g}], class-token read-out G; eq. 36) minimise the "
        f"cross-entropy on scikit-learn's bundled digits ({len(train)} training, {len(test)} "
        f"test images), AdamW, {t['gradient']} gradients, {trainer.step} steps"
        + (f", each at an N_t drawn from {t['n_steps']} ({t['n_steps_weights']} weights)"
           if len(t["n_steps"]) > 1 else "")
        + (f" with {'every batch shared between the substep solvers' if t['solvers_split'] else 'a substep solver drawn from'}"
           f" {t['solvers']} ({t['solvers_weights']} weights"
           + (f"; the parts weighted {t['solvers_split_weights']} in the objective" if split_weighted else "") + ")"
           if t["solvers"] != [m["solver"]] else "")
        + "".join(f", {k} cost weight {o[k]:g}" for k in ("kinetic", "acceleration", "defect") if o[k])
        + (" (resumed from a checkpoint)" if resumed else "") + ". "
        "The trained controls are functions of t, so the model is also solved at other N_t and with other "
        "substep solvers (the solver-swap table below)."
    )
    epochs = [{k: r.get(k) for k in ("epoch", "step", "train_loss", "eval_loss", "eval_accuracy",
                                     "time")} for r in history.epochs]
    report_training(out, prefix, sub.name, history.steps, epochs, None, m["n_steps"], continuity=cont)
    front = None
    if cfg["frontier"]["enabled"]:
        front = run_frontier(cfg, model, test, out, progress, prefix, plan.get("allow_changes", False))
    return trainer, history, cont, front


def reference_config(cfg: dict, n: int) -> dict:
    """The config of the frontier's reference at N_t = ``n``: the run's, with the model's
    controls in ``n`` pieces trained at N_t = ``n`` and the model's solver alone (no draws,
    no levels, no coarse reading), the same epochs, batch, learning rate, seeds, data and
    objective."""
    ref = {k: dict(v) for k, v in cfg.items()}
    ref["model"]["n_steps"] = n
    tr = SCHEMA["train"]
    ref["train"].update({"n_steps": [n], "solvers": [cfg["model"]["solver"]], "solvers_split": False,
                         **{k: tr[k].default for k in ("n_steps_weights", "solvers_weights", "solvers_split_weights",
                                                       *base.LEVEL_KEYS)}})
    ref["eval"] = {"n_steps": [n], "solvers": [], "schemes": ["trained"]}
    ref["frontier"] = {**cfg["frontier"], "enabled": False}
    return ref


def reference_n_steps(cfg: dict) -> list[int]:
    """The N_t at which the frontier trains a model alone: those of frontier.n_steps up to
    model.n_steps (none without frontier.references)."""
    f = cfg["frontier"]
    if not (f["enabled"] and f["references"]):
        return []
    return [n for n in sorted(f["n_steps"]) if n <= cfg["model"]["n_steps"]]


def run_frontier(cfg, model, test, out, progress, prefix, allow):
    """The frontier section: a model trained at every N_t of :func:`reference_n_steps` alone
    (resumable, each in its own folder ``train_nt<N>``), then the trained ``model`` solved at
    every N_t of frontier.n_steps beside them (:mod:`opsplit.cli.frontier_report`)."""
    refs = {}
    for n in reference_n_steps(cfg):
        rcfg = reference_config(cfg, n)
        ref = build_model(rcfg["model"])
        try:
            fit(rcfg, ref, out.folder / f"{prefix}train_nt{n}", progress, allow)
        except Interrupted as err:
            err.folder = out.folder
            raise
        refs[n] = ref
    front = frontier_report.measure(model, test, n_steps=cfg["frontier"]["n_steps"], references=refs)
    t = cfg["train"]
    out.heading("One model, every depth")
    frontier_report.write(out, front, grid=cfg["model"]["n_steps"], prefix=prefix,
                          budget=f"each {t['epochs']} epochs at its own N_t, controls in N_t pieces")
    if refs:
        out.files([f"{prefix}train_nt{n}/{f}" for n in refs for f in ("steps.csv", "epochs.csv", "curves.png")],
                  "The trainer's files of the models trained at one N_t alone: every step, every epoch, their plots")
    return front
