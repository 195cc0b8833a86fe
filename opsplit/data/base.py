"""Datasets as pairs of tensors :math:`\\{(u_i, v_i)\\}_{i=1}^B` (paper 002, §2.5), checked once."""

from __future__ import annotations

import torch
from torch import Tensor

from .._checks import check_int

__all__ = ["TensorData", "check_int"]


class TensorData(torch.utils.data.Dataset):
    """Inputs and targets held as two tensors with the same first dimension.

    ``data[i]`` is ``(inputs[i], targets[i])``; ``data[idx]`` with an index tensor or list
    returns the batch ``(inputs[idx], targets[idx])`` in one indexing (what the trainer
    uses).  Checked at construction: tensors, equal lengths, at least one sample, finite
    floating-point inputs (and targets, when floating).

    Args:
        inputs: ``(B, ...)``.
        targets: ``(B, ...)``.
        name: used in error messages (``"train_data"``, ...).
        info: free-form description (split, seed, source) kept with the data.
    """

    def __init__(self, inputs: Tensor, targets: Tensor, *, name: str = "data", info: dict | None = None):
        if not isinstance(name, str):
            raise TypeError(f"TensorData.name: expected a string, got {type(name).__name__}")
        if info is not None and not isinstance(info, dict):
            raise TypeError(f"TensorData.info: expected a dict or None, got {type(info).__name__}")
        for what, t in (("inputs", inputs), ("targets", targets)):
            if not isinstance(t, Tensor):
                raise TypeError(f"{name}.{what}: expected a torch.Tensor, got {type(t).__name__}")
            if t.dim() < 1:
                raise ValueError(f"{name}.{what}: expected a leading sample dimension, got a scalar")
        if inputs.shape[0] != targets.shape[0]:
            raise ValueError(
                f"{name}: inputs have {inputs.shape[0]} samples, targets {targets.shape[0]}; expected equal"
            )
        if inputs.shape[0] == 0:
            raise ValueError(f"{name}: empty dataset (0 samples)")
        for what, t in (("inputs", inputs), ("targets", targets)):
            if t.is_floating_point() and not bool(torch.isfinite(t).all()):
                raise ValueError(f"{name}.{what}: expected finite values, found NaN/inf")
        self.inputs, self.targets, self.name = inputs, targets, name
        self.info = dict(info or {})

    def __len__(self) -> int:
        return int(self.inputs.shape[0])

    def __getitem__(self, idx):
        return self.inputs[idx], self.targets[idx]

    def to(self, *args, **kwargs) -> TensorData:
        """Move/cast the inputs (floating) and targets like ``Tensor.to``; returns a new dataset."""
        x = self.inputs.to(*args, **kwargs) if self.inputs.is_floating_point() else self.inputs.to(
            device=_device_of(args, kwargs))
        y = self.targets.to(*args, **kwargs) if self.targets.is_floating_point() else self.targets.to(
            device=_device_of(args, kwargs))
        return TensorData(x, y, name=self.name, info=self.info)

    def __repr__(self) -> str:
        return (f"TensorData(name={self.name!r}, n={len(self)}, inputs={tuple(self.inputs.shape[1:])}, "
                f"targets={tuple(self.targets.shape[1:])})")


def _device_of(args, kwargs):
    if "device" in kwargs:
        return kwargs["device"]
    for a in args:
        if isinstance(a, (str, torch.device)):
            return a
    return None
