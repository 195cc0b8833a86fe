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
Hugging Face).  With ``eos_token_id`` (one id or several), a finished sequence is continued
with ``pad_token_id`` (default: the first eos id) and generation stops once every sequence
has finished; ``max_new_tokens`` is a bound, not an allocation (the buffers grow by
doubling), so a large one with an eos costs only the tokens generated.

**Hugging Face's defaults.**  A model with ``generation_defaults`` (a converted Hugging
Face model: its generation config's ``eos_token_id`` and ``pad_token_id``) generates as
HF's ``generate`` does when the arguments are not given: it stops at the model's eos (an
id outside the vocabulary can never be generated, and is dropped, as it never stops HF's),
and, without ``attention_mask``, infers the mask from ``pad_token_id`` as HF does — the
tokens equal to it are padding when it occurs in the prompts and is not an eos id
(otherwise no padding).  ``eos_token_id=None`` / ``pad_token_id=None`` passed explicitly
mean none, as in HF.

**Cost of one decode step** with the cache, context length :math:`n`, per layer: the
projections and the feed-forward of one token (independent of :math:`n`) plus the attention
of one query against :math:`n` cached keys — :math:`O(n\,d)` per head for softmax attention,
:math:`O(D \log^2 n)` for causal sliced attention (sorted runs,
:mod:`opsplit.functional.sliced_runs`); the softmax cache's append writes the new keys and
values in place (amortised :math:`O(d)`; buffers of geometric capacity).  Without the cache a
step is a full forward pass, :math:`O(n^2 d)` attention and :math:`n` feed-forward
evaluations per layer.

**Checks once per call.**  Every argument, the prompt (ids in range, the mask, the
positions against a learned table, including the ``max_new_tokens`` it will reach), every
parameter of the model (finite, named by its qualified name, read afresh at every call: a
NaN in the embedding row of a token the prompt does not use, or one written through
``.data``, is refused before the first step) and the grid with every operator's controls
are checked before any compute, at the first step (the prompt).  An empty batch is refused
(``input_ids: empty batch``).  The later steps feed tokens the model produced,
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

from ..operators import KVCache
from ._decoding import (
    MIN_TEMPERATURE,
    MODEL_DEFAULT,
    _grow,
    _prepare,
    select_next_token,
    token_probs,
)

__all__ = ["generate", "select_next_token", "token_probs", "MODEL_DEFAULT", "MIN_TEMPERATURE"]


@torch.no_grad()
def generate(model, input_ids: Tensor, max_new_tokens: int, *, do_sample: bool = False, temperature: float = 1.0,
             top_k: int | None = None, top_p: float | None = None, generator: torch.Generator | None = None,
             attention_mask: Tensor | None = None, use_cache: bool = True, eos_token_id=MODEL_DEFAULT,
             pad_token_id=MODEL_DEFAULT, n_steps: int | None = None, solver: str | None = None,
             scheme: str | None = None, draft=None, num_draft_tokens="auto",
             draft_confidence: float | None = None) -> Tensor:
    """Continue every prompt of ``input_ids`` ``(B, N)`` by up to ``max_new_tokens`` tokens;
    returns ``(B, N + generated)`` (prompt, then the new tokens), as Hugging Face's
    ``generate`` does.

    Args:
        model: a causal decoder (see the module docstring).
        input_ids: integer prompt ids ``(B, N)``, ``N >= 1``, left-padded in a batch.
        max_new_tokens: how many tokens to append at most (``>= 0``; a bound: memory grows
            with the tokens generated).
        do_sample: sample (``True``) or take the most likely token (``False``).
        temperature, top_k, top_p: sampling warpers (``temperature >= 1.2e-38``, float32's
            smallest normal number; ``top_k >= 0``, ``0`` or ``None`` off; ``0 < top_p <= 1``).
        generator: ``torch.Generator`` for the draws (``None``: the global generator).
        attention_mask: ``(B, N)`` of 0/1 (0 = padding), or ``None`` (no padding, or the
            padding inferred from ``pad_token_id`` as Hugging Face does: module docstring).
        use_cache: keep a :class:`~opsplit.operators.KVCache` (one decode step per token);
            ``False`` recomputes the sequence at every step.
        eos_token_id: stop a sequence at this token (or at any of a list of them); default:
            the model's ``generation_defaults`` (a converted HF model's generation config),
            else none; ``None``: never stop early.
        pad_token_id: continue a stopped sequence with this token (default: the model's, else
            the first eos id); without ``attention_mask``, the padding of the prompts.
        n_steps: solve the decoder with this :math:`N_t` (``None``: the model's own); the
            controls are functions of time, so a model trained at one :math:`N_t` generates
            at another (every step of one generation uses the same :math:`N_t`).
        solver, scheme: solve the decoder with another substep solver (``"euler"``,
            ``"heun"``, ``"rk4"``) or splitting (``"lie"``, ``"strang"``, ``"parallel"``)
            (:meth:`DecoderLM.solve_scheme <opsplit.models.DecoderLM.solve_scheme>`; ``None``:
            the model's own).
        draft, num_draft_tokens, draft_confidence: self-speculative decoding (a :class:`DecoderLM`): a cheaper
            solve of the same model proposes tokens that this solve verifies, with the same
            output (greedy) or the same distribution (sampling);
            :func:`opsplit.models.speculative.speculative_generate`.
    """
    if draft is not None:
        from .speculative import speculative_generate

        return speculative_generate(
            model, input_ids, max_new_tokens, draft=draft, num_draft_tokens=num_draft_tokens, do_sample=do_sample,
            temperature=temperature, top_k=top_k, top_p=top_p, generator=generator, attention_mask=attention_mask,
            use_cache=use_cache, eos_token_id=eos_token_id, pad_token_id=pad_token_id, n_steps=n_steps,
            solver=solver, scheme=scheme, draft_confidence=draft_confidence).sequences
    if draft_confidence is not None:
        raise ValueError("draft_confidence: a threshold for the drafts of speculative decoding; expected draft= "
                         "(the draft solve) with it")
    st = _prepare(model, input_ids, max_new_tokens, do_sample=do_sample, temperature=temperature, top_k=top_k,
                  top_p=top_p, generator=generator, attention_mask=attention_mask, use_cache=use_cache,
                  eos_token_id=eos_token_id, pad_token_id=pad_token_id, n_steps=n_steps, solver=solver,
                  scheme=scheme)
    B, N, mask, position_ids, eos, pad_token_id, kw = st.B, st.N, st.mask, st.position_ids, st.eos, \
        st.pad_token_id, st.kw
    device = input_ids.device
    # the sequence, its mask, padding and positions, written as tokens are chosen, in buffers
    # that grow by doubling: max_new_tokens is a bound (an eos may stop every sequence early)
    total = N + max_new_tokens
    cap = N + min(max_new_tokens, max(N, 64))
    seq, mask_all, pos_all = _grow(input_ids, cap), _grow(mask, cap), _grow(position_ids, cap)
    padding = None if bool(mask.all()) else _grow(mask == 0, cap)
    eos_ids = torch.tensor(eos, dtype=input_ids.dtype, device=device) if eos else None
    cache = KVCache() if use_cache else None
    decode = None
    unfinished = torch.ones(B, dtype=torch.long, device=device)
    n = N
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
        nxt = select_next_token(logits, do_sample=do_sample, temperature=temperature, top_k=top_k, top_p=top_p,
                                generator=generator)
        if eos_ids is not None:
            nxt = nxt * unfinished + pad_token_id * (1 - unfinished)
        if n == seq.shape[1]:
            cap = min(total, 2 * cap)
            seq, mask_all, pos_all = _grow(seq, cap), _grow(mask_all, cap), _grow(pos_all, cap)
            padding = None if padding is None else _grow(padding, cap)
        seq[:, n], mask_all[:, n], pos_all[:, n] = nxt, 1, pos_all[:, n - 1] + 1
        if padding is not None:
            padding[:, n] = False
        n += 1
        if eos_ids is not None:
            unfinished = unfinished & (~torch.isin(nxt, eos_ids)).long()
            if not bool(unfinished.any()):
                break
    return seq if n == seq.shape[1] else seq[:, :n].clone()
