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
"""

from __future__ import annotations

import copy
import datetime
import hashlib
import json
import math
import os
import random
import re
import shutil
from pathlib import Path
from typing import NamedTuple

import numpy as np
import torch
from torch import Tensor, nn

from .._files import sha256_of
from ..controls import Control
from ..controls.projection import TIME_CONTROLS, project_time, time_rows
from ..grid import Grid, Interval
from ..propagator import Propagator
from .paths import check_out_dir, check_path
from .schema import SCHEMA_NAME, SCHEMA_VERSION, SchemaError, validate

__all__ = [
    "CheckpointError",
    "save_checkpoint",
    "load_checkpoint",
    "nonfinite_tensors",
    "read_checkpoint",
    "model_metadata",
    "module_settings",
    "checkpoint_differences",
    "SettingChange",
    "latest_checkpoint",
    "TENSORS_FILE",
    "META_FILE",
    "meta_digest",
]

TENSORS_FILE = "state.safetensors"
META_FILE = "meta.json"
#: the key, in the tensor file's header metadata, of the SHA-256 of ``meta.json``
META_DIGEST_KEY = "opsplit.meta_sha256"
#: the entries of ``meta.json`` its digest leaves out: they describe the tensor file that holds
#: the digest (and are checked against it)
_UNDIGESTED = ("tensors_sha256", "tensors_bytes")


def meta_digest(meta: dict) -> str:
    """The SHA-256 of a checkpoint's metadata (``meta.json`` as a dict) without
    ``tensors_sha256`` and ``tensors_bytes``, over its canonical JSON (sorted keys)."""
    body = {k: v for k, v in meta.items() if k not in _UNDIGESTED}
    return hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def _header_metadata(data: bytes) -> dict:
    """The ``__metadata__`` of a safetensors file's header (``{}`` if none or unreadable)."""
    try:
        n = int.from_bytes(data[:8], "little")
        header = json.loads(data[8:8 + n])
        md = header.get("__metadata__") if isinstance(header, dict) else None
        return md if isinstance(md, dict) else {}
    except (ValueError, UnicodeDecodeError):
        return {}


class CheckpointError(ValueError):
    """A checkpoint that cannot be read or does not fit what it is loaded into."""


def _need_safetensors():
    try:
        import safetensors.torch as st
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise ImportError(
            "opsplit checkpoints need the 'safetensors' package: pip install 'opsplit[train]'"
        ) from e
    return st


# -- metadata ---------------------------------------------------------------------------------
def _interval_meta(itv: Interval | None):
    if itv is None:
        return None
    return {"n": itv.n, "length": itv.length, "spacing": itv.spacing, "rule": itv.rule}


def _grid_meta(grid: Grid) -> dict:
    return {"x": _interval_meta(grid.x), "y": _interval_meta(grid.y), "h": _interval_meta(grid.h)}


def _scheme_meta(scheme) -> dict:
    subs = []
    for s in scheme.substeps:
        terms = getattr(s, "terms", None)
        subs.append(
            {
                "terms": [type(t).__name__ for t in terms] if terms is not None else [type(s).__name__],
                "solver": repr(getattr(s, "solver", None)),
            }
        )
    return {
        "class": type(scheme).__name__,
        "order": int(scheme.order),
        "effective_order": int(scheme.effective_order),
        "substeps": subs,
    }


def _control_meta(c: Control) -> dict:
    d: dict = {"class": type(c).__name__, "axes": list(c.axes)}
    if isinstance(c, TIME_CONTROLS):
        d.update(t0=float(c.t0), t1=float(c.t1), rows=int(time_rows(c).shape[0]),
                 positive=bool(getattr(c, "positive", False)))
        d["parameter"] = "raw" if hasattr(c, "raw") else "coefficients"
        if hasattr(c, "basis"):
            d["basis"] = c.basis
    elif getattr(c, "t0", None) is not None and getattr(c, "t1", None) is not None:
        d.update(t0=float(c.t0), t1=float(c.t1))
    return d


def model_metadata(model: nn.Module) -> dict:
    """The model part of ``meta.json``: class, state keys, propagators, controls."""
    props = {}
    for name, m in model.named_modules():
        if isinstance(m, Propagator):
            props[name] = {
                "class": type(m).__name__,
                "n_steps": int(m.n_steps),
                "t0": float(m.t0),
                "t1": float(m.t1),
                "grid": _grid_meta(m.grid),
                "scheme": _scheme_meta(m.scheme),
            }
    controls = {name: _control_meta(m) for name, m in model.named_modules(remove_duplicate=False) if isinstance(m, Control)}
    return {
        "class": f"{type(model).__module__}.{type(model).__qualname__}",
        "state": list(model.state_dict().keys()),
        "propagators": props,
        "controls": controls,
        "settings": module_settings(model),
    }


#: attributes that say how a map is computed, trained or decoded, not which map it is
#: (gradient modes, memory, batching, dropout, the token ids ``generate`` stops and pads
#: with): never compared
_NOT_SETTINGS = frozenset({"training", "checkpoint_every", "checkpoint_snapshots", "batch", "dropout", "p",
                           "inplace", "gradient_checkpointing", "n_evals", "generation_defaults"})


