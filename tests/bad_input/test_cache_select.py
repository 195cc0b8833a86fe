"""Bad input to the key/value caches (issue 42, findings 1-3): ``KVCache.select`` and
``SlicedDecodeCache.select`` share one check of ``index`` (:func:`opsplit._checks.check_select_index`:
1-D int64/int32 row indices in ``[0, B)`` or a 1-D bool mask of length ``B``; negative indices,
an empty selection, another dtype or rank refused), raised before the cache changes;
``SlicedDecodeCache.step_bump`` refuses a missing bandwidth as ``bump`` does; the other public
methods of both caches refuse wrong types.  Each row is ``(id, call, exception type, regex)``
(``tests/bad_input/_table.py``): raised by opsplit's own checks, naming the argument.  After the
table: a refused select, and a refused decode step, leave the cache usable (the next steps
equal the kept sequences recomputed)."""

from __future__ import annotations

import functools

import pytest
import torch

from opsplit.functional.sliced_runs import SlicedDecodeCache
from opsplit.models import DecoderConfig, DecoderLM
from opsplit.operators import KVCache

from ._table import F64, cases, run_case

VOCAB = 19
IDS = torch.tensor([[3, 4, 5, 6], [7, 8, 9, 10], [11, 12, 13, 14]])


@functools.cache
def lm(attention):
    extra = dict(attention="sliced_relu", norm="layer", mlp="plain", activation="gelu", positions="learned",
                 max_positions=32) if attention == "sliced" else {}
    cfg = DecoderConfig(vocab_size=VOCAB, d_model=8, n_layers=2, n_heads=2, d_ff=12, **extra)
    return DecoderLM(cfg, generator=torch.Generator().manual_seed(0), dtype=F64).eval()


def filled(attention="softmax"):
    """A KVCache holding 4 tokens of 3 sequences (B = 3): tensor entries (softmax) or the
    sorted runs of causal sliced attention."""
    cache = KVCache()
    with torch.no_grad():
        lm(attention).next_token_logits(IDS, cache=cache)
    return cache


def runs(B=3):
    """A SlicedDecodeCache of 5 keys, B = 3 (or ``B``), H = 2, D = 3."""
    g = torch.Generator().manual_seed(1)
    c = SlicedDecodeCache()
    with torch.no_grad():
        c.append(torch.randn(B, 2, 5, generator=g, dtype=F64), torch.randn(B, 2, 5, 3, generator=g, dtype=F64))
    return c


def T(*x, dtype=torch.int64):
    return torch.tensor(x, dtype=dtype)


BOOL = torch.bool
KSEL = "KVCache.select: index"
RSEL = "SlicedDecodeCache.select: index"
#: (id suffix, bad index, exception, regex after the name)
BAD_INDEX = [
    ("list", [0, 2], TypeError, r"expected a 1-D tensor of row indices \(torch.int64 or torch.int32\) in \[0, 3\) or a "
                                r"1-D bool mask of length 3, got list"),
    ("float", T(0.0, 2.0, dtype=torch.float32), TypeError, r"expected a 1-D tensor .* got dtype torch.float32"),
    ("uint8-mask", T(1, 0, 1, dtype=torch.uint8), TypeError, r"expected a 1-D tensor .* got dtype torch.uint8"),
    ("2d", T(0, 2).view(1, 2), ValueError, r"expected a 1-D tensor .* got shape \(1, 2\)"),
    ("0d", torch.tensor(1), ValueError, r"expected a 1-D tensor .* got shape \(\)"),
    ("mask-2d", torch.ones(3, 1, dtype=BOOL), ValueError, r"expected a 1-D tensor .* got shape \(3, 1\)"),
    ("out-of-range", T(0, 3), ValueError, r"row indices must lie in \[0, 2\] .* got range \[0, 3\]"),
    ("negative", T(-1, 0), ValueError, r"row indices must lie in \[0, 2\] \(negative indices are refused, not counted from the end\), got range \[-1, 0\]"),
    ("mask-length", T(True, False, dtype=BOOL), ValueError, r"a bool mask of length 2, but the cache holds 3 sequences"),
    ("empty", T(), ValueError, r"selects no sequence \(an empty index\)"),
    ("mask-none", torch.zeros(3, dtype=BOOL), ValueError, r"the mask keeps no sequence"),
]


