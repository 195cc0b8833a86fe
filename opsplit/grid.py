r"""Spatial grids: *where* the continuous transformer lives.

The continuous model of paper 002 (eq. 7) evolves :math:`u(x, y, t)` on
:math:`\Omega_x \times \Omega_y` with :math:`\Omega_x = [0, L_x]` (token index) and
:math:`\Omega_y = [0, L_y]` (token-vector entry); multi-head attention (eq. 38) adds a
head domain :math:`\Omega_h = [0, L_h]`.  A :class:`Grid` discretises each domain by an
:class:`Interval` with ``n`` nodes and a quadrature rule.  Every discrete integral of the
library goes through the methods here, so the quadrature is in one place:

* with ``L = N`` (``Grid.paper``) the spacing is 1 and the integrals are the paper's plain
  sums, eqs. (25)–(26): :math:`\int_{\bar\Omega_x} f = \sum_k f_k`;
* with ``L`` fixed and ``N`` growing they converge to the integrals at the rule's order
  (2 for the default midpoint rule).

An :class:`Interval` may leave ``n`` open (``Interval(spacing=1.0)`` or
``Interval(length=1.0)``): the node count is then read off the tensor it is applied to.
That is how a model with ``L_x = N_x`` accepts sequences of any length.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import torch
from torch import Tensor

from ._checks import check_positive_float, check_positive_int

__all__ = ["Interval", "Grid", "RULES", "check_grid"]

#: Quadrature rules: name -> (order for smooth non-periodic integrands, description).
RULES = {
    "midpoint": (2, "cell centres (i + 1/2) h, equal weights h"),
    "right": (1, "right endpoints (i + 1) h, equal weights h (the paper's x_k = k)"),
    "trapezoid": (2, "endpoints included, nodes i L/(n-1), end weights halved"),
}


@dataclass(frozen=True)
class Interval:
    """A discretised interval :math:`[0, L]`.

    Give two of ``n``, ``length`` and ``spacing`` for a complete interval, or one of
    ``length`` / ``spacing`` to leave ``n`` to be read from the data.

    Args:
        n: number of nodes :math:`N`.
        length: :math:`L = |\\Omega|`.
        spacing: :math:`h` (for ``midpoint`` and ``right``: :math:`L/N`; for ``trapezoid``:
            :math:`L/(N-1)`).
        rule: quadrature rule, one of :data:`RULES`.
    """

    n: int | None = None
    length: float | None = None
    spacing: float | None = None
    rule: str = "midpoint"

    def __post_init__(self):
        if self.rule not in RULES:
            raise ValueError(f"Interval.rule: expected one of {sorted(RULES)}, got {self.rule!r}")
        n, length, spacing = self.n, self.length, self.spacing
        if n is not None:
            n = check_positive_int(n, "Interval.n")
            if self.rule == "trapezoid" and n < 2:
                raise ValueError("Interval.n: the trapezoid rule needs n >= 2 nodes")
        if length is not None:
            length = check_positive_float(length, "Interval.length")
        if spacing is not None:
            spacing = check_positive_float(spacing, "Interval.spacing")
        given = sum(v is not None for v in (n, length, spacing))
        if given == 0 or (given == 1 and n is not None):
            raise ValueError(
                "Interval: give two of (n, length, spacing), or one of (length, spacing) to read n "
                f"from the data; got n={self.n!r}, length={self.length!r}, spacing={self.spacing!r}"
            )
        if given == 3:
            if not math.isclose(spacing, self._spacing_of(n, length), rel_tol=1e-12):
                raise ValueError(
                    f"Interval: n={n}, length={length} and spacing={spacing} are inconsistent "
                    f"(rule {self.rule!r} gives spacing {self._spacing_of(n, length)})"
                )
        if length is not None and spacing is not None and n is None:
            raise ValueError("Interval: length and spacing together fix n; give n as well")
        # fill in the derived quantity for complete intervals
        if n is not None and length is None:
            length = self._length_of(n, spacing)
        if n is not None and spacing is None:
            spacing = self._spacing_of(n, length)
        object.__setattr__(self, "n", n)
        object.__setattr__(self, "length", length)
        object.__setattr__(self, "spacing", spacing)

    # -- constructors -------------------------------------------------------------------
    @classmethod
    def paper(cls, n: int | None = None) -> Interval:
        """The paper's choice ``L = N`` (spacing 1, plain sums, eqs. 25–26)."""
        return cls(n=n, spacing=1.0) if n is not None else cls(spacing=1.0)

    def _spacing_of(self, n: int, length: float) -> float:
        return length / (n - 1) if self.rule == "trapezoid" else length / n

    def _length_of(self, n: int, spacing: float) -> float:
        return spacing * (n - 1) if self.rule == "trapezoid" else spacing * n

    # -- completeness ---------------------------------------------------------------------
    @property
    def is_complete(self) -> bool:
        return self.n is not None

    def with_n(self, n: int) -> Interval:
        """This interval at ``n`` nodes.

        An open interval takes ``n``; a complete one must already have it (an error names
        both otherwise).  Keeps ``length`` if it was given, else ``spacing``.
        """
        n = check_positive_int(n, "n")
        if self.n is not None:
            if self.n != n:
                raise ValueError(f"grid/tensor mismatch: the grid has {self.n} nodes, got {n}")
            return self
        if self.length is not None:
            return replace(self, n=n, spacing=None)
        return replace(self, n=n, length=None)

    def refine(self, n: int) -> Interval:
        """The same domain ``[0, L]`` at ``n`` nodes (``L`` fixed, spacing changes)."""
        self._need_complete("refine")
        return Interval(n=n, length=self.length, rule=self.rule)

    def _need_complete(self, what: str) -> None:
        if self.n is None:
            raise ValueError(
                f"Interval.{what}: this interval has no node count yet (n is read from the data); "
                "call with_n(n) first"
            )

    # -- quadrature -----------------------------------------------------------------------
    @property
    def order(self) -> int:
        """Order of the quadrature rule for smooth non-periodic integrands."""
        return RULES[self.rule][0]

    @property
    def measure(self) -> float:
        """:math:`|\\Omega| = L`, equal to the sum of the weights."""
        self._need_complete("measure")
        return self.length

    @property
    def uniform_weight(self) -> float | None:
        """The common weight when all weights are equal (midpoint, right), else ``None``."""
        if self.rule == "trapezoid":
            return None
        return self.spacing

    def nodes(self, dtype=None, device=None) -> Tensor:
        self._need_complete("nodes")
        i = torch.arange(self.n, dtype=torch.float64)
        if self.rule == "midpoint":
            x = (i + 0.5) * self.spacing
        elif self.rule == "right":
            x = (i + 1.0) * self.spacing
        else:
            x = i * self.spacing
        return x.to(dtype=dtype or torch.get_default_dtype(), device=device)

    def weights(self, dtype=None, device=None) -> Tensor:
        self._need_complete("weights")
        w = torch.full((self.n,), self.spacing, dtype=torch.float64)
        if self.rule == "trapezoid":
            w[0] = w[-1] = 0.5 * self.spacing
        return w.to(dtype=dtype or torch.get_default_dtype(), device=device)

    def interpolation_matrix(self, target: Interval, dtype=None, device=None) -> Tensor:
        """Matrix ``P`` of shape (target.n, self.n) with ``f_target = P @ f_self``.

        Piecewise-linear interpolation between nodes and linear extrapolation beyond the
        outermost nodes (the half cells of the midpoint rule), so the resampling error is
        :math:`O(h^2)` everywhere for smooth functions.  Both intervals must describe the
        same domain length.
        """
        self._need_complete("interpolation_matrix")
        target._need_complete("interpolation_matrix")
        if not math.isclose(self.length, target.length, rel_tol=1e-12):
            raise ValueError(
                f"interpolation_matrix: domains differ (L = {self.length} vs {target.length})"
            )
        xs = self.nodes(torch.float64)
        xt = target.nodes(torch.float64)
        P = torch.zeros(target.n, self.n, dtype=torch.float64)
        if self.n == 1:
            P[:, 0] = 1.0
        else:
            idx = torch.searchsorted(xs, xt, right=True) - 1
            idx = idx.clamp(0, self.n - 2)
            x0, x1 = xs[idx], xs[idx + 1]
            lam = (xt - x0) / (x1 - x0)
            rows = torch.arange(target.n)
            P[rows, idx] = 1.0 - lam
            P[rows, idx + 1] += lam
        return P.to(dtype=dtype or torch.get_default_dtype(), device=device)

    def __str__(self) -> str:
        n = "N" if self.n is None else str(self.n)
        size = f"L={self.length:g}" if self.length is not None else f"h={self.spacing:g}"
        return f"[{n} nodes, {size}, {self.rule}]"


