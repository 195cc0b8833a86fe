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

**2-D token domains** (paper 002, §6): an :class:`ImageGrid` is a :class:`Grid` whose
token domain :math:`\Omega_x` is an image domain :math:`[0, L_1] \times [0, L_2]`
(``rows`` x ``cols``, flattened row-major, optionally after prefix tokens such as a class
token); every token carries the cell area :math:`h_1 h_2` as its quadrature weight, so
every operator that integrates over :math:`\Omega_x` or :math:`\Omega_y` works on it
unchanged, and the convolution operators (:mod:`opsplit.operators.convolution`) read its
2-D layout.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import torch
from torch import Tensor

from ._checks import check_choice, check_positive_float, check_positive_int

__all__ = ["Interval", "Grid", "ImageGrid", "RULES", "check_grid"]

#: Quadrature rules: name -> (order for smooth non-periodic integrands, description).
RULES = {
    "midpoint": (2, "cell centres (i + 1/2) h, equal weights h"),
    "right": (1, "right endpoints (i + 1) h, equal weights h (the paper's x_k = k)"),
    "trapezoid": (2, "endpoints included, nodes i L/(n-1), end weights halved"),
    "left": (1, "left endpoints i h, equal weights h (a periodic grid x_j = j L/N: spectrally accurate "
                "for smooth periodic integrands)"),
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
        check_choice(self.rule, RULES, "Interval.rule")
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
        elif self.rule == "left":
            x = i * self.spacing
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


def _pair(v, name: str) -> tuple[int, int]:
    if isinstance(v, (tuple, list)):
        if len(v) != 2:
            raise ValueError(f"{name}: expected an int or a pair (height, width), got {v!r}")
        return check_positive_int(v[0], name), check_positive_int(v[1], name)
    n = check_positive_int(v, name)
    return n, n


@dataclass(frozen=True)
class ImageGrid(Grid):
    r"""A grid whose token domain :math:`\Omega_x` is a 2-D image domain (plus prefix tokens).

    opsplit places the image domain on :math:`\Omega_x` (the tokens *are* the spatial
    positions, as in CvT and Hugging Face's ``CvtModel``) and the channels on
    :math:`\Omega_y`; the convolutions of eq. (42) then act on the token variable and the
    attention integrates over spatial positions.  (Paper 002 §6.1 prints the transposed
    assignment, a 2-D :math:`\Omega_y` and "the number of tokens, i.e. the number of
    channels" on :math:`\Omega_x`; read literally, its attention would mix channels, which
    is not CvT's.  See ``docs/cvt.md``.)

    An :class:`ImageGrid` is a :class:`~opsplit.grid.Grid` whose ``x`` interval is the
    flattened 2-D grid: ``rows`` (:math:`N_1` nodes, spacing :math:`h_1`) times ``cols``
    (:math:`N_2` nodes, spacing :math:`h_2`), in row-major order, optionally after
    ``n_prefix`` tokens that are not on the 2-D grid (a class token).  Every token carries the
    cell area :math:`h_1 h_2` as its :math:`\Omega_x` quadrature weight (the class token too:
    a point mass of one cell), so the ``x`` interval has :math:`N_x = n_{\text{prefix}} + N_1
    N_2` nodes of spacing :math:`h_1 h_2` and every operator of opsplit that integrates over
    :math:`\Omega_x` (attention) or :math:`\Omega_y` (FFN, LayerNorm) works on it unchanged.
    With ``ImageGrid.paper`` every spacing is 1: plain sums, the paper's eqs. (25)–(26).

    The state is the usual ``(B, N_x, N_y)`` tensor; :meth:`ImageGrid.to_image` views its
    spatial tokens as an image ``(B, N_y, N_1, N_2)`` (channels first, what ``F.conv2d``
    takes) and :meth:`ImageGrid.from_image` goes back.

    Build it with :meth:`paper` (unit spacing, ``L = N``) or :meth:`uniform` (fixed domain
    lengths); the ``x`` interval is derived from ``rows``, ``cols`` and ``n_prefix``.

    Args:
        rows: :math:`[0, L_1]` at :math:`N_1` nodes (an :class:`~opsplit.grid.Interval`
            with ``n`` given; rules ``midpoint`` or ``right``, equal weights).
        cols: :math:`[0, L_2]` at :math:`N_2` nodes.
        n_prefix: tokens before the 2-D grid (0, or 1 for a class token).
    """

    rows: Interval | None = None
    cols: Interval | None = None
    n_prefix: int = 0

    def __post_init__(self):
        super().__post_init__()
        for name in ("rows", "cols"):
            itv = getattr(self, name)
            if not isinstance(itv, Interval):
                raise TypeError(f"ImageGrid.{name}: expected an Interval, got {type(itv).__name__}")
            if itv.n is None:
                raise ValueError(f"ImageGrid.{name}: expected a node count (the image size), got an open interval")
            if itv.rule == "trapezoid":
                raise ValueError(
                    f"ImageGrid.{name}: the trapezoid rule gives unequal cell weights; use 'midpoint' "
                    "or 'right' (every token carries the cell area)"
                )
        if isinstance(self.n_prefix, bool) or not isinstance(self.n_prefix, int) or self.n_prefix < 0:
            raise ValueError(f"ImageGrid.n_prefix: expected an integer >= 0, got {self.n_prefix!r}")
        nx = self.n_prefix + self.rows.n * self.cols.n
        if self.x.n != nx:
            raise ValueError(
                f"ImageGrid: the x interval has {self.x.n} nodes, expected n_prefix + N_1 N_2 = "
                f"{self.n_prefix} + {self.rows.n}*{self.cols.n} = {nx}"
            )

    # -- constructors -------------------------------------------------------------------------
    @classmethod
    def _build(cls, rows: Interval, cols: Interval, y: Interval, h: Interval | None, n_prefix: int) -> ImageGrid:
        x = Interval(n=n_prefix + rows.n * cols.n, spacing=rows.spacing * cols.spacing, rule=rows.rule)
        return cls(x=x, y=y, h=h, rows=rows, cols=cols, n_prefix=n_prefix)

    @classmethod
    def paper(cls, size, ny: int | None, *, n_prefix: int = 0, nh: int | None = None) -> ImageGrid:
        """``L = N`` in every direction (unit spacing, plain sums).

        Args:
            size: ``(N_1, N_2)`` (or an int for a square grid): the image size.
            ny: number of channels :math:`N_y` (``None``: read from the data).
            n_prefix: tokens before the 2-D grid (a class token).
            nh: optional number of heads :math:`N_h`.
        """
        n1, n2 = _pair(size, "ImageGrid.paper(size)")
        return cls._build(
            Interval.paper(n1), Interval.paper(n2), Interval.paper(ny),
            None if nh is None else Interval.paper(nh), n_prefix,
        )

    @classmethod
    def uniform(cls, size, ny: int, length=(1.0, 1.0), *, ly: float | None = None, rule: str = "midpoint",
                n_prefix: int = 0) -> ImageGrid:
        """The fixed domain :math:`[0, L_1] \\times [0, L_2]` at ``size`` nodes; ``ly``
        (default ``L_y = N_y``) for the channels."""
        n1, n2 = _pair(size, "ImageGrid.uniform(size)")
        if isinstance(length, (int, float)):
            length = (float(length), float(length))
        rows = Interval(n=n1, length=float(length[0]), rule=rule)
        cols = Interval(n=n2, length=float(length[1]), rule=rule)
        y = Interval.paper(ny) if ly is None else Interval(n=ny, length=ly)
        return cls._build(rows, cols, y, None, n_prefix)

    # -- shapes -----------------------------------------------------------------------------------
    @property
    def size(self) -> tuple[int, int]:
        """``(N_1, N_2)``: the image size of the 2-D part."""
        return self.rows.n, self.cols.n

    @property
    def n_spatial(self) -> int:
        return self.rows.n * self.cols.n

    @property
    def cell_area(self) -> float:
        r""":math:`h_1 h_2`, the quadrature weight of every token."""
        return self.rows.spacing * self.cols.spacing

    def with_prefix(self, n_prefix: int) -> ImageGrid:
        """The same 2-D grid with another number of prefix tokens."""
        return self._build(self.rows, self.cols, self.y, self.h, n_prefix)

    def with_channels(self, ny: int) -> ImageGrid:
        """The same token grid with ``N_y = ny`` channels (``L_y = N_y``)."""
        return replace(self, y=Interval.paper(check_positive_int(ny, "ny")))

    def with_image(self, rows: Interval, cols: Interval, *, n_prefix: int | None = None,
                   ny: int | None = None) -> ImageGrid:
        """Another 2-D grid (a grid transfer's target), keeping ``y`` (or ``N_y = ny``) and ``h``."""
        y = self.y if ny is None else Interval.paper(check_positive_int(ny, "ny"))
        return self._build(rows, cols, y, self.h, self.n_prefix if n_prefix is None else n_prefix)

    def with_shape(self, nx: int, ny: int, name: str | None = None) -> ImageGrid:
        pre = f"{name}: " if name else ""
        if nx != self.x.n:
            raise ValueError(
                f"{pre}grid/tensor mismatch: the image grid has N_x = {self.n_prefix} + {self.rows.n}*{self.cols.n} "
                f"= {self.x.n} tokens ({self.n_prefix} prefix + a {self.rows.n}x{self.cols.n} image), "
                f"the tensor has {nx}"
            )
        if self.y.n == ny:
            return self
        try:
            y = self.y.with_n(ny)
        except ValueError:
            raise ValueError(
                f"{pre}grid/tensor mismatch: the grid has N_y = {self.y.n} channels, the tensor has {ny}"
            ) from None
        return replace(self, y=y)

    # -- layouts ------------------------------------------------------------------------------------
    def split(self, u: Tensor) -> tuple[Tensor | None, Tensor]:
        """``(prefix, spatial)`` tokens of a state ``(B, N_x, N_y)`` (views)."""
        if self.n_prefix == 0:
            return None, u
        return u[:, : self.n_prefix], u[:, self.n_prefix:]

    def to_image(self, u: Tensor) -> Tensor:
        """The spatial tokens of ``u`` ``(B, N_x, N_y)`` as an image ``(B, N_y, N_1, N_2)``
        (a view when ``u`` is contiguous: the channels-last memory layout)."""
        s = u if self.n_prefix == 0 else u[:, self.n_prefix:]
        B, _, C = s.shape
        return s.transpose(1, 2).reshape(B, C, self.rows.n, self.cols.n)

    @staticmethod
    def from_image(img: Tensor, prefix: Tensor | None = None) -> Tensor:
        """An image ``(B, C, N_1, N_2)`` as tokens ``(B, [n_prefix +] N_1 N_2, C)``."""
        u = img.flatten(2).transpose(1, 2)
        return u if prefix is None else torch.cat([prefix, u], dim=1)

    def nodes_2d(self, dtype=None, device=None) -> tuple[Tensor, Tensor]:
        """The node coordinates of the 2-D part: ``(x1, x2)``, each of shape ``(N_1 N_2,)``."""
        r = self.rows.nodes(dtype, device)
        c = self.cols.nodes(dtype, device)
        return r.repeat_interleave(self.cols.n), c.repeat(self.rows.n)

    def __str__(self) -> str:
        s = f"ImageGrid({self.rows.n}x{self.cols.n}"
        if self.n_prefix:
            s += f" + {self.n_prefix} prefix"
        s += f", h=({self.rows.spacing:g}, {self.cols.spacing:g}), N_y={self.ny_str}"
        if self.h is not None:
            s += f", N_h={self.h.n}"
        return s + ")"
