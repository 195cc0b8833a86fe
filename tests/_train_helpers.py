"""Small models and data for the training tests (imported by the tests and by the resume
subprocess)."""

import torch
from torch import nn

from opsplit.data import TensorData
from opsplit.models import SplitEncoder


class TinyClassifier(nn.Module):
    """Tokens (B, 5, d) -> SplitEncoder -> mean over tokens -> dropout -> linear (3 classes)."""

    def __init__(self, d=8, n_steps=2, scheme="lie", control="piecewise_constant", seed=0, solver=None, T=2.0):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.encoder = SplitEncoder(d, 2, 2 * d, n_steps=n_steps, T=T, scheme=scheme, control=control,
                                    generator=g, solver=solver)
        self.drop = nn.Dropout(0.2)
        self.head = nn.Linear(d, 3)
        with torch.no_grad():
            self.head.weight.copy_(torch.randn(3, d, generator=g) * 0.3)
            self.head.bias.zero_()

    def forward(self, x, n_steps=None):
        return self.head(self.drop(self.encoder(x, n_steps=n_steps).mean(1)))


def tiny_data(n=40, d=8, seed=1):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 5, d, generator=g)
    y = (x[:, :, 0].sum(1) > 0).long() + (x[:, 0, 1] > 1).long()
    return TensorData(x, y, name="tiny")


def tiny_config(**kw):
    from opsplit.control import TrainConfig

    base = dict(epochs=4, batch_size=16, lr=1e-2, schedule="cosine", warmup_steps=2, grad_clip=1.0,
                weight_decay=0.01, seed=3, progress=False)
    base.update(kw)
    return TrainConfig(**base)


def state_copy(m):
    """A detached copy of ``m``'s state dict."""
    return {k: v.detach().clone() for k, v in m.state_dict().items()}


def same_state(a, b):
    """Two state dicts with the same keys and bitwise equal tensors."""
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
