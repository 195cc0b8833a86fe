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
:math:`(t + \Delta t)^-` (:class:`~opsplit.controls.LeftLimit`): a substep never reads a
control outside its own interval.  Adaptive methods are asked to end a step exactly at
:math:`t + \Delta t` (torchdiffeq's ``step_t`` option) rather than overshoot it and
interpolate back.

**Order.** A fixed-grid method has its own order (``step_size`` in ``options``
subdivides the substep without changing it).  A multistep method restarts at every
substep, where its first step is a one-step method of order 1, so it is declared order 1.
An adaptive method solves the substep to its tolerance: declared order unbounded (like
:class:`~opsplit.solvers.Exact`); the accuracy is then set by ``rtol``/``atol`` and the
scheme's order is the splitting's own.

**Adjoint.** ``adjoint=True`` uses ``torchdiffeq.odeint_adjoint`` (memory independent of
the number of internal steps); gradients reach the operators' parameters and every buffer
that requires grad.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from ..controls.timepoints import LeftLimit
from ._fields import check_field_terms, field_sum
from .base import Solver

__all__ = ["ODESolve", "FIXED_ORDERS", "ADAPTIVE"]

#: one-step fixed-grid methods and their orders
FIXED_ORDERS = {"euler": 1, "midpoint": 2, "heun2": 2, "heun3": 3, "rk4": 4}
#: multistep fixed-grid methods (restarted each substep: order 1)
MULTISTEP = ("explicit_adams", "implicit_adams", "fixed_adams")
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
        lo, hi = (self.t_start, self.t_end) if self.t_start <= self.t_end else (self.t_end, self.t_start)
        if s >= hi:
            s = LeftLimit(hi)
        elif s < lo:
            s = lo
        return field_sum(self.terms, s, y, self.grid)


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

    requires = "field"
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
        from torchdiffeq._impl.odeint import SOLVERS

        if method not in SOLVERS:
            raise ValueError(f"ODESolve.method: expected one of {sorted(SOLVERS)}, got {method!r}")
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
                adjoint_rtol=adjoint_rtol, adjoint_atol=adjoint_atol,
                adjoint_method=adjoint_method, adjoint_options=adjoint_options,
            ).items()
            if v is not None
        }
        if method in FIXED_ORDERS:
            self.order = FIXED_ORDERS[method]
        elif method in MULTISTEP:
            self.order = 1
        else:
            self.order = 99

    @property
    def adaptive(self) -> bool:
        return self.method in ADAPTIVE

    def check(self, terms) -> None:
        check_field_terms(self, terms)

    def step(self, terms, t, dt: float, u: Tensor, grid) -> Tensor:
        import torchdiffeq

        t0 = float(t)
        t1 = t0 + float(dt)
        func = _SubstepField(terms, grid, t0, t1)
        ts = torch.tensor([t0, t1], dtype=u.dtype, device=u.device)
        func.t_end = float(ts[1])  # the representable end time torchdiffeq will pass
        options = dict(self.options)
        if self.method in _STEP_T_METHODS and "step_t" not in options and "jump_t" not in options:
            options["step_t"] = ts[1:]
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
