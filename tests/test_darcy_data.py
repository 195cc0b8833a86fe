"""The Darcy data: the finite-difference solver (second order on a manufactured solution with a
smooth variable coefficient, self-convergent for a two-phase coefficient, the discrete
equations satisfied to round-off against a stencil written out node by node), the random
field (each cosine mode, the covariance of many draws against the cosine series summed
directly, mean zero), and the data (subsampling, seeds, train/test apart, the stored pairs
solve the problem, a damaged cache never used).  Small grids only (s <= 321 for one reference
solve); the full set at s = 421 is described in docs/darcy.md."""

from __future__ import annotations

import json
import re
import warnings

import numpy as np
import pytest
import torch

from opsplit._files import sha256_of
from opsplit.data import DarcyCacheError, load_darcy
from opsplit.data import darcy as darcy_mod
from opsplit.data.darcy import darcy_cache_dir, darcy_pairs, grf_neumann
from opsplit.data.darcy_solver import darcy_matrix, nested_dissection, solve_darcy

PI = np.pi


def _nodes(s):
    x = np.linspace(0.0, 1.0, s)
    return np.meshgrid(x, x, indexing="ij")


# ---------------------------------------------------------------- the solver
def u_star(x, y):
    return np.sin(PI * x) * np.sin(2 * PI * y) * np.exp(x)


def a_star(x, y):
    return 2.0 + np.sin(2 * PI * x) * np.cos(3 * PI * y)


def f_star(x, y):
    """-div(a* grad u*), differentiated by hand."""
    e, sx, cx = np.exp(x), np.sin(PI * x), np.cos(PI * x)
    s2, c2 = np.sin(2 * PI * y), np.cos(2 * PI * y)
    u = sx * s2 * e
    ux, uxx = (PI * cx + sx) * s2 * e, (-PI**2 * sx + 2 * PI * cx + sx) * s2 * e
    uy, uyy = 2 * PI * sx * c2 * e, -4 * PI**2 * u
    a = a_star(x, y)
    ax = 2 * PI * np.cos(2 * PI * x) * np.cos(3 * PI * y)
    ay = -3 * PI * np.sin(2 * PI * x) * np.sin(3 * PI * y)
    return -(ax * ux + a * uxx + ay * uy + a * uyy)


def _order(sizes, errors):
    h = 1.0 / (np.asarray(sizes) - 1.0)
    return np.polyfit(np.log(h), np.log(errors), 1)[0]


@pytest.mark.parametrize("face", ["arithmetic", "harmonic"])
def test_manufactured_solution_second_order(face):
    """u* = sin(pi x) sin(2 pi y) e^x, a* = 2 + sin(2 pi x) cos(3 pi y) (in [1, 3]): the max
    error at the nodes falls 4x per halving of h (measured 1.95, 2.01, 1.99 arithmetic;
    2.05, 1.98, 2.00 harmonic)."""
    sizes, errors = [11, 21, 41, 81], []
    for s in sizes:
        X, Y = _nodes(s)
        u = solve_darcy(a_star(X, Y), f_star(X, Y), face=face)
        errors.append(np.abs(u - u_star(X, Y)).max())
    assert abs(_order(sizes, errors) - 2.0) < 0.2, errors
    assert errors[-1] < 1.5e-3


def _disc(X, Y):
    """A two-phase coefficient (12 in a disc, 3 outside) whose interface is not aligned
    with any grid."""
    return np.where((X - 0.45) ** 2 + (Y - 0.55) ** 2 < 0.3**2, 12.0, 3.0)


@pytest.mark.parametrize("face", ["arithmetic", "harmonic"])
def test_two_phase_self_convergence(face):
    """The RMS error at the nodes of s = 11, 21, 41, 81 against a solve at s = 321 (whose
    nodes include them all), f = 1: a jump in a limits the order; the fitted order is about
    1.8 (arithmetic) and 1.3 (harmonic) here, erratic level to level with the interface's
    position between the nodes, asserted >= 0.9."""
    sf = 321
    fine = solve_darcy(_disc(*_nodes(sf)), face=face)
    sizes, errors = [11, 21, 41, 81], []
    for s in sizes:
        r = (sf - 1) // (s - 1)
        d = solve_darcy(_disc(*_nodes(s)), face=face) - fine[::r, ::r]
        errors.append(np.sqrt((d**2).mean()))
    assert _order(sizes, errors) >= 0.9, errors
    assert errors[-1] < 5e-5 and errors[-1] < errors[0] / 15


