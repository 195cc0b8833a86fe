r"""Autoregressive generation with a key/value cache, for opsplit's causal decoders.

A causal decoder maps a token sequence to next-token logits at every position.  Generation
appends one token at a time: the first call runs the whole prompt (every layer, every
token), and each later call only the new token — the attention terms read the keys and
values of the earlier tokens from a :class:`~opsplit.operators.KVCache` that the call hands
to them through the grid's context (:mod:`opsplit.operators.kv_cache`).  With
``use_cache=False`` every step recomputes the whole sequence (the reference the cache is
tested against).

**Batches of prompts** are left-padded (``attention_mask`` 0 at the pads, as Hugging Face
tokenizers do for decoders): the pads are removed from every key measure, and each
sample's positions start at its first real token, :math:`\xi = \text{cumsum(mask)} - 1`
(pads at 0), continued by one per new token — Hugging Face's ``generate`` convention.

**Token selection** (Hugging Face's order and formulas, applied to the last position's
logits in float32): greedy ``argmax``; or sampling from ``softmax`` after the temperature
(``logits / temperature``), top-k (keep the ``k`` largest, ties kept) and top-p (keep the
smallest set of most likely tokens whose probability exceeds ``top_p``, at least one),
drawn by ``torch.multinomial`` with ``generator`` (``None``: torch's global generator, as
Hugging Face).  With ``eos_token_id``, a finished sequence is continued with
``pad_token_id`` (default ``eos_token_id``) and generation stops once every sequence has
finished.

**Cost of one decode step** with the cache, context length :math:`n`, per layer: the
projections and the feed-forward of one token (independent of :math:`n`) plus the attention
of one query against :math:`n` cached keys — :math:`O(n\,d)` per head for softmax attention,
:math:`O(D \log^2 n)` for causal sliced attention (sorted runs,
:mod:`opsplit.functional.sliced_runs`); the softmax cache's append writes the new keys and
values in place (amortised :math:`O(d)`; buffers of geometric capacity).  Without the cache a step is a full forward pass,
:math:`O(n^2 d)` attention and :math:`n` feed-forward evaluations per layer.

**Checks once per call.**  Every argument, the prompt (ids in range, the mask, the
positions against a learned table, including the ``max_new_tokens`` it will reach), the
parameters (finite) and the grid with every operator's controls are checked before any
compute, at the first step (the prompt).  The later steps feed tokens the model produced,
with the same parameters and positions made here: a model that provides
``decode_steps(cache)`` (:meth:`~opsplit.models.DecoderLM.decode_steps`) runs them without
checks, with its controls evaluated once for the whole generation
(:mod:`opsplit.operators._fused`), and gives the same logits bit for bit; another model is
called with ``check_values=False``.

A model is generated from when it provides ``vocab_size``, ``check_inputs(input_ids,
attention_mask)`` (validation before any compute, returning ``(past, mask)``) and
``next_token_logits(input_ids, attention_mask, position_ids=..., cache=...)`` returning the
last position's logits ``(B, vocab)`` (:class:`~opsplit.models.DecoderLM`, and
:class:`~opsplit.models.TokenClassifier` over a causal :class:`~opsplit.models.AttentionDecoder`).
"""

from __future__ import annotations

import torch
from torch import Tensor

from .._checks import check_positive_float, check_positive_int
from ..operators import KVCache

__all__ = ["generate", "select_next_token"]


def _check_int(v, name: str, lo: int) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < lo:
        raise ValueError(f"{name}: expected an integer >= {lo}, got {v!r}")
    return v


def _check_token(v, name: str, vocab: int):
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v < vocab:
        raise ValueError(f"{name}: expected None or a token id in [0, {vocab - 1}], got {v!r}")
    return v


