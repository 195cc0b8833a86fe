"""``opsplit train``: training as an optimal-control problem (paper 002, eqs. 10-12)
through :mod:`opsplit.control`: a ViT-style model (patch embedding F, split encoder
N_theta, class-token read-out G; eq. 36) on scikit-learn's bundled digits, then evaluated
at other N_t than it was trained at.  Resumable: ``opsplit train --resume FOLDER``
continues from the folder's config and latest checkpoint."""

from __future__ import annotations

import warnings
from pathlib import Path

from .config import ConfigError, Field, at_least, positive

NAME = "train"
SUMMARY = "train a model's controls (optimal control) on the bundled digits; resumable"
EXAMPLE = """\
examples:
  opsplit train --epochs 10 --out runs/train
  opsplit train --resume runs/train        # continue an interrupted run from its folder
  opsplit train --config train.toml

train.toml:
  [model]                 # ImageClassifier(SplitEncoder): F, N_theta, G of paper 002, eq. 36
  d_model = 32
  n_steps = 4             # N_t of training
  scheme = "hybrid"       # lie, strang, parallel, hybrid
  control = "piecewise_constant"
  [train]
  epochs = 10
  gradient = "backprop"   # backprop, checkpoint, adjoint
  eval_n_steps = [2, 4, 8, 16]   # N_t at which the trained model is evaluated
"""

SCHEMES = ("lie", "strang", "parallel", "hybrid")
CONTROLS = ("piecewise_constant", "piecewise_linear", "legendre", "chebyshev", "cosine")
GRADIENTS = ("backprop", "checkpoint", "adjoint")

SCHEMA = {
    "model": {
        "d_model": Field("int", 32, "embedding size N_y (a multiple of heads)", at_least(1)),
        "heads": Field("int", 4, "attention heads", at_least(1)),
        "d_ff": Field("int", 64, "FFN hidden width", at_least(1)),
        "n_steps": Field("int", 4, "time steps N_t of training", at_least(1)),
        "T": Field("float", 4.0, "final time (T = n_steps: dt = 1, the paper's choice)", positive),
        "patch": Field("int", 2, "patch side (a divisor of 8, the digits' side)", at_least(1)),
        "scheme": Field("str", "hybrid", "splitting scheme of the encoder", choices=SCHEMES),
        "control": Field("str", "piecewise_constant", "time dependence of the controls",
                         choices=CONTROLS),
        "seed": Field("int", 0, "seed of the initial weights", at_least(0)),
    },
    "train": {
        "epochs": Field("int", 10, "passes over the training set", at_least(1)),
        "max_steps": Field("int", 0, "stop after this many optimizer steps (0: epochs decide)",
                           at_least(0)),
        "batch_size": Field("int", 64, "images per step", at_least(1)),
        "lr": Field("float", 1e-2, "peak learning rate (AdamW, cosine schedule)", positive),
        "weight_decay": Field("float", 0.05, "AdamW weight decay", at_least(0)),
        "warmup_steps": Field("int", 10, "linear warm-up steps", at_least(0)),
        "gradient": Field("str", "backprop", "how the gradient of J is computed",
                          choices=GRADIENTS),
        "shift": Field("int", 0, "random-shift augmentation in pixels (0: none)", at_least(0)),
        "save_every": Field("int", 20, "checkpoint every this many steps (for --resume)",
                            at_least(1)),
        "seed": Field("int", 0, "seed of the data order, augmentation and dropout", at_least(0)),
        "eval_n_steps": Field("int_list", [2, 4, 8, 16], "N_t at which the trained model is "
                              "evaluated on the test set", at_least(1)),
    },
    "data": {
        "test_fraction": Field("float", 0.2, "held-out fraction (stratified)",
                               lambda v: None if 0 < v < 1 else "a number in (0, 1)"),
        "split_seed": Field("int", 0, "seed of the train/test split", at_least(0)),
        "limit": Field("int", 0, "use only this many training images (0: all)", at_least(0)),
    },
}


def add_arguments(p):
    p.add_argument("--resume", metavar="DIR", help="continue the run in DIR (its config.toml "
                   "and latest checkpoint)")
    p.add_argument("--epochs", type=int, help="train.epochs")
    p.add_argument("--n-steps", type=int, help="model.n_steps (N_t of training)")
    p.add_argument("--scheme", help="model.scheme")
    p.add_argument("--gradient", help="train.gradient: backprop, checkpoint or adjoint")


def overrides(a) -> dict:
    return {"train.epochs": a.epochs, "model.n_steps": a.n_steps, "model.scheme": a.scheme,
            "train.gradient": a.gradient}


def resume_config(folder):
    p = Path(folder) / "config.toml"
    if not p.is_file():
        raise ConfigError(f"--resume: expected an opsplit train output folder with config.toml, "
                          f"{str(folder)!r} has none")
    return p


def prepare(cfg) -> dict:
    m = cfg["model"]
    if m["d_model"] % m["heads"]:
        raise ConfigError(f"model.heads: expected a divisor of model.d_model = {m['d_model']}, "
                          f"got {m['heads']}")
    if 8 % m["patch"]:
        raise ConfigError(f"model.patch: expected a divisor of 8 (the digits are 8 x 8 images), "
                          f"got {m['patch']}")
    try:
        import sklearn  # noqa: F401
    except ImportError:
        raise ConfigError("train: the bundled digits need scikit-learn (pip install scikit-learn)") from None
    model = build_model(m)  # the library's own checks, before any training
    return {"model": model}


