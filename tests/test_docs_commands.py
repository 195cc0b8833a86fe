"""Every command quoted in the docs still runs as written: the ``python benchmarks/X.py ...``,
``opsplit ...`` and ``python -m ...`` commands of docs/ (guides and experiments pages),
README.md and benchmarks/README.md, in code blocks and inline code.

* a benchmark script it names exists, and so does a module run with ``python -m``;
* a benchmark script defines its arguments with argparse (its ``--help`` answers without
  running it), and every flag a command passes is one the script's (or the ``opsplit``
  subcommand's) parser defines, spelled out (not an abbreviation argparse would guess); a
  command without placeholders (``N``, ``DIR``, ``<...>``, ``[...]``, ``...``, ``a|b``)
  parses as a whole: the values' types, choices and counts too.  The parsers are the
  scripts' own, taken at their ``parse_args`` call in one process (the scripts run up to
  that call and no further);
* ``opsplit <job> ... --print-config`` accepts each command of a job that takes a config (the
  config's checks, the model built, nothing run); a command the page shows refused (the
  ``opsplit <job>: error: ...`` line under it) is refused naming the same key (exit 2, or
  for a refusal of the job's size or cost the note ``--print-config`` prints).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import io
import json
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAGES = sorted((ROOT / "docs").rglob("*.md")) + [ROOT / "README.md", ROOT / "benchmarks" / "README.md"]

#: commands quoted in prose (no error line under them) that the page says are refused, with
#: the start of the message they stop with
REFUSED_IN_PROSE = {
    "opsplit solve --rtol 1e-15": "opsplit solve: error: solve.rtol = 1e-15:",
}


@dataclass
class Command:
    page: str
    line: int
    text: str  # as quoted, from the program's name on
    argv: list[str]  # the arguments after the script / module / `opsplit`
    kind: str  # "benchmark", "opsplit" or "module"
    target: str  # the script's path, the module, or "opsplit"
    placeholders: bool
    error: str | None = None  # the error line the page shows under it
    writes: str | None = None  # `> FILE`: the file its output goes to
    flags: list[str] = field(default_factory=list)

    def __str__(self):
        return f"{self.page}:{self.line}: {self.text}"


# -- reading the pages ----------------------------------------------------------------------------
FENCE = re.compile(r"^\s*(```|~~~)")
INLINE = re.compile(r"(`+)(.+?)\1")


def _snippets(text: str):
    """``(line, code, next_lines, inline)`` of every code line (fenced blocks, and indented
    blocks after a blank line; ``\\`` continuations joined; ``next_lines``: the block's
    lines after it) and of every inline code span."""
    lines = text.splitlines()
    block: list[tuple[int, str]] = []
    fenced = False

    def flush():
        joined, cur, start = [], "", None
        for n, line in block:
            start = n if start is None else start
            s = line.strip()
            if s.endswith("\\"):
                cur += s[:-1] + " "
                continue
            joined.append((start, cur + s))
            cur, start = "", None
        for i, (n, s) in enumerate(joined):
            yield n, s, [x for _, x in joined[i + 1:]], False
        block.clear()

    for n, line in enumerate(lines, 1):
        if FENCE.match(line):
            if fenced:
                yield from flush()
            fenced = not fenced
            continue
        indented = line.startswith("    ") and line.strip() and (block or n == 1 or not lines[n - 2].strip())
        if fenced or indented:
            block.append((n, line))
            continue
        if block:
            yield from flush()
        for m in INLINE.finditer(line):
            yield n, m.group(2), [], True
    if block:
        yield from flush()


OPERATORS = {"|", "||", "&&", ";", "&", ">", ">>", "<", "(", ")"}
PLACEHOLDER = re.compile(r"^[A-Z][A-Z_0-9]*$|^\.\.\.$|^…$")


def _tokens(code: str) -> list[str]:
    lex = shlex.shlex(code, posix=True, punctuation_chars="|&;<>()")
    lex.whitespace_split = True
    lex.commenters = "#"
    try:
        return list(lex)
    except ValueError:  # an unbalanced quote: prose, not a command
        return []


def _placeholders(code: str) -> bool:
    """Whether a command's words (up to a shell operator, comments left out) hold a
    placeholder: ``N``, ``DIR``, ``<name>``, ``[optional]``, ``...``, ``a|b``."""
    try:
        words = shlex.split(code, comments=True)
    except ValueError:
        return True
    for w in words:
        if w in OPERATORS:
            break
        if PLACEHOLDER.match(w) or any(c in w for c in "<>[]…") or "..." in w or re.search(r"\S\|\S", w):
            return True
    return False


def _command(page, line, code, tokens, i, following, inline=False) -> Command | None:
    """The command starting at ``tokens[i]`` (``opsplit`` or ``python``), or None."""
    tok = tokens[i]
    rest = tokens[i + 1:]
    if tok == "opsplit":
        kind, target = "opsplit", "opsplit"
        if rest and (rest[0].endswith(":") or not re.match(r"^[-a-z]", rest[0])):
            return None  # "opsplit solve: error: ..." (an output line) or prose
    elif tok in ("python", "python3") and rest:
        if rest[0] == "-m" and len(rest) > 1:
            kind, target, rest = "module", rest[1], rest[2:]
            if target == "opsplit":
                kind = "opsplit"
        elif re.fullmatch(r"benchmarks/[a-z_0-9]+\.py", rest[0]):  # not a pattern (benchmarks/X.py)
            kind, target, rest = "benchmark", rest[0], rest[1:]
        else:
            return None
    else:
        return None
    argv, writes = [], None
    for k, t in enumerate(rest):
        if t in OPERATORS:
            if t == ">" and k + 1 < len(rest):
                writes = rest[k + 1]
            break
        argv.append(t)
    # a command or flag named in prose (`opsplit generate`, `opsplit generate --n-t`): its
    # name and options are checked, not a parse
    placeholders = _placeholders(code[code.find(tok):]) or (inline and (len(argv) <= 1 or argv[-1].startswith("-")))
    error = None
    if following and kind == "opsplit":
        nxt = following[0].removeprefix("$ ").strip()
        sub = next((a for a in argv if not a.startswith("-")), None)
        if sub and nxt.startswith(f"opsplit {sub}: error:"):
            error = nxt
    text = " ".join([tok if kind != "module" else f"{tok} -m {target}",
                     *(() if kind != "benchmark" else (target,)), *argv])
    if kind == "opsplit":
        text = "opsplit " + " ".join(argv)
    clean = [a.strip("[]") for a in argv if a.strip("[]") and a not in ("...", "…")]
    flags = [f for f in (a.split("=", 1)[0] for a in clean) if re.fullmatch(r"--?[A-Za-z][-\w@]*", f)]
    return Command(page, line, text.strip(), argv, kind, target, placeholders, error, writes, flags)


def commands() -> list[Command]:
    out = []
    for path in PAGES:
        page = str(path.relative_to(ROOT))
        for line, code, following, inline in _snippets(path.read_text()):
            tokens = _tokens(code.removeprefix("$ "))
            for i, tok in enumerate(tokens):
                prev = tokens[i - 1] if i else None
                at_start = prev is None or prev in OPERATORS or prev == "$" or re.match(r"^[A-Z_][A-Z0-9_]*=", prev)
                if tok in ("opsplit", "python", "python3") and at_start:
                    c = _command(page, line, code, tokens, i, following, inline)
                    if c is not None:
                        out.append(c)
    return out


COMMANDS = commands()


# -- the probe: the scripts' parsers and opsplit's --print-config, in one process ----------------
class _Captured(Exception):
    def __init__(self, parser):
        self.parser = parser


def _parse(parser, argv) -> str | None:
    """None when ``parser`` accepts ``argv``, else argparse's message."""
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            parser.parse_args(argv)
    except SystemExit as e:
        return err.getvalue().strip().splitlines()[-1] if e.code else None
    except Exception as e:  # opsplit's parser raises its UsageError
        return f"{type(e).__name__}: {e}"
    return None