def select_next_token(logits: Tensor, *, do_sample: bool = False, temperature: float = 1.0, top_k: int | None = None,
                      top_p: float | None = None, generator: torch.Generator | None = None) -> Tensor:
    """The next token of every sequence from last-position logits ``(B, vocab)`` (module
    docstring: float32 scores, temperature, top-k, top-p, multinomial; or argmax)."""
    scores = logits.to(dtype=torch.float32, copy=True)
    if not do_sample:
        return torch.argmax(scores, dim=-1)
    if temperature != 1.0:
        scores = scores / temperature
    if top_k is not None and top_k != 0:
        k = min(top_k, scores.shape[-1])
        scores = scores.masked_fill(scores < torch.topk(scores, k)[0][..., -1, None], float("-inf"))
    if top_p is not None and top_p < 1.0:
        sorted_logits, sorted_indices = torch.sort(scores, descending=False)
        cumulative = sorted_logits.softmax(dim=-1).cumsum(dim=-1)
        remove = cumulative <= (1 - top_p)
        remove[..., -1:] = 0
        scores = scores.masked_fill(remove.scatter(1, sorted_indices, remove), float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    return torch.multinomial(probs, num_samples=1, generator=generator).squeeze(1)


@torch.no_grad()
def generate(model, input_ids: Tensor, max_new_tokens: int, *, do_sample: bool = False, temperature: float = 1.0,
             top_k: int | None = None, top_p: float | None = None, generator: torch.Generator | None = None,
             attention_mask: Tensor | None = None, use_cache: bool = True, eos_token_id: int | None = None,
             pad_token_id: int | None = None, n_steps: int | None = None) -> Tensor:
    """Continue every prompt of ``input_ids`` ``(B, N)`` by up to ``max_new_tokens`` tokens;
    returns ``(B, N + generated)`` (prompt, then the new tokens), as Hugging Face's
    ``generate`` does.

    Args:
        model: a causal decoder (see the module docstring).
        input_ids: integer prompt ids ``(B, N)``, ``N >= 1``, left-padded in a batch.
        max_new_tokens: how many tokens to append (``>= 0``).
        do_sample: sample (``True``) or take the most likely token (``False``).
        temperature, top_k, top_p: sampling warpers (``temperature > 0``; ``top_k >= 0``,
            ``0`` or ``None`` off; ``0 < top_p <= 1``).
        generator: ``torch.Generator`` for the draws (``None``: the global generator).
        attention_mask: ``(B, N)`` of 0/1 (0 = padding), or ``None`` (no padding).
        use_cache: keep a :class:`~opsplit.operators.KVCache` (one decode step per token);
            ``False`` recomputes the sequence at every step.
        eos_token_id, pad_token_id: stop a sequence at ``eos_token_id`` and continue it with
            ``pad_token_id`` (default ``eos_token_id``) until all have stopped.
        n_steps: solve the decoder with this :math:`N_t` (``None``: the model's own); the
            controls are functions of time, so a model trained at one :math:`N_t` generates
            at another (every step of one generation uses the same :math:`N_t`).
    """
    max_new_tokens = _check_int(max_new_tokens, "max_new_tokens", 0)
    if not isinstance(do_sample, bool):
        raise TypeError(f"do_sample: expected a bool, got {type(do_sample).__name__}")
    if not isinstance(use_cache, bool):
        raise TypeError(f"use_cache: expected a bool, got {type(use_cache).__name__}")
    temperature = check_positive_float(temperature, "temperature")
    if top_k is not None:
        top_k = _check_int(top_k, "top_k", 0)
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
    _, mask = model.check_inputs(input_ids, attention_mask)
    vocab = model.vocab_size
    eos_token_id = _check_token(eos_token_id, "eos_token_id", vocab)
    pad_token_id = _check_token(pad_token_id, "pad_token_id", vocab)
    if pad_token_id is None:
        pad_token_id = eos_token_id
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
    # the sequence, its mask and positions for every step, written as tokens are chosen
    total = N + max_new_tokens
    seq = input_ids.new_empty(B, total)
    seq[:, :N] = input_ids
    mask_all = torch.ones(B, total, dtype=torch.long, device=device)
    mask_all[:, :N] = mask
    pos_all = torch.cat([position_ids, position_ids[:, -1:] + torch.arange(1, max_new_tokens + 1, device=device)], -1)
    cache = KVCache() if use_cache else None
    decode = padding = None
    unfinished = torch.ones(B, dtype=torch.long, device=device)
    n = N
    kw = {} if n_steps is None else {"n_steps": n_steps}  # N_t of the solve (None: the model's)
    for step in range(max_new_tokens):
        if decode is not None:
            logits = decode(seq[:, n - 1: n], pos_all[:, n - 1: n], None if padding is None else padding[:, :n])
        elif cache is not None and step > 0:
            logits = model.next_token_logits(seq[:, n - 1: n], mask_all[:, :n], position_ids=pos_all[:, n - 1: n],
                                             cache=cache, check_values=False, **kw)
        else:
            # the parameters and the prompt are checked (finite values included) at the first
            # step; the later steps feed tokens the model produced, with the same parameters
            logits = model.next_token_logits(seq[:, :n], mask_all[:, :n], position_ids=pos_all[:, :n], cache=cache,
                                             check_values=step == 0, **kw)
            if step == 0 and cache is not None and hasattr(model, "decode_steps"):
                # the decode steps, made once: controls evaluated at their times, no checks
                decode = model.decode_steps(cache, **kw)
                padding = None if bool(mask.all()) else mask_all == 0
        nxt = select_next_token(logits, do_sample=do_sample, temperature=temperature, top_k=top_k, top_p=top_p,
                                generator=generator)
        if eos_token_id is not None:
            nxt = nxt * unfinished + pad_token_id * (1 - unfinished)
        seq[:, n] = nxt
        n += 1
        if eos_token_id is not None:
            unfinished = unfinished & (nxt != eos_token_id).long()
            if not bool(unfinished.any()):
                break
    return seq if n == total else seq[:, :n].clone()