def _residual_by_hand(a, u, f, face):
    """The five-point equations at every interior node, written out one node at a time."""
    s = a.shape[0]
    h2 = 1.0 / (s - 1) ** 2
    res = np.zeros((s, s))

    def mean(p, q):
        return (p + q) / 2 if face == "arithmetic" else 2 * p * q / (p + q)

    for i in range(1, s - 1):
        for j in range(1, s - 1):
            flux = 0.0
            for di, dj in ((1, 0), (-1, 0), (0, 1), (0, -1)):
                flux += mean(a[i, j], a[i + di, j + dj]) * (u[i + di, j + dj] - u[i, j])
            res[i, j] = -flux / h2 - f[i, j]
    return res


@pytest.mark.parametrize("face", ["arithmetic", "harmonic"])
def test_solution_satisfies_discrete_equations(face):
    """Random two-phase coefficient and random right-hand side on a 17 x 17 grid (a 15 x 15
    nested dissection with leaves of 8 and a separator): residual <= 1e-11 of the
    right-hand side, the boundary exactly zero; the matrix equals the stencil."""
    rng = np.random.default_rng(5)
    s = 17
    a = np.where(rng.standard_normal((s, s)) > 0, 12.0, 3.0)
    f = rng.standard_normal((s, s))
    u = solve_darcy(a, f, face=face)
    res = _residual_by_hand(a, u, f, face)
    assert np.abs(res).max() < 1e-11 * np.abs(f).max()
    assert (u[0] == 0).all() and (u[-1] == 0).all() and (u[:, 0] == 0).all() and (u[:, -1] == 0).all()
    # the matrix applied to the interior values is the stencil's left-hand side
    A = darcy_matrix(a, face)
    lhs = A @ u[1:-1, 1:-1].ravel()
    np.testing.assert_allclose(lhs, (res + f)[1:-1, 1:-1].ravel(), rtol=1e-12, atol=1e-9)
    assert abs(A - A.T).max() == 0  # symmetric


def test_solver_axes_batch_and_order():
    """Transposing a transposes u (no axis mixed up in the ordering); a batch is solved
    sample by sample; the nested-dissection order is a permutation."""
    rng = np.random.default_rng(1)
    a = np.where(rng.standard_normal((3, 23, 23)) > 0, 12.0, 3.0)
    u = solve_darcy(a)
    np.testing.assert_allclose(solve_darcy(a[1].T), u[1].T, rtol=1e-12, atol=1e-15)
    np.testing.assert_array_equal(solve_darcy(a[2]), u[2])
    for m in (1, 7, 8, 9, 19, 40):
        assert np.array_equal(np.sort(nested_dissection(m)), np.arange(m * m))
    # the single interior node of a 3 x 3 grid: 4 a u / h^2 = f with a constant
    assert solve_darcy(np.full((3, 3), 2.0))[1, 1] == pytest.approx(1 / (4 * 2.0 * 4))


# ---------------------------------------------------------------- the random field
def _mode_std(k1, k2, alpha=2.0, tau=3.0):
    c = lambda k: 1.0 if k == 0 else np.sqrt(2.0)  # noqa: E731
    return c(k1) * c(k2) * tau ** (alpha - 1) * (PI**2 * (k1**2 + k2**2) + tau**2) ** (-alpha / 2)


@pytest.mark.parametrize("s", [5, 12])
def test_field_modes_are_neumann_cosines(s):
    """A unit normal at mode (k1, k2) gives tau^(alpha-1) (pi^2 |k|^2 + tau^2)^(-alpha/2)
    c_k1 c_k2 cos(pi k1 x) cos(pi k2 y) at the nodes, the constant mode nothing; each mode is
    an eigenvector of the 5-point Laplacian with the boundary rows reflected (a zero-Neumann
    ghost node u_{-1} = u_1)."""
    X, Y = _nodes(s)
    h = 1.0 / (s - 1)
    for k1, k2 in [(0, 0), (1, 0), (0, 3), (2, 3), (s - 1, 1), (s - 1, s - 1)]:
        xi = np.zeros((s, s))
        xi[k1, k2] = 1.0
        psi = grf_neumann(xi)
        want = 0.0 if k1 == k2 == 0 else _mode_std(k1, k2) * np.cos(PI * k1 * X) * np.cos(PI * k2 * Y)
        np.testing.assert_allclose(psi, want, rtol=0, atol=1e-14)
        p = np.pad(psi, 1, mode="reflect")  # ghost nodes mirror the first interior ones
        lap = (p[2:, 1:-1] + p[:-2, 1:-1] + p[1:-1, 2:] + p[1:-1, :-2] - 4 * psi) / h**2
        mu = -(2 - 2 * np.cos(PI * k1 * h) + 2 - 2 * np.cos(PI * k2 * h)) / h**2
        np.testing.assert_allclose(lap, mu * psi, rtol=0, atol=1e-9)


