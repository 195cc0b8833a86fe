"""The Burgers data: the solver against the Cole-Hopf solution (1e-8), the energy identity,
self-convergence on a small problem, the random field's spectrum, and the cache (location,
prefix reuse, checksums: a truncated or edited file is never used).  Tiny sizes only; the
full data set is made and checked by benchmarks/burgers.py."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from opsplit.data import burgers as burgers_mod
from opsplit.data.burgers import (
    BurgersCacheError,
    burgers_cache_dir,
    grf_initial_conditions,
    load_burgers,
)
from opsplit.data.burgers_solver import solve_burgers

NU = 0.1


def cole_hopf(x, t, a=0.5, nu=NU):
    """u = -2 nu phi_x / phi, phi = 1 + a e^{-4 pi^2 nu t} cos(2 pi x): phi solves the heat
    equation, so u solves Burgers' equation exactly (Cole-Hopf)."""
    e = a * np.exp(-4 * np.pi**2 * nu * t)
    return -2 * nu * (-2 * np.pi * e * np.sin(2 * np.pi * x)) / (1 + e * np.cos(2 * np.pi * x))


def test_cole_hopf_to_1e8():
    x = np.arange(64) / 64
    u = solve_burgers(cole_hopf(x, 0.0)[None], nu=NU, t_final=1.0, n_steps=1000)[0]
    assert np.abs(u - cole_hopf(x, 1.0)).max() < 1e-8
    # and at an intermediate time, from a larger amplitude
    u = solve_burgers(cole_hopf(x, 0.0, a=0.8)[None], nu=NU, t_final=0.25, n_steps=250)[0]
    assert np.abs(u - cole_hopf(x, 0.25, a=0.8)).max() < 1e-8


def _rough(n=128, B=3, seed=1):
    return grf_initial_conditions(B, n, np.random.default_rng(seed))


def test_energy_identity_and_decay():
    """d/dt (1/2)||u||^2 = -nu ||u_x||^2 (the advection term conserves the energy of a periodic
    u): the energy decreases at every saved time, and E(1) - E(0) + nu int_0^1 ||u_x||^2 dt
    vanishes up to the time quadrature (Simpson's rule on 1000 saved levels; a smooth,
    nonlinear initial condition of amplitude 1, so the dissipation is smooth in t)."""
    x = np.arange(64) / 64
    u0 = np.stack([np.sin(2 * np.pi * x) + 0.5 * np.cos(6 * np.pi * x + 1), 0.8 * np.cos(4 * np.pi * x)])
    _, (times, c) = solve_burgers(u0, n_steps=1000, save_times=1000)
    m = np.arange(c.shape[-1])
    w = np.where(m == 0, 1.0, 2.0)  # ||u||^2 = |c_0|^2 + 2 sum_{m > 0} |c_m|^2 on [0, 1)
    E = 0.5 * (w * np.abs(c) ** 2).sum(-1)
    D = NU * (w * (2 * np.pi * m) ** 2 * np.abs(c) ** 2).sum(-1)
    assert (np.diff(E, axis=0) < 0).all()
    h = times[1] - times[0]
    simpson = h / 3 * (D[0] + D[-1] + 4 * D[1:-1:2].sum(0) + 2 * D[2:-1:2].sum(0))
    rel = np.abs(E[-1] - E[0] + simpson) / (E[0] - E[-1])
    assert rel.max() < 1e-6, rel
    # and for rough data the energy still decreases at every level
    _, (_, c) = solve_burgers(_rough(), n_steps=100, save_times=100)
    w = np.where(np.arange(c.shape[-1]) == 0, 1.0, 2.0)
    E = (w * np.abs(c) ** 2).sum(-1)
    assert (np.diff(E, axis=0) < 0).all()


def test_self_convergence_small():
    """Against a 2x finer grid and time step: <= 1e-6 relative (the data's own check, at 8192
    nodes and 1000 steps, is in benchmarks/burgers.py --check-solver)."""
    a = _rough(128)
    u = solve_burgers(a, n_steps=250)
    fine = solve_burgers(a, n_steps=500, grid_factor=2)
    assert np.linalg.norm(u - fine) / np.linalg.norm(fine) < 1e-6


