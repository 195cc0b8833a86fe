"""What the training tasks of ``opsplit train`` share (:mod:`opsplit.cli.tasks`): the keys
that set the library's objects, the library's checks before anything is written, the run
folder, ``--resume``, and an interrupt that stops at the end of an optimizer step.

**Keys.**  A task's ``[train]`` keys are the :class:`~opsplit.control.TrainConfig` fields of
the same names (:func:`train_key`), its ``[objective]`` keys the
:class:`~opsplit.control.Objective` weights of the same names (:func:`objective_key`); the
command passes their values on as they are (:func:`train_config`, :func:`objective`) and
the library checks them, its error naming ``TrainConfig.<field>`` (``Objective.<weight>``)
shown as the key's: ``train.<field>`` (``objective.<weight>``).  A task sets its own
defaults and fixes the fields it has no key for.  A list of ``[train]`` (``n_steps``,
``solvers``) that holds only the model's own N_t or solver is the field's ``None`` (the
model's own: no draw), and its weights' keys left at their defaults are not passed.

**Interrupts.**  During training the first SIGINT (Ctrl-C) only sets a flag, checked at
the start of the next optimizer step, where a checkpoint is saved and :class:`Interrupted`
raised (its message names the checkpoint and the command that continues the run); a second
one stops at once.
"""

from __future__ import annotations

import contextlib
import json
import re
import signal
import sys
import threading
import warnings
from pathlib import Path

from ...coarse import check_coarse
from ...control import (
    Callback,
    Objective,
    TrainConfig,
    Trainer,
    checkpoint_differences,
    config_changes,
)
from ...control.checkpoint import CheckpointError, latest_checkpoint, read_checkpoint
from ...control.flow_costs import check_flow_costs
from ...control.gradients import restore_gradient_mode, set_gradient_mode
from ...control.objective import check_objective
from ...control.swap import solved_with
from ..config import ConfigError, Field, dump_toml, library_field
from ..output import relpath

__all__ = ["NAME", "TASKS", "TRAIN_FIELDS", "train_key", "objective_key", "task_field", "train_config", "objective",
           "run_keys", "preflight", "fit", "Interrupted", "resumable_after_training", "check_resume",
           "check_new_folder", "folder_kind", "run_folder", "check_checkpoint", "data_settings", "no_allow_changes",
           "without_api_advice", "library_error"]

NAME = "train"
#: the tasks of ``opsplit train`` (the config's top-level ``task``; :mod:`opsplit.cli.tasks`)
TASKS = ("digits", "text", "burgers")
#: TrainConfig's fields: name -> ConfigField (default, accepted values, doc)
TRAIN_FIELDS = TrainConfig.schema()
#: the keys of ``[train]`` whose weights' keys apply only to a drawn list
_WEIGHTS_OF = {"n_steps": ("n_steps_weights",),
               "solvers": ("solvers_weights", "solvers_split", "solvers_split_weights")}


def task_field(name: str, help: str) -> Field:
    """The top-level ``task`` key of a task's schema."""
    return Field("str", name, help, choices=TASKS)


def train_key(name: str, default=None, help: str | None = None, *, choices: tuple | None = None) -> Field:
    """The ``[train]`` key of the TrainConfig field ``name``: checked by TrainConfig, its
    accepted values and (unless ``help``) its doc TrainConfig's; ``default`` the task's
    (``None``: TrainConfig's), ``choices`` a subset the task's model takes."""
    return library_field(TRAIN_FIELDS[name], default, help, choices=choices)


#: the [train] keys of multilevel training in time and of coarse solves (TrainConfig's fields)
LEVEL_KEYS = ("levels", "levels_prolongation", "levels_schedule", "coarse_controls", "n_steps_distill")


def level_keys() -> dict:
    """The ``[train]`` keys of :data:`LEVEL_KEYS`, TrainConfig's defaults (no levels):
    ``levels = [[1, 0.4], [2, 0.3], [4, 0.3]]`` trains the model's piecewise controls at 1,
    2 then 4 pieces (docs/multilevel.md)."""
    return {k: train_key(k) for k in LEVEL_KEYS}


def objective_key(name: str, default: float, help: str) -> Field:
    """The ``[objective]`` key of the Objective weight ``name`` (checked by Objective)."""
    return Field("library", default, help, accepts="a finite weight >= 0")


def library_error(e: Exception, cls: str, section: str) -> ConfigError:
    """The library's error ``<cls>.<field>: ...`` as the key's, ``<section>.<field>: ...``."""
    m = re.match(rf"{cls}\.(\w+): (.*)", str(e), re.S)
    return ConfigError(f"{section}.{m.group(1)}: {m.group(2)}" if m else f"{section}: {e}")


