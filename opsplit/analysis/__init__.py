"""Measuring: convergence orders in time and space, seeded test problems, plots; spline
degree of ReLU networks along a line (a trained model's continuity, the solver-swap test, is
:func:`opsplit.control.continuity`: it evaluates through the training objective)."""

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
from .metrics import relative_l2
from .ngram import NGram
from .problems import SmoothTransformer, smooth_transformer
from .spline import DegreeEstimate, finite_difference, line, piecewise_degree, relu_sign_patterns

__all__ = [
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
    "relative_l2",
    "NGram",
]
