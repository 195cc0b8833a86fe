"""``opsplit train``: training as an optimal-control problem (paper 002, eqs. 10-12)
through :mod:`opsplit.control`: a ViT-style model (patch embedding F, split encoder
N_theta, class-token read-out G; eq. 36) on scikit-learn's bundled digits, then evaluated
at other N_t than it was trained at.  Resumable: ``opsplit train --resume FOLDER``
continues from the folder's config and latest checkpoint; an interrupt (Ctrl-C) stops
at the end of the current optimizer step, saves a checkpoint there and prints the command
that continues the run."""

from __future__ import annotations

import contextlib
import re
import signal
import threading
import warnings
from pathlib import Path

from .budget import Estimate
from .config import TOP, ConfigError, Field, at_least, between, positive, read_toml, seed_field

NAME = "train"
SUMMARY = ("train a model's controls (optimal control): a ViT on the bundled digits, or a character-level GPT "
           "with task = \"text\"; resumable")
EXAMPLE = """\
examples:
  opsplit train --epochs 10 --out runs/train
  opsplit train --resume runs/train        # continue an interrupted run from its folder
  opsplit train --config train.toml
  opsplit train --config text.toml      # task = "text": a character-level GPT (docs/text.md)
  opsplit train --config text.toml --print-config   # the text task's keys and defaults

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
  eval_n_steps = [2, 4, 8, 16]   # N_t at which the trained model is evaluated
"""

#: what ``opsplit train`` trains (the config's top-level ``task``): this module's digits
#: classifier, :mod:`opsplit.cli.train_text`'s character-level GPT, or
#: :mod:`opsplit.cli.train_burgers`'s neural operator on Burgers' equation
TASKS = ("digits", "text", "burgers")
SCHEMES = ("lie", "strang", "parallel", "hybrid")
CONTROLS = ("piecewise_constant", "piecewise_linear", "legendre", "chebyshev", "cosine")
GRADIENTS = ("backprop", "checkpoint", "adjoint")
SOLVERS = ("euler", "rk4")
#: the digits are 8 x 8 images
SIDE = 8

SCHEMA = {
    TOP: {"task": Field("str", "digits", "the training task: digits (a ViT on the bundled digits), burgers (a neural operator, keys in opsplit.cli.train_burgers and docs/burgers.md) or text "
                        "(a character-level GPT on pydoc_data.topics, keys in opsplit.cli.train_text and docs/text.md)",
                        choices=TASKS)},
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
        "solver": Field("str", "euler", "substep solver: explicit Euler (the transformer's "
                        "layer) or one classical RK4 step (torchdiffeq; needed by the adjoint)",
                        choices=SOLVERS),
        "seed": seed_field("seed of the initial weights"),
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
        "shift": Field("int", 0, "random-shift augmentation in pixels (0: none)",
                       between(0, SIDE - 1, "a shift in pixels")),
        "save_every": Field("int", 20, "checkpoint every this many steps (for --resume)",
                            at_least(1)),
        "seed": seed_field("seed of the data order, augmentation and dropout"),
        "train_n_steps": Field("int_list", [2, 4, 8], "multi-resolution training: every step solves the "
                               "model at an N_t drawn from this list ([model.n_steps]: one N_t)", at_least(1)),
        "train_solvers": Field("str_list", ["euler", "heun"], "every step also draws the substep solver from this "
                               "list ([model.solver]: its own only)", choices=("euler", "heun", "rk4")),
        "solvers_weights": Field("str", "cost", "how the solvers are drawn: cost (probability proportional to "
                                 "1/stages) or uniform", choices=("cost", "uniform")),
        "solvers_split": Field("bool", False, "share every batch between train_solvers (each its share of the "
                               "images by solvers_weights, the objective the mean over all) instead of drawing one "
                               "per step: TrainConfig.train_solvers_split"),
        "solvers_split_weights": Field("split_weights", "shares", "with solvers_split, the objective's weight of "
                                       "each solver's part: shares (each its share of the windows: the mean over "
                                       "the batch) or one positive weight per solver, normalised "
                                       "(TrainConfig.train_solvers_split_weights)"),
        "n_steps_weights": Field("str", "cost", "how the N_t of train_n_steps are drawn: cost (probability "
                                 "proportional to 1/N_t: each resolution the same compute) or uniform",
                                 choices=("cost", "uniform")),
        "kinetic": Field("float", 0.3, "weight of the flow's relative kinetic energy (a running cost that makes "
                         "the flow easy to solve; docs/continuity.md)", at_least(0)),
        "acceleration": Field("float", 0.0, "weight of the flow's relative acceleration", at_least(0)),
        "defect": Field("float", 0.0, "weight of the steps' local error estimate (one extra step on a quarter "
                        "of each batch)", at_least(0)),
        "eval_n_steps": Field("int_list", [2, 4, 8, 16, 32], "N_t at which the trained model is "
                              "evaluated on the test set (the solver-swap table)", at_least(1)),
        "eval_solvers": Field("str_list", ["heun", "rk4"], "substep solvers the trained model is also solved "
                              "with, at N_t >= model.n_steps (besides its own)", choices=("euler", "heun", "rk4")),
        "eval_schemes": Field("str_list", ["trained"], "schemes of the solver-swap table: trained (the model's) "
                              "and/or strang", choices=("trained", "strang")),
    },
    "data": {
        "test_fraction": Field("float", 0.2, "held-out fraction (stratified)",
                               lambda v: None if 0 < v < 1 else "a number in (0, 1)"),
        "split_seed": seed_field("seed of the train/test split"),
        "limit": Field("int", 0, "use only this many training images (0: all)", at_least(0)),
    },
}


