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
used, nor a missing one beside its partner, a folder in a file's place, or a ``.json`` that is
not an object with ``settings`` and ``sha256``.  By default it is regenerated (with a
warning); ``on_corrupt="error"`` raises :class:`BurgersCacheError` naming the file instead.
Another cached set with the same settings and more pairs is read instead when it passes its
checks (and fits in memory) and passed over otherwise, as are stray ``burgers-*.json`` files.
Files are written to names unique to the process and thread and renamed, under an advisory
lock (``flock`` of a ``.lock`` file beside them) that readers share, so an interrupted
generation leaves no partial file behind and two writers never leave one's ``.npz`` with the
other's ``.json``.  A cache folder that exists as a file is refused; one that cannot be
written gives a warning and the data uncached.

**Checks and sizes.**  Every argument is checked before anything is computed or written:
counts and sizes are integers (at least 1; ``points`` at least 8), the viscosity finite,
positive and within the range the solver takes at ``points`` and ``n_steps``
(:func:`data_viscosity_range`: the modes resolve the steepest viscous front and the ETDRK4
step is stable; :mod:`opsplit.data.burgers_solver`), and the estimated memory
(:func:`generation_cost`; :func:`opsplit._memory.available_memory`) and time (an hour,
:data:`~opsplit.data.burgers_solver.MAX_SECONDS`) within bounds unless ``force=True``.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import threading
import warnings
from pathlib import Path

import numpy as np
import torch

from .._checks import check_dtype_arg
from .._files import sha256_of
from .._memory import available_memory
from ._cache import file_lock
from .base import TensorData
from .burgers_solver import (
    ViscosityRange,
    check_bool,
    check_count,
    check_real,
    least_modes,
    least_steps,
    size_guard,
    solve_burgers,
    solve_cost,
    viscosity_range,
)

__all__ = ["load_burgers", "burgers_pairs", "grf_initial_conditions", "burgers_cache_dir", "BurgersCacheError",
           "data_viscosity_range", "generation_cost", "RESOLUTIONS", "NU", "GRF_AMPLITUDE"]

#: the viscosity of the benchmark
NU = 0.1
#: the evaluation resolutions of the benchmark (FNO's table)
RESOLUTIONS = (256, 512, 1024, 2048, 4096, 8192)
#: the bound on max|u0| of the random initial conditions that the viscosity check of the data
#: assumes before any is drawn (4e5 draws: largest 3.10, 7.5e-6 of them above 2.9); the
#: drawn ones are checked again
GRF_AMPLITUDE = 3.5
#: max|u0| of a batch of 50 draws that the cost estimate assumes (the 90th percentile of the
#: batch maximum over 1,000 batches; its median is 1.89)
_GRF_COST_AMPLITUDE = 2.2
#: the version of the generator: part of every cache key (a change regenerates)
_VERSION = 1
_SPLITS = {"train": 0, "test": 1}
#: pairs solved at once
_BATCH = 50


class BurgersCacheError(RuntimeError):
    """A cached Burgers file that fails its checks (missing, unreadable, checksum, settings,
    shapes)."""


def _cache_dir_and_source(cache_dir) -> tuple[Path, str]:
    if cache_dir is not None:
        if not isinstance(cache_dir, (str, os.PathLike)):
            raise TypeError(f"load_burgers.cache_dir: expected a path or None, got {type(cache_dir).__name__}")
        return Path(cache_dir), ""
    env = os.environ.get("OPSPLIT_DATA_DIR")
    if env:
        return Path(env) / "burgers", " (from $OPSPLIT_DATA_DIR)"
    xdg = os.environ.get("XDG_CACHE_HOME")
    if xdg:
        return Path(xdg) / "opsplit" / "burgers", " (from $XDG_CACHE_HOME)"
    return Path.home() / ".cache" / "opsplit" / "burgers", ""


def burgers_cache_dir(cache_dir=None) -> Path:
    """The folder of the cached Burgers data: ``cache_dir`` if given, else
    ``$OPSPLIT_DATA_DIR``, else ``$XDG_CACHE_HOME/opsplit``, else ``~/.cache/opsplit``
    (then ``burgers/`` inside)."""
    return _cache_dir_and_source(cache_dir)[0]


