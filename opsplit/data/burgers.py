r"""1-D viscous Burgers' equation, the operator-learning benchmark of Li et al. (FNO, ICLR
2021), generated (nothing is downloaded).

**Problem.**  :math:`u_t + (u^2/2)_x = \nu u_{xx}` on the periodic :math:`[0, 1)`,
:math:`\nu = 0.1`, from :math:`t = 0` to :math:`t = 1`; learn the map
:math:`u_0 \mapsto u(\cdot, 1)`.  The initial conditions are draws of the Gaussian random
field :math:`\mathcal N(0,\ 625\,(-\Delta + 25 I)^{-2})` with periodic boundary conditions:
its Karhunen–Loève expansion

.. math::  u_0(x) = \sum_{m \ge 1} \sqrt{2\lambda_m}\,\big(a_m \cos 2\pi m x
           + b_m \sin 2\pi m x\big), \quad
           \lambda_m = 625\,\big((2\pi m)^2 + 25\big)^{-2}, \quad a_m, b_m \sim \mathcal N(0, 1),

truncated at the modes a grid of ``points`` nodes resolves (:math:`m < \text{points}/2`);
the mean (:math:`m = 0`) is set to zero, as in FNO's generator.  Each pair is solved by
:func:`~opsplit.data.burgers_solver.solve_burgers` (pseudo-spectral, 2/3 rule, ETDRK4 with
``n_steps = 1000``; self-convergence against a 2x finer grid and time step about
:math:`2 \cdot 10^{-9}` relative, ``benchmarks/burgers.py --check-solver``) and stored at
``points = 8192`` nodes :math:`x_j = j/8192` (FNO's data came from a spectral solver at 8192
points too).

**Samples and seeds.**  Initial condition ``i`` of split ``s`` (0: train, 1: test) is drawn
from ``numpy.random.default_rng([seed, s, i])``: a data set with fewer samples is a prefix
of one with more, and the train and test draws never coincide.

**Resolutions.**  :func:`load_burgers` returns the pairs subsampled to ``resolution`` nodes
(every ``points/resolution``-th node, :math:`x_j = j/n`; ``resolution`` must divide
``points``): 256, 512, ..., 8192 by default.

**Cache.**  Generated on first use (1,200 pairs: a few minutes on one core) and kept under
``$OPSPLIT_DATA_DIR`` if set, else ``$XDG_CACHE_HOME/opsplit``, else ``~/.cache/opsplit``
(folder ``burgers/``): a ``.npz`` file and a ``.json`` file beside it holding the
generation settings, the shapes and the SHA-256 of the ``.npz``.  Every load recomputes the
checksum and checks the settings and shapes: a truncated, edited or foreign file is never
used.  By default it is regenerated (with a warning); ``on_corrupt="error"`` raises
:class:`BurgersCacheError` instead.  Files are written to a temporary name and renamed, so
an interrupted generation leaves no partial file behind.
"""

from __future__ import annotations

import json
import os
import warnings
from pathlib import Path

import numpy as np
import torch

from .._checks import check_dtype_arg, check_positive_float
from .._files import sha256_of
from .base import TensorData, check_int
from .burgers_solver import solve_burgers

__all__ = ["load_burgers", "burgers_pairs", "grf_initial_conditions", "burgers_cache_dir", "BurgersCacheError",
           "RESOLUTIONS", "NU"]

#: the viscosity of the benchmark
NU = 0.1
#: the evaluation resolutions of the benchmark (FNO's table)
RESOLUTIONS = (256, 512, 1024, 2048, 4096, 8192)
#: the version of the generator: part of every cache key (a change regenerates)
_VERSION = 1
_SPLITS = {"train": 0, "test": 1}


class BurgersCacheError(RuntimeError):
    """A cached Burgers file that fails its checks (checksum, settings, shapes)."""


