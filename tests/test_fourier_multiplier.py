"""FourierMultiplier (opsplit/operators/fourier_multiplier.py, eq. P): against a direct
transcription of the sum over modes, the orthogonal projection at initialisation, one
operator on every grid, autograd, dtypes, devices, and bad input."""

from __future__ import annotations

import math

import pytest
import torch

from opsplit.models import NeuralOperatorTransformer
from opsplit.operators import FourierMultiplier

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def naive(w: torch.Tensor, factors: torch.Tensor) -> torch.Tensor:
    """(P) written out, O(N^2 M): the coefficients by the rectangle rule, then the sum over
    |m| <= M with c_{-m} = conj(c_m) and c_0 real; ``w`` ``(B, N, C)``."""
    B, n, C = w.shape
    M1 = factors.shape[1]
    x = torch.arange(n, dtype=torch.float64) / n  # x_j / L
    out = torch.zeros(B, n, C, dtype=torch.complex128)
    for m in range(-(M1 - 1), M1):
        k = abs(m)
        c = torch.complex(factors[0, k], factors[1, k] if k else torch.zeros_like(factors[1, k]))
        if m < 0:
            c = c.conj()
        e = torch.exp(-2j * math.pi * m * x)  # (n,)
        coef = (w.to(torch.complex128) * e.view(1, n, 1)).sum(1) / n  # (B, C)
        out += (c * coef).unsqueeze(1) * torch.exp(2j * math.pi * m * x).view(1, n, 1)
    assert out.imag.abs().max() < 1e-10
    return out.real


def random_factors(op, gen):
    with torch.no_grad():
        op.factors.copy_(torch.randn(op.factors.shape, generator=gen, dtype=op.factors.dtype))


@pytest.mark.parametrize("n,modes,channels", [(16, 8, 1), (31, 16, 3), (64, 5, 2)])
def test_equals_the_sum_over_modes(n, modes, channels):
    gen = torch.Generator().manual_seed(n + modes)
    op = FourierMultiplier(modes, channels, dtype=torch.float64)
    random_factors(op, gen)
    w = torch.randn(3, n, channels, generator=gen, dtype=torch.float64)
    got = op(w)
    torch.testing.assert_close(got, naive(w, op.factors.detach()), rtol=0, atol=1e-12)
    if channels == 1:  # (B, N_x) in, (B, N_x) out
        torch.testing.assert_close(op(w[..., 0]), got[..., 0], rtol=0, atol=0)


def test_initialised_as_the_orthogonal_projection():
    op = FourierMultiplier(4, dtype=torch.float64)
    x = torch.arange(64, dtype=torch.float64) / 64
    low = 0.3 + torch.cos(2 * math.pi * x) - 0.5 * torch.sin(2 * math.pi * 3 * x)
    high = torch.cos(2 * math.pi * 4 * x) + torch.sin(2 * math.pi * 9 * x)
    torch.testing.assert_close(op((low + high)[None]), low[None], rtol=0, atol=1e-13)
    once = op(torch.randn(2, 64, dtype=torch.float64))
    torch.testing.assert_close(op(once), once, rtol=0, atol=1e-13)  # idempotent


