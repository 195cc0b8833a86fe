"""Self-speculative decoding (opsplit.models.speculative): a cheaper solve of the same model
drafts, the model's own solve verifies.

* greedy: the output equals plain greedy ``generate`` token for token — 64 prompts over 16
  model configs (softmax and sliced attention, Lie/parallel/Strang, float32 and float64,
  batch 1 and left-padded batches of 3), drafts of coarser N_t, of Euler under a Heun/RK4
  target and of Lie under a Strang target, fixed and automatic k, eos; and on models
  converted from Hugging Face (GPT-2 and Llama configs) against HF's own greedy ``generate``;
* sampling: the joint distribution of the first 4 sampled tokens (vocabulary 4, 256 cells,
  20,000 draws as one batch, temperature 0.9, top-k 3) is the target's, computed exactly from
  the model's logits of every continuation: chi-square p-values 0.42 (speculative, acceptance
  rate 0.32) and 0.64 (plain sampling, the same settings); a two-sample test of speculative
  against plain sampling p = 0.38; the acceptance rule with the residual drawn from p instead
  of norm(max(0, p - q)) fails (p = 0 in float64, asserted below 1e-100);
* the caches' rollback: sorted runs rolled back after any appends equal, bit for bit and run
  for run, a cache that appended the kept keys once (with some of them turned to padding);
  softmax entries keep the exact maximum of their kept keys;
* a solver of several stages keeps one cache entry per stage (Heun and RK4 generation with
  the cache equals generation without it).
"""

from __future__ import annotations

import itertools

import pytest
import torch

from opsplit.functional.sliced_runs import SlicedDecodeCache
from opsplit.models import DecoderConfig, DecoderLM
from opsplit.models import speculative as spec
from opsplit.models.generate import token_probs
from opsplit.models.speculative import DraftSolve, speculative_generate
from opsplit.operators import KVCache


def _model(attention="softmax", scheme="lie", dtype=torch.float64, seed=0, vocab=23, layers=4, scale=0.3):
    kw = dict(positions="learned", max_positions=96) if attention == "sliced_relu" else {}
    cfg = DecoderConfig(vocab_size=vocab, d_model=16, n_layers=layers, n_heads=2, d_ff=24, attention=attention,
                        scheme=scheme, **kw)
    m = DecoderLM(cfg, generator=torch.Generator().manual_seed(seed), dtype=dtype).eval()
    g = torch.Generator().manual_seed(100 + seed)
    with torch.no_grad():
        for p in m.parameters():
            p.add_(scale * torch.randn(p.shape, generator=g, dtype=torch.float64).to(p.dtype))
    return m


def _prompts(vocab, B, N, seed):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab, (B, N), generator=g)
    mask = torch.ones(B, N, dtype=torch.long)
    for b in range(1, B):
        mask[b, : min(N - 1, 2 * b)] = 0
    return ids, mask


# (attention, scheme, dtype, target solve, draft, k): 16 configs, 4 prompts each (one alone, a padded batch of 3)
CONFIGS = [
    ("softmax", "lie", torch.float32, {}, 2, 3),
    ("softmax", "lie", torch.float64, {}, 1, "auto"),
    ("softmax", "parallel", torch.float32, {}, 2, 2),
    ("softmax", "parallel", torch.float64, {"solver": "heun"}, {"n_steps": 4}, 4),
    ("softmax", "strang", torch.float32, {}, DraftSolve(scheme="lie"), 3),
    ("softmax", "lie", torch.float64, {"n_steps": 8}, 2, "auto"),
    ("softmax", "parallel", torch.float32, {"solver": "rk4", "n_steps": 2}, DraftSolve(n_steps=2, solver="heun"), 2),
    ("softmax", "lie", torch.float32, {"scheme": "strang"}, DraftSolve(n_steps=2, scheme="strang"), 1),
    ("sliced_relu", "lie", torch.float32, {}, 2, 3),
    ("sliced_relu", "lie", torch.float64, {}, 1, "auto"),
    ("sliced_relu", "parallel", torch.float32, {}, 2, 2),
    ("sliced_relu", "parallel", torch.float64, {"solver": "heun"}, {"n_steps": 4}, 4),
    ("sliced_relu", "strang", torch.float64, {}, DraftSolve(scheme="lie"), 3),
    ("sliced_relu", "lie", torch.float32, {"n_steps": 8}, 2, "auto"),
    ("sliced_relu", "parallel", torch.float64, {"solver": "rk4", "n_steps": 2}, DraftSolve(n_steps=2, solver="heun"),
     2),
    ("sliced_relu", "parallel", torch.float32, {}, DraftSolve(n_steps=2, scheme="lie"), 5),
]


