"""File helpers shared by the layers that write files (data caches, checkpoints)."""

import hashlib
from pathlib import Path


def sha256_of(path: Path) -> str:
    """The SHA-256 hex digest of a file's bytes, read in 1 MiB chunks."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()
