r"""Three ways to get :math:`\nabla_\theta J`, chosen by one argument.

``"backprop"``  — *discretise, then optimise*: reverse-mode autograd through the discrete
    propagator :math:`\bar{\mathcal N}_{\bar\theta}` (eq. 12).  The gradient is the exact
    gradient of the discrete objective; memory holds every intermediate of every step, so
    it grows linearly in :math:`N_t` with the full per-step footprint (attention weights,
    solver stages, ...).

``"checkpoint"`` — the same gradient (the chain rule of the same discrete map; round-off
    may differ in the last bits), computed without keeping the intermediates of the time
    loop.  With ``snapshots = s`` (the default, :data:`DEFAULT_SNAPSHOTS`) the forward pass
    keeps at most :math:`s` states of blocks of ``checkpoint_every`` steps and the backward
    pass recomputes the others from them (binomial checkpointing, :mod:`opsplit.revolve`):
    memory bounded independently of :math:`N_t`, at the cost of recomputing each block at
    most :math:`r` times, :math:`\binom{s + r}{s} \ge N_t/k`.  With ``snapshots=None``:
    ``torch.utils.checkpoint`` around every block, one stored state per block (memory
    linear in :math:`N_t`, one extra forward pass).

``"adjoint"``  — *optimise, then discretise*: the substeps that are smooth ODEs are solved
    by ``torchdiffeq.odeint_adjoint`` (the :class:`~opsplit.solvers.ODESolve` substeps,
    switched to ``adjoint=True``), and the unsplit reference (:class:`Unsplit`) by
    ``odeint_adjoint`` between its breakpoints.  The gradient of each such substep is the
    solution of the continuous adjoint equation
    :math:`\dot\lambda = -\lambda^\top \partial_u A`,
    :math:`\dot\mu = -\lambda^\top \partial_\theta A`, integrated backwards by the same
    method: it agrees with backprop up to the discretisation error of the adjoint solve,
    which vanishes as :math:`\Delta t \to 0` at the method's order (test:
    ``tests/test_control_gradients.py``).  Projections (:math:`S_1`, :math:`S_2`),
    relaxations and other discrete maps are differentiated per step by autograd (their
    Jacobians are exact).  A substep's adjoint solve needs the substep's initial state;
    a projection cannot be run backwards (it is not invertible), so these states are not
    reconstructed by integrating backwards across steps: with ``snapshots = s`` (default)
    they are recomputed from at most :math:`s` stored states exactly as in
    ``"checkpoint"`` (memory bounded independently of :math:`N_t` and of the solver's
    inner steps); with ``snapshots=None`` every substep's endpoints are stored (memory
    linear in :math:`N_t`, independent of the inner steps).  Both give the same gradient.

:func:`set_gradient_mode` configures a model for a mode and returns what it changed;
:func:`gradient_mode` is the same as a context manager that restores the previous setting.
"""

from __future__ import annotations

import contextlib

from torch import Tensor, nn

from .._checks import check_choice
from ..propagator import Propagator
from ..reference import solve_reference, unsplit_terms
from ..solvers.base import Solver, Substep
from ..solvers.odeint import ODESolve

__all__ = ["GRADIENT_MODES", "DEFAULT_SNAPSHOTS", "set_gradient_mode", "gradient_mode", "ode_solvers", "Unsplit"]

#: the gradient modes
GRADIENT_MODES = ("backprop", "checkpoint", "adjoint")
#: default snapshot budget of the "checkpoint" and "adjoint" modes (stored states)
DEFAULT_SNAPSHOTS = 8


def _solvers_of(solver: Solver, seen: set):
    if id(solver) in seen:
        return
    seen.add(id(solver))
    yield solver
    for v in vars(solver).values():
        if isinstance(v, Solver):
            yield from _solvers_of(v, seen)


def ode_solvers(model: nn.Module) -> list[ODESolve]:
    """The :class:`~opsplit.solvers.ODESolve` solvers used by ``model``'s substeps (each
    once), including those wrapped by other solvers and the solver of :class:`Unsplit`."""
    seen: set = set()
    out = []
    for m in model.modules():
        solvers = []
        if isinstance(m, Substep):
            solvers.append(m.solver)
        if isinstance(m, Unsplit):
            solvers.append(m.solver)
        for s in solvers:
            for x in _solvers_of(s, seen):
                if isinstance(x, ODESolve):
                    out.append(x)
    return out


def _check_snapshots(snapshots):
    if snapshots is None:
        return None
    if isinstance(snapshots, bool) or not isinstance(snapshots, int) or snapshots < 1:
        raise ValueError(f"snapshots: expected an integer >= 1 (stored states) or None, got {snapshots!r}")
    return snapshots


def _check_mode(mode, checkpoint_every) -> int:
    check_choice(mode, GRADIENT_MODES, "gradient")
    if isinstance(checkpoint_every, bool) or not isinstance(checkpoint_every, int) or checkpoint_every < 1:
        raise ValueError(f"checkpoint_every: expected an integer >= 1 (steps per block), got {checkpoint_every!r}")
    return checkpoint_every


