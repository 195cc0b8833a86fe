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

import importlib.util
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from opsplit.models import from_hf  # noqa: E402

sys.path.insert(0, str(ROOT / "benchmarks"))
from cvt import arguments, workloads  # noqa: E402


def load_revision(rev: str, into: Path):
    """opsplit as of git revision ``rev``, imported as the package ``opsplit_ref``."""
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", rev, "opsplit"], check=True, capture_output=True)
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive.stdout, check=True)
    init = into / "opsplit" / "__init__.py"
    spec = importlib.util.spec_from_file_location("opsplit_ref", init, submodule_search_locations=[str(init.parent)])
    module = importlib.util.module_from_spec(spec)
    sys.modules["opsplit_ref"] = module
    spec.loader.exec_module(module)
    return importlib.import_module("opsplit_ref.models")


def paired(times: dict, a: str, b: str) -> float:
    """The median of the ratios of ``a``'s and ``b``'s runs taken side by side."""
    return statistics.median(ta / tb for ta, tb in zip(times[a], times[b]))


def main(argv=None):
    ap = arguments(__doc__.split("\n")[0])
    ap.set_defaults(batch=4)
    ap.add_argument("--ref", required=True, help="git revision to compare with (e.g. main)")
    args = ap.parse_args(argv)
    import transformers

    if args.threads:
        torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        ref_models = load_revision(args.ref, Path(tmp))
        torch.manual_seed(0)
        hf = transformers.CvtForImageClassification(transformers.CvtConfig()).eval()
        models = {"HF": hf, "ref": ref_models.from_hf(hf), "this": from_hf(hf)}
        x = torch.randn(args.batch, 3, args.size, args.size)
        with torch.no_grad():
            d = (models["this"](x[:2]).logits - models["ref"](x[:2]).logits).abs().max().item()
        print(f"CvT-13, batch {args.batch} of {args.size}x{args.size}, float32, {torch.get_num_threads()} threads, "
              f"reference {args.ref}; max |logits this - reference| = {d:.2e}")

        for mode, fn in workloads(x, args.modes):
            for m in models.values():
                fn(m)  # warm-up
            t = {k: [] for k in models}
            for _ in range(args.repeats):
                for k, m in models.items():
                    t0 = time.perf_counter()
                    fn(m)
                    t[k].append(time.perf_counter() - t0)

            med = {k: statistics.median(v) * 1e3 for k, v in t.items()}
            print(f"{mode:>24}: HF {med['HF']:8.1f} ms  reference {med['ref']:8.1f} ms  this {med['this']:8.1f} ms   "
                  f"paired: reference/HF {paired(t, 'ref', 'HF'):5.3f}  this/HF {paired(t, 'this', 'HF'):5.3f}  "
                  f"this/reference {paired(t, 'this', 'ref'):5.3f}")
            print(" " * 26 + "runs (s): " + "; ".join(f"{k} {[round(v, 2) for v in t[k]]}" for k in t))


if __name__ == "__main__":
    main()
