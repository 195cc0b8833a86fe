"""What the benchmark scripts share: the output folder, the load average, interleaved and
paired timing (A B A B ..., medians and medians of the paired ratios), the log-log slope of
a scaling study, the saved-tensor meter of a training step, a fresh process per
measurement, another git revision of opsplit imported beside this one, and the argument
types the scripts have in common.

A script run as ``python benchmarks/X.py`` has ``benchmarks/`` first on its module search
path, so it reads this module as ``import _common``; opsplit itself is the installed
package.  Nothing here imports torch or opsplit at import time.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import math
import os
import statistics
import subprocess
import sys
import time
import types
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: where the scripts write their tables, JSON and plots by default (git-ignored)
OUT = ROOT / "benchmarks" / "out"


def out_dir(*parts: str) -> Path:
    """``benchmarks/out/<parts>``, created."""
    path = OUT.joinpath(*parts)
    path.mkdir(parents=True, exist_ok=True)
    return path


def loadavg() -> float:
    """The 1-minute load average (NaN where the platform has none)."""
    try:
        return os.getloadavg()[0]
    except (OSError, AttributeError):  # pragma: no cover - no load average on this platform
        return float("nan")


def loadavgs() -> str:
    """The 1-, 5- and 15-minute load averages as text (``"-"`` where the platform has none)."""
    try:
        return " ".join(f"{x:.1f}" for x in os.getloadavg())
    except (OSError, AttributeError):  # pragma: no cover
        return "-"


# -- timing ---------------------------------------------------------------------------------------
def timed(fn: Callable[[], object], *, clock: Callable[[], float] = time.perf_counter,
          sync: Callable[[], None] | None = None) -> float:
    """Seconds of one call of ``fn`` by ``clock`` (``sync`` before and after: a device's
    queue, e.g. ``torch.cuda.synchronize``)."""
    if sync is not None:
        sync()
    t0 = clock()
    fn()
    if sync is not None:
        sync()
    return clock() - t0


def interleaved(fns: dict[str, Callable[[], object]], rounds: int, *, warmup: int = 1,
                clock: Callable[[], float] = time.perf_counter, sync: Callable[[], None] | None = None,
                alternate: bool = False) -> dict[str, list[float]]:
    """Every function of ``fns`` called round-robin (A B C A B C ...) for ``rounds`` rounds
    after ``warmup`` untimed rounds, so that a load that changes during the run affects all
    alike (``alternate``: every other round in the reverse order, A B B A ...):
    ``{name: [seconds per round]}``."""
    for _ in range(warmup):
        for fn in fns.values():
            fn()
    times: dict[str, list[float]] = {k: [] for k in fns}
    for r in range(rounds):
        order = list(fns.items())
        for k, fn in (order[::-1] if alternate and r % 2 else order):
            times[k].append(timed(fn, clock=clock, sync=sync))
    return times


def ratios(a: list[float], b: list[float]) -> list[float]:
    """The paired ratios ``a_i / b_i`` (runs taken side by side)."""
    return [x / y for x, y in zip(a, b)]


def paired(a: list[float], b: list[float]) -> dict:
    """The medians of ``a`` and ``b`` and the median, least and largest of the paired ratios
    ``a_i / b_i``."""
    r = ratios(a, b)
    return {"a_median_s": statistics.median(a), "b_median_s": statistics.median(b),
            "ratio": statistics.median(r), "ratio_min": min(r), "ratio_max": max(r), "n": len(r)}


def loglog_slope(xs, ys) -> float:
    """The least-squares slope of ``log y`` against ``log x`` (NaN for fewer than two points)."""
    lx, ly = [math.log(x) for x in xs], [math.log(y) for y in ys]
    if len(lx) < 2:
        return float("nan")
    mx, my = sum(lx) / len(lx), sum(ly) / len(ly)
    return sum((a - mx) * (b - my) for a, b in zip(lx, ly)) / sum((a - mx) ** 2 for a in lx)


# -- memory ---------------------------------------------------------------------------------------
class SavedTensors:
    """Autograd's saved-tensor memory while the context is open
    (``torch.autograd.graph.saved_tensors_hooks``): the bytes of every distinct storage saved
    for the backward pass, live (``current``) and at most (``peak``), and every storage seen
    (``seen``: pointer -> bytes).  Storages in ``held`` (the parameters and the input: memory
    the model holds anyway) count 0.  Hooks nest and the innermost wins: inside a
    checkpointed block or a solve run under ``no_grad`` nothing is saved."""

    def __init__(self, held=()):
        self.held = {t.untyped_storage().data_ptr() for t in held}
        self.current = self.peak = 0
        self.refs: dict[int, int] = {}
        self.seen: dict[int, int] = {}
        self.hooks = None

    def pack(self, t):
        return _Saved(self, t)

    def __enter__(self):
        import torch

        self.hooks = torch.autograd.graph.saved_tensors_hooks(self.pack, lambda s: s.t)
        self.hooks.__enter__()
        return self

    def __exit__(self, *exc):
        self.hooks.__exit__(*exc)

    @property
    def peak_mb(self) -> float:
        return self.peak / 2**20


class _Saved:
    __slots__ = ("meter", "t", "key", "nbytes")

    def __init__(self, meter: SavedTensors, t):
        self.meter, self.t = meter, t
        st = t.untyped_storage()
        self.key = st.data_ptr()
        self.nbytes = 0 if self.key in meter.held else st.nbytes()
        meter.seen[self.key] = self.nbytes
        meter.refs[self.key] = meter.refs.get(self.key, 0) + 1
        if meter.refs[self.key] == 1:
            meter.current += self.nbytes
            meter.peak = max(meter.peak, meter.current)

    def __del__(self):
        m = self.meter
        m.refs[self.key] -= 1
        if m.refs[self.key] == 0:
            del m.refs[self.key]
            m.current -= self.nbytes


# -- processes and revisions ----------------------------------------------------------------------
RESULT = "RESULT "


def print_result(obj) -> None:
    """The line :func:`in_fresh_process` reads back (JSON after ``RESULT``)."""
    print(RESULT + json.dumps(obj), flush=True)


def in_fresh_process(script: str | Path, args: list[str], *, env: dict | None = None, timeout: float | None = None):
    """Run ``python <script> <args>`` in a new process (its peak memory its own) and return
    the object of its :func:`print_result` line."""
    out = subprocess.run([sys.executable, str(script), *args], capture_output=True, text=True, check=False,
                         env=dict(os.environ) if env is None else env, timeout=timeout)
    if out.returncode != 0:
        raise SystemExit(f"{script} {' '.join(args)}: exit {out.returncode}\n{out.stderr[-3000:]}")
    line = next((ln for ln in out.stdout.splitlines() if ln.startswith(RESULT)), None)
    if line is None:
        raise SystemExit(f"{script} {' '.join(args)}: no {RESULT.strip()} line\n{out.stdout[-2000:]}")
    return json.loads(line[len(RESULT):])


def load_revision(rev: str, into: str | Path, name: str, *, run_init: bool = True) -> types.ModuleType:
    """opsplit as of git revision ``rev`` (``git archive`` of its ``opsplit/`` into ``into``),
    imported as the package ``name`` beside this tree's opsplit.  ``run_init=False`` leaves
    the package's ``__init__`` unrun: only the modules imported from it load (e.g.
    ``importlib.import_module(name + ".functional")``)."""
    arch = subprocess.run(["git", "-C", str(ROOT), "archive", rev, "opsplit"], check=True, capture_output=True)
    subprocess.run(["tar", "-x", "-C", str(into)], input=arch.stdout, check=True)
    folder = Path(into) / "opsplit"
    if not run_init:
        pkg = types.ModuleType(name)
        pkg.__path__ = [str(folder)]
        sys.modules[name] = pkg
        return pkg
    spec = importlib.util.spec_from_file_location(name, folder / "__init__.py",
                                                  submodule_search_locations=[str(folder)])
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def git_head() -> str:
    """This tree's commit (short), ``+`` when ``opsplit/`` has uncommitted changes."""
    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True,
                          text=True).stdout.strip()
    dirty = subprocess.run(["git", "-C", str(ROOT), "diff", "--quiet", "HEAD", "--", "opsplit"]).returncode
    return head + ("+" if dirty else "")


