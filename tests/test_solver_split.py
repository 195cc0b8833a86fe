"""``TrainConfig.solvers_split``: every batch shared between the training solvers, the
objective the mean over the windows, each window solved with its part's solver — checked
against Euler and Heun written out by hand, not against the trainer's own pieces."""

import itertools

import pytest
import torch
from torch import nn

from opsplit import Propagator
from opsplit.control import Objective, TrainConfig, Trainer
from opsplit.control.objective import ObjectiveValue
from opsplit.control.resolution import solver_probabilities, solvers_left_out, split_sizes
from opsplit.operators import FFNIntegral
from opsplit.schemes import Lie
from opsplit.solvers import ExplicitEuler, Substep

D = torch.float64


def test_split_sizes_round_the_shares_and_keep_the_batch():
    assert split_sizes(64, ("euler", "heun"), (3.0, 1.0)) == [48, 16]
    assert split_sizes(64, ("euler", "heun"), "cost") == [43, 21]  # 2/3 and 1/3 of 64: 42.67, 21.33
    assert split_sizes(10, ("euler", "heun", "rk4")) == [4, 3, 3]  # ties to the earlier solver
    assert split_sizes(2, ("euler", "heun"), (3.0, 1.0)) == [2, 0]
    assert solvers_left_out(2, ("euler", "heun"), (3.0, 1.0)) == (["heun"], {"euler": 2, "heun": 0})
    assert solvers_left_out(4, ("euler", "heun"), (3.0, 1.0)) == ([], {"euler": 3, "heun": 1})
    g = torch.Generator().manual_seed(0)
    for batch, k in itertools.product((1, 2, 3, 7, 16, 33, 64, 100), (1, 2, 3)):
        w = tuple(float(x) for x in torch.rand(k, generator=g) + 0.05)
        solvers = ("euler", "heun", "rk4")[:k]
        sizes = split_sizes(batch, solvers, w)
        p = solver_probabilities(solvers, w)
        assert sum(sizes) == batch
        assert all(abs(m - q * batch) < 1 for m, q in zip(sizes, p))


class Linear(nn.Module):
    """u_t = u W on [0, T], N_t explicit-Euler steps (its own solver)."""

    def __init__(self, W, n=3, T=1.5):
        super().__init__()
        self.prop = Propagator(Lie([Substep(FFNIntegral(nn.Parameter(W.clone())), ExplicitEuler())]), n, t1=T)

    def forward(self, u):
        return self.prop(u)


def _problem(seed, dtype=D, n=8):
    """W0 (4, 4) and n windows x, y (n, 2, 4), drawn in that order from one seeded generator."""
    g = torch.Generator().manual_seed(seed)
    W0 = torch.randn(4, 4, dtype=dtype, generator=g) / 2
    x = torch.randn(n, 2, 4, dtype=dtype, generator=g)
    y = torch.randn(n, 2, 4, dtype=dtype, generator=g)
    return W0, x, y


def _split_config(lr, **kw):
    """One epoch of plain SGD on batches of 8 in order, Euler and Heun drawn 3 : 1 and split."""
    return TrainConfig(epochs=1, batch_size=8, optimizer="sgd", momentum=0.0, lr=lr, shuffle=False, progress=False,
                       solvers=["euler", "heun"], solvers_weights=[3, 1], solvers_split=True, **kw)


def _rel(v, u):
    c = u - u.mean(-1, keepdim=True)
    return (v.square().sum(-1) / (c.square().sum(-1) + 1e-5 * u.shape[-1])).mean()


def _by_hand(W, x, y, m_euler, n=3, T=1.5, kinetic=0.0, weights=None):
    """The objective of the split written out: windows [0, m) by explicit Euler, the rest by
    Heun (k1 = uW, k2 = (u + dt k1)W, u + dt/2 (k1 + k2)), each part's mean squared error and
    relative kinetic energy, weighted by the part's windows (or by ``weights``: Euler's,
    Heun's)."""
    dt = T / n
    total = 0.0
    for part, heun in ((slice(0, m_euler), False), (slice(m_euler, len(x)), True)):
        u, kin = x[part], 0.0
        if not len(u):
            continue
        for _ in range(n):
            k1 = u @ W
            new = u + dt * (0.5 * (k1 + (u + dt * k1) @ W) if heun else k1)
            kin = kin + dt * _rel((new - u) / dt, u)
            u = new
        share = u.shape[0] / len(x) if weights is None else weights[heun]
        total = total + share * ((u - y[part]).square().mean() + kinetic * kin)
    return total