def test_field_covariance_and_mean():
    """40,000 draws at s = 7: the empirical covariance of every pair of nodes matches
    sum_k var_k phi_k(x) phi_k(x') (the cosine series summed directly) within 5 standard
    errors; each draw's trapezoidal integral (exact for the modes present) is zero: the
    constant mode is off."""
    s, n = 7, 40_000
    rng = np.random.default_rng(11)
    psi = grf_neumann(rng.standard_normal((n, s, s))).reshape(n, -1)
    X, Y = _nodes(s)
    x, y = X.ravel(), Y.ravel()
    cov = np.zeros((s * s, s * s))
    for k1 in range(s):
        for k2 in range(s):
            if k1 == k2 == 0:
                continue
            phi = np.cos(PI * k1 * x) * np.cos(PI * k2 * y)
            cov += _mode_std(k1, k2) ** 2 * np.outer(phi, phi)
    emp = psi.T @ psi / n  # mean zero by construction: not subtracted
    se = np.sqrt((np.outer(np.diag(cov), np.diag(cov)) + cov**2) / n)
    assert np.abs(emp - cov).max() < 5 * se.max()
    assert np.abs((emp - cov) / se).mean() < 1.2  # ~0.8 for independent normal errors
    w = np.full(s, 1.0)
    w[0] = w[-1] = 0.5
    integral = np.einsum("nij,i,j->n", psi.reshape(n, s, s), w, w)
    assert np.abs(integral).max() < 1e-13
    assert np.abs(psi.mean(0)).max() < 5 * np.sqrt(np.diag(cov).max() / n)


# ---------------------------------------------------------------- the data
SMALL = dict(n_train=4, n_test=3, s=21)


def test_subsampling_commutes_with_storage(tmp_path):
    """At s = 21 the 11- and 6-node data are the 21-node data at every 2nd and 4th node;
    coordinates=True appends x_i = i/(N - 1) (axis 1) and y_j (axis 2)."""
    full, full_test = load_darcy(21, cache_dir=tmp_path, **SMALL)
    assert full.inputs.shape == (4, 21, 21) and full_test.targets.shape == (3, 21, 21)
    assert full.inputs.dtype == torch.float32 and set(full.inputs.unique().tolist()) == {3.0, 12.0}
    for res, r in ((11, 2), (6, 4)):
        tr, te = load_darcy(res, cache_dir=tmp_path, **SMALL)
        assert tr.info["stride"] == r
        torch.testing.assert_close(tr.inputs, full.inputs[:, ::r, ::r], rtol=0, atol=0)
        torch.testing.assert_close(tr.targets, full.targets[:, ::r, ::r], rtol=0, atol=0)
        torch.testing.assert_close(te.targets, full_test.targets[:, ::r, ::r], rtol=0, atol=0)
    tr, _ = load_darcy(11, coordinates=True, dtype=torch.float64, cache_dir=tmp_path, **SMALL)
    assert tr.inputs.shape == (4, 11, 11, 3) and tr.inputs.dtype == torch.float64
    torch.testing.assert_close(tr.inputs[..., 0], full.inputs[:, ::2, ::2].double(), rtol=0, atol=0)
    assert tr.inputs[0, 3, 7, 1].item() == pytest.approx(0.3) and tr.inputs[0, 3, 7, 2].item() == pytest.approx(0.7)


def test_numpy_integers_are_integers(tmp_path):
    """The sizes may be NumPy integers (as from np.arange): the same data as Python ints."""
    tr, te = load_darcy(np.int64(11), n_train=np.int64(4), n_test=np.int32(3), s=np.int64(21), seed=np.int64(0),
                        cache_dir=tmp_path)
    tr2, te2 = load_darcy(11, cache_dir=tmp_path, **SMALL)
    assert torch.equal(tr.inputs, tr2.inputs) and torch.equal(te.targets, te2.targets)


