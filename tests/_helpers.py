"""Small helpers that several test modules share."""

from __future__ import annotations

import csv

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from opsplit.functional.sliced_runs import SlicedDecodeCache


class RandomDraws(TorchDispatchMode):
    """Records the random draws (op, number of elements) of a forward pass, to compare where
    two implementations draw dropout (and drop-path) masks."""

    def __init__(self):
        super().__init__()
        self.draws = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        if any(k in name for k in ("bernoulli", "dropout", "rand", "uniform", "normal")):
            self.draws.append((name, args[0].numel() if isinstance(args[0], torch.Tensor) else args[0]))
        return func(*args, **(kwargs or {}))


def csv_rows(path):
    """The rows of a CSV file written by the CLI, as dicts keyed by its header."""
    with open(path, newline="") as fh:
        return list(csv.DictReader(fh))


def sigma_state(model, s1, s2):
    """``model``'s state dict with every S1 projection's sigma1 set to ``s1`` and sigma2 to
    ``s2`` (for loading back through load_state_dict)."""
    state = model.state_dict()
    for k in state:
        if k.endswith("sigma1.value"):
            state[k] = torch.tensor(s1, dtype=state[k].dtype)
        elif k.endswith("sigma2.value"):
            state[k] = torch.tensor(s2, dtype=state[k].dtype)
    return state


def sliced_runs_steps(zq, zk, v, w, centered, first):
    """The causal sliced ReLU attention (eqs. 2/3) through a SlicedDecodeCache (sorted runs):
    the first ``first`` tokens as one step (the prefill), then one token per step (the sorted
    runs, their merges and the tail); rows (R, N) as the kernels take them."""
    c, outs, a = SlicedDecodeCache(), [], 0
    with torch.no_grad():
        for m in [first] + [1] * (zk.shape[1] - first):
            s = slice(a, a + m)
            outs.append(c.step_relu(zq[None, :, s], zk[None, :, s], v[None, :, s], key_weights=w[None, :, s],
                                    centered=centered))
            a += m
    return torch.cat(outs, 2)[0]


def same_draws(ref, model, *args):
    """The random draws of one forward pass of ``ref`` and one of ``model`` on ``args``,
    asserted equal (same ops, same sizes, same order); returns ``ref``'s."""
    with RandomDraws() as r_ref:
        ref(*args)
    with RandomDraws() as r_ops:
        model(*args)
    assert r_ops.draws == r_ref.draws
    return r_ref.draws


def assert_seeded_pass_close(ref, model, x, *args, seed, atol, out=lambda y: y):
    """From the same seed, ``out(model(x, *args))`` equals ``out(ref(x, *args))`` and the input
    gradients of their sums of squares agree, within ``atol`` (rtol 0); both backward passes
    leave their parameters' gradients in place."""
    x1, x2 = x.clone().requires_grad_(), x.clone().requires_grad_()
    torch.manual_seed(seed)
    y_ref = out(ref(x1, *args))
    torch.manual_seed(seed)
    y = out(model(x2, *args))
    torch.testing.assert_close(y, y_ref, rtol=0, atol=atol)
    y_ref.square().sum().backward()
    y.square().sum().backward()
    torch.testing.assert_close(x2.grad, x1.grad, rtol=0, atol=atol)


def output_and_grads(attention, inputs, g):
    """``attention`` applied to fresh leaf copies of ``inputs``: its output and the gradient of
    ``(out * g).sum()`` for each input (to compare two code paths of one kernel)."""
    ins = [t.detach().clone().requires_grad_() for t in inputs]
    out = attention(*ins)
    (out * g).sum().backward()
    return [out.detach()] + [t.grad for t in ins]
