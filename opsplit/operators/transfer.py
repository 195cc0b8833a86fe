r"""Grid transfers: maps that move the state to another grid (paper 002, §6.2).

A multi-stage model (CvT) changes the number of tokens and channels from stage to stage:
"for a K-stage CvT, the number of tokens changes from stage to stage [...] based on the
multigrid idea, these kernels are discretized at different scales" (§6.2).  In opsplit a
stage change is an operator, not a reshape hidden in a model's forward: a
:class:`GridTransfer` is a map substep (:math:`\Delta t`-independent, solved by
:class:`~opsplit.solvers.Exact`) whose output lives on :meth:`GridTransfer.target_grid`.
Schemes that thread the grid through their substeps
(:class:`~opsplit.schemes.Hybrid`, each transfer in a group of its own, and
:class:`~opsplit.schemes.Stages`) pass the new grid to the substeps that follow.

* :class:`ConvTransfer` — the convolutional token embedding (eq. 44 as a restriction):
  :math:`u \mapsto W^C *_s u + b^C` with stride :math:`s` (a coarser token grid),
  padding, and :math:`C_{\text{in}} \to C_{\text{out}}` channels.  Eq. (44) prints the
  substep as :math:`u^{1/M} = u^0 + W^{C,0} * u^0 + b^{C,0}`; when the grid or the
  channels change the identity term has no meaning (it lives on the old grid), so the
  embedding is the map :math:`u^{1/M} = W^{C,0} * u^0 + b^{C,0}` itself — what CvT
  computes.  (On one grid the residual form is the explicit-Euler step of
  :class:`~opsplit.operators.Convolution2d`.)  It is also CvT's Q/K/V convolution
  (depthwise, no bias, stride 1 for queries and :math:`s_{kv}` for keys and values).
* :class:`PrependTokens` — the class token of ViT's pre-processing (§4.2,
  :math:`[\mathbf v_0;\ \cdot\,]`): :math:`N_x \to N_x + 1` tokens.

**Sizes and node positions (any image size).**  Along one axis let the fine grid have
:math:`N` nodes :math:`x_i = x_0 + i h`.  The convolution with kernel :math:`k`, stride
:math:`s` and zero padding :math:`p` computes at output :math:`m` the sum
:math:`\sum_{j<k} w_j\, u_{ms - p + j}` (:math:`u = 0` on the :math:`p` padding nodes on
either side): a stencil of :math:`k` consecutive nodes of the padded grid
:math:`x_{-p}, \dots, x_{N-1+p}`.  Exactly

.. math::  N' = \lfloor (N + 2p - k)/s \rfloor + 1

stencils fit in the padded grid (:math:`N' \ge 1` iff :math:`N + 2p \ge k`; otherwise no
stencil fits and the size is refused, as torch refuses it).  Output :math:`m` is the
quadrature of :math:`\int W(\xi)\, u(x'_m + \xi)\, d\xi` around its stencil's centre

.. math::  x'_m = x_0 + \big(ms - p + \tfrac{k-1}{2}\big) h, \qquad m = 0, \dots, N' - 1,

so the coarse grid is the lattice of stencil centres: spacing :math:`s h`, first node
:math:`x_0 + ((k-1)/2 - p) h` (:meth:`ConvTransfer.node_positions`).  Nothing here needs
:math:`s` to divide :math:`N`: otherwise the coarse grid simply has :math:`N'` nodes, and
the last :math:`(N + 2p - k) \bmod s` nodes of the padded grid are read by no stencil
(image nodes only when that remainder exceeds :math:`p`) — what torch's and Hugging
Face's convolutions compute, exactly.

**Spacing.**  ``spacing="keep"`` (default) gives the coarse grid the fine grid's spacing:
with unit spacing this is the paper's convention :math:`L = N` on every stage (the tokens
of every stage indexed by integers, :math:`\Omega = [0, N']`, the plain sums of
eqs. 25–26), which is what CvT computes; the tokens' positions in the fine grid's
coordinates are still the :math:`x'_m` above (an affine relabelling with scale :math:`s`).
``spacing="stride"`` multiplies the spacing by the stride: the multigrid view, the coarse
cells :math:`[x'_m - sh/2,\ x'_m + sh/2]` tile :math:`[a,\ a + N' s h]` with
:math:`a = x'_0 - sh/2` (:math:`= ((k - s)/2 - p)\,h` for cell-centred fine nodes).  That
is the fine domain :math:`[0, N h]` only when :math:`k - s = 2p` and :math:`s \mid N`.
CvT's stencils (:math:`k, s, p = 7, 4, 2` and :math:`3, 2, 1`) give :math:`a = -h/2`: the
coarse domain is the fine one shifted by half a fine cell, and for sizes the stride does
not divide it is shorter or longer by less than one coarse cell.  The coarse
:class:`~opsplit.grid.Interval` (always :math:`[0, L]`) is that domain in the coordinate
:math:`x - a`: every quadrature and kernel of opsplit is translation invariant (equal
weights, kernels of the offset), so the translation changes no computed value.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from ..controls import as_control
from ..grid import Grid, ImageGrid, Interval
from .base import Operator
from .convolution import (
    ContinuousKernel,
    _resolve_groups,
    check_weight,
    convolve,
    expand_weight,
    image_grid_of,
    kernel_shape,
)

__all__ = ["GridTransfer", "ConvTransfer", "PrependTokens"]


def _int_pair(v, name: str, minimum: int) -> tuple[int, int]:
    vals = tuple(v) if isinstance(v, (tuple, list)) else (v, v)
    if len(vals) != 2 or any(isinstance(a, bool) or not isinstance(a, int) or a < minimum for a in vals):
        raise ValueError(f"{name}: expected an integer >= {minimum} or a pair of them, got {v!r}")
    return int(vals[0]), int(vals[1])


class GridTransfer(Operator):
    """Base class of maps to another grid: a ``flow`` (independent of :math:`\\Delta t`)
    whose output lives on :meth:`target_grid`."""

    has_flow = True
    default_solver = "exact"
    #: a Δt-independent map (applied once, like a projection)
    is_map = True
    #: the output lives on ``target_grid(grid)``, not on ``grid``
    changes_grid = True

    def target_grid(self, grid: Grid) -> Grid:  # pragma: no cover - abstract
        raise NotImplementedError

    def check(self, grid: Grid) -> None:
        self.target_grid(grid)


class ConvTransfer(GridTransfer):
    r"""Strided convolution to a coarser token grid: :math:`u \mapsto W *_s u + b`
    (eq. 44 as a restriction; CvT's convolutional token embedding and Q/K/V convolutions).

    Args:
        weight: discrete weights (tensor or control, e.g. a
            :class:`~opsplit.controls.PiecewiseConstant` with one set per layer) of shape
            ``(C_out, C_in/groups, k_1, k_2)`` in torch's layout, or a
            :class:`~opsplit.operators.ContinuousKernel` (stride 1 only: the coarse nodes of
            a strided restriction are not nodes of the fine grid).
        bias: optional :math:`b(y)`, shape ``(C_out,)``.
        stride, padding: ints or pairs (zero padding).
        groups: ``1``, ``"depthwise"`` or a divisor of :math:`C_{\text{in}}`.
        prefix: ``"drop"`` (the prefix tokens are not carried over: a stage's class token
            ends with its stage) or ``"keep"`` (they pass unchanged: CvT's Q/K/V
            projections leave the class token alone).
        spacing: ``"keep"`` or ``"stride"`` (see the module docstring).
    """

    def __init__(self, weight, bias=None, *, stride=1, padding=0, groups=1, prefix: str = "drop",
                 spacing: str = "keep"):
        super().__init__()
        self.weight = weight if isinstance(weight, ContinuousKernel) else as_control(weight, "ConvTransfer.weight")
        self.bias = None if bias is None else as_control(bias, "ConvTransfer.bias")
        self.stride = _int_pair(stride, "ConvTransfer.stride", 1)
        self.padding = _int_pair(padding, "ConvTransfer.padding", 0)
        if groups != "depthwise":
            _resolve_groups(groups, 0, "ConvTransfer")
        self.groups = groups
        if prefix not in ("drop", "keep"):
            raise ValueError(f"ConvTransfer.prefix: expected 'drop' or 'keep', got {prefix!r}")
        if spacing not in ("keep", "stride"):
            raise ValueError(f"ConvTransfer.spacing: expected 'keep' or 'stride', got {spacing!r}")
        self.prefix, self.spacing = prefix, spacing
        if isinstance(self.weight, ContinuousKernel) and self.stride != (1, 1):
            raise ValueError(
                "ConvTransfer: a continuous kernel needs stride 1 (the nodes of a strided restriction "
                "are not nodes of the fine grid); give discrete weights"
            )
        s = kernel_shape(self.weight)
        if s is not None and len(s) != 4:
            raise ValueError(f"ConvTransfer.weight: expected shape (C_out, C_in/groups, k_1, k_2), got {s}")
        b = None if self.bias is None else kernel_shape(self.bias)
        if s is not None and b is not None and b != (s[0],) and not (s[0] == 1 and len(b) == 1):
            raise ValueError(f"ConvTransfer.bias: expected shape ({s[0]},) (C_out), got {b}")

    # -- shapes -----------------------------------------------------------------------------
    def _kernel_size(self, grid: ImageGrid) -> tuple[int, int]:
        if isinstance(self.weight, ContinuousKernel):
            m1, m2 = self.weight.taps(grid)
            return 2 * m1 + 1, 2 * m2 + 1
        s = kernel_shape(self.weight)
        if s is None:
            raise ValueError("ConvTransfer: the weight control has no static shape")
        return s[2], s[3]

    def out_channels(self, c_in: int) -> int:
        s = kernel_shape(self.weight)
        groups = _resolve_groups(self.groups, c_in, "ConvTransfer")
        if s is None:
            return self.weight.channels[0] if self.weight.channels[0] > 1 else c_in
        return check_weight(s, c_in, groups, "ConvTransfer")

    def out_size(self, size: tuple[int, int], kernel_size: tuple[int, int], who: str = "ConvTransfer"):
        r"""torch's output size :math:`N' = \lfloor (N + 2p - k)/s \rfloor + 1` per axis, for
        any :math:`N` with :math:`N + 2p \ge k` (a clear error otherwise: no stencil fits)."""
        out = []
        for axis, n, k, s, p in zip(("height N_1", "width N_2"), size, kernel_size, self.stride, self.padding):
            if n + 2 * p < k:
                raise ValueError(
                    f"{who}: the kernel ({k}) is larger than the padded image ({axis} = {n}, + 2*{p} padding = "
                    f"{n + 2 * p}): no stencil fits, the coarse grid would have no node"
                )
            out.append((n + 2 * p - k) // s + 1)
        return tuple(out)

    def node_positions(self, grid: Grid, dtype=None, device=None) -> tuple[Tensor, Tensor]:
        r"""The coarse nodes in the fine grid's coordinates, per axis: the stencil centres
        :math:`x'_m = x_0 + (ms - p + (k - 1)/2)\,h`, :math:`m < N'` (module docstring),
        ``(rows, cols)`` of shapes ``(N'_1,)`` and ``(N'_2,)``."""
        g = image_grid_of(grid, "ConvTransfer")
        ks = self._kernel_size(g)
        sizes = self.out_size(g.size, ks)
        out = []
        for itv, n_out, k, s, p in zip((g.rows, g.cols), sizes, ks, self.stride, self.padding):
            m = torch.arange(n_out, dtype=torch.float64)
            x0 = float(itv.nodes(torch.float64)[0])
            out.append((x0 + (m * s - p + (k - 1) / 2) * itv.spacing).to(dtype=dtype or torch.get_default_dtype(),
                                                                          device=device))
        return out[0], out[1]

    def target_grid(self, grid: Grid) -> ImageGrid:
        g = image_grid_of(grid, "ConvTransfer")
        c_in = g.y.n
        if c_in is None:
            raise ValueError("ConvTransfer: the grid's channel count N_y is not known yet")
        c_out = self.out_channels(c_in)
        n1, n2 = self.out_size(g.size, self._kernel_size(g))
        f1, f2 = (self.stride if self.spacing == "stride" else (1, 1))
        rows = Interval(n=n1, spacing=g.rows.spacing * f1, rule=g.rows.rule)
        cols = Interval(n=n2, spacing=g.cols.spacing * f2, rule=g.cols.rule)
        n_prefix = 0 if self.prefix == "drop" else g.n_prefix
        return g.with_image(rows, cols, n_prefix=n_prefix, ny=None if c_out == c_in else c_out)

    def check(self, grid: Grid) -> None:
        g = image_grid_of(grid, "ConvTransfer")
        self.target_grid(g)
        if not isinstance(self.weight, ContinuousKernel):
            self.weight.validate(g, "ConvTransfer.weight")

    # -- the map ----------------------------------------------------------------------------------
    def kernel(self, t, grid: ImageGrid, dtype=None) -> Tensor:
        c = grid.y.n
        w = expand_weight(self.weight(t, grid), _resolve_groups(self.groups, c, "ConvTransfer"), c)
        return w if dtype is None else w.to(dtype)

    def apply_image(self, t, img: Tensor, grid: ImageGrid) -> Tensor:
        """The map on an image ``(B, C_in, N_1, N_2)`` -> ``(B, C_out, N_1', N_2')``."""
        c = img.shape[1]
        b = None if self.bias is None else self.bias(t, grid)
        return convolve(img, self.kernel(t, grid, img.dtype), b, stride=self.stride, padding=self.padding,
                        groups=_resolve_groups(self.groups, c, "ConvTransfer"), area=grid.cell_area)

    def flow(self, t, dt: float, u: Tensor, grid: Grid) -> Tensor:
        g = image_grid_of(grid, "ConvTransfer")
        out = self.apply_image(t, g.to_image(u), g)
        prefix = g.split(u)[0] if self.prefix == "keep" else None
        return g.from_image(out, prefix)

    def extra_repr(self) -> str:
        s = kernel_shape(self.weight)
        w = "continuous" if s is None else f"weight={s}"
        return (f"{w}, stride={self.stride}, padding={self.padding}, groups={self.groups!r}, "
                f"bias={self.bias is not None}, prefix={self.prefix!r}, spacing={self.spacing!r}")


class PrependTokens(GridTransfer):
    r""":math:`u \mapsto [\mathbf v_0;\ u]`: tokens put before the 2-D grid (the class token of
    ViT's pre-processing, paper 002 §4.2, and of CvT's last stage).

    Args:
        tokens: control (or tensor; an ``nn.Parameter`` trains) of shape ``(n, N_y)``.
    """

    def __init__(self, tokens):
        super().__init__()
        self.tokens = as_control(tokens, "PrependTokens.tokens")
        s = kernel_shape(self.tokens)
        if s is not None and len(s) != 2:
            raise ValueError(f"PrependTokens.tokens: expected shape (n, N_y), got {s}")

    @classmethod
    def create(cls, n_y: int, n: int = 1, *, std: float = 0.02, device=None, dtype=None) -> PrependTokens:
        """Trainable tokens, truncated-normal initialised (ViT's and CvT's class token)."""
        op = cls(nn.Parameter(torch.zeros(n, n_y, device=device, dtype=dtype or torch.get_default_dtype())))
        op.std = float(std)
        op.reset_parameters()
        return op

    @torch.no_grad()
    def reset_parameters(self) -> None:
        v = getattr(self.tokens, "value", None)
        if isinstance(v, nn.Parameter):
            nn.init.trunc_normal_(v, std=getattr(self, "std", 0.02))

    @property
    def n_tokens(self) -> int:
        return kernel_shape(self.tokens)[0]

    def target_grid(self, grid: Grid) -> ImageGrid:
        g = image_grid_of(grid, "PrependTokens")
        s = kernel_shape(self.tokens)
        if g.y.n is not None and s is not None and s[1] != g.y.n:
            raise ValueError(
                f"PrependTokens: channel mismatch: the tokens have {s[1]} channels, the grid has N_y = {g.y.n}"
            )
        return g.with_prefix(g.n_prefix + s[0])

    def flow(self, t, dt: float, u: Tensor, grid: Grid) -> Tensor:
        v = self.tokens(t, grid).to(u.dtype)
        return torch.cat([v.unsqueeze(0).expand(u.shape[0], -1, -1), u], dim=1)

    def extra_repr(self) -> str:
        return f"tokens={kernel_shape(self.tokens)}"