def test_stored_pairs_are_the_documented_draws_and_solutions(tmp_path):
    """Sample i of the train split: a = 12 where the field from default_rng([seed, 0, i]) is
    >= 0 (the field transcribed here from the cosine series, not through grf_neumann), and u
    solves the problem for that a (to float32)."""
    train, test = load_darcy(21, seed=3, cache_dir=tmp_path, **SMALL)
    s = 21
    X, Y = _nodes(s)
    k = np.arange(s)
    for split, data in ((0, train), (1, test)):
        for i in (0, 2):
            xi = np.random.default_rng([3, split, i]).standard_normal((s, s))
            cx, cy = np.cos(PI * np.outer(k, X[:, 0])), np.cos(PI * np.outer(k, Y[0]))
            scale = np.array([[_mode_std(p, q) if p + q else 0.0 for q in k] for p in k])
            psi = cx.T @ (scale * xi) @ cy
            np.testing.assert_array_equal(data.inputs[i].numpy(), np.where(psi >= 0, 12.0, 3.0))
            u = solve_darcy(data.inputs[i].double().numpy())
            np.testing.assert_allclose(data.targets[i].double().numpy(), u, rtol=0, atol=1e-6 * np.abs(u).max())


def test_seeds_splits_and_prefixes(tmp_path, monkeypatch):
    """The same seed gives the same data (generated afresh in another folder); the train and
    test draws differ, as do other seeds; a smaller set is read from a larger cached one."""
    a, b = load_darcy(21, cache_dir=tmp_path / "one", **SMALL)
    a2, b2 = load_darcy(21, cache_dir=tmp_path / "two", **SMALL)
    torch.testing.assert_close(a.targets, a2.targets, rtol=0, atol=0)
    torch.testing.assert_close(b.inputs, b2.inputs, rtol=0, atol=0)
    for i in range(4):
        for j in range(3):
            assert not torch.equal(a.inputs[i], b.inputs[j])
    c, _ = load_darcy(21, seed=1, cache_dir=tmp_path / "one", **SMALL)
    assert not any(torch.equal(c.inputs[i], a.inputs[i]) for i in range(4))
    monkeypatch.setattr(darcy_mod, "_generate", lambda *args: pytest.fail("generated, not read"))
    small, small_test = load_darcy(11, n_train=2, n_test=1, s=21, cache_dir=tmp_path / "one")
    torch.testing.assert_close(small.targets, a.targets[:2, ::2, ::2], rtol=0, atol=0)
    torch.testing.assert_close(small_test.inputs, b.inputs[:1, ::2, ::2], rtol=0, atol=0)
    # a contrast of other values is another data set (the same masks)
    monkeypatch.undo()
    d, _ = load_darcy(21, n_train=2, n_test=1, s=21, a_pos=2.0, a_neg=1.0, cache_dir=tmp_path / "one")
    torch.testing.assert_close(d.inputs == 2.0, a.inputs[:2] == 12.0, rtol=0, atol=0)
    assert not torch.allclose(d.targets, a.targets[:2])


