r"""The trainer: minimises the objective :math:`J(\theta)` of eqs. (10)/(12) (with running
costs, :class:`~opsplit.control.Objective`) over the controls of any model, scheme and grid.

Public API (five lines)::

    from opsplit.control import Objective, TrainConfig, Trainer
    trainer = Trainer(model, Objective("cross_entropy"), TrainConfig(epochs=20, lr=3e-3, gradient="backprop"))
    history = trainer.fit(train_data, eval_data, out_dir="runs/x")   # TensorData or (inputs, targets)
    trainer.fit(train_data, eval_data, out_dir="runs/x", resume="runs/x")  # continue a killed run
    metrics = trainer.evaluate(test_data, n_steps=8)                  # {"loss", "accuracy" | "mse", ...}

**What is checked before the first step** (clear ``ValueError``/``TypeError``): the data
(tensors or :class:`~opsplit.data.TensorData`, equal lengths, not empty, finite), the
configuration (:class:`~opsplit.control.TrainConfig`: ``lr > 0``, ...), the gradient mode
against the model (:func:`~opsplit.control.set_gradient_mode`), the model's output on two
training samples against the targets and the loss (:meth:`Objective.check`: shape
mismatch, class range), the output folder (:func:`~opsplit.control.check_out_dir`), and a
checkpoint given to ``resume`` against the model and the run
(:func:`~opsplit.control.load_checkpoint`, :func:`~opsplit.control.config_changes`: another
model, another map with the same tensors, or other run settings are refused, nothing is
loaded).  In a data-parallel run a refusal on one rank stops every rank.

**The objective's weights** (:func:`~opsplit.control.objective.check_objective`): the
objective of the untrained model on two training samples must be finite; a running-cost
weight whose term overflows the parameters' dtype there (``kinetic = 1e308``) is refused by
its name, with the largest weight that fits, before anything is written.

**During training** the objective (before the backward pass) and the global gradient norm
(after it, before clipping) must be finite: otherwise a ``FloatingPointError`` naming the
parameters with a non-finite gradient stops the run before the optimizer step, the
parameters unchanged, and no checkpoint is written (:func:`save_checkpoint` refuses
non-finite weights in any case).

**Determinism.** A fresh run seeds torch's global generator with ``config.seed`` (dropout
and any other global-RNG use during training); the data order of epoch ``e`` is a
permutation drawn from a generator seeded with ``(seed, e)``, so it needs no state.  A
checkpoint holds the model, optimizer, scheduler, global RNG states and the step counter;
resuming from it continues the same sequence of batches and random numbers, so on CPU the
loss curve and the parameters equal those of the uninterrupted run bit for bit
(``tests/test_control_trainer.py``) — at the same number of threads and torch version (the
CPU kernels' reductions are split by thread: another thread count rounds differently).

**Peak memory** in the history (``peak_mem_mb``): on CUDA the peak allocated by torch's
caching allocator during the epoch (``torch.cuda.max_memory_allocated``, reset per
epoch); on CPU the process's peak resident set size (``ru_maxrss``) — monotone over the
process's life and including everything the process ever held, so only its growth is
informative.  ``benchmarks/train_memory.py`` measures the autograd memory itself.
"""

from __future__ import annotations

import contextlib
import math
import resource
import shutil
import sys
import time
import warnings
from pathlib import Path

import torch
from torch import Tensor, nn
from tqdm.auto import tqdm

from .._checks import check_bool
from .._memory import available_memory, check_fits, human_bytes
from ..coarse import check_coarse, coarse_controls
from ..data.base import TensorData
from ..propagator import Propagator, _calls_per_step
from .callbacks import Callback
from .checkpoint import load_checkpoint, save_checkpoint
from .checkpoint_diff import check_allow_changes, checkpoint_differences, refuse_changes
from .checkpoint_meta import CheckpointError
from .checkpoint_read import latest_checkpoint, read_checkpoint
from .checkpoint_resample import plan_model_state
from .config import TrainConfig, check_int, config_changes
from .distributed import any_rank, check_data_parallel
from .flow_costs import check_flow_costs
from .gradients import restore_gradient_mode, set_gradient_mode
from .history import History
from .multilevel import change_level, check_level_schedule, level_at, level_n_steps, level_starts
from .objective import Objective, ObjectiveValue, check_objective
from .paths import check_out_dir, check_path
from .resolution import draw_n_steps, draw_solver, split_sizes
from .swap import field_substeps, propagators, solved_with, solver_name

__all__ = ["Trainer", "peak_memory_mb", "as_dataset", "check_out_dir"]


def peak_memory_mb(device=None) -> float:
    """CUDA: ``max_memory_allocated`` of ``device`` in MiB; CPU: the process's peak RSS in MiB."""
    dev = torch.device(device) if device is not None else torch.device("cpu")
    if dev.type == "cuda" and torch.cuda.is_available():
        return torch.cuda.max_memory_allocated(dev) / 2**20
    r = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return r / 2**20 if sys.platform == "darwin" else r / 2**10


def as_dataset(data, name: str) -> TensorData:
    """``data`` as a :class:`TensorData`: a ``TensorData`` or a pair ``(inputs, targets)``."""
    if isinstance(data, TensorData):
        return data
    if isinstance(data, (tuple, list)) and len(data) == 2:
        return TensorData(data[0], data[1], name=name)
    if data is None:
        raise ValueError(f"{name}: expected a dataset, got None")
    raise TypeError(f"{name}: expected an opsplit.data.TensorData or a pair (inputs, targets), "
                    f"got {type(data).__name__}")


def _total_norm(grads: list) -> Tensor:
    """The global 2-norm of ``grads`` exactly as ``clip_grad_norm_`` computes it."""
    if hasattr(torch.nn.utils, "get_total_norm"):  # torch >= 2.6
        return torch.nn.utils.get_total_norm(grads, 2.0, error_if_nonfinite=False)
    if not grads:
        return torch.tensor(0.0)
    return torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g, 2.0) for g in grads]), 2.0)


def _clip(params, max_norm: float, total: Tensor) -> None:
    """Scale the gradients as ``clip_grad_norm_(params, max_norm)`` does, given their norm."""
    if hasattr(torch.nn.utils, "clip_grads_with_norm_"):  # torch >= 2.6
        torch.nn.utils.clip_grads_with_norm_(params, max_norm, total)
        return
    coef = torch.clamp(max_norm / (total + 1e-6), max=1.0)
    for p in params:
        if p.grad is not None:
            p.grad.detach().mul_(coef.to(p.grad.device))


