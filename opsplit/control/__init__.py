r"""Training as an optimal-control problem (paper 002, eqs. 10–12 and 36).

- :class:`Objective` — :math:`J(\theta)` = data term + running costs on the controls;
- :class:`Trainer`, :class:`TrainConfig`, :class:`History` — the optimisation loop;
- :class:`Callback`, :class:`CPUTimeBudget` — what a script adds to the loop (per-step and
  per-evaluation work, stopping, the schedule's progress; :mod:`opsplit.control.callbacks`);
- gradient modes (:data:`GRADIENT_MODES`): ``"backprop"``, ``"checkpoint"``, ``"adjoint"``;
- :class:`Unsplit` — the unsplit continuous model (eq. 10) as a trainable module;
- :func:`save_checkpoint` / :func:`load_checkpoint` — safetensors + versioned JSON;
  :func:`checkpoint_differences` / :func:`config_changes` — the recorded settings of a
  checkpoint's model / run that differ from a model / config (what loading refuses);
- :func:`check_out_dir` — whether a run can write its output folder (checked before training);
- :func:`continuity` — a trained model's metric over N_t, substep solvers and schemes, and the
  convergence of its outputs (the solver-swap test); :func:`solved_with` — the swap itself;
- :func:`frontier` — one model's metric against N_t and compute beside models trained at each
  N_t; :func:`coarse_controls` — a solve coarser than the controls' pieces that averages them;
  multilevel training in time: ``TrainConfig.levels`` (:mod:`opsplit.control.multilevel`).
"""

from ..coarse import COARSE_MODES, coarse_controls
from .callbacks import Callback, CPUTimeBudget
from .checkpoint import (
    CheckpointError,
    SettingChange,
    checkpoint_differences,
    latest_checkpoint,
    load_checkpoint,
    read_checkpoint,
    save_checkpoint,
)
from .config import OPTIMIZERS, SCHEDULES, ConfigField, TrainConfig, config_changes
from .continuity import Continuity, continuity
from .costs import energy_cost, leaf_controls, smoothness_cost
from .frontier import Frontier, frontier
from .gradients import GRADIENT_MODES, Unsplit, gradient_mode, set_gradient_mode
from .history import History
from .objective import LOSSES, Objective, ObjectiveValue
from .swap import solved_with, strang_of
from .trainer import Trainer, check_out_dir, peak_memory_mb

__all__ = [
    "Objective",
    "ObjectiveValue",
    "LOSSES",
    "smoothness_cost",
    "energy_cost",
    "leaf_controls",
    "GRADIENT_MODES",
    "set_gradient_mode",
    "gradient_mode",
    "Unsplit",
    "Trainer",
    "TrainConfig",
    "ConfigField",
    "Callback",
    "CPUTimeBudget",
    "OPTIMIZERS",
    "SCHEDULES",
    "History",
    "peak_memory_mb",
    "CheckpointError",
    "save_checkpoint",
    "load_checkpoint",
    "read_checkpoint",
    "latest_checkpoint",
    "checkpoint_differences",
    "config_changes",
    "SettingChange",
    "check_out_dir",
    "Continuity",
    "continuity",
    "solved_with",
    "strang_of",
    "coarse_controls",
    "COARSE_MODES",
    "Frontier",
    "frontier",
]
