"""Accuracy of the six sliced kernels over magnitudes and bandwidths, against the naive
O(N^2) formulas in float64 on the same (rounded) inputs
(``opsplit.analysis.formulas``); this tree, and optionally the
kernels of another commit (issue 17, finding 1).

    python benchmarks/attention_magnitudes.py --base fe9638b

1. Magnitudes: scores scaled by 10^e_z and values by 10^e_v, e_z, e_v in
   {-38, -30, -20, -10, 0, 10, 19, 20, 30, 37} (100 combinations per kernel), float32,
   B = 1, H = 2, N_q = N_k = 70 (the causal kernels run their dense blocks and one sorted
   level), D = 3, the bump's bandwidth 0.8 * 10^e_z.  A combination is *wrong* when the
   output holds NaN/inf or differs from the reference by more than 1e-5 max |v|.
2. Bandwidths: the two bump kernels with b = r * 10^e_z, r in {1e3, 1, 1e-2 .. 1e-6, 1e-9,
   1e-20, 1e-38, 1e-39}, e_z in {-30, 0, 30}, float32 and float64 (tolerance 1e-5 and
   1e-10 of max |v|): wrong, refused (a ValueError), or right.

Prints one line per kernel and study; writes benchmarks/out/attention_magnitudes.json.
"""

from __future__ import annotations

import argparse
import itertools
import json
import tempfile

import _common
import torch
from attention_ab import load_base

import opsplit.functional as this
from opsplit.analysis.formulas import causal, naive_sliced_bump, naive_sliced_relu

EXPS = [-38, -30, -20, -10, 0, 10, 19, 20, 30, 37]
RATIOS = [1e3, 1.0, 1e-2, 1e-3, 1e-4, 1e-6, 1e-9, 1e-20, 1e-38, 1e-39]


def kernels(mod):
    return {
        "relu (eq. 3)": (
            lambda q, k, v, b: mod.sliced_relu_attention(q, k, v),
            lambda q, k, v, b: naive_sliced_relu(q, k, v),
        ),
        "relu (eq. 2)": (
            lambda q, k, v, b: mod.sliced_relu_attention(q, k, v, centered=False),
            lambda q, k, v, b: naive_sliced_relu(q, k, v, centered=False),
        ),
        "bump (eq. 7)": (
            lambda q, k, v, b: mod.sliced_relu_bump_attention(q, k, v, b),
            lambda q, k, v, b: naive_sliced_bump(q, k, v, b),
        ),
        "causal relu (eq. 3)": (
            lambda q, k, v, b: mod.causal_sliced_relu_attention(q, k, v),
            lambda q, k, v, b: causal(naive_sliced_relu, q, k, v),
        ),
        "causal relu (eq. 2)": (
            lambda q, k, v, b: mod.causal_sliced_relu_attention(q, k, v, centered=False),
            lambda q, k, v, b: causal(naive_sliced_relu, q, k, v, centered=False),
        ),
        "causal bump (eq. 7)": (
            lambda q, k, v, b: mod.causal_sliced_relu_bump_attention(q, k, v, b),
            lambda q, k, v, b: causal(naive_sliced_bump, q, k, v, bandwidth=b),
        ),
    }


def case(fn, ref, e_z, e_v, r=0.8, dt=torch.float32, N=70, seed=0):
    """The error relative to max |v|, or "nonfinite" / "refused"."""
    g = torch.Generator().manual_seed(seed)
    zq = torch.randn(1, 2, N, generator=g, dtype=torch.float64) * 10.0**e_z
    zk = torch.randn(1, 2, N, generator=g, dtype=torch.float64) * 10.0**e_z
    v = (torch.randn(1, 2, N, 3, generator=g, dtype=torch.float64) + 0.5) * 10.0**e_v
    zq, zk, v = (t.to(dt) for t in (zq, zk, v))
    b = torch.tensor(r * 10.0**e_z, dtype=dt)
    try:
        out = fn(zq, zk, v, b)
    except ValueError:
        return "refused"
    if not bool(torch.isfinite(out).all()):
        return "nonfinite"
    want = ref(zq.double(), zk.double(), v.double(), b.double())
    return float((out.double() - want).abs().max() / v.double().abs().max())


def study(mod, label):
    rows = []
    for name, (fn, ref) in kernels(mod).items():
        wrong, worst = [], 0.0
        for e_z, e_v in itertools.product(EXPS, EXPS):
            r = case(fn, ref, e_z, e_v)
            if isinstance(r, str) or r > 1e-5:
                wrong.append((e_z, e_v, r))
            else:
                worst = max(worst, r)
        rows.append(
            {
                "tree": label,
                "study": "magnitudes",
                "kernel": name,
                "wrong": len(wrong),
                "of": len(EXPS) ** 2,
                "worst_right": worst,
                "examples": wrong[:6],
            }
        )
        print(
            f"{label:>6} | magnitudes | {name:<20} | {len(wrong):3d} of {len(EXPS) ** 2} "
            f"wrong | largest error of the rest {worst:.1e} | e.g. {wrong[:3]}",
            flush=True,
        )
    for name in ("bump (eq. 7)", "causal bump (eq. 7)"):
        fn, ref = kernels(mod)[name]
        for dt, tol in ((torch.float32, 1e-5), (torch.float64, 1e-10)):
            wrong, refused, n = [], [], 0
            for e_z, r in itertools.product((-30, 0, 30), RATIOS):
                n += 1
                res = case(fn, ref, e_z, 0, r=r, dt=dt)
                if res == "refused":
                    refused.append((e_z, r))
                elif isinstance(res, str) or res > tol:
                    wrong.append((e_z, r, res))
            rows.append(
                {
                    "tree": label,
                    "study": "bandwidths",
                    "kernel": name,
                    "dtype": str(dt),
                    "wrong": len(wrong),
                    "refused": len(refused),
                    "of": n,
                    "examples": wrong[:6],
                    "refused_cases": refused,
                }
            )
            print(
                f"{label:>6} | bandwidths | {name:<20} | {str(dt)[6:]} | {len(wrong):2d} of "
                f"{n} wrong, {len(refused)} refused {refused} | e.g. {wrong[:3]}",
                flush=True,
            )
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--base", default=None, help="also measure the kernels of this commit")
    args = ap.parse_args()
    torch.set_num_threads(1)
    rows = study(this, "this")
    if args.base:
        rows += study(load_base(args.base, tempfile.mkdtemp(prefix="opsplit_base_")), "base")
    out = _common.out_dir()
    (out / "attention_magnitudes.json").write_text(json.dumps(rows, indent=1, default=str))


if __name__ == "__main__":
    main()
