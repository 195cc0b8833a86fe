r"""A continuous transformer whose controls are smooth functions of space.

The same scheme as :class:`~opsplit.models.PaperTransformer` (paper 002, (13)–(17)), but
on fixed domains :math:`\Omega_x = [0, L_x]`, :math:`\Omega_y = [0, L_y]` with every
kernel :math:`W(\tilde y, y, t)` and bias :math:`b(x, t)` a cosine series
(:class:`~opsplit.controls.CosineSeries`, coefficients piecewise-constant in time).  The
model is therefore defined independently of any grid: it can be solved at whatever
:math:`N_x, N_y` (read from the input) and :math:`N_t` the user chooses, and the discrete
solutions converge to the continuous one as the grid is refined.
"""

from __future__ import annotations

import torch

from .._checks import (
    check_choice,
    check_dtype_arg,
    check_generator,
    check_positive_float,
    check_positive_int,
)
from ..controls import Constant, CosineSeries, PiecewiseConstant
from ..grid import RULES, Grid, Interval
from ..operators import FFNIntegral, ProjectionS1, SoftmaxAttention
from .paper import PaperSchemePropagator, paper_scheme

__all__ = ["ContinuousTransformer"]


class ContinuousTransformer(PaperSchemePropagator):
    r"""The scheme (13)–(17) with controls that are smooth functions of :math:`(x, y)`.

    Args:
        n_modes: cosine modes per spatial variable of every kernel and bias.
        J: FFN layers.
        n_steps: default :math:`N_t` (the controls have one coefficient set per step).
        T: final time (default 1).
        lx, ly: domain lengths :math:`L_x, L_y` (fixed; node counts come from the input).
        rule: quadrature rule of both domains.
        kernel_scale: size of the kernels' coefficients (see :meth:`reset_parameters`).
        generator: a ``torch.Generator`` for a reproducible initialisation.
        device, dtype: factory kwargs.
    """

    def __init__(
        self,
        n_modes: int = 4,
        *,
        J: int = 2,
        n_steps: int = 4,
        T: float = 1.0,
        lx: float = 1.0,
        ly: float = 1.0,
        rule: str = "midpoint",
        eps: float = 0.0,
        kernel_scale: float = 1.0,
        generator: torch.Generator | None = None,
        device=None,
        dtype=None,
    ):
        n_modes = check_positive_int(n_modes, "ContinuousTransformer.n_modes")
        J = check_positive_int(J, "ContinuousTransformer.J")
        n_steps = check_positive_int(n_steps, "ContinuousTransformer.n_steps (N_t)")
        T = check_positive_float(T, "ContinuousTransformer.T")
        lx = check_positive_float(lx, "ContinuousTransformer.lx")
        ly = check_positive_float(ly, "ContinuousTransformer.ly")
        check_choice(rule, RULES, "ContinuousTransformer.rule")
        eps = check_positive_float(eps, "ContinuousTransformer.eps", allow_zero=True)
        kernel_scale = check_positive_float(kernel_scale, "ContinuousTransformer.kernel_scale", allow_zero=True)
        check_generator(generator, "ContinuousTransformer.generator")
        dtype = check_dtype_arg(dtype, "ContinuousTransformer.dtype")
        fk = {"device": device, "dtype": dtype or torch.get_default_dtype()}

        def coeffs(*shape, positive=False, fill=0.0):
            return PiecewiseConstant(
                torch.full((n_steps, *shape), fill, **fk), t0=0.0, t1=T, positive=positive
            )

        def kernel():
            return CosineSeries(coeffs(n_modes, n_modes), axes=("y", "y"))

        attention = SoftmaxAttention(kernel(), kernel(), kernel())
        norm = ProjectionS1(coeffs(), coeffs(positive=True, fill=1.0), eps=eps)
        ffn = [
            FFNIntegral(kernel(), CosineSeries(coeffs(n_modes), axes=("x",)), bias_axis="x")
            for _ in range(J)
        ]
        grid = Grid(x=Interval(length=lx, rule=rule), y=Interval(length=ly, rule=rule))
        super().__init__(paper_scheme(attention, norm, ffn), n_steps, t0=0.0, t1=T, grid=grid)
        self.n_modes, self.J, self.kernel_scale = n_modes, J, float(kernel_scale)
        self.reset_parameters(generator)

    @torch.no_grad()
    def reset_parameters(self, generator: torch.Generator | None = None) -> None:
        r"""Coefficients :math:`c_{pq} \sim \mathcal N(0, 1)\,s/((1+p)^2 (1+q)^2)` with
        :math:`s` = ``kernel_scale`` / :math:`|\Omega_y|` (smooth kernels whose integral
        operators have norm of order ``kernel_scale``); :math:`\sigma_1 = 0, \sigma_2 = 1`."""
        P = self.n_modes
        decay = 1.0 / (1.0 + torch.arange(P, dtype=torch.float64)) ** 2
        ly = self.grid.y.length

        def draw(c, dims):
            shape = c.raw.shape
            z = torch.randn(shape, generator=generator, dtype=torch.float64)
            d = decay if dims == 1 else torch.outer(decay, decay)
            c.raw.copy_((z * d * (self.kernel_scale / ly)).to(c.raw))

        a = self.attention
        for k in (a.WQ, a.WK, a.WV):
            draw(k.coefficients, 2)
        for layer in self.ffn:
            draw(layer.W.coefficients, 2)
            draw(layer.b.coefficients, 1)
            layer.b.coefficients.raw.mul_(ly)  # biases of order kernel_scale
        self.norm.sigma1.fill_(torch.tensor(0.0))
        self.norm.sigma2.fill_(torch.tensor(1.0))

    def sample(self, f_coefficients: torch.Tensor, nx: int, ny: int) -> torch.Tensor:
        r"""An initial state :math:`f(x, y) = \sum c_{pq}\cos(p\pi x/L_x)\cos(q\pi y/L_y)`
        sampled on the ``nx x ny`` grid of this model's domains; ``f_coefficients`` has
        shape ``(B, P_x, P_y)``."""
        g = self.grid.with_shape(nx, ny)
        f = CosineSeries(Constant(f_coefficients), axes=("x", "y"))
        return f(0.0, g)

    def extra_repr(self) -> str:
        return f"n_modes={self.n_modes}, J={self.J}, " + super().extra_repr()
