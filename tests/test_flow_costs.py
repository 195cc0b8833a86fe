"""Training tools for continuous-time models: the flow running costs
(``opsplit.control.flow_costs``: relative kinetic energy and acceleration read off the
forward solve's steps) and the cost-weighted N_t draws (``opsplit.control.resolution``)."""

import math

import pytest
import torch

from opsplit import Propagator
from opsplit.control import Objective, TrainConfig, Trainer
from opsplit.control.flow_costs import record_flow
from opsplit.control.resolution import draw_n_steps, expected_n_steps, n_steps_probabilities
from opsplit.operators import FFNIntegral
from opsplit.schemes import Lie
from opsplit.solvers import ExplicitEuler, Substep

D = torch.float64


def _linear(W, n=4, T=1.0):
    return Propagator(Lie([Substep(FFNIntegral(W), ExplicitEuler())]), n, t1=T)


def _rel(v, u):
    """Mean over tokens of |v|^2 / (|u - mean(u)|^2 + 1e-5 N_y): the relative norm, by hand."""
    c = u - u.mean(-1, keepdim=True)
    return float((v.square().sum(-1) / (c.square().sum(-1) + 1e-5 * u.shape[-1])).mean())


def test_kinetic_and_acceleration_equal_the_sums_over_the_euler_steps():
    g = torch.Generator().manual_seed(0)
    W = torch.randn(5, 5, dtype=D, generator=g) / 3
    f = torch.randn(2, 3, 5, dtype=D, generator=g)
    p = _linear(W, n=4, T=2.0)
    with record_flow(p) as rec:
        p(f)
    dt, us = 0.5, [f]
    for _ in range(4):
        us.append(us[-1] + dt * (us[-1] @ W))
    kin = sum(dt * _rel((b - a) / dt, a) for a, b in zip(us[:-1], us[1:]))
    acc = sum(dt * _rel(((us[n + 1] - us[n]) / dt - (us[n] - us[n - 1]) / dt) / dt, us[n]) for n in range(1, 4))
    assert float(rec.kinetic()) == pytest.approx(kin, rel=1e-12)
    assert float(rec.acceleration()) == pytest.approx(acc, rel=1e-12)
    with record_flow(p, relative=False) as rec:
        p(f)
    assert float(rec.kinetic()) == pytest.approx(
        sum(dt * float(((b - a) / dt).square().sum(-1).mean()) for a, b in zip(us[:-1], us[1:])), rel=1e-12)
    assert not p._step_hooks  # removed after the block


def test_kinetic_energy_converges_to_the_integral_of_the_exact_flow():
    """Sum_n dt |delta/dt|_r^2 -> int_0^T |u_t|_r^2 dt, the integral of the exact flow
    u(t) = f exp(tW) by the trapezoidal rule on a fine grid: the costs are comparable across N_t."""
    g = torch.Generator().manual_seed(1)
    W = torch.randn(4, 4, dtype=D, generator=g) / 2
    f = torch.randn(3, 2, 4, dtype=D, generator=g)
    ts = torch.linspace(0, 1, 4001, dtype=D)
    vals = []
    for t in ts:
        u = f @ torch.linalg.matrix_exp(t * W)
        vals.append(_rel(u @ W, u))
    exact = float(torch.trapezoid(torch.tensor(vals, dtype=D), ts))
    errs = []
    for n in (8, 16, 32, 64):
        p = _linear(W, n=n)
        with record_flow(p) as rec:
            p(f)
        errs.append(abs(float(rec.kinetic()) - exact))
    rates = [math.log2(a / b) for a, b in zip(errs[:-1], errs[1:])]
    assert all(0.8 < r < 1.2 for r in rates), rates
    assert errs[-1] < 0.02 * exact


def test_objective_adds_the_weighted_flow_costs_and_they_are_differentiable():
    g = torch.Generator().manual_seed(2)
    W = torch.randn(3, 3, dtype=D, generator=g) / 3
    f = torch.randn(2, 2, 3, dtype=D, generator=g)
    y = torch.randn(2, 2, 3, dtype=D, generator=g)
    p = _linear(torch.nn.Parameter(W.clone()), n=3)
    plain = Objective("mse")(p, f, y)
    val = Objective("mse", kinetic=0.3, acceleration=0.2)(p, f, y)
    assert float(val.total.detach()) == pytest.approx(float((plain.data + 0.3 * val.kinetic + 0.2 * val.acceleration).detach()))
    assert set(val.as_floats()) == {"loss", "data", "kinetic", "acceleration"}
    Wp = next(p.parameters())

    def fn(w):
        with torch.no_grad():
            Wp.copy_(w)
        return Objective("mse", kinetic=0.3, acceleration=0.2)(p, f, y).total

    val.total.backward()
    grad = Wp.grad.clone()
    eps, i, j = 1e-6, 1, 2
    e = torch.zeros_like(W)
    e[i, j] = eps
    fd = (float(fn(W + e)) - float(fn(W - e))) / (2 * eps)
    assert float(grad[i, j]) == pytest.approx(fd, rel=1e-6)


