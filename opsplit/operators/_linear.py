r"""Integral transforms over :math:`\Omega_y` as GEMMs.

:func:`linear_y` is :math:`\int_{\Omega_y} W(\xi, \cdot)\, x(\cdot, \xi)\, d\xi + b` for a
kernel ``W`` of shape ``(N_y, M)`` (rows: the integration variable), the y-weights folded
into the kernel when they are equal.

:func:`side_by_side` puts several kernels side by side for inference: one GEMM where a term
applies several integral transforms to the same state (queries/keys/values, gate/up).  It
keeps nothing between calls, so it can never serve weights older than the parameters:

* when the kernels are adjacent column blocks of one row-major buffer — what
  :func:`share_pieces` makes of the kernels of a :class:`~opsplit.controls.LayerwiseConstant`
  control per time piece (:class:`~opsplit.models.DecoderLM` does at construction and after
  every ``.to()``) — the kernel side by side *is* that buffer: a view, no copy, and every
  write to a parameter (``p.data.mul_``, ``copy_``, ``load_state_dict``, an optimizer step)
  is a write to it.  Whether they are is decided at every call from the tensors' storage,
  offsets and strides (:func:`adjacent_columns`, a few attribute reads);
* otherwise (other controls, or a write that replaced a parameter's storage: ``p.data =
  ...``, ``load_state_dict(assign=True)``, a deep copy) the kernels are concatenated, a copy
  made at that call.

With autograd recording the operators apply the kernels one by one, so gradients reach
each parameter directly.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = ["linear_y", "side_by_side", "adjacent_columns", "share_storage", "share_pieces"]


def linear_y(x: Tensor, W: Tensor, b: Tensor | None, grid) -> Tensor:
    r""":math:`\int_{\Omega_y} W(\xi, \cdot)\, x(\cdot, \xi)\, d\xi + b`: ``x`` ``(..., N_y)``,
    ``W`` ``(N_y, M)``, ``b`` ``(M,)`` or ``None`` -> ``(..., M)`` (one GEMM)."""
    wy = grid.y.uniform_weight
    if wy is None:
        x = x * grid.y.weights(x.dtype, x.device)
    elif wy != 1.0:
        W = W * wy
    return F.linear(x, W.t(), b)


def adjacent_columns(parts) -> Tensor | None:
    """The ``(R, sum M_i)`` tensor whose column blocks are ``parts`` (each ``(R, M_i)``), as a
    view of their storage, when they are adjacent column blocks of one row-major buffer (one
    storage, consecutive offsets, row stride ``sum M_i``, unit column stride, one dtype);
    else ``None``.  The view and the parts are the same memory: no copy to go stale."""
    first = parts[0]
    if first.device.type == "meta" or torch.compiler.is_compiling():
        return None
    R, S = first.shape[0], sum(p.shape[1] for p in parts)
    ptr, off = first.untyped_storage().data_ptr(), first.storage_offset()
    for p in parts:
        if (p.dtype != first.dtype or p.shape[0] != R or p.stride(1) != 1 or (R > 1 and p.stride(0) != S)
                or p.storage_offset() != off or p.untyped_storage().data_ptr() != ptr):
            return None
        off += p.shape[1]
    return first.as_strided((R, S), (S, 1))


def side_by_side(kernels, biases) -> tuple[Tensor, Tensor | None]:
    """``[W_1, ..., W_k]`` as one ``(N_y, sum M_i)`` kernel (each ``W_i`` reshaped to
    ``(N_y, M_i)``) and the matching bias (zeros where a ``b_i`` is ``None``; ``None`` if all
    are): a view of the parameters when they share one buffer (:func:`adjacent_columns`),
    else a new tensor (module docstring)."""
    ny = kernels[0].shape[0]
    Ws = [w.reshape(ny, -1) for w in kernels]
    W = adjacent_columns(Ws)
    if W is None:
        W = torch.cat(Ws, 1)
    if all(x is None for x in biases):
        return W, None
    if all(x is not None for x in biases):
        bs = [x.reshape(1, -1) for x in biases]
        b = adjacent_columns(bs)
        return W, (torch.cat(bs, 1) if b is None else b).view(-1)
    return W, torch.cat([x.reshape(-1) if x is not None else w.new_zeros(w.shape[1]) for w, x in zip(Ws, biases)])


@torch.no_grad()
def share_storage(params, rows: int) -> None:
    """Make the tensors ``params`` (each viewed as ``(rows, M_i)``) adjacent column blocks of
    one new row-major buffer ``(rows, sum M_i)``: each ``p.data`` becomes a view of it, with
    the same values, shape and ``requires_grad`` (nothing is done when they already are)."""
    if adjacent_columns([p.reshape(rows, -1) for p in params]) is not None:
        return
    buf = torch.cat([p.detach().reshape(rows, -1) for p in params], 1)
    off = 0
    for p in params:
        m = p.numel() // rows
        p.data = buf[:, off: off + m].view(p.shape)
        off += m


def share_pieces(controls, rows: int | None = None) -> None:
    """:func:`share_storage` for the parameters of each time piece of ``controls`` when all
    are :class:`~opsplit.controls.LayerwiseConstant` with the same pieces (``rows``: the rows
    of each piece's ``(rows, M_i)`` view; ``None``: its first dimension, a kernel's
    :math:`N_y`); other controls are left as they are."""
    from ..controls import LayerwiseConstant

    if not controls or not all(type(c) is LayerwiseConstant for c in controls):
        return
    n = controls[0].n_pieces
    if any(c.n_pieces != n or (c.t0, c.t1) != (controls[0].t0, controls[0].t1) for c in controls):
        return
    for k in range(n):
        ps = [c.pieces[k] for c in controls]
        if len({(p.dtype, p.device) for p in ps}) == 1 and ps[0].dim() > 0:
            share_storage(ps, ps[0].shape[0] if rows is None else rows)
