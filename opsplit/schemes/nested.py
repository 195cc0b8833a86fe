r"""A scheme as one substep of another scheme: a splitting inside a splitting.

:class:`SchemeFlow` wraps a scheme :math:`\Psi` as an operator whose exact flow over
:math:`[t, t + \Delta t]` is one step :math:`\Psi_{\Delta t}` (each of its substeps
keeps its own clock from :math:`t`).  An outer scheme then treats the inner scheme's
terms as one term: for instance

.. code-block:: python

    Strang([Substep(norm, CatchUp()), Substep(SchemeFlow(BlanesMoan(projected)), Exact())])

keeps the :math:`S_1` projection (which cannot run backwards) in an outer Strang step and
runs the fourth-order composition, with its negative substeps, on the smooth terms only
(one of the options of ``docs/schemes.md`` for the projected model).  The outer scheme's
order bounds the result: :math:`\min(2, 4) = 2` here, and that is what is measured when
the set :math:`S_1(\sigma(t))` moves (``docs/work_precision.md``); with :math:`\sigma`
constant the catching-up step is the identity on the manifold after the first step and
the inner order shows.  Like :class:`~opsplit.schemes.Relaxation` it composes substeps,
so it lives with the schemes.  Its substep calls are counted as those of the inner
substeps (:mod:`opsplit.solution`).
"""

from __future__ import annotations

from torch import Tensor

from ..grid import Grid
from ..operators.base import Operator
from .base import Scheme, changes_grid, irreversibility

__all__ = ["SchemeFlow"]


class SchemeFlow(Operator):
    """One step of ``scheme`` as the exact flow of a single term (module docstring).

    Args:
        scheme: a :class:`~opsplit.schemes.Scheme` on one grid (no grid transfers; a
            :class:`~opsplit.schemes.Hybrid` without them is accepted).
    """

    has_flow = True
    default_solver = "exact"

    def __init__(self, scheme: Scheme):
        super().__init__()
        self.scheme = scheme

    def __setattr__(self, name, value):
        if name == "scheme":  # checked at construction and whenever it is set
            if not isinstance(value, Scheme):
                raise TypeError(f"SchemeFlow.scheme: expected an opsplit Scheme, got {type(value).__name__}")
            moving = [type(s.terms[0]).__name__ for s in value.modules() if hasattr(s, "terms") and changes_grid(s)]
            if moving:
                raise ValueError(
                    f"SchemeFlow: {type(value).__name__} moves the state to another grid (grid transfer "
                    f"{moving[0]}); a substep's state stays on its grid"
                )
        super().__setattr__(name, value)

    @property
    def order(self) -> int:
        """The inner scheme's ``effective_order``."""
        return self.scheme.effective_order

    @property
    def reversible(self) -> bool:
        """Whether every inner substep can run over a negative time step."""
        return all(irreversibility(s) is None for s in self.scheme.substeps)

    def check(self, grid: Grid) -> None:
        self.scheme.check(grid)

    def flow(self, t, dt: float, u: Tensor, grid: Grid) -> Tensor:
        return self.scheme.step(t, dt, u, grid)

    def extra_repr(self) -> str:
        return f"{type(self.scheme).__name__}, order={self.order}"
