"""The trainer's configuration: a plain dataclass, validated field by field — at construction
*and on every assignment* (``config.lr = -1`` raises like ``TrainConfig(lr=-1)``) — readable
from and writable to a dict (TOML / JSON) with unknown keys and wrong types refused."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

from ..data.base import check_int
from .gradients import DEFAULT_SNAPSHOTS, GRADIENT_MODES
from .resolution import check_n_steps_list, check_weights, solvers_left_out

__all__ = ["TrainConfig", "OPTIMIZERS", "SCHEDULES", "check_int", "check_float", "config_changes"]

OPTIMIZERS = ("adamw", "adam", "sgd")
SCHEDULES = ("constant", "cosine", "linear")


def check_float(v, name: str, *, positive=False, nonneg=False, allow_none=False, below=None) -> float | None:
    """A finite real number (``bool`` and strings refused), optionally ``> 0``, ``>= 0`` or
    ``< below``; ``name`` is the full argument name used in the message."""
    if v is None and allow_none:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise TypeError(f"{name}: expected a number{' or None' if allow_none else ''}, got {v!r}")
    v = float(v)
    if not math.isfinite(v):
        raise ValueError(f"{name}: expected a finite number, got {v}")
    if positive and v <= 0:
        raise ValueError(f"{name}: expected a number > 0, got {v}")
    if nonneg and v < 0:
        raise ValueError(f"{name}: expected a number >= 0, got {v}")
    if below is not None and v >= below:
        raise ValueError(f"{name}: expected a number < {below}, got {v}")
    return v


def _choice(options):
    def check(v, name):
        if not isinstance(v, str) or v not in options:
            raise ValueError(f"{name}: expected one of {options}, got {v!r}")
        return v

    return check


def _bool(v, name):
    if not isinstance(v, bool):
        raise TypeError(f"{name}: expected true or false, got {v!r}")
    return v


def _betas(b, name):
    if isinstance(b, (str, bytes)) or not isinstance(b, (tuple, list)) or len(b) != 2:
        raise TypeError(f"{name}: expected a pair (beta1, beta2), got {b!r}")
    return tuple(check_float(x, name, nonneg=True, below=1.0) for x in b)


def _min_lr_ratio(v, name):
    v = check_float(v, name, nonneg=True)
    if v > 1:
        raise ValueError(f"{name}: expected a number in [0, 1], got {v}")
    return v


def _train_n_steps(v, name):
    if v is None:
        return None
    return check_n_steps_list(v, name)


def _weights(v, name):
    return check_weights(v, None, name)


def _split_weights(v, name):
    # the objective's weights of the split's parts: None (their shares) or one weight > 0 each
    if isinstance(v, str):
        raise ValueError(f"{name}: expected None (each part weighted by its share of the batch) or a list of "
                         f"weights > 0, one per solver, got {v!r}")
    return check_weights(v, None, name)


def _solvers(v, name):
    if v is None:
        return None
    from .swap import check_solver_names

    return check_solver_names(v, name)


def _extra(v, name):
    if not isinstance(v, dict):
        raise TypeError(f"{name}: expected a dict, got {type(v).__name__}")
    return v


def _i(lo, allow_none=False):
    return lambda v, name: check_int(v, name, lo, allow_none=allow_none)


def _seed(v, name):
    # the trainer seeds epoch e's shuffle with seed * 1_000_003 + e, which torch's generator
    # must hold (< 2**64)
    v = check_int(v, name, 0)
    if v >= 2**32:
        raise ValueError(f"{name}: expected an integer in [0, 2**32), got {v}")
    return v


def _f(**kw):
    return lambda v, name: check_float(v, name, **kw)


#: one check per field: ``check(value, "TrainConfig.<field>") -> normalised value``
_CHECKS = {
    "epochs": _i(1),
    "max_steps": _i(1, allow_none=True),
    "batch_size": _i(1),
    "eval_batch_size": _i(1),
    "optimizer": _choice(OPTIMIZERS),
    "lr": _f(positive=True),
    "weight_decay": _f(nonneg=True),
    "betas": _betas,
    "momentum": _f(nonneg=True, below=1.0),
    "schedule": _choice(SCHEDULES),
    "warmup_steps": _i(0),
    "min_lr_ratio": _min_lr_ratio,
    "grad_clip": _f(positive=True, allow_none=True),
    "gradient": _choice(GRADIENT_MODES),
    "checkpoint_every": _i(1),
    "checkpoint_snapshots": _i(1, allow_none=True),
    "train_n_steps": _train_n_steps,
    "train_n_steps_weights": _weights,
    "train_solvers": _solvers,
    "train_solvers_weights": _weights,
    "train_solvers_split": _bool,
    "train_solvers_split_weights": _split_weights,
    "seed": _seed,
    "shuffle": _bool,
    "drop_last": _bool,
    "eval_every": _i(1),
    "save_every": _i(1, allow_none=True),
    "keep_checkpoints": _i(1),
    "progress": _bool,
    "extra": _extra,
}


@dataclass
class TrainConfig:
    """What a training run does (everything but the model, objective and data).

    Attributes:
        epochs: passes over the training data.
        max_steps: stop after this many optimizer steps (``None``: ``epochs`` decides).
        batch_size: samples per optimizer step (per process in data-parallel runs).
        eval_batch_size: samples per evaluation batch.
        optimizer: ``"adamw"``, ``"adam"`` or ``"sgd"``.
        lr: peak learning rate (> 0).
        weight_decay: decoupled (AdamW) or L2 (Adam, SGD) weight decay (>= 0).
        betas: Adam's (beta1, beta2).
        momentum: SGD momentum in [0, 1).
        schedule: ``"constant"``, ``"cosine"`` (to ``min_lr_ratio * lr``) or ``"linear"``
            decay over the run, after ``warmup_steps`` of linear warm-up.
        warmup_steps: linear warm-up steps (>= 0).
        min_lr_ratio: final learning rate of the decaying schedules, relative to ``lr``.
        grad_clip: clip the global gradient norm to this value (``None``: no clipping).
        gradient: ``"backprop"``, ``"checkpoint"`` or ``"adjoint"``
            (:mod:`opsplit.control.gradients`).
        checkpoint_every: steps per checkpointed block (``gradient="checkpoint"``, and
            ``"adjoint"`` with a snapshot budget).
        checkpoint_snapshots: the most block states stored for the backward pass in the
            ``"checkpoint"`` and ``"adjoint"`` modes (binomial checkpointing: memory
            bounded independently of N_t, blocks recomputed from the stored states;
            :mod:`opsplit.revolve`); ``None``: one state per block (``"checkpoint"``) or
            per substep (``"adjoint"``), memory linear in N_t.
        train_n_steps: multi-resolution training: every optimizer step solves the model at an
            N_t drawn uniformly from this list (the model is called with ``n_steps=``; the
            draw uses the trainer's seeded generator, so resumed runs repeat it).  The
            controls, functions of t, are then fit at several time steps Δt = T/N_t, not to
            one discrete map (``None``: the model's own N_t).  Distinct entries.
        train_n_steps_weights: how the N_t of ``train_n_steps`` are drawn
            (:mod:`opsplit.control.resolution`): ``None`` uniformly, ``"cost"`` with
            probabilities proportional to 1/N_t (each resolution the same compute; the mean
            cost of a step is the harmonic mean of the list), or one weight > 0 per entry.
        train_solvers: every optimizer step also draws the substep solver the model is solved
            with, from these names (``"euler"``, ``"heun"``, ``"rk4"``;
            :func:`opsplit.control.swap.solved_with`): the solver-swap test as a part of the
            objective (``None``: the model's own solvers).
        train_solvers_weights: how they are drawn: ``None`` uniformly, ``"cost"`` with
            probability proportional to 1 / (field evaluations per substep), or one weight per
            entry.  Drawn independently of ``train_n_steps``.
        train_solvers_split: ``True``: no draw — every step solves a share of its batch with
            each solver of ``train_solvers`` (shares = the draw's probabilities, rounded by
            :func:`~opsplit.control.resolution.split_sizes`) and the objective is the mean
            over all the batch's windows: the drawn objective's expectation, at the same
            expected work, without its variance (docs/continuity.md measures both).  Needs
            ``train_solvers``, and a ``batch_size`` that gives every solver a window.
        train_solvers_split_weights: with ``train_solvers_split``, the objective's weight of
            each solver's part, one weight > 0 per solver, normalised to sum 1 (``None``: each
            part its share of the batch, the mean over all windows).  The work stays that of
            the shares; the weights set how much of the objective each solve carries
            (docs/continuity.md: Heun on a quarter of every batch weighted 0.3).
        seed: seeds the parameters' RNG use during training, the data order and the
            augmentation generator.
        shuffle: reshuffle the training data every epoch (seeded).
        drop_last: drop the last incomplete batch of an epoch.
        eval_every: evaluate every this many epochs (and after the last).
        save_every: write a checkpoint every this many optimizer steps (needs an output
            folder; ``None``: only at the end).
        keep_checkpoints: how many step checkpoints to keep (the newest).
        progress: show a tqdm progress bar.
        extra: settings of the run outside this config that fix what it trains on — the
            data (``{"data.split_seed": 0, "data.max_chars": 20000}``: corpus, split,
            subset, augmentation), as JSON values.  Recorded in checkpoints and compared on
            resume like ``lr`` (:func:`config_changes`: a changed or missing key is refused
            unless allowed by its name); ``{}`` (the default) records nothing.

    **A config stays valid.**  Every field is checked when the config is built and again
    whenever it is assigned (``config.optimizer = "rmsprop"`` raises a ``ValueError`` naming
    ``TrainConfig.optimizer``; an unknown attribute name raises ``AttributeError``), as a
    PyTorch user setting ``module.p = ...`` expects.  A :class:`~opsplit.control.Trainer`
    keeps its own copy, frozen: its optimizer and schedule are built from it, so
    ``trainer.config.lr = ...`` raises ``dataclasses.FrozenInstanceError`` instead of
    silently not reaching the optimizer (build a new trainer, ``Trainer(..., lr=...)``).
    ``config.replace(**changes)`` returns a new, checked, unfrozen config.
    """

    epochs: int = 10
    max_steps: int | None = None
    batch_size: int = 64
    eval_batch_size: int = 512
    optimizer: str = "adamw"
    lr: float = 1e-3
    weight_decay: float = 0.0
    betas: tuple = (0.9, 0.999)
    momentum: float = 0.9
    schedule: str = "constant"
    warmup_steps: int = 0
    min_lr_ratio: float = 0.0
    grad_clip: float | None = None
    gradient: str = "backprop"
    checkpoint_every: int = 1
    checkpoint_snapshots: int | None = DEFAULT_SNAPSHOTS
    train_n_steps: tuple | None = None
    train_n_steps_weights: str | tuple | None = None
    train_solvers: tuple | None = None
    train_solvers_weights: str | tuple | None = None
    train_solvers_split: bool = False
    train_solvers_split_weights: tuple | None = None
    seed: int = 0
    shuffle: bool = True
    drop_last: bool = False
    eval_every: int = 1
    save_every: int | None = None
    keep_checkpoints: int = 2
    progress: bool = True
    extra: dict = field(default_factory=dict)

    def __post_init__(self):
        self.check_consistent()

    def check_consistent(self) -> None:
        """The checks across fields (each field is checked on its own when set)."""
        w = self.train_n_steps_weights
        if w is not None and self.train_n_steps is None:
            raise ValueError("TrainConfig.train_n_steps_weights: weights without train_n_steps (the list of N_t they "
                             "weigh)")
        if isinstance(w, tuple):
            check_weights(w, len(self.train_n_steps), "TrainConfig.train_n_steps_weights")
        w = self.train_solvers_weights
        if w is not None and self.train_solvers is None:
            raise ValueError("TrainConfig.train_solvers_weights: weights without train_solvers (the solvers they "
                             "weigh)")
        if isinstance(w, tuple):
            check_weights(w, len(self.train_solvers), "TrainConfig.train_solvers_weights", "train_solvers")
        if self.train_solvers_split:
            if self.train_solvers is None:
                raise ValueError("TrainConfig.train_solvers_split: a split of every batch between solvers needs "
                                 "train_solvers (the solvers it shares the batch between)")
            empty, sizes = solvers_left_out(self.batch_size, self.train_solvers, self.train_solvers_weights)
            if empty:
                raise ValueError(f"TrainConfig.train_solvers_split: a batch of {self.batch_size} gives "
                                 f"{empty[0]!r} no window (windows per solver {sizes}); "
                                 "expected a batch_size at least as large as 1 / its share, or a larger weight")
        w = self.train_solvers_split_weights
        if w is not None:
            if not self.train_solvers_split:
                raise ValueError("TrainConfig.train_solvers_split_weights: weights of the split's parts without "
                                 "train_solvers_split (no batch is split); expected None, or train_solvers_split=True")
            if len(w) != len(self.train_solvers):
                raise ValueError(f"TrainConfig.train_solvers_split_weights: expected one weight per solver of "
                                 f"train_solvers = {self.train_solvers}, got {len(w)}")

    def __setattr__(self, name, value):
        # every assignment is checked, at construction and after it: a config stays valid
        if name in _CHECKS:
            owner = self.__dict__.get("_owner")
            if owner is not None:
                raise dataclasses.FrozenInstanceError(
                    f"TrainConfig.{name}: this config belongs to a {owner} (its optimizer and schedule were "
                    f"built from it) and cannot be changed; pass {name}=... to the {owner} (or use "
                    f"config.replace({name}=...)) and build a new one")
            value = _CHECKS[name](value, f"TrainConfig.{name}")
        elif not name.startswith("_"):
            raise AttributeError(f"TrainConfig: unknown field {name!r}; expected one of {sorted(_CHECKS)}")
        object.__setattr__(self, name, value)

    def _freeze(self, owner: str) -> None:
        """Refuse later assignments (the config of a built :class:`Trainer`)."""
        object.__setattr__(self, "_owner", owner)

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["betas"] = list(self.betas)
        if self.train_n_steps is not None:
            d["train_n_steps"] = list(self.train_n_steps)
        for k in ("train_n_steps_weights", "train_solvers", "train_solvers_weights", "train_solvers_split_weights"):
            if isinstance(getattr(self, k), tuple):
                d[k] = list(getattr(self, k))
        return d

    @classmethod
    def from_dict(cls, d: dict) -> TrainConfig:
        """Build from a dict (a TOML table); unknown keys are refused with their names."""
        if not isinstance(d, dict):
            raise TypeError(f"TrainConfig.from_dict: expected a dict, got {type(d).__name__}")
        _refuse_unknown(d)
        return cls(**d)

    def replace(self, **changes) -> TrainConfig:
        """A new config with ``changes`` (checked; unknown keys refused with their names)."""
        _refuse_unknown(changes)
        return dataclasses.replace(self, **changes)


def _refuse_unknown(d: dict) -> None:
    unknown = sorted(set(d) - set(_CHECKS), key=str)
    if unknown:
        raise ValueError(f"TrainConfig: unknown key(s) {unknown}; expected keys from {sorted(_CHECKS)}")


#: the fields whose change between a checkpoint's run and the resumed run makes the resumed
#: run neither of the two runs: the optimizer's rates (restored from the checkpoint), the
#: data order and batches (restored step counter), the gradient clipping and the N_t draws
_RESUME_FIXED = ("optimizer", "lr", "weight_decay", "betas", "momentum", "schedule", "warmup_steps", "min_lr_ratio",
                 "grad_clip", "seed", "shuffle", "drop_last", "train_n_steps", "train_n_steps_weights",
                 "train_solvers", "train_solvers_weights", "train_solvers_split", "train_solvers_split_weights")


def config_changes(saved: dict | None, config: TrainConfig, *, saved_world_size: int = 1, world_size: int = 1,
                   saved_total_steps: int | None = None, total_steps: int | None = None) -> list:
    """The settings of a checkpoint's run (``saved``: its ``TrainConfig.to_dict()``) that
    differ from ``config``, as :class:`~opsplit.control.checkpoint.SettingChange` rows
    (``where = "TrainConfig"``): every field of ``_RESUME_FIXED`` (``momentum`` only for
    SGD, ``betas`` only for Adam/AdamW), the samples per optimizer step
    (``batch_size × world_size``), and — when a schedule decays over the run — its length
    (``epochs`` / ``max_steps`` through the total step count).  Fields that do not change
    the run (``eval_*``, ``save_every``, ``progress``, the gradient mode, ...) are not
    compared; nor is anything when ``saved`` is ``None``.  The keys of ``extra`` (the data
    the run trains on) are compared one by one, named by their key (``data.max_chars``),
    when the checkpoint recorded any (runs saved before ``extra`` was compared recorded
    none)."""
    from .checkpoint import SettingChange

    if saved is None:
        return []
    if not isinstance(config, TrainConfig):
        raise TypeError(f"config_changes.config: expected a TrainConfig, got {type(config).__name__}")
    now = config.to_dict()
    out = []
    for k in _RESUME_FIXED:
        if k not in saved or (k == "momentum" and config.optimizer != "sgd") or (
                k == "betas" and config.optimizer == "sgd"):
            continue
        a, b = saved[k], now[k]
        same = a == b
        if isinstance(a, (int, float)) and isinstance(b, (int, float)) and not isinstance(a, bool):
            same = math.isclose(a, b, rel_tol=1e-12, abs_tol=0.0)
        if not same:
            out.append(SettingChange("TrainConfig", k, a, b))
    if "batch_size" in saved:
        a, b = saved["batch_size"] * saved_world_size, config.batch_size * world_size
        if a != b:
            out.append(SettingChange("TrainConfig", "batch_size (samples per step: batch_size x world_size)", a, b))
    extra = saved.get("extra") or {}
    if isinstance(extra, dict) and extra:
        for k in sorted(set(extra) | set(now["extra"]), key=str):
            a, b = extra.get(k, "(not recorded)"), now["extra"].get(k, "(not set)")
            if a != b and not (isinstance(a, (int, float)) and isinstance(b, (int, float)) and not isinstance(a, bool)
                               and not isinstance(b, bool) and math.isclose(a, b, rel_tol=1e-12, abs_tol=0.0)):
                out.append(SettingChange("TrainConfig", str(k), a, b))
    decays = config.schedule != "constant" or saved.get("schedule", "constant") != "constant"
    if decays and saved_total_steps is not None and total_steps is not None and saved_total_steps != total_steps:
        out.append(SettingChange("TrainConfig", f"epochs/max_steps (the {config.schedule} schedule's total steps)",
                                 saved_total_steps, total_steps))
    return out
