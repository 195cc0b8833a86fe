"""Trainer, objective and checkpoints: bad input refused before training, kill-and-resume
bit for bit (in a new process), corrupt / truncated / mismatched checkpoints refused with
nothing loaded, loading at another N_t."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from opsplit.control import (
    CheckpointError,
    Objective,
    TrainConfig,
    Trainer,
    load_checkpoint,
    save_checkpoint,
)
from opsplit.controls import PiecewiseConstant
from opsplit.data import TensorData

sys.path.insert(0, str(Path(__file__).parent))
from _train_helpers import TinyClassifier, same_state, state_copy, tiny_config, tiny_data  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


_params, _same = state_copy, same_state


def test_trains_and_records_history(tmp_path):
    torch.manual_seed(0)
    m = TinyClassifier()
    data = tiny_data()
    tr = Trainer(m, Objective("cross_entropy"), tiny_config(epochs=4))
    before = tr.evaluate(data)
    h = tr.fit(data, data, out_dir=tmp_path, plot=False)
    after = tr.evaluate(data)
    assert len(h.steps) == 4 * 3 and len(h.epochs) == 4
    assert after["loss"] < before["loss"]
    for k in ("loss", "lr", "grad_norm", "time"):
        assert k in h.steps[-1]
    for k in ("eval_accuracy", "eval_loss", "peak_mem_mb", "epoch_time"):
        assert k in h.epochs[-1]
    assert (tmp_path / "steps.csv").is_file() and (tmp_path / "epochs.csv").is_file()
    h.plot(tmp_path / "curves.png")
    assert (tmp_path / "curves.png").stat().st_size > 1000
    from opsplit.control import History

    back = History.read_csv(tmp_path)
    assert [r["loss"] for r in back.steps] == pytest.approx(h.losses)
    # the cosine schedule ends near 0 and warm-up starts at lr/2
    assert h.steps[0]["lr"] == pytest.approx(0.5e-2)
    assert h.steps[-1]["lr"] < 1e-3


def test_grad_clip_and_sgd():
    m = TinyClassifier()
    tr = Trainer(m, Objective("cross_entropy"), tiny_config(optimizer="sgd", grad_clip=1e-3, epochs=1, weight_decay=0.0,
                                                            schedule="constant", warmup_steps=0))
    p0 = torch.cat([p.detach().flatten().clone() for p in m.parameters()])
    tr.fit(tiny_data())
    p1 = torch.cat([p.detach().flatten() for p in m.parameters()])
    # every SGD step moves by at most lr * (momentum sum) * clip
    assert float((p1 - p0).norm()) <= 1e-2 * 1e-3 * (1 + 1.9 + 2.71) + 1e-9


@pytest.mark.parametrize(
    "make, match",
    [
        (lambda: (TinyClassifier(), Objective("mse"), tiny_data()), "shape"),
        (lambda: (TinyClassifier(), Objective("cross_entropy"),
                  TensorData(torch.randn(4, 5, 8), torch.tensor([0, 1, 2, 7]))), r"\[0, 2\]"),
        (lambda: (TinyClassifier(), Objective("cross_entropy"),
                  TensorData(torch.randn(4, 5, 8), torch.zeros(4, 3).long())), "targets"),
    ],
)
def test_loss_target_mismatch_refused_before_training(make, match):
    m, obj, data = make()
    before = _params(m)
    tr = Trainer(m, obj, tiny_config())
    with pytest.raises(ValueError, match=match):
        tr.fit(data)
    assert tr.step == 0 and _same(before, _params(m))


def test_empty_dataset_and_bad_config():
    with pytest.raises(ValueError, match="empty dataset"):
        TensorData(torch.zeros(0, 5, 8), torch.zeros(0).long())
    m = TinyClassifier()
    tr = Trainer(m, Objective("cross_entropy"), tiny_config())
    with pytest.raises(ValueError, match="empty"):
        tr.fit((torch.zeros(0, 5, 8), torch.zeros(0).long()))
    with pytest.raises(TypeError, match="train_data"):
        tr.fit([1, 2, 3])
    for lr in (0.0, -1e-3):
        with pytest.raises(ValueError, match="lr"):
            TrainConfig(lr=lr)
        with pytest.raises(ValueError, match="lr"):
            Trainer(m, Objective("cross_entropy"), tiny_config(), lr=lr)
    with pytest.raises(ValueError, match="gradient"):
        TrainConfig(gradient="forward")
    with pytest.raises(ValueError, match="unknown key"):
        TrainConfig.from_dict({"learning_rate": 1e-3})
    with pytest.raises(ValueError, match="adjoint"):  # no ODE substep to apply the adjoint to
        Trainer(m, Objective("cross_entropy"), tiny_config(gradient="adjoint")).fit(tiny_data())
    with pytest.raises(ValueError, match="smoothness"):
        Objective("mse", smoothness=-1.0)


_RESUME = r"""
import sys, torch
sys.path.insert(0, {tests!r})
from _train_helpers import TinyClassifier, tiny_config, tiny_data
from opsplit.control import Objective, Trainer
torch.set_num_threads(1)  # as the parent's run: bit for bit needs the same thread count
torch.manual_seed(12345)  # a different global RNG state: the checkpoint must restore it
m = TinyClassifier(seed=99)  # other initial values: the checkpoint must overwrite them
tr = Trainer(m, Objective("cross_entropy"), tiny_config())
h = tr.fit(tiny_data(), out_dir={out!r}, resume={ck!r}, plot=False)
torch.save({{"losses": torch.tensor([r["loss"] for r in h.steps], dtype=torch.float64),
            "state": m.state_dict()}}, {res!r})
