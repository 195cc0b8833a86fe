"""The forward pass of full sliced ReLU attention without autograd (eqs. 2-3,
``opsplit.functional.sliced._relu_forward_fast``: in-block prefix tables plus block offsets
read by one ``embedding_bag``) against the naive O(N^2) formula in float64, at the block
boundaries of its tables, with ties, weights, masks, chunked rows and reused workspaces; and
against the autograd forward pass of the same kernel."""

from __future__ import annotations

import pytest
import torch

import opsplit.functional.sliced as sliced_mod
from opsplit.functional import sliced_relu_attention

TOL = {torch.float32: 2e-6, torch.float64: 1e-12}


def naive(zq, zk, v, w=None, centered=True):
    """Eq. 3 (eq. 2 if not centered) with N_q x N_k tensors, in float64; 0 where the
    denominator vanishes."""
    zq, zk, v = zq.double(), zk.double(), v.double()
    w = torch.ones_like(zk) if w is None else w.double()
    d = zq.unsqueeze(-1) - zk.unsqueeze(-2)
    den = (d.abs() * w.unsqueeze(-2)).sum(-1, keepdim=True)
    if centered:
        W = w.sum(-1, keepdim=True).unsqueeze(-1)
        m = (w.unsqueeze(-1) * v).sum(-2, keepdim=True) / torch.where(W > 0, W, 1.0)
        v = v - m
    num = (torch.relu(d) * w.unsqueeze(-2)) @ v
    return torch.where(den > 0, num / torch.where(den > 0, den, 1.0), 0.0)


def _err(out, ref, v, centered):
    """max |out - ref| relative to the largest centred (eq. 3) or plain (eq. 2) value."""
    vv = v.double()
    scale = (vv - vv.mean(-2, keepdim=True)).abs().max() if centered else vv.abs().max()
    return float((out.double() - ref).abs().max() / scale.clamp_min(1e-300))


@pytest.fixture
def count_fast(monkeypatch):
    calls = []
    f = sliced_mod._relu_forward_fast

    def counted(*a, **k):
        calls.append(1)
        return f(*a, **k)

    monkeypatch.setattr(sliced_mod, "_relu_forward_fast", counted)
    return calls


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("centered", [True, False])
def test_block_boundaries(dtype, centered, count_fast):
    # N_k around the blocks of 8 sorted keys (position 0 is a key of weight 0, so the table
    # has N_k + 1 positions) and the superblocks of 16 blocks of the offsets' scan
    g = torch.Generator().manual_seed(0)
    for Nk in (1, 2, 6, 7, 8, 9, 15, 16, 17, 127, 128, 129, 135, 136, 137, 300):
        for Nq in (1, 5, Nk, 2 * Nk + 3):
            zq = torch.randn(2, 3, Nq, generator=g, dtype=dtype) * 2
            zk = torch.randn(2, 3, Nk, generator=g, dtype=dtype)
            v = torch.randn(2, 3, Nk, 5, generator=g, dtype=dtype)
            with torch.no_grad():
                out = sliced_relu_attention(zq, zk, v, centered=centered)
            err = _err(out, naive(zq, zk, v, centered=centered), v, centered)
            assert err < TOL[dtype], (Nk, Nq, err)
    assert len(count_fast) == 16 * 4


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_ties_and_extremes(dtype, count_fast):
    # integer scores: many keys tied with each other and with the queries (ReLU(0) = 0,
    # |0| = 0); queries below and above every key; all keys equal to the query (den = 0)
    g = torch.Generator().manual_seed(1)
    zk = torch.randint(-3, 4, (4, 40), generator=g).to(dtype)
    zq = torch.cat([torch.randint(-3, 4, (4, 30), generator=g).to(dtype),
                    torch.full((4, 2), -10.0, dtype=dtype), torch.full((4, 2), 10.0, dtype=dtype)], 1)
    zk[3] = 1.0
    zq[3, :5] = 1.0
    v = torch.randn(4, 40, 3, generator=g, dtype=dtype)
    for centered in (True, False):
        with torch.no_grad():
            out = sliced_relu_attention(zq, zk, v, centered=centered)
        ref = naive(zq, zk, v, centered=centered)
        assert _err(out, ref, v, centered) < TOL[dtype]
        assert torch.equal(out[3, :5], torch.zeros_like(out[3, :5]))
    assert len(count_fast) == 2


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_weights_masks_and_workspace_reuse(dtype, count_fast):
    # the same shapes called with weights, a mask (one row fully masked), and none, in turn:
    # the reused work buffers (the tables' unit weights) must not leak between calls
    g = torch.Generator().manual_seed(2)
    zq = torch.randn(2, 2, 50, generator=g, dtype=dtype)
    zk = torch.randn(2, 2, 45, generator=g, dtype=dtype)
    v = torch.randn(2, 2, 45, 4, generator=g, dtype=dtype)
    w = torch.rand(2, 2, 45, generator=g, dtype=dtype)
    mask = torch.rand(2, 45, generator=g) < 0.4
    mask[1] = True
    wm = (~mask).to(dtype).unsqueeze(1).expand(2, 2, 45)
    for _ in range(2):
        for kw, wr in ((dict(key_weights=w), w), ({}, None), (dict(key_padding_mask=mask), wm),
                       ({}, None)):
            for centered in (True, False):
                with torch.no_grad():
                    out = sliced_relu_attention(zq, zk, v, centered=centered, **kw)
                ref = naive(zq, zk, v, wr, centered)
                assert _err(out, ref, v, centered) < TOL[dtype], (kw.keys(), centered)
    with torch.no_grad():
        out = sliced_relu_attention(zq, zk, v, key_padding_mask=mask)
    assert torch.equal(out[1], torch.zeros_like(out[1]))  # no unmasked key: 0
    assert len(count_fast) == 2 * 4 * 2 + 1


