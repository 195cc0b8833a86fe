"""`benchmarks/burgers.py`'s FNO peer (its CPU-time budget, ``--cpu-schedule``, is the
library's :class:`opsplit.control.CPUTimeBudget`: tests/test_control_callbacks.py)."""

import importlib.util
from pathlib import Path

import pytest
import torch

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "burgers.py"


def _bench():
    spec = importlib.util.spec_from_file_location("opsplit_bench_burgers", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_fno_peer_output_scale_scales_only_its_last_layer():
    """``--output-scale`` on the peer: the last layer's initial weights and bias times the
    scale, every other weight as FNO's script draws it (the same random draws)."""
    b = _bench()
    ref, small = b.build("fno", 3), b.build("fno", 3, output_scale=0.1)
    for (name, p), (name2, q) in zip(ref.named_parameters(), small.named_parameters()):
        assert name == name2
        if name.startswith("proj2."):
            torch.testing.assert_close(q, 0.1 * p, rtol=1e-6, atol=0)
        else:
            assert torch.equal(p, q), name
    u = torch.randn(2, 64, generator=torch.Generator().manual_seed(1))
    assert not torch.allclose(ref(u), small(u))


def test_fno_peer_refuses_a_bad_output_scale():
    b = _bench()
    for bad in (0.0, -0.1, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="output_scale"):
            b.build("fno", 0, output_scale=bad)


def test_fno_peer_output_modes_band_limits_only_its_output():
    """``--output-modes`` on the peer: every weight drawn as without it, the output the
    orthogonal projection of the plain peer's onto the modes kept (at initialisation)."""
    b = _bench()
    ref, lim = b.build("fno", 3), b.build("fno", 3, output_modes=5)
    named = dict(lim.named_parameters())
    for name, p in ref.named_parameters():
        assert torch.equal(p, named.pop(name)), name
    assert list(named) == ["output_filter.factors"]
    u = torch.randn(2, 64, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        full, out = torch.fft.rfft(ref(u)), torch.fft.rfft(lim(u))
    torch.testing.assert_close(out[:, :5], full[:, :5], rtol=1e-5, atol=1e-7)
    assert out[:, 5:].abs().max() < 1e-6 * full[:, :5].abs().max()


def test_report_pairs_each_opsplit_setting_with_the_peer_seed_by_seed(capsys):
    """The per-seed ratios the docs quote: only the seeds both settings ran, each opsplit
    error divided by the peer's on the same seed."""
    bench = _bench()

    def run(model, lr, seed, err):
        return {"model": model, "lr": lr, "seed": seed, "test_error": {"256": err}}

    groups = {("fno", 2e-3): [run("fno", 2e-3, 0, 4.0), run("fno", 2e-3, 1, 2.0), run("fno", 2e-3, 2, 1.0)],
              ("none-lie", 5e-3): [run("none-lie", 5e-3, 0, 2.0), run("none-lie", 5e-3, 1, 4.0)]}
    bench.paired_ratios(groups)
    out = capsys.readouterr().out
    # seeds 0 and 1 only: 2/4 = 0.5 and 4/2 = 2; geometric mean 1; means 3 / 3 = 1; ahead on one
    assert "seeds 0, 1:" in out and "per seed 0.50, 2.00" in out
    assert "geometric mean 1.00" in out and "ratio of the means 1.00" in out and "ahead on 1 of 2" in out