def train_config(cfg: dict, schema: dict, *, own: dict, fixed: dict, progress: bool = True, extra=()) -> TrainConfig:
    """The run's TrainConfig: every ``[train]`` key as the field of its name (``None``, unset:
    TrainConfig's default), the task's ``fixed`` fields, ``extra`` (keys of the config that
    fix the data: TrainConfig.extra); ``own`` (``{"n_steps": [4]}``): the lists that are the
    model's own N_t or solver, passed as ``None``.  TrainConfig's refusal is a
    :class:`ConfigError` naming the key."""
    t = dict(cfg["train"])
    for key, mine in own.items():
        if t.get(key) == mine:
            t[key] = None
            for w in _WEIGHTS_OF[key]:
                if w in t and t[w] == schema["train"][w].default:
                    del t[w]
    kw = {k: v for k, v in t.items() if v is not None}
    try:
        return TrainConfig(**kw, **fixed, progress=progress, extra=data_settings(cfg, extra))
    except (ValueError, TypeError) as e:
        err = library_error(e, "TrainConfig", "train")
        owned = [k for k in own if t.get(k) is None and cfg["train"].get(k) is not None
                 and (f"without {k}" in str(err) or f"needs {k}" in str(err))]
        if owned:  # a setting of a list the command passed as None (the model's own)
            k = owned[0]
            err = ConfigError(f"{err} (train.{k} = {cfg['train'][k]} is the model's own: no draw)")
        raise err from None


def run_keys(cfg: dict, **more) -> dict:
    """The TrainConfig fields a resume compares -> the keys that set them (each ``[train]``
    key sets the field of its name; ``more``: fields the task sets from other keys)."""
    return {**{k: f"train.{k}" for k in cfg["train"] if TRAIN_FIELDS[k].resume != "allowed"}, **more}


def objective(cfg: dict, loss, **kw) -> Objective:
    """The objective: ``loss`` and the ``[objective]`` weights (checked by Objective, refused
    naming the key)."""
    try:
        return Objective(loss, **cfg.get("objective", {}), **kw)
    except (ValueError, TypeError) as e:
        raise library_error(e, "Objective", "objective") from None


def data_settings(cfg: dict, keys) -> dict:
    """``{"section.key": value}`` of ``keys`` (TrainConfig.extra)."""
    return {k: cfg[k.split(".")[0]][k.split(".", 1)[1]] for k in keys}


def preflight(model, obj: Objective, config: TrainConfig, inputs, targets, what: str, *,
              gradient_hint: str = "") -> None:
    """The trainer's checks before its first step (:meth:`~opsplit.control.Trainer.fit`), on
    two training samples, before anything is written: the gradient mode applies to the
    model, the flow costs can read its steps, the objective's weighted costs and their
    gradients are finite (:func:`~opsplit.control.objective.check_objective`), every drawn
    solver can run the model's terms.  A refusal names the key (``gradient_hint``: what the
    task's keys change about a refused gradient mode)."""
    try:
        previous = set_gradient_mode(model, config.gradient, checkpoint_every=config.checkpoint_every,
                                     snapshots=config.checkpoint_snapshots)
    except ValueError as e:
        raise ConfigError(f"train.gradient: {e}{gradient_hint}") from None
    try:
        check_flow_costs(obj, model)
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="There is a performance drop")
            check_objective(obj, model, inputs, targets, what=what)
    except ValueError as e:
        raise library_error(e, "Objective", "objective") from None
    finally:
        restore_gradient_mode(previous)
    for name in config.solvers or ():
        try:
            with solved_with(model, solver=name):
                pass
        except ValueError as e:
            raise ConfigError(f"train.solvers: {e}") from None


def check_coarse_keys(model, cfg: dict) -> None:
    """The N_t below the model's control pieces that a run solves with the pieces' average
    (``eval.n_steps`` with ``train.coarse_controls = "average"``; ``frontier.n_steps``
    always) divide the pieces: refused naming the key, before training
    (:func:`~opsplit.coarse.check_coarse`)."""
    keys = []
    if cfg["train"].get("coarse_controls") == "average" and "eval" in cfg:
        keys.append(("eval.n_steps", cfg["eval"]["n_steps"]))
    if cfg.get("frontier", {}).get("enabled"):
        keys.append(("frontier.n_steps", cfg["frontier"]["n_steps"]))
    for key, ns in keys:
        for n in ns:
            try:
                check_coarse(model, n, key)
            except ValueError as e:
                raise ConfigError(str(e)) from None


# -- interrupts -------------------------------------------------------------------------------------
class Interrupted(KeyboardInterrupt):
    """An interrupt of ``opsplit train``; the message says where the run stopped, which
    checkpoint holds it and how to continue (``run`` adds the folder)."""

    def __init__(self, step: int, checkpoint, at_once: bool = False, folder=None):
        super().__init__(step, checkpoint)
        self.step, self.checkpoint, self.at_once, self.folder = step, checkpoint, at_once, folder
        self.command = None  # the command that continues the run (default: train --resume)

    def __str__(self):
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
    try:
        yield
    except KeyboardInterrupt:
        raise Interrupted(trainer.step, latest_checkpoint(folder / sub), at_once=True, folder=folder) from None


