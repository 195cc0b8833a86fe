r"""A checkpoint's model state planned for a model: checked against it (class, state keys,
tensor kinds, finiteness) and, with ``resample=True``, its controls resampled as functions
of :math:`t, x, y` onto the model's grids — in time by the :math:`L^2` projection
(:func:`opsplit.controls.projection.project_time`: refinement is exact), in space by
piecewise-linear interpolation between the nodes of two grids of one domain
(:meth:`opsplit.grid.Interval.interpolation_matrix`)."""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from ..controls import Control, PiecewiseConstant, PiecewiseLinear, TimeBasis
from ..controls.projection import TIME_CONTROLS, project_time, time_rows
from ..grid import Grid, Interval
from ..propagator import Propagator
from .checkpoint_meta import CheckpointError, interval_meta, nonfinite_tensors, tensor_kind
from .checkpoint_read import Checkpoint

__all__ = ["plan_model_state"]


def _source_control(cmeta: dict, rows: Tensor) -> Control:
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
        tgt = _interval_from(interval_meta(tgt_itv), nt, f"Omega_{axis} (model grid)")
        if not math.isclose(src.length, tgt.length, rel_tol=1e-12):
            raise CheckpointError(f"{name}: Omega_{axis} has length {src.length:g} in the checkpoint and "
                                  f"{tgt.length:g} in the model; resample only between grids of one domain")
        P = src.interpolation_matrix(tgt, dtype=torch.float64)
        out = (P @ out.movedim(dim, -2)).movedim(-2, dim) if dim != out.dim() - 1 else out @ P.T
    return out


def plan_model_state(ckpt: Checkpoint, model: nn.Module, resample: bool,
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
        if tensor_kind(saved[k]) != tensor_kind(target):
            raise CheckpointError(
                f"checkpoint {str(ckpt.path)!r}: {k!r} is {saved[k].dtype} in the checkpoint, {target.dtype} in the "
                f"model; a tensor of another kind ({tensor_kind(saved[k])} for {tensor_kind(target)}) is not cast. Nothing was "
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
