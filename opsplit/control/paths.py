"""Paths of output folders and checkpoints, checked before anything is computed or written."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

__all__ = ["check_path", "check_out_dir"]


def check_path(path, name: str) -> Path:
    """``path`` as a ``Path``: a non-empty ``str`` or ``os.PathLike`` (``TypeError`` /
    ``ValueError`` naming ``name`` otherwise)."""
    if isinstance(path, bool) or not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"{name}: expected a folder path (str or os.PathLike), got {type(path).__name__}")
    if str(path) == "":
        raise ValueError(f"{name}: expected a folder path, got an empty string")
    return Path(path)


def check_out_dir(path, name: str = "out_dir") -> Path:
    """``path`` as a ``Path`` if a run could write its output folder there (``ValueError`` /
    ``TypeError`` naming ``name`` otherwise) — checked before any training, so that an
    unwritable folder does not fail the run after its last step.  Refused: a path that
    is not a ``str`` / ``os.PathLike``, an empty one, an existing file, a path inside a file,
    and a folder (or, if it does not exist yet, its nearest existing parent) in which no
    entry can be created (tested by creating and removing a temporary folder there: works
    for read-only mounts and for root).  Nothing is left behind."""
    p = check_path(path, name)
    if p.exists() and not p.is_dir():
        raise ValueError(f"{name}: {str(p)!r} is a file, expected a folder (or a path to create one)")
    anc = p
    while not anc.exists() and anc != anc.parent:
        anc = anc.parent
    if not anc.is_dir():
        raise ValueError(f"{name}: {str(p)!r} cannot be created: {str(anc)!r} is a file, not a folder")
    try:
        probe = tempfile.mkdtemp(prefix=".opsplit-write-test-", dir=anc)
        os.rmdir(probe)
    except OSError as e:
        raise ValueError(f"{name}: {str(p)!r} is not writable: cannot create entries in {str(anc)!r} "
                         f"({e.strerror or e})") from None
    return p
