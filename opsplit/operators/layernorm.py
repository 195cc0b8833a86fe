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

**Constant tokens.**  For a token with zero variance (:math:`\beta = 0`) every point of
:math:`S_1` is equally close, so the projection is not unique.  opsplit returns the
constant :math:`\sigma_1` there (the limit :math:`\varepsilon \to 0` of the regularised
formula below), with zero gradient with respect to the token.  In floating point a
constant token is recognised by a tolerance relative to its own scale, never by the
computed variance (the mean of a constant token is rounded, so the centred token is
rounding noise that the literal formula would blow up to :math:`\pm\sigma_2`):

.. math::  \max_y u - \min_y u \;\le\; c\,\epsilon_{\mathrm{mach}} \max_y |u|,
           \qquad c = 8 \ (\texttt{S1\_CONSTANT\_ULPS}),

with :math:`\epsilon_{\mathrm{mach}}` of the tensor's dtype (``torch.finfo(dtype).eps``).
The test is exact (a difference of extremes, no rounded mean), scale-free, and holds for
the all-zero token.  A token that varies by at most a few units in the last place is
rounding noise around a constant and is treated as that constant.

**Extreme magnitudes.**  The formula is evaluated scale-robustly: each token is divided
by its max-abs :math:`\max_y|u|` (exact for a constant token), centred twice (the second
pass removes the rounding error of the first mean, which matters for weighted grids and
for tokens with a large mean), and divided by the max-abs of the centred token before it
is squared, so that the variance is of order one: it neither overflows nor underflows for
any finite input (``float32`` tokens of size :math:`10^{\pm 30}`, ``float64`` ones of size
:math:`10^{\pm 300}`).  The two rescalings are constants for autograd; the map is
invariant under them (for ``eps = 0``; for ``eps > 0`` the rescaled formula is the same
function), so first and second derivatives are exact.

**eps.**  With ``eps > 0`` the formula is :math:`\sigma_2 (v - \alpha)/\sqrt{\beta +
\varepsilon} + \sigma_1`, which is what ``torch.nn.functional.layer_norm`` computes (its
default ``eps = 1e-5``); the output is then only approximately on :math:`S_1` (variance
:math:`\sigma_2^2\beta/(\beta + \varepsilon)`).  It is evaluated with the same rescaling
(:math:`\beta + \varepsilon = M^2(\beta_r + \varepsilon/M^2)` for a centred max-abs
:math:`M \ge 1`, directly otherwise), and constant tokens give :math:`\sigma_1` as torch
does.  (torch's own kernel overflows for ``float32`` tokens beyond about :math:`10^{19}`:
opsplit's fused ``PointwiseAffine`` path, which calls ``layer_norm`` to stay bit-compatible
with ``nn.LayerNorm``, inherits that; :func:`project_s1` does not.)