def test_cache_folder_env(monkeypatch, tmp_path):
    monkeypatch.delenv("OPSPLIT_DATA_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert darcy_cache_dir() == tmp_path / "xdg" / "opsplit" / "darcy"
    monkeypatch.setenv("OPSPLIT_DATA_DIR", str(tmp_path / "mine"))
    assert darcy_cache_dir() == tmp_path / "mine" / "darcy"
    assert darcy_cache_dir(tmp_path / "x") == tmp_path / "x"


def _train_files(folder):
    return next(folder.glob("darcy-*-train-*.npz")), next(folder.glob("darcy-*-train-*.json"))


def _truncate(npz, meta):
    raw = npz.read_bytes()
    npz.write_bytes(raw[: len(raw) // 2])


def _flip_bit(npz, meta):
    raw = bytearray(npz.read_bytes())
    raw[len(raw) // 2] ^= 0x10
    npz.write_bytes(bytes(raw))


def _edit_u(npz, meta):  # a plausible edit, written as a valid npz
    with np.load(npz) as z:
        arrays = {k: z[k].copy() for k in z.files}
    arrays["u"][0, 5, 5] += 1e-3
    np.savez(npz, **arrays)


def _bad_json(npz, meta):
    meta.write_text("{not json")


def _edit_settings(npz, meta):
    info = json.loads(meta.read_text())
    info["settings"]["a_pos"] = 11.0
    meta.write_text(json.dumps(info))


def _edit_recorded_checksum(npz, meta):
    info = json.loads(meta.read_text())
    info["sha256"] = "0" * 64
    meta.write_text(json.dumps(info))


def _npz_folder(npz, meta):
    npz.unlink()
    npz.mkdir()


def _json_folder(npz, meta):
    meta.unlink()
    meta.mkdir()


def _npz_missing(npz, meta):
    npz.unlink()


def _json_not_object(npz, meta):
    meta.write_text("[1, 2]")


def _rewrite_with_checksum(npz, meta, arrays):
    """Replace the arrays and record the new file's checksum: only the structural checks
    (keys, shapes, dtypes, finiteness) can catch it."""
    np.savez(npz, **arrays)
    info = json.loads(meta.read_text())
    info["sha256"] = sha256_of(npz)
    meta.write_text(json.dumps(info))


def _foreign_keys(npz, meta):
    with np.load(npz) as z:
        _rewrite_with_checksum(npz, meta, {"a": z["u"], "u": z["u"]})


def _float64_u(npz, meta):
    with np.load(npz) as z:
        _rewrite_with_checksum(npz, meta, {"mask": z["mask"], "u": z["u"].astype(np.float64)})


def _fewer_samples(npz, meta):
    with np.load(npz) as z:
        _rewrite_with_checksum(npz, meta, {"mask": z["mask"][:2], "u": z["u"][:2]})


def _nan_u(npz, meta):
    with np.load(npz) as z:
        u = z["u"].copy()
    u[1, 3, 3] = np.nan
    with np.load(npz) as z:
        _rewrite_with_checksum(npz, meta, {"mask": z["mask"], "u": u})


DAMAGE = {
    "truncated": (_truncate, "checksum mismatch"),
    "bit-flipped": (_flip_bit, "checksum mismatch"),
    "edited-array": (_edit_u, "checksum mismatch"),
    "json-unreadable": (_bad_json, "unreadable metadata"),
    "json-other-settings": (_edit_settings, "settings"),
    "json-other-checksum": (_edit_recorded_checksum, "checksum mismatch"),
    "npz-is-folder": (_npz_folder, r"unreadable \(IsADirectoryError"),
    "json-is-folder": (_json_folder, r"unreadable metadata \(IsADirectoryError"),
    "npz-missing": (_npz_missing, r"unreadable \(FileNotFoundError"),
    "json-not-an-object": (_json_not_object, "settings"),
    "foreign-keys-rechecksummed": (_foreign_keys, r"unreadable \(ValueError: holds \['a', 'u'\]"),
    "float64-rechecksummed": (_float64_u, r"u has shape \(4, 21, 21\) and dtype float64, expected \(4, 21, 21\) float32"),
    "fewer-samples-rechecksummed": (_fewer_samples, r"mask has shape \(2, 56\)"),
    "nan-rechecksummed": (_nan_u, "u holds NaN/inf"),
}


@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_damaged_cache_refused_or_regenerated(tmp_path, damage):
    """Every kind of damage: on_corrupt="error" raises DarcyCacheError naming the file and what
    is wrong; the default warns, regenerates and returns the original data (rewriting the
    file where it can, else using the data uncached), never the damaged one."""
    edit, message = DAMAGE[damage]
    kw = dict(cache_dir=tmp_path, **SMALL)
    train, _ = load_darcy(11, **kw)
    npz, meta = _train_files(tmp_path)
    edit(npz, meta)
    with pytest.raises(DarcyCacheError, match=f"Darcy cache .*darcy-v1-train.*{message}.*regenerate=True"):
        load_darcy(11, on_corrupt="error", **kw)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        again, test = load_darcy(11, **kw)
    assert any(re.search(f"{message}.*regenerating it", str(w.message)) for w in record), record
    assert all(w.filename == __file__ for w in record)  # pointed at the caller
    torch.testing.assert_close(again.inputs, train.inputs, rtol=0, atol=0)
    torch.testing.assert_close(again.targets, train.targets, rtol=0, atol=0)
    folder_in_place = damage.endswith("is-folder")
    assert any("could not write the cache" in str(w.message) for w in record) == folder_in_place
    if folder_in_place:
        assert again.info["cache"] is None
    else:  # rewritten whole: the next load reads it without a warning
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            third, _ = load_darcy(11, on_corrupt="error", **kw)
        torch.testing.assert_close(third.targets, train.targets, rtol=0, atol=0)
    assert not list(tmp_path.glob(".*tmp*"))  # no temporary file left behind


def test_damaged_larger_set_is_not_used_for_a_prefix(tmp_path, monkeypatch):
    """A larger cached set that fails its checks is skipped when a prefix is looked for."""
    load_darcy(21, cache_dir=tmp_path, **SMALL)
    _flip_bit(*_train_files(tmp_path))
    calls = []
    real = darcy_mod._generate
    monkeypatch.setattr(darcy_mod, "_generate",
                        lambda st, folder, start=0: calls.append((st["n"], start)) or real(st, folder, start))
    small, _ = load_darcy(21, n_train=2, n_test=1, s=21, cache_dir=tmp_path)
    assert calls == [(2, 0)]  # the train prefix generated afresh; the test prefix read
    mask, u = darcy_pairs(2, s=21)
    np.testing.assert_allclose(small.targets.numpy(), u, rtol=0, atol=1e-6)


def test_larger_set_extends_a_cached_smaller_one(tmp_path, monkeypatch):
    """A larger set reads the largest cached smaller one and generates only the samples after
    it; the result equals a set generated whole; a smaller set is read from the smallest
    larger one."""
    calls = []
    real = darcy_mod._generate
    monkeypatch.setattr(darcy_mod, "_generate",
                        lambda st, folder, start=0: calls.append((st["split"], st["n"], start)) or real(st, folder, start))
    kw = dict(s=21, cache_dir=tmp_path / "grown")
    load_darcy(21, n_train=2, n_test=1, **kw)
    load_darcy(21, n_train=3, n_test=2, **kw)
    grown, grown_test = load_darcy(21, n_train=5, n_test=2, **kw)
    assert calls == [("train", 2, 0), ("test", 1, 0), ("train", 3, 2), ("test", 2, 1), ("train", 5, 3)]
    whole, whole_test = load_darcy(21, n_train=5, n_test=2, s=21, cache_dir=tmp_path / "whole")
    torch.testing.assert_close(grown.inputs, whole.inputs, rtol=0, atol=0)
    torch.testing.assert_close(grown.targets, whole.targets, rtol=0, atol=0)
    torch.testing.assert_close(grown_test.targets, whole_test.targets, rtol=0, atol=0)
    calls.clear()
    one, _ = load_darcy(21, n_train=1, n_test=1, **kw)
    assert calls == [] and "-train-seed0-n2-" in one.info["cache"]


def test_close_contrasts_get_their_own_files(tmp_path):
    """Contrasts that differ in the ninth digit are two data sets in two files: neither
    overwrites the other (no warning, no regeneration on the second load)."""
    kw = dict(n_train=1, n_test=1, s=9, cache_dir=tmp_path)
    load_darcy(9, a_pos=12.0, **kw)
    load_darcy(9, a_pos=12.000000001, **kw)
    assert len(list(tmp_path.glob("darcy-*-train-*.npz"))) == 2
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        load_darcy(9, a_pos=12.0, on_corrupt="error", **kw)
        load_darcy(9, a_pos=12.000000001, on_corrupt="error", **kw)


def test_concurrent_loads_generate_once_and_agree(tmp_path, monkeypatch):
    """Two threads ask for the same uncached set while the first is generating it: the
    second waits on the data family's lock and reads what the first wrote, so the set is
    generated once per split (without the lock the second generates its own copy beside
    the first's writes), and both get the same data."""
    import threading

    real = darcy_mod._generate
    calls, inside, release = [], threading.Event(), threading.Event()

    def generate(st, folder, start=0):
        calls.append((threading.current_thread().name, st["split"]))
        if threading.current_thread().name == "first":
            inside.set()
            release.wait(30)
        return real(st, folder, start)

    monkeypatch.setattr(darcy_mod, "_generate", generate)
    out, errors = {}, []

    def load(name):
        try:
            out[name] = load_darcy(9, n_train=2, n_test=1, s=9, cache_dir=tmp_path)
        except Exception as e:  # pragma: no cover - reported below
            errors.append(e)

    first = threading.Thread(target=load, args=("first",), name="first")
    first.start()
    assert inside.wait(30)
    second = threading.Thread(target=load, args=("second",), name="second")
    second.start()
    second.join(0.5)  # with the lock the second thread waits here for the first's files
    release.set()
    first.join(60)
    second.join(60)
    assert errors == [] and set(out) == {"first", "second"}
    # each split generated once (the test split by whichever thread takes its lock first)
    assert calls[0] == ("first", "train") and sorted(split for _, split in calls) == ["test", "train"], calls
    for k in (0, 1):
        torch.testing.assert_close(out["second"][k].inputs, out["first"][k].inputs, rtol=0, atol=0)
        torch.testing.assert_close(out["second"][k].targets, out["first"][k].targets, rtol=0, atol=0)
    assert len(list(tmp_path.glob("darcy-*.npz"))) == 2  # one file per split
