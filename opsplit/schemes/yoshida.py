r"""Yoshida's triple jump: a fourth-order symmetric composition of three Strang steps.

.. math::  \Psi_{\Delta t} = S_{\gamma_1 \Delta t} \circ S_{\gamma_2 \Delta t} \circ
           S_{\gamma_1 \Delta t},\qquad
           \gamma_1 = \frac{1}{2 - 2^{1/3}},\quad \gamma_2 = -\frac{2^{1/3}}{2 - 2^{1/3}},

H. Yoshida, *Construction of higher order symplectic integrators*, Phys. Lett. A 150
(1990) 262–268, §4 (with :math:`S` the second-order symmetric step; the
same composition is Suzuki's and Creutz–Gocksch's for :math:`p = 2`).  For a symmetric
method :math:`S` of order 2, the symmetric composition has order 4 iff
:math:`2\gamma_1 + \gamma_2 = 1` and :math:`2\gamma_1^3 + \gamma_2^3 = 0` (Hairer, Lubich,
Wanner, *Geometric Numerical Integration*, §II.4); the unique real solution is
the one above, with :math:`\gamma_2 \approx -1.7024 < 0`: the middle Strang step runs
backwards in time.

Order 4 with every substep solved to order :math:`\ge 4` (``RK4``, ``ODESolve``, exact
flows); ``effective_order`` says so.  Substep calls per step: :math:`6K - 5` for
:math:`K` substeps (three Strang steps, ends merged).  Every substep runs over a negative
time step, so every substep must be reversible (see :mod:`opsplit.schemes.composition`).
"""

from __future__ import annotations

from .composition import Composition, sweeps_from_strang

__all__ = ["TripleJump", "TRIPLE_JUMP_GAMMAS"]

_CBRT2 = 2.0 ** (1.0 / 3.0)
#: (gamma_1, gamma_2, gamma_3) of Yoshida (1990)
TRIPLE_JUMP_GAMMAS = (1.0 / (2.0 - _CBRT2), -_CBRT2 / (2.0 - _CBRT2), 1.0 / (2.0 - _CBRT2))


class TripleJump(Composition):
    """Yoshida's triple jump :math:`S_{\\gamma_1\\Delta t} S_{\\gamma_2\\Delta t}
    S_{\\gamma_1\\Delta t}` of Strang steps (module docstring). Order 4."""

    order = 4

    @classmethod
    def sweeps(cls):
        return sweeps_from_strang(TRIPLE_JUMP_GAMMAS)
