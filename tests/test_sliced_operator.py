"""Sliced ReLU and ReLU-bump attention operators (paper 004, eqs. 3, 7, 8 on a grid):
against explicit quadrature loops, inside schemes, gradients, errors."""

import math

import pytest
import torch

from opsplit import Grid, Interval, Propagator
from opsplit.controls import PiecewiseConstant
from opsplit.models import paper_scheme
from opsplit.operators import (
    FFNIntegral,
    ProjectionS1,
    SlicedReLUAttention,
    SlicedReLUBumpAttention,
    SoftmaxAttention,
)
from opsplit.schemes import Lie
from opsplit.solvers import ExplicitEuler, Substep

GRIDS = {
    "paper": Grid.paper(6, 4),
    "midpoint": Grid.uniform(6, 4, lx=2.0, ly=0.5),
    "trapezoid": Grid(x=Interval(n=6, length=2.0, rule="trapezoid"),
                      y=Interval(n=4, length=0.5, rule="trapezoid")),
    "heads": Grid(x=Interval(n=6, length=3.0), y=Interval(n=4, length=1.0),
                  h=Interval(n=3, length=1.5, rule="trapezoid")),
}


def naive_field(u, WQ, WK, WV, P, P1, c1, g, kind, centered=True, b=None):
    """The continuous term of paper 004 eq. (8) (heads as in paper 002 eq. 38), written as
    explicit quadrature sums over Omega_y, Omega_x and Omega_h."""
    wx, wy = g.x.weights(u.dtype), g.y.weights(u.dtype)
    H = P.shape[0]
    wh = g.h.weights(u.dtype) if g.h is not None else torch.ones(H, dtype=u.dtype)
    B, NX, NY = u.shape

    def transform(W):  # int W(xi, y) u(x, xi) dxi
        return torch.stack([torch.stack([
            torch.stack([sum(wy[l] * W[l, m] * u[bb, k, l] for l in range(NY)) for m in range(NY)])
            for k in range(NX)]) for bb in range(B)])

    def proj(Z):  # (B, NX, NY) -> (B, NX, H)
        if P1 is not None:
            hid = torch.relu(torch.stack([torch.stack([torch.stack([
                sum(wy[l] * P1[l, e] * Z[bb, k, l] for l in range(NY)) + c1[e] for e in range(NY)])
                for k in range(NX)]) for bb in range(B)]))
        else:
            hid = Z
        return torch.stack([torch.stack([torch.stack([
            sum(wy[e] * P[h, e] * hid[bb, k, e] for e in range(NY)) for h in range(H)])
            for k in range(NX)]) for bb in range(B)])

    zq, zk = proj(transform(WQ)), proj(transform(WK))
    Lx = sum(wx)
    out = torch.zeros_like(u)
    for h in range(H):
        V = transform(WV[h])
        for bb in range(B):
            Vbar = sum(wx[j] * V[bb, j] for j in range(NX)) / Lx
            for k in range(NX):
                acc = torch.zeros(NY, dtype=u.dtype)
                if kind == "relu":
                    den = sum(wx[j] * abs(zq[bb, k, h] - zk[bb, j, h]) for j in range(NX))
                    for j in range(NX):
                        vj = V[bb, j] - Vbar if centered else V[bb, j]
                        acc = acc + wx[j] * max(zq[bb, k, h] - zk[bb, j, h], 0) * vj
                    acc = acc / den if den > 0 else acc * 0
                else:
                    for j in range(NX):
                        kern = max(1 - abs(zq[bb, k, h] - zk[bb, j, h]) / b[h], 0)
                        acc = acc + wx[j] * kern * V[bb, j]
                    acc = acc / Lx
                out[bb, k] += wh[h] * acc
    return out