def _setting_value(v, depth: int = 0):
    """A JSON value for a module attribute that fixes the map, or ``_SKIP``."""
    from ..solvers.base import Solver

    if v is None or isinstance(v, (bool, int, str)):
        return v
    if isinstance(v, float):
        return v if math.isfinite(v) else repr(v)
    if depth > 3:
        return _SKIP
    if isinstance(v, (tuple, list)):
        out = [_setting_value(x, depth + 1) for x in v]
        return _SKIP if any(x is _SKIP for x in out) else out
    if isinstance(v, dict):
        out = {str(k): _setting_value(x, depth + 1) for k, x in v.items()}
        return _SKIP if any(x is _SKIP for x in out.values()) else out
    if isinstance(v, Solver):
        d = {"class": type(v).__name__}
        for k, x in sorted(vars(v).items()):
            if k.startswith(("_", "adjoint")) or k in _NOT_SETTINGS:
                continue  # the adjoint's settings change the gradient, not the map
            x = _setting_value(x, depth + 1)
            if x is not _SKIP:
                d[k] = x
        return d
    if isinstance(v, (Tensor, nn.Module, torch.dtype, torch.device, Grid)):
        return _SKIP  # tensors are state; child modules have their own entry; grids: the propagators'
    if callable(v):
        return f"{getattr(v, '__module__', '?')}.{getattr(v, '__qualname__', type(v).__qualname__)}"
    return _SKIP


_SKIP = object()


def module_settings(model: nn.Module) -> dict:
    """``{module name: {"class": ..., attribute: value}}`` for every module of ``model`` that
    is neither a control (its time interval and kind are in ``controls``) nor a propagator
    (``propagators``): the public attributes that are numbers, strings, booleans, lists of
    them or substep solvers — ``causal``, ``activation``, ``scale``, ``eps``, a solver's
    method and tolerances, a ``Linear``'s sizes — i.e. the settings that, with the tensors,
    fix the map.  Attributes of how the map is trained or computed (gradient modes,
    batching, dropout: ``_NOT_SETTINGS``) are left out."""
    out = {}
    for name, m in model.named_modules():
        if isinstance(m, (Control, Propagator)):
            continue
        d = {"class": f"{type(m).__module__}.{type(m).__qualname__}"}
        for k, v in vars(m).items():
            if k.startswith("_") or k in _NOT_SETTINGS:
                continue
            v = _setting_value(v)
            if v is not _SKIP:
                d[k] = v
        out[name] = d
    return out


def _jsonable(v):
    if isinstance(v, Tensor):
        return v.item() if v.numel() == 1 else v.tolist()
    if isinstance(v, (list, tuple)):
        return [_jsonable(x) for x in v]
    if isinstance(v, dict):
        return {str(k): _jsonable(x) for k, x in v.items()}
    if isinstance(v, float) and not math.isfinite(v):
        return repr(v)
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    return repr(v)


# -- save ---------------------------------------------------------------------------------------
def _optimizer_parts(optimizer) -> tuple[dict, dict]:
    sd = optimizer.state_dict()
    tensors, scalars = {}, {}
    for idx, st in sd["state"].items():
        for k, v in st.items():
            if isinstance(v, Tensor):
                tensors[f"optimizer.{idx}.{k}"] = v
            else:
                scalars.setdefault(str(idx), {})[k] = _jsonable(v)
    meta = {
        "class": type(optimizer).__name__,
        "param_groups": [_jsonable(g) for g in sd["param_groups"]],
        "state": scalars,
    }
    return tensors, meta