def select(a):
    """The module of the run's task: this one (digits) or :mod:`opsplit.cli.train_text`, by
    the top-level ``task`` of ``--config`` (or of the ``--resume`` folder's config.toml).
    A ``task`` that is not one of :data:`TASKS`, or a file without a task line whose keys
    belong to the text task only, is refused naming ``task``; a file that cannot be read is
    reported by this module's checks."""
    import sys

    from . import train_text

    path = None
    if getattr(a, "resume", None) is not None:
        p = Path(a.resume) / "config.toml"
        path = p if p.is_file() else None
    elif getattr(a, "config", None) is not None:
        path = a.config
    try:
        raw = {} if path is None else read_toml(path)
    except ConfigError:
        raw = {}
    task = raw.get("task", None)
    if isinstance(task, dict):  # a [task] table: an unknown section, reported by the schema
        task = None
    if task is None:
        text_only = _text_only_keys(raw)
        if text_only:
            raise ConfigError(
                f"task: the config has no task line, so it is read as task = \"digits\", but "
                f"{', '.join(text_only[:4])}{' ...' if len(text_only) > 4 else ''} belong(s) to task = \"text\"; "
                f"expected task = \"text\" on the first line (before any [section]) for the character-level GPT")
        task = "digits"
    if not isinstance(task, str) or isinstance(task, bool):
        raise ConfigError(f"task: expected a string, one of {', '.join(map(repr, TASKS))}, got {task!r} "
                          f"({type(task).__name__})")
    if task not in TASKS:
        hint = f" (task names are lower case: {task.lower()!r})" if task.lower() in TASKS else ""
        raise ConfigError(f"task: expected one of {', '.join(map(repr, TASKS))}, got {task!r}{hint}")
    if task == "burgers":
        from . import train_burgers

        return train_burgers
    return train_text if task == "text" else sys.modules[__name__]


def _text_only_keys(raw: dict) -> list[str]:
    """The sections and keys of a raw config that the text task's schema has and this
    (digits) one has not."""
    from .train_text import SCHEMA as TEXT

    out = []
    for sec, v in raw.items():
        if not isinstance(v, dict):
            continue
        if sec in TEXT and sec not in SCHEMA:
            out.append(f"[{sec}]")
        elif sec in TEXT:
            out += [f"{sec}.{k}" for k in v if k in TEXT[sec] and k not in SCHEMA[sec]]
    return out


def add_arguments(p):
    p.add_argument("--resume", metavar="DIR", help="continue the run in DIR (its config.toml "
                   "and latest checkpoint)")
    p.add_argument("--epochs", type=int, help="train.epochs (digits; the text task counts train.steps)")
    p.add_argument("--n-steps", type=int, metavar="N", help="N_t of training: model.n_steps (digits) or "
                   "train.n_steps (task = \"text\")")
    p.add_argument("--scheme", help="model.scheme (digits: lie, strang, parallel, hybrid; text: lie, strang)")
    p.add_argument("--gradient", help="train.gradient: backprop or checkpoint; adjoint for the digits with "
                   "model.solver = 'rk4' (the text task refuses it)")
    p.add_argument("--allow-changes", nargs="+", metavar="KEY", help="with --resume: continue although these "
                   "keys of the folder's config.toml were edited since its checkpoint was written (train.lr, "
                   "data.split_seed, ...; the optimizer and schedule follow the new values from the resumed step on)")


def no_allow_changes(a) -> None:
    """``--allow-changes`` belongs to ``--resume``."""
    if getattr(a, "allow_changes", None) is not None:
        raise ConfigError("--allow-changes: only with --resume (it names the keys of a resumed run's config.toml "
                          "edited since its checkpoint); a new run takes any config")


def overrides(a) -> dict:
    no_allow_changes(a)
    return _flag_values(a)


def _flag_values(a) -> dict:
    return {"train.epochs": a.epochs, "model.n_steps": a.n_steps, "model.scheme": a.scheme,
            "train.gradient": a.gradient}


