"""`convert_time_controls` on a decoder's layer weights (`LayerwiseConstant`): the L2
projection in time onto a smooth basis, checked against its definition transcribed here
(numpy's Legendre polynomials, exact integrals of the pieces), and a constant-in-time model
left unchanged."""

import numpy as np
import pytest
import torch
from numpy.polynomial import legendre as npleg

from opsplit.controls import LayerwiseConstant, PiecewiseLinear, TimeBasis
from opsplit.models import DecoderConfig, DecoderLM, convert_time_controls

D = torch.float64


def _decoder(layers=4, seed=0):
    cfg = DecoderConfig(vocab_size=11, d_model=8, n_layers=layers, n_heads=2, d_ff=16, norm="layer", mlp="plain",
                        activation="gelu", positions="learned", max_positions=8, qkv_bias=True, norm_bias=True)
    return DecoderLM(cfg, generator=torch.Generator().manual_seed(seed), dtype=D)


def _layerwise(m):
    return [(name, c) for name, c in m.named_modules() if isinstance(c, LayerwiseConstant)]


def test_legendre_coefficients_are_the_l2_projection():
    """c_p = (2p + 1)/2 * int_{-1}^{1} f(s) P_p(s) ds, f piecewise constant on 4 equal pieces
    of s in [-1, 1] (t in [0, 4]), each piece integrated exactly with numpy's antiderivative."""
    m = _decoder()
    before = {n: torch.stack([p.detach().clone() for p in c.pieces]) for n, c in _layerwise(m)}
    convert_time_controls(m, "legendre", n_steps=4, n_modes=4)
    after = dict(m.named_modules())
    edges = np.linspace(-1.0, 1.0, 5)
    for name, rows in before.items():
        c = after[name]
        assert isinstance(c, TimeBasis) and c.n_modes == 4 and c.basis == "legendre"
        want = []
        for p in range(4):
            anti = npleg.Legendre.basis(p).integ()
            w = np.array([anti(b) - anti(a) for a, b in zip(edges[:-1], edges[1:])])  # int over each piece
            want.append((2 * p + 1) / 2 * np.tensordot(w, rows.numpy(), axes=1))
        np.testing.assert_allclose(c.coefficients.detach().numpy(), np.stack(want), rtol=0, atol=1e-12)


@pytest.mark.parametrize("kind", ["legendre", "chebyshev", "cosine", "piecewise_linear"])
def test_constant_in_time_model_is_unchanged(kind):
    """Layers with equal weights: the same function of t in every kind, the same logits."""
    m = _decoder()
    with torch.no_grad():
        for _, c in _layerwise(m):
            for p in c.pieces[1:]:
                p.copy_(c.pieces[0])
    ids = torch.randint(0, 11, (2, 6), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ref = m(ids).logits
    convert_time_controls(m, kind, n_steps=4, n_modes=4)
    assert not _layerwise(m)
    kinds = {type(c) for c in m.modules() if isinstance(c, (TimeBasis, PiecewiseLinear))}
    assert kinds == {PiecewiseLinear if kind == "piecewise_linear" else TimeBasis}
    with torch.no_grad():
        out = m(ids).logits
    torch.testing.assert_close(out, ref, rtol=0, atol=1e-12)


def test_converted_decoder_trains_and_refines():
    """The converted weights are parameters that receive gradients, and the model is solved
    at another N_t (the controls are functions of t, not layer indices)."""
    m = convert_time_controls(_decoder(), "legendre", n_steps=4, n_modes=3)
    ids = torch.randint(0, 11, (2, 6), generator=torch.Generator().manual_seed(2))
    m(ids).logits.square().mean().backward()
    coeffs = [c.coefficients for c in m.modules() if isinstance(c, TimeBasis)]
    assert coeffs and all(c.grad is not None and c.grad.abs().sum() > 0 for c in coeffs)
    with torch.no_grad():
        u = m.embed(ids)
        a, b, c = (m.decoder.solve(u, n_steps=n).u for n in (32, 64, 128))
    # explicit-Euler substeps, first order: halving the step halves the difference
    ratio = float((a - b).norm() / (b - c).norm())
    assert 1.7 < ratio < 2.3
