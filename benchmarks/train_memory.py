"""Peak memory of one training step (forward + backward) against N_t for the three
gradient modes of opsplit.control: backprop, checkpoint (binomial checkpointing with a
fixed snapshot budget, opsplit.revolve; "checkpoint@none": torch.utils.checkpoint per step),
adjoint (torchdiffeq.odeint_adjoint per substep, substep states recomputed from the same
snapshot budget; "adjoint@none": every substep's endpoints stored).  A mode is written
NAME or NAME@S (S stored states, or "none"); NAME alone uses --snapshots.

The model is the same in all modes: a SplitEncoder (lie scheme, d_model 32, 2 heads, d_ff
64, T = 1 fixed, Legendre-in-t controls, every substep solved by ODESolve("euler") so that
all three modes apply), batch 16 x 16 tokens, float32.

Two CPU measurements, each in a fresh subprocess per (mode, N_t):

* saved_mb — the autograd memory held between the forward and the backward pass:
  torch.autograd.graph.saved_tensors_hooks, active during the forward pass, counts the
  bytes of every distinct storage autograd saves for the backward pass (parameters and the
  input are not counted: the model holds them anyway).  Hooks nest, and the innermost
  wins: inside a checkpointed block and inside odeint_adjoint's own forward (run under
  no_grad) nothing is saved, so those are correctly not counted.  Not counted: the
  backward pass's transient workspace (a checkpointed block's recomputation, the adjoint
  solve's vector-Jacobian products: one step or substep at a time) — the RSS column
  includes it.  (The hooks are not active during the backward pass: their wrappers form
  reference cycles with nodes that save their own outputs, which would keep transient
  tensors alive until the garbage collector runs.)
* rss_mb — the growth of the process's peak resident set size during a plain step (no
  hooks; after a warm-up step with N_t = 1)
  (/proc/self/status VmHWM after resetting it through /proc/self/clear_refs, minus the RSS
  before the step, after one warm-up step): everything the process touched, including
  recomputation and solver workspaces.  Linux only; glibc runs with a fixed mmap threshold
  of 16 KiB (MALLOC_MMAP_THRESHOLD_) so that freed blocks of that size and more go back to
  the OS; smaller blocks stay cached, so RSS undercounts small tensors.

    OMP_NUM_THREADS=1 python benchmarks/train_memory.py [--n-steps 8 16 32 64 128 256]
    OMP_NUM_THREADS=1 python benchmarks/train_memory.py --inner 1 4 16 64   # resolution inside substeps
    OMP_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE python benchmarks/train_memory.py --timing --n-steps 16 64 256

--timing: the time of one training step of each mode against backprop, in one process
(the same model and batch), interleaved backprop, mode, backprop, mode, ...; the median
over --repeats of the paired ratio (mode time / the backprop time just before it).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

import _common
import torch

from opsplit.control import gradient_mode
from opsplit.models import SplitEncoder
from opsplit.revolve import revolve_cost
from opsplit.solvers import ODESolve


def model(n: int, inner: int = 1):
    """The benchmark's SplitEncoder at N_t = ``n`` (``inner`` Euler steps inside every substep)."""
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    opts = {"step_size": 1.0 / (n * inner)} if inner > 1 else None
    return SplitEncoder(32, 2, 64, n_steps=n, T=1.0, scheme="lie", control="legendre", n_modes=3,
                        generator=g, solver=ODESolve("euler", options=opts))


def _status(key: str) -> float:
    """A field of /proc/self/status, MiB."""
    for line in open("/proc/self/status"):
        if line.startswith(key):
            return int(line.split()[1]) / 1024.0
    raise KeyError(key)


def child(mode: str, n: int, inner: int, snapshots) -> dict:
    """One (mode, N_t) in this (fresh) process: the peak RSS growth of a plain step, then the
    autograd memory held between its forward and backward passes (module docstring)."""
    m = model(n, inner)
    x = torch.randn(16, 16, 32)

    def step(n_steps=None):
        m.zero_grad(set_to_none=True)
        with gradient_mode(m, mode, checkpoint_every=1, snapshots=snapshots):
            m(x, n_steps=n_steps).square().mean().backward()

    step(1)  # warm-up with one time step (lazy inits, small allocator caches)
    rss0 = _status("VmRSS")  # 1. peak RSS growth of a plain step (no hooks)
    Path("/proc/self/clear_refs").write_text("5")
    t0 = time.perf_counter()
    step()
    dt = time.perf_counter() - t0
    hwm = _status("VmHWM")
    # 2. autograd memory held between forward and backward: hooks active during the forward pass
    m.zero_grad(set_to_none=True)
    with gradient_mode(m, mode, checkpoint_every=1, snapshots=snapshots):
        with _common.SavedTensors(held=[*m.parameters(), x]) as saved:
            loss = m(x).square().mean()
        loss.backward()
    return {"mode": mode, "snapshots": None if mode == "backprop" else snapshots, "n_steps": n, "inner": inner,
            "saved_mb": saved.peak_mb, "rss_mb": hwm - rss0, "time_s": dt}


def _parse_mode(spec: str, default_snapshots):
    name, _, s = spec.partition("@")
    if not s:
        return name, default_snapshots
    return name, None if s == "none" else int(s)


