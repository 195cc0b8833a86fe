r"""Controls moved between time grids: prolongation to more pieces, restriction to fewer,
and the piece average a step longer than a piece reads.

A piecewise control on :math:`[t_0, t_1]` with :math:`P` equal pieces of length
:math:`h = (t_1 - t_0)/P` (:class:`~opsplit.controls.PiecewiseConstant`,
:class:`~opsplit.controls.LayerwiseConstant`) holds rows :math:`\theta_0, \dots,
\theta_{P-1}`.  Every map here is linear in the rows, :math:`\theta' = M\theta` row-wise,
with one matrix :math:`M` per pair of piece counts:

**Prolongation** to :math:`Q = rP` pieces (:func:`prolongation_matrix`, :func:`prolong`):

* ``"constant"`` — :math:`\theta'_j = \theta_{\lfloor j/r \rfloor}`: every piece
  duplicated.  The *same function of t*: the continuous flow of the prolonged control is
  the flow of the old one exactly (a solve at :math:`N_t` steps differs only by the
  scheme's error at :math:`N_t`).  This is the depth interpolation of Chang et al.
  (ICLR 2018) with the step halved.
* ``"linear"`` — :math:`\theta'_j` is the linear interpolation of the old pieces' values
  placed at their midpoints :math:`\tau_i = t_0 + (i + \tfrac12)h`, read at the new
  midpoints, constant before :math:`\tau_0` and after :math:`\tau_{P-1}`:
  :math:`\theta'_j = (1-\lambda)\theta_i + \lambda\theta_{i+1}` with
  :math:`\tau'_j = \tau_i + \lambda h`.  A smoother control; it changes the function
  (by :math:`O(h)` where the pieces jump), so it changes the flow.

Every row of a prolongation matrix is a convex combination (weights :math:`\ge 0`,
summing to one): it maps Adam's second moments to non-negative ones.

**Restriction** to :math:`P/r` pieces (:func:`restriction_matrix`): the piece averages

.. math::  \bar\theta_k = \frac1r \sum_{i = kr}^{kr + r - 1} \theta_i
           = \frac{1}{rh}\int_{t_0 + krh}^{t_0 + (k+1)rh} \theta(s)\,ds,

the :math:`L^2` projection onto the coarse pieces.

**A step longer than a piece** (:class:`PieceAverage`): a view of a piecewise-constant
control that answers, at a time :math:`t` in coarse piece :math:`k` of :math:`N` (``N``
dividing :math:`P`), the average :math:`\bar\theta_k` of the pieces under that coarse
piece — the control integrated over a step of a grid of :math:`N` steps instead of read
at one point.  It reads the source's parameters at every call (a differentiable view,
nothing copied); the left limit of a coarse breakpoint
(:class:`~opsplit.controls.LeftLimit`) reads the coarse piece that ends there.

A positive control (stored as :math:`\log\theta`) is prolonged in its stored rows (the
duplication is the same function either way); its average is the average of the values.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from .base import Control
from .layerwise import LayerwiseConstant
from .piecewise import PiecewiseConstant
from .piecewise_linear import PiecewiseLinear

__all__ = ["PROLONGATIONS", "RESTRICTIONS", "PIECEWISE_CONTROLS", "prolongation_matrix", "node_prolongation_matrix",
           "restriction_matrix",
           "prolong", "restrict", "PieceAverage", "n_pieces_of", "check_pieces"]

#: the prolongations of :func:`prolong` (module docstring)
PROLONGATIONS = ("constant", "linear")
#: the restrictions of :func:`restrict`: the piece averages, or the value at each coarse piece's start
RESTRICTIONS = ("average", "sample")
#: the controls with pieces in time that :func:`prolong` and :class:`PieceAverage` take
PIECEWISE_CONTROLS = (PiecewiseConstant, LayerwiseConstant, PiecewiseLinear)


def _count(v, name: str) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        raise TypeError(f"{name}: expected an integer >= 1, got {v!r}")
    if v < 1:
        raise ValueError(f"{name}: expected an integer >= 1, got {v}")
    return v


def check_pieces(n_from: int, n_to: int, name: str = "n_pieces") -> int:
    """The ratio ``n_to / n_from`` of a prolongation (``n_to`` a multiple of ``n_from``),
    refused naming ``name`` otherwise."""
    n_from, n_to = _count(n_from, f"{name} (from)"), _count(n_to, name)
    if n_to < n_from or n_to % n_from:
        raise ValueError(f"{name}: expected a piece count of {n_to} that is a multiple of {n_from} (each coarse piece "
                         f"split into equal fine pieces), got {n_from} and {n_to} pieces")
    return n_to // n_from


def node_prolongation_matrix(n_from: int, n_to: int) -> Tensor:
    """``(n_to + 1, n_from + 1)`` float64: the nodes of a piecewise-linear control of
    ``n_from`` pieces evaluated at the nodes of ``n_to`` pieces (``n_to`` a multiple of
    ``n_from``): new node ``j`` lies ``j / r`` old intervals in, ``r = n_to / n_from``, and
    takes the linear interpolation of the two old nodes around it (exact on the lines)."""
    r = n_to // n_from
    M = torch.zeros(n_to + 1, n_from + 1, dtype=torch.float64)
    for j in range(n_to + 1):
        i, rem = divmod(j, r)
        if rem == 0:
            M[j, i] = 1.0
        else:
            M[j, i], M[j, i + 1] = 1.0 - rem / r, rem / r
    return M


def prolongation_matrix(n_from: int, n_to: int, kind: str = "constant", *, dtype=torch.float64) -> Tensor:
    """``(n_to, n_from)``: the rows of a control of ``n_from`` pieces prolonged to ``n_to``
    pieces (``n_to`` a multiple of ``n_from``) by ``kind`` (:data:`PROLONGATIONS`; module
    docstring)."""
    if kind not in PROLONGATIONS:
        raise ValueError(f"prolongation: expected one of {PROLONGATIONS}, got {kind!r}")
    r = check_pieces(n_from, n_to, "n_to")
    M = torch.zeros(n_to, n_from, dtype=torch.float64)
    for j in range(n_to):
        if kind == "constant":
            M[j, j // r] = 1.0
            continue
        s = (j + 0.5) / r - 0.5  # the new midpoint in units of old pieces, from the first old midpoint
        if s <= 0:
            M[j, 0] = 1.0
        elif s >= n_from - 1:
            M[j, n_from - 1] = 1.0
        else:
            i = int(math.floor(s))
            lam = s - i
            M[j, i] += 1.0 - lam
            M[j, i + 1] += lam
    return M.to(dtype)


def restriction_matrix(n_from: int, n_to: int, kind: str = "average", *, dtype=torch.float64) -> Tensor:
    """``(n_to, n_from)``: the averages of ``n_from / n_to`` consecutive pieces (``n_from`` a
    multiple of ``n_to``; module docstring), or with ``kind="sample"`` the first of them (the
    control's value at each coarse piece's start, :math:`\\theta(t_0 + krh)`)."""
    if kind not in RESTRICTIONS:
        raise ValueError(f"restriction: expected one of {RESTRICTIONS}, got {kind!r}")
    r = check_pieces(n_to, n_from, "n_from")
    M = torch.zeros(n_to, n_from, dtype=torch.float64)
    for k in range(n_to):
        if kind == "sample":
            M[k, k * r] = 1.0
        else:
            M[k, k * r:(k + 1) * r] = 1.0 / r
    return M.to(dtype)


def n_pieces_of(control: Control) -> int:
    """The pieces of a piecewise control in time (a piecewise-linear control's intervals
    between nodes); ``TypeError`` for another control."""
    if isinstance(control, (PiecewiseConstant, LayerwiseConstant)):
        return control.n_pieces
    if isinstance(control, PiecewiseLinear):
        return max(control.n_nodes - 1, 1)
    raise TypeError(f"control: expected one of {[c.__name__ for c in PIECEWISE_CONTROLS]} (pieces in t), got "
                    f"{type(control).__name__}")


def _apply(M: Tensor, rows: Tensor) -> Tensor:
    """``M`` applied to the first dimension of ``rows`` (a differentiable map)."""
    flat = rows.reshape(rows.shape[0], -1)
    return (M.to(dtype=rows.dtype, device=rows.device) @ flat).reshape(M.shape[0], *rows.shape[1:])


def prolong(control: Control, n_pieces: int, kind: str = "constant") -> Control:
    """A new control of ``control``'s class with ``n_pieces`` pieces on the same interval:
    its rows prolonged by ``kind`` (:data:`PROLONGATIONS`; module docstring).  A
    :class:`~opsplit.controls.PiecewiseLinear` control is refined by inserting nodes on its
    lines (``kind`` does not apply: the same function).  Fresh parameters with the source's
    ``requires_grad``; ``control`` is not modified.

    Raises ``TypeError`` for a control without pieces in time (a constant, a smooth basis)
    and ``ValueError`` when ``n_pieces`` is not a multiple of the control's pieces."""
    if kind not in PROLONGATIONS:
        raise ValueError(f"prolong.kind: expected one of {PROLONGATIONS}, got {kind!r}")
    if not isinstance(control, PIECEWISE_CONTROLS):
        raise TypeError(f"prolong.control: a {type(control).__name__} has no pieces in time to prolong; expected "
                        f"one of {[c.__name__ for c in PIECEWISE_CONTROLS]}")
    P = n_pieces_of(control)
    check_pieces(P, n_pieces, "prolong.n_pieces")
    with torch.no_grad():
        if isinstance(control, PiecewiseLinear):
            nodes = control.n_nodes
            if nodes == 1:
                rows = control.raw.detach().expand(n_pieces + 1, *control.raw.shape[1:]).clone()
            else:  # new node j at s = j / r old intervals: linear interpolation (exact)
                rows = _apply(node_prolongation_matrix(P, n_pieces), control.raw.detach())
            new = PiecewiseLinear(rows.exp() if control.positive else rows, t0=control.t0, t1=control.t1,
                                  axes=control.axes, positive=control.positive,
                                  requires_grad=control.raw.requires_grad)
            return new
        M = prolongation_matrix(P, n_pieces, kind)
        if isinstance(control, LayerwiseConstant):
            rows = _apply(M, control.values.detach())
            new = LayerwiseConstant(rows, t0=control.t0, t1=control.t1, axes=control.axes)
            for p_new, j in zip(new.pieces, range(n_pieces)):
                p_new.requires_grad_(bool(control.pieces[int(M[j].argmax())].requires_grad))
            return new
        rows = _apply(M, control.raw.detach())
        return PiecewiseConstant(rows.exp() if control.positive else rows, t0=control.t0, t1=control.t1,
                                 axes=control.axes, positive=control.positive,
                                 requires_grad=control.raw.requires_grad)


