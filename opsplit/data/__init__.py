"""Datasets that ship or are generated (nothing is downloaded): pairs of tensors
:class:`TensorData`, scikit-learn's bundled digits, the periodic sequences of seed 001, and a
long-range retrieval task (recall the flagged symbol), character-level text that ships with
Python (``pydoc_data.topics``, the standard library's sources), and 1-D viscous Burgers' equation
(solved by opsplit's own pseudo-spectral solver, cached on first use), and 2-D Darcy flow with a
two-phase random coefficient (opsplit's finite-difference solver, cached on first use)."""

from .augment import random_affine
from .base import TensorData
from .burgers import BurgersCacheError, load_burgers
from .darcy import DarcyCacheError, load_darcy
from .digits import load_digits, random_shift
from .periodic import (
    FUNCTIONS,
    TABLE1_MSE,
    PeriodicTask,
    input_noise,
    periodic_series,
    periodic_task,
    rollout,
)
from .retrieval import IGNORE, flag_retrieval, retrieval_accuracy, retrieval_loss
from .text import (
    CORPORA,
    CharVocab,
    TextCorpus,
    bits_per_char,
    char_corpus,
    corpus_chars,
    load_text,
    sample_windows,
    text_windows,
)

__all__ = ["TensorData", "load_digits", "random_shift", "random_affine", "FUNCTIONS", "TABLE1_MSE", "PeriodicTask", "periodic_series",
           "periodic_task", "rollout", "input_noise", "IGNORE", "flag_retrieval", "retrieval_loss",
           "retrieval_accuracy", "CORPORA", "CharVocab", "TextCorpus", "load_text", "char_corpus", "sample_windows",
           "text_windows", "bits_per_char", "corpus_chars", "load_burgers", "BurgersCacheError",
           "load_darcy", "DarcyCacheError"]
