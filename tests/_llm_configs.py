"""Random seeded Hugging Face decoder configurations for the tests of opsplit's decoder-only
models (GPT-2, Llama, Qwen2, Mistral), built from configs only (no download): the cases live
in :mod:`opsplit.analysis.hf_cases` (benchmarks/llm.py --exactness reads the same ones);
here the tests' transformers 4.x view of a config."""

from __future__ import annotations

transformers = __import__("pytest").importorskip("transformers")

from opsplit.analysis.hf_cases import (  # noqa: E402, F401 (re-exported for the tests)
    BASE,
    CAUSAL_LM,
    CONFIG,
    build,
    gpt2_config,
    left_padded,
    llama_config,
    mistral_config,
    qwen2_config,
)


class _Config4x:
    """A transformers 4.x view of a 5.x config: ``rope_theta`` and ``rope_scaling`` (and any
    other ``extra`` attribute) as 4.x configs have them, no ``rope_parameters``; every other
    attribute read from the wrapped config."""

    def __init__(self, cfg, rope_scaling=None, **extra):
        rp = getattr(cfg, "rope_parameters", None)
        theta = rp["rope_theta"] if rp is not None else cfg.rope_theta
        self.__dict__.update({"_cfg": cfg, "rope_theta": theta, "rope_scaling": rope_scaling, **extra})

    def __getattr__(self, name):
        if name == "rope_parameters":
            raise AttributeError(name)
        return getattr(self.__dict__["_cfg"], name)


def as_4x(hf, **kw):
    """``hf`` with its decoder's config seen as transformers 4.x writes it."""
    base = hf.model if hasattr(hf, "model") else hf
    base.config = _Config4x(base.config, **kw)
    return hf