def _as_interval(v, name: str) -> Interval | None:
    if v is None or isinstance(v, Interval):
        return v
    if isinstance(v, int) and not isinstance(v, bool):
        return Interval.paper(v)
    raise TypeError(f"Grid.{name}: expected an Interval or an int (L = N), got {type(v).__name__}")


def _axis_with_n(itv: Interval, n: int, what: str, unit: str, name: str | None) -> Interval:
    """``itv`` at the tensor's ``n`` nodes, with errors that say which axis and why."""
    pre = f"{name}: " if name else ""
    if itv.n is not None:
        if itv.n != n:
            raise ValueError(
                f"{pre}grid/tensor mismatch: the grid has {what} = {itv.n} {unit}, the tensor has {n}"
            )
        return itv
    if n < 1:
        raise ValueError(f"{pre}empty tensor: expected {what} >= 1 {unit}, the tensor has {n}")
    if itv.rule == "trapezoid" and n < 2:
        raise ValueError(
            f"{pre}the grid's {what} interval uses the trapezoid rule, which needs {what} >= 2 "
            f"nodes; the tensor has {n} {unit}"
        )
    return itv.with_n(n)


def check_grid(grid, name: str = "grid", *, optional: bool = True):
    """``grid`` if it is a :class:`Grid` (or ``None`` when ``optional``), else a clear
    ``TypeError`` naming the argument."""
    if grid is None and optional:
        return None
    if not isinstance(grid, Grid):
        what = "an opsplit Grid or None" if optional else "an opsplit Grid"
        raise TypeError(
            f"{name}: expected {what} (e.g. Grid.paper(N_x, N_y) or Grid.uniform(...)), got "
            f"{type(grid).__name__} {grid!r}"
        )
    return grid