_FLAGS = {"train.epochs": "--epochs", "model.n_steps": "--n-steps", "model.scheme": "--scheme",
          "train.gradient": "--gradient"}


def folder_kind(folder: Path) -> str | None:
    """The job that wrote ``folder`` (``"train"``, ``"solve"``, ..., ``"default"``), from its
    manifest's title or its configs; ``None`` when nothing says."""
    import json

    m = folder / "manifest.json"
    if m.is_file():
        try:
            title = json.loads(m.read_bytes().decode("utf-8")).get("title", "")
        except (ValueError, AttributeError):
            title = ""
        if isinstance(title, str) and title.startswith("opsplit: the default job"):
            return "default"
        if isinstance(title, str) and title.startswith("opsplit "):
            return title.split()[1]
    if (folder / "train.toml").is_file() and (folder / "solve.toml").is_file():
        return "default"
    return None


def check_resume(a) -> Path:
    """``--resume DIR``: no flag that contradicts the folder, a train folder; returns the
    path of its config.toml (the config the run continues with)."""
    folder = Path(a.resume)
    if a.config is not None:
        raise ConfigError(f"--config: cannot be combined with --resume (a resumed run continues with "
                          f"{str(folder / 'config.toml')!r}; start a new run with --out to use another config)")
    if a.out is not None and Path(a.out).resolve() != folder.resolve():
        raise ConfigError(f"--out: cannot be combined with --resume {str(folder)!r} (a resumed run "
                          f"writes to its own folder), got --out {a.out!r}")
    for key, value in _flag_values(a).items():
        if value is not None:
            raise ConfigError(f"{_FLAGS[key]}: cannot be combined with --resume (a resumed run continues "
                              f"with the settings of {str(folder / 'config.toml')!r}, {key} included; "
                              f"start a new run with --out to change them)")
    if not folder.is_dir():
        raise ConfigError(f"--resume: expected an opsplit train output folder (its config.toml and "
                          f"checkpoints), {str(folder)!r} is not a folder")
    kind = folder_kind(folder)
    if kind not in (None, NAME):
        what = "the default job" if kind == "default" else f"opsplit {kind}"
        raise ConfigError(f"--resume: expected an opsplit train output folder, {str(folder)!r} holds the "
                          f"output of {what}")
    return resume_config(folder)


def resume_config(folder):
    p = Path(folder) / "config.toml"
    if not p.is_file():
        raise ConfigError(f"--resume: expected an opsplit train output folder with config.toml, "
                          f"{str(folder)!r} has none")
    return p


def check_new_folder(out, same_config: Path | None = None, cfg: dict | None = None) -> None:
    """A new run does not write into a folder that holds a training run (it would silently
    continue that run with another config), unless ``same_config`` (that run's config file)
    holds ``cfg`` (the default job continues its own training)."""
    from ..control.checkpoint import latest_checkpoint
    from .config import dump_toml

    if out is not None and latest_checkpoint(Path(out) / "train") is not None:
        if same_config is not None and same_config.is_file() and cfg is not None \
                and same_config.read_text() == dump_toml(cfg):
            return
        raise ConfigError(f"--out: {str(out)!r} already holds a training run (checkpoints in "
                          f"{str(Path(out) / 'train' / 'checkpoints')!r}); continue it with "
                          f"opsplit train --resume {out}, or choose another folder")


#: the keys that fix what a digits run trains on, beyond TrainConfig (TrainConfig.extra:
#: recorded in the run's checkpoints; an edit is refused on --resume like one of train.lr)
DATA_KEYS = ("data.test_fraction", "data.split_seed", "data.limit", "train.shift")
#: the TrainConfig fields a resume compares (opsplit.control.config_changes) -> the config
#: keys that set them; the others are fixed by the command
RUN_KEYS = {"lr": "train.lr", "weight_decay": "train.weight_decay", "warmup_steps": "train.warmup_steps",
            "seed": "train.seed", "batch_size": "train.batch_size", "epochs": "train.epochs",
            "max_steps": "train.max_steps"}


def data_settings(cfg: dict, keys) -> dict:
    """``{"section.key": value}`` of ``keys`` (TrainConfig.extra)."""
    return {k: cfg[k.split(".")[0]][k.split(".", 1)[1]] for k in keys}


def _cli_key(change, run_keys: dict) -> str:
    base = change.key.split(" ")[0]
    if change.where != "TrainConfig":
        return "model"
    names = [run_keys.get(k, k) for k in base.split("/")]
    return "/".join(dict.fromkeys(names))


