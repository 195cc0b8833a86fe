r"""Controls :math:`\theta(t)` (paper 002, eq. 8): *with what* the operators move :math:`u`."""

from .base import Control, as_control
from .basis import CosineSeries
from .piecewise import Constant, PiecewiseConstant

__all__ = ["Control", "as_control", "PiecewiseConstant", "Constant", "CosineSeries"]
