"""Self-distillation of coarse draws (``TrainConfig.n_steps_distill``, opsplit.control.objective):
the objective against a direct transcription of its formula, computed on a copy of the model."""

from __future__ import annotations

import copy
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from opsplit.control import Objective, TrainConfig, Trainer, coarse_controls

sys.path.insert(0, str(Path(__file__).parent))
from _train_helpers import TinyClassifier, tiny_config, tiny_data  # noqa: E402


def _kl(teacher, student):
    """mean over rows of sum_c p_T (log p_T - log p_S), written out."""
    pt = torch.softmax(teacher, -1)
    return (pt * (torch.log(pt) - torch.log(torch.softmax(student, -1)))).sum(-1).mean()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_distill_term_is_the_kl_of_the_softmaxes(dtype):
    g = torch.Generator().manual_seed(0)
    s, t = torch.randn(4, 7, 5, generator=g, dtype=dtype), torch.randn(4, 7, 5, generator=g, dtype=dtype)
    got = Objective("cross_entropy").distill_term(s, t)
    want = _kl(t.reshape(-1, 5), s.reshape(-1, 5))  # the mean over every position of every sequence
    tol = 1e-12 if dtype == torch.float64 else 1e-6
    assert float(got) == pytest.approx(float(want), rel=tol, abs=tol)
    assert float(Objective("cross_entropy").distill_term(t, t)) == pytest.approx(0.0, abs=tol)
    mse = Objective("mse").distill_term(s, t)
    assert float(mse) == pytest.approx(float(((s - t) ** 2).mean()), rel=tol)
    assert Objective(lambda o, y: o.sum(), distill="kl").distill_kind == "kl"
    assert Objective(lambda o, y: o.sum()).distill_kind is None


def test_distill_term_gradcheck_and_no_gradient_into_the_teacher():
    g = torch.Generator().manual_seed(1)
    s = torch.randn(3, 4, generator=g, dtype=torch.float64, requires_grad=True)
    t = torch.randn(3, 4, generator=g, dtype=torch.float64, requires_grad=True)
    obj = Objective("cross_entropy")
    assert torch.autograd.gradcheck(lambda a: obj.distill_term(a, t), (s,))
    obj.distill_term(s, t).backward()
    assert t.grad is None and s.grad is not None


def test_objective_mixes_the_terms_by_the_weight():
    g = torch.Generator().manual_seed(2)
    x, y = torch.randn(6, 3, generator=g), torch.randint(0, 3, (6,), generator=g)
    teacher = torch.randn(6, 3, generator=g)
    obj = Objective("cross_entropy")
    model = torch.nn.Identity()
    for w in (0.0, 0.3, 1.0):
        v = obj(model, x, y, teacher=teacher, distill_weight=w)
        want = (1 - w) * F.cross_entropy(x, y) + w * _kl(teacher, x)
        assert float(v.total) == pytest.approx(float(want), rel=1e-6)
        assert float(v.data) == pytest.approx(float(F.cross_entropy(x, y)), rel=1e-6)
        assert float(v.distill) == pytest.approx(float(_kl(teacher, x)), rel=1e-6)
    assert obj(model, x, y).distill is None


def _trainer(lam, **kw):
    model = TinyClassifier(n_steps=4, T=2.0)
    model.drop.p = 0.0  # (the hand computation below solves the same network)
    cfg = tiny_config(n_steps=(1, 2, 4), coarse_controls="average", n_steps_distill=lam, max_steps=40, **kw)
    return model, Trainer(model, Objective("cross_entropy"), cfg)