@pytest.mark.parametrize("i", range(len(CONFIGS)))
def test_greedy_equals_plain_generate(i):
    attention, scheme, dtype, target, draft, k = CONFIGS[i]
    m = _model(attention, scheme, dtype, seed=i)
    accepted_rounds, tokens = 0, set()
    for B, seed in ((1, i), (3, 50 + i)):
        ids, mask = _prompts(23, B, 6, seed)
        am = mask if B > 1 else None
        ref = m.generate(ids, 16, attention_mask=am, **target)
        out = speculative_generate(m, ids, 16, attention_mask=am, draft=draft, num_draft_tokens=k, **target)
        assert torch.equal(out.sequences, ref), (B, out.sequences, ref)
        accepted_rounds += sum(1 for a in out.accepted if a)
        tokens |= set(ref[:, 6:].flatten().tolist())
    assert len(tokens) >= 3  # not one repeated token
    assert accepted_rounds >= 2  # rounds that kept drafts (and rolled back the rest)
    if i == 0:  # DecoderLM.generate(draft=...) is speculative_generate
        assert torch.equal(m.generate(ids, 16, attention_mask=am, draft=draft, num_draft_tokens=k), ref)


@pytest.mark.parametrize("attention, sample, k, conf", [("softmax", False, 3, None), ("sliced_relu", False, "auto", None),
                                                         ("softmax", True, 2, None), ("sliced_relu", True, 4, None),
                                                         ("softmax", False, 4, 0.5), ("sliced_relu", True, 4, 0.4)])
def test_one_row_path_equals_the_batch_loop(attention, sample, k, conf, monkeypatch):
    """A batch of one row runs the Python-bookkept rounds (``_one_row``): the same tokens,
    random draws and round statistics as the batch loop (``ONE_ROW_PATH = False``), eos
    inside an accepted run of drafts included."""
    m = _model(attention, "parallel", torch.float64, seed=11, scale=0.1)
    ids, _ = _prompts(23, 1, 6, 3)
    free = m.generate(ids, 24)
    warp = dict(do_sample=True, temperature=0.9, top_k=5) if sample else {}
    new = free[0, 6:].tolist()
    stop = next(i for i in range(5, 24) if new[i] not in new[:i])  # a token first generated at step stop + 1
    for eos in (None, [new[stop]]):
        outs = []
        for fast in (True, False):
            monkeypatch.setattr(spec, "ONE_ROW_PATH", fast)
            g = torch.Generator().manual_seed(5) if sample else None
            outs.append(speculative_generate(m, ids, 24, draft=2, num_draft_tokens=k, eos_token_id=eos, generator=g,
                                             draft_confidence=conf, **warp))
        a, b = outs
        assert torch.equal(a.sequences, b.sequences)
        assert (a.draft_lengths, a.drafted, a.accepted, a.target_steps, a.draft_steps) == \
            (b.draft_lengths, b.drafted, b.accepted, b.target_steps, b.draft_steps)
        assert sum(a.accepted) > 0 and a.rounds > 1
        if eos is not None and not sample:
            assert a.sequences.shape[1] == 6 + stop + 1  # stopped at the eos


@pytest.mark.parametrize("attention, scheme, dtype, scale, conf", [("softmax", "lie", torch.float64, 0.3, 0.2),
                                                                   ("sliced_relu", "parallel", torch.float32, 0.6, 0.3)])
