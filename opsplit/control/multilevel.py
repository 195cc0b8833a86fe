r"""Multilevel training in time: train the controls :math:`\theta(t)` on a coarse time grid,
prolong them to a finer one, continue — inside one run (Chang, Meng, Haber, Tung and
Begert, *Multi-level Residual Networks from Dynamical Systems View*, ICLR 2018).

A model trained with opsplit is a model of its controls, functions of :math:`t` on
:math:`[t_0, T]`.  A **level** is a resolution of them: ``(pieces, fraction)`` — the
controls in :math:`P_\ell` equal pieces of :math:`[t_0, T]`, for that fraction of the
run's optimizer steps.  ``TrainConfig.levels = ((1, 0.3), (2, 0.3), (4, 0.4))`` trains a
model built with 4 pieces first with 1, then 2, then its own 4; the pieces strictly
increase, each a multiple of the one before, the last the model's own, the fractions sum
to 1.  Level :math:`\ell` starts at optimizer step
:math:`\mathrm{round}(S \sum_{m<\ell} f_m)` of a run of :math:`S` steps
(:func:`level_starts`).

**What a level changes.**  At level :math:`\ell` every piecewise control of the model
(:class:`~opsplit.controls.PiecewiseConstant`, :class:`~opsplit.controls.LayerwiseConstant`,
:class:`~opsplit.controls.PiecewiseLinear`) has :math:`P_\ell` pieces, every propagator
takes :math:`N_t^{(\ell)} = N_t \, P_\ell / P` steps (its own :math:`N_t` scaled with the
pieces: the step length relative to a piece stays), and the :math:`N_t` draws of
``TrainConfig.n_steps`` are scaled the same way, :math:`n \, P_\ell / P` for every
:math:`n` of the list for which that is an integer (their weights kept).  Controls
continuous in :math:`t` (a smooth basis) and everything outside the propagators are left
as they are.  The running costs of the objective (the kinetic energy
:math:`\int\|u_t\|^2_r\,dt`, the smoothness :math:`\int\|\theta'\|^2`) are integrals in
:math:`t` and apply unchanged at every level.

**The first level** is the model's controls restricted to :math:`P_0` pieces by sampling
(:func:`~opsplit.controls.restrict` ``kind="sample"``: each coarse piece the value at its
start, so a freshly initialised model starts with layer weights of the usual scale).

**The learning-rate schedule** (``TrainConfig.levels_schedule``): ``"run"`` — one decay over
the whole run, as without levels; ``"level"`` — the decay restarted at every level, its
progress :math:`(s - s_\ell) / (s_{\ell+1} - s_\ell)` within level :math:`\ell`'s steps (the
warm-up only at the start of the run).

**A level change** (:func:`change_level`) prolongs every control
(:func:`~opsplit.controls.prolong`, ``TrainConfig.levels_prolongation``: ``"constant"``
duplicates the pieces — the same function of :math:`t`, so the continuous flow is
unchanged — or ``"linear"``) and carries the optimizer's state along with the same matrix
:math:`M`: Adam's moments :math:`m' = M m / r`, :math:`v' = M v / r^2` with
:math:`r = P_{\ell+1} / P_\ell` (a fine piece receives :math:`1/r` of its coarse piece's
gradient, so the first update after the change moves every fine piece as the coarse
one would have moved; its step count is kept), SGD's momentum :math:`M b / r`.  The new
parameters take the old ones' places in the optimizer, in the order of
``model.parameters()``, the same order a resumed run rebuilds (resume across a level change
is bit-exact).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from ..coarse import piecewise_controls
from ..controls import LayerwiseConstant, PiecewiseConstant, PiecewiseLinear
from ..controls.refine import (
    PROLONGATIONS,
    n_pieces_of,
    node_prolongation_matrix,
    prolong,
    prolongation_matrix,
    restrict,
)
from ..data.base import check_int
from .swap import propagators

__all__ = ["LEVEL_SCHEDULES", "check_levels", "level_starts", "level_at", "level_n_steps", "model_pieces", "check_level_schedule",
           "change_level", "PROLONGATIONS"]

#: the learning-rate schedule of a multilevel run: one over the run, or restarted at every level
LEVEL_SCHEDULES = ("run", "level")
_PIECEWISE = (PiecewiseConstant, LayerwiseConstant, PiecewiseLinear)


def check_levels(v, name: str = "TrainConfig.levels"):
    """``None`` or a list of ``(pieces, fraction)`` levels (module docstring): pieces
    integers >= 1, strictly increasing, each a multiple of the one before; fractions finite,
    > 0, summing to 1 (within 1e-6).  Returns a tuple of ``(int, float)`` pairs."""
    if v is None:
        return None
    if isinstance(v, (str, bytes)) or not isinstance(v, (list, tuple)) or not v:
        raise TypeError(f"{name}: expected None or a non-empty list of [pieces, fraction] levels, got {v!r}")
    out = []
    for i, lv in enumerate(v):
        if isinstance(lv, (str, bytes)) or not isinstance(lv, (list, tuple)) or len(lv) != 2:
            raise TypeError(f"{name}[{i}]: expected a pair [pieces, fraction of the run's steps], got {lv!r}")
        p = check_int(lv[0], f"{name}[{i}] pieces", 1)
        f = lv[1]
        if isinstance(f, bool) or not isinstance(f, (int, float)):
            raise TypeError(f"{name}[{i}] fraction: expected a number in (0, 1], got {f!r}")
        f = float(f)
        if not math.isfinite(f) or not 0.0 < f <= 1.0:
            raise ValueError(f"{name}[{i}] fraction: expected a number in (0, 1], got {f}")
        if out:
            q = out[-1][0]
            if p <= q:
                raise ValueError(f"{name}: expected strictly increasing pieces, got {q} then {p} (levels go from "
                                 "coarse to fine)")
            if p % q:
                raise ValueError(f"{name}[{i}] pieces: a level's pieces must be a multiple of the level before "
                                 f"(each piece split in equal parts), got {q} then {p}")
        out.append((p, f))
    total = sum(f for _, f in out)
    if abs(total - 1.0) > 1e-6:
        raise ValueError(f"{name}: expected fractions of the run's steps that sum to 1, got "
                         f"{[f for _, f in out]} (sum {total:g})")
    return tuple(out)


def level_starts(levels, total_steps: int) -> list[int]:
    """The optimizer step at which each level starts in a run of ``total_steps`` steps."""
    starts, acc = [], 0.0
    for _, f in levels:
        starts.append(int(round(total_steps * acc)))
        acc += f
    return starts


def level_at(levels, total_steps: int, step: int) -> int:
    """The index of the level that trains optimizer step ``step`` (0-based)."""
    starts = level_starts(levels, total_steps)
    return max(i for i, s in enumerate(starts) if s <= step)


def level_n_steps(n_steps, weights, pieces: int, final: int):
    """``TrainConfig.n_steps`` and its weights at a level of ``pieces`` of the model's
    ``final``: every :math:`n` with :math:`n \\cdot` pieces / final an integer, scaled (a
    weight list keeps the weights of the entries kept).  ``(None, None)`` without draws."""
    if n_steps is None:
        return None, None
    keep = [i for i, n in enumerate(n_steps) if (n * pieces) % final == 0]
    scaled = tuple(n * pieces // final for n in (n_steps[i] for i in keep))
    w = tuple(weights[i] for i in keep) if isinstance(weights, tuple) else weights
    return scaled, w


def model_pieces(model: nn.Module, name: str = "TrainConfig.levels") -> int:
    """The pieces in :math:`t` shared by every piecewise control inside the model's
    propagators; refused, naming ``name``, when there is none or they differ."""
    counts = {}
    for prop in propagators(model):
        for _, _, c in piecewise_controls(prop.scheme, _PIECEWISE):
            counts.setdefault(n_pieces_of(c), type(c).__name__)
    if not counts:
        raise ValueError(f"{name}: the model has no control with pieces in time (PiecewiseConstant, "
                         "LayerwiseConstant, PiecewiseLinear) inside a propagator: nothing to prolong")
    if len(counts) > 1:
        raise ValueError(f"{name}: the model's controls have {sorted(counts)} pieces in time; a level schedule needs "
                         "one piece count")
    return next(iter(counts))


def check_level_schedule(model: nn.Module, levels, n_steps=None, name: str = "TrainConfig.levels") -> int:
    """``levels`` against ``model`` before a run: the last level's pieces the model's own,
    every propagator's :math:`N_t` scaled to an integer at every level, every level with at
    least one :math:`N_t` of ``n_steps`` (when given).  Returns the model's pieces."""
    P = model_pieces(model, name)
    last = levels[-1][0]
    if last != P:
        raise ValueError(f"{name}: the last level has {last} pieces, the model's controls {P}; expected the last "
                         "level at the model's own pieces (the model as built is the finest level)")
    for i, (p, _) in enumerate(levels):
        if P % p:
            raise ValueError(f"{name}[{i}] pieces: {p} pieces do not divide the model's {P}")
        for prop in propagators(model):
            if (prop.n_steps * p) % P:
                raise ValueError(f"{name}[{i}]: N_t = {prop.n_steps} x {p} / {P} pieces is not an integer; the "
                                 f"level's N_t does not fit its controls (expected N_t a multiple of {P // p})")
        if n_steps is not None and not level_n_steps(n_steps, None, p, P)[0]:
            raise ValueError(f"{name}[{i}]: no N_t of TrainConfig.n_steps = {list(n_steps)} fits {p} pieces "
                             f"(n x {p} / {P} an integer); add one or coarsen no further")
    return P