def _partial():
    """Two operators' entries of 4 tokens, then a call in which only the first appended."""
    cache, a, b = KVCache(), object(), object()
    x = torch.ones(3, 2, 4, 2, dtype=F64)
    cache.begin(4)
    cache.update(a, 0.0, x, x)
    cache.update(b, 0.0, x, x)
    cache.begin(1)
    cache.update(a, 0.0, x[:, :, :1], x[:, :, :1])
    return cache


def _select(make, index):
    return lambda: make().select(index)


def _kv_update(**kw):
    x = torch.ones(1, 1, 2, 2)
    args = kw.pop("tensors", (x, x))
    return KVCache().update(object(), kw.pop("t", 0.0), *args, **kw)


def _step_bump(cache_fn, **kw):
    c = cache_fn()
    g = torch.Generator().manual_seed(2)
    B = 3
    args = dict(zq=torch.randn(B, 2, 1, generator=g, dtype=F64), zk=torch.randn(B, 2, 1, generator=g, dtype=F64),
                v=torch.randn(B, 2, 1, 3, generator=g, dtype=F64), bandwidth=None)
    grad = kw.pop("grad", False)
    args.update(kw)
    with torch.enable_grad() if grad else torch.no_grad():
        return c.step_bump(args.pop("zq"), args.pop("zk"), args.pop("v"), args.pop("bandwidth"), **args)


