"""Reading a checkpoint validates everything that writing one refuses: non-finite weights and
optimizer state, tensors of another kind, trainer counters out of range; a resume compares
the data a run trains on (``TrainConfig.extra``) like its learning rate; ``evaluate`` refuses
an N_t whose time grid cannot be allocated.  Each case was accepted before (a model of NaN,
an int64 tensor cast to float, ``step = -5`` then 5 extra steps, ``exp_avg_sq = inf``
carried to the end of the run, a run resumed on other data)."""

import shutil

import pytest
import torch
from _train_helpers import TinyClassifier, rewrite_checkpoint, tiny_config, tiny_data

from opsplit.control import CheckpointError, Objective, Trainer, load_checkpoint, save_checkpoint

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A finished 12-step run with checkpoints at steps 5, 10 and 12."""
    out = tmp_path_factory.mktemp("ck") / "run"
    cfg = tiny_config(epochs=4, save_every=5, keep_checkpoints=10, extra={"data.split_seed": 0})
    Trainer(TinyClassifier(), Objective("cross_entropy"), cfg).fit(tiny_data(), out_dir=out, plot=False)
    return out / "checkpoints" / "step-00000005", cfg


def _copy(run, tmp_path, **edit):
    return rewrite_checkpoint(shutil.copytree(run[0], tmp_path / "ck"), **edit)


def _state(m):
    return {k: v.clone() for k, v in m.state_dict().items()}


def _nan_weight(t):
    t["model.head.weight"][0, 0] = float("nan")
    return t


def _int_weight(t):
    t["model.head.weight"] = t["model.head.weight"].round().long()
    return t


def _inf_exp_avg_sq(t):
    k = next(k for k in t if k.endswith(".exp_avg_sq"))
    t[k][...] = float("inf")
    return t


def _negative_step(m):
    m["trainer"]["step"] = -5


CASES = [
    pytest.param(dict(tensors=_nan_weight), r"the weights head\.weight hold\(s\) NaN/inf", id="nan-weight"),
    pytest.param(dict(tensors=_int_weight), r"'head\.weight' is torch\.int64 in the checkpoint, torch\.float32 in "
                 r"the model; a tensor of another kind \(integer for floating\) is not cast", id="int64-weight"),
    pytest.param(dict(meta=_negative_step), r"meta\.trainer\.step: expected >= 0, got -5", id="negative-step"),
    pytest.param(dict(tensors=_inf_exp_avg_sq), r"the optimizer state optimizer\.\d+\.exp_avg_sq hold\(s\) NaN/inf",
                 id="inf-exp-avg-sq"),
]


@pytest.mark.parametrize("edit, match", CASES)
def test_load_and_resume_refuse_what_save_refuses(run, tmp_path, edit, match):
    """``load_checkpoint`` (with the optimizer) and a resume refuse the edited checkpoint,
    naming what is wrong, and leave the model, the optimizer and the step as they were."""
    ck = _copy(run, tmp_path, **edit)
    tr = Trainer(TinyClassifier(seed=7), Objective("cross_entropy"), run[1])
    before = _state(tr.model)
    with pytest.raises(CheckpointError, match=match):
        load_checkpoint(ck, tr.model, optimizer=tr.optimizer)
    with pytest.raises(CheckpointError, match=match):
        tr.fit(tiny_data(), resume=ck)
    after = _state(tr.model)
    assert tr.step == 0 and not tr.optimizer.state and all(torch.equal(before[k], after[k]) for k in before)


def test_save_refuses_the_same(tmp_path):
    m = TinyClassifier()
    tr = Trainer(m, Objective("cross_entropy"), tiny_config(epochs=1))
    tr.fit(tiny_data())
    with pytest.raises(ValueError, match=r"meta\.trainer\.step: expected >= 0, got -5"):
        save_checkpoint(tmp_path / "a", m, trainer={"step": -5})
    next(iter(tr.optimizer.state.values()))["exp_avg_sq"].fill_(float("inf"))
    with pytest.raises(ValueError, match=r"save_checkpoint\.optimizer: its state optimizer\.\d+\.exp_avg_sq"):
        save_checkpoint(tmp_path / "b", m, optimizer=tr.optimizer)
    assert not any(tmp_path.iterdir())
    save_checkpoint(tmp_path / "c", m, optimizer=tr.optimizer, allow_nonfinite=True)  # asked for: written
    with pytest.raises(CheckpointError, match="exp_avg_sq"):
        load_checkpoint(tmp_path / "c", TinyClassifier(), optimizer=Trainer(
            TinyClassifier(), Objective("cross_entropy"), tiny_config()).optimizer)


def test_allow_nonfinite_reads_what_it_wrote(run, tmp_path):
    ck = _copy(run, tmp_path, tensors=_nan_weight)
    m = TinyClassifier(seed=7)
    load_checkpoint(ck, m, allow_nonfinite=True)
    assert torch.isnan(m.head.weight[0, 0]) and torch.isfinite(m.head.weight[0, 1:]).all()
    with pytest.raises(TypeError, match=r"load_checkpoint\.allow_nonfinite: expected true or false"):
        load_checkpoint(ck, m, allow_nonfinite="yes")


def test_a_resume_compares_the_data_of_the_run(run):
    """``TrainConfig.extra`` (the data a run trains on) is compared on resume: another value
    is refused by its name unless allowed; a checkpoint that recorded none is not compared."""
    ck, cfg = run
    tr = Trainer(TinyClassifier(), Objective("cross_entropy"), cfg.replace(extra={"data.split_seed": 1}))
    with pytest.raises(CheckpointError, match=r"TrainConfig: data\.split_seed = 0 in the checkpoint, 1 now"):
        tr.fit(tiny_data(), resume=ck)
    tr = Trainer(TinyClassifier(), Objective("cross_entropy"), cfg.replace(extra={}))
    with pytest.raises(CheckpointError, match=r"data\.split_seed = 0 in the checkpoint, '\(not set\)' now"):
        tr.fit(tiny_data(), resume=ck)
    tr = Trainer(TinyClassifier(), Objective("cross_entropy"), cfg.replace(extra={"data.split_seed": 1}))
    with pytest.warns(UserWarning, match="data.split_seed"):
        tr.fit(tiny_data(), resume=ck, allow_changes=["data.split_seed"])
    assert tr.step == 12  # resumed at step 5, finished


def test_evaluate_refuses_an_n_t_whose_time_grid_cannot_be_allocated():
    """Before: ``evaluate(n_steps=10**12)`` built a list of 1e12 times (killed by the OOM
    killer)."""
    tr = Trainer(TinyClassifier(), Objective("cross_entropy"), tiny_config())
    with pytest.raises(ValueError, match=r"Trainer\.evaluate\.n_steps: N_t = 1000000000000 steps need a time grid"):
        tr.evaluate(tiny_data(), n_steps=10**12)
    assert tr.evaluate(tiny_data(), n_steps=3)["loss"] > 0


def test_generation_defaults_are_not_a_setting_of_the_map(tmp_path):
    """A decoder's ``generation_defaults`` (the ids generate stops and pads with) do not
    change its logits: a checkpoint written before decoders had them (a text run of
    opsplit train) loads, and so does one with other defaults."""
    from opsplit.models import DecoderConfig, DecoderLM

    cfg = DecoderConfig(vocab_size=7, d_model=8, n_layers=1, n_heads=2, d_ff=16, norm="layer", mlp="plain",
                        activation="gelu", positions="learned", max_positions=8, tie_embeddings=True)
    m = DecoderLM(cfg)
    m.generation_defaults = {"eos_token_id": 3, "pad_token_id": None}
    ck = save_checkpoint(tmp_path / "ck", m)
    load_checkpoint(ck, DecoderLM(cfg))
    rewrite_checkpoint(ck, meta=lambda meta: meta["model"]["settings"][""].pop("generation_defaults", None))
    load_checkpoint(ck, DecoderLM(cfg))
