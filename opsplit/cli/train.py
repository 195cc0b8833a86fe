"""``opsplit train``: training as an optimal-control problem through
:mod:`opsplit.control` (the trainer), on the bundled digits; resumable from its output
folder."""

from __future__ import annotations

NAME = "train"
SUMMARY = "train a model's controls (optimal control) on the bundled digits; resumable"
EXAMPLE = """\
examples:
  opsplit train --epochs 5 --out runs/train
  opsplit train --resume runs/train        # continue an interrupted run from its folder
"""
SCHEMA = {}


def available() -> bool:
    try:
        import opsplit.control  # noqa: F401
        import opsplit.data  # noqa: F401
    except ImportError:
        return False
    return True


def add_arguments(p):
    p.add_argument("--resume", metavar="DIR", help="continue the run in DIR (its config.toml "
                   "and latest checkpoint)")


def overrides(a) -> dict:
    return {}


def resume_config(folder):
    from pathlib import Path

    from .config import ConfigError

    p = Path(folder) / "config.toml"
    if not p.is_file():
        raise ConfigError(f"--resume: expected an opsplit train output folder with config.toml, "
                          f"{str(folder)!r} has none")
    return p


def prepare(cfg) -> dict:
    from .config import ConfigError

    if not available():
        raise ConfigError("train: this opsplit has no trainer (opsplit.control, opsplit.data)")
    return {}


def run(cfg, plan, out, progress=True):  # pragma: no cover - filled in with the trainer
    raise NotImplementedError
