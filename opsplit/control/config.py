"""The trainer's configuration: a plain dataclass, validated field by field — at construction
*and on every assignment* (``config.lr = -1`` raises like ``TrainConfig(lr=-1)``) — readable
from and writable to a dict (TOML / JSON) with unknown keys and wrong types refused.

Every field declares, in its metadata, its check, its one-line doc, its group and what a
resumed run may change (:meth:`TrainConfig.schema`): the dict form, the comparison on resume
(:func:`config_changes`) and a command's keys and help text all read that one table."""

from __future__ import annotations

import dataclasses
import functools
import math
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from .._checks import check_bool
from ..coarse import COARSE_MODES
from ..data.base import check_int
from .checkpoint_diff import SettingChange
from .gradients import DEFAULT_SNAPSHOTS, GRADIENT_MODES
from .multilevel import LEVEL_SCHEDULES, PROLONGATIONS, check_levels
from .resolution import check_n_steps_list, check_weights, solvers_left_out
from .swap import SOLVERS, check_solver_names

__all__ = ["TrainConfig", "ConfigField", "OPTIMIZERS", "SCHEDULES", "RENAMED", "check_int", "check_float",
           "config_changes"]

OPTIMIZERS = ("adamw", "adam", "sgd")
SCHEDULES = ("constant", "cosine", "linear")
#: the fields' former names (accepted, with a ``DeprecationWarning`` naming the new one)
RENAMED = {"train_n_steps": "n_steps", "train_n_steps_weights": "n_steps_weights", "train_solvers": "solvers",
           "train_solvers_weights": "solvers_weights", "train_solvers_split": "solvers_split",
           "train_solvers_split_weights": "solvers_split_weights"}


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


class ConfigField(NamedTuple):
    """One field of :class:`TrainConfig`, as :meth:`TrainConfig.schema` lists it.

    ``accepts``: the accepted types and values in words; ``choices``: the accepted strings
    of a field that takes one of a few names (else ``None``); ``group``: the part of the run
    it sets (``"length"``, ``"optimizer"``, ``"schedule"``, ``"gradient"``, ``"sampling"``,
    ``"levels"`` — the time grids of multilevel training and coarse solves —, ``"data"``,
    ``"output"``); ``resume``: what a resumed run may change
    (:func:`config_changes`) — ``"refused"`` (a change is refused), ``"allowed"``,
    ``"samples"`` (refused when ``batch_size x world_size`` changes), ``"length"`` (refused
    when a decaying schedule's total step count changes) or ``"keys"`` (each key compared)."""

    name: str
    default: Any
    accepts: str
    doc: str
    group: str
    resume: str
    choices: tuple | None = None


def _f(check, accepts: str, doc: str, group: str, resume: str = "allowed", *, default=dataclasses.MISSING,
       factory=dataclasses.MISSING, choices=None, when: Callable | None = None):
    """A dataclass field carrying its check ``check(value, "TrainConfig.<field>")``, its doc
    and what a resume may change (``when(config)``: whether the comparison applies)."""
    meta = {"check": check, "accepts": accepts, "doc": doc, "group": group, "resume": resume, "choices": choices,
            "when": when}
    return field(default=default, default_factory=factory, metadata=meta)


def _choice(options):
    def check(v, name):
        if not isinstance(v, str) or v not in options:
            raise ValueError(f"{name}: expected one of {options}, got {v!r}")
        return v

    return check


def _betas(b, name):
    if isinstance(b, (str, bytes)) or not isinstance(b, (tuple, list)) or len(b) != 2:
        raise TypeError(f"{name}: expected a pair (beta1, beta2), got {b!r}")
    return tuple(check_float(x, name, nonneg=True, below=1.0) for x in b)


def _unit(v, name):
    v = check_float(v, name, nonneg=True)
    if v > 1:
        raise ValueError(f"{name}: expected a number in [0, 1], got {v}")
    return v


def _n_steps(v, name):
    return None if v is None else check_n_steps_list(v, name)