ROWS = (
    [(f"kv-select-{n}", _select(filled, i), e, rf"^{KSEL}: {m}") for n, i, e, m in BAD_INDEX]
    + [(f"kv-sliced-select-{n}", _select(lambda: filled("sliced"), i), e, rf"^{KSEL}: {m}") for n, i, e, m in BAD_INDEX]
    + [(f"runs-select-{n}", _select(runs, i), e, rf"^{RSEL}: {m}") for n, i, e, m in BAD_INDEX]
    + [
        # an empty cache checks what it can: the type, the rank, negative indices, an empty selection
        ("kv-empty-select-float", _select(KVCache, T(0.5, dtype=F64)), TypeError, rf"^{KSEL}: .* got dtype torch.float64"),
        ("kv-empty-select-negative", _select(KVCache, T(-2)), ValueError, rf"^{KSEL}: row indices must lie in \[0, B\)"),
        ("runs-empty-select-2d", _select(SlicedDecodeCache, T(0, 1).view(2, 1)), ValueError, rf"^{RSEL}: .* got shape \(2, 1\)"),
        ("runs-empty-select-empty", _select(SlicedDecodeCache, T()), ValueError, rf"^{RSEL}: selects no sequence"),
        # finding 1: step_bump without a bandwidth ran eq. 3; refused as bump(zq, None) is
        ("runs-step-bump-none", lambda: _step_bump(runs), TypeError,
         r"^SlicedDecodeCache.step_bump: bandwidth: expected a number or a tensor, got None"),
        ("runs-step-bump-none-empty", lambda: _step_bump(SlicedDecodeCache), TypeError,
         r"^SlicedDecodeCache.step_bump: bandwidth: expected a number or a tensor, got None"),
        ("runs-step-bump-zero", lambda: _step_bump(runs, bandwidth=0.0), ValueError,
         r"^SlicedDecodeCache.step_bump: bandwidth: expected finite values > 0"),
        ("runs-step-bump-str", lambda: _step_bump(runs, bandwidth="1"), TypeError,
         r"^SlicedDecodeCache.step_bump: bandwidth: expected a number or a tensor, got '1'"),
        ("runs-step-bump-grad", lambda: _step_bump(runs, bandwidth=torch.tensor(1.0, dtype=F64, requires_grad=True),
                                                   grad=True), RuntimeError,
         r"^SlicedDecodeCache.step_bump: the sorted runs are built in place and are not differentiable"),
        ("runs-bump-grad", lambda: runs().bump(torch.zeros(3, 2, 1, dtype=F64), torch.tensor(1.0, dtype=F64, requires_grad=True)),
         RuntimeError, r"^SlicedDecodeCache.bump: the sorted runs are built in place and are not differentiable"),
        ("runs-bump-none", lambda: runs().bump(torch.zeros(3, 2, 1, dtype=F64), None), TypeError,
         r"^SlicedDecodeCache.bump: bandwidth: expected a number or a tensor, got None"),
        ("runs-relu-zq-list", lambda: runs().relu([[0.0]]), TypeError, r"^SlicedDecodeCache.relu: zq: expected a torch.Tensor"),
        ("runs-append-kw-str", lambda: runs().append(torch.zeros(3, 2, 1, dtype=F64), torch.zeros(3, 2, 1, 3, dtype=F64),
                                                      key_weights="1"), TypeError,
         r"^SlicedDecodeCache.append: key_weights: expected a tensor, got str"),
        # the other public methods of KVCache: wrong types named, before anything is kept
        ("kv-begin-str", lambda: KVCache().begin("3"), TypeError, r"^KVCache.begin: n_tokens: expected an int >= 0"),
        ("kv-begin-negative", lambda: KVCache().begin(-1), ValueError, r"^KVCache.begin: n_tokens: expected an int >= 0 \(the tokens of the call\), got -1"),
        ("kv-begin-float", lambda: KVCache().begin(2.0), TypeError, r"^KVCache.begin: n_tokens: expected an int >= 0 \(the tokens of the call\), got 2.0"),
        ("kv-update-list", lambda: _kv_update(tensors=([1.0], [2.0])), TypeError,
         r"^KVCache.update: tensors: expected one or more torch.Tensors, got \['list', 'list'\]"),
        ("kv-update-none", lambda: _kv_update(tensors=()), TypeError, r"^KVCache.update: tensors: expected one or more"),
        ("kv-update-dim", lambda: _kv_update(dim=4), ValueError, r"^KVCache.update: dim: expected the token dimension .* \[0, 4\)\), got 4"),
        ("kv-update-dim-str", lambda: _kv_update(dim="2"), ValueError, r"^KVCache.update: dim: .* got '2'"),
        ("kv-update-key-max", lambda: _kv_update(key_max="1"), TypeError, r"^KVCache.update: key_max: expected a number or None, got str"),
        ("kv-update-t", lambda: _kv_update(t="0"), TypeError, r"^KVCache: t: expected a number \(the step's start time\), got str"),
        ("kv-past-t", lambda: KVCache().past(object(), None), TypeError, r"^KVCache: t: expected a number"),
        ("kv-state-make", lambda: KVCache().state(object(), 0.0, 3), TypeError, r"^KVCache.state: make: expected a callable"),
        ("kv-sorted-runs", lambda: KVCache(sorted_runs=1), TypeError, r"^KVCache: sorted_runs: expected a bool, got int"),
        ("kv-check-use-batch", lambda: KVCache().check_use(lm("softmax"), "3", 2, F64, torch.device("cpu")), TypeError,
         r"^KVCache.check_use: batch_size: expected an int >= 1, got '3'"),
        ("kv-check-use-batch-zero", lambda: KVCache().check_use(lm("softmax"), 0, 2, F64, torch.device("cpu")), ValueError,
         r"^KVCache.check_use: batch_size: expected an int >= 1, got 0"),
        ("kv-check-use-steps", lambda: KVCache().check_use(lm("softmax"), 3, 2.0, F64, torch.device("cpu")), TypeError,
         r"^KVCache.check_use: n_steps: expected an int >= 1, got 2.0"),
        ("kv-key-max-t", lambda: KVCache().key_max(object(), "0"), TypeError, r"^KVCache: t: expected a number"),
        ("kv-has-state-t", lambda: KVCache().has_state(object(), [0.0]), TypeError, r"^KVCache: t: expected a number"),
        ("runs-nbytes-str", lambda: runs().nbytes("yes"), TypeError, r"^SlicedDecodeCache.nbytes: allocated: expected a bool"),
        # a call that failed after some terms appended (simulated: one of two operators appended)
        ("kv-begin-after-partial-call", lambda: _partial().begin(1), ValueError,
         r"^cache: its entries hold \[4, 5\] tokens: an earlier call failed after some attention terms had appended"),
    ]
)