def _batches(n: int, batch_size: int, drop_last: bool, perm: Tensor | None):
    idx = perm if perm is not None else torch.arange(n)
    stop = n - (n % batch_size) if drop_last else n
    return [idx[a:min(a + batch_size, stop)] for a in range(0, stop, batch_size)]


def _own_solver(model) -> str | None:
    """The name of the solver of every field substep of ``model`` when they share one."""
    names = {solver_name(s.solver) for p in propagators(model) for s in field_substeps(p.scheme)}
    return names.pop() if len(names) == 1 else None


def _mean(values) -> float:
    v = list(values)
    return sum(v) / len(v) if v else float("nan")


@contextlib.contextmanager
def _solve_inputs(model):
    """``with _solve_inputs(model) as calls: model(x)``: ``calls`` lists ``(propagator, bytes
    of its input state, its batch size or None)`` for every solve of an opsplit propagator
    inside ``model``."""
    calls = []

    def hook(mod, args, kwargs):
        f = args[0] if args else kwargs.get("f")
        if isinstance(f, Tensor):
            calls.append((mod, float(f.numel() * f.element_size()), f.shape[0] if f.dim() == 3 else None))

    handles = [m.register_forward_pre_hook(hook, with_kwargs=True) for m in model.modules()
               if isinstance(m, Propagator)]
    try:
        yield calls
    finally:
        for h in handles:
            h.remove()


_OPTIMIZER_CLASSES = {"adamw": "AdamW", "adam": "Adam", "sgd": "SGD"}


def _check_run_state(ck) -> None:
    """A trainer's checkpoint agrees with itself before it is resumed (issue 42, 13d): the
    step counter is at most the run's total, the schedule has stepped once per optimizer step
    (``scheduler.last_epoch == trainer.step``), Adam's update counts reach the step counter,
    and the parameter groups hold the rates of the run's config (``initial_lr == lr``,
    ``weight_decay``, ``betas`` / ``momentum``; the scheduled ``lr`` never above its base).
    A :class:`~opsplit.control.CheckpointError` names the two records that disagree."""
    t = ck.trainer
    if not isinstance(t, dict):
        return

    def refuse(what: str):
        raise CheckpointError(f"checkpoint {str(ck.path)!r}: {what} in its metadata; the checkpoint was edited or "
                              "damaged, and resuming it would continue neither its run nor another. Nothing was "
                              "loaded")

    step, total = t.get("step", 0), t.get("total_steps")
    if total is not None and step > total:
        refuse(f"trainer.step = {step} is beyond trainer.total_steps = {total} (a run stops at its total)")
    sm = ck.meta.get("scheduler")
    last = (sm or {}).get("state", {}).get("last_epoch") if isinstance(sm, dict) else None
    if last is not None and last != step:
        refuse(f"scheduler.last_epoch = {last!r} and trainer.step = {step} differ (the schedule steps once per "
               "optimizer step)")
    om = ck.meta.get("optimizer")
    if not isinstance(om, dict):
        return
    counts = [float(v) for k, v in ck.tensors.items() if k.startswith("optimizer.") and k.endswith(".step")
              and v.numel() == 1]
    counts += [float(sc["step"]) for sc in (om.get("state") or {}).values()
               if isinstance(sc, dict) and isinstance(sc.get("step"), (int, float))]
    if counts and max(counts) != step:
        refuse(f"the optimizer's update counts (optimizer.<i>.step, largest {max(counts):g}) and trainer.step = {step} "
               "differ (every optimizer step updates the parameters that have a gradient)")
    cfg = ck.config
    if not isinstance(cfg, dict) or _OPTIMIZER_CLASSES.get(cfg.get("optimizer")) != om.get("class"):
        return
    for i, g in enumerate(om.get("param_groups") or []):
        pairs = [("initial_lr", "lr"), ("weight_decay", "weight_decay")]
        pairs += [("betas", "betas")] if cfg.get("optimizer") != "sgd" else [("momentum", "momentum")]
        for gk, ck_ in pairs:
            a, b = g.get(gk), cfg.get(ck_)
            if a is None or b is None:
                continue
            same = (len(a) == len(b) and all(math.isclose(x, y, rel_tol=1e-12, abs_tol=0.0) for x, y in zip(a, b))
                    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)) else
                    isinstance(a, (int, float)) and isinstance(b, (int, float)) and
                    math.isclose(a, b, rel_tol=1e-12, abs_tol=0.0))
            if not same:
                refuse(f"optimizer.param_groups[{i}].{gk} = {a!r} and the run's TrainConfig.{ck_} = {b!r} differ")
        lr, base = g.get("lr"), g.get("initial_lr")
        if isinstance(lr, (int, float)) and isinstance(base, (int, float)) and lr > base * (1 + 1e-9):
            refuse(f"optimizer.param_groups[{i}].lr = {lr!r} is above its base rate initial_lr = {base!r} (every "
                   "schedule factor is at most 1)")


def _check_callbacks(callbacks) -> list:
    if callbacks is None:
        return []
    if isinstance(callbacks, Callback) or not isinstance(callbacks, (list, tuple)):
        raise TypeError(f"Trainer.callbacks: expected a list of opsplit.control.Callback, got {callbacks!r}")
    for i, cb in enumerate(callbacks):
        if not isinstance(cb, Callback):
            raise TypeError(f"Trainer.callbacks[{i}]: expected an opsplit.control.Callback (subclass it and override "
                            f"its hooks), got {type(cb).__name__}")
    return list(callbacks)


def _callback_keys(callbacks):
    """``(key, callback)``: the key a callback's state is saved under (its class name, then
    ``#2``, ``#3`` ... for further callbacks of the same class)."""
    seen: dict = {}
    for cb in callbacks:
        name = type(cb).__name__
        seen[name] = seen.get(name, 0) + 1
        yield (name if seen[name] == 1 else f"{name}#{seen[name]}"), cb


def _check_eval_n_steps(n) -> int:
    """``Trainer.evaluate``'s :math:`N_t`: an integer >= 1 whose time grid (``n + 1`` times,
    Python floats of 32 bytes, made before the first step) fits in the available memory."""
    n = check_int(n, "Trainer.evaluate.n_steps", 1)
    need, free = 32.0 * (n + 1), available_memory()
    if need > free:
        raise ValueError(f"Trainer.evaluate.n_steps: N_t = {n} steps need a time grid of {n + 1} times "
                         f"({human_bytes(need)}) before the first step, more than the {human_bytes(free)} "
                         f"available; expected a smaller n_steps")
    return n


