r"""The propagator: the composed map :math:`f \mapsto u(T)`.

Paper 002, eq. (9) and §3.1: the continuous transformer is the map
:math:`\mathcal N_\theta : f \mapsto u(\cdot, \cdot, T)`, approximated on the time grid
:math:`t^n = t_0 + n\Delta t`, :math:`\Delta t = (T - t_0)/N_t`, by

.. math::  u^{N_t} = \bar{\mathcal N}^{N_t} \circ \dots \circ \bar{\mathcal N}^1 (f),

where each one-step propagator :math:`\bar{\mathcal N}^n` is one step of a splitting
scheme.  :class:`Propagator` is that map as an ``nn.Module``; its parameters are the
controls held by the scheme's operators.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from ._checks import (
    check_finite,
    check_finite_float,
    check_float_dtype,
    check_like_module,
    check_parameters_finite,
    check_positive_int,
    check_tensor,
)
from .grid import Grid, check_grid
from .schemes.base import Scheme, changes_grid

__all__ = ["Propagator"]


class Propagator(nn.Module):
    """:math:`f \\mapsto u(T)` by ``n_steps`` steps of ``scheme`` on ``[t0, t1]``.

    Args:
        scheme: a :class:`~opsplit.schemes.Scheme` (e.g. :class:`~opsplit.schemes.Lie`).
        n_steps: :math:`N_t \\ge 1`.
        t0, t1: the time interval, finite, ``t0 < t1``; ``t1`` defaults to ``t0 + n_steps``
            (:math:`\\Delta t = 1`, the paper's choice).
        grid: the spatial :class:`~opsplit.grid.Grid`; ``None`` is ``Grid.paper`` with node
            counts read from the input (``L = N``).  Node counts left open in the grid are
            read from the input.

    ``forward(f)`` takes ``f`` of shape ``(B, N_x, N_y)`` (or ``(N_x, N_y)``, unbatched) and
    returns :math:`u^{N_t}` of the same shape.

    ``checkpoint_every`` (attribute, default ``0``): gradient checkpointing of the time
    loop.  ``0`` keeps every intermediate of every step for the backward pass (plain
    backpropagation); ``k >= 1`` keeps only the state at the start of each block of ``k``
    steps and recomputes the block during the backward pass (``torch.utils.checkpoint``,
    non-reentrant, RNG state preserved, so dropout masks are the same in the recomputation).
    Used only when autograd records and no trajectory is asked for.  Set by
    ``opsplit.control`` (``gradient="checkpoint"``).

    **Validation** (once per call, never per substep): ``f`` is a floating tensor of rank 2
    or 3 whose shape fits the grid, on the dtype and device of the parameters, with at
    least one token and one feature; the parameters and ``f`` are finite; every operator
    checks its controls against the grid; and the result is checked to be finite (NaN/inf
    from finite input means an intermediate left the float range: the error says so).
    The value checks (finiteness) are skipped under ``torch.compile`` and ``torch.jit``
    tracing (see :mod:`opsplit._checks`) and with ``check_finite_input=False``.

    **Saving and loading.**  Save the parameters, not the module:
    ``torch.save(model.state_dict(), path)``, then build the same model (same constructor
    arguments) and ``model.load_state_dict(torch.load(path))`` — this works with
    ``torch.load``'s default ``weights_only=True``.  Pickling the whole module
    (``torch.save(model)``) stores opsplit's classes by reference and needs
    ``torch.load(..., weights_only=False)``, i.e. trusting the file.
    """

    #: gradient checkpointing of the time loop: 0 off, k >= 1 blocks of k steps
    checkpoint_every: int = 0

    def __init__(
        self,
        scheme: Scheme,
        n_steps: int,
        *,
        t0: float = 0.0,
        t1: float | None = None,
        grid: Grid | None = None,
    ):
        super().__init__()
        if not isinstance(scheme, Scheme):
            raise TypeError(f"Propagator.scheme: expected an opsplit Scheme, got {type(scheme).__name__}")
        self.scheme = scheme
        self.n_steps = check_positive_int(n_steps, "Propagator.n_steps (N_t)")
        self.t0 = check_finite_float(t0, "Propagator.t0")
        if t1 is None:
            self.t1 = float(self.t0 + self.n_steps)
        else:
            self.t1 = check_finite_float(t1, "Propagator.t1 (T)")
            if self.t1 <= self.t0:
                raise ValueError(f"Propagator.t1 (T): expected t0 < t1, got t0={t0}, t1={t1}")
        self.grid = check_grid(grid, "Propagator.grid") or Grid.paper(None, None)

    @property
    def T(self) -> float:
        return self.t1

    def dt(self, n_steps: int | None = None) -> float:
        """:math:`\\Delta t = (t_1 - t_0)/N_t`."""
        n = self.n_steps if n_steps is None else check_positive_int(n_steps, "n_steps (N_t)")
        return (self.t1 - self.t0) / n

    def times(self, n_steps: int | None = None) -> list[float]:
        """The time grid :math:`t^0, \\dots, t^{N_t}`."""
        n = self.n_steps if n_steps is None else check_positive_int(n_steps, "n_steps (N_t)")
        return [self.t0 + (self.t1 - self.t0) * k / n for k in range(n + 1)]

    def resolve_grid(self, f: Tensor, grid: Grid | None = None) -> Grid:
        g = self.grid if grid is None else check_grid(grid, "grid")
        g.check_shape(f.shape[-2:], "f")
        return g.with_shape(f.shape[-2], f.shape[-1], "f")

    def forward(
        self,
        f: Tensor,
        *,
        n_steps: int | None = None,
        grid: Grid | None = None,
        return_trajectory: bool = False,
        check_finite_input: bool = True,
    ):
        """Solve from :math:`u(t_0) = f` to :math:`t_1`.

        Args:
            f: initial state, ``(B, N_x, N_y)`` or ``(N_x, N_y)``.
            n_steps: override :math:`N_t` (the controls are functions of continuous time,
                so a model built with one :math:`N_t` can be solved with another).
            grid: override the grid (same domains at another resolution, for controls that
                can be evaluated there).
            return_trajectory: also return the states at :math:`t^0, \\dots, t^{N_t}`
                stacked on a new dimension 1 (after the batch).
            check_finite_input: reject NaN/inf in ``f`` and in the parameters, and raise if
                the solve produces NaN/inf (one reduction each; the parameters are
                re-checked only after they change).
        """
        f = check_tensor(f, "f")
        check_float_dtype(f, "f")
        unbatched = f.dim() == 2
        if unbatched:
            f = f.unsqueeze(0)
        if f.dim() != 3:
            g0 = self.grid if grid is None else check_grid(grid, "grid")
            raise ValueError(
                f"f: expected shape (B, N_x, N_y) = (B, {g0.nx_str}, {g0.ny_str}) or unbatched "
                f"(N_x, N_y), got rank {f.dim()} with shape {tuple(f.shape)}"
            )
        check_like_module(f, self, "f", f"the {type(self).__name__}")
        g = self.resolve_grid(f, grid)
        times = self.times(n_steps)
        if check_finite_input:
            check_finite(f, "f")
            check_parameters_finite(self, type(self).__name__)
        if return_trajectory and any(changes_grid(s) for s in self.scheme.substeps):
            raise ValueError(
                f"return_trajectory: {type(self.scheme).__name__} may move the state to other grids (grid "
                "transfers), so its states cannot be stacked; solve step by step with scheme.advance instead"
            )
        self.scheme.check(g)
        u = f
        traj = [u] if return_trajectory else None
        if self.checkpoint_every and traj is None and torch.is_grad_enabled():
            u, g = _checkpointed_steps(self.scheme, times, u, g, int(self.checkpoint_every))
        else:
            for n in range(len(times) - 1):
                # a scheme with grid transfers returns the grid of the new state (Scheme.advance)
                u, g = self.scheme.advance(times[n], times[n + 1] - times[n], u, g)
                if traj is not None:
                    traj.append(u)
        if check_finite_input:
            check_finite(
                u, f"{type(self).__name__} output",
                f"produced from a finite input and finite parameters: an intermediate value "
                f"left the range of {u.dtype}; scale the input down or use float64",
            )
        if unbatched:
            u = u.squeeze(0)
        if not return_trajectory:
            return u
        trajectory = torch.stack(traj, dim=1)
        if unbatched:
            trajectory = trajectory.squeeze(0)
        return u, trajectory

    def extra_repr(self) -> str:
        s = (
            f"n_steps={self.n_steps}, t=[{self.t0:g}, {self.t1:g}], dt={self.dt():g}, "
            f"grid={self.grid}"
        )
        if self.checkpoint_every:
            s += f", checkpoint_every={self.checkpoint_every}"
        return s


def _checkpointed_steps(scheme: Scheme, times, u: Tensor, grid: Grid, k: int):
    """The time loop with ``torch.utils.checkpoint`` around every block of ``k`` steps: the
    backward pass stores one state per block and recomputes the block's steps.  Returns
    ``(u, grid)``: the grid is threaded as in :meth:`Scheme.advance` (it is computed from
    the grid alone, :meth:`Scheme.output_grid`, so it need not cross the checkpoint)."""
    from torch.utils.checkpoint import checkpoint

    def block(u, a, b, g):
        for n in range(a, b):
            u, g = scheme.advance(times[n], times[n + 1] - times[n], u, g)
        return u

    n = len(times) - 1
    for a in range(0, n, k):
        b = min(a + k, n)
        u = checkpoint(block, u, a, b, grid, use_reentrant=False)
        for _ in range(a, b):
            grid = scheme.output_grid(grid)
    return u, grid

    n = len(times) - 1
    for a in range(0, n, k):
        u = checkpoint(block, u, a, min(a + k, n), use_reentrant=False)
    return u
