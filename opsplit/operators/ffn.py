r"""One layer of the feed-forward term III of paper 002, eq. (7): an integral operator.

.. math::  F_j(t; u)(x, y) = \langle W_j(\cdot, y, t), u(x, \cdot, t)\rangle_{\Omega_y}
           + b_j(\cdot, t)

The explicit-Euler step of :math:`F_j` is the first line of eq. (23); with ``L = N``,
:math:`\Delta t = 1` it is eq. (34), :math:`\bar u = u + u W_j + b_j = u (I + W_j) + b_j`,
the paper's square linear layer "I + W_j".  Followed by the projection onto
:math:`S_2` (eq. 24 / 35) it is the semi-implicit substep (15).

**The bias.** Eq. (8) makes :math:`b_j` a function of :math:`(x, t)` — one value per
*token*, added along the row (eq. 34: :math:`z_{k,l} = W_{k,l} + b_k`).  A
``torch.nn.Linear`` bias is a function of the output *feature* :math:`y`.  Both are here:
``bias_axis="x"`` (the paper, the default of the paper's model) and ``bias_axis="y"``.

Because the term is affine in :math:`u` it also has an exact resolvent (implicit Euler,
one linear solve) and an exact flow (one matrix exponential), with the controls frozen at
the substep's start time.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..controls import as_control
from ..grid import Grid
from .base import Operator

__all__ = ["FFNIntegral"]


class FFNIntegral(Operator):
    """The affine integral operator :math:`u \\mapsto \\langle W_j, u\\rangle_{\\Omega_y} + b_j`
    (paper 002, eq. 7 term III; steps eqs. 23 and 34).

    Args:
        W: control (or tensor) for the kernel :math:`W_j(\\tilde y, y, t)`, shape
            ``(N_y, N_y)`` (row: integration variable).
        b: control (or tensor) for the bias, shape ``(N_x,)`` if ``bias_axis="x"`` or
            ``(N_y,)`` if ``bias_axis="y"``; ``None`` for no bias.
        bias_axis: ``"x"`` (paper, eq. 8) or ``"y"`` (``nn.Linear``).
    """

    has_field = True
    has_resolvent = True
    has_flow = True
    default_solver = "explicit"

    def __init__(self, W, b=None, *, bias_axis: str = "x"):
        super().__init__()
        if bias_axis not in ("x", "y"):
            raise ValueError(f"FFNIntegral.bias_axis: expected 'x' or 'y', got {bias_axis!r}")
        self.bias_axis = bias_axis
        self.W = as_control(W, "FFNIntegral.W", axes=("y", "y"))
        self.b = None if b is None else as_control(b, "FFNIntegral.b", axes=(bias_axis,))

    def check(self, grid: Grid) -> None:
        self.W.validate(grid, "FFNIntegral.W")
        if self.b is not None:
            self.b.validate(grid, "FFNIntegral.b")

    def _bias(self, t, grid: Grid) -> Tensor | None:
        if self.b is None:
            return None
        b = self.b(t, grid)
        return b.unsqueeze(-1) if self.bias_axis == "x" else b

    def field(self, t, u: Tensor, grid: Grid) -> Tensor:
        out = grid.kernel_y(u, self.W(t, grid))
        b = self._bias(t, grid)
        return out if b is None else out + b

    def _matrix(self, t, grid: Grid) -> Tensor:
        """The discrete operator ``A`` with ``field(u) = u @ A + b`` (weights folded in)."""
        W = self.W(t, grid)
        w = grid.y.uniform_weight
        if w is None:
            return grid.y.weights(W.dtype, W.device).unsqueeze(-1) * W
        return W if w == 1.0 else W * w

    def resolvent(self, t, dt: float, u: Tensor, grid: Grid) -> Tensor:
        r"""Implicit Euler: solve :math:`w - \Delta t\,(w A + b) = u` for :math:`w`."""
        A = self._matrix(t, grid)
        eye = torch.eye(A.shape[0], dtype=A.dtype, device=A.device)
        rhs = u
        b = self._bias(t, grid)
        if b is not None:
            rhs = rhs + dt * b
        # w (I - dt A) = rhs  <=>  (I - dt A)^T w^T = rhs^T
        M = (eye - dt * A).transpose(0, 1)
        return torch.linalg.solve(M, rhs.transpose(-1, -2)).transpose(-1, -2)

    def flow(self, t, dt: float, u: Tensor, grid: Grid) -> Tensor:
        r"""Exact flow of :math:`w_t = w A + b` over :math:`[t, t + \Delta t]` (controls frozen
        at ``t``), by the exponential of the augmented matrix
        :math:`\begin{pmatrix} A & 0 \\ c & 0 \end{pmatrix}` acting on rows
        :math:`(w, 1)` (y-bias, :math:`c = b`) or :math:`(w, b_k)` (x-bias, :math:`c = 1`)."""
        A = self._matrix(t, grid)
        n = A.shape[0]
        b = self._bias(t, grid)
        if b is None:
            return u @ torch.linalg.matrix_exp(dt * A)
        aug = A.new_zeros(n + 1, n + 1)
        aug[:n, :n] = A
        if self.bias_axis == "y":
            aug[n, :n] = b
            tail = u.new_ones(u.shape[:-1] + (1,))
        else:
            aug[n, :n] = 1.0
            tail = b.expand(u.shape[:-1] + (1,))
        E = torch.linalg.matrix_exp(dt * aug)
        return torch.cat([u, tail], dim=-1) @ E[:, :n]

    def extra_repr(self) -> str:
        return f"bias_axis={self.bias_axis!r}, bias={self.b is not None}"
