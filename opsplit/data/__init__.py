"""Datasets that ship or are generated (nothing is downloaded): pairs of tensors
:class:`TensorData`, scikit-learn's bundled digits, and the periodic sequences of seed 001."""

from .base import TensorData
from .digits import load_digits, random_shift
from .periodic import FUNCTIONS, TABLE1_MSE, PeriodicTask, periodic_series, periodic_task, rollout

__all__ = ["TensorData", "load_digits", "random_shift", "FUNCTIONS", "TABLE1_MSE", "PeriodicTask", "periodic_series",
           "periodic_task", "rollout"]
