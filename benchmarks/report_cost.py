"""The default job's wall time with this checkout's report against another checkout's
(e.g. the commit before the report gained its findings, browser-checked layout and
embedded plots), paired.

Run from the repository root::

    git archive <base-commit> | tar -x -C /tmp/opsplit-base       # the other checkout
    python3 benchmarks/report_cost.py --base /tmp/opsplit-base [--this DIR] [--repeats 7] [--quick]

Each repeat runs ``python -m opsplit --no-progress --out <tmp>`` (the README's first
command; one torch thread, ``OMP_WAIT_POLICY=PASSIVE``, the command's default) once with
each checkout first on ``PYTHONPATH``, alternating which goes first (A B B A ...), each in a
fresh process, so that a load that changes during the benchmark affects both alike.
Prints each pair with the 1-minute load average; the median wall time and CPU time (user +
system of the process, less sensitive to the machine's load) of each side and the seconds
the job itself reports ("done in N s"); the medians of the paired ratios (this / base); and
the time of writing the report alone (``write_report`` on the last folder).
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

import _common

ROOT = str(_common.ROOT)


def run(tree: str, args: list, out: str) -> tuple[float, float, float]:
    """``(wall seconds, CPU seconds of the process, the job's own "done in" seconds)``."""
    env = dict(os.environ, PYTHONPATH=tree, OMP_WAIT_POLICY="PASSIVE")
    env.pop("OMP_NUM_THREADS", None)
    t0 = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "opsplit", "--no-progress", *args, "--out", out], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tempfile.gettempdir())
    stdout, stderr = proc.communicate()
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"{tree}: exit {proc.returncode}\n{stderr[-2000:]}")
    cpu = _cpu_of(proc)
    m = re.search(r"done in (\d+) s", stdout)
    return wall, cpu, float(m.group(1)) if m else float("nan")


_CHILDREN = [0.0]


def _cpu_of(proc) -> float:
    """CPU seconds (user + system) of the child just reaped (the growth of RUSAGE_CHILDREN)."""
    import resource

    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    total = r.ru_utime + r.ru_stime
    cpu, _CHILDREN[0] = total - _CHILDREN[0], total
    return cpu


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--base", required=True, help="the other checkout (a folder with opsplit/)")
    p.add_argument("--this", default=ROOT, help="this side's checkout (default: this repository; a "
                   "copy keeps the benchmark apart from edits made while it runs)")
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--quick", action="store_true", help="opsplit --quick instead of opsplit")
    a = p.parse_args(argv)
    trees = {"this": os.path.abspath(a.this), "base": os.path.abspath(a.base)}
    args = ["--quick"] if a.quick else []
    walls = {k: [] for k in trees}
    cpus = {k: [] for k in trees}
    inner = {k: [] for k in trees}
    ratios, cpu_ratios = [], []
    with tempfile.TemporaryDirectory(prefix="opsplit-report-cost-") as tmp:
        for i in range(a.repeats):
            order = ["this", "base"] if i % 2 == 0 else ["base", "this"]
            got = {}
            for k in order:
                got[k] = run(trees[k], args, os.path.join(tmp, f"{k}-{i}"))
                walls[k].append(got[k][0])
                cpus[k].append(got[k][1])
                inner[k].append(got[k][2])
            ratios.append(got["this"][0] / got["base"][0])
            cpu_ratios.append(got["this"][1] / got["base"][1])
            load = _common.loadavg()
            print(f"pair {i + 1}: wall this {got['this'][0]:.1f} s, base {got['base'][0]:.1f} s, ratio "
                  f"{ratios[-1]:.3f}; CPU this {got['this'][1]:.1f} s, base {got['base'][1]:.1f} s, ratio "
                  f"{cpu_ratios[-1]:.3f} (load {load:.1f})", flush=True)
        last = os.path.join(tmp, f"this-{a.repeats - 1}")
        env = dict(os.environ, PYTHONPATH=trees["this"])
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-c", "import sys; from opsplit.cli.output import write_report; "
                        "import time; t = time.perf_counter(); write_report(sys.argv[1]); "
                        "print(time.perf_counter() - t)", last], env=env, check=True, capture_output=True)
        report_s = time.perf_counter() - t0
    for k in trees:
        print(f"{k}: median wall {statistics.median(walls[k]):.1f} s, CPU {statistics.median(cpus[k]):.1f} s, "
              f"job's own 'done in' median {statistics.median(inner[k]):.0f} s over {a.repeats} runs")
    print(f"median of the paired ratios this / base: wall {statistics.median(ratios):.3f} "
          f"(min {min(ratios):.3f}, max {max(ratios):.3f}); CPU {statistics.median(cpu_ratios):.3f} "
          f"(min {min(cpu_ratios):.3f}, max {max(cpu_ratios):.3f})")
    print(f"writing the report alone (opsplit.cli.output.write_report, with Python start-up): {report_s:.2f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
