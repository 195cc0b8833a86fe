r"""Attention with convolutional projections: the attention term of the convolutional
transformer (paper 002, §6.1, eq. 42) and of CvT.

Paper 002's eq. (42) replaces the integral transforms of :math:`Q, K, V` (eqs. 3–5) by
convolutions on the 2-D token domain (translation-invariant kernels):

.. math::

    Q(x, y) = (W^Q * u)(x, y),\quad K = W^K * u,\quad V = W^V * u,\qquad
    \gamma(x, \tilde x) = \mathrm{Softmax}_2\Big(\tfrac{1}{\sqrt{|\Omega_y|}}
        \langle Q(x, \cdot), K(\tilde x, \cdot)\rangle_{\Omega_y}\Big)          \qquad (42)

and the term is :math:`\int_{\Omega_x}\gamma(x, \tilde x) V(\tilde x, y)\,d\tilde x`.
CvT's convolutional projection composes three pieces per :math:`Q, K, V`:

1. a depthwise convolution (:class:`~opsplit.operators.ConvTransfer`, ``groups="depthwise"``,
   no bias; stride 1 for the queries, :math:`s_{kv}` for the keys and values, whose
   integration variable :math:`\tilde x` then runs over the coarser grid — the key measure
   of the attention is the coarse grid's quadrature);
2. batch normalisation (:class:`~opsplit.operators.BatchNormMap`: an affine map per
   channel in eval mode);
3. the pointwise linear map of eqs. (3)–(5), :math:`\int_{\Omega_y} W^Q(\xi, h, k)\,
   \cdot\,d\xi + b^Q`, per head (the kernels of
   :class:`~opsplit.operators.MultiHeadAttention`, whose heads, score scale, softmax and
   output projection this operator inherits).

Prefix tokens (CvT's class token) are not on the 2-D grid: they skip the convolution and
the batch norm and enter the linear maps directly (as ``transformers``' ``CvtSelfAttention``
does).  The score scale of CvT is :math:`1/\sqrt{N_y}` (``embed_dim ** -0.5``, not the
head size): eq. (37)'s :math:`1/\sqrt{|\Omega_y|}` on the paper's grid, opsplit's default
``scale=None``.

With projections that are one convolution each and identity pointwise maps this is
eq. (42) literally (see :func:`opsplit.models.cvt.one_head_cvt`).
"""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor, nn

from ..grid import Grid
from .base import Operator
from .convolution import image_grid_of
from .multihead import MultiHeadAttention

__all__ = ["ConvAttention"]


def _maps(proj, name: str) -> nn.ModuleList:
    if proj is None:
        return nn.ModuleList()
    maps = list(proj) if isinstance(proj, (list, tuple, nn.ModuleList)) else [proj]
    for m in maps:
        if not isinstance(m, Operator) or not hasattr(m, "apply_image"):
            raise TypeError(
                f"ConvAttention.{name}: expected image maps (ConvTransfer, BatchNormMap), got {type(m).__name__}"
            )
        if getattr(m, "changes_grid", False) and getattr(m, "prefix", "keep") != "keep":
            raise ValueError(
                f"ConvAttention.{name}: a projection must keep the prefix (class) tokens: "
                "ConvTransfer(..., prefix='keep')"
            )
    return nn.ModuleList(maps)


