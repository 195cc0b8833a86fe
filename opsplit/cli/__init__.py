"""The ``opsplit`` command: the jobs of a user of opsplit, each writing its tables (CSV and
Markdown), plots (PNG) and a report (Markdown and HTML) into an output folder.

    opsplit                      the embedded default job (under a minute on 2 idle CPU cores)
    opsplit solve ...            a seeded continuous transformer at given N_t, N_x, N_y, schemes
    opsplit compare ...          Lie / Strang / parallel / hybrid: error vs cost, orders
    opsplit convert ...          torch / Hugging Face models -> opsplit, error tables
    opsplit train ...            training as an optimal-control problem (resumable)
    opsplit report FOLDER        (re)assemble a folder's tables and plots into a report
    opsplit grid                 nested-grid convergence of the paper's scheme (text)

Each job reads a small TOML config (``--config``) and/or flags; the config is checked
against the job's schema before any work starts (:mod:`opsplit.cli.config`).  The CLI has
no math of its own: it calls the library and writes what it returns.
"""

from __future__ import annotations

import argparse
import os
import sys
import textwrap

from . import compare, convert, default, grid, report, solve, train
from .config import ConfigError, describe, dump_toml, load
from .output import Output, new_folder, relpath

__all__ = ["main", "ConfigError", "COMMANDS"]

COMMANDS = {m.NAME: m for m in (solve, compare, convert, train, report, grid)}


def _fmt(prog):
    return argparse.RawDescriptionHelpFormatter(prog, max_help_position=32)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="opsplit",
        description="Continuous-time operator splitting for transformers. Without a command: "
        "the default job (a seeded continuous transformer solved with Lie, Strang, parallel "
        "and hybrid splitting at several N_t and grids, and a short training on the bundled "
        "digits), written to an output folder with a report.",
        epilog=default.EXAMPLE, formatter_class=_fmt,
    )
    p.add_argument("--quick", action="store_true",
                   help="a tiny default job (seconds; also OPSPLIT_QUICK=1)")
    p.add_argument("--out", metavar="DIR", help="output folder (default: opsplit-runs/<job>-<time>)")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    sub = p.add_subparsers(dest="command", metavar="command")
    for name, mod in COMMANDS.items():
        epilog = mod.EXAMPLE
        if mod.SCHEMA is not None:
            epilog += "\nconfig keys and defaults (opsplit " + name + " --print-config):\n"
            epilog += describe(mod.SCHEMA)
        sp = sub.add_parser(name, help=mod.SUMMARY, description=mod.SUMMARY + ".",
                            epilog=epilog, formatter_class=_fmt)
        if mod.SCHEMA is not None:
            sp.add_argument("--config", metavar="FILE", help="a TOML config (keys below)")
            sp.add_argument("--out", metavar="DIR", help="output folder "
                            "(default: opsplit-runs/" + name + "-<time>)")
            sp.add_argument("--no-progress", action="store_true", help="no progress bars")
            sp.add_argument("--print-config", action="store_true",
                            help="print the config that would run (TOML) and exit")
        mod.add_arguments(sp)
    return p


def _progress(args) -> bool:
    return not getattr(args, "no_progress", False)


def run_configured(mod, args) -> int:
    """Config -> checks (before any long work) -> output folder -> run -> report."""
    resume = getattr(args, "resume", None)
    path = args.config
    if resume is not None:
        path = path or mod.resume_config(resume)
    cfg = load(mod.SCHEMA, path, mod.overrides(args))
    if args.print_config:
        print(dump_toml(cfg), end="")
        return 0
    plan = mod.prepare(cfg)
    folder = new_folder(mod.NAME, resume or args.out)
    (folder / "config.toml").write_text(dump_toml(cfg))
    out = Output(folder, f"opsplit {mod.NAME}")
    mod.run(cfg, plan, out, _progress(args))
    html = out.finish()
    print(f"opsplit {mod.NAME}: results in {relpath(folder)}/ "
          f"(report: {relpath(html)}, {relpath(folder / 'report.md')})")
    return 0


def main(argv=None) -> int:
    """Entry point of the ``opsplit`` console script and ``python -m opsplit``; returns the
    exit status (0, or 2 for a config error, whose message goes to stderr)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    name = args.command or "default job"
    try:
        if args.command is None:
            quick = args.quick or os.environ.get("OPSPLIT_QUICK", "") not in ("", "0")
            return default.run_default(quick=quick, out=args.out, progress=_progress(args))
        mod = COMMANDS[args.command]
        if mod is report:
            html = report.run_report(args)
            print(f"opsplit report: {relpath(html)}")
            return 0
        if mod is grid:
            grid.run_grid(args)
            return 0
        return run_configured(mod, args)
    except ConfigError as e:
        msg = textwrap.fill(str(e), 100, subsequent_indent="  ")
        print(f"opsplit {name}: error: {msg}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"\nopsplit {name}: interrupted", file=sys.stderr)
        return 130


# re-exported for ``opsplit.__main__`` and the tests
grid_study = grid.grid_study
__all__ += ["Output", "new_folder", "build_parser", "grid_study"]