def _script_parser(script: Path) -> argparse.ArgumentParser:
    """The parser ``script``'s main builds, taken at its ``parse_args`` call: the script runs
    as ``python benchmarks/X.py`` would (its folder first on the path) up to that call."""
    import runpy

    if not re.search(r"\.parse_(known_)?args\(", script.read_text()):  # it would run, not parse
        raise AssertionError(f"{script.name} defines no arguments (argparse): its --help would run it")
    real = argparse.ArgumentParser.parse_known_args

    def capture(self, args=None, namespace=None):
        raise _Captured(self)

    argparse.ArgumentParser.parse_known_args = capture
    saved_argv, saved_path = sys.argv[:], sys.path[:]
    sys.argv = [str(script)]
    sys.path.insert(0, str(script.parent))
    try:
        runpy.run_path(str(script), run_name="__main__")
    except _Captured as c:
        return c.parser
    finally:
        argparse.ArgumentParser.parse_known_args = real
        sys.argv, sys.path[:] = saved_argv, saved_path
    raise AssertionError(f"{script}: main() did not parse its arguments")


def probe(request: dict) -> dict:
    """``{"benchmarks": {script: [argv | None]}, "configs": [[argv, stdout file | None]]}`` ->
    per script its options and the parse of every argv (None: not parsed), per config command
    its exit status, first stderr line and where its stdout went."""
    out = {"benchmarks": {}, "configs": []}
    for script, argvs in request["benchmarks"].items():
        try:
            parser = _script_parser(ROOT / script)
        except BaseException as e:  # noqa: BLE001 - reported per script
            out["benchmarks"][script] = {"error": f"{type(e).__name__}: {e}"}
            continue
        out["benchmarks"][script] = {"options": sorted(parser._option_string_actions),
                                     "parses": [None if a is None else _parse(parser, a) for a in argvs]}
    if request["configs"]:
        from opsplit.cli import main

        for argv, stdout in request["configs"]:
            o, e = io.StringIO(), io.StringIO()
            with contextlib.redirect_stdout(o), contextlib.redirect_stderr(e):
                try:
                    code = main(argv)
                except SystemExit as x:
                    code = x.code
            if stdout:
                Path(stdout).write_text(o.getvalue())
            lines = e.getvalue().strip().splitlines()
            out["configs"].append({"code": code, "stderr": lines[-1] if lines else ""})
    return out


