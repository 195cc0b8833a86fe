"""Sliced ReLU / ReLU-bump attention against the naive O(N^2) formula and torch's
scaled_dot_product_attention, side by side on the same inputs (paper 004, Prop. 2.1).

    python benchmarks/attention.py                   # the full study (CPU; CUDA too if present)
    python benchmarks/attention.py --sizes 1024 4096 --rounds 1   # a quick look
    OMP_WAIT_POLICY=PASSIVE python benchmarks/attention.py --paired
        # full sliced ReLU vs the seed-004 reference algorithm and SDPA, paired in one process

For every N in --sizes (B = 1, H = 4, D = 64, float32) and every method, one fresh
subprocess builds the inputs, calls the method once (its peak memory is read from
``ru_maxrss`` minus the resident memory with the inputs already held: the *extra* memory
of the call), makes up to 5 warm-up calls (about 2 s at most), then times further calls.  Methods are run round-robin (``--rounds``), and
the table reports the median over all timed calls of all rounds, so that the load of
other processes falls on every method alike.

    relu        opsplit.functional.sliced_relu_attention (eq. 3), forward
    bump        opsplit.functional.sliced_relu_bump_attention (eq. 7, b = 0.5), forward
    naive       the O(N^2) formula of eq. 3 with dense N x N tensors (while it fits)
    sdpa        torch.nn.functional.scaled_dot_product_attention on (B, H, N, 64) q, k, v
                (while a call is predicted to take under --sdpa-limit seconds)
    relu_fb     sliced ReLU forward + backward (gradients for zq, zk, v)
    bump_fb     ReLU-bump forward + backward (and the bandwidth)
    model_relu  a continuous transformer, paper 002's Lie scheme (13)-(17) with multi-head
                sliced ReLU attention (MLP projection) in place of softmax, N_y = 64, H = 4,
                J = 2 FFN layers, N_t = 2 steps: forward + backward
    model_bump  the same with sliced ReLU-bump attention

Also printed: the least-squares exponent of time against N from 16K to 1M, the
forward+backward / forward ratio, and the float32 accuracy at the largest N (relative error
max|out - ref| / max|ref| on 64 sampled queries per head against a float64 evaluation of the
naive formula over all keys).  Writes benchmarks/out/attention.json and attention.png.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import pathlib
import resource
import statistics
import subprocess
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
OUT = ROOT / "benchmarks" / "out"
H, D = 4, 64
BUMP_B = 0.5
METHODS = ("relu", "bump", "naive", "sdpa")
FB_METHODS = ("relu_fb", "bump_fb")
MODEL_METHODS = ("model_relu", "model_bump")


# ----------------------------------------------------------------------------- worker
def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _peak_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def worker(method: str, N: int, device: str, reps: int, budget: float) -> dict:
    import torch

    from opsplit.functional import sliced_relu_attention, sliced_relu_bump_attention

    dev = torch.device(device)
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    g = torch.Generator(device="cpu").manual_seed(0)

    def randn(*shape):
        return torch.randn(*shape, generator=g).to(dev)

    grad = method.endswith("_fb")
    if method.startswith("model"):
        f = _model_call(method, N, dev, randn)
    else:
        zq, zk, v = randn(1, H, N), randn(1, H, N), randn(1, H, N, D)
        if method in ("sdpa", "naive"):
            q, k = randn(1, H, N, D), randn(1, H, N, D)
        if grad:
            zq.requires_grad_()
            zk.requires_grad_()
            v.requires_grad_()
            gout = randn(1, H, N, D)
        if method == "relu":
            f = lambda: sliced_relu_attention(zq, zk, v)  # noqa: E731
        elif method == "bump":
            f = lambda: sliced_relu_bump_attention(zq, zk, v, BUMP_B)  # noqa: E731
        elif method == "relu_fb":
            f = lambda: sliced_relu_attention(zq, zk, v).backward(gout)  # noqa: E731
        elif method == "bump_fb":
            f = lambda: sliced_relu_bump_attention(zq, zk, v, BUMP_B).backward(gout)  # noqa: E731
        elif method == "sdpa":
            f = lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v)  # noqa: E731
        elif method == "naive":
            def f():
                d = zq.unsqueeze(-1) - zk.unsqueeze(-2)
                num = torch.relu(d) @ (v - v.mean(-2, keepdim=True))
                return num / d.abs().sum(-1, keepdim=True)
        else:
            raise ValueError(method)
    ctx = torch.no_grad() if not (grad or method.startswith("model")) else _null()
    with ctx:
        sync()
        rss0, peak0 = _rss_bytes(), _peak_bytes()
        t0 = time.perf_counter()
        res = f()
        sync()
        first = time.perf_counter() - t0
        peak = _peak_bytes() - rss0
        if dev.type == "cuda":
            peak = torch.cuda.max_memory_allocated()
        acc = None
        if method in ("relu", "bump") and N == int(os.environ.get("OPSPLIT_BENCH_ACC_N", "0")):
            acc = _accuracy(method, zq, zk, v, res)
        del res
        # warm-up calls (at most 5, about 2 s), then the timed calls: steady-state times, as
        # in a training or inference loop (the same rule for every method)
        for _ in range(max(0, min(5, int(2.0 / max(first, 1e-6))))):
            r = f()
            sync()
            del r
        times = []
        n_rep = max(1, min(reps, int(budget / max(first, 1e-6))))
        for _ in range(n_rep):
            t0 = time.perf_counter()
            r = f()
            sync()
            times.append(time.perf_counter() - t0)
            del r
    return {"method": method, "N": N, "device": device, "first_s": first, "times_s": times,
            "peak_extra_bytes": peak, "peak_before_bytes": peak0 - rss0, "accuracy": acc,
            "threads": torch.get_num_threads(), "load": os.getloadavg()[0]}


class _null:
    def __enter__(self):
        return self

    def __exit__(self, *a):
        return False


def _model_call(method, N, dev, randn):
    import torch

    from opsplit import Propagator
    from opsplit.controls import PiecewiseConstant
    from opsplit.models import paper_scheme
    from opsplit.operators import (
        FFNIntegral,
        ProjectionS1,
        SlicedReLUAttention,
        SlicedReLUBumpAttention,
    )

    NY, NT, J = D, 2, 2
    gen = torch.Generator().manual_seed(1)
    if method == "model_relu":
        attn = SlicedReLUAttention.build(NY, H, projection="mlp", n_steps=NT, generator=gen)
    else:
        attn = SlicedReLUBumpAttention.build(NY, H, bandwidth=BUMP_B, n_steps=NT, generator=gen)
    ffn = [FFNIntegral(PiecewiseConstant(torch.randn(NT, NY, NY, generator=gen) / NY, axes=("y", "y")),
                       PiecewiseConstant(torch.zeros(NT, NY), axes=("y",)), bias_axis="y")
           for _ in range(J)]
    norm = ProjectionS1(PiecewiseConstant(torch.zeros(NT, 1).squeeze(-1)),
                        PiecewiseConstant(torch.ones(NT), positive=True))
    model = Propagator(paper_scheme(attn, norm, ffn), NT).to(dev)
    u = randn(1, N, NY)

    def f():
        model.zero_grad(set_to_none=True)
        model(u).pow(2).mean().backward()

    return f


def _accuracy(method, zq, zk, v, out):
    """max |out - ref| / max |ref| on 64 sampled queries per head, ref in float64 over all keys."""
    import torch

    g = torch.Generator().manual_seed(1)
    N = zq.shape[-1]
    idx = torch.randint(0, N, (64,), generator=g)
    errs, refs = [], []
    for h in range(H):
        q = zq[0, h, idx].double().cpu()
        kk = zk[0, h].double().cpu()
        vv = v[0, h].double().cpu()
        num = torch.zeros(64, D, dtype=torch.float64)
        den = torch.zeros(64, 1, dtype=torch.float64)
        mean = vv.mean(0)
        for s in range(0, N, 1 << 17):
            d = q[:, None] - kk[None, s : s + (1 << 17)]
            if method == "relu":
                num += torch.relu(d) @ (vv[s : s + (1 << 17)] - mean)
                den += d.abs().sum(1, keepdim=True)
            else:
                num += torch.relu(1 - d.abs() / BUMP_B) @ vv[s : s + (1 << 17)]
        ref = num / den if method == "relu" else num / N
        errs.append((out[0, h, idx].double().cpu() - ref).abs().max())
        refs.append(ref.abs().max())
    return float(max(errs) / max(refs))


# ----------------------------------------------------------------------------- driver
def run_case(method, N, device, reps, budget, thp, passive, timeout, acc_n):
    env = dict(os.environ)
    env["OPSPLIT_BENCH_ACC_N"] = str(acc_n)
    if thp:
        env["THP_MEM_ALLOC_ENABLE"] = "1"
    if passive:
        env["OMP_WAIT_POLICY"] = "PASSIVE"
    cmd = [sys.executable, __file__, "--worker", method, str(N), device, str(reps), str(budget)]
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"method": method, "N": N, "device": device, "error": f"timeout {timeout}s"}
    if p.returncode != 0:
        return {"method": method, "N": N, "device": device,
                "error": (p.stderr.strip().splitlines() or ["?"])[-1][:200]}
    return json.loads(p.stdout.strip().splitlines()[-1])


def fmt_t(s):
    if s is None:
        return "—"
    return f"{s * 1e3:.1f} ms" if s < 1 else f"{s:.2f} s"


def fmt_m(b):
    if b is None:
        return "—"
    return f"{b / 2**20:.0f} MiB" if b < 2**30 else f"{b / 2**30:.2f} GiB"


def median_time(rows):
    ts = [t for r in rows for t in r.get("times_s", [])]
    return statistics.median(ts) if ts else None


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--worker", nargs=5, help=argparse.SUPPRESS)
    ap.add_argument("--sizes", type=int, nargs="+",
                    default=[1 << 10, 1 << 12, 1 << 14, 1 << 16, 1 << 18, 1 << 20])
    ap.add_argument("--rounds", type=int, default=3, help="round-robin rounds (default 3)")
    ap.add_argument("--reps", type=int, default=5, help="timed calls per round (default 5)")
    ap.add_argument("--budget", type=float, default=20.0, help="seconds of timed calls per case")
    ap.add_argument("--sdpa-limit", type=float, default=60.0,
                    help="skip SDPA / naive once a call is predicted to exceed this (s)")
    ap.add_argument("--naive-bytes", type=float, default=6 * 2**30,
                    help="skip the naive formula when its N x N tensors exceed this")
    ap.add_argument("--fb-sizes", type=int, nargs="*", default=[1 << 14, 1 << 16])
    ap.add_argument("--model-sizes", type=int, nargs="*", default=[1 << 12, 1 << 16])
    ap.add_argument("--devices", nargs="+", default=None)
    ap.add_argument("--thp", action="store_true",
                    help="run the workers with THP_MEM_ALLOC_ENABLE=1 (torch's huge-page allocations)")
    ap.add_argument("--omp-passive", action="store_true",
                    help="run the workers with OMP_WAIT_POLICY=PASSIVE (OpenMP threads sleep "
                         "instead of spinning at barriers; see docs/sliced_attention.md)")
    ap.add_argument("--tag", default="attention", help="output file stem in benchmarks/out/")
    ap.add_argument("--paired", action="store_true",
                    help="only the paired in-process comparison against the seed-004 reference "
                         "algorithm and SDPA (see paired())")
    ap.add_argument("--paired-sizes", type=int, nargs="+", default=[1 << 12, 1 << 14, 1 << 16, 1 << 18])
    ap.add_argument("--sdpa-T", type=int, default=1 << 14)
    ap.add_argument("--runs", type=int, default=7, help="pairs per size in --paired (default 7)")
    ap.add_argument("--threads", type=int, default=None, help="torch threads in --paired")
    args = ap.parse_args()
    if args.paired:
        paired(args)
        return
    if args.worker:
        m, n, dev, reps, budget = args.worker
        print(json.dumps(worker(m, int(n), dev, int(reps), float(budget))))
        return

    import torch

    devices = args.devices or (["cpu"] + (["cuda"] if torch.cuda.is_available() else []))
    sizes = sorted(args.sizes)
    acc_n = sizes[-1]
    results = []
    for device in devices:
        cases = [(m, n) for n in sizes for m in METHODS]
        cases += [(m, n) for n in args.fb_sizes for m in FB_METHODS]
        cases += [(m, n) for n in args.model_sizes for m in MODEL_METHODS]
        skipped: dict = {}
        last_t: dict = {}
        for rnd in range(args.rounds):
            for m, n in cases:
                if (m, n) in skipped:
                    continue
                if m in ("sdpa", "naive"):
                    prev = [k for k in last_t if k[0] == m and k[1] < n]
                    if prev:
                        n0 = max(k[1] for k in prev)
                        pred = last_t[(m, n0)] * (n / n0) ** 2
                        if pred > args.sdpa_limit:
                            skipped[(m, n)] = f"predicted {pred:.0f} s > {args.sdpa_limit:.0f} s"
                            continue
                    if m == "naive" and 3 * H * n * n * 4 > args.naive_bytes:
                        skipped[(m, n)] = f"N x N tensors {3 * H * n * n * 4 / 2**30:.0f} GiB"
                        continue
                    if (m, n) in [(k[0], k[1]) for k in last_t] and rnd > 0 and last_t[(m, n)] > 10:
                        continue  # one round is enough for the slow quadratic baselines
                r = run_case(m, n, device, args.reps, args.budget, args.thp, args.omp_passive,
                             timeout=max(120, 4 * args.sdpa_limit), acc_n=acc_n)
                r["round"] = rnd
                results.append(r)
                if "error" in r:
                    skipped[(m, n)] = r["error"]
                else:
                    last_t[(m, n)] = r["first_s"]
                print(f"[{device} round {rnd}] {m:>10} N={n:>8}: "
                      + (r.get("error") or f"{fmt_t(median_time([r]))}, peak +{fmt_m(r['peak_extra_bytes'])},"
                         f" load {r['load']:.1f}"), flush=True)
        report(results, device, sizes, args, skipped)
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / f"{args.tag}.json").write_text(json.dumps(results, indent=1))
    plot(results, devices, OUT / f"{args.tag}.png")


def _rows(results, device, m, n):
    return [r for r in results if r["device"] == device and r["method"] == m and r["N"] == n
            and "error" not in r]


def report(results, device, sizes, args, skipped):
    import numpy as np

    env = [e for e, on in (("THP_MEM_ALLOC_ENABLE=1", args.thp),
                           ("OMP_WAIT_POLICY=PASSIVE", args.omp_passive)) if on]
    print(f"\n## {device}, B=1, H={H}, D={D}, float32, forward"
          + (f" ({', '.join(env)})" if env else " (default environment)"))
    print("\n| N | sliced ReLU | ReLU-bump | naive O(N²) | SDPA | SDPA / sliced ReLU |"
          " peak extra: ReLU | bump | naive | SDPA |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for n in sizes:
        t = {m: median_time(_rows(results, device, m, n)) for m in METHODS}
        pk = {m: max([r["peak_extra_bytes"] for r in _rows(results, device, m, n)], default=None)
              for m in METHODS}
        ratio = f"{t['sdpa'] / t['relu']:.0f}×" if t["sdpa"] and t["relu"] else "—"
        cells = [fmt_t(t[m]) if t[m] is not None else ("skipped" if (m, n) in skipped else "—")
                 for m in METHODS]
        print(f"| {n} | " + " | ".join(cells) + f" | {ratio} | "
              + " | ".join(fmt_m(pk[m]) for m in METHODS) + " |")
    for m in ("relu", "bump"):
        pts = [(n, median_time(_rows(results, device, m, n))) for n in sizes if n >= 1 << 14]
        pts = [(n, t) for n, t in pts if t]
        if len(pts) >= 2:
            x, y = np.log([p[0] for p in pts]), np.log([p[1] for p in pts])
            slope = float(np.polyfit(x, y, 1)[0])
            print(f"\n{m}: fitted exponent of time vs N over N = {pts[0][0]}..{pts[-1][0]}: {slope:.3f}")
        mem = [(n, max(r["peak_extra_bytes"] for r in _rows(results, device, m, n)))
               for n in sizes if _rows(results, device, m, n) and n >= 1 << 14]
        if len(mem) >= 2:
            x, y = np.log([p[0] for p in mem]), np.log([max(p[1], 1) for p in mem])
            print(f"{m}: fitted exponent of peak extra memory vs N: {float(np.polyfit(x, y, 1)[0]):.3f}")
        acc = [r["accuracy"] for r in results if r["device"] == device and r["method"] == m
               and r.get("accuracy") is not None]
        if acc:
            print(f"{m}: float32 relative error at N = {sizes[-1]} against float64: {acc[0]:.2e}")
    for m, base in (("relu_fb", "relu"), ("bump_fb", "bump")):
        for n in args.fb_sizes:
            tf, tb = median_time(_rows(results, device, base, n)), median_time(_rows(results, device, m, n))
            if tf and tb:
                pk = max(r["peak_extra_bytes"] for r in _rows(results, device, m, n))
                print(f"{m} N={n}: forward+backward {fmt_t(tb)} = {tb / tf:.2f}× forward "
                      f"({fmt_t(tf)}), peak extra {fmt_m(pk)}")
    for m in MODEL_METHODS:
        for n in args.model_sizes:
            rows = _rows(results, device, m, n)
            if rows:
                print(f"{m} N_x={n}: forward+backward {fmt_t(median_time(rows))}, "
                      f"peak extra {fmt_m(max(r['peak_extra_bytes'] for r in rows))}")
    for k, why in skipped.items():
        print(f"skipped {k[0]} at N={k[1]}: {why}")
    loads = [r["load"] for r in results if r["device"] == device and "load" in r]
    if loads:
        print(f"load average during the run: {min(loads):.1f}..{max(loads):.1f} "
              f"(threads: {results[0].get('threads')})")


def plot(results, devices, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    labels = {"relu": "sliced ReLU (opsplit)", "bump": "ReLU-bump (opsplit)",
              "naive": "naive O(N²)", "sdpa": "torch SDPA"}
    for device in devices:
        for m in METHODS:
            ns = sorted({r["N"] for r in results if r["method"] == m and r["device"] == device
                         and "error" not in r})
            if not ns:
                continue
            ts = [median_time(_rows(results, device, m, n)) for n in ns]
            pk = [max(r["peak_extra_bytes"] for r in _rows(results, device, m, n)) / 2**20 for n in ns]
            lab = labels[m] + ("" if device == "cpu" else f" [{device}]")
            axes[0].loglog(ns, ts, "o-", label=lab)
            axes[1].loglog(ns, pk, "o-", label=lab)
    ns = sorted({r["N"] for r in results})
    if ns:
        ref = [ns[0] * math.log(ns[0])]
        base = [r for r in results if r["method"] == "relu" and r["N"] == ns[0] and "error" not in r]
        if base:
            t0 = median_time(base)
            axes[0].loglog(ns, [t0 * n * math.log(n) / ref[0] for n in ns], "k:", lw=1, label="∝ N log N")
    axes[0].set(xlabel="N (tokens)", ylabel="time per call (s)", title="forward, B=1, H=4, D=64, float32")
    axes[1].set(xlabel="N (tokens)", ylabel="peak extra memory (MiB)", title="peak memory of the call")
    for a in axes:
        a.grid(True, which="both", alpha=0.3)
        a.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    print(f"wrote {path}")


# ----------------------------------------------------------------------------- paired
def seed_reference_relu(zq, zk, v):
    """Paper 004's reference algorithm for eq. (3) (proof of Prop. 2.1), the baseline of the
    paired comparison: concatenate the keys and the queries into one array of 2T scalars
    with gamma = (v - mean v, 0), sort it, take the cumulative sums a_i = sum gamma and
    b_i = sum z gamma (and their scalar analogues for the denominator), form
    z_i a_i - b_i at every sorted position, unsort, and keep the query positions.
    ``zq``, ``zk``: (R, T); ``v``: (R, T, D)."""
    import torch

    R, T = zk.shape
    Dv = v.shape[-1]
    vc = v - v.mean(1, keepdim=True)
    z = torch.cat([zk, zq], 1)  # (R, 2T)
    gam = torch.cat([vc, torch.zeros_like(vc)], 1)  # (R, 2T, D)
    ind = torch.cat([torch.ones_like(zk), torch.zeros_like(zq)], 1)
    zs, order = torch.sort(z, dim=1)
    gs = gam.gather(1, order.unsqueeze(-1).expand(R, 2 * T, Dv))
    a = torch.cumsum(gs, 1)
    b = torch.cumsum(gs * zs.unsqueeze(-1), 1)
    num = zs.unsqueeze(-1) * a - b
    ws = ind.gather(1, order)
    A = torch.cumsum(ws, 1)
    Bk = torch.cumsum(ws * zs, 1)
    den = zs * (2 * A - A[:, -1:]) - (2 * Bk - Bk[:, -1:])  # sum_l |z_i - k_l|
    out_sorted = num / den.unsqueeze(-1)
    out = torch.empty_like(out_sorted).scatter_(
        1, order.unsqueeze(-1).expand(R, 2 * T, Dv), out_sorted)
    return out[:, T:]


def paired(args):
    """Full (non-causal) sliced ReLU forward (eq. 3) against the seed's reference algorithm
    at each T, and against torch SDPA at --sdpa-T: in one process, calls interleaved A B A B,
    the median (and min..max) of the per-pair time ratios over --runs pairs.
    Beside the wall-time ratios, the ratios of the calls' CPU time (``time.thread_time``: the
    time the thread ran, page faults included, waits for a busy core excluded; with
    ``--threads 1`` that is all of a call's work)."""
    import torch

    from opsplit.functional import sliced_relu_attention

    torch.manual_seed(0)
    if args.threads:
        torch.set_num_threads(args.threads)
    print(f"# paired, B=1, H={H}, D={D}, float32, forward; threads {torch.get_num_threads()}, "
          f"OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY', '(unset)')}; "
          f"load average {os.getloadavg()[0]:.1f}")

    cpu = {}  # per-call CPU time of this thread (time.thread_time) beside the wall time

    def timed(f):
        c0, t0 = time.thread_time(), time.perf_counter()
        f()
        t1, c1 = time.perf_counter(), time.thread_time()
        cpu[f] = c1 - c0
        return t1 - t0

    def pair(fa, fb, runs, warm=2):
        """Wall-time medians and ratios; the CPU-time ratios (not counting the time the
        thread waits for a core on a shared machine) go to ``cpu_ratio``."""
        for _ in range(warm):
            fa()
            fb()
        ta, tb, ca, cb = [], [], [], []
        for _ in range(runs):
            ta.append(timed(fa))
            ca.append(cpu[fa])
            tb.append(timed(fb))
            cb.append(cpu[fb])
        r = [a / b for a, b in zip(ta, tb)]
        rc = [a / b for a, b in zip(ca, cb)]
        cpu_ratio[0] = (statistics.median(rc), min(rc), max(rc))
        return statistics.median(ta), statistics.median(tb), statistics.median(r), min(r), max(r)

    cpu_ratio = [None]
    rows = []
    print("\n| T | seed reference | opsplit sliced | speed-up (median of pairs) | min..max "
          "| CPU-time speed-up (min..max) |")
    print("|---|---|---|---|---|---|")
    for T in args.paired_sizes:
        zq, zk = torch.randn(1, H, T), torch.randn(1, H, T)
        v = torch.randn(1, H, T, D)
        def ref(zq=zq, zk=zk, v=v, T=T):
            return seed_reference_relu(zq.view(H, T), zk.view(H, T), v.view(H, T, D))

        def ours(zq=zq, zk=zk, v=v):
            return sliced_relu_attention(zq, zk, v)

        with torch.no_grad():
            err = float((ours().view(H, T, D) - ref()).abs().max() / ref().abs().max())
            ta, tb, rm, rlo, rhi = pair(ref, ours, args.runs)
        cm, clo, chi = cpu_ratio[0]
        rows.append({"T": T, "seed_s": ta, "ours_s": tb, "ratio": rm, "min": rlo, "max": rhi,
                     "cpu_ratio": cm, "cpu_min": clo, "cpu_max": chi, "rel_diff": err})
        print(f"| {T} | {fmt_t(ta)} | {fmt_t(tb)} | {rm:.1f}× | {rlo:.1f}..{rhi:.1f}× |"
              f" {cm:.1f}× ({clo:.1f}..{chi:.1f}×) |  (max rel. difference {err:.1e})", flush=True)
    T = args.sdpa_T
    if T:
        q, k, v = (torch.randn(1, H, T, D) for _ in range(3))
        zq, zk = torch.randn(1, H, T), torch.randn(1, H, T)
        sd = lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v)  # noqa: E731
        ours = lambda: sliced_relu_attention(zq, zk, v)  # noqa: E731
        with torch.no_grad():
            ta, tb, rm, rlo, rhi = pair(sd, ours, args.runs, warm=1)
        cm, clo, chi = cpu_ratio[0]
        rows.append({"T": T, "sdpa_s": ta, "ours_s": tb, "ratio": rm, "min": rlo, "max": rhi,
                     "cpu_ratio": cm, "cpu_min": clo, "cpu_max": chi})
        print(f"\nSDPA vs sliced at T = {T}: SDPA {fmt_t(ta)}, sliced {fmt_t(tb)}, "
              f"speed-up {rm:.0f}× (median of pairs; min..max {rlo:.0f}..{rhi:.0f}×); "
              f"CPU time {cm:.0f}× ({clo:.0f}..{chi:.0f}×)")
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / f"{args.tag}_paired.json").write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
