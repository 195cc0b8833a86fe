r"""Two-dimensional token grids: :math:`\Omega_x` as an image domain (paper 002, §6).

The convolutional transformer of paper 002, §6 (eqs. 42–45) evolves :math:`u(x, y, t)`
where the token variable lives on a 2-D domain.  opsplit places the image domain on
:math:`\Omega_x = [0, L_1] \times [0, L_2]` (the tokens *are* the spatial positions, as
in CvT and in Hugging Face's ``CvtModel``) and the channels on :math:`\Omega_y`; the
convolutions of eq. (42) then act on the token variable and the attention integrates over
spatial positions.  (The paper's §6.1 prints the opposite assignment, a 2-D
:math:`\Omega_y` and "the number of tokens, i.e. the number of channels" on
:math:`\Omega_x`; with that reading the attention would mix channels, which is not CvT's.
See ``docs/cvt.md``.)

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
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
from torch import Tensor

from ._checks import check_positive_int
from .grid import Grid, Interval

__all__ = ["ImageGrid"]


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

    def with_shape(self, nx: int, ny: int) -> ImageGrid:
        if nx != self.x.n:
            raise ValueError(
                f"grid/tensor mismatch: the image grid has N_x = {self.n_prefix} + {self.rows.n}*{self.cols.n} "
                f"= {self.x.n} tokens ({self.n_prefix} prefix + a {self.rows.n}x{self.cols.n} image), "
                f"the tensor has {nx}"
            )
        if self.y.n == ny:
            return self
        try:
            y = self.y.with_n(ny)
        except ValueError:
            raise ValueError(
                f"grid/tensor mismatch: the grid has N_y = {self.y.n} channels, the tensor has {ny}"
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
