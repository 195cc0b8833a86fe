"""``opsplit train`` with ``task = "burgers"`` on a tiny config: the run folder, the table of
errors per evaluation grid, the config's task picking the schema, the cost estimate against
torch's flop counter, and refusals before any work."""

from __future__ import annotations

import math

import pytest
import torch
from _helpers import csv_rows

from opsplit.cli import main

pytestmark = pytest.mark.usefixtures("one_thread")

TOML = """\
task = "burgers"
[model]
attention = "{attention}"
scheme = "strang"
d_model = 8
heads = 2
n_steps = 2
modes = 4
d_ff = 8
n_freq = 2
[train]
epochs = 2
batch_size = 4
save_every = 2
[eval]
resolutions = [8, 16, 64]
[data]
resolution = 16
n_train = 8
n_test = 4
points = 64
solver_steps = 100
"""


@pytest.fixture
def data_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("OPSPLIT_DATA_DIR", str(tmp_path / "cache"))
    return tmp_path


def test_burgers_run_folder(data_dir):
    cfg = data_dir / "burgers.toml"
    cfg.write_text(TOML.format(attention="galerkin"))
    run = data_dir / "run"
    assert main(["train", "--config", str(cfg), "--out", str(run), "--no-progress"]) == 0
    from opsplit.cli.config import read_top

    assert read_top(run / "config.toml", "task") == "burgers"
    for f in ("report.md", "eval_resolution.csv", "burgers_training.png", "train/steps.csv"):
        assert (run / f).is_file(), f
    rows = csv_rows(run / "eval_resolution.csv")
    assert [int(r["resolution"]) for r in rows] == [8, 16, 64]
    assert [r["trained_at"] for r in rows] == ["", "yes", ""]
    assert all(math.isfinite(float(r["relative_l2"])) for r in rows)
    assert len(csv_rows(run / "train" / "steps.csv")) == 4  # 2 epochs of 8 pairs in batches of 4
    assert (data_dir / "cache" / "burgers").is_dir()  # generated and cached there
    assert "neural operator on Burgers" in (run / "report.md").read_text()


def test_burgers_band_limited_output_keys(data_dir):
    """``model.output_modes`` and ``model.output_scale`` reach the model: its output on the
    evaluation grids holds no mode above the band."""
    from opsplit.cli.tasks import burgers as tb

    cfg = data_dir / "burgers.toml"
    cfg.write_text(TOML.format(attention="none").replace("n_freq = 2", "n_freq = 2\noutput_modes = 3\n"
                                                          "output_scale = 0.1").replace("[8, 16, 64]", "[16, 64]"))
    run = data_dir / "run"
    assert main(["train", "--config", str(cfg), "--out", str(run), "--no-progress"]) == 0
    m = dict(attention="none", scheme="strang", d_model=8, heads=2, head_dim=0, nonlinearity="ffn", n_steps=2, modes=4,
             d_ff=8, n_freq=2, seed=0, output_scale=0.1, output_modes=3)
    model = tb.build_model(m)
    assert model.output_filter is not None and model.output_filter.modes == 3 and model.output_scale == 0.1
    x = torch.arange(64) / 64
    with torch.no_grad():
        out = model(torch.sin(2 * math.pi * x)[None] + 0.2 * torch.cos(2 * math.pi * 5 * x)[None])
    spec = torch.fft.rfft(out, dim=-1).abs()
    assert spec[:, 3:].max() < 1e-5 * spec[:, :3].max()
    assert [int(r["resolution"]) for r in csv_rows(run / "eval_resolution.csv")] == [16, 64]


def test_burgers_refusals_before_work(data_dir, capsys):
    cfg = data_dir / "b.toml"
    cfg.write_text(TOML.format(attention="galerkin").replace("resolutions = [8, 16, 64]",
                                                               "resolutions = [8, 16, 48]"))
    assert main(["train", "--config", str(cfg), "--print-config"]) == 2
    assert "eval.resolutions: expected divisors of data.points = 64" in capsys.readouterr().err
    cfg.write_text(TOML.format(attention="galerkin").replace("resolution = 16", "resolution = 4"))
    assert main(["train", "--config", str(cfg), "--print-config"]) == 2
    assert "at least 2 * 4 - 1 = 7 nodes, got 4" in capsys.readouterr().err
    # a band-limited output needs grids that carry its modes (here more than the convolution's)
    cfg.write_text(TOML.format(attention="galerkin").replace("n_freq = 2", "n_freq = 2\noutput_modes = 5"))
    assert main(["train", "--config", str(cfg), "--print-config"]) == 2
    err = capsys.readouterr().err
    assert "eval.resolutions" in err and "model.output_modes" in err and "2 * 5 - 1 = 9 nodes, got 8" in err
    for key, bad in (("output_modes", "-1"), ("output_scale", "0.0"), ("output_scale", "nan"), ("output_modes", "1.5")):
        cfg.write_text(TOML.format(attention="galerkin").replace("n_freq = 2", f"n_freq = 2\n{key} = {bad}"))
        assert main(["train", "--config", str(cfg), "--print-config"]) == 2
        assert f"model.{key}" in capsys.readouterr().err
    cfg.write_text(TOML.format(attention="cosine"))
    assert main(["train", "--config", str(cfg), "--print-config"]) == 2
    assert "model.attention" in capsys.readouterr().err
    assert not (data_dir / "cache").exists()  # nothing generated