def build_model(m: dict):
    import torch

    from ..models import ImageClassifier, SplitEncoder

    g = torch.Generator().manual_seed(m["seed"])
    try:
        # F and G initialise from torch's global generator (as torch.nn modules do): seed it
        # with model.seed for the construction only, leaving the caller's RNG state as it was
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(m["seed"])
            enc = SplitEncoder(m["d_model"], m["heads"], m["d_ff"], n_steps=m["n_steps"], T=m["T"],
                               scheme=m["scheme"], control=m["control"], generator=g)
            return ImageClassifier(8, m["patch"], 1, 10, enc)
    except (ValueError, TypeError) as e:
        raise ConfigError(f"model: {e}") from None


def _augment(shift: int):
    from ..data import random_shift

    if not shift:
        return None
    return lambda x, g: random_shift(x, g, max_shift=shift)


def fit(cfg, model, folder: Path, progress: bool = True):
    """Train ``model`` with the config's trainer settings; checkpoints and the trainer's
    history go to ``folder``, which is resumed from when it holds a checkpoint."""
    from ..control import Objective, TrainConfig, Trainer
    from ..control.checkpoint import latest_checkpoint
    from ..data import TensorData, load_digits

    t, d = cfg["train"], cfg["data"]
    train, test = load_digits(test_fraction=d["test_fraction"], seed=d["split_seed"])
    if d["limit"]:
        train = TensorData(train.inputs[: d["limit"]], train.targets[: d["limit"]],
                           name="digits_train", info=train.info)
    tc = TrainConfig(epochs=t["epochs"], max_steps=t["max_steps"] or None,
                     batch_size=t["batch_size"], lr=t["lr"], weight_decay=t["weight_decay"],
                     schedule="cosine", warmup_steps=t["warmup_steps"], grad_clip=1.0,
                     gradient=t["gradient"], seed=t["seed"], save_every=t["save_every"],
                     progress=progress)
    trainer = Trainer(model, Objective("cross_entropy"), tc, augment=_augment(t["shift"]))
    folder.mkdir(parents=True, exist_ok=True)
    resume = folder if latest_checkpoint(folder) is not None else None
    with warnings.catch_warnings():
        # torch's vmap fallback for SDPA (parallel/hybrid heads batched): a speed note only
        warnings.filterwarnings("ignore", message="There is a performance drop")
        history = trainer.fit(train, test, out_dir=folder, resume=resume)
    return trainer, history, train, test, resume is not None


def run(cfg, plan, out, progress=True, heading="Training", prefix=""):
    import matplotlib.pyplot as plt

    m, t = cfg["model"], cfg["train"]
    model = plan["model"]
    sub = out.folder / f"{prefix}train"
    trainer, history, train, test, resumed = fit(cfg, model, sub, progress)
    evals = []
    for n in t["eval_n_steps"]:
        r = trainer.evaluate(test, n_steps=n)
        evals.append({"n_t": n, "dt": m["T"] / n, "test_accuracy": r["accuracy"],
                      "test_loss": r["loss"], "trained_at": "yes" if n == m["n_steps"] else ""})
    out.heading(heading)
    out.text(
        f"Training as an optimal-control problem (paper 002, eq. 12): the controls of a "
        f"ViT-style model (patch embedding F, a {m['scheme']} split encoder with "
        f"{m['control']} controls, d_model {m['d_model']}, {m['heads']} heads, N_t = "
        f"{m['n_steps']} on [0, {m['T']:g}], class-token read-out G; eq. 36) minimise the "
        f"cross-entropy on scikit-learn's bundled digits ({len(train)} training, {len(test)} "
        f"test images), AdamW, {t['gradient']} gradients, {trainer.step} steps"
        + (" (resumed from a checkpoint)" if resumed else "") + ". "
        "The trained controls are functions of t, so the model is also evaluated at other N_t."
    )
    epochs = [{k: r.get(k) for k in ("epoch", "step", "train_loss", "eval_loss", "eval_accuracy",
                                     "time")} for r in history.epochs]
    out.table(f"{prefix}train_epochs", epochs, title="training history (per evaluated epoch)")
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(10, 3.8), layout="constrained")
    steps = history.steps
    a1.plot([r["step"] for r in steps], [r["loss"] for r in steps], lw=0.8, label="training loss J")
    if epochs:
        a1.plot([r["step"] for r in epochs], [r["eval_loss"] for r in epochs], "o-",
                label="test loss")
    a1.set_xlabel("optimizer step")
    a1.set_ylabel("cross-entropy")
    a1.legend()
    a1.set_title("training curve")
    if epochs:
        a2.plot([r["epoch"] for r in epochs], [r["eval_accuracy"] for r in epochs], "o-")
    a2.set_xlabel("epoch")
    a2.set_ylabel("test accuracy")
    a2.set_title("held-out accuracy")
    out.figure(fig, f"{prefix}training_curve", "the training curve: loss per step, test loss "
               "and accuracy per evaluated epoch")
    out.link(f"{sub.name}/curves.png", "the trainer's own plot of its history (opsplit.control)")
    out.table(f"{prefix}eval_n_t", evals, title=f"test accuracy at other N_t (trained at N_t = "
              f"{m['n_steps']})")
    fig, ax = plt.subplots(figsize=(5, 3.6), layout="constrained")
    ax.semilogx([r["n_t"] for r in evals], [r["test_accuracy"] for r in evals], "o-", base=2)
    ax.axvline(m["n_steps"], color="gray", ls=":", label=f"trained at N_t = {m['n_steps']}")
    ax.set_xlabel("N_t at evaluation")
    ax.set_ylabel("test accuracy")
    ax.legend()
    out.figure(fig, f"{prefix}accuracy_vs_n_t", "the trained model evaluated at other N_t")
    return trainer, history, evals
