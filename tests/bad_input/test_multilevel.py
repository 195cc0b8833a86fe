"""Bad input to multilevel training and coarse solves: level schedules that are not
increasing, whose pieces do not nest or whose fractions do not sum to 1
(``TrainConfig.levels``), a schedule the model cannot take (its last level not the model's
pieces, a level whose N_t does not fit the controls, controls without pieces in t) — each
refused before training starts with nothing written —, prolongations and restrictions the
controls cannot take (``opsplit.controls.prolong`` / ``restrict``), coarse solves that would
straddle a piece (``coarse_controls``, ``Trainer.evaluate``, ``frontier``)."""

import shutil
import sys
import tempfile
from pathlib import Path

import pytest
import torch

from opsplit.control import Objective, TrainConfig, Trainer, coarse_controls, frontier
from opsplit.controls import (
    Constant,
    PieceAverage,
    PiecewiseConstant,
    TimeBasis,
    prolong,
    prolongation_matrix,
    restrict,
)

from ._table import cases, run_case

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from _train_helpers import TinyClassifier, tiny_config, tiny_data  # noqa: E402


def fit_in_empty_dir(model=None, **cfg):
    """Build the trainer and fit into a fresh folder; re-raise its error after checking that
    nothing was written."""
    d = Path(tempfile.mkdtemp())
    out = d / "run"
    try:
        model = model if model is not None else TinyClassifier(n_steps=4, T=2.0)
        tr = Trainer(model, Objective("cross_entropy"), tiny_config(max_steps=2, **cfg))
        tr.fit(tiny_data(), None, out_dir=out)
    finally:
        written = out.exists()
        shutil.rmtree(d, ignore_errors=True)
        assert not written, "the refused run wrote its folder"


def _off_grid_model():
    m = TinyClassifier(n_steps=4, T=2.0)
    m.encoder.n_steps = 2  # N_t = 2 over 4 pieces: at 1 piece N_t would be 1/2
    return m


def _mixed_pieces_model():
    m = TinyClassifier(n_steps=4, T=2.0)
    m.encoder._ffn.W1 = prolong(m.encoder._ffn.W1, 8)
    return m


PC = PiecewiseConstant(torch.zeros(4, 2), t0=0.0, t1=1.0)