def _cli_change(change, run_keys: dict) -> str:
    if change.where != "TrainConfig":
        return f"the model ([model] edited): {change.where + '.' if change.where else ''}{change.key} = " \
               f"{change.checkpoint!r} in the checkpoint, {change.model!r} now"
    def shown(v):  # a setting left to its default is None in TrainConfig
        return "unset (the default)" if v is None else repr(v)

    return f"{_cli_key(change, run_keys)} = {shown(change.checkpoint)} in the checkpoint, {shown(change.model)} in " \
           "config.toml"


def _allowed_names(allow, run_keys: dict, data_keys) -> frozenset:
    """``--allow-changes KEY ...`` (config keys) as the trainer's setting names."""
    if not allow:
        return frozenset()
    back = {}
    for field, key in run_keys.items():
        back.setdefault(key, []).append(field)
    known = sorted({*back, *data_keys})
    out = set()
    for k in allow:
        if k in data_keys:
            out.add(k)
        elif k in back:
            out.update(back[k])
        else:
            raise ConfigError(f"--allow-changes: expected keys that a resume compares ({', '.join(known)}), got {k!r}")
    return frozenset(out)


def without_api_advice(e: Exception) -> str:
    """A checkpoint refusal without the library's advice, which names arguments of
    ``load_checkpoint`` (``allow_nonfinite=``, ``resample=``) that the command does not offer."""
    return re.sub(r"\s*\(pass (?:allow_nonfinite|resample)=[^)]*\)", "", str(e)).rstrip(" .;")


def check_checkpoint(plan, folder: Path, allow, *, trainer, total_steps: int, run_keys: dict,
                     data_keys) -> None:
    """Before anything of a resumed run is written: the folder's latest checkpoint is read,
    checked against ``trainer`` (the model of ``config.toml`` and its run, ``total_steps``
    optimizer steps) and loaded — what :meth:`~opsplit.control.Trainer.fit` does when it
    resumes, refused here as one :class:`ConfigError` that names the edited keys by their
    config names, with the advice the command offers (``--allow-changes``, ``--out``).
    The accepted names go to ``plan["allow_changes"]`` for the run."""
    from ..control import checkpoint_differences, config_changes
    from ..control.checkpoint import CheckpointError, latest_checkpoint, read_checkpoint

    ck_path = latest_checkpoint(folder / "train")
    if ck_path is None:
        return  # nothing saved yet: the run starts from step 0
    names = _allowed_names(allow, run_keys, data_keys)
    older = sorted(p for p in ck_path.parent.iterdir()
                   if p.name.startswith("step-") and p < ck_path and (p / "meta.json").is_file())
    earlier = (f"; remove {str(ck_path)!r} to resume from the earlier {str(older[-1])!r}" if older else
               "; start a new run with --out")
    try:
        ck = read_checkpoint(ck_path)
        t = ck.trainer or {}
        changes = checkpoint_differences(ck, trainer.model) + config_changes(
            ck.config, trainer.config, saved_world_size=int(t.get("world_size", 1)), world_size=1,
            saved_total_steps=t.get("total_steps"), total_steps=total_steps)
    except CheckpointError as e:
        raise ConfigError(f"--resume: {e}{earlier}") from None
    bad = [c for c in changes if c.where != "TrainConfig" or not (
        c.key.split(" ")[0] in names or any(k in names for k in c.key.split(" ")[0].split("/")))]
    if bad:
        keys = [_cli_key(c, run_keys) for c in bad if c.where == "TrainConfig"]
        may = (f", or pass --allow-changes {' '.join(dict.fromkeys(keys))} to continue with the new value(s) "
               "(the optimizer and schedule follow them from the resumed step on)") if len(keys) == len(bad) else ""
        raise ConfigError(
            f"--resume: {str(folder / 'config.toml')!r} differs from the run that wrote the checkpoint "
            f"{str(ck_path)!r}: " + "; ".join(_cli_change(c, run_keys) for c in bad)
            + ". A resume continues that run: restore the value(s) in config.toml, or start a new run with --out"
            + may + ". Nothing was loaded or written")
    try:
        with warnings.catch_warnings():  # the accepted changes: warned about once, by the run
            warnings.simplefilter("ignore")
            trainer.load(ck_path, allow_changes=names, _total_steps=total_steps)
    except CheckpointError as e:
        raise ConfigError(f"--resume: {without_api_advice(e)}{earlier}") from None
    plan["allow_changes"] = names


def _digits_split(d: dict):
    from ..data import load_digits

    return load_digits(test_fraction=d["test_fraction"], seed=d["split_seed"])


