"""The optimizer, scheduler and RNG states of a checkpoint: split into tensors and JSON
metadata for writing (:func:`optimizer_parts`, :func:`rng_parts`), and on reading checked
against the optimizer given (classes, parameter groups, shapes, kinds, finiteness) and
against their own ranges (an edited or damaged ``meta.json``: a NaN learning rate, a
negative squared average, a schedule whose rates are not its groups')."""

from __future__ import annotations

import math
import random

import numpy as np
import torch
from torch import Tensor

from .checkpoint_meta import META_FILE, CheckpointError, jsonable, nonfinite_tensors, tensor_kind
from .checkpoint_read import Checkpoint

__all__ = ["optimizer_parts", "rng_parts", "plan_optimizer", "check_scheduler", "rng_state_of", "current_rng",
           "apply_rng"]


def optimizer_parts(optimizer) -> tuple[dict, dict]:
    sd = optimizer.state_dict()
    tensors, scalars = {}, {}
    for idx, st in sd["state"].items():
        for k, v in st.items():
            if isinstance(v, Tensor):
                tensors[f"optimizer.{idx}.{k}"] = v
            else:
                scalars.setdefault(str(idx), {})[k] = jsonable(v)
    meta = {
        "class": type(optimizer).__name__,
        "param_groups": [jsonable(g) for g in sd["param_groups"]],
        "state": scalars,
    }
    return tensors, meta


def rng_parts(generator) -> tuple[dict, dict]:
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


def plan_optimizer(ckpt: Checkpoint, optimizer, allow_nonfinite: bool = False) -> dict:
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
            if isinstance(v, Tensor) and v.dim() > 0 and tensor_kind(v) != tensor_kind(p):
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


def check_scheduler(path, sched: dict, groups) -> None:
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


def rng_state_of(ckpt: Checkpoint) -> dict:
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


def current_rng(generator) -> dict:
    out = {"torch_cpu": torch.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate()}
    if generator is not None:
        out["generator"] = generator.get_state()
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        out["cuda"] = torch.cuda.get_rng_state_all()
    return out


def apply_rng(state: dict, generator) -> None:
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
