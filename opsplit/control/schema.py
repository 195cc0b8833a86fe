"""The versioned JSON schema of a checkpoint's ``meta.json``, and a small validator for the
subset of JSON Schema it uses (``type``, ``required``, ``properties``,
``additionalProperties``, ``items``, ``enum``, ``const``, ``minimum``).

The schema is also written next to every checkpoint's metadata as ``$schema``-style
reference (``schema``, ``schema_version``) and shipped as ``checkpoint_schema.json`` in
this package, for tools outside opsplit.
"""

from __future__ import annotations

import json
from pathlib import Path

__all__ = ["SCHEMA_NAME", "SCHEMA_VERSION", "CHECKPOINT_SCHEMA", "validate", "SchemaError"]

SCHEMA_NAME = "opsplit.checkpoint"
#: bump when the layout of meta.json or of the tensor names changes incompatibly
SCHEMA_VERSION = 1

CHECKPOINT_SCHEMA: dict = json.loads((Path(__file__).with_name("checkpoint_schema.json")).read_text())


class SchemaError(ValueError):
    """``meta.json`` does not follow the checkpoint schema."""


_TYPES = {
    "object": dict,
    "array": list,
    "string": str,
    "boolean": bool,
    "null": type(None),
}


def _is_type(v, t: str) -> bool:
    if t == "integer":
        return isinstance(v, int) and not isinstance(v, bool)
    if t == "number":
        return isinstance(v, (int, float)) and not isinstance(v, bool)
    return isinstance(v, _TYPES[t])


def validate(value, schema: dict | None = None, where: str = "meta") -> None:
    """Raise :class:`SchemaError` naming the first place where ``value`` breaks ``schema``
    (default: the checkpoint schema)."""
    schema = CHECKPOINT_SCHEMA if schema is None else schema
    t = schema.get("type")
    if t is not None:
        types = t if isinstance(t, list) else [t]
        if not any(_is_type(value, x) for x in types):
            raise SchemaError(f"{where}: expected {' or '.join(types)}, got {type(value).__name__}")
    if "const" in schema and value != schema["const"]:
        raise SchemaError(f"{where}: expected {schema['const']!r}, got {value!r}")
    if "enum" in schema and value not in schema["enum"]:
        raise SchemaError(f"{where}: expected one of {schema['enum']}, got {value!r}")
    if "minimum" in schema and _is_type(value, "number") and value < schema["minimum"]:
        raise SchemaError(f"{where}: expected >= {schema['minimum']}, got {value!r}")
    if isinstance(value, dict):
        for k in schema.get("required", []):
            if k not in value:
                raise SchemaError(f"{where}: missing required key {k!r}")
        props = schema.get("properties", {})
        extra = schema.get("additionalProperties", True)
        for k, v in value.items():
            if k in props:
                validate(v, props[k], f"{where}.{k}")
            elif extra is False:
                raise SchemaError(f"{where}: unexpected key {k!r}")
            elif isinstance(extra, dict):
                validate(v, extra, f"{where}.{k}")
    if isinstance(value, list) and "items" in schema:
        for i, v in enumerate(value):
            validate(v, schema["items"], f"{where}[{i}]")
