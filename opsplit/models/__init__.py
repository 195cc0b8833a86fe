"""Named discretisations that recover known architectures."""

from .attention_operator import AttentionNeuralOperator
from .continuous import ContinuousTransformer
from .convert import from_torch, load_torch_state_dict, to_torch, torch_state_dict
from .cvt import CvT, CvTOutput, CvtReadout, CvtStageSpec, build_cvt, one_head_cvt
from .cvt_hf import cvt_from_hf
from .decoder_lm import DecoderConfig, DecoderLM, DecoderOutput
from .hf import from_hf, hf_converters, register_hf_converter
from .hf_decoders import hf_state_dict, to_hf
from .integral_patch import IntegralPatchEmbedding, OnPixelGrid, PixelQuadrature
from .neural_operator import NeuralOperatorTransformer
from .paper import PaperTransformer, paper_scheme
from .split_encoder import (
    CONTROL_KINDS,
    SCHEMES,
    ImageClassifier,
    SequenceForecaster,
    SplitEncoder,
    convert_time_controls,
)
from .token_decoder import ATTENTIONS, AttentionDecoder, TokenClassifier
from .torch_exact import (
    LayerConfig,
    TorchDecoder,
    TorchEncoder,
    decoder_layer_scheme,
    encoder_layer_scheme,
)
from .vit import ClassTokenReadout, PatchEmbedding, ViT, ViTOutput

__all__ = [
    "PaperTransformer",
    "paper_scheme",
    "ContinuousTransformer",
    "TorchEncoder",
    "TorchDecoder",
    "LayerConfig",
    "encoder_layer_scheme",
    "decoder_layer_scheme",
    "from_torch",
    "to_torch",
    "torch_state_dict",
    "load_torch_state_dict",
    "ViT",
    "ViTOutput",
    "PatchEmbedding",
    "ClassTokenReadout",
    "CvT",
    "CvTOutput",
    "CvtReadout",
    "CvtStageSpec",
    "build_cvt",
    "cvt_from_hf",
    "one_head_cvt",
    "from_hf",
    "register_hf_converter",
    "hf_converters",
    "SplitEncoder",
    "ImageClassifier",
    "SequenceForecaster",
    "convert_time_controls",
    "SCHEMES",
    "CONTROL_KINDS",
    "ATTENTIONS",
    "AttentionDecoder",
    "TokenClassifier",
    "DecoderConfig",
    "DecoderLM",
    "DecoderOutput",
    "to_hf",
    "hf_state_dict",
    "NeuralOperatorTransformer",
    "AttentionNeuralOperator",
    "IntegralPatchEmbedding",
    "PixelQuadrature",
    "OnPixelGrid",
]