def test_one_operator_on_every_grid():
    """The same factors on 32, 64 and 512 nodes give the same function (the input smooth
    and periodic: the coefficients' quadrature is spectrally accurate)."""
    gen = torch.Generator().manual_seed(1)
    op = FourierMultiplier(6, dtype=torch.float64)
    random_factors(op, gen)
    fine = None
    for n in (512, 64, 32):
        x = torch.arange(n, dtype=torch.float64) / n
        w = torch.exp(torch.sin(2 * math.pi * x)) + 0.3 * torch.cos(2 * math.pi * 2 * x)
        out = op(w[None])[0]
        if fine is None:
            fine = out
        else:  # the fine grid's values at the coarse nodes
            torch.testing.assert_close(out, fine[:: 512 // n], rtol=0, atol=1e-12)


def test_gradcheck():
    gen = torch.Generator().manual_seed(2)
    op = FourierMultiplier(4, 2, dtype=torch.float64)
    random_factors(op, gen)
    w = torch.randn(2, 9, 2, generator=gen, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda w: op(w), (w,))
    assert torch.autograd.gradgradcheck(lambda w: op(w) ** 2, (w,))  # second derivatives through the FFTs
    # the factors: through a functional call of the module
    assert torch.autograd.gradcheck(lambda f: torch.func.functional_call(op, {"factors": f}, (w,)),
                                    (op.factors.detach().clone().requires_grad_(),))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_dtypes_and_devices(device, dtype):
    gen = torch.Generator().manual_seed(3)
    op64 = FourierMultiplier(5, 2, dtype=torch.float64)
    random_factors(op64, gen)
    w = torch.randn(2, 20, 2, generator=gen, dtype=torch.float64)
    op = FourierMultiplier(5, 2, dtype=dtype, device=device)
    with torch.no_grad():
        op.factors.copy_(op64.factors.to(dtype))
    out = op(w.to(device=device, dtype=dtype))
    assert out.dtype == dtype and out.device.type == device
    tol = 1e-12 if dtype == torch.float64 else 1e-5
    torch.testing.assert_close(out.cpu().double(), op64(w), rtol=0, atol=tol)
    out.sum().backward()
    assert op.factors.grad is not None and torch.isfinite(op.factors.grad).all()


def test_bad_input():
    op = FourierMultiplier(8, 2)
    with pytest.raises(ValueError, match=r"N_x = 14 nodes.*needs N_x >= 15"):
        op(torch.zeros(1, 14, 2))
    with pytest.raises(ValueError, match=r"expected shape \(B, N_x, 2\)"):
        op(torch.zeros(1, 32, 3))
    with pytest.raises(ValueError, match=r"expected shape \(B, N_x, 2\)"):
        op(torch.zeros(1, 32))
    with pytest.raises(ValueError, match="finite"):
        op(torch.full((1, 32, 2), float("nan")))
    with pytest.raises(TypeError, match="floating-point"):
        op(torch.zeros(1, 32, 2, dtype=torch.int64))
    with pytest.raises(TypeError, match="torch.Tensor"):
        op([[0.0] * 32])
    for bad in (0, -1, 2.5, True):
        with pytest.raises((ValueError, TypeError), match="FourierMultiplier.modes"):
            FourierMultiplier(bad)


def test_model_output_is_band_limited():
    gen = torch.Generator().manual_seed(4)
    m = NeuralOperatorTransformer("none", "lie", d_model=8, heads=1, modes=4, nonlinearity="map", output_modes=6,
                                  generator=gen, dtype=torch.float64)
    plain = NeuralOperatorTransformer("none", "lie", d_model=8, heads=1, modes=4, nonlinearity="map",
                                      generator=torch.Generator().manual_seed(4), dtype=torch.float64)
    u = torch.randn(2, 64, generator=gen, dtype=torch.float64)
    out = m(u)
    spec = torch.fft.rfft(out, dim=-1)
    assert spec[:, 6:].abs().max() < 1e-10 * spec[:, :6].abs().max()
    # the rest of the model is drawn as without the option: the same outputs on the kept modes
    torch.testing.assert_close(spec[:, :6], torch.fft.rfft(plain(u), dim=-1)[:, :6], rtol=1e-12, atol=1e-12)
    assert m.min_nodes == 11  # 2 * 6 - 1 > 2 * 4 - 1
    with pytest.raises(ValueError, match="N_x"):
        m(torch.randn(1, 10, dtype=torch.float64))
    with pytest.raises((ValueError, TypeError), match="output_modes"):
        NeuralOperatorTransformer("none", "lie", d_model=8, heads=1, output_modes=0)
