"""opsplit.data: bundled digits split, generated periodic sequences, rollout, augmentation."""

import math

import numpy as np
import pytest
import torch

from opsplit.data import (
    TensorData,
    input_noise,
    load_digits,
    periodic_series,
    periodic_task,
    random_shift,
    rollout,
)


def test_digits_split_stratified_seeded_disjoint():
    tr, te = load_digits(seed=0)
    assert len(tr) + len(te) == 1797 and tr.inputs.shape[1:] == (1, 8, 8)
    assert tr.targets.dtype == torch.int64
    counts = torch.bincount(te.targets, minlength=10)
    assert int(counts.min()) >= 35 and int(counts.max()) <= 37
    # disjoint and complete, and the indices point at the right images
    tri, tei = tr.info["train_index"], te.info["test_index"]
    assert not set(tri) & set(tei) and sorted(tri + tei) == list(range(1797))
    tr2, te2 = load_digits(seed=0)
    assert torch.equal(te.targets, te2.targets) and torch.equal(tr.inputs, tr2.inputs)
    _, te3 = load_digits(seed=1)
    assert not torch.equal(te.inputs, te3.inputs)
    assert abs(float(tr.inputs.mean())) < 1e-5 and abs(float(tr.inputs.std()) - 1) < 1e-4
    with pytest.raises(ValueError, match="test_fraction"):
        load_digits(test_fraction=1.5)


@pytest.mark.slow
def test_digits_equal_sklearn_loader():
    from sklearn.datasets import load_digits as sk  # slow import: the independent loader

    _, te = load_digits(seed=0)
    tei = te.info["test_index"]
    d = sk()
    assert torch.equal(te.targets, torch.as_tensor(d.target[tei]))
    img = torch.as_tensor(d.images[tei], dtype=torch.float64) / 16
    torch.testing.assert_close(te.inputs[:, 0].double() * te.info["std"] + te.info["mean"], img, atol=1e-5, rtol=0)


def test_periodic_series_against_numpy():
    x = np.arange(300) * 0.1
    np.testing.assert_allclose(periodic_series("sin", 300).numpy(), np.sin(x), rtol=0, atol=1e-15)
    np.testing.assert_allclose(periodic_series("sin_exp", 300).numpy(), np.sin(x) * np.exp(0.01 * x), atol=1e-14)
    sq = periodic_series("square", 300).numpy()
    assert set(np.unique(sq)) <= {-1.0, 0.0, 1.0}
    np.testing.assert_array_equal(sq[1:], np.sign(np.sin(x[1:])))
    with pytest.raises(ValueError, match="name"):
        periodic_series("cos", 10)


def test_periodic_task_layout_and_rollout_of_exact_recurrence():
    task = periodic_task("sin", window=100, horizon=200, n_train=400, n_test=3, dtype=torch.float64)
    x, y = task.train[torch.arange(len(task.train))]
    assert x.shape == (300, 100) and torch.equal(x[:, 1:], y[:, :-1])
    # the training windows never reach the test futures
    assert (len(task.train) - 1) + 100 < task.starts[0] + 100
    # sin satisfies x_{k+1} = 2 cos(h) x_k - x_{k-1}: a predictor using it reproduces the futures
    c = 2 * math.cos(0.1)

    def predict(w):
        nxt = c * w - torch.cat([w[:, :1], w[:, :-1]], 1)
        return nxt

    pred = rollout(predict, task.contexts, 200)
    torch.testing.assert_close(pred, task.futures, rtol=0, atol=1e-10)


def test_random_shift_moves_images_within_bounds():
    g = torch.Generator().manual_seed(0)
    img = torch.zeros(64, 1, 8, 8)
    img[:, :, 3:5, 3:5] = 1.0
    out = random_shift(img, g, max_shift=1, fill=0.0)
    assert out.shape == img.shape and torch.equal(out.sum((1, 2, 3)), img.sum((1, 2, 3)))
    rows = out.sum((1, 3)).argmax(-1)  # first row of the blob moves by -1, 0 or 1
    assert set(rows.tolist()) <= {2, 3, 4} and len(set(rows.tolist())) > 1


def test_input_noise_is_seeded_gaussian_on_inputs_only():
    x = torch.zeros(4000, 50, dtype=torch.float64)
    f = input_noise(0.1)
    a = f(x, torch.Generator().manual_seed(3))
    b = f(x, torch.Generator().manual_seed(3))
    assert torch.equal(a, b) and not torch.equal(a, f(x, torch.Generator().manual_seed(4)))
    assert a.dtype == x.dtype and abs(float(a.std()) - 0.1) < 1e-3 and abs(float(a.mean())) < 1e-3
    assert input_noise(0)(x, None) is x
    for bad in (-0.1, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="input_noise.std"):
            input_noise(bad)
    for bad in ("0.1", True):
        with pytest.raises(TypeError, match="input_noise.std"):
            input_noise(bad)
    with pytest.raises(TypeError, match="floating tensor"):
        f(torch.zeros(3, dtype=torch.int64), None)


def test_trainer_applies_input_noise_to_inputs_not_targets():
    """The trainer hands the batch's inputs to the augmentation and compares the model's
    output with the untouched targets: a model returning its input has loss = noise variance."""
    from opsplit.control import Objective, TrainConfig, Trainer

    class Echo(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.zeros(()))

        def forward(self, x):
            return x + 0 * self.w

    x = torch.zeros(256, 64, dtype=torch.float64)
    tr = Trainer(Echo().double(), Objective("mse"), TrainConfig(epochs=1, batch_size=256, lr=1e-3, progress=False),
                 augment=input_noise(0.5))
    tr.fit((x, x.clone()))
    assert abs(tr.history.steps[0]["loss"] - 0.25) < 0.01


def test_tensor_data_checks():
    with pytest.raises(ValueError, match="samples"):
        TensorData(torch.zeros(3, 2), torch.zeros(4))
    with pytest.raises(ValueError, match="finite"):
        TensorData(torch.tensor([[float("nan")]]), torch.zeros(1))
    with pytest.raises(TypeError, match="Tensor"):
        TensorData([1, 2], torch.zeros(2))
