r"""Integral transforms over :math:`\Omega_y` as GEMMs.

:func:`linear_y` is :math:`\int_{\Omega_y} W(\xi, \cdot)\, x(\cdot, \xi)\, d\xi + b` for a
kernel ``W`` of shape ``(N_y, M)`` (rows: the integration variable), the y-weights folded
into the kernel when they are equal.

:func:`side_by_side` puts several kernels side by side for inference: one GEMM where a term
applies several integral transforms to the same state (queries/keys/values, gate/up), built
once per time piece and parameter version.  Used only when autograd does not record: the
concatenation is a copy, cached on the operator (``cache``, a plain dict) under the time
``t`` and invalidated when any source tensor changes (its storage, version counter, shape,
dtype or device).  The cache keeps at most :data:`MAX_TIMES` times (the oldest entry is
dropped first): a fixed grid of up to that many steps is built once, and an adaptive solve,
whose step times are all distinct, does not grow it without bound.  With autograd
recording the operators apply the kernels one by one, so gradients reach each parameter
directly.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = ["linear_y", "side_by_side", "MAX_TIMES"]

#: the most times a :func:`side_by_side` cache keeps
MAX_TIMES = 256


def linear_y(x: Tensor, W: Tensor, b: Tensor | None, grid) -> Tensor:
    r""":math:`\int_{\Omega_y} W(\xi, \cdot)\, x(\cdot, \xi)\, d\xi + b`: ``x`` ``(..., N_y)``,
    ``W`` ``(N_y, M)``, ``b`` ``(M,)`` or ``None`` -> ``(..., M)`` (one GEMM)."""
    wy = grid.y.uniform_weight
    if wy is None:
        x = x * grid.y.weights(x.dtype, x.device)
    elif wy != 1.0:
        W = W * wy
    return F.linear(x, W.t(), b)


def side_by_side(cache: dict, t, kernels, biases) -> tuple[Tensor, Tensor | None]:
    """``[W_1, ..., W_k]`` as one ``(N_y, sum M_i)`` kernel (each ``W_i`` reshaped to
    ``(N_y, M_i)``) and the matching bias (zeros where a ``b_i`` is ``None``; ``None`` if all
    are)."""
    srcs = [w for w in (*kernels, *biases) if w is not None]
    versions = tuple((w.data_ptr(), w._version, tuple(w.shape), w.dtype, w.device) for w in srcs)
    hit = cache.get(float(t))
    if hit is not None and hit[0] == versions:
        return hit[1], hit[2]
    ny = kernels[0].shape[0]
    Ws = [w.reshape(ny, -1) for w in kernels]
    W = torch.cat(Ws, 1)
    b = None
    if any(x is not None for x in biases):
        b = torch.cat([x.reshape(-1) if x is not None else w.new_zeros(w.shape[1]) for w, x in zip(Ws, biases)])
    cache.pop(float(t), None)
    while len(cache) >= MAX_TIMES:
        del cache[next(iter(cache))]  # the oldest time
    cache[float(t)] = (versions, W, b)
    return W, b