class _StopHere(Exception):
    """Raised at the start of an optimizer step after an interrupt (the state is whole)."""


class InterruptAtStepEnd(Callback):
    """While active (in the main thread): the first SIGINT only sets a flag, checked at the
    start of the next optimizer step (a trainer callback); the second one interrupts at once."""

    def __init__(self):
        self.requested = False
        self._previous = None

    def _handler(self, signum, frame):
        if self.requested:
            raise KeyboardInterrupt
        self.requested = True
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

    def on_step_start(self, trainer) -> None:
        if self.requested:  # between two optimizer steps: the state is whole
            raise _StopHere


def fit(trainer_of, folder: Path, train, evald=None, *, allow=False, callbacks=()):
    """Train the :class:`~opsplit.control.Trainer` ``trainer_of(callbacks)`` (the task's
    ``callbacks`` and the interrupt's, last) on ``train``; its checkpoints and history go
    to ``folder``, which is resumed from when it holds a checkpoint.  An interrupt stops at
    the end of the current step and saves a checkpoint there (:class:`Interrupted`).
    Returns ``(trainer, history, resumed)``."""
    stop = InterruptAtStepEnd()
    try:
        trainer = trainer_of([*callbacks, stop])
    except ValueError as e:  # a level schedule the model's controls cannot take: the key's error
        if not str(e).startswith("TrainConfig."):
            raise
        raise library_error(e, "TrainConfig", "train") from None
    folder.mkdir(parents=True, exist_ok=True)
    resume = folder if latest_checkpoint(folder) is not None else None
    try:
        with stop, warnings.catch_warnings():
            # torch's vmap fallback for SDPA (parallel/hybrid heads batched): a speed note only
            warnings.filterwarnings("ignore", message="There is a performance drop")
            history = trainer.fit(train, evald, out_dir=folder, resume=resume, allow_changes=allow)
    except _StopHere:
        # between two optimizer steps: model, optimizer, scheduler, generator and counters
        # are those after step trainer.step, as in a periodic checkpoint
        path = trainer.save(folder / "checkpoints" / f"step-{trainer.step:08d}")
        raise Interrupted(trainer.step, path) from None
    except KeyboardInterrupt:
        raise Interrupted(trainer.step, latest_checkpoint(folder), at_once=True) from None
    if stop.requested:  # interrupted during the last evaluation: the final checkpoint is saved
        raise Interrupted(trainer.step, latest_checkpoint(folder))
    return trainer, history, resume is not None


# -- the run folder and --resume -------------------------------------------------------------------
def no_allow_changes(a) -> None:
    """``--allow-changes`` belongs to ``--resume``."""
    if getattr(a, "allow_changes", None) is not None:
        raise ConfigError("--allow-changes: only with --resume (it names the keys of a resumed run's config.toml "
                          "edited since its checkpoint); a new run takes any config")


def folder_kind(folder: Path) -> str | None:
    """The job that wrote ``folder`` (``"train"``, ``"solve"``, ..., ``"default"``), from its
    manifest's title or its configs; ``None`` when nothing says."""
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


def check_resume(a, flags: dict) -> Path:
    """``--resume DIR``: no flag that contradicts the folder (``flags``: ``{"--epochs":
    value}``, the flags that set keys), a train folder; returns the path of its config.toml
    (the config the run continues with)."""
    folder = Path(a.resume)
    if a.config is not None:
        raise ConfigError(f"--config: cannot be combined with --resume (a resumed run continues with "
                          f"{str(folder / 'config.toml')!r}; start a new run with --out to use another config)")
    if a.out is not None and Path(a.out).resolve() != folder.resolve():
        raise ConfigError(f"--out: cannot be combined with --resume {str(folder)!r} (a resumed run "
                          f"writes to its own folder), got --out {a.out!r}")
    for flag, value in flags.items():
        if value is not None:
            raise ConfigError(f"{flag}: cannot be combined with --resume (a resumed run continues with the "
                              f"settings of {str(folder / 'config.toml')!r}; start a new run with --out to "
                              f"change them)")
    return run_folder(folder, "--resume", "an opsplit train output folder (its config.toml and checkpoints)")


