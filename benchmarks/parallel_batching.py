"""Parallel and hybrid splitting: independent substeps as one batched (vmapped) call vs a
Python loop over the substeps, side by side in one run.

Run from the repository root::

    python3 benchmarks/parallel_batching.py [--repeats 7] [--threads N]

Problem: H attention heads given as H separate ``SoftmaxAttention`` terms and J FFN
integral terms, Heun substeps, one propagator step of ``Parallel`` (eq. 59) and of
``Hybrid([[heads...], [ffn...]])``.  Substeps of the same structure (the H heads; the J
FFN layers) are stacked along a new leading dimension and evaluated by one
``torch.func.vmap`` call (``batch=True``) or called one after the other
(``batch=False``).  Timings are medians of interleaved repeats (forward, and forward +
backward); the outputs of the two paths are compared.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from opsplit import Grid, Propagator  # noqa: E402
from opsplit.operators import FFNIntegral, SoftmaxAttention  # noqa: E402
from opsplit.schemes import Hybrid, Parallel  # noqa: E402
from opsplit.solvers import Heun, Substep  # noqa: E402


def build(kind, H, J, ny, nx, batch, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)

    def W():
        return torch.nn.Parameter(
            torch.randn(ny, ny, generator=g, dtype=torch.float64).to(dtype) / ny**0.5
        )

    heads = [SoftmaxAttention(W(), W(), W()) for _ in range(H)]
    ffn = [
        FFNIntegral(
            W(), torch.nn.Parameter(torch.randn(nx, generator=g, dtype=torch.float64).to(dtype))
        )
        for _ in range(J)
    ]
    sub = lambda op: Substep(op, Heun())  # noqa: E731
    if kind == "parallel":
        scheme = Parallel([sub(o) for o in heads + ffn], batch=batch)
    else:
        scheme = Hybrid([[sub(o) for o in heads], [sub(o) for o in ffn]], batch=batch)
    return Propagator(scheme, 2, t1=1.0, grid=Grid.uniform(nx, ny))


def timeit(fn, repeats):
    out = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t)
    return out


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--threads", type=int, default=None)
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    dtype = torch.float32
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} threads, float32, "
        f"medians of {args.repeats} interleaved repeats, 2 propagator steps, Heun substeps"
    )
    print(
        f"{'scheme':<9}{'H':>3}{'J':>3}{'B':>5}{'N_x':>5}{'N_y':>5} | {'loop fwd':>10}{'vmap fwd':>10}"
        f"{'ratio':>7} | {'loop f+b':>10}{'vmap f+b':>10}{'ratio':>7} | max |diff|"
    )
    for kind in ("parallel", "hybrid"):
        for H, J, B, nx, ny in [
            (8, 2, 8, 16, 16),
            (16, 4, 8, 16, 16),
            (8, 2, 16, 32, 32),
            (8, 2, 32, 64, 64),
        ]:
            props = {b: build(kind, H, J, ny, nx, b, dtype) for b in (False, True)}
            f = torch.randn(B, nx, ny, dtype=dtype)
            with torch.no_grad():
                diff = float((props[True](f) - props[False](f)).abs().max())
            fw = {False: [], True: [], "fb_False": [], "fb_True": []}
            for _ in range(2):  # warm-up
                for b in (False, True):
                    props[b](f).sum().backward()
            for _ in range(args.repeats):
                for b in (False, True):  # interleaved
                    with torch.no_grad():
                        fw[b] += timeit(lambda p=props[b], f=f: p(f), 1)
                    fw[f"fb_{b}"] += timeit(lambda p=props[b], f=f: p(f).sum().backward(), 1)
            m = {k: statistics.median(v) * 1e3 for k, v in fw.items()}
            print(
                f"{kind:<9}{H:>3}{J:>3}{B:>5}{nx:>5}{ny:>5} | {m[False]:>8.2f}ms{m[True]:>8.2f}ms"
                f"{m[False] / m[True]:>6.2f}x | {m['fb_False']:>8.2f}ms{m['fb_True']:>8.2f}ms"
                f"{m['fb_False'] / m['fb_True']:>6.2f}x | {diff:.1e}",
                flush=True,
            )


if __name__ == "__main__":
    main()
