"""The long-range retrieval task (opsplit.data.retrieval) and the decoder with a choice of
attention (opsplit.models.token_decoder): layout, determinism, errors, causality, and the
softmax decoder against torch's own pre-norm layer."""

import math

import pytest
import torch

from opsplit.data import IGNORE, flag_retrieval, retrieval_accuracy, retrieval_loss
from opsplit.models import ATTENTIONS, AttentionDecoder, TokenClassifier

pytestmark = pytest.mark.usefixtures("one_thread")


# -- data -------------------------------------------------------------------------------------
def test_flag_retrieval_layout():
    C, N, n = 5, 64, 40
    d = flag_retrieval(n, N, n_symbols=C, flag_span=(0.25, 0.5), seed=3)
    x, y = d.inputs, d.targets
    assert x.shape == y.shape == (n, N) and x.dtype == y.dtype == torch.int64
    assert int(x.min()) >= 0 and int(x.max()) < 2 * C
    for i in range(n):
        flagged = torch.nonzero(x[i] >= C).flatten().tolist()
        assert flagged == [d.info["flag"][i]]  # exactly one flag, where info says
        p = flagged[0]
        assert 16 <= p < 32
        assert (y[i, : p + 1] == IGNORE).all()
        assert (y[i, p + 1:] == x[i, p] - C).all()
    assert d.info["vocab_size"] == 2 * C


def test_flag_retrieval_span():
    C, N, m = 4, 40, 5
    d = flag_retrieval(30, N, n_symbols=C, flag_span=(0.0, 1.0), flag_length=m, seed=1)
    for i in range(30):
        p = d.info["flag"][i]
        assert torch.nonzero(d.inputs[i] >= C).flatten().tolist() == list(range(p, p + m))
        assert (d.inputs[i, p:p + m] == d.inputs[i, p]).all()  # one symbol along the span
        assert (d.targets[i, : p + m] == IGNORE).all() and (d.targets[i, p + m:] == d.inputs[i, p] - C).all()
        assert p + m <= N - 1
    # flag_length 1 is the single flag (same draws)
    assert torch.equal(flag_retrieval(4, 20, seed=2).inputs, flag_retrieval(4, 20, seed=2, flag_length=1).inputs)
    # distances of retrieval_accuracy count from the span's last token
    logits = torch.nn.functional.one_hot(d.targets.clamp(min=0), C).double()
    assert retrieval_accuracy(logits, d.targets) == 1.0
    # right answers closer than k tokens after the span's last token, wrong ones from k on
    k = 3
    last = torch.tensor(d.info["flag"])[:, None] + m - 1
    dist = torch.arange(N)[None, :] - last
    logits = torch.where((dist >= k)[..., None], logits.roll(1, dims=-1), logits)
    n_near = int(((dist >= 1) & (dist < k)).sum())
    assert retrieval_accuracy(logits, d.targets) == pytest.approx(n_near / int((dist >= 1).sum()))
    assert retrieval_accuracy(logits, d.targets, min_distance=k) == 0.0
    assert retrieval_accuracy(logits, d.targets, min_distance=k - 1) > 0.0


def test_flag_retrieval_deterministic_by_seed():
    a = flag_retrieval(8, 100, seed=1)
    b = flag_retrieval(8, 100, seed=1)
    c = flag_retrieval(8, 100, seed=2)
    assert torch.equal(a.inputs, b.inputs) and torch.equal(a.targets, b.targets)
    assert not torch.equal(a.inputs, c.inputs)
    # the flag can be at the last allowed position; every sequence keeps a target
    d = flag_retrieval(50, 3, n_symbols=2, flag_span=(0.0, 1.0))
    assert ((d.targets != IGNORE).sum(1) >= 1).all()


