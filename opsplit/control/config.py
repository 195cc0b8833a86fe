"""The trainer's configuration: a plain dataclass, validated field by field, readable from
and writable to a dict (TOML / JSON) with unknown keys and wrong types refused."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

from .gradients import DEFAULT_SNAPSHOTS, GRADIENT_MODES

__all__ = ["TrainConfig", "OPTIMIZERS", "SCHEDULES"]

OPTIMIZERS = ("adamw", "adam", "sgd")
SCHEDULES = ("constant", "cosine", "linear")


def _int(v, name, lo=None, allow_none=False):
    if v is None and allow_none:
        return None
    if isinstance(v, bool) or not isinstance(v, int):
        raise TypeError(f"TrainConfig.{name}: expected an integer, got {v!r}")
    if lo is not None and v < lo:
        raise ValueError(f"TrainConfig.{name}: expected an integer >= {lo}, got {v}")
    return v


def _float(v, name, *, positive=False, nonneg=False, allow_none=False, below=None):
    if v is None and allow_none:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise TypeError(f"TrainConfig.{name}: expected a number, got {v!r}")
    v = float(v)
    if not math.isfinite(v):
        raise ValueError(f"TrainConfig.{name}: expected a finite number, got {v}")
    if positive and v <= 0:
        raise ValueError(f"TrainConfig.{name}: expected a number > 0, got {v}")
    if nonneg and v < 0:
        raise ValueError(f"TrainConfig.{name}: expected a number >= 0, got {v}")
    if below is not None and v >= below:
        raise ValueError(f"TrainConfig.{name}: expected a number < {below}, got {v}")
    return v


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
            one discrete map (``None``: the model's own N_t).
        seed: seeds the parameters' RNG use during training, the data order and the
            augmentation generator.
        shuffle: reshuffle the training data every epoch (seeded).
        drop_last: drop the last incomplete batch of an epoch.
        eval_every: evaluate every this many epochs (and after the last).
        save_every: write a checkpoint every this many optimizer steps (needs an output
            folder; ``None``: only at the end).
        keep_checkpoints: how many step checkpoints to keep (the newest).
        progress: show a tqdm progress bar.
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
    seed: int = 0
    shuffle: bool = True
    drop_last: bool = False
    eval_every: int = 1
    save_every: int | None = None
    keep_checkpoints: int = 2
    progress: bool = True
    extra: dict = field(default_factory=dict)

    def __post_init__(self):
        self.epochs = _int(self.epochs, "epochs", 1)
        self.max_steps = _int(self.max_steps, "max_steps", 1, allow_none=True)
        self.batch_size = _int(self.batch_size, "batch_size", 1)
        self.eval_batch_size = _int(self.eval_batch_size, "eval_batch_size", 1)
        if self.optimizer not in OPTIMIZERS:
            raise ValueError(f"TrainConfig.optimizer: expected one of {OPTIMIZERS}, got {self.optimizer!r}")
        self.lr = _float(self.lr, "lr", positive=True)
        self.weight_decay = _float(self.weight_decay, "weight_decay", nonneg=True)
        b = self.betas
        if not isinstance(b, (tuple, list)) or len(b) != 2:
            raise TypeError(f"TrainConfig.betas: expected a pair (beta1, beta2), got {b!r}")
        self.betas = tuple(_float(x, "betas", nonneg=True, below=1.0) for x in b)
        self.momentum = _float(self.momentum, "momentum", nonneg=True, below=1.0)
        if self.schedule not in SCHEDULES:
            raise ValueError(f"TrainConfig.schedule: expected one of {SCHEDULES}, got {self.schedule!r}")
        self.warmup_steps = _int(self.warmup_steps, "warmup_steps", 0)
        self.min_lr_ratio = _float(self.min_lr_ratio, "min_lr_ratio", nonneg=True)
        if self.min_lr_ratio > 1:
            raise ValueError(f"TrainConfig.min_lr_ratio: expected a number in [0, 1], got {self.min_lr_ratio}")
        self.grad_clip = _float(self.grad_clip, "grad_clip", positive=True, allow_none=True)
        if self.gradient not in GRADIENT_MODES:
            raise ValueError(f"TrainConfig.gradient: expected one of {GRADIENT_MODES}, got {self.gradient!r}")
        self.checkpoint_every = _int(self.checkpoint_every, "checkpoint_every", 1)
        self.checkpoint_snapshots = _int(self.checkpoint_snapshots, "checkpoint_snapshots", 1, allow_none=True)
        if self.train_n_steps is not None:
            v = self.train_n_steps
            if isinstance(v, (str, bytes)) or not isinstance(v, (tuple, list)) or not v:
                raise TypeError(f"TrainConfig.train_n_steps: expected a non-empty list of integers >= 1 "
                                f"(or None), got {v!r}")
            self.train_n_steps = tuple(_int(n, "train_n_steps", 1) for n in v)
        self.seed = _int(self.seed, "seed", 0)
        for name in ("shuffle", "drop_last", "progress"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"TrainConfig.{name}: expected true or false, got {getattr(self, name)!r}")
        self.eval_every = _int(self.eval_every, "eval_every", 1)
        self.save_every = _int(self.save_every, "save_every", 1, allow_none=True)
        self.keep_checkpoints = _int(self.keep_checkpoints, "keep_checkpoints", 1)
        if not isinstance(self.extra, dict):
            raise TypeError(f"TrainConfig.extra: expected a dict, got {type(self.extra).__name__}")

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["betas"] = list(self.betas)
        if self.train_n_steps is not None:
            d["train_n_steps"] = list(self.train_n_steps)
        return d

    @classmethod
    def from_dict(cls, d: dict) -> TrainConfig:
        """Build from a dict (a TOML table); unknown keys are refused with their names."""
        if not isinstance(d, dict):
            raise TypeError(f"TrainConfig.from_dict: expected a dict, got {type(d).__name__}")
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - names)
        if unknown:
            raise ValueError(f"TrainConfig: unknown key(s) {unknown}; expected keys from {sorted(names)}")
        return cls(**d)

    def replace(self, **changes) -> TrainConfig:
        return dataclasses.replace(self, **changes)
