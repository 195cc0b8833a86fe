"""``opsplit solve`` and ``opsplit compare`` with the fourth-order compositions and
``--rtol/--atol`` (adaptive solves and their statistics in the report)."""

from __future__ import annotations

import pytest
from _helpers import csv_rows

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
    runs = csv_rows(out / "runs.csv")
    # substep solves from the solve statistics: 12K - 11 = 25 (Blanes-Moan), 6K - 5 = 13
    # (triple jump) per step for K = 3 terms
    calls = {(r["scheme"], int(r["n_t"])): int(r["substeps"]) for r in runs}
    assert calls == {("blanes_moan", 2): 50, ("blanes_moan", 4): 100, ("triple_jump", 2): 26,
                     ("triple_jump", 4): 52}
    ad = {r["scheme"]: r for r in csv_rows(out / "adaptive.csv")}
    assert set(ad) == {"blanes_moan", "triple_jump"}
    for r in ad.values():
        assert int(r["accepted"]) >= 1 and float(r["rel_error"]) <= 1e-4
        assert float(r["atol"]) == pytest.approx(1e-8)
        # three steps per attempt (step doubling)
        per_step = 25 if r["scheme"] == "blanes_moan" else 13
        assert int(r["substeps"]) == 3 * per_step * (int(r["accepted"]) + int(r["rejected"]))
    assert "adaptive.csv" in (out / "report.md").read_text()
    orders = {r["scheme / solver"]: r for r in csv_rows(out / "orders.csv")}
    assert orders["blanes_moan / rk4"]["theory"] == "4"
    _check_statistics(out, ad)


def _check_statistics(out, ad):
    """substep_calls.csv and adaptive_times.csv against the library's own solve of the same
    model (the SMOOTH config on the 4 x 4 grid, N_t in {2, 4}, rtol 1e-5, atol 1e-3 rtol,
    steps at most T / 2): ``Propagator.solve(...).stats``."""
    from opsplit.adaptive import PIController
    from opsplit.analysis import smooth_transformer

    p = smooth_transformer(n_x=4, n_y=4, batch=1, J=2, T=1.0, seed=0, time="legendre", n_time=3,
                           space="polynomial", n_modes=4, constraint=False, relu=False, scale=1.0, margin=0.2)
    stats_rows = csv_rows(out / "substep_calls.csv")
    times_rows = csv_rows(out / "adaptive_times.csv")
    for scheme in ("blanes_moan", "triple_jump"):
        fixed = {n: p.propagator(n, scheme, "rk4").solve(p.f).stats for n in (2, 4)}
        sol = p.propagator(1, scheme, "rk4").solve(p.f, controller=PIController(rtol=1e-5, atol=1e-8, max_step=0.5))
        st = sol.stats
        mine = {r["run"]: r for r in stats_rows if r["scheme"] == scheme}
        assert set(mine) == {"N_t = 2", "N_t = 4", "adaptive, rtol 1e-05"}
        for run, s in [(f"N_t = {n}", fixed[n]) for n in (2, 4)] + [("adaptive, rtol 1e-05", st)]:
            r = mine[run]
            assert (int(r["accepted"]), int(r["rejected"])) == (s.n_accepted, s.n_rejected)
            assert {k: int(r[k]) for k in s.substep_calls} == s.substep_calls  # per operator
            assert len(s.substep_calls) == 3 and all(v > 0 for v in s.substep_calls.values())
            assert int(r["total"]) == s.n_substep_calls
            others = set(r) - set(s.substep_calls) - {"scheme", "solver", "run", "n_x", "n_y", "accepted",
                                                      "rejected", "total"}
            assert all(r[k] == "" for k in others)  # another scheme's substep labels
        assert int(mine["adaptive, rtol 1e-05"]["total"]) == int(ad[scheme]["substeps"])
        grid = [r for r in times_rows if r["scheme"] == scheme]
        assert [int(r["step"]) for r in grid] == list(range(st.n_accepted + 1))
        ts = [float(r["t"]) for r in grid]
        assert ts == st.times and ts[0] == 0.0 and ts[-1] == 1.0
        dts = [float(r["dt"]) for r in grid[1:]]
        assert dts == pytest.approx([b - a for a, b in zip(ts[:-1], ts[1:])], abs=1e-15)
        assert min(dts) == pytest.approx(float(ad[scheme]["min_dt"])) and max(dts) <= 0.5


