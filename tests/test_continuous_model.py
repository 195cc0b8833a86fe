"""The continuous transformer with smooth controls is one model at every resolution: its
discrete solutions converge as the grid is refined (and `python -m opsplit` shows it)."""

import math

import numpy as np
import torch

from opsplit.__main__ import grid_study, main
from opsplit.models import ContinuousTransformer


def test_solutions_converge_at_second_order_on_nested_grids():
    _, rows, _ = grid_study(resolutions=(9, 27, 81), reference=243, n_steps=2, batch=2)
    ns = np.array([r[0] for r in rows], dtype=float)
    errs = np.array([r[1] for r in rows])
    assert np.all(np.diff(errs) < 0), f"errors do not decrease: {errs}"
    p = -np.polyfit(np.log(ns), np.log(errs), 1)[0]
    assert 1.5 < p < 2.7, f"measured spatial order {p:.2f} (midpoint rule: 2); errors {errs}"


def test_model_is_defined_independently_of_the_grid():
    gen = torch.Generator().manual_seed(1)
    m = ContinuousTransformer(n_modes=3, n_steps=2, generator=gen, dtype=torch.float64)
    fc = torch.randn(1, 3, 3, generator=gen, dtype=torch.float64)
    for nx, ny in ((5, 7), (12, 4), (30, 30)):
        u = m(m.sample(fc, nx, ny))
        assert u.shape == (1, nx, ny) and torch.isfinite(u).all()
        # every token of the output lies on S1(0, 1)
        assert torch.allclose(u.mean(-1), torch.zeros(1, nx, dtype=torch.float64), atol=1e-12)


def test_same_controls_at_another_time_step():
    gen = torch.Generator().manual_seed(2)
    m = ContinuousTransformer(n_modes=3, n_steps=3, generator=gen, dtype=torch.float64)
    f = m.sample(torch.randn(2, 3, 3, generator=gen, dtype=torch.float64), 8, 8)
    a, b = m(f), m(f, n_steps=6)
    assert a.shape == b.shape and not torch.allclose(a, b)
    assert math.isclose(m.dt(6), 1 / 6)


def test_main_job_prints_the_table(capsys):
    assert main(["grid", "--levels", "2", "--steps", "2"]) == 0
    out = capsys.readouterr().out
    assert "rel. L2 error" in out and "reference: N_x = N_y = 81" in out