def measure(spec: str, n: int, inner: int = 1, snapshots=8) -> dict:
    mode, snapshots = _parse_mode(spec, snapshots)
    # a fixed mmap threshold: freed large blocks go back to the OS, so RSS follows live memory
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="16384", MALLOC_TRIM_THRESHOLD_="0")
    r = _common.in_fresh_process(__file__, ["--child", mode, str(n), str(inner), str(snapshots)], env=env,
                                 timeout=900)
    r["spec"] = spec
    if mode != "backprop" and snapshots is not None:
        c = revolve_cost(n, snapshots)
        r["factor"], r["reps"], r["max_held"] = c["factor"], c["reps"], c["max_held"]
    return r


def timing(specs, ns, repeats, snapshots):
    """Paired, interleaved step times of each mode against backprop (one process)."""
    rows = []
    for n in ns:
        m = model(n)
        x = torch.randn(16, 16, 32)

        def step(mode, s, m=m, x=x):
            m.zero_grad(set_to_none=True)
            with gradient_mode(m, mode, checkpoint_every=1, snapshots=s):
                t0 = time.perf_counter()
                m(x).square().mean().backward()
                return time.perf_counter() - t0

        for spec in specs:
            mode, s = _parse_mode(spec, snapshots)
            step("backprop", None), step(mode, s)  # warm-up
            ratios, tb = [], []
            for _ in range(repeats):
                b = step("backprop", None)
                a = step(mode, s)
                ratios.append(a / b)
                tb.append(b)
            r = {"spec": spec, "n_steps": n, "ratio": statistics.median(ratios), "backprop_s": statistics.median(tb),
                 "ratios": ratios}
            if mode != "backprop" and s is not None:
                r["factor"] = revolve_cost(n, s)["factor"]
            rows.append(r)
            print(json.dumps(r), flush=True)
    print("\n| N_t | backprop s (median) | " + " | ".join(f"{s} / backprop" for s in specs) + " |")
    print("|---|---|" + "---|" * len(specs))
    for n in ns:
        rs = [r for r in rows if r["n_steps"] == n]
        print(f"| {n} | {rs[0]['backprop_s']:.3f} | " + " | ".join(f"{r['ratio']:.2f}" for r in rs) + " |")
    return rows


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--n-steps", type=int, nargs="+", default=[8, 16, 32, 64, 128, 256])
    p.add_argument("--modes", nargs="+", default=["backprop", "checkpoint", "adjoint"],
                   help="NAME or NAME@S (S stored states or none)")
    p.add_argument("--snapshots", default="8", help="snapshot budget of checkpoint/adjoint (an integer or none)")
    p.add_argument("--timing", action="store_true", help="paired step times against backprop instead")
    p.add_argument("--repeats", type=int, default=9)
    p.add_argument("--inner", type=int, nargs="*", default=[],
                   help="also: N_t = 8 with this many euler steps inside every substep (backprop vs adjoint)")
    p.add_argument("--json", default=None)
    p.add_argument("--child", nargs=4, metavar=("MODE", "N_T", "INNER", "SNAPSHOTS"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        mode, n, inner, s = args.child
        _common.print_result(child(mode, int(n), int(inner), None if s == "None" else int(s)))
        return None
    snaps = None if args.snapshots == "none" else int(args.snapshots)
    if args.timing:
        specs = [s for s in args.modes if s != "backprop"]
        rows = timing(specs, args.n_steps, args.repeats, snaps)
        if args.json:
            Path(args.json).write_text(json.dumps(rows, indent=1))
        return rows
    if args.inner:
        rows = []
        for k in args.inner:
            for mode in ("backprop", "adjoint"):
                r = measure(mode, 8, k, snaps)
                rows.append(r)
                print(json.dumps(r), flush=True)
        print("\n| inner steps per substep (N_t = 8) | backprop saved MB | backprop RSS MB | adjoint saved MB | "
              "adjoint RSS MB |")
        print("|---|---|---|---|---|")
        for k in args.inner:
            b = next(r for r in rows if r["inner"] == k and r["spec"] == "backprop")
            a = next(r for r in rows if r["inner"] == k and r["spec"] == "adjoint")
            print(f"| {k} | {b['saved_mb']:.1f} | {b['rss_mb']:.1f} | {a['saved_mb']:.1f} | {a['rss_mb']:.1f} |")
        return rows
    rows = []
    for n in args.n_steps:
        for mode in args.modes:
            r = measure(mode, n, 1, snaps)
            rows.append(r)
            print(json.dumps(r), flush=True)
    # evals/step: step evaluations per time step (forward, recomputation and the re-run with a graph)
    print("\n| N_t | " + " | ".join(f"{m} saved MB | {m} RSS MB | {m} evals/step" for m in args.modes) + " |")
    print("|---|" + "---|---|---|" * len(args.modes))
    for n in args.n_steps:
        cells = []
        for mode in args.modes:
            r = next(r for r in rows if r["n_steps"] == n and r["spec"] == mode)
            f = r.get("factor")
            ev = "1" if mode == "backprop" else ("2" if f is None else f"{f:.2f}")
            cells += [f"{r['saved_mb']:.2f}", f"{r['rss_mb']:.1f}", ev]
        print(f"| {n} | " + " | ".join(cells) + " |")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return rows


if __name__ == "__main__":
    main()
