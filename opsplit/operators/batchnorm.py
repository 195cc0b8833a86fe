r"""Batch normalisation of the spatial tokens: the affine map of CvT's Q/K/V projections.

CvT's convolutional projection is a depthwise convolution followed by
``nn.BatchNorm2d``.  Per channel :math:`y`:

* **eval mode** (running statistics :math:`\mu(y), \sigma^2(y)`): a pointwise affine map

  .. math::  u(x, y) \mapsto \gamma(y)\,\frac{u(x, y) - \mu(y)}{\sqrt{\sigma^2(y) + \varepsilon}}
             + \beta(y) = a(y)\,u(x, y) + c(y),

  the same kind of map as :class:`~opsplit.operators.PointwiseAffine` (see
  :meth:`BatchNormMap.affine`);
* **training mode**: :math:`\mu, \sigma^2` are the mean and (biased) variance over the
  batch and the spatial tokens, so the map is the closed-form projection of Theorem 3.1
  (eq. 22) taken over the index set (batch × :math:`\Omega_x`) instead of
  :math:`\Omega_y`, followed by the affine map; the running statistics are updated as
  torch does (momentum, unbiased variance).

Prefix (class) tokens are not on the 2-D grid and pass unchanged.  The parameters are
piecewise constant in time (one set per layer, like every control of a converted model);
the running statistics are buffers with one row per time piece.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from .._checks import check_positive_float, check_positive_int
from ..controls import PiecewiseConstant
from ..grid import Grid
from .base import Operator
from .convolution import image_grid_of

__all__ = ["BatchNormMap"]


class BatchNormMap(Operator):
    """``nn.BatchNorm2d`` on the spatial tokens, per time piece (see the module docstring).

    Args:
        num_channels: :math:`N_y`.
        n_pieces, t0, t1: time pieces of the parameters and statistics (``t1`` defaults to
            ``t0 + n_pieces``).
        eps: :math:`\\varepsilon`.
        momentum: running-statistics momentum (``None``: cumulative average, as torch).
    """

    has_flow = True
    default_solver = "exact"
    #: a Δt-independent map
    is_map = True

    def __init__(self, num_channels: int, *, n_pieces: int = 1, t0: float = 0.0, t1: float | None = None,
                 eps: float = 1e-5, momentum: float | None = 0.1, device=None, dtype=None):
        super().__init__()
        c = check_positive_int(num_channels, "BatchNormMap.num_channels")
        n = check_positive_int(n_pieces, "BatchNormMap.n_pieces")
        self.eps = check_positive_float(eps, "BatchNormMap.eps")
        if momentum is not None:
            momentum = float(momentum)
            if not 0.0 <= momentum <= 1.0:
                raise ValueError(f"BatchNormMap.momentum: expected a number in [0, 1] or None, got {momentum}")
        self.momentum = momentum
        fk = {"device": device, "dtype": dtype or torch.get_default_dtype()}
        self.weight = PiecewiseConstant(torch.ones(n, c, **fk), t0=t0, t1=t1, axes=("y",))
        self.bias = PiecewiseConstant(torch.zeros(n, c, **fk), t0=t0, t1=t1, axes=("y",))
        self.register_buffer("running_mean", torch.zeros(n, c, **fk))
        self.register_buffer("running_var", torch.ones(n, c, **fk))
        self.register_buffer("num_batches_tracked", torch.zeros(n, dtype=torch.long, device=device))
        self.num_channels = c

    @torch.no_grad()
    def reset_parameters(self) -> None:
        self.weight.raw.fill_(1.0)
        self.bias.raw.zero_()
        self.running_mean.zero_()
        self.running_var.fill_(1.0)
        self.num_batches_tracked.zero_()

    def check(self, grid: Grid) -> None:
        g = image_grid_of(grid, "BatchNormMap")
        if g.y.n is not None and g.y.n != self.num_channels:
            raise ValueError(
                f"BatchNormMap: channel mismatch: {self.num_channels} channels, the grid has N_y = {g.y.n}"
            )

    def affine(self, t=0.0) -> tuple[Tensor, Tensor]:
        r"""The eval-mode map as :math:`u \mapsto a \odot u + c`: ``(a, c)``, each ``(N_y,)``."""
        k = self.weight.piece(t)
        a = self.weight(t) / torch.sqrt(self.running_var[k] + self.eps)
        return a, self.bias(t) - self.running_mean[k] * a

    def apply_image(self, t, img: Tensor, grid=None) -> Tensor:
        """The map on an image ``(B, N_y, N_1, N_2)``."""
        k = self.weight.piece(t)
        w, b = self.weight(t), self.bias(t)
        rm, rv = self.running_mean[k], self.running_var[k]
        if self.training:
            self.num_batches_tracked[k].add_(1)
            factor = self.momentum if self.momentum is not None else 1.0 / float(self.num_batches_tracked[k])
            return F.batch_norm(img, rm, rv, w, b, True, factor, self.eps)
        return F.batch_norm(img, rm, rv, w, b, False, 0.0, self.eps)

    def flow(self, t, dt: float, u: Tensor, grid: Grid) -> Tensor:
        g = image_grid_of(grid, "BatchNormMap")
        return g.from_image(self.apply_image(t, g.to_image(u), g), g.split(u)[0])

    def extra_repr(self) -> str:
        m = "None" if self.momentum is None else f"{self.momentum:g}"
        return f"{self.num_channels}, pieces={self.weight.n_pieces}, eps={self.eps:g}, momentum={m}"

