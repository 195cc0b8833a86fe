"""The ``opsplit`` command's wall time under three thread settings, side by side.

Run from the repository root::

    python3 benchmarks/cli_threads.py [--repeats 5] [--job "train --epochs 3"]

Each repeat runs the job once per setting, interleaved (A B C A B C ...), each in a fresh
process (``python -m opsplit --no-progress <job> --out <tmp>``), so that a machine whose
load changes during the benchmark affects the settings alike:

- ``one``: the command's default (one torch thread, ``OMP_WAIT_POLICY=PASSIVE``);
- ``two passive``: ``--threads 2`` (two threads, passive wait);
- ``torch default``: ``OMP_WAIT_POLICY=ACTIVE`` and ``--threads`` = the machine's CPU
  count, i.e. what torch does when nothing is set (a thread per core, spinning between
  parallel regions).

Prints each run (with the 1-minute load average when it ended) and the median per setting
and of the paired ratios against ``one``.  The load is whatever else the machine runs:
run it on an idle machine and on a busy one to see both sides.
"""

from __future__ import annotations

import argparse
import os
import shlex
import statistics
import subprocess
import sys
import tempfile

import _common


def settings() -> dict:
    n = os.cpu_count() or 1
    return {"one": ([], {}), "two passive": (["--threads", "2"], {}),
            "torch default": (["--threads", str(n)], {"OMP_WAIT_POLICY": "ACTIVE"})}


def run_once(job: list[str], flags: list[str], extra_env: dict) -> float:
    env = {k: v for k, v in os.environ.items()
           if k not in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OMP_WAIT_POLICY", "OPSPLIT_THREADS")}
    env.update(extra_env)
    with tempfile.TemporaryDirectory() as tmp:
        return _common.timed(lambda: subprocess.run(
            [sys.executable, "-m", "opsplit", "--no-progress", *flags, *job, "--out", os.path.join(tmp, "out")],
            cwd=_common.ROOT, env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--job", default="train --epochs 3", help="the opsplit job (default: %(default)s)")
    a = ap.parse_args(argv)
    job = shlex.split(a.job)
    runs = {k: [] for k in settings()}
    print(f"opsplit {a.job}: {a.repeats} interleaved repeats, {os.cpu_count()} CPUs")
    for i in range(a.repeats):
        for name, (flags, env) in settings().items():
            sec = run_once(job, flags, env)
            runs[name].append(sec)
            print(f"  repeat {i + 1}  {name:<14} {sec:8.1f} s   load {_common.loadavg():.2f}", flush=True)
    print()
    for name, ts in runs.items():
        ratio = statistics.median(t / o for t, o in zip(ts, runs["one"]))
        print(f"  {name:<14} median {statistics.median(ts):8.1f} s  (min {min(ts):.1f}, max {max(ts):.1f});"
              f"  median ratio to 'one' {ratio:.2f}")


if __name__ == "__main__":
    main()