**sigma.**  The paper's :math:`S_1` has *scalar* :math:`\sigma_1, \sigma_2` (one value
per token at most: a shape that broadcasts against ``(..., N_x, 1)``).  A per-feature
:math:`\sigma_2(y)` is not a projection onto any :math:`S_1` and is refused; a
per-feature scale is :class:`~opsplit.operators.PointwiseAffine` after the projection.
:math:`\sigma_2 > 0` is required.
"""

from __future__ import annotations

from dataclasses import replace

import torch
from torch import Tensor

from .._checks import (
    check_finite,
    check_finite_float,
    check_float_dtype,
    check_positive_float,
    check_positive_values,
    check_tensor,
    skip_value_checks,
)
from ..controls import Constant, Control, as_control
from ..grid import Grid, _axis_with_n, check_grid
from .base import Operator

__all__ = ["ProjectionS1", "project_s1", "S1_CONSTANT_ULPS", "constant_tokens", "token_mean_std"]

#: a token is constant when ``max - min <= S1_CONSTANT_ULPS * eps_machine * max|u|``
S1_CONSTANT_ULPS = 8


def _mean_fn(grid: Grid | None):
    if grid is None or grid.y.uniform_weight is not None:
        return lambda f: f.mean(-1, keepdim=True)
    return lambda f: grid.mean_y(f).unsqueeze(-1)


def constant_tokens(v: Tensor) -> Tensor:
    """Boolean mask ``(..., 1)`` of the tokens (last dimension) that :func:`project_s1`
    treats as constant: ``max - min <= S1_CONSTANT_ULPS * eps * max|v|``."""
    with torch.no_grad():
        v = v.detach()
        a = v.abs().amax(-1, keepdim=True)
        spread = v.amax(-1, keepdim=True) - v.amin(-1, keepdim=True)
        return spread <= (S1_CONSTANT_ULPS * torch.finfo(v.dtype).eps) * a


def _normalise(v: Tensor, grid: Grid | None):
    """Scale-robust centring of every token (see the module docstring).

    Returns ``(const, s, mu, m, r, beta)`` with ``v = s * (mu + m * r)``: ``const`` the
    constant-token mask, ``s = max|v|`` and ``m`` the max-abs of the centred ``v / s``
    (constants for autograd), ``mu`` the mean of ``v / s``, ``r`` the centred token with
    max-abs 1 and ``beta`` its mean square in ``[min weight / |Omega_y|, 1]`` (1 on constant
    tokens).  All shapes ``(..., 1)`` except ``r``."""
    mean = _mean_fn(grid)
    const = constant_tokens(v)
    with torch.no_grad():
        a = v.detach().abs().amax(-1, keepdim=True)
        s = torch.where(a > 0, a, torch.ones_like(a))  # a constant token becomes exactly +-1
    w = v / s
    mu = mean(w)
    d = w - mu
    mu2 = mean(d)  # second pass: removes the rounding error of the first mean
    d = d - mu2
    with torch.no_grad():
        m = d.detach().abs().amax(-1, keepdim=True)
        m = torch.where(const | (m == 0), torch.ones_like(m), m)
    r = d / m
    beta = torch.where(const, torch.ones_like(m), mean(r * r))
    return const, s, mu + mu2, m, r, beta


def token_mean_std(v: Tensor, grid: Grid | None = None) -> tuple[Tensor, Tensor, Tensor]:
    """Per-token mean, standard deviation (in the grid's y-quadrature; plain means for
    ``grid=None``) and constant-token mask, shapes ``(..., 1)``, computed without
    overflow or underflow for any finite input; the standard deviation is 0 on the
    tokens :func:`project_s1` treats as constant."""
    const, s, mu, m, _, beta = _normalise(v, grid)
    std = torch.where(const, torch.zeros_like(beta), (s * m) * beta.sqrt())
    return s * mu, std, const


def _scaled_rsqrt(r: Tensor, beta: Tensor, M: Tensor, eps: float) -> Tensor:
    r""":math:`(M r)/\sqrt{M^2 \beta + \varepsilon}` without forming :math:`M^2` where it would
    overflow or underflow: ``r`` a token rescaled to max-abs 1, ``beta`` its mean square,
    ``M`` the rescaling (a constant for autograd; may be inf near the float range, where
    :math:`\varepsilon/M^2 = 0`).  ``eps = 0`` is :math:`r/\sqrt\beta`."""
    if eps == 0:
        return r * torch.rsqrt(beta)
    with torch.no_grad():
        big = M >= 1
        Mb = torch.where(big, M, torch.ones_like(M))
        Ms = torch.where(big, torch.ones_like(M), M)
    z_big = r * torch.rsqrt(beta + (eps / Mb) / Mb)
    z_small = (r * Ms) * torch.rsqrt((Ms * Ms) * beta + eps)
    return torch.where(big, z_big, z_small)


def _project_s1(v: Tensor, sigma1, sigma2, grid: Grid | None, eps: float) -> Tensor:
    """The projection without argument checks (the kernel; see the module docstring)."""
    const, s, _, m, r, beta = _normalise(v, grid)
    # sigma_2 (v - alpha)/sqrt(beta_v + eps) with v - alpha = M r, M = s m (centred max-abs)
    with torch.no_grad():
        M = s * m
    z = _scaled_rsqrt(r, beta, M, eps)
    z = torch.where(const, torch.zeros_like(z), z)
    return z * sigma2 + sigma1


def _static_shape(x):
    """The value shape of a tensor or control when known without evaluating it."""
    if isinstance(x, Tensor):
        return tuple(x.shape)
    shape = getattr(x, "shape", None)
    return tuple(shape) if isinstance(shape, (tuple, torch.Size)) else None


def _check_sigma(x, name: str, positive: bool):
    """A number or a tensor of per-token scalars (shape broadcasting to (..., N_x, 1))."""
    if isinstance(x, Tensor):
        check_float_dtype(x, name)
        if x.dim() > 0 and x.shape[-1] != 1:
            raise ValueError(
                f"{name}: expected a scalar (one value per token at most: shape () or (..., 1)), "
                f"got shape {tuple(x.shape)}; the paper's S1 has scalar sigma_1, sigma_2 (a "
                "per-feature scale is PointwiseAffine after the projection)"
            )
        if not skip_value_checks():
            check_finite(x, name)
            if positive and not bool((x > 0).all()):
                raise ValueError(f"{name}: expected sigma_2 > 0, got min {float(x.min()):g}")
        return x
    if positive:
        return check_positive_float(x, name)
    return check_finite_float(x, name)


def _check_tokens(v, grid):
    """The argument checks of the closed-form projections: ``v`` a finite floating tensor
    ``(..., N_y)``, ``grid`` ``None`` or a Grid whose y-interval fits ``N_y`` (completed from
    ``v`` when open).  Returns ``(v, grid)``."""
    v = check_tensor(v, "v")
    check_float_dtype(v, "v")
    if v.dim() < 1 or v.shape[-1] < 1:
        raise ValueError(f"v: expected a tensor (..., N_y) with N_y >= 1, got shape {tuple(v.shape)}")
    grid = check_grid(grid, "grid")
    if grid is not None:
        n = v.shape[-1]
        if grid.y.n is not None and grid.y.n != n:
            raise ValueError(
                f"v: grid/tensor mismatch: the grid has N_y = {grid.y.n} features, v has {n}"
            )
        if grid.y.n is None:
            grid = replace(grid, y=_axis_with_n(grid.y, n, "N_y", "features", "v"))
    check_finite(v, "v")
    return v, grid


def project_s1(
    v: Tensor,
    sigma1: Tensor | float = 0.0,
    sigma2: Tensor | float = 1.0,
    grid: Grid | None = None,
    eps: float = 0.0,
) -> Tensor:
    """Closed-form projection onto :math:`S_1(\\sigma_1, \\sigma_2)` over the last dimension
    (Theorem 3.1, eq. 22).  ``grid=None`` means equal weights (plain means, eq. 30).

    Constant tokens (``max - min <= 8 eps_machine max|v|``) map to :math:`\\sigma_1`;
    any finite magnitude is handled without overflow (see the module docstring).

    Args:
        v: a finite floating tensor ``(..., N_y)``.
        sigma1: the mean, a finite number or a tensor broadcasting to ``(..., N_x, 1)``.
        sigma2: the standard deviation, a number ``> 0`` or such a tensor (values ``> 0``).
        grid: ``None`` or a :class:`~opsplit.grid.Grid` whose y-interval fits ``N_y``.
        eps: variance regulariser ``>= 0`` (``> 0``: torch's ``layer_norm`` formula).
    """
    v, grid = _check_tokens(v, grid)
    sigma1 = _check_sigma(sigma1, "sigma1", positive=False)
    sigma2 = _check_sigma(sigma2, "sigma2", positive=True)
    eps = check_positive_float(eps, "eps", allow_zero=True)
    return _project_s1(v, sigma1, sigma2, grid, eps)


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
        if not isinstance(sigma1, (Tensor, Control)):
            sigma1 = torch.tensor(check_finite_float(sigma1, "ProjectionS1.sigma1"), dtype=torch.float64)
        if not isinstance(sigma2, (Tensor, Control)):
            sigma2 = torch.tensor(
                check_positive_float(sigma2, "ProjectionS1.sigma2"), dtype=torch.float64
            )
        for name, x in (("sigma1", sigma1), ("sigma2", sigma2)):
            shape = _static_shape(x)
            if shape is not None and shape != ():
                raise ValueError(
                    f"ProjectionS1.{name}: expected a scalar control (value shape ()), got value "
                    f"shape {shape}; the paper's S1 has scalar sigma_1, sigma_2 (a per-feature "
                    "scale is PointwiseAffine after the projection)"
                )
        if isinstance(sigma2, Tensor):
            check_float_dtype(sigma2, "ProjectionS1.sigma2")
            if not bool((sigma2 > 0).all()):
                raise ValueError(
                    f"ProjectionS1.sigma2: expected sigma_2 > 0, got {float(sigma2):g}"
                )
            sigma2 = Constant(sigma2, positive=True)
        self.sigma1 = as_control(sigma1, "ProjectionS1.sigma1")
        self.sigma2 = as_control(sigma2, "ProjectionS1.sigma2")
        self.eps = check_positive_float(eps, "ProjectionS1.eps", allow_zero=True)

    def check(self, grid: Grid) -> None:
        """The controls on ``grid``; a :math:`\\sigma_2` stored as values (not log-values)
        must be > 0 (one reduction, once per solve; skipped under compilation)."""
        self.sigma1.validate(grid, "ProjectionS1.sigma1")
        self.sigma2.validate(grid, "ProjectionS1.sigma2")
        c = self.sigma2
        values = None
        if isinstance(c, Constant):
            values = c.value
        elif hasattr(c, "raw") and not getattr(c, "positive", True):
            values = c.raw
        check_positive_values(self, values, "ProjectionS1.sigma2")  # re-read only after a change

    def resolvent(self, t, dt: float, u: Tensor, grid: Grid) -> Tensor:
        # the resolvent of an indicator's subdifferential is the projection, for every dt
        s1, s2 = self.sigma1(t, grid), self.sigma2(t, grid)
        if s1.dim() != 0 or s2.dim() != 0:
            raise ValueError(
                f"ProjectionS1: sigma_1, sigma_2 must be scalars, the controls gave shapes "
                f"{tuple(s1.shape)} and {tuple(s2.shape)}"
            )
        return _project_s1(u, s1, s2, grid, self.eps)

    def extra_repr(self) -> str:
        return f"eps={self.eps:g}"
