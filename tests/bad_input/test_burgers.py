"""Bad input to the neural-operator pieces and the Burgers data: a grid the model cannot take
(too few nodes for its Fourier modes, a non-periodic rule), NaN/inf fields, a non-periodic
field where periodicity is assumed, wrong shapes and types, a truncated or edited cache
file, a resolution the data cannot be subsampled to.  Issue 42: the data's generator and
solver (a viscosity outside the range the solver takes, NaN initial conditions, counts and
sizes below 1, sizes beyond the machine's memory or an hour), cache files that are missing,
folders or not JSON objects, a cache folder that is a file, and ``opsplit train`` with
``task = "burgers"`` (exit status 2, one line naming the key, nothing written)."""

import json
import tempfile
from pathlib import Path

import numpy as np
import pytest
import torch

from opsplit import Grid
from opsplit.data import load_burgers
from opsplit.data.burgers import BurgersCacheError, burgers_pairs, grf_initial_conditions
from opsplit.data.burgers_solver import solve_burgers
from opsplit.grid import Interval
from opsplit.models import IntegralPatchEmbedding, NeuralOperatorTransformer, PatchEmbedding
from opsplit.models.integral_patch import PixelQuadrature
from opsplit.operators import FourierMultiplier, GalerkinAttention, Lifting, SpectralConvolution

from ._table import cases, run_case
from .test_cli import CFG, OUT, Row, _check, _setup, _tree, rows


def _model():
    return NeuralOperatorTransformer("galerkin", "lie", d_model=4, heads=2, n_steps=1, modes=4, d_ff=4, hidden=4,
                                     generator=torch.Generator().manual_seed(0))


def _field(n=16, B=2):
    x = torch.arange(n) / n
    return torch.stack([torch.sin(2 * torch.pi * x), torch.cos(4 * torch.pi * x)])[:B]


def _with(value, n=16, where=(0, 3)):
    u = _field(n)
    u[where] = value
    return u


def _conv(n, rule="left"):
    op = SpectralConvolution.create(3, 5)
    return op(torch.randn(1, n, 3), grid=Grid(x=Interval(n=n, length=1.0, rule=rule), y=Interval.paper(3)))


def _cache(edit):
    """A tiny cached data set, edited by ``edit(npz_path, json_path)``, then loaded with
    ``on_corrupt="error"``."""
    d = Path(tempfile.mkdtemp(prefix="opsplit-burgers-"))
    kw = dict(n_train=2, n_test=1, points=64, n_steps=40, cache_dir=d)
    load_burgers(16, **kw)
    edit(next(d.glob("*.npz")), next(d.glob("*.json")))
    return load_burgers(16, on_corrupt="error", **kw)


def _truncate(npz, meta):
    raw = npz.read_bytes()
    npz.write_bytes(raw[: len(raw) - 100])


