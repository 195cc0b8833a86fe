"""Named discretisations that recover known architectures."""

from .paper import PaperTransformer, paper_scheme

__all__ = ["PaperTransformer", "paper_scheme"]