def check(cfg) -> None:
    """The cross-key checks (no model built)."""
    m, t, d = cfg["model"], cfg["train"], cfg["data"]
    if m["d_model"] % m["heads"]:
        raise ConfigError(f"model.heads: expected a divisor of model.d_model = {m['d_model']}, "
                          f"got {m['heads']}")
    if SIDE % m["patch"]:
        raise ConfigError(f"model.patch: expected a divisor of {SIDE} (the digits are {SIDE} x {SIDE} "
                          f"images), got {m['patch']}")
    if t["gradient"] == "adjoint" and m["solver"] == "euler":
        raise ConfigError("train.gradient: 'adjoint' solves the substeps' ODEs backwards by "
                          "torchdiffeq, and model.solver = 'euler' has none (each substep is one "
                          "explicit Euler step); expected model.solver = 'rk4' with 'adjoint', or "
                          "train.gradient = 'backprop' or 'checkpoint'")
    check_distinct(t, ("train_n_steps", "eval_n_steps", "train_solvers", "eval_solvers"))
    if m["solver"] != "euler" and t["train_solvers"] != [m["solver"]]:
        raise ConfigError(f"train.train_solvers: the drawn solvers replace explicit-Euler substeps; with model.solver "
                          f"= {m['solver']!r} expected [{m['solver']!r}] (its own only), got {t['train_solvers']}")
    check_solvers_split(t, "train_solvers", "solvers_weights", t["batch_size"], [m["solver"]])
    check_flow_costs(t, ("kinetic", "acceleration", "defect"))
    try:
        import sklearn  # noqa: F401
    except ImportError:
        raise ConfigError("train: the bundled digits need scikit-learn (pip install scikit-learn)") from None
    import numpy as np
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


def tokens(m: dict) -> int:
    """Tokens of the model: the patches and the class token."""
    return (SIDE // m["patch"]) ** 2 + 1


def forward_flops(m: dict, n_steps: int) -> tuple[float, float]:
    """``(flops, calls)`` of one image's forward pass at N_t = ``n_steps``: per step and
    solver stage, the heads (Q, K, V and output projections, scores and the weighted sum)
    and the feed-forward term; the patch embedding and the read-out once."""
    L, d, f, h = tokens(m), m["d_model"], m["d_ff"], m["heads"]
    heads, ffn = 8.0 * L * d * d + 4.0 * L * L * d, 4.0 * L * d * f
    stages = 1 if m["solver"] == "euler" else 4
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
    import math

    m, t, d = cfg["model"], cfg["train"], cfg["data"]
    n_test = max(1, round(d["test_fraction"] * 1797))
    n_train = 1797 - n_test
    if d["limit"]:
        n_train = min(n_train, d["limit"])
    steps = t["epochs"] * math.ceil(n_train / t["batch_size"])
    if t["max_steps"]:
        steps = min(steps, t["max_steps"])
    from ..control.resolution import expected_n_steps

    # training: the mean cost of a step over the draws of train.train_n_steps
    draws = t["train_n_steps"]
    from ..control.resolution import expected_stages

    n_draw = expected_n_steps(draws, draw_weights(t["n_steps_weights"]))
    n_draw *= expected_stages(t["train_solvers"], draw_weights(t["solvers_weights"])) / \
        {"euler": 1, "rk4": 4}[m["solver"]] if t["train_solvers"] != [m["solver"]] else 1.0
    fwd, calls = forward_flops(m, m["n_steps"])
    f_draw, c_draw = (fwd * n_draw / m["n_steps"], calls * n_draw / m["n_steps"])
    passes = 3 if t["gradient"] == "backprop" else 4
    batch = min(t["batch_size"], n_train)
    work = Estimate(steps * batch * passes * f_draw, steps * passes * c_draw)
    evals = min(t["epochs"], math.ceil(steps * batch / max(n_train, 1)) + 1)
    work += Estimate(evals * n_test * fwd, evals * math.ceil(n_test / 512) * calls)
    # the solver-swap table: every eval N_t with the model's solver, the finer ones with each
    # eval solver, and the output convergence levels N_t x 2 ... 16
    own = set(t["eval_n_steps"]) | {m["n_steps"] * k for k in (1, 2, 4, 8, 16)}
    stages_of = {"euler": 1, "heun": 2, "rk4": 4}
    runs = [(n, 1.0) for n in own] + [(n, stages_of[s] / (1 if m["solver"] == "euler" else 4))
                                      for s in t["eval_solvers"] for n in t["eval_n_steps"] if n >= m["n_steps"]]
    for n, k in runs:
        f_n, c_n = forward_flops(m, n)
        work += Estimate(k * n_test * f_n, k * math.ceil(n_test / 512) * c_n)
    L, dm, f, h = tokens(m), m["d_model"], m["d_ff"], m["heads"]
    pieces = m["n_steps"] if m["control"] in ("piecewise_constant", "piecewise_linear") else 3
    params = pieces * (4.0 * dm * dm + 2.0 * dm * f + 10.0 * dm + f) + m["patch"] ** 2 * dm + 11.0 * dm
    stages = 1 if m["solver"] == "euler" else 4
    per_image = max(draws) * stages * (3.0 * h * L * L + 12.0 * L * dm + 3.0 * L * f)
    eval_n = max([m["n_steps"], *t["eval_n_steps"]])
    eval_image = stages * (3.0 * h * L * L + 4.0 * L * dm + 2.0 * L * f)
    act = max(batch * per_image, min(512, n_test) * eval_image * min(eval_n, 2))
    return Estimate(work.flops, work.calls, 4.0 * (5.0 * params + act))


def prepare(cfg) -> dict:
    """The library's own checks: the model is built, its gradient mode can apply, the
    trainer accepts the settings, and the untrained model gives finite outputs."""
    import torch

    from ..control.gradients import restore_gradient_mode, set_gradient_mode

    m = cfg["model"]
    model = build_model(m)  # the library's own checks, before any training
    try:
        restore_gradient_mode(set_gradient_mode(model, cfg["train"]["gradient"]))
    except ValueError as e:
        raise ConfigError(f"train.gradient: {e}") from None
    try:
        train_config(cfg, progress=False)
    except (ValueError, TypeError) as e:
        raise ConfigError(f"train: {e}") from None
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
    check_objective_weights(objective(cfg), model, train.inputs[:2], train.targets[:2], "digits")
    return {"model": model}


def check_objective_weights(obj, model, inputs, targets, what: str) -> None:
    """The objective of the untrained model on two samples must be finite: a cost weight
    (``train.kinetic``, ...) whose term overflows is refused by its key, before anything is
    written (:func:`opsplit.control.objective.check_objective`)."""
    from ..control.objective import check_objective

    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="There is a performance drop")
            check_objective(obj, model, inputs, targets, what=what)
    except ValueError as e:
        key = re.match(r"Objective\.(\w+): (.*)", str(e), re.S)
        if key is None:
            raise ConfigError(f"train: {e}") from None
        raise ConfigError(f"train.{key.group(1)}: {key.group(2)}") from None