def _weights(v, name):
    return check_weights(v, None, name)


def _split_weights(v, name):
    # the objective's weights of the split's parts: None / "shares" (their shares) or one weight > 0 each
    if v == "shares":
        return None
    if isinstance(v, str):
        raise ValueError(f"{name}: expected None or 'shares' (each part weighted by its share of the batch) or a "
                         f"list of weights > 0, one per solver, got {v!r}")
    return check_weights(v, None, name)


def _solvers(v, name):
    return None if v is None else check_solver_names(v, name)


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


def _num(**kw):
    return lambda v, name: check_float(v, name, **kw)


def _sgd(c) -> bool:
    return c.optimizer == "sgd"


def _adam(c) -> bool:
    return c.optimizer != "sgd"


_WEIGHTS = "None or 'uniform', 'cost', or a list of weights > 0 (one per entry)"


@dataclass(init=True)
class TrainConfig:
    """What a training run does (everything but the model, objective and data).

    The fields, each with its accepted values and one-line doc, are listed by
    :meth:`schema` (``docs/training.md`` prints the table).  Three pairs sample how each
    optimizer step solves the model (group ``"sampling"``, :mod:`opsplit.control.resolution`):

    * ``n_steps`` / ``n_steps_weights`` — multi-resolution training: every step solves the
      model at an :math:`N_t` drawn from this list (the model is called with ``n_steps=``;
      the draw uses the trainer's seeded generator, so resumed runs repeat it), uniformly
      (``None`` or ``"uniform"``), with probabilities :math:`\\propto 1/N_t` (``"cost"``:
      each resolution the same compute) or by one weight > 0 per entry; ``n_steps_distill``
      :math:`\\lambda`: a step drawn below the finest :math:`N_t` of the list also fits the
      model's own outputs at the finest (self-distillation, :mod:`opsplit.control.objective`);
    * ``solvers`` / ``solvers_weights`` — every step also draws the substep solver
      (``"euler"``, ``"heun"``, ``"rk4"``; :func:`opsplit.control.swap.solved_with`), the
      same way (``"cost"``: probability :math:`\\propto` 1 / field evaluations per substep),
      independently of the :math:`N_t` draw;
    * ``solvers_split`` / ``solvers_split_weights`` — no draw: every step solves a share of
      its batch with each solver of ``solvers`` (shares = the draw's probabilities, rounded
      by :func:`~opsplit.control.resolution.split_sizes`), the objective the mean over all
      the batch's windows (``None`` / ``"shares"``) or weighted per solver (one weight > 0
      each, normalised).

    The former names ``train_n_steps``, ``train_n_steps_weights``, ``train_solvers``,
    ``train_solvers_weights``, ``train_solvers_split`` and ``train_solvers_split_weights``
    (:data:`RENAMED`) are accepted by the constructor, :meth:`from_dict`, :meth:`replace`
    and in the config a checkpoint recorded, with a ``DeprecationWarning`` naming the new name.

    **A config stays valid.**  Every field is checked when the config is built and again
    whenever it is assigned (``config.optimizer = "rmsprop"`` raises a ``ValueError`` naming
    ``TrainConfig.optimizer``; an unknown attribute name raises ``AttributeError``), as a
    PyTorch user setting ``module.p = ...`` expects.  A :class:`~opsplit.control.Trainer`
    keeps its own copy, frozen: its optimizer and schedule are built from it, so
    ``trainer.config.lr = ...`` raises ``dataclasses.FrozenInstanceError`` instead of
    silently not reaching the optimizer (build a new trainer, ``Trainer(..., lr=...)``).
    ``config.replace(**changes)`` returns a new, checked, unfrozen config.
    """

    epochs: int = _f(_i(1), "an integer >= 1", "passes over the training data", "length", "length", default=10)
    max_steps: int | None = _f(_i(1, allow_none=True), "an integer >= 1 or None",
                               "stop after this many optimizer steps (None: epochs decide)", "length", "length",
                               default=None)
    batch_size: int = _f(_i(1), "an integer >= 1", "samples per optimizer step (per process in data-parallel runs)",
                         "data", "samples", default=64)
    eval_batch_size: int = _f(_i(1), "an integer >= 1", "samples per evaluation batch", "output", default=512)
    optimizer: str = _f(_choice(OPTIMIZERS), f"one of {OPTIMIZERS}", "the optimizer", "optimizer", "refused",
                        default="adamw", choices=OPTIMIZERS)
    lr: float = _f(_num(positive=True), "a number > 0", "peak learning rate", "optimizer", "refused", default=1e-3)
    weight_decay: float = _f(_num(nonneg=True), "a number >= 0",
                             "decoupled (AdamW) or L2 (Adam, SGD) weight decay", "optimizer", "refused", default=0.0)
    betas: tuple = _f(_betas, "a pair of numbers in [0, 1)", "Adam's (beta1, beta2)", "optimizer", "refused",
                      default=(0.9, 0.999), when=_adam)
    momentum: float = _f(_num(nonneg=True, below=1.0), "a number in [0, 1)", "SGD momentum", "optimizer", "refused",
                         default=0.9, when=_sgd)
    schedule: str = _f(_choice(SCHEDULES), f"one of {SCHEDULES}",
                       "learning-rate decay over the run's progress, after the warm-up (cosine and linear to "
                       "min_lr_ratio * lr)", "schedule", "refused", default="constant", choices=SCHEDULES)
    warmup_steps: int = _f(_i(0), "an integer >= 0", "linear warm-up steps", "schedule", "refused", default=0)
    min_lr_ratio: float = _f(_unit, "a number in [0, 1]",
                             "final learning rate of the decaying schedules, relative to lr", "schedule", "refused",
                             default=0.0)
    grad_clip: float | None = _f(_num(positive=True, allow_none=True), "a number > 0 or None",
                                 "clip the global gradient norm to this value (None: no clipping)", "optimizer",
                                 "refused", default=None)
    gradient: str = _f(_choice(GRADIENT_MODES), f"one of {GRADIENT_MODES}",
                       "how the gradient is computed (opsplit.control.gradients)", "gradient",
                       default="backprop", choices=GRADIENT_MODES)
    checkpoint_every: int = _f(_i(1), "an integer >= 1",
                               "steps per checkpointed block (gradient checkpoint, and adjoint with snapshots)",
                               "gradient", default=1)
    checkpoint_snapshots: int | None = _f(_i(1, allow_none=True), "an integer >= 1 or None",
                                          "the most block states stored for the backward pass (binomial "
                                          "checkpointing, opsplit.revolve; None: one per block or substep)",
                                          "gradient", default=DEFAULT_SNAPSHOTS)
    n_steps: tuple | None = _f(_n_steps, "None or a list of distinct integers >= 1",
                               "every optimizer step solves the model at an N_t drawn from this list (None: the "
                               "model's own N_t)", "sampling", "refused", default=None)
    n_steps_weights: str | tuple | None = _f(_weights, _WEIGHTS, "how the N_t of n_steps are drawn",
                                             "sampling", "refused", default=None)
    n_steps_distill: float = _f(_unit, "a number in [0, 1]",
                                "the weight of self-distillation: a step drawn at an N_t below the finest of n_steps "
                                "fits the model's own outputs at the finest with this weight, the targets with the "
                                "rest (opsplit.control.objective)", "levels", "refused", default=0.0)
    solvers: tuple | None = _f(_solvers, f"None or a list of distinct names from {SOLVERS}",
                               "every optimizer step also draws the substep solver from these (None: the model's "
                               "own)", "sampling", "refused", default=None, choices=SOLVERS)
    solvers_weights: str | tuple | None = _f(_weights, _WEIGHTS, "how the solvers are drawn", "sampling", "refused",
                                             default=None)
    solvers_split: bool = _f(check_bool, "true or false",
                             "no draw: every step solves a share of its batch with each of solvers", "sampling",
                             "refused", default=False)
    solvers_split_weights: tuple | None = _f(_split_weights, "None or 'shares', or one weight > 0 per solver",
                                             "with solvers_split, the objective's weight of each solver's part "
                                             "(None: its share of the batch)", "sampling", "refused", default=None)
    coarse_controls: str = _f(_choice(COARSE_MODES), f"one of {COARSE_MODES}",
                              "how a step longer than a control piece reads the controls: at the solver's times "
                              "('point') or averaged over the step ('average', opsplit.coarse)", "levels",
                              "refused", default="point", choices=COARSE_MODES)
    levels: tuple | None = _f(check_levels, "None or a list of [pieces, fraction] levels, pieces increasing",
                              "multilevel training in time: the controls' pieces in t and the fraction of the run's "
                              "steps at each level, the last the model's own (opsplit.control.multilevel)",
                              "levels", "refused", default=None)
    levels_prolongation: str = _f(_choice(PROLONGATIONS), f"one of {PROLONGATIONS}",
                                  "how the controls and the optimizer's moments are prolonged at a level change "
                                  "(opsplit.controls.prolong)", "levels", "refused", default="constant",
                                  choices=PROLONGATIONS)
    levels_schedule: str = _f(_choice(LEVEL_SCHEDULES), f"one of {LEVEL_SCHEDULES}",
                              "with levels: one learning-rate schedule over the run ('run') or the decay restarted "
                              "at every level ('level': the progress within the level)", "levels", "refused",
                              default="run", choices=LEVEL_SCHEDULES)
    seed: int = _f(_seed, "an integer in [0, 2**32)", "seeds the training RNG, the data order and the augmentation",
                   "data", "refused", default=0)
    shuffle: bool = _f(check_bool, "true or false", "reshuffle the training data every epoch (seeded)", "data", "refused",
                       default=True)
    drop_last: bool = _f(check_bool, "true or false", "drop the last incomplete batch of an epoch", "data", "refused",
                         default=False)
    eval_every: int = _f(_i(1), "an integer >= 1", "evaluate every this many epochs (and after the last)", "output",
                         default=1)
    save_every: int | None = _f(_i(1, allow_none=True), "an integer >= 1 or None",
                                "write a checkpoint every this many optimizer steps (None: only at the end)",
                                "output", default=None)
    keep_checkpoints: int = _f(_i(1), "an integer >= 1", "how many step checkpoints to keep (the newest)", "output",
                               default=2)
    progress: bool = _f(check_bool, "true or false", "show a tqdm progress bar", "output", default=True)
    extra: dict = _f(_extra, "a dict of JSON values",
                     "settings outside this config that fix what the run trains on (data.split_seed, ...), "
                     "recorded and compared on resume", "data", "keys", factory=dict)

    def __post_init__(self):
        self.check_consistent()

    def check_consistent(self) -> None:
        """The checks across fields (each field is checked on its own when set)."""
        w = self.n_steps_weights
        if w is not None and self.n_steps is None:
            raise ValueError("TrainConfig.n_steps_weights: weights without n_steps (the list of N_t they weigh)")
        if isinstance(w, tuple):
            check_weights(w, len(self.n_steps), "TrainConfig.n_steps_weights", "n_steps")
        if self.n_steps_distill and (self.n_steps is None or len(self.n_steps) < 2):
            raise ValueError(f"TrainConfig.n_steps_distill: self-distillation fits the coarse draws of n_steps to the "
                             f"finest; expected n_steps with two N_t or more, got n_steps = {self.n_steps}")
        w = self.solvers_weights
        if w is not None and self.solvers is None:
            raise ValueError("TrainConfig.solvers_weights: weights without solvers (the solvers they weigh)")
        if isinstance(w, tuple):
            check_weights(w, len(self.solvers), "TrainConfig.solvers_weights", "solvers")
        if self.solvers_split:
            if self.solvers is None:
                raise ValueError("TrainConfig.solvers_split: a split of every batch between solvers needs solvers "
                                 "(the solvers it shares the batch between)")
            empty, sizes = solvers_left_out(self.batch_size, self.solvers, self.solvers_weights)
            if empty:
                raise ValueError(f"TrainConfig.solvers_split: a batch of {self.batch_size} gives {empty[0]!r} no "
                                 f"window (windows per solver {sizes}); expected a batch_size at least as large as "
                                 "1 / its share, or a larger weight")
        w = self.solvers_split_weights
        if w is not None:
            if not self.solvers_split:
                raise ValueError("TrainConfig.solvers_split_weights: weights of the split's parts without "
                                 "solvers_split (no batch is split); expected None, or solvers_split=True")
            if len(w) != len(self.solvers):
                raise ValueError(f"TrainConfig.solvers_split_weights: expected one weight per solver of solvers = "
                                 f"{self.solvers}, got {len(w)}")

    def __setattr__(self, name, value):
        # every assignment is checked, at construction and after it: a config stays valid
        if name in RENAMED:
            name = _renamed(name, stacklevel=3)
        if name in _FIELDS:
            owner = self.__dict__.get("_owner")
            if owner is not None:
                raise dataclasses.FrozenInstanceError(
                    f"TrainConfig.{name}: this config belongs to a {owner} (its optimizer and schedule were "
                    f"built from it) and cannot be changed; pass {name}=... to the {owner} (or use "
                    f"config.replace({name}=...)) and build a new one")
            value = _FIELDS[name].metadata["check"](value, f"TrainConfig.{name}")
        elif not name.startswith("_"):
            raise AttributeError(f"TrainConfig: unknown field {name!r}; expected one of {sorted(_FIELDS)}")
        object.__setattr__(self, name, value)

    def __getattr__(self, name):
        # (called only for names that are not attributes: the former names of renamed fields)
        if name in RENAMED:
            return getattr(self, _renamed(name, stacklevel=3))
        raise AttributeError(f"TrainConfig: unknown field {name!r}; expected one of {sorted(_FIELDS)}")

    def _freeze(self, owner: str) -> None:
        """Refuse later assignments (the config of a built :class:`Trainer`)."""
        object.__setattr__(self, "_owner", owner)

    def to_dict(self) -> dict:
        """The fields as JSON / TOML values (tuples as lists), in their order."""
        return {f.name: _plain(getattr(self, f.name)) for f in dataclasses.fields(self)}

    @classmethod
    def from_dict(cls, d: dict) -> TrainConfig:
        """Build from a dict (a TOML table); unknown keys are refused with their names."""
        if not isinstance(d, dict):
            raise TypeError(f"TrainConfig.from_dict: expected a dict, got {type(d).__name__}")
        return cls(**_canonical(d, "TrainConfig.from_dict", stacklevel=4))

    def replace(self, **changes) -> TrainConfig:
        """A new config with ``changes`` (checked; unknown keys refused with their names)."""
        return dataclasses.replace(self, **_canonical(changes, "TrainConfig.replace", stacklevel=4))

    @classmethod
    def schema(cls) -> dict[str, ConfigField]:
        """``{name: ConfigField}`` of every field in order: its default, accepted values, doc,
        group and what a resumed run may change (:class:`ConfigField`)."""
        out = {}
        for f in dataclasses.fields(cls):
            m = f.metadata
            default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
            out[f.name] = ConfigField(f.name, default, m["accepts"], m["doc"], m["group"], m["resume"],
                                      m["choices"])
        return out