@pytest.mark.parametrize("case", cases(*ROWS))
def test_bad_input(case):
    run_case(case)


def test_case_count():
    assert len(ROWS) >= 50


# -- a refused select or step leaves the cache usable -----------------------------------------------
def _continue_equals_recompute(m, cache, seq, steps=2):
    """Decode ``steps`` tokens of ``seq`` (whose last token is not cached yet) through ``cache``:
    each step's logits equal the whole sequence recomputed without a cache."""
    with torch.no_grad():
        for _ in range(steps):
            a = m.next_token_logits(seq[:, -1:], cache=cache)
            ref = m(seq).logits[:, -1]
            assert float((a - ref).abs().max()) <= 1e-12 * float(ref.abs().max())
            seq = torch.cat([seq, ref.argmax(-1, keepdim=True)], 1)


@pytest.mark.parametrize("attention", ["softmax", "sliced"])
def test_refused_selects_leave_the_cache_usable(attention):
    """Every bad index of the table refused on the same cache: its length and batch unchanged, and
    a valid select then keeps the right rows (the next logits are the kept sequences')."""
    m = lm(attention)
    cache = filled(attention)
    with torch.no_grad():
        nxt = m.next_token_logits(IDS[:, -1:] * 0 + 5, cache=cache).argmax(-1, keepdim=True)
    seq = torch.cat([IDS, IDS[:, -1:] * 0 + 5, nxt], 1)
    for _, index, exc, _ in BAD_INDEX:
        with pytest.raises(exc):
            cache.select(index)
        assert cache.length == 5 and cache.batch_size() == 3
    cache.select(torch.tensor([True, False, True]))
    _continue_equals_recompute(m, cache, seq[[0, 2]])


@pytest.mark.parametrize("attention", ["softmax", "sliced"])
def test_select_after_refused_steps(attention):
    """Decode steps refused before any compute (another batch size, a mask of the wrong length,
    token ids out of range; for sliced attention also a mask that re-pads cached tokens, refused
    inside the first layer), then a select, then decoding: the logits of the kept sequences."""
    m = lm(attention)
    cache = filled(attention)
    bad = [dict(input_ids=IDS[:2, -1:]), dict(input_ids=IDS[:, -1:], attention_mask=torch.ones(3, 3)),
           dict(input_ids=IDS[:, -1:] + VOCAB)]
    if attention == "sliced":
        repad = torch.ones(3, 5, dtype=torch.long)
        repad[1, 0] = 0
        bad.append(dict(input_ids=IDS[:, -1:], attention_mask=repad))
    with torch.no_grad():
        for kw in bad:
            with pytest.raises(ValueError):
                m.next_token_logits(cache=cache, **kw)
            assert cache.length == 4
    cache.select(torch.tensor([2, 0, 0]))
    _continue_equals_recompute(m, cache, torch.cat([IDS, IDS[:, -1:] * 0 + 1], 1)[[2, 0, 0]], steps=3)


def test_step_bump_refused_without_a_bandwidth_leaves_the_cache_as_it_was():
    """Finding 1: ``step_bump(zq, zk, v, None)`` returned eq. 3 of the new token and appended it.
    Refused now, before anything is appended (an empty cache stays empty, so a later call may
    bring another batch)."""
    c = runs()
    with pytest.raises(TypeError, match="bandwidth"), torch.no_grad():
        c.step_bump(torch.zeros(3, 2, 1, dtype=F64), torch.zeros(3, 2, 1, dtype=F64),
                    torch.zeros(3, 2, 1, 3, dtype=F64), None)
    assert c.length == 5
    e = SlicedDecodeCache()
    with pytest.raises(TypeError, match="bandwidth"), torch.no_grad():
        e.step_bump(torch.zeros(3, 2, 1, dtype=F64), torch.zeros(3, 2, 1, dtype=F64),
                    torch.zeros(3, 2, 1, 3, dtype=F64), None)
    assert e.length == 0 and e.batch_size is None
    with torch.no_grad():
        e.append(torch.zeros(1, 4, 2, dtype=F64), torch.zeros(1, 4, 2, 5, dtype=F64))  # another batch: accepted
    assert e.batch_size == 1
