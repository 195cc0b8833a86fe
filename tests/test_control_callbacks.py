"""The trainer's extension points: callbacks (hooks, stopping, the schedule's progress), the
CPU-time budget (a fake clock: no wall-clock dependence), the public single step, the
replacement of parameters at a step boundary with their optimizer state, and the
TrainConfig's field table (renamed fields, their former names, ``schema()``)."""

import dataclasses
import math
import sys
import warnings
from pathlib import Path

import pytest
import torch
from torch import nn

from opsplit.control import (
    Callback,
    CPUTimeBudget,
    Objective,
    TrainConfig,
    Trainer,
    config_changes,
    save_checkpoint,
)
from opsplit.data import TensorData

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _train_helpers import TinyClassifier, tiny_config, tiny_data  # noqa: E402


class Recorder(Callback):
    def __init__(self, stop_at=None):
        self.calls, self.stop_at = [], stop_at

    def on_fit_start(self, trainer):
        self.calls.append(("fit_start", trainer.step))

    def on_step_start(self, trainer):
        self.calls.append(("step_start", trainer.step))

    def on_step_end(self, trainer, row):
        self.calls.append(("step_end", row["step"]))
        return self.stop_at is not None and row["step"] >= self.stop_at

    def on_evaluate(self, trainer, metrics):
        self.calls.append(("evaluate", metrics["epoch"]))

    def on_fit_end(self, trainer):
        self.calls.append(("fit_end", trainer.step))


def test_hooks_are_called_in_order():
    rec = Recorder()
    tr = Trainer(TinyClassifier(), Objective("cross_entropy"), tiny_config(epochs=2, batch_size=20), callbacks=[rec])
    tr.fit(tiny_data(), tiny_data(8, seed=4))
    # 40 samples, batches of 20: 2 steps per epoch, 2 epochs, one evaluation each
    want = [("fit_start", 0), ("step_start", 0), ("step_end", 1), ("step_start", 1), ("step_end", 2),
            ("evaluate", 0), ("step_start", 2), ("step_end", 3), ("step_start", 3), ("step_end", 4),
            ("evaluate", 1), ("fit_end", 4)]
    assert rec.calls == want


def test_a_callback_stops_the_run_by_return_or_flag(tmp_path):
    rec = Recorder(stop_at=3)
    tr = Trainer(TinyClassifier(), Objective("cross_entropy"), tiny_config(epochs=10, batch_size=8), callbacks=[rec])
    tr.fit(tiny_data(), out_dir=tmp_path)
    assert tr.step == 3 and len(tr.history.steps) == 3
    assert rec.calls[-1] == ("fit_end", 3)
    assert (tmp_path / "checkpoints" / "step-00000003").is_dir()  # the last checkpoint is written as usual
    assert tr.history.epochs[-1]["step"] == 3  # the stopped epoch's row is written

    class Flag(Callback):
        def on_step_end(self, trainer, row):
            if trainer.step == 2:
                trainer.should_stop = True

    tr = Trainer(TinyClassifier(), Objective("cross_entropy"), tiny_config(epochs=10, batch_size=8), callbacks=[Flag()])
    tr.fit(tiny_data())
    assert tr.step == 2


class FixedProgress(Callback):
    """Progress p_k after k steps, from a list."""

    def __init__(self, ps):
        self.ps = ps

    def progress(self, trainer):
        return self.ps[min(trainer.step, len(self.ps) - 1)]


def test_a_callbacks_progress_drives_the_schedule():
    ps = [0.0, 0.5, 0.1, 0.9, 1.0, 1.0]
    lr, r = 1e-2, 0.1
    tr = Trainer(TinyClassifier(), Objective("cross_entropy"),
                 tiny_config(epochs=1, batch_size=8, warmup_steps=0, schedule="cosine", min_lr_ratio=r, lr=lr),
                 callbacks=[FixedProgress(ps)])
    tr.fit(tiny_data())
    lrs = [row["lr"] for row in tr.history.steps]
    # the rate of step k + 1 is set at the end of step k (the scheduler steps before the
    # counter is raised: trainer.step = k there), from the progress then
    want = [lr] + [lr * (r + (1 - r) * 0.5 * (1 + math.cos(math.pi * ps[k]))) for k in range(len(lrs) - 1)]
    assert lrs == pytest.approx(want, rel=1e-12)


