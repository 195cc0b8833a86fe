"""The objective's named losses against independent computations: ``"relative_l2"`` (FNO's
LpLoss, :func:`opsplit.analysis.relative_l2`) against a per-sample loop, and
``"cross_entropy"`` on a language model's sequence logits (B, N, V) against torch's
cross-entropy of the flattened logits (the mean over all positions), in ``check``,
``data_term`` and the trainer's evaluation."""

import math

import pytest
import torch
import torch.nn.functional as F

from opsplit.analysis import relative_l2
from opsplit.control import Objective, TrainConfig, Trainer
from opsplit.data import TensorData
from opsplit.models import DecoderConfig, DecoderLM

D = torch.float64


def _naive_relative_l2(out, y):
    errs = []
    for i in range(out.shape[0]):
        num = math.sqrt(sum(float(v) ** 2 for v in (out[i] - y[i]).flatten()))
        den = math.sqrt(sum(float(v) ** 2 for v in y[i].flatten()))
        errs.append(num / den)
    return errs


def test_relative_l2_is_the_mean_of_the_per_sample_errors():
    g = torch.Generator().manual_seed(0)
    out, y = torch.randn(5, 3, 4, generator=g, dtype=D), torch.randn(5, 3, 4, generator=g, dtype=D)
    want = _naive_relative_l2(out, y)
    assert relative_l2(out, y, reduction="none").tolist() == pytest.approx(want, rel=1e-13)
    assert float(relative_l2(out, y)) == pytest.approx(sum(want) / 5, rel=1e-13)
    assert float(relative_l2(out[:, 0, 0], y[:, 0, 0])) == pytest.approx(
        float((out[:, 0, 0] - y[:, 0, 0]).abs().div(y[:, 0, 0].abs()).mean()), rel=1e-13)  # one value per sample
    o = Objective("relative_l2")
    o.check(out, y)
    assert float(o.data_term(out, y)) == pytest.approx(sum(want) / 5, rel=1e-13)
    # the gradient through the objective is the gradient of the mean
    p = out.clone().requires_grad_(True)
    o.data_term(p, y).backward()
    q = out.clone().requires_grad_(True)
    sum(((q[i] - y[i]).square().sum().sqrt() / y[i].square().sum().sqrt()) for i in range(5)).div(5).backward()
    torch.testing.assert_close(p.grad, q.grad, rtol=1e-12, atol=0)


@pytest.mark.parametrize("call, exc, match", [
    (lambda: relative_l2(torch.ones(2, 3), torch.ones(2, 4)), ValueError, r"relative_l2: outputs shape \(2, 3\) and"),
    (lambda: relative_l2(torch.ones(2, 3), torch.zeros(2, 3)), ValueError, r"relative_l2\.targets: sample 0 is all zeros"),
    (lambda: relative_l2(torch.ones(2, 3), torch.ones(2, 3), reduction="sum"), ValueError, r"relative_l2\.reduction"),
    (lambda: relative_l2([1.0], torch.ones(1)), TypeError, r"relative_l2\.outputs: expected a torch\.Tensor"),
    (lambda: relative_l2(torch.ones(2, 3, dtype=torch.long), torch.ones(2, 3, dtype=torch.long)), TypeError,
     r"relative_l2: expected floating-point"),
    (lambda: Objective("relative_l2").check(torch.ones(2, 3), torch.ones(3, 2)), ValueError,
     r"loss 'relative_l2': model output shape \(2, 3\) and targets shape \(3, 2\) differ"),
])
def test_relative_l2_refuses(call, exc, match):
    with pytest.raises(exc, match=match):
        call()


def _lm():
    cfg = DecoderConfig(vocab_size=11, d_model=8, n_layers=2, n_heads=2, d_ff=16, norm="layer", mlp="plain",
                        activation="gelu", positions="learned", max_positions=8, tie_embeddings=True)
    return DecoderLM(cfg, generator=torch.Generator().manual_seed(0), dtype=D)


def _windows(n=6, N=7, seed=1):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, 11, (n, N + 1), generator=g)
    return ids[:, :-1], ids[:, 1:]


def test_cross_entropy_of_sequence_logits_is_the_mean_over_all_positions():
    model = _lm().eval()
    x, y = _windows()
    o = Objective("cross_entropy", output="logits")
    with torch.no_grad():
        logits = o.select(model(x))
    assert logits.shape == (6, 7, 11)
    o.check(logits, y)
    want = F.cross_entropy(logits.reshape(-1, 11), y.reshape(-1))
    # the same mean written out position by position
    by_hand = -sum(float(torch.log_softmax(logits[b, i], -1)[y[b, i]]) for b in range(6) for i in range(7)) / 42
    assert float(o.data_term(logits, y)) == pytest.approx(float(want), rel=1e-13)
    assert float(o.data_term(logits, y)) == pytest.approx(by_hand, rel=1e-12)
    with torch.no_grad():
        assert float(o(model, x, y).data) == pytest.approx(float(want), rel=1e-13)
    # (B, C) logits are unchanged: torch's cross-entropy of the batch
    assert float(o.data_term(logits[:, 0], y[:, 0])) == float(F.cross_entropy(logits[:, 0], y[:, 0]))
    with pytest.raises(ValueError, match=r"loss 'cross_entropy': expected targets \(6, 7\) of token ids"):
        o.check(logits, y[:, :-1])
    with pytest.raises(ValueError, match=r"loss 'cross_entropy': targets must be class indices in \[0, 10\]"):
        o.check(logits, y + 11)


def test_trainer_on_a_language_model_trains_and_evaluates_per_position():
    model = _lm()
    x, y = _windows(8)
    o = Objective("cross_entropy", output="logits")
    tr = Trainer(model, o, TrainConfig(epochs=1, batch_size=4, lr=1e-2, progress=False))
    tr.fit(TensorData(x, y))
    assert tr.step == 2
    m = tr.evaluate(TensorData(x, y), batch_size=3)
    model.eval()
    with torch.no_grad():
        logits = model(x).logits
    assert m["loss"] == pytest.approx(float(F.cross_entropy(logits.reshape(-1, 11), y.reshape(-1))), rel=1e-12)
    assert m["accuracy"] == pytest.approx(float((logits.argmax(-1) == y).double().mean()), rel=1e-13)
    assert 0.0 <= m["accuracy"] <= 1.0
