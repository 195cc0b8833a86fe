r"""The feed-forward term with its own hidden grid: torch's FFN as one integral operator.

Paper 002's FFN (eq. 7 term III, steps 34–35) is :math:`J` *square* layers on
:math:`\Omega_y`, each ":math:`I + W_j`" followed by the ReLU projection, and the skip
connection is the relaxation (16).  ``nn.TransformerEncoderLayer``'s FFN is different: one
hidden layer of width ``dim_feedforward`` :math:`\ne N_y`, an activation inside, *no*
activation after the last layer, and a plain residual :math:`u + \mathrm{FFN}(u)`.  As a
continuous term, with a hidden domain :math:`\Omega_z = [0, L_z]`:

.. math::

    F(u)(x, y) = \int_{\Omega_z} W_2(z, y)\,
        \sigma\Big(\int_{\Omega_y} W_1(\xi, z)\, u(x, \xi)\, d\xi + b_1(z)\Big)\, dz + b_2(y),

an explicit term whose explicit-Euler step with :math:`\Delta t = 1` and ``L = N`` (unit
weights on :math:`\Omega_y` and :math:`\Omega_z`) is ``x + linear2(act(linear1(x)))``.
With ReLU, :math:`\sigma` is the projection onto :math:`S_2` *in the hidden space*
:math:`\Omega_z`; with GELU it is a pointwise map that is not a projection
(:mod:`opsplit.operators.activation`).  Dropout (on the hidden activation, as torch) is
applied in training mode only and is the identity in eval mode.

The :math:`\Omega_y` and :math:`\Omega_z` quadrature weights are folded into the kernels
when they are equal; the two integrals are two GEMMs (``F.linear``).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from .._checks import check_dtype_arg, check_positive_int, check_probability
from ..controls import PiecewiseConstant, as_control
from ..grid import Grid, Interval
from ._linear import fan_in_uniform_, linear_y
from .activation import Activation, activation_fn
from .base import Operator

__all__ = ["FeedForward"]


def _shape(control):
    return tuple(control.shape) if hasattr(control, "shape") and not callable(control.shape) else None


class FeedForward(Operator):
    """One-hidden-layer feed-forward integral operator on a hidden grid :math:`\\Omega_z`
    (``nn.TransformerEncoderLayer``'s FFN as a term of the continuous model).

    Args:
        W1: control (or tensor) for :math:`W_1(\\xi, z)`, shape ``(N_y, N_z)``.
        b1: control (or tensor) for :math:`b_1(z)`, shape ``(N_z,)``, or ``None``.
        W2: control (or tensor) for :math:`W_2(z, y)`, shape ``(N_z, N_y)``.
        b2: control (or tensor) for :math:`b_2(y)`, shape ``(N_y,)``, or ``None``.
        activation: a name from :data:`~opsplit.operators.activation.ACTIVATIONS` or an
            :class:`~opsplit.operators.Activation`.
        hidden: the hidden domain :math:`\\Omega_z` (an :class:`~opsplit.grid.Interval`,
            ``n`` open or ``N_z``); ``None`` is ``L_z = N_z`` (unit weights).
        dropout: dropout probability on the hidden activation in training mode.
    """

    has_field = True
    default_solver = "explicit"

    def __init__(
        self,
        W1,
        b1,
        W2,
        b2,
        *,
        activation="relu",
        hidden: Interval | None = None,
        dropout: float = 0.0,
    ):
        super().__init__()
        self.W1 = as_control(W1, "FeedForward.W1")
        self.b1 = None if b1 is None else as_control(b1, "FeedForward.b1")
        self.W2 = as_control(W2, "FeedForward.W2", axes=("y",))
        self.b2 = None if b2 is None else as_control(b2, "FeedForward.b2", axes=("y",))
        if isinstance(activation, Activation):
            self.activation = activation.name
        else:
            activation_fn(activation)  # clear error for unknown names
            self.activation = activation
        if hidden is not None and not isinstance(hidden, Interval):
            raise TypeError(f"FeedForward.hidden: expected an Interval, got {type(hidden).__name__}")
        self.hidden = hidden
        self.dropout = check_probability(dropout, "FeedForward.dropout")
        s1, s2 = _shape(self.W1), _shape(self.W2)
        if s1 is not None and len(s1) != 2:
            raise ValueError(f"FeedForward.W1: expected shape (N_y, N_z), got {s1}")
        if s2 is not None and len(s2) != 2:
            raise ValueError(f"FeedForward.W2: expected shape (N_z, N_y), got {s2}")
        if s1 is not None and s2 is not None and (s1[1] != s2[0] or s1[0] != s2[1]):
            raise ValueError(
                f"FeedForward: W1 {s1} = (N_y, N_z) and W2 {s2} = (N_z, N_y) do not fit together"
            )
        for name, c, want in (("b1", self.b1, None if s1 is None else (s1[1],)), ("b2", self.b2, None if s2 is None else (s2[1],))):
            s = None if c is None else _shape(c)
            if s is not None and want is not None and s != want:
                raise ValueError(f"FeedForward.{name}: expected shape {want}, got {s}")
        if hidden is not None and hidden.n is not None and s1 is not None and hidden.n != s1[1]:
            raise ValueError(f"FeedForward.hidden: {hidden.n} nodes, but W1 has N_z = {s1[1]}")

    @classmethod
    def create(
        cls,
        n_y: int,
        n_z: int,
        *,
        n_pieces: int = 1,
        t0: float = 0.0,
        t1: float | None = None,
        bias: bool = True,
        device=None,
        dtype=None,
        **kwargs,
    ) -> FeedForward:
        """Trainable kernels with one set per time piece, initialised like ``nn.Linear``."""
        n_y = check_positive_int(n_y, "FeedForward.create: n_y")
        n_z = check_positive_int(n_z, "FeedForward.create: n_z")
        n_pieces = check_positive_int(n_pieces, "FeedForward.create: n_pieces")
        dtype = check_dtype_arg(dtype, "FeedForward.create: dtype")
        fk = {"device": device, "dtype": dtype or torch.get_default_dtype()}

        def pc(*shape):
            return PiecewiseConstant(torch.zeros(n_pieces, *shape, **fk), t0=t0, t1=t1)

        op = cls(pc(n_y, n_z), pc(n_z) if bias else None, pc(n_z, n_y), pc(n_y) if bias else None, **kwargs)
        op.reset_parameters()
        return op

    @torch.no_grad()
    def reset_parameters(self) -> None:
        """``nn.Linear``'s default initialisation, for trainable (piecewise-constant) kernels."""
        for W, b in ((self.W1, self.b1), (self.W2, self.b2)):
            if isinstance(W, PiecewiseConstant):
                fan_in_uniform_(W.shape[0], W.raw, b.raw if isinstance(b, PiecewiseConstant) else None)

    @property
    def n_hidden(self) -> int | None:
        s = _shape(self.W1)
        return None if s is None else s[1]

    def check(self, grid: Grid) -> None:
        s = _shape(self.W1)
        if s is not None and grid.y.n is not None and s[0] != grid.y.n:
            raise ValueError(
                f"FeedForward: grid/control mismatch: W1 acts on N_y = {s[0]} features (d_model), "
                f"the grid has N_y = {grid.y.n}"
            )
        for name in ("W1", "b1", "W2", "b2"):
            c = getattr(self, name)
            if c is not None:
                c.validate(grid, f"FeedForward.{name}")

    def _hidden_weight(self, nz: int, dtype, device):
        if self.hidden is None:
            return 1.0
        itv = self.hidden.with_n(nz)
        w = itv.uniform_weight
        return w if w is not None else itv.weights(dtype, device)

    def hidden_preactivation(self, t, u: Tensor, grid: Grid) -> Tensor:
        """:math:`\\int_{\\Omega_y} W_1(\\xi, z) u(x, \\xi) d\\xi + b_1(z)`, shape (B, N_x, N_z)."""
        return linear_y(u, self.W1(t, grid), None if self.b1 is None else self.b1(t, grid), grid)

    def field(self, t, u: Tensor, grid: Grid) -> Tensor:
        h = self.hidden_preactivation(t, u, grid)
        # ReLU in place on the fresh GEMM output (autograd-safe: the GEMM does not save it)
        h = h.relu_() if self.activation == "relu" else activation_fn(self.activation)(h)
        return self.output(t, h, grid)

    def output(self, t, h: Tensor, grid: Grid) -> Tensor:
        """:math:`\\int_{\\Omega_z} W_2(z, y)\\, h(x, z)\\, dz + b_2(y)` of the hidden activation
        ``h`` (B, N_x, N_z), after dropout in training mode."""
        if self.dropout and self.training:
            h = F.dropout(h, self.dropout, True)
        W2 = self.W2(t, grid)
        b2 = None if self.b2 is None else self.b2(t, grid)
        wz = self._hidden_weight(W2.shape[0], h.dtype, h.device)
        if isinstance(wz, Tensor):
            h = h * wz
        elif wz != 1.0:
            W2 = W2 * wz
        return F.linear(h, W2.t(), b2)

    def extra_repr(self) -> str:
        s = f"n_hidden={self.n_hidden}, activation={self.activation!r}"
        if self.hidden is not None:
            s += f", hidden={self.hidden}"
        if self.dropout:
            s += f", dropout={self.dropout:g}"
        return s
