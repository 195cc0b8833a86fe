"""Reading a checkpoint folder: :func:`read_checkpoint` verifies ``meta.json`` (schema,
version, digest) and ``state.safetensors`` (size, SHA-256, tensor index) and returns a
:class:`Checkpoint` held in memory; :func:`latest_checkpoint` finds the newest one of a run."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import safetensors.torch as st

from .checkpoint_meta import (
    META_DIGEST_KEY,
    META_FILE,
    TENSORS_FILE,
    CheckpointError,
    header_metadata,
    meta_digest,
)
from .paths import check_path
from .schema import SCHEMA_NAME, SCHEMA_VERSION, SchemaError, validate

__all__ = ["Checkpoint", "read_checkpoint", "latest_checkpoint"]


def latest_checkpoint(folder) -> Path | None:
    """The complete checkpoint folder with the highest step under ``folder`` (``step-*``
    folders holding a ``meta.json``), or ``folder`` itself if it is one; ``None`` if none."""
    folder = check_path(folder, "latest_checkpoint.folder")
    if (folder / META_FILE).is_file():
        return folder
    for sub in (folder, folder / "checkpoints"):
        if not sub.is_dir():
            continue
        cands = []
        for p in sub.iterdir():
            if p.is_dir() and p.name.startswith("step-") and (p / META_FILE).is_file():
                try:
                    cands.append((int(p.name[5:]), p))
                except ValueError:
                    continue
        if cands:
            return max(cands)[1]
    return None


class Checkpoint:
    """A checkpoint read and verified in memory: ``meta`` (dict) and ``tensors`` (name ->
    tensor).  Nothing is applied to any model."""

    def __init__(self, path: Path, meta: dict, tensors: dict):
        self.path, self.meta, self.tensors = path, meta, tensors
        self.resampled: list[str] = []  # set by load_checkpoint
        self.changes: list = []  # SettingChange rows, set by load_checkpoint

    @property
    def trainer(self) -> dict | None:
        return self.meta["trainer"]

    @property
    def config(self) -> dict | None:
        return self.meta["config"]

    def model_state(self) -> dict:
        return {k[len("model."):]: v for k, v in self.tensors.items() if k.startswith("model.")}


def read_checkpoint(path) -> Checkpoint:
    """Read and verify a checkpoint folder (schema, version, size, SHA-256, tensor index);
    raises :class:`CheckpointError` naming the problem."""
    path = check_path(path, "read_checkpoint.path")
    if not path.is_dir():
        raise CheckpointError(f"checkpoint {str(path)!r}: not a folder (expected a folder with {META_FILE} "
                              f"and {TENSORS_FILE})")
    mfile = path / META_FILE
    if not mfile.is_file():
        raise CheckpointError(f"checkpoint {str(path)!r}: no {META_FILE} (incomplete or not a checkpoint)")
    try:
        meta = json.loads(mfile.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise CheckpointError(f"checkpoint {str(path)!r}: {META_FILE} is not valid JSON (corrupted or "
                              f"truncated): {e}") from None
    if not isinstance(meta, dict) or meta.get("schema") != SCHEMA_NAME:
        raise CheckpointError(f"checkpoint {str(path)!r}: {META_FILE} is not an opsplit checkpoint "
                              f"(schema {meta.get('schema') if isinstance(meta, dict) else None!r}, "
                              f"expected {SCHEMA_NAME!r})")
    ver = meta.get("schema_version")
    if ver != SCHEMA_VERSION:
        raise CheckpointError(f"checkpoint {str(path)!r}: schema_version {ver!r}; this opsplit reads "
                              f"version {SCHEMA_VERSION}")
    try:
        validate(meta)
    except SchemaError as e:
        raise CheckpointError(f"checkpoint {str(path)!r}: {META_FILE} does not follow the schema: {e}") from None
    tfile = path / meta["tensors_file"]
    if not tfile.is_file():
        raise CheckpointError(f"checkpoint {str(path)!r}: tensor file {meta['tensors_file']!r} is missing")
    data = tfile.read_bytes()
    if len(data) != meta["tensors_bytes"]:
        raise CheckpointError(
            f"checkpoint {str(path)!r}: {meta['tensors_file']} has {len(data)} bytes, {META_FILE} records "
            f"{meta['tensors_bytes']} (truncated or replaced)"
        )
    if hashlib.sha256(data).hexdigest() != meta["tensors_sha256"]:
        raise CheckpointError(
            f"checkpoint {str(path)!r}: {meta['tensors_file']} does not match its SHA-256 in {META_FILE} "
            "(corrupted)"
        )
    recorded = header_metadata(data).get(META_DIGEST_KEY)
    if recorded is not None and recorded != meta_digest(meta):  # (checkpoints written before it: none)
        raise CheckpointError(
            f"checkpoint {str(path)!r}: {META_FILE} was changed after the checkpoint was written (its contents do not "
            f"match the SHA-256 recorded in {meta['tensors_file']}); an edited checkpoint is not resumed: its "
            "counters, optimizer and schedule settings would disagree with its state. Nothing was loaded")
    try:
        tensors = st.load(data)
    except Exception as e:  # safetensors raises its own error types
        raise CheckpointError(f"checkpoint {str(path)!r}: cannot read {meta['tensors_file']}: {e}") from None
    if set(tensors) != set(meta["tensors"]):
        missing = sorted(set(meta["tensors"]) - set(tensors))[:5]
        extra = sorted(set(tensors) - set(meta["tensors"]))[:5]
        raise CheckpointError(f"checkpoint {str(path)!r}: tensor index mismatch (missing {missing}, "
                              f"unexpected {extra})")
    for k, v in tensors.items():
        rec = meta["tensors"][k]
        if list(v.shape) != rec["shape"] or str(v.dtype).replace("torch.", "") != rec["dtype"]:
            raise CheckpointError(f"checkpoint {str(path)!r}: tensor {k!r} is {tuple(v.shape)} "
                                  f"{v.dtype}, {META_FILE} records {rec}")
    return Checkpoint(path, meta, tensors)
