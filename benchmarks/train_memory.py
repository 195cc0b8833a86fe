"""Peak memory of one training step (forward + backward) against N_t for the three
gradient modes of opsplit.control: backprop, checkpoint (torch.utils.checkpoint per step),
adjoint (torchdiffeq.odeint_adjoint per substep).

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
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

_CHILD = r"""
import json, sys, time, weakref
sys.path.insert(0, {root!r})
import torch
from opsplit.control import gradient_mode
from opsplit.models import SplitEncoder
from opsplit.solvers import ODESolve

mode, n, inner = {mode!r}, {n}, {inner}
torch.manual_seed(0)
g = torch.Generator().manual_seed(0)
opts = {{"step_size": 1.0 / (n * inner)}} if inner > 1 else None
m = SplitEncoder(32, 2, 64, n_steps=n, T=1.0, scheme="lie", control="legendre", n_modes=3,
                 generator=g, solver=ODESolve("euler", options=opts))
x = torch.randn(16, 16, 32)

live = [0, 0]  # current, peak
refs = {{}}  # storage pointer -> number of live saved references
held = {{p.untyped_storage().data_ptr() for p in m.parameters()}} | {{x.untyped_storage().data_ptr()}}

class Saved:
    __slots__ = ("t", "key", "nbytes")
    def __init__(self, t):
        self.t = t
        st = t.untyped_storage()
        self.key, self.nbytes = st.data_ptr(), st.nbytes()
        if self.key in held:  # parameters and the input: memory the model holds anyway
            self.nbytes = 0
        refs[self.key] = refs.get(self.key, 0) + 1
        if refs[self.key] == 1:
            live[0] += self.nbytes
            live[1] = max(live[1], live[0])
    def __del__(self):
        refs[self.key] -= 1
        if refs[self.key] == 0:
            del refs[self.key]
            live[0] -= self.nbytes

def pack(t):
    return Saved(t)

def unpack(s):
    return s.t

def step(n_steps=None):
    m.zero_grad(set_to_none=True)
    with gradient_mode(m, mode, checkpoint_every=1):
        loss = m(x, n_steps=n_steps).square().mean()
        loss.backward()

step(1)  # warm-up with one time step (lazy inits, small allocator caches)
def status(key):
    for line in open("/proc/self/status"):
        if line.startswith(key):
            return int(line.split()[1]) / 1024.0

# 1. peak RSS growth of a plain step (no hooks)
rss0 = status("VmRSS")
open("/proc/self/clear_refs", "w").write("5")
t0 = time.perf_counter()
step()
dt = time.perf_counter() - t0
hwm = status("VmHWM")
# 2. autograd memory held between forward and backward: hooks active during the forward pass
m.zero_grad(set_to_none=True)
with gradient_mode(m, mode, checkpoint_every=1):
    with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
        loss = m(x).square().mean()
    saved = live[1]
    loss.backward()
print(json.dumps({{"mode": mode, "n_steps": n, "inner": inner, "saved_mb": saved / 2**20, "rss_mb": hwm - rss0,
                  "time_s": dt}}))
"""


def measure(mode: str, n: int, inner: int = 1) -> dict:
    code = _CHILD.format(root=str(ROOT), mode=mode, n=n, inner=inner)
    # a fixed mmap threshold: freed large blocks go back to the OS, so RSS follows live memory
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="16384", MALLOC_TRIM_THRESHOLD_="0")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=900,
                         env=env)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--n-steps", type=int, nargs="+", default=[8, 16, 32, 64, 128, 256])
    p.add_argument("--modes", nargs="+", default=["backprop", "checkpoint", "adjoint"])
    p.add_argument("--inner", type=int, nargs="*", default=[],
                   help="also: N_t = 8 with this many euler steps inside every substep (backprop vs adjoint)")
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    if args.inner:
        rows = []
        for k in args.inner:
            for mode in ("backprop", "adjoint"):
                r = measure(mode, 8, k)
                rows.append(r)
                print(json.dumps(r), flush=True)
        print("\n| inner steps per substep (N_t = 8) | backprop saved MB | backprop RSS MB | adjoint saved MB | "
              "adjoint RSS MB |")
        print("|---|---|---|---|---|")
        for k in args.inner:
            b = next(r for r in rows if r["inner"] == k and r["mode"] == "backprop")
            a = next(r for r in rows if r["inner"] == k and r["mode"] == "adjoint")
            print(f"| {k} | {b['saved_mb']:.1f} | {b['rss_mb']:.1f} | {a['saved_mb']:.1f} | {a['rss_mb']:.1f} |")
        return rows
    rows = []
    for n in args.n_steps:
        for mode in args.modes:
            r = measure(mode, n)
            rows.append(r)
            print(json.dumps(r), flush=True)
    print("\n| N_t | " + " | ".join(f"{m} saved MB | {m} RSS MB | {m} s" for m in args.modes) + " |")
    print("|---|" + "---|---|---|" * len(args.modes))
    for n in args.n_steps:
        cells = []
        for mode in args.modes:
            r = next(r for r in rows if r["n_steps"] == n and r["mode"] == mode)
            cells += [f"{r['saved_mb']:.1f}", f"{r['rss_mb']:.1f}", f"{r['time_s']:.2f}"]
        print(f"| {n} | " + " | ".join(cells) + " |")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return rows


if __name__ == "__main__":
    main()
