r"""What generation and speculative decoding share (:mod:`opsplit.models.generate`,
:mod:`opsplit.models.speculative`): the checks of their arguments, the model and the prompt,
the token selection (:func:`select_next_token`, :func:`token_probs`) and the growing buffers.
A module of its own so that the two import it and not each other."""

from __future__ import annotations

import torch
from torch import Tensor

from .._checks import check_parameters_finite, check_positive_float, check_positive_int

__all__ = ["select_next_token", "token_probs", "MODEL_DEFAULT", "MIN_TEMPERATURE"]


class _ModelDefault:
    """The default of ``eos_token_id`` / ``pad_token_id``: the model's own (:mod:`opsplit.models.generate`)."""

    def __repr__(self) -> str:
        return "MODEL_DEFAULT"


#: "the model's generation default" (``generation_defaults``; ``None`` for a model without)
MODEL_DEFAULT = _ModelDefault()
#: the smallest sampling temperature: the scores are divided by it in float32
MIN_TEMPERATURE = torch.finfo(torch.float32).tiny


def _check_int(v, name: str, lo: int) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < lo:
        raise ValueError(f"{name}: expected an integer >= {lo}, got {v!r}")
    return v


def _is_id(v) -> bool:
    return not isinstance(v, bool) and isinstance(v, int)


def _check_token(v, name: str, vocab: int):
    if v is None:
        return None
    if not _is_id(v) or not 0 <= v < vocab:
        raise ValueError(f"{name}: expected None or a token id in [0, {vocab - 1}], got {v!r}")
    return v


def _check_eos(v, vocab: int, default: bool) -> list:
    """The eos ids as a list (empty: none): one id or a list/tuple of ids in the vocabulary;
    a model default outside the vocabulary is dropped (it can never be generated)."""
    if v is None:
        return []
    ids = list(v) if isinstance(v, (list, tuple)) else [v]
    if not ids or not all(_is_id(i) for i in ids):
        raise ValueError(f"eos_token_id: expected None, a token id or a list of token ids, got {v!r}"
                         + (" (the model's generation config)" if default else ""))
    if default:
        return [i for i in ids if 0 <= i < vocab]
    for i in ids:
        _check_token(i, "eos_token_id", vocab)
    return ids


def _grow(x: Tensor, capacity: int) -> Tensor:
    """A buffer ``(B, capacity)`` starting with ``x`` ``(B, n)``."""
    out = x.new_empty(x.shape[0], capacity)
    out[:, : x.shape[1]] = x
    return out


def select_next_token(logits: Tensor, *, do_sample: bool = False, temperature: float = 1.0, top_k: int | None = None,
                      top_p: float | None = None, generator: torch.Generator | None = None) -> Tensor:
    """The next token of every sequence from last-position logits ``(B, vocab)``
    (:mod:`opsplit.models.generate`: float32 scores, temperature, top-k, top-p, multinomial;
    or argmax)."""
    if not do_sample:
        return torch.argmax(logits.to(dtype=torch.float32, copy=True), dim=-1)
    probs = token_probs(logits, temperature=temperature, top_k=top_k, top_p=top_p)
    return torch.multinomial(probs, num_samples=1, generator=generator).squeeze(1)


def token_probs(logits: Tensor, *, temperature: float = 1.0, top_k: int | None = None,
                top_p: float | None = None) -> Tensor:
    """The sampling distribution of :func:`select_next_token`: ``softmax`` of the float32
    scores after the temperature, top-k and top-p (:mod:`opsplit.models.generate`), for
    logits ``(..., vocab)`` (every leading index a distribution of its own)."""
    shape = logits.shape
    logits = logits.reshape(-1, shape[-1])
    scores = logits.to(dtype=torch.float32, copy=True)
    if temperature != 1.0:
        scores = scores / temperature
        if temperature < 1.0 and not bool(torch.isfinite(scores).all()) and bool(torch.isfinite(logits).all()):
            raise ValueError(
                f"temperature: {temperature:g} makes the float32 scores logits / temperature overflow (largest "
                f"|logit| {float(logits.abs().max()):g}); use a larger temperature, or do_sample=False for the "
                "most likely token"
            )
    if top_k is not None and top_k != 0:
        k = min(top_k, scores.shape[-1])
        scores = scores.masked_fill(scores < torch.topk(scores, k)[0][..., -1, None], float("-inf"))
    if top_p is not None and top_p < 1.0:
        sorted_logits, sorted_indices = torch.sort(scores, descending=False)
        cumulative = sorted_logits.softmax(dim=-1).cumsum(dim=-1)
        remove = cumulative <= (1 - top_p)
        remove[..., -1:] = 0
        scores = scores.masked_fill(remove.scatter(1, sorted_indices, remove), float("-inf"))
    return torch.softmax(scores, dim=-1).reshape(shape)


class _Setup:
    """What :func:`generate` and speculative decoding check and make before the first step."""

    __slots__ = ("B", "N", "mask", "position_ids", "eos", "pad_token_id", "kw")


