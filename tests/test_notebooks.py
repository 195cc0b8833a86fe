"""The notebooks in examples/ are stored executed, with their outputs (figures included),
by scripts/run_notebooks.py, and run top to bottom here (nbclient, a fresh kernel each).

The stored outputs are those of the stored code: each notebook keeps the SHA-256 of its
code cells from when the script executed it, and a notebook whose code cells changed since
fails here (rerun ``python scripts/run_notebooks.py NAME``).  They run here with
``OPSPLIT_QUICK=1`` (smaller grids, fewer time steps, shorter training and sequences; the
same cells and checks), 5-20 s each on 2 cores, with their stored outputs cleared first;
this test converts each executed notebook to its page (figures included) as the docs build
does, and tests/test_docs.py builds the site from the stored notebooks."""

from __future__ import annotations

import copy
import re
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
import run_notebooks  # noqa: E402


def test_there_are_notebooks():
    names = {p.stem for p in NOTEBOOKS}
    for prefix in ("a_", "b_", "c_", "d_", "e_", "f_"):
        assert any(n.startswith(prefix) for n in names), (prefix, names)


def _outputs(nb):
    return [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_stored_with_outputs_of_its_code(path):
    """Executed by scripts/run_notebooks.py from the code it holds now: every code cell
    run, printed results and figures stored, no error, a note of the machine and time."""
    nb = nbformat.read(path, as_version=4)
    why = run_notebooks.stale(nb)
    assert why is None, f"examples/{path.name}: {why}; rerun: python scripts/run_notebooks.py {path.stem}"
    outputs = _outputs(nb)
    assert not [o for o in outputs if o.output_type == "error"]
    assert any("image/png" in o.get("data", {}) for o in outputs), "no stored figure"
    assert any(o.output_type == "stream" for o in outputs), "nothing printed"
    note = [c for c in nb.cells if run_notebooks.NOTE_TAG in c.metadata.get("tags", [])]
    meta = nb.metadata[run_notebooks.KEY]
    assert len(note) == 1 and f"in {meta['seconds']:.0f} s" in note[0].source and meta["machine"]["cpu"]


def test_staleness_check_catches_an_edited_cell():
    nb = nbformat.read(NOTEBOOKS[0], as_version=4)
    assert run_notebooks.stale(nb) is None
    code = [i for i, c in enumerate(nb.cells) if c.cell_type == "code"]
    edited = copy.deepcopy(nb)
    edited.cells[code[-1]].source += "\nprint('edited')"
    assert run_notebooks.stale(edited) == "its code cells changed after its outputs were stored"
    added = copy.deepcopy(nb)
    added.cells.append(nbformat.v4.new_code_cell("x = 1"))
    assert run_notebooks.stale(added) is not None
    dropped = copy.deepcopy(nb)
    del dropped.cells[code[0]]
    assert run_notebooks.stale(dropped) is not None
    prose = copy.deepcopy(nb)  # the prose may change without rerunning the code
    next(c for c in prose.cells if c.cell_type == "markdown").source += " More words."
    assert run_notebooks.stale(prose) is None
    bare = copy.deepcopy(nb)
    del bare.metadata[run_notebooks.KEY]
    assert "not stored by scripts/run_notebooks.py" in run_notebooks.stale(bare)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_renders_with_outputs_without_executing(path, tmp_path):
    """A viewer shows the stored figures and printed output without running anything:
    ``jupyter nbconvert --to html`` where nbconvert is installed, else the docs' converter
    (scripts/build_docs.to_markdown) on the valid notebook."""
    nb = nbformat.read(path, as_version=4)
    nbformat.validate(nb)
    images = sum("image/png" in o.get("data", {}) for o in _outputs(nb))
    try:
        from nbconvert import HTMLExporter
    except ImportError:
        md = build_docs.to_markdown(nb, path.stem, tmp_path).read_text()
        figures = sorted((tmp_path / f"{path.stem}_files").glob("*.png"))
        assert len(figures) == images and all(f.read_bytes()[:4] == b"\x89PNG" for f in figures)
        assert "```text" in md and "Stored outputs: executed" in md
        return
    body, _ = HTMLExporter().from_notebook_node(nb)
    shown = len(re.findall(r'<img [^>]*src="data:image/png;base64,', body))
    assert shown == images and "Stored outputs: executed" in body


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_runs_top_to_bottom(path, tmp_path):
    nb = build_docs.execute(path, quick=True)  # raises CellExecutionError on the first failing cell
    outputs = _outputs(nb)
    assert not [o for o in outputs if o.output_type == "error"]
    # a story with plots: at least one figure, and printed results (made now: execute clears
    # the stored outputs first)
    assert any("image/png" in o.get("data", {}) for o in outputs), "no figure"
    assert any(o.output_type == "stream" for o in outputs), "nothing printed"
    # the page the docs build makes of it: every figure written and linked
    md = build_docs.to_markdown(nb, path.stem, tmp_path).read_text()
    figures = sorted((tmp_path / f"{path.stem}_files").glob("*.png"))
    assert figures and all(f"({path.stem}_files/{f.name})" in md for f in figures)
