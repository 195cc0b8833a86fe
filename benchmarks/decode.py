"""Decode-step time against the context length: causal sliced attention with the sorted runs
of ``opsplit.functional.sliced_runs`` (new), with the direct O(n D) sums over the cached
scores and values (old), and softmax attention with its key/value cache, in one process.

Three ``DecoderLM`` of the same shape (d_model 64, 2 layers, 4 heads, d_ff 256, LayerNorm,
GELU MLP, learned positions; ``--d-model``, ``--layers``, ``--heads``): two with
``attention="sliced_relu"`` (one model, two caches: ``KVCache()`` keeps sorted runs,
``KVCache(sorted_runs=False)`` the scores and values) and one with ``attention="softmax"``
(head size 16).  For each context length ``n`` (1K ... 256K) every cache is filled with ``n``
random tokens' keys and values per layer (the step's cost does not depend on their values; a
prefill through the models would take minutes for the sliced ones and hours for softmax at
256K: O(n^2)), the new cache by appending them (its runs are built as a prefill builds them,
timed), and then decode steps (one token, ``DecoderLM.decode_steps``, as ``generate`` runs
them) are timed (the process's CPU time with one thread, which a loaded machine inflates
less than wall-clock time; ``--wall`` for wall-clock) interleaved, new / old / softmax / new / old / ..., ``--runs`` times after a
warm-up: the medians per kind and the medians of the paired ratios old/new and softmax/new.
The new cache's median step does not merge large runs (it appends to a tail of 32 keys and
merges it into the runs every 32 steps); ``--mean-steps`` consecutive steps are timed as well
(their mean includes the merges of that stretch), and the time to build the runs, per key
and layer, is reported: the step at which all runs merge into one of :math:`2^k` keys (once
per power of two) costs about :math:`2^k` times that.  Memory: bytes per cached token and layer
(used, not the geometric capacity) of each cache.

Reported: the table, the exponents of the new step's time (log t(64K)/t(4K) / log 16 and
log t(256K)/t(64K) / log 4), the crossover n from which the new step is faster than the
softmax step, the load (``uptime``) before and after, and a plot (``--plot``).

Usage::

    OMP_WAIT_POLICY=PASSIVE python benchmarks/decode.py [--sizes 1024 ... 262144] [--runs 9]
        [--threads 1] [--plot docs/figures/decode.png]
    OMP_WAIT_POLICY=PASSIVE python benchmarks/decode.py --prefill --sizes 4096 16384 65536
        # the prefill: the runs built from the causal forward's sorts, per token and layer
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import subprocess
import time

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402

from opsplit.models import DecoderConfig, DecoderLM  # noqa: E402
from opsplit.operators import KVCache  # noqa: E402

KINDS = ("new", "old", "softmax")


def load() -> str:
    try:
        return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip().split("load average:")[-1]
    except OSError:
        return "?"


def models(E: int, L: int, H: int, max_pos: int):
    kw = dict(vocab_size=256, d_model=E, n_layers=L, n_heads=H, d_ff=4 * E, norm="layer", mlp="plain",
              activation="gelu", positions="learned", max_positions=max_pos)
    g = torch.Generator().manual_seed(0)
    sliced = DecoderLM(DecoderConfig(attention="sliced_relu", **kw), generator=g).eval()
    soft = DecoderLM(DecoderConfig(attention="softmax", **kw), generator=g).eval()
    return sliced, soft


def fill(model: DecoderLM, n: int, kind: str, seed: int = 1):
    """A cache of ``n`` random tokens per layer (step time) for ``kind``; the new cache's run
    building is timed (seconds)."""
    cache = KVCache(sorted_runs=kind == "new")
    op, c = model.attention, model.config
    g = torch.Generator().manual_seed(seed)
    built = 0.0
    cache.begin(n)  # one call of n tokens: every layer's entry holds them
    for t in model.decoder.times(None)[:-1]:
        if kind == "softmax":
            k = torch.randn(1, c.n_kv_heads, n, c.head_dim, generator=g)
            cache.update(op, t, k, torch.randn(k.shape, generator=g), key_max=float(k.abs().amax()))
        else:
            zk, v = torch.randn(1, c.n_heads, n, generator=g), torch.randn(1, c.n_heads, n, c.d_model, generator=g)
            if kind == "old":
                cache.update(op, t, zk, v)
            else:
                runs = op.cache_state(cache, t).runs
                t0 = time.process_time()
                runs.append(zk, v)
                built += time.process_time() - t0
    return cache, built


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", type=int, nargs="+", default=[1 << k for k in range(10, 19)])
    ap.add_argument("--runs", type=int, default=9)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--mean-steps", type=int, default=64)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--d-model", type=int, default=64)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--plot", default=None)
    ap.add_argument("--wall", action="store_true",
                    help="time wall-clock (default: the process's CPU time, 1 thread: robust to a loaded machine)")
    ap.add_argument("--prefill", action="store_true",
                    help="the prefill instead: the causal forward kernel alone, the prefill step of a fresh "
                         "SlicedDecodeCache (the forward, then the runs from its sorts), and the runs built by "
                         "appending the keys to a fresh cache (sorted again), paired, per token and layer")
    args = ap.parse_args()
    if args.prefill:
        return prefill(args)
    clock = time.perf_counter if args.wall else time.process_time
    torch.set_num_threads(args.threads)
    E, L, H = args.d_model, args.layers, args.heads
    max_pos = max(args.sizes) + args.runs + args.warmup + args.mean_steps + 8
    sliced, soft = models(E, L, H, max_pos)
    model = {"new": sliced, "old": sliced, "softmax": soft}
    print(f"DecoderLM d_model {E}, {L} layers, {H} heads, float32, {args.threads} thread(s), torch {torch.__version__}, "
          f"{'wall-clock' if args.wall else 'process CPU'} time")
    print(f"load before: {load()}")
    rows = []
    with torch.no_grad():
        for n in args.sizes:
            caches, steps, built, mem = {}, {}, 0.0, {}
            for kind in KINDS:
                caches[kind], b = fill(model[kind], n, kind)
                built += b
                steps[kind] = model[kind].decode_steps(caches[kind])
                mem[kind] = caches[kind].nbytes() / (n * L)
            tok = torch.tensor([[7]])
            times = {k: [] for k in KINDS}
            for r in range(args.warmup + args.runs):
                for kind in KINDS:
                    pos = torch.tensor([[caches[kind].length]])
                    t0 = clock()
                    steps[kind](tok, pos, None)
                    dt = clock() - t0
                    if r >= args.warmup:
                        times[kind].append(dt)
            ratios = {k: statistics.median(a / b for a, b in zip(times[k], times["new"])) for k in ("old", "softmax")}
            med = {k: statistics.median(v) for k, v in times.items()}
            # consecutive new steps (their mean includes the tail merges of that stretch)
            c = caches["new"]
            t0 = clock()
            for _ in range(args.mean_steps):
                steps["new"](tok, torch.tensor([[c.length]]), None)
            mean_new = (clock() - t0) / args.mean_steps
            del caches, steps
            rows.append(dict(n=n, **{f"t_{k}": med[k] for k in KINDS}, r_old=ratios["old"], r_soft=ratios["softmax"],
                             mean_new=mean_new, build=built / (L * n), **{f"m_{k}": mem[k] for k in KINDS}))
            r = rows[-1]
            print(f"n={n:7d}  new {r['t_new'] * 1e3:8.3f} ms (mean of {args.mean_steps}: {mean_new * 1e3:7.3f})  "
                  f"old {r['t_old'] * 1e3:9.3f} ms  softmax {r['t_softmax'] * 1e3:8.3f} ms  old/new {r['r_old']:7.2f}  "
                  f"softmax/new {r['r_soft']:6.2f}  runs built {r['build'] * 1e6:6.2f} us/token/layer  "
                  f"bytes/token/layer new {mem['new']:.0f} old {mem['old']:.0f} softmax {mem['softmax']:.0f}",
                  flush=True)
    print(f"load after: {load()}")
    by_n = {r["n"]: r for r in rows}

    def slope(a, b, key="t_new"):
        if a in by_n and b in by_n:
            return math.log(by_n[b][key] / by_n[a][key]) / math.log(b / a)
        return float("nan")

    print(f"exponent of the new step 4K -> 64K: {slope(4096, 65536):.3f} (target <= 0.35); "
          f"64K -> 256K: {slope(65536, 262144):.3f} (target <= 0.25)")
    print(f"exponent of the old step 4K -> 64K: {slope(4096, 65536, 't_old'):.3f}; softmax: "
          f"{slope(4096, 65536, 't_softmax'):.3f}")
    cross = next((r["n"] for r in rows if r["r_soft"] > 1), None)
    print(f"crossover: the new sliced step is faster than the softmax step from n = {cross} (of the sizes run)")
    if 65536 in by_n:
        r = by_n[65536]
        print(f"at 64K: old/new {r['r_old']:.1f} (target >= 10), softmax/new {r['r_soft']:.2f} (target > 1)")
    print("memory (bytes per token and layer): new / softmax = "
          + ", ".join(f"{r['m_new'] / r['m_softmax']:.2f}" for r in rows[-1:]))
    if args.plot:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        ns = [r["n"] for r in rows]
        fig, ax = plt.subplots(figsize=(6, 4))
        for k, lab in (("t_new", "sliced, sorted runs (new)"), ("t_old", "sliced, direct sums (old)"),
                       ("t_softmax", "softmax, KV cache")):
            ax.loglog(ns, [r[k] * 1e3 for r in rows], "o-", label=lab)
        ax.set_xlabel("cached tokens n")
        ax.set_ylabel("decode step (ms), median")
        ax.set_title(f"DecoderLM d_model {E}, {L} layers, {H} heads, float32, CPU {args.threads} thread")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend()
        fig.tight_layout()
        fig.savefig(args.plot, dpi=120)
        print(f"wrote {args.plot}")


def prefill(args):
    """Prefill cost of one layer's causal sliced attention (``--heads`` heads, values of width
    ``--d-model``, float32): per size, ``--runs`` rounds of (forward kernel, prefill step,
    append), timed (process CPU time, one thread unless --threads); the runs' build time per
    token and layer is the paired difference prefill - forward (the runs from the forward's
    sorts) against an append to an empty cache (the runs sorted again)."""
    from opsplit.functional import causal_sliced_relu_attention
    from opsplit.functional.sliced_runs import SlicedDecodeCache

    clock = time.perf_counter if args.wall else time.process_time
    torch.set_num_threads(args.threads)
    H, D = args.heads, args.d_model
    print(f"prefill of one layer: {H} heads, values of width {D}, float32, {args.threads} thread(s), "
          f"{'wall-clock' if args.wall else 'process CPU'} time; load before: {load()}")
    print("| n | forward kernel | prefill (forward + runs) | runs from the forward's sorts, per token | "
          "runs sorted again (append), per token |")
    print("|---|---|---|---|---|")
    rows = []
    with torch.no_grad():
        for n in args.sizes:
            g = torch.Generator().manual_seed(n)
            zq, zk = torch.randn(1, H, n, generator=g), torch.randn(1, H, n, generator=g)
            v = torch.randn(1, H, n, D, generator=g)
            calls = {"forward": lambda zq=zq, zk=zk, v=v: causal_sliced_relu_attention(zq, zk, v),
                     "prefill": lambda zq=zq, zk=zk, v=v: SlicedDecodeCache().step_relu(zq, zk, v),
                     "append": lambda zk=zk, v=v: SlicedDecodeCache().append(zk, v)}
            times = {k: [] for k in calls}
            for r in range(args.warmup + args.runs):
                for k, f in calls.items():
                    t0 = clock()
                    f()
                    if r >= args.warmup:
                        times[k].append(clock() - t0)
            shared = statistics.median(b - a for a, b in zip(times["forward"], times["prefill"])) / n
            again = statistics.median(times["append"]) / n
            row = {"n": n, "forward": statistics.median(times["forward"]), "prefill": statistics.median(times["prefill"]),
                   "runs_shared_per_token": shared, "runs_sorted_per_token": again}
            rows.append(row)
            print(f"| {n} | {row['forward'] * 1e3:.1f} ms | {row['prefill'] * 1e3:.1f} ms | {shared * 1e6:.2f} us | "
                  f"{again * 1e6:.2f} us |", flush=True)
    print(f"load after: {load()}")
    return rows


if __name__ == "__main__":
    main()
