"""The frontier section of ``opsplit train`` (digits) and of the default job: one model solved
at every N_t beside models trained at one N_t alone (opsplit.cli.frontier_report).

Checked against independent computations: each reference's number is its saved weights
evaluated by hand at its own N_t, and the one model's number at N_t = 1 is a model of *one*
piece whose controls are the plain mean of the trained model's pieces (the integral of
piecewise-constant controls over the step, divided by the step), evaluated at N_t = 1."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from _helpers import csv_rows

from opsplit.cli import main
from opsplit.cli.config import load
from opsplit.cli.tasks import digits
from opsplit.control.checkpoint import latest_checkpoint, read_checkpoint

pytestmark = pytest.mark.usefixtures("one_thread")

TRAIN = """
[model]
d_model = 8
heads = 2
d_ff = 16
n_steps = 4
[train]
epochs = 2
batch_size = 16
save_every = 4
warmup_steps = 0
n_steps = [1, 2, 4]
n_steps_weights = [1, 1, 2]
coarse_controls = "average"
[eval]
n_steps = [2, 4, 8]
solvers = ["heun"]
[frontier]
enabled = true
[data]
limit = 64
"""


def _toml(tmp_path, text):
    p = tmp_path / "c.toml"
    p.write_text(text)
    return str(p)


def _weights(folder: Path) -> dict:
    """The final weights of a run folder's trainer (its last checkpoint)."""
    return read_checkpoint(latest_checkpoint(folder)).model_state()


def _accuracy(model, test, n_steps: int) -> float:
    with torch.no_grad():
        pred = model.eval()(test.inputs, n_steps=n_steps).argmax(-1)
    return float((pred == test.targets).double().mean())


def test_train_frontier_section_against_hand_computed_accuracies(tmp_path):
    out = tmp_path / "run"
    assert main(["train", "--config", _toml(tmp_path, TRAIN), "--out", str(out), "--no-progress"]) == 0
    rows = {int(r["n_t"]): r for r in csv_rows(out / "frontier.csv")}
    assert sorted(rows) == [1, 2, 4, 8]  # the default: a quarter, half, one and two times the grid
    assert [int(rows[n]["calls"]) for n in (1, 2, 4, 8)] == [3, 6, 12, 24]  # (2 heads + the FFN) x N_t
    cfg = load(digits.SCHEMA, path=out / "config.toml")
    _, test = digits._train_split(cfg["data"])
    for n in (1, 2, 4):  # each reference: its own weights, n pieces, solved at its own N_t
        ref = digits.build_model({**cfg["model"], "n_steps": n})
        ref.load_state_dict(_weights(out / f"train_nt{n}"))
        assert float(rows[n]["accuracy (trained at this N_t alone)"]) == pytest.approx(_accuracy(ref, test, n),
                                                                                        abs=1e-12)
        steps = csv_rows(out / f"train_nt{n}" / "steps.csv")
        assert {int(s.get("n_steps", n)) for s in steps} == {n} and "solver" not in steps[0]  # no draws
    assert rows[8]["accuracy (trained at this N_t alone)"] in ("", "nan")  # no reference above the grid
    # the one model at N_t = 1: a model of one piece holding the mean of the four pieces
    w = _weights(out / "train")
    one = digits.build_model({**cfg["model"], "n_steps": 1})
    own = one.state_dict()
    mean = {k: (v.mean(0, keepdim=True) if v.shape != own[k].shape else v) for k, v in w.items()}
    assert any(v.shape != own[k].shape for k, v in w.items())  # the controls have pieces
    one.load_state_dict(mean)
    assert float(rows[1]["accuracy (one model)"]) == pytest.approx(_accuracy(one, test, 1), abs=1e-12)
    full = digits.build_model(cfg["model"])
    full.load_state_dict(w)
    assert float(rows[4]["accuracy (one model)"]) == pytest.approx(_accuracy(full, test, 4), abs=1e-12)
    md = (out / "report.md").read_text()
    assert "frontier.png" in md and (out / "frontier.png").stat().st_size > 1000
    assert "One trained model solved at N_t = 1, 2, 4, 8" in md  # the finding


def test_frontier_off_by_default_and_on_in_the_default_job():
    from opsplit.cli import default

    assert load(digits.SCHEMA, data={})["frontier"]["enabled"] is False
    cfg = default.configs(quick=False)["train"]
    assert cfg["frontier"]["enabled"] and cfg["frontier"]["n_steps"] == [1, 2, 4, 8]
    assert digits.reference_n_steps(cfg) == [1, 2, 4]


@pytest.mark.parametrize("toml, message", [
    ("[frontier]\nenabled = true\nn_steps = [3, 4]\n",
     "frontier.n_steps: N_t = 3 steps cannot average the 4 pieces"),
    ('[train]\ncoarse_controls = "average"\n[eval]\nn_steps = [3, 4]\n',
     "eval.n_steps: N_t = 3 steps cannot average the 4 pieces"),
    ("[frontier]\nenabled = true\nn_steps = [0, 4]\n", "frontier.n_steps: expected"),
    ("[frontier]\nenabled = true\nn_steps = [2, 2]\n", "frontier.n_steps: expected"),
    ("[frontier]\nenabled = 1\n", "frontier.enabled: expected true or false"),
])
def test_bad_frontier_keys_stop_before_anything_is_written(toml, message, tmp_path, capsys):
    out = tmp_path / "x"
    assert main(["train", "--config", _toml(tmp_path, toml), "--out", str(out)]) == 2
    assert message in " ".join(capsys.readouterr().err.split())
    assert not out.exists()


def test_the_estimate_counts_the_references():
    base = load(digits.SCHEMA, data={})
    on = load(digits.SCHEMA, data={"frontier": {"enabled": True}})
    alone = [digits.estimate(digits.reference_config(on, n)).flops for n in (1, 2, 4)]
    extra = digits.estimate(on).flops - digits.estimate(base).flops
    assert extra > sum(alone)  # the references' training and evaluation, and the frontier's solves
    assert extra < 1.1 * sum(alone)