def build_model(m: dict):
    import torch

    from ..models import ImageClassifier, SplitEncoder
    from ..solvers import ExplicitEuler, ODESolve

    g = torch.Generator().manual_seed(m["seed"])
    solver = ExplicitEuler() if m.get("solver", "euler") == "euler" else ODESolve("rk4")
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


def check_distinct(t: dict, keys) -> None:
    """The lists ``train.<key>`` of ``keys`` (N_t or solver names) hold no entry twice."""
    for key in keys:
        seen = [n for i, n in enumerate(t[key]) if n in t[key][:i]]
        if seen:
            what = "N_t" if key.endswith("n_steps") else "solvers"
            raise ConfigError(f"train.{key}: expected distinct {what}, got {seen[0]} twice in {t[key]}")


def check_solvers_split(t: dict, key: str, weights_key: str, batch_size: int, own: list) -> None:
    """``train.solvers_split``: needs several solvers in ``train.<key>``, and a batch that gives
    each of them a window (:func:`opsplit.control.resolution.split_sizes`)."""
    sw = t["solvers_split_weights"]
    if sw != "shares" and not t["solvers_split"]:
        raise ConfigError("train.solvers_split_weights: weights of a split batch's parts, but train.solvers_split = "
                          "false; expected 'shares', or solvers_split = true")
    if sw != "shares" and len(sw) != len(t[key]):
        raise ConfigError(f"train.solvers_split_weights: expected 'shares' or one weight per solver of "
                          f"train.{key} = {t[key]}, got {sw}")
    if not t["solvers_split"]:
        return
    if t[key] == own:
        raise ConfigError(f"train.solvers_split: shares every batch between the solvers of train.{key}, which "
                          f"holds only the model's own {own}; expected several solvers, or solvers_split = false")
    from ..control.resolution import solvers_left_out

    empty, sizes = solvers_left_out(batch_size, tuple(t[key]), draw_weights(t[weights_key]))
    if empty:
        raise ConfigError(f"train.solvers_split: a batch of {batch_size} gives {empty[0]!r} no window (windows per "
                          f"solver {sizes}); expected a larger train.batch_size or {weights_key}")


def check_flow_costs(t: dict, keys) -> None:
    """A flow cost (``train.<key>`` of ``keys`` non-zero) needs the forward solve's steps:
    ``train.gradient = 'backprop'``."""
    flows = [k for k in keys if t[k]]
    if flows and t["gradient"] != "backprop":
        raise ConfigError(f"train.{flows[0]}: a flow cost reads every step of the forward solve, which "
                          f"train.gradient = {t['gradient']!r} recomputes; expected train.gradient = 'backprop' "
                          f"(or train.{flows[0]} = 0)")


def split_weights(t: dict):
    """``train.solvers_split_weights`` as TrainConfig takes them: ``None`` (the shares, or no
    split) or a tuple."""
    w = t["solvers_split_weights"]
    return tuple(w) if t["solvers_split"] and isinstance(w, list) else None


