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
import statistics

import _common
import torch

from opsplit import Grid, Propagator
from opsplit.operators import FFNIntegral, SoftmaxAttention
from opsplit.schemes import Hybrid, Parallel
from opsplit.solvers import Heun, Substep


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


#: (H, J, B, N_x, N_y) of the rows
CASES = [(8, 2, 8, 16, 16), (16, 4, 8, 16, 16), (8, 2, 16, 32, 32), (8, 2, 32, 64, 64)]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--quick", action="store_true", help="the smallest case of each scheme only")
    args = ap.parse_args(argv)
    _common.threads(args.threads)
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
        for H, J, B, nx, ny in CASES[:1] if args.quick else CASES:
            props = {b: build(kind, H, J, ny, nx, b, dtype) for b in (False, True)}
            f = torch.randn(B, nx, ny, dtype=dtype)
            with torch.no_grad():
                diff = float((props[True](f) - props[False](f)).abs().max())
            for _ in range(2):  # warm-up
                for b in (False, True):
                    props[b](f).sum().backward()

            def forward(p, f=f):
                with torch.no_grad():
                    p(f)

            fw = _common.interleaved({k: fn for b in (False, True) for k, fn in (
                (b, lambda p=props[b]: forward(p)), (f"fb_{b}", lambda p=props[b], f=f: p(f).sum().backward()))},
                args.repeats, warmup=0)
            m = {k: statistics.median(v) * 1e3 for k, v in fw.items()}
            print(
                f"{kind:<9}{H:>3}{J:>3}{B:>5}{nx:>5}{ny:>5} | {m[False]:>8.2f}ms{m[True]:>8.2f}ms"
                f"{m[False] / m[True]:>6.2f}x | {m['fb_False']:>8.2f}ms{m['fb_True']:>8.2f}ms"
                f"{m['fb_False'] / m['fb_True']:>6.2f}x | {diff:.1e}",
                flush=True,
            )


if __name__ == "__main__":
    main()