def set_gradient_mode(model: nn.Module, mode: str, *, checkpoint_every: int = 1,
                      snapshots: int | None = DEFAULT_SNAPSHOTS) -> dict:
    """Configure ``model`` to compute gradients by ``mode`` (:data:`GRADIENT_MODES`).

    Sets :attr:`~opsplit.Propagator.checkpoint_every` and
    :attr:`~opsplit.Propagator.checkpoint_snapshots` on every propagator of the model
    (``"checkpoint"``: ``checkpoint_every`` steps per block, ``snapshots`` stored block
    states or ``None`` for one per block; ``"adjoint"``: the same with a snapshot budget,
    checkpointing off with ``snapshots=None``; ``"backprop"``: off) and ``adjoint`` on
    every :class:`~opsplit.solvers.ODESolve` of its substeps and of :class:`Unsplit`
    (``True`` in ``"adjoint"`` mode only).  Returns the previous settings (for
    :func:`gradient_mode` to restore).

    Raises ``ValueError`` before changing anything when the mode cannot apply: no propagator
    for ``"checkpoint"``; no smooth ODE substep (``ODESolve``) and no :class:`Unsplit` for
    ``"adjoint"``.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"set_gradient_mode.model: expected an nn.Module, got {type(model).__name__}")
    k = _check_mode(mode, checkpoint_every)
    snapshots = _check_snapshots(snapshots)
    props = [m for m in model.modules() if isinstance(m, Propagator)]
    odes = ode_solvers(model)
    if mode == "checkpoint" and not props:
        raise ValueError(
            "gradient='checkpoint': the model holds no opsplit Propagator whose time loop could be "
            "checkpointed"
        )
    if mode == "adjoint" and not odes:
        raise ValueError(
            "gradient='adjoint': the model has no smooth ODE substep to solve by the continuous "
            "adjoint; give its smooth terms an ODESolve solver (Substep(op, ODESolve('rk4'))) or "
            "train the unsplit reference (opsplit.control.Unsplit)"
        )
    previous = {
        "propagators": [(p, p.checkpoint_every, p.checkpoint_snapshots) for p in props],
        "ode_solvers": [(s, s.adjoint) for s in odes],
    }
    for p in props:
        if mode == "checkpoint" or (mode == "adjoint" and snapshots is not None):
            p.checkpoint_every, p.checkpoint_snapshots = k, snapshots
        else:
            p.checkpoint_every, p.checkpoint_snapshots = 0, None
    for s in odes:
        s.adjoint = mode == "adjoint"
    return previous


def restore_gradient_mode(previous: dict) -> None:
    for p, k, s in previous["propagators"]:
        p.checkpoint_every, p.checkpoint_snapshots = k, s
    for s, v in previous["ode_solvers"]:
        s.adjoint = v


@contextlib.contextmanager
def gradient_mode(model: nn.Module, mode: str, *, checkpoint_every: int = 1,
                  snapshots: int | None = DEFAULT_SNAPSHOTS):
    """``with gradient_mode(model, "adjoint"): loss.backward()`` — :func:`set_gradient_mode`
    for the block, previous settings restored after."""
    previous = set_gradient_mode(model, mode, checkpoint_every=checkpoint_every, snapshots=snapshots)
    try:
        yield model
    finally:
        restore_gradient_mode(previous)


class Unsplit(nn.Module):
    r"""The unsplit continuous model :math:`\mathcal N_\theta: f \mapsto u(T)` of eq. (9),
    solved by :func:`opsplit.reference.solve_reference` (torchdiffeq), as a trainable
    module: the objective of eq. (10) rather than (12).

    Args:
        propagator: the :class:`~opsplit.Propagator` whose smooth terms (and :math:`S_1`
            constraint) define the model; its controls are this module's parameters.
        method, rtol, atol, options: passed to torchdiffeq (``"dopri5"`` adaptive by
            default; a fixed-grid method with ``options={"step_size": h}`` for a fixed
            discretisation of the forward and adjoint solves).
        adjoint: gradients by ``odeint_adjoint`` (set by :func:`set_gradient_mode`).
    """

    def __init__(self, propagator: Propagator, *, method: str = "dopri5", rtol: float = 1e-6,
                 atol: float = 1e-8, options: dict | None = None, adjoint: bool = False):
        super().__init__()
        if not isinstance(propagator, Propagator):
            raise TypeError(f"Unsplit.propagator: expected an opsplit Propagator, got {type(propagator).__name__}")
        unsplit_terms(propagator)  # raises for terms without an ODE meaning
        self.propagator = propagator
        # one ODESolve carries the settings (so set_gradient_mode finds and switches it)
        self.solver = ODESolve(method, rtol=rtol, atol=atol, options=options, adjoint=adjoint)

    def forward(self, f: Tensor) -> Tensor:
        s = self.solver
        return solve_reference(self.propagator, f, method=s.method, rtol=s.rtol, atol=s.atol,
                               options=s.options or None, adjoint=s.adjoint)

    def extra_repr(self) -> str:
        return f"solver={self.solver!r}"