def _rng_parts(generator) -> tuple[dict, dict]:
    tensors = {"rng.torch_cpu": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        for i, s in enumerate(torch.cuda.get_rng_state_all()):
            tensors[f"rng.cuda.{i}"] = s
    if generator is not None:
        tensors["rng.generator"] = generator.get_state()
    np_state = np.random.get_state()
    tensors["rng.numpy"] = torch.from_numpy(np.asarray(np_state[1], dtype=np.int64))
    py = random.getstate()
    meta = {
        "python": [py[0], list(py[1]), py[2]],
        "numpy": {"kind": np_state[0], "pos": int(np_state[2]), "has_gauss": int(np_state[3]),
                  "cached_gaussian": float(np_state[4])},
    }
    return tensors, meta


def nonfinite_tensors(model) -> list[str]:
    """The names of ``model``'s floating parameters and buffers that hold NaN or inf (or of
    the floating tensors of a dict ``{name: tensor}``)."""
    items = model.items() if isinstance(model, dict) else model.state_dict().items()
    named = [(k, v) for k, v in items
             if isinstance(v, Tensor) and (v.is_floating_point() or v.is_complex()) and v.numel()]
    if not named:
        return []
    with torch.no_grad():
        flags = torch.stack([torch.isfinite(v).all().cpu() for _, v in named])
    return [k for (k, _), ok in zip(named, flags.tolist()) if not ok]


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
    st = _need_safetensors()
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
        t, opt_meta = _optimizer_parts(optimizer)
        bad = [] if allow_nonfinite else nonfinite_tensors(t)
        if bad:
            raise ValueError(
                f"save_checkpoint.optimizer: its state {', '.join(bad[:6])}{' ...' if len(bad) > 6 else ''} "
                f"hold(s) NaN/inf; a checkpoint with non-finite optimizer state is not written ({str(path)!r}; "
                "pass allow_nonfinite=True to write it anyway)")
        tensors.update(t)
    sched_meta = None
    if scheduler is not None:
        sched_meta = {"class": type(scheduler).__name__, "state": _jsonable(
            {k: v for k, v in scheduler.state_dict().items() if k != "lr_lambdas"})}
    rng_meta = {"python": None, "numpy": None}
    if rng:
        t, rng_meta = _rng_parts(generator)
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
            "opsplit_version": _opsplit_version(),
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
            "trainer": _jsonable(trainer) if trainer is not None else None,
            "config": _jsonable(config) if config is not None else None,
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


def _opsplit_version() -> str:
    from .. import __version__

    return __version__


def latest_checkpoint(folder) -> Path | None:
    """The complete checkpoint folder with the highest step under ``folder`` (``step-*``
    folders holding a ``meta.json``), or ``folder`` itself if it is one; ``None`` if none."""
    folder = check_path(folder, "latest_checkpoint.folder")
    if (folder / META_FILE).is_file():
        return folder
    for sub in (folder, folder / "checkpoints"):
        if not sub.is_dir():
            continue
        cands = []
        for p in sub.iterdir():
            if p.is_dir() and p.name.startswith("step-") and (p / META_FILE).is_file():
                try:
                    cands.append((int(p.name[5:]), p))
                except ValueError:
                    continue
        if cands:
            return max(cands)[1]
    return None


# -- read -----------------------------------------------------------------------------------------
class Checkpoint:
    """A checkpoint read and verified in memory: ``meta`` (dict) and ``tensors`` (name ->
    tensor).  Nothing is applied to any model."""

    def __init__(self, path: Path, meta: dict, tensors: dict):
        self.path, self.meta, self.tensors = path, meta, tensors
        self.resampled: list[str] = []  # set by load_checkpoint
        self.changes: list[SettingChange] = []

    @property
    def trainer(self) -> dict | None:
        return self.meta["trainer"]

    @property
    def config(self) -> dict | None:
        return self.meta["config"]

    def model_state(self) -> dict:
        return {k[len("model."):]: v for k, v in self.tensors.items() if k.startswith("model.")}


def read_checkpoint(path) -> Checkpoint:
    """Read and verify a checkpoint folder (schema, version, size, SHA-256, tensor index);
    raises :class:`CheckpointError` naming the problem."""
    st = _need_safetensors()
    path = check_path(path, "read_checkpoint.path")
    if not path.is_dir():
        raise CheckpointError(f"checkpoint {str(path)!r}: not a folder (expected a folder with {META_FILE} "
                              f"and {TENSORS_FILE})")
    mfile = path / META_FILE
    if not mfile.is_file():
        raise CheckpointError(f"checkpoint {str(path)!r}: no {META_FILE} (incomplete or not a checkpoint)")
    try:
        meta = json.loads(mfile.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise CheckpointError(f"checkpoint {str(path)!r}: {META_FILE} is not valid JSON (corrupted or "
                              f"truncated): {e}") from None
    if not isinstance(meta, dict) or meta.get("schema") != SCHEMA_NAME:
        raise CheckpointError(f"checkpoint {str(path)!r}: {META_FILE} is not an opsplit checkpoint "
                              f"(schema {meta.get('schema') if isinstance(meta, dict) else None!r}, "
                              f"expected {SCHEMA_NAME!r})")
    ver = meta.get("schema_version")
    if ver != SCHEMA_VERSION:
        raise CheckpointError(f"checkpoint {str(path)!r}: schema_version {ver!r}; this opsplit reads "
                              f"version {SCHEMA_VERSION}")
    try:
        validate(meta)
    except SchemaError as e:
        raise CheckpointError(f"checkpoint {str(path)!r}: {META_FILE} does not follow the schema: {e}") from None
    tfile = path / meta["tensors_file"]
    if not tfile.is_file():
        raise CheckpointError(f"checkpoint {str(path)!r}: tensor file {meta['tensors_file']!r} is missing")
    data = tfile.read_bytes()
    if len(data) != meta["tensors_bytes"]:
        raise CheckpointError(
            f"checkpoint {str(path)!r}: {meta['tensors_file']} has {len(data)} bytes, {META_FILE} records "
            f"{meta['tensors_bytes']} (truncated or replaced)"
        )
    if hashlib.sha256(data).hexdigest() != meta["tensors_sha256"]:
        raise CheckpointError(
            f"checkpoint {str(path)!r}: {meta['tensors_file']} does not match its SHA-256 in {META_FILE} "
            "(corrupted)"
        )
    recorded = _header_metadata(data).get(META_DIGEST_KEY)
    if recorded is not None and recorded != meta_digest(meta):  # (checkpoints written before it: none)
        raise CheckpointError(
            f"checkpoint {str(path)!r}: {META_FILE} was changed after the checkpoint was written (its contents do not "
            f"match the SHA-256 recorded in {meta['tensors_file']}); an edited checkpoint is not resumed: its "
            "counters, optimizer and schedule settings would disagree with its state. Nothing was loaded")
    try:
        tensors = st.load(data)
    except Exception as e:  # safetensors raises its own error types
        raise CheckpointError(f"checkpoint {str(path)!r}: cannot read {meta['tensors_file']}: {e}") from None
    if set(tensors) != set(meta["tensors"]):
        missing = sorted(set(meta["tensors"]) - set(tensors))[:5]
        extra = sorted(set(tensors) - set(meta["tensors"]))[:5]
        raise CheckpointError(f"checkpoint {str(path)!r}: tensor index mismatch (missing {missing}, "
                              f"unexpected {extra})")
    for k, v in tensors.items():
        rec = meta["tensors"][k]
        if list(v.shape) != rec["shape"] or str(v.dtype).replace("torch.", "") != rec["dtype"]:
            raise CheckpointError(f"checkpoint {str(path)!r}: tensor {k!r} is {tuple(v.shape)} "
                                  f"{v.dtype}, {META_FILE} records {rec}")
    return Checkpoint(path, meta, tensors)


# -- resampling ---------------------------------------------------------------------------------------
def _source_control(cmeta: dict, rows: Tensor) -> Control:
    from ..controls import PiecewiseConstant, PiecewiseLinear, TimeBasis

    cls = cmeta["class"]
    rows = rows.to(torch.float64)
    kw = dict(t0=cmeta["t0"], t1=cmeta["t1"], requires_grad=False)
    if cls == "PiecewiseConstant":
        c = PiecewiseConstant(torch.zeros_like(rows), **kw)
    elif cls == "PiecewiseLinear":
        c = PiecewiseLinear(torch.zeros_like(rows), **kw)
    elif cls == "TimeBasis":
        c = TimeBasis(torch.zeros_like(rows), basis=cmeta.get("basis", "legendre"), **kw)
    else:
        raise CheckpointError(f"cannot resample a {cls} control in time")
    time_rows(c).data.copy_(rows)  # the stored rows (log-values for positive controls)
    return c


def _owner(path: str, propagators: dict) -> str | None:
    best = None
    for p in propagators:
        if p == "" or path == p or path.startswith(p + "."):
            if best is None or len(p) > len(best):
                best = p
    return best


def _interval_from(meta: dict | None, n: int, what: str) -> Interval:
    if meta is None or meta.get("length") is None:
        raise CheckpointError(f"cannot resample along {what}: the grid does not fix the domain length")
    return Interval(n=n, length=meta["length"], rule=meta["rule"])


def _resample_space(name, rows: Tensor, target: Tensor, axes, src_grid: dict | None, tgt_grid: Grid | None):
    """Interpolate the trailing (axes) dims of ``rows`` onto the target's node counts."""
    d = len(axes)
    if d == 0:
        raise CheckpointError(f"{name}: shape {tuple(rows.shape)} differs from the model's "
                              f"{tuple(target.shape)} and the control declares no spatial axes")
    if tuple(rows.shape[1: rows.dim() - d]) != tuple(target.shape[1: target.dim() - d]):
        raise CheckpointError(f"{name}: shape {tuple(rows.shape)} differs from the model's "
                              f"{tuple(target.shape)} outside its spatial axes {tuple(axes)}")
    if src_grid is None or tgt_grid is None:
        raise CheckpointError(f"{name}: spatial resampling needs the grid of its propagator")
    out = rows.to(torch.float64)
    for k, axis in enumerate(axes):
        dim = out.dim() - d + k
        ns, nt = out.shape[dim], target.shape[target.dim() - d + k]
        if ns == nt:
            continue
        src = _interval_from(src_grid.get(axis), ns, f"Omega_{axis} (checkpoint grid)")
        tgt_itv = getattr(tgt_grid, axis)
        tgt = _interval_from(_interval_meta(tgt_itv), nt, f"Omega_{axis} (model grid)")
        if not math.isclose(src.length, tgt.length, rel_tol=1e-12):
            raise CheckpointError(f"{name}: Omega_{axis} has length {src.length:g} in the checkpoint and "
                                  f"{tgt.length:g} in the model; resample only between grids of one domain")
        P = src.interpolation_matrix(tgt, dtype=torch.float64)
        out = (P @ out.movedim(dim, -2)).movedim(-2, dim) if dim != out.dim() - 1 else out @ P.T
    return out


def _kind(t: Tensor) -> str:
    if t.is_complex():
        return "complex"
    if t.is_floating_point():
        return "floating"
    return "boolean" if t.dtype == torch.bool else "integer"


def _plan_model_state(ckpt: Checkpoint, model: nn.Module, resample: bool,
                      allow_nonfinite: bool = False) -> tuple[dict, list[str]]:
    """The state dict to load (validated, resampled if asked); and the resampled keys."""
    meta = ckpt.meta["model"]
    saved = ckpt.model_state()
    own = model.state_dict()
    cls = f"{type(model).__module__}.{type(model).__qualname__}"
    missing = [k for k in own if k not in saved]
    extra = [k for k in saved if k not in own]
    if missing or extra:
        raise CheckpointError(
            f"checkpoint {str(ckpt.path)!r} is from another model ({meta['class']}, {len(saved)} state "
            f"entries) than the one given ({cls}, {len(own)}): missing {missing[:4]}"
            f"{' ...' if len(missing) > 4 else ''}, unexpected {extra[:4]}{' ...' if len(extra) > 4 else ''}"
        )
    if meta["class"] != cls:
        raise CheckpointError(f"checkpoint {str(ckpt.path)!r} holds a {meta['class']}, the model is a {cls}")
    for k, target in own.items():
        if _kind(saved[k]) != _kind(target):
            raise CheckpointError(
                f"checkpoint {str(ckpt.path)!r}: {k!r} is {saved[k].dtype} in the checkpoint, {target.dtype} in the "
                f"model; a tensor of another kind ({_kind(saved[k])} for {_kind(target)}) is not cast. Nothing was "
                "loaded")
    bad = [] if allow_nonfinite else nonfinite_tensors(saved)
    if bad:
        raise CheckpointError(
            f"checkpoint {str(ckpt.path)!r}: the weights {', '.join(bad[:6])}{' ...' if len(bad) > 6 else ''} hold(s) "
            "NaN/inf; a diverged model is not loaded, as save_checkpoint does not write one. Nothing was loaded "
            "(pass allow_nonfinite=True to load it anyway)")
    controls = dict(model.named_modules(remove_duplicate=False))
    new, resampled = {}, []
    for k, target in own.items():
        v = saved[k]
        if tuple(v.shape) == tuple(target.shape):
            new[k] = v.to(dtype=target.dtype)
            continue
        owner, _, pname = k.rpartition(".")
        c = controls.get(owner)
        cmeta = meta["controls"].get(owner)
        if not resample:
            raise CheckpointError(
                f"checkpoint {str(ckpt.path)!r}: {k!r} has shape {tuple(v.shape)}, the model's is "
                f"{tuple(target.shape)}" + (" (pass resample=True to resample the control as a function "
                                             "of t, x, y)" if isinstance(c, Control) else "")
            )
        if not isinstance(c, Control) or cmeta is None:
            raise CheckpointError(f"checkpoint {str(ckpt.path)!r}: {k!r} has shape {tuple(v.shape)}, the "
                                  f"model's is {tuple(target.shape)}, and it is not a control that can be resampled")
        if not isinstance(c, TIME_CONTROLS) or cmeta["class"] not in ("PiecewiseConstant", "PiecewiseLinear",
                                                                       "TimeBasis"):
            raise CheckpointError(f"{k!r}: resampling needs time controls, got {cmeta['class']} -> {type(c).__name__}")
        if bool(cmeta.get("positive", False)) != bool(getattr(c, "positive", False)):
            raise CheckpointError(f"{k!r}: positivity differs between checkpoint and model")
        rows = v.to(torch.float64)
        if tuple(rows.shape[1:]) != tuple(target.shape[1:]):
            props = meta["propagators"]
            own_props = {n: m for n, m in controls.items() if isinstance(m, Propagator)}
            po = _owner(owner, props)
            src_grid = props[po]["grid"] if po is not None else None
            pm = _owner(owner, own_props)
            tgt_grid = own_props[pm].grid if pm is not None else None
            # the target's node counts come from the model's control itself
            rows = _resample_space(k, rows, target, c.axes, src_grid, tgt_grid)
        if rows.shape[0] != target.shape[0] or cmeta["class"] != type(c).__name__ or (
                not math.isclose(cmeta["t0"], c.t0) or not math.isclose(cmeta["t1"], c.t1)):
            src = _source_control(cmeta, rows)
            try:
                rows = project_time(src, c)
            except ValueError as e:
                raise CheckpointError(f"{k!r}: {e}") from None
        new[k] = rows.to(dtype=target.dtype)
        resampled.append(k)
    return new, resampled


class SettingChange(NamedTuple):
    """A recorded setting of a checkpoint that differs from the model (or run) it is loaded
    into: ``where`` (a module path, ``""`` for the model itself, ``"TrainConfig"`` for the
    run), ``key`` (the setting: ``t1``, ``scheme``, ``causal``, ``lr`` ...), and the two
    values."""

    where: str
    key: str
    checkpoint: object
    model: object

    def __str__(self) -> str:
        at = f"{self.where}: " if self.where else ""
        other = "now" if self.where == "TrainConfig" else "in the model"
        return f"{at}{self.key} = {self.checkpoint!r} in the checkpoint, {self.model!r} {other}"


def _solver_key(r: str) -> str:
    return re.sub(r",? ?adjoint=True", "", r)  # a gradient mode, not a setting of the map


def _scheme_changes(where: str, a: dict, b: dict) -> list[SettingChange]:
    def summary(m):
        return f"{m['class']} ({len(m['substeps'])} substeps: " + ", ".join(
            "+".join(x["terms"]) for x in m["substeps"]) + ")"

    if a["class"] != b["class"] or [x["terms"] for x in a["substeps"]] != [x["terms"] for x in b["substeps"]]:
        return [SettingChange(where, "scheme", summary(a), summary(b))]
    out = []
    for i, (x, y) in enumerate(zip(a["substeps"], b["substeps"])):
        if _solver_key(x["solver"]) != _solver_key(y["solver"]):
            out.append(SettingChange(where, f"substep {i} solver", _solver_key(x["solver"]), _solver_key(y["solver"])))
    return out


def _same_number(a, b) -> bool:
    if isinstance(a, (int, float)) and isinstance(b, (int, float)) and not isinstance(a, bool):
        return math.isclose(a, b, rel_tol=1e-12, abs_tol=0.0)
    return a == b


def _grid_changes(where: str, a: dict, b: dict, resample: bool) -> list[SettingChange]:
    out = []
    for axis in ("x", "y", "h"):
        ia, ib = a.get(axis), b.get(axis)
        if (ia is None) != (ib is None):
            out.append(SettingChange(where, f"grid.{axis}", ia, ib))
            continue
        if ia is None:
            continue
        for k in sorted(set(ia) | set(ib)):
            if resample and k in ("n", "spacing"):
                continue  # another resolution of the same domain: resampled
            if not _same_number(ia.get(k), ib.get(k)):
                out.append(SettingChange(where, f"grid.{axis}.{k}", ia.get(k), ib.get(k)))
    return out


def _class_change(where: str, what: str, a: dict | None, b: dict | None) -> SettingChange | None:
    """A module (``what``) present on one side only, or of another class on the two sides."""
    if a is None or b is None:
        return SettingChange(where, what, a and a["class"], b and b["class"])
    if a["class"] != b["class"]:
        return SettingChange(where, "class", a["class"], b["class"])
    return None


def checkpoint_differences(checkpoint, model: nn.Module, *, resample: bool = False) -> list[SettingChange]:
    """The recorded settings of ``checkpoint`` (a folder or a :class:`Checkpoint`) that differ
    from ``model``'s: every propagator's class, :math:`[t_0, T]`, grid, scheme (its class
    and substeps) and substep solvers, its :math:`N_t` (unless ``resample``: another
    resolution of the same controls), and every other module's settings
    (:func:`module_settings`: ``causal``, ``activation``, ``eps``, ...).  Equal tensor shapes
    do not make two models the same map: a model with :math:`T = 4` and one with
    :math:`T = 8` hold the same tensors.  An empty list: nothing recorded differs.
    (Checkpoints written before the settings were recorded are compared on their
    propagators only.)"""
    ckpt = checkpoint if isinstance(checkpoint, Checkpoint) else read_checkpoint(checkpoint)
    if not isinstance(model, nn.Module):
        raise TypeError(f"checkpoint_differences.model: expected an nn.Module, got {type(model).__name__}")
    saved, own = ckpt.meta["model"], model_metadata(model)
    out: list[SettingChange] = []
    replaced: list[str] = []
    sp, op = saved["propagators"], own["propagators"]
    for name in sorted(set(sp) | set(op), key=lambda n: (n.count("."), n)):
        a, b = sp.get(name), op.get(name)
        where = name or "model"
        first = _class_change(where, "propagator", a, b)
        if first is not None:
            out.append(first)
            if first.key == "propagator":
                continue
        for k in ("t0", "t1"):
            if not _same_number(a[k], b[k]):
                out.append(SettingChange(where, k + (" (T)" if k == "t1" else ""), a[k], b[k]))
        if not resample and a["n_steps"] != b["n_steps"]:
            out.append(SettingChange(where, "n_steps", a["n_steps"], b["n_steps"]))
        out += _grid_changes(where, a["grid"], b["grid"], resample)
        sc = _scheme_changes(where, a["scheme"], b["scheme"])
        if any(c.key == "scheme" for c in sc):
            replaced.append(f"{name}.scheme" if name else "scheme")  # its modules' settings: noise
        out += sc
    ss = saved.get("settings")
    if ss is not None:
        os_ = own["settings"]
        for name in [n for n in ss if n in os_] + [n for n in os_ if n not in ss]:
            if any(name == r or name.startswith(r + ".") for r in replaced):
                continue
            a, b = ss.get(name), os_.get(name)
            first = _class_change(name or "model", "module", a, b)
            if first is not None:
                out.append(first)
                continue
            for k in [k for k in a if k in b] + [k for k in b if k not in a] + [k for k in a if k not in b]:
                if k != "class" and not _same_number(a.get(k), b.get(k)):
                    out.append(SettingChange(name or "model", k, a.get(k), b.get(k)))
    return out


def _allowed(change: SettingChange, allow) -> bool:
    if allow is True:
        return True
    base = change.key.split(" ")[0]
    return change.key in allow or any(k in allow or f"{change.where}.{k}" in allow for k in base.split("/"))


def check_allow_changes(allow_changes, name: str = "allow_changes"):
    """``False`` / ``None`` (nothing may differ), ``True`` (anything may), or a collection of
    setting names (``"t1"``, ``"causal"``, ``"lr"``, or ``"<module path>.<setting>"``)."""
    if allow_changes is None or allow_changes is False:
        return frozenset()
    if allow_changes is True:
        return True
    if isinstance(allow_changes, str):
        return frozenset({allow_changes})
    try:
        items = list(allow_changes)
    except TypeError:
        raise TypeError(f"{name}: expected True, False or a collection of setting names, got "
                        f"{allow_changes!r}") from None
    for k in items:
        if not isinstance(k, str):
            raise TypeError(f"{name}: expected setting names (strings), got {k!r}")
    return frozenset(items)


def refuse_changes(changes: list[SettingChange], allow, path, what: str = "model") -> list[SettingChange]:
    """Raise :class:`CheckpointError` listing the ``changes`` that ``allow`` does not accept;
    returns the accepted ones."""
    bad = [c for c in changes if not _allowed(c, allow)]
    if bad:
        keys = sorted({c.key.split(" ")[0].split("/")[0] for c in bad})
        if what == "model":
            why = "equal tensor shapes do not make it the same map"
            fix = "To load it anyway (a deliberate transfer of the weights)"
        else:
            why = ("resuming would continue neither run: the checkpoint's optimizer and schedule keep their own "
                   "state while this config reports the new settings")
            fix = "To resume anyway, the optimizer and schedule following this config from the resumed step on"
        raise CheckpointError(
            f"checkpoint {str(path)!r} was written by a {what} with other settings ({why}): "
            + "; ".join(map(str, bad)) + f". Nothing was loaded. {fix}, pass allow_changes={keys!r} "
            "(or allow_changes=True)"
        )
    return [c for c in changes if c not in bad]


def _plan_optimizer(ckpt: Checkpoint, optimizer, allow_nonfinite: bool = False) -> dict:
    om = ckpt.meta["optimizer"]
    if om is None:
        raise CheckpointError(f"checkpoint {str(ckpt.path)!r} holds no optimizer state; load with optimizer=None")
    if om["class"] != type(optimizer).__name__:
        raise CheckpointError(f"checkpoint {str(ckpt.path)!r}: optimizer {om['class']}, given {type(optimizer).__name__}")
    own = optimizer.state_dict()
    if len(own["param_groups"]) != len(om["param_groups"]):
        raise CheckpointError(f"optimizer: {len(om['param_groups'])} parameter groups in the checkpoint, "
                              f"{len(own['param_groups'])} given")
    for i, (a, b) in enumerate(zip(own["param_groups"], om["param_groups"])):
        if list(a["params"]) != list(b["params"]):
            raise CheckpointError(f"optimizer: parameter group {i} has {len(b['params'])} parameters in the "
                                  f"checkpoint, {len(a['params'])} given")
    groups = [dict(g) for g in om["param_groups"]]
    for i, g in enumerate(groups):
        _check_group(ckpt.path, i, g)
    for g, cur in zip(groups, own["param_groups"]):
        for key, val in cur.items():  # restore tuples (betas) and types the JSON lost
            if key in g and isinstance(val, tuple) and isinstance(g[key], list):
                g[key] = tuple(g[key])
    params = [p for grp in optimizer.param_groups for p in grp["params"]]
    bad = [] if allow_nonfinite else sorted(nonfinite_tensors(
        {k: v for k, v in ckpt.tensors.items() if k.startswith("optimizer.")}),
        key=lambda k: (int(k.split(".")[1]), k))  # optimizer.<index>.<state>, in parameter order
    if bad:
        raise CheckpointError(
            f"checkpoint {str(ckpt.path)!r}: the optimizer state {', '.join(bad[:6])}{' ...' if len(bad) > 6 else ''} "
            "hold(s) NaN/inf (optimizer.<parameter index>.<state>); resuming would carry it into every later step, "
            "and save_checkpoint does not write such a state either. Nothing was loaded (pass allow_nonfinite=True "
            "to load it anyway)")
    state: dict = {}
    for k, v in ckpt.tensors.items():
        if k.startswith("optimizer."):
            _, idx, key = k.split(".", 2)
            state.setdefault(int(idx), {})[key] = v
    for idx, sc in om["state"].items():
        state.setdefault(int(idx), {}).update(sc)
    for idx, st in sorted(state.items()):  # (in parameter order: the first bad one is named)
        if idx >= len(params):
            raise CheckpointError(f"optimizer: state for parameter {idx}, only {len(params)} parameters given")
        _check_state(ckpt.path, idx, st)
        p = params[idx]
        for key, v in st.items():
            if isinstance(v, Tensor) and v.dim() > 0 and tuple(v.shape) != tuple(p.shape):
                raise CheckpointError(f"optimizer: state {key!r} of parameter {idx} has shape {tuple(v.shape)}, "
                                      f"the parameter {tuple(p.shape)}")
            if isinstance(v, Tensor) and v.dim() > 0 and _kind(v) != _kind(p):
                raise CheckpointError(f"optimizer: state {key!r} of parameter {idx} is {v.dtype}, the parameter "
                                      f"{p.dtype}; a tensor of another kind is not cast")
            if isinstance(v, Tensor):
                st[key] = v.to(device=p.device, dtype=p.dtype if v.is_floating_point() and v.dim() > 0 else v.dtype)
    return {"state": state, "param_groups": groups}


def _number(path, where: str, v, *, lo=0.0, hi=math.inf, lo_open=False, hi_open=False, what="") -> float:
    """A recorded optimizer or scheduler setting: a finite number in its range, or a
    :class:`CheckpointError` that blames the checkpoint (``where``: the setting's place)."""
    ok = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and (
        v > lo if lo_open else v >= lo) and (v < hi if hi_open else v <= hi)
    if not ok:
        rng = f"{'(' if lo_open else '['}{lo:g}, {hi:g}{')' if hi_open else ']'}"
        raise CheckpointError(
            f"checkpoint {str(path)!r}: {where} = {v!r} in {META_FILE}; expected a finite number in {rng}"
            f"{f' ({what})' if what else ''}: the checkpoint was edited or damaged. Nothing was loaded")
    return float(v)


#: a parameter group's settings and their ranges: (lo, hi, lo open, hi open, what)
_GROUP_RANGES = {
    "lr": (0.0, math.inf, False, False, "the learning rate"),
    "initial_lr": (0.0, math.inf, False, False, "the schedule's base rate"),
    "eps": (0.0, math.inf, True, False, "Adam's denominator guard"),
    "weight_decay": (0.0, math.inf, False, False, "the weight decay"),
    "momentum": (0.0, 1.0, False, True, "SGD's momentum"),
    "dampening": (0.0, 1.0, False, False, "SGD's dampening"),
}


def _check_group(path, i: int, g: dict) -> None:
    """The recorded settings of parameter group ``i`` (13h: a NaN ``lr`` or ``eps`` edited
    into ``meta.json`` is the checkpoint's fault, named here, not "parameters must be
    finite" steps later)."""
    for key, (lo, hi, lo_open, hi_open, what) in _GROUP_RANGES.items():
        if key in g:
            _number(path, f"optimizer.param_groups[{i}].{key}", g[key], lo=lo, hi=hi, lo_open=lo_open,
                    hi_open=hi_open, what=what)
    if "betas" in g:
        b = g["betas"]
        if not isinstance(b, (list, tuple)) or len(b) != 2:
            raise CheckpointError(f"checkpoint {str(path)!r}: optimizer.param_groups[{i}].betas = {b!r} in {META_FILE}; "
                                  "expected a pair (beta1, beta2): the checkpoint was edited or damaged. Nothing was "
                                  "loaded")
        for k, x in enumerate(b):
            _number(path, f"optimizer.param_groups[{i}].betas[{k}]", x, hi=1.0, hi_open=True,
                    what="Adam's averaging factors")


def _check_state(path, idx: int, st: dict) -> None:
    """The optimizer state of parameter ``idx``: Adam's ``step`` counts the updates (an integer
    >= 1 once there is a state: 0 divides by zero in the bias correction, a negative one
    fails inside torch), its squared averages are >= 0 (their square root is taken)."""
    step = st.get("step")
    if step is not None:
        v = float(step) if isinstance(step, Tensor) and step.numel() == 1 else step
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 1 or v != int(v):
            raise CheckpointError(
                f"checkpoint {str(path)!r}: the optimizer state optimizer.{idx}.step = {v!r}; expected an integer >= 1 "
                "(the updates the parameter received): the checkpoint was edited or damaged. Nothing was loaded")
    for key in ("exp_avg_sq", "max_exp_avg_sq"):
        t = st.get(key)
        if isinstance(t, Tensor) and t.is_floating_point() and t.numel() and bool((t < 0).any()):
            raise CheckpointError(
                f"checkpoint {str(path)!r}: the optimizer state optimizer.{idx}.{key} holds negative values; expected "
                "values >= 0 (an average of squared gradients): the checkpoint was edited or damaged. Nothing was "
                "loaded")


def _check_scheduler(path, sched: dict, groups) -> None:
    """The recorded scheduler state: its counters in range, its base and last rates finite,
    one per parameter group, and the base rates those of the groups (``initial_lr``)."""
    le = sched.get("last_epoch")
    if le is not None and (isinstance(le, bool) or not isinstance(le, int) or le < 0):
        raise CheckpointError(f"checkpoint {str(path)!r}: scheduler.last_epoch = {le!r} in {META_FILE}; expected an "
                              "integer >= 0 (the schedule's steps): the checkpoint was edited or damaged. Nothing was "
                              "loaded")
    for key in ("base_lrs", "_last_lr"):
        if key not in sched:
            continue
        rates = sched[key]
        if not isinstance(rates, list) or (groups is not None and len(rates) != len(groups)):
            raise CheckpointError(f"checkpoint {str(path)!r}: scheduler.{key} = {rates!r} in {META_FILE}; expected one "
                                  "rate per parameter group: the checkpoint was edited or damaged. Nothing was loaded")
        for i, r in enumerate(rates):
            _number(path, f"scheduler.{key}[{i}]", r, what="a learning rate")
            g = groups[i] if groups is not None else {}
            ref = g.get("initial_lr") if key == "base_lrs" else g.get("lr")
            if isinstance(ref, (int, float)) and not math.isclose(r, ref, rel_tol=1e-12, abs_tol=0.0):
                other = "initial_lr" if key == "base_lrs" else "lr"
                raise CheckpointError(
                    f"checkpoint {str(path)!r}: scheduler.{key}[{i}] = {r!r} but optimizer.param_groups[{i}].{other} = "
                    f"{ref!r} in {META_FILE}; expected equal rates (the schedule sets the group's): the checkpoint was "
                    "edited or damaged. Nothing was loaded")


def _rng_state_of(ckpt: Checkpoint) -> dict:
    t, m = ckpt.tensors, ckpt.meta["rng"]
    out = {}
    if "rng.torch_cpu" in t:
        out["torch_cpu"] = t["rng.torch_cpu"]
    cuda = sorted((int(k.split(".")[2]), v) for k, v in t.items() if k.startswith("rng.cuda."))
    if cuda:
        out["cuda"] = [v for _, v in cuda]
    if "rng.generator" in t:
        out["generator"] = t["rng.generator"]
    if m["numpy"] is not None and "rng.numpy" in t:
        nm = m["numpy"]
        out["numpy"] = (nm["kind"], t["rng.numpy"].numpy().astype(np.uint32), nm["pos"], nm["has_gauss"],
                        nm["cached_gaussian"])
    if m["python"] is not None:
        p = m["python"]
        out["python"] = (p[0], tuple(p[1]), p[2])
    return out


def _current_rng(generator) -> dict:
    out = {"torch_cpu": torch.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate()}
    if generator is not None:
        out["generator"] = generator.get_state()
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        out["cuda"] = torch.cuda.get_rng_state_all()
    return out


def _apply_rng(state: dict, generator) -> None:
    if "torch_cpu" in state:
        torch.set_rng_state(state["torch_cpu"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
    if "generator" in state and generator is not None:
        generator.set_state(state["generator"])
    if "numpy" in state:
        np.random.set_state(state["numpy"])
    if "python" in state:
        random.setstate(state["python"])


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
    if not isinstance(allow_nonfinite, bool):
        raise TypeError(f"load_checkpoint.allow_nonfinite: expected true or false, got {allow_nonfinite!r}")
    ckpt = path if isinstance(path, Checkpoint) else read_checkpoint(path)
    state, resampled = _plan_model_state(ckpt, model, resample, allow_nonfinite)
    accepted = refuse_changes(checkpoint_differences(ckpt, model, resample=resample), allow, ckpt.path)
    opt_state = None
    if optimizer is not None:
        if resampled:
            raise CheckpointError(
                f"checkpoint {str(ckpt.path)!r}: controls were resampled ({resampled[0]!r}, ...); their "
                "optimizer state cannot be carried over: load with optimizer=None"
            )
        opt_state = _plan_optimizer(ckpt, optimizer, allow_nonfinite)
    sched_state = None
    if scheduler is not None:
        sm = ckpt.meta["scheduler"]
        if sm is None or sm["class"] != type(scheduler).__name__:
            raise CheckpointError(f"checkpoint {str(ckpt.path)!r}: scheduler "
                                  f"{None if sm is None else sm['class']}, given {type(scheduler).__name__}")
        sched_state = dict(sm["state"])
        om = ckpt.meta.get("optimizer")
        _check_scheduler(ckpt.path, sched_state, om["param_groups"] if om is not None and optimizer is not None
                         else None)
        own = scheduler.state_dict()
        for k in own:
            if k not in sched_state and k != "lr_lambdas":
                raise CheckpointError(f"scheduler: state key {k!r} missing from the checkpoint")
        if "lr_lambdas" in own:
            sched_state["lr_lambdas"] = own["lr_lambdas"]
    rng_state = _rng_state_of(ckpt) if restore_rng else None

    # -- apply (with a backup of everything it touches) --
    backup_model = {k: v.detach().clone() for k, v in model.state_dict().items()}
    backup_opt = copy.deepcopy(optimizer.state_dict()) if optimizer is not None else None
    backup_sched = copy.deepcopy(scheduler.state_dict()) if scheduler is not None else None
    backup_rng = _current_rng(generator) if restore_rng else None
    try:
        with torch.no_grad():
            model.load_state_dict(state, strict=True)
        if opt_state is not None:
            optimizer.load_state_dict(opt_state)
        if sched_state is not None:
            scheduler.load_state_dict(sched_state)
        if rng_state is not None:
            _apply_rng(rng_state, generator)
    except Exception as e:
        with torch.no_grad():
            model.load_state_dict(backup_model, strict=True)
        if backup_opt is not None:
            optimizer.load_state_dict(backup_opt)
        if backup_sched is not None:
            scheduler.load_state_dict(backup_sched)
        if backup_rng is not None:
            _apply_rng(backup_rng, generator)
        raise CheckpointError(f"checkpoint {str(ckpt.path)!r}: applying the state failed ({e}); the previous "
                              "state was restored") from e
    ckpt.resampled = resampled
    ckpt.changes = accepted
    return ckpt
