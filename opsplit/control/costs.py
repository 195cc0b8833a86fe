r"""Running costs on the controls: :math:`\int_{t_0}^{T} \|\theta'(t)\|^2\,dt` (smoothness) and
:math:`\int_{t_0}^{T} \|\theta(t)\|^2\,dt` (energy), by quadrature in :math:`t` for any
control type.

The objective of paper 002 (eqs. 10 and 12) has only the data term; an optimal-control
problem usually adds a running cost on the control.  Here

.. math::

    R_{\text{smooth}}(\theta) = \sum_c \int_{t_0^c}^{t_1^c} \|\theta_c'(t)\|^2\,dt,
    \qquad
    R_{\text{energy}}(\theta) = \sum_c \int_{t_0^c}^{t_1^c} \|\theta_c(t)\|^2\,dt,

summed over the *leaf controls* :math:`c` of a model (the controls that hold their
parameters themselves: the coefficient control inside a
:class:`~opsplit.controls.CosineSeries`, not the series), with :math:`\|\cdot\|` the
Euclidean norm of the control's stored value (for a series control: of its coefficient
vector).  The positive controls (:math:`\sigma_2`) enter with their values, not their
logarithms.

**Quadrature.**  Each control's interval is cut at its breakpoints (the piece boundaries of
a :class:`~opsplit.controls.PiecewiseConstant`, the nodes of a
:class:`~opsplit.controls.PiecewiseLinear`; none for a
:class:`~opsplit.controls.TimeBasis`).  On every sub-interval the control is sampled at
``m`` Gauss–Legendre nodes; the energy is the Gauss sum of :math:`\|\theta\|^2`, and
:math:`\theta'` is the derivative of the degree-``m - 1`` polynomial interpolating those
samples (a spectral differentiation matrix).  Both are exact for controls polynomial of
degree ``< m`` on the sub-interval: ``m = 1`` for piecewise-constant, ``2`` for
piecewise-linear, ``n_modes`` (+1) for a Legendre/Chebyshev basis; a cosine basis and
unknown control types get more nodes (spectrally accurate).

**Jumps.**  A control with a jump :math:`[\theta]_b` at a breakpoint :math:`b` has no
square-integrable derivative.  The smoothness cost then adds
:math:`\|[\theta]_b\|^2 / \bar h_b` with :math:`\bar h_b` the mean length of the two
sub-intervals meeting at :math:`b`: for a piecewise-constant control with pieces of length
:math:`h` this is :math:`\sum_n \|\theta^{n+1} - \theta^n\|^2 / h`, the exact
:math:`\int \|\tilde\theta'\|^2` of the piecewise-linear interpolant :math:`\tilde\theta`
through the piece midpoints (the discrete :math:`H^1` seminorm of the layer weights).
Continuous controls have no jumps and get no such term.
"""

from __future__ import annotations

import math
from functools import lru_cache

import numpy as np
import torch
from torch import Tensor, nn

from ..controls import Control, LeftLimit, PiecewiseConstant, PiecewiseLinear, TimeBasis
from ..controls.projection import time_breakpoints

__all__ = ["leaf_controls", "smoothness_cost", "energy_cost", "control_interval", "breakpoints", "check_controls"]

# Gauss nodes for controls whose polynomial degree is unknown
_DEFAULT_POINTS = 8


def check_controls(controls, name: str) -> list:
    """``controls`` as a list of :class:`~opsplit.controls.Control` (or ``(name, control)``
    pairs, as :func:`leaf_controls` returns); anything else is refused naming ``name``."""
    if isinstance(controls, (str, bytes, Control)) or not hasattr(controls, "__iter__"):
        raise TypeError(f"{name}: expected a list of opsplit controls (or (name, control) pairs), got "
                        f"{type(controls).__name__}")
    out = list(controls)
    for item in out:
        c = item[1] if isinstance(item, tuple) and len(item) == 2 else item
        if not isinstance(c, Control):
            raise TypeError(f"{name}: expected opsplit controls (opsplit.controls.Control), got {type(c).__name__}")
    return out


def _check_model(model, name: str) -> None:
    if not isinstance(model, nn.Module):
        raise TypeError(f"{name}: expected an nn.Module, got {type(model).__name__}")


def leaf_controls(model: nn.Module) -> list[tuple[str, Control]]:
    """``(name, control)`` for every control of ``model`` that holds trainable parameters
    itself (not through child controls), in module order."""
    out = []
    for name, m in model.named_modules():
        if isinstance(m, Control) and any(p.requires_grad for p in m.parameters(recurse=False)):
            out.append((name, m))
    return out


def control_interval(control: Control, default: tuple[float, float] | None = None):
    """The time interval ``(t0, t1)`` a control is defined on (``default`` for controls
    that do not carry one, such as time-independent ``Constant``)."""
    t0, t1 = getattr(control, "t0", None), getattr(control, "t1", None)
    if t0 is None or t1 is None:
        return default
    return float(t0), float(t1)


def breakpoints(control: Control) -> list[float]:
    """Interior and end points where ``control`` may be non-smooth, sorted, ends included
    (:func:`opsplit.controls.projection.time_breakpoints`)."""
    return time_breakpoints(control)


