"""benchmarks/neural_operator.py's statistics: the per-seed ratios, their geometric mean, the
seeds and pairs ahead, and the bootstrap interval, against the definitions written out."""

import math
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import neural_operator as bench  # noqa: E402


def _runs(errors):
    return {s: {"errors": {"grid": list(e), "nt2x": list(2 * np.asarray(e))}} for s, e in errors.items()}


def test_ratios_geometric_mean_and_counts():
    rng = np.random.default_rng(0)
    peer = {s: rng.uniform(1, 2, 50) for s in (0, 1, 2)}
    ours = {0: peer[0] * 0.5, 1: peer[1] * 1.5, 2: rng.uniform(1, 2, 50)}
    ours[3] = rng.uniform(1, 2, 50)  # a seed the peer did not run: left out
    c = bench.compare(_runs(ours), _runs(peer), "grid", n_boot=200)
    assert c["seeds"] == [0, 1, 2]
    by_hand = [sum(ours[s]) / sum(peer[s]) for s in (0, 1, 2)]
    np.testing.assert_allclose(c["ratios"], by_hand, rtol=1e-12)
    assert math.isclose(c["geo"], (by_hand[0] * by_hand[1] * by_hand[2]) ** (1 / 3), rel_tol=1e-12)
    assert c["ahead"] == sum(r < 1 for r in by_hand)
    seed_mean_ours = [np.mean([ours[s][i] for s in (0, 1, 2)]) for i in range(50)]
    seed_mean_peer = [np.mean([peer[s][i] for s in (0, 1, 2)]) for i in range(50)]
    assert c["pairs_ahead"] == sum(a < b for a, b in zip(seed_mean_ours, seed_mean_peer)) / 50
    lo, hi = c["ci"]
    assert lo <= c["geo"] <= hi
    # the 2x/4x N_t key compares those errors of ours against the peer's grid errors
    c2 = bench.compare(_runs(ours), _runs(peer), "nt2x", n_boot=50)
    np.testing.assert_allclose(c2["ratios"], [2 * r for r in by_hand], rtol=1e-12)


def test_bootstrap_interval_of_a_constant_ratio_is_that_ratio():
    rng = np.random.default_rng(1)
    peer = {s: rng.uniform(0.5, 3, 40) for s in range(5)}
    c = bench.compare(_runs({s: 0.8 * e for s, e in peer.items()}), _runs(peer), n_boot=300)
    np.testing.assert_allclose(c["ci"], (0.8, 0.8), rtol=1e-12)
    assert c["ahead"] == 5 and c["pairs_ahead"] == 1.0


def test_bootstrap_interval_widens_with_the_seed_spread():
    rng = np.random.default_rng(2)
    peer = {s: rng.uniform(1, 2, 100) for s in range(5)}
    tight = bench.compare(_runs({s: e * (1 + 0.01 * (s - 2)) for s, e in peer.items()}), _runs(peer), n_boot=500)
    wide = bench.compare(_runs({s: e * (1 + 0.2 * (s - 2)) for s, e in peer.items()}), _runs(peer), n_boot=500)
    assert (wide["ci"][1] - wide["ci"][0]) > 5 * (tight["ci"][1] - tight["ci"][0])
