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
``effective_order`` as :math:`p` whose step tends to a smooth map that is the identity on
the states the solve visits; the models where it does not (a projection with a kink, the
ReLU; a map applied once per step; two projections; a projection averaged in a parallel
group) are refused before compute (:func:`adaptive_obstacle`).  It keeps the structure of
the scheme (the propagated
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

**Embedded Euler–Heun pair** (:class:`EulerHeunPair`): for a scheme whose step is explicit
Euler on the sum of its terms (the parallel scheme of explicit-Euler substeps, eq. 59, or one
explicit-Euler substep), Heun's method with Euler embedded (the RK1(2) pair): Euler's value
:math:`w = u + h F(t, u)` is propagated and :math:`\mathrm{err} = \tfrac h2 (F((t + h)^-, w)
- F(t, u)) = \tfrac12 (\Psi_h(w) - 2 w + u)` with :math:`\Psi_h(w)` a step from :math:`w`
reading the controls' left limit at :math:`t + h`: Heun's value minus Euler's, an estimate of
Euler's local error (order 1, asymptotically exact).  That second step is the next step's
field at no cost (first same as last; Euler is linear in :math:`h`, so the next step of size
:math:`h'` from :math:`w` is :math:`w + (h'/h)(\Psi_h(w) - w)`) wherever the controls are
continuous at :math:`t + h`, and a rejected step retries from the field it has: an accepted
step costs one step of the scheme, the fixed grid's work (step doubling: three).

**Steps across control pieces** (``PIController(stop_at_breakpoints=False)``): a step may
cross the breakpoints of piecewise controls (below); it then reads the controls where its
substeps do (explicit Euler: at its start, for the whole step, as a fixed :math:`N_t` below
the number of pieces does), and the error estimate judges what that costs — with the
Euler–Heun pair, from the controls' left limit at the step's end.

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

**Times.**  Steps end exactly at the requested output times (``t_eval``) and, unless
``stop_at_breakpoints=False``, at the breakpoints of piecewise controls (:func:`opsplit.controls.projection.time_breakpoints`;
the piece ends of a :class:`~opsplit.controls.LayerwiseConstant`, a decoder's layers), as
torchdiffeq's ``step_t``/``jump_t``: a splitting step has no dense output, and a step
across a breakpoint loses the scheme's order.  The controls :math:`\theta(t)` are
evaluated by the substeps at the accepted steps' own times.

**Failures, never a hang.**  ``max_steps`` bounds the attempts (accepted + rejected);
reaching it raises :class:`AdaptiveStepError` (default) or, with
``on_failure="return"``, returns the state where the solve stopped with
``stats.success = False`` and the reason in ``stats.message``.  A non-finite error
estimate rejects the step (the state left the float range, or the step was too large for
the substeps); a step size below ``min_step`` or below the round-off limit (float64's :math:`16\,\epsilon\,|t|`
(the times' own round-off), and :math:`16\,\epsilon\,(t_1 - t_0)` in the state's
dtype) raises :class:`AdaptiveStepError` at once.  Time arithmetic is relative to the
interval, not to :math:`|t|` (:func:`time_tolerance`).  What can be refused before compute
is: the controller's arguments against the interval and the dtype
(:meth:`PIController.check_solve`: ``rtol`` below :func:`min_rtol`, a first step below
``min_step`` or the round-off limit, a ``max_step`` that cannot cover the interval in
``max_steps`` steps), the model (:func:`adaptive_obstacle`), and a composition whose
substeps read the controls outside a step without room before ``t0`` or after ``t1``
(otherwise each step is capped to keep them inside); :func:`check_adaptive` runs all of
them.

**Layers.**  Step control reads a scheme and an interval; it does not import the
propagator (:class:`~opsplit.AdaptivePropagator` and :meth:`~opsplit.Propagator.solve`
live in :mod:`opsplit.propagator` and call :func:`solve_adaptive`).

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
import numbers
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from .controls import LayerwiseConstant, PiecewiseConstant, PiecewiseLinear
from .controls.projection import time_breakpoints
from .controls.timepoints import LeftLimit
from .grid import Grid
from .revolve import checkpointed_steps, revolve_steps
from .schemes import Parallel
from .schemes.base import Scheme, changes_grid
from .schemes.composition import clock_reach, controls_interval
from .schemes.parallel import ParallelGroup, ScaledOperator
from .solution import Solution, SolveStats, count_substep_calls, substep_labels
from .solvers import ExplicitEuler, Substep
from .solvers.catch_up import is_projection

__all__ = [
    "PIController",
    "StepDoubling",
    "EmbeddedPair",
    "EulerHeunPair",
    "AdaptiveStepError",
    "solve_adaptive",
    "adaptive_obstacle",
    "check_adaptive",
    "time_tolerance",
    "min_rtol",
    "ON_FAILURE",
]

#: what happens when ``max_steps`` is reached
ON_FAILURE = ("raise", "return")
#: the smallest rtol a dtype can meet: MIN_RTOL_EPS * eps (float64 2.2e-14, float32 1.2e-5)
MIN_RTOL_EPS = 100.0
#: the step-size floor in eps: of float64 times |t|, and of the state's dtype times the interval
_FLOOR = 16.0
_EPS64 = float(torch.finfo(torch.float64).eps)


class AdaptiveStepError(RuntimeError):
    """An adaptive solve could not reach its final time (``max_steps`` reached, or the step
    size underflowed)."""


def _number(x, name: str) -> float:
    """A real number: Python, numpy or a one-element tensor (not a bool)."""
    if isinstance(x, Tensor):
        if x.numel() != 1 or x.dtype == torch.bool or x.is_complex():
            raise TypeError(f"{name}: expected a number, got a {x.dtype} tensor of shape {tuple(x.shape)}")
        return float(x)
    if isinstance(x, bool) or not isinstance(x, numbers.Real) or type(x).__name__ == "bool_":
        raise TypeError(f"{name}: expected a number, got {type(x).__name__}")
    return float(x)


def _positive(x, name: str, *, allow_inf: bool = False) -> float:
    v = _number(x, name)
    if math.isnan(v) or v <= 0 or (math.isinf(v) and not allow_inf):
        raise ValueError(f"{name}: expected a finite number > 0, got {x!r}")
    return v


def _count(x, name: str) -> int:
    """A positive integer: Python or numpy (not a bool, not a float)."""
    if isinstance(x, bool) or not isinstance(x, numbers.Integral) or type(x).__name__ == "bool_":
        raise ValueError(f"{name}: expected an integer >= 1, got {type(x).__name__} {x!r}")
    if int(x) < 1:
        raise ValueError(f"{name}: expected an integer >= 1, got {int(x)}")
    return int(x)


def time_tolerance(t0: float, t1: float) -> float:
    """Two times of a solve over ``[t0, t1]`` closer than this are the same time: 1e-12 of
    the interval, and at least 4 spacings of float64 numbers at the interval's magnitude
    (times are relative to the interval, not to :math:`|t|`)."""
    return max(1e-12 * (t1 - t0), 4.0 * math.ulp(max(abs(t0), abs(t1))))


def _interval(t0: float, t1: float) -> str:
    """``[t0, t1]`` for a message, with enough digits to tell the ends apart."""
    a, b = f"{t0:g}", f"{t1:g}"
    return f"[{a}, {b}]" if a != b else f"[{t0!r}, {t1!r}]"


def _step_floor(t: float, span: float, dtype) -> tuple[float, str]:
    """The smallest step the arithmetic resolves at time ``t`` and its reason: 16 eps of
    float64 times :math:`|t|` (the times' own round-off), and 16 eps of the state's dtype
    times the interval
    (a step that small changes the state by less than its round-off)."""
    a = _FLOOR * _EPS64 * abs(t)
    b = _FLOOR * float(torch.finfo(dtype).eps) * span
    if a > b:
        return a, f"the round-off limit of the times (16 eps |t|: float64 times near {abs(t):.3g} are {math.ulp(abs(t)):.3g} apart)"
    return b, f"the round-off limit of {str(dtype).replace('torch.', '')} (16 eps (t1 - t0))"


def min_rtol(dtype) -> float:
    """The smallest ``rtol`` an adaptive solve accepts for states of ``dtype``:
    ``MIN_RTOL_EPS`` eps (float64 2.2e-14, float32 1.2e-5).  Below it the error estimate is
    round-off (one step's estimate carries a few eps of noise, and the global error
    accumulates round-off over the steps): the controller would shrink the step until it
    underflows or ``max_steps`` is spent."""
    return MIN_RTOL_EPS * float(torch.finfo(dtype).eps)


@dataclass(frozen=True)
class PIController:
    """Tolerances and the PI step-size controller (see the module docstring).

    Numbers may be Python, numpy or one-element tensor scalars.

    Args:
        rtol, atol: relative and absolute tolerance, finite and > 0 (``rtol`` at least
            :func:`min_rtol` of the state's dtype: checked when a solve starts).
        first_step: the first step size; ``None``: a sixteenth of the interval (and never
            beyond the first output time or breakpoint).
        min_step: a smaller step size raises :class:`AdaptiveStepError` (``0``: only the
            round-off limit :math:`16\\,\\epsilon` of the times and of the interval); at most
            the first step.
        max_step: the largest step size (``inf``: no limit); at least the round-off limit,
            and few enough steps must cover the interval (``(t1 - t0) / max_step <=
            max_steps``; checked when a solve starts).
        max_steps: the largest number of attempts (accepted + rejected).
        safety, factor_min, factor_max: :math:`s`, :math:`f_\\min`, :math:`f_\\max`.
        pcoeff, icoeff: the PI coefficients (diffrax's names; ``pcoeff = icoeff = 0``
            with ``icoeff`` alone is I control).
        stop_at_breakpoints: end steps at the breakpoints of piecewise controls (default);
            ``False``: steps may cross them (module docstring).
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
    stop_at_breakpoints: bool = True

    def __post_init__(self):
        if not isinstance(self.stop_at_breakpoints, bool):
            raise TypeError(f"stop_at_breakpoints: expected True or False, got {self.stop_at_breakpoints!r}")
        object.__setattr__(self, "rtol", _positive(self.rtol, "rtol"))
        object.__setattr__(self, "atol", _positive(self.atol, "atol"))
        if self.first_step is not None:
            object.__setattr__(self, "first_step", _positive(self.first_step, "first_step"))
        min_step = _number(self.min_step, "min_step")
        if not (math.isfinite(min_step) and min_step >= 0):
            raise ValueError(f"min_step: expected a finite number >= 0, got {self.min_step!r}")
        object.__setattr__(self, "min_step", min_step)
        object.__setattr__(self, "max_step", _positive(self.max_step, "max_step", allow_inf=True))
        if self.min_step > self.max_step:
            raise ValueError(
                f"min_step: expected min_step <= max_step, got {self.min_step} > {self.max_step}"
            )
        if self.first_step is not None and self.min_step > self.first_step:
            raise ValueError(
                f"min_step: expected min_step <= first_step, got {self.min_step} > {self.first_step}"
            )
        object.__setattr__(self, "max_steps", _count(self.max_steps, "max_steps"))
        for name in ("safety", "factor_min", "factor_max", "pcoeff", "icoeff"):
            object.__setattr__(self, name, _number(getattr(self, name), name))
        if not 0 < self.safety <= 1:
            raise ValueError(f"safety: expected 0 < safety <= 1, got {self.safety!r}")
        if not 0 < self.factor_min < 1 < self.factor_max or not math.isfinite(self.factor_max):
            raise ValueError(
                f"factor_min, factor_max: expected 0 < factor_min < 1 < factor_max < inf, got "
                f"{self.factor_min!r}, {self.factor_max!r}"
            )
        for name in ("pcoeff", "icoeff"):
            v = getattr(self, name)
            if not (math.isfinite(v) and v >= 0):
                raise ValueError(f"{name}: expected a finite number >= 0, got {v!r}")

    def check_solve(self, t0: float, t1: float, dtype) -> None:
        """Raise ``ValueError`` naming the argument, before compute, where this controller
        cannot solve over ``[t0, t1]`` with states of ``dtype``: ``rtol`` below
        :func:`min_rtol`, a first step below ``min_step`` or below the round-off limit,
        ``max_step`` below the round-off limit or too small to cover the interval in
        ``max_steps`` steps."""
        span = t1 - t0
        name = str(dtype).replace("torch.", "")
        lo = min_rtol(dtype)
        if self.rtol < lo:
            raise ValueError(
                f"rtol: {self.rtol:g} is below what {name} can meet ({MIN_RTOL_EPS:g} eps = {lo:.3g}: "
                f"below it the error estimate is round-off); expected rtol >= {lo:.3g}"
                + (", or float64 states" if dtype != torch.float64 else "")
            )
        floor, why = max(_step_floor(t0, span, dtype), _step_floor(t1, span, dtype))
        first = self.first_step if self.first_step is not None else span / 16.0
        src = "first_step" if self.first_step is not None else "the default first step (t1 - t0)/16"
        if first > span:
            first, src = span, "the interval t1 - t0"
        if self.min_step > first:
            raise ValueError(
                f"min_step: expected min_step <= the first step, got min_step = {self.min_step:g} > "
                f"{src} = {first:g} on [t0, t1] = {_interval(t0, t1)}"
            )
        if first < floor:
            arg = "first_step" if self.first_step is not None else "t0, t1"
            raise ValueError(
                f"{arg}: {src} = {first:.3g} is below {why} = {floor:.3g} on [t0, t1] = {_interval(t0, t1)}"
                + ("" if self.first_step is not None else "; shift the time origin (a shorter |t|) or lengthen the interval")
            )
        if self.max_step < floor:
            raise ValueError(
                f"max_step: {self.max_step:.3g} is below {why} = {floor:.3g} on [t0, t1] = {_interval(t0, t1)}"
            )
        if span / self.max_step > self.max_steps:
            raise ValueError(
                f"max_step: {self.max_step:.3g} needs at least (t1 - t0)/max_step = {span / self.max_step:.3g} "
                f"steps over {_interval(t0, t1)}, more than max_steps = {self.max_steps}; expected max_step >= "
                f"{span / self.max_steps:.3g} (or more max_steps)"
            )

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


class EulerHeunPair:
    r"""The embedded Euler–Heun pair of a scheme whose step is explicit Euler on the sum of
    its terms: Euler's value propagated, Heun's minus Euler's the error estimate, the second
    step reused as the next step's field (module docstring).

    Args:
        scheme: a :class:`~opsplit.schemes.Parallel` scheme of explicit-Euler substeps of one
            term each, or a scheme of one explicit-Euler substep; anything else is refused
            (its step is not Euler on the sum of its terms).

    ``calls_saved`` counts the scheme steps the reuse spared (a statistic of the solves)."""

    name = "Euler-Heun pair"

    def __init__(self, scheme: Scheme):
        if not isinstance(scheme, Scheme):
            raise TypeError(f"EulerHeunPair.scheme: expected an opsplit Scheme, got {type(scheme).__name__}")
        why = _not_euler_on_a_sum(scheme)
        if why is not None:
            raise ValueError(f"estimator: the Euler-Heun pair needs a step that is explicit Euler on the sum of "
                             f"the scheme's terms: {why}; use 'doubling' or an embedded pair of schemes")
        self.scheme = scheme
        self.breakpoints: list = []  # where the controls jump: no reuse of the field there (solve_adaptive)
        self.calls_saved = 0
        self._last = None  # (t, u, h, w): Euler from u over h gave w
        self._next = None  # (t, w, h, w2): the step from w over h (left limits at its end), for the next attempt

    @property
    def order(self) -> int:
        return 1

    def propagate(self, t: float, t_next: float, u: Tensor, grid) -> Tensor:
        return self.scheme.step(t, t_next - t, u, grid)

    def _jump(self, t: float) -> bool:
        tol = 1e-12 * max(1.0, abs(t))
        return any(abs(b - t) <= tol for b in self.breakpoints)

    def attempt(self, t: float, t_next: float, u: Tensor, grid, record: bool):
        h = t_next - t
        # autograd records this step: every attempt is its own Euler step (the reused field has no graph)
        grad = record and torch.is_grad_enabled() and (u.requires_grad or any(
            p.requires_grad for p in self.scheme.parameters()))
        with torch.set_grad_enabled(grad):
            w = None
            if not grad:
                for c in (self._next, self._last):  # the field at (t, u), known: Euler is linear in h
                    if c is not None and c[0] == t and c[1] is u:
                        w = torch.add(u, c[3] - u, alpha=h / c[2])
                        self.calls_saved += 1
                        break
            if w is None:
                w = self.scheme.step(t, h, u, grid)
        with torch.no_grad():
            w2 = self.scheme.step(LeftLimit(t_next), h, w.detach(), grid)
            err = 0.5 * (w2 - 2.0 * w.detach() + u.detach())
        self._last = (t, u, h, w.detach())
        self._next = None if grad or self._jump(t_next) else (t_next, w, h, w2)
        return w, err


def _not_euler_on_a_sum(scheme) -> str | None:
    """Why a step of ``scheme`` is not explicit Euler on the sum of its terms, or ``None``."""
    subs = list(scheme.substeps)
    if any(type(s.solver) is not ExplicitEuler for s in subs):
        names = sorted({type(s.solver).__name__ for s in subs})
        return f"its substeps are solved by {names}, not explicit Euler"
    if len(subs) == 1:
        return None
    if type(scheme) is not Parallel:
        return f"{type(scheme).__name__} of {len(subs)} substeps (a splitting, not Euler on the sum)"
    if any(len(s.terms) != 1 for s in subs):
        return "a parallel substep of several terms"
    return None


def _estimator(scheme, estimator):
    if estimator is None or estimator == "doubling":
        return StepDoubling(scheme)
    if estimator == "extrapolate":
        return StepDoubling(scheme, extrapolate=True)
    if estimator == "euler-heun":
        return EulerHeunPair(scheme)
    if isinstance(estimator, Scheme):
        return EmbeddedPair(scheme, estimator)
    if isinstance(estimator, (StepDoubling, EmbeddedPair, EulerHeunPair)):
        if estimator.scheme is not scheme:
            raise ValueError("estimator: it must be built on the propagator's own scheme")
        return estimator
    raise TypeError(
        f"estimator: expected 'doubling', 'extrapolate', 'euler-heun', a companion Scheme (embedded pair), a "
        f"StepDoubling, an EmbeddedPair or an EulerHeunPair, got {type(estimator).__name__}"
    )


def _stops(t0: float, t1: float, t_eval, breakpoints) -> tuple[list[float], list[float]]:
    tol = time_tolerance(t0, t1)
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


def adaptive_obstacle(scheme: Scheme) -> str | None:
    """Why the local error of ``scheme``'s steps cannot be estimated by comparing steps of
    different sizes (step doubling, an embedded pair), or ``None`` if it can.

    The estimate needs one step and two half steps to differ by a power of the step: the
    step must tend to a smooth map that is the identity on the states the solve visits.
    That fails for a substep that is not smooth (a projection onto a set with corners: the
    ReLU), for a map applied once per step (two half steps apply it twice), for two
    projections onto different sets (one step alternates them once, two half steps twice)
    and for a projection averaged with other substeps in a parallel group (a relaxation
    towards the set).  A projection alone (S1: smooth near its manifold, idempotent) is
    fine."""
    labels = substep_labels(scheme)
    subs = []
    for m in scheme.modules():
        if isinstance(m, Substep):
            subs.append(m)
        elif isinstance(m, ParallelGroup):  # its scaled substeps (K A_k) are not registered modules
            subs += [s for s in m._scaled if s not in subs]
    by_op = {id(op): lab for sub, lab in labels.items() for op in sub.terms}
    sets: dict = {}
    for m in subs:
        for op in m.terms:
            inner = op.op if isinstance(op, ScaledOperator) else op
            kind = type(inner).__name__
            label = labels.get(m) or by_op.get(id(inner))
            where = f"substep {label}" if label else f"substep ({kind})"
            if not getattr(inner, "smooth", True):
                what = (
                    "the projection onto {u >= 0} (the ReLU), with a kink where an entry is 0"
                    if is_projection(inner) else "declared not smooth (smooth = False)"
                )
                return (
                    f"its {where} is not a smooth map of the state ({kind}: {what}): where entries reach "
                    "the kink one step and two half steps differ by O(h), not O(h^(p+1)), and with a second "
                    "projection (S1) by O(1) whatever the step, so the error estimate cannot guide the step "
                    "size"
                )
            if getattr(inner, "is_map", False) and not is_projection(inner):
                return (
                    f"its {where} is a map applied once per step, not a flow: two half steps "
                    "apply it twice, so one step and two half steps differ by O(1) whatever the step"
                )
            if is_projection(inner):
                sets.setdefault(id(inner), (where, kind))
                if isinstance(op, ScaledOperator) and op.factor > 1:
                    return (
                        f"its {where} is a projection averaged with the other substeps of a "
                        "parallel group (a relaxation towards the set, not idempotent): from a state off "
                        "the set one step and two half steps differ by O(1) whatever the step"
                    )
    if len(sets) > 1:
        w1, w2 = [w for w, _ in sets.values()][:2]
        return (
            f"its {w1} and {w2} project onto two different sets: one step alternates the "
            "projections once, two half steps twice, and from a state off the sets' intersection they "
            "differ by O(1) whatever the step"
        )
    return None


def _step_cap(scheme: Scheme, t0: float, t1: float, tol: float):
    """For a scheme whose substeps read the controls outside each step (negative
    coefficients, the triple jump), the largest step from ``t`` that keeps them inside the
    controls' interval: ``cap(t)`` (``None``: no cap).  Raises ``ValueError`` before compute
    where no step fits at ``t0`` or none can end at ``t1``."""
    lo, hi = clock_reach(scheme)
    if lo >= -1e-14 and hi <= 1.0 + 1e-12:
        return None
    c0, c1 = controls_interval(scheme)
    name = type(scheme).__name__
    if lo < -1e-14 and c0 >= t0 - tol:
        raise ValueError(
            f"scheme: {name}'s substeps read the controls up to {-lo:.4g} h before each step of size h "
            f"(negative coefficients), but a control starts at t0 = {t0:g}: no step fits; define the controls "
            "on an interval that extends before t0 (a margin), or use BlanesMoan (its substeps stay inside "
            "each step)"
        )
    if hi > 1.0 + 1e-12 and c1 <= t1 + tol:
        raise ValueError(
            f"scheme: {name}'s substeps read the controls up to {hi - 1:.4g} h after each step of size h "
            f"(negative coefficients), but a control ends at t1 = {t1:g}: no step can end there; define the "
            "controls on an interval that extends beyond t1 (a margin), or use BlanesMoan (its substeps stay "
            "inside each step)"
        )

    def cap(t: float) -> float:
        h = math.inf
        if lo < -1e-14:
            h = min(h, (t - c0) / -lo)
        if hi > 1.0 + 1e-12:
            h = min(h, (c1 - t) / hi)
        return h

    return cap


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
    cap=None,
):
    """The adaptive loop for one batch: ``(u, {t: state}, stats)``.  Every comparison of
    times is relative to the interval (:func:`time_tolerance`)."""
    k = est.order + 1
    span = t1 - t0
    tol = time_tolerance(t0, t1)
    t, u = t0, f
    h = ctl.first_step if ctl.first_step is not None else span / 16.0
    h = min(h, ctl.max_step)
    prev = 1.0
    times = [t0]
    saved = {}
    if outs and abs(outs[0] - t0) <= tol:
        saved[outs[0]] = f
    stats = SolveStats(times=times)
    si, e_last = 0, float("nan")
    while t1 - t > tol:
        if stats.n_steps >= ctl.max_steps:
            msg = (
                f"max_steps = {ctl.max_steps} attempts reached at t = {t:.6g} of {_interval(t0, t1)} "
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
        capped = False
        if cap is not None:
            c = cap(t)
            if c < h:
                h, capped = c, True
        limit, why = _step_floor(t, span, f.dtype)
        if ctl.min_step >= limit and ctl.min_step > 0:
            limit, why = ctl.min_step, "min_step"
        if h < limit:
            if capped:
                why += " (the step is capped where the substeps would read the controls outside their interval)"
            raise AdaptiveStepError(
                f"adaptive solve: step size underflow at t = {t:.6g}: the step {h:.3g} is below {why} "
                f"{limit:.3g} (last error norm {e_last:.3g}); the tolerance rtol={ctl.rtol:g}, atol={ctl.atol:g} "
                "cannot be met at this step (or the state left the float range)"
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
    """The accepted steps as a scheme for the checkpointed loops:
    ``advance(t, dt)`` recomputes the estimator's propagated value over the accepted step
    that starts at ``t`` (its exact end time is looked up, not recomputed as ``t + dt``)."""

    def __init__(self, est, times):
        super().__init__()
        self.scheme = est.scheme  # registered: its parameters are the checkpoint's inputs
        self.__dict__["est"] = est
        self.ends = dict(zip(times[:-1], times[1:]))

    def advance(self, t, dt, u, grid):
        return self.est.propagate(t, self.ends[t], u, grid), grid


def _replay(est, replay: list[float], f: Tensor, grid, outs, every: int, snapshots):
    """The accepted grid recomputed by the checkpointed loop (with a graph): blocks of
    ``every`` steps (:func:`opsplit.revolve.checkpointed_steps`), or binomial checkpointing
    with ``snapshots`` (:func:`opsplit.revolve.revolve_steps`)."""
    steps = _AcceptedSteps(est, replay)
    tol = time_tolerance(replay[0], replay[-1])
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
        if snapshots is None:
            u, g = checkpointed_steps(steps, seg, u, g, every)
        else:
            u, g = revolve_steps(steps, seg, u, g, every, int(snapshots))
        for o in outs:
            if abs(o - seg[-1]) <= tol:
                saved[o] = u
    return u, saved


def check_adaptive(scheme: Scheme, t0: float, t1: float, controller: PIController, dtype,
                   estimator=None, on_failure: str = "raise"):
    """Every check of an adaptive solve of ``scheme`` over ``[t0, t1]`` with states of
    ``dtype`` that needs no state: raises ``ValueError``/``TypeError`` naming the argument,
    before compute.  Returns ``(estimator, step cap)``."""
    if not isinstance(scheme, Scheme):
        raise TypeError(f"scheme: expected an opsplit Scheme, got {type(scheme).__name__}")
    if not isinstance(controller, PIController):
        raise TypeError(f"controller: expected a PIController, got {type(controller).__name__}")
    if on_failure not in ON_FAILURE:
        raise ValueError(f"on_failure: expected one of {ON_FAILURE}, got {on_failure!r}")
    if scheme.threads_grid and any(
        changes_grid(s) for s in scheme.modules() if hasattr(s, "terms")
    ):
        raise ValueError(
            f"adaptive steps: {type(scheme).__name__} moves the state to other grids (grid transfers); "
            "adaptive steps need a scheme on one grid"
        )
    est = _estimator(scheme, estimator)
    why = adaptive_obstacle(scheme)
    if why is not None:
        raise ValueError(
            f"adaptive steps: {type(scheme).__name__} cannot be solved to a tolerance: {why}; solve with "
            "fixed steps (n_steps), or keep such substeps out of the scheme (docs/adaptive.md)"
        )
    t0, t1 = float(t0), float(t1)
    if not (math.isfinite(t0) and math.isfinite(t1) and t0 < t1):
        raise ValueError(f"t0, t1: expected finite times t0 < t1, got [{t0!r}, {t1!r}]")
    if not (isinstance(dtype, torch.dtype) and dtype.is_floating_point):
        raise TypeError(f"dtype: expected a floating torch.dtype, got {dtype!r}")
    controller.check_solve(t0, t1, dtype)
    cap = _step_cap(scheme, t0, t1, time_tolerance(t0, t1))
    return est, cap


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
    :meth:`opsplit.Propagator.solve` (which validates ``f`` and the grid).  ``prop`` is read
    for ``scheme``, ``t0``, ``t1`` and its checkpointing (``checkpoint_every``,
    ``checkpoint_snapshots``): step control does not depend on the propagator class."""

    scheme = getattr(prop, "scheme", None)
    if not isinstance(scheme, Scheme):
        raise TypeError(f"prop: expected a Propagator (with an opsplit Scheme), got {type(prop).__name__}")
    if not isinstance(f, Tensor) or not f.is_floating_point() or f.dim() != 3:
        raise TypeError("f: expected a floating tensor of shape (B, N_x, N_y)")
    if not isinstance(per_sample, bool):
        raise TypeError(f"per_sample: expected True or False, got {per_sample!r}")
    ctl = controller if controller is not None else PIController()
    t0, t1 = float(prop.t0), float(prop.t1)
    est, cap = check_adaptive(scheme, t0, t1, ctl, f.dtype, estimator, on_failure)
    pieces = [m for m in scheme.modules() if isinstance(m, (PiecewiseConstant, PiecewiseLinear, LayerwiseConstant))]
    breaks = sorted({b for m in pieces for b in time_breakpoints(m)})
    if isinstance(est, EulerHeunPair):
        est.breakpoints = breaks
    stops, outs = _stops(t0, t1, t_eval, breaks if ctl.stop_at_breakpoints else [])
    grad = torch.is_grad_enabled()
    every = int(getattr(prop, "checkpoint_every", 0) or 0)
    checkpointed = bool(every) and grad
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
                    cap=cap,
                )
            stats.substep_calls = {k: calls[k] - before.get(k, 0) for k in calls}
            if checkpointed:
                reached = [s for s in outs if s in saved]
                u, saved = _replay(est, stats.times, x, grid, reached, every,
                                   getattr(prop, "checkpoint_snapshots", None))
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