def test_greedy_with_a_draft_confidence_equals_plain(attention, scheme, dtype, scale, conf):
    """``draft_confidence``: rows stop drafting at an unsure draft token (alone, and in a
    left-padded batch where the rows stop apart); the tokens stay plain greedy's, and the
    rounds draft fewer tokens than without it."""
    m = _model(attention, scheme, dtype, seed=4, scale=scale)
    for B in (1, 3):
        ids, mask = _prompts(23, B, 6, 9 + B)
        am = mask if B > 1 else None
        ref = m.generate(ids, 20, attention_mask=am)
        free = speculative_generate(m, ids, 20, attention_mask=am, draft=2, num_draft_tokens=5)
        out = speculative_generate(m, ids, 20, attention_mask=am, draft=2, num_draft_tokens=5, draft_confidence=conf)
        assert torch.equal(out.sequences, ref) and torch.equal(free.sequences, ref)
        assert sum(out.drafted) / out.rounds < sum(free.drafted) / free.rounds
        if B == 1:
            assert min(out.draft_lengths) < 5 and sum(out.accepted) > 0
    assert torch.equal(m.generate(ids, 20, attention_mask=am, draft=2, draft_confidence=conf), ref)


def test_greedy_equals_plain_with_eos_and_uneven_acceptance():
    """eos in a left-padded batch: the rows stop apart, as plain generate's; rows accept
    different numbers of drafts (the others' positions become padding)."""
    m = _model("sliced_relu", "parallel", torch.float64, seed=3)
    ids, mask = _prompts(23, 4, 5, 7)
    free = m.generate(ids, 30, attention_mask=mask)
    eos = [int(free[0, 5 + 4]), int(free[2, 5 + 9])]
    ref = m.generate(ids, 30, attention_mask=mask, eos_token_id=eos, pad_token_id=5)
    out = speculative_generate(m, ids, 30, attention_mask=mask, draft=2, num_draft_tokens=4, eos_token_id=eos,
                               pad_token_id=5)
    assert torch.equal(out.sequences, ref)
    assert ref.shape[1] < 35 or (ref[0, 10:] == 5).all()


@pytest.mark.parametrize("family,seed", [("gpt2", 0), ("gpt2", 5), ("llama", 1), ("llama", 6)])
def test_converted_model_equals_hf_greedy(family, seed):
    pytest.importorskip("transformers")
    from _llm_configs import build, left_padded

    from opsplit.models import from_hf

    hf = build(family, seed, dtype=torch.float32, scale=0.5)
    ours = from_hf(hf)
    assert ours.decoder.n_steps >= 2
    ids, mask = left_padded(hf.config.vocab_size, 3, 5, seed)
    ref = hf.generate(ids, attention_mask=mask, max_new_tokens=24, do_sample=False, eos_token_id=None, pad_token_id=0)
    for b in range(3):  # batch 1 and the padded batch
        one = ids[b:b + 1, int((mask[b] == 0).sum()):]
        got = speculative_generate(ours, one, 24, draft=1, num_draft_tokens=3, eos_token_id=None).sequences
        assert torch.equal(got[0], ref[b, int((mask[b] == 0).sum()):])
    got = speculative_generate(ours, ids, 24, attention_mask=mask, draft=1, num_draft_tokens="auto",
                               eos_token_id=None)
    assert torch.equal(got.sequences, ref)


# -- the distribution of speculative sampling ---------------------------------------------------
V, T = 4, 4


def _chi2(counts: torch.Tensor, probs: torch.Tensor):
    """Pearson's chi-square of ``counts`` against ``probs`` (cells expected below 5 merged);
    returns the p-value (the chi-square survival function, ``gammaincc(df / 2, x / 2)``)."""
    e = probs.double() * counts.sum()
    small = e < 5
    obs = torch.cat([counts[~small], counts[small].sum().view(1)])
    ex = torch.cat([e[~small], e[small].sum().view(1)])
    if ex[-1] == 0:
        assert obs[-1] == 0
        obs, ex = obs[:-1], ex[:-1]
    x = ((obs - ex) ** 2 / ex).sum()
    return float(torch.special.gammaincc(torch.tensor((len(obs) - 1) / 2, dtype=torch.float64), x / 2))


