r"""Controls smooth in time: a finite expansion in a basis of :math:`t`.

.. math::  \theta(t) = \sum_{p=0}^{P-1} c_p\, \varphi_p(s(t)),

with :math:`\varphi_p` Legendre polynomials :math:`P_p` or Chebyshev polynomials
:math:`T_p` of :math:`s = 2 (t - t_0)/(t_1 - t_0) - 1 \in [-1, 1]`, or cosines
:math:`\cos(p \pi s)` of :math:`s = (t - t_0)/(t_1 - t_0) \in [0, 1]`.  The control is
:math:`C^\infty` in :math:`t`, so a splitting scheme of order :math:`p` whose substeps
see the time dependence (``opsplit.solvers.Heun``, ``RK4``, ``ODESolve``) converges at
order :math:`p` however many steps :math:`N_t` it is solved with; the trained object is
the coefficient tensor, independent of :math:`N_t`.

The 1-D basis functions here (:func:`basis_matrix`) are also the spatial basis of
:class:`~opsplit.controls.PolynomialSeries`.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from .._checks import check_choice
from .base import Control, _check_values, _time_of

__all__ = ["TimeBasis", "basis_matrix", "BASES"]

#: the bases, name -> the interval of their argument
BASES = {"legendre": (-1.0, 1.0), "chebyshev": (-1.0, 1.0), "cosine": (0.0, 1.0)}

# tolerance (relative to the interval) for times that land on t0 or t1 up to round-off
_END_TOL = 1e-9


def basis_matrix(kind: str, s: Tensor, n: int) -> Tensor:
    r"""Values :math:`\varphi_p(s)` for :math:`p = 0, \dots, n - 1`: shape ``(*s.shape, n)``.

    ``kind``: ``"legendre"`` (:math:`P_p`, three-term recurrence
    :math:`(p+1) P_{p+1} = (2p+1) s P_p - p P_{p-1}`), ``"chebyshev"`` (:math:`T_p`,
    :math:`T_{p+1} = 2 s T_p - T_{p-1}`) or ``"cosine"`` (:math:`\cos(p\pi s)`).
    """
    check_choice(kind, BASES, "basis")
    if n < 1:
        raise ValueError(f"basis: expected at least one basis function, got {n}")
    if kind == "cosine":
        p = torch.arange(n, dtype=s.dtype, device=s.device)
        return torch.cos(s.unsqueeze(-1) * p * math.pi)
    cols = [torch.ones_like(s)]
    if n > 1:
        cols.append(s.clone())
    for p in range(1, n - 1):
        if kind == "legendre":
            cols.append(((2 * p + 1) * s * cols[p] - p * cols[p - 1]) / (p + 1))
        else:
            cols.append(2 * s * cols[p] - cols[p - 1])
    return torch.stack(cols, dim=-1)


class TimeBasis(Control):
    r"""A control smooth in time: coefficients of a Legendre, Chebyshev or cosine basis.

    Args:
        coefficients: tensor of shape ``(P, *shape)``: :math:`c_0, \dots, c_{P-1}`; becomes
            a ``Parameter`` (trainable unless ``requires_grad=False``).
        t0, t1: the time interval :math:`[t_0, t_1]` the basis lives on.
        basis: ``"legendre"`` (default), ``"chebyshev"`` or ``"cosine"``.
        axes: spatial domain of each trailing dimension (see :class:`Control`).
        positive: the control is :math:`\exp(\sum_p c_p \varphi_p)` (log-parametrised, for
            :math:`\sigma_2 > 0`).
        requires_grad: whether the coefficients are trained.

    Evaluating outside :math:`[t_0, t_1]` raises.
    """

    def __init__(
        self,
        coefficients: Tensor,
        *,
        t0: float = 0.0,
        t1: float = 1.0,
        basis: str = "legendre",
        axes=(),
        positive: bool = False,
        requires_grad: bool = True,
    ):
        super().__init__(axes)
        c = _check_values(coefficients, "TimeBasis.coefficients")
        if c.dim() < 1 or c.shape[0] < 1:
            raise ValueError(
                "TimeBasis.coefficients: expected shape (n_modes, *shape) with n_modes >= 1, "
                f"got {tuple(c.shape)}"
            )
        self._check_per_row(c, "TimeBasis")
        check_choice(basis, BASES, "TimeBasis.basis")
        self._set_interval(t0, t1, "TimeBasis")
        self.basis = basis
        self.positive = bool(positive)
        self.n_modes = int(c.shape[0])
        self.coefficients = nn.Parameter(c.detach().clone(), requires_grad=requires_grad)

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.coefficients.shape[1:])

    def argument(self, t) -> float:
        """The basis argument :math:`s(t)`; raises outside :math:`[t_0, t_1]`."""
        t = _time_of(t)
        r = (t - self.t0) / (self.t1 - self.t0)
        if r < -_END_TOL or r > 1 + _END_TOL:
            raise ValueError(
                f"control evaluated at t = {t:g}, outside its time interval [{self.t0:g}, {self.t1:g}]"
            )
        r = min(max(r, 0.0), 1.0)
        lo, hi = BASES[self.basis]
        return lo + (hi - lo) * r

    def forward(self, t, grid=None) -> Tensor:
        c = self.coefficients
        s = torch.tensor(self.argument(t), dtype=torch.float64)
        phi = basis_matrix(self.basis, s, self.n_modes).to(dtype=c.dtype, device=c.device)
        v = torch.tensordot(phi, c, dims=1)
        return v.exp() if self.positive else v

    def validate(self, grid, name: str = "control") -> None:
        self.check_grid(self.shape, grid, name)

    def extra_repr(self) -> str:
        return (f"basis={self.basis!r}, n_modes={self.n_modes}, shape={self.shape}, "
                f"t=[{self.t0:g}, {self.t1:g}]" + self._repr_flags())