def draw_weights(w):
    """A config's draw weights as TrainConfig takes them: ``"cost"``, ``None`` (uniform) or
    a tuple."""
    return tuple(w) if isinstance(w, list) else "cost" if w == "cost" else None


def train_config(cfg, progress: bool = True):
    from ..control import TrainConfig

    t = cfg["train"]
    tns = tuple(t["train_n_steps"]) if t["train_n_steps"] != [cfg["model"]["n_steps"]] else None
    sol = tuple(t["train_solvers"]) if t["train_solvers"] != [cfg["model"]["solver"]] else None
    return TrainConfig(epochs=t["epochs"], max_steps=t["max_steps"] or None,
                       batch_size=t["batch_size"], lr=t["lr"], weight_decay=t["weight_decay"],
                       schedule="cosine", warmup_steps=t["warmup_steps"], grad_clip=1.0,
                       gradient=t["gradient"], seed=t["seed"], save_every=t["save_every"],
                       train_n_steps=tns,
                       train_n_steps_weights=draw_weights(t["n_steps_weights"]) if tns else None,
                       train_solvers=sol, train_solvers_weights=draw_weights(t["solvers_weights"]) if sol else None,
                       train_solvers_split=bool(sol and t["solvers_split"]),
                       train_solvers_split_weights=split_weights(t) if sol else None,
                       progress=progress, extra=data_settings(cfg, DATA_KEYS))


def _train_split(d: dict):
    from ..data import TensorData

    train, test = _digits_split(d)
    if d["limit"]:
        train = TensorData(train.inputs[: d["limit"]], train.targets[: d["limit"]],
                           name="digits_train", info=train.info)
    return train, test


def check_resumed(cfg, plan, folder: Path, allow=None) -> None:
    """``--resume``: the folder's checkpoint against this config, before anything is
    written (:func:`check_checkpoint`)."""
    from ..control import Trainer

    c = train_config(cfg, progress=False)
    n = len(_train_split(cfg["data"])[0])
    total = -(-n // c.batch_size) * c.epochs
    check_checkpoint(plan, folder, allow, trainer=Trainer(plan["model"], objective(cfg), c),
                     total_steps=min(total, c.max_steps) if c.max_steps else total, run_keys=RUN_KEYS,
                     data_keys=DATA_KEYS)


def objective(cfg):
    """The objective: cross-entropy and the flow costs of ``train.kinetic``, ``train.acceleration``,
    ``train.defect``."""
    from ..control import Objective

    t = cfg["train"]
    return Objective("cross_entropy", kinetic=t["kinetic"], acceleration=t["acceleration"], defect=t["defect"])


class Interrupted(KeyboardInterrupt):
    """An interrupt of ``opsplit train``; the message says where the run stopped, which
    checkpoint holds it and how to continue (``run`` adds the folder)."""

    def __init__(self, step: int, checkpoint, at_once: bool = False, folder=None):
        super().__init__(step, checkpoint)
        self.step, self.checkpoint, self.at_once, self.folder = step, checkpoint, at_once, folder
        self.command = None  # the command that continues the run (default: train --resume)

    def __str__(self):
        from .output import relpath

        if self.checkpoint is None:
            return (f"interrupted at step {self.step}, before the first checkpoint; "
                    f"nothing to resume (train.save_every sets how often checkpoints are written)")
        where = (f"the latest checkpoint is {relpath(self.checkpoint)}" if self.at_once else
                 f"saved a checkpoint at step {self.step}: {relpath(self.checkpoint)}")
        command = self.command or f"opsplit train --resume {relpath(self.folder) if self.folder else '<folder>'}"
        return f"interrupted at step {self.step}; {where}; continue with: {command}"


@contextlib.contextmanager
def resumable_after_training(trainer, folder: Path, sub: str = "train"):
    """The evaluations after training: an interrupt (Ctrl-C) there is an :class:`Interrupted`
    at the final step, whose checkpoint is saved, with the command that continues the run
    (``--resume`` evaluates again)."""
    from ..control.checkpoint import latest_checkpoint

    try:
        yield
    except KeyboardInterrupt:
        raise Interrupted(trainer.step, latest_checkpoint(folder / sub), at_once=True, folder=folder) from None


class _StopHere(Exception):
    """Raised at the start of an optimizer step after an interrupt (the state is whole)."""


class _InterruptAtStepEnd:
    """While active (in the main thread): the first SIGINT only sets a flag, checked at the
    start of the next optimizer step; the second one interrupts at once."""

    def __init__(self):
        self.requested = False
        self._previous = None

    def _handler(self, signum, frame):
        if self.requested:
            raise KeyboardInterrupt
        self.requested = True
        import sys

        print("\nopsplit train: interrupt: stopping after this step to save a checkpoint "
              "(interrupt again to stop at once)", file=sys.stderr, flush=True)

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGINT, self._handler)
        return self

    def __exit__(self, *exc):
        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)
        return False

    def wrap(self, augment):
        """The trainer's per-batch hook (called first in every step): stop here if asked."""

        def hook(x, g):
            if self.requested:
                raise _StopHere
            return augment(x, g) if augment is not None else x

        return hook


