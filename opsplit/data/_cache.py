"""The cache of generated data sets, shared by the generators that can use it (the Darcy data
now; the Burgers data keeps its own copy of the same scheme and can switch to this one).

A cached set is two files beside each other: ``<stem>.npz`` (the arrays) and ``<stem>.json``
(the generation settings, the arrays' shapes and dtypes, and the SHA-256 of the ``.npz``).
Every read recomputes the checksum and checks the settings, the keys, the shapes, the dtypes
and the finiteness of floating arrays, so a truncated, bit-flipped, edited or foreign file (or
a folder where a file should be) is never used: :func:`cached_arrays` regenerates it (with a
warning) or, with ``on_corrupt="error"``, raises the caller's :class:`CacheError` subclass.
Files are written to a temporary name and renamed, so an interrupted write leaves no
partial file under the final name.  A set of ``n`` samples is read from a cached set of the
same settings with more samples (its prefix) when no exact one exists.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import warnings
from collections.abc import Callable
from pathlib import Path

import numpy as np

from .._files import sha256_of

__all__ = ["CacheError", "cache_root", "data_cache_dir", "read_arrays", "write_arrays", "cached_arrays",
           "free_disk", "file_lock"]


class CacheError(RuntimeError):
    """A cached data file that fails its checks (checksum, settings, shapes)."""


def cache_root() -> Path:
    """``$OPSPLIT_DATA_DIR`` if set, else ``$XDG_CACHE_HOME/opsplit``, else
    ``~/.cache/opsplit``."""
    env = os.environ.get("OPSPLIT_DATA_DIR")
    if env:
        return Path(env)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "opsplit"


def data_cache_dir(subdir: str, cache_dir=None, *, name: str = "cache_dir") -> Path:
    """``cache_dir`` if given (a path; ``name`` is the argument's name in the error), else
    :func:`cache_root` / ``subdir``."""
    if cache_dir is not None:
        if isinstance(cache_dir, bytes) or not isinstance(cache_dir, (str, os.PathLike)):
            raise TypeError(f"{name}: expected a path or None, got {type(cache_dir).__name__}")
        return Path(cache_dir)
    return cache_root() / subdir


def free_disk(folder: Path) -> float:
    """Free bytes on the file system that holds ``folder`` (or its nearest existing parent);
    infinity when it cannot be read."""
    p = Path(folder).absolute()
    while not p.exists() and p != p.parent:
        p = p.parent
    try:
        return float(shutil.disk_usage(p).free)
    except OSError:
        return float("inf")


def _open_lock_file(path: Path, modes: tuple[str, ...], make_folder: bool):
    try:
        if make_folder:
            path.parent.mkdir(parents=True, exist_ok=True)
    except OSError:
        return None
    for mode in modes:
        try:
            return open(path, mode)
        except OSError:
            continue
    return None


@contextlib.contextmanager
def file_lock(path: Path, *, exclusive: bool = True, modes: tuple[str, ...] = ("ab",), make_folder: bool = False):
    """An advisory lock (``flock``) of the file ``path``, exclusive or shared, held for the
    ``with`` block.  The file is opened with the first of ``modes`` that succeeds (``"ab"``
    creates it; ``"rb"`` after it still locks an existing file in a folder that cannot be
    written), after making its folder with ``make_folder``.  Without a lock file (none of the
    modes opens it, the folder cannot be made, no ``fcntl``) or on a file system without
    locks, the block runs unlocked."""
    try:
        import fcntl  # POSIX only
    except ImportError:  # pragma: no cover - not POSIX
        yield
        return
    fh = _open_lock_file(path, modes, make_folder)
    try:
        if fh is not None:
            try:
                fcntl.flock(fh.fileno(), fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
            except OSError:  # a file system without locks
                pass
        yield
    finally:
        if fh is not None:
            fh.close()


def _path(stem: Path, suffix: str) -> Path:
    return stem.parent / (stem.name + suffix)


def read_arrays(stem: Path, settings: dict, spec: dict, *, error: type[CacheError] = CacheError,
                what: str = "cache") -> dict:
    """The arrays of the cached ``stem`` after every check, else ``error``.

    Args:
        stem: the files' path without suffix.
        settings: the settings the file must have been generated with (compared whole).
        spec: ``{key: (shape, dtype)}`` of the arrays the file must hold (and nothing else).
        error: the :class:`CacheError` subclass raised.
        what: the data's name in messages (``"Darcy cache"``).
    """
    data, meta = _path(stem, ".npz"), _path(stem, ".json")
    try:
        info = json.loads(meta.read_text())
    except (OSError, ValueError) as e:
        raise error(f"{what} {str(meta)!r}: unreadable metadata ({type(e).__name__}: {e})") from None
    if not isinstance(info, dict) or info.get("settings") != settings:
        got = info.get("settings") if isinstance(info, dict) else info
        raise error(f"{what} {str(meta)!r}: its settings {got} are not the requested {settings}")
    try:
        digest = sha256_of(data)
    except OSError as e:  # missing, a folder, unreadable
        raise error(f"{what} {str(data)!r}: unreadable ({type(e).__name__}: {e})") from None
    if digest != info.get("sha256"):
        raise error(f"{what} {str(data)!r}: checksum mismatch (SHA-256 {digest[:16]}..., recorded "
                    f"{str(info.get('sha256'))[:16]}...): the file was truncated or edited")
    try:
        with np.load(data, allow_pickle=False) as z:
            if sorted(z.files) != sorted(spec):
                raise ValueError(f"holds {sorted(z.files)}, expected {sorted(spec)}")
            arrays = {k: np.asarray(z[k]) for k in spec}
    except Exception as e:  # a file that matches its checksum but is no npz of ours
        raise error(f"{what} {str(data)!r}: unreadable ({type(e).__name__}: {e})") from None
    for k, (shape, dtype) in spec.items():
        arr = arrays[k]
        if arr.shape != tuple(shape) or arr.dtype != np.dtype(dtype):
            raise error(f"{what} {str(data)!r}: {k} has shape {arr.shape} and dtype {arr.dtype}, expected "
                        f"{tuple(shape)} {np.dtype(dtype)}")
        if arr.dtype.kind == "f" and not np.isfinite(arr).all():
            raise error(f"{what} {str(data)!r}: {k} holds NaN/inf")
    return arrays


def write_arrays(stem: Path, settings: dict, arrays: dict) -> None:
    """Write ``arrays`` and their metadata under ``stem`` (temporary names, then renamed)."""
    stem.parent.mkdir(parents=True, exist_ok=True)
    tmp = stem.parent / f".{stem.name}.{os.getpid()}.tmp.npz"
    tmpj = stem.parent / f".{stem.name}.{os.getpid()}.tmp.json"
    try:
        np.savez(tmp, **arrays)
        digest = sha256_of(tmp)
        os.replace(tmp, _path(stem, ".npz"))
        tmpj.write_text(json.dumps({"settings": settings, "sha256": digest,
                                    "arrays": {k: [list(v.shape), str(v.dtype)] for k, v in arrays.items()}},
                                   indent=1))
        os.replace(tmpj, _path(stem, ".json"))
    finally:
        for t in (tmp, tmpj):
            if t.is_file():
                t.unlink()


def cached_arrays(folder: Path, prefix: str, stem_of: Callable[[dict], str], settings: dict,
                  spec_of: Callable[[dict], dict], generate: Callable[[dict, int], dict], *, count: str = "n",
                  on_corrupt: str = "regenerate", regenerate: bool = False, extend: bool = False,
                  error: type[CacheError] = CacheError, what: str = "cache", owner: str = "load",
                  stacklevel: int = 3) \
        -> tuple[dict, Path | None]:
    """The arrays of ``settings``: read from the cache (the exact file, else the prefix of the
    smallest cached set with the same settings and more samples), else generated and written.

    Args:
        folder: the cache folder.
        prefix: the file names' prefix (``"darcy-"``), for the search of other sets.
        stem_of: the file name (no suffix) of a settings dict.
        settings: the generation settings; ``settings[count]`` is the number of samples, the
            first dimension of every array.
        spec_of: ``{key: (shape, dtype)}`` of a settings dict.
        generate: ``(settings, start) -> arrays`` of samples ``start .. settings[count] - 1``.
        on_corrupt: ``"regenerate"`` (warn, generate, rewrite) or ``"error"`` (raise
            ``error``) for a file that fails its checks.
        regenerate: ignore the cached files.
        extend: samples are generated independently of each other (sample ``i`` the same
            whatever the set's size): the largest cached set with fewer samples is read and
            only the samples after it are generated.
        owner: the public function's name, in messages.
        stacklevel: of the warnings, counted from the ``warnings.warn`` line (3: the caller of
            this function's caller).

    Returns:
        ``(arrays, stem)``: ``stem`` is the file the arrays came from or were written to,
        ``None`` when the write failed (a warning says why; the arrays are used uncached).
    """
    n = settings[count]
    stem = folder / stem_of(settings)
    exact = _path(stem, ".npz"), _path(stem, ".json")
    if not regenerate and any(os.path.lexists(p) for p in exact):
        try:
            return read_arrays(stem, settings, spec_of(settings), error=error, what=what), stem
        except CacheError as e:
            if on_corrupt == "error":
                raise error(f"{e}; delete the file or call {owner}(..., regenerate=True)") from None
            warnings.warn(f"{e}; regenerating it", stacklevel=stacklevel)
    larger, smaller = [], []
    if not regenerate and folder.is_dir():
        others = {k: v for k, v in settings.items() if k != count}
        for meta in folder.glob(f"{prefix}*.json"):
            try:
                other = json.loads(meta.read_text())["settings"]
                n_other = other[count]
                same = {k: v for k, v in other.items() if k != count} == others
            except (OSError, ValueError, KeyError, TypeError, AttributeError):
                continue
            if not same or isinstance(n_other, bool) or not isinstance(n_other, int) or n_other < 1 \
                    or meta.parent / meta.stem == stem:
                continue
            (larger if n_other >= n else smaller).append((n_other, str(meta), other))
    for _, meta, other in sorted(larger):  # the smallest larger set first: the least to read
        try:
            arrays = read_arrays(Path(meta[:-5]), other, spec_of(other), error=error, what=what)
        except CacheError:
            continue
        return {k: v[:n] for k, v in arrays.items()}, Path(meta[:-5])
    head = None
    for _, meta, other in sorted(smaller, reverse=True) if extend else ():
        try:
            head = read_arrays(Path(meta[:-5]), other, spec_of(other), error=error, what=what)
            break
        except CacheError:
            continue
    if head is None:
        arrays = generate(settings, 0)
    else:
        start = len(next(iter(head.values())))
        tail = generate(settings, start)
        arrays = {k: np.concatenate([head[k], tail[k]]) for k in head}
        del head, tail
    try:
        write_arrays(stem, settings, arrays)
    except OSError as e:
        warnings.warn(f"{owner}: could not write the cache {str(stem)!r} ({type(e).__name__}: {e}); the data "
                      f"is used uncached", stacklevel=stacklevel)
        return arrays, None
    return arrays, stem
