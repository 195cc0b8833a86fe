"""scikit-learn's bundled handwritten digits (8×8, 1797 images, 10 classes), split and
normalised, for ViT-style classification (paper 002, §4.2: patch embedding F, class-token
read-out G).  Shipped with scikit-learn: nothing is downloaded."""

from __future__ import annotations

import torch

from .base import TensorData

__all__ = ["load_digits"]


def load_digits(*, test_fraction: float = 0.2, seed: int = 0, dtype=torch.float32,
                normalize: bool = True) -> tuple[TensorData, TensorData]:
    """``(train, test)``: images ``(B, 1, 8, 8)`` and labels ``(B,)`` (int64).

    The split is a seeded stratified permutation: ``round(test_fraction * n_c)`` images of
    every class ``c`` go to the test set (360 of 1797 for 0.2).  Pixels (0…16) are scaled
    by 1/16 and, with ``normalize``, standardised with the *training* mean and standard
    deviation (one scalar each).  ``info`` of both sets records the split.
    """
    try:
        from sklearn.datasets import load_digits as _load
    except ImportError as e:  # pragma: no cover - environment
        raise ImportError("load_digits needs scikit-learn: pip install 'opsplit[train]'") from e
    if not isinstance(test_fraction, float) or not 0.0 < test_fraction < 1.0:
        raise ValueError(f"load_digits.test_fraction: expected a float in (0, 1), got {test_fraction!r}")
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise TypeError(f"load_digits.seed: expected an integer, got {seed!r}")
    d = _load()
    x = torch.as_tensor(d.images, dtype=torch.float64).unsqueeze(1) / 16.0
    y = torch.as_tensor(d.target, dtype=torch.int64)
    g = torch.Generator().manual_seed(seed)
    test_idx, train_idx = [], []
    for c in range(10):
        idx = torch.nonzero(y == c).flatten()
        idx = idx[torch.randperm(len(idx), generator=g)]
        k = round(test_fraction * len(idx))
        test_idx.append(idx[:k])
        train_idx.append(idx[k:])
    tr = torch.cat(train_idx)
    tr = tr[torch.randperm(len(tr), generator=g)]
    te = torch.cat(test_idx).sort().values
    xtr, xte = x[tr], x[te]
    mean, std = float(xtr.mean()), float(xtr.std())
    if normalize:
        xtr, xte = (xtr - mean) / std, (xte - mean) / std
    info = {"source": "sklearn.datasets.load_digits", "n_total": len(y), "n_train": len(tr), "n_test": len(te),
            "test_fraction": test_fraction, "split_seed": seed, "split": "stratified per class",
            "pixel_scale": 1 / 16, "mean": mean if normalize else 0.0, "std": std if normalize else 1.0}
    return (TensorData(xtr.to(dtype), y[tr], name="digits_train", info=info),
            TensorData(xte.to(dtype), y[te], name="digits_test", info=info))
