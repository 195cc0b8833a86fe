"""The sliced attention kernels of this tree against those of another commit, paired in one
process: what a change to the kernels costs (issue 17: the per-row power-of-two rescaling,
the finiteness/magnitude reductions and the bump's spread/bandwidth routing).

    OMP_WAIT_POLICY=PASSIVE python benchmarks/attention_ab.py --base fe9638b
    python benchmarks/attention_ab.py --base main --sizes 4096 16384 --runs 9 --threads 1

The base commit's ``opsplit/`` is extracted with ``git archive`` into a temporary folder and
its ``opsplit.functional`` imported under another package name (``opsplit_base``), next to
this tree's.  For every kernel (full and causal sliced ReLU, eq. 3; full and causal ReLU-bump,
eq. 7, b = 0.5), every T in --sizes (B = 1, H = 4, D = 64, float32, standard normal scores
and values: the common case, no rescaling) and forward / forward + backward, the two
kernels are called alternately (A B A B ...) on the same inputs after two warm-up calls
each; reported: the median over --runs pairs of t_this / t_base (> 1: this tree is slower)
and its min..max.  ``--extreme`` adds rows with scores and values scaled by 1e19 (every row
rescaled here; the base returns NaN/inf there, its time is still a reference) and, for the
bump, b = 0.002 (spread / b ~ 4000: this tree routes to the float64 tables or the window
sums).  Writes benchmarks/out/attention_ab.json.
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import argparse  # noqa: E402
import importlib  # noqa: E402
import json  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402

import _common  # noqa: E402
import torch  # noqa: E402

import opsplit.functional as this  # noqa: E402

H, D = 4, 64


def load_base(ref: str, tmp: str):
    """``opsplit.functional`` of commit ``ref`` as the package ``opsplit_base.functional``
    (the base's ``opsplit/__init__.py`` is not run: only the modules the kernels import)."""
    _common.load_revision(ref, tmp, "opsplit_base", run_init=False)
    return importlib.import_module("opsplit_base.functional")


def _inputs(T, seed=0, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    zq, zk = torch.randn(1, H, T, generator=g) * scale, torch.randn(1, H, T, generator=g) * scale
    v = torch.randn(1, H, T, D, generator=g) * scale
    return zq, zk, v


def _call(mod, kind, b):
    if kind == "relu":
        return lambda zq, zk, v: mod.sliced_relu_attention(zq, zk, v)
    if kind == "bump":
        return lambda zq, zk, v: mod.sliced_relu_bump_attention(zq, zk, v, b)
    if kind == "causal":
        return lambda zq, zk, v: mod.causal_sliced_relu_attention(zq, zk, v)
    return lambda zq, zk, v: mod.causal_sliced_relu_bump_attention(zq, zk, v, b)


def _timed(f, ins, backward):
    if backward:
        ins = [x.detach().requires_grad_() for x in ins]
        t0 = time.perf_counter()
        f(*ins).sum().backward()
        return time.perf_counter() - t0
    with torch.no_grad():
        t0 = time.perf_counter()
        f(*ins)
        return time.perf_counter() - t0


def paired(fa, fb, ins, backward, runs, warm=2):
    for _ in range(warm):
        _timed(fa, ins, backward)
        _timed(fb, ins, backward)
    ta, tb = [], []
    for _ in range(runs):
        ta.append(_timed(fa, ins, backward))
        tb.append(_timed(fb, ins, backward))
    p = _common.paired(ta, tb)
    return {"this_s": p["a_median_s"], "base_s": p["b_median_s"], "ratio": p["ratio"], "min": p["ratio_min"],
            "max": p["ratio_max"]}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--base", default="main", help="git commit of the reference kernels")
    ap.add_argument("--sizes", type=int, nargs="+", default=[4096, 16384, 65536])
    ap.add_argument("--causal-sizes", type=int, nargs="+", default=[4096, 16384])
    ap.add_argument("--kinds", nargs="+", default=["relu", "bump", "causal", "causal_bump"])
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--no-backward", action="store_true")
    ap.add_argument("--extreme", action="store_true")
    args = ap.parse_args()
    _common.threads(args.threads)
    tmp = tempfile.mkdtemp(prefix="opsplit_base_")
    base = load_base(args.base, tmp)
    info = {
        "base": args.base,
        "this": _common.git_head(),
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"),
        "load_before": _common.loadavg(),
        "H": H,
        "D": D,
        "runs": args.runs,
    }
    print(json.dumps(info), flush=True)
    cases = []
    for kind in args.kinds:
        sizes = args.causal_sizes if kind.startswith("causal") else args.sizes
        for T in sizes:
            setups = [("randn", 1.0, 0.5)]
            if args.extreme:
                setups += [("1e19", 1e19, 0.5e19)]
                if kind.endswith("bump"):
                    setups += [("b=0.002", 1.0, 0.002)]
            for label, scale, b in setups:
                for bw in [False] if args.no_backward else [False, True]:
                    ins = _inputs(T, scale=scale)
                    r = paired(_call(this, kind, b), _call(base, kind, b), ins, bw, args.runs)
                    r.update(kind=kind, T=T, inputs=label, backward=bw)
                    cases.append(r)
                    print(
                        f"| {kind} | {T} | {label} | {'fwd+bwd' if bw else 'fwd'} | "
                        f"{r['this_s'] * 1e3:.1f} ms | {r['base_s'] * 1e3:.1f} ms | "
                        f"{r['ratio']:.3f} | {r['min']:.2f}..{r['max']:.2f} |",
                        flush=True,
                    )
    info["load_after"] = _common.loadavg()
    out = _common.out_dir()
    (out / "attention_ab.json").write_text(json.dumps({"info": info, "cases": cases}, indent=1))
    print(f"wrote {out / 'attention_ab.json'}")


if __name__ == "__main__":
    main()