@pytest.mark.parametrize("attention,nonlinearity", [("galerkin", "ffn"), ("softmax", "ffn"), ("fourier", "map")])
def test_burgers_estimate_flops_match_flop_counter(attention, nonlinearity):
    """The guard's matrix-product flops of one forward pass against FlopCounterMode (the
    FFTs, and softmax's fused CPU attention kernel, which the counter does not see, are left
    out of the comparison)."""
    from torch.utils.flop_counter import FlopCounterMode

    from opsplit.cli.tasks import burgers as tb

    m = dict(attention=attention, scheme="strang", d_model=16, heads=2, head_dim=4 if nonlinearity == "map" else 0,
             nonlinearity=nonlinearity, n_steps=2, modes=4, d_ff=32, n_freq=2, seed=0)
    n = 64
    model = tb.build_model(m)
    u = torch.randn(3, n)
    u = u - u.mean()  # any field; the periodicity check passes for random samples
    with FlopCounterMode(display=False) as fc:
        model(u)
    counted = fc.get_total_flops() / 3
    est, _ = tb.forward_flops(m, n)
    d = m["d_model"]
    unseen = m["n_steps"] * 2 * 2 * 5.0 * n * math.log2(n) * d  # the FFTs
    if attention == "softmax":
        unseen += m["n_steps"] * 4.0 * n * n * d  # scores and weighted sum (one attention per Strang step)
    assert 0.8 < (est - unseen) / counted < 1.25, (est - unseen, counted)


# -- issue 42: the data's sizes in the command ---------------------------------------------------
@pytest.fixture
def no_generation(monkeypatch):
    """Generating the data fails the test (instead of running for hours)."""
    from opsplit.data import burgers as burgers_mod

    def generate(*a, **k):
        raise AssertionError("the data was generated")

    monkeypatch.setattr(burgers_mod, "_generate", generate)


def test_print_config_generates_no_data(data_dir, capsys, no_generation):
    cfg = data_dir / "b.toml"
    cfg.write_text(TOML.format(attention="galerkin"))
    assert main(["train", "--config", str(cfg), "--print-config"]) == 0
    assert 'task = "burgers"' in capsys.readouterr().out
    assert not (data_dir / "cache").exists()


def test_huge_solver_steps_neither_hang_nor_generate(data_dir, capsys, no_generation):
    """data.solver_steps = 1e12: the run is refused naming the key (exit 2, one line, nothing
    written); --print-config neither generates the data nor hangs (it refuses the cost the
    same way while the command's guard runs for --print-config; it prints once it does not)."""
    cfg = data_dir / "b.toml"
    cfg.write_text(TOML.format(attention="galerkin").replace("solver_steps = 100", "solver_steps = 1000000000000"))
    run = data_dir / "run"
    assert main(["train", "--config", str(cfg), "--out", str(run)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "data.solver_steps = 1000000000000: the job needs an estimated" in err, err
    assert not run.exists() and not (data_dir / "cache").exists()
    rc = main(["train", "--config", str(cfg), "--print-config"])
    err = capsys.readouterr().err
    assert rc == 0 or (rc == 2 and "data.solver_steps = 1000000000000: the job needs" in err), (rc, err)
    assert not (data_dir / "cache").exists()


@pytest.mark.parametrize("key", ["solver_steps", "points", "n_train", "n_test"])
def test_estimate_counts_every_data_size(key):
    """Sixteen times a data size: the estimated time of the job grows by more than 1.5x
    (data generation dominates this small model; sixteen times the points add least, as the
    solver drops the modes the smooth data no longer needs after its first steps)."""
    from opsplit.cli.config import load
    from opsplit.cli.tasks import burgers as tb

    cfg = load(tb.SCHEMA, data={"task": "burgers", "model": {"d_model": 8, "heads": 2, "d_ff": 8, "n_steps": 1},
                                 "train": {"epochs": 1}, "eval": {"resolutions": [256]}})
    base = tb.estimate(cfg)
    cfg["data"][key] *= 16
    more = tb.estimate(cfg)
    assert more.seconds > 1.5 * base.seconds, (key, base.seconds, more.seconds)
    if key != "solver_steps":
        assert more.bytes > base.bytes