def test_rows_in_chunks(monkeypatch, count_fast):
    # a work-buffer budget below one row: every row is its own chunk, the output is written
    # slice by slice (and in slices of fewer queries than a row); the values are gathered
    # two blocks at a time
    monkeypatch.setattr(sliced_mod, "_FAST_BYTES", 1)
    monkeypatch.setattr(sliced_mod, "_FAST_STEP_ROWS", 2 * sliced_mod._FAST_BLOCK)
    from opsplit.functional import _sorted
    monkeypatch.setattr(_sorted.embedding_bag_into, "__defaults__", (7,))
    g = torch.Generator().manual_seed(3)
    zq, zk = torch.randn(3, 2, 33, generator=g), torch.randn(3, 2, 20, generator=g)
    v = torch.randn(3, 2, 20, 6, generator=g)
    w = torch.rand(3, 2, 20, generator=g)
    for kw, wr in (({}, None), (dict(key_weights=w), w)):
        with torch.no_grad():
            out = sliced_relu_attention(zq, zk, v, **kw)
        assert _err(out, naive(zq, zk, v, wr), v, True) < TOL[torch.float32]
    assert len(count_fast) == 2


def test_large_mean_is_centred_first():
    # values 1e4 + N(0, 1) in float32: the tables hold v - mean, so the result (of size 1)
    # keeps float32's relative accuracy (a table of raw values would lose 1e4 eps per key)
    g = torch.Generator().manual_seed(4)
    zq, zk = torch.randn(2, 300, generator=g), torch.randn(2, 300, generator=g)
    v = 1e4 + torch.randn(2, 300, 8, generator=g)
    with torch.no_grad():
        out = sliced_relu_attention(zq, zk, v)
    ref = naive(zq, zk, v)
    assert float((out.double() - ref).abs().max()) < 1e-5 * float(ref.abs().max())


@pytest.mark.parametrize("scale", [1e-30, 1.0, 1e19])
def test_same_as_the_autograd_forward(scale, count_fast):
    # without autograd the fast path, with it the prefix-table kernel (which keeps the tables
    # for the backward pass): the same values up to rounding, at every magnitude (rescaled rows)
    g = torch.Generator().manual_seed(5)
    zq, zk = torch.randn(2, 4, 70, generator=g) * scale, torch.randn(2, 4, 64, generator=g) * scale
    v = torch.randn(2, 4, 64, 16, generator=g) * scale
    with torch.no_grad():
        fast = sliced_relu_attention(zq, zk, v)
    assert len(count_fast) == 1
    slow = sliced_relu_attention(zq.requires_grad_(), zk, v)
    assert len(count_fast) == 1
    assert torch.isfinite(fast).all()
    assert float((fast - slow.detach()).abs().max()) <= 1e-5 * float(v.abs().max())
    assert _err(fast, naive(zq.detach(), zk, v), v, True) < TOL[torch.float32]


def test_float32_weights_spanning_more_than_2_64():
    # issue 42's rows (weights 1e-10 and 1e10, the query on the heavy key) are summed in
    # float64 by the fast path too
    zk = torch.tensor([[0.0, 1.0, 2.0]])
    zq = torch.tensor([[1.0, 0.5]])
    w = torch.tensor([[1e-10, 1e10, 1e-10]])
    v = torch.tensor([[[1.0], [5.0], [-3.0]]])
    with torch.no_grad():
        out = sliced_relu_attention(zq, zk, v, key_weights=w)
    ref = naive(zq, zk, v, w)
    assert float((out.double() - ref).abs().max()) < 1e-6 * float(ref.abs().max())


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_sort_and_rank_one(dtype):
    # the merged radix sort of keys and queries (float32) and the torch.sort / searchsorted
    # path (float64) against a direct count: ties, -0.0 and +0.0, +inf keys (masked)
    from opsplit.functional._sorted import sort_and_rank_one

    g = torch.Generator().manual_seed(6)
    keys = torch.randint(-4, 5, (3, 37), generator=g).to(dtype)
    keys[0, :5] = -0.0
    keys[1, -3:] = float("inf")
    probe = torch.randint(-5, 6, (3, 23), generator=g).to(dtype)
    probe[0, :4] = 0.0
    perm, ks, counts = sort_and_rank_one(keys, probe)
    assert torch.equal(ks, torch.sort(keys, 1)[0])
    assert torch.equal(keys.reshape(-1)[perm].view(3, 37), ks)
    assert sorted(perm.tolist()) == list(range(3 * 37))
    rows = perm.view(3, 37) // 37
    assert torch.equal(rows, torch.arange(3).unsqueeze(1).expand(3, 37))
    direct = (keys.unsqueeze(1) < probe.unsqueeze(2)).sum(2)
    assert torch.equal(counts, direct)