CASES = cases(
    ("levels_not_a_list", lambda: TrainConfig(levels="1,2"), TypeError, r"^TrainConfig\.levels: expected None or"),
    ("levels_empty", lambda: TrainConfig(levels=[]), TypeError, r"^TrainConfig\.levels: expected None or"),
    ("levels_not_pairs", lambda: TrainConfig(levels=[1, 2]), TypeError, r"^TrainConfig\.levels\[0\]: expected a pair"),
    ("levels_decreasing", lambda: TrainConfig(levels=[[4, 0.5], [2, 0.5]]), ValueError,
     r"^TrainConfig\.levels: expected strictly increasing pieces, got 4 then 2"),
    ("levels_repeated", lambda: TrainConfig(levels=[[2, 0.5], [2, 0.5]]), ValueError,
     r"^TrainConfig\.levels: expected strictly increasing pieces"),
    ("levels_not_nested", lambda: TrainConfig(levels=[[2, 0.5], [3, 0.5]]), ValueError,
     r"^TrainConfig\.levels\[1\] pieces: a level's pieces must be a multiple"),
    ("levels_zero_pieces", lambda: TrainConfig(levels=[[0, 0.5], [2, 0.5]]), ValueError,
     r"^TrainConfig\.levels\[0\] pieces: expected an integer >= 1"),
    ("levels_fraction_zero", lambda: TrainConfig(levels=[[1, 0.0], [2, 1.0]]), ValueError,
     r"^TrainConfig\.levels\[0\] fraction: expected a number in \(0, 1\]"),
    ("levels_fraction_nan", lambda: TrainConfig(levels=[[1, float("nan")], [2, 1.0]]), ValueError,
     r"^TrainConfig\.levels\[0\] fraction"),
    ("levels_fraction_str", lambda: TrainConfig(levels=[[1, "half"], [2, 0.5]]), TypeError,
     r"^TrainConfig\.levels\[0\] fraction: expected a number"),
    ("levels_fractions_sum", lambda: TrainConfig(levels=[[1, 0.5], [2, 0.4]]), ValueError,
     r"^TrainConfig\.levels: expected fractions of the run's steps that sum to 1"),
    ("levels_prolongation", lambda: TrainConfig(levels_prolongation="cubic"), ValueError,
     r"^TrainConfig\.levels_prolongation: expected one of \('constant', 'linear'\)"),
    ("coarse_controls", lambda: TrainConfig(coarse_controls="mean"), ValueError,
     r"^TrainConfig\.coarse_controls: expected one of \('point', 'average'\)"),
    ("fit_last_level_not_the_models", lambda: fit_in_empty_dir(levels=[[1, 0.5], [2, 0.5]]), ValueError,
     r"^TrainConfig\.levels: the last level has 2 pieces, the model's controls 4"),
    ("fit_level_n_steps_does_not_fit", lambda: fit_in_empty_dir(_off_grid_model(), levels=[[1, 0.5], [4, 0.5]]),
     ValueError, r"^TrainConfig\.levels\[0\]: N_t = 2 x 1 / 4 pieces is not an integer; the level's N_t does not "
     r"fit its controls"),
    ("fit_no_draw_fits_a_level", lambda: fit_in_empty_dir(levels=[[1, 0.5], [4, 0.5]], n_steps=[2]), ValueError,
     r"^TrainConfig\.levels\[0\]: no N_t of TrainConfig\.n_steps = \[2\] fits 1 pieces"),
    ("fit_controls_without_pieces", lambda: fit_in_empty_dir(TinyClassifier(n_steps=4, T=2.0, control="legendre"),
                                                             levels=[[1, 0.5], [4, 0.5]]),
     ValueError, r"^TrainConfig\.levels: the model has no control with pieces in time"),
    ("fit_mixed_pieces", lambda: fit_in_empty_dir(_mixed_pieces_model(), levels=[[1, 0.5], [4, 0.5]]), ValueError,
     r"^TrainConfig\.levels: the model's controls have \[4, 8\] pieces in time; a level schedule needs one"),
    ("fit_coarse_draw_straddles", lambda: fit_in_empty_dir(n_steps=[3, 4], coarse_controls="average"), ValueError,
     r"^TrainConfig\.n_steps: N_t = 3 steps cannot average the 4 pieces"),
    ("prolong_not_a_multiple", lambda: prolong(PC, 6), ValueError,
     r"^prolong\.n_pieces: expected a piece count of 6 that is a multiple of 4"),
    ("prolong_fewer", lambda: prolong(PC, 2), ValueError, r"^prolong\.n_pieces: expected a piece count of 2"),
    ("prolong_kind", lambda: prolong(PC, 8, "cubic"), ValueError, r"^prolong\.kind: expected one of"),
    ("prolong_constant_control", lambda: prolong(Constant(torch.zeros(2)), 2), TypeError,
     r"^prolong\.control: a Constant has no pieces in time to prolong"),
    ("prolong_time_basis", lambda: prolong(TimeBasis(torch.zeros(3, 2), t0=0.0, t1=1.0), 2), TypeError,
     r"^prolong\.control: a TimeBasis has no pieces in time"),
    ("prolong_pieces_float", lambda: prolong(PC, 8.0), TypeError, r"^prolong\.n_pieces: expected an integer"),
    ("restrict_not_a_divisor", lambda: restrict(PC, 3), ValueError, r"^restrict\.n_pieces"),
    ("restrict_kind", lambda: restrict(PC, 2, "max"), ValueError, r"^restrict\.kind: expected one of"),
    ("prolongation_matrix_kind", lambda: prolongation_matrix(2, 4, "spline"), ValueError,
     r"^prolongation: expected one of"),
    ("piece_average_not_a_divisor", lambda: PieceAverage(PC, 3), ValueError,
     r"^PieceAverage\.n_pieces: a control of 4 pieces averages over a divisor of 4"),
    ("piece_average_source", lambda: PieceAverage(Constant(torch.zeros(2)), 1), TypeError,
     r"^PieceAverage\.source: expected a PiecewiseConstant or LayerwiseConstant"),
    ("coarse_controls_straddles", lambda: coarse_controls(TinyClassifier(n_steps=4), 3).__enter__(), ValueError,
     r"^coarse_controls\.n_steps: N_t = 3 steps cannot average the 4 pieces"),
    ("coarse_controls_zero", lambda: coarse_controls(TinyClassifier(n_steps=4), 0).__enter__(), ValueError,
     r"^coarse_controls\.n_steps: expected an integer >= 1"),
    ("evaluate_straddles", lambda: Trainer(TinyClassifier(n_steps=4), Objective("cross_entropy"),
                                           tiny_config(coarse_controls="average")).evaluate(tiny_data(), n_steps=3),
     ValueError, r"^Trainer\.evaluate\.n_steps: N_t = 3 steps cannot average"),
    ("frontier_straddles", lambda: frontier(TinyClassifier(n_steps=4), tiny_data(), n_steps=[3]), ValueError,
     r"^frontier\.n_steps: N_t = 3 steps cannot average"),
    ("frontier_coarse", lambda: frontier(TinyClassifier(n_steps=4), tiny_data(), coarse="mean"), ValueError,
     r"^frontier\.coarse: expected one of"),
    ("frontier_references", lambda: frontier(TinyClassifier(n_steps=4), tiny_data(), references=[1]), TypeError,
     r"^frontier\.references: expected a dict"),
    ("set_level_without_levels", lambda: Trainer(TinyClassifier(n_steps=4), Objective("cross_entropy"),
                                                 tiny_config()).set_level(0), ValueError,
     r"^Trainer\.set_level: the config has no levels"),
)


@pytest.mark.parametrize("case", CASES)
def test_bad_input(case):
    run_case(case)
