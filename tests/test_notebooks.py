"""The notebooks in examples/ run top to bottom (nbclient, a fresh kernel each), and are
committed without outputs (issue 12).

They run with ``OPSPLIT_QUICK=1`` (smaller grids, fewer time steps, shorter training and
sequences; the same cells and checks), 5-20 s each on 2 cores.  The notebooks execute only
here: tests/test_docs.py builds the site from the unexecuted notebooks, and this test
converts each executed notebook to its page (figures included) as the docs build does."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "examples").glob("*.ipynb"))

nbformat = pytest.importorskip("nbformat")
pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")
sys.path.insert(0, str(ROOT / "scripts"))
import build_docs  # noqa: E402


def test_there_are_notebooks():
    names = {p.stem for p in NOTEBOOKS}
    for prefix in ("a_", "b_", "c_", "d_", "e_", "f_"):
        assert any(n.startswith(prefix) for n in names), (prefix, names)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_committed_without_outputs(path):
    nb = nbformat.read(path, as_version=4)
    for i, cell in enumerate(nb.cells):
        if cell.cell_type == "code":
            assert cell.outputs == [] and cell.execution_count is None, f"{path.name}: cell {i} has outputs"


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_runs_top_to_bottom(path, tmp_path):
    nb = build_docs.execute(path, quick=True)  # raises CellExecutionError on the first failing cell
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    # a story with plots: at least one figure, and printed results
    assert any("image/png" in o.get("data", {}) for o in outputs), "no figure"
    assert any(o.output_type == "stream" for o in outputs), "nothing printed"
    # the page the docs build makes of it: every figure written and linked
    md = build_docs.to_markdown(nb, path.stem, tmp_path).read_text()
    figures = sorted((tmp_path / f"{path.stem}_files").glob("*.png"))
    assert figures and all(f"({path.stem}_files/{f.name})" in md for f in figures)
