r"""A substep solved as an ODE by torchdiffeq: :math:`u_t = \sum_k A_k(t; u)` on
:math:`[t, t + \Delta t]` (paper 002, Appendix C, eq. 58; with the scale :math:`K` of a
parallel scheme, eq. 59).

``torchdiffeq.odeint`` (or ``odeint_adjoint``) integrates the substep's field with any of
its methods: fixed-grid (``euler``, ``midpoint``, ``heun2``, ``heun3``, ``rk4``, and the
multistep ``explicit_adams`` / ``implicit_adams``) or adaptive (``dopri5``, ``dopri8``,
``bosh3``, ``fehlberg2``, ``adaptive_heun``, ``scipy_solver``), with ``rtol``, ``atol``
and ``options`` passed through.

**Controls.** The field is evaluated at torchdiffeq's own stage times, so the substep
sees the true time dependence of the controls.  A stage at (or, for an adaptive method's
trial step, beyond) the substep's end is evaluated at the left limit
:math:`(t + \Delta t)^-` (:class:`~opsplit.controls.LeftLimit`), and so is any stage in
the second half of the substep (a stage a round-off below the end must not be read in
the next piece of a piecewise-constant control): a substep never reads a control outside
its own interval.  Adaptive methods are asked to end a step exactly at
:math:`t + \Delta t` (torchdiffeq's ``step_t`` option) rather than overshoot it and
interpolate back.

**Backward substeps.** A composition of order :math:`\ge 3` advances substeps over
negative time steps (:mod:`opsplit.schemes.composition`); torchdiffeq solves
:math:`[t, t + \Delta t]` with :math:`\Delta t < 0` in the reversed time
:math:`s \mapsto -s` (the field :math:`-A(-s; u)`), so an adaptive method's first step is
a step of that forward solve: the initial-step heuristic is run on the reversed field
and returns a positive step (``ODESolve`` is reversible for every method).

**Order.** A fixed-grid method has its own order, torchdiffeq's ``order`` attribute
(``step_size`` in ``options`` subdivides the substep without changing it); torchdiffeq
starts its multistep methods with RK4 steps, so ``explicit_adams`` / ``implicit_adams``
restarted at every substep are order 4.  An adaptive method solves the substep to its tolerance: declared order unbounded (like
:class:`~opsplit.solvers.Exact`); the accuracy is then set by ``rtol``/``atol`` and the
scheme's order is the splitting's own.

**Gradients.** Backpropagation through the solve differentiates the discrete
computation; the adaptive step sizes are kept out of the graph (torchdiffeq's initial-step
heuristic is run without gradients and passed as ``first_step``), as the controls read
the stage times as plain numbers.  ``adjoint=True`` uses ``torchdiffeq.odeint_adjoint`` (memory independent of
the number of internal steps); gradients reach the operators' parameters and every buffer
that requires grad.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from .._checks import check_choice
from ._fields import field_sum, stage_time
from .solver import Solver

__all__ = ["ODESolve", "FIXED", "ADAPTIVE"]

#: fixed-grid methods (their order is torchdiffeq's own ``order`` attribute)
FIXED = (
    "euler",
    "midpoint",
    "heun2",
    "heun3",
    "rk4",
    "explicit_adams",
    "implicit_adams",
    "fixed_adams",
)
#: adaptive (tolerance-controlled) methods
ADAPTIVE = ("dopri5", "dopri8", "bosh3", "fehlberg2", "adaptive_heun", "scipy_solver")
_STEP_T_METHODS = ("dopri5", "dopri8", "bosh3", "fehlberg2", "adaptive_heun")


class _SubstepField(nn.Module):
    """``func(s, y)`` for torchdiffeq: the summed field of the substep's terms, with stage
    times kept inside ``[t_start, t_end]`` (the end read as the left limit)."""

    def __init__(self, terms, grid, t_start: float, t_end: float):
        super().__init__()
        self.terms = nn.ModuleList(terms) if all(isinstance(m, nn.Module) for m in terms) else terms
        self.grid = grid
        self.t_start = t_start
        self.t_end = t_end
        self.n_evals = 0

    def forward(self, s, y):
        self.n_evals += 1
        s = float(s.detach()) if isinstance(s, Tensor) else float(s)
        return field_sum(self.terms, stage_time(self.t_start, self.t_end, s), y, self.grid)


class ODESolve(Solver):
    """Solve the substep's ODE with ``torchdiffeq.odeint`` (or ``odeint_adjoint``).

    Args:
        method: a torchdiffeq method name (default ``"dopri5"``).
        rtol, atol: tolerances (adaptive methods).
        options: torchdiffeq ``options`` (e.g. ``{"step_size": 0.01}`` for fixed-grid
            methods); passed through.
        adjoint: use ``odeint_adjoint`` for the backward pass.
        adjoint_rtol, adjoint_atol, adjoint_method, adjoint_options: passed through to
            ``odeint_adjoint``.

    The substep may hold several operators with explicit fields; their sum is integrated.
    """

    #: the default method's (dopri5: adaptive, solved to its tolerance); a fixed-grid method's
    #: own order is set per instance
    order = 99
    #: not fixed (an adaptive method's steps depend on the tolerance)
    stages = None
    n_terms = None
    reversible = True
    #: the parallel schemes do not vmap this solver (adaptive steps branch on data)
    batchable = False

    def __init__(
        self,
        method: str = "dopri5",
        *,
        rtol: float = 1e-7,
        atol: float = 1e-9,
        options: dict | None = None,
        adjoint: bool = False,
        adjoint_rtol: float | None = None,
        adjoint_atol: float | None = None,
        adjoint_method: str | None = None,
        adjoint_options: dict | None = None,
    ):
        # torchdiffeq is slow to import (~0.4 s, it loads scipy): on use, so `import opsplit.solvers` stays fast
        from torchdiffeq._impl.odeint import SOLVERS

        check_choice(method, SOLVERS, "ODESolve.method")
        for name, v in (("rtol", rtol), ("atol", atol)):
            if not (isinstance(v, (int, float)) and math.isfinite(v) and v > 0):
                raise ValueError(f"ODESolve.{name}: expected a finite number > 0, got {v!r}")
        if options is not None and not isinstance(options, dict):
            raise TypeError(f"ODESolve.options: expected a dict, got {type(options).__name__}")
        self.method = method
        self.rtol = float(rtol)
        self.atol = float(atol)
        self.options = dict(options or {})
        self.adjoint = bool(adjoint)
        self.adjoint_kwargs = {
            k: v
            for k, v in dict(
                adjoint_rtol=adjoint_rtol,
                adjoint_atol=adjoint_atol,
                adjoint_method=adjoint_method,
                adjoint_options=adjoint_options,
            ).items()
            if v is not None
        }
        if method in FIXED:
            self.order = int(getattr(SOLVERS[method], "order", 1))
        else:
            self.order = 99

    @property
    def adaptive(self) -> bool:
        return self.method in ADAPTIVE

    def _first_step(self, func, ts: Tensor, u: Tensor) -> float:
        # torchdiffeq's initial-step heuristic, but outside the autograd graph: computed
        # inside the solve it makes the step sizes (and so the stage times) depend on u
        # with a gradient, while the controls read the times as plain numbers; the
        # gradient of the solution would then miss the matching term.
        # on use: slow to import (see __init__)
        from torchdiffeq._impl.misc import _rms_norm, _select_initial_step
        from torchdiffeq._impl.odeint import SOLVERS

        order = int(getattr(SOLVERS[self.method], "order", 5))
        if ts[1] < ts[0]:
            # a backward substep (a composition's negative coefficient): torchdiffeq solves it
            # in the reversed time s -> -s with the field -f(-s, u), and its first step is a
            # step of that forward solve (> 0); the heuristic is run on the same field
            def g(s, y):
                return -func(-s, y)

            f0, s0 = g, -ts[0]
        else:
            f0, s0 = func, ts[0]
        with torch.no_grad():
            h0 = _select_initial_step(f0, s0, u, order - 1, self.rtol, self.atol, _rms_norm)
        return float(min(float(h0), abs(float(ts[1] - ts[0]))))

    def step(self, terms, t, dt: float, u: Tensor, grid) -> Tensor:
        import torchdiffeq  # slow to import (see __init__)

        t0 = float(t)
        t1 = t0 + float(dt)
        func = _SubstepField(terms, grid, t0, t1)
        ts = torch.tensor([t0, t1], dtype=u.dtype, device=u.device)
        func.t_end = float(ts[1])  # the representable end time torchdiffeq will pass
        options = dict(self.options)
        if self.method in _STEP_T_METHODS:
            if "step_t" not in options and "jump_t" not in options:
                options["step_t"] = ts[1:]
            if "first_step" not in options:
                options["first_step"] = self._first_step(func, ts, u)
        kw = dict(rtol=self.rtol, atol=self.atol, method=self.method, options=options or None)
        if self.adjoint:
            params = [p for m in terms if isinstance(m, nn.Module) for p in m.parameters()]
            params += [
                b for m in terms if isinstance(m, nn.Module) for b in m.buffers() if b.requires_grad
            ]
            seen, uniq = set(), []
            for p in params:
                if id(p) not in seen:
                    seen.add(id(p))
                    uniq.append(p)
            sol = torchdiffeq.odeint_adjoint(
                func, u, ts, adjoint_params=tuple(uniq), **kw, **self.adjoint_kwargs
            )
        else:
            sol = torchdiffeq.odeint(func, u, ts, **kw)
        return sol[-1]

    def __repr__(self) -> str:
        s = f"ODESolve(method={self.method!r}, rtol={self.rtol:g}, atol={self.atol:g}"
        if self.options:
            s += f", options={self.options}"
        if self.adjoint:
            s += ", adjoint=True"
        return s + ")"
