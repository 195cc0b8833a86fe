"""The README's first snippet is what a new user sees first: it must run and show the
convergence it claims (issue 8, finding 9)."""

import contextlib
import io
import re
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def _python_blocks():
    return re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)


def test_first_snippet_runs_and_converges_at_first_order():
    code = _python_blocks()[0]
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code, "README.md", "exec"), {})
    diffs = [float(m) for m in re.findall(r"= ([0-9.]+e[-+][0-9]+)", out.getvalue())]
    assert len(diffs) == 4, out.getvalue()
    ratios = [a / b for a, b in zip(diffs[:-1], diffs[1:])]
    # first order in dt: successive differences halve (the text quotes them)
    assert all(1.7 < r < 2.7 for r in ratios), ratios
    text = README.read_text()
    for d in diffs:  # the figures quoted under the snippet are the ones it prints
        assert f"{d:.1e}" in text, d
