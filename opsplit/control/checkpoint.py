r"""Checkpoints that lose nothing: controls, optimizer, scheduler, RNG states and the step
counter, with the grid, scheme, :math:`N_t` and control types as metadata.

A checkpoint is a folder::

    step-000120/
        state.safetensors   every tensor (safetensors: no pickle, no code execution)
        meta.json           versioned metadata (schema: checkpoint_schema.json)

Tensor names: ``model.<state_dict key>``, ``optimizer.<param index>.<state key>``,
``rng.torch_cpu``, ``rng.cuda.<i>``, ``rng.generator``, ``rng.numpy``.  ``meta.json``
records the schema name and version, the SHA-256 and size of ``state.safetensors``, the
shape and dtype of every tensor, the model (class, state keys, every propagator's
:math:`N_t`, :math:`[t_0, T]`, grid and scheme, every control's type and time
interval), the optimizer's parameter groups and non-tensor state, the scheduler state, the
Python and NumPy RNG states, the trainer's counters and history, and the run's config.

**The metadata is covered by a digest**: the header of ``state.safetensors`` records the
SHA-256 of ``meta.json`` (:func:`meta_digest`: its canonical JSON, every entry but
``tensors_sha256`` and ``tensors_bytes``, which the tensor file's own SHA-256 checks), so a
hand edit of either file is refused on reading; a re-indented ``meta.json`` is not (the
digest is of the JSON values).  Checkpoints written before the digest have none and are
read as before.

**Writing is atomic**: the folder is written under a temporary name and renamed when
complete, so a process killed while saving leaves no folder that looks like a checkpoint.

**Reading validates everything before anything is applied** (:func:`load_checkpoint`):
``meta.json`` must parse and follow the schema (its version must be one this opsplit
reads); the tensor file must have the recorded size and SHA-256 (a flipped bit or a
truncation is refused) and hold exactly the recorded tensors; the model must have the same
class and state keys (a checkpoint of another model is refused, naming the differences);
shapes must match, or, with ``resample=True``, differ only where a control is resampled as
a function (below); every tensor must be of the model's kind (an integer tensor for a
floating parameter is refused, never cast; float64 into float32 is a cast, as
``load_state_dict``'s); the weights and the optimizer state must be finite (what
:func:`save_checkpoint` refuses to write is refused on reading: NaN/inf weights, an
``exp_avg_sq`` of inf; ``allow_nonfinite=True`` on both sides writes and reads them); the
trainer's counters must be in range (``trainer.step >= 0``, by the schema); the optimizer
and scheduler must be of the recorded classes with the same parameter groups, their recorded
settings in range (finite ``lr``, ``eps > 0``, ``betas`` in [0, 1), ``weight_decay >= 0``;
Adam's ``step`` an integer >= 1, its squared averages >= 0; ``last_epoch >= 0``) and the
schedule's rates those of the groups (``base_lrs == initial_lr``, ``_last_lr == lr``);
:meth:`~opsplit.control.Trainer.load` also checks the counters against each other and the
groups against the run's config.  Only then is the state applied; should applying fail midway, the
previous model / optimizer / scheduler / RNG state is restored.  Every refusal is a
:class:`CheckpointError` (a ``ValueError``) that says what differs.

**Another resolution** (``resample=True``): a control stored with another number of time
rows (a model trained at :math:`N_t = 4` loaded into one built at :math:`N_t = 8`, or
another control kind) is projected in :math:`L^2(t_0, T)`
(:func:`opsplit.controls.projection.project_time`: refinement is exact); a control whose
spatial axes (``Control.axes``: x, y, h) have other node counts is interpolated
piecewise-linearly between the grids' nodes (:meth:`opsplit.grid.Interval.interpolation_matrix`;
both grids must fix the domain length — with ``L = N`` the domain itself changes with
:math:`N` and nothing can be resampled).  Controls given as functions of space (cosine or
polynomial series) need no spatial resampling: their coefficients are grid-independent.
The optimizer state of a resampled model cannot be carried over: load with
``optimizer=None`` (a fresh optimizer) in that case.

The parts live in modules of their own: the metadata and its digest
(:mod:`~opsplit.control.checkpoint_meta`), reading (:mod:`~opsplit.control.checkpoint_read`),
the differences of settings (:mod:`~opsplit.control.checkpoint_diff`), resampling
(:mod:`~opsplit.control.checkpoint_resample`) and the optimizer, scheduler and RNG states
(:mod:`~opsplit.control.checkpoint_state`); this module writes and loads, and every public
name of those is importable from here.
"""

from __future__ import annotations

import copy
import datetime
import json
import os
import shutil
from pathlib import Path

import safetensors.torch as st
import torch
from torch import Tensor, nn

