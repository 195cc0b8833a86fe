"""Bad input to the Darcy data and its solver: grids that are not square or too small, a
resolution the data cannot be subsampled to, contrast values <= 0 or not finite, counts that
are not positive integers, requests too large for the memory or the disk (refused before any
compute or write), a cache folder that is a file or lies below one (refused before any
compute), and a damaged cache file with on_corrupt="error"."""

import tempfile
from pathlib import Path
from unittest import mock

import numpy as np
import pytest
import torch

from opsplit.data import load_darcy
from opsplit.data.darcy import DarcyCacheError, darcy_pairs, grf_neumann, grf_scales
from opsplit.data.darcy_solver import darcy_matrix, solve_darcy

from ._table import cases, run_case

NAN, INF = float("nan"), float("inf")


def _ones(*shape):
    return np.ones(shape)


def _with(value, s=5):
    a = np.ones((s, s))
    a[2, 3] = value
    return a


def _load(**kw):
    """load_darcy on a tiny grid in a fresh folder (where a row reaches generation)."""
    base = dict(n_train=2, n_test=1, s=9, cache_dir=Path(tempfile.mkdtemp(prefix="opsplit-darcy-")))
    return load_darcy(**{"resolution": 9, **base, **kw})


def _never_computed(**kw):
    """load_darcy with generation replaced by a failure: a row passes only if it is refused
    before any compute or write."""
    with mock.patch("opsplit.data.darcy._generate", side_effect=AssertionError("generated")), \
            mock.patch("opsplit.data._cache.write_arrays", side_effect=AssertionError("written")):
        return _load(**kw)


def _low_memory(**kw):
    with mock.patch("opsplit.data.darcy.available_memory", return_value=50e6):
        return _never_computed(**kw)


def _full_disk(**kw):
    with mock.patch("opsplit.data.darcy.free_disk", return_value=1000.0), \
            mock.patch("opsplit.data.darcy._sample", side_effect=AssertionError("computed")):
        return _load(**kw)


def _file(below: bool = False):
    """A path that is a file (or a folder path below one): load_darcy with it as cache_dir."""
    f = Path(tempfile.mkdtemp(prefix="opsplit-darcy-")) / "f"
    f.write_text("x")
    return f / "darcy" if below else f


def _env_file(**kw):
    with mock.patch.dict("os.environ", {"OPSPLIT_DATA_DIR": str(_file())}):
        return _never_computed(cache_dir=None, **kw)


def _damaged():
    d = Path(tempfile.mkdtemp(prefix="opsplit-darcy-"))
    kw = dict(n_train=2, n_test=1, s=9, cache_dir=d)
    load_darcy(9, **kw)
    npz = next(d.glob("darcy-*-test-*.npz"))
    npz.write_bytes(npz.read_bytes()[:-50])
    return load_darcy(9, on_corrupt="error", **kw)