def test_default_progress_is_the_step_count_after_warmup():
    tr = Trainer(TinyClassifier(), Objective("cross_entropy"), tiny_config(epochs=2, batch_size=8, warmup_steps=2,
                                                                           schedule="linear", lr=1e-2))
    tr.fit(tiny_data())
    total = 10  # 5 batches of 8, 2 epochs
    lrs = [row["lr"] for row in tr.history.steps]
    want = [1e-2 * (k + 1) / 2 if k < 2 else 1e-2 * (1 - (k - 2) / (total - 2)) for k in range(total)]
    assert tr.total_steps == total
    assert lrs == pytest.approx(want, rel=1e-12)


class Clock:
    def __init__(self, t=0.0):
        self.t = t

    def __call__(self):
        return self.t


class Tick(Callback):
    """Each step costs ``dt`` seconds of the fake clock."""

    def __init__(self, clock, dt):
        self.clock, self.dt = clock, dt

    def on_step_start(self, trainer):
        self.clock.t += self.dt


def _budget_run(clock, callbacks, **kw):
    cfg = tiny_config(epochs=1000, max_steps=100, batch_size=8, warmup_steps=0, schedule="cosine", lr=1e-2, **kw)
    return Trainer(TinyClassifier(), Objective("cross_entropy"), cfg, callbacks=callbacks)


def test_cpu_time_budget_stops_at_its_budget_and_the_schedule_follows_it():
    clock = Clock(50.0)
    budget = CPUTimeBudget(1.0, clock=clock)
    tr = _budget_run(clock, [Tick(clock, 0.25), budget])
    tr.fit(tiny_data())
    # each step costs 0.25 s: the budget is used up after the 4th step
    assert tr.step == 4 and budget.used() == pytest.approx(1.0)
    lrs = [row["lr"] for row in tr.history.steps]
    # step k + 1 runs at the rate set after step k, when 0.25 k of the budget was used
    want = [1e-2 * 0.5 * (1 + math.cos(math.pi * 0.25 * k)) for k in range(4)]
    assert lrs == pytest.approx(want, rel=1e-12)


def test_cpu_time_budget_resumes_with_the_time_spent(tmp_path):
    clock = Clock()
    ref = _budget_run(clock, [Tick(clock, 0.25), CPUTimeBudget(1.0, clock=clock)])
    ref.fit(tiny_data())
    clock = Clock()
    first = _budget_run(clock, [Tick(clock, 0.25), CPUTimeBudget(1.0, clock=clock), Recorder(stop_at=2)])
    first.fit(tiny_data(), out_dir=tmp_path)
    assert first.step == 2
    clock = Clock(1000.0)  # another process: another clock origin
    budget = CPUTimeBudget(1.0, clock=clock)
    second = _budget_run(clock, [Tick(clock, 0.25), budget, Recorder()])
    second.fit(tiny_data(), resume=tmp_path)
    assert second.step == ref.step == 4
    assert budget.used() == pytest.approx(1.0)
    assert [r["lr"] for r in second.history.steps] == [r["lr"] for r in ref.history.steps]


def test_train_step_is_fits_step():
    data = tiny_data()
    m1, m2 = TinyClassifier(), TinyClassifier()
    cfg = tiny_config(epochs=1, max_steps=1, batch_size=16, shuffle=False)
    a = Trainer(m1, Objective("cross_entropy"), cfg)
    a.fit(data)
    b = Trainer(m2, Objective("cross_entropy"), cfg)
    torch.manual_seed(cfg.seed)  # what fit does before the first step (dropout draws)
    m2.train()
    row = b.train_step(data, torch.arange(16))
    assert b.step == 1 and b.history.steps == [row] and "epoch" not in row
    assert row["loss"] == a.history.steps[0]["loss"]
    for p, q in zip(m1.parameters(), m2.parameters()):
        assert torch.equal(p, q)


def test_total_steps_set_outside_fit_drives_the_schedule():
    """train_step outside fit reads the schedule at total_steps (set through the public
    property): with a cosine decay over 4 steps the 4 learning rates are lr * (1 + cos(pi k/4))/2."""
    data = tiny_data()
    cfg = tiny_config(epochs=1, batch_size=16, shuffle=False, lr=0.1, schedule="cosine", warmup_steps=0)
    tr = Trainer(TinyClassifier(), Objective("cross_entropy"), cfg)
    tr.total_steps = 4
    lrs = [tr.train_step(data, torch.arange(16))["lr"] for _ in range(4)]
    assert lrs == pytest.approx([0.1 * (1 + math.cos(math.pi * k / 4)) / 2 for k in range(4)])
    for bad, err in ((0, ValueError), (2.0, TypeError), (True, TypeError)):
        with pytest.raises(err, match=r"^Trainer.total_steps: expected an integer >= 1"):
            tr.total_steps = bad
    assert tr.total_steps == 4


