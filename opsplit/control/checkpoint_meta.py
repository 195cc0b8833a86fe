r"""The metadata of a checkpoint (``meta.json``): what a model records of itself (class,
state keys, every propagator's :math:`N_t`, :math:`[t_0, T]`, grid and scheme, every
control's kind and interval, every other module's settings), its digest (the SHA-256 of
``meta.json``'s canonical JSON, kept in the tensor file's header), JSON values of tensors and
numbers, and :class:`CheckpointError`.  The bottom of :mod:`opsplit.control.checkpoint`'s
modules: it imports none of them."""

from __future__ import annotations

import hashlib
import json
import math

import torch
from torch import Tensor, nn

from .. import __version__
from ..controls import Control
from ..controls.projection import TIME_CONTROLS, time_rows
from ..grid import Grid, Interval
from ..propagator import Propagator
from ..solvers.base import Solver

__all__ = ["CheckpointError", "TENSORS_FILE", "META_FILE", "META_DIGEST_KEY", "meta_digest", "header_metadata",
           "model_metadata", "module_settings", "jsonable", "nonfinite_tensors", "tensor_kind",
           "opsplit_version"]

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


def header_metadata(data: bytes) -> dict:
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


# -- metadata ---------------------------------------------------------------------------------
def interval_meta(itv: Interval | None):
    if itv is None:
        return None
    return {"n": itv.n, "length": itv.length, "spacing": itv.spacing, "rule": itv.rule}


def _grid_meta(grid: Grid) -> dict:
    return {"x": interval_meta(grid.x), "y": interval_meta(grid.y), "h": interval_meta(grid.h)}


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


def jsonable(v):
    if isinstance(v, Tensor):
        return v.item() if v.numel() == 1 else v.tolist()
    if isinstance(v, (list, tuple)):
        return [jsonable(x) for x in v]
    if isinstance(v, dict):
        return {str(k): jsonable(x) for k, x in v.items()}
    if isinstance(v, float) and not math.isfinite(v):
        return repr(v)
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    return repr(v)


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


def tensor_kind(t: Tensor) -> str:
    """``"complex"``, ``"floating"``, ``"boolean"`` or ``"integer"``: what a loaded tensor must
    share with the one it replaces (a tensor of another kind is never cast)."""
    if t.is_complex():
        return "complex"
    if t.is_floating_point():
        return "floating"
    return "boolean" if t.dtype == torch.bool else "integer"


def opsplit_version() -> str:
    return __version__