CASES = cases(
    # the solver: grids
    ("solve-non-square", lambda: solve_darcy(_ones(5, 6)), ValueError, r"^solve_darcy\.a: expected a square grid"),
    ("solve-non-square-batch", lambda: solve_darcy(_ones(2, 5, 4)), ValueError, r"^solve_darcy\.a: expected a square"),
    ("solve-1d", lambda: solve_darcy(_ones(5)), ValueError, r"^solve_darcy\.a: expected a square grid.*got \(5,\)"),
    ("solve-4d", lambda: solve_darcy(_ones(1, 1, 5, 5)), ValueError, r"^solve_darcy\.a: expected a square grid"),
    ("solve-2x2", lambda: solve_darcy(_ones(2, 2)), ValueError, r"^solve_darcy\.a: expected at least 3 x 3 nodes"),
    ("solve-empty", lambda: solve_darcy(_ones(0, 0)), ValueError, r"^solve_darcy\.a: expected at least 3 x 3"),
    ("solve-list", lambda: solve_darcy([[1.0] * 3] * 3), TypeError, r"^solve_darcy\.a: expected a numpy array"),
    ("solve-tensor", lambda: solve_darcy(torch.ones(3, 3)), TypeError, r"^solve_darcy\.a: expected a numpy array"),
    ("solve-bool", lambda: solve_darcy(np.ones((3, 3), bool)), TypeError, r"^solve_darcy\.a: expected a real"),
    ("solve-complex", lambda: solve_darcy(np.ones((3, 3), complex)), TypeError, r"^solve_darcy\.a: expected a real"),
    # the solver: values
    ("solve-nan", lambda: solve_darcy(_with(NAN)), ValueError, r"^solve_darcy\.a: expected finite values"),
    ("solve-inf", lambda: solve_darcy(_with(INF)), ValueError, r"^solve_darcy\.a: expected finite values"),
    ("solve-zero-coefficient", lambda: solve_darcy(_with(0.0)), ValueError, r"^solve_darcy\.a: expected a coefficient > 0"),
    ("solve-negative-coefficient", lambda: solve_darcy(_with(-3.0)), ValueError, r"^solve_darcy\.a: .*found min -3"),
    ("solve-f-shape", lambda: solve_darcy(_ones(5, 5), _ones(4, 4)), ValueError, r"^solve_darcy\.f: expected a number or an array of shape \(5, 5\)"),
    ("solve-f-nan", lambda: solve_darcy(_ones(5, 5), NAN), ValueError, r"^solve_darcy\.f: expected finite values"),
    ("solve-f-field-inf", lambda: solve_darcy(_ones(5, 5), _with(INF)), ValueError, r"^solve_darcy\.f: expected finite"),
    ("solve-f-string", lambda: solve_darcy(_ones(5, 5), "1"), TypeError, r"^solve_darcy\.f: expected a number"),
    ("solve-f-bool", lambda: solve_darcy(_ones(5, 5), True), TypeError, r"^solve_darcy\.f: expected a number"),
    ("solve-face", lambda: solve_darcy(_ones(5, 5), face="geometric"), ValueError, r"^solve_darcy\.face: expected one of \('arithmetic', 'harmonic'\)"),
    ("matrix-batch", lambda: darcy_matrix(_ones(2, 5, 5)), ValueError, r"^darcy_matrix\.a: expected one coefficient"),
    ("matrix-face", lambda: darcy_matrix(_ones(5, 5), face=None), ValueError, r"^darcy_matrix\.face"),
    # the random field
    ("grf-non-square", lambda: grf_neumann(np.zeros((4, 5))), ValueError, r"^grf_neumann\.xi: expected a square grid"),
    ("grf-1x1", lambda: grf_neumann(np.zeros((1, 1))), ValueError, r"^grf_neumann\.xi: expected a square grid of at least 2"),
    ("grf-list", lambda: grf_neumann([[0.0, 1.0], [1.0, 0.0]]), TypeError, r"^grf_neumann\.xi: expected a real numpy array"),
    ("grf-alpha-zero", lambda: grf_neumann(np.zeros((4, 4)), alpha=0), ValueError, r"^grf_neumann\.alpha: expected a finite number > 0"),
    ("grf-nan", lambda: grf_neumann(_with(NAN)), ValueError, r"^grf_neumann\.xi: expected finite values"),
    ("grf-bool", lambda: grf_neumann(np.ones((4, 4), bool)), TypeError, r"^grf_neumann\.xi: expected a real numpy array"),
    ("grf-scales-s-zero", lambda: grf_scales(0), ValueError, r"^grf_scales\.s: expected an integer >= 1"),
    ("grf-scales-alpha-negative", lambda: grf_scales(4, alpha=-2.0), ValueError, r"^grf_scales\.alpha: expected a finite number > 0"),
    ("grf-tau-nan", lambda: grf_neumann(np.zeros((4, 4)), tau=NAN), ValueError, r"^grf_neumann\.tau: expected a finite number > 0"),
    ("pairs-split", lambda: darcy_pairs(1, split="val", s=5), ValueError, r"^darcy_pairs\.split: expected 'train' or 'test'"),
    ("pairs-negative-n", lambda: darcy_pairs(-1, s=5), ValueError, r"^darcy_pairs\.n: expected an integer >= 0"),
    ("pairs-s-2", lambda: darcy_pairs(1, s=2), ValueError, r"^darcy_pairs\.s: expected an integer >= 3"),
    ("pairs-contrast-zero", lambda: darcy_pairs(1, s=5, a_neg=0.0), ValueError, r"^darcy_pairs\.a_neg: expected a finite number > 0"),
    ("pairs-face", lambda: darcy_pairs(1, s=5, face="upwind"), ValueError, r"^darcy_pairs\.face: expected one of"),
    # the loader: grids and resolutions
    ("load-s-2", lambda: _never_computed(s=2, resolution=2), ValueError, r"^load_darcy\.s: expected an integer >= 3, got 2"),
    ("load-s-float", lambda: _never_computed(s=9.0), TypeError, r"^load_darcy\.s: expected an integer"),
    ("load-s-bool", lambda: _never_computed(s=True), TypeError, r"^load_darcy\.s: expected an integer"),
    ("load-resolution-not-dividing", lambda: _never_computed(s=21, resolution=8), ValueError,
     r"^load_darcy\.resolution: expected resolution - 1 to divide s - 1 = 20 .*e\.g\. \[21, 11, 6, 5, 3\]; got 8"),
    ("load-resolution-fno-86", lambda: _never_computed(s=421, resolution=86), ValueError,
     r"^load_darcy\.resolution: .*s - 1 = 420 .*\[421, 211, 141, 106, 85,"),
    ("load-resolution-above-s", lambda: _never_computed(s=9, resolution=17), ValueError, r"^load_darcy\.resolution: expected resolution - 1 to divide"),
    ("load-resolution-2", lambda: _never_computed(resolution=2), ValueError, r"^load_darcy\.resolution: expected an integer >= 3"),
    ("load-resolution-float", lambda: _never_computed(resolution=9.0), TypeError, r"^load_darcy\.resolution: expected an integer"),
    # the loader: contrast values
    ("load-a-pos-zero", lambda: _never_computed(a_pos=0.0), ValueError, r"^load_darcy\.a_pos: expected a finite number > 0, got 0\.0"),
    ("load-a-neg-negative", lambda: _never_computed(a_neg=-3.0), ValueError, r"^load_darcy\.a_neg: expected a finite number > 0"),
    ("load-a-pos-nan", lambda: _never_computed(a_pos=NAN), ValueError, r"^load_darcy\.a_pos: expected a finite number > 0, got nan"),
    ("load-a-neg-inf", lambda: _never_computed(a_neg=INF), ValueError, r"^load_darcy\.a_neg: expected a finite number > 0"),
    ("load-a-pos-string", lambda: _never_computed(a_pos="12"), TypeError, r"^load_darcy\.a_pos: expected a real number"),
    ("load-a-neg-bool", lambda: _never_computed(a_neg=True), TypeError, r"^load_darcy\.a_neg: expected a real number"),
    # the loader: counts and seeds
    ("load-n-train-zero", lambda: _never_computed(n_train=0), ValueError, r"^load_darcy\.n_train: expected an integer >= 1, got 0"),
    ("load-n-train-negative", lambda: _never_computed(n_train=-5), ValueError, r"^load_darcy\.n_train: expected an integer >= 1"),
    ("load-n-test-zero", lambda: _never_computed(n_test=0), ValueError, r"^load_darcy\.n_test: expected an integer >= 1"),
    ("load-n-train-float", lambda: _never_computed(n_train=2.0), TypeError, r"^load_darcy\.n_train: expected an integer"),
    ("load-n-test-fraction", lambda: _never_computed(n_test=1.5), TypeError, r"^load_darcy\.n_test: expected an integer"),
    ("load-n-train-bool", lambda: _never_computed(n_train=True), TypeError, r"^load_darcy\.n_train: expected an integer"),
    ("load-n-test-string", lambda: _never_computed(n_test="3"), TypeError, r"^load_darcy\.n_test: expected an integer"),
    ("load-seed-negative", lambda: _never_computed(seed=-1), ValueError, r"^load_darcy\.seed: expected an integer >= 0"),
    # the loader: other arguments
    ("load-face", lambda: _never_computed(face="upwind"), ValueError, r"^load_darcy\.face: expected one of"),
    ("load-coordinates-int", lambda: _never_computed(coordinates=1), TypeError, r"^load_darcy\.coordinates: expected true or false"),
    ("load-dtype-int", lambda: _never_computed(dtype=torch.int64), TypeError, r"^load_darcy\.dtype: expected a floating-point torch\.dtype"),
    ("load-cache-dir-int", lambda: _never_computed(cache_dir=3), TypeError, r"^load_darcy\.cache_dir: expected a path or None"),
    ("load-cache-dir-is-a-file", lambda: _never_computed(cache_dir=_file()), ValueError,
     r"^load_darcy\.cache_dir: expected a folder, but the cache folder .* is a file"),
    ("load-cache-dir-below-a-file", lambda: _never_computed(cache_dir=_file(below=True)), ValueError,
     r"^load_darcy\.cache_dir: expected a folder, but a folder above the cache folder .* is a file"),
    ("load-data-dir-env-is-a-file", _env_file, ValueError,
     r"^load_darcy\.cache_dir: expected a folder \(from \$OPSPLIT_DATA_DIR\), but a folder above"),
    ("load-regenerate-string", lambda: _never_computed(regenerate="yes"), TypeError, r"^load_darcy\.regenerate: expected true or false"),
    ("load-on-corrupt", lambda: _never_computed(on_corrupt="ignore"), ValueError, r"^load_darcy\.on_corrupt: expected 'regenerate' or 'error'"),
    # absurd sizes, refused before compute or write
    ("load-absurd-n-train", lambda: _never_computed(n_train=10**12), ValueError, r"^load_darcy\.n_train: expected at most 10,000,000 samples"),
    ("load-absurd-n-test", lambda: _never_computed(n_test=10**9), ValueError, r"^load_darcy\.n_test: expected at most"),
    ("load-absurd-s", lambda: _never_computed(s=10**6 + 1, resolution=3), ValueError, r"^load_darcy\.s: one solve at s = 1000001 needs about .* of memory"),
    ("load-memory-n-train", lambda: _low_memory(n_train=10**6, s=101, resolution=101), ValueError,
     r"^load_darcy\.n_train: n_train \+ n_test = 1,000,001 samples at s = 101 .*need about .* of memory; 50 MB is available"),
    ("load-memory-n-test", lambda: _low_memory(n_test=10**6, s=101, resolution=101), ValueError, r"^load_darcy\.n_test: n_train \+ n_test"),
    ("load-memory-s", lambda: _low_memory(s=2001, resolution=3), ValueError, r"^load_darcy\.s: one solve at s = 2001"),
    ("load-disk-n-train", lambda: _full_disk(), ValueError, r"^load_darcy\.n_train: 2 samples at s = 9 take .* on disk; the cache folder .* has 1 kB free"),
    # a damaged cache
    ("load-damaged-cache", _damaged, DarcyCacheError, r"^Darcy cache .*darcy-v1-test-.*checksum mismatch.*regenerate=True"),
)


@pytest.mark.parametrize("case", CASES)
def test_darcy_bad_input(case):
    run_case(case)
