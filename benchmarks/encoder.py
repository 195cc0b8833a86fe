"""Speed of the converted torch-exact encoder against torch's own ``nn.TransformerEncoder``.

A 6-layer encoder (B=32, N_x=128, d_model=256, 4 heads, d_ff=1024, ReLU, post-norm,
batch_first, dropout 0) is built in torch, converted with ``opsplit.models.from_torch`` (same
weights), and both are timed side by side in one run, interleaved, medians of ``--repeats``
runs after warm-up:

* ``eval forward``: ``model.eval()`` under ``torch.no_grad()``.  torch then runs its fused
  fast path (``torch._transformer_encoder_layer_fwd``, one native kernel per layer); the
  script checks with the profiler which kernels torch actually ran and prints it.
* ``train forward+backward``: ``model.train()`` (dropout 0, so both compute the same
  function), ``out.square().mean().backward()``, gradients reset between runs.

Usage::

    python benchmarks/encoder.py [--repeats 15] [--threads N] [--device cpu|cuda] [--dtype float32]

Prints the median timings and three ratios opsplit / torch: of the medians, the median of
the ratios of adjacent (paired) runs, and of the minima; the target (<= 1.10) is judged on
the median paired ratio, the estimate least sensitive to load drifting during the run.
"""

from __future__ import annotations

import argparse
import statistics

import _common
import torch
from torch import nn

from opsplit.models import from_torch


def torch_kernels(model, x) -> set[str]:
    from torch.profiler import ProfilerActivity, profile

    with torch.no_grad(), profile(activities=[ProfilerActivity.CPU]) as prof:
        model(x)
    return {e.key for e in prof.key_averages()}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, default=None)
    _common.options(ap, repeats=15, warmup=3, device="cpu", dtype="float32", B=32, N=128, d_model=256, nhead=4,
                    d_ff=1024, layers=6)
    args = ap.parse_args(argv)
    _common.threads(args.threads)
    device, dtype = torch.device(args.device), getattr(torch, args.dtype)
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(args.d_model, args.nhead, args.d_ff, dropout=0.0, batch_first=True,
                                       device=device, dtype=dtype)
    ref = nn.TransformerEncoder(layer, args.layers, enable_nested_tensor=False)
    ops = from_torch(ref)
    x = torch.randn(args.B, args.N, args.d_model, device=device, dtype=dtype)

    print(f"torch {torch.__version__}, device {device}, dtype {dtype}, threads {torch.get_num_threads()}")
    print(f"encoder: {args.layers} layers, B={args.B}, N_x={args.N}, d_model={args.d_model}, "
          f"nhead={args.nhead}, d_ff={args.d_ff}")

    ref.eval(), ops.eval()
    with torch.no_grad():
        err = (ref(x) - ops(x)).abs().max().item()
    print(f"max |opsplit - torch| (eval forward): {err:.3g}")
    if device.type == "cpu":
        k = torch_kernels(ref, x)
        fused = "aten::_transformer_encoder_layer_fwd" in k
        print("torch eval path:", "fused fast path (aten::_transformer_encoder_layer_fwd)" if fused
              else "standard path (no fused kernel found)")

    def fwd(model):
        with torch.no_grad():
            model(x)

    def fwd_bwd(model):
        for p in model.parameters():
            p.grad = None
        model(x).square().mean().backward()

    results = {}
    for name, mode, fn in (("eval forward", "eval", fwd), ("train forward+backward", "train", fwd_bwd)):
        ref.train(mode == "train"), ops.train(mode == "train")
        t = _common.interleaved({"torch": lambda fn=fn: fn(ref), "opsplit": lambda fn=fn: fn(ops)}, args.repeats,
                                warmup=args.warmup, alternate=True,
                                sync=torch.cuda.synchronize if device.type == "cuda" else None)
        tt, to = t["torch"], t["opsplit"]
        mt, mo = statistics.median(tt), statistics.median(to)
        paired = statistics.median(o / t for o, t in zip(to, tt))
        best = min(to) / min(tt)
        results[name] = (mt, mo, paired, best)
        print(f"{name:24s} torch {mt * 1e3:9.1f} ms   opsplit {mo * 1e3:9.1f} ms   "
              f"ratio of medians {mo / mt:5.3f}   median paired ratio {paired:5.3f}   "
              f"ratio of minima {best:5.3f}")
    ok = all(r[2] <= 1.10 for r in results.values())
    print("target opsplit <= 1.10 x torch (median paired ratio):", "met" if ok else "NOT met")
    return results


if __name__ == "__main__":
    main()
