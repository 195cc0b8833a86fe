r"""Blanes and Moan's optimised six-stage fourth-order splitting (S6).

For :math:`u_t = A(u) + B(u)` the symmetric method

.. math::  \Psi_{\Delta t} = e^{a_1 \Delta t A} e^{b_1 \Delta t B} e^{a_2 \Delta t A}
           e^{b_2 \Delta t B} \cdots e^{b_6 \Delta t B} e^{a_7 \Delta t A}

(six :math:`B` flows; the last :math:`A` flow merges with the next step's first), with

=======================================  =======================================
:math:`a_1 = a_7 = 0.0792036964311957`    :math:`b_1 = b_6 = 0.209515106613362`
:math:`a_2 = a_6 = 0.353172906049774`     :math:`b_2 = b_5 = -0.143851773179818`
:math:`a_3 = a_5 = -0.0420650803577195`   :math:`b_3 = b_4 = 1/2 - (b_1 + b_2)`
:math:`a_4 = 1 - 2(a_1 + a_2 + a_3)`
=======================================  =======================================

S. Blanes and P. C. Moan, *Practical symplectic partitioned Runge–Kutta and
Runge–Kutta–Nyström methods*, J. Comput. Appl. Math. 142 (2002) 313–330: their
symmetric six-stage partitioned Runge–Kutta method of order 4 (S6), with coefficients chosen there to minimise the error constants:
at equal work it is far more accurate than the triple jump.  Order 4; the order
conditions are checked from these coefficients in ``tests/test_composition.py``: in the
free algebra over :math:`\{A, B\}` (every word of length :math:`\le 4` of the product of
exponentials equals that of :math:`e^{A+B}` to round-off, a word of length 5 does not) and
on a matrix problem against ``scipy.linalg.expm`` — both independent of the scheme code.

**More than two operators.**  The method is applied as the equivalent composition of the
Lie step and its adjoint (:func:`~opsplit.schemes.composition.sweeps_from_splitting`:
:math:`\beta_1 = a_1`, :math:`\alpha_i = b_i - \beta_i`, :math:`\beta_{i+1} = a_{i+1} -
\alpha_i`; McLachlan 1995; Hairer, Lubich, Wanner, §III.5), which has order 4 for any
number of substeps (for two substeps it is the method above, operator 1 = :math:`A`).
Two of the twelve sweep coefficients are negative (:math:`\alpha_2 = \beta_5 \approx
-0.3667`; four of the thirteen coefficients of the two-term method are, :math:`a_3 = a_5`
and :math:`b_2 = b_5`), and the merged calls run every substep backwards somewhere: every
substep must be reversible.  Substep calls per step: :math:`12K - 11`.
"""

from __future__ import annotations

from .composition import Composition, sweeps_from_splitting

__all__ = ["BlanesMoan", "BLANES_MOAN_A", "BLANES_MOAN_B"]

_a1, _a2, _a3 = 0.0792036964311957, 0.353172906049774, -0.0420650803577195
_b1, _b2 = 0.209515106613362, -0.143851773179818
#: a_1..a_7 of Blanes & Moan (2002), S6 of order 4
BLANES_MOAN_A = (_a1, _a2, _a3, 1.0 - 2.0 * (_a1 + _a2 + _a3), _a3, _a2, _a1)
#: b_1..b_6 of Blanes & Moan (2002), S6 of order 4
BLANES_MOAN_B = (_b1, _b2, 0.5 - (_b1 + _b2), 0.5 - (_b1 + _b2), _b2, _b1)


class BlanesMoan(Composition):
    """Blanes–Moan S6 (module docstring), as sweeps of the Lie step and its adjoint.
    Order 4."""

    order = 4

    @classmethod
    def sweeps(cls):
        return sweeps_from_splitting(BLANES_MOAN_A, BLANES_MOAN_B)