def _augment(shift: int):
    from ..data import random_shift

    if not shift:
        return None
    return lambda x, g: random_shift(x, g, max_shift=shift)


def fit(cfg, model, folder: Path, progress: bool = True, allow=False):
    """Train ``model`` with the config's trainer settings; checkpoints and the trainer's
    history go to ``folder``, which is resumed from when it holds a checkpoint.  An interrupt
    stops at the end of the current step and saves a checkpoint there (:class:`Interrupted`)."""
    from ..control import Trainer
    from ..control.checkpoint import latest_checkpoint

    train, test = _train_split(cfg["data"])
    stop = _InterruptAtStepEnd()
    trainer = Trainer(model, objective(cfg), train_config(cfg, progress),
                      augment=stop.wrap(_augment(cfg["train"]["shift"])))
    folder.mkdir(parents=True, exist_ok=True)
    resume = folder if latest_checkpoint(folder) is not None else None
    try:
        with stop, warnings.catch_warnings():
            # torch's vmap fallback for SDPA (parallel/hybrid heads batched): a speed note only
            warnings.filterwarnings("ignore", message="There is a performance drop")
            history = trainer.fit(train, test, out_dir=folder, resume=resume, allow_changes=allow)
    except _StopHere:
        # between two optimizer steps: model, optimizer, scheduler, generator and counters
        # are those after step trainer.step, as in a periodic checkpoint
        path = trainer.save(folder / "checkpoints" / f"step-{trainer.step:08d}")
        raise Interrupted(trainer.step, path) from None
    except KeyboardInterrupt:
        raise Interrupted(trainer.step, latest_checkpoint(folder), at_once=True) from None
    if stop.requested:  # interrupted during the last evaluation: the final checkpoint is saved
        raise Interrupted(trainer.step, latest_checkpoint(folder))
    return trainer, history, train, test, resume is not None


def run(cfg, plan, out, progress=True, heading="Training", prefix=""):
    m, t = cfg["model"], cfg["train"]
    model = plan["model"]
    sub = out.folder / f"{prefix}train"
    try:
        trainer, history, train, test, resumed = fit(cfg, model, sub, progress, plan.get("allow_changes", False))
    except Interrupted as e:
        e.folder = out.folder
        raise
    from . import continuity_report

    with resumable_after_training(trainer, out.folder, f"{prefix}train"):
        cont = continuity_report.measure(model, test, n_steps=t["eval_n_steps"], reference=m["n_steps"],
                                         solvers=["trained", *t["eval_solvers"]], schemes=t["eval_schemes"])
    out.heading(heading)
    out.text(
        f"Training as an optimal-control problem (paper 002, eq. 12): the controls of a "
        f"ViT-style model (patch embedding F, a {m['scheme']} split encoder with "
        f"{m['control']} controls, d_model {m['d_model']}, {m['heads']} heads, N_t = "
        f"{m['n_steps']} on [0, {m['T']:g}], class-token read-out G; eq. 36) minimise the "
        f"cross-entropy on scikit-learn's bundled digits ({len(train)} training, {len(test)} "
        f"test images), AdamW, {t['gradient']} gradients, {trainer.step} steps"
        + (f", each at an N_t drawn from {t['train_n_steps']} ({t['n_steps_weights']} weights)"
           if len(t["train_n_steps"]) > 1 else "")
        + (f" with {'every batch shared between the substep solvers' if t['solvers_split'] else 'a substep solver drawn from'}"
           f" {t['train_solvers']} ({t['solvers_weights']} weights"
           + (f"; the parts weighted {t['solvers_split_weights']} in the objective" if split_weights(t) else "") + ")"
           if t["train_solvers"] != [m["solver"]] else "")
        + "".join(f", {k} cost weight {t[k]:g}" for k in ("kinetic", "acceleration", "defect") if t[k])
        + (" (resumed from a checkpoint)" if resumed else "") + ". "
        "The trained controls are functions of t, so the model is also solved at other N_t and with other "
        "substep solvers (the solver-swap table below)."
    )
    epochs = [{k: r.get(k) for k in ("epoch", "step", "train_loss", "eval_loss", "eval_accuracy",
                                     "time")} for r in history.epochs]
    from .train_report import report_training

    report_training(out, prefix, sub.name, history.steps, epochs, None, m["n_steps"], continuity=cont)
    return trainer, history, cont