# -- arguments and figures ------------------------------------------------------------------------
def seed_list(text: str) -> list[int]:
    """``"0-4"`` -> ``[0, 1, 2, 3, 4]``; ``"0,2,5"`` -> ``[0, 2, 5]``; ``"3"`` -> ``[3]`` (an
    argparse type)."""
    out = []
    for part in text.split(","):
        lo, sep, hi = part.strip().partition("-")
        try:
            out.extend(range(int(lo), int(hi) + 1) if sep else [int(lo)])
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected seeds like 0-4 or 0,2,5, got {text!r}") from None
    if not out:
        raise argparse.ArgumentTypeError(f"expected at least one seed, got {text!r}")
    return out


def options(parser: argparse.ArgumentParser, **defaults) -> argparse.ArgumentParser:
    """``--name VALUE`` options from their defaults (``d_model=64`` -> ``--d-model``, an int):
    a list default takes one or more values of its first element's type; ``None`` is a
    string option without a default."""
    for key, value in defaults.items():
        flag = "--" + key.replace("_", "-")
        if isinstance(value, bool):
            parser.add_argument(flag, action="store_true", default=value)
        elif isinstance(value, (list, tuple)):
            parser.add_argument(flag, type=type(value[0]), nargs="+", default=list(value))
        elif value is None:
            parser.add_argument(flag, default=None)
        else:
            parser.add_argument(flag, type=type(value), default=value)
    return parser


def switches(parser: argparse.ArgumentParser, **helps: str) -> argparse.ArgumentParser:
    """``--name`` flags (``store_true``) from their help texts (``cpu_time=...`` -> ``--cpu-time``)."""
    for key, text in helps.items():
        parser.add_argument("--" + key.replace("_", "-"), action="store_true", help=text)
    return parser


def threads(n: int | None) -> int:
    """``torch.set_num_threads(n)`` when ``n`` is given; the thread count in use."""
    import torch

    if n:
        torch.set_num_threads(n)
    return torch.get_num_threads()


def pyplot():
    """matplotlib's pyplot on the Agg backend (files, no display)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt
