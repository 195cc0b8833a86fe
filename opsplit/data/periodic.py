r"""The periodic sequences of seed 001 (Anand & Chung, §5, eqs. 20–22, Table 1), generated.

Three functions of period :math:`2\pi`: :math:`\sin x`, :math:`\sin x\,e^{0.01x}` and the
square wave :math:`\operatorname{sign}(\sin x)` (:math:`\pm 1`; 0 exactly at the zeros),
sampled at :math:`x_k = k\,\Delta x` with :math:`\Delta x = 0.1` (about 63 samples per
period; seed 001 reports attention hot spots about 60 steps apart).

**Task** (seed 001: "train on short sequence fragments of length :math:`T_{src} = 100`,
predict 200 future timesteps"): the training set holds every fragment
:math:`(x_k, \dots, x_{k+99})` with target :math:`(x_{k+1}, \dots, x_{k+100})` (next value
at every position) that lies in the first ``n_train`` samples; the test set holds
``n_test`` contexts of 100 samples starting after the training range, each followed by the
200 true future values — never seen in training.  The model predicts them
autoregressively (:func:`rollout`), and the test MSE is the mean squared error over the
200 predicted values and the test contexts (seed 001's Table 1 metric).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from .._checks import check_dtype_arg, check_generator, check_positive_float
from .base import TensorData, check_int

__all__ = ["FUNCTIONS", "TABLE1_MSE", "periodic_series", "PeriodicTask", "periodic_task", "rollout", "input_noise"]


def _square(x: Tensor) -> Tensor:
    return torch.sign(torch.sin(x))


#: eqs. (20)–(22) of seed 001
FUNCTIONS = {
    "sin": torch.sin,
    "sin_exp": lambda x: torch.sin(x) * torch.exp(0.01 * x),
    "square": _square,
}
#: seed 001, Table 1: test MSE over 200 predicted steps
TABLE1_MSE = {"sin": 0.0050, "sin_exp": 0.0085, "square": 0.0243}


def periodic_series(name: str, n: int, *, dx: float = 0.1, dtype=torch.float64) -> Tensor:
    """``(n,)`` samples of function ``name`` at :math:`x_k = k\\,dx`."""
    _check_name(name, "periodic_series.name")
    n = check_int(n, "periodic_series.n", 1)
    dx = check_positive_float(dx, "periodic_series.dx")
    dtype = check_dtype_arg(dtype, "periodic_series.dtype") or torch.float64
    x = torch.arange(n, dtype=torch.float64) * dx
    return FUNCTIONS[name](x).to(dtype)


def _check_name(name, what: str) -> None:
    if not isinstance(name, str) or name not in FUNCTIONS:
        raise ValueError(f"{what}: expected one of {sorted(FUNCTIONS)}, got {name!r}")


@dataclass
class PeriodicTask:
    """``train``: windows ``(N, window)`` → next values ``(N, window)``; ``contexts``
    ``(n_test, window)`` and ``futures`` ``(n_test, horizon)``; ``series`` the whole signal;
    ``starts`` the index of each context's first sample."""

    name: str
    train: TensorData
    contexts: Tensor
    futures: Tensor
    series: Tensor
    starts: list
    window: int
    horizon: int
    dx: float


