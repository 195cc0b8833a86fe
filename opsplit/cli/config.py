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

__all__ = ["ConfigError", "Field", "library_field", "load", "dump_toml", "check_choice", "seed_field", "MAX_SEED",
           "TOP", "read_top", "describe", "accepted", "distinct", "both", "at_least", "between", "positive"]

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
    # a value the library checks (a TrainConfig field, an Objective weight): passed on as it is
    "library": ("", lambda v: True),
}


@dataclass(frozen=True)
class Field:
    """One config key.

    Args:
        kind: ``"int"``, ``"float"``, ``"bool"``, ``"str"``, ``"int_list"``,
            ``"float_list"``, ``"str_list"``, or ``"library"``: a value the command passes on
            as it is to the library object whose field the key sets (``TrainConfig``,
            ``Objective``), which checks it (:func:`library_field`).
        default: its value when neither the file nor a flag sets it (``None``: unset, the
            library's default; such a key is left out of the printed config).
        help: what it means (shown in error messages and ``--help``).
        check: ``check(value) -> str | None``: a description of what was expected when the
            value is out of range, else ``None``.
        choices: the allowed values (of a string, or of each list element).
        accepts: the accepted values in words, for ``--help`` (default: from ``kind``,
            ``choices``).
        derive: ``derive(cfg) -> value``: the default computed from the other keys (checked
            like a given value) when neither the file nor a flag sets the key; ``default``
            is then what ``--help`` shows.
    """

    kind: str
    default: object
    help: str = ""
    check: Callable | None = None
    choices: tuple | None = None
    accepts: str | None = None
    derive: Callable | None = None

    def validate(self, value, name: str):
        desc, test = _KINDS[self.kind]
        if self.kind == "float" and _is_int(value):
            value = float(value)
        if self.kind == "float_list" and isinstance(value, list):
            value = [float(x) if _is_int(x) else x for x in value]
        if not test(value):
            raise ConfigError(f"{name}: expected {desc}, got {_short(value)} ({type(value).__name__})")
        if self.choices is not None and (self.kind != "library" or isinstance(value, (str, list))):
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


def library_field(spec, default=None, help: str | None = None, *, choices: tuple | None = None) -> Field:
    """The key of a library object's field (``spec``: a
    :class:`~opsplit.control.config.ConfigField` of ``TrainConfig.schema()``): its value
    is checked by the library, its help and accepted values are the library's; ``default``
    (``None``: the field's own) and ``choices`` (a subset of the field's, where a task's
    model takes fewer: checked here) are the task's."""
    default = spec.default if default is None else default
    shown = spec.accepts
    if choices is None and spec.choices is not None:  # the library's names, as --help lists choices
        shown = ("each of " if isinstance(default, list) else "") + ", ".join(map(str, spec.choices))
    return Field("library", default, help or spec.doc, choices=choices, accepts=None if choices else shown)


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


def distinct(v):
    """A check: no list element given twice."""
    dup = sorted({x for x in v if v.count(x) > 1})
    return None if not dup else f"distinct values ({', '.join(map(repr, dup))} given more than once)"


def both(*checks):
    """A check: every one of ``checks``."""
    def check(v):
        return next((m for m in (c(v) for c in checks) if m), None)

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


def load(schema: dict, path=None, overrides: dict | None = None, *, data: dict | None = None,
         renamed: dict | None = None) -> dict:
    """The checked config: defaults, then the TOML file ``path`` (or the dict ``data``), then
    ``overrides`` (``{"section.key": value}``, ``None`` values ignored); a key of ``renamed``
    (``{"section.old": "section.new"}``) is refused naming its new name."""
    cfg = {s: {k: copy.deepcopy(f.default) for k, f in keys.items()} for s, keys in schema.items()}
    given = set()
    raw = read_toml(path) if path is not None else (data or {})
    for section, values in raw.items():
        if TOP in schema and section in schema[TOP] and not isinstance(values, dict):
            cfg[TOP][section] = values
            given.add((TOP, section))
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
                new = (renamed or {}).get(f"{section}.{key}")
                if new is not None:
                    raise ConfigError(f"{section}.{key}: renamed {new} (the name of what it sets); expected "
                                      f"{new.split('.')[1]} = ... under [{new.split('.')[0]}]")
                raise ConfigError(
                    f"{section}.{key}: unknown key; [{section}] accepts "
                    f"{', '.join(schema[section])}"
                )
            cfg[section][key] = value
            given.add((section, key))
    for name, value in (overrides or {}).items():
        if value is None:
            continue
        section, key = name.split(".", 1)
        cfg[section][key] = value
        given.add((section, key))
    derived = []
    for section, keys in schema.items():
        for key, f in keys.items():
            if f.derive is not None and (section, key) not in given:
                derived.append((section, key, f))
                continue
            if cfg[section][key] is not None or (section, key) in given:
                cfg[section][key] = f.validate(cfg[section][key], _name(section, key))
    for section, key, f in derived:  # from the checked values of the other keys
        cfg[section][key] = f.validate(f.derive(cfg), _name(section, key))
    return cfg


def _name(section: str, key: str) -> str:
    return f"{section}.{key}" if section != TOP else key


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


def _toml_line(k: str, v) -> str:
    # a key left unset (None: the library's default) is shown as a comment
    return f"# {k}: unset" if v is None else f"{k} = {_toml_value(v)}"


def dump_toml(cfg: dict) -> str:
    """A config as TOML text (what each run writes to ``config.toml`` in its folder)."""
    out = [_toml_line(k, v) for k, v in cfg.get(TOP, {}).items()]
    if out:
        out.append("")
    for section, values in cfg.items():
        if section == TOP:
            continue
        out.append(f"[{section}]")
        out += [_toml_line(k, v) for k, v in values.items()]
        out.append("")
    return "\n".join(out)


def accepted(f: Field) -> str:
    """What a key accepts, in words: its choices, or the library's description of its field."""
    if f.choices is not None:
        each = "each of " if f.kind.endswith("_list") or isinstance(f.default, list) else ""
        return each + ", ".join(map(str, f.choices))
    return f.accepts or _KINDS[f.kind][0]


def describe(schema: dict) -> str:
    """The schema as an annotated TOML example (for ``--help``): each key with its default,
    its help and, in brackets, the values it accepts (:func:`accepted`)."""
    def line(k, f):
        value = "(unset)" if f.default is None else _toml_value(f.default)
        return f"  {k} = {value}   # " + (f"{f.help} " if f.help else "") + f"[{accepted(f)}]"

    out = [line(k, f) for k, f in schema.get(TOP, {}).items()]
    for section, keys in schema.items():
        if section == TOP:
            continue
        out.append(f"  [{section}]")
        out += [line(k, f) for k, f in keys.items()]
    return "\n".join(out)
