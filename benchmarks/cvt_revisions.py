"""Speed of opsplit's CvT against another revision of opsplit and Hugging Face, in one process.

``benchmarks/cvt.py`` measures opsplit / HF; comparing two of its runs (before and after a
change) mixes two processes and two load periods.  This script loads a second copy of
opsplit, the tree of git revision ``--ref`` (``git archive`` into a temporary folder,
imported under the name ``opsplit_ref``), converts the same CvT-13 (default ``CvtConfig``,
random weights from its config, no download) with both, and times HF, the reference and
this tree interleaved A B C, after one warm-up each; it prints the medians and the medians
of the paired ratios this / HF, reference / HF and this / reference.

Usage::

    OMP_WAIT_POLICY=PASSIVE python benchmarks/cvt_revisions.py --ref main [--batch 4] [--size 224] [--repeats 7]
"""

from __future__ import annotations

import importlib
import os
import statistics
import tempfile

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import _common  # noqa: E402
import torch  # noqa: E402
from cvt import arguments, workloads  # noqa: E402

from opsplit.models import from_hf  # noqa: E402


def paired(times: dict, a: str, b: str) -> float:
    """The median of the ratios of ``a``'s and ``b``'s runs taken side by side."""
    return statistics.median(_common.ratios(times[a], times[b]))


def main(argv=None):
    ap = arguments(__doc__.split("\n")[0])
    ap.set_defaults(batch=4)
    ap.add_argument("--ref", required=True, help="git revision to compare with (e.g. main)")
    args = ap.parse_args(argv)
    import transformers

    _common.threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        _common.load_revision(args.ref, tmp, "opsplit_ref")
        ref_models = importlib.import_module("opsplit_ref.models")
        torch.manual_seed(0)
        hf = transformers.CvtForImageClassification(transformers.CvtConfig()).eval()
        models = {"HF": hf, "ref": ref_models.from_hf(hf), "this": from_hf(hf)}
        x = torch.randn(args.batch, 3, args.size, args.size)
        with torch.no_grad():
            d = (models["this"](x[:2]).logits - models["ref"](x[:2]).logits).abs().max().item()
        print(f"CvT-13, batch {args.batch} of {args.size}x{args.size}, float32, {torch.get_num_threads()} threads, "
              f"reference {args.ref}; max |logits this - reference| = {d:.2e}")

        for mode, fn in workloads(x, args.modes):
            t = _common.interleaved({k: (lambda m=m, fn=fn: fn(m)) for k, m in models.items()}, args.repeats)

            med = {k: statistics.median(v) * 1e3 for k, v in t.items()}
            print(f"{mode:>24}: HF {med['HF']:8.1f} ms  reference {med['ref']:8.1f} ms  this {med['this']:8.1f} ms   "
                  f"paired: reference/HF {paired(t, 'ref', 'HF'):5.3f}  this/HF {paired(t, 'this', 'HF'):5.3f}  "
                  f"this/reference {paired(t, 'this', 'ref'):5.3f}")
            print(" " * 26 + "runs (s): " + "; ".join(f"{k} {[round(v, 2) for v in t[k]]}" for k in t))


if __name__ == "__main__":
    main()
