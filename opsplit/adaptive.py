r"""Adaptive time steps for a splitting scheme: a local error estimate and a PI controller.

A splitting scheme of order :math:`p` has no embedded Runge–Kutta pair; its local error
is estimated here from the scheme itself.

**Step doubling** (:class:`StepDoubling`, the default; Richardson's estimate, Hairer,
Nørsett & Wanner, *Solving ODEs I*, §II.4).  From :math:`u^n` take one step
:math:`v = \Psi_h(u^n)` and two half steps :math:`w = \Psi_{h/2}\Psi_{h/2}(u^n)`.  With
the local error :math:`\Psi_h(u) - \varphi_h(u) = C(u) h^{p+1} + O(h^{p+2})` the two half
steps err by :math:`2 C (h/2)^{p+1} + O(h^{p+2})`, so

.. math::  \mathrm{err} = \frac{w - v}{2^p - 1} = w - \varphi_h(u^n) + O(h^{p+2}):

an estimate of the local error of the propagated value :math:`w` that is asymptotically
exact (the estimate has the order :math:`p + 1` of the error it estimates).  It works for
every scheme (Lie, Strang, parallel, hybrid, the compositions) with the scheme's
``effective_order`` as :math:`p`, keeps the structure of the scheme (the propagated
value is a splitting solution: no affine combination that would leave :math:`S_1`), and
costs three steps per attempt (the full step's work is 1/3: 50% over the two half steps
it accepts).  The propagated value is not extrapolated.

**Embedded pair** (:class:`EmbeddedPair`): a scheme and a companion of another order on
the same substeps, e.g. Strang against Lie, or Blanes–Moan against Strang:
:math:`\mathrm{err} = \Psi_h(u) - \hat\Psi_h(u)`, an estimate of the lower-order
method's local error, :math:`O(h^{\min(p, \hat p) + 1})`; the higher-order value is
propagated (local extrapolation), so the estimate is pessimistic by
:math:`h^{|p - \hat p|}` and the achieved error falls well below the tolerance.  No
stages are shared (a splitting companion sharing the substeps of a composition and of
order :math:`p - 1` does not come for free: the order conditions of the Lie/adjoint
sweeps leave only the method itself in the obvious families).  The defect-based
estimators of Auzinger, Koch & Thalhammer need derivatives of every substep's flow
(variational equations of each operator), which the operator interface does not offer.

**The controller** (:class:`PIController`, Gustafsson's PI control as in diffrax's
``PIDController`` with ``pcoeff = 0.4``, ``icoeff = 0.3``).  The error norm of a sample
is the root mean square of :math:`\mathrm{err}_i / (\mathrm{atol} + \mathrm{rtol}
\max(|u^n_i|, |u^{n+1}_i|))` over its entries; a batch solved together takes the
**largest** sample norm (every sample meets the tolerance).  A step is accepted when the
norm :math:`E_n \le 1`; the next step is
:math:`h \cdot \mathrm{clip}(s\, E_n^{-0.7/k}\, E_{n-1}^{0.4/k},\ f_\min, f_\max)` with
:math:`k = p + 1` (:math:`s = 0.9`; after a rejection :math:`h \cdot \max(f_\min, s
E_n^{-1/k})`, no growth).  The decisions are made on detached values: they are not
differentiated (the gradient is that of the discrete solution on the accepted grid).

**Times.**  Steps end exactly at the requested output times (``t_eval``) and at the
breakpoints of piecewise controls (:func:`opsplit.controls.projection.time_breakpoints`;
the piece ends of a :class:`~opsplit.controls.LayerwiseConstant`, a decoder's layers), as
torchdiffeq's ``step_t``/``jump_t``: a splitting step has no dense output, and a step
across a breakpoint loses the scheme's order.  The controls :math:`\theta(t)` are
evaluated by the substeps at the accepted steps' own times.

**Failures, never a hang.**  ``max_steps`` bounds the attempts (accepted + rejected);
reaching it raises :class:`AdaptiveStepError` (default) or, with
``on_failure="return"``, returns the state where the solve stopped with
``stats.success = False`` and the reason in ``stats.message``.  A non-finite error
estimate rejects the step (the state left the float range, or the step was too large for
the substeps); a step size below ``min_step`` or below
:math:`16\,\epsilon\max(1, |t|)` (underflow) raises :class:`AdaptiveStepError` at once.

**Per sample** (``per_sample=True``): each sample of the batch is solved alone, with its
own accepted steps (so its output equals the solve of that sample alone, and an easy
input takes fewer steps: adaptive depth); statistics per sample in
``stats.per_sample``.  Per batch (default): one step sequence for the whole batch.

**Gradients.**  With autograd recording, the accepted attempts are recorded as they are
computed (the full step of step doubling and the companion of a pair run without a
graph).  When the propagator is configured for gradient checkpointing
(:attr:`~opsplit.Propagator.checkpoint_every`, set by ``opsplit.control``'s
``"checkpoint"`` and ``"adjoint"`` modes), the step sizes are decided first without a
graph and the accepted grid (for step doubling, its half steps) is then replayed by the
propagator's checkpointed loop; it computes the same numbers.  The adjoint mode's
``ODESolve`` substeps run their continuous adjoint in either case.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from .grid import Grid
from .propagator import Propagator
from .schemes.base import Scheme, changes_grid
from .solution import Solution, SolveStats, count_substep_calls

__all__ = [
    "PIController",
    "StepDoubling",
    "EmbeddedPair",
    "AdaptiveStepError",
    "AdaptivePropagator",
    "solve_adaptive",
    "ON_FAILURE",
]

#: what happens when ``max_steps`` is reached
ON_FAILURE = ("raise", "return")


class AdaptiveStepError(RuntimeError):
    """An adaptive solve could not reach its final time (``max_steps`` reached, or the step
    size underflowed)."""


def _positive(x, name: str, *, allow_inf: bool = False) -> float:
    if (
        isinstance(x, bool)
        or not isinstance(x, (int, float))
        and not (isinstance(x, Tensor) and x.numel() == 1)
    ):
        raise TypeError(f"{name}: expected a number, got {type(x).__name__}")
    v = float(x)
    if math.isnan(v) or v <= 0 or (math.isinf(v) and not allow_inf):
        raise ValueError(f"{name}: expected a finite number > 0, got {x!r}")
    return v


@dataclass(frozen=True)
class PIController:
    """Tolerances and the PI step-size controller (see the module docstring).

    Args:
        rtol, atol: relative and absolute tolerance, finite and > 0.
        first_step: the first step size; ``None``: a sixteenth of the interval (and never
            beyond the first output time or breakpoint).
        min_step: a smaller step size raises :class:`AdaptiveStepError` (``0``: only the
            round-off limit :math:`16\\,\\epsilon\\max(1, |t|)`).
        max_step: the largest step size (``inf``: no limit).
        max_steps: the largest number of attempts (accepted + rejected).
        safety, factor_min, factor_max: :math:`s`, :math:`f_\\min`, :math:`f_\\max`.
        pcoeff, icoeff: the PI coefficients (diffrax's names; ``pcoeff = icoeff = 0``
            with ``icoeff`` alone is I control).
    """

    rtol: float = 1e-6
    atol: float = 1e-9
    first_step: float | None = None
    min_step: float = 0.0
    max_step: float = math.inf
    max_steps: int = 10_000
    safety: float = 0.9
    factor_min: float = 0.2
    factor_max: float = 10.0
    pcoeff: float = 0.4
    icoeff: float = 0.3

    def __post_init__(self):
        object.__setattr__(self, "rtol", _positive(self.rtol, "rtol"))
        object.__setattr__(self, "atol", _positive(self.atol, "atol"))
        if self.first_step is not None:
            object.__setattr__(self, "first_step", _positive(self.first_step, "first_step"))
        if (
            isinstance(self.min_step, bool)
            or not isinstance(self.min_step, (int, float))
            or not (math.isfinite(self.min_step) and self.min_step >= 0)
        ):
            raise ValueError(f"min_step: expected a finite number >= 0, got {self.min_step!r}")
        object.__setattr__(self, "max_step", _positive(self.max_step, "max_step", allow_inf=True))
        if self.min_step > self.max_step:
            raise ValueError(
                f"min_step: expected min_step <= max_step, got {self.min_step} > {self.max_step}"
            )
        if (
            isinstance(self.max_steps, bool)
            or not isinstance(self.max_steps, int)
            or self.max_steps < 1
        ):
            raise ValueError(f"max_steps: expected an integer >= 1, got {self.max_steps!r}")
        if not 0 < self.safety <= 1:
            raise ValueError(f"safety: expected 0 < safety <= 1, got {self.safety!r}")
        if not 0 < self.factor_min < 1 < self.factor_max:
            raise ValueError(
                f"factor_min, factor_max: expected 0 < factor_min < 1 < factor_max, got "
                f"{self.factor_min!r}, {self.factor_max!r}"
            )
        for name in ("pcoeff", "icoeff"):
            v = getattr(self, name)
            if not (isinstance(v, (int, float)) and math.isfinite(v) and v >= 0):
                raise ValueError(f"{name}: expected a finite number >= 0, got {v!r}")

    def error_norm(self, err: Tensor, u0: Tensor, u1: Tensor) -> Tensor:
        """Per-sample RMS of ``err / (atol + rtol max(|u0|, |u1|))`` (detached, float64)."""
        with torch.no_grad():
            scale = self.atol + self.rtol * torch.maximum(u0.abs(), u1.abs())
            r = (err / scale).to(torch.float64)
            return r.flatten(1).square().mean(1).sqrt()

    def factor(self, err: float, prev: float, k: int) -> float:
        """The step-size factor after an accepted step with norm ``err`` (previous ``prev``)."""
        if err == 0.0:
            return self.factor_max
        f = self.safety * err ** (-(self.pcoeff + self.icoeff) / k) * prev ** (self.pcoeff / k)
        return min(self.factor_max, max(self.factor_min, f))

    def reject_factor(self, err: float, k: int) -> float:
        """The step-size factor after a rejection (no growth)."""
        if not math.isfinite(err):
            return self.factor_min
        return min(1.0, max(self.factor_min, self.safety * err ** (-1.0 / k)))


class StepDoubling:
    r"""Step doubling: one step against two half steps (module docstring).  The propagated
    value is the two half steps (``extrapolate=False``) or their Richardson extrapolation
    :math:`w + \mathrm{err}` (``extrapolate=True``); the estimate is of the two half
    steps' error, order ``effective_order`` + 1.

    Args:
        scheme: the scheme.
        extrapolate: propagate :math:`w + (w - v)/(2^p - 1)` (local extrapolation): order
            :math:`p + 1`, and :math:`p + 2` for a symmetric scheme whose substeps are
            solved to order :math:`\ge p + 2` (Strang with RK4 substeps: order 4 for the
            cost of three Strang steps).  An affine combination of two splitting solutions:
            it does not stay on :math:`S_1` or in :math:`S_2` (off by the local error).
    """

    name = "step doubling"

    def __init__(self, scheme: Scheme, *, extrapolate: bool = False):
        if not isinstance(scheme, Scheme):
            raise TypeError(
                f"StepDoubling.scheme: expected an opsplit Scheme, got {type(scheme).__name__}"
            )
        if extrapolate not in (True, False):
            raise TypeError(
                f"StepDoubling.extrapolate: expected True or False, got {extrapolate!r}"
            )
        self.scheme = scheme
        self.extrapolate = extrapolate

    @property
    def order(self) -> int:
        """The order :math:`p` of the error being estimated (the controller's :math:`k = p + 1`)."""
        return int(min(self.scheme.effective_order, 30))

    def _halves(self, t: float, t_next: float, u: Tensor, grid) -> Tensor:
        mid = t + 0.5 * (t_next - t)
        w = self.scheme.step(t, mid - t, u, grid)
        return self.scheme.step(mid, t_next - mid, w, grid)

    def propagate(self, t: float, t_next: float, u: Tensor, grid) -> Tensor:
        """The propagated value of an accepted step (recomputed by a checkpointed replay)."""
        w = self._halves(t, t_next, u, grid)
        if not self.extrapolate:
            return w
        v = self.scheme.step(t, t_next - t, u, grid)
        return w + (w - v) / (2.0**self.order - 1.0)

    def attempt(self, t: float, t_next: float, u: Tensor, grid, record: bool):
        """``(propagated value, error estimate)`` of a step ``[t, t_next]``; the value is
        recorded by autograd when ``record``, the estimate never."""
        if self.extrapolate:
            with torch.set_grad_enabled(record and torch.is_grad_enabled()):
                w = self._halves(t, t_next, u, grid)
                v = self.scheme.step(t, t_next - t, u, grid)
                err = (w - v) / (2.0**self.order - 1.0)
            return w + err, err.detach()
        with torch.set_grad_enabled(record and torch.is_grad_enabled()):
            w = self._halves(t, t_next, u, grid)
        with torch.no_grad():
            v = self.scheme.step(t, t_next - t, u, grid)
            err = (w.detach() - v) / (2.0**self.order - 1.0)
        return w, err


class EmbeddedPair:
    """A scheme and a companion of another order on the same substeps; the scheme's value
    is propagated, ``err = scheme - companion`` (module docstring)."""

    name = "embedded pair"

    def __init__(self, scheme: Scheme, companion: Scheme):
        for name, s in (("scheme", scheme), ("companion", companion)):
            if not isinstance(s, Scheme):
                raise TypeError(
                    f"EmbeddedPair.{name}: expected an opsplit Scheme, got {type(s).__name__}"
                )
        ops = {id(op) for sub in scheme.substeps for op in sub.terms}
        other = [
            type(op).__name__ for sub in companion.substeps for op in sub.terms if id(op) not in ops
        ]
        if other:
            raise ValueError(
                f"EmbeddedPair: the companion's operators {other} are not the scheme's; build both "
                "schemes on the same operators"
            )
        if scheme.effective_order == companion.effective_order:
            raise ValueError(
                f"EmbeddedPair: the scheme and the companion have the same effective order "
                f"{scheme.effective_order}; the difference would not estimate either's error "
                "(use StepDoubling)"
            )
        self.scheme, self.companion = scheme, companion

    @property
    def order(self) -> int:
        return int(min(self.scheme.effective_order, self.companion.effective_order, 30))

    def propagate(self, t: float, t_next: float, u: Tensor, grid) -> Tensor:
        return self.scheme.step(t, t_next - t, u, grid)

    def attempt(self, t: float, t_next: float, u: Tensor, grid, record: bool):
        with torch.set_grad_enabled(record and torch.is_grad_enabled()):
            w = self.scheme.step(t, t_next - t, u, grid)
        with torch.no_grad():
            err = w.detach() - self.companion.step(t, t_next - t, u, grid)
        return w, err


def _estimator(scheme, estimator):
    if estimator is None or estimator == "doubling":
        return StepDoubling(scheme)
    if estimator == "extrapolate":
        return StepDoubling(scheme, extrapolate=True)
    if isinstance(estimator, Scheme):
        return EmbeddedPair(scheme, estimator)
    if isinstance(estimator, (StepDoubling, EmbeddedPair)):
        if estimator.scheme is not scheme:
            raise ValueError("estimator: it must be built on the propagator's own scheme")
        return estimator
    raise TypeError(
        f"estimator: expected 'doubling', 'extrapolate', a companion Scheme (embedded pair), a StepDoubling or an "
        f"EmbeddedPair, got {type(estimator).__name__}"
    )


def _stops(t0: float, t1: float, t_eval, breakpoints) -> tuple[list[float], list[float]]:
    tol = 1e-12 * max(1.0, abs(t0), abs(t1))
    outs = []
    if t_eval is not None:
        try:
            outs = [float(s) for s in (t_eval.tolist() if isinstance(t_eval, Tensor) else t_eval)]
        except (TypeError, ValueError):
            raise TypeError(f"t_eval: expected a sequence of numbers, got {t_eval!r}") from None
        if not outs:
            raise ValueError("t_eval: expected at least one output time")
        if any(not math.isfinite(s) for s in outs):
            raise ValueError(f"t_eval: expected finite times, got {outs}")
        if any(b <= a for a, b in zip(outs[:-1], outs[1:])):
            raise ValueError(f"t_eval: expected strictly increasing times, got {outs}")
        if outs[0] < t0 - tol or outs[-1] > t1 + tol:
            raise ValueError(f"t_eval: times must lie in [t0, t1] = [{t0:g}, {t1:g}], got {outs}")
    stops = sorted({s for s in outs + list(breakpoints) if t0 + tol < s < t1 - tol} | {t1})
    return stops, outs


def _one(
    est,
    ctl: PIController,
    f: Tensor,
    grid: Grid,
    t0: float,
    t1: float,
    stops,
    outs,
    on_failure: str,
    record: bool,
):
    """The adaptive loop for one batch: ``(u, {t: state}, stats)``."""
    k = est.order + 1
    tol = 1e-12 * max(1.0, abs(t0), abs(t1))
    t, u = t0, f
    h = ctl.first_step if ctl.first_step is not None else (t1 - t0) / 16.0
    h = min(h, ctl.max_step)
    prev = 1.0
    times = [t0]
    saved = {}
    if outs and abs(outs[0] - t0) <= tol:
        saved[outs[0]] = f
    stats = SolveStats(times=times)
    si, e_last = 0, float("nan")
    while t < t1 - tol:
        if stats.n_steps >= ctl.max_steps:
            msg = (
                f"max_steps = {ctl.max_steps} attempts reached at t = {t:.6g} of [{t0:g}, {t1:g}] "
                f"({stats.n_accepted} accepted, {stats.n_rejected} rejected, last step {h:.3g}); raise "
                "max_steps or loosen rtol/atol"
            )
            if on_failure == "raise":
                raise AdaptiveStepError(f"adaptive solve: {msg}")
            stats.success, stats.message = False, msg
            break
        while stops[si] <= t + tol:
            si += 1
        stop = stops[si]
        limit = max(16.0 * torch.finfo(f.dtype).eps * max(1.0, abs(t)), ctl.min_step)
        if h < limit:
            raise AdaptiveStepError(
                f"adaptive solve: step size underflow at t = {t:.6g}: the step {h:.3g} is below "
                f"{'min_step' if ctl.min_step >= limit and ctl.min_step > 0 else 'the round-off limit'} {limit:.3g} "
                f"(last error norm {e_last:.3g}); the tolerance rtol={ctl.rtol:g}, atol={ctl.atol:g} cannot be "
                "met (or the state left the float range)"
            )
        clipped = t + h >= stop - tol
        t_next = stop if clipped else t + h
        w, err = est.attempt(t, t_next, u, grid, record)
        e = e_last = float(ctl.error_norm(err, u, w).max())
        if math.isfinite(e) and e <= 1.0:
            stats.n_accepted += 1
            times.append(t_next)
            h_used = t_next - t
            t, u = t_next, w
            for s in outs:
                if abs(s - t) <= tol:
                    saved[s] = u
            fac = ctl.factor(e, prev, k)
            prev = max(e, 1e-4)
            h_new = h_used * fac
            if clipped:
                h_new = max(h_new, min(h, h_used * ctl.factor_max))
            h = min(h_new, ctl.max_step)
        else:
            stats.n_rejected += 1
            h = (t_next - t) * ctl.reject_factor(e, k)
            if ctl.min_step > 0 and h < ctl.min_step and (t_next - t) > ctl.min_step:
                h = ctl.min_step
    return u, saved, stats


class _AcceptedSteps(nn.Module):
    """The accepted steps as a scheme for the propagator's checkpointed loops:
    ``advance(t, dt)`` recomputes the estimator's propagated value over the accepted step
    that starts at ``t`` (its exact end time is looked up, not recomputed as ``t + dt``)."""

    def __init__(self, est, times):
        super().__init__()
        self.scheme = est.scheme  # registered: its parameters are the checkpoint's inputs
        self.__dict__["est"] = est
        self.ends = dict(zip(times[:-1], times[1:]))

    def advance(self, t, dt, u, grid):
        return self.est.propagate(t, self.ends[t], u, grid), grid


def _replay(prop, est, replay: list[float], f: Tensor, grid, outs):
    """The accepted grid recomputed by the propagator's checkpointed loop (with a graph)."""
    from .propagator import _checkpointed_steps
    from .revolve import revolve_steps

    steps = _AcceptedSteps(est, replay)
    tol = 1e-12 * max(1.0, abs(replay[0]), abs(replay[-1]))
    cuts = [0] + [i for i, s in enumerate(replay) if any(abs(s - o) <= tol for o in outs) and i > 0]
    if cuts[-1] != len(replay) - 1:
        cuts.append(len(replay) - 1)
    saved = {}
    for o in outs:
        if abs(o - replay[0]) <= tol:
            saved[o] = f
    u, g = f, grid
    for a, b in zip(cuts[:-1], cuts[1:]):
        seg = replay[a : b + 1]
        if prop.checkpoint_snapshots is None:
            u, g = _checkpointed_steps(steps, seg, u, g, int(prop.checkpoint_every))
        else:
            u, g = revolve_steps(
                steps, seg, u, g, int(prop.checkpoint_every), int(prop.checkpoint_snapshots)
            )
        for o in outs:
            if abs(o - seg[-1]) <= tol:
                saved[o] = u
    return u, saved


def solve_adaptive(
    prop,
    f: Tensor,
    grid: Grid,
    *,
    t_eval=None,
    controller: PIController | None = None,
    estimator=None,
    per_sample: bool = False,
    on_failure: str = "raise",
) -> Solution:
    """Adaptive solve of ``prop``'s scheme from ``f`` (batched, on a complete ``grid``) over
    ``[prop.t0, prop.t1]``; see the module docstring.  Called by
    :meth:`opsplit.Propagator.solve` (which validates ``f`` and the grid)."""
    from .controls import LayerwiseConstant, PiecewiseConstant, PiecewiseLinear
    from .controls.projection import time_breakpoints

    scheme = prop.scheme
    if scheme.threads_grid and any(
        changes_grid(s) for s in scheme.modules() if hasattr(s, "terms")
    ):
        raise ValueError(
            f"adaptive steps: {type(scheme).__name__} moves the state to other grids (grid transfers); "
            "adaptive steps need a scheme on one grid"
        )
    ctl = controller if controller is not None else PIController()
    if not isinstance(ctl, PIController):
        raise TypeError(f"controller: expected a PIController, got {type(ctl).__name__}")
    if on_failure not in ON_FAILURE:
        raise ValueError(f"on_failure: expected one of {ON_FAILURE}, got {on_failure!r}")
    est = _estimator(scheme, estimator)
    t0, t1 = float(prop.t0), float(prop.t1)
    pieces = [m for m in scheme.modules() if isinstance(m, (PiecewiseConstant, PiecewiseLinear, LayerwiseConstant))]
    stops, outs = _stops(t0, t1, t_eval, sorted({b for m in pieces for b in time_breakpoints(m)}))
    grad = torch.is_grad_enabled()
    checkpointed = bool(prop.checkpoint_every) and grad
    samples = [f[i : i + 1] for i in range(f.shape[0])] if per_sample else [f]
    results = []
    with count_substep_calls(scheme) as calls:
        for x in samples:
            before = dict(calls)
            with torch.set_grad_enabled(grad and not checkpointed):
                u, saved, stats = _one(
                    est,
                    ctl,
                    x,
                    grid,
                    t0,
                    t1,
                    stops,
                    outs,
                    on_failure,
                    record=grad and not checkpointed,
                )
            stats.substep_calls = {k: calls[k] - before.get(k, 0) for k in calls}
            if checkpointed:
                reached = [s for s in outs if s in saved]
                u, saved = _replay(prop, est, stats.times, x, grid, reached)
                for k in calls:  # the replay is part of the forward work
                    stats.substep_calls[k] = calls[k] - before.get(k, 0)
            results.append((u, saved, stats))
    u = torch.cat([r[0] for r in results], 0)
    if per_sample:
        stats = SolveStats.total([r[2] for r in results])
    else:
        stats = results[0][2]
    ys = None
    if outs:
        missing = [s for s in outs if any(s not in r[1] for r in results)]
        if missing:
            ys = None  # a solve stopped early (on_failure="return") before these output times
            stats.message = (
                stats.message + "; " if stats.message else ""
            ) + f"no output at t = {missing}"
        else:
            ys = torch.stack([torch.cat([r[1][s] for r in results], 0) for s in outs], 1)
    return Solution(u, outs or None, ys, stats)


class AdaptivePropagator(Propagator):
    """:math:`f \\mapsto u(t_1)` by adaptive steps of ``scheme``: a
    :class:`~opsplit.Propagator` whose ``forward`` solves to a tolerance instead of with
    :math:`N_t` steps (``forward(f, n_steps=N)`` still takes :math:`N` fixed steps).

    Args:
        scheme: the splitting scheme.
        t0, t1: the time interval (``t1`` required).
        grid: as :class:`~opsplit.Propagator`.
        rtol, atol, and the other :class:`PIController` fields: the controller.
        estimator: ``"doubling"`` (default), ``"extrapolate"``, or a companion scheme.
        per_sample: each sample its own steps.

    ``last_stats`` holds the :class:`~opsplit.solution.SolveStats` of the last adaptive
    ``forward`` (``None`` before).  :meth:`from_propagator` shares an existing
    propagator's scheme (its controls), interval and grid.  The gradient modes of
    ``opsplit.control`` apply (it is a ``Propagator``).
    """

    def __init__(
        self,
        scheme: Scheme,
        *,
        t1: float,
        t0: float = 0.0,
        grid: Grid | None = None,
        estimator="doubling",
        per_sample: bool = False,
        on_failure: str = "raise",
        **controller,
    ):
        super().__init__(scheme, 1, t0=t0, t1=t1, grid=grid)
        self.controller = PIController(**controller)
        _estimator(scheme, estimator)  # validated now, not at the first call
        if per_sample not in (True, False):
            raise TypeError(f"per_sample: expected True or False, got {per_sample!r}")
        if on_failure not in ON_FAILURE:
            raise ValueError(f"on_failure: expected one of {ON_FAILURE}, got {on_failure!r}")
        self.estimator, self.per_sample, self.on_failure = estimator, per_sample, on_failure
        self.last_stats = None

    @classmethod
    def from_propagator(cls, prop: Propagator, **kwargs) -> AdaptivePropagator:
        """An adaptive propagator on ``prop``'s scheme (shared, not copied), interval and grid."""
        if not isinstance(prop, Propagator):
            raise TypeError(f"prop: expected an opsplit Propagator, got {type(prop).__name__}")
        kwargs.setdefault("t0", prop.t0)
        kwargs.setdefault("t1", prop.t1)
        kwargs.setdefault("grid", prop.grid)
        return cls(prop.scheme, **kwargs)

    def forward(
        self,
        f: Tensor,
        *,
        n_steps: int | None = None,
        grid: Grid | None = None,
        return_trajectory: bool = False,
        check_finite_input: bool = True,
    ):
        if n_steps is not None:
            return super().forward(
                f,
                n_steps=n_steps,
                grid=grid,
                return_trajectory=return_trajectory,
                check_finite_input=check_finite_input,
            )
        if return_trajectory:
            raise ValueError(
                "return_trajectory: adaptive steps have no fixed grid to stack; use solve(f, t_eval=...) "
                "(states at requested times), or forward(f, n_steps=N)"
            )
        sol = self.solve(
            f,
            grid=grid,
            controller=self.controller,
            estimator=self.estimator,
            per_sample=self.per_sample,
            on_failure=self.on_failure,
            check_finite_input=check_finite_input,
        )
        self.last_stats = sol.stats
        return sol.u

    def extra_repr(self) -> str:
        c = self.controller
        return (
            f"t=[{self.t0:g}, {self.t1:g}], rtol={c.rtol:g}, atol={c.atol:g}, estimator={self.estimator!r}, "
            f"per_sample={self.per_sample}, grid={self.grid}"
        )