def test_random_field_spectrum():
    """Mode m of N(0, 625 (-Laplacian + 25)^-2) has E|c_m|^2 = lambda_m (its cosine and sine
    parts each of variance lambda_m / 2 after the factor 2 of a real field), the mean is 0."""
    u = grf_initial_conditions(4000, 32, np.random.default_rng(0))
    c = np.fft.rfft(u, axis=-1) / 32
    lam = 625 * ((2 * np.pi * np.arange(1, 6)) ** 2 + 25) ** -2.0
    assert np.abs(c[:, 0]).max() < 1e-12
    ratio = (np.abs(c[:, 1:6]) ** 2).mean(0) / lam
    assert np.all(np.abs(ratio - 1) < 0.1), ratio


TINY = dict(n_train=3, n_test=2, points=64, n_steps=100)


def test_cache_folder_env(monkeypatch, tmp_path):
    monkeypatch.delenv("OPSPLIT_DATA_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert burgers_cache_dir() == tmp_path / "xdg" / "opsplit" / "burgers"
    monkeypatch.setenv("OPSPLIT_DATA_DIR", str(tmp_path / "mine"))
    assert burgers_cache_dir() == tmp_path / "mine" / "burgers"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.delenv("OPSPLIT_DATA_DIR")
    assert burgers_cache_dir().parts[-3:] == (".cache", "opsplit", "burgers")


def test_generated_once_then_read(monkeypatch, tmp_path):
    train, test = load_burgers(32, cache_dir=tmp_path, **TINY)
    assert train.inputs.shape == (3, 32) and test.targets.shape == (2, 32) and train.inputs.dtype == torch.float32
    calls = []
    monkeypatch.setattr(burgers_mod, "_generate", lambda s: calls.append(s))
    again, _ = load_burgers(64, cache_dir=tmp_path, **TINY)  # read, not generated
    assert calls == []
    torch.testing.assert_close(again.inputs[:, ::2], train.inputs, rtol=0, atol=0)
    # a smaller set is a prefix of the cached one: read from it
    small, _ = load_burgers(16, n_train=2, n_test=1, points=64, n_steps=100, cache_dir=tmp_path)
    assert calls == []
    torch.testing.assert_close(small.targets, train.targets[:2, ::2], rtol=0, atol=0)
    # the stored pairs are solutions: the first one solved again from its stored initial condition
    ref = solve_burgers(again.inputs[:1].double().numpy(), n_steps=100)[0, ::2]
    assert np.abs(ref - train.targets[0].double().numpy()).max() < 1e-6


def _files(tmp_path):
    return sorted(tmp_path.glob("burgers-*.npz"))[0], sorted(tmp_path.glob("burgers-*.json"))[0]


def test_truncated_cache_regenerated_or_refused(tmp_path):
    train, _ = load_burgers(64, cache_dir=tmp_path, **TINY)
    data, _ = _files(tmp_path)
    raw = data.read_bytes()
    data.write_bytes(raw[: len(raw) // 2])
    with pytest.raises(BurgersCacheError, match="checksum mismatch"):
        load_burgers(64, cache_dir=tmp_path, on_corrupt="error", **TINY)
    with pytest.warns(UserWarning, match="truncated or edited.*regenerating"):
        again, _ = load_burgers(64, cache_dir=tmp_path, **TINY)
    torch.testing.assert_close(again.targets, train.targets, rtol=0, atol=0)
    assert data.read_bytes() == raw  # rewritten whole


def test_edited_cache_detected(tmp_path):
    load_burgers(64, cache_dir=tmp_path, **TINY)
    data, meta = _files(tmp_path)
    with np.load(data) as z:
        arrays = {k: z[k].copy() for k in z.files}
    arrays["test_u"][0, 3] += 1e-3  # a plausible-looking edit
    np.savez(data, **arrays)
    with pytest.raises(BurgersCacheError, match="checksum mismatch"):
        load_burgers(64, cache_dir=tmp_path, on_corrupt="error", **TINY)
    # metadata of other settings: not used for these
    info = json.loads(meta.read_text())
    info["settings"]["nu"] = 0.2
    meta.write_text(json.dumps(info))
    with pytest.raises(BurgersCacheError, match="settings"):
        load_burgers(64, cache_dir=tmp_path, on_corrupt="error", **TINY)