@pytest.mark.parametrize("lam", [0.5, 1.0])
def test_a_coarse_step_fits_the_grid_solution(lam):
    """Each step's objective against a copy of the model solved by hand: at a coarse draw
    (1 - lam) CE + lam KL(grid || coarse), the grid solve's averages at N_t = n; at the finest
    draw the plain CE, no distillation term."""
    model, tr = _trainer(lam)
    data = tiny_data()
    seen = set()
    for k in range(8):
        idx = torch.arange(16 * (k % 2), 16 * (k % 2) + 16)
        ref = copy.deepcopy(model)
        row = tr.train_step(data, idx)
        n = row["n_steps"]
        seen.add(n)
        x, y = data[idx]
        with torch.no_grad():
            fine = ref(x, n_steps=4)
            with coarse_controls(ref, n):
                out = ref(x, n_steps=n)
        ce = float(F.cross_entropy(out, y))
        assert row["data"] == pytest.approx(ce, rel=1e-5)
        if n < 4:
            kl = float(_kl(fine, out))
            assert row["distill"] == pytest.approx(kl, rel=1e-4, abs=1e-7)
            assert row["loss"] == pytest.approx((1 - lam) * ce + lam * kl, rel=1e-5)
        else:
            assert "distill" not in row
            assert row["loss"] == pytest.approx(ce, rel=1e-5)
    assert seen >= {4} and seen & {1, 2}


def test_full_distillation_does_not_read_the_labels_of_a_coarse_step():
    """lam = 1: a coarse step's update is the same with the labels permuted; lam = 0.5: not."""
    data = tiny_data()
    idx = torch.arange(16)
    flipped = type(data)(data.inputs, (data.targets + 1) % 3, name="tiny")
    for lam, same in ((1.0, True), (0.5, False)):
        results = []
        for d in (data, flipped):
            model, tr = _trainer(lam, optimizer="sgd", momentum=0.0, warmup_steps=0, schedule="constant")
            while True:  # the same seeded draws in both runs: steps until the first coarse one
                before = copy.deepcopy(model.state_dict())
                row = tr.train_step(d, idx)
                if row["n_steps"] < 4:
                    break
                model.load_state_dict(before)  # (undo the fine step: only the coarse one is compared)
            results.append({k: v.clone() for k, v in model.state_dict().items()})
        eq = all(torch.equal(results[0][k], results[1][k]) for k in results[0])
        assert eq is same


def test_distillation_with_a_split_between_solvers_slices_the_teacher():
    model, tr = _trainer(0.5, solvers=("euler", "heun"), solvers_split=True)
    data = tiny_data()
    rows = [tr.train_step(data, torch.arange(16)) for _ in range(6)]
    assert any("distill" in r and r["distill"] >= 0 for r in rows if r["n_steps"] < 4)


def test_bad_distillation_settings_are_refused_before_training():
    with pytest.raises(ValueError, match=r"TrainConfig.n_steps_distill: expected a number in \[0, 1\]"):
        TrainConfig(n_steps=(1, 2), n_steps_distill=1.5)
    with pytest.raises(ValueError, match="TrainConfig.n_steps_distill: .*two N_t or more"):
        TrainConfig(n_steps_distill=0.5)
    with pytest.raises(ValueError, match="TrainConfig.n_steps_distill: .*two N_t or more"):
        TrainConfig(n_steps=(4,), n_steps_distill=0.5)
    with pytest.raises(ValueError, match="Objective.distill: expected None or one of"):
        Objective("cross_entropy", distill="js")
    model = TinyClassifier(n_steps=4, T=2.0)
    with pytest.raises(ValueError, match="n_steps_distill = 0.5: the objective .* no divergence"):
        Trainer(model, Objective(lambda o, y: F.cross_entropy(o, y)), tiny_config(n_steps=(2, 4), n_steps_distill=0.5))
    with pytest.raises(ValueError, match="distill_weight: expected a number in"):
        Objective("cross_entropy")(torch.nn.Identity(), torch.zeros(2, 3), torch.zeros(2, dtype=torch.long),
                                   teacher=torch.zeros(2, 3), distill_weight=2.0)
    with pytest.raises(ValueError, match="distill_term: expected the fine solution's outputs"):
        Objective("cross_entropy").distill_term(torch.zeros(2, 3), torch.zeros(2, 4))


@pytest.mark.parametrize("task, kind", [("digits", "kl"), ("text", "kl"), ("burgers", "mse")])
def test_every_opsplit_train_task_can_distill(task, kind):
    """``train.n_steps_distill`` of every task reaches a Trainer: each task's objective has a
    divergence (text's loss is a callable on logits: it names the KL)."""
    from opsplit.cli.config import load
    from opsplit.cli.tasks import MODULES

    mod = MODULES[task]
    assert mod.objective(load(mod.SCHEMA, data={"task": task})).distill_kind == kind

