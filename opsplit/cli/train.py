"""``opsplit train``: training as an optimal-control problem (paper 002, eqs. 10-12) through
:mod:`opsplit.control`, on the task the config's top-level ``task`` names
(:mod:`opsplit.cli.tasks`: ``digits``, the default; ``text``; ``burgers``).  This module is
the command: its flags, the task's pick, and ``--help`` listing every task's keys."""

from __future__ import annotations

from pathlib import Path

from . import tasks
from .config import ConfigError, accepted, describe, read_toml
from .tasks import TASKS, base

NAME = "train"
SUMMARY = ("train a model's controls (optimal control): a ViT on the bundled digits, a character-level GPT "
           "(task = \"text\") or a neural operator on Burgers' equation (task = \"burgers\"); resumable")
EXAMPLE = """\
examples:
  opsplit train --epochs 10 --out runs/train
  opsplit train --resume runs/train        # continue an interrupted run from its folder
  opsplit train --config train.toml
  opsplit train --config text.toml      # task = "text": a character-level GPT (docs/text.md)
  opsplit train --config text.toml --print-config   # the text task's keys and defaults

""" + "\n".join(m.EXAMPLE for m in tasks.MODULES.values())
#: the digits task's schema (the default task): ``--config`` and ``--print-config`` apply
SCHEMA = tasks.digits.SCHEMA
#: the flags that set keys -> their attribute in the parsed arguments
FLAGS = {"--epochs": "epochs", "--n-steps": "n_steps", "--scheme": "scheme", "--gradient": "gradient"}


def _choices(section: str, key: str) -> str:
    return "; ".join(f"{name}: {accepted(m.SCHEMA[section][key])}" for name, m in tasks.MODULES.items()
                     if key in m.SCHEMA.get(section, {}))


def config_help() -> str:
    """The keys of every task, with their defaults and accepted values (``--help``)."""
    out = []
    for name, m in tasks.MODULES.items():
        what = " (the default)" if name == TASKS[0] else ""
        out.append(f"\ntask = \"{name}\"{what}: config keys and defaults (opsplit train --config "
                   f"<file with task = \"{name}\"> --print-config):\n" + describe(m.SCHEMA))
    return "\n".join(out)


def add_arguments(p):
    p.add_argument("--resume", metavar="DIR", help="continue the run in DIR (its config.toml "
                   "and latest checkpoint)")
    p.add_argument("--epochs", type=int, help="train.epochs (digits, burgers; the text task counts train.max_steps)")
    p.add_argument("--n-steps", type=int, metavar="N", help="N_t of training: model.n_steps (digits, burgers) or "
                   "train.n_steps (text)")
    p.add_argument("--scheme", help=f"model.scheme ({_choices('model', 'scheme')})")
    p.add_argument("--gradient", help=f"train.gradient ({_choices('train', 'gradient')}; burgers: backprop; "
                   "the digits' adjoint needs model.solver = 'rk4')")
    p.add_argument("--allow-changes", nargs="+", metavar="KEY", help="with --resume: continue although these "
                   "keys of the folder's config.toml were edited since its checkpoint was written (train.lr, "
                   "data.split_seed, ...; the optimizer and schedule follow the new values from the resumed step on)")


def select(a):
    """The module of the run's task (:mod:`opsplit.cli.tasks`), by the top-level ``task`` of
    ``--config`` (or of the ``--resume`` folder's config.toml, after the flags are checked
    against ``--resume``).  A ``task`` that is not one of :data:`TASKS`, or a file without a
    task line whose keys belong to another task only, is refused naming ``task``; a file
    that cannot be read is reported when its schema reads it."""
    path = None
    if getattr(a, "resume", None) is not None:
        path = base.check_resume(a, {flag: getattr(a, attr) for flag, attr in FLAGS.items()})
    else:
        base.no_allow_changes(a)
        path = a.config
    try:
        raw = {} if path is None else read_toml(path)
    except ConfigError:
        raw = {}
    task = raw.get("task", None)
    if isinstance(task, dict):  # a [task] table: an unknown section, reported by the schema
        task = None
    if task is None:
        _refuse_other_tasks_keys(raw)
        task = TASKS[0]
    if not isinstance(task, str) or isinstance(task, bool):
        raise ConfigError(f"task: expected a string, one of {', '.join(map(repr, TASKS))}, got {task!r} "
                          f"({type(task).__name__})")
    if task not in TASKS:
        hint = f" (task names are lower case: {task.lower()!r})" if task.lower() in TASKS else ""
        raise ConfigError(f"task: expected one of {', '.join(map(repr, TASKS))}, got {task!r}{hint}")
    return tasks.MODULES[task]


def _refuse_other_tasks_keys(raw: dict) -> None:
    """A config without a task line is the default task's: refused naming ``task`` when it
    has sections or keys that the default task's schema has not and another task's has (the
    task with most of them is named)."""
    default = tasks.MODULES[TASKS[0]].SCHEMA
    foreign = []
    for sec, v in raw.items():
        if isinstance(v, dict) and sec not in default:
            foreign.append((sec, None))
        elif isinstance(v, dict):
            foreign += [(sec, k) for k in v if k not in default[sec]]

    def has(schema, sec, key):
        return sec in schema and (key is None or key in schema[sec])

    best, found = None, []
    for name, m in tasks.MODULES.items():
        mine = [f"[{s}]" if k is None else f"{s}.{k}" for s, k in foreign if has(m.SCHEMA, s, k)]
        if name != TASKS[0] and len(mine) > len(found):
            best, found = name, mine
    if best is not None:
        raise ConfigError(
            f"task: the config has no task line, so it is read as task = \"{TASKS[0]}\", but "
            f"{', '.join(found[:4])}{' ...' if len(found) > 4 else ''} belong(s) to task = \"{best}\"; "
            f"expected task = \"{best}\" on the first line (before any [section])")


def config_path(a) -> Path | None:
    """The config file of a run: the ``--resume`` folder's config.toml, or ``--config``."""
    return Path(a.resume) / "config.toml" if getattr(a, "resume", None) is not None else a.config
