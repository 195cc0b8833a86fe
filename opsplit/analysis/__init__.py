"""Measuring: convergence orders in time and space, seeded test problems, plots."""

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
]