def run_folder(folder: Path, name: str, expected: str) -> Path:
    """The config.toml of the training run in ``folder``; refused naming ``name`` (``"--resume"``,
    ``"folder"``) and saying what was ``expected`` when it is not a folder, holds another job's
    output or has no config.toml."""
    folder = Path(folder)
    if not folder.is_dir():
        raise ConfigError(f"{name}: expected {expected}, {str(folder)!r} is not a folder")
    kind = folder_kind(folder)
    if kind not in (None, NAME):
        what = "the default job" if kind == "default" else f"opsplit {kind}"
        raise ConfigError(f"{name}: expected {expected}, {str(folder)!r} holds the output of {what}")
    p = folder / "config.toml"
    if not p.is_file():
        raise ConfigError(f"{name}: expected {expected}, {str(folder)!r} has no config.toml")
    return p


def check_new_folder(out, same_config: Path | None = None, cfg: dict | None = None) -> None:
    """A new run does not write into a folder that holds a training run (it would silently
    continue that run with another config), unless ``same_config`` (that run's config file)
    holds ``cfg`` (the default job continues its own training)."""
    if out is not None and latest_checkpoint(Path(out) / "train") is not None:
        if same_config is not None and same_config.is_file() and cfg is not None \
                and same_config.read_text() == dump_toml(cfg):
            return
        raise ConfigError(f"--out: {str(out)!r} already holds a training run (checkpoints in "
                          f"{str(Path(out) / 'train' / 'checkpoints')!r}); continue it with "
                          f"opsplit train --resume {out}, or choose another folder")


def _cli_key(change, keys: dict) -> str:
    base = change.key.split(" ")[0]
    if change.where != "TrainConfig":
        return "model"
    names = [keys.get(k, k) for k in base.split("/")]
    return "/".join(dict.fromkeys(names))


def _cli_change(change, keys: dict) -> str:
    if change.where != "TrainConfig":
        return f"the model ([model] edited): {change.where + '.' if change.where else ''}{change.key} = " \
               f"{change.checkpoint!r} in the checkpoint, {change.model!r} now"

    def shown(v):  # a setting left to its default is None in TrainConfig
        return "unset (the default)" if v is None else repr(v)

    return f"{_cli_key(change, keys)} = {shown(change.checkpoint)} in the checkpoint, {shown(change.model)} in " \
           "config.toml"


def _allowed_names(allow, keys: dict, data_keys) -> frozenset:
    """``--allow-changes KEY ...`` (config keys) as the trainer's setting names."""
    if not allow:
        return frozenset()
    back = {}
    for name, key in keys.items():
        back.setdefault(key, []).append(name)
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


def check_checkpoint(plan, folder: Path, allow, *, trainer: Trainer, total_steps: int, keys: dict,
                     data_keys, renamed: dict | None = None) -> None:
    """Before anything of a resumed run is written: the folder's latest checkpoint is read,
    checked against ``trainer`` (the model of ``config.toml`` and its run, ``total_steps``
    optimizer steps) and loaded — what :meth:`~opsplit.control.Trainer.fit` does when it
    resumes, refused here as one :class:`ConfigError` that names the edited keys by their
    config names (``keys``: TrainConfig field -> key, :func:`run_keys`), with the advice the
    command offers (``--allow-changes``, ``--out``).  A data key the checkpoint recorded
    under its former name (``renamed``: old -> new, a run of an earlier version) counts as
    the same key when it holds the same value.  The accepted names go to
    ``plan["allow_changes"]`` for the run."""
    ck_path = latest_checkpoint(folder / "train")
    if ck_path is None:
        return  # nothing saved yet: the run starts from step 0
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
    saved = (ck.config or {}).get("extra") or {}
    former = {old: new for old, new in (renamed or {}).items() if new in data_keys and old in saved}
    names = _allowed_names(allow, keys, (*data_keys, *former))
    for old, new in former.items():
        if saved[old] == trainer.config.extra.get(new):
            names |= {old, new}  # the same setting under its former name
    bad = [c for c in changes if c.where != "TrainConfig" or not (
        c.key.split(" ")[0] in names or any(k in names for k in c.key.split(" ")[0].split("/")))]
    if bad:
        shown = [_cli_key(c, keys) for c in bad if c.where == "TrainConfig"]
        may = (f", or pass --allow-changes {' '.join(dict.fromkeys(shown))} to continue with the new value(s) "
               "(the optimizer and schedule follow them from the resumed step on)") if len(shown) == len(bad) else ""
        raise ConfigError(
            f"--resume: {str(folder / 'config.toml')!r} differs from the run that wrote the checkpoint "
            f"{str(ck_path)!r}: " + "; ".join(_cli_change(c, keys) for c in bad)
            + ". A resume continues that run: restore the value(s) in config.toml, or start a new run with --out"
            + may + ". Nothing was loaded or written")
    try:
        with warnings.catch_warnings():  # the accepted changes: warned about once, by the run
            warnings.simplefilter("ignore")
            trainer.load(ck_path, allow_changes=names, total_steps=total_steps)
    except CheckpointError as e:
        raise ConfigError(f"--resume: {without_api_advice(e)}{earlier}") from None
    plan["allow_changes"] = names
