"""SplitEncoder against a direct transcription: the hybrid scheme with explicit Euler and
dt = 1 is the pre-norm transformer layer x + MHA(LN1(x)), then x + FFN(LN2(x))."""

import torch
import torch.nn.functional as F

from opsplit.models import SplitEncoder


def _layer(enc, u, t, dt):
    (ln1, ln2), f = enc._norms, enc._ffn
    x = F.layer_norm(u, (u.shape[-1],), ln1.weight(t), ln1.bias(t), eps=1e-5)
    attn = 0
    for h in enc._heads:
        WQ, WK, WV, WO = (c(t)[:, 0] if c is not h.WO else c(t)[0] for c in (h.WQ, h.WK, h.WV, h.WO))
        q, k, v = x @ WQ + h.bQ(t)[0], x @ WK + h.bK(t)[0], x @ WV + h.bV(t)[0]
        a = torch.softmax(q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5, dim=-1)
        attn = attn + (a @ v) @ WO + h.bO(t)
    u = u + dt * attn
    x = F.layer_norm(u, (u.shape[-1],), ln2.weight(t), ln2.bias(t), eps=1e-5)
    return u + dt * (F.gelu(x @ f.W1(t) + f.b1(t)) @ f.W2(t) + f.b2(t))


def test_hybrid_split_encoder_is_the_prenorm_layer():
    g = torch.Generator().manual_seed(0)
    enc = SplitEncoder(8, 2, 16, n_steps=3, scheme="hybrid", generator=g, dtype=torch.float64)
    u = torch.randn(2, 5, 8, dtype=torch.float64, generator=g)
    ref = u
    for n in range(3):
        ref = _layer(enc, ref, float(n), 1.0)
    torch.testing.assert_close(enc(u), ref, rtol=1e-12, atol=1e-12)