def _two_sample(a: torch.Tensor, b: torch.Tensor):
    """The chi-square test of homogeneity of two count vectors (cells with fewer than 10
    counts in all merged)."""
    small = (a + b) < 10
    a = torch.cat([a[~small], a[small].sum().view(1)])
    b = torch.cat([b[~small], b[small].sum().view(1)])
    keep = (a + b) > 0
    a, b = a[keep], b[keep]
    tot = a + b
    ea, eb = tot * a.sum() / tot.sum(), tot * b.sum() / tot.sum()
    x = ((a - ea) ** 2 / ea).sum() + ((b - eb) ** 2 / eb).sum()
    return float(torch.special.gammaincc(torch.tensor((len(a) - 1) / 2, dtype=torch.float64), x / 2))


@pytest.fixture(scope="module")
def sampling_setup():
    m = _model("softmax", "lie", torch.float64, seed=3, vocab=V, layers=2, scale=0.6)
    prompt = torch.tensor([[1, 3, 0]])
    warp = dict(temperature=0.9, top_k=3)
    seqs = torch.tensor(list(itertools.product(range(V), repeat=T)))
    with torch.no_grad():  # the exact distribution of the first T tokens: every continuation, one forward
        full = torch.cat([prompt.expand(len(seqs), -1), seqs], 1)
        p = token_probs(m(full).logits[:, prompt.shape[1] - 1: -1], **warp).double()
        exact = p.gather(-1, seqs.unsqueeze(-1)).squeeze(-1).prod(-1)
    return m, prompt.expand(20000, -1).contiguous(), warp, exact


def _counts(out, n_prompt):
    x = out[:, n_prompt:]
    return torch.bincount((x * torch.tensor([V ** 3, V ** 2, V, 1])).sum(1), minlength=V ** T).double()


def _sample(m, ids, warp, seed, conf=None):
    return speculative_generate(m, ids, T, draft=1, num_draft_tokens=3, do_sample=True, eos_token_id=None,
                                generator=torch.Generator().manual_seed(seed), draft_confidence=conf, **warp)


@pytest.mark.parametrize("conf", [None, 0.7])
def test_speculative_sampling_keeps_the_distribution(sampling_setup, conf):
    """With ``draft_confidence`` every row stops drafting where its own draft is unsure
    (the first round judges fewer drafts than 2 a row)."""
    m, ids, warp, exact = sampling_setup
    out = _sample(m, ids, warp, 1, conf)
    assert 0.2 < out.acceptance_rate < 0.8  # drafts accepted and rejected at depth 1 and 2
    if conf is None:
        assert out.drafted[0] == 2 * ids.shape[0] and out.drafted[1] > 1000
    else:
        assert ids.shape[0] < out.drafted[0] < 1.95 * ids.shape[0]
    spec_counts = _counts(out.sequences, 3)
    plain = m.generate(ids, T, do_sample=True, eos_token_id=None, generator=torch.Generator().manual_seed(2), **warp)
    plain_counts = _counts(plain, 3)
    assert (spec_counts[exact == 0] == 0).all()  # top-k: no token outside the target's support
    p_spec, p_plain, p_two = _chi2(spec_counts, exact), _chi2(plain_counts, exact), _two_sample(spec_counts,
                                                                                                plain_counts)
    assert p_spec > 0.01 and p_plain > 0.01 and p_two > 0.01, (p_spec, p_plain, p_two)


