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

import contextlib
from collections import OrderedDict

import torch
from torch import Tensor, nn
from torch.utils.hooks import RemovableHandle

from ._checks import (
    check_finite,
    check_finite_float,
    check_float_dtype,
    check_int,
    check_like_module,
    check_parameters_finite,
    check_positive_int,
    check_tensor,
    skip_value_checks,
)
from ._memory import FLOAT_LIST_ENTRY, GUARD_FROM, check_fits, steps_memory
from .adaptive import (
    ON_FAILURE,
    PIController,
    _estimator,
    _stops,
    check_adaptive,
    solve_adaptive,
    time_tolerance,
)
from .grid import Grid, check_grid
from .revolve import checkpointed_steps as _checkpointed_steps
from .revolve import revolve_steps
from .schemes.base import Scheme, changes_grid
from .solution import Solution, SolveStats, count_substep_calls

__all__ = ["Propagator", "AdaptivePropagator"]


def _steps_name(n_steps) -> str:
    """The argument a size guard names: the call's ``n_steps`` or the propagator's own."""
    return "Propagator.n_steps (N_t)" if n_steps is None else "n_steps (N_t)"


def _calls_per_step(scheme) -> int:
    """Substep calls per step (a lower bound for schemes that do not count them)."""
    n = getattr(scheme, "n_calls", None)
    return int(n) if isinstance(n, int) and n > 0 else max(1, len(scheme.substeps))


def _check_t0(prop, v):
    v = check_finite_float(v, "Propagator.t0")
    t1 = prop.__dict__.get("t1")
    if t1 is not None and not v < t1:
        raise ValueError(f"Propagator.t0: expected t0 < t1 = {t1:g}, got t0={v:g} (to move the interval past t1, "
                         "set t1 first)")
    return v


def _check_t1(prop, v):
    v = check_finite_float(v, "Propagator.t1 (T)")
    t0 = prop.__dict__.get("t0")
    if t0 is not None and not t0 < v:
        raise ValueError(f"Propagator.t1 (T): expected t0 < t1, got t0={t0:g}, t1={v:g}")
    return v


def _check_scheme(prop, v):
    if not isinstance(v, Scheme):
        raise TypeError(f"{type(prop).__name__}.scheme: expected an opsplit Scheme, got {type(v).__name__}")
    return v


def _check_snapshots(prop, v):
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int):
        raise TypeError(f"Propagator.checkpoint_snapshots: expected None or an integer >= 1, got {v!r}")
    if v < 1:
        raise ValueError(f"Propagator.checkpoint_snapshots: expected None or an integer >= 1, got {v}")
    return v


