"""ReLU attention (seed 000, eq. 13) against a transcription in seed 000's own convention,
and its spline degree along random lines (seed 000, Theorem 3.3; seed 003)."""

from __future__ import annotations

import pytest
import torch
from attention_reference import naive_relu_attention

from opsplit import Grid, Propagator
from opsplit.analysis import finite_difference, piecewise_degree, relu_sign_patterns
from opsplit.controls import PiecewiseConstant
from opsplit.operators import ContextGrid, FeedForward, MultiHeadAttention, ReLUAttention
from opsplit.schemes import Lie
from opsplit.solvers import ExplicitEuler, Substep

F64 = torch.float64


def _relu_op(Ny, H, d, *, seed=0, n_out=None, **kw):
    g = torch.Generator().manual_seed(seed)

    def r(*s):
        return torch.randn(*s, generator=g, dtype=F64) * 0.6

    w = dict(WQ=r(Ny, H, d), WK=r(Ny, H, d), WV=r(Ny, H, d), WO=r(H, d, n_out or Ny),
             bQ=r(H, d), bK=r(H, d), bV=r(H, d))
    return ReLUAttention(*list(w.values())[:4], bQ=w["bQ"], bK=w["bK"], bV=w["bV"], **kw), w


def _seed000(w):
    """opsplit kernels (Ny, H, d) -> seed 000's A matrices (H, d, Ny)."""
    return {k: w[k].permute(1, 2, 0) for k in ("WQ", "WK", "WV")}


@pytest.mark.parametrize("causal", [False, True])
def test_self_attention_is_eq13(causal):
    B, N, Ny, H, d = 2, 5, 4, 3, 2
    op, w = _relu_op(Ny, H, d, causal=causal, scale=0.8)
    u = torch.randn(B, N, Ny, dtype=F64)
    got = op.field(0.0, u, Grid.paper(N, Ny))
    A = _seed000(w)
    for b in range(B):
        X = u[b].T  # seed 000: tokens are columns
        ref = naive_relu_attention(X, A["WQ"], A["WK"], A["WV"], w["bQ"], w["bK"], w["bV"], WO=w["WO"],
                                   scale=0.8, causal=causal)
        torch.testing.assert_close(got[b], ref.T, rtol=1e-12, atol=1e-12)


def test_encoder_decoder_attention_is_eq13_gamma():
    B, N, Ns, Ny, H, d = 2, 3, 6, 4, 2, 3
    op, w = _relu_op(Ny, H, d, memory="m")
    u, m = torch.randn(B, N, Ny, dtype=F64), torch.randn(B, Ns, Ny, dtype=F64)
    got = op.field(0.0, u, ContextGrid.of(Grid.paper(N, Ny), m=m))
    A = _seed000(w)
    for b in range(B):
        ref = naive_relu_attention(m[b].T, A["WQ"], A["WK"], A["WV"], w["bQ"], w["bK"], w["bV"], WO=w["WO"],
                                   Y=u[b].T)
        torch.testing.assert_close(got[b], ref.T, rtol=1e-12, atol=1e-12)


def test_no_normalisation_and_key_quadrature():
    """Without a softmax the key weights do not cancel: on L_x = 2 N_x the field doubles."""
    op, _ = _relu_op(4, 2, 2)
    u = torch.randn(2, 5, 4, dtype=F64)
    a = op.field(0.0, u, Grid.paper(5, 4))
    b = op.field(0.0, u, Grid(x=Grid.uniform(5, 4, lx=10.0).x, y=Grid.paper(5, 4).y))
    bO = 0.0
    torch.testing.assert_close(b - bO, 2 * (a - bO), rtol=1e-12, atol=1e-12)


def test_key_padding_and_gradcheck():
    op, _ = _relu_op(3, 2, 2, key_padding_mask="kpm")
    u = torch.randn(2, 4, 3, dtype=F64, requires_grad=True)
    kpm = torch.tensor([[False, False, True, True], [False] * 4])
    g = ContextGrid.of(Grid.paper(4, 3), kpm=kpm)
    y = op.field(0.0, u, g)
    v = u.detach().clone()
    v[0, 2:] += 1.0  # padded keys of sample 0 do not matter ...
    torch.testing.assert_close(op.field(0.0, v, g)[0, :2], y[0, :2].detach())
    assert torch.autograd.gradcheck(lambda u: op.field(0.0, u, g), (u,))


