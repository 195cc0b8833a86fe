r"""Composition methods: a splitting step built from Lie sweeps and their adjoints.

**Sweeps.**  For :math:`u_t = \sum_{k=1}^K A_k(t; u)` write :math:`\Phi^{k}_{c\Delta t}`
for substep :math:`k` over a time :math:`c\,\Delta t`.  The Lie step (eq. 58)
:math:`L_{c\Delta t} = \Phi^{K}_{c\Delta t} \circ \dots \circ \Phi^{1}_{c\Delta t}` is a
first-order method; its adjoint :math:`L^*_{c\Delta t} = L_{-c\Delta t}^{-1} =
\Phi^{1}_{c\Delta t} \circ \dots \circ \Phi^{K}_{c\Delta t}` is the same substeps in the
reversed order.  A composition method is

.. math::  \Psi_{\Delta t} = L^*_{\alpha_m \Delta t} \circ L_{\beta_m \Delta t} \circ \dots
           \circ L^*_{\alpha_1 \Delta t} \circ L_{\beta_1 \Delta t}

(read right to left).  Strang splitting is :math:`L^*_{\Delta t/2} \circ L_{\Delta t/2}`,
so a composition of Strang steps :math:`S_{\gamma_s\Delta t} \circ \dots \circ
S_{\gamma_1\Delta t}` is the sweep sequence :math:`\beta_i = \alpha_i = \gamma_i/2`.  A
two-term splitting method :math:`e^{a_1 \Delta t A}e^{b_1 \Delta t B} \cdots` with
coefficients :math:`(a_i, b_i)` is the composition with :math:`\beta_1 = a_1`,
:math:`\alpha_i = b_i - \beta_i`, :math:`\beta_{i+1} = a_{i+1} - \alpha_i`
(:func:`sweeps_from_splitting`; McLachlan 1995; Hairer, Lubich, Wanner, *Geometric
Numerical Integration*, 2nd ed., §II.5 and §III.3).  The order conditions of a
composition of a first-order method and its adjoint do not depend on the method, so the
composition has the two-term method's order for **any** number of operators :math:`K`
(measured: ``tests/test_composition.py``).

**Time intervals.**  Each substep keeps its own clock: substep :math:`k` starts at
:math:`t`, and a call over :math:`c\,\Delta t` advances its clock by :math:`c\,\Delta t`
(the sweep runs the substep over :math:`[t + \tau_k, t + \tau_k + c\Delta t]`, a backward
interval when :math:`c < 0`).  This is the splitting of the autonomous system in which
every term carries its own time variable, so the composition keeps its order for
controls smooth in time when the substep solvers follow the time dependence inside their
interval (``RK4``, ``ODESolve``; ``Strang``'s intervals are the case of one Strang step).
The clocks leave :math:`[t, t + \Delta t]` when coefficients are negative or exceed 1
(the triple jump's substeps read the controls on :math:`[t - 0.35\Delta t, t +
1.35\Delta t]`): controls with breakpoints on the time grid (piecewise constant,
piecewise linear) are then read across a breakpoint and the order drops.

**Merged calls.**  Consecutive calls of the same substep (the end of one sweep and the
start of the next) run over contiguous intervals of its clock and are merged into one
call (exact for exact substep flows; the same order for solvers of at least the
scheme's order).  A Strang step costs :math:`2K - 1` substep calls, the triple jump
:math:`6K - 5`, Blanes–Moan's S6 :math:`12K - 11`.

**Negative steps.**  Real-coefficient compositions of order :math:`\ge 3` have negative
coefficients (Sheng 1989; Suzuki 1991; Goldman & Kaper 1996).  A substep whose solver or
operator cannot run backwards — a resolvent (an implicit step, a projection onto
:math:`S_1` or :math:`S_2`), a map (an activation, an affine map, a relaxation), a random
field (dropout in training mode) — is refused before any compute, naming the substep,
its operator and the negative coefficient.  Reversibility is declared by
``Solver.reversible`` and ``Operator.reversible`` (maps, ``is_map``, and projections,
``is_projection``, are never reversible).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from torch import Tensor

from ..controls.base import Control
from .base import Scheme, irreversibility
from .nested import SchemeFlow

__all__ = [
    "Composition",
    "sweeps_from_splitting",
    "sweeps_from_strang",
    "substep_calls",
    "irreversibility",
    "clock_reach",
    "controls_interval",
]

_ZERO = 1e-14


def sweeps_from_strang(gammas: Sequence[float]) -> list[tuple[float, int]]:
    """The sweeps ``[(coefficient, +1 forward / -1 adjoint), ...]`` of the composition of
    Strang steps :math:`S_{\\gamma_s} \\circ \\dots \\circ S_{\\gamma_1}` (first
    :math:`\\gamma_1`)."""
    out = []
    for g in gammas:
        out += [(0.5 * float(g), 1), (0.5 * float(g), -1)]
    return out


def sweeps_from_splitting(a: Sequence[float], b: Sequence[float]) -> list[tuple[float, int]]:
    """The sweeps of the two-term splitting method
    :math:`e^{a_1 h A} e^{b_1 h B} e^{a_2 h A} \\cdots e^{b_m h B} e^{a_{m+1} h A}`
    (``len(a) = len(b) + 1``, first :math:`a_1`): :math:`\\beta_1 = a_1`,
    :math:`\\alpha_i = b_i - \\beta_i`, :math:`\\beta_{i+1} = a_{i+1} - \\alpha_i`; the
    last :math:`a_{m+1}` must equal :math:`\\alpha_m` (raises otherwise)."""
    a, b = [float(x) for x in a], [float(x) for x in b]
    if len(a) != len(b) + 1:
        raise ValueError(
            f"sweeps_from_splitting: expected len(a) = len(b) + 1, got {len(a)} and {len(b)}"
        )
    out, beta = [], a[0]
    for i, bi in enumerate(b):
        alpha = bi - beta
        out += [(beta, 1), (alpha, -1)]
        beta = a[i + 1] - alpha
    if abs(beta) > 1e-12:
        raise ValueError(
            f"sweeps_from_splitting: the coefficients do not end with a full adjoint sweep "
            f"(a_last - alpha_last = {beta:.3g}, expected 0)"
        )
    return out


def substep_calls(
    sweeps, n_substeps: int, merge: bool = True
) -> tuple[tuple[int, float, float], ...]:
    """The substep calls ``(k, clock start, length)`` (in units of :math:`\\Delta t`) of the
    sweeps over ``n_substeps`` substeps; consecutive calls of one substep merged."""
    K = int(n_substeps)
    clock = [0.0] * K
    calls: list[list] = []
    for c, direction in sweeps:
        order = range(K) if direction > 0 else range(K - 1, -1, -1)
        for k in order:
            if merge and calls and calls[-1][0] == k:
                calls[-1][2] += c
            else:
                calls.append([k, clock[k], c])
            clock[k] += c
    total = [sum(c for c, _ in sweeps)] * K
    if any(not math.isclose(x, y, rel_tol=0, abs_tol=1e-12) for x, y in zip(clock, total)):
        raise ValueError(f"substep_calls: the substeps' clocks end at different times {clock}")
    return tuple((k, a, c) for k, a, c in calls if abs(c) > _ZERO)


def clock_reach(scheme) -> tuple[float, float]:
    """Where the substeps of one step of ``scheme`` over :math:`[t, t + \\Delta t]` may read
    the controls, in units of :math:`\\Delta t` from :math:`t`: ``(lo, hi)`` with
    ``lo <= 0`` and ``hi >= 1``; ``(0, 1)`` for a scheme whose substeps stay inside each
    step.  A composition nested as a :class:`~opsplit.schemes.SchemeFlow` substep is
    followed through the calls of its substep (exactly inside a composition; inside another
    scheme, whose substeps run over parts of the step, its own reach is taken as the
    bound)."""
    lo, hi = 0.0, 1.0
    if isinstance(scheme, Composition):
        lo, hi = min(lo, scheme.clock_range[0]), max(hi, scheme.clock_range[1])
        for k, sub in enumerate(scheme.substeps):
            for op in sub.terms:
                if isinstance(op, SchemeFlow):
                    ilo, ihi = clock_reach(op.scheme)
                    for kk, a, c in scheme.calls:
                        if kk == k:
                            lo = min(lo, a + c * ilo, a + c * ihi)
                            hi = max(hi, a + c * ilo, a + c * ihi)
        return lo, hi
    for m in scheme.modules():
        if m is not scheme and isinstance(m, Composition):
            ilo, ihi = clock_reach(m)
            lo, hi = min(lo, ilo), max(hi, ihi)
    return lo, hi


def controls_interval(scheme) -> tuple[float, float]:
    """The time interval on which every control of ``scheme`` with a finite interval of
    definition (``t0``, ``t1``) is defined: their intersection (``(-inf, inf)`` if none)."""
    c0, c1 = -math.inf, math.inf
    for m in scheme.modules():
        if isinstance(m, Control):
            a, b = getattr(m, "t0", None), getattr(m, "t1", None)
            if isinstance(a, float) and isinstance(b, float):
                c0, c1 = max(c0, a), min(c1, b)
    return c0, c1


class Composition(Scheme):
    """A splitting step given by its sweeps (see the module docstring).  Subclasses set
    :attr:`order` and :meth:`sweeps`.

    Args:
        substeps: operators or :class:`~opsplit.solvers.Substep` objects, in the order of
            the forward (Lie) sweep.
        merge: merge consecutive calls of the same substep (default; see the module
            docstring).
    """

    order = 1

    def __init__(self, substeps, *, merge: bool = True):
        super().__init__(substeps)
        self._controls = None
        self.merge = bool(merge)  # (makes calls and clock_range, and checks the reversibility)

    def __setattr__(self, name, value):
        # ``merge`` may change after construction: the calls and their clock range follow it
        if name == "merge":
            if not isinstance(value, bool):
                raise TypeError(f"{type(self).__name__}.merge: expected True or False, got {value!r}")
            calls = substep_calls(self.sweeps(), len(self.substeps), value)
            self._check_reversible(calls)
            ends = [0.0] + [a for _, a, _ in calls] + [a + c for _, a, c in calls]
            super().__setattr__("calls", calls)
            #: the substeps' clocks stay in [t + lo dt, t + hi dt] (units of dt)
            super().__setattr__("clock_range", (min(ends), max(ends)))
        elif name in ("calls", "clock_range"):
            raise AttributeError(f"{type(self).__name__}.{name}: made from the sweeps and merge; set merge instead")
        super().__setattr__(name, value)

    @classmethod
    def sweeps(cls) -> list[tuple[float, int]]:  # pragma: no cover - abstract
        raise NotImplementedError

    @property
    def n_calls(self) -> int:
        """Substep calls per step."""
        return len(self.calls)

    def _check_reversible(self, calls=None) -> None:
        for k, _, c in self.calls if calls is None else calls:
            if c < 0:
                why = irreversibility(self.substeps[k])
                if why is not None:
                    op = type(self.substeps[k].terms[0]).__name__
                    raise ValueError(
                        f"{type(self).__name__}: substep {k} ({op}) would be advanced over a negative "
                        f"time step ({c:.6g} dt), but {why}. Compositions of order >= 3 with real "
                        "coefficients need negative substeps (Sheng-Suzuki theorem); keep such substeps "
                        "out of the composition (e.g. in an outer Lie/Strang step) or use Strang "
                        "(order 2, positive substeps only)"
                    )

    def check(self, grid) -> None:
        super().check(grid)
        # dynamic declarations (dropout in training mode) are re-read once per solve
        self._check_reversible()

    def check_span(self, t: float, dt: float) -> None:
        """Raise before compute if a substep would read a control outside its interval (only
        compositions whose clocks leave [t, t + dt], such as the triple jump)."""
        if self._controls is None:
            self._controls = [
                m
                for m in self.modules()
                if isinstance(m, Control)
                and isinstance(getattr(m, "t0", None), float)
                and isinstance(getattr(m, "t1", None), float)
            ]
        lo, hi = sorted((t + self.clock_range[0] * dt, t + self.clock_range[1] * dt))
        for m in self._controls:
            tol = 1e-9 * max(1.0, abs(m.t1 - m.t0))
            if lo < m.t0 - tol or hi > m.t1 + tol:
                raise ValueError(
                    f"{type(self).__name__}: a step over [{t:g}, {t + dt:g}] runs substeps over [{lo:g}, {hi:g}] "
                    f"(clocks from {self.clock_range[0]:.4g} dt to {self.clock_range[1]:.4g} dt: negative "
                    f"coefficients), but a control ({type(m).__name__}) is defined on [{m.t0:g}, {m.t1:g}] only; "
                    "solve on an interval whose steps keep that margin inside the controls' interval, or use "
                    "BlanesMoan (its substeps stay inside each step)"
                )

    def step(self, t, dt: float, u: Tensor, grid) -> Tensor:
        t = float(t)
        if self.clock_range[0] < -_ZERO or self.clock_range[1] > 1.0 + 1e-12:
            self.check_span(t, float(dt))
        for k, a, c in self.calls:
            u = self.substeps[k](t + a * dt, c * dt, u, grid)
        return u

    def extra_repr(self) -> str:
        return super().extra_repr() + f", calls_per_step={self.n_calls}"