_FIELDS = {f.name: f for f in dataclasses.fields(TrainConfig)}
_dataclass_init = TrainConfig.__init__


@functools.wraps(_dataclass_init)
def _init(self, *args, **kwargs):
    _dataclass_init(self, *args, **_canonical(kwargs, "TrainConfig", stacklevel=4))


TrainConfig.__init__ = _init


def _renamed(old: str, stacklevel: int) -> str:
    new = RENAMED[old]
    warnings.warn(f"TrainConfig.{old} is deprecated: use TrainConfig.{new}", DeprecationWarning,
                  stacklevel=stacklevel)
    return new


def _canonical(d: dict, where: str, stacklevel: int) -> dict:
    """``d`` with the former field names replaced by the new ones (a warning each); unknown
    keys, and a field given under both names, refused."""
    out = {}
    for k, v in d.items():
        new = _renamed(k, stacklevel) if k in RENAMED else k
        if new in out:
            raise ValueError(f"TrainConfig.{new}: given twice (as {new!r} and its former name); expected one")
        out[new] = v
    unknown = sorted(set(out) - set(_FIELDS), key=str)
    if unknown:
        raise ValueError(f"TrainConfig: unknown key(s) {unknown}; expected keys from {sorted(_FIELDS)}")
    return out


def _plain(v):
    if isinstance(v, tuple):
        return [_plain(x) for x in v]
    if isinstance(v, dict):
        return {k: _plain(x) for k, x in v.items()}
    return v


