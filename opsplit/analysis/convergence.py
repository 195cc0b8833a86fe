r"""Convergence studies: error against a reference as :math:`\Delta t`, :math:`\Delta x`
or :math:`\Delta y` shrinks, the fitted order with a confidence interval, and the log-log
plot.

**The fit.**  For errors :math:`e_i` at step sizes :math:`h_i`, the model
:math:`\log e = \log C + p \log h` is fitted by least squares; the order :math:`p` comes
with its standard error :math:`s_p = \sqrt{\mathrm{SSR}/(n-2)} / \sqrt{\sum_i (\log h_i -
\overline{\log h})^2}` and the two-sided confidence interval
:math:`p \pm t_{n-2, (1+c)/2}\, s_p` (Student's :math:`t`, :math:`c` = ``confidence``).
With two points the order is the slope between them and the interval is undefined (NaN).

**Errors.**  :func:`relative_error` is the relative discrete :math:`L^2` error
:math:`\|u - u_\text{ref}\| / \|u_\text{ref}\|` in the grid's quadrature (both x and y
weights; Frobenius norm without a grid).  A spatial study compares solutions on
different grids: the reference (on a fine grid) is resampled to the nodes of each coarse
grid by cubic splines along the refined axes (:func:`resample`; error :math:`O(h_\text{ref}^4)`,
far below the quadrature error being measured), and the error is measured in the coarse
grid's quadrature.  Self-convergence (no reference: the error of each solution against
the next finer one) is :func:`self_convergence`, for models whose continuous limit has no
ODE reference (ReLU).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field

import numpy as np
import torch
from torch import Tensor

from ..grid import Grid

__all__ = [
    "OrderFit",
    "ConvergenceStudy",
    "fit_order",
    "relative_error",
    "resample",
    "temporal_convergence",
    "spatial_convergence",
    "self_convergence",
    "plot_convergence",
]


@dataclass(frozen=True)
class OrderFit:
    """A fitted convergence order :math:`p` with its confidence interval."""

    order: float
    intercept: float
    stderr: float
    ci_low: float
    ci_high: float
    confidence: float
    n_points: int

    def within(self, expected: float, tol: float) -> bool:
        """Whether ``|order - expected| <= tol``."""
        return abs(self.order - expected) <= tol

    def __str__(self) -> str:
        if math.isnan(self.stderr):
            return f"{self.order:.2f} ({self.n_points} points)"
        half = 0.5 * (self.ci_high - self.ci_low)
        return (
            f"{self.order:.2f} ± {half:.2f} ({100 * self.confidence:g}% CI, {self.n_points} points)"
        )


def fit_order(h, errors, confidence: float = 0.95) -> OrderFit:
    """Least-squares fit of :math:`\\log e = \\log C + p \\log h` (see the module docstring)."""
    from scipy import stats  # slow to import (~0.6 s): loaded only to fit

    h = np.asarray(h, dtype=np.float64).ravel()
    e = np.asarray(errors, dtype=np.float64).ravel()
    if h.shape != e.shape or h.size < 2:
        raise ValueError(
            f"fit_order: expected at least two (h, error) pairs of equal length, got {h.size} "
            f"and {e.size}"
        )
    if not (np.all(np.isfinite(h)) and np.all(h > 0)):
        raise ValueError(f"fit_order: step sizes must be finite and > 0, got {h.tolist()}")
    if not (np.all(np.isfinite(e)) and np.all(e > 0)):
        raise ValueError(
            f"fit_order: errors must be finite and > 0 to be fitted on a log scale, got {e.tolist()}"
        )
    if not 0 < confidence < 1:
        raise ValueError(f"fit_order: confidence must be in (0, 1), got {confidence}")
    if np.unique(h).size < 2:
        raise ValueError("fit_order: expected at least two distinct step sizes")
    x, y = np.log(h), np.log(e)
    n = x.size
    xm = x.mean()
    sxx = float(((x - xm) ** 2).sum())
    p = float(((x - xm) * (y - y.mean())).sum() / sxx)
    c = float(y.mean() - p * xm)
    if n > 2:
        ssr = float(((y - (c + p * x)) ** 2).sum())
        se = math.sqrt(ssr / (n - 2) / sxx)
        q = float(stats.t.ppf(0.5 * (1 + confidence), n - 2))
        lo, hi = p - q * se, p + q * se
    else:
        se, lo, hi = float("nan"), float("nan"), float("nan")
    return OrderFit(p, c, se, lo, hi, confidence, n)


@dataclass
class ConvergenceStudy:
    """Errors against step sizes, and the fitted order.

    Attributes:
        label: a name for the curve.
        variable: ``"dt"``, ``"dx"``, ``"dy"`` or ``"dx=dy"``.
        n: the resolutions (:math:`N_t`, :math:`N_x` or :math:`N_y`).
        h: the step sizes.
        errors: the errors.
        fit: the fitted order (:class:`OrderFit`).
        expected: the order the theory predicts, if any.
    """

    label: str
    variable: str
    n: list
    h: np.ndarray
    errors: np.ndarray
    fit: OrderFit
    expected: float | None = None
    meta: dict = field(default_factory=dict)

    VARIABLES = ("dt", "dx", "dy", "dx=dy")

    def __post_init__(self):
        if self.variable not in self.VARIABLES:
            raise ValueError(
                f"ConvergenceStudy.variable: expected one of {self.VARIABLES}, got {self.variable!r}"
            )
        self.h = np.asarray(self.h, dtype=np.float64)
        self.errors = np.asarray(self.errors, dtype=np.float64)
        if not (len(self.n) == self.h.size == self.errors.size):
            raise ValueError(
                f"ConvergenceStudy: n, h and errors must have the same length, got {len(self.n)}, "
                f"{self.h.size} and {self.errors.size}"
            )
        if not isinstance(self.fit, OrderFit):
            raise TypeError(
                f"ConvergenceStudy.fit: expected an OrderFit (see fit_order), got {type(self.fit).__name__}"
            )

    @property
    def order(self) -> float:
        return self.fit.order

    def to_dict(self) -> dict:
        return {
            "label": self.label,
            "variable": self.variable,
            "n": list(self.n),
            "h": [float(v) for v in self.h],
            "errors": [float(v) for v in self.errors],
            "fit": asdict(self.fit),
            "expected": self.expected,
            "meta": dict(self.meta),
        }

    def plot(self, ax=None, path=None, **kwargs):
        """Draw the errors and the fitted line on log-log axes; returns the axes.

        Without ``ax`` a new pyplot figure is made (so it shows in a notebook and
        ``plt.show()`` / ``plt.savefig`` see it); ``path`` saves the figure there.
        """
        if ax is None:
            import matplotlib.pyplot as plt  # heavy (~0.4 s): loaded only to plot

            _, ax = plt.subplots(figsize=(5, 4), layout="constrained")
        (line,) = ax.loglog(
            self.h, self.errors, "o-", label=f"{self.label}: {self.fit.order:.2f}", **kwargs
        )
        hh = np.array([self.h.min(), self.h.max()])
        ax.loglog(
            hh,
            np.exp(self.fit.intercept) * hh**self.fit.order,
            ":",
            color=line.get_color(),
            linewidth=1,
        )
        ax.set_xlabel({"dt": "Δt", "dx": "Δx", "dy": "Δy"}.get(self.variable, self.variable))
        ax.set_ylabel("relative error")
        if path is not None:
            ax.figure.savefig(path, dpi=120)
        return ax

    def __str__(self) -> str:
        exp = "" if self.expected is None else f" (theory {self.expected:g})"
        head = f"{self.label}: " if self.label else ""
        return f"{head}order {self.fit}{exp}"


def relative_error(u: Tensor, ref: Tensor, grid: Grid | None = None) -> float:
    """Relative discrete :math:`L^2` error (grid quadrature over x and y if given)."""
    if u.shape != ref.shape:
        raise ValueError(f"relative_error: shapes differ, {tuple(u.shape)} vs {tuple(ref.shape)}")
    d = (u - ref).detach().to(torch.float64)
    r = ref.detach().to(torch.float64)
    if grid is not None:
        g = grid.with_shape(u.shape[-2], u.shape[-1])
        w = g.x.weights(torch.float64, u.device)[:, None] * g.y.weights(torch.float64, u.device)
        num, den = (d * d * w).sum(), (r * r * w).sum()
    else:
        num, den = (d * d).sum(), (r * r).sum()
    if float(den) == 0.0:
        return float(num.sqrt())
    return float((num / den).sqrt())


def resample(u: Tensor, src: Grid, dst: Grid) -> Tensor:
    """Values of ``u`` (on ``src``'s nodes, shape ``(..., N_x, N_y)``) at ``dst``'s nodes by
    cubic splines along each axis whose nodes differ (float64)."""
    from scipy.interpolate import CubicSpline  # slow to import (~0.4 s): loaded only to resample

    out = u.detach().to(torch.float64).cpu().numpy()
    for axis, dim in (("x", -2), ("y", -1)):
        a, b = getattr(src, axis), getattr(dst, axis)
        if not math.isclose(a.length, b.length, rel_tol=1e-12):
            raise ValueError(
                f"resample: the grids' Omega_{axis} differ (L = {a.length} vs {b.length})"
            )
        xa, xb = a.nodes(torch.float64).numpy(), b.nodes(torch.float64).numpy()
        if xa.shape == xb.shape and np.allclose(xa, xb, rtol=0, atol=1e-14 * a.length):
            continue
        if xa.size < 4:
            raise ValueError(f"resample: the source grid needs >= 4 nodes on Omega_{axis}")
        out = CubicSpline(xa, out, axis=out.ndim + dim)(xb)
    return torch.from_numpy(np.ascontiguousarray(out))


def _check_interval(t0, t1, where: str) -> None:
    if not (math.isfinite(t0) and math.isfinite(t1) and t0 < t1):
        raise ValueError(f"{where}: expected t0 < t1 (finite), got t0={t0}, t1={t1}")


def temporal_convergence(
    solve: Callable[[int], Tensor],
    n_steps: Sequence[int],
    reference: Tensor,
    *,
    t0: float = 0.0,
    t1: float = 1.0,
    grid: Grid | None = None,
    label: str = "",
    expected: float | None = None,
    confidence: float = 0.95,
) -> ConvergenceStudy:
    """Error of ``solve(N_t)`` against ``reference`` for each ``N_t``; ``h = (t1 - t0)/N_t``."""
    ns = [int(n) for n in n_steps]
    if len(ns) < 2 or min(ns) < 1:
        raise ValueError(f"temporal_convergence: expected at least two N_t >= 1, got {ns}")
    _check_interval(t0, t1, "temporal_convergence")
    errs = np.array([relative_error(solve(n), reference, grid) for n in ns])
    h = np.array([(t1 - t0) / n for n in ns])
    return ConvergenceStudy(label, "dt", ns, h, errs, fit_order(h, errs, confidence), expected)


def spatial_convergence(
    solve: Callable[[int], tuple[Tensor, Grid]],
    resolutions: Sequence[int],
    reference: tuple[Tensor, Grid],
    *,
    axis: str = "y",
    label: str = "",
    expected: float | None = None,
    confidence: float = 0.95,
) -> ConvergenceStudy:
    """Error of ``solve(N)`` (returning the solution and its grid) against the fine-grid
    ``reference = (u_ref, grid_ref)``, resampled to each grid's nodes; ``axis`` is the
    refined direction (``"x"``, ``"y"`` or ``"xy"``), which sets the step size ``h``."""
    if axis not in ("x", "y", "xy"):
        raise ValueError(f"spatial_convergence: axis must be 'x', 'y' or 'xy', got {axis!r}")
    u_ref, g_ref = reference
    ns, hs, errs = [], [], []
    for n in resolutions:
        u, g = solve(int(n))
        g = g.with_shape(u.shape[-2], u.shape[-1])
        r = resample(u_ref, g_ref.with_shape(u_ref.shape[-2], u_ref.shape[-1]), g)
        errs.append(relative_error(u.to(torch.float64).cpu(), r, g))
        hs.append(
            g.y.spacing
            if axis == "y"
            else g.x.spacing
            if axis == "x"
            else max(g.x.spacing, g.y.spacing)
        )
        ns.append(int(n))
    h, e = np.array(hs), np.array(errs)
    var = {"x": "dx", "y": "dy", "xy": "dx=dy"}[axis]
    return ConvergenceStudy(label, var, ns, h, e, fit_order(h, e, confidence), expected)


def self_convergence(
    solve: Callable[[int], Tensor],
    n_steps: Sequence[int],
    *,
    t0: float = 0.0,
    t1: float = 1.0,
    grid: Grid | None = None,
    label: str = "",
    confidence: float = 0.95,
) -> ConvergenceStudy:
    """Without a reference: the error of ``solve(N)`` against ``solve(next N)`` (successive
    differences, which shrink at the method's order when it converges)."""
    ns = [int(n) for n in n_steps]
    if len(ns) < 3 or min(ns) < 1:
        raise ValueError(f"self_convergence: expected at least three N_t >= 1 (two differences), got {ns}")
    _check_interval(t0, t1, "self_convergence")
    sols = [solve(n) for n in ns]
    errs = np.array([relative_error(a, b, grid) for a, b in zip(sols[:-1], sols[1:])])
    h = np.array([(t1 - t0) / n for n in ns[:-1]])
    study = ConvergenceStudy(label, "dt", ns[:-1], h, errs, fit_order(h, errs, confidence), None)
    study.meta["self_convergence"] = True
    return study


def plot_convergence(studies, path=None, *, ax=None, title: str | None = None):
    """Draw several studies on one log-log plot; save it to ``path`` if given.  Returns the
    matplotlib ``Figure``; without ``ax`` it is a new pyplot figure (shown in a notebook,
    seen by ``plt.show()``; close it with ``plt.close(fig)`` in loops)."""
    if ax is None:
        import matplotlib.pyplot as plt  # heavy (~0.4 s): loaded only to plot

        fig, ax = plt.subplots(figsize=(6.5, 4.8), layout="constrained")
    else:
        fig = ax.figure
    for s in studies:
        s.plot(ax)
    if title:
        ax.set_title(title)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7)
    if path is not None:
        fig.savefig(path, dpi=120)
    return fig
