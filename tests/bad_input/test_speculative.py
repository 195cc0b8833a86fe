"""Bad input of self-speculative decoding (opsplit.models.speculative) and of the rollback of
the key/value caches: refused before decoding, naming the argument."""

from __future__ import annotations

import pytest
import torch

from opsplit.functional.sliced_runs import SlicedDecodeCache
from opsplit.models import DecoderConfig, DecoderLM
from opsplit.models.speculative import DraftSolve, speculative_generate
from opsplit.operators import KVCache

from ._table import cases, run_case


def lm(attention="softmax"):
    kw = dict(positions="learned", max_positions=32) if attention == "sliced_relu" else {}
    cfg = DecoderConfig(vocab_size=11, d_model=8, n_layers=4, n_heads=2, d_ff=8, attention=attention, **kw)
    return DecoderLM(cfg, generator=torch.Generator().manual_seed(0), dtype=torch.float64).eval()


M = lm()
OTHER, OTHER_SLICED = lm(), lm("sliced_relu")  # kept alive: a cache refers to its model weakly
IDS = torch.tensor([[1, 2, 3]])


def spec(**kw):
    kw.setdefault("draft", 2)
    return lambda: speculative_generate(M, IDS, 5, **kw)


def filled(model, **kw):
    c = KVCache()
    with torch.no_grad():
        model(IDS, cache=c, **kw)
    return c


def marked_cache():
    c = filled(M)
    c.mark()
    return c


def runs_rollback(keep):
    c = SlicedDecodeCache()
    with torch.no_grad():
        c.append(torch.zeros(1, 1, 3, dtype=torch.float64), torch.zeros(1, 1, 3, 2, dtype=torch.float64))
        c.mark()
        c.append(torch.ones(1, 1, 2, dtype=torch.float64), torch.ones(1, 1, 2, 2, dtype=torch.float64))
        c.rollback(4, keep)


def runs_no_mark():
    c = SlicedDecodeCache()
    with torch.no_grad():
        c.append(torch.zeros(1, 1, 3, dtype=torch.float64), torch.zeros(1, 1, 3, 2, dtype=torch.float64))
    c.rollback(3)