def _flip_byte(npz, meta):
    raw = bytearray(npz.read_bytes())
    raw[len(raw) // 2] ^= 1
    npz.write_bytes(bytes(raw))


def _drop_meta(npz, meta):
    meta.write_text("{not json")


def _npz_deleted(npz, meta):
    npz.unlink()


def _npz_folder(npz, meta):
    npz.unlink()
    npz.mkdir()


def _meta_text(text):
    def edit(npz, meta):
        meta.write_text(text)

    return edit


def _tmp():
    return Path(tempfile.mkdtemp(prefix="opsplit-burgers-"))


def _file_as_cache_dir():
    f = _tmp() / "cache"
    f.write_text("not a folder")
    return load_burgers(16, n_train=2, n_test=1, points=64, n_steps=40, cache_dir=f)


def _u0(value=None, n=32):
    u = np.sin(2 * np.pi * np.arange(n) / n)[None].repeat(2, 0)
    if value is not None:
        u[1, 3] = value
    return u


def _solve(u0=None, **kw):
    return solve_burgers(_u0() if u0 is None else u0, **kw)


def _pairs(n=2, **kw):
    return burgers_pairs(n, **{"points": 64, "n_steps": 100, **kw})


def _load(**kw):
    return load_burgers(**{"resolution": 16, "n_train": 2, "n_test": 1, "points": 64, "n_steps": 100,
                           "cache_dir": _tmp() / "c", **kw})


CASES = cases(
    ("model-too-few-nodes", lambda: _model()(_field(6)), ValueError, r"N_x = 6 nodes; this model needs N_x >= 7"),
    ("model-nan-field", lambda: _model()(_with(float("nan"))), ValueError, r"u: expected finite values, found 1 NaN"),
    ("model-inf-field", lambda: _model()(_with(float("inf"))), ValueError, r"u: expected finite values"),
    ("model-non-periodic-field", lambda: _model()(torch.linspace(0, 1, 16).expand(2, 16) + 0.0), ValueError,
     r"expected a periodic field .* jumps by .* across the seam"),
    ("model-both-ends-sampled",
     lambda: _model()(torch.sin(2 * torch.pi * torch.linspace(0, 1, 16)).expand(2, 16) + 0.0), ValueError,
     r"first and last samples are equal .* drop the last node"),
    ("model-rank-4", lambda: _model()(torch.zeros(1, 2, 16, 1)), ValueError, r"u: expected a field of shape \(B, N_x\)"),
    ("model-two-channels", lambda: _model()(torch.zeros(2, 16, 2)), ValueError, r"expected 1 channel"),
    ("model-int-field", lambda: _model()(torch.zeros(2, 16, dtype=torch.long)), TypeError, r"floating-point"),
    ("model-float64-field", lambda: _model()(_field().double()), TypeError, r"expected a torch.float32 tensor"),
    ("model-attention-name", lambda: NeuralOperatorTransformer("linear"), ValueError,
     r"attention: expected one of \('galerkin', 'fourier', 'softmax', 'none'\)"),
    ("model-heads-divide", lambda: NeuralOperatorTransformer(d_model=6, heads=4), ValueError,
     r"d_model = 6 is not divisible by heads = 4"),
    ("spectral-too-few-nodes", lambda: _conv(8), ValueError, r"N_x = 8 nodes; the operator needs N_x >= 9"),
    ("spectral-trapezoid-grid", lambda: _conv(16, "trapezoid"), ValueError, r"trapezoid rule .* not periodic"),
    ("spectral-weight-shape", lambda: SpectralConvolution(torch.zeros(3, 4, 2, 2)), ValueError,
     r"weight: expected shape \(2, M \+ 1, N_y, N_y\)"),
    ("spectral-channels", lambda: SpectralConvolution.create(3, 2)(torch.zeros(1, 8, 4)), ValueError,
     r"kernel acts on N_y = 3 features, the grid has N_y = 4"),
    ("galerkin-norm-shape", lambda: GalerkinAttention(torch.zeros(4, 2, 2), torch.zeros(4, 2, 2), torch.zeros(4, 2, 2),
                                                      torch.zeros(2, 2, 4), norm_weights=(torch.ones(2, 3), None)),
     ValueError, r"gamma_k: expected shape \(H, d\) = \(2, 2\)"),
    ("galerkin-norm-not-pair", lambda: GalerkinAttention(torch.zeros(4, 2, 2), torch.zeros(4, 2, 2),
                                                         torch.zeros(4, 2, 2), torch.zeros(2, 2, 4),
                                                         norm_weights=torch.ones(2, 2)),
     TypeError, r"norm_weights: expected a pair"),
    ("galerkin-eps", lambda: GalerkinAttention.create(4, 2, eps=0.0), ValueError, r"eps: expected a finite number > 0"),
    ("model-output-modes-nodes",
     lambda: NeuralOperatorTransformer("none", "lie", d_model=4, heads=1, modes=4, output_modes=6)(_field(10)),
     ValueError, r"N_x = 10 nodes; this model needs N_x >= 11"),
    ("model-output-modes-zero", lambda: NeuralOperatorTransformer(output_modes=0), ValueError, r"output_modes"),
    ("multiplier-too-few-nodes", lambda: FourierMultiplier(8)(torch.zeros(1, 14)), ValueError,
     r"N_x = 14 nodes; the multiplier keeps the modes \|m\| <= 7 and needs N_x >= 15"),
    ("multiplier-nan-field", lambda: FourierMultiplier(4)(_with(float("nan"))), ValueError,
     r"FourierMultiplier input: expected finite values, found 1 NaN"),
    ("multiplier-channels", lambda: FourierMultiplier(4, 2)(torch.zeros(1, 16, 3)), ValueError,
     r"expected shape \(B, N_x, 2\)"),
    ("multiplier-int-field", lambda: FourierMultiplier(4)(torch.zeros(1, 16, dtype=torch.long)), TypeError,
     r"floating-point"),
    ("multiplier-modes", lambda: FourierMultiplier(0), ValueError, r"FourierMultiplier.modes"),
    ("lifting-trapezoid", lambda: Lifting(1, 4, rule="trapezoid"), ValueError, r"periodic grid"),
    ("data-resolution-divides", lambda: load_burgers(300, n_train=1, n_test=1, points=64), ValueError,
     r"resolution: expected a divisor of points = 64 .* got 300"),
    ("data-points-odd", lambda: load_burgers(9, points=63), ValueError, r"points: expected an even number"),
    ("data-on-corrupt", lambda: load_burgers(16, points=32, on_corrupt="ignore"), ValueError,
     r"on_corrupt: expected 'regenerate' or 'error'"),
    ("data-cache-truncated", lambda: _cache(_truncate), BurgersCacheError, r"checksum mismatch .* truncated or edited"),
    ("data-cache-edited", lambda: _cache(_flip_byte), BurgersCacheError, r"checksum mismatch"),
    ("data-cache-metadata", lambda: _cache(_drop_meta), BurgersCacheError, r"unreadable metadata"),
    # -- issue 42: the generator's and the solver's arguments (finding 7) --------------------------
    ("solve-nu-negative", lambda: _solve(nu=-0.1), ValueError, r"^solve_burgers\.nu: expected a finite number > 0"),
    ("solve-nu-nan", lambda: _solve(nu=float("nan")), ValueError, r"^solve_burgers\.nu: expected a finite number > 0"),
    ("solve-nu-inf", lambda: _solve(nu=float("inf")), ValueError, r"^solve_burgers\.nu: expected a finite number"),
    ("solve-nu-tiny", lambda: _solve(nu=1e-6), ValueError,
     r"^solve_burgers\.nu: expected a viscosity in \[\S+, \S+\] .* got 1e-06: below \S+ the 15 modes do not resolve"),
    ("solve-nu-unstable", lambda: _solve(u0=_u0(n=256), nu=0.01, n_steps=2), ValueError,
     r"^solve_burgers\.nu: .* the ETDRK4 step dt = 0\.5 is unstable .* more steps lower this bound"),
    ("solve-nu-overflow", lambda: _solve(nu=1e300), ValueError, r"^solve_burgers\.nu: .* above \S+ the ETDRK4 coefficients "
     r"overflow float64"),
    ("solve-nu-string", lambda: _solve(nu="0.1"), TypeError, r"^solve_burgers\.nu: expected a real number"),
    ("solve-u0-nan", lambda: _solve(u0=_u0(float("nan"))), ValueError,
     r"^solve_burgers\.u0: expected finite values, found 1 NaN and 0 inf"),
    ("solve-u0-inf", lambda: _solve(u0=_u0(float("inf"))), ValueError, r"^solve_burgers\.u0: expected finite values, found 0 NaN "
     r"and 1 inf"),
    ("solve-u0-complex", lambda: _solve(u0=_u0() + 0j), TypeError, r"^solve_burgers\.u0: expected real numbers"),
    ("solve-u0-rank-3", lambda: _solve(u0=np.zeros((1, 2, 32))), ValueError, r"^solve_burgers\.u0: expected shape \(B, N\)"),
    ("solve-u0-two-nodes", lambda: _solve(u0=np.zeros((1, 2))), ValueError, r"^solve_burgers\.u0: expected at least one "
     r"field of at least 3 nodes"),
    ("solve-u0-no-fields", lambda: _solve(u0=np.zeros((0, 32))), ValueError, r"^solve_burgers\.u0: expected at least one"),
    ("solve-u0-ragged", lambda: _solve(u0=[[0.0, 1.0], [1.0]]), TypeError, r"^solve_burgers\.u0: expected an array of real"),
    ("solve-n-steps-zero", lambda: _solve(n_steps=0), ValueError, r"^solve_burgers\.n_steps: expected an integer >= 1, got 0"),
    ("solve-n-steps-float", lambda: _solve(n_steps=10.0), TypeError, r"^solve_burgers\.n_steps: expected an integer"),
    ("solve-t-final-zero", lambda: _solve(t_final=0.0), ValueError, r"^solve_burgers\.t_final: expected a finite number > 0"),
    ("solve-out-points-zero", lambda: _solve(out_points=0), ValueError, r"^solve_burgers\.out_points: expected an integer >= 1"),
    ("solve-grid-factor-zero", lambda: _solve(grid_factor=0), ValueError, r"^solve_burgers\.grid_factor: expected an integer"),
    ("solve-tol-negative", lambda: _solve(tol=-1.0), ValueError, r"^solve_burgers\.tol: expected a finite number >= 0"),
    ("solve-save-times-divisor", lambda: _solve(n_steps=10, save_times=3), ValueError,
     r"^solve_burgers\.save_times: expected a divisor of n_steps = 10, got 3"),
    ("solve-force-string", lambda: _solve(force="yes"), TypeError, r"^solve_burgers\.force: expected True or False"),
    ("pairs-nu-negative", lambda: _pairs(nu=-0.1), ValueError, r"^burgers_pairs\.nu: expected a finite number > 0"),
    ("pairs-nu-nan", lambda: _pairs(nu=float("nan")), ValueError, r"^burgers_pairs\.nu: expected a finite number > 0"),
    ("pairs-nu-tiny", lambda: _pairs(nu=1e-6), ValueError, r"^burgers_pairs\.nu: expected a viscosity in .* at points = 64 "
     r"\(31 modes\) and n_steps = 100"),
    ("pairs-n-steps-zero", lambda: _pairs(n_steps=0), ValueError, r"^burgers_pairs\.n_steps: expected an integer >= 1, got 0"),
    ("pairs-points-zero", lambda: _pairs(points=0), ValueError, r"^burgers_pairs\.points: expected an integer >= 8, got 0"),
    ("pairs-n-negative", lambda: _pairs(n=-1), ValueError, r"^burgers_pairs\.n: expected an integer >= 1, got -1"),
    ("pairs-n-float", lambda: _pairs(n=2.0), TypeError, r"^burgers_pairs\.n: expected an integer >= 1, got 2\.0"),
    ("pairs-batch-zero", lambda: _pairs(batch=0), ValueError, r"^burgers_pairs\.batch: expected an integer >= 1"),
    ("pairs-start-negative", lambda: _pairs(start=-1), ValueError, r"^burgers_pairs\.start: expected an integer >= 0"),
    ("pairs-seed-negative", lambda: _pairs(seed=-1), ValueError, r"^burgers_pairs\.seed: expected an integer >= 0"),
    ("pairs-split", lambda: _pairs(split="val"), ValueError, r"^burgers_pairs\.split: expected 'train' or 'test'"),
    ("grf-n-zero", lambda: grf_initial_conditions(0, 32, np.random.default_rng(0)), ValueError,
     r"^grf_initial_conditions\.n: expected an integer >= 1"),
    ("grf-points-two", lambda: grf_initial_conditions(1, 2, np.random.default_rng(0)), ValueError,
     r"^grf_initial_conditions\.points: expected an integer >= 3"),
    ("grf-rng-seed", lambda: grf_initial_conditions(1, 32, 0), TypeError,
     r"^grf_initial_conditions\.rng: expected a numpy\.random\.Generator"),
    ("grf-sigma2-nan", lambda: grf_initial_conditions(1, 32, np.random.default_rng(0), sigma2=float("nan")), ValueError,
     r"^grf_initial_conditions\.sigma2: expected a finite number > 0"),
    ("data-nu-1e-3", lambda: _load(nu=1e-3), ValueError, r"^load_burgers\.nu: expected a viscosity in \[\S+, \S+\] at "
     r"points = 64 \(31 modes\) and n_steps = 100 .* got 0\.001"),
    ("data-nu-denormal", lambda: _load(nu=5e-324), ValueError, r"^load_burgers\.nu: expected a viscosity in .* got 5e-324"),
    ("data-nu-1e300", lambda: _load(nu=1e300), ValueError, r"^load_burgers\.nu: .* above \S+ the ETDRK4 coefficients overflow"),
    ("data-nu-nan", lambda: _load(nu=float("nan")), ValueError, r"^load_burgers\.nu: expected a finite number > 0"),
    ("data-n-steps-zero", lambda: _load(n_steps=0), ValueError, r"^load_burgers\.n_steps: expected an integer >= 1, got 0"),
    ("data-points-zero", lambda: _load(points=0), ValueError, r"^load_burgers\.points: expected an integer >= 8, got 0"),
    ("data-n-train-zero", lambda: _load(n_train=0), ValueError, r"^load_burgers\.n_train: expected an integer >= 1"),
    ("data-force-int", lambda: _load(force=1), TypeError, r"^load_burgers\.force: expected True or False"),
    # -- sizes (finding 9) ------------------------------------------------------------------------------
    ("data-points-2-40", lambda: _load(points=2**40), ValueError,
     r"^load_burgers\.points: reading the data needs an estimated .* of memory .* \(or force=True to try anyway\)"),
    ("data-n-train-1e9", lambda: _load(n_train=10**9, points=8192), ValueError, r"^load_burgers\.n_train: reading the data needs"),
    ("data-n-test-1e12", lambda: _load(n_test=10**12), ValueError, r"^load_burgers\.n_test: reading the data needs"),
    ("data-n-steps-1e9", lambda: _load(n_steps=10**9), ValueError,
     r"^load_burgers\.n_steps: generating the data needs an estimated .* of compute .* \(or force=True to run it anyway\)"),
    ("data-resolution-points-memory", lambda: _load(points=2**38, resolution=2**38), ValueError,
     r"^load_burgers\.resolution: reading the data needs .* points = 274877906944, resolution = 274877906944"),
    ("pairs-n-1e11", lambda: _pairs(n=10**11), ValueError, r"^burgers_pairs\.n: the data needs an estimated .* of memory"),
    ("pairs-n-steps-1e10", lambda: _pairs(n_steps=10**10), ValueError, r"^burgers_pairs\.n_steps: the data needs an estimated .* "
     r"of compute"),
    ("pairs-batch-memory", lambda: _pairs(n=10**6, points=2**16, batch=10**6), ValueError,
     r"^burgers_pairs\.batch: the data needs an estimated .* of memory .* batch = 1000000\)"),
    ("solve-n-steps-1e10", lambda: _solve(n_steps=10**10), ValueError, r"^solve_burgers\.n_steps: the solve needs an estimated"),
    ("solve-out-points-memory", lambda: _solve(out_points=2**42), ValueError, r"^solve_burgers\.out_points: the solve needs an "
     r"estimated .* of memory"),
    ("grf-n-1e12", lambda: grf_initial_conditions(10**12, 64, np.random.default_rng(0)), ValueError,
     r"^grf_initial_conditions\.n: the draw needs an estimated .* of memory"),
    # -- cache files (finding 8) and neighbours ------------------------------------------------------------
    ("data-cache-npz-deleted", lambda: _cache(_npz_deleted), BurgersCacheError,
     r"^Burgers cache '.*\.npz': unreadable data file \(FileNotFoundError"),
    ("data-cache-npz-folder", lambda: _cache(_npz_folder), BurgersCacheError,
     r"^Burgers cache '.*\.npz': unreadable data file \(IsADirectoryError"),
    ("data-cache-json-list", lambda: _cache(_meta_text("[]")), BurgersCacheError,
     r"^Burgers cache '.*\.json': unreadable metadata \(expected a JSON object .* got \[\]\)"),
    ("data-cache-json-int", lambda: _cache(_meta_text("1")), BurgersCacheError,
     r"^Burgers cache '.*\.json': unreadable metadata \(expected a JSON object .* got 1\)"),
    ("data-cache-json-settings-list", lambda: _cache(_meta_text(json.dumps({"settings": [1], "sha256": "0"}))),
     BurgersCacheError, r"^Burgers cache '.*\.json': unreadable metadata \(expected a JSON object with 'settings', an object"),
    ("data-cache-json-no-checksum", lambda: _cache(_meta_text(json.dumps({"settings": {}}))), BurgersCacheError,
     r"^Burgers cache '.*\.json': unreadable metadata \(expected .* 'sha256', a string"),
    ("data-cache-dir-file", _file_as_cache_dir, ValueError,
     r"^load_burgers\.cache_dir: expected a folder, but the cache folder '.*' is a file"),
    ("data-on-corrupt-capital", lambda: _load(on_corrupt="Error"), ValueError,
     r"^load_burgers\.on_corrupt: expected 'regenerate' or 'error', got 'Error'"),
    ("data-on-corrupt-none", lambda: _load(on_corrupt=None), ValueError, r"^load_burgers\.on_corrupt: expected .* got None"),
    ("data-on-corrupt-list", lambda: _load(on_corrupt=["error"]), ValueError, r"^load_burgers\.on_corrupt: expected .* got "
     r"\['error'\]"),
    ("data-regenerate-string", lambda: _load(regenerate="no"), TypeError, r"^load_burgers\.regenerate: expected True or False"),
    ("pixel-quadrature-rank", lambda: PixelQuadrature(8)(torch.zeros(8, 8)), ValueError, r"expected shape \(B, C, H, W\)"),
    ("integral-patch-not-embedding", lambda: IntegralPatchEmbedding.from_patch_embedding(torch.nn.Linear(2, 2)),
     TypeError, r"expected a PatchEmbedding"),
    ("integral-patch-channels",
     lambda: IntegralPatchEmbedding.from_patch_embedding(PatchEmbedding(8, 2, 1, 4))(torch.zeros(1, 2, 16, 16)),
     ValueError, r"expected 1 channels"),
)


@pytest.mark.parametrize("case", CASES)
def test_bad_input(case):
    run_case(case)


# -- opsplit train with task = "burgers" (issue 42): exit status 2, one line naming the key, nothing
# written (no run folder, no cached data: OPSPLIT_DATA_DIR is inside the row's folder) -------------
BURGERS_TOML = """\
task = "burgers"
[model]
d_model = 8
heads = 2
n_steps = 1
modes = 4
d_ff = 8
n_freq = 2
[train]
epochs = 1
batch_size = 4
[eval]
resolutions = [16]
[data]
resolution = 16
n_train = {n_train}
n_test = {n_test}
points = {points}
solver_steps = {solver_steps}
"""


def btoml(**kw) -> dict:
    return {"c.toml": BURGERS_TOML.format(**{"n_train": 8, "n_test": 4, "points": 64, "solver_steps": 100, **kw})}


PRINT = ("--print-config",)
CLI_CASES = rows(
    ("burgers-solver-steps-cost", ["train", *CFG, *OUT], "data.solver_steps = 1000000000000: the job needs an estimated",
     btoml(solver_steps=10**12)),
    ("burgers-points-memory", ["train", *CFG, *OUT], "data.points = 1099511627776: the job needs an estimated",
     btoml(points=2**40)),
    ("burgers-n-train-memory", ["train", *CFG, *OUT], "data.n_train = 100000000000: the job needs an estimated",
     btoml(n_train=10**11)),
    ("burgers-n-test-memory", ["train", *CFG, *OUT], "data.n_test = 1000000000000: the job needs an estimated",
     btoml(n_test=10**12)),
    ("burgers-points-too-few", ["train", *CFG, *OUT], "data.points: expected at least 42 nodes: fewer modes do not "
     "resolve the steepest viscous front of the data at nu = 0.1", btoml(points=16)),
    ("burgers-print-config-points-too-few", ["train", *CFG, *PRINT], "data.points: expected at least 42 nodes",
     btoml(points=16)),
    ("burgers-solver-steps-unstable", ["train", *CFG, *OUT], "data.solver_steps: expected at least 32 steps at "
     "data.points = 64: with fewer the data solver's ETDRK4 step is unstable", btoml(solver_steps=2)),
    ("burgers-print-config-solver-steps-unstable", ["train", *CFG, *PRINT], "data.solver_steps: expected at least 32 "
     "steps at data.points = 64", btoml(solver_steps=2)),
    # issue 43: a key of an earlier version names its new name
    ("burgers-old-eval-resolutions", ["train", *CFG, *OUT], "train.eval_resolutions: renamed eval.resolutions (the name "
     "of what it sets); expected resolutions = ... under [eval]", {"c.toml": BURGERS_TOML.format(
         n_train=8, n_test=4, points=64, solver_steps=100).replace("[train]\n", "[train]\neval_resolutions = [16]\n")}),
    ("burgers-old-resolution", ["train", *CFG, *OUT], "train.resolution: renamed data.resolution", {
        "c.toml": BURGERS_TOML.format(n_train=8, n_test=4, points=64, solver_steps=100).replace(
            "[train]\n", "[train]\nresolution = 16\n")}),
    ("burgers-epochs-float", ["train", *CFG, *OUT], "train.epochs: expected an integer", {
        "c.toml": BURGERS_TOML.format(n_train=8, n_test=4, points=64, solver_steps=100).replace(
            "epochs = 1", "epochs = 1.5")}),
    ("burgers-solver-steps-zero", ["train", *CFG, *OUT], "data.solver_steps: expected a value >= 1, got 0",
     btoml(solver_steps=0)),
)


@pytest.mark.usefixtures("one_thread")
@pytest.mark.parametrize("row", CLI_CASES)
def test_bad_burgers_command(row: Row, tmp_path, capsys, monkeypatch):
    from opsplit.cli import main
    from opsplit.data import burgers as burgers_mod

    def generate(*a, **k):  # a refusal comes before the data: generating it fails the row
        raise AssertionError("the data was generated")

    monkeypatch.setattr(burgers_mod, "_generate", generate)
    _setup(tmp_path, row.files)
    monkeypatch.setenv("OPSPLIT_DATA_DIR", str(tmp_path / "cache"))
    monkeypatch.chdir(tmp_path)
    before = _tree(tmp_path)
    rc = main([a.replace("{tmp}", str(tmp_path)) for a in row.argv])
    _check(row, tmp_path, rc, capsys.readouterr().err, before)