def _run_probe(request: dict, tmp_path: Path) -> dict:
    (tmp_path / "request.json").write_text(json.dumps(request))
    r = subprocess.run([sys.executable, __file__, str(tmp_path / "request.json")], capture_output=True, text=True,
                       cwd=tmp_path, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


# -- the tests ------------------------------------------------------------------------------------
def test_the_pages_quote_commands():
    kinds = {c.kind for c in COMMANDS}
    assert kinds == {"benchmark", "opsplit", "module"}, kinds
    assert len(COMMANDS) > 100


def test_named_scripts_and_modules_exist():
    import importlib.util

    missing = [str(c) for c in COMMANDS if c.kind == "benchmark" and not (ROOT / c.target).is_file()]
    missing += [str(c) for c in COMMANDS if c.kind == "module" and importlib.util.find_spec(c.target) is None]
    missing += [f"{c}: no {a}" for c in COMMANDS if c.kind == "module" and c.target == "pytest"
                for a in c.argv if a.startswith("tests/") and not (ROOT / a.split("::")[0]).exists()]
    assert not missing, "\n".join(missing)


@functools.cache
def _opsplit_parser():
    """``opsplit``'s parser and its subcommands' parsers by name."""
    from opsplit.cli import build_parser

    top = build_parser()
    return top, next(a for a in top._actions if isinstance(a, argparse._SubParsersAction)).choices


def _opsplit_options(argv: list[str]) -> set[str]:
    """The options of ``opsplit`` and of the subcommand ``argv`` names."""
    top, subs = _opsplit_parser()
    sub = next((a for a in argv if a in subs), None)
    return set(top._option_string_actions) | (set(subs[sub]._option_string_actions) if sub else set())


def test_opsplit_commands_parse():
    wrong = []
    subs = _opsplit_parser()[1]
    for c in (c for c in COMMANDS if c.kind == "opsplit"):
        unknown = [f for f in c.flags if f not in _opsplit_options(c.argv)]
        if c.argv and not c.argv[0].startswith("-") and c.argv[0] not in subs:
            wrong.append(f"{c}: no command {c.argv[0]!r}")
        elif unknown:
            wrong.append(f"{c}: {unknown} not an option")
        elif not c.placeholders and not c.error and (msg := _parse(_opsplit_parser()[0], c.argv)):
            wrong.append(f"{c}: {msg}")
    assert not wrong, "\n".join(wrong)


def test_benchmark_commands_parse_and_opsplit_configs_print(tmp_path):
    bench = [c for c in COMMANDS if c.kind == "benchmark" and (ROOT / c.target).is_file()]
    request = {"benchmarks": {}, "configs": []}
    for c in bench:
        request["benchmarks"].setdefault(c.target, []).append(None if c.placeholders else c.argv)
    configs = _config_commands(tmp_path)
    request["configs"] = [[argv, out] for _, argv, out in configs]
    result = _run_probe(request, tmp_path)
    wrong = []
    seen = {k: 0 for k in request["benchmarks"]}
    for c in bench:
        got = result["benchmarks"][c.target]
        if "error" in got:
            wrong.append(f"{c}: the script's parser: {got['error']}")
            continue
        parse = got["parses"][seen[c.target]]
        seen[c.target] += 1
        unknown = [f for f in c.flags if f not in got["options"]]
        if unknown:
            wrong.append(f"{c}: {unknown} not an option of {c.target}")
        elif parse:
            wrong.append(f"{c}: {parse}")
    for (c, _, _), r in zip(configs, result["configs"]):
        want = c.error or REFUSED_IN_PROSE.get(c.text)
        if want is None and r["code"] != 0:
            wrong.append(f"{c}: --print-config exits {r['code']}: {r['stderr']}")
        elif want is not None and not _refused_alike(want, r):
            wrong.append(f"{c}: expected the refusal {want!r}, got exit {r['code']}: {r['stderr']}")
    assert not wrong, "\n".join(wrong)


def _refused_alike(quoted: str, result: dict) -> bool:
    """Whether ``--print-config``'s result is the refusal the page quotes: exit 2 and the
    message's start up to its key (``opsplit solve: error: solve.n_t:``), or, for a refusal of
    the job's size or cost (which ``--print-config`` only notes), exit 0 and the note naming
    the same keys."""
    prog, _, rest = quoted.partition(": error: ")
    key = re.split(r":(?:\s|$)", rest, maxsplit=1)[0]
    if result["code"] == 2:
        return result["stderr"].startswith(f"{prog}: error: {key}:")
    return result["code"] == 0 and f"the run would be refused: {key}:" in result["stderr"]


def _config_commands(tmp_path: Path) -> list[tuple[Command, list[str], str | None]]:
    """The quoted ``opsplit`` commands of a job that takes a config, as ``--print-config``
    runs (one each): ``(command, argv, file for its stdout)``.  Left out: placeholders, a
    ``--resume`` (it reads a run folder), ``--help``, and a ``--config`` file that is neither
    in the repository nor written by a command quoted before it (``> FILE``)."""
    subs = _opsplit_parser()[1]
    written, out, done = {}, [], set()
    for c in (c for c in COMMANDS if c.kind == "opsplit" and not c.placeholders):
        sub = next((a for a in c.argv if a in subs), None)
        if sub is None or "--print-config" not in subs[sub]._option_string_actions:
            continue
        if "--resume" in c.flags or "--help" in c.flags or "-h" in c.argv:
            continue
        argv = list(c.argv)
        if "--config" in argv:
            i = argv.index("--config") + 1
            name = argv[i]
            if (c.page, name) in written:
                argv[i] = written[c.page, name]
            elif (ROOT / name).is_file():
                argv[i] = str(ROOT / name)
            else:
                continue
        if "--out" in argv:  # --print-config writes nothing: the folder is not needed
            i = argv.index("--out")
            del argv[i:i + 2]
        stdout = None
        if c.writes:
            stdout = str(tmp_path / f"{len(out)}_{Path(c.writes).name}")
            written[c.page, c.writes] = stdout
        key = (tuple(argv), c.error or REFUSED_IN_PROSE.get(c.text), stdout)
        if key in done:
            continue
        done.add(key)
        if "--print-config" not in argv:
            argv.append("--print-config")
        out.append((c, argv, stdout))
    return out


if __name__ == "__main__":  # the probe, in its own process (tests above)
    print(json.dumps(probe(json.loads(Path(sys.argv[1]).read_text()))))
