"""The continuity measurement (``opsplit.control.continuity``) on models whose flow is known
in closed form: linear terms u_t = u W (``FFNIntegral``), u(T) = u(0) exp(T W) by
``torch.linalg.matrix_exp``.  The measured errors must fall at the order of the scheme and
of the substep solver actually run, so a table that mislabels its N_t or its solver (a swap
that did not happen, a solve at the wrong N_t) fails here."""

import math

import pytest
import torch

from opsplit import Propagator
from opsplit.control import continuity, solved_with, strang_of
from opsplit.data import TensorData
from opsplit.operators import FFNIntegral
from opsplit.schemes import Hybrid, Lie, Strang
from opsplit.solvers import ExplicitEuler, Heun, Substep

D = torch.float64
E = torch.linalg.matrix_exp


def _mats(k, n=4, seed=0, scale=0.8):
    g = torch.Generator().manual_seed(seed)
    return [scale * torch.randn(n, n, dtype=D, generator=g) / math.sqrt(n) for _ in range(k)]


def _data(W_total, T=1.0, B=3, seed=1):
    g = torch.Generator().manual_seed(seed)
    f = torch.randn(B, 2, W_total.shape[0], dtype=D, generator=g)
    return TensorData(f, f @ E(T * W_total))


def _rates(c, solver, scheme=None):
    """log2 of successive MSE ratios (twice the order) of one column of the table."""
    rows = sorted((r for r in c.rows if r["solver"] == solver and (scheme is None or r["scheme"] == scheme)),
                  key=lambda r: r["n_steps"])
    m = [r["mse"] for r in rows]
    return [math.log2(a / b) / 2 for a, b in zip(m[:-1], m[1:])]


def test_one_linear_term_converges_at_each_solvers_order():
    (W,) = _mats(1)
    model = Propagator(Lie([Substep(FFNIntegral(W), ExplicitEuler())]), 4, t1=1.0)
    data = _data(W)
    c = continuity(model, data, loss="mse", metric="mse", n_steps=[4, 8, 16, 32],
                   solvers=["trained", "heun", "rk4"], levels=[4, 8, 16, 32, 64])
    for solver, p in (("euler", 1), ("heun", 2), ("rk4", 4)):
        rates = _rates(c, solver)
        assert all(abs(r - p) < 0.2 for r in rates[1:]), (solver, rates)
    # the model's own outputs (Euler) converge at order 1 to their finest level
    assert abs(c.order - 1.0) < 0.1
    assert c.reference["n_steps"] == 4 and c.reference["solver"] == "euler"
    # the solver swap was undone
    assert type(model.scheme.substeps[0].solver) is ExplicitEuler


def test_the_table_equals_an_independent_solve():
    """Each row's MSE against the exact flow equals the MSE of a hand-written solve at that
    N_t with that solver (a row at the wrong N_t or with the wrong solver would differ)."""
    (W,) = _mats(1, seed=3)
    model = Propagator(Lie([Substep(FFNIntegral(W), ExplicitEuler())]), 2, t1=1.0)
    data = _data(W, seed=4)
    c = continuity(model, data, loss="mse", metric="mse", n_steps=[2, 4, 8], solvers=["trained", "rk4"], levels=[])
    f, exact = data.inputs, data.targets

    def euler(n):
        u = f
        for _ in range(n):
            u = u + (1 / n) * (u @ W)
        return u

    def rk4(n):
        h, u = 1 / n, f
        for _ in range(n):
            k1 = u @ W
            k2 = (u + h / 2 * k1) @ W
            k3 = (u + h / 2 * k2) @ W
            k4 = (u + h * k3) @ W
            u = u + h / 6 * (k1 + 2 * k2 + 2 * k3 + k4)
        return u

    for r in c.rows:
        want = {"euler": euler, "rk4": rk4}[r["solver"]](r["n_steps"])
        assert r["mse"] == pytest.approx(float((want - exact).square().mean()), rel=1e-9)
    assert {(r["solver"], r["n_steps"]) for r in c.rows} == {("euler", 2), ("euler", 4), ("euler", 8),
                                                               ("rk4", 2), ("rk4", 4), ("rk4", 8)}
    assert c.fit is None and c.errors == []