"""


#: a guard against a hung child process only, not a measure of speed: the child's work takes
#: seconds of CPU, and a loaded machine may stretch that many times over
HANG_GUARD_S = 1800


def test_kill_and_resume_bit_exact(tmp_path):
    cfg = tiny_config()  # 4 epochs of 3 steps, dropout, shuffling, cosine + warm-up, AdamW, clipping
    data = tiny_data()
    # one intra-op thread here and in the child: the same reductions (bit for bit), and no
    # OpenMP threads waiting for each other on a loaded machine
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        # uninterrupted
        m_full = TinyClassifier()
        h_full = Trainer(m_full, Objective("cross_entropy"), cfg).fit(data)
        # the same run writing a checkpoint every 5 steps: what a run killed after step 5
        # (mid-epoch) leaves behind is its step-5 checkpoint
        m_a = TinyClassifier()
        Trainer(m_a, Objective("cross_entropy"), cfg, save_every=5, keep_checkpoints=10).fit(
            data, out_dir=tmp_path / "run", plot=False)
    finally:
        torch.set_num_threads(threads)
    ck = tmp_path / "run" / "checkpoints" / "step-00000005"
    assert ck.is_dir()
    # a new process, new objects: resume from the checkpoint to the end
    res = tmp_path / "res.pt"
    code = _RESUME.format(tests=str(Path(__file__).parent), out=str(tmp_path / "run"), ck=str(ck), res=str(res))
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", OMP_WAIT_POLICY="PASSIVE")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT, env=env, timeout=HANG_GUARD_S)
    got = torch.load(res)
    full = torch.tensor([r["loss"] for r in h_full.steps], dtype=torch.float64)
    assert got["losses"].shape == (12,)
    assert torch.equal(got["losses"], full), (got["losses"] - full)
    assert _same(got["state"], _params(m_full))


def test_max_steps_truncation_matches_schedule_of_full_run():
    # a run stopped by max_steps follows the same schedule as the full run when told the total
    cfg = tiny_config()
    a = Trainer(TinyClassifier(), Objective("cross_entropy"), cfg)
    ha = a.fit(tiny_data())
    b = Trainer(TinyClassifier(), Objective("cross_entropy"), cfg, max_steps=12)
    hb = b.fit(tiny_data())
    assert ha.losses == hb.losses


def _checkpoint(tmp_path):
    m = TinyClassifier()
    tr = Trainer(m, Objective("cross_entropy"), tiny_config(epochs=1))
    tr.fit(tiny_data())
    return tr.save(tmp_path / "ck"), m


def _fresh():
    m = TinyClassifier(seed=7)
    tr = Trainer(m, Objective("cross_entropy"), tiny_config(epochs=1))
    return m, tr


def test_checkpoint_roundtrip(tmp_path):
    path, m = _checkpoint(tmp_path)
    m2, tr2 = _fresh()
    tr2.load(path)
    assert _same(_params(m), _params(m2))
    meta = json.loads((path / "meta.json").read_text())
    assert meta["schema_version"] == 1
    (prop,) = meta["model"]["propagators"].values()
    assert prop["n_steps"] == 2 and prop["scheme"]["class"] == "Lie"
    assert {c["class"] for c in meta["model"]["controls"].values()} >= {"PiecewiseConstant"}
    assert meta["trainer"]["step"] == 3


def _flip_byte(p: Path, pos: int):
    b = bytearray(p.read_bytes())
    b[pos] ^= 0x01
    p.write_bytes(bytes(b))


@pytest.mark.parametrize("damage", ["flip", "truncate_tensors", "truncate_meta", "no_meta", "version",
                                    "schema_field"])
def test_corrupt_checkpoint_refused_nothing_loaded(tmp_path, damage):
    path, _ = _checkpoint(tmp_path)
    tfile, mfile = path / "state.safetensors", path / "meta.json"
    if damage == "flip":
        _flip_byte(tfile, tfile.stat().st_size - 3)
    elif damage == "truncate_tensors":
        tfile.write_bytes(tfile.read_bytes()[:-100])
    elif damage == "truncate_meta":
        mfile.write_text(mfile.read_text()[:200])
    elif damage == "no_meta":
        mfile.unlink()
    elif damage == "version":
        meta = json.loads(mfile.read_text())
        meta["schema_version"] = 99
        mfile.write_text(json.dumps(meta))
    else:
        meta = json.loads(mfile.read_text())
        del meta["tensors_sha256"]
        mfile.write_text(json.dumps(meta))
    m, tr = _fresh()
    before = _params(m)
    opt_before = json.dumps(tr.optimizer.state_dict(), default=str)
    with pytest.raises(CheckpointError):
        tr.load(path)
    assert _same(before, _params(m))
    assert json.dumps(tr.optimizer.state_dict(), default=str) == opt_before
    assert tr.step == 0


def test_checkpoint_from_another_model_refused_before_training(tmp_path):
    path, _ = _checkpoint(tmp_path)
    for other in (TinyClassifier(d=12), TinyClassifier(scheme="strang", n_steps=3)):
        before = _params(other)
        tr = Trainer(other, Objective("cross_entropy"), tiny_config())
        d = 12 if other.head.in_features == 12 else 8
        data = TensorData(torch.randn(20, 5, d), torch.zeros(20).long())
        with pytest.raises(CheckpointError, match="another model|shape"):
            tr.fit(data, resume=path)
        assert tr.step == 0 and _same(before, _params(other))


def test_load_at_another_n_steps_resamples_controls(tmp_path):
    path, m = _checkpoint(tmp_path)  # N_t = 2
    m4 = TinyClassifier(n_steps=4, seed=5)
    with pytest.raises(CheckpointError, match="resample=True"):
        load_checkpoint(path, m4)
    ck = load_checkpoint(path, m4, resample=True, restore_rng=False)
    assert ck.resampled
    # the controls are the same functions of t (refinement is exact)
    src = dict(m.named_modules())
    n = 0
    for name, c in m4.named_modules():
        if isinstance(c, PiecewiseConstant):
            for t in (0.1, 0.7, 1.2, 1.9):
                assert torch.allclose(c(t), src[name](t), atol=1e-6)
            n += 1
    assert n > 0
    # so the model at N_t = 4 equals the checkpointed model solved with n_steps=4
    x = torch.randn(3, 5, 8)
    m.eval()
    m4.eval()
    torch.testing.assert_close(m4(x), m(x, n_steps=4))
    # with an optimizer, resampled state cannot be carried over
    tr = Trainer(m4, Objective("cross_entropy"), tiny_config())
    with pytest.raises(CheckpointError, match="optimizer"):
        load_checkpoint(path, m4, optimizer=tr.optimizer, resample=True)


def test_save_is_atomic_and_replaces(tmp_path):
    path, m = _checkpoint(tmp_path)
    save_checkpoint(path, m)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ck"]


def _affine_model(ny, slope_w, slope_b):
    from opsplit import Propagator
    from opsplit.grid import Grid
    from opsplit.operators import PointwiseAffine
    from opsplit.schemes import Lie

    grid = Grid.uniform(None, ny, ly=1.0)
    y = grid.y.nodes(dtype=torch.float64)
    w = torch.stack([0.5 + slope_w * y, 0.2 - slope_w * y])  # 2 time pieces, linear in y
    b = torch.stack([slope_b * y, 1.0 + slope_b * y])
    op = PointwiseAffine(PiecewiseConstant(w, t0=0.0, t1=2.0, axes=("y",)),
                         PiecewiseConstant(b, t0=0.0, t1=2.0, axes=("y",)))
    return Propagator(Lie([op]), 2, t1=2.0, grid=grid)


def test_load_at_another_grid_resolution_interpolates_in_y(tmp_path):
    src = _affine_model(8, 0.7, -0.3)
    path = save_checkpoint(tmp_path / "ck", src)
    tgt = _affine_model(16, 0.0, 0.0)
    with pytest.raises(CheckpointError, match="shape"):
        load_checkpoint(path, tgt, restore_rng=False)
    ck = load_checkpoint(path, tgt, resample=True, restore_rng=False)
    assert len(ck.resampled) == 2
    ref = _affine_model(16, 0.7, -0.3)  # the same functions of y sampled on the fine grid
    for (k, v), (_, r) in zip(tgt.state_dict().items(), ref.state_dict().items()):
        torch.testing.assert_close(v, r, rtol=1e-12, atol=1e-12, msg=k)
    # on a grid whose domain is N (L = N) nothing can be resampled
    from opsplit.grid import Grid

    paper = _affine_model(8, 0.7, -0.3)
    paper.grid = Grid.paper(None, 8)
    p2 = save_checkpoint(tmp_path / "ck2", paper)
    with pytest.raises(CheckpointError, match="length|domain"):
        load_checkpoint(p2, tgt, resample=True, restore_rng=False)


def test_trains_a_paper_transformer_with_running_costs():
    from opsplit.models import PaperTransformer

    torch.manual_seed(0)
    kw = dict(n_y=6, n_x=4, J=2, n_steps=3, dtype=torch.float64)
    teacher, student = PaperTransformer(**kw), PaperTransformer(**kw)
    x = torch.randn(32, 4, 6, dtype=torch.float64)
    with torch.no_grad():
        y = teacher(x)
    obj = Objective("mse", smoothness=1e-3, energy=1e-4)
    tr = Trainer(student, obj, tiny_config(epochs=3, batch_size=16, lr=2e-2))
    before = tr.evaluate((x, y))["mse"]
    h = tr.fit((x, y))
    assert "smoothness" in h.steps[0] and "energy" in h.steps[0]
    assert tr.evaluate((x, y))["mse"] < 0.9 * before


def test_data_parallel_slices_partition_the_global_batch():
    cfg = tiny_config(drop_last=True, batch_size=4)
    trs = [Trainer(TinyClassifier(), Objective("cross_entropy"), cfg, rank=r, world_size=2) for r in (0, 1)]
    single = Trainer(TinyClassifier(), Objective("cross_entropy"), cfg.replace(batch_size=8))
    for epoch in (0, 3):
        a, b = (t._epoch_batches(40, epoch) for t in trs)
        g = single._epoch_batches(40, epoch)
        assert len(a) == len(b) == len(g) == 5
        for x, y, z in zip(a, b, g):
            assert torch.equal(torch.cat([x, y]), z)
    with pytest.raises(ValueError, match="drop_last"):
        Trainer(TinyClassifier(), Objective("cross_entropy"), tiny_config(), rank=0, world_size=2).fit(tiny_data())
    with pytest.raises(ValueError, match="rank"):
        Trainer(TinyClassifier(), Objective("cross_entropy"), tiny_config(), rank=2, world_size=2)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_trainer_and_checkpoint_on_cuda(tmp_path):
    m = TinyClassifier().cuda()
    d = tiny_data()
    data = TensorData(d.inputs.cuda(), d.targets.cuda())
    tr = Trainer(m, Objective("cross_entropy"), tiny_config(epochs=2))
    h = tr.fit(data, data, out_dir=tmp_path, plot=False)
    assert h.epochs[-1]["peak_mem_mb"] > 0
    m2 = TinyClassifier(seed=4).cuda()
    tr2 = Trainer(m2, Objective("cross_entropy"), tiny_config(epochs=2))
    tr2.load(tmp_path)
    assert _same(_params(m), _params(m2)) and tr2.step == tr.step


def test_multi_resolution_training_draws_n_t_per_step_and_resumes(tmp_path):
    """TrainConfig.n_steps: each optimizer step calls the model with an N_t drawn from
    the list (seeded: the same draws in a resumed run); the model sees exactly the N_t the
    history records."""
    seen = []

    class Recording(TinyClassifier):
        def forward(self, x, n_steps=None):
            if self.training:
                seen.append(n_steps)
            return super().forward(x, n_steps=n_steps)

    cfg = tiny_config(n_steps=[1, 2, 4])
    h = Trainer(Recording(), Objective("cross_entropy"), cfg).fit(tiny_data())
    drawn = [int(r["n_steps"]) for r in h.steps]
    assert seen == drawn and len(drawn) == 12 and set(drawn) == {1, 2, 4}
    # without the option the model's own N_t is used
    seen.clear()
    Trainer(Recording(), Objective("cross_entropy"), tiny_config(epochs=1)).fit(tiny_data())
    assert seen == [None] * 3
    # resumed from the step-5 checkpoint: the same draws and losses as the uninterrupted run
    Trainer(Recording(), Objective("cross_entropy"), cfg, save_every=5, keep_checkpoints=10).fit(
        tiny_data(), out_dir=tmp_path / "run", plot=False)
    seen.clear()
    m = Recording(seed=5)
    h2 = Trainer(m, Objective("cross_entropy"), cfg).fit(
        tiny_data(), resume=tmp_path / "run" / "checkpoints" / "step-00000005")
    assert seen == drawn[5:]
    assert [r["loss"] for r in h2.steps] == [r["loss"] for r in h.steps]


def test_multi_resolution_training_refuses_bad_lists_and_models():
    for bad in ([], [0, 2], "4", [2.5]):
        with pytest.raises((TypeError, ValueError), match="n_steps"):
            tiny_config(n_steps=bad)

    class NoSteps(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(8, 3)

        def forward(self, x):
            return self.lin(x.mean(1))

    with pytest.raises(TypeError, match="n_steps: the model's forward must take n_steps"):
        Trainer(NoSteps(), Objective("cross_entropy"), tiny_config(n_steps=[2])).fit(tiny_data())


# -- issue 42, finding 11b: the rule for the objective's weights -------------------------------------
def test_objective_weight_refused_exactly_where_its_gradient_norm_or_term_overflows():
    """``check_objective`` refuses a cost weight w when w * ||grad C|| >= sqrt(float32 max) (the
    trainer's global gradient norm, a sum of squares, overflows) or w * C >= float32 max, C the
    cost of the untrained model on the samples: here against C and its gradient computed
    directly (record_flow, energy_cost, autograd in float64), just below and above each bound."""
    import math

    from opsplit.control.costs import energy_cost
    from opsplit.control.flow_costs import record_flow
    from opsplit.control.objective import check_objective, model_interval

    m = TinyClassifier()
    x, y = tiny_data()[torch.arange(2)]
    M = torch.finfo(torch.float32).max
    m.eval()
    with record_flow(m) as rec:
        m(x)
    grads = torch.autograd.grad(rec.kinetic(), [p for p in m.parameters()], allow_unused=True)
    gk = math.sqrt(sum(float(g.double().square().sum()) for g in grads if g is not None))
    grads = torch.autograd.grad(energy_cost(m, default_interval=model_interval(m)), list(m.parameters()),
                                allow_unused=True)
    ge = math.sqrt(sum(float(g.double().square().sum()) for g in grads if g is not None))
    m.train()
    for name, g in (("kinetic", gk), ("energy", ge)):
        bound = math.sqrt(M) / g
        check_objective(Objective("cross_entropy", **{name: 0.99 * bound}), m, x, y)
        with pytest.raises(ValueError, match=rf"^Objective\.{name}: the weight .* times the gradient"):
            check_objective(Objective("cross_entropy", **{name: 1.01 * bound}), m, x, y)
    assert m.training and all(p.grad is None for p in m.parameters())  # mode restored, no .grad written
    # the value rule (no trainable parameter: no gradient to overflow)
    from opsplit.control.costs import leaf_controls

    controls = leaf_controls(m)
    m.requires_grad_(False)
    c = float(energy_cost(m, controls=controls, default_interval=model_interval(m)))
    assert c > 1
    check_objective(Objective("cross_entropy", energy=0.99 * M / c, controls=controls), m, x, y)
    with pytest.raises(ValueError, match=r"^Objective\.energy: the weight .* is not finite in float32"):
        check_objective(Objective("cross_entropy", energy=1.01 * M / c, controls=controls), m, x, y)


# -- issue 42, finding 13d: the digest of meta.json ------------------------------------------------------
def test_meta_json_is_covered_by_a_digest_in_the_tensor_file(tmp_path):
    """state.safetensors records the SHA-256 of meta.json's canonical JSON (sorted keys, every
    entry but tensors_sha256 / tensors_bytes, which state.safetensors' own SHA-256 checks):
    recomputed here with hashlib; an edit of any entry is refused, a re-indented file is not,
    and a checkpoint written before the digest (none in its header) still loads."""
    import hashlib

    import safetensors.torch as st

    path, m = _checkpoint(tmp_path)
    meta_file, tfile = path / "meta.json", path / "state.safetensors"
    meta = json.loads(meta_file.read_text())
    data = tfile.read_bytes()
    header = json.loads(data[8:8 + int.from_bytes(data[:8], "little")])["__metadata__"]
    body = {k: v for k, v in meta.items() if k not in ("tensors_sha256", "tensors_bytes")}
    want = hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()
    assert header == {"opsplit.meta_sha256": want}
    original = meta_file.read_text()
    meta_file.write_text(json.dumps(meta, indent=4))  # the same metadata, laid out anew
    _fresh()[1].load(path)
    edits = {"created": lambda d: d.update(created="2000-01-01"),
             "trainer.elapsed": lambda d: d["trainer"].update(elapsed=1.0),
             "config.lr": lambda d: d["config"].update(lr=0.02),
             "rng.numpy.pos": lambda d: d["rng"]["numpy"].update(pos=1),
             "model.propagators.t1": lambda d: next(iter(d["model"]["propagators"].values())).update(t1=3.0),
             "trainer.history": lambda d: d["trainer"]["history"]["steps"][0].update(loss=0.5)}
    for what, edit in edits.items():
        changed = json.loads(original)
        edit(changed)
        meta_file.write_text(json.dumps(changed))
        m2, tr2 = _fresh()
        before = _params(m2)
        with pytest.raises(CheckpointError, match=r"meta\.json was changed after the checkpoint was written"):
            tr2.load(path)
        assert _same(before, _params(m2)) and tr2.step == 0, what
    # a checkpoint of an opsplit without the digest: its header holds none, and it loads
    meta_file.write_text(original)
    st.save_file(dict(st.load(data)), str(tfile))  # no metadata in the header
    old = tfile.read_bytes()
    meta["tensors_sha256"], meta["tensors_bytes"] = hashlib.sha256(old).hexdigest(), len(old)
    meta_file.write_text(json.dumps(meta))
    m3, tr3 = _fresh()
    tr3.load(path)
    assert _same(_params(m), _params(m3)) and tr3.step == 3