def _check_folder(folder: Path, source: str, who: str) -> None:
    """A cache folder that exists as something else than a folder (or below a file) is
    refused before anything is computed."""
    p = folder
    while True:
        try:
            if p.exists() or p.is_symlink():
                if not p.is_dir():
                    what = "the cache folder" if p == folder else f"a folder above the cache folder {str(folder)!r}"
                    raise ValueError(f"{who}.cache_dir: expected a folder{source}, but {what} {str(p)!r} is a file "
                                     f"(or a broken link); expected a folder or a path that can be created")
                return
        except OSError:  # unreadable: the write reports it (warned, used uncached)
            return
        if p.parent == p:
            return
        p = p.parent


def grf_initial_conditions(n: int, points: int, rng: np.random.Generator, *, sigma2: float = 625.0,
                           tau2: float = 25.0, alpha: float = 2.0, force: bool = False) -> np.ndarray:
    r"""``n`` draws of :math:`\mathcal N(0, \sigma^2(-\Delta + \tau^2 I)^{-\alpha})` on the
    periodic :math:`[0, 1)` at ``points`` nodes :math:`x_j = j/\text{points}` (modes
    :math:`1 \le m < \text{points}/2`, zero mean), float64 ``(n, points)``.  ``force``: draw
    even when the arrays exceed the available memory."""
    n = check_count(n, "grf_initial_conditions.n")
    points = check_count(points, "grf_initial_conditions.points", 3)
    if not isinstance(rng, np.random.Generator):
        raise TypeError(f"grf_initial_conditions.rng: expected a numpy.random.Generator, got {type(rng).__name__}")
    sigma2 = check_real(sigma2, "grf_initial_conditions.sigma2", lo=0.0)
    tau2 = check_real(tau2, "grf_initial_conditions.tau2", lo=0.0, strict=False)
    alpha = check_real(alpha, "grf_initial_conditions.alpha", lo=0.0)
    force = check_bool(force, "grf_initial_conditions.force")
    size_guard("grf_initial_conditions", seconds=0.0, nbytes=48.0 * n * points, force=force, what="the draw",
               sizes={"n": (n, 1000), "points": (points, 8192)})
    M = (points - 1) // 2
    m = np.arange(1, M + 1)
    lam = sigma2 * ((2 * np.pi * m) ** 2 + tau2) ** (-alpha)
    a = rng.standard_normal((n, M))
    b = rng.standard_normal((n, M))
    c = np.zeros((n, points // 2 + 1), complex)
    c[:, 1:M + 1] = np.sqrt(lam / 2) * (a - 1j * b)  # u = sum_m c_m e^{2 pi i m x} + conj
    return np.fft.irfft(c * points, n=points, axis=-1)


def data_viscosity_range(points: int, n_steps: int) -> ViscosityRange:
    """The viscosities the data's solver takes at ``points`` nodes and ``n_steps`` steps on
    ``[0, 1]`` for initial conditions within :data:`GRF_AMPLITUDE`
    (:func:`~opsplit.data.burgers_solver.viscosity_range`)."""
    return viscosity_range((points - 1) // 2, 1.0 / n_steps, GRF_AMPLITUDE)


def data_least_sizes(points: int, nu: float = NU) -> tuple[int, int]:
    """``(points, n_steps)``: the fewest (even) nodes whose modes resolve the data at ``nu``,
    and the fewest steps on ``[0, 1]`` stable at ``points`` nodes (the two conditions of
    :func:`data_viscosity_range` solved for the sizes)."""
    M = least_modes(nu, GRF_AMPLITUDE)
    return 2 * (M + 1), least_steps((points - 1) // 2, 1.0, nu, GRF_AMPLITUDE)


def _where(points: int, n_steps: int, drawn: bool) -> str:
    M = (points - 1) // 2
    what = "the drawn initial conditions" if drawn else "the data's random initial conditions (bound: GRF_AMPLITUDE)"
    return f"points = {points} ({M} modes) and n_steps = {n_steps} (dt = {1 / n_steps:.3g}) for {what}"


def _check_nu(nu, who: str, points: int, n_steps: int) -> float:
    x = check_real(nu, f"{who}.nu", lo=0.0)
    allowed = data_viscosity_range(points, n_steps)
    if x not in allowed:
        raise ValueError(allowed.refusal(f"{who}.nu", nu, _where(points, n_steps, False)))
    return x


def _pairs_cost(n: int, points: int, n_steps: int, nu: float, batch: int = _BATCH) -> tuple[float, float]:
    """``(seconds, bytes)`` of :func:`burgers_pairs`: the draws, the solves in batches of
    ``batch`` (:func:`~opsplit.data.burgers_solver.solve_cost`), the two float64 arrays."""
    full, rest = divmod(n, batch)
    seconds, work = 0.0, 0.0
    for B, k in ((batch, full), (rest, 1 if rest else 0)):
        if k:
            sec, nb = solve_cost(B, points, n_steps, nu=nu, amplitude=_GRF_COST_AMPLITUDE, batches=k)
            seconds, work = seconds + sec, max(work, nb)
    seconds += n * (points * 3e-8 + 1e-5)  # the draws
    return seconds, 16.0 * n * points + work + 48.0 * points


def generation_cost(n_train: int, n_test: int, points: int, n_steps: int, nu: float = NU) -> tuple[float, float]:
    """``(seconds, bytes)``: an estimate of generating and caching a data set (both splits;
    the arrays of one split in float64 and float32 beside the other in float32, the file
    written and hashed).  A rough figure (a factor of a few, high for the smooth data of
    :data:`NU`), for the size guards of :func:`load_burgers` and ``opsplit train``."""
    seconds, work = 0.0, 0.0
    for n in (n_train, n_test):
        sec, nb = _pairs_cost(n, points, n_steps, nu)
        seconds, work = seconds + sec, max(work, nb)
    total = (n_train + n_test) * float(points)
    seconds += 3 * 8.0 * total * 1e-9  # write, hash, read back at about 1 GB/s
    return seconds, work + 8.0 * total


def burgers_pairs(n: int, *, split: str = "train", seed: int = 0, points: int = 8192, nu: float = NU,
                  n_steps: int = 1000, start: int = 0, batch: int = _BATCH,
                  force: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """Initial conditions ``start .. start + n - 1`` of ``split`` and the solutions at
    :math:`t = 1`, float64 ``(n, points)`` each (see the module docstring).  Every argument
    is checked, ``nu`` against :func:`data_viscosity_range`, and the estimated memory and
    time against the machine's and an hour (``force=True`` runs it anyway), before anything
    is computed."""
    return _pairs(n, split=split, seed=seed, points=points, nu=nu, n_steps=n_steps, start=start, batch=batch,
                  force=force, who="burgers_pairs")


def _pairs(n, *, split, seed, points, nu, n_steps, start, batch, force, who, checked=False):
    if not checked:
        if not isinstance(split, str) or split not in _SPLITS:
            raise ValueError(f"{who}.split: expected 'train' or 'test', got {split!r}")
        n = check_count(n, f"{who}.n")
        seed = check_count(seed, f"{who}.seed", 0)
        points = check_count(points, f"{who}.points", 8)
        n_steps = check_count(n_steps, f"{who}.n_steps")
        start = check_count(start, f"{who}.start", 0)
        batch = check_count(batch, f"{who}.batch")
        force = check_bool(force, f"{who}.force")
        nu = _check_nu(nu, who, points, n_steps)
        seconds, nbytes = _pairs_cost(n, points, n_steps, nu, min(batch, n))
        size_guard(who, seconds=seconds, nbytes=nbytes, force=force, what="the data",
                   sizes={"n": (n, 1000), "points": (points, 8192), "n_steps": (n_steps, 1000),
                          "batch": (min(batch, n), _BATCH)})
    a = np.empty((n, points))
    for i in range(n):
        a[i] = grf_initial_conditions(1, points, np.random.default_rng([seed, _SPLITS[split], start + i]), force=True)[0]
    # the drawn initial conditions against the viscosity range (GRF_AMPLITUDE bounds them almost always)
    drawn = viscosity_range((points - 1) // 2, 1.0 / n_steps, float(np.abs(a).max()))
    if nu not in drawn:
        raise ValueError(drawn.refusal(f"{who}.nu", nu, _where(points, n_steps, True)))
    u = np.empty_like(a)
    for s in range(0, n, batch):
        u[s:s + batch] = solve_burgers(a[s:s + batch], nu=nu, t_final=1.0, n_steps=n_steps, force=True)
    if not np.isfinite(u).all():  # excluded by the viscosity range: a solver fault, never written
        raise RuntimeError(f"{who}: the solver returned non-finite values at nu = {nu!r}, points = {points}, "
                           f"n_steps = {n_steps}, within its viscosity range; please report it")
    return a, u


def _settings(seed, n_train, n_test, points, nu, n_steps) -> dict:
    return {"version": _VERSION, "seed": seed, "n_train": n_train, "n_test": n_test, "points": points,
            "nu": nu, "n_steps": n_steps, "t_final": 1.0, "grf": "625 (-Laplacian + 25 I)^-2, zero mean",
            "dtype": "float32"}


def _stem(s: dict) -> str:
    nu = repr(float(s["nu"])).replace(".", "p").replace("-", "m").replace("+", "")  # every digit: one file per nu
    return (f"burgers-v{s['version']}-seed{s['seed']}-n{s['n_train']}+{s['n_test']}-p{s['points']}"
            f"-nu{nu}-steps{s['n_steps']}")


def _file(stem: Path, suffix: str) -> Path:
    return stem.parent / (stem.name + suffix)


_KEYS = ("train_a", "train_u", "test_a", "test_u")


def _lock(stem: Path, exclusive: bool):
    """An advisory lock (``flock``) of one cached data set: shared while it is read, exclusive
    while it is generated and written, so a reader never sees the ``.npz`` of one writer
    with the ``.json`` of another.  Without a lock file (a folder that cannot be written or
    does not exist, no ``fcntl``) the files are used unlocked."""
    return file_lock(stem.parent / f".{stem.name}.lock", exclusive=exclusive, modes=("ab", "rb"))


def _short(x) -> str:
    r = repr(x)
    return r if len(r) <= 80 else r[:77] + "..."


def _read_meta(meta: Path) -> dict:
    """The ``.json`` of a cached set: a JSON object with ``settings`` (an object) and
    ``sha256`` (a string); :class:`BurgersCacheError` naming the file otherwise."""
    try:
        info = json.loads(meta.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError) as e:
        raise BurgersCacheError(f"Burgers cache {str(meta)!r}: unreadable metadata ({type(e).__name__}: {e})") from None
    if not isinstance(info, dict) or not isinstance(info.get("settings"), dict) \
            or not isinstance(info.get("sha256"), str):
        raise BurgersCacheError(f"Burgers cache {str(meta)!r}: unreadable metadata (expected a JSON object with "
                                f"'settings', an object, and 'sha256', a string; got {_short(info)})")
    return info


def _same_kind(other: dict, settings: dict) -> bool:
    """``other`` holds the settings of a data set whose samples start with those of
    ``settings`` (the same settings but at least as many pairs of each split)."""
    if set(other) != set(settings):
        return False
    for k in ("n_train", "n_test"):
        if isinstance(other[k], bool) or not isinstance(other[k], int) or other[k] < settings[k]:
            return False
    return {k: v for k, v in other.items() if k not in ("n_train", "n_test")} == \
        {k: v for k, v in settings.items() if k not in ("n_train", "n_test")}


def _read(stem: Path, settings: dict) -> dict:
    """The arrays of a cached file, after every check; :class:`BurgersCacheError` otherwise."""
    data, meta = _file(stem, ".npz"), _file(stem, ".json")
    info = _read_meta(meta)
    if info["settings"] != settings:
        raise BurgersCacheError(f"Burgers cache {str(meta)!r}: its settings {_short(info['settings'])} are not the "
                                f"requested {settings}")
    try:
        digest = sha256_of(data)
    except OSError as e:
        raise BurgersCacheError(f"Burgers cache {str(data)!r}: unreadable data file ({type(e).__name__}: "
                                f"{e.strerror or e})") from None
    if digest != info["sha256"]:
        raise BurgersCacheError(
            f"Burgers cache {str(data)!r}: checksum mismatch (SHA-256 {digest[:16]}..., recorded "
            f"{info['sha256'][:16]}...): the file was truncated or edited")
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
    """Both files under temporary names unique to this process and thread, then renamed
    (the caller holds the exclusive lock); the temporary files never stay behind."""
    tag = f"{os.getpid()}.{threading.get_ident()}"
    tmp = stem.parent / f".{stem.name}.{tag}.tmp.npz"
    tmpj = stem.parent / f".{stem.name}.{tag}.tmp.json"
    try:
        np.savez(tmp, **{k: np.asarray(arrays[k], dtype=np.float32) for k in _KEYS})
        tmpj.write_text(json.dumps({"settings": settings, "sha256": sha256_of(tmp),
                                    "shapes": {k: list(arrays[k].shape) for k in _KEYS}}, indent=1))
        os.replace(tmp, _file(stem, ".npz"))
        os.replace(tmpj, _file(stem, ".json"))
    finally:
        for t in (tmp, tmpj):
            with contextlib.suppress(OSError):
                t.unlink()


def _generate(settings: dict, who: str) -> dict:
    s = settings
    out = {}
    for split, n in (("train", s["n_train"]), ("test", s["n_test"])):
        a, u = _pairs(n, split=split, seed=s["seed"], points=s["points"], nu=s["nu"], n_steps=s["n_steps"],
                      start=0, batch=_BATCH, force=True, who=who, checked=True)
        out[f"{split}_a"], out[f"{split}_u"] = a.astype(np.float32), u.astype(np.float32)
    return out


def _lookup(stem: Path, settings: dict, on_corrupt: str, lock: bool, memory: float):
    """``(arrays, stem)`` of the requested set, or of a larger cached set with the same
    settings (its prefix), or ``None`` when it must be generated.  A file of the requested
    set that fails its checks raises :class:`BurgersCacheError` (``on_corrupt="error"``) or
    is warned about (``"regenerate"``; ``"quiet"`` neither); a larger set that fails its
    checks, or would not fit in ``memory``, is passed over."""
    data, meta = _file(stem, ".npz"), _file(stem, ".json")
    if any(p.exists() or p.is_symlink() for p in (data, meta)):
        try:
            with _lock(stem, exclusive=False) if lock else contextlib.nullcontext():
                return _read(stem, settings), stem
        except BurgersCacheError as e:
            if on_corrupt == "error":
                raise BurgersCacheError(f"{e}; delete the file or call load_burgers(..., regenerate=True)") from None
            if on_corrupt == "regenerate":
                warnings.warn(f"{e}; regenerating it", stacklevel=4)
    folder = stem.parent
    try:
        candidates = sorted(folder.glob("burgers-*.json")) if folder.is_dir() else []
    except OSError:
        candidates = []
    for m in candidates:
        other_stem = m.parent / m.name[: -len(".json")]
        if other_stem == stem:
            continue
        try:
            other = _read_meta(m)["settings"]
        except BurgersCacheError:
            continue
        if not _same_kind(other, settings) or 8.0 * (other["n_train"] + other["n_test"]) * other["points"] > memory:
            continue
        try:
            with _lock(other_stem, exclusive=False) if lock else contextlib.nullcontext():
                arrays = _read(other_stem, other)
        except BurgersCacheError:
            continue
        return {k: v[: settings["n_train"] if k.startswith("train") else settings["n_test"]]
                for k, v in arrays.items()}, other_stem
    return None


def _cached_arrays(settings: dict, folder: Path, on_corrupt: str, regenerate: bool, who: str,
                   force: bool) -> tuple[dict, Path]:
    stem = folder / _stem(settings)
    memory = math.inf if force else available_memory()
    if not regenerate:
        found = _lookup(stem, settings, on_corrupt, True, memory)
        if found is not None:
            return found
    s = settings
    seconds, nbytes = generation_cost(s["n_train"], s["n_test"], s["points"], s["n_steps"], s["nu"])
    size_guard(who, seconds=seconds, nbytes=nbytes, force=force, what="generating the data",
               sizes={"n_train": (s["n_train"], 1000), "n_test": (s["n_test"], 200), "points": (s["points"], 8192),
                      "n_steps": (s["n_steps"], 1000)})
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError:
        pass  # reported when the file cannot be written
    with _lock(stem, exclusive=True):
        if not regenerate:  # another process may have written it meanwhile
            found = _lookup(stem, settings, "quiet", False, memory)
            if found is not None:
                return found
        arrays = _generate(settings, who)
        try:
            _write(stem, settings, arrays)
        except OSError as e:
            warnings.warn(f"{who}: could not write the cache {str(stem)!r} ({type(e).__name__}: {e}); the data is "
                          f"used uncached", stacklevel=3)
    return arrays, stem


def load_burgers(resolution: int = 256, *, n_train: int = 1000, n_test: int = 200, seed: int = 0,
                 points: int = 8192, nu: float = NU, n_steps: int = 1000, dtype=torch.float32, cache_dir=None,
                 regenerate: bool = False, on_corrupt: str = "regenerate",
                 force: bool = False) -> tuple[TensorData, TensorData]:
    r"""The Burgers pairs :math:`(u_0, u(\cdot, 1))` at ``resolution`` nodes, train and test.

    Returns two :class:`~opsplit.data.TensorData` with inputs and targets of shape
    ``(n, resolution)`` (values at :math:`x_j = j/\text{resolution}`).

    Every argument is checked before anything is computed or written: the counts and sizes
    integers, ``nu`` within :func:`data_viscosity_range` of ``points`` and ``n_steps``, the
    cache folder a folder, the memory of the call within the available memory and, when the
    data must be generated, its estimated time (:func:`generation_cost`) within an hour.

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
            ``"error"`` (raise :class:`BurgersCacheError` naming the file).
        force: load or generate even when the estimated memory exceeds the available memory
            or the estimated time an hour.
    """
    who = "load_burgers"
    n_train = check_count(n_train, "load_burgers.n_train")
    n_test = check_count(n_test, "load_burgers.n_test")
    seed = check_count(seed, "load_burgers.seed", 0)
    points = check_count(points, "load_burgers.points", 8)
    n_steps = check_count(n_steps, "load_burgers.n_steps")
    resolution = check_count(resolution, "load_burgers.resolution")
    dtype = check_dtype_arg(dtype, "load_burgers.dtype") or torch.float32
    if points % 2:
        raise ValueError(f"load_burgers.points: expected an even number of nodes, got {points}")
    if points % resolution:
        ok = sorted(points // 2**k for k in range(6) if points % 2**k == 0)
        raise ValueError(
            f"load_burgers.resolution: expected a divisor of points = {points} (the data is subsampled, every "
            f"points/resolution-th node), e.g. {ok}; got {resolution}")
    regenerate = check_bool(regenerate, "load_burgers.regenerate")
    force = check_bool(force, "load_burgers.force")
    if not isinstance(on_corrupt, str) or on_corrupt not in ("regenerate", "error"):
        raise ValueError(f"load_burgers.on_corrupt: expected 'regenerate' or 'error', got {on_corrupt!r}")
    nu = _check_nu(nu, who, points, n_steps)
    folder, source = _cache_dir_and_source(cache_dir)
    _check_folder(folder, source, who)
    n = n_train + n_test
    size_guard(who, seconds=0.0, nbytes=8.0 * n * points + (4.0 + torch.empty((), dtype=dtype).element_size())
               * 2 * n * resolution, force=force, what="reading the data",
               sizes={"n_train": (n_train, 1000), "n_test": (n_test, 200), "points": (points, 8192),
                      "resolution": (resolution, 256)})
    settings = _settings(seed, n_train, n_test, points, float(nu), n_steps)
    arrays, stem = _cached_arrays(settings, folder, on_corrupt, regenerate, who, force)
    step = points // resolution
    info = {"equation": "u_t + (u^2/2)_x = nu u_xx, periodic [0, 1), t in [0, 1]", "resolution": resolution,
            "cache": str(_file(stem, ".npz")), **settings}

    def part(split):
        a = torch.from_numpy(np.ascontiguousarray(arrays[f"{split}_a"][:, ::step])).to(dtype)
        u = torch.from_numpy(np.ascontiguousarray(arrays[f"{split}_u"][:, ::step])).to(dtype)
        return TensorData(a, u, name=f"burgers_{split}", info={**info, "split": split})

    return part("train"), part("test")