@pytest.mark.parametrize(
    "kw, err, match",
    [
        (dict(n_samples=0), ValueError, "n_samples"),
        (dict(n_samples=2.0), TypeError, "n_samples"),
        (dict(length=1), ValueError, "length"),
        (dict(n_symbols=1), ValueError, "n_symbols"),
        (dict(seed=-1), ValueError, "seed"),
        (dict(seed=True), TypeError, "seed"),
        (dict(flag_span=(0.5, 0.5)), ValueError, "flag_span"),
        (dict(flag_span=(0.6, 0.4)), ValueError, "flag_span"),
        (dict(flag_span=(0.0, 1.5)), ValueError, "flag_span"),
        (dict(flag_span=(0.0, 0.001)), ValueError, "flag_span"),
        (dict(flag_span=0.5), TypeError, "flag_span"),
        (dict(flag_length=0), ValueError, "flag_length"),
        (dict(flag_length=16), ValueError, "flag_span"),
        (dict(flag_span=(0.9, 1.0), flag_length=3), ValueError, "flag_span"),
        (dict(flag_span=(0.0, float("nan"))), TypeError, "flag_span"),
    ],
)
def test_flag_retrieval_bad_arguments(kw, err, match):
    args = dict(n_samples=2, length=16)
    args.update(kw)
    with pytest.raises(err, match=match):
        flag_retrieval(args.pop("n_samples"), args.pop("length"), **args)


def test_retrieval_loss_and_accuracy_against_loops():
    g = torch.Generator().manual_seed(0)
    d = flag_retrieval(3, 12, n_symbols=4, seed=5)
    logits = torch.randn(3, 12, 4, generator=g, dtype=torch.float64)
    terms, hits, far_hits, far_n = [], 0, 0, 0
    for i in range(3):
        p = d.info["flag"][i]
        for k in range(p + 1, 12):
            t = int(d.targets[i, k])
            terms.append(-(logits[i, k, t] - torch.logsumexp(logits[i, k], 0)))
            ok = int(logits[i, k].argmax()) == t
            hits += ok
            if k - p >= 4:
                far_hits, far_n = far_hits + ok, far_n + 1
    torch.testing.assert_close(retrieval_loss(logits, d.targets), torch.stack(terms).mean())
    assert retrieval_accuracy(logits, d.targets) == pytest.approx(hits / len(terms))
    assert retrieval_accuracy(logits, d.targets, min_distance=4) == pytest.approx(far_hits / far_n)
    assert math.isnan(retrieval_accuracy(logits, d.targets, min_distance=100))
    with pytest.raises(ValueError, match="logits"):
        retrieval_loss(logits[..., 0], d.targets)
    with pytest.raises(ValueError, match="min_distance"):
        retrieval_accuracy(logits, d.targets, min_distance=0)


# -- models -----------------------------------------------------------------------------------
def _model(attention, seed=0, **kw):
    g = torch.Generator().manual_seed(seed)
    dec = AttentionDecoder(8, 2, 16, attention=attention, n_steps=2, generator=g, dtype=torch.float64, **kw)
    return TokenClassifier(6, 3, dec, generator=torch.Generator().manual_seed(seed + 1), dtype=torch.float64)


@pytest.mark.parametrize("attention", ATTENTIONS)
def test_decoder_shapes_determinism_causality(attention):
    m = _model(attention)
    x = torch.randint(0, 6, (2, 70))
    out = m(x)
    assert out.shape == (2, 70, 3) and out.dtype == torch.float64
    m2 = _model(attention)
    assert all(torch.equal(a, b) for a, b in zip(m.state_dict().values(), m2.state_dict().values()))
    assert torch.equal(m2(x), out)
    m3 = _model(attention, seed=1)
    assert not torch.equal(m3(x), out)
    # causal: a change at position 50 leaves positions < 50 unchanged, and changes some later one
    x2 = x.clone()
    x2[:, 50] = (x2[:, 50] + 1) % 6
    out2 = m(x2)
    torch.testing.assert_close(out2[:, :50], out[:, :50], rtol=0, atol=1e-12)
    if attention != "none":
        assert (out2[:, 51:] - out[:, 51:]).abs().max() > 1e-6
    else:  # token-wise: nothing but position 50 changes
        torch.testing.assert_close(out2[:, 51:], out[:, 51:], rtol=0, atol=0)
    # backward reaches every parameter
    out.square().mean().backward()
    assert all(p.grad is not None for p in m.parameters())