from .._checks import check_bool
from .._files import sha256_of
from .checkpoint_diff import (
    SettingChange,
    check_allow_changes,
    checkpoint_differences,
    refuse_changes,
)
from .checkpoint_meta import (
    META_DIGEST_KEY,
    META_FILE,
    TENSORS_FILE,
    CheckpointError,
    jsonable,
    meta_digest,
    model_metadata,
    module_settings,
    nonfinite_tensors,
    opsplit_version,
)
from .checkpoint_read import Checkpoint, latest_checkpoint, read_checkpoint
from .checkpoint_resample import plan_model_state
from .checkpoint_state import (
    apply_rng,
    check_scheduler,
    current_rng,
    optimizer_parts,
    plan_optimizer,
    rng_parts,
    rng_state_of,
)
from .paths import check_out_dir
from .schema import SCHEMA_NAME, SCHEMA_VERSION, validate

__all__ = [
    "CheckpointError",
    "Checkpoint",
    "save_checkpoint",
    "load_checkpoint",
    "nonfinite_tensors",
    "read_checkpoint",
    "model_metadata",
    "module_settings",
    "checkpoint_differences",
    "check_allow_changes",
    "refuse_changes",
    "SettingChange",
    "latest_checkpoint",
    "TENSORS_FILE",
    "META_FILE",
    "META_DIGEST_KEY",
    "meta_digest",
]