def test_compare_takes_the_compositions_and_tolerances(tmp_path):
    out = tmp_path / "cmp"
    argv = ["compare", "--config", _toml(tmp_path, SMOOTH.replace("constraint = false", "constraint = true")),
            "--schemes", "strang", "blanes_moan", "--solvers", "rk4", "--n-t", "2", "4", "--n-x", "4",
            "--n-y", "4", "--repeats", "1", "--rtol", "1e-3", "--atol", "1e-5", "--no-progress",
            "--out", str(out)]
    assert main(argv) == 0
    table = {r["scheme"]: r for r in csv_rows(out / "comparison.csv")}
    # with S1 the composition sits in an outer Strang step: theory 2
    assert table["blanes_moan"]["theory"] == "2"
    ad = csv_rows(out / "adaptive.csv")
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
         r"opsplit solve: error: model\.margin = 0: scheme 'triple_jump' runs substeps up to 0\.351 dt outside .* "
         r"expected model\.margin >= 0\.176\n$"),
        (["solve", "--schemes", "yoshida"], "solve.schemes: expected each of one of"),
    ],
)
def test_bad_tolerances_and_schemes(argv, message, capsys, tmp_path):
    import re

    assert main([*argv, "--out", str(tmp_path / "x"), "--no-progress"]) == 2
    assert re.search(message, capsys.readouterr().err)
    assert not (tmp_path / "x").exists()


def _one_line_exit_2(argv, capsys, tmp_path, pattern):
    import re

    out = tmp_path / "x"
    assert main([*argv, "--out", str(out), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert re.search(pattern, err), err
    return out


@pytest.mark.parametrize(
    "config, argv, pattern",
    [
        # the tolerance a dtype cannot meet, refused before any work
        ("[model]\ndtype = \"float32\"\n[solve]\nrtol = 1e-9\n", ["solve"],
         r"opsplit solve: error: solve\.rtol = 1e-09: scheme 'lie' with heun substeps cannot be solved by adaptive "
         r"steps: rtol: 1e-09 is below what float32 can meet"),
        ("", ["solve", "--rtol", "1e-15"], r"solve\.rtol = 1e-15: .* rtol: 1e-15 is below what float64 can meet"),
        # the projected model with the ReLU: no error estimate shrinks with the step
        ("[model]\nrelu = true\n[solve]\nreference = \"finest\"\n", ["solve", "--rtol", "1e-4"],
         r"solve\.rtol = 0\.0001: scheme 'lie' .* substep \d:ProjectionS2 is not a smooth map"),
        ("", ["compare", "--schemes", "blanes_moan", "blanes_moan"],
         r"compare\.schemes: expected distinct values \('blanes_moan' given more than once\)"),
        ("", ["compare", "--solvers", "rk4", "rk4"], r"compare\.solvers: expected distinct values"),
        ("", ["solve", "--schemes", "strang", "lie", "strang"], r"solve\.schemes: expected distinct values"),
    ],
    ids=["float32-rtol-1e-9", "rtol-1e-15", "relu-rtol-1e-4", "compare-schemes-twice", "compare-solvers-twice",
         "solve-schemes-twice"],
)
def test_refused_adaptive_solves_print_one_line(config, argv, pattern, capsys, tmp_path):
    cfg = ["--config", _toml(tmp_path, config)] if config else []
    small = ["--n-t", "2", "4", "--n-x", "4", "--n-y", "4"]
    out = _one_line_exit_2([*argv, *cfg, *small], capsys, tmp_path, pattern)
    assert not out.exists()  # refused before the folder is written


def test_an_adaptive_solve_that_fails_while_running_prints_one_line(monkeypatch, capsys, tmp_path):
    from opsplit.adaptive import PIController
    from opsplit.cli import study

    # a controller that runs out of attempts (the command's own is checked before any work)
    monkeypatch.setattr(study, "adaptive_controller",
                        lambda model, n_t, rtol, atol: PIController(rtol=rtol, atol=1e-3 * rtol, max_steps=2))
    argv = ["solve", "--config", _toml(tmp_path, SMOOTH), "--schemes", "strang", "--solver", "rk4", "--n-t", "2",
            "4", "--n-x", "4", "--n-y", "4", "--rtol", "1e-8"]
    _one_line_exit_2(argv, capsys, tmp_path, r"solve\.rtol = 1e-08: the adaptive solve of scheme 'strang' with rk4 "
                     r"substeps failed: adaptive solve: max_steps = 2 attempts reached")
