"""Causal sliced ReLU attention (opsplit.functional.causal_sliced_relu_attention, paper 004
eq. 3 over the causal prefix) against causal SDPA
(torch.nn.functional.scaled_dot_product_attention(is_causal=True)), and the scaling of the
causal kernel with the sequence length.

    python benchmarks/attention_causal.py                      # CPU, the full study
    python benchmarks/attention_causal.py --device cuda        # GPU rows
    python benchmarks/attention_causal.py --sizes 16384 --runs 7 --scaling 16384 65536

Shapes as in benchmarks/attention.py: B = 1, H = 4, value dim D = 64 (SDPA: q, k of dim 64
too), float32, forward only, without autograd.

1. Paired comparison, for every T in --sizes: sliced and SDPA are called alternately
   (A B A B ...) in this one process on the same values, after one warm-up call each;
   reported: the median of the per-pair ratios t_SDPA / t_sliced over --runs pairs, and the
   median times.
2. Scaling: the causal kernel alone at every T in --scaling (median of --scaling-runs
   calls after a warm-up), and the least-squares slope of log(time) against log(T).

OMP_WAIT_POLICY=PASSIVE is set before torch starts (unless already set).  Writes
benchmarks/out/attention_causal_<device>.json.
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import argparse  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import pathlib  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402

import torch  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from opsplit.functional import causal_sliced_relu_attention  # noqa: E402

H, D = 4, 64


def _inputs(T, dev, seed=0):
    g = torch.Generator().manual_seed(seed)
    zq, zk = torch.randn(1, H, T, generator=g), torch.randn(1, H, T, generator=g)
    q, k = torch.randn(1, H, T, D, generator=g), torch.randn(1, H, T, D, generator=g)
    v = torch.randn(1, H, T, D, generator=g)
    return [x.to(dev) for x in (zq, zk, q, k, v)]


def _timer(dev):
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)

    def run(f):
        sync()
        t0 = time.perf_counter()
        r = f()
        sync()
        dt = time.perf_counter() - t0
        del r
        return dt

    return run


def paired(T, dev, runs):
    zq, zk, q, k, v = _inputs(T, dev)
    tm = _timer(dev)
    sliced = lambda: causal_sliced_relu_attention(zq, zk, v)  # noqa: E731
    sdpa = lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)  # noqa: E731
    with torch.no_grad():
        tm(sliced)
        tm(sdpa)
        ts, tq = [], []
        for _ in range(runs):
            ts.append(tm(sliced))
            tq.append(tm(sdpa))
    ratios = [b / a for a, b in zip(ts, tq)]
    return {"T": T, "sliced_s": ts, "sdpa_s": tq, "ratio_median": statistics.median(ratios),
            "ratio_min": min(ratios), "ratio_max": max(ratios),
            "sliced_median_s": statistics.median(ts), "sdpa_median_s": statistics.median(tq)}


def _time_sliced(T, dev, runs, tm):
    zq, zk, _, _, v = _inputs(T, dev)

    def f():
        return causal_sliced_relu_attention(zq, zk, v)

    with torch.no_grad():
        tm(f)
        return [tm(f) for _ in range(runs)]


def scaling(sizes, dev, runs):
    tm = _timer(dev)
    rows = []
    for T in sizes:
        ts = _time_sliced(T, dev, runs, tm)
        rows.append({"T": T, "times_s": ts, "median_s": statistics.median(ts)})
        print(f"  scaling T={T:>8}: median {statistics.median(ts):.3f} s over {runs}", flush=True)
    x = [math.log(r["T"]) for r in rows]
    y = [math.log(r["median_s"]) for r in rows]
    mx, my = sum(x) / len(x), sum(y) / len(y)
    slope = (sum((a - mx) * (b - my) for a, b in zip(x, y)) / sum((a - mx) ** 2 for a in x)
             if len(x) > 1 else float("nan"))
    return rows, slope


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--sizes", type=int, nargs="*", default=[16384, 65536])
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("--scaling", type=int, nargs="*",
                    default=[16384, 65536, 262144, 1048576])
    ap.add_argument("--scaling-runs", type=int, default=3)
    args = ap.parse_args()
    dev = torch.device(args.device)
    info = {"device": str(dev), "torch": torch.__version__, "threads": torch.get_num_threads(),
            "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"), "H": H, "D": D,
            "load_before": os.getloadavg()[0]}
    if dev.type == "cuda":
        info["gpu"] = torch.cuda.get_device_name(dev)
    print(json.dumps(info), flush=True)
    pairs = []
    for T in args.sizes:
        r = paired(T, dev, args.runs)
        pairs.append(r)
        print(f"T={T:>7}: causal sliced {r['sliced_median_s'] * 1e3:9.1f} ms | causal SDPA "
              f"{r['sdpa_median_s'] * 1e3:10.1f} ms | SDPA/sliced median {r['ratio_median']:.1f}x "
              f"(min {r['ratio_min']:.1f}, max {r['ratio_max']:.1f}, {args.runs} pairs)", flush=True)
    rows, slope = scaling(args.scaling, dev, args.scaling_runs) if args.scaling else ([], None)
    if rows:
        print(f"scaling exponent {args.scaling[0]} -> {args.scaling[-1]}: {slope:.3f} "
              f"(least squares on log time vs log T)", flush=True)
    info["load_after"] = os.getloadavg()[0]
    out = ROOT / "benchmarks" / "out"
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"attention_causal_{dev.type}.json"
    path.write_text(json.dumps({"info": info, "paired": pairs, "scaling": rows,
                                "exponent": slope}, indent=1))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
