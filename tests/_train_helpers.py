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


def rewrite_checkpoint(folder, tensors=None, meta=None, seal=True):
    """Edit a checkpoint folder the way a damaged or hand-edited file would be, with its
    SHA-256, size, tensor index and (``seal``) the digest of its metadata made to match again
    (so that only the checks of the contents can refuse it): ``tensors(dict) -> dict`` on
    ``state.safetensors``, ``meta(dict)`` in place on ``meta.json``.  ``seal=False`` leaves
    the digest that the tensor file records (an edit of ``meta.json`` by hand)."""
    import hashlib
    import json
    from pathlib import Path

    import safetensors.torch as st

    from opsplit.control.checkpoint import META_DIGEST_KEY, meta_digest

    ck = Path(folder)
    m = json.loads((ck / "meta.json").read_text())
    tfile = ck / "state.safetensors"
    if tensors is not None:
        t = tensors(dict(st.load(tfile.read_bytes())))
        m["tensors"] = {k: {"shape": list(v.shape), "dtype": str(v.dtype).replace("torch.", "")} for k, v in t.items()}
    if meta is not None:
        meta(m)
    if tensors is not None or seal:
        data = tfile.read_bytes()
        header = json.loads(data[8:8 + int.from_bytes(data[:8], "little")]).get("__metadata__") or {}
        if seal:
            header[META_DIGEST_KEY] = meta_digest(m)
        st.save_file(t if tensors is not None else dict(st.load(data)), str(tfile), metadata=header or None)
        data = tfile.read_bytes()
        m["tensors_sha256"], m["tensors_bytes"] = hashlib.sha256(data).hexdigest(), len(data)
    (ck / "meta.json").write_text(json.dumps(m))
    return ck
