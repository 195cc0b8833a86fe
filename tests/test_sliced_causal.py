"""Causal sliced ReLU / ReLU-bump attention (paper 004, eqs. 2, 3, 7 over the causal prefix)
against naive masked O(N^2) formulas written here from the equations, with ties, duplicate
scores, N_q != N_k (bottom-right alignment), padding combined with causality, quadrature
weights; gradients, the refusal of double backward, no N x N tensor, bad input, and the
causal structure of a decoder-only continuous transformer."""

import pytest
import torch
from _helpers import output_and_grads

import opsplit.functional.sliced_causal as sc
from opsplit.functional import (
    causal_sliced_relu_attention,
    causal_sliced_relu_bump_attention,
    sliced_relu_attention,
)


# ------------------------------------------------------------------ naive references
def _visible(zq, zk, key_padding_mask=None, key_weights=None):
    """w_l * [l <= i + N_k - N_q], shape (..., N_q, N_k)."""
    Nq, Nk = zq.shape[-1], zk.shape[-1]
    i = torch.arange(Nq, device=zq.device).unsqueeze(1)
    j = torch.arange(Nk, device=zq.device).unsqueeze(0)
    vis = (j <= i + (Nk - Nq)).to(zq.dtype)
    w = torch.ones_like(zk)
    if key_weights is not None:
        w = w * key_weights
    if key_padding_mask is not None:
        m = key_padding_mask
        if m.dim() == 2 and zk.dim() == 3:
            m = m.unsqueeze(1)
        w = w * (~m).to(zk.dtype)
    return vis * w.unsqueeze(-2)


def naive_relu(zq, zk, v, centered=True, key_padding_mask=None, key_weights=None):
    """o_i = sum_{j<=t_i} w_j relu(q_i - z_j)(v_j - vbar_i) / sum_{l<=t_i} w_l |q_i - z_l|,
    vbar_i = sum_{l<=t_i} w_l v_l / sum_{l<=t_i} w_l (0 if not centered); 0 if den = 0."""
    W = _visible(zq, zk, key_padding_mask, key_weights)
    d = zq.unsqueeze(-1) - zk.unsqueeze(-2)
    den = (d.abs() * W).sum(-1, keepdim=True)
    out = torch.zeros(*zq.shape, v.shape[-1], dtype=v.dtype, device=v.device)
    # per query, explicitly (the prefix mean differs from query to query)
    for i in range(zq.shape[-1]):
        wi = W[..., i, :]  # (..., N_k)
        k = torch.relu(d[..., i, :]) * wi
        if centered:
            cnt = wi.sum(-1, keepdim=True)
            vbar = (wi.unsqueeze(-1) * v).sum(-2) / torch.where(cnt > 0, cnt, 1.0)
            num = (k.unsqueeze(-1) * (v - vbar.unsqueeze(-2))).sum(-2)
        else:
            num = (k.unsqueeze(-1) * v).sum(-2)
        di = den[..., i, :]
        out[..., i, :] = torch.where(di > 0, num / torch.where(di > 0, di, 1.0), 0.0)
    return out


def naive_bump(zq, zk, v, b, key_padding_mask=None, key_weights=None):
    """o_i = (1 / sum_{l<=t_i} w_l) sum_{j<=t_i} w_j relu(1 - |q_i - z_j| / b) v_j."""
    W = _visible(zq, zk, key_padding_mask, key_weights)
    b = torch.as_tensor(b, dtype=zq.dtype, device=zq.device)
    b = b.expand(zq.shape[:-1]).unsqueeze(-1).unsqueeze(-1)
    K = torch.relu(1 - (zq.unsqueeze(-1) - zk.unsqueeze(-2)).abs() / b) * W
    cnt = W.sum(-1, keepdim=True)
    return torch.where(cnt > 0, (K @ v) / torch.where(cnt > 0, cnt, 1.0), 0.0)


