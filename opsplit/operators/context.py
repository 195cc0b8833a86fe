r"""Call-time inputs of attention operators: masks (measures on :math:`\Omega_x`) and a
second state (the memory of encoder–decoder attention).

An attention integral :math:`\int_{\Omega_x} \gamma(x, \tilde x)\, V(\tilde x, y)\, d\tilde x`
integrates against a measure on the key domain.  Everything that torch calls a *mask*
is a change of that measure, made per call:

* a **key-padding mask** removes the padded tokens of each sample from the key domain
  (their quadrature weight becomes 0, i.e. :math:`\log w = -\infty`): the sample's
  sequence is shorter;
* a **causal mask** (seed 000, eq. 9) restricts the integral to :math:`\tilde x \le x`:
  the attention becomes a Volterra operator;
* a **float mask** :math:`m(x, \tilde x)` multiplies the measure by :math:`e^{m}`, so
  :math:`\mathrm{Softmax}_2(s + m)` integrates against :math:`e^{m(x,\cdot)} d\tilde x`.

Encoder–decoder attention (seed 000, eq. 12) reads a second function, the memory
:math:`m(s, y)` on its own domain :math:`\Omega_s \times \Omega_y`, that is fixed while
the decoder evolves (the coupled system :math:`u_t = \dots + A(u; m)`, :math:`m_t = 0`).

These inputs change with every call but not with the time step, so they ride on the grid
that the propagator hands to every substep: a :class:`ContextGrid` is a
:class:`~opsplit.grid.Grid` with a read-only mapping ``context``.  Operators are told at
construction which keys they read (e.g. ``key_padding_mask="src_key_padding_mask"``), so
the data flow is explicit: no operator keeps per-call state, and a solve is re-entrant.
A ``ContextGrid`` also keeps a per-call cache, so a merged mask is built once per solve
and not once per step.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from ..grid import Grid

__all__ = ["ContextGrid", "context_value", "cached"]


@dataclass(frozen=True)
class ContextGrid(Grid):
    """A :class:`~opsplit.grid.Grid` with call-time inputs for the operators.

    Args:
        x, y, h: as :class:`~opsplit.grid.Grid`.
        context: mapping from names to call-time inputs (masks, memory, ...).

    ``ContextGrid.of(grid, **context)`` adds inputs to an existing grid.  Node counts read
    from data (``with_shape``) keep the context.
    """

    context: Mapping[str, Any] = field(default_factory=dict, compare=False, hash=False, repr=False)
    _cache: dict = field(default_factory=dict, compare=False, hash=False, repr=False, init=False)

    def __post_init__(self):
        super().__post_init__()
        if not isinstance(self.context, Mapping):
            raise TypeError(
                f"ContextGrid.context: expected a mapping of names to inputs, got "
                f"{type(self.context).__name__}"
            )
        object.__setattr__(self, "context", MappingProxyType(dict(self.context)))
        object.__setattr__(self, "_cache", {})

    @classmethod
    def of(cls, grid: Grid, **context) -> ContextGrid:
        """``grid`` with the inputs ``context`` (merged over any it already has)."""
        if not isinstance(grid, Grid):
            raise TypeError(f"ContextGrid.of: expected an opsplit Grid, got {type(grid).__name__}")
        merged = dict(getattr(grid, "context", {}))
        merged.update(context)
        return cls(x=grid.x, y=grid.y, h=grid.h, context=merged)

    def __str__(self) -> str:
        keys = ", ".join(sorted(k for k, v in self.context.items() if v is not None))
        return super().__str__()[:-1] + f", context=[{keys}])"


def context_value(grid: Grid, key: str | None):
    """The input ``key`` of ``grid`` (``None`` when the key or the context is absent)."""
    if key is None:
        return None
    ctx = getattr(grid, "context", None)
    if ctx is None:
        return None
    return ctx.get(key)


def cached(grid: Grid, key, build: Callable[[], Any]):
    """``build()`` once per call: memoised on a :class:`ContextGrid`, rebuilt on a plain
    grid (which carries no per-call inputs, so there is nothing worth caching)."""
    cache = getattr(grid, "_cache", None)
    if cache is None:
        return build()
    if key not in cache:
        cache[key] = build()
    return cache[key]
