"""What the trainer and the checkpoints refuse (issue 17): a step on a non-finite gradient,
a checkpoint with non-finite weights, a checkpoint of another map with the same tensor
shapes, a resume with other run settings, an unwritable output folder found after the
training, loose evaluation batch sizes, and a config changed after it was checked."""

import dataclasses
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

from opsplit.control import (
    CheckpointError,
    Objective,
    TrainConfig,
    Trainer,
    check_out_dir,
    checkpoint_differences,
    load_checkpoint,
    save_checkpoint,
)
from opsplit.models import SplitEncoder

sys.path.insert(0, str(Path(__file__).parent))
from _train_helpers import (  # noqa: E402
    TinyClassifier,
    rewrite_checkpoint,
    same_state,
    state_copy,
    tiny_config,
    tiny_data,
)

ROOT = Path(__file__).resolve().parents[1]


_params, _same = state_copy, same_state


def _files(folder: Path):
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*")) if folder.exists() else []


# -- a non-finite gradient at a finite loss --------------------------------------------------------
class Kinked(TinyClassifier):
    """TinyClassifier plus sqrt(|p|) with p = 0: a finite loss whose gradient in p is inf."""

    def __init__(self):
        super().__init__()
        self.p = nn.Parameter(torch.zeros(()))

    def forward(self, x, n_steps=None):
        return super().forward(x, n_steps) + torch.sqrt(self.p.abs())


class KinkedLinear(nn.Module):
    """No opsplit propagator (nothing checks the parameters in the forward pass)."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 3)
        self.p = nn.Parameter(torch.zeros(()))

    def forward(self, x):
        return self.lin(x.mean(1)) * torch.sqrt(self.p.abs())


@pytest.mark.parametrize("make", [Kinked, KinkedLinear])
@pytest.mark.parametrize("clip", [1.0, None])
@pytest.mark.parametrize("steps", [1, 6])
def test_nonfinite_gradient_stops_before_the_step_and_writes_nothing(tmp_path, make, clip, steps):
    """Before: with grad_clip the inf gradient of p turned every gradient NaN, one step made
    every parameter NaN and the run 'finished', writing them to its checkpoint (with more
    steps the next forward blamed the learning rate)."""
    torch.manual_seed(0)
    m = make()
    before = _params(m)
    tr = Trainer(m, Objective("cross_entropy"), tiny_config(grad_clip=clip, max_steps=steps, save_every=1))
    out = tmp_path / "run"
    with pytest.raises(FloatingPointError, match=r"step 0: the gradient of p holds NaN/inf, at a finite objective"):
        tr.fit(tiny_data(), out_dir=out)
    assert _same(before, _params(m)), "the optimizer stepped"
    assert tr.step == 0 and tr.history.steps == []
    assert not list(out.rglob("meta.json")), "a checkpoint was written"
    assert all(torch.isfinite(v).all() for v in m.state_dict().values())


def test_gradient_norm_and_clipping_unchanged_on_finite_gradients():
    """The norm the trainer logs and clips with is clip_grad_norm_'s (an independent
    computation: the same step done by hand)."""
    m, ref = TinyClassifier(), TinyClassifier()
    ref.load_state_dict(m.state_dict())
    cfg = tiny_config(max_steps=1, optimizer="sgd", momentum=0.0, weight_decay=0.0, warmup_steps=0,
                      schedule="constant", grad_clip=0.05, shuffle=False)
    tr = Trainer(m, Objective("cross_entropy"), cfg)
    h = tr.fit(tiny_data())
    x, y = tiny_data()[torch.arange(16)]
    torch.manual_seed(cfg.seed)  # the same dropout mask
    ref.train()
    loss = torch.nn.functional.cross_entropy(ref(x), y)
    loss.backward()
    norm = torch.nn.utils.clip_grad_norm_(ref.parameters(), 0.05)
    with torch.no_grad():
        for p in ref.parameters():
            p -= cfg.lr * p.grad
    assert h.steps[0]["grad_norm"] == pytest.approx(float(norm), rel=1e-6) and float(norm) > 0.05
    for (k, a), b in zip(m.state_dict().items(), ref.state_dict().values()):
        torch.testing.assert_close(a, b, msg=k)


@pytest.mark.parametrize("newer_torch", [True, False])
def test_norm_and_clip_equal_clip_grad_norm(monkeypatch, newer_torch):
    """The trainer's norm-then-clip equals clip_grad_norm_, with torch's helpers (>= 2.6) and
    with the fallback the older torch of the dependency range takes."""
    from opsplit.control import trainer as T

    if not newer_torch:
        for name in ("get_total_norm", "clip_grads_with_norm_"):
            monkeypatch.delattr(torch.nn.utils, name, raising=False)
    g = torch.Generator().manual_seed(0)
    ps = [nn.Parameter(torch.zeros(s)) for s in ((3, 4), (5,), ())]
    qs = [nn.Parameter(torch.zeros_like(p)) for p in ps]
    for p, q in zip(ps, qs):
        p.grad = torch.randn(p.shape, generator=g)
        q.grad = p.grad.clone()
    total = T._total_norm([p.grad for p in ps])
    T._clip(ps, 0.5, total)
    monkeypatch.undo()
    ref = torch.nn.utils.clip_grad_norm_(qs, 0.5)
    torch.testing.assert_close(total, ref)
    for p, q in zip(ps, qs):
        torch.testing.assert_close(p.grad, q.grad)


def test_save_checkpoint_refuses_nonfinite_weights(tmp_path):
    m = TinyClassifier()
    with torch.no_grad():
        m.head.weight[1, 2] = float("nan")
    with pytest.raises(ValueError, match=r"save_checkpoint.model: head.weight hold\(s\) NaN/inf"):
        save_checkpoint(tmp_path / "ck", m)
    assert _files(tmp_path) == []
    save_checkpoint(tmp_path / "ck", m, allow_nonfinite=True)  # asked for: written
    assert (tmp_path / "ck" / "meta.json").is_file()


_DDP_NAN = r"""
import os, sys, torch
sys.path.insert(0, {tests!r})
from _train_helpers import TinyClassifier, tiny_config, tiny_data
from opsplit.control import Objective, Trainer
from opsplit.control import distributed as od

