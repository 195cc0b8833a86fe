r"""The operator (term) interface: *what moves u*.

The continuous transformer (paper 002, eq. 7; eq. 38 for multi-head) is

.. math::  u_t = \sum_k A_k(t; u),

a sum of terms: integral operators with an explicit vector field (attention, FFN) and
subdifferentials of indicator functions (:math:`\partial I_{S_1}` = LayerNorm,
:math:`\partial I_{S_2}` = ReLU) whose only sensible discrete step is a resolvent, i.e. a
projection.  An :class:`Operator` declares which of three capabilities it has; a solver
(``opsplit.solvers``) uses exactly one of them, and a scheme never looks inside:

``field(t, u, grid)``
    the vector field :math:`A(t; u)` (explicit terms);
``resolvent(t, dt, u, grid)``
    :math:`(I - \Delta t\, A(t; \cdot))^{-1} u`.  For :math:`A = -\partial I_S` this is the
    projection onto :math:`S` for every :math:`\Delta t` (eqs. 20–21 and 24 of paper 002);
``flow(t, dt, u, grid)``
    the exact solution map of the substep over :math:`[t, t + \Delta t]`.

Sign convention: the paper writes eq. (7) with :math:`+\partial I_S(u)` on the right-hand
side and eq. (14) as :math:`u^{2/M} - u^{1/M} = \partial I_{S_1}(u^{2/M})`; the monotone
(dissipative) reading, and the one whose solution is the projection (eq. 21), is
:math:`u_t \in -\partial I_S(u)`.  opsplit implements that reading.

Calling an operator module, ``op(u, t=0.0, grid=None)``, validates its input and returns
``field`` for explicit terms, or the projection / map for the others.  With
``grid=None`` the paper's grid ``L = N`` (unit spacing) is used.
"""

from __future__ import annotations

from torch import Tensor, nn

from .._checks import (
    all_finite,
    check_finite,
    check_finite_float,
    check_like_module,
    check_parameters_finite,
    check_state,
    is_vmapped,
    skip_value_checks,
)
from ..grid import Grid, check_grid

__all__ = ["Operator", "field_operator"]


class Operator(nn.Module):
    """Base class of the terms of the continuous model.

    Subclasses set the capability flags and implement the matching methods, and cite the
    equation they implement in their docstring.
    """

    #: the term has an explicit vector field ``field(t, u, grid)``
    has_field: bool = False
    #: the term has a resolvent ``resolvent(t, dt, u, grid)`` (for indicators: a projection)
    has_resolvent: bool = False
    #: the term has an exact flow ``flow(t, dt, u, grid)``
    has_flow: bool = False
    #: which solver a scheme uses when given the bare operator: "explicit", "implicit", "exact"
    default_solver: str = "explicit"
    #: the term can be advanced over a negative time step (its field is deterministic, its
    #: flow a flow); maps (``is_map``) and projections are never reversible, whatever this says
    reversible: bool = True
    #: the term's substep is a smooth (C^1) map of the state: a projection onto a set with
    #: corners (ReLU's cone) is not; adaptive steps refuse such a term (``opsplit.adaptive``)
    smooth: bool = True

    def field(self, t, u: Tensor, grid: Grid) -> Tensor:
        raise NotImplementedError(f"{type(self).__name__} has no explicit field")

    def resolvent(self, t, dt: float, u: Tensor, grid: Grid) -> Tensor:
        raise NotImplementedError(f"{type(self).__name__} has no resolvent")

    def flow(self, t, dt: float, u: Tensor, grid: Grid) -> Tensor:
        raise NotImplementedError(f"{type(self).__name__} has no exact flow")

    def check(self, grid: Grid) -> None:
        """Validate the operator's controls against a (complete) grid; raise a clear error.

        Called once per solve by the propagator, not at every substep.
        """
        for m in self.children():
            if isinstance(m, Operator):
                m.check(grid)

    def resolve_grid(self, u: Tensor, grid: Grid | None, name: str = "u") -> Grid:
        grid = check_grid(grid, "grid")
        if grid is None:
            return Grid.paper(u.shape[-2], u.shape[-1])
        return grid.with_shape(u.shape[-2], u.shape[-1], name)

    def forward(self, u: Tensor, t: float = 0.0, grid: Grid | None = None) -> Tensor:
        """Apply the operator: the field of an explicit term, else its projection / map
        (resolvent or flow with :math:`\\Delta t = 1`).

        Validates ``u`` (a float tensor ``(B, N_x, N_y)`` matching ``grid``, finite, on the
        dtype and device of the operator's parameters), ``grid`` (a
        :class:`~opsplit.grid.Grid` or ``None``) and ``t`` (a finite number), then the
        operator's controls against the grid.  The parameters are checked finite before (named;
        re-read only after they change) and re-read afresh when the call raises a ``ValueError``
        or returns a non-finite value, so that one written through ``.data`` (no version
        change) is named rather than its symptom."""
        grid = check_grid(grid, "grid")
        name = f"{type(self).__name__} input"
        u = check_state(u, grid or Grid.paper(None, None), name, finite=False)
        check_like_module(u, self, name, f"the {type(self).__name__}")
        check_finite(u, name)
        if not isinstance(t, Tensor):
            check_finite_float(t, "t")
        what = type(self).__name__
        check_parameters_finite(self, what)
        g = self.resolve_grid(u, grid, name)
        self.check(g)
        try:
            if self.has_field:
                out = self.field(t, u, g)
            elif self.has_resolvent:
                out = self.resolvent(t, 1.0, u, g)
            else:
                out = self.flow(t, 1.0, u, g)
        except ValueError:  # (an attention-score check): a NaN written through .data is named first
            check_parameters_finite(self, what, fresh=True)
            raise
        if not (skip_value_checks() or is_vmapped(out) or all_finite(out)):
            # a non-finite result of a finite input: re-read every parameter (one written through
            # .data changes no version counter); an overflow itself is returned as before
            check_parameters_finite(self, what, fresh=True)
        return out


def field_operator(inner, name: str) -> Operator:
    """``inner`` if it is an opsplit :class:`Operator` with an explicit field (what a wrapper
    of a field — dropout, drop path, a pre-norm — takes), else a ``TypeError`` naming ``name``."""
    if not isinstance(inner, Operator) or not inner.has_field:
        raise TypeError(f"{name}: expected an opsplit Operator with a field, got {type(inner).__name__}")
    return inner