def test_two_terms_lie_first_order_strang_heun_second_order():
    W1, W2 = _mats(2, seed=5)
    data = _data(W1 + W2)
    lie = Propagator(Lie([Substep(FFNIntegral(W1), ExplicitEuler()), Substep(FFNIntegral(W2), ExplicitEuler())]),
                     4, t1=1.0)
    c = continuity(lie, data, loss="mse", metric="mse", n_steps=[4, 8, 16, 32], solvers=["trained", "heun"],
                   schemes=["trained", "strang"])
    assert abs(c.order - 1.0) < 0.1
    # Lie with Heun substeps is still first order (splitting error); Strang with Heun second
    assert all(abs(r - 1) < 0.2 for r in _rates(c, "heun", "lie")[1:])
    assert all(abs(r - 2) < 0.2 for r in _rates(c, "heun", "strang")[1:])
    assert type(lie.scheme) is Lie
    strang = Propagator(Strang([Substep(FFNIntegral(W1), Heun()), Substep(FFNIntegral(W2), Heun())]), 4, t1=1.0)
    c2 = continuity(strang, data, loss="mse", metric="mse", n_steps=[4, 8], solvers=["trained"])
    assert abs(c2.order - 2.0) < 0.15
    assert c2.reference["solver"] == "heun" and c2.reference["scheme"] == "strang"


def _rk4(u, A, h):
    k1 = u @ A
    k2 = (u + h / 2 * k1) @ A
    k3 = (u + h / 2 * k2) @ A
    k4 = (u + h * k3) @ A
    return u + h / 6 * (k1 + 2 * k2 + 2 * k3 + k4)