def _prepare(model, input_ids, max_new_tokens, *, do_sample, temperature, top_k, top_p, generator, attention_mask,
             use_cache, eos_token_id, pad_token_id, n_steps, solver, scheme, new_tokens_cached=None):
    """Every check of :func:`generate`'s arguments, the prompt and the model, before any
    compute (:mod:`opsplit.models.generate`); returns a :class:`_Setup`.  ``new_tokens_cached``: how many
    tokens past the prompt the cache certainly holds (default: every new token but the last
    when no eos can stop the generation early)."""
    s = _Setup()
    max_new_tokens = _check_int(max_new_tokens, "max_new_tokens", 0)
    if not isinstance(do_sample, bool):
        raise TypeError(f"do_sample: expected a bool, got {type(do_sample).__name__}")
    if not isinstance(use_cache, bool):
        raise TypeError(f"use_cache: expected a bool, got {type(use_cache).__name__}")
    temperature = check_positive_float(temperature, "temperature")
    if do_sample and temperature < MIN_TEMPERATURE:
        raise ValueError(f"temperature: expected at least {MIN_TEMPERATURE:.3g} (float32's smallest normal number: "
                         f"the float32 scores are divided by it), got {temperature!r}; use do_sample=False for the "
                         "most likely token")
    if top_k is not None:
        _check_int(top_k, "top_k", 0)
    if top_p is not None:
        top_p = float(top_p)
        if not 0.0 < top_p <= 1.0:
            raise ValueError(f"top_p: expected 0 < top_p <= 1, got {top_p}")
    if generator is not None and not isinstance(generator, torch.Generator):
        raise TypeError(f"generator: expected a torch.Generator or None, got {type(generator).__name__}")
    if n_steps is not None:
        n_steps = check_positive_int(n_steps, "n_steps (N_t)")
    if not (hasattr(model, "check_inputs") and hasattr(model, "next_token_logits")):
        raise TypeError(f"generate: model: expected an opsplit causal decoder (DecoderLM, TokenClassifier), "
                        f"got {type(model).__name__}")
    kw = {} if n_steps is None else {"n_steps": n_steps}  # N_t of the solve (None: the model's)
    if solver is not None or scheme is not None:
        if not hasattr(model, "solve_scheme"):
            raise TypeError(f"solver: solving with another solver or scheme needs a DecoderLM, got "
                            f"{type(model).__name__}")
        model.solve_scheme(solver, scheme)  # the names, checked before any compute
        kw.update(solver=solver, scheme=scheme)
    vocab = model.vocab_size
    defaults = getattr(model, "generation_defaults", None) or {}
    eos_default, pad_default = eos_token_id is MODEL_DEFAULT, pad_token_id is MODEL_DEFAULT
    eos = _check_eos(defaults.get("eos_token_id") if eos_default else eos_token_id, vocab, eos_default)
    pad_token_id = defaults.get("pad_token_id") if pad_default else pad_token_id
    if pad_default and pad_token_id is not None and eos and not (_is_id(pad_token_id) and 0 <= pad_token_id < vocab):
        raise ValueError(f"pad_token_id: the model's generation config gives {pad_token_id!r}, not a token id in "
                         f"[0, {vocab - 1}], and stopped sequences are continued with it; pass pad_token_id")
    if not pad_default:
        pad_token_id = _check_token(pad_token_id, "pad_token_id", vocab)
    if attention_mask is None and pad_token_id is not None and pad_token_id not in eos and \
            isinstance(input_ids, Tensor) and input_ids.dim() == 2 and not input_ids.is_floating_point() and \
            bool((input_ids == pad_token_id).any()):
        attention_mask = (input_ids != pad_token_id).long()  # Hugging Face's inferred padding
    if isinstance(input_ids, Tensor) and input_ids.dim() == 2 and input_ids.shape[0] == 0:
        raise ValueError(f"input_ids: empty batch (shape {tuple(input_ids.shape)}): expected at least one prompt")
    _, mask = model.check_inputs(input_ids, attention_mask)
    if isinstance(model, torch.nn.Module):
        # every parameter, read now (fresh: also one written through .data, which changes no version
        # counter), named by its qualified name: the decode steps run no checks, and a NaN in the
        # embedding row of a token the prompt does not use would surface only once it is generated
        check_parameters_finite(model, type(model).__name__, fresh=True)
    guard = getattr(model, "check_cache_memory", None)
    if use_cache and guard is not None:
        # the cache certainly holds the prompt, and every new token but the last when no eos can stop
        # the generation early; the decode kernels are made after the first token
        new = new_tokens_cached if new_tokens_cached is not None else 0 if eos else max(0, max_new_tokens - 1)
        name = "n_steps (N_t)" if n_steps is not None else "max_new_tokens" if new else "input_ids"
        extra = {k: v for k, v in kw.items() if k != "n_steps"}
        guard(name, input_ids.shape[0], input_ids.shape[1] + new, n_steps, decode=max_new_tokens > 1, **extra)
    if pad_token_id is None and eos:
        pad_token_id = eos[0]
    B, N = input_ids.shape
    device = input_ids.device
    mask = torch.ones(B, N, dtype=torch.long, device=device) if mask is None else mask.long()
    position_ids = (mask.cumsum(-1) - 1).masked_fill(mask == 0, 0)
    limit = getattr(model, "max_positions", None)
    if limit is not None and max_new_tokens and int(position_ids[:, -1].max()) + max_new_tokens > limit:
        raise ValueError(
            f"max_new_tokens: a prompt of {int(position_ids[:, -1].max()) + 1} positions plus {max_new_tokens} new "
            f"tokens exceeds the model's learned positions (max_positions = {limit})"
        )
    s.B, s.N, s.mask, s.position_ids, s.eos, s.pad_token_id, s.kw = B, N, mask, position_ids, eos, pad_token_id, kw
    return s