def burgers_cache_dir(cache_dir=None) -> Path:
    """The folder of the cached Burgers data: ``cache_dir`` if given, else
    ``$OPSPLIT_DATA_DIR``, else ``$XDG_CACHE_HOME/opsplit``, else ``~/.cache/opsplit``
    (then ``burgers/`` inside)."""
    if cache_dir is not None:
        if not isinstance(cache_dir, (str, os.PathLike)):
            raise TypeError(f"load_burgers.cache_dir: expected a path or None, got {type(cache_dir).__name__}")
        return Path(cache_dir)
    env = os.environ.get("OPSPLIT_DATA_DIR")
    if env:
        base = Path(env)
    else:
        xdg = os.environ.get("XDG_CACHE_HOME")
        base = (Path(xdg) if xdg else Path.home() / ".cache") / "opsplit"
    return base / "burgers"


def grf_initial_conditions(n: int, points: int, rng: np.random.Generator, *, sigma2: float = 625.0,
                           tau2: float = 25.0, alpha: float = 2.0) -> np.ndarray:
    r"""``n`` draws of :math:`\mathcal N(0, \sigma^2(-\Delta + \tau^2 I)^{-\alpha})` on the
    periodic :math:`[0, 1)` at ``points`` nodes :math:`x_j = j/\text{points}` (modes
    :math:`1 \le m < \text{points}/2`, zero mean), float64 ``(n, points)``."""
    M = (points - 1) // 2
    m = np.arange(1, M + 1)
    lam = sigma2 * ((2 * np.pi * m) ** 2 + tau2) ** (-alpha)
    a = rng.standard_normal((n, M))
    b = rng.standard_normal((n, M))
    c = np.zeros((n, points // 2 + 1), complex)
    c[:, 1:M + 1] = np.sqrt(lam / 2) * (a - 1j * b)  # u = sum_m c_m e^{2 pi i m x} + conj
    return np.fft.irfft(c * points, n=points, axis=-1)


def burgers_pairs(n: int, *, split: str = "train", seed: int = 0, points: int = 8192, nu: float = NU,
                  n_steps: int = 1000, start: int = 0, batch: int = 50) -> tuple[np.ndarray, np.ndarray]:
    """Initial conditions ``start .. start + n - 1`` of ``split`` and the solutions at
    :math:`t = 1`, float64 ``(n, points)`` each (see the module docstring)."""
    if split not in _SPLITS:
        raise ValueError(f"burgers_pairs.split: expected 'train' or 'test', got {split!r}")
    a = np.stack([grf_initial_conditions(1, points, np.random.default_rng([seed, _SPLITS[split], start + i]))[0]
                  for i in range(n)]) if n else np.zeros((0, points))
    u = np.empty_like(a)
    for s in range(0, n, batch):
        u[s:s + batch] = solve_burgers(a[s:s + batch], nu=nu, t_final=1.0, n_steps=n_steps)
    return a, u


def _settings(seed, n_train, n_test, points, nu, n_steps) -> dict:
    return {"version": _VERSION, "seed": seed, "n_train": n_train, "n_test": n_test, "points": points,
            "nu": nu, "n_steps": n_steps, "t_final": 1.0, "grf": "625 (-Laplacian + 25 I)^-2, zero mean",
            "dtype": "float32"}


def _stem(s: dict) -> str:
    nu = f"{s['nu']:g}".replace(".", "p").replace("-", "m").replace("+", "")
    return (f"burgers-v{s['version']}-seed{s['seed']}-n{s['n_train']}+{s['n_test']}-p{s['points']}"
            f"-nu{nu}-steps{s['n_steps']}")


def _file(stem: Path, suffix: str) -> Path:
    return stem.parent / (stem.name + suffix)


_KEYS = ("train_a", "train_u", "test_a", "test_u")


def _read(stem: Path, settings: dict) -> dict:
    """The arrays of a cached file, after every check; :class:`BurgersCacheError` otherwise."""
    data, meta = _file(stem, ".npz"), _file(stem, ".json")
    try:
        info = json.loads(meta.read_text())
    except (OSError, ValueError) as e:
        raise BurgersCacheError(f"Burgers cache {str(meta)!r}: unreadable metadata ({e})") from None
    if info.get("settings") != settings:
        raise BurgersCacheError(f"Burgers cache {str(meta)!r}: its settings {info.get('settings')} are not the "
                                f"requested {settings}")
    digest = sha256_of(data)
    if digest != info.get("sha256"):
        raise BurgersCacheError(
            f"Burgers cache {str(data)!r}: checksum mismatch (SHA-256 {digest[:16]}..., recorded "
            f"{str(info.get('sha256'))[:16]}...): the file was truncated or edited")
    try:
        with np.load(data) as z:
            arrays = {k: np.asarray(z[k]) for k in _KEYS}
    except Exception as e:  # a file that matches its checksum but is no npz of ours
        raise BurgersCacheError(f"Burgers cache {str(data)!r}: unreadable ({type(e).__name__}: {e})") from None
    for k in _KEYS:
        n = settings["n_train"] if k.startswith("train") else settings["n_test"]
        if arrays[k].shape != (n, settings["points"]) or arrays[k].dtype != np.float32:
            raise BurgersCacheError(f"Burgers cache {str(data)!r}: {k} has shape {arrays[k].shape} and dtype "
                                    f"{arrays[k].dtype}, expected ({n}, {settings['points']}) float32")
        if not np.isfinite(arrays[k]).all():
            raise BurgersCacheError(f"Burgers cache {str(data)!r}: {k} holds NaN/inf")
    return arrays


def _write(stem: Path, settings: dict, arrays: dict) -> None:
    stem.parent.mkdir(parents=True, exist_ok=True)
    tmp = stem.parent / f".{stem.name}.{os.getpid()}.tmp.npz"
    np.savez(tmp, **{k: arrays[k].astype(np.float32) for k in _KEYS})
    digest = sha256_of(tmp)
    os.replace(tmp, _file(stem, ".npz"))
    tmpj = stem.parent / f".{stem.name}.{os.getpid()}.tmp.json"
    tmpj.write_text(json.dumps({"settings": settings, "sha256": digest,
                                "shapes": {k: list(arrays[k].shape) for k in _KEYS}}, indent=1))
    os.replace(tmpj, _file(stem, ".json"))


def _generate(settings: dict) -> dict:
    s = settings
    out = {}
    for split, n in (("train", s["n_train"]), ("test", s["n_test"])):
        a, u = burgers_pairs(n, split=split, seed=s["seed"], points=s["points"], nu=s["nu"], n_steps=s["n_steps"])
        out[f"{split}_a"], out[f"{split}_u"] = a.astype(np.float32), u.astype(np.float32)
    return out


def _cached_arrays(settings: dict, folder: Path, on_corrupt: str, regenerate: bool) -> tuple[dict, Path]:
    stem = folder / _stem(settings)
    if not regenerate and (_file(stem, ".npz").exists() or _file(stem, ".json").exists()):
        try:
            return _read(stem, settings), stem
        except BurgersCacheError as e:
            if on_corrupt == "error":
                raise BurgersCacheError(f"{e}; delete the file or call load_burgers(..., regenerate=True)") from None
            warnings.warn(f"{e}; regenerating it", stacklevel=3)
    # a larger cached set with the same settings holds these samples as a prefix
    if not regenerate and folder.is_dir():
        for meta in sorted(folder.glob("burgers-*.json")):
            try:
                other = json.loads(meta.read_text())["settings"]
            except (OSError, ValueError, KeyError, TypeError):
                continue
            same = {k: v for k, v in other.items() if k not in ("n_train", "n_test")} == \
                {k: v for k, v in settings.items() if k not in ("n_train", "n_test")}
            if same and other["n_train"] >= settings["n_train"] and other["n_test"] >= settings["n_test"] \
                    and meta.parent / meta.stem != stem:
                try:
                    arrays = _read(meta.parent / meta.stem, other)
                except BurgersCacheError:
                    continue
                return {k: v[: settings["n_train"] if k.startswith("train") else settings["n_test"]]
                        for k, v in arrays.items()}, meta.parent / meta.stem
    arrays = _generate(settings)
    try:
        _write(stem, settings, arrays)
    except OSError as e:
        warnings.warn(f"load_burgers: could not write the cache {str(stem)!r} ({e}); the data is used uncached",
                      stacklevel=3)
    return arrays, stem


def load_burgers(resolution: int = 256, *, n_train: int = 1000, n_test: int = 200, seed: int = 0,
                 points: int = 8192, nu: float = NU, n_steps: int = 1000, dtype=torch.float32, cache_dir=None,
                 regenerate: bool = False, on_corrupt: str = "regenerate") -> tuple[TensorData, TensorData]:
    r"""The Burgers pairs :math:`(u_0, u(\cdot, 1))` at ``resolution`` nodes, train and test.

    Returns two :class:`~opsplit.data.TensorData` with inputs and targets of shape
    ``(n, resolution)`` (values at :math:`x_j = j/\text{resolution}`).

    Args:
        resolution: nodes of the returned grid; must divide ``points``.
        n_train, n_test: numbers of pairs (1,000 and 200: FNO's split sizes for training, a
            test set of 200).
        seed: the data seed (see the module docstring).
        points: the generation grid (8192).
        nu, n_steps: viscosity and ETDRK4 steps of the solver.
        dtype: of the returned tensors.
        cache_dir: the cache folder (default: see the module docstring).
        regenerate: ignore a cached file and generate (and cache) again.
        on_corrupt: ``"regenerate"`` (warn and regenerate a file that fails its checks) or
            ``"error"`` (raise :class:`BurgersCacheError`).
    """
    n_train = check_int(n_train, "load_burgers.n_train", 1)
    n_test = check_int(n_test, "load_burgers.n_test", 1)
    seed = check_int(seed, "load_burgers.seed", 0)
    points = check_int(points, "load_burgers.points", 8)
    n_steps = check_int(n_steps, "load_burgers.n_steps", 1)
    resolution = check_int(resolution, "load_burgers.resolution", 1)
    nu = check_positive_float(nu, "load_burgers.nu")
    dtype = check_dtype_arg(dtype, "load_burgers.dtype") or torch.float32
    if points % 2:
        raise ValueError(f"load_burgers.points: expected an even number of nodes, got {points}")
    if points % resolution:
        ok = sorted(points // 2**k for k in range(6) if points % 2**k == 0)
        raise ValueError(
            f"load_burgers.resolution: expected a divisor of points = {points} (the data is subsampled, every "
            f"points/resolution-th node), e.g. {ok}; got {resolution}")
    if not isinstance(regenerate, bool):
        raise TypeError(f"load_burgers.regenerate: expected true or false, got {regenerate!r}")
    if on_corrupt not in ("regenerate", "error"):
        raise ValueError(f"load_burgers.on_corrupt: expected 'regenerate' or 'error', got {on_corrupt!r}")
    folder = burgers_cache_dir(cache_dir)
    settings = _settings(seed, n_train, n_test, points, float(nu), n_steps)
    arrays, stem = _cached_arrays(settings, folder, on_corrupt, regenerate)
    step = points // resolution
    info = {"equation": "u_t + (u^2/2)_x = nu u_xx, periodic [0, 1), t in [0, 1]", "resolution": resolution,
            "cache": str(_file(stem, ".npz")), **settings}

    def part(split):
        a = torch.from_numpy(np.ascontiguousarray(arrays[f"{split}_a"][:, ::step])).to(dtype)
        u = torch.from_numpy(np.ascontiguousarray(arrays[f"{split}_u"][:, ::step])).to(dtype)
        return TensorData(a, u, name=f"burgers_{split}", info={**info, "split": split})

    return part("train"), part("test")
