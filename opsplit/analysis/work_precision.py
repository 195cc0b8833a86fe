r"""Work–precision measurements: error against work for fixed-step schemes, adaptive
solves and torchdiffeq on the unsplit model.

**Work** is counted three ways for every run:

* *substep calls* — from :class:`~opsplit.solution.SolveStats` (a splitting's unit of work;
  not defined for an unsplit solve);
* *term evaluations* — evaluations :math:`A_k(t; u)` of one smooth term's vector field,
  counted on the operators themselves while the run lasts (an explicit-Euler substep costs
  1, Heun 2, RK4 4; one evaluation of the unsplit field by torchdiffeq costs :math:`K`, one
  per term): the unit in which a splitting and an unsplit solver compare;
* *wall time* — the median of ``repeats`` runs (``time.perf_counter``).

**Error**: the relative discrete :math:`L^2` error at the final time against a reference
(:func:`~opsplit.analysis.relative_error`).
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import asdict, dataclass, field

import numpy as np
import torch
from torch import Tensor

from ..controls.timepoints import LeftLimit
from ..operators import ProjectionS1
from ..operators.layernorm import project_s1
from ..reference import ReferenceField, solve_reference, unsplit_terms
from .convergence import relative_error

__all__ = [
    "WorkPoint",
    "count_field_evaluations",
    "run_fixed",
    "run_adaptive",
    "run_unsplit",
    "cheapest_fixed",
    "plot_work_precision",
]


@dataclass
class WorkPoint:
    """One run: a method at one setting (``N_t`` or a tolerance) and its cost and error."""

    method: str
    setting: float
    error: float
    evaluations: int
    seconds: float
    substep_calls: int | None = None
    accepted: int | None = None
    rejected: int | None = None
    meta: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return asdict(self)


@contextlib.contextmanager
def count_field_evaluations(operators):
    """Count calls of ``op.field`` for each operator while the block runs; yields a one-item
    list holding the total.  (Counts per call: a batched parallel group evaluating several
    terms in one vmapped call counts once, so use ``batch=False`` schemes when counting.)"""
    total = [0]
    saved = []
    for op in operators:
        original = op.field

        def counted(t, u, grid, _f=original):
            total[0] += 1
            return _f(t, u, grid)

        saved.append((op, "field" in op.__dict__, op.__dict__.get("field")))
        op.field = counted
    try:
        yield total
    finally:
        for op, had, old in saved:
            if had:
                op.field = old
            else:
                del op.field


def _timed(fn, repeats: int):
    out, secs = None, []
    for _ in range(max(1, repeats)):
        t = time.perf_counter()
        out = fn()
        secs.append(time.perf_counter() - t)
    return out, float(np.median(secs))


def run_fixed(
    method: str, prop, f: Tensor, ref: Tensor, n_steps, terms, *, grid=None, repeats: int = 1
):
    """``prop.solve(f, n_steps=N)`` for each ``N``: a list of :class:`WorkPoint`."""
    out = []
    for n in n_steps:
        with torch.no_grad():
            with count_field_evaluations(terms) as ev:
                sol = prop.solve(f, n_steps=int(n))
            _, secs = _timed(lambda n=n: prop.solve(f, n_steps=int(n)), repeats)
        out.append(
            WorkPoint(
                method,
                int(n),
                relative_error(sol.u, ref, grid),
                ev[0],
                secs,
                sol.stats.n_substep_calls,
                sol.stats.n_accepted,
                0,
            )
        )
    return out


def run_adaptive(
    method: str,
    prop,
    f: Tensor,
    ref: Tensor,
    rtols,
    terms,
    *,
    atol_factor: float = 1e-3,
    grid=None,
    repeats: int = 1,
    **solve_kwargs,
):
    """``prop.solve(f, rtol=r, atol=atol_factor * r, ...)`` for each ``r``."""
    out = []
    for r in rtols:
        kw = dict(rtol=float(r), atol=atol_factor * float(r), **solve_kwargs)
        with torch.no_grad():
            with count_field_evaluations(terms) as ev:
                sol = prop.solve(f, **kw)
            _, secs = _timed(lambda kw=kw: prop.solve(f, **kw), repeats)
        out.append(
            WorkPoint(
                method,
                float(r),
                relative_error(sol.u, ref, grid),
                ev[0],
                secs,
                sol.stats.n_substep_calls,
                sol.stats.n_accepted,
                sol.stats.n_rejected,
            )
        )
    return out


def _torchode_solve(
    operators, f: Tensor, *, t0: float, t1: float, grid, rtol: float, atol: float
) -> Tensor:
    """The unsplit model (as :func:`opsplit.reference.solve_reference` sets it up: the smooth
    terms' sum, or the z-field of the S1 constraint) by torchode's Tsit5 with its integral
    step-size controller; the whole batch as one ODE (the controls take one time)."""
    import torchode  # optional: the benchmarks' extra (opsplit[benchmarks])

    fields, constraint = unsplit_terms(list(operators))
    rhs = ReferenceField(fields, constraint)
    g = grid.with_shape(f.shape[-2], f.shape[-1])
    z0 = f if constraint is None else project_s1(f, 0.0, 1.0, g)
    shape = z0.shape

    def fn(t, y):
        return rhs.field(float(t[0]), y.reshape(shape), g).reshape(1, -1)

    term = torchode.ODETerm(fn)
    method = torchode.Tsit5(term=term)
    control = torchode.IntegralController(atol=atol, rtol=rtol, term=term)
    solver = torchode.AutoDiffAdjoint(method, control)
    ts = torch.tensor([[t0, t1]], dtype=f.dtype, device=f.device)
    sol = solver.solve(torchode.InitialValueProblem(y0=z0.reshape(1, -1), t_eval=ts))
    return rhs.to_u(LeftLimit(t1), sol.ys[0, -1].reshape(shape), g)


def run_unsplit(
    method: str,
    operators,
    f: Tensor,
    ref: Tensor,
    rtols,
    *,
    t0: float,
    t1: float,
    grid,
    solver: str = "dopri5",
    atol_factor: float = 1e-3,
    repeats: int = 1,
):
    """The unsplit model at each ``rtol`` by torchdiffeq (``solver`` one of its methods, via
    :func:`opsplit.reference.solve_reference`) or, for ``solver="tsit5"`` (which torchdiffeq
    does not have), by torchode's Tsit5; evaluations count every term's field once per
    unsplit evaluation."""
    smooth = [op for op in operators if not isinstance(op, ProjectionS1)]
    out = []
    for r in rtols:
        atol = atol_factor * float(r)
        if solver == "tsit5":

            def call(r=r, atol=atol):
                return _torchode_solve(
                    operators, f, t0=t0, t1=t1, grid=grid, rtol=float(r), atol=atol
                )
        else:

            def call(r=r, atol=atol):
                return solve_reference(
                    list(operators),
                    f,
                    t0=t0,
                    t1=t1,
                    grid=grid,
                    rtol=float(r),
                    atol=atol,
                    method=solver,
                )

        with torch.no_grad():
            with count_field_evaluations(smooth) as ev:
                u = call()
            _, secs = _timed(call, repeats)
        out.append(WorkPoint(method, float(r), relative_error(u, ref, grid), ev[0], secs))
    return out


def cheapest_fixed(
    prop,
    f: Tensor,
    ref: Tensor,
    error: float,
    *,
    grid=None,
    n_max: int = 4096,
    cache: dict | None = None,
):
    """The smallest ``N_t <= n_max`` whose fixed-step error is at most ``error`` (bisection:
    the errors are assumed to decrease with ``N_t``), and its :class:`SolveStats`; ``(None,
    None)`` if ``n_max`` does not reach it.  ``cache`` (a dict) keeps the solves of earlier
    calls for the same propagator."""
    cache = {} if cache is None else cache

    def err(n):
        if n not in cache:
            with torch.no_grad():
                sol = prop.solve(f, n_steps=n)
            cache[n] = (relative_error(sol.u, ref, grid), sol.stats)
        return cache[n][0]

    hi = 1
    while err(hi) > error:
        if hi >= n_max:
            return None, None
        hi = min(2 * hi, n_max)
    if hi == 1:
        return 1, cache[1][1]
    lo = hi // 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if err(mid) <= error else (mid, hi)
    return hi, cache[hi][1]


def plot_work_precision(points, axes=None, title: str | None = None):
    """Three log-log panels, one line per method: error against substep calls (splitting
    runs only), against term field evaluations, and against wall time; returns the figure."""
    import matplotlib.pyplot as plt  # heavy (~0.4 s): loaded only to plot

    if axes is None:
        fig, axes = plt.subplots(1, 3, figsize=(16, 4.8), layout="constrained")
    fig = axes[0].figure
    for m in dict.fromkeys(p.method for p in points):
        pts = [p for p in points if p.method == m and p.error > 0]
        if not pts:
            continue
        unsplit = pts[0].substep_calls is None
        style = "s--" if unsplit else ("o-" if "adaptive" in m else ".-")
        err = [p.error for p in pts]
        (line,) = axes[1].loglog([p.evaluations for p in pts], err, style, label=m)
        if not unsplit:
            axes[0].loglog(
                [p.substep_calls for p in pts], err, style, color=line.get_color(), label=m
            )
        axes[2].loglog([p.seconds for p in pts], err, style, color=line.get_color(), label=m)
    for ax, xl in zip(axes, ("substep calls", "term field evaluations", "wall time (s)")):
        ax.set_xlabel(xl)
        ax.set_ylabel("relative error at T")
        ax.grid(True, which="both", alpha=0.3)
    axes[1].legend(fontsize=7)
    if title:
        fig.suptitle(title)
    return fig