ROWS = cases(
    ("spec-k-zero", spec(num_draft_tokens=0), ValueError, r"^num_draft_tokens: expected an integer >= 1 or 'auto', got 0"),
    ("spec-confidence-one", spec(draft_confidence=1.0), ValueError,
     r"^draft_confidence: expected None or a number in \(0, 1\) .*got 1.0"),
    ("spec-confidence-zero", spec(draft_confidence=0), ValueError, r"^draft_confidence: expected None or a number in"),
    ("spec-confidence-bool", spec(draft_confidence=True), ValueError, r"^draft_confidence: expected None or a number"),
    ("spec-confidence-word", spec(draft_confidence="high"), ValueError, r"^draft_confidence: expected None or a"),
    ("generate-confidence-without-draft", lambda: M.generate(IDS, 5, draft_confidence=0.5), ValueError,
     r"^draft_confidence: a threshold for the drafts of speculative decoding; expected draft="),
    ("spec-k-negative", spec(num_draft_tokens=-2), ValueError, r"^num_draft_tokens: expected an integer >= 1"),
    ("spec-k-word", spec(num_draft_tokens="many"), ValueError, r"^num_draft_tokens: expected an integer >= 1 or 'auto'"),
    ("spec-k-float", spec(num_draft_tokens=2.0), ValueError, r"^num_draft_tokens: expected an integer >= 1"),
    ("spec-draft-same", spec(draft=4), ValueError,
     r"^draft: the draft solve \(N_t = 4\) costs 8 term evaluations per token, the target solve 8: a draft must be "
     r"cheaper"),
    ("spec-draft-finer", spec(draft=8), ValueError, r"^draft: the draft solve \(N_t = 8\) costs 16 term evaluations"),
    ("spec-draft-costlier-solver", spec(draft={"n_steps": 2, "solver": "rk4"}), ValueError,
     r"^draft: the draft solve \(N_t = 2, solver rk4\) costs 16 term evaluations per token, the target solve 8"),
    ("spec-draft-strang", spec(draft=DraftSolve(scheme="strang")), ValueError,
     r"^draft: the draft solve \(the model's N_t, scheme strang\) costs 12"),
    ("spec-draft-coarser-target-finer", spec(draft=4, n_steps=4), ValueError, r"^draft: .* costs 8 .* the target solve 8"),
    ("spec-draft-solver-unknown", spec(draft={"solver": "dopri5"}), ValueError,
     r"^draft: the model cannot take the draft solve \(the model's N_t, solver dopri5\): solver: expected None"),
    ("spec-draft-scheme-unknown", spec(draft=DraftSolve(n_steps=2, scheme="yoshida")), ValueError,
     r"^draft: the model cannot take the draft solve .*scheme: expected None \(the model's own\) or one of"),
    ("spec-draft-steps-zero", spec(draft=DraftSolve(n_steps=0)), ValueError, r"^draft.n_steps: expected an integer >= 1"),
    ("spec-draft-steps-float", spec(draft={"n_steps": 2.0}), ValueError, r"^draft.n_steps: expected an integer >= 1"),
    ("spec-draft-key", spec(draft={"steps": 2}), ValueError, r"^draft: unknown keys \['steps'\]"),
    ("spec-draft-controls", spec(draft=DraftSolve(n_steps=2, controls="mean")), ValueError,
     r"^draft.controls: expected one of \('point', 'average'\), got 'mean'"),
    ("spec-draft-average-straddles", spec(draft=DraftSolve(n_steps=3, controls="average")), ValueError,
     r"^draft.n_steps: N_t = 3 steps cannot average the 4 pieces of a control"),
    ("spec-draft-type", spec(draft="coarse"), TypeError, r"^draft: expected a DraftSolve, a dict"),
    ("spec-draft-bool", spec(draft=True), TypeError, r"^draft: expected a DraftSolve"),
    ("spec-no-cache", spec(use_cache=False), ValueError, r"^use_cache: speculative decoding needs the key/value cache"),
    ("spec-model", lambda: speculative_generate(torch.nn.Linear(2, 2), IDS, 5, draft=2), TypeError,
     r"^draft: speculative decoding drafts with another solve of a DecoderLM, got Linear"),
    ("spec-cache-other-model", spec(cache=filled(OTHER)), ValueError,
     r"^cache: this KVCache holds the keys and values of another model \(DecoderLM\)"),
    ("spec-draft-cache-other-model", spec(draft_cache=filled(OTHER_SLICED)), ValueError,
     r"^draft_cache: this KVCache holds the keys and values of another model"),
    ("spec-cache-filled", spec(cache=filled(M)), ValueError, r"^cache: expected an empty KVCache .* it holds 3 tokens"),
    ("spec-cache-type", spec(cache={}), TypeError, r"^cache: expected an opsplit KVCache or None, got dict"),
    ("spec-cache-shared", (lambda c: spec(cache=c, draft_cache=c))(KVCache()), ValueError,
     r"^draft_cache: the same KVCache as cache"),
    ("spec-target-solver", spec(solver="euler2"), ValueError, r"^solver: expected None \(the model's own\) or one of"),
    ("spec-max-new", lambda: speculative_generate(M, IDS, -1, draft=2), ValueError,
     r"^max_new_tokens: expected an integer >= 0"),
    ("gen-solver", lambda: M.generate(IDS, 3, solver="odeint"), ValueError,
     r"^solver: expected None \(the model's own\) or one of \('euler', 'heun', 'rk4'\), got 'odeint'"),
    ("gen-scheme", lambda: M.generate(IDS, 3, scheme="yoshida"), ValueError,
     r"^scheme: expected None \(the model's own\) or one of \('lie', 'strang', 'parallel'\)"),
    ("cache-other-solve", lambda: M(IDS, cache=filled(M, solver="heun")), ValueError,
     r"^solver: the cache was filled solving with solver=heun, scheme=own, this call solves with the model's own"),
    ("kv-mark-empty", lambda: KVCache().mark(), ValueError, r"^KVCache.mark: the cache is empty"),
    ("kv-rollback-no-mark", lambda: filled(M).rollback(2), ValueError, r"^KVCache.rollback: no mark to roll back to"),
    ("kv-rollback-below-mark", lambda: marked_cache().rollback(2), ValueError,
     r"^KVCache.rollback: n_tokens: expected an int in \[3, 3\]"),
    ("kv-rollback-above", lambda: marked_cache().rollback(4), ValueError, r"^KVCache.rollback: n_tokens: expected an int"),
    ("kv-rollback-padding", lambda: marked_cache().rollback(3, torch.zeros(1, 2, dtype=torch.bool)), ValueError,
     r"^KVCache.rollback: padding: expected a bool tensor \(B, n_tokens\) = \(1, 3\)"),
    ("kv-rollback-padding-dtype", lambda: marked_cache().rollback(3, torch.zeros(1, 3)), ValueError,
     r"^KVCache.rollback: padding: expected a bool tensor"),
    ("runs-mark-empty", lambda: SlicedDecodeCache().mark(), ValueError, r"^SlicedDecodeCache.mark: the cache is empty"),
    ("runs-rollback-no-mark", runs_no_mark, ValueError, r"^SlicedDecodeCache.rollback: no mark to roll back to"),
    ("runs-rollback-keep", lambda: runs_rollback(torch.ones(1, 2, dtype=torch.bool)), ValueError,
     r"^SlicedDecodeCache.rollback: keep: expected a bool tensor \(B, n - marked length\) = \(1, 1\)"),
)


@pytest.mark.parametrize("case", ROWS)
def test_rows(case):
    run_case(case)
