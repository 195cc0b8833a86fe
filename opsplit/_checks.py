"""Input validation shared by every public entry point.

Every check raises a ``ValueError`` (or ``TypeError``) whose message names what was
expected and what was received, so that bad input never reaches a matmul.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor


def check_tensor(x, name: str) -> Tensor:
    if not isinstance(x, Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(x).__name__}")
    return x


def check_float_dtype(x: Tensor, name: str) -> None:
    if not x.is_floating_point():
        raise TypeError(
            f"{name}: expected a floating-point tensor (float32 or float64), got dtype {x.dtype}"
        )


def check_finite(x: Tensor, name: str) -> None:
    """Raise if ``x`` holds NaN or inf (one reduction; syncs on CUDA)."""
    if not bool(torch.isfinite(x).all()):
        n_bad = int((~torch.isfinite(x)).sum())
        raise ValueError(f"{name}: expected finite values, found {n_bad} NaN/inf entries")


def check_state(u, grid, name: str = "u", *, finite: bool = True) -> Tensor:
    """Validate a state ``u`` of shape (B, N_x, N_y) against ``grid``."""
    u = check_tensor(u, name)
    check_float_dtype(u, name)
    if u.dim() != 3:
        raise ValueError(
            f"{name}: expected a tensor of shape (B, N_x, N_y) = (B, {grid.nx_str}, {grid.ny_str}) "
            f"(rank 3), got rank {u.dim()} with shape {tuple(u.shape)}"
        )
    grid.check_shape(u.shape[-2:], name)
    if finite:
        check_finite(u, name)
    return u


def check_positive_int(n, name: str) -> int:
    if isinstance(n, bool) or not isinstance(n, int) and not (
        isinstance(n, float) and n.is_integer()
    ):
        raise TypeError(f"{name}: expected a positive integer, got {n!r}")
    n = int(n)
    if n < 1:
        raise ValueError(f"{name}: expected a positive integer (>= 1), got {n}")
    return n


def check_positive_float(x, name: str, *, allow_zero: bool = False) -> float:
    try:
        xf = float(x)
    except (TypeError, ValueError):
        raise TypeError(f"{name}: expected a real number, got {x!r}") from None
    if not math.isfinite(xf) or (xf < 0 if allow_zero else xf <= 0):
        bound = ">= 0" if allow_zero else "> 0"
        raise ValueError(f"{name}: expected a finite number {bound}, got {x!r}")
    return xf


def check_shape(x: Tensor, expected: Sequence[int], name: str, what: str = "") -> None:
    if tuple(x.shape) != tuple(expected):
        extra = f" ({what})" if what else ""
        raise ValueError(f"{name}: expected shape {tuple(expected)}{extra}, got {tuple(x.shape)}")


def all_finite(x: Tensor) -> bool:
    """Whether ``x`` holds no NaN or inf, by one sum (NaN and inf propagate through it;
    several times cheaper than ``torch.isfinite(x).all()`` on the CPU); only when the sum
    overflows are the entries tested one by one."""
    if x.numel() == 0:
        return True
    if bool(torch.isfinite(x.sum())):
        return True
    return bool(torch.isfinite(x).all())