# -- spline degree (seed 000, Theorem 3.3) -------------------------------------------------------
def test_finite_difference_of_polynomials():
    t = torch.linspace(-1, 1, 50, dtype=F64)
    p = 3 * t**3 - t + 2
    assert finite_difference(p, 4).abs().max() < 1e-13
    assert finite_difference(p, 3).abs().min() > 1e-4
    with pytest.raises(ValueError, match="order"):
        finite_difference(p, -1)


def test_relu_sign_patterns_records_every_relu():
    x = torch.tensor([[-1.0, 2.0], [3.0, -4.0]], dtype=F64)
    _, pat = relu_sign_patterns(lambda x: torch.relu(x) + x.clamp_min(1.0) + x.clamp(min=0.0, max=2.5), x)
    assert pat.tolist() == [[False, True, False, True, False, True, True, True],
                            [True, False, True, False, True, False, False, True]]


def _line(Nx, Ny, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(Nx, Ny, generator=g, dtype=F64), torch.randn(Nx, Ny, generator=g, dtype=F64)


def test_one_layer_relu_attention_is_piecewise_cubic_on_a_line():
    """Thm 3.3 (i): the 4th finite difference vanishes away from kinks; the 3rd does not."""
    Nx, Ny = 3, 4
    op, _ = _relu_op(Ny, 2, 2, seed=1)
    grid = Grid.paper(Nx, Ny)
    x0, D = _line(Nx, Ny, 3)
    taus = torch.linspace(-2, 2, 401, dtype=F64)
    r = piecewise_degree(lambda X: op.field(0.0, X, grid), x0, D, taus, max_degree=5, rtol=1e-13)
    assert r.n_kinks > 0 and r.smooth_fraction[4] > 0.5
    assert r.vanishes(4), r.differences
    assert r.differences[3] > 1e-10  # genuinely cubic, not of lower degree
    assert r.degree == 3
    # negative control: softmax attention is not a piecewise polynomial
    sm = MultiHeadAttention(op.WQ, op.WK, op.WV, op.WO, bQ=op.bQ, bK=op.bK, bV=op.bV, scale=1.0)
    s = piecewise_degree(lambda X: sm.field(0.0, X, grid), x0, D, taus, max_degree=5, rtol=1e-13)
    assert not s.vanishes(4) and s.differences[4] > 1e-10


def _relu_encoder(L, Nx, Ny, H, d, Nz, seed):
    """seed 000 eq. (7) with residuals: L blocks of ReLU attention then a ReLU network."""
    g = torch.Generator().manual_seed(seed)

    def pc(*s):
        return PiecewiseConstant(torch.randn(L, *s, generator=g, dtype=F64) * 0.6)

    att = ReLUAttention(pc(Ny, H, d), pc(Ny, H, d), pc(Ny, H, d), pc(H, d, Ny), bQ=pc(H, d), bK=pc(H, d),
                        bV=pc(H, d), bO=pc(Ny))
    ffn = FeedForward(pc(Ny, Nz), pc(Nz), pc(Nz, Ny), pc(Ny), activation="relu")
    scheme = Lie([Substep(att, ExplicitEuler()), Substep(ffn, ExplicitEuler())])
    return Propagator(scheme, L, grid=Grid.paper(Nx, Ny))


def test_two_layer_relu_encoder_has_degree_at_most_nine():
    """Thm 3.3 (vii), t = 2: degree <= 3^2 = 9 (10th difference vanishes away from kinks); the
    same measurement sees degree > 9 in a three-layer encoder (negative control)."""
    Nx, Ny = 3, 3
    x0, D = _line(Nx, Ny, 100)
    taus = torch.linspace(-3, 3, 241, dtype=F64)
    res = {}
    for L in (2, 3):
        enc = _relu_encoder(L, Nx, Ny, 1, 2, 2, seed=0)
        res[L] = piecewise_degree(lambda X, enc=enc: enc(X, check_finite_input=False), x0, D, taus,
                                  max_degree=10, rtol=1e-13)
        assert res[L].n_kinks > 0 and res[L].smooth_fraction[10] > 0.1
    assert res[2].vanishes(10), res[2].differences
    assert res[2].degree is not None and res[2].degree <= 9
    assert res[3].differences[10] > 1e-11, res[3].differences  # degree > 9 is seen


def test_errors():
    with pytest.raises(ValueError, match="uniformly spaced"):
        piecewise_degree(torch.relu, torch.zeros(2), torch.ones(2), torch.tensor([0.0, 1.0, 3.0] + [4.0] * 20))
    with pytest.raises(ValueError, match="at least"):
        piecewise_degree(torch.relu, torch.zeros(2), torch.ones(2), torch.linspace(0, 1, 5), max_degree=5)