@dataclass(frozen=True)
class Grid:
    r"""The grid of :math:`\Omega_x \times \Omega_y` (and :math:`\Omega_h`).

    Args:
        x: token domain :math:`\Omega_x` (an :class:`Interval`, or an int ``N_x`` for
            ``L_x = N_x``).
        y: feature domain :math:`\Omega_y` (likewise).
        h: optional head domain :math:`\Omega_h` (multi-head attention, eq. 38).

    The discrete integrals (eqs. 25–26 when ``L = N``) are the methods
    :meth:`integrate_y`, :meth:`mean_y`, :meth:`kernel_y`, :meth:`inner_y` and
    :meth:`log_weights_x`.
    """

    x: Interval
    y: Interval
    h: Interval | None = None

    def __post_init__(self):
        object.__setattr__(self, "x", _as_interval(self.x, "x"))
        object.__setattr__(self, "y", _as_interval(self.y, "y"))
        object.__setattr__(self, "h", _as_interval(self.h, "h"))
        if self.x is None or self.y is None:
            raise ValueError("Grid: both x and y intervals are required")

    # -- constructors -------------------------------------------------------------------
    @classmethod
    def paper(cls, nx: int | None, ny: int | None, nh: int | None = None) -> Grid:
        """``L = N`` in every direction: the paper's grid (§3.4), plain sums.

        ``None`` leaves a node count to be read from the input.
        """
        for name, n in (("nx", nx), ("ny", ny), ("nh", nh)):
            if n is not None:
                check_positive_int(n, f"Grid.paper: {name}")
        return cls(
            x=Interval.paper(nx),
            y=Interval.paper(ny),
            h=None if nh is None else Interval.paper(nh),
        )

    @classmethod
    def uniform(
        cls,
        nx: int | None,
        ny: int,
        lx: float = 1.0,
        ly: float = 1.0,
        rule: str = "midpoint",
        nh: int | None = None,
        lh: float = 1.0,
    ) -> Grid:
        """Fixed domains ``[0, lx] x [0, ly]`` at ``nx x ny`` nodes."""
        for name, n in (("nx", nx), ("ny", ny), ("nh", nh)):
            if n is not None:
                check_positive_int(n, f"Grid.uniform: {name}")
        for name, v in (("lx", lx), ("ly", ly), ("lh", lh)):
            check_positive_float(v, f"Grid.uniform: {name}")
        return cls(
            x=Interval(n=nx, length=lx, rule=rule),
            y=Interval(n=ny, length=ly, rule=rule),
            h=None if nh is None else Interval(n=nh, length=lh, rule=rule),
        )

    # -- shapes ---------------------------------------------------------------------------
    @property
    def nx(self) -> int | None:
        return self.x.n

    @property
    def ny(self) -> int | None:
        return self.y.n

    @property
    def nx_str(self) -> str:
        return "N_x" if self.x.n is None else str(self.x.n)

    @property
    def ny_str(self) -> str:
        return "N_y" if self.y.n is None else str(self.y.n)

    @property
    def is_complete(self) -> bool:
        return self.x.is_complete and self.y.is_complete

    def with_shape(self, nx: int, ny: int, name: str | None = None) -> Grid:
        """This grid with node counts read from data (checks the fixed ones).

        ``name`` (the tensor's argument name) prefixes the error messages."""
        if self.x.n == nx and self.y.n == ny:
            return self
        x = _axis_with_n(self.x, nx, "N_x", "tokens", name)
        y = _axis_with_n(self.y, ny, "N_y", "features", name)
        return replace(self, x=x, y=y)

    def check_shape(self, shape, name: str = "u") -> None:
        nx, ny = shape
        for n, itv, what in ((nx, self.x, "N_x"), (ny, self.y, "N_y")):
            if itv.n is not None and itv.n != n:
                raise ValueError(
                    f"{name}: grid/tensor mismatch: expected (..., {self.nx_str}, {self.ny_str}) "
                    f"from the grid, got (..., {nx}, {ny}) ({what} differs)"
                )

    def refine(self, nx: int | None = None, ny: int | None = None) -> Grid:
        """The same domains at other node counts (``L`` fixed)."""
        x = self.x if nx is None else self.x.refine(nx)
        y = self.y if ny is None else self.y.refine(ny)
        return replace(self, x=x, y=y)

    # -- discrete integrals (eqs. 25-26) ----------------------------------------------------
    def _check_ny(self, x: Tensor, where: str, name: str) -> None:
        # a cheap metadata check (these are called per substep): a wrong size would be a
        # matmul error deep inside, or a silently wrong sum with uniform weights
        if self.y.n is not None and x.shape[-1] != self.y.n:
            raise ValueError(
                f"{where}: {name}: expected N_y = {self.y.n} entries in the last dimension "
                f"(the grid's Omega_y nodes), got shape {tuple(x.shape)}"
            )

    def integrate_y(self, f: Tensor) -> Tensor:
        r""":math:`\int_{\Omega_y} f(\cdot, \xi)\,d\xi` over the last dimension."""
        self._check_ny(f, "integrate_y", "f")
        w = self.y.uniform_weight
        if w is not None:
            s = f.sum(-1)
            return s if w == 1.0 else s * w
        return f @ self.y.weights(f.dtype, f.device)

    def mean_y(self, f: Tensor) -> Tensor:
        r""":math:`\frac{1}{|\Omega_y|}\int_{\Omega_y} f\,d\xi` (the discrete measure, so that a
        constant has mean exactly itself)."""
        if self.y.uniform_weight is not None:
            self._check_ny(f, "mean_y", "f")
            return f.mean(-1)
        return self.integrate_y(f) / self.y.measure

    def kernel_y(self, u: Tensor, W: Tensor) -> Tensor:
        r"""Integral transform :math:`\int_{\Omega_y} W(\xi, y)\, u(x, \xi)\, d\xi` (eqs. 3–5).

        ``u``: (..., N_y), ``W``: (N_y, M) -> (..., M).  With ``L = N`` this is the plain
        matrix product ``u @ W`` of eq. (27).
        """
        self._check_ny(u, "kernel_y", "u")
        if W.dim() < 2 or W.shape[-2] != u.shape[-1]:
            raise ValueError(
                f"kernel_y: W: expected shape ({u.shape[-1]}, M) (rows: the integration variable "
                f"of u's last dimension), got {tuple(W.shape)}"
            )
        w = self.y.uniform_weight
        if w is not None:
            out = u @ W
            return out if w == 1.0 else out * w
        return (u * self.y.weights(u.dtype, u.device)) @ W

    def inner_y(self, a: Tensor, b: Tensor) -> Tensor:
        r""":math:`\langle a(x,\cdot), b(\tilde x,\cdot)\rangle_{\Omega_y}` for all pairs:
        (..., N, N_y), (..., M, N_y) -> (..., N, M)."""
        return self.kernel_y(a, b.transpose(-1, -2))

    def log_weights_x(self, dtype=None, device=None) -> Tensor | None:
        """``log w_x`` for the Ω_x quadrature inside a softmax, or ``None`` when the weights
        are equal (they cancel between numerator and denominator)."""
        if self.x.uniform_weight is not None:
            return None
        return self.x.weights(dtype, device).log()

    def weights_x(self, dtype=None, device=None) -> Tensor:
        return self.x.weights(dtype, device)

    def __str__(self) -> str:
        s = f"Grid(x={self.x}, y={self.y}"
        if self.h is not None:
            s += f", h={self.h}"
        return s + ")"
