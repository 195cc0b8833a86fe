"""Small helpers that several test modules share."""

from __future__ import annotations

import torch
from torch.utils._python_dispatch import TorchDispatchMode


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
