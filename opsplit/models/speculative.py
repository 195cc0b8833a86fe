r"""Self-speculative decoding: a cheaper solve of the same continuous model drafts tokens that
the model's own solve verifies, several at once.

A :class:`~opsplit.models.DecoderLM` is a map of its controls :math:`\theta(t)`; solved with
fewer steps :math:`N_t`, another substep solver or another splitting, it is a cheaper model
of the same flow — the *draft*.  Speculative decoding (Leviathan, Kalman & Matias, *Fast
Inference from Transformers via Speculative Decoding*, ICML 2023; Chen et al., *Accelerating
Large Language Model Decoding with Speculative Sampling*, 2023) turns a cheap draft into exact
speed: every round,

1. the draft solve proposes :math:`k` tokens :math:`d_1, \dots, d_k`, one decode step each,
   with its own key/value cache;
2. the target solve (the model's own, or the ``n_steps``/``solver``/``scheme`` given) runs the
   pending token and the :math:`k` drafts in **one** decode step over :math:`k + 1`
   positions, giving its distributions :math:`p_0, \dots, p_k`;
3. greedy: :math:`d_i` is accepted while it is the target's most likely token,
   :math:`d_i = \arg\max p_{i-1}`; sampling: with probability :math:`\min(1,
   p_{i-1}(d_i)/q_{i-1}(d_i))` (:math:`q` the draft's distribution, after the same
   temperature, top-k and top-p); at the first rejection the target's token is drawn from
   :math:`\mathrm{norm}(\max(0, p - q))`, after :math:`k` acceptances from :math:`p_k`.
   Every round appends the accepted drafts and one token of the target — token for token
   what plain greedy decoding gives, and in distribution what plain sampling gives
   (:func:`speculative_accept`);
4. both caches roll back to the accepted prefix (:meth:`KVCache.rollback
   <opsplit.operators.KVCache.rollback>`: softmax entries keep a shorter length; the sorted
   runs of causal sliced attention undo what the round overwrote and append the kept keys
   again, exactly).

The better the model is continuous — the closer its coarse solves are to its own — the more
drafts are accepted.  A model trained to be right at coarse :math:`N_t` with the controls
averaged over each step (``TrainConfig(coarse_controls="average")``, docs/multilevel.md)
drafts with ``DraftSolve(n_steps, controls="average")``: its draft calls read the pieces'
averages (:func:`opsplit.coarse.coarse_controls`), the target's calls the model's own.  **Cost** per round: :math:`k` draft steps and one target step over
:math:`k+1` tokens (at batch 1, about one target step), for :math:`(1 - \alpha^{k+1})/(1 -
\alpha)` tokens on average at acceptance rate :math:`\alpha`.  ``num_draft_tokens="auto"``
picks :math:`k \le 16` each round maximising that ratio, with :math:`\alpha` a running mean of
the acceptances and the draft's cost relative to the target's (term evaluations per token,
:meth:`DecoderLM.solve_cost <opsplit.models.DecoderLM.solve_cost>`; the verification counted
as one target step), or :math:`k = 0` — plain decoding — where no draft pays (a round of one
draft every :data:`PROBE_EVERY` rounds measures the acceptance again).

**Batches.**  Every row of a batch is judged on its own; a round appends as many positions
as the row that accepted most, and in the other rows the positions past their accepted
prefix become padding (0 in the attention mask, removed from every key measure, their keys
weighted 0 in the sorted runs): each row's tokens are its own plain decoding's.  The returned
sequences are the rows' tokens without that padding: ``(B, N + generated)``, as
:func:`~opsplit.models.generate.generate`.

**Checks**, before any compute, with the arguments of
:func:`~opsplit.models.generate.generate`: ``num_draft_tokens`` (an integer :math:`\ge 1` or
``"auto"``), the draft (a :class:`DraftSolve`, a dict of its fields or an integer
:math:`N_t`; a solve the model can take — :meth:`DecoderLM.solve_scheme
<opsplit.models.DecoderLM.solve_scheme>` — strictly cheaper than the target's, else refused
naming ``draft``), the caches (``cache``/``draft_cache``: empty
:class:`~opsplit.operators.KVCache` objects, two different ones, not filled by another model).
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass, field

import torch
from torch import Tensor

from ..coarse import COARSE_MODES, check_coarse, coarse_controls
from ..operators import KVCache
from ._decoding import MODEL_DEFAULT, _grow, _prepare, token_probs

__all__ = ["DraftSolve", "SpeculativeOutput", "speculative_generate", "speculative_accept", "MAX_DRAFT_TOKENS"]

#: the largest number of draft tokens ``num_draft_tokens="auto"`` chooses
MAX_DRAFT_TOKENS = 16
#: ``num_draft_tokens="auto"`` with no draft paying: rounds of the target alone between two rounds of one draft
PROBE_EVERY = 16
#: a batch of one row without padding runs :func:`_one_row` (the batch loop's rounds with Python bookkeeping)
ONE_ROW_PATH = True


@dataclass(frozen=True)
class DraftSolve:
    """A solve of the model that drafts tokens: :math:`N_t` (``n_steps``), substep ``solver``
    (``"euler"``, ``"heun"``, ``"rk4"``) and ``scheme`` (``"lie"``, ``"strang"``,
    ``"parallel"``); ``None``: the model's own (:meth:`DecoderLM.solve_scheme
    <opsplit.models.DecoderLM.solve_scheme>`)."""

    n_steps: int | None = None
    solver: str | None = None
    scheme: str | None = None
    #: how a draft of fewer steps than the controls' pieces reads them: at each step's times
    #: (``"point"``) or averaged over each step (``"average"``, :func:`opsplit.coarse.coarse_controls`:
    #: for a model trained to be right there, ``TrainConfig(coarse_controls="average")``)
    controls: str = "point"

    def describe(self) -> str:
        parts = [f"N_t = {self.n_steps}" if self.n_steps is not None else "the model's N_t"]
        if self.solver is not None:
            parts.append(f"solver {self.solver}")
        if self.scheme is not None:
            parts.append(f"scheme {self.scheme}")
        if self.controls != "point":
            parts.append(f"controls {self.controls} over each step")
        return ", ".join(parts)


@dataclass
class SpeculativeOutput:
    """What :func:`speculative_generate` returns: the ``sequences`` (as
    :func:`~opsplit.models.generate.generate`), and per round the number of draft tokens
    ``k`` (``draft_lengths``), the draft tokens judged over the batch (``drafted``: per row,
    up to ``k``, fewer where a row needs fewer tokens) and the accepted ones (``accepted``).
    ``target_steps`` counts the target's decode steps (the prompt included), ``draft_steps``
    the draft's."""

    sequences: Tensor
    draft_lengths: list = field(default_factory=list)
    drafted: list = field(default_factory=list)
    accepted: list = field(default_factory=list)
    target_steps: int = 0
    draft_steps: int = 0

    @property
    def rounds(self) -> int:
        return len(self.draft_lengths)

    @property
    def acceptance_rate(self) -> float:
        """Accepted over judged draft tokens (``nan`` when none was judged)."""
        d = sum(self.drafted)
        return sum(self.accepted) / d if d else math.nan

    def tokens_per_round(self, batch_row_count: int = 1) -> float:
        """New tokens per row and round: accepted drafts plus the target's token."""
        return (sum(self.accepted) / batch_row_count + self.rounds) / max(1, self.rounds)


def _draft_solve(draft) -> DraftSolve:
    if isinstance(draft, DraftSolve):
        d = draft
    elif isinstance(draft, dict):
        extra = set(draft) - {"n_steps", "solver", "scheme", "controls"}
        if extra:
            raise ValueError(f"draft: unknown keys {sorted(extra)}; expected n_steps, solver, scheme, controls")
        d = DraftSolve(**draft)
    elif isinstance(draft, int) and not isinstance(draft, bool):
        d = DraftSolve(n_steps=draft)
    else:
        raise TypeError(f"draft: expected a DraftSolve, a dict of n_steps/solver/scheme/controls or an int N_t, got "
                        f"{type(draft).__name__}")
    if d.n_steps is not None and (isinstance(d.n_steps, bool) or not isinstance(d.n_steps, int) or d.n_steps < 1):
        raise ValueError(f"draft.n_steps: expected an integer >= 1 (the draft's N_t) or None, got {d.n_steps!r}")
    if not isinstance(d.controls, str) or d.controls not in COARSE_MODES:
        raise ValueError(f"draft.controls: expected one of {COARSE_MODES}, got {d.controls!r}")
    return d


def _check_k(k) -> int | str:
    if isinstance(k, str):
        if k != "auto":
            raise ValueError(f"num_draft_tokens: expected an integer >= 1 or 'auto', got {k!r}")
        return k
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f"num_draft_tokens: expected an integer >= 1 or 'auto', got {k!r}")
    return k


def _check_confidence(c) -> float | None:
    if c is None:
        return None
    if isinstance(c, bool) or not isinstance(c, (int, float)) or not 0 < c < 1:
        raise ValueError(f"draft_confidence: expected None or a number in (0, 1) (the draft probability below which a "
                         f"round stops drafting), got {c!r}")
    return float(c)


def _draft_prob(logits: Tensor, q: Tensor | None, tok: Tensor) -> Tensor:
    """The draft's probability of each row's drafted token ``(B,)`` (``q``: the warped
    distribution it was drawn from; greedy: the softmax of ``logits``)."""
    p = torch.softmax(logits.to(torch.float32), -1) if q is None else q
    return p.gather(-1, tok.unsqueeze(-1)).squeeze(-1)


def _check_cache(c, name: str, model) -> KVCache:
    if c is None:
        return KVCache()
    if not isinstance(c, KVCache):
        raise TypeError(f"{name}: expected an opsplit KVCache or None, got {type(c).__name__}")
    owner = c.model
    if owner is not None and owner is not model:
        raise ValueError(f"{name}: this KVCache holds the keys and values of another model "
                         f"({type(owner).__name__}); speculative decoding fills a new cache of this model")
    if c.length:
        raise ValueError(f"{name}: expected an empty KVCache (speculative decoding fills it from the prompt), it "
                         f"holds {c.length} tokens")
    return c


def speculative_accept(target: Tensor, draft_probs: Tensor | None, draft_tokens: Tensor, limit: Tensor, *,
                       do_sample: bool, generator: torch.Generator | None = None) -> tuple[Tensor, Tensor]:
    r"""The acceptance rule of speculative decoding (module docstring) for a batch.

    Args:
        target: greedy: the target's logits ``(B, k + 1, V)`` at the pending token and the
            :math:`k` drafts; sampling: its probabilities :math:`p_0, \dots, p_k` (after the
            warpers, :func:`~opsplit.models.generate.token_probs`).
        draft_probs: sampling: the draft's probabilities :math:`q_0, \dots, q_{k-1}` ``(B, k,
            V)`` the drafts were drawn from; greedy: ``None``.
        draft_tokens: ``(B, k)``.
        limit: ``(B,)``, how many drafts a row may accept at most (``<= k``; the tokens it
            still needs, less one).

    Returns ``(accepted, token)``: per row the number of leading drafts accepted
    (``<= limit``) and the target's token after them — greedy: :math:`\arg\max p_a`;
    sampling: drawn from :math:`\mathrm{norm}(\max(0, p_a - q_a))` after a rejection
    (from :math:`p_a` if that is 0 everywhere: :math:`p_a = q_a` up to rounding), from
    :math:`p_a` when the row accepted all it may.
    """
    B, k1, V = target.shape
    k = k1 - 1
    rows = torch.arange(B, device=target.device)
    if k == 0:
        acc = torch.zeros(B, dtype=torch.long, device=target.device)
    elif not do_sample:
        best = target.to(torch.float32).argmax(-1)
        ok = draft_tokens == best[:, :k]
    else:
        pd = target[:, :k].gather(-1, draft_tokens.unsqueeze(-1)).squeeze(-1)
        qd = draft_probs.gather(-1, draft_tokens.unsqueeze(-1)).squeeze(-1)
        u = torch.rand(B, k, generator=generator, device=target.device, dtype=pd.dtype)
        ok = u * qd < pd  # accepted with probability min(1, p / q)
    if k:
        ok = ok & (torch.arange(k, device=target.device) < limit.unsqueeze(1))
        acc = ok.long().cumprod(-1).sum(-1)
    if not do_sample:
        scores = target[rows, acc].to(torch.float32)
        return acc, scores.argmax(-1)
    p = target[rows, acc]
    if k:
        rejected = acc < limit
        q = draft_probs[rows, acc.clamp(max=k - 1)]
        res = (p - q).clamp_min(0)
        res = torch.where((rejected & (res.sum(-1) > 0)).unsqueeze(-1), res, p)
    else:
        res = p
    return acc, torch.multinomial(res, 1, generator=generator).squeeze(1)


def _one_row(out, input_ids, position_ids, new, count, max_new_tokens, eos_ids, dstep, tstep, cache, draft_cache,
             swap, k_arg, cost, do_sample, warp, generator, conf) -> SpeculativeOutput:
    """The rounds of :func:`speculative_generate` for a batch of one row without padding,
    its bookkeeping in Python numbers (every slot a token, positions consecutive): the same
    calls, draws and tokens as the batch loop, a tenth of its small tensor operations."""
    N = input_ids.shape[1]
    cap = N + max_new_tokens + MAX_DRAFT_TOKENS + 2
    seq = _grow(input_ids, cap)
    seq[0, N] = new[0, 0]
    steps = torch.arange(1, cap - N + 1, device=input_ids.device).unsqueeze(0)
    pos = torch.cat([position_ids, position_ids[:, -1:] + steps], 1)
    n, ct, cd = N + 1, N, N  # slots; tokens in the target's and the draft's cache
    k = 4 if k_arg == "auto" else k_arg
    alpha, probe, done = 0.8, PROBE_EVERY, False
    while not done and count < max_new_tokens:
        k_eff = min(k, max_new_tokens - count - 1)
        q_list = []
        if k_eff:
            draft_cache.mark()
        with swap if k_eff else contextlib.nullcontext():
            for i in range(k_eff):
                dl = dstep(seq[:, cd:n + i], pos[:, cd:n + i], None)
                cd = n + i
                q = token_probs(dl, **warp) if do_sample else None
                tok = torch.multinomial(q, 1, generator=generator).squeeze(1) if do_sample else \
                    dl.to(torch.float32).argmax(-1)
                if do_sample:
                    q_list.append(q)
                seq[:, n + i] = tok
                if conf is not None and i + 1 < k_eff and float(_draft_prob(dl, q, tok)) < conf:
                    k_eff = i + 1  # unsure of its draft: verify what there is
                    break
        out.draft_steps += k_eff
        if k_eff:
            cache.mark()
        tl = tstep(seq[:, ct:n + k_eff], pos[:, ct:n + k_eff], None, last=False)[:, -(k_eff + 1):]
        out.target_steps += 1
        if do_sample:
            acc, tok = speculative_accept(token_probs(tl, **warp), torch.stack(q_list, 1) if q_list else None,
                                          seq[:, n:n + k_eff], torch.full((1,), k_eff, device=seq.device),
                                          do_sample=True, generator=generator)
            a, tok = int(acc[0]), tok[0]
        else:
            best = tl[0].to(torch.float32).argmax(-1)  # (k_eff + 1,)
            a = int((seq[0, n:n + k_eff] == best[:k_eff]).cumprod(0).sum()) if k_eff else 0
            tok = best[a]
        seq[0, n + a] = tok
        if k_eff:
            cache.rollback(n + a)
            cd = min(n + a, cd)
            draft_cache.rollback(cd)
        ct = n + a
        m = min(a + 1, max_new_tokens - count)  # the accepted drafts and the target's token
        if eos_ids is not None:
            hit = torch.isin(seq[0, n:n + m], eos_ids).nonzero()
            if hit.numel():
                m, done = int(hit[0, 0]) + 1, True
        new[0, count:count + m] = seq[0, n:n + m]
        count += m
        n += a + 1
        out.draft_lengths.append(k_eff)
        out.drafted.append(k_eff)
        out.accepted.append(a)
        if k_arg == "auto":
            k, alpha, probe = _next_k(k, alpha, probe, k_eff, a, cost)
    out.sequences = torch.cat([input_ids, new[:, :count]], 1)
    return out


def _next_k(k: int, alpha: float, probe: int, judged: int, accepted: int, cost: float) -> tuple[int, float, int]:
    """``num_draft_tokens="auto"`` after a round that judged ``judged`` drafts and accepted
    ``accepted``: the running acceptance ``alpha`` and the next round's ``k``
    (:func:`_best_k`); with ``k = 0`` a round of one draft every :data:`PROBE_EVERY` rounds
    measures the acceptance again.  Returns ``(k, alpha, probe)``."""
    if judged:
        alpha = 0.7 * alpha + 0.3 * (accepted / judged)
        k = _best_k(alpha, cost)
    if k == 0:
        probe -= 1
        if probe <= 0:
            k, probe = 1, PROBE_EVERY
    return k, alpha, probe


def _best_k(alpha: float, cost: float) -> int:
    """The number of drafts maximising tokens per round over its cost, :math:`(1 -
    \\alpha^{k+1}) / ((1 - \\alpha)(k c + 1))`, for acceptance rate ``alpha`` and draft cost
    ``c`` relative to a target step; 0 (plain decoding) where no draft pays."""
    alpha = min(max(alpha, 0.0), 0.999)
    best, arg = -1.0, 0
    for k in range(0, MAX_DRAFT_TOKENS + 1):
        v = (1 - alpha ** (k + 1)) / ((1 - alpha) * (k * cost + 1))
        if v > best:
            best, arg = v, k
    return arg


@torch.no_grad()
def speculative_generate(model, input_ids: Tensor, max_new_tokens: int, *, draft, num_draft_tokens="auto",
                         do_sample: bool = False, temperature: float = 1.0, top_k: int | None = None,
                         top_p: float | None = None, generator: torch.Generator | None = None,
                         attention_mask: Tensor | None = None, use_cache: bool = True, eos_token_id=MODEL_DEFAULT,
                         pad_token_id=MODEL_DEFAULT, n_steps: int | None = None, solver: str | None = None,
                         scheme: str | None = None, cache: KVCache | None = None,
                         draft_cache: KVCache | None = None,
                         draft_confidence: float | None = None) -> SpeculativeOutput:
    """:func:`~opsplit.models.generate.generate` of ``model`` (a
    :class:`~opsplit.models.DecoderLM`) solved with ``n_steps``, ``solver``, ``scheme``,
    drafted by the solve ``draft`` (module docstring); the same arguments, and

    Args:
        draft: a :class:`DraftSolve` (or a dict of its fields, or an int: its ``n_steps``),
            strictly cheaper than the target solve (:meth:`DecoderLM.solve_cost
            <opsplit.models.DecoderLM.solve_cost>`).
        num_draft_tokens: :math:`k` drafts per round (an integer ``>= 1``), or ``"auto"``
            (module docstring).
        cache, draft_cache: empty :class:`~opsplit.operators.KVCache` objects to fill
            (default: new ones), e.g. ``KVCache(sorted_runs=False)``.
        draft_confidence: a number in (0, 1), or ``None``: a row stops drafting for the
            round after a draft token whose probability under the draft (its softmax;
            sampling: after the warpers) is below it, and the round after every row stopped
            (as Hugging Face's ``assistant_confidence_threshold``): drafts the target would
            likely reject are not paid for. The output is unchanged (greedy) or keeps its
            distribution (sampling: how many drafts a row makes is decided by its draft alone).

    Returns a :class:`SpeculativeOutput` (``.sequences``: what ``generate`` returns).
    """
    k_arg = _check_k(num_draft_tokens)
    conf = _check_confidence(draft_confidence)
    d = _draft_solve(draft)
    if not (hasattr(model, "decode_steps") and hasattr(model, "solve_cost")):
        raise TypeError(f"draft: speculative decoding drafts with another solve of a DecoderLM, got "
                        f"{type(model).__name__}")
    if not use_cache:
        raise ValueError("use_cache: speculative decoding needs the key/value cache (use_cache=True)")
    try:
        target_cost = model.solve_cost(n_steps, solver, scheme)
    except ValueError:
        target_cost = None  # refused below by _prepare, naming the argument
    try:
        draft_cost = model.solve_cost(d.n_steps, d.solver, d.scheme)
    except ValueError as e:
        raise ValueError(f"draft: the model cannot take the draft solve ({d.describe()}): {e}") from None
    if d.controls == "average" and d.n_steps is not None:  # a step must cover whole pieces: refused before decoding
        check_coarse(model, d.n_steps, "draft.n_steps")
    # the draft's calls read the averaged controls; the target's, in between, the model's own
    swap = coarse_controls(model, d.n_steps) if d.controls == "average" else contextlib.nullcontext()
    cache = _check_cache(cache, "cache", model)
    draft_cache = _check_cache(draft_cache, "draft_cache", model)
    if cache is draft_cache:
        raise ValueError("draft_cache: the same KVCache as cache; the draft solve keeps its own")
    st = _prepare(model, input_ids, max_new_tokens, do_sample=do_sample, temperature=temperature, top_k=top_k,
                  top_p=top_p, generator=generator, attention_mask=attention_mask, use_cache=True,
                  eos_token_id=eos_token_id, pad_token_id=pad_token_id, n_steps=n_steps, solver=solver,
                  scheme=scheme)
    if draft_cost >= target_cost:
        raise ValueError(
            f"draft: the draft solve ({d.describe()}) costs {draft_cost} term evaluations per token, the target "
            f"solve {target_cost}: a draft must be cheaper (a coarser n_steps, a solver of fewer stages, a "
            "splitting of fewer substeps)")
    B, N, mask, position_ids, eos, pad_token_id, tkw = st.B, st.N, st.mask, st.position_ids, st.eos, \
        st.pad_token_id, st.kw
    dkw = {k: v for k, v in (("n_steps", d.n_steps), ("solver", d.solver), ("scheme", d.scheme)) if v is not None}
    model.check_cache_memory("draft", B, N + (0 if eos else max(0, max_new_tokens - 1)), d.n_steps,
                             decode=max_new_tokens > 1, solver=d.solver, scheme=d.scheme)
    device = input_ids.device
    out = SpeculativeOutput(sequences=input_ids)
    warp = {"temperature": temperature, "top_k": top_k, "top_p": top_p}
    if max_new_tokens == 0:
        out.sequences = input_ids.clone()
        return out
    # the prompt: the target's first token, both caches filled (the checked calls)
    logits = model.next_token_logits(input_ids, mask, position_ids=position_ids, cache=cache, check_values=True,
                                     **tkw)
    with swap:
        model.next_token_logits(input_ids, mask, position_ids=position_ids, cache=draft_cache, check_values=False,
                                **dkw)
        dstep = model.decode_steps(draft_cache, **dkw)
    out.target_steps, out.draft_steps = 1, 1
    tstep = model.decode_steps(cache, **tkw)
    p0 = logits.unsqueeze(1) if not do_sample else token_probs(logits.unsqueeze(1), **warp)
    _, first = speculative_accept(p0, None, input_ids.new_zeros(B, 0), input_ids.new_zeros(B), do_sample=do_sample,
                                  generator=generator)
    # the new tokens of every row, without the padding of rejected positions
    fill = pad_token_id if pad_token_id is not None else 0
    new = torch.full((B, max_new_tokens), fill, dtype=input_ids.dtype, device=device)
    count = torch.zeros(B, dtype=torch.long, device=device)
    done = torch.zeros(B, dtype=torch.bool, device=device)
    eos_ids = torch.tensor(eos, dtype=input_ids.dtype, device=device) if eos else None

    def record(tokens: Tensor, n_new: Tensor):
        """Append ``tokens[b, :n_new[b]]`` to the rows not done; stop a row at eos or at
        ``max_new_tokens``."""
        nonlocal done
        m = tokens.shape[1]
        j = torch.arange(m, device=device)
        valid = (j < n_new.unsqueeze(1)) & ~done.unsqueeze(1)
        if eos_ids is not None:
            hit = torch.isin(tokens, eos_ids) & valid
            first_eos = torch.where(hit.any(1), hit.long().argmax(1), m)
            valid = valid & (j <= first_eos.unsqueeze(1))
            done = done | hit.any(1)
        valid = valid & (count.unsqueeze(1) + j < max_new_tokens)
        b, i = valid.nonzero(as_tuple=True)
        new[b, count[b] + i] = tokens[b, i]
        count.add_(valid.sum(1))
        done = done | (count >= max_new_tokens)

    record(first.unsqueeze(1), torch.ones(B, dtype=torch.long, device=device))
    if ONE_ROW_PATH and B == 1 and not bool(done.all()) and bool(mask.all()):
        return _one_row(out, input_ids, position_ids, new, int(count), max_new_tokens, eos_ids, dstep, tstep, cache,
                        draft_cache, swap, k_arg, draft_cost / target_cost, do_sample, warp, generator, conf)
    # the slots of the sequence: prompt, then the rounds' positions (padding where rejected)
    cap = N + 2 * max(max_new_tokens, 8) + MAX_DRAFT_TOKENS + 2
    seq, mask_all, pos_all = _grow(input_ids, cap), _grow(mask, cap), _grow(position_ids, cap)
    seq[:, N], mask_all[:, N], pos_all[:, N] = first, 1, position_ids[:, -1] + 1
    last_pos = pos_all[:, N].clone()
    padded = not bool(mask.all())
    n, ct, cd = N + 1, N, N  # slots; tokens in the target's and the draft's cache
    k = 4 if k_arg == "auto" else k_arg
    alpha, cost = 0.8, draft_cost / target_cost
    probe = PROBE_EVERY  # with k = 0 ("auto": no draft pays), a round of one draft every PROBE_EVERY rounds
    while not bool(done.all()):
        need = (max_new_tokens - count).masked_fill(done, 0)  # tokens each row still needs
        k_eff = min(k, int(need.max()) - 1)
        limit = (need - 1).clamp(min=0, max=k_eff).masked_fill(done, 0)
        if n + k_eff + 1 > seq.shape[1]:
            cap = 2 * seq.shape[1]
            seq, mask_all, pos_all = _grow(seq, cap), _grow(mask_all, cap), _grow(pos_all, cap)
        # 1. k_eff drafts, one decode step of the draft solve each; their slots' mask and
        # positions do not depend on the tokens: set for the round at once (a row's drafts past
        # its limit are padding)
        q_list, d_list = [], []
        if k_eff:
            draft_cache.mark()
            real = torch.arange(k_eff, device=device) < limit.unsqueeze(1)  # (B, k_eff)
            mask_all[:, n:n + k_eff] = real.long()
            pos_all[:, n:n + k_eff] = torch.where(real, last_pos.unsqueeze(1) + torch.arange(1, k_eff + 1, device=device),
                                                  0)
            if not bool(real.all()):
                padded = True
        with swap if k_eff else contextlib.nullcontext():
            for i in range(k_eff):
                kpm = (mask_all[:, :n + i] == 0) if padded else None
                dl = dstep(seq[:, cd:n + i], pos_all[:, cd:n + i], kpm)
                out.draft_steps += 1
                cd = n + i
                if do_sample:
                    q = token_probs(dl, **warp)
                    tok = torch.multinomial(q, 1, generator=generator).squeeze(1)
                    q_list.append(q)
                else:
                    tok = dl.to(torch.float32).argmax(-1)
                d_list.append(tok)
                seq[:, n + i] = tok
                if conf is not None and i + 1 < k_eff:  # a row unsure of its draft stops drafting
                    unsure = (_draft_prob(dl, q_list[-1] if do_sample else None, tok) < conf) & (limit > i + 1)
                    if bool(unsure.any()):
                        limit = torch.where(unsure, i + 1, limit)
                        if int(limit.max()) <= i + 1:  # every row stopped: verify what there is
                            k_eff = i + 1
                            break
                        later = torch.arange(i + 1, k_eff, device=device) < limit.unsqueeze(1)
                        mask_all[:, n + i + 1:n + k_eff] = later.long()  # its later drafts: padding
                        pos_all[:, n + i + 1:n + k_eff] = torch.where(later, pos_all[:, n + i + 1:n + k_eff], 0)
                        padded = True
        # 2. one target step over the pending token and the drafts
        if k_eff:
            cache.mark()
        kpm = (mask_all[:, :n + k_eff] == 0) if padded else None
        tl = tstep(seq[:, ct:n + k_eff], pos_all[:, ct:n + k_eff], kpm, last=False)[:, -(k_eff + 1):]
        out.target_steps += 1
        dt = torch.stack(d_list, 1) if d_list else input_ids.new_zeros(B, 0)
        acc, tok = speculative_accept(token_probs(tl, **warp) if do_sample else tl,
                                      torch.stack(q_list, 1) if q_list else None, dt, limit, do_sample=do_sample,
                                      generator=generator)
        acc = acc.masked_fill(done, 0)
        a = int(acc.max())
        # 3. the new slots: the accepted drafts (padding past a row's own), then the target's token at n + a
        j = torch.arange(a, device=device)
        keep = (j < acc.unsqueeze(1)) & ~done.unsqueeze(1)
        if a:
            mask_all[:, n:n + a] = keep.long()
            if not bool(keep.all()):
                padded = True
        seq[:, n + a] = tok
        mask_all[:, n + a] = (~done).long()
        last_pos = last_pos + acc
        pos_all[:, n + a] = torch.where(done, 0, last_pos + 1)
        last_pos = torch.where(done, last_pos, last_pos + 1)
        if bool(done.any()):
            padded = True
        pad = (mask_all[:, :n + a] == 0) if padded else None
        if k_eff:
            cache.rollback(n + a, pad)
            keep_d = min(n + a, cd)
            draft_cache.rollback(keep_d, None if pad is None else pad[:, :keep_d])
            cd = keep_d
        ct = n + a
        got = torch.cat([dt[:, :a], tok.unsqueeze(1)], 1)
        got[torch.arange(B, device=device), acc] = tok  # a row's token right after its accepted drafts
        record(got, acc + 1)
        n = n + a + 1
        judged = int(limit.sum())
        out.draft_lengths.append(k_eff)
        out.drafted.append(judged)
        out.accepted.append(int(acc.sum()))
        if k_arg == "auto":
            k, alpha, probe = _next_k(k, alpha, probe, judged, int(acc.sum()), cost)
    L = int(count.max())
    out.sequences = torch.cat([input_ids, new[:, :L]], 1)
    return out