class NaNOnRank1(TinyClassifier):
    def forward(self, x, n_steps=None):
        out = super().forward(x, n_steps)
        return out * float("nan") if self.training and od.env_from_environ().rank == 1 else out

env = od.init_from_env(timeout=300)  # a hung collective fails the test (rc != 3); ranks start within seconds
torch.manual_seed(0)
m = NaNOnRank1()
tr = Trainer(m, Objective("cross_entropy"), tiny_config(drop_last=True, batch_size=8), forward_model=od.wrap(m, env),
             **env.trainer_kwargs())
try:
    tr.fit(tiny_data())
    stopped = None
except FloatingPointError as e:
    stopped = str(e)
# nothing may hold the DDP wrapper (and through it the gloo group) when the interpreter
# finalises: gloo's worker threads then abort the process (docs/distributed.md, shutdown)
del tr
od.shutdown(barrier=stopped is None)
if stopped is not None:
    print("STOPPED", env.rank, stopped, flush=True)
    sys.exit(3)
print("FINISHED", env.rank, flush=True)
"""


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_data_parallel_ranks_agree_to_stop_on_a_nonfinite_objective(tmp_path):
    """Rank 1's objective is NaN, rank 0's finite: both stop at step 0 with a
    FloatingPointError (before: rank 1 raised before the backward pass and rank 0 waited in
    the gradient all-reduce until the process group's timeout)."""
    script = tmp_path / "nan_rank1.py"
    script.write_text(_DDP_NAN.format(tests=str(Path(__file__).parent)))
    port = str(_free_port())
    procs = []
    for r in (0, 1):
        env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
        env.update(RANK=str(r), WORLD_SIZE="2", LOCAL_RANK=str(r), LOCAL_WORLD_SIZE="2", MASTER_ADDR="127.0.0.1",
                   MASTER_PORT=port, OMP_NUM_THREADS="1", OMP_WAIT_POLICY="PASSIVE", PYTHONPATH=str(ROOT),
                   CUDA_VISIBLE_DEVICES="")
        procs.append(subprocess.Popen([sys.executable, str(script)], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True))
    outs = []
    for p in procs:
        try:
            outs.append(p.communicate(timeout=1800)[0])  # a guard against a hang (> the gloo timeout)
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            pytest.fail("a rank hung: the ranks did not agree to stop")
    for r, (p, out) in enumerate(zip(procs, outs)):
        assert p.returncode == 3, f"rank {r} (rc {p.returncode}):\n{out[-3000:]}"
        assert f"STOPPED {r} step 0: the objective is NaN/inf on {'another rank' if r == 0 else 'this rank'}" in out


# -- checkpoints of another map ------------------------------------------------------------------------
def _enc(**kw):
    base = dict(n_steps=2, T=4.0, scheme="lie", generator=torch.Generator().manual_seed(0))
    base.update(kw)
    return SplitEncoder(8, 2, 16, **base)


@pytest.mark.parametrize("change, key", [
    (dict(T=8.0), "t1"),
    (dict(scheme="strang"), "scheme"),
    (dict(causal=True), "causal"),
    (dict(activation="relu"), "activation"),
    (dict(layer_norm_eps=1e-3), "eps"),
])
def test_checkpoint_of_another_map_with_the_same_shapes_is_refused(tmp_path, change, key):
    """Before: T = 4 loaded into T = 8, Lie into Strang, non-causal into causal, GELU into
    ReLU: the same tensor shapes, another map (outputs differing by O(1)), loaded silently."""
    src = _enc()
    path = save_checkpoint(tmp_path / "ck", src)
    tgt = _enc(**change, generator=torch.Generator().manual_seed(5))
    before = _params(tgt)
    with pytest.raises(CheckpointError, match=rf"{key}\b.*in the checkpoint.*in the model.*allow_changes=\['{key}'\]"):
        load_checkpoint(path, tgt, restore_rng=False)
    assert _same(before, _params(tgt)), "something was loaded"
    assert [c.key.split(" ")[0] for c in checkpoint_differences(path, tgt)][:1] == [key]
    # a deliberate transfer: named (or True), loaded, reported
    ck = load_checkpoint(path, tgt, restore_rng=False, allow_changes=[key])
    assert ck.changes and _same(_params(src), _params(tgt))
    x = torch.randn(2, 5, 8)
    with torch.no_grad():
        assert float((tgt(x) - src(x)).abs().max()) > 1e-3  # the same tensors, another map
    load_checkpoint(path, _enc(**change), restore_rng=False, allow_changes=True)


def test_same_map_loads_and_resample_accepts_another_n_t(tmp_path):
    src = _enc(control="legendre")
    path = save_checkpoint(tmp_path / "ck", src)
    assert checkpoint_differences(path, _enc(control="legendre")) == []
    load_checkpoint(path, _enc(control="legendre", generator=torch.Generator().manual_seed(3)), restore_rng=False)
    # Legendre controls: N_t = 8 has the same shapes as N_t = 2 but is another discrete map
    fine = _enc(control="legendre", n_steps=8)
    with pytest.raises(CheckpointError, match=r"n_steps = 2 in the checkpoint, 8 in the model"):
        load_checkpoint(path, fine, restore_rng=False)
    load_checkpoint(path, fine, restore_rng=False, resample=True)  # the same controls at another N_t
    x = torch.randn(2, 5, 8)
    with torch.no_grad():
        torch.testing.assert_close(fine(x), src(x, n_steps=8))


def test_checkpoint_without_recorded_settings_still_loads(tmp_path):
    """Checkpoints written before the settings were recorded: compared on their propagators."""
    path = save_checkpoint(tmp_path / "ck", _enc())
    rewrite_checkpoint(path, meta=lambda meta: meta["model"].pop("settings"))  # (its digest made to match)
    load_checkpoint(path, _enc(causal=True), restore_rng=False)  # nothing recorded to compare
    with pytest.raises(CheckpointError, match="t1"):
        load_checkpoint(path, _enc(T=8.0), restore_rng=False)


def test_resume_into_another_map_is_refused_before_training(tmp_path):
    m = TinyClassifier()
    Trainer(m, Objective("cross_entropy"), tiny_config(epochs=1)).fit(tiny_data(), out_dir=tmp_path / "run")
    other = TinyClassifier(T=4.0, seed=3)
    before = _params(other)
    tr = Trainer(other, Objective("cross_entropy"), tiny_config(epochs=1))
    with pytest.raises(CheckpointError, match=r"encoder: t1 \(T\) = 2.0 in the checkpoint, 4.0 in the model"):
        tr.fit(tiny_data(), resume=tmp_path / "run")
    assert tr.step == 0 and _same(before, _params(other))


# -- a resumed run with other settings ----------------------------------------------------------------
@pytest.mark.parametrize("change, key", [
    (dict(lr=0.5), "lr"),
    (dict(schedule="linear"), "schedule"),
    (dict(batch_size=8), "batch_size"),
    (dict(seed=4), "seed"),
    (dict(epochs=8), "epochs"),  # the cosine schedule's length
    (dict(optimizer="adam"), "optimizer"),
])
def test_resume_with_other_run_settings_is_refused(tmp_path, change, key):
    """Before: accepted silently; the checkpoint's rates were used while the config reported
    the new ones (lr 0.5 in the config, 1.5e-3 in the optimizer)."""
    cfg = tiny_config(save_every=5, keep_checkpoints=10)
    Trainer(TinyClassifier(), Objective("cross_entropy"), cfg).fit(tiny_data(), out_dir=tmp_path / "run")
    ck = tmp_path / "run" / "checkpoints" / "step-00000005"
    m = TinyClassifier(seed=4)
    before = _params(m)
    tr = Trainer(m, Objective("cross_entropy"), cfg.replace(**change))
    with pytest.raises(CheckpointError, match=rf"written by a run with other settings.*TrainConfig: {key}"):
        tr.fit(tiny_data(), resume=ck)
    assert tr.step == 0 and _same(before, _params(m))


def test_resume_with_allowed_changes_follows_the_new_config(tmp_path):
    cfg = tiny_config(save_every=5, keep_checkpoints=10, schedule="constant", warmup_steps=0)
    Trainer(TinyClassifier(), Objective("cross_entropy"), cfg).fit(tiny_data(), out_dir=tmp_path / "run")
    ck = tmp_path / "run" / "checkpoints" / "step-00000005"
    tr = Trainer(TinyClassifier(), Objective("cross_entropy"), cfg.replace(lr=0.02, weight_decay=0.1))
    with pytest.warns(UserWarning, match=r"accepted changed settings.*lr = 0.01 in the checkpoint, 0.02 now"):
        h = tr.fit(tiny_data(), resume=ck, allow_changes=["lr", "weight_decay"])
    assert [r["lr"] for r in h.steps[5:]] == [0.02] * 7  # the config's rate, as it reports
    assert {g["weight_decay"] for g in tr.optimizer.param_groups} == {0.1}
    # unchanged settings resume silently (a changed eval / save setting is not a change of the run)
    tr = Trainer(TinyClassifier(), Objective("cross_entropy"), cfg.replace(eval_every=3, save_every=None))
    tr.fit(tiny_data(), resume=ck)


# -- late and loose errors ------------------------------------------------------------------------------
def test_unwritable_out_dir_is_refused_before_the_first_step(tmp_path):
    """Before: the run trained to the end, then failed writing its checkpoint."""
    f = tmp_path / "a_file"
    f.write_text("x")
    for out, match in ((f, "is a file"), (f / "sub", "cannot be created.*is a file"), ("", "empty"), (3, "path")):
        tr = Trainer(TinyClassifier(), Objective("cross_entropy"), tiny_config())
        with pytest.raises((ValueError, TypeError), match=rf"Trainer.fit.out_dir: .*{match}"):
            tr.fit(tiny_data(), out_dir=out)
        assert tr.step == 0
    assert _files(tmp_path) == ["a_file"]
    assert check_out_dir(tmp_path / "new" / "deeper") == tmp_path / "new" / "deeper"
    assert _files(tmp_path) == ["a_file"]  # checking creates nothing


@pytest.mark.skipif(os.geteuid() == 0 if hasattr(os, "geteuid") else True, reason="root writes anywhere")
def test_read_only_out_dir_is_refused(tmp_path):
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    try:
        with pytest.raises(ValueError, match="not writable"):
            check_out_dir(ro / "run")
    finally:
        ro.chmod(0o700)


def test_folder_refusing_entries_is_refused_before_the_first_step_as_root_too(tmp_path, monkeypatch):
    """A folder in which nothing can be created (a read-only mount, a folder without write
    permission: the check creates and removes a probe folder there) — simulated by making
    the probe fail with EACCES, so that the refusal is tested when the suite runs as root,
    whom permission bits do not stop."""
    import errno

    import opsplit.control.paths as paths

    ro = tmp_path / "ro"
    ro.mkdir()

    def refuse(*args, dir=None, **kwargs):
        raise PermissionError(errno.EACCES, "Permission denied", str(dir))

    monkeypatch.setattr(paths.tempfile, "mkdtemp", refuse)
    tr = Trainer(TinyClassifier(), Objective("cross_entropy"), tiny_config())
    with pytest.raises(ValueError, match=rf"Trainer.fit.out_dir: '{ro / 'run'}' is not writable: cannot "
                                         rf"create entries in '{ro}' \(Permission denied\)"):
        tr.fit(tiny_data(), out_dir=ro / "run")
    assert tr.step == 0 and _files(tmp_path) == ["ro"] and not any(ro.iterdir())


@pytest.mark.parametrize("bs, exc", [(0, ValueError), (-1, ValueError), (2.5, TypeError), (True, TypeError),
                                     ("8", TypeError)])
def test_evaluate_batch_size_checked(bs, exc):
    """Before: 0 used another value silently, -1 raised ZeroDivisionError, 2.5 a TypeError
    deep in range()."""
    tr = Trainer(TinyClassifier(), Objective("cross_entropy"), tiny_config())
    with pytest.raises(exc, match=r"Trainer.evaluate.batch_size: expected an integer >= 1"):
        tr.evaluate(tiny_data(), batch_size=bs)
    a, b = tr.evaluate(tiny_data(), batch_size=7), tr.evaluate(tiny_data())
    assert a["accuracy"] == b["accuracy"] and a["loss"] == pytest.approx(b["loss"], rel=1e-6)


def test_config_stays_valid_after_assignment():
    """Before: c.optimizer = "rmsprop" was accepted and a Trainer built SGD from it."""
    c = TrainConfig()
    for name, bad, exc in (("optimizer", "rmsprop", ValueError), ("lr", -1.0, ValueError),
                           ("batch_size", 2.5, TypeError), ("betas", (0.9, 1.5), ValueError),
                           ("schedule", "step", ValueError), ("shuffle", "yes", TypeError)):
        with pytest.raises(exc, match=rf"TrainConfig\.{name}"):
            setattr(c, name, bad)
    assert c == TrainConfig()  # nothing changed
    with pytest.raises(AttributeError, match="unknown field 'learning_rate'"):
        c.learning_rate = 1e-3
    c.lr = 3  # a valid assignment is normalised as at construction
    assert c.lr == 3.0 and isinstance(c.lr, float)
    # the trainer's copy is frozen: its optimizer was built from it
    tr = Trainer(TinyClassifier(), Objective("cross_entropy"), c)
    with pytest.raises(dataclasses.FrozenInstanceError, match=r"TrainConfig.lr: this config belongs to a Trainer"):
        tr.config.lr = 1.0
    c.lr = 0.5  # the user's object is not the trainer's
    assert tr.config.lr == 3.0 and tr.optimizer.param_groups[0]["lr"] == 3.0
    assert tr.config.replace(lr=0.1).lr == 0.1
