r"""Terms at a fixed time with their controls evaluated once: the decode steps of a generation.

A splitting step evaluates every control of every term at the step's start time
:math:`t^k` (``W(t, grid)``) and then applies the term to the state.  Generation calls the
same steps once per new token with the same parameters and the same :math:`t^k`: the
controls' values do not change between the calls, only the state and the call-time inputs
of the grid (the key/value cache, the masks, the positions).  :func:`frozen_field` and
:func:`frozen_map` return the term at time ``t`` as a function ``f(u, grid)`` whose
controls were evaluated once, when it was made; applying it performs the same tensor
operations, in the same order, as the term's own ``field`` / ``flow`` / ``resolvent`` at
``t`` (so the result is the same bit for bit; ``tests/test_llm_decode.py``).

Valid while the parameters do not change and autograd does not record (what the decode
steps of :func:`opsplit.models.generate.generate` guarantee: ``torch.no_grad()``, one call).
A term that provides ``frozen_field(t, grid)`` / ``frozen_map(t, grid, dtype)`` is asked for
it (:class:`~opsplit.operators.GroupedQueryAttention`,
:class:`~opsplit.operators.GatedFeedForward`, :class:`~opsplit.operators.ProjectionSphere`);
:class:`~opsplit.operators.PreNorm`, :class:`~opsplit.operators.FieldDropout` (in eval
mode), :class:`~opsplit.operators.FeedForward` and
:class:`~opsplit.operators.PointwiseAffine` are composed here from their controls; any
other term (and these in the cases listed at each function) is called as it is, at ``t``.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

from ..grid import Grid
from ._linear import linear_y
from .activation import activation_fn
from .affine import PointwiseAffine
from .dropout import FieldDropout
from .feedforward import FeedForward
from .prenorm import PreNorm

__all__ = ["frozen_field", "frozen_map", "frozen_output"]

Frozen = Callable[[Tensor, Grid], Tensor]


def frozen_field(op, t, grid: Grid, dtype) -> Frozen:
    """``op.field`` at time ``t`` as ``f(u, grid)`` (module docstring); ``grid``: the grid of
    the calls without their call-time inputs, ``dtype``: the state's."""
    own = getattr(op, "frozen_field", None)
    if own is not None:
        return own(t, grid)
    kind = type(op)
    if kind is PreNorm:
        maps = [frozen_map(n, t, grid, dtype) for n in op.maps]
        inner = frozen_field(op.inner, t, grid, dtype)

        def prenorm(u: Tensor, g: Grid) -> Tensor:
            for m in maps:
                u = m(u, g)
            return inner(u, g)

        return prenorm
    if kind is FieldDropout and not (op.training and op.p > 0):  # the identity in eval mode
        return frozen_field(op.inner, t, grid, dtype)
    if kind is FeedForward:
        return _frozen_feedforward(op, t, grid)
    return lambda u, g: op.field(t, u, g)


def frozen_map(op, t, grid: Grid, dtype) -> Frozen:
    """A map substep (a normalisation of :class:`PreNorm`, a final norm) at time ``t`` as
    ``f(u, grid)`` (module docstring)."""
    own = getattr(op, "frozen_map", None)
    if own is not None:
        return own(t, grid, dtype)
    if type(op) is PointwiseAffine:
        return _frozen_affine(op, t, grid, dtype)
    if op.has_flow:
        return lambda u, g: op.flow(t, 1.0, u, g)
    return lambda u, g: op.resolvent(t, 1.0, u, g)


def frozen_output(ffn: FeedForward, t, grid: Grid) -> Frozen:
    """:meth:`FeedForward.output` at ``t``, ``h -> W_2 h + b_2`` with the hidden weights
    folded into :math:`W_2` (as ``output`` folds them when they are equal); called as it is
    in training mode with dropout and with unequal hidden weights."""
    W2 = ffn.W2(t, grid)
    b2 = None if ffn.b2 is None else ffn.b2(t, grid)
    wz = ffn._hidden_weight(W2.shape[0], W2.dtype, W2.device)
    if (ffn.dropout and ffn.training) or isinstance(wz, Tensor):
        return lambda h, g: ffn.output(t, h, g)
    Wt = (W2 if wz == 1.0 else W2 * wz).t()
    return lambda h, g: F.linear(h, Wt, b2)


def _frozen_feedforward(op: FeedForward, t, grid: Grid) -> Frozen:
    """:meth:`FeedForward.field`: GEMM, activation (ReLU in place), :func:`frozen_output`."""
    W1 = op.W1(t, grid)
    b1 = None if op.b1 is None else op.b1(t, grid)
    out = frozen_output(op, t, grid)
    if op.activation == "relu":
        return lambda u, g: out(linear_y(u, W1, b1, g).relu_(), g)
    act = activation_fn(op.activation)
    return lambda u, g: out(act(linear_y(u, W1, b1, g)), g)


def _frozen_affine(op: PointwiseAffine, t, grid: Grid, dtype) -> Frozen:
    """:meth:`PointwiseAffine.flow`: with its projection (equal y-weights, :math:`\\varepsilon
    > 0`) one ``F.layer_norm`` with :math:`\\gamma \\sigma_2` and :math:`\\gamma \\sigma_1 +
    \\beta` computed once; else the affine map (the projection is called as it is)."""
    w = None if op.weight is None else op.weight(t, grid)
    b = None if op.bias is None else op.bias(t, grid)
    P = op.projection
    if P is not None:
        if not (P.eps > 0 and grid.y.uniform_weight is not None and grid.y.n is not None):
            return lambda u, g: op.flow(t, 1.0, u, g)
        n, eps = grid.y.n, P.eps
        s1, s2 = P.sigma1(t, grid).to(dtype), P.sigma2(t, grid).to(dtype)
        gw = s2.expand(n) if w is None else w * s2
        gb = s1.expand(n) if w is None else w * s1
        if b is not None:
            gb = gb + b
        return lambda u, g: F.layer_norm(u, (n,), gw, gb, eps)
    if w is not None:
        return (lambda u, g: torch.addcmul(b, u, w)) if b is not None else (lambda u, g: u * w)
    return (lambda u, g: u) if b is None else (lambda u, g: u + b)