#: the checks of the attributes a user may set, at construction and after it (``prop.n_steps =
#: 0`` raises like ``Propagator(scheme, 0)``): ``check(propagator, value) -> value``
_SETTABLE = {
    "n_steps": lambda p, v: check_positive_int(v, "Propagator.n_steps (N_t)"),
    "t0": _check_t0,
    "t1": _check_t1,
    "grid": lambda p, v: check_grid(v, "Propagator.grid") or Grid.paper(None, None),
    "scheme": _check_scheme,
    "checkpoint_every": lambda p, v: check_int(v, "Propagator.checkpoint_every", 0),
    "checkpoint_snapshots": _check_snapshots,
}


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
    ``opsplit.control`` (``gradient="checkpoint"`` and ``"adjoint"``).

    ``checkpoint_snapshots`` (attribute, default ``None``): with ``checkpoint_every >= 1``,
    ``None`` stores one state per block (memory linear in :math:`N_t`); ``s >= 1`` stores
    at most ``s`` block states whatever :math:`N_t` and recomputes the others from them
    during the backward pass (binomial checkpointing, :mod:`opsplit.revolve`: memory
    bounded independently of :math:`N_t`, each block evaluated at most :math:`r` times without
    a graph and once with one, :math:`\\binom{s + r}{s} \\ge N_t / k`; :func:`opsplit.revolve.revolve_cost` counts
    the evaluations).  It differentiates the scheme's own parameters and buffers.

    **Validation** (once per call, never per substep): ``f`` is a floating tensor of rank 2
    or 3 whose shape fits the grid, on the dtype and device of the parameters, with at
    least one token and one feature; the parameters and ``f`` are finite; every operator
    checks its controls against the grid; and the result is checked to be finite (NaN/inf
    from finite input means an intermediate left the float range: the error says so).
    The value checks (finiteness) are skipped under ``torch.compile`` and ``torch.jit``
    tracing (see :mod:`opsplit._checks`) and with ``check_finite_input=False``.

    **Attributes stay valid.**  ``n_steps``, ``t0``, ``t1``, ``grid``, ``scheme``,
    ``checkpoint_every`` and ``checkpoint_snapshots`` are checked whenever they are set, as
    by the constructor (``prop.n_steps = 0`` raises a ``ValueError`` naming
    ``Propagator.n_steps``; ``prop.t1 = t`` needs ``t0 < t``: to move the interval past
    ``t1``, set ``t1`` first).

    **Saving and loading.**  Save the parameters, not the module:
    ``torch.save(model.state_dict(), path)``, then build the same model (same constructor
    arguments) and ``model.load_state_dict(torch.load(path))`` — this works with
    ``torch.load``'s default ``weights_only=True``.  Pickling the whole module
    (``torch.save(model)``) stores opsplit's classes by reference and needs
    ``torch.load(..., weights_only=False)``, i.e. trusting the file.
    """

    #: gradient checkpointing of the time loop: 0 off, k >= 1 blocks of k steps
    checkpoint_every: int = 0
    #: binomial checkpointing: at most this many stored block states (None: one per block)
    checkpoint_snapshots: int | None = None

    def __setattr__(self, name, value):
        # ``n_steps``, ``t0``, ``t1``, ``grid``, ``scheme`` and the checkpointing attributes
        # are checked whenever they are set, as in the constructor: a propagator stays valid
        check = _SETTABLE.get(name)
        if check is not None:
            value = check(self, value)
        super().__setattr__(name, value)

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
        self.n_steps = n_steps
        self.t0 = t0
        self.t1 = float(self.t0 + self.n_steps) if t1 is None else t1
        self.grid = grid
        self._step_hooks: OrderedDict = OrderedDict()

    def register_step_hook(self, hook):
        """Call ``hook(propagator, t, dt, u_before, u_after, grid)`` after every step of
        :meth:`forward`'s time loop (fixed steps; not the adaptive solve; ``grid`` is the grid
        of ``u_after``): what a running
        cost on the trajectory reads (:mod:`opsplit.control.flow_costs`), recorded by
        autograd like the step itself.  A propagator with step hooks refuses the
        checkpointed time loop (its recomputation would call them again).  Returns a handle
        whose ``remove()`` unregisters the hook."""
        if not callable(hook):
            raise TypeError(f"Propagator.register_step_hook: expected a callable, got {type(hook).__name__}")
        handle = RemovableHandle(self._step_hooks)
        self._step_hooks[handle.id] = hook
        return handle

    @property
    def T(self) -> float:
        return self.t1

    def dt(self, n_steps: int | None = None) -> float:
        """:math:`\\Delta t = (t_1 - t_0)/N_t`."""
        n = self.n_steps if n_steps is None else check_positive_int(n_steps, "n_steps (N_t)")
        return (self.t1 - self.t0) / n

    def times(self, n_steps: int | None = None) -> list[float]:
        """The time grid :math:`t^0, \\dots, t^{N_t}` (refused, naming ``n_steps``, when its
        :math:`N_t + 1` Python floats do not fit in the available memory)."""
        n = self.n_steps if n_steps is None else check_positive_int(n_steps, "n_steps (N_t)")
        if FLOAT_LIST_ENTRY * (n + 1.0) >= GUARD_FROM and not skip_value_checks():
            need, parts = steps_memory(n)
            check_fits(_steps_name(n_steps), need, f"N_t = {n} steps", "a smaller n_steps", parts=parts)
        return [self.t0 + (self.t1 - self.t0) * k / n for k in range(n + 1)]

    def _steps_memory(self, n_steps: int, state_bytes: float, *, grad: bool, trajectory: bool = False):
        """A lower bound of the memory a solve of ``n_steps`` steps on a state of
        ``state_bytes`` bytes holds at its peak, with its parts in words
        (:func:`opsplit._memory.steps_memory`): the time grid, the trajectory, and what
        autograd keeps (``grad``: one state per substep call, or the checkpointed loop's
        stored states)."""
        every, snaps = int(self.checkpoint_every or 0), self.checkpoint_snapshots
        stored = None
        if grad and every and not trajectory:
            stored = min(-(-n_steps // every), snaps) if snaps is not None else -(-n_steps // every)
        return steps_memory(n_steps, state_bytes=state_bytes, calls_per_step=_calls_per_step(self.scheme),
                            grad=grad, stored_states=stored, trajectory=trajectory)

    def _check_steps_fit(self, n_steps, f: Tensor, trajectory: bool) -> None:
        """Refuse, before the time grid is made, a solve of ``n_steps`` (``None``: the
        propagator's own) whose memory cannot fit (:func:`opsplit._memory.check_fits`)."""
        n = self.n_steps if n_steps is None else check_positive_int(n_steps, "n_steps (N_t)")
        if n < 1024 or skip_value_checks():
            return  # (a loop this short never holds GUARD_FROM bytes beyond its states)
        grad = torch.is_grad_enabled() and (f.requires_grad or any(p.requires_grad for p in self.parameters()))
        need, parts = self._steps_memory(n, float(f.numel() * f.element_size()), grad=grad, trajectory=trajectory)
        calls = n * _calls_per_step(self.scheme)
        check_fits(_steps_name(n_steps), need, f"N_t = {n} steps of {type(self.scheme).__name__} on a state "
                   f"{tuple(f.shape)}", "a smaller n_steps", parts=parts, work=f"{calls:.3g} substep calls")

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
        if n_steps is None:
            out = self._forward_own_steps(f, grid, return_trajectory, check_finite_input)
            if out is not None:
                return out
        f, g, unbatched = self._prepare(f, grid, check_finite_input)
        self._check_steps_fit(n_steps, f, return_trajectory)
        times = self.times(n_steps)
        if return_trajectory and any(changes_grid(s) for s in self.scheme.substeps):
            raise ValueError(
                f"return_trajectory: {type(self.scheme).__name__} may move the state to other grids (grid "
                "transfers), so its states cannot be stacked; solve step by step with scheme.advance instead"
            )
        traj = [f] if return_trajectory else None
        with self._parameters_named_on_error(check_finite_input):
            u = self._time_loop(f, g, times, traj)
        if check_finite_input:
            self._check_output(u)
        if unbatched:
            u = u.squeeze(0)
        if not return_trajectory:
            return u
        trajectory = torch.stack(traj, dim=1)
        if unbatched:
            trajectory = trajectory.squeeze(0)
        return u, trajectory

    def _forward_own_steps(self, f: Tensor, grid: Grid | None, return_trajectory: bool, check_finite_input: bool):
        """``forward`` without ``n_steps``: ``None`` here (the propagator's own :math:`N_t`
        fixed steps); a subclass that solves otherwise returns what ``forward`` returns."""
        return None

    def _time_loop(self, u: Tensor, g: Grid, times: list, traj: list | None) -> Tensor:
        """The steps of :meth:`forward` from ``u`` on ``times`` (checkpointed when asked for),
        the states appended to ``traj`` when given; the step hooks called after each step."""
        hooks = getattr(self, "_step_hooks", None)
        if self.checkpoint_every and traj is None and torch.is_grad_enabled():
            if hooks:
                raise ValueError(
                    f"{type(self).__name__}: step hooks (a running cost on the trajectory) and the checkpointed "
                    "time loop (gradient='checkpoint' / 'adjoint' with snapshots) exclude each other: the "
                    "recomputed steps would be counted again; train with gradient='backprop'")
            if self.checkpoint_snapshots is None:
                u, g = _checkpointed_steps(self.scheme, times, u, g, int(self.checkpoint_every))
            else:
                u, g = revolve_steps(self.scheme, times, u, g, int(self.checkpoint_every),
                                     int(self.checkpoint_snapshots))
            return u
        for n in range(len(times) - 1):
            # a scheme with grid transfers returns the grid of the new state (Scheme.advance)
            before = u
            u, g = self.scheme.advance(times[n], times[n + 1] - times[n], u, g)
            if hooks:
                for hook in list(hooks.values()):
                    hook(self, times[n], times[n + 1] - times[n], before, u, g)
            if traj is not None:
                traj.append(u)
        return u

    @contextlib.contextmanager
    def _parameters_named_on_error(self, check: bool):
        """A ``ValueError`` raised inside the solve (a check of an operator that saw a NaN
        written through ``.data``, which the cached parameter check misses) is preceded, when
        ``check``, by a fresh read of every parameter, which names such a parameter."""
        try:
            yield
        except ValueError:
            if check:
                check_parameters_finite(self, type(self).__name__, fresh=True)
            raise

    def _prepare(self, f: Tensor, grid: Grid | None, check_finite_input: bool):
        """Validate ``f`` (batched on return), resolve the grid, check the parameters and
        the scheme's controls: ``(f, grid, unbatched)``."""
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
        if check_finite_input:
            check_finite(f, "f")
            check_parameters_finite(self, type(self).__name__)
        self.scheme.check(g)
        return f, g, unbatched

    def _check_output(self, u: Tensor) -> None:
        try:
            check_finite(
                u, f"{type(self).__name__} output",
                f"produced from a finite input and finite parameters: an intermediate value "
                f"left the range of {u.dtype}; scale the input down or use float64",
            )
        except ValueError:  # a NaN written through p.data escapes the cached parameter check: read them all
            check_parameters_finite(self, type(self).__name__, fresh=True)
            raise

    def solve(
        self,
        f: Tensor,
        *,
        n_steps: int | None = None,
        grid: Grid | None = None,
        t_eval=None,
        rtol: float | None = None,
        atol: float | None = None,
        controller=None,
        estimator=None,
        per_sample: bool = False,
        on_failure: str = "raise",
        check_finite_input: bool = True,
    ):
        r"""Solve from :math:`u(t_0) = f` and return a :class:`~opsplit.solution.Solution`
        (the state, the states at ``t_eval``, and :class:`~opsplit.solution.SolveStats`:
        accepted/rejected steps, substep calls per operator, the time grid).

        **Fixed steps** (no ``rtol``/``atol``/``controller``): the :math:`N_t` steps of
        :meth:`forward` (``n_steps`` overrides :math:`N_t`); ``t_eval`` must be times of the
        grid :math:`t^0, \dots, t^{N_t}`.

        **Adaptive steps** (``rtol`` and/or ``atol``, or a
        :class:`~opsplit.adaptive.PIController` as ``controller``): step sizes from a local
        error estimate (``estimator``: ``"doubling"`` (default), or a companion scheme on
        the same operators for an embedded pair), steps ending at every ``t_eval`` time;
        ``per_sample=True`` gives each sample its own steps; ``on_failure`` is ``"raise"``
        or ``"return"`` at ``max_steps``.  See :mod:`opsplit.adaptive`.

        The same validation as :meth:`forward`.  Autograd records the solve (adaptive step
        sizes are not differentiated); the propagator's checkpointing applies.
        """
        adaptive = rtol is not None or atol is not None or controller is not None
        if adaptive and n_steps is not None:
            raise ValueError("n_steps: a fixed N_t and adaptive steps (rtol/atol/controller) exclude each other")
        if not adaptive:
            for name, v in (("estimator", estimator), ("per_sample", per_sample or None)):
                if v is not None:
                    raise ValueError(f"{name}: only for adaptive steps (give rtol and/or atol)")
        if adaptive:
            if controller is None:
                kw = {k: v for k, v in (("rtol", rtol), ("atol", atol)) if v is not None}
                controller = PIController(**kw)
            elif rtol is not None or atol is not None:
                raise ValueError("rtol/atol: give the tolerances in the controller or as arguments, not both")
        if per_sample not in (True, False):
            raise TypeError(f"per_sample: expected True or False, got {per_sample!r}")
        f, g, unbatched = self._prepare(f, grid, check_finite_input)
        if any(changes_grid(s) for s in self.scheme.substeps) and t_eval is not None:
            raise ValueError(
                f"t_eval: {type(self.scheme).__name__} may move the state to other grids (grid "
                "transfers), so its states cannot be stacked"
            )
        with self._parameters_named_on_error(check_finite_input):
            sol = self._solve_steps(f, g, grid, n_steps, t_eval, adaptive, controller, estimator, per_sample,
                                    on_failure)
        if check_finite_input:
            self._check_output(sol.u)
        if unbatched:
            sol.u = sol.u.squeeze(0)
            if sol.ys is not None:
                sol.ys = sol.ys.squeeze(0)
        return sol

    def _solve_steps(self, f, g, grid, n_steps, t_eval, adaptive, controller, estimator, per_sample, on_failure):
        """:meth:`solve`'s adaptive or fixed steps from the checked ``f`` on the grid ``g``."""
        if adaptive:
            sol = solve_adaptive(self, f, g, t_eval=t_eval, controller=controller, estimator=estimator,
                                 per_sample=per_sample, on_failure=on_failure)
        else:
            self._check_steps_fit(n_steps, f, t_eval is not None)
            times = self.times(n_steps)
            idx = None
            if t_eval is not None:
                _, outs = _stops(times[0], times[-1], t_eval, ())
                tol = time_tolerance(times[0], times[-1])
                idx = []
                for s in outs:
                    hit = [i for i, x in enumerate(times) if abs(x - s) <= tol]
                    if not hit:
                        raise ValueError(
                            f"t_eval: {s:g} is not a time of the fixed grid of N_t = {len(times) - 1} steps on "
                            f"[{times[0]:g}, {times[-1]:g}]; give grid times, or adaptive tolerances"
                        )
                    idx.append(hit[0])
            with count_substep_calls(self.scheme) as calls:
                out = self.forward(f, n_steps=n_steps, grid=grid, return_trajectory=idx is not None,
                                   check_finite_input=False)
            u, traj = out if idx is not None else (out, None)
            stats = SolveStats(n_accepted=len(times) - 1, substep_calls=dict(calls), times=list(times))
            sol = Solution(u, None if idx is None else [times[i] for i in idx],
                           None if idx is None else traj[:, idx], stats)
        return sol

    def extra_repr(self) -> str:
        s = (
            f"n_steps={self.n_steps}, t=[{self.t0:g}, {self.t1:g}], dt={self.dt():g}, "
            f"grid={self.grid}"
        )
        if self.checkpoint_every:
            s += f", checkpoint_every={self.checkpoint_every}"
            if self.checkpoint_snapshots is not None:
                s += f", checkpoint_snapshots={self.checkpoint_snapshots}"
        return s


class AdaptivePropagator(Propagator):
    """:math:`f \\mapsto u(t_1)` by adaptive steps of ``scheme``: a
    :class:`~opsplit.Propagator` whose ``forward`` solves to a tolerance instead of with
    :math:`N_t` steps (``forward(f, n_steps=N)`` still takes :math:`N` fixed steps).

    Args:
        scheme: the splitting scheme.
        t0, t1: the time interval (``t1`` required).
        grid: as :class:`~opsplit.Propagator`.
        rtol, atol, and the other :class:`PIController` fields: the controller.
        estimator: ``"doubling"`` (default), ``"extrapolate"``, or a companion scheme.
        per_sample: each sample its own steps.

    ``last_stats`` holds the :class:`~opsplit.solution.SolveStats` of the last adaptive
    ``forward`` (``None`` before).  :meth:`from_propagator` shares an existing
    propagator's scheme (its controls), interval and grid.  The gradient modes of
    ``opsplit.control`` apply (it is a ``Propagator``).
    """

    def __init__(
        self,
        scheme: Scheme,
        *,
        t1: float,
        t0: float = 0.0,
        grid: Grid | None = None,
        estimator="doubling",
        per_sample: bool = False,
        on_failure: str = "raise",
        **controller,
    ):
        super().__init__(scheme, 1, t0=t0, t1=t1, grid=grid)
        self.controller = PIController(**controller)
        if per_sample not in (True, False):
            raise TypeError(f"per_sample: expected True or False, got {per_sample!r}")
        # validated now, not at the first call; the dtype's own limits (rtol, the round-off
        # step) are checked by each solve, with the state's dtype (a module may be cast later)
        check_adaptive(scheme, self.t0, self.t1, self.controller, torch.float64, estimator, on_failure)
        self.estimator, self.per_sample, self.on_failure = estimator, per_sample, on_failure
        self.last_stats = None

    def __setattr__(self, name, value):
        # the adaptive settings are checked whenever they are set (and the interval, the grid
        # and the scheme by Propagator); a solve re-checks them all against the state's dtype
        if name == "controller" and not isinstance(value, PIController):
            raise TypeError(f"AdaptivePropagator.controller: expected an opsplit.adaptive.PIController, got "
                            f"{type(value).__name__}")
        if name == "per_sample" and value not in (True, False):
            raise TypeError(f"AdaptivePropagator.per_sample: expected True or False, got {value!r}")
        if name == "on_failure" and (not isinstance(value, str) or value not in ON_FAILURE):
            raise ValueError(f"AdaptivePropagator.on_failure: expected one of {ON_FAILURE}, got {value!r}")
        if name == "estimator" and "last_stats" in self.__dict__:  # (the constructor checks its own)
            try:
                _estimator(self.scheme, value)
            except (TypeError, ValueError) as e:
                raise type(e)(f"AdaptivePropagator.{e}") from None
        super().__setattr__(name, value)

    @classmethod
    def from_propagator(cls, prop: Propagator, **kwargs) -> AdaptivePropagator:
        """An adaptive propagator on ``prop``'s scheme (shared, not copied), interval and grid."""
        if not isinstance(prop, Propagator):
            raise TypeError(f"prop: expected an opsplit Propagator, got {type(prop).__name__}")
        kwargs.setdefault("t0", prop.t0)
        kwargs.setdefault("t1", prop.t1)
        kwargs.setdefault("grid", prop.grid)
        return cls(prop.scheme, **kwargs)

    def _forward_own_steps(self, f: Tensor, grid: Grid | None, return_trajectory: bool, check_finite_input: bool):
        """``forward`` without ``n_steps``: the adaptive solve (the last statistics kept)."""
        if return_trajectory:
            raise ValueError(
                "return_trajectory: adaptive steps have no fixed grid to stack; use solve(f, t_eval=...) "
                "(states at requested times), or forward(f, n_steps=N)"
            )
        sol = self.solve(
            f,
            grid=grid,
            controller=self.controller,
            estimator=self.estimator,
            per_sample=self.per_sample,
            on_failure=self.on_failure,
            check_finite_input=check_finite_input,
        )
        self.last_stats = sol.stats
        return sol.u

    def extra_repr(self) -> str:
        c = self.controller
        return (
            f"t=[{self.t0:g}, {self.t1:g}], rtol={c.rtol:g}, atol={c.atol:g}, estimator={self.estimator!r}, "
            f"per_sample={self.per_sample}, grid={self.grid}"
        )