def test_solver_swap_of_a_hybrid_scheme_advances_each_group_unsplit():
    """RK4 in place of Euler: each parallel group's terms advanced together by RK4 (their sum),
    the groups in sequence; Euler in place of Heun: the group's scaled copies follow (the
    parallel group with Euler substeps is Euler on the sum); Strang of the hybrid scheme:
    half a step of the group, a step of the rest, half again."""
    W1, W2, W3 = _mats(3, seed=7)
    f = _data(W1 + W2 + W3).inputs

    def hybrid(solver):
        return Propagator(Hybrid([[Substep(FFNIntegral(W1), solver), Substep(FFNIntegral(W2), solver)],
                                  [Substep(FFNIntegral(W3), solver)]], batch=False), 3, t1=1.0)

    model = hybrid(ExplicitEuler())
    before = model(f)
    h = 1.0 / 5
    want = f
    for _ in range(5):
        want = _rk4(_rk4(want, W1 + W2, h), W3, h)
    with torch.no_grad(), solved_with(model, solver="rk4"):
        torch.testing.assert_close(model(f, n_steps=5), want, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(model(f), before, rtol=0, atol=0)  # restored
    assert type(model.scheme) is Hybrid
    heun = hybrid(Heun())
    with torch.no_grad(), solved_with(heun, solver="euler"):
        torch.testing.assert_close(heun(f, n_steps=4), hybrid(ExplicitEuler())(f, n_steps=4), rtol=0, atol=0)
    assert all(type(s.solver) is Heun for s in heun.scheme.substeps)
    h = 1.0 / 3
    u = f
    for _ in range(3):
        u = u + (h / 2) * (u @ (W1 + W2))  # the parallel group with Euler substeps (eq. 59)
        u = u + h * (u @ W3)
        u = u + (h / 2) * (u @ (W1 + W2))
    with torch.no_grad(), solved_with(model, scheme="strang"):
        torch.testing.assert_close(model(f), u, rtol=1e-12, atol=1e-12)
    assert type(model.scheme) is Hybrid
    assert isinstance(strang_of(model.scheme), Strang)


def test_accuracy_table_of_a_classifier_and_its_plot(tmp_path):
    W1, W2 = _mats(2, n=4, seed=9)

    class Classifier(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.p = Propagator(Lie([Substep(FFNIntegral(W1), ExplicitEuler()),
                                     Substep(FFNIntegral(W2), ExplicitEuler())]), 2, t1=1.0)

        def forward(self, x, n_steps=None):
            return self.p(x, n_steps=n_steps).sum(1)  # (B, 4) logits

    model = Classifier()
    x = torch.randn(40, 2, 4, dtype=D, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        y = model(x, n_steps=64).argmax(-1)
    c = continuity(model, (x, y))
    assert c.metric == "accuracy" and c.reference["n_steps"] == 2
    ns = sorted({r["n_steps"] for r in c.rows})
    assert ns == [1, 2, 4, 8, 16, 32]
    # the finer the solve, the closer to the labels made at N_t = 64
    fine = [r for r in c.rows if r["solver"] == "euler" and r["n_steps"] == 32][0]
    assert fine["accuracy"] >= c.reference["accuracy"]
    assert len(c.errors) == 4 and c.errors == sorted(c.errors, reverse=True)
    rk4 = [r for r in c.rows if r["solver"] == "rk4"]
    assert {r["n_steps"] for r in rk4} == {2, 4, 8, 16, 32} and rk4[0]["cost"] == 4.0
    assert "(trained)" in c.markdown()
    fig = c.plot(tmp_path / "c.png")
    assert (tmp_path / "c.png").is_file()
    import matplotlib.pyplot as plt

    plt.close(fig)


# -- the continuity table of a language model ------------------------------------------------------
_TEXT = [
    "The solver-swap test solves the same controls at other step counts and with other solvers. ",
    "A model of its controls keeps its loss when the time grid is refined; a model of its grid does not. ",
    "Operator splitting advances the attention term and the feed-forward term one after the other. ",
    "Strang splitting takes half a step of one term, a full step of the other, and half a step again. ",
    "Characters are tokens here: the vocabulary is the set of characters of the training documents. ",
]


def _text_lm():
    """A small character-level GPT as ``opsplit train --task text`` builds it (float64, its
    weights spread so the logits are far from uniform) and windows of validation text."""
    from opsplit.cli.tasks import text as tt
    from opsplit.data import char_corpus, text_windows

    corpus = char_corpus({f"d{i}": t * 2 for i, t in enumerate(_TEXT)}, val_fraction=0.4, seed=0)
    m = {"d_model": 16, "heads": 2, "layers": 2, "context": 12, "attention": "softmax", "scheme": "lie", "seed": 0}
    model = tt.build_model(m, corpus.vocab.size).double()
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.3 * torch.randn(p.shape, generator=g, dtype=D))
    val = text_windows(corpus.val, m["context"], name="validation")
    assert len(val) >= 5
    val = TensorData(val.inputs[:5], val.targets[:5])
    return tt, model, corpus.val, val, m["context"]


def test_language_model_bits_per_char_equal_the_trainers_evaluation_and_a_direct_computation():
    """The table of a DecoderLM on windows of text (``loss="cross_entropy", output="logits"``):
    every row's bits per character equals the trainer's evaluation of the text objective
    (``Trainer.evaluate`` with ``opsplit.cli.tasks.text``'s objective, at that N_t and solver)
    and a direct computation: F.cross_entropy of the logits of each window of context + 1
    characters, the first context characters in, the last context characters the targets."""
    import torch.nn.functional as F

    from opsplit.control import TrainConfig, Trainer
    from opsplit.data import bits_per_char

    tt, model, ids, val, C = _text_lm()
    trainer = Trainer(model, tt.objective({"objective": {"kinetic": 0.0, "acceleration": 0.0}}),
                      TrainConfig(eval_batch_size=2, progress=False))
    c = continuity(model, val, loss="cross_entropy", output="logits", metric="bits_per_char", n_steps=[2, 4],
                   solvers=["trained", "heun"], levels=[], batch_size=2)
    assert c.metric == "bits_per_char" and not c.higher_is_better
    assert {(r["solver"], r["n_steps"]) for r in c.rows} == {("euler", 2), ("euler", 4), ("heun", 2), ("heun", 4)}
    windows = torch.stack([ids[k * C: k * C + C + 1] for k in range(len(val))])  # (5, C + 1)
    for r in c.rows:
        n = r["n_steps"]
        with solved_with(model, solver=None if r["solver"] == "euler" else r["solver"]):
            want = bits_per_char(trainer.evaluate(val, n_steps=n)["loss"])
            with torch.no_grad():
                logits = model(windows[:, :-1], n_steps=n).logits
        direct = float(F.cross_entropy(logits.reshape(-1, logits.shape[-1]), windows[:, 1:].reshape(-1)))
        assert r["bits_per_char"] == pytest.approx(want, rel=1e-12), r
        assert r["bits_per_char"] == pytest.approx(direct / math.log(2.0), rel=1e-12), r
        assert r["loss"] == pytest.approx(direct, rel=1e-12), r
    # the rows differ (another N_t, another solver is another solve)
    assert len({round(r["bits_per_char"], 12) for r in c.rows}) == 4


def test_language_model_default_metric_is_the_per_position_accuracy():
    """The call of the finding: ``continuity(DecoderLM, (inputs, targets), loss="cross_entropy",
    output="logits")`` with sequence logits (B, N, V) and targets (B, N): the accuracy over every
    position, against the argmax of the logits counted by hand."""
    _, model, _, val, _ = _text_lm()
    c = continuity(model, (val.inputs, val.targets), loss="cross_entropy", output="logits", n_steps=[2, 4],
                   solvers=["trained"], levels=[2, 4, 8])
    assert c.metric == "accuracy"
    for r in c.rows:
        with torch.no_grad():
            pred = model(val.inputs, n_steps=r["n_steps"]).logits.argmax(-1)
        assert r["accuracy"] == pytest.approx(float((pred == val.targets).double().mean()), rel=1e-12)
    assert len(c.errors) == 2 and len(c.differences) == 2