class Toy(nn.Module):
    """A piecewise-constant control with ``w.shape[0]`` pieces on [0, 1], read at fixed times."""

    def __init__(self, pieces=2):
        super().__init__()
        self.w = nn.Parameter(torch.linspace(-1, 1, 3 * pieces, dtype=torch.float64).reshape(pieces, 3))

    def forward(self, x):
        t = torch.tensor([0.1, 0.4, 0.6, 0.9], dtype=torch.float64)
        rows = self.w[(t * self.w.shape[0]).long()]  # (4, 3): the control at the four times
        return x @ rows.T


def _prolong(v):
    return v.repeat_interleave(2, dim=0)  # each piece split in two: the same function of t


def test_replace_parameters_carries_adams_moments_prolonged():
    g = torch.Generator().manual_seed(0)
    data = TensorData(torch.randn(12, 3, generator=g, dtype=torch.float64),
                      torch.randn(12, 4, generator=g, dtype=torch.float64))
    model = Toy()
    tr = Trainer(model, Objective("mse"), tiny_config(epochs=1, batch_size=12, lr=0.05, warmup_steps=0,
                                                      schedule="constant", weight_decay=0.0, grad_clip=None))
    model.train()
    for _ in range(3):
        tr.train_step(data)
    old = model.w
    st = {k: v.clone() for k, v in tr.optimizer.state[old].items()}
    new = nn.Parameter(_prolong(old.detach()))
    model.w = new
    with torch.no_grad():
        assert torch.equal(model(data.inputs), Toy.forward(_with(old), data.inputs))  # the same map
    tr.replace_parameters({old: new}, state_map=lambda key, value, o, n: _prolong(value))
    assert tr.params == [new] and tr.optimizer.param_groups[0]["params"] == [new] and old not in tr.optimizer.state
    moved = tr.optimizer.state[new]
    assert torch.equal(moved["exp_avg"], _prolong(st["exp_avg"]))
    assert torch.equal(moved["exp_avg_sq"], _prolong(st["exp_avg_sq"]))
    assert float(moved["step"]) == float(st["step"]) == 3
    # the next step equals a fresh torch Adam given the prolonged moments (the independent reference)
    ref = nn.Parameter(new.detach().clone())
    opt = torch.optim.AdamW([ref], lr=0.05, betas=(0.9, 0.999), weight_decay=0.0)
    opt.state[ref] = {"step": st["step"].clone(), "exp_avg": _prolong(st["exp_avg"]),
                      "exp_avg_sq": _prolong(st["exp_avg_sq"])}
    ref_model = Toy()
    ref_model.w = ref
    Objective("mse")(ref_model, data.inputs, data.targets).total.backward()
    opt.step()
    tr.train_step(data)
    torch.testing.assert_close(new.detach(), ref.detach(), rtol=0, atol=0)


def _with(w):
    m = Toy()
    m.w = w
    return m


def test_replace_parameters_from_a_callback_during_fit():
    g = torch.Generator().manual_seed(1)
    data = TensorData(torch.randn(16, 3, generator=g, dtype=torch.float64),
                      torch.randn(16, 4, generator=g, dtype=torch.float64))

    class Refine(Callback):
        def on_step_start(self, trainer):
            if trainer.step == 2:
                old = trainer.model.w
                trainer.model.w = nn.Parameter(_prolong(old.detach()))
                trainer.replace_parameters({old: trainer.model.w}, state_map=lambda k, v, o, n: _prolong(v))

    model = Toy()
    tr = Trainer(model, Objective("mse"), tiny_config(epochs=1, batch_size=4, lr=0.05), callbacks=[Refine()])
    tr.fit(data)
    assert tr.step == 4 and model.w.shape == (4, 3) and tr.params == [model.w]
    assert len(tr.optimizer.state) == 1 and float(tr.optimizer.state[model.w]["step"]) == 4


def test_fresh_state_when_no_state_map():
    model = Toy()
    tr = Trainer(model, Objective("mse"), tiny_config(epochs=1, batch_size=4))
    data = TensorData(torch.randn(4, 3, dtype=torch.float64), torch.randn(4, 4, dtype=torch.float64))
    tr.train_step(data)
    old = model.w
    model.w = nn.Parameter(_prolong(old.detach()))
    tr.replace_parameters({old: model.w})
    assert model.w not in tr.optimizer.state and old not in tr.optimizer.state
    tr.train_step(data)
    assert float(tr.optimizer.state[model.w]["step"]) == 1


