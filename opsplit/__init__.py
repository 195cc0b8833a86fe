"""opsplit: continuous-time operator splitting for transformers.

A transformer is an operator-splitting discretisation of a continuous
integro-differential equation on Omega_x x Omega_y x (0, T] (Tai, Liu, Li, Chan,
eq. 7).  opsplit's pieces, in the order data flows through them:

- :mod:`opsplit.grid`       where: grids, quadrature, resampling
- :mod:`opsplit.controls`   with what: controls theta(t)
- :mod:`opsplit.operators`  what moves u: the terms of the equation
- :mod:`opsplit.solvers`    how one substep is advanced
- :mod:`opsplit.schemes`    in what order: splitting schemes
- :mod:`opsplit.adaptive`   step control: adaptive time steps (error estimate, PI controller)
- :class:`opsplit.Propagator`  the composed map f -> u(T); ``solve`` returns a Solution with statistics
  (fixed or adaptive steps; :class:`opsplit.AdaptivePropagator`)
- :mod:`opsplit.models`     named discretisations (the paper's transformer, ...)
- :mod:`opsplit.functional` attention kernels as functions (sliced ReLU, ReLU-bump, kernel)
- :mod:`opsplit.analysis`   measuring: convergence orders, plots
- :mod:`opsplit.reference`  the unsplit continuous-time solution

The subpackages and names below are imported on first use (PEP 562), so that
``import opsplit`` (and the ``opsplit`` command's start, which sets torch's thread count
before torch is loaded: :mod:`opsplit.cli.threads`) does not import torch by itself.
"""

import importlib
from typing import TYPE_CHECKING

__version__ = "0.1.0"

_SUBPACKAGES = ("adaptive", "analysis", "controls", "functional", "grid", "models", "operators", "reference",
                "schemes", "solvers")
_NAMES = {"Grid": "grid", "ImageGrid": "grid", "Interval": "grid", "Propagator": "propagator",
          "AdaptivePropagator": "propagator"}

if TYPE_CHECKING:  # pragma: no cover - for type checkers and IDEs
    from . import (
        adaptive,
        analysis,
        controls,
        functional,
        grid,
        models,
        operators,
        reference,
        schemes,
        solvers,
    )
    from .grid import Grid, ImageGrid, Interval
    from .propagator import AdaptivePropagator, Propagator


def __getattr__(name: str):
    if name in _SUBPACKAGES:
        return importlib.import_module(f"{__name__}.{name}")
    if name in _NAMES:
        value = getattr(importlib.import_module(f"{__name__}.{_NAMES[name]}"), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(__all__))


__all__ = [
    "Grid",
    "ImageGrid",
    "Interval",
    "Propagator",
    "AdaptivePropagator",
    "adaptive",
    "analysis",
    "controls",
    "functional",
    "grid",
    "models",
    "operators",
    "reference",
    "schemes",
    "solvers",
]
