"""Named discretisations that recover known architectures."""

from .continuous import ContinuousTransformer
from .paper import PaperTransformer, paper_scheme

__all__ = ["PaperTransformer", "paper_scheme", "ContinuousTransformer"]
