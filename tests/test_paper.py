"""The paper's discrete transformer (paper 002, eqs. 27-35) is recovered exactly by the
Lie-splitting propagator with L = N and Delta t = 1."""

import math

import pytest
import torch

from opsplit.analysis.formulas import paper_transformer
from opsplit.models import PaperTransformer

CONFIGS = [  # (B, N_x, N_y, J, N_t)
    (1, 3, 4, 1, 1),
    (2, 5, 8, 2, 6),
    (3, 7, 6, 3, 2),
    (2, 16, 12, 2, 4),
]


def _weights_of(model, n):
    """Step n's controls, read from the model's parameters (theta^n = theta(t^n))."""
    t = float(n)
    a = model.attention
    return {
        "WQ": a.WQ(t),
        "WK": a.WK(t),
        "WV": a.WV(t),
        "Ws": [f.W(t) for f in model.ffn],
        "bs": [f.b(t) for f in model.ffn],
        "s1": model.norm.sigma1(t),
        "s2": model.norm.sigma2(t),
    }


def _randomise_sigmas(model, gen):
    with torch.no_grad():
        n = model.n_steps
        model.norm.sigma1.fill_(0.3 * torch.randn(n, generator=gen, dtype=torch.float64))
        model.norm.sigma2.fill_(0.5 + torch.rand(n, generator=gen, dtype=torch.float64))


@pytest.mark.parametrize("B,nx,ny,J,nt", CONFIGS)
@pytest.mark.parametrize("literal_scale", [False, True], ids=["eq19-scale", "eq29-literal"])
def test_propagator_equals_paper_equations(B, nx, ny, J, nt, literal_scale, dtype):
    gen = torch.Generator().manual_seed(1000 * nx + 10 * ny + J + nt)
    torch.manual_seed(nx * ny + nt)
    scale = 1.0 if literal_scale else None
    model = PaperTransformer(ny, n_x=nx, J=J, n_steps=nt, scale=scale, dtype=dtype)
    _randomise_sigmas(model, gen)
    f = torch.randn(B, nx, ny, generator=gen, dtype=torch.float64).to(dtype)
    out = model(f)
    with torch.no_grad():
        ref = paper_transformer(
            f, [_weights_of(model, n) for n in range(nt)], 1.0 if literal_scale else 1 / math.sqrt(ny)
        )
    err = (out - ref).abs().max().item()
    # float64: the formulas agree to round-off.  float32: two float32 evaluations of the
    # same map differ by a few ulps of |u| ~ 3 per step (both deviate equally from the
    # float64 value; docs/paper_scheme.md has the measured figures), so 1e-6 per step.
    tol = 1e-6 * nt if dtype == torch.float32 else 1e-12
    assert out.dtype == dtype and out.shape == (B, nx, ny)
    assert err <= tol, f"max |opsplit - eqs.(27)-(35)| = {err:.3e} > {tol:g} (N_t = {nt})"


def test_reference_is_not_trivially_equal():
    """Guard: the comparison would see a wrong substep (a changed relaxation weight)."""
    torch.manual_seed(0)
    model = PaperTransformer(6, n_x=4, J=2, n_steps=2, dtype=torch.float64)
    wrong = PaperTransformer(6, n_x=4, J=2, n_steps=2, relax_weight=0.6, dtype=torch.float64)
    wrong.load_state_dict(model.state_dict())
    f = torch.randn(2, 4, 6, dtype=torch.float64)
    ref = paper_transformer(f, [_weights_of(model, n) for n in range(2)], 1 / math.sqrt(6))
    assert (model(f) - ref).abs().max() < 1e-12
    assert (wrong(f) - ref).abs().max() > 1e-6


def test_output_tokens_lie_on_S1(dtype):
    torch.manual_seed(3)
    model = PaperTransformer(10, n_x=6, J=2, n_steps=3, sigma1=0.2, sigma2=1.7, dtype=dtype)
    u = model(torch.randn(4, 6, 10, dtype=dtype))
    tol = 1e-5 if dtype == torch.float32 else 1e-12
    assert torch.allclose(u.mean(-1), torch.full_like(u[..., 0], 0.2), atol=tol)
    assert torch.allclose(u.var(-1, unbiased=False), torch.full_like(u[..., 0], 1.7**2), atol=10 * tol)


def test_unbatched_input_and_trajectory():
    torch.manual_seed(4)
    model = PaperTransformer(5, n_x=3, J=1, n_steps=4, dtype=torch.float64)
    f = torch.randn(3, 5, dtype=torch.float64)
    out, traj = model(f, return_trajectory=True)
    assert out.shape == (3, 5) and traj.shape == (5, 3, 5)
    assert torch.equal(traj[0], f) and torch.allclose(traj[-1], out)
    assert torch.allclose(model(f.unsqueeze(0))[0], out)


def test_per_feature_bias_option_matches_linear_layer():
    """bias_axis='y' adds b_j(y) like nn.Linear: check against torch.nn.Linear."""
    torch.manual_seed(5)
    model = PaperTransformer(6, J=1, n_steps=1, bias_axis="y", dtype=torch.float64)
    layer = model.ffn[0]
    lin = torch.nn.Linear(6, 6, dtype=torch.float64)
    with torch.no_grad():
        lin.weight.copy_((torch.eye(6, dtype=torch.float64) + layer.W(0.0)).T)
        lin.bias.copy_(layer.b(0.0))
    u = torch.randn(2, 9, 6, dtype=torch.float64)
    g = model.grid.with_shape(9, 6)
    assert torch.allclose(u + layer.field(0.0, u, g), lin(u), atol=1e-13)


def _successive_differences(model, f, steps):
    with torch.no_grad():
        outs = [model(f, n_steps=n) for n in steps]
    return [float((a - b).abs().max()) for a, b in zip(outs[1:], outs[:-1])]


def test_with_sigma1_positive_the_scheme_converges_at_first_order_in_dt():
    """S1(2, 1) meets S2 = {u >= 0}: the same controls at dt -> 0 converge, order 1."""
    torch.manual_seed(0)
    m = PaperTransformer(12, n_x=8, J=2, n_steps=6, sigma1=2.0, dtype=torch.float64)
    f = torch.randn(2, 8, 12, dtype=torch.float64)
    d = _successive_differences(m, f, [48, 96, 192, 384])
    orders = [math.log2(a / b) for a, b in zip(d[:-1], d[1:])]
    assert all(0.8 < p < 1.3 for p in orders), f"successive differences {d}, orders {orders}"


def test_with_sigma1_zero_the_dt_limit_forgets_the_controls():
    """S1(0, sigma2) and S2 do not intersect (a token >= 0 with mean 0 is 0, and has no
    variance), so eq. (7) has no solution; as dt -> 0 the scheme tends to the fixed point
    of the projections, the same for any controls (docs/paper_scheme.md)."""
    torch.manual_seed(0)
    f = torch.randn(2, 8, 12, dtype=torch.float64)
    a = PaperTransformer(12, n_x=8, J=2, n_steps=6, sigma1=0.0, dtype=torch.float64)
    b = PaperTransformer(12, n_x=8, J=2, n_steps=6, sigma1=0.0, dtype=torch.float64)
    with torch.no_grad():
        gaps = [float((a(f, n_steps=n) - b(f, n_steps=n)).abs().max()) for n in (384, 768, 1536)]
        gap6 = float((a(f) - b(f)).abs().max())
    assert gap6 > 0.5, "two random models should differ at dt = 1"
    assert gaps[-1] < 1e-2 and 1.8 < gaps[0] / gaps[1] < 2.2 and 1.8 < gaps[1] / gaps[2] < 2.2, gaps