@pytest.mark.parametrize("conf", [None, 0.7])
def test_a_wrong_acceptance_rule_fails_the_same_test(sampling_setup, monkeypatch, conf):
    m, ids, warp, exact = sampling_setup
    right = spec.speculative_accept

    def residual_from_p(target, q, d, limit, *, do_sample, generator=None):
        acc, tok = right(target, q, d, limit, do_sample=do_sample, generator=generator)
        if target.shape[1] == 1:
            return acc, tok
        p = target[torch.arange(target.shape[0]), acc]
        return acc, torch.multinomial(p, 1, generator=generator).squeeze(1)

    monkeypatch.setattr(spec, "speculative_accept", residual_from_p)
    counts = _counts(_sample(m, ids, warp, 1, conf).sequences, 3)
    assert _chi2(counts, exact) < 1e-100


# -- rollback ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_sorted_runs_rollback_equals_appending_the_kept_keys(dtype):
    B, H, D = 2, 2, 3
    g = torch.Generator().manual_seed(0)

    def keys(m):
        return (torch.randn(B, H, m, generator=g, dtype=torch.float64).to(dtype),
                torch.randn(B, H, m, D, generator=g, dtype=torch.float64).to(dtype))

    with torch.no_grad():
        for _trial in range(60):
            n0 = int(torch.randint(1, 90, (1,), generator=g))
            w0 = (torch.rand(B, 1, n0, generator=g) > 0.2).to(dtype).expand(B, H, n0)  # padded keys
            zk, v = keys(n0)
            a, b = SlicedDecodeCache(), SlicedDecodeCache()
            a.append(zk, v, key_weights=w0)
            b.append(zk, v, key_weights=w0)
            a.mark()
            extra = []
            for _ in range(int(torch.randint(1, 5, (1,), generator=g))):
                z2, v2 = keys(int(torch.randint(1, 40, (1,), generator=g)))
                extra.append((z2, v2))
                a.append(z2, v2)
            z2, v2 = torch.cat([e[0] for e in extra], 2), torch.cat([e[1] for e in extra], 2)
            k = int(torch.randint(0, z2.shape[2] + 1, (1,), generator=g))
            keep = torch.rand(B, k, generator=g) > 0.3
            a.rollback(n0 + k, keep)
            if k:
                b.append(z2[..., :k], v2[:, :, :k], key_weights=keep.unsqueeze(1).to(dtype).expand(B, H, k))
            assert a.runs == b.runs and a.nt == b.nt and a.length == n0 + k
            q = torch.randn(B, H, 5, generator=g, dtype=torch.float64).to(dtype)
            assert torch.equal(a.relu(q), b.relu(q))
            assert torch.equal(a.bump(q, 0.7), b.bump(q, 0.7))
            # and it goes on as the other does
            z3, v3 = keys(3)
            assert torch.equal(a.step_relu(q[..., :3], z3, v3), b.step_relu(q[..., :3], z3, v3))


def test_kv_cache_rollback_keeps_the_exact_key_maximum():
    op = object()
    c = KVCache()
    with torch.no_grad():
        c.begin(4)
        c.update(op, 0.0, torch.tensor([1.0, -2.0, 0.5, 1.5]).view(1, 1, 4, 1), key_max=2.0)
        c.mark()
        c.begin(3)
        c.update(op, 0.0, torch.tensor([-7.0, 3.0, 9.0]).view(1, 1, 3, 1), key_max=9.0)
        assert c.key_max(op, 0.0) == 9.0
        c.rollback(6)
        assert c.length == 6 and c.key_max(op, 0.0) == 7.0
        (k,) = c.entries()[0][2]
        assert k.flatten().tolist() == [1.0, -2.0, 0.5, 1.5, -7.0, 3.0]
    with pytest.raises(ValueError, match="no mark"):
        c.rollback(6)


@pytest.mark.parametrize("attention", ["softmax", "sliced_relu"])
@pytest.mark.parametrize("solver", ["heun", "rk4"])
def test_stages_of_a_solver_cache_apart(attention, solver):
    """Heun's second stage at t + dt and the next step's first stage read different keys: each
    evaluation of a term within a call is an entry of its own (KVCache docstring)."""
    m = _model(attention, "parallel", torch.float64, seed=5, scale=0.3)
    ids, mask = _prompts(23, 2, 5, 1)
    a = m.generate(ids, 12, attention_mask=mask, solver=solver, n_steps=3)
    b = m.generate(ids, 12, attention_mask=mask, solver=solver, n_steps=3, use_cache=False)
    assert torch.equal(a, b)
    assert not torch.equal(a, m.generate(ids, 12, attention_mask=mask, n_steps=3))


