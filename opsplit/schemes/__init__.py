"""Splitting schemes: *in what order* (one scheme per file, each declares its order)."""

from .base import Scheme
from .blanes_moan import BlanesMoan
from .composition import Composition
from .hybrid import Hybrid
from .lie import Lie
from .nested import SchemeFlow
from .parallel import Parallel, ScaledOperator
from .relaxation import Relaxation
from .stages import Schedule, Stage, Stages
from .strang import Strang
from .yoshida import TripleJump

__all__ = [
    "Scheme",
    "Lie",
    "Strang",
    "Parallel",
    "Hybrid",
    "ScaledOperator",
    "Relaxation",
    "Stage",
    "Stages",
    "Schedule",
    "Composition",
    "TripleJump",
    "BlanesMoan",
    "SchemeFlow",
]
