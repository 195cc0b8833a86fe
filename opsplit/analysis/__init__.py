"""Analysis: measuring the models (spline degree of ReLU networks along a line, ...)."""

from .spline import DegreeEstimate, finite_difference, line, piecewise_degree, relu_sign_patterns

__all__ = ["DegreeEstimate", "finite_difference", "line", "piecewise_degree", "relu_sign_patterns"]