def periodic_task(name: str, *, window: int = 100, horizon: int = 200, n_train: int = 1000,
                  n_test: int = 8, test_gap: int = 37, dx: float = 0.1, dtype=torch.float32) -> PeriodicTask:
    """The train/test task of the module docstring.  Test contexts start at
    ``n_train + j * test_gap`` (``j < n_test``: phases spread over several periods)."""
    _check_name(name, "periodic_task.name")
    for v, nm in ((window, "window"), (horizon, "horizon"), (n_train, "n_train"), (n_test, "n_test"),
                  (test_gap, "test_gap")):
        check_int(v, f"periodic_task.{nm}", 1)
    dx = check_positive_float(dx, "periodic_task.dx")
    dtype = check_dtype_arg(dtype, "periodic_task.dtype") or torch.float32
    if n_train < window + 1:
        raise ValueError(f"periodic_task.n_train: expected >= window + 1 = {window + 1}, got {n_train}")
    total = n_train + (n_test - 1) * test_gap + window + horizon
    s = periodic_series(name, total, dx=dx, dtype=torch.float64)
    k = torch.arange(n_train - window)
    idx = k[:, None] + torch.arange(window)[None, :]
    train = TensorData(s[idx].to(dtype), s[idx + 1].to(dtype), name=f"{name}_train",
                       info={"function": name, "dx": dx, "window": window, "n_train_samples": n_train})
    starts = [n_train + j * test_gap for j in range(n_test)]
    ctx = torch.stack([s[a:a + window] for a in starts]).to(dtype)
    fut = torch.stack([s[a + window:a + window + horizon] for a in starts]).to(dtype)
    return PeriodicTask(name, train, ctx, fut, s.to(dtype), starts, window, horizon, dx)


@torch.no_grad()
def rollout(predict, context: Tensor, horizon: int) -> Tensor:
    """Autoregressive prediction: ``predict`` maps windows ``(B, L)`` to next-value
    predictions ``(B, L)`` (position ``k`` predicts sample ``k + 1``); its last value is
    appended and the window slides, ``horizon`` times.  Returns ``(B, horizon)``."""
    if not callable(predict):
        raise TypeError(f"rollout.predict: expected a callable mapping windows (B, L) to predictions (B, L), got "
                        f"{type(predict).__name__}")
    if not isinstance(context, Tensor):
        raise TypeError(f"rollout.context: expected a torch.Tensor (B, L), got {type(context).__name__}")
    if context.dim() != 2:
        raise ValueError(f"rollout.context: expected (B, L), got shape {tuple(context.shape)}")
    horizon = check_int(horizon, "rollout.horizon", 1)
    w = context
    out = []
    for k in range(horizon):
        pred = predict(w)
        if k == 0 and (not isinstance(pred, Tensor) or tuple(pred.shape) != tuple(w.shape)):
            raise ValueError(f"rollout.predict: expected next-value predictions (B, L) = {tuple(w.shape)}, got "
                             f"{tuple(pred.shape) if isinstance(pred, Tensor) else type(pred).__name__}")
        nxt = pred[:, -1:]
        out.append(nxt)
        w = torch.cat([w[:, 1:], nxt], dim=1)
    return torch.cat(out, dim=1)


def input_noise(std: float):
    r"""A training augmentation for autoregressive forecasters: ``fn(inputs, generator)``
    adding independent Gaussian noise of standard deviation ``std`` to every input value
    (the targets stay the true next values).

    In a rollout (:func:`rollout`) the model reads its own predictions, which are never
    exactly the true values; trained on exact windows only, it has never seen a window
    with small errors and may amplify them step after step.  Trained on noisy windows with
    exact targets, it learns to map a perturbed window back onto the signal (the standard
    noise-injection remedy for exposure bias).  Pass it as
    ``Trainer(..., augment=input_noise(0.1))``; the noise is drawn from the trainer's
    seeded generator, so runs and resumed runs are reproducible.
    """
    if isinstance(std, bool) or not isinstance(std, (int, float)):
        raise TypeError(f"input_noise.std: expected a number (a standard deviation >= 0), got {std!r}")
    if not math.isfinite(std) or std < 0:
        raise ValueError(f"input_noise.std: expected a finite number >= 0, got {std!r}")
    std = float(std)

    def add_noise(inputs: Tensor, generator: torch.Generator | None = None) -> Tensor:
        if not isinstance(inputs, Tensor) or not inputs.is_floating_point():
            raise TypeError(f"input_noise: expected a floating tensor of inputs, got {type(inputs).__name__}")
        check_generator(generator, "input_noise.generator")
        if std == 0:
            return inputs
        noise = torch.randn(inputs.shape, generator=generator, dtype=inputs.dtype, device="cpu")
        return inputs + std * noise.to(inputs.device)

    return add_noise
