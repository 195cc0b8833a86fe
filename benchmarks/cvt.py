"""Speed of opsplit's CvT (a Stages splitting scheme) against Hugging Face's CvtForImageClassification.

The default ``CvtConfig`` (CvT-13: 3 stages, depths 1, 2, 10, embed dims 64, 192, 384,
1000 labels) is built in ``transformers`` from its config (random weights, no download),
converted with ``opsplit.models.from_hf`` (same weights), and both are timed side by side in
one process on the same input, interleaved A B A B, after one warm-up each:

* ``eval forward``: ``model.eval()`` under ``torch.no_grad()``, logits;
* ``train forward+backward``: ``model.train()`` (the default config has no dropout and no
  drop path; batch norm uses batch statistics), ``logits.square().mean().backward()``,
  gradients reset between runs.

Usage::

    OMP_WAIT_POLICY=PASSIVE python benchmarks/cvt.py [--batch 32] [--size 224] [--repeats 7] [--threads N]

Prints the median timings and the ratios opsplit / HF: of the medians and the median of the
ratios of adjacent (paired) runs; the target (<= 1.15) is judged on the median paired ratio.
The script also checks once that both models give the same logits.
"""

from __future__ import annotations

import argparse
import os
import statistics

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import _common  # noqa: E402
import torch  # noqa: E402

from opsplit.models import from_hf  # noqa: E402


def logits_of(model, x):
    out = model(x)
    return out.logits


def arguments(description: str) -> argparse.ArgumentParser:
    """The options every CvT speed script takes (batch, image size, repeats, threads, modes)."""
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--size", type=int, default=224)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--modes", default="eval,train")
    return ap


def workloads(x, modes: str):
    """``[(name, fn)]``: the timed calls on input ``x`` — ``eval forward`` (no grad) and
    ``train forward+backward`` (gradients reset first) — of those named in ``modes``."""

    def eval_fwd(model):
        model.eval()
        with torch.no_grad():
            logits_of(model, x)

    def train_fwd_bwd(model):
        model.train()
        for p in model.parameters():
            p.grad = None
        logits_of(model, x).square().mean().backward()

    return [(m, fn) for m, fn in (("eval forward", eval_fwd), ("train forward+backward", train_fwd_bwd))
            if m.split()[0] in modes]


def main(argv=None):
    args = arguments(__doc__.split("\n")[0]).parse_args(argv)
    import transformers

    _common.threads(args.threads)
    torch.manual_seed(0)
    hf = transformers.CvtForImageClassification(transformers.CvtConfig()).eval()
    ours = from_hf(hf)
    x = torch.randn(args.batch, 3, args.size, args.size)
    with torch.no_grad():
        d = (logits_of(ours, x[:2]) - logits_of(hf, x[:2])).abs().max().item()
    print(f"CvT-13, batch {args.batch} of {args.size}x{args.size}, float32, {torch.get_num_threads()} threads, "
          f"OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY')}; max |logits difference| = {d:.2e}")

    results = {}
    for mode, fn in workloads(x, args.modes):
        t = _common.interleaved({"HF": lambda fn=fn: fn(hf), "opsplit": lambda fn=fn: fn(ours)}, args.repeats)
        th, to = t["HF"], t["opsplit"]
        mh, mo = statistics.median(th), statistics.median(to)
        paired = statistics.median(_common.ratios(to, th))
        results[mode] = paired
        print(f"{mode:>24}: HF {mh * 1e3:9.1f} ms   opsplit {mo * 1e3:9.1f} ms   ratio of medians {mo / mh:5.3f}   "
              f"median paired ratio {paired:5.3f}   (runs: HF {[round(t, 3) for t in th]}, "
              f"opsplit {[round(t, 3) for t in to]})")
    ok = all(r <= 1.15 for r in results.values())
    print("target opsplit <= 1.15 x HF (median paired ratio):", "met" if ok else "NOT met")


if __name__ == "__main__":
    main()
