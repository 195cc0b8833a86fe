"""Configs of the ``opsplit`` command: a small TOML file and/or flags, checked against a
schema before any work starts.

A schema is ``{section: {key: Field}}``; the section :data:`TOP` (``""``) holds the keys that
stand before any section header (``task = "text"`` of ``opsplit train``).  :func:`load` merges, in order, the schema's
defaults, a TOML file and the flags given on the command line, then checks every value:
an unknown section or key, a value of the wrong type, or a value outside its range raises
:class:`ConfigError` naming ``section.key`` and what was expected.
"""

from __future__ import annotations

import copy
import math
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

__all__ = ["ConfigError", "Field", "load", "dump_toml", "check_choice", "seed_field", "MAX_SEED", "TOP",
           "read_top"]

#: the schema section of the keys outside any [section] (top-level TOML keys)
TOP = ""


class ConfigError(ValueError):
    """A config value that cannot be used; the message names the key and what was expected."""


#: TOML integers are 64-bit (Python's parser reads larger ones; torch cannot hold them)
_INT_LIMIT = 2**63
#: seeds are 32-bit (torch.Generator takes 64 bits, but the trainer derives per-epoch seeds
#: from them by multiplication)
MAX_SEED = 2**32 - 1


# kind -> (description, test)
def _is_int(v):
    return isinstance(v, int) and not isinstance(v, bool) and -_INT_LIMIT <= v < _INT_LIMIT


def _is_num(v):
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return False
    return math.isfinite(v) if isinstance(v, float) else -_INT_LIMIT <= v < _INT_LIMIT


def _positive_list(v) -> bool:
    return isinstance(v, list) and len(v) > 0 and all(_is_num(x) and x > 0 for x in v)


_KINDS: dict[str, tuple[str, Callable]] = {
    "int": ("an integer (64-bit)", _is_int),
    "float": ("a finite number", _is_num),
    "bool": ("true or false", lambda v: isinstance(v, bool)),
    "str": ("a string", lambda v: isinstance(v, str)),
    "int_list": (
        "a non-empty list of integers (64-bit)",
        lambda v: isinstance(v, list) and len(v) > 0 and all(_is_int(x) for x in v),
    ),
    "float_list": (
        "a non-empty list of finite numbers",
        lambda v: isinstance(v, list) and len(v) > 0 and all(_is_num(x) for x in v),
    ),
    "str_list": (
        "a non-empty list of strings",
        lambda v: isinstance(v, list) and len(v) > 0 and all(isinstance(x, str) for x in v),
    ),
    # the weights of a draw: by cost, uniform, or given
    "weights": (
        "'cost', 'uniform' or a non-empty list of positive numbers",
        lambda v: v in ("cost", "uniform") if isinstance(v, str) else _positive_list(v),
    ),
    # the objective's weights of a split batch's parts: their shares of the windows, or given
    "split_weights": (
        "'shares' or a non-empty list of positive numbers",
        lambda v: v == "shares" if isinstance(v, str) else _positive_list(v),
    ),
}


@dataclass(frozen=True)
class Field:
    """One config key.

    Args:
        kind: ``"int"``, ``"float"``, ``"bool"``, ``"str"``, ``"int_list"``,
            ``"float_list"``, ``"str_list"``, ``"weights"`` (``"cost"``, ``"uniform"`` or a
            list of positive numbers) or ``"split_weights"`` (``"shares"`` or a list of positive
            numbers).
        default: its value when neither the file nor a flag sets it.
        help: what it means (shown in error messages and ``--help``).
        check: ``check(value) -> str | None``: a description of what was expected when the
            value is out of range, else ``None``.
        choices: the allowed values (of a string, or of each list element).
    """

    kind: str
    default: object
    help: str = ""
    check: Callable | None = None
    choices: tuple | None = None

    def validate(self, value, name: str):
        desc, test = _KINDS[self.kind]
        if self.kind == "float" and _is_int(value):
            value = float(value)
        if self.kind in ("float_list", "weights", "split_weights") and isinstance(value, list):
            value = [float(x) if _is_int(x) else x for x in value]
        if not test(value):
            raise ConfigError(f"{name}: expected {desc}, got {_short(value)} ({type(value).__name__})")
        if self.choices is not None:
            items = value if isinstance(value, list) else [value]
            bad = [x for x in items if x not in self.choices]
            if bad:
                raise ConfigError(
                    f"{name}: expected {'each of ' if isinstance(value, list) else ''}one of "
                    f"{', '.join(map(repr, self.choices))}, got {bad[0]!r}"
                )
        if self.check is not None:
            msg = self.check(value)
            if msg:
                raise ConfigError(f"{name}: expected {msg}, got {value!r}")
        return value


def _short(v) -> str:
    r = repr(v)
    return r if len(r) <= 60 else r[:40] + " ... " + r[-12:]


def between(lo, hi, what: str = "a value"):
    """A check: a number (or every list element) in ``[lo, hi]``."""

    def check(v):
        items = v if isinstance(v, list) else [v]
        return None if all(lo <= x <= hi for x in items) else f"{what} from {lo} to {hi}"

    return check


def seed_field(help: str) -> Field:
    """A seed key: an integer from 0 to :data:`MAX_SEED`."""
    return Field("int", 0, help, between(0, MAX_SEED, "a seed"))