@pytest.mark.parametrize("kinetic", [0.0, 0.3])
def test_a_split_step_is_the_gradient_step_of_the_mean_over_windows_solved_by_their_parts_solvers(kinetic):
    W0, x, y = _problem(0)
    model = Linear(W0)
    cfg = _split_config(lr=0.1)
    tr = Trainer(model, Objective("mse", kinetic=kinetic), cfg)
    tr.fit((x, y))
    # by hand: 6 windows by Euler, 2 by Heun; one SGD step on W
    W = W0.clone().requires_grad_(True)
    J = _by_hand(W, x, y, 6, kinetic=kinetic)
    (grad,) = torch.autograd.grad(J, W)
    assert tr.history.steps[0]["loss"] == pytest.approx(float(J.detach()), rel=1e-12)
    new = [p for p in model.parameters()]
    assert len(new) == 1
    torch.testing.assert_close(new[0].detach(), W0 - 0.1 * grad, rtol=1e-12, atol=1e-14)
    # the draw's objective with Heun never drawn differs (the split is not Euler alone)
    assert float(_by_hand(W0, x, y, 8, kinetic=kinetic)) != pytest.approx(float(J.detach()), rel=1e-6)
    # the model is left with its own solver
    assert type(model.prop.scheme.substeps[0].solver).__name__ == "ExplicitEuler"
    assert "solver" not in tr.history.steps[0]


def test_split_weights_set_each_parts_share_of_the_objective_not_its_windows():
    W0, x, y = _problem(2)
    model = Linear(W0)
    cfg = _split_config(lr=0.1, solvers_split_weights=[1.4, 0.6])  # 0.7 and 0.3 of the objective, 6 and 2 windows
    assert cfg.to_dict()["solvers_split_weights"] == [1.4, 0.6]
    tr = Trainer(model, Objective("mse", kinetic=0.2), cfg)
    tr.fit((x, y))
    W = W0.clone().requires_grad_(True)
    J = _by_hand(W, x, y, 6, kinetic=0.2, weights=(0.7, 0.3))
    (grad,) = torch.autograd.grad(J, W)
    assert tr.history.steps[0]["loss"] == pytest.approx(float(J.detach()), rel=1e-12)
    torch.testing.assert_close(next(model.parameters()).detach(), W0 - 0.1 * grad, rtol=1e-12, atol=1e-14)
    # not the shares' objective
    assert float(_by_hand(W0, x, y, 6, kinetic=0.2)) != pytest.approx(float(J.detach()), rel=1e-6)


def test_a_short_last_batch_is_split_too_and_float32_trains():
    W0, x, y = _problem(1, dtype=torch.float32, n=10)
    model = Linear(W0)
    cfg = _split_config(lr=1e-30)
    tr = Trainer(model, Objective("mse", kinetic=0.1), cfg)
    tr.fit((x, y))  # batches of 8 (6 by Euler + 2 by Heun) and 2 (2 + 0: Euler only); W does not move
    assert [r["loss"] for r in tr.history.steps] == pytest.approx(
        [float(_by_hand(W0, x[:8], y[:8], 6, kinetic=0.1)), float(_by_hand(W0, x[8:], y[8:], 2, kinetic=0.1))],
        rel=1e-5)


def test_mixture_weights_each_term_and_concatenates_the_outputs():
    a = ObjectiveValue(torch.tensor(1.0), torch.tensor(0.5), None, None, torch.zeros(2, 3), kinetic=torch.tensor(2.0))
    b = ObjectiveValue(torch.tensor(3.0), torch.tensor(1.5), None, None, torch.ones(1, 3), kinetic=torch.tensor(4.0))
    m = ObjectiveValue.mixture([a, b], [0.75, 0.25])
    assert float(m.total) == pytest.approx(1.5) and float(m.data) == pytest.approx(0.75)
    assert float(m.kinetic) == pytest.approx(2.5) and m.smoothness is None and m.acceleration is None
    assert m.outputs.shape == (3, 3) and float(m.outputs.sum()) == 3.0
    with pytest.raises(ValueError, match="ObjectiveValue.mixture: expected one weight per value"):
        ObjectiveValue.mixture([a, b], [1.0])