# -- the config's field table -------------------------------------------------------------------
RENAMES = {"train_n_steps": ("n_steps", [2, 4]), "train_n_steps_weights": ("n_steps_weights", "cost"),
           "train_solvers": ("solvers", ["euler", "heun"]), "train_solvers_weights": ("solvers_weights", "cost"),
           "train_solvers_split": ("solvers_split", True), "train_solvers_split_weights": ("solvers_split_weights",
                                                                                         [3.0, 1.0])}


def test_former_names_are_accepted_with_a_deprecation_warning():
    new = {n: v for n, v in RENAMES.values()}
    old = {o: v for o, (_, v) in RENAMES.items()}
    want = TrainConfig(**new)
    for make in (lambda: TrainConfig(**old), lambda: TrainConfig.from_dict(old), lambda: TrainConfig().replace(**old)):
        with pytest.warns(DeprecationWarning) as rec:
            got = make()
        assert got == want
        msgs = sorted(str(w.message) for w in rec)
        assert msgs == sorted(f"TrainConfig.{o} is deprecated: use TrainConfig.{n}" for o, (n, _) in RENAMES.items())
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert TrainConfig(**new).to_dict()["n_steps"] == [2, 4]  # the new names warn nothing
    with pytest.warns(DeprecationWarning, match="use TrainConfig.n_steps"):
        assert want.train_n_steps == (2, 4)
    with pytest.raises(ValueError, match=r"^TrainConfig\.n_steps: given twice"), pytest.warns(DeprecationWarning):
        TrainConfig(n_steps=[2], train_n_steps=[4])


def test_uniform_and_shares_are_the_defaults_spelled_out():
    a = TrainConfig(n_steps=[2, 4], n_steps_weights="uniform", solvers=["euler", "heun"], solvers_weights="uniform",
                    solvers_split=True, solvers_split_weights="shares")
    assert a == TrainConfig(n_steps=[2, 4], solvers=["euler", "heun"], solvers_split=True)
    assert a.n_steps_weights is None and a.solvers_weights is None and a.solvers_split_weights is None


def test_schema_lists_every_field_with_its_default_and_check():
    schema = TrainConfig.schema()
    fields = [f.name for f in dataclasses.fields(TrainConfig)]
    assert list(schema) == fields == list(TrainConfig().to_dict())
    assert len(fields) == 35
    default = TrainConfig()
    for name, f in schema.items():
        assert f.name == name and f.doc and f.accepts and f.group
        assert f.resume in ("refused", "allowed", "samples", "length", "keys")
        assert getattr(default, name) == f.default
        # every value is checked by the library, with a message that starts with the field
        with pytest.raises((TypeError, ValueError)) as info:
            TrainConfig(**{name: object()})
        assert str(info.value).startswith(f"TrainConfig.{name}: "), str(info.value)
        if f.choices and name != "solvers":
            for c in f.choices:
                assert getattr(TrainConfig(**{name: c}), name) == c
    assert {n for n, f in schema.items() if f.group == "sampling"} == {n for n, _ in RENAMES.values()}
    assert schema["lr"].resume == "refused" and schema["eval_every"].resume == "allowed"


def test_a_checkpoint_saved_with_the_former_names_resumes(tmp_path):
    cfg = tiny_config(epochs=2, n_steps=[1, 2], n_steps_weights="cost", solvers=["euler", "heun"])
    old = {next((o for o, (n, _) in RENAMES.items() if n == k), k): v for k, v in cfg.to_dict().items()}
    assert "train_n_steps" in old and "n_steps" not in old
    assert config_changes(old, cfg) == []
    changed = cfg.replace(n_steps=[1, 4])
    assert [c.key for c in config_changes(old, changed)] == ["n_steps"]
    tr = Trainer(TinyClassifier(), Objective("cross_entropy"), cfg)
    tr.fit(tiny_data())
    ck = save_checkpoint(tmp_path / "ck", tr.model, optimizer=tr.optimizer, scheduler=tr.scheduler,
                         generator=tr.generator, trainer=tr.state(), config=old)
    tr2 = Trainer(TinyClassifier(), Objective("cross_entropy"), cfg)
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)  # no "accepted changed settings" warning
        tr2.load(ck)
    assert tr2.step == tr.step
