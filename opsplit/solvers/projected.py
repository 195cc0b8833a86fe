r"""Projection methods on :math:`S_1`: solve a substep for the tangent-projected field,
then project back onto the manifold.

**The manifold and its tangent space.**  For each token :math:`x`, write
:math:`\langle a, b\rangle = \frac{1}{|\Omega_y|}\int_{\Omega_y} a\,b\,d\xi` (the grid's
y-quadrature: the discrete measure of eqs. 30–31), :math:`\bar a = \langle a, 1\rangle`.
:math:`S_1(\sigma_1, \sigma_2) = \{u : g_1(u) = 0,\ g_2(u) = 0\}` with

.. math::  g_1(u) = \bar u - \sigma_1,\qquad g_2(u) = \overline{(u - \sigma_1)^2} - \sigma_2^2 .

Their gradients in this inner product are :math:`\nabla g_1 = 1` and
:math:`\nabla g_2 = 2(u - \sigma_1)`, so at :math:`u \in S_1` the normal space is
:math:`N_u = \mathrm{span}\{1, d\}` with :math:`d = u - \bar u = u - \sigma_1`, and
:math:`\langle 1, d\rangle = 0`, :math:`\langle d, d\rangle = \sigma_2^2 > 0`.  The
orthogonal projection onto the tangent space :math:`T_u = N_u^\perp` is therefore

.. math::  P_T(u)\,v = v - \bar v - \frac{\langle v, d\rangle}{\langle d, d\rangle}\, d,
           \qquad d = u - \bar u .                                  (\text{tangent\_s1})

The formula uses only :math:`u` (not :math:`\sigma`), so it extends off the manifold: at
any :math:`u` with non-zero variance it projects onto the tangent space of the level set
of :math:`(g_1, g_2)` through :math:`u` — the flow of :math:`v(t,u) = P_T(u) F(t, u)`
conserves every token's mean and variance exactly (:math:`\frac{d}{dt}\bar u = \overline{P_T
F} = 0`, :math:`\frac{d}{dt}\overline{d^2} = 2\langle d, P_T F\rangle = 0`).  For a
constant token (zero variance, decided by the rule of
:func:`~opsplit.operators.project_s1`: ``max - min <= 8 eps_machine max|u|``) the
:math:`d`-component is dropped.  The formula is 0-homogeneous in :math:`d`, so it is
evaluated with :math:`d` divided by its max-abs: no overflow or underflow at any finite
magnitude.

**The constrained model.**  With :math:`S_1` as a constraint, eq. (7) without
:math:`S_2` reads :math:`u_t \in F(t, u) - N_{S_1}(u)`, :math:`u \in S_1`; the velocity
must be tangent, so :math:`u_t = P_T(u) F(t, u)` (plus the normal motion of the set when
:math:`\sigma` varies in time; see :mod:`opsplit.reference`).

**The projection method** (Hairer, Lubich, Wanner, *Geometric Numerical Integration*,
§IV.4): one step of any one-step method of order :math:`p` applied to the field
:math:`P_T(u) F(t, u)`, followed by the projection onto the manifold through the step's
starting point (mean and variance of :math:`u^n`, token by token; Theorem 3.1 with
:math:`\sigma_1 = \bar u^n`, :math:`\sigma_2^2 = \overline{(d^n)^2}`), has order :math:`p`
on the manifold.  Starting on :math:`S_1(\sigma_1, \sigma_2)` that manifold is
:math:`S_1(\sigma_1, \sigma_2)`; the motion of the set with :math:`\sigma(t)` is a separate
substep (the projection :class:`~opsplit.operators.ProjectionS1`, advanced by
:class:`~opsplit.solvers.CatchUp`).  Composed by Strang splitting, projected substeps of
order :math:`\ge 2` give a second-order scheme for the constrained model.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..grid import Grid
from ..operators.base import Operator
from ..operators.layernorm import _normalise, _project_s1, token_mean_std
from .euler import ExplicitEuler
from .solver import Solver

__all__ = ["ProjectedS1", "TangentS1", "tangent_s1", "token_moments"]


def _mean(f: Tensor, grid: Grid | None) -> Tensor:
    return f.mean(-1, keepdim=True) if grid is None else grid.mean_y(f).unsqueeze(-1)


def token_moments(u: Tensor, grid: Grid | None = None) -> tuple[Tensor, Tensor]:
    """Per-token mean :math:`\\bar u` and variance :math:`\\overline{(u - \\bar u)^2}`,
    shapes ``(..., N_x, 1)``, in the grid's y-quadrature (plain means if ``grid=None``).
    The variance is the square of :func:`~opsplit.operators.layernorm.token_mean_std`'s
    standard deviation (0 on constant tokens; it over/underflows only where the true
    variance is outside the float range)."""
    m, sd, _ = token_mean_std(u, grid)
    return m, sd * sd


def tangent_s1(u: Tensor, v: Tensor, grid: Grid | None = None) -> Tensor:
    """Project ``v`` onto the tangent space of :math:`S_1` at ``u`` (per token):
    :math:`P_T(u) v = v - \\bar v - \\langle v, d\\rangle/\\langle d, d\\rangle\\, d`,
    :math:`d = u - \\bar u` (evaluated with :math:`d` scaled to max-abs 1; the
    :math:`d`-component is dropped on constant tokens)."""
    const, _, _, _, r, beta = _normalise(u, grid)
    c = _mean(v * r, grid) / beta
    c = torch.where(const, torch.zeros_like(c), c)
    return v - _mean(v, grid) - c * r


class TangentS1(Operator):
    """The tangent-projected field :math:`P_T(u)\\,A(t; u)` of an explicit term ``A``
    (see the module docstring)."""

    has_field = True
    default_solver = "explicit"

    def __init__(self, term: Operator):
        super().__init__()
        if not getattr(term, "has_field", False):
            raise ValueError(
                f"TangentS1: expected an operator with an explicit field, got {type(term).__name__}"
            )
        self.term = term

    def check(self, grid: Grid) -> None:
        self.term.check(grid)

    def field(self, t, u: Tensor, grid: Grid) -> Tensor:
        return tangent_s1(u, self.term.field(t, u, grid), grid)


class ProjectedS1(Solver):
    """Projection method on :math:`S_1`: ``base`` on the tangent-projected field, then the
    projection onto the manifold through the starting point (per-token mean and
    variance).  Order: ``base.order`` (on the manifold).

    Args:
        base: a solver of explicit fields (``ExplicitEuler``, ``Heun``, ``RK4``,
            ``ODESolve``); default ``ExplicitEuler()``.
    """

    requires = "field"
    #: several terms with explicit fields, as the base solver takes them (checked by :meth:`check`)
    n_terms = None

    def __init__(self, base: Solver | None = None):
        if base is None:
            base = ExplicitEuler()
        if not isinstance(base, Solver):
            raise TypeError(f"ProjectedS1.base: expected a Solver, got {type(base).__name__}")
        if getattr(base, "requires", None) != "field":
            raise ValueError(
                f"ProjectedS1.base: expected a solver of explicit fields, got {base!r} "
                f"(requires {getattr(base, 'requires', '?')!r})"
            )
        self.base = base
        self.order = base.order
        self.batchable = getattr(base, "batchable", True)
        # a negative step is the base solver backwards on the tangent field, then the
        # retraction onto the level set through the start: defined, unlike a resolvent
        self.reversible = getattr(base, "reversible", False)

    @property
    def stages(self) -> int | None:
        """The base solver's (the tangent projection adds no evaluation of the operator)."""
        return self.base.stages

    def check(self, terms) -> None:
        terms = tuple(terms)
        for k, term in enumerate(terms):
            if not getattr(term, "has_field", False):
                raise ValueError(
                    f"ProjectedS1 needs operators with an explicit field; term {k} "
                    f"({type(term).__name__}) has none"
                )
        self.base.check(tuple(_Probe() for _ in terms))

    def step(self, terms, t, dt: float, u: Tensor, grid) -> Tensor:
        m0, sd0, _ = token_mean_std(u, grid)
        tangent = tuple(TangentS1(term) for term in terms)
        v = self.base.step(tangent, t, dt, u, grid)
        # a constant token (sd0 = 0) stays constant at its mean; no sqrt of a variance, so
        # no infinite gradient at 0 and no overflow at extreme magnitudes
        return _project_s1(v, m0, sd0, grid, 0.0)

    def __repr__(self) -> str:
        return f"ProjectedS1({self.base!r})"


class _Probe:
    """Stand-in with only an explicit field, to ask the base solver whether it accepts the
    tangent-projected terms."""

    has_field, has_resolvent, has_flow = True, False, False
    default_solver = "explicit"
