"""scikit-learn's bundled handwritten digits (8×8, 1797 images, 10 classes), split and
normalised, for ViT-style classification (paper 002, §4.2: patch embedding F, class-token
read-out G).  Shipped with scikit-learn: nothing is downloaded."""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path

import numpy as np
import torch

from .._checks import check_bool, check_dtype_arg, check_finite_float, check_generator
from .base import TensorData, check_int

__all__ = ["load_digits", "random_shift"]


def _bundled_digits():
    """``(images (1797, 8, 8), labels (1797,))`` from the CSV scikit-learn ships
    (``sklearn/datasets/data/digits.csv.gz``, what ``sklearn.datasets.load_digits`` reads),
    located without importing ``sklearn.datasets`` (slow); that loader is the fallback."""
    spec = importlib.util.find_spec("sklearn")
    if spec is None:
        raise ImportError("load_digits needs scikit-learn (its bundled digits): pip install 'opsplit[train]'")
    for loc in spec.submodule_search_locations or []:
        f = Path(loc) / "datasets" / "data" / "digits.csv.gz"
        if f.is_file():
            data = np.loadtxt(f, delimiter=",")
            return data[:, :-1].reshape(-1, 8, 8), data[:, -1].astype(np.int64)
    # on use: slow to import (~0.9 s)
    from sklearn.datasets import load_digits as _load  # pragma: no cover - other layouts

    d = _load()
    return d.images, d.target


def load_digits(*, test_fraction: float = 0.2, seed: int = 0, dtype=torch.float32,
                normalize: bool = True) -> tuple[TensorData, TensorData]:
    """``(train, test)``: images ``(B, 1, 8, 8)`` and labels ``(B,)`` (int64).

    The split is a seeded stratified permutation: ``round(test_fraction * n_c)`` images of
    every class ``c`` go to the test set (360 of 1797 for 0.2).  Pixels (0…16) are scaled
    by 1/16 and, with ``normalize``, standardised with the *training* mean and standard
    deviation (one scalar each).  ``info`` of both sets records the split (sizes, seed, and
    the indices into scikit-learn's array: ``train_index``, ``test_index``).
    """
    if isinstance(test_fraction, bool) or not isinstance(test_fraction, (int, float)):
        raise TypeError(f"load_digits.test_fraction: expected a number in (0, 1), got {test_fraction!r}")
    if not (math.isfinite(test_fraction) and 0.0 < test_fraction < 1.0):
        raise ValueError(f"load_digits.test_fraction: expected a number in (0, 1), got {test_fraction!r}")
    seed = check_int(seed, "load_digits.seed", 0)
    dtype = check_dtype_arg(dtype, "load_digits.dtype") or torch.float32
    check_bool(normalize, "load_digits.normalize")
    images, target = _bundled_digits()
    x = torch.as_tensor(images, dtype=torch.float64).unsqueeze(1) / 16.0
    y = torch.as_tensor(target, dtype=torch.int64)
    for c in range(10):  # every class in both sets, checked before the split
        n_c = int((y == c).sum())
        k = round(test_fraction * n_c)
        if k == n_c:
            raise ValueError(f"load_digits.test_fraction: {test_fraction!r} leaves no training image of class {c} "
                             f"(round({test_fraction!r} x {n_c}) = {k} of its {n_c} images go to the test set); "
                             f"expected test_fraction < {(n_c - 0.5) / n_c:.4f}")
        if k == 0:
            raise ValueError(f"load_digits.test_fraction: {test_fraction!r} puts no test image of class {c} "
                             f"(round({test_fraction!r} x {n_c}) = 0); expected test_fraction >= {0.5 / n_c:.4f}")
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
    info = {"source": "sklearn.datasets.load_digits", "train_index": tr.tolist(), "test_index": te.tolist(), "n_total": len(y), "n_train": len(tr), "n_test": len(te),
            "test_fraction": test_fraction, "split_seed": seed, "split": "stratified per class",
            "pixel_scale": 1 / 16, "mean": mean if normalize else 0.0, "std": std if normalize else 1.0}
    return (TensorData(xtr.to(dtype), y[tr], name="digits_train", info=info),
            TensorData(xte.to(dtype), y[te], name="digits_test", info=info))


def random_shift(images: torch.Tensor, generator: torch.Generator | None = None, *, max_shift: int = 1,
                 fill: float | None = None) -> torch.Tensor:
    """Translate every image of ``(B, C, H, W)`` by its own random integer offset in
    ``[-max_shift, max_shift]`` along both axes (drawn from ``generator``), filling the
    uncovered border with ``fill`` (default: the batch minimum, the background of
    standardised digits).  A training augmentation for :class:`~opsplit.control.Trainer`
    (``augment=random_shift``)."""
    if not isinstance(images, torch.Tensor):
        raise TypeError(f"random_shift.images: expected a torch.Tensor (B, C, H, W), got {type(images).__name__}")
    if images.dim() != 4:
        raise ValueError(f"random_shift.images: expected (B, C, H, W), got shape {tuple(images.shape)}")
    if not images.is_floating_point():
        raise TypeError(f"random_shift.images: expected a floating-point tensor, got dtype {images.dtype}")
    B, _, H, W = images.shape
    m = check_int(max_shift, "random_shift.max_shift", 0)
    if m >= min(H, W):
        raise ValueError(f"random_shift.max_shift: expected an integer < {min(H, W)} (the image is {H} x {W}), "
                         f"got {m}")
    if fill is not None:
        fill = check_finite_float(fill, "random_shift.fill")
    check_generator(generator, "random_shift.generator")
    if m == 0:
        return images
    bg = float(images.min()) if fill is None else fill
    pad = torch.nn.functional.pad(images, (m, m, m, m), value=bg)
    off = torch.randint(0, 2 * m + 1, (B, 2), generator=generator)
    rows = (off[:, 0, None] + torch.arange(H)[None, :])  # (B, H)
    cols = (off[:, 1, None] + torch.arange(W)[None, :])  # (B, W)
    b = torch.arange(B)[:, None, None]
    out = pad.permute(0, 2, 3, 1)[b, rows[:, :, None], cols[:, None, :]]  # (B, H, W, C)
    return out.permute(0, 3, 1, 2).contiguous()
