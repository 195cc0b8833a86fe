r"""ReLU attention: seed 000, eq. (13) — attention with the softmax replaced by ReLU and
*no normalisation*.

.. math::

    \alpha(X) &= V(X)\,\mathrm{ReLU}\big(K(X)^\top Q(X)\big), \\
    \beta(X)  &= V(X)\,\mathrm{ReLU}\big(\mathrm{mask}(K(X)^\top Q(X))\big), \\
    \gamma(X, Y) &= V(X)\,\mathrm{ReLU}\big(K(X)^\top Q(Y)\big)                 \qquad (13)

with affine :math:`Q, K, V` (eq. 4) and heads stacked (eq. 5).  Seed 000 writes tokens as
*columns*; opsplit's states have tokens as rows, so in opsplit's notation (and as a
continuous term, with the key quadrature now *not* cancelling because nothing is
normalised):

.. math::

    A(u)(x, y) = \int_{\Omega_h}\int_{\Omega_x}
        \mathrm{ReLU}\big(s\,\langle Q(x, h, \cdot), K(\tilde x, h, \cdot)\rangle + m(x, \tilde x)\big)
        \,[V W^O](\tilde x, h, y)\, d\tilde x\, dh + b^O(y).

With ``L = N`` the :math:`d\tilde x` integral is the plain sum of eq. (13).  ``scale``
defaults to 1 (eq. 13 has none).  Masks: a boolean (or :math:`-\infty`) entry removes the
key (:math:`\mathrm{ReLU}(-\infty) = 0`, eq. 13's :math:`\beta`); a finite float mask is
added to the score inside the ReLU; a causal flag is eq. 9's mask; encoder–decoder
attention (:math:`\gamma`) reads the memory from the grid context, as
:class:`~opsplit.operators.MultiHeadAttention`, whose parametrisation (shapes, biases,
heads, :math:`W^O`) this operator shares.

Seed 000, Theorem 3.3: every entry of :math:`\alpha(X)` is a cubic spline in the entries of
:math:`X` (scores are quadratic, ReLU keeps the degree, times the linear :math:`V`);
:mod:`opsplit.analysis.spline` measures it.
"""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor

from ..grid import Grid, Interval
from ._masks import attention_log_weights
from .context import cached
from .multihead import MultiHeadAttention

__all__ = ["ReLUAttention"]


class ReLUAttention(MultiHeadAttention):
    """ReLU attention (seed 000, eq. 13): :class:`MultiHeadAttention`'s heads with
    :math:`\\mathrm{ReLU}(s\\,QK^\\top + m)` in place of the normalised softmax.

    Arguments as :class:`~opsplit.operators.MultiHeadAttention`; ``scale`` defaults to 1.
    Attention-weight dropout is applied in training mode (ReLU weights, unnormalised).
    """

    def __init__(self, WQ, WK, WV, WO=None, *, scale: float | None = 1.0, **kwargs):
        super().__init__(WQ, WK, WV, WO, scale=scale, **kwargs)

    def _key_weights(self, grid: Grid, Nk: int, dtype, device):
        itv = grid.x if self.memory is None else self.source
        if itv is None:
            if grid.x.uniform_weight is not None:
                return grid.x.uniform_weight
            itv = Interval(n=Nk, length=grid.x.length, rule=grid.x.rule)
        itv = itv.with_n(Nk) if itv.n is None else itv
        w = itv.uniform_weight
        return w if w is not None else itv.weights(dtype, device)

    def scores(self, q: Tensor, k: Tensor, grid: Grid) -> Tensor:
        """The masked scores :math:`s\\,QK^\\top + m` that the ReLU acts on, (B, H, N_x, N_s)."""
        B, H, N, _ = q.shape
        a = self.score_scale(grid) * (q @ k.transpose(-1, -2))
        bias, is_causal = self._log_weights(grid, B, H, N, k.shape[2], q.dtype, q.device, quadrature=False)
        if is_causal:
            Nk = k.shape[2]
            bias = cached(
                grid, ("relu-causal", N, Nk, q.dtype, str(q.device)),
                lambda: attention_log_weights(B=B, H=H, Nq=N, Nk=Nk, dtype=q.dtype, device=q.device, causal=True),
            )
        return a if bias is None else a + bias

    def attend(self, q: Tensor, k: Tensor, v: Tensor, grid: Grid) -> Tensor:
        a = self.scores(q, k, grid).relu()
        if self.dropout and self.training:
            a = F.dropout(a, self.dropout, True)
        w = self._key_weights(grid, k.shape[2], q.dtype, q.device)
        if isinstance(w, Tensor):
            a = a * w
        elif w != 1.0:
            a = a * w
        return a @ v

    def attention_weights(self, u: Tensor, t: float = 0.0, grid: Grid | None = None) -> Tensor:
        """The (unnormalised) ReLU weights times the key quadrature, (B, H, N_x, N_s)."""
        g = self.resolve_grid(u, grid)
        q, k, _ = self.heads(t, u, g)
        a = self.scores(q, k, g).relu()
        w = self._key_weights(g, k.shape[2], q.dtype, q.device)
        return a * w