def make(B, H, Nq, Nk, D, dtype, device="cpu", ties=False, seed=0):
    g = torch.Generator().manual_seed(seed)
    if ties:  # few distinct values: ties between queries and keys, duplicate keys
        zq = torch.randint(-4, 5, (B, H, Nq), generator=g).to(dtype) / 2
        zk = torch.randint(-4, 5, (B, H, Nk), generator=g).to(dtype) / 2
    else:
        zq = torch.randn(B, H, Nq, generator=g, dtype=dtype)
        zk = torch.randn(B, H, Nk, generator=g, dtype=dtype)
    v = torch.randn(B, H, Nk, D, generator=g, dtype=dtype) + 2.0
    return zq.to(device), zk.to(device), v.to(device)


def _mask(B, Nk, device, seed=3, p=0.25):
    g = torch.Generator().manual_seed(seed)
    m = torch.rand(B, Nk, generator=g) < p
    m[0, :70] = True  # the first queries of batch 0 see no key at all
    return m.to(device)


SHAPES = [(300, 300), (200, 333), (333, 200), (64, 64), (1, 7), (129, 129)]


# ------------------------------------------------------------------ forward
@pytest.mark.parametrize("Nq,Nk", SHAPES)
@pytest.mark.parametrize("ties", [False, True], ids=["random", "ties"])
@pytest.mark.parametrize("centered", [True, False], ids=["eq3", "eq2"])
def test_relu_matches_naive(Nq, Nk, ties, centered):
    zq, zk, v = make(2, 2, Nq, Nk, 3, torch.float64, ties=ties)
    m = _mask(2, Nk, "cpu")
    for kpm in (None, m):
        out = causal_sliced_relu_attention(zq, zk, v, centered=centered, key_padding_mask=kpm)
        ref = naive_relu(zq, zk, v, centered, key_padding_mask=kpm)
        assert (out - ref).abs().max() <= 1e-10


@pytest.mark.parametrize("Nq,Nk", SHAPES)
@pytest.mark.parametrize("ties", [False, True], ids=["random", "ties"])
def test_bump_matches_naive(Nq, Nk, ties):
    zq, zk, v = make(2, 2, Nq, Nk, 3, torch.float64, ties=ties)
    b = torch.tensor([0.5, 1.25], dtype=torch.float64)  # with ties: |q - z| = b exactly
    m = _mask(2, Nk, "cpu")
    for kpm in (None, m):
        out = causal_sliced_relu_bump_attention(zq, zk, v, b, key_padding_mask=kpm)
        ref = naive_bump(zq, zk, v, b, key_padding_mask=kpm)
        assert (out - ref).abs().max() <= 1e-10


