r"""RMS normalisation as the projection onto a sphere: the :math:`S_1` of Theorem 3.1
without its hyperplane (paper 002, eq. 7 term II with the mean constraint dropped).

.. math::

    S_\circ(\sigma_2) = \Big\{u :\ \tfrac{1}{|\Omega_y|}\int_{\Omega_y} u^2\, d\xi = \sigma_2^2\Big\}

(token by token, for every :math:`x`): the sphere of radius :math:`\sigma_2\sqrt{|\Omega_y|}`
in :math:`L^2(\Omega_y)`.  The resolvent of :math:`\partial I_{S_\circ}` is the projection,
whose closed form (derived in ``docs/llm.md``, like Theorem 3.1) is

.. math::

    P_{S_\circ}(v) = \sigma_2\, \frac{v}{\sqrt{\beta}},\qquad
    \beta = \tfrac{1}{|\Omega_y|}\int_{\Omega_y} v^2\, d\xi .  \qquad (\mathrm{R})

The mean uses the grid's y-quadrature, so the output lies exactly on the discrete sphere
and is the closest point in the discrete :math:`L^2(\Omega_y)` norm (Cauchy–Schwarz: among
the points of a sphere the one closest to :math:`v` is the one most aligned with it).
``LlamaRMSNorm`` is this projection with :math:`\sigma_2 = 1` followed by the pointwise
affine substep :math:`u \mapsto \gamma(y)\odot u` (:class:`~opsplit.operators.PointwiseAffine`),
as ``nn.LayerNorm`` is :math:`P_{S_1}` followed by it.

**The zero token.**  For :math:`v = 0` every point of the sphere is equally close: the
projection is not unique.  opsplit returns :math:`0` there (the limit
:math:`\varepsilon \to 0` of the regularised formula below, which is 0 at :math:`v = 0` for
every :math:`\varepsilon > 0`), with zero gradient; it never divides by zero.  A token is
zero when all its entries are exactly 0 (the closed form is scale-free, so any other token,
however small, has a well-defined projection).

**Extreme magnitudes.**  (R) is evaluated scale-robustly: each token is divided by its
max-abs :math:`s = \max_y |v|` before it is squared (a constant for autograd; (R) is
0-homogeneous, so the map and its derivatives are unchanged), so :math:`\beta` is of order
one and neither overflows nor underflows for any finite input (float32 tokens of size
:math:`10^{\pm 30}`, float64 ones of size :math:`10^{\pm 300}`).

**eps.**  With :math:`\varepsilon > 0` the formula is :math:`\sigma_2 v/\sqrt{\beta +
\varepsilon}`: Hugging Face's ``LlamaRMSNorm`` (``x * rsqrt(mean(x**2) + eps)``), whose
output is only approximately on the sphere (mean square :math:`\sigma_2^2\beta/(\beta +
\varepsilon)`).  It is evaluated with the same rescaling (:math:`\beta + \varepsilon =
s^2(\beta_r + \varepsilon/s^2)` for :math:`s \ge 1`, directly otherwise).

**Hugging Face's arithmetic, when asked** (``compute_dtype=torch.float32``): Llama, Qwen2
and Mistral evaluate the norm in float32 whatever the model's dtype — ``h = x.float();
h * rsqrt(h.pow(2).mean(-1) + eps)``, cast back — so a float64 HF model carries float32
rounding there.  With ``compute_dtype`` set, opsplit evaluates that literal formula in that
dtype (the same operations in the same order: bit-compatible with HF, and therefore *not*
scale-robust: float32 tokens beyond about :math:`10^{19}` overflow as in HF).  The
converters (:mod:`opsplit.models.hf_decoders`) ask for it; the default (``None``) is the
robust evaluation in the state's dtype.

**sigma.**  :math:`\sigma_2` is a scalar (per token at most), :math:`> 0`; a per-feature
scale is :class:`~opsplit.operators.PointwiseAffine` after the projection.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .._checks import (
    check_float_dtype,
    check_positive_float,
    check_positive_values,
)
from ..controls import Constant, Control, as_control
from ..grid import Grid
from .base import Operator
from .layernorm import _check_sigma, _check_tokens, _mean_fn, _scaled_rsqrt, _static_shape

__all__ = ["ProjectionSphere", "project_sphere"]

_COMPUTE_DTYPES = (None, torch.float32, torch.float64)


def _check_compute_dtype(dtype, name: str):
    if dtype not in _COMPUTE_DTYPES:
        raise ValueError(f"{name}: expected None, torch.float32 or torch.float64, got {dtype!r}")
    return dtype


def _project_sphere(v: Tensor, sigma2, grid: Grid | None, eps: float, compute_dtype=None) -> Tensor:
    """The projection without argument checks (see the module docstring)."""
    mean = _mean_fn(grid)
    if compute_dtype is not None:
        # Hugging Face's LlamaRMSNorm, literally: x.float() * rsqrt(mean(x^2) + eps), cast back
        h = v.to(compute_dtype)
        h = h * torch.rsqrt(mean(h.pow(2)) + eps)
        h = h.to(v.dtype)
        return h if isinstance(sigma2, (int, float)) and sigma2 == 1.0 else h * sigma2
    with torch.no_grad():
        a = v.detach().abs().amax(-1, keepdim=True)
        zero = a == 0
        s = torch.where(zero, torch.ones_like(a), a)  # max-abs, a constant for autograd
    r = v / s
    beta = torch.where(zero, torch.ones_like(s), mean(r * r))  # in [w_min/|Omega_y|, 1]
    z = _scaled_rsqrt(r, beta, s, eps)  # v / sqrt(mean(v^2) + eps) with v = s r
    z = torch.where(zero, torch.zeros_like(z), z)
    return z if isinstance(sigma2, (int, float)) and sigma2 == 1.0 else z * sigma2


def project_sphere(
    v: Tensor,
    sigma2: Tensor | float = 1.0,
    grid: Grid | None = None,
    eps: float = 0.0,
    *,
    compute_dtype=None,
) -> Tensor:
    """Closed-form projection onto the sphere :math:`\\{(1/|\\Omega_y|)\\int u^2 = \\sigma_2^2\\}`
    over the last dimension (eq. R of the module docstring).  ``grid=None`` means equal
    weights (plain means).  Zero tokens map to 0; any finite magnitude is handled without
    overflow (unless ``compute_dtype`` asks for Hugging Face's literal float32 formula).

    Args:
        v: a finite floating tensor ``(..., N_y)``.
        sigma2: the radius parameter, a number ``> 0`` or a tensor broadcasting to
            ``(..., N_x, 1)`` (values ``> 0``).
        grid: ``None`` or a :class:`~opsplit.grid.Grid` whose y-interval fits ``N_y``.
        eps: regulariser ``>= 0`` of the mean square (``> 0``: HF's RMSNorm formula).
        compute_dtype: ``None`` (robust, in ``v``'s dtype) or the dtype of HF's literal
            evaluation (``torch.float32`` for Llama-family models).
    """
    v, grid = _check_tokens(v, grid)
    sigma2 = _check_sigma(sigma2, "sigma2", positive=True)
    eps = check_positive_float(eps, "eps", allow_zero=True)
    compute_dtype = _check_compute_dtype(compute_dtype, "compute_dtype")
    return _project_sphere(v, sigma2, grid, eps, compute_dtype)


class ProjectionSphere(Operator):
    """Projection onto the sphere :math:`\\{(1/|\\Omega_y|)\\int u^2\\,dy = \\sigma_2(t)^2\\}`:
    RMSNorm without its per-feature weight (the resolvent of the sphere's indicator, for
    every :math:`\\Delta t`; see the module docstring).

    Args:
        sigma2: control (or tensor / float) for :math:`\\sigma_2(t) > 0` (a scalar).
        eps: regulariser of the mean square; ``0`` is the projection exactly, HF's
            ``rms_norm_eps`` (e.g. ``1e-6``) is ``LlamaRMSNorm``.
        compute_dtype: ``None`` (scale-robust, in the state's dtype) or ``torch.float32``
            for HF's literal float32 evaluation (what a float64 HF Llama computes).
    """

    has_resolvent = True
    default_solver = "implicit"
    #: a Δt-independent map (PreNorm accepts it)
    is_map = True

    def __init__(self, sigma2=1.0, *, eps: float = 0.0, compute_dtype=None):
        super().__init__()
        if not isinstance(sigma2, (Tensor, Control)):
            sigma2 = torch.tensor(check_positive_float(sigma2, "ProjectionSphere.sigma2"), dtype=torch.float64)
        shape = _static_shape(sigma2)
        if shape is not None and shape != ():
            raise ValueError(
                f"ProjectionSphere.sigma2: expected a scalar control (value shape ()), got value shape {shape}; "
                "a per-feature scale is PointwiseAffine after the projection"
            )
        if isinstance(sigma2, Tensor):
            check_float_dtype(sigma2, "ProjectionSphere.sigma2")
            if not bool((sigma2 > 0).all()):
                raise ValueError(f"ProjectionSphere.sigma2: expected sigma_2 > 0, got {float(sigma2):g}")
            sigma2 = Constant(sigma2, positive=True)
        # read at every call, never cached as a number: a sigma_2 written later (load_state_dict,
        # a checkpoint, an in-place edit) is the one used; multiplying by 1 rounds nothing
        self.sigma2 = as_control(sigma2, "ProjectionSphere.sigma2")
        self.eps = check_positive_float(eps, "ProjectionSphere.eps", allow_zero=True)
        self.compute_dtype = _check_compute_dtype(compute_dtype, "ProjectionSphere.compute_dtype")

    def check(self, grid: Grid) -> None:
        self.sigma2.validate(grid, "ProjectionSphere.sigma2")
        c = self.sigma2
        values = c.value if isinstance(c, Constant) else (
            c.raw if hasattr(c, "raw") and not getattr(c, "positive", True) else None)
        check_positive_values(self, values, "ProjectionSphere.sigma2")  # re-read only after a change

    def _sigma(self, t, grid: Grid, dtype):
        s = self.sigma2(t, grid)
        if s.dim() != 0:
            raise ValueError(f"ProjectionSphere: sigma_2 must be a scalar, the control gave shape {tuple(s.shape)}")
        return s.to(dtype)

    def resolvent(self, t, dt: float, u: Tensor, grid: Grid) -> Tensor:
        # the resolvent of an indicator's subdifferential is the projection, for every dt
        return _project_sphere(u, self._sigma(t, grid, u.dtype), grid, self.eps, self.compute_dtype)

    def frozen_map(self, t, grid: Grid, dtype):
        """The projection at time ``t`` as ``f(u, grid)`` with :math:`\\sigma_2(t)` evaluated
        once (:mod:`opsplit.operators._fused`); the same operations as :meth:`resolvent`."""
        sigma, eps, cd = self._sigma(t, grid, dtype), self.eps, self.compute_dtype
        return lambda u, g: _project_sphere(u, sigma, g, eps, cd)

    def extra_repr(self) -> str:
        s = f"eps={self.eps:g}"
        if self.compute_dtype is not None:
            s += f", compute_dtype={self.compute_dtype} (HF's literal formula)"
        return s
