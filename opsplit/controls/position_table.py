r"""Learned absolute positions as an :math:`x`-dependent control: GPT-2's ``wpe``.

GPT-2 adds a learned vector to every token before the first layer,
:math:`u_0(x, y) = E(\text{token}(x), y) + P(\xi(x), y)`: a control that depends on the token
position and not on time.  :class:`PositionTable` stores :math:`P` at the nodes
:math:`\xi = 0, 1, \dots, n_{pos} - 1` of the position axis (one row per node, Hugging
Face's ``wpe.weight``) and is the piecewise-linear function through them, so it can be
evaluated at any :math:`\xi \in [0, n_{pos} - 1]`:

* on the paper's grid :math:`L = N` the tokens sit at :math:`\xi_i = x_i - x_1 = i`, nodes of
  the table: the value is the row itself (a lookup, bit for bit ``wpe(position_ids)``);
* on a refined grid (:math:`L_x` fixed, spacing :math:`h < 1`) at :math:`\xi_i = i h`, between
  nodes: linear interpolation of the two neighbouring rows.

Positions beyond the table (:math:`\xi > n_{pos} - 1`: a sequence longer than GPT-2's
``n_positions``) or before it are refused with a ``ValueError`` before any compute; the
table is not extrapolated.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .._checks import skip_value_checks
from .base import Control, _check_values

__all__ = ["PositionTable"]


class PositionTable(Control):
    """:math:`P(\\xi, y)` from rows at :math:`\\xi = 0, \\dots, n_{pos} - 1` (module docstring).

    Args:
        values: tensor ``(n_positions, N_y)``; becomes a trainable ``Parameter`` (unless
            ``requires_grad=False``).
    """

    def __init__(self, values: Tensor, *, requires_grad: bool = True):
        super().__init__(axes=("y",))
        values = _check_values(values, "PositionTable.values")
        if values.dim() != 2 or values.shape[0] < 1:
            raise ValueError(f"PositionTable.values: expected shape (n_positions, N_y), got {tuple(values.shape)}")
        self.weight = nn.Parameter(values.detach().clone(), requires_grad=requires_grad)

    @property
    def n_positions(self) -> int:
        return int(self.weight.shape[0])

    @property
    def shape(self) -> tuple[int, ...]:
        return (int(self.weight.shape[1]),)

    def check_positions(self, positions: Tensor, name: str = "positions") -> None:
        """Raise a ``ValueError`` naming ``name`` if a position lies outside the table."""
        if skip_value_checks() or positions.numel() == 0:
            return
        p = positions.detach()
        lo, hi = float(p.min()), float(p.max())
        if lo < 0 or hi > self.n_positions - 1:
            raise ValueError(
                f"{name}: positions in [{lo:g}, {hi:g}] lie outside the learned position table [0, "
                f"{self.n_positions - 1}] (n_positions = {self.n_positions}): a sequence longer than the model's "
                f"positions cannot be evaluated"
            )

    def at(self, positions: Tensor, *, check: bool = True) -> Tensor:
        """:math:`P(\\xi)` at coordinates ``positions`` (any shape; integer or real), shape
        ``positions.shape + (N_y,)``: a row lookup at integer coordinates, linear interpolation
        between rows otherwise.  ``check=False`` skips the range check (the caller made it)."""
        if check:
            self.check_positions(positions)
        if not positions.is_floating_point():
            return F.embedding(positions, self.weight)
        lo = positions.floor()
        if bool((lo == positions).all()):
            return F.embedding(lo.long(), self.weight)
        i0 = lo.long().clamp(max=self.n_positions - 2) if self.n_positions > 1 else lo.long()
        lam = (positions - i0.to(positions.dtype)).unsqueeze(-1).to(self.weight.dtype)
        if self.n_positions == 1:
            return F.embedding(i0, self.weight)
        return torch.lerp(F.embedding(i0, self.weight), F.embedding(i0 + 1, self.weight), lam)

    def validate(self, grid, name: str = "control") -> None:
        self.check_grid(self.shape, grid, name)

    def forward(self, t=None, grid=None) -> Tensor:
        """The rows at the grid's token coordinates :math:`\\xi_i = x_i - x_1`, ``(N_x, N_y)``."""
        if grid is None or grid.x.n is None:
            raise ValueError("PositionTable: needs a grid with a node count on Omega_x")
        x = grid.x.nodes(torch.float64, self.weight.device)
        return self.at(x - x[0])

    def extra_repr(self) -> str:
        return f"n_positions={self.n_positions}, n_y={self.shape[0]}"
