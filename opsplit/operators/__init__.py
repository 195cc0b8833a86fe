"""Operators: the terms of the continuous model, *what moves u* (one operator per file)."""

from .attention import SoftmaxAttention
from .base import Operator
from .ffn import FFNIntegral
from .kernel_attention import KernelAttention
from .layernorm import ProjectionS1, project_s1
from .relaxation import Relaxation
from .relu import ProjectionS2
from .sliced_attention import SlicedReLUAttention, SlicedReLUBumpAttention

__all__ = [
    "Operator",
    "SoftmaxAttention",
    "ProjectionS1",
    "project_s1",
    "ProjectionS2",
    "FFNIntegral",
    "Relaxation",
    "SlicedReLUAttention",
    "SlicedReLUBumpAttention",
    "KernelAttention",
]
