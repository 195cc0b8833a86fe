"""Splitting schemes: *in what order* (one scheme per file, each declares its order)."""

from .base import Scheme
from .lie import Lie

__all__ = ["Scheme", "Lie"]