def save_checkpoint(path, model: nn.Module, *, optimizer=None, scheduler=None, generator=None,
                    trainer: dict | None = None, config: dict | None = None, rng: bool = True,
                    allow_nonfinite: bool = False) -> Path:
    """Write a checkpoint folder at ``path`` (atomically; an existing one is replaced).

    Args:
        path: the checkpoint folder.
        model: the (unwrapped) model; its full ``state_dict``.
        optimizer, scheduler: optional; their full state.
        generator: the trainer's ``torch.Generator`` (data augmentation), saved with the
            global torch / CUDA / NumPy / Python RNG states when ``rng`` is true.
        trainer: the trainer's counters and history (JSON-serialisable dict).
        config: the run's configuration (JSON-serialisable dict).
        allow_nonfinite: write the checkpoint even if a parameter or buffer of ``model``, or
            a tensor of the optimizer's state, holds NaN/inf (default: refused with a
            ``ValueError`` naming them, nothing written: a diverged model is not a
            checkpoint to resume from; :func:`load_checkpoint` refuses them likewise).
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"save_checkpoint.model: expected an nn.Module, got {type(model).__name__}")
    path = check_out_dir(path, "save_checkpoint.path")
    if not allow_nonfinite:
        bad = nonfinite_tensors(model)
        if bad:
            raise ValueError(
                f"save_checkpoint.model: {', '.join(bad[:6])}{' ...' if len(bad) > 6 else ''} hold(s) NaN/inf; a "
                f"checkpoint with non-finite weights is not written ({str(path)!r}; pass allow_nonfinite=True "
                "to write it anyway)")
    tensors: dict[str, Tensor] = {}
    for k, v in model.state_dict().items():
        tensors[f"model.{k}"] = v
    opt_meta = None
    if optimizer is not None:
        t, opt_meta = optimizer_parts(optimizer)
        bad = [] if allow_nonfinite else nonfinite_tensors(t)
        if bad:
            raise ValueError(
                f"save_checkpoint.optimizer: its state {', '.join(bad[:6])}{' ...' if len(bad) > 6 else ''} "
                f"hold(s) NaN/inf; a checkpoint with non-finite optimizer state is not written ({str(path)!r}; "
                "pass allow_nonfinite=True to write it anyway)")
        tensors.update(t)
    sched_meta = None
    if scheduler is not None:
        sched_meta = {"class": type(scheduler).__name__, "state": jsonable(
            {k: v for k, v in scheduler.state_dict().items() if k != "lr_lambdas"})}
    rng_meta = {"python": None, "numpy": None}
    if rng:
        t, rng_meta = rng_parts(generator)
        tensors.update(t)
    # safetensors wants contiguous tensors that share no memory
    tensors = {k: v.detach().to("cpu").clone().contiguous() for k, v in tensors.items()}
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    try:
        tfile = tmp / TENSORS_FILE
        meta = {
            "schema": SCHEMA_NAME,
            "schema_version": SCHEMA_VERSION,
            "opsplit_version": opsplit_version(),
            "torch_version": torch.__version__,
            "created": datetime.datetime.now(datetime.timezone.utc).isoformat(),
            "tensors_file": TENSORS_FILE,
            "tensors_sha256": None,
            "tensors_bytes": None,
            "tensors": {k: {"shape": list(v.shape), "dtype": str(v.dtype).replace("torch.", "")}
                        for k, v in tensors.items()},
            "model": model_metadata(model),
            "optimizer": opt_meta,
            "scheduler": sched_meta,
            "rng": rng_meta,
            "trainer": jsonable(trainer) if trainer is not None else None,
            "config": jsonable(config) if config is not None else None,
        }
        # the metadata's digest goes into the tensor file (whose SHA-256 goes into the metadata):
        # an edit of meta.json, or of state.safetensors, is then refused on reading
        st.save_file(tensors, str(tfile), metadata={META_DIGEST_KEY: meta_digest(json.loads(json.dumps(meta)))})
        meta["tensors_sha256"], meta["tensors_bytes"] = sha256_of(tfile), tfile.stat().st_size
        validate(meta)
        with open(tmp / META_FILE, "w") as fh:
            json.dump(meta, fh, indent=1)
            fh.flush()
            os.fsync(fh.fileno())
        if path.exists():
            old = path.with_name(f".{path.name}.old-{os.getpid()}")
            os.replace(path, old)
            os.replace(tmp, path)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return path


def _apply(model, optimizer, scheduler, generator, model_state, opt_state, sched_state, rng_state) -> None:
    """Load the given states (``None``: that part left as it is)."""
    with torch.no_grad():
        model.load_state_dict(model_state, strict=True)
    if opt_state is not None:
        optimizer.load_state_dict(opt_state)
    if sched_state is not None:
        scheduler.load_state_dict(sched_state)
    if rng_state is not None:
        apply_rng(rng_state, generator)


def load_checkpoint(path, model: nn.Module, *, optimizer=None, scheduler=None, generator=None,
                    resample: bool = False, restore_rng: bool = True, allow_changes=False,
                    allow_nonfinite: bool = False) -> Checkpoint:
    """Load a checkpoint folder (or a :class:`Checkpoint` read by :func:`read_checkpoint`)
    into ``model`` (and ``optimizer``, ``scheduler``, the RNGs).

    Everything is read and checked first (module docstring); the state is applied only
    when every check passed, and restored if applying fails.  Returns the
    :class:`Checkpoint` (its ``trainer`` counters/history and ``config``).

    Args:
        resample: accept controls stored at another :math:`N_t`, control kind or spatial
            resolution, resampled as functions of :math:`t, x, y` (not with an optimizer).
        restore_rng: restore the torch / CUDA / NumPy / Python RNG states and ``generator``.
        allow_changes: the recorded settings that may differ between the checkpoint's model
            and ``model`` (:func:`checkpoint_differences`: ``t1``, ``scheme``, ``causal``,
            ``activation``, ...): ``False`` (default: any difference is refused, naming
            it), ``True`` (a deliberate transfer of the weights to another model), or a
            collection of setting names.  The accepted differences are in the returned
            checkpoint's ``changes``.
        allow_nonfinite: load weights or optimizer state that hold NaN/inf (default: refused,
            naming them, as :func:`save_checkpoint` refuses to write them).
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"load_checkpoint.model: expected an nn.Module, got {type(model).__name__}")
    allow = check_allow_changes(allow_changes, "load_checkpoint.allow_changes")
    check_bool(allow_nonfinite, "load_checkpoint.allow_nonfinite")
    ckpt = path if isinstance(path, Checkpoint) else read_checkpoint(path)
    state, resampled = plan_model_state(ckpt, model, resample, allow_nonfinite)
    accepted = refuse_changes(checkpoint_differences(ckpt, model, resample=resample), allow, ckpt.path)
    opt_state = None
    if optimizer is not None:
        if resampled:
            raise CheckpointError(
                f"checkpoint {str(ckpt.path)!r}: controls were resampled ({resampled[0]!r}, ...); their "
                "optimizer state cannot be carried over: load with optimizer=None"
            )
        opt_state = plan_optimizer(ckpt, optimizer, allow_nonfinite)
    sched_state = None
    if scheduler is not None:
        sm = ckpt.meta["scheduler"]
        if sm is None or sm["class"] != type(scheduler).__name__:
            raise CheckpointError(f"checkpoint {str(ckpt.path)!r}: scheduler "
                                  f"{None if sm is None else sm['class']}, given {type(scheduler).__name__}")
        sched_state = dict(sm["state"])
        om = ckpt.meta.get("optimizer")
        check_scheduler(ckpt.path, sched_state, om["param_groups"] if om is not None and optimizer is not None
                         else None)
        own = scheduler.state_dict()
        for k in own:
            if k not in sched_state and k != "lr_lambdas":
                raise CheckpointError(f"scheduler: state key {k!r} missing from the checkpoint")
        if "lr_lambdas" in own:
            sched_state["lr_lambdas"] = own["lr_lambdas"]
    rng_state = rng_state_of(ckpt) if restore_rng else None

    # -- apply (with a backup of everything it touches) --
    backup_model = {k: v.detach().clone() for k, v in model.state_dict().items()}
    backup_opt = copy.deepcopy(optimizer.state_dict()) if optimizer is not None else None
    backup_sched = copy.deepcopy(scheduler.state_dict()) if scheduler is not None else None
    backup_rng = current_rng(generator) if restore_rng else None
    try:
        _apply(model, optimizer, scheduler, generator, state, opt_state, sched_state, rng_state)
    except Exception as e:
        _apply(model, optimizer, scheduler, generator, backup_model, backup_opt, backup_sched, backup_rng)
        raise CheckpointError(f"checkpoint {str(ckpt.path)!r}: applying the state failed ({e}); the previous "
                              "state was restored") from e
    ckpt.resampled = resampled
    ckpt.changes = accepted
    return ckpt