def test_decoders_share_the_non_attention_weights():
    """Built from the same seed, every attention choice starts from the same feed-forward,
    LayerNorm, embedding and read-out weights (a fair comparison)."""
    models = {a: _model(a) for a in ATTENTIONS}
    ref = models["none"]
    for a, m in models.items():
        for k in ("W1", "b1", "W2", "b2"):
            assert torch.equal(getattr(m.encoder._ffn, k).raw, getattr(ref.encoder._ffn, k).raw), (a, k)
        for k in ("embedding.weight", "readout.weight", "readout.bias"):
            assert torch.equal(m.state_dict()[k], ref.state_dict()[k]), (a, k)


def test_softmax_decoder_equals_torch_prenorm_layer():
    """N_t = 1, Δt = 1: u + MHA(LN(u)), then u + FFN(LN(u)) — torch's
    TransformerEncoderLayer(norm_first=True, causal mask), with the weights copied."""
    g = torch.Generator().manual_seed(0)
    E, H, F = 8, 2, 16
    dec = AttentionDecoder(E, H, F, attention="softmax", n_steps=1, generator=g, dtype=torch.float64)
    with torch.no_grad():  # non-trivial LayerNorm affine parts and biases
        for c in list(dec._norms) + [dec.attention]:
            for p in c.parameters():
                p.add_(0.1 * torch.randn(p.shape, generator=g, dtype=p.dtype))
    layer = torch.nn.TransformerEncoderLayer(E, H, F, dropout=0.0, activation="gelu", batch_first=True,
                                             norm_first=True, dtype=torch.float64)
    a, f = dec.attention, dec._ffn
    ln1, ln2 = dec._norms
    with torch.no_grad():
        Wq, Wk, Wv = (c.raw[0].reshape(E, E).T for c in (a.WQ, a.WK, a.WV))
        layer.self_attn.in_proj_weight.copy_(torch.cat([Wq, Wk, Wv]))
        layer.self_attn.in_proj_bias.copy_(torch.cat([c.raw[0].reshape(E) for c in (a.bQ, a.bK, a.bV)]))
        layer.self_attn.out_proj.weight.copy_(a.WO.raw[0].reshape(E, E).T)
        layer.self_attn.out_proj.bias.copy_(a.bO.raw[0])
        layer.linear1.weight.copy_(f.W1.raw[0].T)
        layer.linear1.bias.copy_(f.b1.raw[0])
        layer.linear2.weight.copy_(f.W2.raw[0].T)
        layer.linear2.bias.copy_(f.b2.raw[0])
        for ln, tln in ((ln1, layer.norm1), (ln2, layer.norm2)):
            tln.weight.copy_(ln.weight.raw[0])
            tln.bias.copy_(ln.bias.raw[0])
    u = torch.randn(3, 20, E, generator=g, dtype=torch.float64)
    mask = torch.nn.Transformer.generate_square_subsequent_mask(20, dtype=torch.float64)
    ref = layer(u, src_mask=mask, is_causal=True)
    torch.testing.assert_close(dec(u), ref, rtol=1e-10, atol=1e-10)


