"""Execute the notebooks in examples/ and store them with their outputs.

    python scripts/run_notebooks.py                # every notebook, in full, stored executed
    python scripts/run_notebooks.py c_training     # one (or several) by name
    python scripts/run_notebooks.py --check        # which stored notebooks are stale (exit 1 if any)

Each notebook runs top to bottom in a fresh kernel (``scripts/build_docs.execute``: this
checkout's opsplit, ``OPSPLIT_QUICK=0``, one torch thread unless ``OMP_NUM_THREADS`` says
otherwise), and is written back with its outputs (each notebook seeds its own random draws;
figures as PNG in a 256-colour palette, to keep the repository small), a closing note of
the machine and the time it took, and in its metadata (``metadata.opsplit``) the SHA-256
of its code cells.  tests/test_notebooks.py fails when a stored notebook's code cells no
longer have that hash -- a cell was edited after the outputs were stored -- so the outputs
on a code host or in the docs cannot silently go stale: edit a notebook, then rerun this
script on it.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import hashlib
import json
import os
import platform
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
import build_docs  # noqa: E402

#: the metadata key of what this script stored
KEY = "opsplit"
#: the tag of the closing note cell (replaced on every run)
NOTE_TAG = "opsplit-run-note"


def code_hash(nb) -> str:
    """SHA-256 of the notebook's code cells (their sources, in order; outputs, markdown
    and metadata left out)."""
    sources = [c.source for c in nb.cells if c.cell_type == "code"]
    return hashlib.sha256(json.dumps(sources, ensure_ascii=False).encode("utf-8")).hexdigest()


def stale(nb) -> str | None:
    """Why the stored outputs of ``nb`` are not those of its code (``None``: they are)."""
    meta = nb.metadata.get(KEY)
    if not meta or "code_sha256" not in meta:
        return "it was not stored by scripts/run_notebooks.py (no metadata.opsplit.code_sha256)"
    if meta["code_sha256"] != code_hash(nb):
        return "its code cells changed after its outputs were stored"
    unrun = [i for i, c in enumerate(nb.cells) if c.cell_type == "code" and c.source.strip()
             and c.get("execution_count") is None]
    if unrun:
        return f"code cells {unrun} have no stored execution"
    return None


def shrink_figures(nb) -> None:
    """Store each PNG figure with a 256-colour palette (a plot's colours fit; about a third
    of the bytes of matplotlib's RGBA file, the same pixels count), when that is smaller."""
    import base64
    import io

    from PIL import Image

    for c in nb.cells:
        for o in c.get("outputs", []):
            data = o.get("data", {})
            if "image/png" not in data:
                continue
            raw = base64.b64decode(data["image/png"])
            buf = io.BytesIO()
            Image.open(io.BytesIO(raw)).convert("RGB").quantize(256).save(buf, "PNG", optimize=True)
            if buf.tell() < len(raw):
                data["image/png"] = base64.b64encode(buf.getvalue()).decode("ascii")


def machine() -> dict:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    import torch

    return {"cpu": cpu, "cores": os.cpu_count(), "threads": os.environ.get("OMP_NUM_THREADS", ""),
            "load": round(os.getloadavg()[0], 1) if hasattr(os, "getloadavg") else None,
            "system": f"{platform.system()} {platform.release()}", "python": platform.python_version(),
            "torch": torch.__version__}


def _note(meta: dict) -> str:
    m = meta["machine"]
    return (f"*Stored outputs: executed top to bottom by `python scripts/run_notebooks.py "
            f"{meta['name']}` on {meta['date']} in {meta['seconds']:.0f} s: {m['cpu']}, {m['cores']} cores, "
            f"{m['threads'] or 'default'} torch thread(s), {m['system']}, Python {m['python']}, torch "
            f"{m['torch']}; load average {m.get('load')} when it started (other work on the machine). Timings "
            f"printed above are of that machine at that load.*")


def store(path: Path, verbose: bool = True, timeout: int = 3600) -> float:
    """Execute ``path`` in full and write it back with its outputs; returns the seconds.
    ``timeout``: seconds one cell may take (a training cell on a loaded machine is slow)."""
    import nbformat

    started = machine()
    t0 = time.perf_counter()
    nb = build_docs.execute(path, timeout=timeout, quick=False)
    seconds = time.perf_counter() - t0
    for c in nb.cells:  # no per-cell timestamps: a rerun changes only what the code prints
        c.metadata.pop("execution", None)
    shrink_figures(nb)
    nb.cells = [c for c in nb.cells if NOTE_TAG not in c.metadata.get("tags", [])]
    meta = {"code_sha256": code_hash(nb), "name": path.stem, "seconds": round(seconds, 1),
            "date": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"), "machine": started}
    nb.cells.append(nbformat.v4.new_markdown_cell(_note(meta), metadata={"tags": [NOTE_TAG]}))
    nb.metadata[KEY] = meta
    nb.metadata.pop("widgets", None)
    nbformat.validate(nb)
    nbformat.write(nb, path)
    if verbose:
        size = path.stat().st_size / 1024
        print(f"  {path.name}: executed in {seconds:.0f} s, stored ({size:.0f} KiB)", flush=True)
    return seconds


def main(argv=None) -> int:
    import nbformat

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("names", nargs="*", help="notebooks by name (a_convergence or examples/a_convergence.ipynb); "
                   "default: all")
    p.add_argument("--check", action="store_true", help="only report stale notebooks")
    p.add_argument("--timeout", type=int, default=3600, help="seconds one cell may take (default 3600)")
    a = p.parse_args(argv)
    paths = build_docs.notebooks()
    if a.names:
        want = {Path(n).stem for n in a.names}
        unknown = want - {q.stem for q in paths}
        if unknown:
            p.error(f"no such notebook in examples/: {', '.join(sorted(unknown))}")
        paths = [q for q in paths if q.stem in want]
    if a.check:
        bad = [(q, stale(nbformat.read(q, as_version=4))) for q in paths]
        bad = [(q, why) for q, why in bad if why]
        for q, why in bad:
            print(f"{q.relative_to(ROOT)}: stale: {why}; rerun python scripts/run_notebooks.py {q.stem}")
        return 1 if bad else 0
    os.environ.setdefault("OMP_NUM_THREADS", "1")  # the timings a notebook prints: one thread, as the CLI
    print(f"executing {len(paths)} notebook(s) in full ...", flush=True)
    for q in paths:
        store(q, timeout=a.timeout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