def _same(a, b) -> bool:
    if isinstance(a, (int, float)) and isinstance(b, (int, float)) and not isinstance(a, bool) \
            and not isinstance(b, bool):
        return math.isclose(a, b, rel_tol=1e-12, abs_tol=0.0)
    return a == b


def config_changes(saved: dict | None, config: TrainConfig, *, saved_world_size: int = 1, world_size: int = 1,
                   saved_total_steps: int | None = None, total_steps: int | None = None) -> list:
    """The settings of a checkpoint's run (``saved``: its ``TrainConfig.to_dict()``, former
    field names accepted) that differ from ``config``, as
    :class:`~opsplit.control.SettingChange` rows (``where = "TrainConfig"``), by each field's
    ``resume`` rule (:meth:`TrainConfig.schema`): every ``"refused"`` field (``momentum`` only
    for SGD, ``betas`` only for Adam/AdamW), the samples per optimizer step
    (``batch_size × world_size``), the keys of ``extra`` one by one (named by their key,
    ``data.max_chars``; when the checkpoint recorded any), and — when a schedule decays over
    the run — its length (``epochs`` / ``max_steps`` through the total step count).  Fields
    that do not change the run (``eval_*``, ``save_every``, ``progress``, the gradient
    mode, ...) are not compared; nor is anything when ``saved`` is ``None``."""
    if saved is None:
        return []
    if not isinstance(config, TrainConfig):
        raise TypeError(f"config_changes.config: expected a TrainConfig, got {type(config).__name__}")
    saved = {RENAMED.get(k, k): v for k, v in saved.items()}
    now = config.to_dict()
    out = []
    for f in dataclasses.fields(config):
        when = f.metadata["when"]
        if f.metadata["resume"] == "refused" and f.name in saved and (when is None or when(config)) \
                and not _same(saved[f.name], now[f.name]):
            out.append(SettingChange("TrainConfig", f.name, saved[f.name], now[f.name]))
    if "batch_size" in saved:
        a, b = saved["batch_size"] * saved_world_size, config.batch_size * world_size
        if a != b:
            out.append(SettingChange("TrainConfig", "batch_size (samples per step: batch_size x world_size)", a, b))
    extra = saved.get("extra") or {}
    if isinstance(extra, dict) and extra:
        for k in sorted(set(extra) | set(now["extra"]), key=str):
            a, b = extra.get(k, "(not recorded)"), now["extra"].get(k, "(not set)")
            if not _same(a, b):
                out.append(SettingChange("TrainConfig", str(k), a, b))
    decays = config.schedule != "constant" or saved.get("schedule", "constant") != "constant"
    if decays and saved_total_steps is not None and total_steps is not None and saved_total_steps != total_steps:
        out.append(SettingChange("TrainConfig", f"epochs/max_steps (the {config.schedule} schedule's total steps)",
                                 saved_total_steps, total_steps))
    return out
