"""What differs between a checkpoint and the model or run it is loaded into: the recorded
settings of the map (:func:`checkpoint_differences`) as :class:`SettingChange` rows, which
changes a caller accepts (:func:`check_allow_changes`) and the refusal of the others
(:func:`refuse_changes`)."""

from __future__ import annotations

import math
import re
from typing import NamedTuple

from torch import nn

from .checkpoint_meta import CheckpointError, model_metadata
from .checkpoint_read import Checkpoint, read_checkpoint

__all__ = ["SettingChange", "checkpoint_differences", "check_allow_changes", "refuse_changes", "same_number"]


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


def same_number(a, b) -> bool:
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
            if not same_number(ia.get(k), ib.get(k)):
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
            if not same_number(a[k], b[k]):
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
                if k != "class" and not same_number(a.get(k), b.get(k)):
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