def _controls(g, H, mlp, gen, dtype=torch.float64):
    NY = g.ny
    r = lambda *s: torch.randn(*s, generator=gen, dtype=dtype)  # noqa: E731
    return dict(WQ=r(NY, NY), WK=r(NY, NY), WV=r(H, NY, NY), P=r(H, NY),
                P1=r(NY, NY) if mlp else None, c1=r(NY) if mlp else None)


@pytest.mark.parametrize("gname", list(GRIDS))
@pytest.mark.parametrize("mlp", [False, True], ids=["linear", "mlp"])
@pytest.mark.parametrize("centered", [True, False], ids=["eq3", "eq2"])
def test_relu_field_matches_quadrature_loops(gname, mlp, centered):
    g = GRIDS[gname]
    gen = torch.Generator().manual_seed(1)
    H = 3
    c = _controls(g, H, mlp, gen)
    op = SlicedReLUAttention(c["WQ"], c["WK"], c["WV"], c["P"], P1=c["P1"], c1=c["c1"],
                             centered=centered)
    u = torch.randn(2, g.nx, g.ny, generator=gen, dtype=torch.float64)
    ref = naive_field(u, c["WQ"], c["WK"], c["WV"], c["P"], c["P1"], c["c1"], g, "relu", centered)
    assert torch.allclose(op(u, grid=g), ref, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("gname", list(GRIDS))
@pytest.mark.parametrize("mlp", [False, True], ids=["linear", "mlp"])
def test_bump_field_matches_quadrature_loops(gname, mlp):
    g = GRIDS[gname]
    gen = torch.Generator().manual_seed(2)
    H = 3
    c = _controls(g, H, mlp, gen)
    b = torch.tensor([0.5, 2.0, 8.0], dtype=torch.float64)
    op = SlicedReLUBumpAttention(c["WQ"], c["WK"], c["WV"], c["P"], bandwidth=b, P1=c["P1"],
                                 c1=c["c1"])
    u = torch.randn(2, g.nx, g.ny, generator=gen, dtype=torch.float64)
    ref = naive_field(u, c["WQ"], c["WK"], c["WV"], c["P"], c["P1"], c["c1"], g, "bump", b=b)
    assert torch.allclose(op(u, grid=g), ref, rtol=1e-10, atol=1e-12)


def test_paper_grid_is_eq3_and_eq7_literally():
    # L = N: unit weights, the field is sum_h of eq. (3) / eq. (7) on the token sequence
    gen = torch.Generator().manual_seed(3)
    NX, NY, H = 7, 5, 2
    u = torch.randn(1, NX, NY, generator=gen, dtype=torch.float64)
    c = _controls(Grid.paper(NX, NY), H, False, gen)
    op = SlicedReLUAttention(c["WQ"], c["WK"], c["WV"], c["P"])
    bump = SlicedReLUBumpAttention(c["WQ"], c["WK"], c["WV"], c["P"], bandwidth=0.7)
    x = u[0]
    out = torch.zeros(NX, NY, dtype=torch.float64)
    outb = torch.zeros(NX, NY, dtype=torch.float64)
    for h in range(H):
        zq, zk = x @ c["WQ"] @ c["P"][h], x @ c["WK"] @ c["P"][h]
        V = x @ c["WV"][h]
        d = zq[:, None] - zk[None, :]
        out += torch.relu(d) @ (V - V.mean(0)) / d.abs().sum(1, keepdim=True)
        outb += torch.relu(1 - d.abs() / 0.7) @ V / NX
    assert torch.allclose(op(u)[0], out, rtol=0, atol=1e-12)
    assert torch.allclose(bump(u)[0], outb, rtol=0, atol=1e-12)


def test_attention_weights_reproduce_the_field():
    g = GRIDS["trapezoid"]
    gen = torch.Generator().manual_seed(4)
    op = SlicedReLUAttention.build(g.ny, 2, centered=False, generator=gen, dtype=torch.float64)
    bump = SlicedReLUBumpAttention.build(g.ny, 2, bandwidth=3.0, generator=gen, dtype=torch.float64)
    u = torch.randn(2, g.nx, g.ny, generator=gen, dtype=torch.float64)
    for o in (op, bump):
        _, _, V = o.scores_and_values(0.0, u, g)
        A = o.attention_weights(u, grid=g)
        assert torch.allclose((A @ V).sum(1), o(u, grid=g), rtol=0, atol=1e-12)


@pytest.mark.parametrize("cls", [SlicedReLUAttention, SlicedReLUBumpAttention])
def test_dtypes_devices_and_gradcheck(cls, dtype, device):
    gen = torch.Generator().manual_seed(5)
    op = cls.build(4, 2, generator=gen, dtype=dtype, device=device)
    u = torch.randn(2, 9, 4, generator=gen, dtype=dtype).to(device)
    out = op(u)
    assert out.dtype == dtype and out.device.type == torch.device(device).type
    if dtype == torch.float64:
        u.requires_grad_()
        params = [p for p in op.parameters()]
        assert torch.autograd.gradcheck(lambda x, *ps: op(x), (u, *params))


def _model(attn, NY, J=1, n_steps=2, bias_axis="y", gen=None, dtype=torch.float64):
    norm = ProjectionS1(0.0, 1.0)
    ffn = [FFNIntegral(torch.randn(NY, NY, generator=gen, dtype=dtype) / NY,
                       torch.randn(NY, generator=gen, dtype=dtype) / NY, bias_axis=bias_axis)
           for _ in range(J)]
    return Propagator(paper_scheme(attn, norm, ffn), n_steps)


@pytest.mark.parametrize("cls", [SlicedReLUAttention, SlicedReLUBumpAttention])
def test_transformer_with_sliced_attention_equals_hand_written_loop(cls):
    """paper 002's Lie scheme (13)-(17) with sliced attention in place of softmax: the
    propagator against the same steps written out with the naive formulas."""
    gen = torch.Generator().manual_seed(6)
    NX, NY, H = 10, 4, 2
    attn = cls.build(NY, H, n_steps=2, t1=2.0, generator=gen, dtype=torch.float64)
    model = _model(attn, NY, J=1, gen=gen)
    f = torch.randn(2, NX, NY, generator=gen, dtype=torch.float64)
    g = Grid.paper(NX, NY)

    def ln(x):
        m = x.mean(-1, keepdim=True)
        return (x - m) / ((x - m).pow(2).mean(-1, keepdim=True)).sqrt()

    ffn = model.scheme.substeps[2].terms[0].steps[0].terms[0]
    u = f
    for n in range(2):
        c = {k: getattr(attn, k)(float(n)) for k in ("WQ", "WK", "WV", "P")}
        P1 = attn.P1(float(n)) if attn.P1 is not None else None
        c1 = attn.c1(float(n)) if attn.c1 is not None else None
        if cls is SlicedReLUAttention:
            a = naive_field(u, c["WQ"], c["WK"], c["WV"], c["P"], P1, c1, g, "relu")
        else:
            a = naive_field(u, c["WQ"], c["WK"], c["WV"], c["P"], P1, c1, g, "bump",
                            b=attn.bandwidth(float(n)))
        u1 = ln(u + a)
        u2 = torch.relu(u1 + u1 @ ffn.W(0.0) + ffn.b(0.0))
        u = ln(0.5 * (u2 + u1))
    assert torch.allclose(model(f), u, rtol=0, atol=1e-10)


@pytest.mark.parametrize("cls", [SlicedReLUAttention, SlicedReLUBumpAttention])
def test_transformer_with_sliced_attention_trains(cls):
    """Forward and backward of a Lie scheme with sliced attention, ProjectionS1 and an FFN
    (float32, variable N_x); gradients reach every control and are finite."""
    gen = torch.Generator().manual_seed(7)
    NY, H = 8, 2
    attn = cls.build(NY, H, n_steps=3, t1=3.0, generator=gen)
    ffn = [FFNIntegral(PiecewiseConstant(torch.randn(3, NY, NY, generator=gen) / NY, axes=("y", "y")),
                       PiecewiseConstant(torch.zeros(3, NY), axes=("y",)), bias_axis="y")]
    scheme = Lie([Substep(attn, ExplicitEuler()), ProjectionS1(0.0, 1.0), *ffn])
    model = Propagator(scheme, 3)
    for NX in (5, 257):
        f = torch.randn(2, NX, NY, generator=gen)
        loss = model(f).pow(2).mean()
        loss.backward()
    for name, p in model.named_parameters():
        assert p.grad is not None and bool(torch.isfinite(p.grad).all()), name
    assert any(float(p.grad.abs().max()) > 0 for p in attn.parameters())


def test_sliced_attention_replaces_softmax_in_the_paper_scheme():
    gen = torch.Generator().manual_seed(8)
    NY = 4
    soft = SoftmaxAttention(*[torch.randn(NY, NY, generator=gen) for _ in range(3)])
    sliced = SlicedReLUAttention.build(NY, 2, generator=gen)
    for attn in (soft, sliced):
        m = _model(attn, NY, gen=gen, dtype=torch.float32)
        assert m(torch.randn(1, 6, NY, generator=gen)).shape == (1, 6, NY)


def test_build_is_reproducible_and_reports():
    a = SlicedReLUAttention.build(6, 3, generator=torch.Generator().manual_seed(0))
    b = SlicedReLUAttention.build(6, 3, generator=torch.Generator().manual_seed(0))
    for (na, pa), (_, pb) in zip(a.named_parameters(), b.named_parameters(), strict=True):
        assert torch.equal(pa, pb), na
    assert "heads=3" in repr(a) and "projection='mlp'" in repr(a)
    bump = SlicedReLUBumpAttention.build(6, 3, bandwidth=0.25)
    assert torch.allclose(bump.bandwidth(0.0), torch.full((3,), 0.25))
    assert "projection='linear'" in repr(bump)


def test_errors_are_clear():
    NY = 4
    W = torch.randn(NY, NY)
    with pytest.raises(ValueError, match="WV has 2 heads .* but P has 3"):
        SlicedReLUAttention(W, W, torch.randn(2, NY, NY), torch.randn(3, NY))
    with pytest.raises(ValueError, match=r"WV: expected shape \(H, N_y, N_y\)"):
        SlicedReLUAttention(W, W, W, torch.randn(3, NY))
    with pytest.raises(ValueError, match="needs both P1 and c1"):
        SlicedReLUAttention(W, W, torch.randn(2, NY, NY), torch.randn(2, NY), P1=W)
    with pytest.raises(ValueError, match="projection: expected 'linear' or 'mlp'"):
        SlicedReLUAttention.build(NY, 2, projection="conv")
    for b in (0.0, -1.0, float("nan")):
        with pytest.raises(ValueError, match="bandwidth: expected"):
            SlicedReLUBumpAttention(W, W, torch.randn(2, NY, NY), torch.randn(2, NY), bandwidth=b)
    op = SlicedReLUAttention(W, W, torch.randn(2, NY, NY), torch.randn(2, NY))
    with pytest.raises(ValueError, match="grid/control mismatch|N_y"):
        op(torch.randn(1, 5, NY + 1))
    g = Grid(x=Interval(n=5, length=1.0), y=Interval(n=NY, length=1.0), h=Interval(n=3, length=1.0))
    with pytest.raises(ValueError, match="N_h = 3 nodes, the operator has 2 heads"):
        op(torch.randn(1, 5, NY), grid=g)
    bump = SlicedReLUBumpAttention(W, W, torch.randn(2, NY, NY), torch.randn(2, NY),
                                   bandwidth=torch.ones(3))
    with pytest.raises(ValueError, match="one value per head"):
        bump(torch.randn(1, 5, NY))
    with pytest.raises(ValueError, match="NaN/inf"):
        op(torch.full((1, 5, NY), math.nan))
