"""Every Python block of docs/quickstart.md runs, in order, in one namespace (the page
promises that each block runs as written)."""

from __future__ import annotations

import re
from pathlib import Path

import torch

PAGE = Path(__file__).resolve().parents[1] / "docs" / "quickstart.md"


def python_blocks(text: str) -> list[str]:
    return re.findall(r"^```python\n(.*?)^```", text, flags=re.S | re.M)


def test_quickstart_blocks_run(capsys):
    blocks = python_blocks(PAGE.read_text())
    assert len(blocks) >= 5, "the quickstart lost its code blocks"
    torch.set_num_threads(1)
    namespace: dict = {"__name__": "quickstart"}
    for i, block in enumerate(blocks):
        try:
            exec(compile(block, f"{PAGE.name}[block {i}]", "exec"), namespace)
        except Exception as e:  # name the block that failed
            raise AssertionError(f"docs/quickstart.md, python block {i} failed: {e!r}\n{block}") from e
    out = capsys.readouterr().out
    # what the page says its blocks show
    assert "torch.Size([2, 8, 16])" in out and "torch.Size([2, 32, 64])" in out
    ns = namespace
    assert ns["u8"].shape == ns["u"].shape
    # solved_with restored the classifier's own solver and scheme on exit: the model in the
    # continuity table is the trained one
    from opsplit.control import solved_with
    before = ns["trainer"].evaluate(ns["test"])
    with solved_with(ns["classifier"], solver="rk4"):
        pass
    assert ns["trainer"].evaluate(ns["test"]) == before
    assert {"loss", "accuracy"} <= set(before)
    assert "N_t" in ns["c"].markdown()


def test_block_extraction_finds_only_python_fences():
    text = "a\n```python\nx = 1\n```\n```bash\nrm -rf /\n```\n```python\ny = 2\n```\n"
    assert python_blocks(text) == ["x = 1\n", "y = 2\n"]
