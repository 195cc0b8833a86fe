r"""2-D Darcy flow, the operator-learning benchmark of Li et al. (FNO, ICLR 2021), generated
(nothing is downloaded).

**Problem.**  :math:`-\nabla\cdot(a(x)\nabla u(x)) = f(x) = 1` on :math:`(0, 1)^2`,
:math:`u = 0` on the boundary; learn the map :math:`a \mapsto u`.  The coefficient is
piecewise constant, :math:`a = a_+ = 12` where :math:`\psi \ge 0` and :math:`a_- = 3` where
:math:`\psi < 0`, for a Gaussian random field :math:`\psi \sim \mathcal N(0,\ \tau^{2\alpha - 2}
(-\Delta + \tau^2 I)^{-\alpha})`, :math:`\alpha = 2`, :math:`\tau = 3`, with zero Neumann
boundary conditions.  Its Karhunen–Loève expansion in the Neumann eigenfunctions
:math:`\varphi_k(x, y) = c_{k_1} c_{k_2}\cos(\pi k_1 x)\cos(\pi k_2 y)` (:math:`c_0 = 1`,
:math:`c_k = \sqrt 2`: orthonormal on the square) is

.. math::  \psi = \sum_{k \ne 0} \tau^{\alpha - 1}\big(\pi^2|k|^2 + \tau^2\big)^{-\alpha/2}
           \,\xi_k\,\varphi_k, \qquad \xi_k \sim \mathcal N(0, 1),

truncated at :math:`0 \le k_1, k_2 \le s - 1`, the constant mode set to zero — the
coefficients and truncation of FNO's data script ``GRF.m``.  (The overall factor
:math:`\tau^{\alpha - 1}` does not change the sign of :math:`\psi`, so ``a`` is that of
:math:`\mathcal N(0, (-\Delta + 9I)^{-2})` too.)  :func:`grf_neumann` evaluates the series
at the nodes :math:`(i, j)/(s - 1)` exactly, by a type-I discrete cosine transform; FNO's
script evaluates it at the cell centres (MATLAB's ``idct2``) and interpolates to the nodes
with splines, which blurs the two-valued coefficient; here ``a`` takes exactly the two
values at every node.

**Solver.**  :func:`~opsplit.data.darcy_solver.solve_darcy`: five-point finite differences
with the arithmetic mean of the neighbouring nodes' ``a`` at the faces (FNO's
``solve_gwf.m``), a sparse direct solve per sample; second order for a smooth coefficient
(checked on a manufactured solution), about first order for the two-phase one.  Solved at
``s = 421`` nodes per side (FNO's data: 421 x 421).

**Samples and seeds.**  The normals :math:`\xi` of sample ``i`` of split ``split`` (0:
train, 1: test) come from ``numpy.random.default_rng([seed, split, i])``: a data set with
fewer samples is a prefix of one with more (a larger set is read from a cached smaller one
and only the samples after it are generated), and the train and test draws never coincide.

**Resolutions.**  :func:`load_darcy` returns the pairs subsampled to ``resolution`` nodes
per side, every ``r``-th node with ``r = (s - 1)/(resolution - 1)`` (``[::r, ::r]``, as
FNO does): 85, 141, 211, 421 at ``s = 421`` (``r = 5, 3, 2, 1``).  ``resolution - 1`` must
divide ``s - 1``.  The subsampled coefficient is the fine one at the coarse nodes, so a
finer grid carries information a coarser one does not.

**Cache.**  Generated on first use (``docs/darcy.md`` has the time per sample) and kept
under ``$OPSPLIT_DATA_DIR`` if set, else ``$XDG_CACHE_HOME/opsplit``, else
``~/.cache/opsplit`` (folder ``darcy/``), one file per split: a ``.npz`` holding the sign of
:math:`\psi` as packed bits (``mask``, ``ceil(s^2/8)`` bytes a sample) and ``u`` at every node
as float32 (``4 s^2`` bytes: 709 kB at ``s = 421``), and a ``.json`` beside it with the
generation settings, the shapes and the SHA-256 of the ``.npz``.  Every load recomputes the
checksum and checks the settings, shapes and dtypes: a truncated, edited or foreign file is
never used.  By default it is regenerated (with a warning); ``on_corrupt="error"`` raises
:class:`DarcyCacheError` instead.  The scheme is ``opsplit/data/_cache.py``'s.  A load holds
an exclusive ``flock`` of a ``.lock`` file per data family (split, seed, grid, contrast, face
rule) in the cache folder while it reads or generates, so concurrent processes asking for
the same data generate it once and never see each other's half-replaced files.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import torch

from .._checks import check_bool, check_choice, check_dtype_arg, check_positive_float
from .._memory import available_memory, human_bytes
from ._cache import CacheError, cached_arrays, data_cache_dir, file_lock, free_disk
from .base import TensorData, check_int
from .burgers import _cache_dir_and_source, _check_folder
from .darcy_solver import FACES, MIN_NODES, factor_entries, solve_darcy

__all__ = ["load_darcy", "darcy_pairs", "grf_neumann", "grf_scales", "darcy_cache_dir", "DarcyCacheError",
           "RESOLUTIONS", "S", "ALPHA", "TAU", "A_POS", "A_NEG"]

#: the generation grid of the benchmark (nodes per side)
S = 421
#: the evaluation resolutions of the benchmark (FNO's table): every 5th, 3rd, 2nd, 1st node
RESOLUTIONS = (85, 141, 211, 421)
#: the random field's smoothness and length scale
ALPHA, TAU = 2.0, 3.0
#: the coefficient where psi >= 0 and where psi < 0
A_POS, A_NEG = 12.0, 3.0
#: the version of the generator: part of every cache key (a change regenerates)
_VERSION = 1
_SPLITS = {"train": 0, "test": 1}
#: the largest sample count the loader takes (a guard against absurd requests)
_MAX_SAMPLES = 10**7


class DarcyCacheError(CacheError):
    """A cached Darcy file that fails its checks (checksum, settings, shapes)."""


def darcy_cache_dir(cache_dir=None) -> Path:
    """The folder of the cached Darcy data: ``cache_dir`` if given, else
    ``$OPSPLIT_DATA_DIR``, else ``$XDG_CACHE_HOME/opsplit``, else ``~/.cache/opsplit``
    (then ``darcy/`` inside)."""
    return data_cache_dir("darcy", cache_dir, name="load_darcy.cache_dir")


def grf_scales(s: int, alpha: float = ALPHA, tau: float = TAU, *, name: str = "grf_scales") -> np.ndarray:
    r"""The standard deviations of the cosine coefficients :math:`b_k` of the field,
    :math:`\psi(x, y) = \sum_{k_1, k_2 = 0}^{s - 1} b_k \cos(\pi k_1 x)\cos(\pi k_2 y)`:
    :math:`c_{k_1} c_{k_2}\,\tau^{\alpha - 1}(\pi^2|k|^2 + \tau^2)^{-\alpha/2}`, zero at
    :math:`k = 0`; ``(s, s)``.  (``name``: the caller's, in error messages.)"""
    s = check_int(s, f"{name}.s", 1)
    alpha = check_positive_float(alpha, f"{name}.alpha")
    tau = check_positive_float(tau, f"{name}.tau")
    k = np.arange(s, dtype=np.float64)
    c = np.where(k == 0, 1.0, math.sqrt(2.0))
    k2 = k[:, None] ** 2 + k[None, :] ** 2
    scale = c[:, None] * c[None, :] * tau ** (alpha - 1) * (np.pi**2 * k2 + tau**2) ** (-alpha / 2)
    scale[0, 0] = 0.0
    return scale


def grf_neumann(xi: np.ndarray, alpha: float = ALPHA, tau: float = TAU) -> np.ndarray:
    r"""The field :math:`\psi` (module docstring) at the nodes :math:`(i, j)/(s - 1)` for the
    standard normals ``xi`` of its modes, ``(..., s, s)`` (``xi[..., k1, k2]`` multiplies mode
    :math:`(k_1, k_2)`; ``xi[..., 0, 0]`` is ignored).  Float64, the shape of ``xi``."""
    if not isinstance(xi, np.ndarray) or xi.dtype.kind not in "fiu":
        raise TypeError(f"grf_neumann.xi: expected a real numpy array (..., s, s), got "
                        f"{type(xi).__name__}{'' if not isinstance(xi, np.ndarray) else ' of dtype ' + str(xi.dtype)}")
    if xi.ndim < 2 or xi.shape[-1] != xi.shape[-2] or xi.shape[-1] < 2:
        raise ValueError(f"grf_neumann.xi: expected a square grid of at least 2 x 2 nodes, shape (..., s, s), "
                         f"got {xi.shape}")
    if not np.isfinite(xi).all():
        raise ValueError("grf_neumann.xi: expected finite values, found NaN/inf")
    s = xi.shape[-1]
    b = xi * grf_scales(s, alpha, tau, name="grf_neumann")
    # DCT-I: y_i = x_0 + (-1)^i x_{s-1} + 2 sum_{0<n<s-1} x_n cos(pi i n/(s-1)); halving the
    # inner coefficients makes it the plain sum  sum_n b_n cos(pi i n/(s-1))
    import scipy.fft  # imported on use (~0.3 s): opsplit.data stays quick to import

    w = np.full(s, 0.5)
    w[0] = w[-1] = 1.0
    return scipy.fft.dctn(b * w[:, None] * w[None, :], type=1, axes=(-2, -1))


def _normals(seed: int, split: int, i: int, s: int) -> np.ndarray:
    return np.random.default_rng([seed, split, i]).standard_normal((s, s))


def darcy_pairs(n: int, *, split: str = "train", seed: int = 0, s: int = S, a_pos: float = A_POS,
                a_neg: float = A_NEG, face: str = "arithmetic", start: int = 0) -> tuple[np.ndarray, np.ndarray]:
    r"""Samples ``start .. start + n - 1`` of ``split``: the sign masks :math:`\psi \ge 0`
    (bool ``(n, s, s)``; the coefficient is ``where(mask, a_pos, a_neg)``) and the solutions
    ``u`` (float64 ``(n, s, s)``), see the module docstring."""
    if split not in _SPLITS:
        raise ValueError(f"darcy_pairs.split: expected 'train' or 'test', got {split!r}")
    n = check_int(n, "darcy_pairs.n", 0)
    s = check_int(s, "darcy_pairs.s", MIN_NODES)
    seed = check_int(seed, "darcy_pairs.seed", 0)
    start = check_int(start, "darcy_pairs.start", 0)
    a_pos = check_positive_float(a_pos, "darcy_pairs.a_pos")
    a_neg = check_positive_float(a_neg, "darcy_pairs.a_neg")
    check_choice(face, FACES, "darcy_pairs.face")
    mask = np.empty((n, s, s), dtype=bool)
    u = np.empty((n, s, s))
    for i in range(n):
        mask[i], u[i] = _sample(seed, _SPLITS[split], start + i, s, a_pos, a_neg, face)
    return mask, u


def _sample(seed: int, split: int, i: int, s: int, a_pos: float, a_neg: float, face: str):
    """Sample ``i``: its mask (bool ``(s, s)``) and solution (float64 ``(s, s)``)."""
    mask = grf_neumann(_normals(seed, split, i, s)) >= 0
    return mask, solve_darcy(np.where(mask, a_pos, a_neg), 1.0, face=face)


def _settings(split, seed, n, s, a_pos, a_neg, face) -> dict:
    return {"version": _VERSION, "split": split, "seed": seed, "n": n, "s": s, "a_pos": a_pos, "a_neg": a_neg,
            "face": face, "f": 1.0, "alpha": ALPHA, "tau": TAU,
            "grf": "tau^(alpha-1) (pi^2 |k|^2 + tau^2)^(-alpha/2), cosine modes 0..s-1, constant mode 0",
            "mask": "psi >= 0, numpy.packbits of each sample's s*s nodes (C order)", "u": "float32"}


def _number(v) -> str:
    """A float in a file name, every digit kept (``12.0`` -> ``12``, ``0.1`` -> ``0p1``), so
    two settings never share a name."""
    r = repr(float(v))
    r = r[:-2] if r.endswith(".0") else r
    return r.replace(".", "p").replace("-", "m").replace("+", "")


def _stem(st: dict) -> str:
    return (f"darcy-v{st['version']}-{st['split']}-seed{st['seed']}-n{st['n']}-s{st['s']}"
            f"-a{_number(st['a_pos'])}_{_number(st['a_neg'])}-{st['face']}")


def _family_lock(folder: Path, st: dict):
    """An exclusive advisory lock (``flock``) of one data family — a split, seed, grid,
    contrast and face rule, every ``n`` — held while its files are looked up, read, generated
    and written, so two processes asking for the same data never generate it twice and
    never replace one's files while the other reads or extends them (the second waits and
    reads what the first wrote).  The lock file is ``.<stem without n>.lock`` in the cache
    folder.  Without one (a folder that cannot be written or does not exist yet and cannot
    be made, no ``fcntl``) the files are used unlocked."""
    name = "." + _stem(st).replace(f"-n{st['n']}-", "-") + ".lock"
    return file_lock(folder / name, make_folder=True)


def _spec(st: dict) -> dict:
    n, s = st["n"], st["s"]
    return {"mask": ((n, (s * s + 7) // 8), np.uint8), "u": ((n, s, s), np.float32)}


def _sample_bytes(s: int) -> int:
    """Bytes a sample takes in the cache file: ``u`` float32 and the packed mask."""
    return 4 * s * s + (s * s + 7) // 8


def _factor_bytes(s: int) -> float:
    """Peak memory of one solve: the sparse factors (8-byte values, 4-byte indices, and a
    third again for SuperLU's work space), and the matrix and its pattern."""
    return 16 * factor_entries(s) + 100 * s * s


def _generate(settings: dict, folder: Path, start: int = 0) -> dict:
    """Samples ``start .. n - 1`` of ``settings``, in the stored layout."""
    st = settings
    n, s = st["n"], st["s"]
    need, free = n * _sample_bytes(s) + 4096, free_disk(folder)
    if need > free:
        raise ValueError(f"load_darcy.n_{st['split']}: {n:,} samples at s = {s} take {human_bytes(need)} on "
                         f"disk; the cache folder {str(folder)!r} has {human_bytes(free)} free (pass cache_dir= "
                         f"elsewhere, or fewer samples)")
    out = {"mask": np.empty((n - start, (s * s + 7) // 8), np.uint8), "u": np.empty((n - start, s, s), np.float32)}
    for j in range(n - start):  # sample by sample into the stored arrays: no float64 copy of the set
        mask, u = _sample(st["seed"], _SPLITS[st["split"]], start + j, s, st["a_pos"], st["a_neg"], st["face"])
        out["mask"][j] = np.packbits(mask.ravel())
        out["u"][j] = u
    return out


def load_darcy(resolution: int = 85, *, n_train: int = 1000, n_test: int = 100, s: int = S, seed: int = 0,
               a_pos: float = A_POS, a_neg: float = A_NEG, face: str = "arithmetic", coordinates: bool = False,
               dtype=torch.float32, cache_dir=None, regenerate: bool = False,
               on_corrupt: str = "regenerate") -> tuple[TensorData, TensorData]:
    r"""The Darcy pairs :math:`(a, u)` at ``resolution x resolution`` nodes, train and test.

    Returns two :class:`~opsplit.data.TensorData`: inputs ``(n, N, N)`` — the coefficient
    :math:`a` (``a_pos`` or ``a_neg`` at each node) — or ``(n, N, N, 3)`` with
    ``coordinates=True`` (channels :math:`a, x, y`: the layout of FNO's Darcy script), and
    targets ``(n, N, N)`` — the solution :math:`u`; ``N = resolution``, entry ``[b, i, j]``
    at the node :math:`(x_i, y_j) = (i, j)/(N - 1)` (boundary nodes included, where
    :math:`u = 0`).  The coordinates are left out by default: they are a function of the
    grid, which a model that accepts several grids computes from its own grid, and they would
    triple the inputs' memory.

    Args:
        resolution: nodes per side of the returned grid; ``resolution - 1`` must divide
            ``s - 1`` (85, 141, 211, 421 at ``s = 421``).
        n_train, n_test: numbers of pairs (1,000 and 100: FNO's Darcy script).
        s: nodes per side of the generation grid (421).
        seed: the data seed (see the module docstring).
        a_pos, a_neg: the coefficient where :math:`\psi \ge 0` and where :math:`\psi < 0`
            (12 and 3), finite and ``> 0``.
        face: the coefficient at a face of the finite-difference stencil, ``"arithmetic"``
            (FNO's) or ``"harmonic"`` mean of its nodes.
        coordinates: append the node coordinates to the inputs as two channels.
        dtype: of the returned tensors.
        cache_dir: the cache folder (default: see the module docstring).
        regenerate: ignore the cached files and generate (and cache) again.
        on_corrupt: ``"regenerate"`` (warn and regenerate a file that fails its checks) or
            ``"error"`` (raise :class:`DarcyCacheError`).

    Raises:
        ValueError: before any compute or write, for a request that would not fit in memory
            (the solver's factors or the data) or on the cache's disk, or is absurd
            (over ten million samples), naming the argument.
    """
    n_train = check_int(n_train, "load_darcy.n_train", 1)
    n_test = check_int(n_test, "load_darcy.n_test", 1)
    seed = check_int(seed, "load_darcy.seed", 0)
    s = check_int(s, "load_darcy.s", MIN_NODES)
    resolution = check_int(resolution, "load_darcy.resolution", MIN_NODES)
    a_pos = check_positive_float(a_pos, "load_darcy.a_pos")
    a_neg = check_positive_float(a_neg, "load_darcy.a_neg")
    check_choice(face, FACES, "load_darcy.face")
    check_bool(coordinates, "load_darcy.coordinates")
    dtype = check_dtype_arg(dtype, "load_darcy.dtype") or torch.float32
    check_bool(regenerate, "load_darcy.regenerate")
    if on_corrupt not in ("regenerate", "error"):
        raise ValueError(f"load_darcy.on_corrupt: expected 'regenerate' or 'error', got {on_corrupt!r}")
    if resolution > s or (s - 1) % (resolution - 1):
        ok = [(s - 1) // q + 1 for q in range(1, s - 1) if (s - 1) % q == 0 and (s - 1) // q >= 2][:8]
        raise ValueError(
            f"load_darcy.resolution: expected resolution - 1 to divide s - 1 = {s - 1} (every r-th node of the "
            f"s = {s} grid, r = (s - 1)/(resolution - 1)), e.g. {ok}; got {resolution} (r = "
            f"{(s - 1) / (resolution - 1):.4g})")
    folder = darcy_cache_dir(cache_dir)
    _check_folder(folder, _cache_dir_and_source(cache_dir)[1], "load_darcy")  # a file there: refused now
    # size guards, before any compute or write
    free = available_memory()
    solve = _factor_bytes(s)
    if solve > free or factor_entries(s) >= 2**31:
        raise ValueError(f"load_darcy.s: one solve at s = {s} needs about {human_bytes(solve)} of memory for its "
                         f"sparse factors; {human_bytes(free)} is available")
    for name, n in (("n_train", n_train), ("n_test", n_test)):
        if n > _MAX_SAMPLES:
            raise ValueError(f"load_darcy.{name}: expected at most {_MAX_SAMPLES:,} samples, got {n:,}")
    # the stored arrays and the returned tensors of both splits, the unpacked masks of one
    itemsize = torch.empty((), dtype=dtype).element_size()
    per = _sample_bytes(s) + resolution**2 * (itemsize * (4 if coordinates else 2) + 1)
    need = (n_train + n_test) * per + max(n_train, n_test) * s * s + solve
    if need > free:
        name = "n_train" if n_train >= n_test else "n_test"
        raise ValueError(f"load_darcy.{name}: n_train + n_test = {n_train + n_test:,} samples at s = {s} "
                         f"(returned at {resolution} x {resolution}) need about {human_bytes(need)} of memory; "
                         f"{human_bytes(free)} is available")
    r = (s - 1) // (resolution - 1)
    x = np.linspace(0.0, 1.0, resolution)
    info = {"equation": "-div(a grad u) = 1 on (0, 1)^2, u = 0 on the boundary", "resolution": resolution,
            "stride": r, "layout": "[b, i, j] at (x_i, y_j) = (i, j)/(resolution - 1)" +
            ("; inputs' channels a, x, y" if coordinates else "")}

    def part(split, n):
        st = _settings(split, seed, n, s, float(a_pos), float(a_neg), face)
        with _family_lock(folder, st):
            arrays, stem = cached_arrays(folder, "darcy-", _stem, st, _spec,
                                         lambda st_, start: _generate(st_, folder, start), on_corrupt=on_corrupt,
                                         regenerate=regenerate, extend=True, error=DarcyCacheError,
                                         what="Darcy cache", owner="load_darcy", stacklevel=4)
        mask = np.unpackbits(arrays["mask"], axis=-1, count=s * s).reshape(n, s, s)[:, ::r, ::r]
        a = torch.where(torch.from_numpy(np.ascontiguousarray(mask)).bool(), torch.tensor(a_pos, dtype=dtype),
                        torch.tensor(a_neg, dtype=dtype))
        u = torch.from_numpy(np.ascontiguousarray(arrays["u"][:, ::r, ::r])).to(dtype)
        if coordinates:
            xx = torch.from_numpy(np.stack(np.meshgrid(x, x, indexing="ij"), axis=-1)).to(dtype)
            a = torch.cat([a[..., None], xx.expand(n, -1, -1, -1)], dim=-1)
        cache = None if stem is None else str(stem.parent / (stem.name + ".npz"))
        return TensorData(a, u, name=f"darcy_{split}", info={**info, **st, "cache": cache})

    return part("train", n_train), part("test", n_test)