class Trainer:
    """Minimise ``objective`` over the parameters of ``model``.

    Args:
        model: any ``nn.Module`` holding opsplit propagators (a :class:`~opsplit.Propagator`,
            a model with pre/post-processing, :class:`~opsplit.control.Unsplit`, ...).
        objective: an :class:`~opsplit.control.Objective` (loss, running costs).
        config: a :class:`~opsplit.control.TrainConfig` (or a dict of its fields); keyword
            ``overrides`` replace single fields.
        forward_model: the module called in the training step (default ``model``; e.g. a
            ``DistributedDataParallel`` wrapper of it).  Checkpoints and running costs
            always use ``model``.
        metrics: extra evaluation metrics ``{name: fn(outputs, targets) -> float}``.
        rank, world_size: data parallelism (with ``forward_model`` a
            ``DistributedDataParallel``): every step draws a global batch of
            ``world_size * batch_size`` samples from the shared seeded order and process
            ``rank`` trains on its slice; only rank 0 writes checkpoints, CSV, plots and the
            progress bar.
        augment: ``fn(inputs, generator) -> inputs`` applied to every training batch (e.g.
            :func:`opsplit.data.random_shift`); ``generator`` is the trainer's own
            ``torch.Generator`` (seeded with ``config.seed``, saved in checkpoints).
        callbacks: :class:`~opsplit.control.Callback` instances called at the run's points
            (:mod:`opsplit.control.callbacks`: per-step and per-evaluation work, stopping, the
            schedule's progress — e.g. :class:`~opsplit.control.CPUTimeBudget`), in order.
    """
    def __init__(self, model: nn.Module, objective: Objective, config: TrainConfig | dict | None = None, *,
                 forward_model: nn.Module | None = None, metrics: dict | None = None, augment=None,
                 rank: int = 0, world_size: int = 1, callbacks=None, **overrides):
        if not isinstance(model, nn.Module):
            raise TypeError(f"Trainer.model: expected an nn.Module, got {type(model).__name__}")
        if not isinstance(objective, Objective):
            raise TypeError(f"Trainer.objective: expected an opsplit.control.Objective, got {type(objective).__name__}")
        if config is None:
            config = TrainConfig()
        elif isinstance(config, dict):
            config = TrainConfig.from_dict(config)
        elif not isinstance(config, TrainConfig):
            raise TypeError(f"Trainer.config: expected a TrainConfig or a dict, got {type(config).__name__}")
        # the trainer's own copy, frozen: the optimizer and the schedule are built from it
        self.config = config.replace(**overrides)
        self.config.check_consistent()
        self.config._freeze("Trainer")
        params = [p for p in model.parameters() if p.requires_grad]
        if not params:
            raise ValueError("Trainer.model: the model has no trainable parameters")
        if params[0].is_floating_point():
            objective.check_weights(params[0].dtype)  # a weight beyond the dtype's range: inf from step 0
        self.model, self.objective = model, objective
        if forward_model is not None and not isinstance(forward_model, nn.Module):
            raise TypeError(f"Trainer.forward_model: expected an nn.Module (e.g. DistributedDataParallel(model)) or "
                            f"None, got {type(forward_model).__name__}")
        self.forward_model = forward_model if forward_model is not None else model
        if metrics is not None and not isinstance(metrics, dict):
            raise TypeError(f"Trainer.metrics: expected a dict {{name: fn(outputs, targets) -> float}}, got "
                            f"{type(metrics).__name__}")
        for k, fn in (metrics or {}).items():
            if not isinstance(k, str) or not callable(fn):
                raise TypeError(f"Trainer.metrics[{k!r}]: expected a callable fn(outputs, targets) -> float under a "
                                f"string name, got {fn!r}")
        self.metrics = dict(metrics or {})
        if augment is not None and not callable(augment):
            raise TypeError(f"Trainer.augment: expected a callable fn(inputs, generator), got {augment!r}")
        self.augment = augment
        for v, nm in ((world_size, "world_size"), (rank, "rank")):
            if isinstance(v, bool) or not isinstance(v, int):
                raise TypeError(f"Trainer.{nm}: expected an integer, got {v!r}")
        if world_size < 1 or not 0 <= rank < world_size:
            raise ValueError(f"Trainer: expected 0 <= rank < world_size, got rank={rank}, world_size={world_size}")
        self.rank, self.world_size = rank, world_size
        self.callbacks = _check_callbacks(callbacks)
        self.should_stop = False
        if self.config.solvers_split and (world_size > 1 or forward_model is not None):
            raise ValueError("TrainConfig.solvers_split: the split calls the model once per solver in a "
                             "step, and a data-parallel wrapper (forward_model, world_size > 1) expects one call "
                             "per backward; use the draw (solvers_split=False) for data-parallel training")
        self.generator = torch.Generator().manual_seed(self.config.seed)
        self.params = params
        names = {id(p): n for n, p in model.named_parameters()}
        self._param_names = [names.get(id(p), f"<parameter {i}>") for i, p in enumerate(params)]
        self.optimizer = self._make_optimizer(params)
        self._total_steps = 1
        self.step = 0
        self.history = History()
        self.elapsed = 0.0
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, self._lr_factor)
        # multilevel training (TrainConfig.levels): the model as built is the finest level
        self.level = None
        c = self.config
        if c.levels is not None:
            self._final_pieces = check_level_schedule(model, c.levels, c.n_steps)
            self._final_n_steps = {p: p.n_steps for p in propagators(model)}
            self.level = len(c.levels) - 1
        if c.coarse_controls == "average":
            for n in c.n_steps or ():
                check_coarse(model, n, "TrainConfig.n_steps")
        if c.n_steps_distill and getattr(objective, "distill_kind", None) is None:
            raise ValueError(f"TrainConfig.n_steps_distill = {c.n_steps_distill:g}: the objective "
                             f"({type(objective).__name__}) has no divergence for self-distillation (a callable loss "
                             "names one: Objective(..., distill='kl') for logits, 'mse' otherwise)")

    # -- optimizer / schedule -------------------------------------------------------------
    def _make_optimizer(self, params):
        c = self.config
        if c.optimizer == "adamw":
            return torch.optim.AdamW(params, lr=c.lr, betas=c.betas, weight_decay=c.weight_decay)
        if c.optimizer == "adam":
            return torch.optim.Adam(params, lr=c.lr, betas=c.betas, weight_decay=c.weight_decay)
        return torch.optim.SGD(params, lr=c.lr, momentum=c.momentum, weight_decay=c.weight_decay)

    @property
    def total_steps(self) -> int:
        """The optimizer steps of the run (``max_steps``, or ``epochs`` times the steps per
        epoch; set by :meth:`fit`); a callback may stop the run before.  Set it to drive
        :meth:`train_step` outside :meth:`fit` (the learning-rate schedule and the levels
        read it)."""
        return self._total_steps

    @total_steps.setter
    def total_steps(self, n: int) -> None:
        self._total_steps = check_int(n, "Trainer.total_steps", 1)

    def progress(self, step: int | None = None) -> float:
        """The run's progress in [0, 1] after ``step`` optimizer steps (default
        ``self.step``), which the decaying schedules follow: the largest of the callbacks'
        :meth:`~opsplit.control.Callback.progress` values when one returns a number, else
        (step − warmup_steps) / (total steps − warmup_steps) — with ``TrainConfig.levels``
        and ``levels_schedule="level"`` the progress within the current level's steps."""
        step = self.step if step is None else step
        values = []
        for cb in self.callbacks:
            v = cb.progress(self)
            if v is None:
                continue
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
                raise TypeError(f"{type(cb).__name__}.progress: expected a finite number in [0, 1] or None, got {v!r}")
            values.append(float(v))
        if values:
            return min(1.0, max(0.0, max(values)))
        w = self.config.warmup_steps
        levels = self.config.levels
        if levels is not None and self.config.levels_schedule == "level":
            starts = level_starts(levels, self._total_steps) + [self._total_steps]
            i = level_at(levels, self._total_steps, min(step, self._total_steps - 1))
            a = max(starts[i], w) if i == 0 else starts[i]
            return min(1.0, max(0.0, (step - a) / max(1, starts[i + 1] - a)))
        return min(1.0, max(0.0, (step - w) / max(1, self._total_steps - w)))

    def _lr_factor(self, step: int) -> float:
        c = self.config
        if c.warmup_steps and step < c.warmup_steps:
            return (step + 1) / c.warmup_steps
        if c.schedule == "constant":
            return 1.0
        p = self.progress(step)
        r = c.min_lr_ratio
        if c.schedule == "cosine":
            return r + (1 - r) * 0.5 * (1 + math.cos(math.pi * p))
        return r + (1 - r) * (1 - p)

    def replace_parameters(self, old_to_new: dict, state_map=None) -> None:
        """Train new parameters in place of old ones from the next optimizer step on (at a
        step boundary, e.g. in a callback's ``on_step_start``, after the model was given the
        new parameters — controls prolonged to a finer time grid, say).

        Args:
            old_to_new: ``{old: new}``, ``old`` a parameter this trainer trains, ``new`` an
                ``nn.Parameter`` that requires a gradient (of any shape); each takes its
                predecessor's place in the optimizer's parameter group.
            state_map: ``fn(key, value, old, new) -> tensor`` mapping the optimizer's state of
                ``old`` to ``new``'s, called for every state tensor of ``old``'s shape
                (Adam's ``exp_avg``, ``exp_avg_sq``, SGD's ``momentum_buffer``: prolong them as
                the parameter was); other entries (Adam's ``step``) are copied.  ``None``:
                the new parameters start with no optimizer state (fresh moments).
        """
        if not isinstance(old_to_new, dict) or not old_to_new:
            raise TypeError(f"Trainer.replace_parameters.old_to_new: expected a non-empty dict {{old parameter: new "
                            f"parameter}}, got {old_to_new!r}")
        if state_map is not None and not callable(state_map):
            raise TypeError(f"Trainer.replace_parameters.state_map: expected None or a callable "
                            f"fn(key, value, old, new) -> tensor, got {state_map!r}")
        where = {id(p): i for i, p in enumerate(self.params)}
        seen = {id(p) for p in self.params}
        for old, new in old_to_new.items():
            if id(old) not in where:
                raise ValueError("Trainer.replace_parameters.old_to_new: a key is not a parameter this trainer "
                                 f"trains (shape {tuple(getattr(old, 'shape', ()))})")
            if not isinstance(new, nn.Parameter) or not new.requires_grad:
                raise TypeError(f"Trainer.replace_parameters.old_to_new[{self._param_names[where[id(old)]]}]: "
                                f"expected an nn.Parameter that requires a gradient, got {type(new).__name__}")
            if id(new) in seen and new is not old:
                raise ValueError(f"Trainer.replace_parameters.old_to_new[{self._param_names[where[id(old)]]}]: the "
                                 "new parameter is already trained (each parameter once)")
            seen.add(id(new))
        opt = self.optimizer
        for old, new in old_to_new.items():
            st = opt.state.pop(old, None)
            if st and state_map is not None:
                mapped = {}
                for k, v in st.items():
                    if isinstance(v, Tensor) and v.shape == old.shape and v.dim() > 0:
                        v = state_map(k, v, old, new)
                        if not isinstance(v, Tensor) or v.shape != new.shape:
                            raise ValueError(f"Trainer.replace_parameters.state_map: the state {k!r} mapped to "
                                             f"{tuple(getattr(v, 'shape', ()))}, expected the new parameter's shape "
                                             f"{tuple(new.shape)}")
                    mapped[k] = v
                opt.state[new] = mapped
            for g in opt.param_groups:
                g["params"] = [new if q is old else q for q in g["params"]]
            i = where[id(old)]
            self.params[i] = new
        names = {id(p): n for n, p in self.model.named_parameters()}
        self._param_names = [names.get(id(p), f"<parameter {i}>") for i, p in enumerate(self.params)]

    # -- levels (TrainConfig.levels) ------------------------------------------------------------
    def set_level(self, level: int) -> None:
        """Bring the model to level ``level`` of ``TrainConfig.levels`` (its controls'
        pieces, its propagators' :math:`N_t`), the optimizer's state carried by the
        prolongation (:func:`opsplit.control.multilevel.change_level`); :meth:`fit` calls it
        at every level's first step."""
        levels = self.config.levels
        if levels is None:
            raise ValueError("Trainer.set_level: the config has no levels (TrainConfig.levels)")
        level = check_int(level, "Trainer.set_level.level", 0)
        if level >= len(levels):
            raise ValueError(f"Trainer.set_level.level: expected a level in [0, {len(levels) - 1}], got {level}")
        if level == self.level:
            return
        change_level(self.model, levels[level][0], kind=self.config.levels_prolongation, optimizer=self.optimizer,
                     final_n_steps=self._final_n_steps, final_pieces=self._final_pieces)
        self.params[:] = self.optimizer.param_groups[0]["params"]
        names = {id(p): n for n, p in self.model.named_parameters()}
        self._param_names = [names.get(id(p), f"<parameter {i}>") for i, p in enumerate(self.params)]
        self.level = level

    def _sync_level(self) -> None:
        if self.config.levels is not None:
            self.set_level(level_at(self.config.levels, self._total_steps, self.step))

    def _draws(self):
        """``TrainConfig.n_steps`` and its weights at the current level."""
        c = self.config
        if c.levels is None or c.n_steps is None:
            return c.n_steps, c.n_steps_weights
        return level_n_steps(c.n_steps, c.n_steps_weights, c.levels[self.level][0], self._final_pieces)

    def _coarse(self, n):
        """The coarse-solve context of a solve at ``n`` steps (``TrainConfig.coarse_controls``)."""
        if self.config.coarse_controls == "average" and n is not None:
            return coarse_controls(self.model, n)
        return contextlib.nullcontext()

    # -- data ---------------------------------------------------------------------------------
    def _steps_per_epoch(self, n: int) -> int:
        b = self.config.batch_size * self.world_size
        k = n // b if self.config.drop_last else -(-n // b)
        if k == 0:
            raise ValueError(f"train_data: {n} samples give no batch of {b} (batch_size x world_size) with "
                             "drop_last=True")
        return k

    def _epoch_batches(self, n: int, epoch: int):
        c = self.config
        perm = None
        if c.shuffle:
            g = torch.Generator().manual_seed(c.seed * 1_000_003 + epoch)
            perm = torch.randperm(n, generator=g)
        batches = _batches(n, c.batch_size * self.world_size, c.drop_last, perm)
        if self.world_size > 1:
            batches = [b.tensor_split(self.world_size)[self.rank] for b in batches]
        return batches

    def _check_batch(self, data: TensorData) -> None:
        """The model's output on two samples against the targets and the loss."""
        k = min(2, len(data))
        x, y = data[torch.arange(k)]
        was = self.model.training
        self.model.eval()
        try:
            with torch.no_grad():
                with _solve_inputs(self.model) as calls:
                    out = self.objective.select(self.model(x))
                for n in self.config.n_steps or ():
                    self._check_steps_fit(n, calls, k)
                    try:
                        self.model(x, n_steps=n)
                    except TypeError as e:
                        raise TypeError(f"TrainConfig.n_steps: the model's forward must take n_steps= "
                                        f"({type(self.model).__name__}: {e})") from None
                self.objective.check(out, y)
                val = self.objective.data_term(out, y)  # a callable loss fails here, not mid-run
        finally:
            self.model.train(was)
        if not torch.isfinite(val):
            raise ValueError(f"{data.name}: the loss of the untrained model on two samples is {float(val)}")
        t = data.targets
        if self.objective.is_classification and t.numel():
            C = out.shape[-1]
            lo, hi = int(t.min()), int(t.max())
            if lo < 0 or hi >= C:
                raise ValueError(f"{data.name}.targets: loss 'cross_entropy' needs class indices in [0, {C - 1}] "
                                 f"(the model outputs {C} logits), got range [{lo}, {hi}]")

    def _check_steps_fit(self, n: int, calls: list, k: int) -> None:
        """``TrainConfig.n_steps``: refuse, before the first step (and before the model
        is solved at ``n`` steps in :meth:`_check_batch`), an :math:`N_t` whose training step
        cannot fit in memory: the propagators' time grids and, with ``gradient="backprop"``,
        one state of the batch per substep call kept for the backward pass
        (:meth:`opsplit.Propagator._steps_memory`, lower bounds; ``calls``: the
        propagators the model called on ``k`` samples, with their input's bytes and batch)."""
        c = self.config
        need, parts, work = 0.0, [], 0
        for prop, nbytes, batch in calls:  # (a state of the k samples grows to the batch's)
            state = nbytes / k * c.batch_size if batch == k else nbytes
            b, p = prop._steps_memory(n, state, grad=c.gradient == "backprop")
            need, parts, work = need + b, parts + p, work + n * _calls_per_step(prop.scheme)
        check_fits("TrainConfig.n_steps", need,
                   f"N_t = {n} in a training step of batch_size {c.batch_size} ({c.gradient} gradients)",
                   "smaller N_t in n_steps", parts=parts, work=f"{work:.3g} substep calls per step")

    # -- checkpoints --------------------------------------------------------------------------
    def state(self) -> dict:
        """The counters, history and callbacks' states a checkpoint keeps (``meta.json``'s
        ``trainer``)."""
        out = {"step": self.step, "elapsed": self.elapsed, "history": self.history.to_dict(),
               "total_steps": self._total_steps, "world_size": self.world_size}
        if self.level is not None:
            out["level"] = self.level
        states = {k: cb.state_dict() for k, cb in _callback_keys(self.callbacks)}
        states = {k: v for k, v in states.items() if v}
        if states:
            out["callbacks"] = states
        return out

    def save(self, path) -> Path:
        """Write a checkpoint folder (model, optimizer, scheduler, RNG, counters, history)."""
        return save_checkpoint(path, self.model, optimizer=self.optimizer, scheduler=self.scheduler,
                               generator=self.generator, trainer=self.state(), config=self.config.to_dict())

    def load(self, path, *, restore_rng: bool = True, allow_changes=False, total_steps: int | None = None,
             _total_steps: int | None = None):
        """Load a checkpoint (or the latest ``step-*`` one under a run folder) into the
        model, optimizer, scheduler, RNG and counters; refused as a whole if anything differs.

        Refused (:class:`~opsplit.control.CheckpointError`, nothing loaded): another model
        (class, state keys, shapes, or a recorded setting of the map:
        :func:`~opsplit.control.checkpoint_differences`), and a run with other settings
        (:func:`~opsplit.control.config_changes`: learning rate, schedule, samples per step,
        seed, ... — the checkpoint's optimizer would keep its own rates while the config
        reports the new ones).  ``allow_changes`` (``True`` or setting names such as
        ``["lr", "epochs"]``) accepts them: a warning lists them, and the optimizer and
        schedule then follow *this* trainer's config from the resumed step on.
        ``total_steps``: the resumed run's total optimizer steps, compared with the
        checkpoint's when a schedule decays (:meth:`fit` passes its own; ``None``: not
        compared); ``_total_steps`` is its former name."""
        total_steps = _total_steps if total_steps is None else total_steps
        check_path(path, "resume")
        allow = check_allow_changes(allow_changes, "allow_changes")
        p = latest_checkpoint(path)
        if p is None and Path(path).is_dir() and any(Path(path).iterdir()):
            p = Path(path)  # not a complete checkpoint: read_checkpoint says what is wrong
        if p is None:
            raise FileNotFoundError(f"resume: no checkpoint found at {str(path)!r}")
        ck = read_checkpoint(p)
        t = ck.trainer or {}
        _check_run_state(ck)  # the counters, the optimizer and the schedule against each other and the config
        self._load_level(ck, t)
        # another model first (class, keys, shapes, settings of the map), then another run
        plan_model_state(ck, self.model, False)
        refuse_changes(checkpoint_differences(ck, self.model), allow, ck.path)
        run_changes = refuse_changes(
            config_changes(ck.config, self.config, saved_world_size=int(t.get("world_size", 1)),
                           world_size=self.world_size, saved_total_steps=t.get("total_steps"),
                           total_steps=total_steps), allow, ck.path, what="run")
        ck = load_checkpoint(ck, self.model, optimizer=self.optimizer, scheduler=self.scheduler,
                             generator=self.generator, restore_rng=restore_rng, allow_changes=allow)
        self.step = int(t.get("step", 0))
        self.elapsed = float(t.get("elapsed", 0.0))
        self.history = History.from_dict(t.get("history"))
        saved_cb = t.get("callbacks") or {}
        for k, cb in _callback_keys(self.callbacks):
            if k in saved_cb:
                cb.load_state_dict(saved_cb[k])
        ck.changes = list(ck.changes) + run_changes
        if run_changes:
            self._follow_config()
        if ck.changes:
            warnings.warn(f"resume from {str(ck.path)!r}: accepted changed settings: "
                          + "; ".join(map(str, ck.changes))
                          + (" (the optimizer and the schedule follow the new config from here on)"
                             if run_changes else ""), stacklevel=2)
        return ck

    def _load_level(self, ck, t: dict) -> None:
        """A run with ``TrainConfig.levels``: bring the model to the checkpoint's level before
        its tensors are compared and loaded (refused when the checkpoint's run had other
        levels; nothing loaded)."""
        mine = self.config.levels
        saved = (ck.config or {}).get("levels") if isinstance(ck.config, dict) else None
        if mine is None and saved is None:
            return
        mine_l = [list(x) for x in mine] if mine is not None else None
        if saved != mine_l:
            raise CheckpointError(f"checkpoint {str(ck.path)!r}: TrainConfig.levels = {saved} in the checkpoint's run, "
                                  f"{mine_l} in this one; a level schedule cannot change on resume. Nothing was loaded")
        lvl = t.get("level")
        if isinstance(lvl, bool) or not isinstance(lvl, int) or not 0 <= lvl < len(mine):
            raise CheckpointError(f"checkpoint {str(ck.path)!r}: trainer.level = {lvl!r}, expected a level in "
                                  f"[0, {len(mine) - 1}] of TrainConfig.levels. Nothing was loaded")
        self.set_level(lvl)

    def _follow_config(self) -> None:
        """Set the optimizer's rates and the schedule's base rate from ``self.config``
        (after a resume that accepted a changed config)."""
        c = self.config
        factor = self._lr_factor(self.scheduler.last_epoch)
        self.scheduler.base_lrs = [c.lr for _ in self.optimizer.param_groups]
        for g in self.optimizer.param_groups:
            g["initial_lr"], g["lr"], g["weight_decay"] = c.lr, c.lr * factor, c.weight_decay
            if "betas" in g:
                g["betas"] = tuple(c.betas)
            if "momentum" in g:
                g["momentum"] = c.momentum
        self.scheduler._last_lr = [g["lr"] for g in self.optimizer.param_groups]

    def _save_step(self, out_dir: Path):
        ck = out_dir / "checkpoints"
        self.save(ck / f"step-{self.step:08d}")
        olds = sorted(p for p in ck.iterdir() if p.is_dir() and p.name.startswith("step-"))
        for p in olds[:-self.config.keep_checkpoints]:
            shutil.rmtree(p, ignore_errors=True)

    # -- evaluation -----------------------------------------------------------------------------
    @torch.no_grad()
    def evaluate(self, data, *, n_steps: int | None = None, grid=None, batch_size: int | None = None) -> dict:
        """Mean data loss and metrics over ``data`` (``accuracy`` for cross-entropy, ``mse``
        for MSE, and ``metrics``), with the model in eval mode, optionally at another
        :math:`N_t` (``n_steps``) or grid (passed to the model's forward)."""
        data = as_dataset(data, "eval_data")
        bs = check_int(batch_size, "Trainer.evaluate.batch_size", 1, allow_none=True)
        bs = self.config.eval_batch_size if bs is None else bs
        kw = {}
        if n_steps is not None:
            kw["n_steps"] = _check_eval_n_steps(n_steps)
            if self.config.coarse_controls == "average":
                check_coarse(self.model, kw["n_steps"], "Trainer.evaluate.n_steps")
        if grid is not None:
            kw["grid"] = grid
        was = self.model.training
        self.model.eval()
        tot, correct, positions, sq, n = 0.0, 0, 0, 0.0, 0
        outs, tgts = [], []
        try:
            for idx in _batches(len(data), bs, False, None):
                x, y = data[idx]
                with self._coarse(kw.get("n_steps")):
                    out = self.objective.select(self.model(x, **kw))
                b = x.shape[0]
                tot += float(self.objective.data_term(out, y)) * b
                if self.objective.is_classification:  # (per position of sequence logits)
                    correct += int((out.argmax(-1) == y).sum())
                    positions += y.numel()
                elif self.objective.loss == "mse":
                    sq += float((out - y).square().mean()) * b
                if self.metrics:
                    outs.append(out)
                    tgts.append(y)
                n += b
        finally:
            self.model.train(was)
        res = {"loss": tot / n}
        if self.objective.is_classification:
            res["accuracy"] = correct / positions
        elif self.objective.loss == "mse":
            res["mse"] = sq / n
        if self.metrics:
            O, Y = torch.cat(outs), torch.cat(tgts)
            for k, fn in self.metrics.items():
                res[k] = float(fn(O, Y))
        return res

    # -- training -------------------------------------------------------------------------------
    def fit(self, train_data, eval_data=None, *, out_dir=None, resume=None, plot: bool = True,
            allow_changes=False) -> History:
        """Train; returns the :class:`~opsplit.control.History` (also ``self.history``).

        Args:
            train_data, eval_data: :class:`~opsplit.data.TensorData` or ``(inputs, targets)``.
            out_dir: a folder for ``checkpoints/step-*`` (every ``save_every`` steps and at
                the end), ``steps.csv``, ``epochs.csv`` and (``plot``) ``curves.png``;
                checked before the first step (:func:`check_out_dir`).
            resume: a checkpoint folder (or a run folder: its latest checkpoint) to continue.
            allow_changes: settings that may differ from the resumed checkpoint's
                (:meth:`load`); default none.

        Raises ``FloatingPointError`` (and stops before the optimizer step, writing nothing)
        when the objective or the gradient is NaN/inf, naming the parameters whose gradient
        is not finite; in a data-parallel run every rank stops at the same step.
        """
        c = self.config
        train = as_dataset(train_data, "train_data")
        evald = as_dataset(eval_data, "eval_data") if eval_data is not None else None
        check_bool(plot, "Trainer.fit.plot")
        allow = check_allow_changes(allow_changes, "Trainer.fit.allow_changes")
        n = len(train)
        if self.world_size > 1 and not c.drop_last:
            raise ValueError("TrainConfig.drop_last: expected True with world_size > 1 (every process needs a "
                             "non-empty slice of every global batch)")
        check_data_parallel(self.rank, self.world_size, self.model, self.forward_model)
        # everything that can refuse the run, before the first step; in a data-parallel run
        # every rank stops if one refuses (instead of waiting in the first all-reduce)
        err, previous, out = None, None, None
        try:
            spe = self._steps_per_epoch(n)
            self._total_steps = min(c.max_steps, spe * c.epochs) if c.max_steps else spe * c.epochs
            self._check_batch(train)
            if evald is not None:
                self._check_batch(evald)
            if out_dir is not None and self.rank == 0:
                out = check_out_dir(out_dir, "Trainer.fit.out_dir")
            previous = set_gradient_mode(self.model, c.gradient, checkpoint_every=c.checkpoint_every,
                                         snapshots=c.checkpoint_snapshots)
            check_flow_costs(self.objective, self.model)
            k = min(2, n)
            check_objective(self.objective, self.model, *train[torch.arange(k)])  # J finite before step 0
            for name in c.solvers or ():
                with solved_with(self.model, solver=name):  # refuses a solver that cannot run a term
                    pass
            if resume is not None:
                self.load(resume, allow_changes=allow, total_steps=self._total_steps)
            else:
                torch.manual_seed(c.seed)
                self.generator.manual_seed(c.seed)
            self._sync_level()
        except Exception as e:
            err = e
        refused = any_rank([err is not None], self._device())[0] if self.world_size > 1 else err is not None
        if refused:
            if previous is not None:
                restore_gradient_mode(previous)
            if err is not None:
                raise err
            raise ValueError("Trainer.fit: another rank refused to start (its error says why); every rank stops "
                             "before the first step")
        try:
            self._loop(train, evald, spe, out)
        finally:
            restore_gradient_mode(previous)
        if out is not None:
            self.history.save_csv(out)
            if plot:
                self.history.plot(out / "curves.png")
        return self.history

    def _device(self):
        return self.params[0].device

    def _loop(self, train: TensorData, evald, spe: int, out: Path | None):
        c = self.config
        bar = None
        if c.progress and self.rank == 0:
            bar = tqdm(total=self._total_steps, initial=self.step, desc="train", leave=False, dynamic_ncols=True)
        dev = next(iter(self.params)).device
        if dev.type == "cuda":
            torch.cuda.reset_peak_memory_stats(dev)
        self.model.train()
        self.should_stop = False
        for cb in self.callbacks:
            cb.on_fit_start(self)
        try:
            while self.step < self._total_steps and not self.should_stop:
                epoch, offset = divmod(self.step, spe)
                batches = self._epoch_batches(len(train), epoch)
                t_ep = time.perf_counter()
                for idx in batches[offset:]:
                    if self.step >= self._total_steps or self.should_stop:
                        break
                    self._sync_level()
                    row = self._step(train, idx, epoch)
                    if bar is not None:
                        bar.update(1)
                        bar.set_postfix(loss=f"{row['loss']:.4g}", epoch=epoch)
                    if out is not None and c.save_every and self.step % c.save_every == 0:
                        self._save_step(out)
                last = self.step >= self._total_steps or self.should_stop
                epoch_done = self.step % spe == 0 or last
                if epoch_done and ((epoch + 1) % c.eval_every == 0 or last):
                    erow = {"epoch": epoch, "step": self.step,
                            "train_loss": _mean(r["loss"] for r in self.history.steps if r["epoch"] == epoch),
                            "epoch_time": time.perf_counter() - t_ep,
                            "peak_mem_mb": peak_memory_mb(dev)}
                    if evald is not None:
                        for k, v in self.evaluate(evald).items():
                            erow[f"eval_{k}"] = v
                    erow["time"] = self.elapsed
                    self.history.epochs.append(erow)
                    if bar is not None and evald is not None:
                        bar.write(f"epoch {epoch}: " + ", ".join(f"{k}={v:.4g}" for k, v in erow.items()
                                                                  if k.startswith("eval_")))
                    self._call("on_evaluate", erow)
        finally:
            if bar is not None:
                bar.close()
        for cb in self.callbacks:
            cb.on_fit_end(self)
        if out is not None:
            self._save_step(out)

    def _call(self, hook: str, row: dict) -> None:
        """Call ``hook(self, row)`` of every callback; one returning ``True`` stops the run."""
        for cb in self.callbacks:
            if getattr(cb, hook)(self, row) is True:
                self.should_stop = True

    def train_step(self, data, indices=None) -> dict:
        """One optimizer step on the samples ``indices`` of ``data`` (all of them when
        ``None``), as :meth:`fit` takes it: augmentation, the config's :math:`N_t` and solver
        draws, objective, backward pass, clipping, optimizer and schedule step, the callbacks'
        ``on_step_start`` / ``on_step_end``; ``self.step`` counts it and its row (returned)
        is appended to ``self.history.steps``.  The model's train/eval flag and gradient mode
        are left as they are (:meth:`fit` sets ``model.train()`` and ``config.gradient``).

        Args:
            data: a :class:`~opsplit.data.TensorData` or ``(inputs, targets)``.
            indices: a 1-D integer tensor (or list) of sample indices into ``data``.
        """
        data = as_dataset(data, "Trainer.train_step.data")
        n = len(data)
        if indices is None:
            idx = torch.arange(n)
        else:
            idx = torch.as_tensor(indices) if isinstance(indices, (list, tuple, Tensor)) else None
            if idx is None or idx.dim() != 1 or idx.numel() == 0 or idx.is_floating_point() or idx.dtype == torch.bool:
                raise TypeError(f"Trainer.train_step.indices: expected a non-empty 1-D integer tensor or list of "
                                f"sample indices, got {indices!r}")
            if int(idx.min()) < 0 or int(idx.max()) >= n:
                raise ValueError(f"Trainer.train_step.indices: expected indices in [0, {n - 1}] (data has {n} "
                                 f"samples), got range [{int(idx.min())}, {int(idx.max())}]")
        return self._step(data, idx, None)

    def _step(self, train: TensorData, idx: Tensor, epoch: int | None) -> dict:
        for cb in self.callbacks:
            cb.on_step_start(self)
        t0 = time.perf_counter()
        row = self._optimizer_step(train, idx)
        self.step += 1
        self.elapsed += time.perf_counter() - t0
        row.update(step=self.step, **({} if epoch is None else {"epoch": epoch}), time=self.elapsed)
        self.history.steps.append(row)
        self._call("on_step_end", row)
        return row

    def _optimizer_step(self, train: TensorData, idx: Tensor) -> dict:
        c = self.config
        x, y = train[idx]
        if self.augment is not None:
            x = self.augment(x, self.generator)
        kw = {}
        draws, weights = self._draws()
        if draws is not None:
            kw["n_steps"] = draw_n_steps(draws, weights, self.generator)
        solver = None
        if c.solvers is not None and not c.solvers_split:
            solver = draw_solver(c.solvers, c.solvers_weights, self.generator)
            if solver == _own_solver(self.model):
                solver = None  # the model's own solver: nothing to swap
        self.optimizer.zero_grad(set_to_none=True)
        if c.n_steps_distill and draws is not None and kw["n_steps"] < max(draws):
            kw.update(teacher=self._teacher(x, max(draws)), distill_weight=c.n_steps_distill)
        with self._coarse(kw.get("n_steps")):
            if c.solvers_split:  # (a consistent config holds solvers with it)
                val = self._split_objective(x, y, kw)
            else:
                with solved_with(self.model, solver=solver) if solver is not None else contextlib.nullcontext():
                    val = self.objective(self.forward_model, x, y, costs_model=self.model, **kw)
        loss_ok = bool(torch.isfinite(val.total))
        if not loss_ok and self.world_size == 1:
            raise FloatingPointError(f"step {self.step}: the objective is {float(val.total)}; lower the "
                                     "learning rate or clip the gradients (TrainConfig.grad_clip)")
        val.total.backward()  # (data-parallel: every rank joins the gradient all-reduce, then all stop)
        total = _total_norm([p.grad for p in self.params if p.grad is not None])
        grad_ok = bool(torch.isfinite(total))
        if self.world_size > 1:
            loss_bad, grad_bad = any_rank([not loss_ok, not grad_ok], self._device())
            if loss_bad:
                self.optimizer.zero_grad(set_to_none=True)
                raise FloatingPointError(
                    f"step {self.step}: the objective is NaN/inf on "
                    f"{'this rank' if not loss_ok else 'another rank'} ({float(val.total.detach())} here); every rank "
                    "stops before the optimizer step. Lower the learning rate or clip the gradients "
                    "(TrainConfig.grad_clip)")
            grad_ok = not grad_bad
        if not grad_ok:
            self._refuse_gradient(float(val.total.detach()), float(total))
        if c.grad_clip is not None:
            _clip(self.params, c.grad_clip, total)
        gn = float(total)
        lr = self.optimizer.param_groups[0]["lr"]
        self.optimizer.step()
        self.scheduler.step()
        row = val.as_floats()
        row.update(lr=lr, grad_norm=gn)
        if "n_steps" in kw:
            row["n_steps"] = kw["n_steps"]
        if self.level is not None:
            row["level"] = self.level
        if solver is not None:
            row["solver"] = solver
        return row

    @torch.no_grad()
    def _teacher(self, x, n: int) -> Tensor:
        """The model's outputs at the finest :math:`N_t` of the draws, with its own solver and
        no gradient: the targets of self-distillation (``TrainConfig.n_steps_distill``)."""
        with self._coarse(n):
            return self.objective.select(self.forward_model(x, n_steps=n)).detach()

    def _split_objective(self, x, y, kw) -> ObjectiveValue:
        """``TrainConfig.solvers_split``: the batch in consecutive parts, part i solved
        with ``solvers[i]`` (:func:`~opsplit.control.resolution.split_sizes`), the
        objective their mean weighted by the windows of each (the mean over the batch), or
        by ``solvers_split_weights`` (normalised over the parts that have windows)."""
        c = self.config
        n = len(y)
        own = _own_solver(self.model)
        fixed = c.solvers_split_weights
        values, shares, start = [], [], 0
        for i, (name, m) in enumerate(zip(c.solvers, split_sizes(n, c.solvers, c.solvers_weights))):
            if m == 0:  # a short last batch of an epoch
                continue
            part = slice(start, start + m)
            start += m
            kp = dict(kw, teacher=kw["teacher"][part]) if kw.get("teacher") is not None else kw
            with solved_with(self.model, solver=name) if name != own else contextlib.nullcontext():
                values.append(self.objective(self.forward_model, x[part], y[part], costs_model=self.model, **kp))
            shares.append(m / n if fixed is None else fixed[i])
        if fixed is not None:
            total = sum(shares)
            shares = [s / total for s in shares]
        return ObjectiveValue.mixture(values, shares)

    def _refuse_gradient(self, loss: float, norm: float):
        """Stop before the optimizer step on a non-finite gradient, naming the parameters."""
        bad = [n for n, p in zip(self._param_names, self.params)
               if p.grad is not None and not bool(torch.isfinite(p.grad).all())]
        self.optimizer.zero_grad(set_to_none=True)
        if bad:
            what = (f"the gradient of {', '.join(bad[:8])}{f' (and {len(bad) - 8} more)' if len(bad) > 8 else ''} "
                    "holds NaN/inf")
        else:
            what = f"the gradients are finite but their global norm overflows ({norm})"
        hint = ("a finite objective with a non-finite gradient is usually a point where the model is not "
                "differentiable (sqrt(|p|) or |p|^a with a < 1 at p = 0, the norm of a zero vector, ...): change "
                "the model there (gradient clipping cannot repair it: it scales every gradient by inf/inf = NaN); "
                "if instead the parameters have grown until the backward pass overflows, lower the learning rate"
                ) if bad else "rescale the objective or the parameters (float32 overflows at 3.4e38)"
        raise FloatingPointError(
            f"step {self.step}: {what}, at a finite objective {loss:.6g}; the optimizer step was not taken and the "
            f"parameters are those before this step (nothing is written). {hint[0].upper()}{hint[1:]}")
