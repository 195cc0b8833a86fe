"""The Burgers data: the solver against the Cole-Hopf solution (1e-8), the energy identity,
self-convergence on a small problem, the random field's spectrum, and the cache (location,
prefix reuse, checksums: a truncated or edited file is never used).  Then (issue 42) the
viscosity range the solver takes (its resolution bound against exact Cole-Hopf solutions, its
stability constants against ETDRK4's amplification written out), every argument and size
checked before anything is computed or written, and cache files that are missing, folders,
not JSON objects, stray, left over from a larger set or written by two writers at once.
Tiny sizes only; the full data set is made and checked by benchmarks/burgers.py."""

from __future__ import annotations

import json
import os
import re
import warnings

import numpy as np
import pytest
import torch

from opsplit.data import burgers as burgers_mod
from opsplit.data import burgers_solver as solver_mod
from opsplit.data.burgers import (
    BurgersCacheError,
    burgers_cache_dir,
    burgers_pairs,
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


# -- the solver's arguments: checked before anything is computed (issue 42, finding 7) ---------------
@pytest.fixture
def no_solve(monkeypatch):
    """Any step of the solver fails the test: a refusal must come before it."""
    def step(*a, **k):
        raise AssertionError("the solver ran")

    monkeypatch.setattr(solver_mod, "_nonlinear", step)


@pytest.mark.parametrize("nu", [-0.1, float("nan"), 1e-6, float("inf"), 0.0, 5e-324, 1e300])
def test_viscosity_refused_before_any_step(nu, no_solve, tmp_path):
    x = np.arange(64) / 64
    with pytest.raises(ValueError, match=r"^solve_burgers\.nu: expected a"):
        solve_burgers(np.sin(2 * np.pi * x)[None], nu=nu, n_steps=100)
    with pytest.raises(ValueError, match=r"^burgers_pairs\.nu: expected a"):
        burgers_pairs(2, points=64, nu=nu, n_steps=100)
    with pytest.raises(ValueError, match=r"^load_burgers\.nu: expected a"):
        load_burgers(16, n_train=2, n_test=1, points=64, n_steps=100, nu=nu, cache_dir=tmp_path / "c")
    assert not (tmp_path / "c").exists()  # nothing written


@pytest.mark.parametrize("nu", [1e-3, 5e-324, 1e300])
def test_load_burgers_absurd_viscosity_writes_nothing(nu, tmp_path):
    """The reported cases: a NaN .npz was cached, then the load failed naming the targets."""
    with pytest.raises(ValueError, match=r"^load_burgers\.nu: expected a viscosity in \[\S+, \S+\] at points = 64"):
        load_burgers(16, n_train=2, n_test=1, points=64, n_steps=100, nu=nu, cache_dir=tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_range_message_states_the_bounds():
    x = np.arange(64) / 64
    u0 = np.sin(2 * np.pi * x)[None]  # max|u0| = 1
    with pytest.raises(ValueError) as e:
        solve_burgers(u0, nu=1e-4, n_steps=10)
    msg = str(e.value)
    # resolution: nu >= max|u0| ln(1e3) / (4 pi M), M = 31; stability at dt = 0.1: the least nu with
    # dt (k max|u0| - 0.34 nu k^2) <= 2.82 for every k <= 2 pi 31 (by bisection over a fine grid of k)
    res = np.log(1e3) / (4 * np.pi * 31)
    k = np.linspace(0, 2 * np.pi * 31, 200001)
    lo, hi = 0.0, 1.0
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (lo, mid) if (0.1 * (k - 0.34 * mid * k * k)).max() <= 2.82 else (mid, hi)
    stab = hi
    assert f"below {res:.3g} the 31 modes do not resolve" in msg
    assert f"below {stab:.3g} the ETDRK4 step dt = 0.1 is unstable" in msg
    assert f"[{max(res, stab):.3g}, " in msg


def test_nan_initial_condition_refused(no_solve):
    u0 = np.ones((2, 32))
    u0[1, 5] = np.nan
    with pytest.raises(ValueError, match=r"^solve_burgers\.u0: expected finite values, found 1 NaN and 0 inf"):
        solve_burgers(u0)


@pytest.mark.parametrize("kw, match", [
    (dict(n_steps=0), r"^burgers_pairs\.n_steps: expected an integer >= 1, got 0"),
    (dict(points=0), r"^burgers_pairs\.points: expected an integer >= 8, got 0"),
    (dict(n=-1), r"^burgers_pairs\.n: expected an integer >= 1, got -1"),
    (dict(n=0), r"^burgers_pairs\.n: expected an integer >= 1, got 0"),
])
def test_counts_refused_naming_the_argument(kw, match, no_solve):
    args = dict(n=2, points=64, n_steps=100)
    args.update(kw)
    with pytest.raises(ValueError, match=match):
        burgers_pairs(args.pop("n"), **args)


def _cole_hopf_bound(a, nu):
    """The max|u0| of the Cole-Hopf field of ``a`` and the fewest modes / steps the range allows."""
    A = 4 * np.pi * nu * a / np.sqrt(1 - a * a)  # max of -2 nu phi_x / phi: sin / (1 + a cos) peaks at 1/sqrt(1-a^2)
    return A, solver_mod.least_modes(nu, A)


@pytest.mark.parametrize("a", [0.9, 0.99, 0.999])
def test_viscosity_bound_resolves_cole_hopf(a):
    """At the resolution bound (the fewest modes the check allows) the solver matches the
    exact Cole-Hopf solution, whose front is the steepest the bound assumes, to 5e-4 of
    max|u| (at t = 0.001 and 0.01, dt = 1e-4); with two thirds of those modes, which the
    check refuses, the error is above 1e-3 (measured: 1.6e-3 to 4.1e-3)."""
    nu = 0.01
    A, M = _cole_hopf_bound(a, nu)
    for modes, ok in ((M, True), ((2 * M) // 3, False)):
        N = 2 * (modes + 1)
        x = np.arange(N) / N
        u0 = cole_hopf(x, 0.0, a=a, nu=nu)
        assert A * 0.95 < np.abs(u0).max() <= A
        err = 0.0
        for T, steps in ((0.001, 10), (0.01, 100)):  # dt = 1e-4: stable (checked), time error negligible
            r = solver_mod.viscosity_range((N - 1) // 2, T / steps, float(np.abs(u0).max()))
            assert (nu in r) == ok, (modes, r)
            if ok:
                u = solve_burgers(u0[None], nu=nu, t_final=T, n_steps=steps)[0]
            else:
                with pytest.raises(ValueError, match=r"^solve_burgers\.nu: .* modes do not resolve"):
                    solve_burgers(u0[None], nu=nu, t_final=T, n_steps=steps)
                u = _unchecked_solve(u0[None], nu=nu, t_final=T, n_steps=steps)[0]
            err = max(err, np.abs(u - cole_hopf(x, T, a=a, nu=nu)).max() / A)
        assert (err < 5e-4) if ok else (err > 1e-3), (a, modes, err)


def _unchecked_solve(u0, **kw):
    import unittest.mock

    wide = solver_mod.ViscosityRange(1, 1.0, 0.0, 0.0, 0.0, np.inf)
    with unittest.mock.patch.object(solver_mod, "viscosity_range", lambda *a: wide):
        return solve_burgers(u0, **kw)


def _etdrk4_amplification(x, y):
    """|R| of one ETDRK4 step (Cox & Matthews) of c' = -x c + i y c, dt = 1, with the phi
    functions in closed form (x > 0) or RK4's polynomial (x = 0): written out here, apart
    from the solver's contour integrals."""
    lam = 1j * y
    if x == 0:
        return np.abs(1 + lam + lam**2 / 2 + lam**3 / 6 + lam**4 / 24)
    z = -x
    E, E2 = np.exp(z), np.exp(z / 2)
    Q = (E2 - 1) / z
    f1 = (-4 - z + E * (4 - 3 * z + z * z)) / z**3
    f2 = (2 + z + E * (z - 2)) / z**3
    f3 = (-4 - 3 * z - z * z + E * (4 - z)) / z**3
    a = E2 + Q * lam
    b = E2 + Q * lam * a
    c = E2 * a + Q * lam * (2 * b - 1)
    return np.abs(E + lam * f1 + 2 * lam * (a + b) * f2 + lam * c * f3)


def test_etdrk4_stability_constants():
    """|R| <= 1 on the segment |y| <= STABILITY_A + STABILITY_B x (x = nu k^2 dt, y = k |u| dt)
    from x = 0 to 1e4, and the boundary is within 6% of it near its least slope (x = 2);
    the solver's contour-integral coefficients agree with the closed forms."""
    a, b = solver_mod.STABILITY_A, solver_mod.STABILITY_B
    xs = np.concatenate([[0.0], np.geomspace(0.05, 1e4, 120)])
    for x in xs:
        y = np.linspace(0, a + b * x, 2001)
        assert _etdrk4_amplification(x, y).max() <= 1 + 1e-12, x
    assert _etdrk4_amplification(2.0, a + 1.06 * b * 2.0) > 1  # the slope is near its least there
    assert _etdrk4_amplification(0.0, 2.83) > 1  # and a is RK4's bound 2 sqrt 2
    z = -np.array([0.5, 2.0, 30.0])
    E, E2, Q, f1, f2, f3 = solver_mod.etdrk4_coefficients(z, 1.0)
    np.testing.assert_allclose(Q, (np.exp(z / 2) - 1) / z, rtol=1e-12)
    np.testing.assert_allclose(f2, (2 + z + np.exp(z) * (z - 2)) / z**3, rtol=1e-10)


def test_coefficients_finite_at_the_largest_viscosity():
    """At nu dt k^2 = MAX_STIFFNESS the coefficients are finite and match their limits
    (E = 0, Q -> -dt / (dt L), f1 -> -dt / (dt L)^2 ...); beyond it they overflow."""
    hL = -np.array([solver_mod.MAX_STIFFNESS])
    E, E2, Q, f1, f2, f3 = solver_mod.etdrk4_coefficients(hL, 1.0)
    assert all(np.isfinite(c).all() for c in (E, E2, Q, f1, f2, f3))
    np.testing.assert_allclose(Q, -1 / hL, rtol=1e-6)
    np.testing.assert_allclose(f1, -1 / hL**2, rtol=1e-6)
    with np.errstate(all="ignore"):
        over = solver_mod.etdrk4_coefficients(-np.array([1e160]), 1.0)
    assert not all(np.isfinite(c).all() for c in over)


# -- the size guard (finding 9) ----------------------------------------------------------------------
@pytest.mark.parametrize("kw, match", [
    (dict(points=2**40), r"^load_burgers\.points: reading the data needs an estimated .* of memory"),
    (dict(n_train=10**9), r"^load_burgers\.n_train: reading the data needs an estimated .* of memory"),
    (dict(n_test=10**12), r"^load_burgers\.n_test: reading the data needs an estimated .* of memory"),
    (dict(points=64, n_steps=10**9), r"^load_burgers\.n_steps: generating the data needs an estimated .* of compute"),
])
def test_load_burgers_size_guard(kw, match, tmp_path, no_solve):
    args = dict(resolution=16, cache_dir=tmp_path / "c")
    args.update(kw)
    with pytest.raises(ValueError, match=match) as e:
        load_burgers(**args)
    assert "force=True" in str(e.value)
    assert not (tmp_path / "c").exists()


def test_size_guard_of_pairs_and_solver(no_solve):
    with pytest.raises(ValueError, match=r"^burgers_pairs\.n: the data needs an estimated .* of memory"):
        burgers_pairs(10**11, points=64, n_steps=100)
    with pytest.raises(ValueError, match=r"^burgers_pairs\.n_steps: the data needs an estimated .* of compute"):
        burgers_pairs(2, points=64, n_steps=10**10)
    with pytest.raises(ValueError, match=r"^solve_burgers\.n_steps: the solve needs an estimated .* of compute"):
        solve_burgers(np.zeros((1, 64)), n_steps=10**10)
    with pytest.raises(ValueError, match=r"^grf_initial_conditions\.n: the draw needs an estimated .* of memory"):
        grf_initial_conditions(10**12, 64, np.random.default_rng(0))


def test_size_guard_override(monkeypatch, tmp_path):
    """A machine with 1 kB free: refused (naming load_burgers, every size at its default or
    below), and run with force=True."""
    monkeypatch.setattr(solver_mod, "available_memory", lambda: 1e3)
    monkeypatch.setattr(burgers_mod, "available_memory", lambda: 1e3)
    with pytest.raises(ValueError, match=r"^load_burgers: reading the data needs an estimated .* more than the 1 kB"):
        load_burgers(16, cache_dir=tmp_path, **TINY)
    assert list(tmp_path.iterdir()) == []
    train, test = load_burgers(16, cache_dir=tmp_path, force=True, **TINY)
    assert train.inputs.shape == (3, 16) and test.targets.shape == (2, 16)


def test_generation_cost_counts_every_size():
    from opsplit.data.burgers import generation_cost

    base = generation_cost(100, 20, 256, 1000)
    for k, i in (("n_train", 0), ("n_test", 1), ("points", 2), ("n_steps", 3)):
        args = [100, 20, 256, 1000]
        args[i] *= 16
        s, b = generation_cost(*args)
        assert s > 2 * base[0], k
        if k != "n_steps":
            assert b > 1.3 * base[1], k


# -- cache files (finding 8) -------------------------------------------------------------------------
def _npz_to_folder(data, meta):
    data.unlink()
    data.mkdir()


CACHE_EDITS = {
    "npz-deleted": (lambda data, meta: data.unlink(), r"unreadable data file \(FileNotFoundError"),
    "npz-folder": (_npz_to_folder, r"unreadable data file \(IsADirectoryError"),
    "json-list": (lambda data, meta: meta.write_text("[]"), r"unreadable metadata \(expected a JSON object"),
    "json-int": (lambda data, meta: meta.write_text("1"), r"unreadable metadata \(expected a JSON object"),
    "json-settings-list": (lambda data, meta: meta.write_text(json.dumps({"settings": [1, 2], "sha256": "0"})),
                           r"unreadable metadata \(expected a JSON object"),
    "json-folder": (lambda data, meta: (meta.unlink(), meta.mkdir()), r"unreadable metadata \(IsADirectoryError"),
    "json-binary": (lambda data, meta: meta.write_bytes(b"\xff\xfe{"), r"unreadable metadata \(UnicodeDecodeError"),
}


@pytest.mark.parametrize("edit", list(CACHE_EDITS))
def test_broken_cache_file_refused_or_regenerated(edit, tmp_path):
    fn, match = CACHE_EDITS[edit]
    train, _ = load_burgers(64, cache_dir=tmp_path, **TINY)
    data, meta = _files(tmp_path)
    fn(data, meta)
    broken = data if "npz" in edit else meta
    with pytest.raises(BurgersCacheError, match=rf"^Burgers cache '{re.escape(str(broken))}': {match}"):
        load_burgers(64, cache_dir=tmp_path, on_corrupt="error", **TINY)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        again, _ = load_burgers(64, cache_dir=tmp_path, **TINY)
    said = [str(w.message) for w in seen]
    assert any(re.search(rf"^Burgers cache '{re.escape(str(broken))}': {match}.*; regenerating it", m) for m in said)
    if "folder" in edit:  # the folder stays (never deleted): the data is used uncached
        assert any("could not write the cache" in m for m in said), said
    torch.testing.assert_close(again.targets, train.targets, rtol=0, atol=0)
    assert not list(tmp_path.glob(".*.tmp.*"))  # no temporary file left behind


def test_stray_json_files_ignored(tmp_path):
    """Stray burgers-*.json in the folder (a list, a number, settings that are a list or
    have other keys or a text count): a request reads past them (and generates)."""
    for i, text in enumerate(["[]", "1", json.dumps({"settings": [1], "sha256": "x"}),
                              json.dumps({"settings": {"n_train": "5"}, "sha256": "x"}),
                              json.dumps({"settings": {**burgers_mod._settings(0, "9", 9, 64, 0.1, 100)},
                                          "sha256": "x"})]):
        (tmp_path / f"burgers-stray{i}.json").write_text(text)
    for mode in ("error", "regenerate"):
        train, _ = load_burgers(64, cache_dir=tmp_path, on_corrupt=mode, **TINY)
        assert train.inputs.shape == (3, 64)


@pytest.mark.parametrize("edit", ["npz-deleted", "npz-folder", "json-settings-list"])
def test_leftover_larger_set_never_breaks_a_smaller_request(edit, tmp_path):
    big = dict(n_train=4, n_test=3, points=64, n_steps=100)
    load_burgers(64, cache_dir=tmp_path, **big)
    data, meta = _files(tmp_path)
    CACHE_EDITS[edit][0](data, meta)
    for mode in ("error", "regenerate"):
        train, test = load_burgers(64, cache_dir=tmp_path, on_corrupt=mode, **TINY)
        assert train.inputs.shape == (3, 64) and test.inputs.shape == (2, 64)
    ref = solve_burgers(train.inputs[:1].double().numpy(), n_steps=100)[0]
    assert np.abs(ref - train.targets[0].double().numpy()).max() < 1e-6


def test_viscosities_equal_to_six_digits_have_their_own_files(tmp_path):
    a, _ = load_burgers(64, cache_dir=tmp_path, on_corrupt="error", nu=0.1, **TINY)
    b, _ = load_burgers(64, cache_dir=tmp_path, on_corrupt="error", nu=0.1000001, **TINY)
    assert len(list(tmp_path.glob("burgers-*.npz"))) == 2
    assert not torch.equal(a.targets, b.targets)


def test_cache_folder_that_is_a_file(tmp_path, monkeypatch, no_solve):
    f = tmp_path / "f"
    f.write_text("x")
    with pytest.raises(ValueError, match=r"^load_burgers\.cache_dir: expected a folder, but the cache folder .* is a "
                                         r"file"):
        load_burgers(64, cache_dir=f, **TINY)
    monkeypatch.setenv("OPSPLIT_DATA_DIR", str(f))
    with pytest.raises(ValueError, match=r"^load_burgers\.cache_dir: expected a folder \(from \$OPSPLIT_DATA_DIR\), "
                                         r"but a folder above the cache folder"):
        load_burgers(64, **TINY)
    assert f.read_text() == "x"


def test_unwritable_cache_folder(tmp_path, monkeypatch):
    """The cache cannot be written (a read-only folder, as root too: the write fails with
    EACCES): the data is returned with a warning and no temporary file is left; a read-only
    folder that holds the data is read (no lock file needed)."""
    import errno

    real = np.savez

    def refuse(path, **arrays):
        open(path, "wb").close()  # created, then the write fails
        raise PermissionError(errno.EACCES, "Permission denied", str(path))

    monkeypatch.setattr(burgers_mod.np, "savez", refuse)
    with pytest.warns(UserWarning, match="could not write the cache"):
        train, _ = load_burgers(64, cache_dir=tmp_path, **TINY)
    assert train.inputs.shape == (3, 64)
    assert [p.name for p in tmp_path.iterdir() if not p.name.endswith(".lock")] == []
    monkeypatch.setattr(burgers_mod.np, "savez", real)
    load_burgers(64, cache_dir=tmp_path, **TINY)
    for p in tmp_path.glob(".*.lock"):
        p.unlink()
    if hasattr(os, "geteuid") and os.geteuid() != 0:
        tmp_path.chmod(0o555)
        try:
            again, _ = load_burgers(64, cache_dir=tmp_path, on_corrupt="error", **TINY)
            torch.testing.assert_close(again.targets, train.targets, rtol=0, atol=0)
        finally:
            tmp_path.chmod(0o755)


def test_concurrent_writers_leave_a_consistent_pair(tmp_path, monkeypatch):
    """Two writers of the same set, the second starting while the first has renamed its
    .npz but not yet its .json: the files left are one writer's pair (the second waits for
    the first), never one writer's .npz with the other's checksum."""
    import threading

    shapes = {"train_a": (3, 64), "train_u": (3, 64), "test_a": (2, 64), "test_u": (2, 64)}
    own = {}

    def generate(settings, *args):
        v = own[threading.current_thread().name]
        return {k: np.full(s, v, np.float32) for k, s in shapes.items()}

    monkeypatch.setattr(burgers_mod, "_generate", generate)
    real_replace = os.replace
    errors = []

    def load(name, value):
        own[name] = value
        try:
            load_burgers(64, cache_dir=tmp_path, regenerate=True, **TINY)
        except Exception as e:  # pragma: no cover - reported below
            errors.append(e)

    second = threading.Thread(target=load, args=("second", 2.0), name="second")
    at_lock = threading.Event()
    real_lock = burgers_mod._lock

    def lock(stem, exclusive):
        if exclusive and threading.current_thread().name == "second":
            at_lock.set()  # the second writer asks for the lock the first holds
        return real_lock(stem, exclusive)

    monkeypatch.setattr(burgers_mod, "_lock", lock)

    class _OS:
        def __getattr__(self, k):
            return getattr(os, k)

        @staticmethod
        def replace(src, dst):
            real_replace(src, dst)
            if threading.current_thread().name == "first" and str(dst).endswith(".npz") and not second.is_alive() \
                    and second.ident is None:
                second.start()
                while not at_lock.is_set() and second.is_alive():  # a writer that takes no lock runs to its end
                    at_lock.wait(0.01)
                second.join(timeout=1.0)  # a lock that holds nothing lets it finish here

    monkeypatch.setattr(burgers_mod, "os", _OS())
    first = threading.Thread(target=load, args=("first", 1.0), name="first")
    first.start()
    first.join()
    second.join()
    assert not errors, errors
    monkeypatch.setattr(burgers_mod, "os", os)
    train, test = load_burgers(64, cache_dir=tmp_path, on_corrupt="error", **TINY)
    assert float(train.inputs[0, 0]) == float(test.targets[-1, -1]) in (1.0, 2.0)