def test_flow_costs_refuse_the_checkpointed_loop_before_training(tmp_path):
    from opsplit.models import ImageClassifier, SplitEncoder

    enc = SplitEncoder(8, 2, 8, n_steps=2, generator=torch.Generator().manual_seed(0))
    model = ImageClassifier(4, 2, 1, 3, enc)
    x = torch.randn(8, 1, 4, 4)
    y = torch.arange(8) % 3
    tr = Trainer(model, Objective("cross_entropy", kinetic=0.1), TrainConfig(epochs=1, gradient="checkpoint",
                                                                             progress=False))
    with pytest.raises(ValueError, match="Objective.kinetic: .*checkpointed time loop"):
        tr.fit((x, y), out_dir=tmp_path / "run")
    assert not (tmp_path / "run").exists()
    assert tr.step == 0


def test_cost_weighted_draws():
    assert n_steps_probabilities((2, 4, 8, 16), "cost") == pytest.approx([8 / 15, 4 / 15, 2 / 15, 1 / 15])
    assert expected_n_steps((2, 4, 8, 16), "cost") == pytest.approx(64 / 15)  # 4.27: about one N_t = 4 step
    assert expected_n_steps((2, 4, 8, 16)) == pytest.approx(7.5)
    assert n_steps_probabilities((2, 4), [1, 3]) == pytest.approx([0.25, 0.75])
    # "uniform" is the config's spelling of None (the cost estimate of opsplit train passes it as written)
    assert n_steps_probabilities((1, 2, 4), "uniform") == pytest.approx([1 / 3] * 3)
    assert expected_n_steps((2, 4, 8, 16), "uniform") == pytest.approx(7.5)
    from opsplit.control.resolution import expected_stages
    assert expected_stages(("euler", "heun"), "uniform") == pytest.approx(1.5)
    g = torch.Generator().manual_seed(0)
    draws = [draw_n_steps((2, 4, 8, 16), "cost", g) for _ in range(3000)]
    freq = [draws.count(n) / len(draws) for n in (2, 4, 8, 16)]
    assert freq == pytest.approx([8 / 15, 4 / 15, 2 / 15, 1 / 15], abs=0.03)
    # uniform draws are the trainer's historical randint (runs without weights repeat bit for bit)
    g1, g2 = torch.Generator().manual_seed(5), torch.Generator().manual_seed(5)
    assert [draw_n_steps((2, 4, 8), None, g1) for _ in range(20)] == \
        [(2, 4, 8)[int(torch.randint(3, (), generator=g2))] for _ in range(20)]


def test_train_solvers_draws_the_solver_of_each_step_and_restores_the_model():
    from opsplit.control.resolution import draw_solver, expected_stages
    from opsplit.models import ImageClassifier, SplitEncoder
    from opsplit.solvers import Heun as _Heun

    assert expected_stages(("euler", "heun"), "cost") == pytest.approx(4 / 3)
    assert expected_stages(("euler", "rk4")) == pytest.approx(2.5)
    g = torch.Generator().manual_seed(0)
    draws = [draw_solver(("euler", "heun"), "cost", g) for _ in range(3000)]
    assert draws.count("heun") / 3000 == pytest.approx(1 / 3, abs=0.03)
    enc = SplitEncoder(8, 2, 8, n_steps=2, generator=torch.Generator().manual_seed(0))
    model = ImageClassifier(4, 2, 1, 3, enc)
    x = torch.randn(16, 1, 4, 4)
    y = torch.arange(16) % 3
    cfg = TrainConfig(epochs=2, batch_size=4, progress=False, n_steps=[1, 2], solvers=["euler", "heun"])
    tr = Trainer(model, Objective("cross_entropy", kinetic=0.1), cfg)
    tr.fit((x, y))
    rows = tr.history.steps
    assert {r.get("solver", "euler") for r in rows} == {"euler", "heun"}  # Euler (the model's own): no swap
    assert all(type(s.solver).__name__ == "ExplicitEuler" for s in enc.scheme.substeps)  # restored
    assert type(enc.scheme).__name__ == "Hybrid"
    # a step drawn with Heun is the step of the model solved with Heun (one group unsplit, as the analysis)
    from opsplit.control import solved_with

    with torch.no_grad(), solved_with(model, solver=_Heun()):
        a = model(x[:2], n_steps=2)
    with torch.no_grad():
        b = model(x[:2], n_steps=2)
    assert not torch.allclose(a, b)
