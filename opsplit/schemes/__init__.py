"""Splitting schemes: *in what order* (one scheme per file, each declares its order)."""

from .base import Scheme
from .hybrid import Hybrid
from .lie import Lie
from .parallel import Parallel, ScaledOperator
from .relaxation import Relaxation
from .stages import Schedule, Stage, Stages
from .strang import Strang

__all__ = ["Scheme", "Lie", "Strang", "Parallel", "Hybrid", "ScaledOperator", "Relaxation", "Stage", "Stages", "Schedule"]