def test_auto_k_follows_the_acceptance():
    assert spec._best_k(0.95, 0.25) > spec._best_k(0.5, 0.25) >= 1
    assert spec._best_k(0.2, 0.9) == 0  # no draft pays: plain decoding
    assert spec._best_k(0.999, 0.01) == spec.MAX_DRAFT_TOKENS


def test_auto_k_stops_drafting_where_no_draft_pays_and_probes_again():
    m = _model("softmax", "lie", torch.float64, seed=7, scale=1.0)
    ids, _ = _prompts(23, 1, 6, 7)
    ref = m.generate(ids, 60, n_steps=8)
    out = speculative_generate(m, ids, 60, n_steps=8, draft=1, num_draft_tokens="auto")
    assert torch.equal(out.sequences, ref)
    assert out.acceptance_rate < 0.3
    ks = out.draft_lengths
    assert 0 in ks and ks.count(0) > len(ks) // 2  # mostly the target alone
    first = ks.index(0)
    assert any(k > 0 for k in ks[first + spec.PROBE_EVERY - 1: first + spec.PROBE_EVERY + 1])  # a probing round


# -- the caches' public reading (benchmarks/decode.py builds and measures caches through it) ------------
def test_cache_states_nbytes_and_a_cache_filled_directly():
    """``KVCache.states``/``nbytes`` and ``cache_state``: the softmax cache's bytes are its keys'
    and values' (B H n d each, counted here by hand); a sliced model's prefill leaves one state
    per step, reached by ``cache_state``; a cache filled directly with those states' keys (runs
    appended after ``begin(n)``) decodes the next token as the prefilled one does."""
    ids = torch.tensor([[3, 1, 4, 1, 5, 9, 2]])
    soft = _model("softmax", "lie", torch.float64, seed=2)
    c = KVCache()
    with torch.no_grad():
        soft(ids, cache=c)
    cfg = soft.config
    per_entry = 2 * ids.shape[1] * cfg.n_kv_heads * cfg.head_dim * 8  # keys and values, float64
    assert c.states() == [] and len(c.entries()) == soft.decoder.n_steps
    assert c.nbytes() == soft.decoder.n_steps * per_entry
    m = _model("sliced_relu", "lie", torch.float64, seed=2)
    a = KVCache()
    with torch.no_grad():
        m(ids, cache=a)
    times = m.decoder.times(None)[:-1]
    assert [(op, t) for op, t, _ in a.states()] == [(m.attention, float(t)) for t in times]
    assert a.nbytes() == sum(st.runs.nbytes() for _, _, st in a.states()) > 0
    # the same random keys in a sorted-runs cache (filled directly) and in a cache of scores and
    # values (their direct sums): the next decode step agrees
    n, H, D = 40, m.config.n_heads, m.config.d_model
    g = torch.Generator().manual_seed(0)
    runs, sums = KVCache(), KVCache(sorted_runs=False)
    runs.begin(n)
    sums.begin(n)
    with torch.no_grad():
        for t in times:
            zk = torch.randn(1, H, n, generator=g, dtype=torch.float64)
            v = torch.randn(1, H, n, D, generator=g, dtype=torch.float64)
            m.attention.cache_state(runs, t).runs.append(zk, v)
            sums.update(m.attention, t, zk, v)
        assert runs.length == sums.length == n and len(runs.states()) == len(times) and not sums.states()
        tok, pos = torch.tensor([[7]]), torch.tensor([[n]])
        torch.testing.assert_close(m.decode_steps(runs)(tok, pos, None), m.decode_steps(sums)(tok, pos, None),
                                   rtol=1e-9, atol=1e-9)
