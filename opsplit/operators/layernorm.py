r"""Layer normalisation as the projection onto :math:`S_1(\sigma_1, \sigma_2)`: term II of
paper 002, eq. (7).

.. math::

    S_1(\sigma_1, \sigma_2) = \Big\{u :\ \tfrac{1}{|\Omega_y|}\int_{\Omega_y} u\,d\xi = \sigma_1,\
        \tfrac{1}{|\Omega_y|}\int_{\Omega_y} (u - \sigma_1)^2 d\xi = \sigma_2^2\Big\}

(token by token, for every :math:`x`).  The substeps (14) and (17) are the resolvent of
:math:`\partial I_{S_1}`, i.e. the projection (eqs. 20–21), whose closed form is
**Theorem 3.1, eq. (22)**:

.. math::

    P_{S_1}(v) = \sigma_2\, \frac{v - \alpha}{\sqrt{\beta}} + \sigma_1,\qquad
    \alpha = \tfrac{1}{|\Omega_y|}\int_{\Omega_y} v\,d\xi,\quad
    \beta  = \tfrac{1}{|\Omega_y|}\int_{\Omega_y} (v - \alpha)^2 d\xi,

discretised by eqs. (30)–(32).  The means use the grid's y-quadrature (the discrete
measure), so that the output lies exactly on the discrete :math:`S_1` and is the closest
point in the discrete :math:`L^2(\Omega_y)` norm.

**Zero variance.**  For a constant token (:math:`\beta = 0`) every point of :math:`S_1` is
equally close, so the projection is not unique.  With ``eps = 0`` (the literal formula)
opsplit returns the constant :math:`\sigma_1` there — the limit :math:`\varepsilon \to 0`
of the regularised formula below, finite, with finite (zero) gradient.  With ``eps > 0``
the formula is :math:`\sigma_2 (v - \alpha)/\sqrt{\beta + \varepsilon} + \sigma_1`, which
is what ``torch.nn.LayerNorm`` computes (its default ``eps = 1e-5``); the output is then
only approximately on :math:`S_1` (variance :math:`\sigma_2^2\beta/(\beta + \varepsilon)`).
"""

from __future__ import annotations

import torch
from torch import Tensor

from .._checks import check_positive_float
from ..controls import Constant, as_control
from ..grid import Grid
from .base import Operator

__all__ = ["ProjectionS1", "project_s1"]


def project_s1(
    v: Tensor,
    sigma1: Tensor | float = 0.0,
    sigma2: Tensor | float = 1.0,
    grid: Grid | None = None,
    eps: float = 0.0,
) -> Tensor:
    """Closed-form projection onto :math:`S_1(\\sigma_1, \\sigma_2)` over the last dimension
    (Theorem 3.1, eq. 22).  ``grid=None`` means equal weights (plain means, eq. 30)."""
    if grid is None:
        alpha = v.mean(-1, keepdim=True)
        d = v - alpha
        beta = (d * d).mean(-1, keepdim=True)
    else:
        alpha = grid.mean_y(v).unsqueeze(-1)
        d = v - alpha
        beta = grid.mean_y(d * d).unsqueeze(-1)
    if eps > 0:
        inv = torch.rsqrt(beta + eps)
    else:
        # beta == 0: return sigma_1 (the eps -> 0 limit); keep the untaken branch finite so
        # autograd never multiplies 0 by inf
        pos = beta > 0
        inv = torch.where(pos, torch.rsqrt(torch.where(pos, beta, torch.ones_like(beta))), 0.0)
    return d * (inv * sigma2) + sigma1


class ProjectionS1(Operator):
    """Projection onto :math:`S_1(\\sigma_1(t), \\sigma_2(t))`: LayerNorm without affine
    (paper 002, Theorem 3.1 / eq. 22; substeps 14 and 17; discrete eqs. 30–32).

    Args:
        sigma1: control (or tensor / float) for the mean :math:`\\sigma_1(t)` (a scalar).
        sigma2: control (or tensor / float) for the standard deviation :math:`\\sigma_2(t) > 0`
            (a scalar; positivity is checked for given values and kept by a log
            parametrisation in :class:`~opsplit.controls.PiecewiseConstant` with
            ``positive=True``).
        eps: regulariser of the variance (see the module docstring); ``0`` is Theorem 3.1
            exactly, ``1e-5`` is ``torch.nn.LayerNorm``'s default.
    """

    has_resolvent = True
    default_solver = "implicit"

    def __init__(self, sigma1=0.0, sigma2=1.0, *, eps: float = 0.0):
        super().__init__()
        # numbers become float64 0-d buffers: exact in a float64 model, and a 0-d tensor
        # does not promote a float32 state (module.to(dtype) converts them as well)
        if isinstance(sigma1, (int, float)):
            sigma1 = torch.tensor(float(sigma1), dtype=torch.float64)
        if isinstance(sigma2, (int, float)):
            sigma2 = torch.tensor(
                check_positive_float(sigma2, "ProjectionS1.sigma2"), dtype=torch.float64
            )
        if isinstance(sigma2, Tensor):
            if not bool((sigma2 > 0).all()):
                raise ValueError(
                    f"ProjectionS1.sigma2: expected sigma_2 > 0, got min {float(sigma2.min()):g}"
                )
            sigma2 = Constant(sigma2, positive=True)
        self.sigma1 = as_control(sigma1, "ProjectionS1.sigma1")
        self.sigma2 = as_control(sigma2, "ProjectionS1.sigma2")
        self.eps = check_positive_float(eps, "ProjectionS1.eps", allow_zero=True)

    def check(self, grid: Grid) -> None:
        self.sigma1.validate(grid, "ProjectionS1.sigma1")
        self.sigma2.validate(grid, "ProjectionS1.sigma2")

    def resolvent(self, t, dt: float, u: Tensor, grid: Grid) -> Tensor:
        # the resolvent of an indicator's subdifferential is the projection, for every dt
        return project_s1(u, self.sigma1(t, grid), self.sigma2(t, grid), grid, self.eps)

    def extra_repr(self) -> str:
        return f"eps={self.eps:g}"