def _state_map(M: Tensor, r: int, key: str, value: Tensor) -> Tensor:
    """An optimizer state of a control's rows (first dimension the pieces) prolonged."""
    flat = value.reshape(value.shape[0], -1)
    out = (M.to(dtype=value.dtype, device=value.device) @ flat).reshape(M.shape[0], *value.shape[1:])
    if key == "exp_avg_sq" or key == "max_exp_avg_sq":
        return out / (r * r)
    return out / r


def _rows_params(c) -> list:
    return list(c.pieces) if isinstance(c, LayerwiseConstant) else [c.raw]


def change_level(model: nn.Module, pieces: int, *, kind: str = "constant", optimizer=None,
                 final_n_steps: dict | None = None, final_pieces: int | None = None) -> dict:
    """Bring every piecewise control inside ``model``'s propagators to ``pieces`` pieces:
    prolonged by ``kind`` when finer (module docstring), restricted by sampling when coarser,
    each shared control once; every propagator's :math:`N_t` set to
    ``final_n_steps[prop] * pieces / final_pieces`` (when given).  With ``optimizer``, the
    state of every replaced parameter is carried by the prolongation (a restriction drops
    it) and the optimizer's single parameter group is rebuilt in the order of
    ``model.parameters()``.  Returns ``{old parameter: new parameter}`` (a
    :class:`~opsplit.controls.LayerwiseConstant`'s pieces by their first new piece)."""
    memo, replaced = {}, {}
    for prop in propagators(model):
        for parent, name, c in piecewise_controls(prop.scheme, _PIECEWISE):
            P = n_pieces_of(c)
            if P == pieces:
                continue
            if id(c) not in memo:
                new = prolong(c, pieces, kind) if pieces > P else restrict(c, pieces, "sample")
                memo[id(c)] = (c, new)
            setattr(parent, name, memo[id(c)][1])
        if final_n_steps is not None and prop in final_n_steps:
            prop.n_steps = final_n_steps[prop] * pieces // final_pieces
    if optimizer is None:
        return replaced
    if len(optimizer.param_groups) != 1:
        raise ValueError("change_level.optimizer: expected one parameter group (the Trainer's)")
    state = optimizer.state
    for old_c, new_c in memo.values():
        olds, news = _rows_params(old_c), _rows_params(new_c)
        P, Q = n_pieces_of(old_c), n_pieces_of(new_c)
        st = [state.pop(p, None) for p in olds]
        replaced.update({o: news[0] for o in olds})
        if Q < P or not any(st):
            continue
        if isinstance(old_c, PiecewiseLinear):
            # nodes refined on their lines: the node interpolation of prolong
            M, r = node_prolongation_matrix(P, Q), Q // P
        else:
            M, r = prolongation_matrix(P, Q, kind), Q // P
        if isinstance(old_c, LayerwiseConstant):
            if not all(st):
                continue  # a piece without state (never updated): fresh moments for all
            keys = st[0].keys()
            stacked = {}
            for k in keys:
                v = st[0][k]
                if isinstance(v, Tensor) and v.dim() > 0 and v.shape == olds[0].shape:
                    stacked[k] = _state_map(M, r, k, torch.stack([s[k] for s in st]))
            for j, p in enumerate(news):
                src = st[int(M[j].argmax())]
                state[p] = {k: (stacked[k][j].clone() if k in stacked else
                                (v.clone() if isinstance(v, Tensor) else v)) for k, v in src.items()}
        else:
            s0 = st[0]
            if not s0:
                continue
            state[news[0]] = {k: (_state_map(M, r, k, v) if isinstance(v, Tensor) and v.dim() > 0
                                  and v.shape == olds[0].shape else v) for k, v in s0.items()}
    group = optimizer.param_groups[0]
    group["params"] = [p for p in model.parameters() if p.requires_grad]
    return replaced