class ConvAttention(MultiHeadAttention):
    r"""Multi-head attention whose :math:`Q, K, V` read convolutional projections of
    :math:`u` (paper 002 eq. 42; CvT's ``dw_bn`` projection).

    Args:
        WQ, WK, WV, WO, bQ, bK, bV, bO, scale, dropout: as
            :class:`~opsplit.operators.MultiHeadAttention` (the pointwise maps; ``scale=None``
            is :math:`1/\sqrt{|\Omega_y|}`, CvT's).
        q_proj, k_proj, v_proj: the convolutional projection of each input, a map or a
            sequence of maps applied in order (:class:`~opsplit.operators.ConvTransfer` with
            ``prefix="keep"``, :class:`~opsplit.operators.BatchNormMap`); ``None`` is the
            identity.

    The state lives on an :class:`~opsplit.grid.ImageGrid`.
    """

    def __init__(self, WQ, WK, WV, WO=None, *, q_proj=None, k_proj=None, v_proj=None, bQ=None, bK=None,
                 bV=None, bO=None, scale: float | None = None, dropout: float = 0.0):
        super().__init__(WQ, WK, WV, WO, bQ=bQ, bK=bK, bV=bV, bO=bO, scale=scale, dropout=dropout)
        self.q_proj = _maps(q_proj, "q_proj")
        self.k_proj = _maps(k_proj, "k_proj")
        self.v_proj = _maps(v_proj, "v_proj")

    def check(self, grid: Grid) -> None:
        g = image_grid_of(grid, "ConvAttention")
        super().check(g)
        out = {}
        for name in ("q_proj", "k_proj", "v_proj"):
            gg = g
            for m in getattr(self, name):
                try:
                    m.check(gg)
                except ValueError as e:
                    raise ValueError(f"ConvAttention.{name}: {e}") from None
                if getattr(m, "changes_grid", False):
                    gg = m.target_grid(gg)
            if gg.y.n != g.y.n:
                raise ValueError(
                    f"ConvAttention.{name}: the projection changes the channels ({g.y.n} -> {gg.y.n}); "
                    "the pointwise kernels act on N_y channels"
                )
            out[name] = gg
        if out["q_proj"].size != g.size:
            n1, n2 = g.size
            m1, m2 = out["q_proj"].size
            raise ValueError(
                f"ConvAttention.q_proj: the query projection must keep the token grid, got {n1}x{n2} -> {m1}x{m2}: "
                "the term is a field on the state's grid (stride 1 with 'same' padding keeps every grid; a "
                "strided one keeps only the sizes N with floor((N + 2p - k)/s) + 1 = N)"
            )
        if out["k_proj"].nx != out["v_proj"].nx:
            raise ValueError(
                f"ConvAttention: the key and value projections give different token grids ({out['k_proj']} vs "
                f"{out['v_proj']}); the values are integrated over the keys' grid (same stride and padding)"
            )

    def projection_grids(self, grid: Grid) -> dict:
        """The token grids of the projected Q, K and V inputs for a state on ``grid``."""
        out = {}
        for name in ("q_proj", "k_proj", "v_proj"):
            gg = grid
            for m in getattr(self, name):
                if getattr(m, "changes_grid", False):
                    gg = m.target_grid(gg)
            out[name[0].upper()] = gg
        return out

    def schedule_note(self, grid: Grid) -> str:
        """What a schedule shows: the heads and the token grids of the keys and values."""
        g = self.projection_grids(grid)["K"]
        size = f"{g.size[0]}x{g.size[1]}" + (f" + {g.n_prefix}" if g.n_prefix else "")
        return f"heads {self.n_heads}, K/V on {size}"

    def project_inputs(self, t, u: Tensor, grid) -> tuple[Tensor, Tensor, Tensor]:
        """The convolutional projections of ``u`` (tokens, prefix first): the inputs of the
        pointwise maps for :math:`Q, K, V`."""
        img = grid.to_image(u)
        prefix = grid.split(u)[0]

        def run(maps):
            if len(maps) == 0:
                return u
            x = img
            for m in maps:
                x = m.apply_image(t, x, grid)
            return grid.from_image(x, prefix)

        xk = run(self.k_proj)  # transformers' order: key, query, value
        xq = run(self.q_proj)
        xv = run(self.v_proj)
        return xq, xk, xv

    def _pointwise(self, x: Tensor, W: Tensor, b: Tensor | None, grid: Grid) -> Tensor:
        r""":math:`\int_{\Omega_y} W(\xi, h, k)\, x(\cdot, \xi)\, d\xi + b(h, k)`, ``(B, N, H*d)``."""
        ny = x.shape[-1]
        W = W.reshape(ny, -1)
        wy = grid.y.uniform_weight
        if wy is None:
            x = x * grid.y.weights(x.dtype, x.device)
        elif wy != 1.0:
            W = W * wy
        return F.linear(x, W.t(), None if b is None else b.reshape(-1))

    def heads(self, t, u: Tensor, grid: Grid):
        g = image_grid_of(grid, "ConvAttention")
        B = u.shape[0]
        xq, xk, xv = self.project_inputs(t, u, g)
        WQ, WK, WV = self.WQ(t, g), self.WK(t, g), self.WV(t, g)
        bQ = None if self.bQ is None else self.bQ(t, g)
        bK = None if self.bK is None else self.bK(t, g)
        bV = None if self.bV is None else self.bV(t, g)
        H, dk, dv = WQ.shape[1], WQ.shape[2], WV.shape[2]
        q = self._pointwise(xq, WQ, bQ, g).view(B, xq.shape[1], H, dk).transpose(1, 2)
        k = self._pointwise(xk, WK, bK, g).view(B, xk.shape[1], H, dk).transpose(1, 2)
        v = self._pointwise(xv, WV, bV, g).view(B, xv.shape[1], H, dv).transpose(1, 2)
        return q, k, v

    def attend(self, q: Tensor, k: Tensor, v: Tensor, grid: Grid) -> Tensor:
        """As :meth:`MultiHeadAttention.attend`; in training mode with attention dropout the
        weights are formed explicitly and dropped by ``nn.Dropout``'s draw (what
        ``transformers``' ``CvtSelfAttention`` does), so a seeded training step is
        reproduced."""
        if not (self.training and self.dropout > 0):
            return super().attend(q, k, v, grid)
        B, H, N, _ = q.shape
        bias, _ = self._log_weights(grid, B, H, N, k.shape[2], q.dtype, q.device)
        a = self.score_scale(grid) * (q @ k.transpose(-1, -2))
        if bias is not None:
            a = a + bias
        return F.dropout(a.softmax(-1), self.dropout, True) @ v

    def extra_repr(self) -> str:
        return super().extra_repr() + ", conv projections"
