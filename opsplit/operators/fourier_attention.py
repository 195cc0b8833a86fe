r"""Fourier-type attention (Cao, *Choose a Transformer: Fourier or Galerkin*, NeurIPS 2021)
as an integral operator on :math:`\Omega_x`: softmax-free, with layer-normalised queries
and keys.

For every head :math:`h` with the integral transforms :math:`Q, K, V` of paper 002,
eq. (38), and :math:`\tilde Q, \tilde K` their per-head layer normalisations (projection
onto :math:`S_1(0, 1)` with ``eps``, then a per-head affine map):

.. math::

    A(u)(x, h, \cdot) = s \int_{\Omega_x} \kappa(x, \tilde x, h)\, V(\tilde x, h, \cdot)\,
        d\tilde x, \qquad
    \kappa(x, \tilde x, h) = \big\langle \tilde Q(x, h, \cdot),
        \tilde K(\tilde x, h, \cdot)\big\rangle,                            \tag{F}

then the heads are combined by :math:`W^O` (eq. 38).  On :math:`\Omega_x = [0, 1]` with
:math:`n` equal weights :math:`1/n` and :math:`s = 1` this is Cao's eq. (Fourier):
:math:`z = (\tilde Q \tilde K^\top) V / n` — a quadrature of an integral operator with the
learned kernel :math:`\kappa`, Cao's analogy with a Fourier-type integral transform.
(Cao's code divides the scores by :math:`\sqrt d` as well; pass ``scale=1/sqrt(d)`` for that.)
Without a softmax the product is associative: opsplit computes
:math:`\tilde Q(\tilde K^\top V)/n`, :math:`O(N_x d^2)` instead of the :math:`O(N_x^2 d)` of
the written order (equal up to rounding: ``tests/test_galerkin_attention.py``).
"""

from __future__ import annotations

from ._normed_attention import NormedAttention

__all__ = ["FourierAttention"]


class FourierAttention(NormedAttention):
    r"""Fourier-type attention, eq. (F) of the module docstring.

    Args: as :class:`~opsplit.operators.GalerkinAttention`, the normalisations acting on
    :math:`Q` and :math:`K` (``norm_weights = (gamma_q, gamma_k)``).
    """

    normalised = ("q", "k")
