r"""Controls :math:`\theta(t)` (paper 002, eq. 8): *with what* the operators move :math:`u`."""

from .base import Control
from .basis import CosineSeries
from .constant import Constant, as_control
from .layerwise import LayerwiseConstant
from .piecewise import PiecewiseConstant
from .piecewise_linear import PiecewiseLinear
from .polynomial import PolynomialSeries
from .position_table import PositionTable
from .reference_grid import OnReferenceGrid
from .refine import PieceAverage, prolong, prolongation_matrix, restrict, restriction_matrix
from .time_basis import TimeBasis, basis_matrix
from .timepoints import LeftLimit, is_left_limit

__all__ = [
    "Control",
    "as_control",
    "PiecewiseConstant",
    "LayerwiseConstant",
    "Constant",
    "CosineSeries",
    "PiecewiseLinear",
    "TimeBasis",
    "basis_matrix",
    "PolynomialSeries",
    "PositionTable",
    "OnReferenceGrid",
    "LeftLimit",
    "is_left_limit",
    "prolong",
    "restrict",
    "prolongation_matrix",
    "restriction_matrix",
    "PieceAverage",
]