def _points(control: Control) -> int:
    if isinstance(control, PiecewiseConstant):
        return 1
    if isinstance(control, PiecewiseLinear):
        return 2
    if isinstance(control, TimeBasis):
        return control.n_modes + 1 if control.basis != "cosine" else 2 * control.n_modes + 8
    return _DEFAULT_POINTS


@lru_cache(maxsize=64)
def _gauss(m: int):
    """Gauss–Legendre nodes/weights on [-1, 1] and the differentiation matrix of the
    interpolating polynomial at those nodes (float64 numpy)."""
    x, w = np.polynomial.legendre.leggauss(m)
    # barycentric weights and the spectral differentiation matrix D_ij = l_j'(x_i)
    c = np.array([np.prod([x[i] - x[j] for j in range(m) if j != i]) for i in range(m)])
    D = np.zeros((m, m))
    for i in range(m):
        for j in range(m):
            if i != j:
                D[i, j] = (c[i] / c[j]) / (x[i] - x[j])
        D[i, i] = -D[i].sum()
    return x, w, D


def _samples(control: Control, times) -> Tensor:
    """Values at ``times`` stacked on a new dim 0 (times at a right end read as left limits)."""
    return torch.stack([control(t) for t in times])


def _sub_intervals(control: Control):
    pts = breakpoints(control)
    return list(zip(pts[:-1], pts[1:]))


def _cost(control: Control, kind: str) -> Tensor:
    intervals = _sub_intervals(control)
    m = _points(control)
    x, w, D = _gauss(m)
    total = None
    for a, b in intervals:
        half = 0.5 * (b - a)
        ts = [a + half * (1.0 + xi) for xi in x]
        v = _samples(control, ts).reshape(len(ts), -1)  # (m, numel); scalar controls too
        wq = torch.as_tensor(w * half, dtype=v.dtype, device=v.device)
        if kind == "energy":
            term = (wq[:, None] * v.square()).sum()
        else:
            if m == 1:
                continue
            Dm = torch.as_tensor(D / half, dtype=v.dtype, device=v.device)
            term = (wq[:, None] * (Dm @ v).square()).sum()
        total = term if total is None else total + term
    if kind == "smoothness":
        for (a0, b0), (a1, b1) in zip(intervals[:-1], intervals[1:]):
            jump = control(a1) - control(LeftLimit(a1))
            hbar = 0.5 * ((b0 - a0) + (b1 - a1))
            term = jump.square().sum() / hbar
            total = term if total is None else total + term
    if total is None:
        p = next(control.parameters())
        total = torch.zeros((), dtype=p.dtype, device=p.device)
    return total


def _constant_energy(control: Control, interval) -> Tensor:
    v = control()
    return (interval[1] - interval[0]) * v.square().sum()


def _sum_over(model, kind: str, controls, default_interval) -> Tensor:
    fn = "smoothness_cost" if kind == "smoothness" else "energy_cost"
    _check_model(model, f"{fn}.model")
    items = leaf_controls(model) if controls is None else check_controls(controls, f"{fn}.controls")
    total = None
    for item in items:
        c = item[1] if isinstance(item, tuple) else item
        iv = control_interval(c)
        if iv is None:
            if kind == "smoothness":
                continue  # a time-independent control has theta' = 0
            if default_interval is None:
                raise ValueError(
                    f"energy_cost: {type(c).__name__} carries no time interval; pass the "
                    "model's [t0, T] as default_interval"
                )
            term = _constant_energy(c, default_interval)
        else:
            term = _cost(c, kind)
        total = term if total is None else total + term
    if total is None:
        p = next(model.parameters(), None)
        return torch.zeros((), dtype=p.dtype if p is not None else torch.get_default_dtype())
    return total


def smoothness_cost(model: nn.Module, *, controls=None) -> Tensor:
    r""":math:`\sum_c \int \|\theta_c'(t)\|^2 dt` over the leaf controls of ``model`` (or the
    given ``controls``), jumps included (module docstring)."""
    return _sum_over(model, "smoothness", controls, None)


def energy_cost(model: nn.Module, *, controls=None, default_interval=None) -> Tensor:
    r""":math:`\sum_c \int \|\theta_c(t)\|^2 dt` over the leaf controls of ``model`` (or the
    given ``controls``).  Time-independent controls count over ``default_interval``
    ``(t0, T)`` (the model's time interval; the trainer passes it)."""
    if default_interval is not None:
        ok = isinstance(default_interval, (tuple, list)) and len(default_interval) == 2 and all(
            isinstance(v, (int, float)) and not isinstance(v, bool) for v in default_interval)
        if not ok:
            raise TypeError(f"energy_cost.default_interval: expected a pair of numbers (t0, T), got "
                            f"{default_interval!r}")
        a, b = (float(v) for v in default_interval)
        if not (math.isfinite(a) and math.isfinite(b) and b > a):
            raise ValueError(f"energy_cost.default_interval: expected t0 < T, got {default_interval!r}")
        default_interval = (a, b)
    return _sum_over(model, "energy", controls, default_interval)
