r"""The continuous-time reference: the unsplit model solved by torchdiffeq at tight
tolerance, where that is well defined.

**Smooth terms.**  For operators with explicit fields (softmax attention, FFN integral
terms, ...) the continuous model :math:`u_t = \sum_k A_k(t; u)` on the grid is a system of
ODEs; :func:`solve_reference` integrates it with ``torchdiffeq.odeint`` (``dopri5``,
``rtol=1e-10``, ``atol=1e-12`` by default; use float64).  A splitting scheme on the same
grid converges to this solution as :math:`\Delta t \to 0`, at the scheme's order.

**With** :math:`S_1` **as a constraint** (the operator
:class:`~opsplit.operators.ProjectionS1` among the terms): eq. (7) reads
:math:`u_t \in F(t, u) - N_{S_1(t)}(u)`, :math:`u(t) \in S_1(\sigma_1(t), \sigma_2(t))`,
with :math:`F` the sum of the smooth terms.  The velocity is the tangent projection of
:math:`F` (:func:`~opsplit.solvers.tangent_s1`) plus the motion of the set:
:math:`u_t = P_T(u) F + \sigma_1' + (\sigma_2'/\sigma_2)(u - \sigma_1)`.  The reference
avoids :math:`\sigma'` by writing :math:`u = \sigma_2(t) z + \sigma_1(t)` with :math:`z`
on the fixed manifold :math:`S_1(0, 1)` (same tangent space, :math:`P_T(u) = P_T(z)`):

.. math::  z_t = \frac{1}{\sigma_2(t)}\, P_T(z)\, F\big(t, \sigma_2(t) z + \sigma_1(t)\big),
           \qquad z(t_0) = P_{S_1(0, 1)}(f),

so the solution starts with the projection of :math:`f` (the initial layer of the
constrained model when :math:`f \notin S_1`) and is reported as
:math:`u(t) = \sigma_2(t) z(t) + \sigma_1(t)`.  Tokens of ``f`` with zero variance have no
projection and raise.  The reference takes :math:`S_1` exactly (``eps = 0``).

**Not defined here**: :math:`\partial I_{S_2}` (ReLU) makes the model a differential
inclusion (a projected dynamical system) with a discontinuous right-hand side; a
relaxation step (eq. 16) is a step of the scheme, not a term of eq. (7).  Both raise;
measure such models by self-convergence (``opsplit.analysis``).

**Discontinuities in time.**  Piecewise controls have breakpoints (the pieces of a
:class:`~opsplit.controls.PiecewiseConstant`, the nodes of a
:class:`~opsplit.controls.PiecewiseLinear`); the reference integrates between them, each
interval reading its end as the left limit, so an adaptive solver never steps across a
jump.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from ._checks import check_state
from .controls import PiecewiseConstant, PiecewiseLinear
from .controls.timepoints import LeftLimit
from .grid import Grid
from .operators import ProjectionS1, ProjectionS2
from .operators.base import Operator
from .operators.layernorm import constant_tokens, project_s1
from .propagator import Propagator
from .schemes.base import Scheme
from .solvers.base import Substep
from .solvers.odeint import ODESolve
from .solvers.projected import tangent_s1

__all__ = ["solve_reference", "unsplit_terms", "ReferenceField", "control_breakpoints"]


def unsplit_terms(model) -> tuple[list[Operator], ProjectionS1 | None]:
    """The smooth terms and the :math:`S_1` constraint of a scheme, propagator, or list of
    operators/substeps; raises for terms without an ODE meaning."""
    if isinstance(model, Propagator):
        model = model.scheme
    if isinstance(model, Scheme):
        items = list(model.substeps)
    elif isinstance(model, nn.Module):
        items = [model]
    else:
        items = list(model)
    ops: list = []
    for it in items:
        ops.extend(it.terms if isinstance(it, Substep) else [it])
    fields, constraint = [], None
    for op in ops:
        if isinstance(op, ProjectionS1):
            if constraint is not None and op is not constraint:
                raise ValueError(
                    "solve_reference: several different ProjectionS1 operators; the constrained "
                    "reference takes one S1(sigma_1, sigma_2) set"
                )
            if op.eps != 0:
                raise ValueError(
                    f"solve_reference: the S1 constraint must be exact (ProjectionS1 eps=0), got "
                    f"eps={op.eps:g}"
                )
            constraint = op
        elif isinstance(op, ProjectionS2):
            raise ValueError(
                "solve_reference: ProjectionS2 (ReLU, the term dI_S2) makes the model a "
                "differential inclusion with a discontinuous right-hand side; there is no ODE "
                "reference (measure by self-convergence instead)"
            )
        elif getattr(op, "has_field", False):
            fields.append(op)
        else:
            raise ValueError(
                f"solve_reference: {type(op).__name__} has no explicit field and is not the S1 "
                "constraint; the unsplit model is not an ODE with it (a relaxation step is a "
                "step of the scheme, not a term of eq. 7)"
            )
    if not fields and constraint is None:
        raise ValueError("solve_reference: expected at least one operator")
    return fields, constraint


def control_breakpoints(modules) -> list[float]:
    """Times where the controls of ``modules`` are not smooth (piece boundaries, nodes)."""
    out = set()
    for mod in modules:
        for m in mod.modules():
            if isinstance(m, PiecewiseConstant):
                for i in range(m.n_pieces + 1):
                    out.add(m.t0 + (m.t1 - m.t0) * i / m.n_pieces)
            elif isinstance(m, PiecewiseLinear):
                out.update(m.breakpoints())
    return sorted(out)


class ReferenceField(Operator):
    """The field of the unsplit model: :math:`\\sum_k A_k(t; u)`, or, with an :math:`S_1`
    constraint, the :math:`z`-field of the module docstring."""

    has_field = True

    def __init__(self, fields, constraint: ProjectionS1 | None = None):
        super().__init__()
        self.fields = nn.ModuleList(fields)
        self.constraint = constraint

    def check(self, grid: Grid) -> None:
        for f in self.fields:
            f.check(grid)
        if self.constraint is not None:
            self.constraint.check(grid)

    def _sum(self, t, u, grid):
        out = None
        for f in self.fields:
            v = f.field(t, u, grid)
            out = v if out is None else out + v
        return torch.zeros_like(u) if out is None else out

    def field(self, t, u: Tensor, grid: Grid) -> Tensor:
        if self.constraint is None:
            return self._sum(t, u, grid)
        s1 = self.constraint.sigma1(t, grid)
        s2 = self.constraint.sigma2(t, grid)
        return tangent_s1(u, self._sum(t, s2 * u + s1, grid), grid) / s2

    def to_u(self, t, z: Tensor, grid: Grid) -> Tensor:
        if self.constraint is None:
            return z
        return self.constraint.sigma2(t, grid) * z + self.constraint.sigma1(t, grid)


def solve_reference(
    model,
    f: Tensor,
    *,
    t0: float | None = None,
    t1: float | None = None,
    grid: Grid | None = None,
    times=None,
    rtol: float = 1e-10,
    atol: float = 1e-12,
    method: str = "dopri5",
    options: dict | None = None,
    breakpoints=None,
    adjoint: bool = False,
) -> Tensor:
    """Solve the unsplit continuous model from :math:`u(t_0) = f`.

    Args:
        model: a :class:`~opsplit.Propagator` (its ``t0``, ``t1`` and grid are the
            defaults), a :class:`~opsplit.schemes.Scheme`, or a list of operators /
            substeps.
        f: initial state ``(B, N_x, N_y)``.
        t0, t1: the time interval (default: the propagator's, else ``0`` and ``1``).
        grid: the spatial grid (default: the propagator's, else ``Grid.paper``).
        times: output times in ``[t0, t1]`` (default: only ``t1``); the result is then
            stacked on a new dimension 0.
        rtol, atol, method, options: passed to ``torchdiffeq.odeint``.
        breakpoints: extra times where the controls are not smooth (those of piecewise
            controls are found automatically).
        adjoint: gradients by the continuous adjoint (``torchdiffeq.odeint_adjoint`` on
            every interval between breakpoints) instead of backpropagation through the
            solver's steps (``opsplit.control``, ``gradient="adjoint"``).

    Returns:
        :math:`u(t_1)`, or :math:`u` at ``times`` stacked on dimension 0.
    """
    if isinstance(model, Propagator):
        t0 = model.t0 if t0 is None else t0
        t1 = model.t1 if t1 is None else t1
        grid = model.grid if grid is None else grid
    t0 = 0.0 if t0 is None else float(t0)
    t1 = 1.0 if t1 is None else float(t1)
    if not (math.isfinite(t0) and math.isfinite(t1)) or t1 <= t0:
        raise ValueError(f"solve_reference: expected t0 < t1, got t0={t0}, t1={t1}")
    g0 = grid if grid is not None else Grid.paper(None, None)
    f = check_state(f, g0, "f")
    g = g0.with_shape(f.shape[-2], f.shape[-1])
    fields, constraint = unsplit_terms(model)
    rhs = ReferenceField(fields, constraint)
    rhs.check(g)
    out_times = [t1] if times is None else sorted(float(s) for s in times)
    for s in out_times:
        if s < t0 - 1e-12 * max(1.0, abs(t0)) or s > t1 + 1e-12 * max(1.0, abs(t1)):
            raise ValueError(f"solve_reference: output time {s:g} outside [{t0:g}, {t1:g}]")
    cuts = set(control_breakpoints(fields + ([constraint] if constraint is not None else [])))
    cuts.update(float(b) for b in (breakpoints or ()))
    cuts.update(out_times)
    tol = 1e-12 * max(1.0, abs(t0), abs(t1))
    knots = [t0] + sorted(c for c in cuts if t0 + tol < c < t1 - tol) + [t1]
    if constraint is not None:
        if bool(constant_tokens(f).any()):
            raise ValueError(
                "solve_reference: f: a token is constant (zero variance, max - min <= "
                "8 eps_machine max|f|); its projection onto S1 is not defined"
            )
        z = project_s1(f, 0.0, 1.0, g)
    else:
        z = f
    solver = ODESolve(method, rtol=rtol, atol=atol, options=options, adjoint=adjoint)
    results = {}
    if any(abs(s - t0) <= tol for s in out_times):
        results[t0] = rhs.to_u(t0, z, g)
    for a, b in zip(knots[:-1], knots[1:]):
        z = solver.step((rhs,), a, b - a, z, g)
        results[b] = rhs.to_u(LeftLimit(b), z, g)
    outs = []
    for s in out_times:
        key = min(results, key=lambda k: abs(k - s))
        outs.append(results[key])
    return outs[0] if times is None else torch.stack(outs, 0)
