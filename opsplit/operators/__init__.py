"""Operators: the terms of the continuous model, *what moves u* (one operator per file)."""

from .activation import ACTIVATIONS, Activation
from .affine import PointwiseAffine
from .attention import SoftmaxAttention
from .base import Operator
from .batchnorm import BatchNormMap
from .context import ContextGrid
from .conv_attention import ConvAttention
from .convolution import ContinuousKernel, Convolution2d
from .dropout import FieldDropout
from .droppath import DropPath, FieldDropPath, StateDropout
from .feedforward import FeedForward
from .ffn import FFNIntegral
from .field_sum import FieldSum
from .fourier_attention import FourierAttention
from .fourier_multiplier import FourierMultiplier
from .galerkin_attention import GalerkinAttention
from .gated_ffn import GatedFeedForward
from .grouped_attention import GroupedQueryAttention
from .kernel_attention import KernelAttention
from .kv_cache import KVCache
from .layernorm import ProjectionS1, project_s1
from .lifting import Lifting, Projection, periodic_positions
from .multihead import MultiHeadAttention
from .prenorm import PreNorm
from .relu import ProjectionS2
from .relu_attention import ReLUAttention
from .rmsnorm import ProjectionSphere, project_sphere
from .rope import RotaryEmbedding
from .sliced_attention import SlicedReLUAttention, SlicedReLUBumpAttention
from .spectral_convolution import SpectralConvolution
from .spectral_gated_ffn import SpectralGatedFeedForward
from .transfer import ConvTransfer, GridTransfer, PrependTokens

__all__ = [
    "Operator",
    "SoftmaxAttention",
    "ProjectionS1",
    "project_s1",
    "ProjectionS2",
    "FFNIntegral",
    "SlicedReLUAttention",
    "SlicedReLUBumpAttention",
    "KernelAttention",
    "MultiHeadAttention",
    "ReLUAttention",
    "ContextGrid",
    "PointwiseAffine",
    "Activation",
    "ACTIVATIONS",
    "FeedForward",
    "PreNorm",
    "FieldDropout",
    "ContinuousKernel",
    "Convolution2d",
    "GridTransfer",
    "ConvTransfer",
    "PrependTokens",
    "BatchNormMap",
    "ConvAttention",
    "DropPath",
    "FieldDropPath",
    "StateDropout",
    "ProjectionSphere",
    "project_sphere",
    "RotaryEmbedding",
    "GatedFeedForward",
    "GroupedQueryAttention",
    "KVCache",
    "GalerkinAttention",
    "FourierAttention",
    "SpectralConvolution",
    "SpectralGatedFeedForward",
    "FieldSum",
    "Lifting",
    "Projection",
    "FourierMultiplier",
    "periodic_positions",
]


def __getattr__(name: str):
    # `Relaxation` composes substeps (operator, solver): a step of the scheme, so it lives in
    # opsplit.schemes (above the solvers); re-exporting it here would import upward
    if name == "Relaxation":
        raise AttributeError(
            "opsplit.operators.Relaxation moved to opsplit.schemes.Relaxation "
            "(it composes substeps: a step of the scheme, not a term)"
        )
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