def test_key_weights_and_all_equal_scores():
    zq, zk, v = make(1, 2, 260, 260, 2, torch.float64, seed=5)
    w = torch.rand(1, 2, 260, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    out = causal_sliced_relu_attention(zq, zk, v, key_weights=w)
    assert (out - naive_relu(zq, zk, v, key_weights=w)).abs().max() <= 1e-10
    out = causal_sliced_relu_bump_attention(zq, zk, v, 0.7, key_weights=w)
    assert (out - naive_bump(zq, zk, v, 0.7, key_weights=w)).abs().max() <= 1e-10
    # every score equal: eq. 3's denominator vanishes (output 0); the bump is the prefix mean
    z = torch.zeros(1, 1, 200, dtype=torch.float64)
    vv = v[:, :1, :200]
    assert causal_sliced_relu_attention(z, z, vv).abs().max() == 0
    pm = vv.cumsum(-2) / torch.arange(1, 201, dtype=torch.float64).view(1, 1, -1, 1)
    assert (causal_sliced_relu_bump_attention(z, z, vv, 1.0) - pm).abs().max() <= 1e-12


def test_last_query_is_the_full_attention():
    # with N_q = N_k the last query sees every key: eq. 3 / eq. 7 of the full kernel
    zq, zk, v = make(1, 2, 400, 400, 3, torch.float64, seed=4)
    full = sliced_relu_attention(zq, zk, v)[..., -1, :]
    assert (causal_sliced_relu_attention(zq, zk, v)[..., -1, :] - full).abs().max() <= 1e-12


@pytest.mark.parametrize("fn", ["relu", "bump"])
def test_prefix_outputs_are_bitwise_independent_of_later_tokens(fn, dtype):
    zq, zk, v = make(2, 2, 700, 700, 4, dtype, seed=6)
    v = v * 3 + 5
    m = _mask(2, 700, "cpu")

    def f(a, b, c, mm):
        if fn == "relu":
            return causal_sliced_relu_attention(a, b, c, key_padding_mask=mm)
        return causal_sliced_relu_bump_attention(a, b, c, 0.6, key_padding_mask=mm)

    full = f(zq, zk, v, m)
    for k in (1, 64, 65, 300, 513):
        part = f(zq[..., :k], zk[..., :k], v[..., :k, :], m[:, :k])
        assert torch.equal(full[..., :k, :], part)


@pytest.mark.parametrize("dtype, e_w", [(torch.float64, 20), (torch.float32, 6), (torch.float32, 30)],
                         ids=["f64-1e20", "f32-1e6", "f32-1e30"])
def test_prefix_outputs_are_bitwise_independent_of_later_tokens_with_spread_weights(dtype, e_w):
    """Issue 42: the tables of each node are shifted by its own heaviest key, and float32 rows of
    weights spanning more than 2^64 run in float64: still the outputs of a prefix are bitwise
    those of the prefix alone.  (Float64 rows whose weights grow by more than 2^192 along the
    sequence run in segments, batched with left padding: equal to rounding only, as before.)"""
    zq, zk, v = make(2, 2, 400, 400, 3, dtype, seed=12)
    g = torch.Generator().manual_seed(13)
    w = (10.0 ** ((torch.rand(2, 2, 400, generator=g, dtype=torch.float64) * 2 - 1) * e_w)).to(dtype)
    zq[..., ::3] = zk[..., ::3]  # queries on their own keys
    full = causal_sliced_relu_attention(zq, zk, v, key_weights=w)
    for k in (1, 64, 65, 130, 257):
        part = causal_sliced_relu_attention(zq[..., :k], zk[..., :k], v[..., :k, :], key_weights=w[..., :k])
        assert torch.equal(full[..., :k, :], part)


def test_float32_close_to_float64():
    zq, zk, v = make(1, 2, 5000, 5000, 8, torch.float64, seed=8)
    for fn in (lambda a, b, c: causal_sliced_relu_attention(a, b, c),
               lambda a, b, c: causal_sliced_relu_bump_attention(a, b, c, 0.3)):
        ref = fn(zq, zk, v)
        out = fn(zq.float(), zk.float(), v.float()).double()
        assert ((out - ref).abs().max() / ref.abs().max()) < 1e-5


@pytest.mark.parametrize("fn", ["relu", "bump"])
def test_chunked_tables_agree(fn, monkeypatch):
    # tiny table and tile budgets: several row chunks, column chunks and tile steps
    zq, zk, v = make(2, 2, 600, 611, 5, torch.float64, ties=True, seed=9)
    g = torch.randn(2, 2, 600, 5, generator=torch.Generator().manual_seed(1), dtype=torch.float64)

    def run():
        attention = (causal_sliced_relu_attention if fn == "relu"
                     else lambda *ins: causal_sliced_relu_bump_attention(*ins, 0.5))
        return output_and_grads(attention, (zq, zk, v), g)

    ref = run()
    monkeypatch.setattr(sc, "_TABLE_BYTES", 64 * 5 * 8 * 3)
    monkeypatch.setattr(sc, "_TILE_BYTES", 1)
    for a, b in zip(run(), ref):
        assert (a - b).abs().max() <= 1e-12
    monkeypatch.setattr(sc, "_TABLE_BYTES", 64 * 8 * 2)  # below one row: column chunks
    for a, b in zip(run(), ref):
        assert (a - b).abs().max() <= 1e-12


# ------------------------------------------------------------------ gradients
@pytest.mark.parametrize("Nq,Nk", [(300, 300), (200, 333), (333, 200)])
@pytest.mark.parametrize("ties", [False, True], ids=["random", "ties"])
def test_gradients_match_autograd_of_naive(Nq, Nk, ties):
    zq, zk, v = make(2, 2, Nq, Nk, 3, torch.float64, ties=ties, seed=11)
    m = _mask(2, Nk, "cpu", seed=4)
    g = torch.randn(2, 2, Nq, 3, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    b0 = torch.tensor([0.5, 1.25], dtype=torch.float64)
    cases = [
        (lambda a, k, c, bb: causal_sliced_relu_attention(a, k, c, key_padding_mask=m),
         lambda a, k, c, bb: naive_relu(a, k, c, key_padding_mask=m)),
        (lambda a, k, c, bb: causal_sliced_relu_attention(a, k, c, centered=False),
         lambda a, k, c, bb: naive_relu(a, k, c, centered=False)),
        (lambda a, k, c, bb: causal_sliced_relu_bump_attention(a, k, c, bb, key_padding_mask=m),
         lambda a, k, c, bb: naive_bump(a, k, c, bb, key_padding_mask=m)),
    ]
    for fast, slow in cases:
        grads = []
        for f in (fast, slow):
            ins = [t.clone().requires_grad_() for t in (zq, zk, v, b0)]
            out = f(*ins)
            used = [t for t in ins if t.requires_grad]
            gr = torch.autograd.grad((out * g).sum(), used, allow_unused=True)
            grads.append([torch.zeros_like(t) if x is None else x for x, t in zip(gr, used)])
        for a, b in zip(*grads):
            assert (a - b).abs().max() <= 1e-10


def test_gradcheck_relu():
    # 90 positions: dense blocks and one level of the divide and conquer
    zq, zk, v = make(1, 1, 90, 90, 1, torch.float64, seed=12)
    m = torch.zeros(1, 90, dtype=torch.bool)
    m[0, 5:12] = True
    ins = [t.clone().requires_grad_() for t in (zq, zk, v)]
    assert torch.autograd.gradcheck(
        lambda a, b, c: causal_sliced_relu_attention(a, b, c, key_padding_mask=m), ins)


def test_gradcheck_bump():
    b = torch.tensor(0.8, dtype=torch.float64, requires_grad=True)
    zq, zk, v = make(1, 1, 60, 90, 1, torch.float64, seed=13)
    ins = [t.clone().requires_grad_() for t in (zq, zk, v)] + [b]
    assert torch.autograd.gradcheck(causal_sliced_relu_bump_attention, ins)


def test_double_backward_is_refused():
    zq, zk, v = make(1, 1, 80, 80, 2, torch.float64, seed=14)
    for f in (causal_sliced_relu_attention, lambda a, b, c: causal_sliced_relu_bump_attention(a, b, c, 0.5)):
        ins = [t.clone().requires_grad_() for t in (zq, zk, v)]
        with pytest.raises(RuntimeError, match="cannot differentiate twice"):
            torch.autograd.grad(f(*ins).pow(2).sum(), ins[0], create_graph=True)


@pytest.mark.parametrize("use", ["linear", "plus-smooth-term", "propagator"])
@pytest.mark.parametrize("kind", ["relu", "bump"])
def test_double_backward_is_refused_whatever_the_loss(kind, use):
    """Issue 8, finding 1 for the causal kernels: with ``once_differentiable`` a loss linear
    in the kernel's output (the incoming gradient does not require grad) gave a second
    derivative without the kernel's terms, silently: plus a smooth term, the Hessian-vector
    product was wrong in the kernel's entries; through a propagator it differed from finite
    differences by 0.98 (norm 1.5).  Any backward with create_graph=True must refuse."""
    from opsplit import Grid, Interval, Propagator
    from opsplit.operators import SlicedReLUAttention, SlicedReLUBumpAttention
    from opsplit.schemes import Lie

    D = torch.float64
    g = torch.Generator().manual_seed(21)
    if use == "propagator":
        cls = SlicedReLUAttention if kind == "relu" else SlicedReLUBumpAttention
        P = Propagator(Lie([cls.build(4, 2, causal=True, dtype=D, generator=g)]), 2,
                       grid=Grid(x=Interval(length=1.0), y=Interval(n=4, length=2.0)))
        x = torch.randn(1, 3, 4, dtype=D, generator=g, requires_grad=True)
        loss = P(x).sum()
    else:
        f = causal_sliced_relu_attention if kind == "relu" else (
            lambda a, b, c: causal_sliced_relu_bump_attention(a, b, c, 0.7))
        zq, zk, v = make(1, 1, 6, 6, 2, D, seed=22)
        x = zq.clone().requires_grad_()
        w = torch.randn(1, 1, 6, 2, dtype=D, generator=g)
        loss = (f(x, zk, v) * w).sum()
        if use == "plus-smooth-term":
            loss = loss + x.pow(3).sum()
    with pytest.raises(RuntimeError, match=r"causal_sliced_relu(_bump)?_attention: cannot differentiate twice"):
        torch.autograd.grad(loss, x, create_graph=True)
    # first derivatives are unaffected
    (gx,) = torch.autograd.grad(loss, x)
    assert gx.shape == x.shape and bool(torch.isfinite(gx).all()) and gx.abs().sum() > 0


# ------------------------------------------------------------------ no N x N tensor
def test_no_quadratic_tensor_forward_or_backward():
    from torch.profiler import ProfilerActivity, profile

    N, D = 3000, 4
    zq, zk, v = make(1, 2, N, N, D, torch.float32, seed=15)
    m = torch.zeros(1, N, dtype=torch.bool)
    m[0, ::7] = True
    ins = [t.clone().requires_grad_() for t in (zq, zk, v)]
    b = torch.tensor(0.5, requires_grad=True)
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True,
                 profile_memory=True) as prof:
        causal_sliced_relu_attention(*ins, key_padding_mask=m).sum().backward()
        causal_sliced_relu_bump_attention(*ins, b, key_padding_mask=m).sum().backward()
    numels = [1]
    for e in prof.events():
        for shp in e.input_shapes or []:
            if isinstance(shp, (list, tuple)) and all(isinstance(x, int) for x in shp):
                n = 1
                for x in shp:
                    n *= x
                numels.append(n)
    assert len(numels) > 100  # the profiler saw the ops
    assert max(numels) < N * N  # no tensor with N_q * N_k elements (the largest is O(N D))
    biggest = max(e.cpu_memory_usage for e in prof.events() if e.cpu_memory_usage > 0)
    assert biggest < N * N  # bytes: an N x N float32 matrix would be 4 N^2


# ------------------------------------------------------------------ bad input
def test_bad_input_errors():
    zq, zk, v = make(1, 2, 10, 10, 3, torch.float64)
    f, fb = causal_sliced_relu_attention, causal_sliced_relu_bump_attention
    with pytest.raises(ValueError, match="shape"):
        f(zq, zk, v[..., :9, :])
    with pytest.raises(ValueError, match="shape"):
        f(zq, zk[:, :1], v)
    with pytest.raises(TypeError, match="float32 or float64"):
        f(zq.long(), zk, v)
    with pytest.raises(TypeError, match="share one dtype"):
        f(zq.float(), zk, v)
    with pytest.raises(ValueError, match="at least one key"):
        f(zq, zk[..., :0], v[..., :0, :])
    bad = zq.clone()
    bad[0, 0, 3] = float("nan")
    with pytest.raises(ValueError, match="zq: expected finite"):
        f(bad, zk, v)
    badv = v.clone()
    badv[0, 1, 9, 0] = float("inf")
    with pytest.raises(ValueError, match="v: expected finite"):
        f(zq, zk, badv)
    with pytest.raises(TypeError, match="key_padding_mask: expected a bool"):
        f(zq, zk, v, key_padding_mask=torch.zeros(1, 10))
    with pytest.raises(ValueError, match="key_padding_mask: expected shape"):
        f(zq, zk, v, key_padding_mask=torch.zeros(1, 9, dtype=torch.bool))
    with pytest.raises(ValueError, match="key_weights"):
        f(zq, zk, v, key_weights=-torch.ones(10, dtype=torch.float64))
    with pytest.raises(ValueError, match="bandwidth"):
        fb(zq, zk, v, 0.0)
    with pytest.raises(ValueError, match="bandwidth"):
        fb(zq, zk, v, torch.ones(3, dtype=torch.float64))
    with pytest.raises(TypeError, match="bandwidth"):
        fb(zq, zk, v, "1")


# ------------------------------------------------------------------ CUDA
@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
def test_cuda_matches_naive_and_cpu(dtype):
    zq, zk, v = make(2, 2, 333, 300, 3, dtype, ties=True, seed=16)
    m = _mask(2, 300, "cpu")
    tol = 1e-10 if dtype == torch.float64 else 1e-4
    g = torch.randn(2, 2, 333, 3, dtype=dtype, generator=torch.Generator().manual_seed(3))
    for f in (lambda a, b, c, mm: causal_sliced_relu_attention(a, b, c, key_padding_mask=mm),
              lambda a, b, c, mm: causal_sliced_relu_bump_attention(a, b, c, 0.75, key_padding_mask=mm)):
        res = []
        for dev in ("cpu", "cuda"):
            ins = [t.to(dev).requires_grad_() for t in (zq, zk, v)]
            out = f(*ins, m.to(dev))
            (out * g.to(dev)).sum().backward()
            res.append([out.detach().cpu()] + [t.grad.cpu() for t in ins])
        for a, b in zip(*res):
            assert (a - b).abs().max() <= tol * max(1.0, float(b.abs().max()))
    ref = naive_relu(zq.double(), zk.double(), v.double(), key_padding_mask=m)
    out = causal_sliced_relu_attention(zq.cuda(), zk.cuda(), v.cuda(), key_padding_mask=m.cuda())
    assert (out.cpu().double() - ref).abs().max() <= tol


# ------------------------------------------------------------------ operators and a decoder
def _decoder(kind, NY=4, H=2, NT=2, dtype=torch.float64):
    from opsplit import Propagator
    from opsplit.controls import PiecewiseConstant
    from opsplit.models import paper_scheme
    from opsplit.operators import (
        FFNIntegral,
        ProjectionS1,
        SlicedReLUAttention,
        SlicedReLUBumpAttention,
    )

    gen = torch.Generator().manual_seed(0)
    if kind == "relu":
        attn = SlicedReLUAttention.build(NY, H, projection="mlp", n_steps=NT, causal=True,
                                         generator=gen, dtype=dtype)
    else:
        attn = SlicedReLUBumpAttention.build(NY, H, bandwidth=0.5, n_steps=NT, causal=True,
                                             generator=gen, dtype=dtype)
    ffn = [FFNIntegral(PiecewiseConstant(torch.randn(NT, NY, NY, generator=gen, dtype=dtype) / NY,
                                         axes=("y", "y")),
                       PiecewiseConstant(torch.zeros(NT, NY, dtype=dtype), axes=("y",)),
                       bias_axis="y") for _ in range(2)]
    return Propagator(paper_scheme(attn, ProjectionS1(0.0, 1.0), ffn), NT), attn


@pytest.mark.parametrize("kind", ["relu", "bump"])
def test_decoder_output_depends_only_on_the_past(kind):
    # a continuous decoder-only transformer (paper 002's Lie scheme (13)-(17) with causal
    # sliced attention): the Jacobian d out_i / d u_j vanishes exactly for j > i
    model, attn = _decoder(kind)
    assert "causal=True" in repr(attn)
    N = 150
    u = torch.randn(1, N, 4, generator=torch.Generator().manual_seed(1), dtype=torch.float64,
                    requires_grad=True)
    out = model(u)
    c = torch.randn(4, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    for i in (0, 63, 64, 100, 149):
        gr, = torch.autograd.grad((out[0, i] * c).sum(), u, retain_graph=True)
        if i + 1 < N:
            assert gr[0, i + 1 :].abs().max() == 0
        assert gr[0, : i + 1].abs().max() > 0  # it does depend on the past
    # and a prefix run gives the same outputs
    with torch.no_grad():
        assert (model(u[:, :100]) - out[:, :100]).abs().max() <= 1e-12


def test_operator_field_matches_dense_causal_weights():
    from opsplit.operators import SlicedReLUAttention

    op = SlicedReLUAttention.build(4, 2, causal=True, dtype=torch.float64,
                                   generator=torch.Generator().manual_seed(3))
    u = torch.randn(2, 90, 4, generator=torch.Generator().manual_seed(4), dtype=torch.float64)
    g = op.resolve_grid(u, None)
    A = op.attention_weights(u, grid=g)  # (B, H, N, N), lower triangular
    assert A.triu(1).abs().max() == 0
    _, _, V = op.scores_and_values(0.0, u, g)
    vbar = V.cumsum(-2) / torch.arange(1, 91, dtype=torch.float64).view(1, 1, -1, 1)
    # eq. 3 with prefix centring: sum_j A_ij (V_j - Vbar_i), summed over the heads
    ref = (A @ V - A.sum(-1, keepdim=True) * vbar).sum(1)
    assert (op.field(0.0, u, g) - ref).abs().max() <= 1e-10
    with pytest.raises(TypeError, match="causal"):
        SlicedReLUAttention.build(4, 2, causal=1)


def _causal_propagator(kind):
    from opsplit import Grid, Interval, Propagator
    from opsplit.operators import SlicedReLUAttention, SlicedReLUBumpAttention
    from opsplit.schemes import Lie

    cls = SlicedReLUAttention if kind == "relu" else SlicedReLUBumpAttention
    op = cls.build(4, 2, causal=True, dtype=torch.float64, generator=torch.Generator().manual_seed(23))
    return Propagator(Lie([op]), 2, grid=Grid(x=Interval(length=1.0), y=Interval(n=4, length=2.0)))


@pytest.mark.parametrize("kind", ["relu", "bump"])
def test_jit_trace_is_refused_clearly(kind):
    # issue 8, finding 8 for the causal kernels: tracing failed with "unordered_map::at"
    P = _causal_propagator(kind)
    x = torch.randn(2, 3, 4, dtype=torch.float64)
    with pytest.raises(RuntimeError, match=r"causal_sliced_relu(_bump)?_attention: torch\.jit\.trace is not supported"):
        torch.jit.trace(P, (x,), check_trace=False)


@pytest.mark.parametrize("kind", ["relu", "bump"])
def test_compile_runs_the_kernel_eagerly(kind):
    # issue 8, finding 8 for the causal kernels: torch.compile failed on a data-dependent
    # guard.  The kernel is excluded from the graph: without fullgraph the compiled model
    # equals eager at changing batch sizes; fullgraph=True names the kernel
    torch._dynamo.reset()
    P = _causal_propagator(kind)
    C = torch.compile(P, backend="eager")
    for B in (2, 5):
        x = torch.randn(B, 3, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(B))
        torch.testing.assert_close(C(x), P(x), rtol=0, atol=1e-13)
    torch._dynamo.reset()
    with pytest.raises(Exception, match=r"causal_sliced_relu(_bump)?_attention"):
        torch.compile(P, fullgraph=True, backend="eager")(torch.randn(2, 3, 4, dtype=torch.float64))
    torch._dynamo.reset()
