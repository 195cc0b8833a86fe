r"""Piecewise-constant controls stored as one parameter per piece.

:class:`LayerwiseConstant` is the same function of time as
:class:`~opsplit.controls.PiecewiseConstant` — :math:`\theta(t) = \theta^n` on
:math:`[t^{n-1}, t^n)`, the last piece closed, one piece per layer of a converted network —
but it holds every piece in its own ``nn.Parameter`` instead of one stacked tensor.  The
difference is only in the backward pass: reading row :math:`n` of a stacked parameter
(``raw[n]``) sends a full-size gradient (zeros except row :math:`n`) into the stacked
parameter at every use, so a stack of :math:`N_t` layers costs :math:`O(N_t^2)` gradient
memory traffic; with one parameter per piece each layer's gradient goes to its own
parameter.  For deep stacks of large kernels (CvT's last stage: 10 layers, 384 x 1536 FFN
kernels) this is a large share of a training step.  Each piece also has its own
``requires_grad``.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from .base import Control, _check_values
from .piecewise import PiecewiseConstant

__all__ = ["LayerwiseConstant"]


class LayerwiseConstant(Control):
    """Piecewise constant in time on ``[t0, t1]`` with equal pieces, one ``Parameter`` each.

    Args:
        values: tensor of shape ``(n_pieces, *shape)``; piece ``n`` becomes the parameter
            ``pieces[n]`` (a copy).
        t0, t1: the time interval; ``t1`` defaults to ``t0 + n_pieces`` (one unit per piece).
        axes: the spatial axes the trailing dimensions live on (as for every control).
    """

    def __init__(self, values: Tensor, *, t0: float = 0.0, t1: float | None = None, axes=()):
        super().__init__(axes)
        values = _check_values(values, "LayerwiseConstant.values")
        if values.dim() < 1 or values.shape[0] < 1:
            raise ValueError(
                f"LayerwiseConstant.values: expected shape (n_pieces, *shape) with at least one piece, got "
                f"{tuple(values.shape)}"
            )
        self.pieces = nn.ParameterList(nn.Parameter(v.detach().clone()) for v in values)
        self.t0 = float(t0)
        self.t1 = self.t0 + len(self.pieces) if t1 is None else float(t1)
        if not self.t1 > self.t0:
            raise ValueError(f"LayerwiseConstant: expected t0 < t1, got t0={t0}, t1={t1}")
        self.check_grid(self.shape, None)
        # the exact start times t0 + (t1 - t0) k / n of the pieces (what a propagator with one
        # step per piece evaluates at), looked up without the general rule of `piece`
        n = len(self.pieces)
        self._starts = {self.t0 + (self.t1 - self.t0) * k / n: str(k) for k in range(n)}

    @property
    def n_pieces(self) -> int:
        return len(self.pieces)

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.pieces[0].shape)

    #: the piece that holds time ``t`` (the same rule as :class:`PiecewiseConstant`)
    piece = PiecewiseConstant.piece

    @property
    def values(self) -> Tensor:
        """All pieces stacked, shape ``(n_pieces, *shape)`` (a new tensor)."""
        return torch.stack(list(self.pieces))

    def forward(self, t, grid=None) -> Tensor:
        if type(t) is float:  # a plain float (not a LeftLimit, not a tensor) at a piece's start
            k = self._starts.get(t)
            if k is not None and len(self._starts) == len(self.pieces):
                return self.pieces._parameters[k]
        return self.pieces[self.piece(t)]

    def validate(self, grid, name: str = "control") -> None:
        self.check_grid(self.shape, grid, name)

    @torch.no_grad()
    def fill_(self, values: Tensor):
        """Overwrite all pieces (``values`` of shape ``(n_pieces, *shape)`` or ``shape``)."""
        values = torch.as_tensor(values)
        for n, p in enumerate(self.pieces):
            p.copy_(values[n] if values.dim() == p.dim() + 1 else values)
        return self

    def extra_repr(self) -> str:
        return f"n_pieces={self.n_pieces}, shape={self.shape}, t=[{self.t0:g}, {self.t1:g}]"
