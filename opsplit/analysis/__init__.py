"""Measuring: convergence orders in time and space, seeded test problems, plots; spline
degree of ReLU networks along a line; a trained model's continuity (the solver-swap test)."""

from .continuity import Continuity, continuity, solved_with, strang_of
from .convergence import (
    ConvergenceStudy,
    OrderFit,
    fit_order,
    plot_convergence,
    relative_error,
    resample,
    self_convergence,
    spatial_convergence,
    temporal_convergence,
)
from .problems import SmoothTransformer, smooth_transformer
from .spline import DegreeEstimate, finite_difference, line, piecewise_degree, relu_sign_patterns

__all__ = [
    "Continuity",
    "continuity",
    "solved_with",
    "strang_of",
    "ConvergenceStudy",
    "OrderFit",
    "fit_order",
    "plot_convergence",
    "relative_error",
    "resample",
    "self_convergence",
    "spatial_convergence",
    "temporal_convergence",
    "SmoothTransformer",
    "smooth_transformer",
    "DegreeEstimate",
    "finite_difference",
    "line",
    "piecewise_degree",
    "relu_sign_patterns",
]
