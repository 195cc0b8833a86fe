"""Cost of the Galerkin- and Fourier-type attention integrals against softmax attention at
N_x = 1K ... 16K nodes (paired runs in one process).

    OMP_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE python benchmarks/galerkin_attention.py

One field (B = 1) of d_model = 64 features, 4 heads, on Omega_x = [0, 1) with N_x nodes:
opsplit's ``GalerkinAttention``, ``FourierAttention`` (both O(N d^2): the d x d integral of
every head first) and ``MultiHeadAttention`` (softmax, O(N^2 d): torch's fused CPU kernel),
each the explicit field A(u) of one term, forward under ``torch.no_grad()`` and forward +
backward.  The three are timed round-robin (G F S G F S ...), ``--repeats`` rounds after one
warm-up; reported: the median time of each and the median over the rounds of the paired
ratios softmax / Galerkin and softmax / Fourier, with the load average before and after.
The flop counts (``torch.utils.flop_counter``; softmax's fused kernel is counted from its
formula, 4 N^2 d) are load-independent.
"""

from __future__ import annotations

import argparse
import math
import os
import statistics

import _common
import torch

from opsplit.grid import Grid, Interval
from opsplit.operators import FourierAttention, GalerkinAttention, MultiHeadAttention


def ops(d: int, heads: int):
    torch.manual_seed(0)
    return {
        "galerkin": GalerkinAttention.create(d, heads),
        "fourier": FourierAttention.create(d, heads),
        "softmax": MultiHeadAttention.create(d, heads, scale=1.0 / math.sqrt(d // heads)),
    }


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", type=int, nargs="+", default=[1024, 2048, 4096, 8192, 16384])
    p.add_argument("--d-model", type=int, default=64)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--backward", action="store_true", help="time forward + backward instead of forward")
    args = p.parse_args(argv)
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    d, H = args.d_model, args.heads
    terms = ops(d, H)
    print(f"# torch {torch.__version__}, {torch.get_num_threads()} thread(s), d_model {d}, {H} heads, "
          f"{'forward + backward' if args.backward else 'forward (no grad)'}, load before: {_common.loadavgs()}")
    print("| N_x | Galerkin (ms) | Fourier (ms) | softmax (ms) | softmax / Galerkin (paired median) | "
          "softmax / Fourier (paired median) | flops G / F / S |")
    print("|---|---|---|---|---|---|---|")
    for n in args.sizes:
        g = Grid(x=Interval(n=n, length=1.0, rule="left"), y=Interval.paper(d))
        u = torch.randn(1, n, d, requires_grad=args.backward)

        def call(op, u=u, g=g):
            if args.backward:
                return lambda: op.field(0.0, u, g).square().sum().backward()

            def forward():
                with torch.no_grad():
                    op.field(0.0, u, g)
            return forward

        times = _common.interleaved({k: call(op) for k, op in terms.items()}, args.repeats)
        med = {k: statistics.median(v) for k, v in times.items()}
        r_g = statistics.median(_common.ratios(times["softmax"], times["galerkin"]))
        r_f = statistics.median(_common.ratios(times["softmax"], times["fourier"]))
        from torch.utils.flop_counter import FlopCounterMode

        flops = {}
        for k, op in terms.items():
            with FlopCounterMode(display=False) as fc:
                op.field(0.0, u.detach(), g)
            flops[k] = fc.get_total_flops() + (4.0 * n * n * d if k == "softmax" else 0.0)
        print(f"| {n} | {1e3 * med['galerkin']:.2f} | {1e3 * med['fourier']:.2f} | {1e3 * med['softmax']:.2f} | "
              f"{r_g:.1f} | {r_f:.1f} | {flops['galerkin']:.2e} / {flops['fourier']:.2e} / {flops['softmax']:.2e} |",
              flush=True)
    print(f"# load after: {_common.loadavgs()}")


if __name__ == "__main__":
    main()