def at_least(lo):
    """A check: a number (or every list element) ``>= lo``."""

    def check(v):
        items = v if isinstance(v, list) else [v]
        return None if all(x >= lo for x in items) else (
            f"{'values' if isinstance(v, list) else 'a value'} >= {lo}"
        )

    return check


def positive(v):
    items = v if isinstance(v, list) else [v]
    return None if all(x > 0 for x in items) else "a value > 0"


def check_choice(value, choices, name):
    if value not in choices:
        raise ConfigError(f"{name}: expected one of {', '.join(map(repr, choices))}, got {value!r}")
    return value


def read_toml(path) -> dict:
    path = Path(path)
    if path.is_dir():
        raise ConfigError(f"config: expected a TOML file, {str(path)!r} is a folder")
    if not path.is_file():
        raise ConfigError(f"config: no such file {str(path)!r}")
    try:
        raw = path.read_bytes()
    except OSError as e:
        raise ConfigError(f"config: cannot read {str(path)!r}: {e.strerror or e}") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ConfigError(f"config: {str(path)!r} is not a TOML file (not UTF-8 text: byte "
                          f"{raw[e.start]:#04x} at offset {e.start})") from None
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"config: {path} is not valid TOML: {e}") from None


def load(schema: dict, path=None, overrides: dict | None = None, *, data: dict | None = None) -> dict:
    """The checked config: defaults, then the TOML file ``path`` (or the dict ``data``), then
    ``overrides`` (``{"section.key": value}``, ``None`` values ignored)."""
    cfg = {s: {k: copy.deepcopy(f.default) for k, f in keys.items()} for s, keys in schema.items()}
    raw = read_toml(path) if path is not None else (data or {})
    for section, values in raw.items():
        if TOP in schema and section in schema[TOP] and not isinstance(values, dict):
            cfg[TOP][section] = values
            continue
        if section not in schema and not isinstance(values, dict):
            top = f" (top-level keys: {', '.join(schema[TOP])})" if TOP in schema else ""
            raise ConfigError(
                f"config: key {section!r} is outside any section; expected it under one of "
                f"{', '.join('[' + s + ']' for s in schema if s != TOP)}{top}"
            )
        if section not in schema:
            raise ConfigError(
                f"config: unknown section [{section}]; expected one of "
                f"{', '.join('[' + s + ']' for s in schema if s != TOP)}"
            )
        if not isinstance(values, dict):
            raise ConfigError(f"config: [{section}] must be a table of keys, got {values!r}")
        for key, value in values.items():
            if key not in schema[section]:
                raise ConfigError(
                    f"{section}.{key}: unknown key; [{section}] accepts "
                    f"{', '.join(schema[section])}"
                )
            cfg[section][key] = value
    for name, value in (overrides or {}).items():
        if value is None:
            continue
        section, key = name.split(".", 1)
        cfg[section][key] = value
    for section, keys in schema.items():
        for key, f in keys.items():
            cfg[section][key] = f.validate(cfg[section][key], f"{section}.{key}" if section != TOP else key)
    return cfg


def read_top(path, key: str, default=None):
    """The top-level ``key`` of the TOML file ``path`` (``default`` when absent), read
    before the schema is known (``opsplit train`` picks its task's schema by it)."""
    value = read_toml(path).get(key, default)
    return default if isinstance(value, dict) else value


#: TOML's short escapes; every other control character is written as \uXXXX
_ESCAPES = {"\\": "\\\\", '"': '\\"', "\b": "\\b", "\t": "\\t", "\n": "\\n", "\f": "\\f", "\r": "\\r"}


def _toml_string(v: str) -> str:
    """A TOML basic string: quotes, backslashes and control characters (U+0000-U+001F,
    U+007F: a newline in ``generate.prompt``) escaped, so that the text reads back equal."""
    return '"' + "".join(_ESCAPES.get(c) or (f"\\u{ord(c):04X}" if ord(c) < 0x20 or ord(c) == 0x7F else c)
                         for c in v) + '"'


def _toml_value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str):
        return _toml_string(v)
    if isinstance(v, float):
        return repr(v)
    if isinstance(v, list):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    return str(v)


def dump_toml(cfg: dict) -> str:
    """A config as TOML text (what each run writes to ``config.toml`` in its folder)."""
    out = [f"{k} = {_toml_value(v)}" for k, v in cfg.get(TOP, {}).items()]
    if out:
        out.append("")
    for section, values in cfg.items():
        if section == TOP:
            continue
        out.append(f"[{section}]")
        out += [f"{k} = {_toml_value(v)}" for k, v in values.items()]
        out.append("")
    return "\n".join(out)


def describe(schema: dict) -> str:
    """The schema as an annotated TOML example (for ``--help``)."""
    out = [f"  {k} = {_toml_value(f.default)}" + (f"   # {f.help}" if f.help else "")
           for k, f in schema.get(TOP, {}).items()]
    for section, keys in schema.items():
        if section == TOP:
            continue
        out.append(f"  [{section}]")
        for k, f in keys.items():
            out.append(f"  {k} = {_toml_value(f.default)}" + (f"   # {f.help}" if f.help else ""))
    return "\n".join(out)
