"""ReLU is the L2 projection onto S2 = {u >= 0} (paper 002, eq. 24)."""

import numpy as np
import torch
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from opsplit.operators import ProjectionS2

vals = arrays(np.float64, (2, 3, 5), elements=st.floats(-1e6, 1e6, allow_nan=False))
P = ProjectionS2()


def _p(a):
    return P(torch.from_numpy(a))


@given(vals)
def test_idempotent(a):
    u = _p(a)
    assert torch.equal(P(u), u)
    assert (u >= 0).all()


@given(vals, vals)
def test_non_expansive(a, b):
    d_out = (_p(a) - _p(b)).norm()
    d_in = torch.from_numpy(a - b).norm()
    assert d_out <= d_in * (1 + 1e-12) + 1e-12


@given(vals, arrays(np.float64, (2, 3, 5), elements=st.floats(0, 1e6)))
def test_variational_inequality_characterises_the_projection(a, w):
    """<v - P v, w - P v> <= 0 for every w in S2: P v is the closest point of the convex S2."""
    v = torch.from_numpy(a)
    pv = P(v)
    inner = ((v - pv) * (torch.from_numpy(w) - pv)).sum()
    assert inner <= 1e-9 * (1 + v.abs().max() * torch.from_numpy(w).abs().max())


@given(vals, st.integers(0, 1000))
def test_closest_point_beats_random_points_of_S2(a, seed):
    v = torch.from_numpy(a)
    pv = P(v)
    g = torch.Generator().manual_seed(seed)
    for _ in range(5):
        w = (pv + torch.randn(v.shape, generator=g, dtype=v.dtype)).clamp_min(0)
        assert (pv - v).norm() <= (w - v).norm() + 1e-9