def restrict(control: Control, n_pieces: int, kind: str = "average") -> Control:
    """A new control of ``control``'s class with ``n_pieces`` pieces (a divisor of its
    pieces) on the same interval: the piece averages (``"average"``, the :math:`L^2`
    projection; of the values for a positive control) or each coarse piece's first piece
    (``"sample"``); a :class:`~opsplit.controls.PiecewiseLinear` control keeps every
    ``r``-th node with either kind.  Fresh parameters; ``control`` is not modified."""
    if kind not in RESTRICTIONS:
        raise ValueError(f"restrict.kind: expected one of {RESTRICTIONS}, got {kind!r}")
    if not isinstance(control, PIECEWISE_CONTROLS):
        raise TypeError(f"restrict.control: a {type(control).__name__} has no pieces in time to restrict; expected "
                        f"one of {[c.__name__ for c in PIECEWISE_CONTROLS]}")
    P = n_pieces_of(control)
    check_pieces(_count(n_pieces, "restrict.n_pieces"), P, "restrict.n_pieces (a divisor of the control's pieces)")
    with torch.no_grad():
        if isinstance(control, PiecewiseLinear):
            rows = control.raw.detach()[:: P // n_pieces] if control.n_nodes > 1 else control.raw.detach()
            return PiecewiseLinear(rows.exp() if control.positive else rows, t0=control.t0, t1=control.t1,
                                   axes=control.axes, positive=control.positive,
                                   requires_grad=control.raw.requires_grad)
        M = restriction_matrix(P, n_pieces, kind)
        if isinstance(control, LayerwiseConstant):
            return LayerwiseConstant(_apply(M, control.values.detach()), t0=control.t0, t1=control.t1,
                                     axes=control.axes)
        vals = control.values.detach()  # the values (exp of the rows of a positive control)
        rows = _apply(M, vals)
        return PiecewiseConstant(rows, t0=control.t0, t1=control.t1, axes=control.axes, positive=control.positive,
                                 requires_grad=control.raw.requires_grad)


class PieceAverage(Control):
    r"""``source`` (a :class:`~opsplit.controls.PiecewiseConstant` or
    :class:`~opsplit.controls.LayerwiseConstant` of :math:`P` pieces) seen on ``n_pieces``
    coarse pieces (``n_pieces`` dividing :math:`P`): at :math:`t` in coarse piece :math:`k`
    the average :math:`\bar\theta_k = \frac1r\sum_{i=kr}^{kr+r-1}\theta_i`,
    :math:`r = P/N` (module docstring).  Differentiable in the source's parameters, which
    stay the source's (this module holds ``source`` as its child)."""

    def __init__(self, source: Control, n_pieces: int):
        if not isinstance(source, (PiecewiseConstant, LayerwiseConstant)):
            raise TypeError(f"PieceAverage.source: expected a PiecewiseConstant or LayerwiseConstant control, got "
                            f"{type(source).__name__}")
        n = _count(n_pieces, "PieceAverage.n_pieces")
        P = source.n_pieces
        if n > P or P % n:
            raise ValueError(f"PieceAverage.n_pieces: a control of {P} pieces averages over a divisor of {P} coarse "
                             f"pieces, got {n}")
        super().__init__(source.axes)
        self.source = source
        self.t0, self.t1 = source.t0, source.t1
        self._n, self._r = n, P // n

    @property
    def n_pieces(self) -> int:
        return self._n

    #: the coarse piece that holds ``t`` (the rule of :class:`PiecewiseConstant`, left limits included)
    piece = PiecewiseConstant.piece

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.source.shape)

    def value(self, k: int) -> Tensor:
        """The average of coarse piece ``k``."""
        s, r = self.source, self._r
        if isinstance(s, LayerwiseConstant):
            rows = [s.pieces[i] for i in range(k * r, (k + 1) * r)]
        else:
            vals = s.raw[k * r:(k + 1) * r]
            rows = list(vals.exp() if s.positive else vals)
        if r == 1:
            return rows[0]
        return torch.stack(rows).mean(0)

    def forward(self, t, grid=None) -> Tensor:
        return self.value(self.piece(t))

    def validate(self, grid, name: str = "control") -> None:
        self.source.validate(grid, name)

    def extra_repr(self) -> str:
        return f"n_pieces={self._n}, averaging {self._r} pieces each"
