"""The documentation site builds with warnings as errors (``mkdocs build --strict``), with
the API reference from the docstrings and the notebooks as pages (issue 12)."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
pytest.importorskip("mkdocs")
pytest.importorskip("mkdocstrings")
pytest.importorskip("material")
nbformat = pytest.importorskip("nbformat")
sys.path.insert(0, str(ROOT / "scripts"))
import build_docs  # noqa: E402


@pytest.mark.slow
def test_site_builds_strict(tmp_path):
    docs = tmp_path / "docs"
    shutil.copytree(ROOT / "docs", docs, ignore=shutil.ignore_patterns("notebooks"))
    # the notebook pages, converted without executing (tests/test_notebooks.py runs them)
    for path in build_docs.notebooks():
        build_docs.to_markdown(nbformat.read(path, as_version=4), path.stem, docs / "notebooks")
    site = tmp_path / "site"
    build_docs.build_site(site_dir=site, docs_dir=docs)  # raises on any warning
    assert (site / "index.html").is_file()
    html = (site / "api" / "operators" / "index.html").read_text()
    assert "ProjectionS1" in html and "Theorem 3.1" in html  # generated from the docstrings
    for page in ("getting_started", "math", "equivalence", "benchmarks", "notebooks/a_convergence",
                 "cvt", "sliced_causal", "training", "reliability"):
        assert (site / page / "index.html").is_file(), page


def _nav_files(items):
    for item in items:
        value = next(iter(item.values())) if isinstance(item, dict) else item
        if isinstance(value, list):
            yield from _nav_files(value)
        else:
            yield value


def test_every_page_is_in_the_nav():
    """A page added to docs/ (by any piece of work) is listed in mkdocs.yml's nav; the
    strict build would only log it at INFO level."""
    import yaml

    cfg = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
    listed = set(_nav_files(cfg["nav"]))
    pages = {str(p.relative_to(ROOT / "docs")) for p in (ROOT / "docs").rglob("*.md")
             if p.relative_to(ROOT / "docs").parts[0] not in ("_hooks", "notebooks")}
    assert pages - listed == set(), f"pages missing from mkdocs.yml's nav: {sorted(pages - listed)}"
    notebooks = {f"notebooks/{p.stem}.md" for p in build_docs.notebooks()}
    assert notebooks <= listed, sorted(notebooks - listed)


def test_nav_hook_drops_missing_pages(tmp_path):
    sys.path.insert(0, str(ROOT / "docs" / "_hooks"))
    import nav

    (tmp_path / "here.md").write_text("# here\n")
    items = [{"A": "here.md"}, {"B": "missing.md"}, {"S": [{"C": "missing2.md"}]},
             {"T": [{"D": "here.md"}, {"E": "gone.md"}]}, "here.md"]
    assert nav._prune(items, str(tmp_path)) == [{"A": "here.md"}, {"T": [{"D": "here.md"}]}, "here.md"]


# Pages over the limit for now, each with the reason; the lead removes an entry when its page
# is brought under the limit.
LINE_LIMIT_EXCEPTIONS: set[str] = set()


def test_guides_are_at_most_300_lines():
    """Every page outside docs/experiments/ is a guide a newcomer reads in a few minutes: at
    most 300 lines (the runs, variants and long tables live in docs/experiments/)."""
    long = {}
    for p in (ROOT / "docs").rglob("*.md"):
        rel = p.relative_to(ROOT / "docs")
        if rel.parts[0] in ("experiments", "_hooks", "notebooks") or str(rel) in LINE_LIMIT_EXCEPTIONS:
            continue
        n = len(p.read_text().splitlines())
        if n > 300:
            long[str(rel)] = n
    assert long == {}, f"pages over 300 lines (move the narrative to docs/experiments/): {long}"


def test_every_experiments_page_is_linked_from_a_guide():
    """An experiments page is reached from its guide, not only from the nav."""
    import re

    guides = "\n".join(p.read_text() for p in (ROOT / "docs").glob("*.md"))
    for p in (ROOT / "docs" / "experiments").glob("*.md"):
        assert re.search(rf"experiments/{re.escape(p.name)}", guides), f"no guide links {p.name}"
