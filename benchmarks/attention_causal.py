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
import statistics  # noqa: E402

import _common  # noqa: E402
import torch  # noqa: E402

from opsplit.functional import causal_sliced_relu_attention  # noqa: E402

H, D = 4, 64


def _inputs(T, dev, seed=0):
    g = torch.Generator().manual_seed(seed)
    zq, zk = torch.randn(1, H, T, generator=g), torch.randn(1, H, T, generator=g)
    q, k = torch.randn(1, H, T, D, generator=g), torch.randn(1, H, T, D, generator=g)
    v = torch.randn(1, H, T, D, generator=g)
    return [x.to(dev) for x in (zq, zk, q, k, v)]


def _sync(dev):
    return torch.cuda.synchronize if dev.type == "cuda" else None


def paired(T, dev, runs):
    zq, zk, q, k, v = _inputs(T, dev)
    fns = {"sliced": lambda: causal_sliced_relu_attention(zq, zk, v),
           "sdpa": lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)}
    with torch.no_grad():
        t = _common.interleaved(fns, runs, sync=_sync(dev))
    ts, tq = t["sliced"], t["sdpa"]
    ratios = _common.ratios(tq, ts)
    return {"T": T, "sliced_s": ts, "sdpa_s": tq, "ratio_median": statistics.median(ratios),
            "ratio_min": min(ratios), "ratio_max": max(ratios),
            "sliced_median_s": statistics.median(ts), "sdpa_median_s": statistics.median(tq)}


def scaling(sizes, dev, runs):
    rows = []
    for T in sizes:
        zq, zk, _, _, v = _inputs(T, dev)
        with torch.no_grad():
            ts = _common.interleaved({"sliced": lambda a=(zq, zk, v): causal_sliced_relu_attention(*a)}, runs,
                                     sync=_sync(dev))["sliced"]
        rows.append({"T": T, "times_s": ts, "median_s": statistics.median(ts)})
        print(f"  scaling T={T:>8}: median {statistics.median(ts):.3f} s over {runs}", flush=True)
    return rows, _common.loglog_slope([r["T"] for r in rows], [r["median_s"] for r in rows])


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
            "load_before": _common.loadavg()}
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
    info["load_after"] = _common.loadavg()
    path = _common.out_dir() / f"attention_causal_{dev.type}.json"
    path.write_text(json.dumps({"info": info, "paired": pairs, "scaling": rows,
                                "exponent": slope}, indent=1))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
