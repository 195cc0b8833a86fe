r"""Galerkin-type attention (Cao, *Choose a Transformer: Fourier or Galerkin*, NeurIPS 2021)
as an integral operator on :math:`\Omega_x`: softmax-free, with layer-normalised keys and
values.

For every head :math:`h` with the integral transforms :math:`Q, K, V` of paper 002,
eq. (38) (rank index :math:`k = 1..d`), and :math:`\tilde K, \tilde V` their per-head layer
normalisations (projection onto :math:`S_1(0, 1)` with ``eps``, then a per-head affine map):

.. math::

    A(u)(x, h, \cdot) = s \int_{\Omega_x} \big\langle Q(x, h, \cdot),
        \tilde K(\tilde x, h, \cdot)\big\rangle\, \tilde V(\tilde x, h, \cdot)\, d\tilde x
      = s\, Q(x, h, \cdot)\Big(\int_{\Omega_x} \tilde K(\tilde x, h, \cdot)^{\!\top}
        \tilde V(\tilde x, h, \cdot)\, d\tilde x\Big),                    \tag{G}

then the heads are combined by :math:`W^O` (eq. 38; ``WO=None``: summed).  On
:math:`\Omega_x = [0, 1]` with :math:`n` equal weights :math:`1/n` and ``scale`` :math:`s = 1`
this is Cao's eq. (Galerkin): :math:`z = Q(\tilde K^\top \tilde V)/n` — a Petrov–Galerkin
projection: the columns of :math:`\tilde V` span the trial space, each output is a
combination of them with coefficients :math:`\langle Q, \tilde K_\cdot\rangle`.  The
integral is computed first (a :math:`d \times d` matrix per head), so the cost is
:math:`O(N_x d^2)`, linear in the number of nodes.  Every integral carries its quadrature
weights, so the operator converges as the :math:`\Omega_x` grid is refined: a trained model
can be solved on other grids (``docs/burgers.md``).
"""

from __future__ import annotations

from ._normed_attention import NormedAttention

__all__ = ["GalerkinAttention"]


class GalerkinAttention(NormedAttention):
    r"""Galerkin-type attention, eq. (G) of the module docstring.

    Args:
        WQ, WK, WV: head kernels, shapes ``(N_y, H, d)`` (the layout of
            :class:`~opsplit.operators.MultiHeadAttention`; controls or tensors).
        WO: optional ``(H, d, N_y)`` output kernel (``None``: the heads are summed, needs
            ``d = N_y``).
        bQ, bK, bV, bO: optional biases ``(H, d)`` / ``(N_y,)``.
        norm_weights, norm_biases: the per-head affine maps of the normalisations of
            :math:`K` and :math:`V`, pairs of ``(H, d)`` controls (``None``: identity).
        eps: the normalisation's :math:`\varepsilon` (``nn.LayerNorm``'s 1e-5).
        scale: :math:`s` (1: Cao's formula).

    :meth:`create` builds trainable controls with one weight set per time piece.
    """

    normalised = ("k", "v")
