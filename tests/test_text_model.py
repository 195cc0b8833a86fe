"""The character-level GPT of benchmarks/train_text.py: opsplit's DecoderLM against an
independent nanoGPT-style peer (written here, plain torch), and the continuous-time
variants (Strang, N_t != layers, sliced ReLU attention) against hand-written compositions.

The peer and the weight copy are an independent copy of the benchmark's (the tests do not
import benchmarks/)."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from opsplit.analysis.formulas import naive_sliced_relu
from opsplit.control import Objective, TrainConfig, Trainer
from opsplit.data import char_corpus, text_windows
from opsplit.models import DecoderConfig, DecoderLM

V, CTX, E, H, L = 23, 16, 16, 2, 2


class PeerBlock(nn.Module):
    def __init__(self, d, h):
        super().__init__()
        self.h = h
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.fc, self.out = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def attn(self, x):
        B, N, D = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(D, -1)
        q, k, v = (t.view(B, N, self.h, D // self.h).transpose(1, 2) for t in (q, k, v))
        return self.proj(F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(B, N, D))

    def mlp(self, x):
        return self.out(F.gelu(self.fc(self.ln2(x))))

    def forward(self, x):
        x = x + self.attn(x)
        return x + self.mlp(x)


class Peer(nn.Module):
    """nanoGPT: token + learned position embedding, pre-LN blocks, final LN, tied head."""

    def __init__(self, dtype=torch.float32):
        super().__init__()
        self.tok, self.pos = nn.Embedding(V, E), nn.Embedding(CTX, E)
        self.blocks = nn.ModuleList(PeerBlock(E, H) for _ in range(L))
        self.ln_f = nn.LayerNorm(E)
        g = torch.Generator().manual_seed(3)
        with torch.no_grad():
            for name, p in self.named_parameters():  # random everything (LN and biases too)
                p.copy_(torch.randn(p.shape, generator=g) * (0.3 if "ln" not in name else 0.1) + ("ln" in name
                        and name.endswith("weight")))
        self.to(dtype)

    def embed(self, idx):
        return self.tok(idx) + self.pos(torch.arange(idx.shape[1], device=idx.device))

    def head(self, x):
        return F.linear(self.ln_f(x), self.tok.weight)

    def forward(self, idx):
        x = self.embed(idx)
        for b in self.blocks:
            x = b(x)
        return self.head(x)


def config(attention="softmax", scheme="lie") -> DecoderConfig:
    s = attention == "softmax"
    return DecoderConfig(vocab_size=V, d_model=E, n_layers=L, n_heads=H, d_ff=4 * E, norm="layer", norm_eps=1e-5,
                         norm_bias=True, mlp="plain", activation="gelu", positions="learned", max_positions=CTX,
                         qkv_bias=s, out_bias=s, mlp_bias=True, tie_embeddings=True, attention=attention,
                         scheme=scheme)


def piece(control, i):
    """Stored weights of control piece i (LayerwiseConstant: a parameter; PiecewiseConstant: a row)."""
    return control.pieces[i] if hasattr(control, "pieces") else control.raw[i]


@torch.no_grad()
def load_peer(peer: Peer, model: DecoderLM) -> None:
    """Layer l of the peer -> control piece l (a pure weight copy)."""
    model.embedding.weight.copy_(peer.tok.weight)
    model.positions.weight.copy_(peer.pos.weight)
    (n1,), (n2,) = model.norms
    a, f = model.attention, model.ffn
    for i, b in enumerate(peer.blocks):
        copies = [(n1.weight, b.ln1.weight), (n1.bias, b.ln1.bias), (n2.weight, b.ln2.weight),
                  (n2.bias, b.ln2.bias), (f.W1, b.fc.weight.T), (f.b1, b.fc.bias), (f.W2, b.out.weight.T),
                  (f.b2, b.out.bias)]
        if model.config.attention == "softmax":
            Wq, Wk, Wv = b.qkv.weight.split(E)
            bq, bk, bv = b.qkv.bias.split(E)
            copies += [(c, W.T.reshape(E, H, E // H)) for c, W in zip((a.WQ, a.WK, a.WV), (Wq, Wk, Wv))]
            copies += [(c, v.reshape(H, E // H)) for c, v in zip((a.bQ, a.bK, a.bV), (bq, bk, bv))]
            copies += [(a.WO, b.proj.weight.T.reshape(H, E // H, E)), (a.bO, b.proj.bias)]
        for control, value in copies:
            piece(control, i).copy_(value)
    model.final_norm[0].weight.value.copy_(peer.ln_f.weight)
    model.final_norm[0].bias.value.copy_(peer.ln_f.bias)


def pair(dtype=torch.float64, **kw):
    peer = Peer(dtype)
    model = DecoderLM(config(**kw), dtype=dtype)
    load_peer(peer, model)
    return peer, model


def ids(B=3, N=CTX, seed=1):
    return torch.randint(V, (B, N), generator=torch.Generator().manual_seed(seed))


def test_lie_at_n_layers_is_the_peer(dtype):
    peer, model = pair(dtype)
    x = ids()
    tol = dict(atol=1e-12, rtol=1e-12) if dtype == torch.float64 else dict(atol=2e-5, rtol=2e-5)
    torch.testing.assert_close(model(x).logits, peer(x), **tol)


def _loss(logits, targets):
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["f64", "f32"])
def test_training_losses_agree_with_the_peer_for_50_steps(dtype):
    """opsplit's model trained by the Trainer (AdamW, warm-up + cosine, clipping) and the
    peer trained by a plain torch loop from the same weights on the same batches."""
    text = "".join(chr(97 + (i * 7 + i // 5) % (V - 1)) for i in range(3000))
    corpus = char_corpus([text[:2500], text[2500:]], val_fraction=0.15, seed=0)
    assert corpus.vocab.size <= V
    steps, batch = 50, 4
    train = text_windows(corpus.train, CTX, steps * batch, seed=0)
    peer, model = pair(dtype)
    cfg = TrainConfig(epochs=1, batch_size=batch, lr=3e-3, betas=(0.9, 0.99), weight_decay=0.1, schedule="cosine",
                      warmup_steps=5, min_lr_ratio=0.1, grad_clip=1.0, shuffle=False, progress=False)
    tr = Trainer(model, Objective(_loss, output="logits"), cfg)
    tr.fit(train, None)
    ours = [r["loss"] for r in tr.history.steps]

    opt = torch.optim.AdamW(peer.parameters(), lr=3e-3, betas=(0.9, 0.99), weight_decay=0.1)

    def factor(s):  # warm-up 5 steps, then cosine to 0.1 over the remaining 45
        if s < 5:
            return (s + 1) / 5
        return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, (s - 5) / 45)))

    sched = torch.optim.lr_scheduler.LambdaLR(opt, factor)
    theirs = []
    for s in range(steps):
        x, y = train.inputs[s * batch:(s + 1) * batch], train.targets[s * batch:(s + 1) * batch]
        opt.zero_grad()
        loss = _loss(peer(x), y)
        loss.backward()
        nn.utils.clip_grad_norm_(peer.parameters(), 1.0)
        opt.step()
        sched.step()
        theirs.append(float(loss.detach()))
    assert len(ours) == steps
    tol = 1e-9 if dtype == torch.float64 else 1e-5
    torch.testing.assert_close(torch.tensor(ours), torch.tensor(theirs), atol=tol, rtol=tol)
    assert theirs[-1] < theirs[0] - 0.5  # it learned something: the agreement is not of constants


def test_strang_is_the_symmetric_composition():
    """scheme="strang", dt = 1: per layer, x + attn/2, x + mlp, x + attn/2 (same layer's weights)."""
    peer, model = pair(scheme="strang")
    x = ids()
    u = peer.embed(x)
    for b in peer.blocks:
        u = u + 0.5 * b.attn(u)
        u = u + b.mlp(u)
        u = u + 0.5 * b.attn(u)
    torch.testing.assert_close(model(x).logits, peer.head(u), atol=1e-12, rtol=1e-12)
    assert not torch.allclose(model(x).logits, peer(x), atol=1e-3)


@pytest.mark.parametrize("scheme", ["lie", "strang"])
def test_another_n_t_refines_each_layer(scheme):
    """N_t = 2 L (dt = 1/2): every layer's weights over two steps of half length."""
    peer, model = pair(scheme=scheme)
    x = ids()
    u = peer.embed(x)
    for b in peer.blocks:
        for _ in range(2):
            if scheme == "lie":
                u = u + 0.5 * b.attn(u)
                u = u + 0.5 * b.mlp(u)
            else:
                u = u + 0.25 * b.attn(u)
                u = u + 0.5 * b.mlp(u)
                u = u + 0.25 * b.attn(u)
    torch.testing.assert_close(model(x, n_steps=2 * L).logits, peer.head(u), atol=1e-12, rtol=1e-12)


def test_parallel_is_the_parallel_block(dtype, device):
    """scheme="parallel", dt = 1: per layer, x + attn(x) + mlp(x) (GPT-J / GPT-NeoX's parallel
    residual, two LayerNorms), written out with the peer's modules; N_t = 2L: two Euler steps
    of the whole field per layer."""
    peer, model = pair(dtype, scheme="parallel")
    peer, model = peer.to(device), model.to(device)
    x = ids().to(device)
    u = peer.embed(x)
    for b in peer.blocks:
        u = u + b.attn(u) + b.mlp(u)
    tol = dict(atol=1e-12, rtol=1e-12) if dtype == torch.float64 else dict(atol=2e-5, rtol=2e-5)
    torch.testing.assert_close(model(x).logits, peer.head(u), **tol)
    torch.testing.assert_close(model(x, n_steps=2 * L).logits, _parallel(peer, x, 2, _euler), **tol)
    assert not torch.allclose(model(x).logits, peer(x), atol=1e-3)  # not the Lie (sequential) layer


def test_parallel_decoder_checkpoint_round_trip(tmp_path):
    """A parallel decoder saves and loads as itself, and a Lie decoder's checkpoint is refused
    by it (the scheme is part of the architecture a checkpoint records)."""
    from opsplit.control import CheckpointError, load_checkpoint, save_checkpoint

    _, model = pair(scheme="parallel")
    x = ids(B=1, N=6)
    save_checkpoint(tmp_path / "par.pt", model)
    _, fresh = pair(scheme="parallel")
    with torch.no_grad():
        for p in fresh.parameters():
            p.add_(1.0)
    load_checkpoint(tmp_path / "par.pt", fresh)
    torch.testing.assert_close(fresh(x).logits, model(x).logits, atol=0, rtol=0)
    _, lie = pair(scheme="lie")
    save_checkpoint(tmp_path / "lie.pt", lie)
    with pytest.raises(CheckpointError, match="scheme"):
        load_checkpoint(tmp_path / "lie.pt", fresh)


def _euler(f, u, dt):
    return u + dt * f(u)


def _rk4(f, u, dt):
    k1 = f(u)
    k2 = f(u + dt / 2 * k1)
    k3 = f(u + dt / 2 * k2)
    k4 = f(u + dt * k3)
    return u + dt / 6 * (k1 + 2 * k2 + 2 * k3 + k4)


def _parallel(peer, x, per_layer, step):
    """The flow u_t = attn(u) + mlp(u), each layer's weights on a unit interval, ``per_layer``
    steps of ``step`` each."""
    u = peer.embed(x)
    for b in peer.blocks:
        for _ in range(per_layer):
            u = step(lambda v, b=b: b.attn(v) + b.mlp(v), u, 1.0 / per_layer)
    return peer.head(u)


@pytest.mark.parametrize("solver", ["heun", "rk4"])
def test_parallel_swapped_solver_advances_the_whole_field(solver):
    """A solver swap on the parallel decoder is that solver on u_t = A(u) + F(u) (both terms
    advanced together: no splitting), RK4 written out here; Heun checked against the
    composition Heun = average of Euler and Euler-from-Euler."""
    from opsplit.control.swap import solved_with

    peer, model = pair(scheme="parallel")
    x = ids(B=2, N=9)
    if solver == "rk4":
        want = _parallel(peer, x, 1, _rk4)
    else:
        want = _parallel(peer, x, 1, lambda f, u, dt: u + dt / 2 * (f(u) + f(u + dt * f(u))))
    with torch.no_grad(), solved_with(model, solver=solver):
        got = model(x).logits
    torch.testing.assert_close(got, want, atol=1e-12, rtol=1e-12)


def test_parallel_decoder_generates_as_its_forward():
    """Greedy decoding of the parallel decoder (key/value cache) picks the argmax of its
    uncached forward at every step."""
    _, model = pair(scheme="parallel")
    x = ids(B=2, N=5)
    out = model.generate(x, max_new_tokens=4)
    seq = x
    for _ in range(4):
        nxt = model(seq).logits[:, -1].argmax(-1, keepdim=True)
        seq = torch.cat([seq, nxt], 1)
    assert torch.equal(out, seq)


def test_parallel_decoder_gradcheck():
    cfg = config(scheme="parallel")
    model = DecoderLM(cfg, dtype=torch.float64)
    x = ids(B=1, N=4)
    u0 = model.embedding(x).detach().requires_grad_(True)
    torch.autograd.gradcheck(lambda u: model.decoder(u), (u0,))


def _naive_causal_sliced(a, layer, h):
    """Causal sliced ReLU attention of the normalised state h (B, N, E) from the operator's
    controls of piece ``layer``, written out: MLP projection, per-query prefix, centred values."""
    WQ, WK, WV, P, P1, c1 = (piece(getattr(a, n), layer) for n in ("WQ", "WK", "WV", "P", "P1", "c1"))

    def proj(Q):
        return (torch.relu(Q @ P1 + c1) @ P.T).transpose(1, 2)  # (B, H, N)

    zq, zk = proj(h @ WQ), proj(h @ WK)
    v = torch.einsum("bne,hef->bhnf", h, WV)
    N = h.shape[1]
    out = torch.stack([naive_sliced_relu(zq[..., i:i + 1], zk[..., :i + 1], v[:, :, :i + 1]) for i in range(N)], 2)
    return out[:, :, :, 0].sum(1)


def test_sliced_decoder_is_the_naive_causal_formula():
    peer, model = pair(attention="sliced_relu")
    a = model.attention
    assert a.causal and a.projection == "mlp"
    x = ids(B=2, N=9)
    u = peer.embed(x)
    (n1,), _ = model.norms
    for i, b in enumerate(peer.blocks):
        h = F.layer_norm(u, (E,), piece(n1.weight, i), piece(n1.bias, i), 1e-5)
        u = u + _naive_causal_sliced(a, i, h)
        u = u + b.mlp(u)
    torch.testing.assert_close(model(x).logits, peer.head(u), atol=1e-10, rtol=1e-10)


@pytest.mark.parametrize("attention", ["softmax", "sliced_relu"])
def test_generate_at_another_n_t(attention):
    """generate(n_steps=k) is the argmax loop over model(ids, n_steps=k); with the cache and
    without."""
    _, model = pair(attention=attention)
    model.eval()
    prompt = ids(B=2, N=3)
    seq = prompt
    with torch.no_grad():
        for _ in range(5):
            seq = torch.cat([seq, model(seq, n_steps=3).logits[:, -1].argmax(-1, keepdim=True)], 1)
    out = model.generate(prompt, 5, use_cache=False, n_steps=3)
    assert torch.equal(out, seq)
    assert torch.equal(model.generate(prompt, 5, n_steps=3), seq)
    assert not torch.equal(model.generate(prompt, 5, use_cache=False, n_steps=1), seq)


def test_sliced_decoder_takes_cache_and_padding():
    """The sliced decoder generates with the cache (the decode sums over the cached scores) and
    takes a left-padded batch: sample 1 with one pad gives the logits of its real tokens alone
    (positions from its first real token), and the cached generation is the argmax loop."""
    _, model = pair(attention="sliced_relu")
    model.eval()
    x = ids(B=2, N=4)
    mask = torch.tensor([[1, 1, 1, 1], [0, 1, 1, 1]])
    pos = torch.tensor([[0, 1, 2, 3], [0, 0, 1, 2]])
    with torch.no_grad():
        out = model(x, mask, position_ids=pos).logits
        torch.testing.assert_close(out[1, 1:], model(x[1:, 1:]).logits[0], rtol=0, atol=1e-12)
        seq = x[:1]
        for _ in range(4):
            seq = torch.cat([seq, model(seq).logits[:, -1].argmax(-1, keepdim=True)], 1)
        assert torch.equal(model.generate(x[:1], 4), seq)


def test_sliced_decoder_gradcheck():
    _, model = pair(attention="sliced_relu", scheme="strang")
    x = ids(B=1, N=5)
    u0 = model.embed(x).detach().requires_grad_(True)
    assert torch.autograd.gradcheck(lambda u: model.decoder(u), (u0,))


def test_value_checks_by_sums_keep_their_verdicts():
    """check_finite / check_parameters_finite test one sum per tensor (cheap enough for a
    training step); a sum that overflows from finite entries must not be taken for a NaN."""
    from opsplit._checks import check_finite, check_parameters_finite

    big = torch.full((8,), 3e38)  # finite float32 entries whose sum overflows
    check_finite(big, "big")
    m = nn.Linear(8, 1)
    with torch.no_grad():
        m.weight.fill_(3e38)
    check_parameters_finite(m, "model")
    with torch.no_grad():
        m.bias.fill_(float("nan"))
    with pytest.raises(ValueError, match=r"model: parameters must be finite, but bias hold"):
        check_parameters_finite(m, "model")
    bad = big.clone()
    bad[3] = float("inf")
    with pytest.raises(ValueError, match=r"bad: expected finite values, found 1 NaN/inf"):
        check_finite(bad, "bad")


def test_token_classifier_generates_at_another_n_t():
    """generate(n_steps=) reaches TokenClassifier.next_token_logits too (the other causal decoder)."""
    from opsplit.models import AttentionDecoder, TokenClassifier

    g = torch.Generator().manual_seed(0)
    model = TokenClassifier(V, V, AttentionDecoder(E, H, 2 * E, n_steps=2, causal=True, generator=g), generator=g)
    model.eval()
    prompt, seq = ids(B=2, N=3), ids(B=2, N=3)
    with torch.no_grad():
        for _ in range(4):
            seq = torch.cat([seq, model(seq, n_steps=5)[:, -1].argmax(-1, keepdim=True)], 1)
    assert torch.equal(model.generate(prompt, 4, n_steps=5), seq)
    assert torch.equal(model.generate(prompt, 4, n_steps=5, use_cache=False), seq)
