"""The ``opsplit`` command's parser and dispatch (:func:`opsplit.cli.main` imports it once
torch's threads are set, :mod:`opsplit.cli.threads`).

A configured job runs in this order, and nothing is written before the last step:
the flags (argparse), ``--out`` / ``--resume`` (the folder can be written, is of the right
kind, no flag contradicts it), the config (:func:`~opsplit.cli.config.load`: every key's
type and range), the job's cross-key checks (``check``: with the library's checks of the
keys that set its objects' fields), the size and cost guard (``estimate``,
:func:`~opsplit.cli.budget.guard`), the library's own checks on the built model
(``prepare``); then the folder is created and the job runs.

``--print-config`` checks the config the same way and prints it; it does not refuse the
job's cost (it runs nothing): a config over the guard's limits is printed with one line on
stderr that says so (the run asks for ``--force``), and its model is not built.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from . import budget, compare, convert, default, generate, grid, report, solve, threads, train
from .config import ConfigError, describe, dump_toml, load
from .output import Output, check_out, new_folder, relpath
from .tasks import Interrupted

__all__ = ["run", "build_parser", "COMMANDS", "UsageError"]

COMMANDS = {m.NAME: m for m in (solve, compare, convert, train, generate, report, grid)}


class UsageError(ConfigError):
    """A flag argparse refuses; ``prog`` is the (sub)command that refused it."""

    def __init__(self, message: str, prog: str):
        super().__init__(message)
        self.prog = prog


class _Parser(argparse.ArgumentParser):
    # one line on stderr and exit status 2 (through main), as for a config error
    def error(self, message):
        raise UsageError(message, self.prog)


def _fmt(prog):
    return argparse.RawDescriptionHelpFormatter(prog, max_help_position=32)


THREADS_HELP = (f"torch CPU threads (default {threads.DEFAULT_THREADS}, with OMP_WAIT_POLICY=PASSIVE; "
                f"also {threads.ENV}=N; see README)")


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(
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
    p.add_argument("--threads", type=int, metavar="N", help=THREADS_HELP)
    sub = p.add_subparsers(dest="command", metavar="command", parser_class=_Parser)
    for name, mod in COMMANDS.items():
        epilog = mod.EXAMPLE
        if hasattr(mod, "config_help"):
            epilog += mod.config_help()
        elif mod.SCHEMA is not None:
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
                            help="check the config and print it (TOML) without running")
        if mod.SCHEMA is not None or mod is grid:
            sp.add_argument("--force", action="store_true",
                            help="run even when the job's estimated memory or time exceeds the "
                            "machine's memory or an hour (opsplit.cli.budget)")
        sp.add_argument("--threads", type=int, metavar="N", default=argparse.SUPPRESS,
                        help=THREADS_HELP)
        mod.add_arguments(sp)
    return p


def _progress(args) -> bool:
    return not getattr(args, "no_progress", False)


def run_configured(mod, args) -> int:
    """Flags -> folder checks -> config -> cross-key checks -> cost guard -> library checks
    -> output folder -> run -> report (or, with ``--print-config``, the checks and the
    config printed: see the module docstring)."""
    if hasattr(mod, "select"):  # opsplit train: the config's task picks the schema (and checks --resume)
        path, mod = mod.config_path(args), mod.select(args)
    else:
        path = args.config
    resume = getattr(args, "resume", None)
    cfg = load(mod.SCHEMA, path, None if resume is not None else mod.overrides(args),
               renamed=getattr(mod, "RENAMED", None))
    out = resume if resume is not None else args.out
    if not args.print_config:
        check_out(out, "--resume" if resume is not None else "--out")
    mod.check(cfg)
    job = f"opsplit {mod.NAME}"
    if args.print_config:
        over = None if args.force else budget.refusal(job, mod.SCHEMA, cfg, mod.estimate)
        if over is None:  # the library's checks on the built model, when it may be built
            plan = mod.prepare(cfg)
            if resume is not None and hasattr(mod, "check_resumed"):
                mod.check_resumed(cfg, plan, Path(resume), getattr(args, "allow_changes", None))
        else:
            print(f"{job}: note: not built (the model and data), the run would be refused: {over}", file=sys.stderr)
        print(dump_toml(cfg), end="")
        return 0
    budget.guard(job, mod.SCHEMA, cfg, mod.estimate, args.force)
    plan = mod.prepare(cfg)
    if resume is not None and hasattr(mod, "check_resumed"):  # the checkpoint, before anything is written
        mod.check_resumed(cfg, plan, Path(resume), getattr(args, "allow_changes", None))
    if resume is None and hasattr(mod, "check_new_folder"):
        mod.check_new_folder(out)
    folder = new_folder(mod.NAME, out)
    (folder / "config.toml").write_text(dump_toml(cfg))
    out = Output(folder, job)
    mod.run(cfg, plan, out, _progress(args))
    html = out.finish()
    print(f"{job}: results in {relpath(folder)}/ "
          f"(report: {relpath(html)}, {relpath(folder / 'report.md')})")
    return 0


def _error(prog: str, e: Exception) -> int:
    msg = " ".join(str(e).split())  # one line
    hint = f" (see {prog} --help)" if isinstance(e, UsageError) else ""
    print(f"{prog}: error: {msg}{hint}", file=sys.stderr)
    return 2


def run(argv: list[str]) -> int:
    parser = build_parser()
    prog = "opsplit"
    try:
        args = parser.parse_args(argv)
        if getattr(args, "threads", None) is not None:
            threads.apply_late(args.threads)  # an abbreviated --thr N the pre-scan did not see
        if args.command is None:
            prog = "opsplit (default job)"
            quick = args.quick or os.environ.get("OPSPLIT_QUICK", "") not in ("", "0")
            return default.run_default(quick=quick, out=args.out, progress=_progress(args))
        prog = f"opsplit {args.command}"
        mod = COMMANDS[args.command]
        if mod is report:
            html = report.run_report(args)
            print(f"opsplit report: {relpath(html)}")
            return 0
        if mod is grid:
            grid.run_grid(args)
            return 0
        if mod is generate:
            print(generate.run_generate(args))
            return 0
        return run_configured(mod, args)
    except UsageError as e:
        return _error(e.prog, e)
    except ConfigError as e:
        return _error(prog, e)
    except Interrupted as e:
        print(f"\n{prog}: {e}", file=sys.stderr)
        return 130
    except KeyboardInterrupt:
        print(f"\n{prog}: interrupted", file=sys.stderr)
        return 130


# re-exported for ``opsplit.cli``
__all__ += ["Output", "new_folder"]