def test_sliced_decoder_step_equals_dense_causal_kernel():
    """N_t = 1, Δt = 1, sliced ReLU: u + Σ_h Σ_j K_ij (v_j − v̄_i) with the dense causal
    kernel K (attention_weights) and the causal-prefix mean v̄_i, then the FFN term."""
    g = torch.Generator().manual_seed(1)
    dec = AttentionDecoder(8, 2, 16, attention="sliced_relu", n_steps=1, generator=g, dtype=torch.float64)
    u = torch.randn(2, 30, 8, generator=g, dtype=torch.float64)
    a, f = dec.attention, dec._ffn
    ln1, ln2 = dec._norms
    grid = dec.resolve_grid(u)

    def ln(m, x):
        return torch.nn.functional.layer_norm(x, (8,), m.weight.raw[0], m.bias.raw[0], eps=1e-5)

    x1 = ln(ln1, u)
    K = a.attention_weights(x1, 0.5, grid)  # (B, H, N, N), causal
    _, _, V = a.scores_and_values(0.5, x1, grid)  # (B, H, N, N_y)
    vbar = V.cumsum(2) / torch.arange(1, 31, dtype=V.dtype)[:, None]
    att = (K @ V - K.sum(-1, keepdim=True) * vbar).sum(1)
    u1 = u + att
    h = torch.nn.functional.gelu(ln(ln2, u1) @ f.W1.raw[0] + f.b1.raw[0])
    ref = u1 + h @ f.W2.raw[0] + f.b2.raw[0]
    torch.testing.assert_close(dec(u), ref, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize(
    "kw, err, match",
    [
        (dict(attention="linear"), ValueError, "attention"),
        (dict(attention="softmax", n_heads=3), ValueError, "divisible"),
        (dict(d_model=0), ValueError, "d_model"),
        (dict(causal=1), TypeError, "causal"),
        (dict(bandwidth=-1.0), ValueError, "bandwidth"),
        (dict(generator=0), TypeError, "generator"),
    ],
)
def test_decoder_bad_arguments(kw, err, match):
    args = dict(d_model=8, n_heads=2, d_ff=16)
    args.update(kw)
    with pytest.raises(err, match=match):
        AttentionDecoder(args.pop("d_model"), args.pop("n_heads"), args.pop("d_ff"), **args)


def test_token_classifier_bad_input():
    m = _model("sliced_relu")
    with pytest.raises(ValueError, match="ids in"):
        m(torch.tensor([[0, 6]]))
    with pytest.raises(ValueError, match=r"\(B, N\)"):
        m(torch.zeros(2, 3))
    with pytest.raises(ValueError, match=r"\(B, N\)"):
        m(torch.zeros(3, dtype=torch.int64))
    with pytest.raises(TypeError, match="encoder"):
        TokenClassifier(6, 3, torch.nn.Linear(2, 2))
    with pytest.raises(ValueError, match="n_classes"):
        TokenClassifier(6, 0, _model("none").encoder)


@pytest.mark.parametrize("attention", ATTENTIONS)
def test_decoder_gradcheck_float64(attention):
    g = torch.Generator().manual_seed(2)
    dec = AttentionDecoder(4, 2, 6, attention=attention, n_steps=2, generator=g, dtype=torch.float64)
    u = torch.randn(2, 7, 4, generator=g, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda x: dec(x), (u,), eps=1e-6, atol=1e-7)


@pytest.mark.parametrize("attention", ATTENTIONS)
def test_token_classifier_dtype_device(attention, device, dtype):
    g = torch.Generator().manual_seed(0)
    dec = AttentionDecoder(8, 2, 16, attention=attention, n_steps=1, generator=g, device=device, dtype=dtype)
    m = TokenClassifier(6, 3, dec, generator=g, device=device, dtype=dtype)
    x = torch.randint(0, 6, (2, 40), device=device)
    out = m(x)
    assert out.dtype == dtype and out.device.type == device.type and bool(torch.isfinite(out).all())
    retrieval_loss(out, torch.full((2, 40), 1, device=device)).backward()
    # float32 against float64 of the same weights
    m64 = TokenClassifier(6, 3, AttentionDecoder(8, 2, 16, attention=attention, n_steps=1, dtype=torch.float64),
                          dtype=torch.float64)
    m64.load_state_dict({k: v.double().cpu() for k, v in m.state_dict().items()})
    torch.testing.assert_close(out.detach().cpu().double(), m64(x.cpu()), rtol=1e-4, atol=1e-4)
