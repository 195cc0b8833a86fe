r"""The gated feed-forward term of Llama-family decoders as a product of integral operators
on a hidden grid :math:`\Omega_z`.

.. math::

    F(u)(x, y) = \int_{\Omega_z} W_{\downarrow}(z, y)\,
        \sigma\Big(\int_{\Omega_y} W_g(\xi, z)\, u(x, \xi)\, d\xi + b_g(z)\Big)\,
        \Big(\int_{\Omega_y} W_{\uparrow}(\xi, z)\, u(x, \xi)\, d\xi + b_{\uparrow}(z)\Big)\, dz
        + b_{\downarrow}(y):

two integral transforms :math:`\Omega_y \to \Omega_z` (gate and up), their pointwise
product on :math:`\Omega_z` after the activation :math:`\sigma` of the gate (SiLU for
Llama, Qwen2 and Mistral: "SwiGLU"), and one transform back :math:`\Omega_z \to \Omega_y`.
An explicit term: with ``L = N`` (unit weights on :math:`\Omega_y`, :math:`\Omega_z`) and
:math:`\Delta t = 1` its explicit-Euler step is ``x + down_proj(act(gate_proj(x)) *
up_proj(x))`` (biases: Llama's ``mlp_bias``).  :math:`\sigma` is a pointwise map, not a
projection (:mod:`opsplit.operators.activation`); the product makes :math:`F` quadratic in
:math:`u` (for :math:`\sigma` = identity: a bilinear form).

It is :class:`~opsplit.operators.FeedForward` (``W1, b1`` the gate, ``W2, b2`` the down
transform, same hidden grid, quadrature and dropout on the hidden activation) with the up
transform as a second factor.  When autograd does not record, the gate and up kernels are
applied as one GEMM (side by side, :func:`~opsplit.operators._linear.side_by_side`: a copy
made at the call, never kept).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from .._checks import check_positive_int
from ..controls import PiecewiseConstant, as_control
from ..grid import Grid
from ._fused import frozen_output
from ._linear import fan_in_uniform_, linear_y, side_by_side
from .activation import activation_fn
from .feedforward import FeedForward, _shape

__all__ = ["GatedFeedForward"]


class GatedFeedForward(FeedForward):
    """:math:`W_\\downarrow(\\sigma(W_g u + b_g) \\odot (W_\\uparrow u + b_\\uparrow)) + b_\\downarrow`
    (module docstring).

    Args:
        W_gate, W_up: controls (or tensors) of shape ``(N_y, N_z)``.
        W_down: control (or tensor) of shape ``(N_z, N_y)``.
        b_gate, b_up: optional biases ``(N_z,)``; b_down: optional ``(N_y,)``.
        activation: the gate's activation (a name from
            :data:`~opsplit.operators.activation.ACTIVATIONS`; ``"silu"`` for Llama).
        hidden: the hidden domain :math:`\\Omega_z` (``None``: ``L_z = N_z``).
        dropout: dropout probability on the hidden product in training mode.
    """

    def __init__(self, W_gate, W_up, W_down, *, b_gate=None, b_up=None, b_down=None, activation="silu",
                 hidden=None, dropout: float = 0.0):
        super().__init__(W_gate, b_gate, W_down, b_down, activation=activation, hidden=hidden, dropout=dropout)
        self.W_up = as_control(W_up, "GatedFeedForward.W_up")
        self.b_up = None if b_up is None else as_control(b_up, "GatedFeedForward.b_up")
        s1, su = _shape(self.W1), _shape(self.W_up)
        if su is not None and s1 is not None and su != s1:
            raise ValueError(f"GatedFeedForward: W_up {su} must have the shape of W_gate {s1} = (N_y, N_z)")
        sb = None if self.b_up is None else _shape(self.b_up)
        if sb is not None and s1 is not None and sb != (s1[1],):
            raise ValueError(f"GatedFeedForward.b_up: expected shape ({s1[1]},), got {sb}")

    @classmethod
    def create(cls, n_y: int, n_z: int, *, n_pieces: int = 1, t0: float = 0.0, t1: float | None = None,
               bias: bool = False, generator=None, device=None, dtype=None, **kwargs) -> GatedFeedForward:
        """Trainable kernels with one set per time piece, initialised like ``nn.Linear``
        (uniform :math:`\\pm 1/\\sqrt{n_{in}}`, drawn from ``generator``)."""
        n_y = check_positive_int(n_y, "GatedFeedForward.create: n_y")
        n_z = check_positive_int(n_z, "GatedFeedForward.create: n_z")
        n_pieces = check_positive_int(n_pieces, "GatedFeedForward.create: n_pieces")
        fk = {"device": device, "dtype": dtype or torch.get_default_dtype()}

        def pc(*shape, fan_in):
            v = (torch.rand((n_pieces, *shape), generator=generator, dtype=torch.float64) * 2 - 1) / math.sqrt(fan_in)
            return PiecewiseConstant(v.to(**fk), t0=t0, t1=t1)

        return cls(pc(n_y, n_z, fan_in=n_y), pc(n_y, n_z, fan_in=n_y), pc(n_z, n_y, fan_in=n_z),
                   b_gate=pc(n_z, fan_in=n_y) if bias else None, b_up=pc(n_z, fan_in=n_y) if bias else None,
                   b_down=pc(n_y, fan_in=n_z) if bias else None, **kwargs)

    @torch.no_grad()
    def reset_parameters(self) -> None:
        """``nn.Linear``'s default initialisation of trainable (piecewise-constant) kernels."""
        super().reset_parameters()
        if isinstance(self.W_up, PiecewiseConstant):
            b = self.b_up.raw if isinstance(self.b_up, PiecewiseConstant) else None
            fan_in_uniform_(self.W_up.shape[0], self.W_up.raw, b)

    def check(self, grid: Grid) -> None:
        super().check(grid)
        self.W_up.validate(grid, "GatedFeedForward.W_up")
        if self.b_up is not None:
            self.b_up.validate(grid, "GatedFeedForward.b_up")

    def up(self, t, u: Tensor, grid: Grid) -> Tensor:
        """:math:`\\int_{\\Omega_y} W_\\uparrow(\\xi, z) u(x, \\xi) d\\xi + b_\\uparrow(z)`, shape (B, N_x, N_z)."""
        return linear_y(u, self.W_up(t, grid), None if self.b_up is None else self.b_up(t, grid), grid)

    def field(self, t, u: Tensor, grid: Grid) -> Tensor:
        if torch.is_grad_enabled():
            act = activation_fn(self.activation)
            h = act(self.hidden_preactivation(t, u, grid)) * self.up(t, u, grid)
            return self.output(t, h, grid)
        return self.output(t, self._gated(u, grid, *self._gate_up(t, grid)), grid)

    def _gate_up(self, t, grid: Grid) -> tuple:
        """Without autograd: the gate and up kernels side by side (one GEMM; a copy made here
        from the current values), their biases and :math:`N_z`."""
        Wg, Wu = self.W1(t, grid), self.W_up(t, grid)
        bg = None if self.b1 is None else self.b1(t, grid)
        bu = None if self.b_up is None else self.b_up(t, grid)
        W, b = side_by_side((Wg, Wu), (bg, bu))
        return W, b, Wg.shape[1]

    def _gated(self, u: Tensor, grid: Grid, W: Tensor, b: Tensor | None, nz: int) -> Tensor:
        g, up = linear_y(u, W, b, grid).split(nz, dim=-1)
        return activation_fn(self.activation)(g) * up

    def frozen_field(self, t, grid: Grid):
        """The field at time ``t`` as ``f(u, grid)`` with the kernels evaluated once
        (:mod:`opsplit.operators._fused`: repeated calls without autograd, fixed parameters);
        the same operations as :meth:`field`."""
        kernels, out = self._gate_up(t, grid), frozen_output(self, t, grid)
        return lambda u, g: out(self._gated(u, g, *kernels), g)

    def extra_repr(self) -> str:
        return super().extra_repr() + ", gated=True"
