r"""A pointwise activation as a substep: :math:`u \mapsto \sigma(u)` (GELU, ReLU, ...).

Paper 002 obtains ReLU as the resolvent of :math:`\partial I_{S_2}`, i.e. the projection
onto :math:`S_2 = \{u \ge 0\}` (eq. 24, :class:`~opsplit.operators.ProjectionS2`).  Other
activations are **not projections** and not resolvents of any monotone operator, so they
are not a term of eq. (7) that a splitting can take implicitly.  The reason for GELU
(:math:`x\Phi(x)`): a resolvent :math:`(I + \lambda A)^{-1}` of a maximal monotone
:math:`A` is firmly non-expansive, and for a scalar map that means non-decreasing with
slope in :math:`[0, 1]`; GELU decreases on :math:`x < -0.75` (slope down to about
:math:`-0.13`) and has slope above 1 (up to about :math:`1.13`) near :math:`x = 1.4`, and
it is not idempotent (:math:`\sigma(\sigma(x)) \ne \sigma(x)`), so it projects onto no
set.

What it is: a fixed pointwise *map substep*, independent of :math:`\Delta t` (like the
projections), that a scheme applies once per step.  :class:`Activation` exposes it as
the exact "flow" of the substep, and its ``fn`` is what
:class:`~opsplit.operators.FeedForward` applies on its hidden grid.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from torch import Tensor

from ..grid import Grid
from .base import Operator

__all__ = ["Activation", "ACTIVATIONS", "activation_fn"]

#: name -> (function, is a projection (resolvent of an indicator))
ACTIVATIONS = {
    "relu": (F.relu, True),
    "gelu": (F.gelu, False),
    "gelu_tanh": (functools.partial(F.gelu, approximate="tanh"), False),
    "silu": (F.silu, False),
    "tanh": (torch.tanh, False),
    "identity": (lambda u: u, True),
}


def _quick_gelu(u: Tensor) -> Tensor:
    return u * torch.sigmoid(1.702 * u)


ACTIVATIONS["quick_gelu"] = (_quick_gelu, False)


def activation_fn(name: str):
    """The function of a named activation (clear error for unknown names)."""
    if not isinstance(name, str) or name not in ACTIVATIONS:
        raise ValueError(f"activation: expected one of {sorted(ACTIVATIONS)}, got {name!r}")
    return ACTIVATIONS[name][0]


class Activation(Operator):
    """Pointwise map :math:`u \\mapsto \\sigma(u)` as a substep (a map, not a projection —
    except ``"relu"``, which is :math:`P_{S_2}`, paper 002 eq. 24).

    Args:
        name: one of :data:`ACTIVATIONS` (``"gelu"`` is the exact, erf-based GELU of
            ``torch.nn.functional.gelu``; ``"gelu_tanh"`` its tanh approximation).
    """

    has_flow = True
    default_solver = "exact"
    #: a Δt-independent map (applied once per step, like a projection)
    is_map = True

    def __init__(self, name: str = "gelu"):
        super().__init__()
        self.fn = activation_fn(name)
        self.name = name

    @property
    def is_projection(self) -> bool:
        """Whether the map is a projection onto a convex set (ReLU, identity)."""
        return ACTIVATIONS[self.name][1]

    @property
    def smooth(self) -> bool:
        """ReLU has a kink at 0 (``opsplit.adaptive`` refuses it)."""
        return self.name != "relu"

    def flow(self, t, dt: float, u: Tensor, grid: Grid) -> Tensor:
        return self.fn(u)

    def extra_repr(self) -> str:
        return f"{self.name!r}" + ("" if self.is_projection else " (not a projection)")

