"""``opsplit solve`` and ``opsplit compare`` with the fourth-order compositions and
``--rtol/--atol`` (adaptive solves and their statistics in the report)."""

from __future__ import annotations

import csv

import pytest

from opsplit.cli import main

pytestmark = pytest.mark.usefixtures("one_thread")

SMOOTH = """
[model]
seed = 0
J = 2
batch = 1
constraint = false
margin = 0.2
"""


def _rows(path):
    with open(path, newline="") as fh:
        return list(csv.DictReader(fh))


def _toml(tmp_path, text):
    p = tmp_path / "c.toml"
    p.write_text(text)
    return str(p)


def test_solve_with_the_compositions_and_an_adaptive_solve(tmp_path):
    out = tmp_path / "run"
    argv = ["solve", "--config", _toml(tmp_path, SMOOTH), "--schemes", "blanes_moan", "triple_jump",
            "--solver", "rk4", "--n-t", "2", "4", "--n-x", "4", "--n-y", "4", "--rtol", "1e-5",
            "--no-progress", "--out", str(out)]
    assert main(argv) == 0
    runs = _rows(out / "runs.csv")
    # substep solves from the solve statistics: 12K - 11 = 25 (Blanes-Moan), 6K - 5 = 13
    # (triple jump) per step for K = 3 terms
    calls = {(r["scheme"], int(r["n_t"])): int(r["substeps"]) for r in runs}
    assert calls == {("blanes_moan", 2): 50, ("blanes_moan", 4): 100, ("triple_jump", 2): 26,
                     ("triple_jump", 4): 52}
    ad = {r["scheme"]: r for r in _rows(out / "adaptive.csv")}
    assert set(ad) == {"blanes_moan", "triple_jump"}
    for r in ad.values():
        assert int(r["accepted"]) >= 1 and float(r["rel_error"]) <= 1e-4
        assert float(r["atol"]) == pytest.approx(1e-8)
        # three steps per attempt (step doubling)
        per_step = 25 if r["scheme"] == "blanes_moan" else 13
        assert int(r["substeps"]) == 3 * per_step * (int(r["accepted"]) + int(r["rejected"]))
    assert "adaptive.csv" in (out / "report.md").read_text()
    orders = {r["scheme / solver"]: r for r in _rows(out / "orders.csv")}
    assert orders["blanes_moan / rk4"]["theory"] == "4"


def test_compare_takes_the_compositions_and_tolerances(tmp_path):
    out = tmp_path / "cmp"
    argv = ["compare", "--config", _toml(tmp_path, SMOOTH.replace("constraint = false", "constraint = true")),
            "--schemes", "strang", "blanes_moan", "--solvers", "rk4", "--n-t", "2", "4", "--n-x", "4",
            "--n-y", "4", "--repeats", "1", "--rtol", "1e-3", "--atol", "1e-5", "--no-progress",
            "--out", str(out)]
    assert main(argv) == 0
    table = {r["scheme"]: r for r in _rows(out / "comparison.csv")}
    # with S1 the composition sits in an outer Strang step: theory 2
    assert table["blanes_moan"]["theory"] == "2"
    ad = _rows(out / "adaptive.csv")
    assert {r["scheme"] for r in ad} == {"strang", "blanes_moan"}
    assert all(float(r["atol"]) == pytest.approx(1e-5) for r in ad)


@pytest.mark.parametrize(
    "argv, message",
    [
        (["solve", "--rtol=-1e-3"], r"solve.rtol: expected 0 \(off\) or a number in \(0, 1\)"),
        (["compare", "--rtol", "2"], r"compare.rtol: expected 0 \(off\) or a number in \(0, 1\)"),
        (["solve", "--atol", "1e-6"], "solve.atol: the adaptive solve runs only with solve.rtol > 0"),
        (["compare", "--rtol", "1e-3", "--atol=-1"], "compare.atol: expected a number >= 0"),
        (["solve", "--schemes", "triple_jump", "--solver", "rk4", "--n-t", "2", "--n-x", "4", "--n-y", "4"],
         r"TripleJump: a step over .*\(model\.margin extends"),
        (["solve", "--schemes", "yoshida"], "solve.schemes: expected each of one of"),
    ],
)
def test_bad_tolerances_and_schemes(argv, message, capsys, tmp_path):
    import re

    assert main([*argv, "--out", str(tmp_path / "x"), "--no-progress"]) == 2
    assert re.search(message, capsys.readouterr().err)
    assert not (tmp_path / "x").exists()
