r"""Controls re-expressed in another time discretisation: the :math:`L^2(t_0, t_1)`
projection.

The time controls of opsplit (:class:`~opsplit.controls.PiecewiseConstant`,
:class:`~opsplit.controls.PiecewiseLinear`, :class:`~opsplit.controls.TimeBasis`) are
linear in their stored rows :math:`r_i` (for a ``positive`` control: in the logarithm of
the values):

.. math::  R(t) = \sum_i w_i(t)\, r_i .

Given a source control :math:`R_s` and a target discretisation with weight functions
:math:`w^{t}_i`, :func:`project_time` returns the rows of the target that minimise
:math:`\int_{t_0}^{t_1} \|R_t(t) - R_s(t)\|^2 dt` (normal equations
:math:`M r = b`, :math:`M_{ij} = \int w^t_i w^t_j`, :math:`b_i = \int w^t_i R_s`, by
Gauss–Legendre quadrature on every interval between the breakpoints of both, exact for
these piecewise-polynomial functions).  Consequences:

* a control refined onto a finer grid of the same kind (``PiecewiseConstant`` with
  :math:`N_t \to 2N_t` pieces, ``PiecewiseLinear`` with nodes :math:`\to` nodes and
  midpoints) is reproduced *exactly* — the same function of :math:`t`;
* coarsening gives the best :math:`L^2` approximation (piece averages for
  ``PiecewiseConstant``);
* changing the kind (piecewise-constant layers to a piecewise-linear or a smooth basis
  control) gives the closest control of the new kind.

The projection acts on the stored rows, so a positive control is projected in
:math:`\log`; trailing (spatial) dimensions are carried along unchanged.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from .base import Control
from .layerwise import LayerwiseConstant
from .piecewise import PiecewiseConstant
from .piecewise_linear import PiecewiseLinear
from .time_basis import TimeBasis

__all__ = ["TIME_CONTROLS", "project_time", "time_weights", "time_breakpoints", "time_rows"]

#: the time controls :func:`project_time` handles
TIME_CONTROLS = (PiecewiseConstant, PiecewiseLinear, TimeBasis)


def time_rows(control: Control) -> Tensor:
    """The stored rows (``raw`` of a table control, ``coefficients`` of a basis control)."""
    if isinstance(control, (PiecewiseConstant, PiecewiseLinear)):
        return control.raw
    if isinstance(control, TimeBasis):
        return control.coefficients
    raise TypeError(f"expected a time control {[c.__name__ for c in TIME_CONTROLS]}, got {type(control).__name__}")


def _probe(control: Control):
    """A scalar copy of ``control``'s discretisation whose rows are the unit vectors: its
    value at ``t`` is the weight vector :math:`w(t)`."""
    n = time_rows(control).shape[0]
    eye = torch.eye(n, dtype=torch.float64)
    if isinstance(control, PiecewiseConstant):
        return PiecewiseConstant(eye, t0=control.t0, t1=control.t1, requires_grad=False)
    if isinstance(control, PiecewiseLinear):
        return PiecewiseLinear(eye, t0=control.t0, t1=control.t1, requires_grad=False)
    return TimeBasis(eye, t0=control.t0, t1=control.t1, basis=control.basis, requires_grad=False)


def time_weights(control: Control, times) -> Tensor:
    """``(len(times), n_rows)`` float64: the weights :math:`w_i(t)` of ``control``'s rows."""
    p = _probe(control)
    with torch.no_grad():
        return torch.stack([p(t) for t in times])


def time_breakpoints(control: Control) -> list[float]:
    """Where the weight functions are not smooth (ends included); a
    :class:`~opsplit.controls.LayerwiseConstant` is piecewise constant (a parameter per
    piece) and has the same piece ends."""
    t0, t1 = control.t0, control.t1
    pts = {t0, t1}
    if isinstance(control, (PiecewiseConstant, LayerwiseConstant)):
        n = control.n_pieces
        pts.update(t0 + (t1 - t0) * i / n for i in range(n + 1))
    elif isinstance(control, PiecewiseLinear):
        pts.update(control.breakpoints())
    return sorted(pts)


def _degree(control: Control) -> int:
    if isinstance(control, PiecewiseConstant):
        return 0
    if isinstance(control, PiecewiseLinear):
        return 1
    return control.n_modes + (8 if control.basis == "cosine" else 0)


def project_time(source: Control, target: Control) -> Tensor:
    """The rows of ``target``'s discretisation closest in :math:`L^2(t_0, t_1)` to
    ``source`` (module docstring).  Returns a tensor shaped like ``target``'s rows
    (dtype/device of the target); ``target`` itself is not modified.

    Raises ``ValueError`` when the time intervals differ, when the row shapes (the
    spatial/value dimensions after the first) differ, or when the positivity differs.
    """
    for c, name in ((source, "source"), (target, "target")):
        if not isinstance(c, TIME_CONTROLS):
            raise TypeError(
                f"project_time.{name}: expected one of {[k.__name__ for k in TIME_CONTROLS]}, "
                f"got {type(c).__name__}"
            )
    if not (np.isclose(source.t0, target.t0) and np.isclose(source.t1, target.t1)):
        raise ValueError(
            f"project_time: time intervals differ: source [{source.t0:g}, {source.t1:g}], target "
            f"[{target.t0:g}, {target.t1:g}]"
        )
    rs, rt = time_rows(source), time_rows(target)
    if tuple(rs.shape[1:]) != tuple(rt.shape[1:]):
        raise ValueError(
            f"project_time: value shapes differ: source {tuple(rs.shape[1:])}, target {tuple(rt.shape[1:])}"
        )
    if bool(getattr(source, "positive", False)) != bool(getattr(target, "positive", False)):
        raise ValueError("project_time: one control is positive (log-parametrised), the other is not")
    pts = sorted(set(time_breakpoints(source)) | set(time_breakpoints(target)))
    # drop near-duplicates from round-off
    cuts = [pts[0]]
    for p in pts[1:]:
        if p - cuts[-1] > 1e-12 * max(1.0, abs(p)):
            cuts.append(p)
    m = max(_degree(source), _degree(target)) + 2  # exact for the products of weights
    x, w = np.polynomial.legendre.leggauss(m)
    times, weights = [], []
    for a, b in zip(cuts[:-1], cuts[1:]):
        half = 0.5 * (b - a)
        times += [a + half * (1.0 + xi) for xi in x]
        weights += list(w * half)
    W = torch.as_tensor(weights, dtype=torch.float64)
    Ws, Wt = time_weights(source, times), time_weights(target, times)  # (Q, n_s), (Q, n_t)
    src = rs.detach().to(torch.float64).reshape(rs.shape[0], -1)
    samples = Ws @ src  # (Q, numel)
    M = Wt.T @ (W[:, None] * Wt)
    rhs = Wt.T @ (W[:, None] * samples)
    rows = torch.linalg.solve(M, rhs)
    return rows.reshape(rt.shape).to(dtype=rt.dtype, device=rt.device)
