"""The notebooks in examples/ run top to bottom (nbclient, a fresh kernel each), and are
committed without outputs (issue 12).  Slow: about a minute each on 2 cores."""

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
def test_notebook_runs_top_to_bottom(path):
    if path.stem.startswith("c_"):
        pytest.importorskip("opsplit.control", reason="the training notebook needs the trainer")
    nb = build_docs.execute(path)  # raises CellExecutionError on the first failing cell
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    # a story with plots: at least one figure, and printed results
    assert any("image/png" in o.get("data", {}) for o in outputs), "no figure"
    assert any(o.output_type == "stream" for o in outputs), "nothing printed"
