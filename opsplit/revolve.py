r"""Binomial checkpointing of the time loop: reverse-mode gradients of
:math:`u^{N_t} = \bar{\mathcal N}^{N_t} \circ \dots \circ \bar{\mathcal N}^1 (f)` (paper 002,
eq. 9 discretised as in eq. 12) with a fixed number of stored states, whatever :math:`N_t`.

The time loop is cut into *units* of ``every`` steps (``every = 1``: one unit per step).
Plain backpropagation keeps every intermediate of every unit; storing one state per unit
(``torch.utils.checkpoint`` per block) keeps :math:`N_t/\text{every}` states.  Here at most
``snapshots`` unit states are held, and the states the backward sweep needs are recomputed
from the nearest held one (Griewank's *revolve*; A. Griewank, A. Walther, "Algorithm 799:
revolve", ACM TOMS 26(1), 2000):

* With :math:`s` snapshot slots (the initial state counts as one) and :math:`r` forward
  evaluations per unit at most, :math:`\beta(s, r) = \binom{s + r}{s}` units can be
  reversed, by the recursion :math:`\beta(s, r) = \beta(s, r-1) + \beta(s-1, r)`: a segment
  of :math:`l \le \beta(s, r)` units starting at a held state is split at :math:`l_1`
  (:math:`\le \beta(s, r-1)`, chosen where the cost is least, :func:`_split`); the state
  there is stored, the right part (:math:`\le \beta(s-1, r)` units) is reversed with the
  remaining :math:`s - 1` slots, its slot is freed, and the left part is reversed with
  :math:`s` slots and one evaluation fewer.  With one slot the segment is reversed by recomputing every state
  from the held one (quadratic cost).
* The forward pass (no graph recorded) stores the states of the first descent of that
  recursion; the backward pass follows it, and for each unit :math:`n` (last to first)
  re-runs the unit from :math:`u^n` with autograd and takes its vector-Jacobian product
  with the adjoint state :math:`\lambda^{n+1}`: :math:`\lambda^n = \lambda^{n+1}
  \partial_u \bar{\mathcal N}^{n+1}`, and :math:`\nabla_\theta J \mathrel{+}=
  \lambda^{n+1} \partial_\theta \bar{\mathcal N}^{n+1}` — the chain rule of the discrete
  map, i.e. the same gradient as backpropagation (round-off aside: the per-unit
  parameter gradients are summed in another order).

Cost: the forward pass evaluates every unit once without a graph; the backward pass
re-evaluates units without a graph (each unit at most :math:`r - 1` times, :math:`r` the
least integer with :math:`\binom{s + r}{s} \ge N`) and every unit once with a graph for its
vector-Jacobian product.  The graph-free evaluations number
:math:`r N - \binom{s + r}{s + 1} + 1`: Griewank's minimum :math:`t(N, s) = r N -
\beta(s + 1, r - 1)` for reversing :math:`N` steps with :math:`s` checkpoints, plus the
forward pass's evaluation of the last unit (which produces the output; revolve would
tape it instead).  :func:`revolve_cost` counts them by a dry run of the same schedule.

Memory: kept from the forward pass to the backward pass (what autograd saves): at most
:math:`s` snapshots plus the working state (the input of the last unit) and one RNG state
each; alive during the backward pass: at most :math:`2s` states (the forward pass's stay
referenced by autograd until the backward pass ends, and up to :math:`s - 1` more are
placed by the sweep), plus one working state, one unit's intermediates, the adjoint state
and one gradient per parameter — independent of :math:`N`.

What is differentiated: the state and the parameters (and buffers that require grad) of
the ``scheme`` — its controls.  A tensor that requires grad and that the scheme reads from
elsewhere (not registered in the scheme) is detected on the first unit of the backward
pass and refused with an error; such models need ``snapshots=None``
(``torch.utils.checkpoint``, which follows the whole graph).  RNG state is stored with
each snapshot and restored for every recomputation (dropout masks are the same as in the
forward pass); the global RNG is left as it was.  Autocast state is restored for the
recomputation.  Double backward (``create_graph=True``) is not supported.
"""

from __future__ import annotations

from math import comb

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable
from torch.utils.checkpoint import checkpoint

__all__ = ["binomial_reps", "revolve_cost", "revolve_steps", "checkpointed_steps"]


def binomial_reps(n_units: int, snapshots: int) -> int:
    """The least :math:`r \\ge 1` with :math:`\\binom{s + r}{s} \\ge N` (``s = snapshots``,
    ``N = n_units``): the most forward evaluations of any unit (the forward pass included,
    the backward pass's graph-recording re-run not)."""
    _check_int(n_units, "n_units")
    _check_int(snapshots, "snapshots")
    if n_units == 1:
        return 1
    r = 1
    while comb(snapshots + r, snapshots) < n_units:
        r += 1
    return r


def _check_int(v, name):
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise ValueError(f"{name}: expected an integer >= 1, got {v!r}")


def _split(length: int, slots: int) -> int:
    """Length :math:`l_1` of the left part of a segment of ``length`` units reversed with
    ``slots`` slots (``slots >= 2``).  The cost (graph-free unit evaluations) of reversing
    :math:`l` units with :math:`s` slots is :math:`t(l, s) = r l - \\beta(s + 1, r - 1)`,
    :math:`r` = :func:`binomial_reps` (convex, piecewise linear in :math:`l` with slope
    :math:`r`); :math:`l_1 + t(l_1, s) + t(l - l_1, s - 1)` is least where the slopes
    match, :math:`r(l_1, s) = r - 1` and :math:`r(l - l_1, s - 1) = r`: any
    :math:`l_1 \\in [\\max(\\beta(s, r-2), l - \\beta(s-1, r)),
    \\min(\\beta(s, r-1), l - \\beta(s-1, r-1))]` (non-empty for
    :math:`\\beta(s, r-1) < l \\le \\beta(s, r)`); the least is taken."""
    r = binomial_reps(length, slots)
    lo = max(comb(slots + r - 2, slots) if r >= 2 else 0, length - comb(slots - 1 + r, slots - 1), 1)
    return min(lo, length - 1)


def _forward_positions(n: int, s: int) -> list[int]:
    """Unit indices whose start states the forward pass stores: the snapshots of the first
    descent (0 included) and the working state, the start of the last unit."""
    pos, a = [0], 0
    while n - a > 1 and s > 1:
        a += _split(n - a, s)
        s -= 1
        pos.append(a)
    if pos[-1] != n - 1:
        pos.append(n - 1)
    return pos


def _reverse(n: int, s: int, held: dict, run, vjp) -> None:
    """The backward sweep over units ``n - 1, ..., 0``.  ``held[a]`` is the record of the
    state at the start of unit ``a`` (those of :func:`_forward_positions` on entry);
    ``run(rec, a, b)`` returns the record at ``b`` from the record at ``a`` (no graph);
    ``vjp(j, rec)`` back-propagates through unit ``j``.  Records are dropped as soon as
    the sweep has passed them."""
    stack = [(0, n, s)]
    while stack:
        a, b, s = stack.pop()
        if b - a == 1 or s <= 1:
            for j in range(b - 1, a, -1):
                vjp(j, held.pop(j) if j in held else run(held[a], a, j))
            vjp(a, held.pop(a))
            continue
        m = a + _split(b - a, s)
        if m not in held:
            held[m] = run(held[a], a, m)
        stack.append((a, m, s))
        stack.append((m, b, s - 1))


def revolve_cost(n_units: int, snapshots: int) -> dict:
    """Counts of the schedule for ``n_units`` units and ``snapshots`` slots (a dry run of
    the same code the backward pass runs): ``forward`` (units evaluated by the forward
    pass), ``recomputed`` (units re-evaluated without a graph by the backward pass),
    ``rerun`` (units evaluated with a graph for their vector-Jacobian product),
    ``max_held`` (most states held at once by the backward sweep, the forward pass's
    included), ``stored`` (states kept from forward to backward), ``reps`` (the bound
    :func:`binomial_reps`), ``factor`` ((forward + recomputed + rerun) / n_units: unit
    evaluations per unit, against 1 for plain backpropagation)."""
    _check_int(n_units, "n_units")
    _check_int(snapshots, "snapshots")
    fwd = _forward_positions(n_units, snapshots)
    held = {p: p for p in fwd}
    count = {"recomputed": 0, "rerun": 0, "max_held": len(held)}
    extra = [0]

    def run(a_rec, a, b):
        count["recomputed"] += b - a
        return b

    def vjp(j, rec):
        count["rerun"] += 1

    class _Held(dict):
        def __setitem__(self, k, v):
            super().__setitem__(k, v)
            extra[0] += 1
            # forward snapshots stay referenced by autograd until the sweep ends
            count["max_held"] = max(count["max_held"], len(fwd) + extra[0])

        def pop(self, k):
            if k not in fwd:
                extra[0] -= 1
            return super().pop(k)

    _reverse(n_units, snapshots, _Held(held), run, vjp)
    out = {"forward": n_units, **count, "stored": len(fwd), "reps": binomial_reps(n_units, snapshots)}
    out["factor"] = (out["forward"] + out["recomputed"] + out["rerun"]) / n_units
    return out


# ---------------------------------------------------------------------------------------------
# the autograd function


def _rng_state(device: torch.device):
    cpu = torch.get_rng_state()
    dev = torch.cuda.get_rng_state(device) if device.type == "cuda" else None
    return cpu, dev


def _set_rng_state(state, device: torch.device):
    torch.set_rng_state(state[0])
    if state[1] is not None:
        torch.cuda.set_rng_state(state[1], device)


def _external_leaf(y: Tensor, allowed: set):
    """A leaf tensor requiring grad that ``y``'s graph reaches and that is not in
    ``allowed`` (ids), or None."""
    seen, stack = set(), [y.grad_fn]
    while stack:
        fn = stack.pop()
        if fn is None or fn in seen:
            continue
        seen.add(fn)
        v = getattr(fn, "variable", None)
        if v is not None and id(v) not in allowed:
            return v
        stack.extend(f for f, _ in fn.next_functions)
    return None


def _compact(u: Tensor) -> Tensor:
    """``u`` itself, or a copy when it is a view into a larger storage (e.g. the last
    time of a solver's stacked solution): a stored state holds its own bytes only."""
    if u.untyped_storage().nbytes() > u.numel() * u.element_size():
        return u.clone()
    return u


class _Plan:
    """The non-tensor arguments of the function: scheme, time grid, units, slots."""

    def __init__(self, scheme, times, grid, every, snapshots):
        self.scheme, self.times, self.grid = scheme, times, grid
        n = len(times) - 1
        self.bounds = list(range(0, n, every)) + [n]
        self.n_units = len(self.bounds) - 1
        self.snapshots = snapshots

    def run_units(self, u, g, a, b):
        times = self.times
        for j in range(a, b):
            for n in range(self.bounds[j], self.bounds[j + 1]):
                u, g = self.scheme.advance(times[n], times[n + 1] - times[n], u, g)
        return u, g


class _BinomialCheckpoint(torch.autograd.Function):
    @staticmethod
    def forward(ctx, plan: _Plan, u: Tensor, *params: Tensor):
        dev = u.device
        positions = set(_forward_positions(plan.n_units, plan.snapshots))
        states, grids, rngs = [], [], []
        g = plan.grid
        for j in range(plan.n_units):
            if j in positions:
                states.append(_compact(u))
                grids.append(g)
                rngs.append(_rng_state(dev))
            u, g = plan.run_units(u, g, j, j + 1)
        plan.out_grid = g
        ctx.plan = plan
        ctx.positions = sorted(positions)
        ctx.grids = grids
        ctx.has_cuda_rng = dev.type == "cuda"
        ctx.autocast = (dev.type, torch.is_autocast_enabled(dev.type), torch.get_autocast_dtype(dev.type))
        rng_t = [r[0] for r in rngs] + ([r[1] for r in rngs] if ctx.has_cuda_rng else [])
        ctx.save_for_backward(*states, *rng_t)
        ctx.n_params = len(params)
        return u

    @staticmethod
    @once_differentiable
    def backward(ctx, lam: Tensor):
        plan: _Plan = ctx.plan
        saved = ctx.saved_tensors
        k = len(ctx.positions)
        states = saved[:k]
        cpu_rng = saved[k:2 * k]
        dev_rng = saved[2 * k:3 * k] if ctx.has_cuda_rng else [None] * k
        dev = states[0].device
        held = {p: (states[i], ctx.grids[i], (cpu_rng[i], dev_rng[i])) for i, p in enumerate(ctx.positions)}
        del states, saved
        scheme = plan.scheme
        params = [p for p in scheme.parameters() if p.requires_grad]
        params += [b for b in scheme.buffers() if b.requires_grad]
        n_params = ctx.n_params
        if len(params) != n_params:  # the scheme's parameters changed between forward and backward
            raise RuntimeError("checkpointed solve: the scheme's parameters changed between the forward and "
                               "the backward pass")
        need_input = ctx.needs_input_grad[1]
        grads: list = [None] * n_params
        state = {"lam": lam, "checked": False, "grad_u": None}
        dtype, ac_enabled, ac_dtype = ctx.autocast

        def run(rec, a, b):
            _set_rng_state(rec[2], dev)
            with torch.no_grad(), torch.autocast(dtype, dtype=ac_dtype, enabled=ac_enabled):
                u, g = plan.run_units(rec[0], rec[1], a, b)
            return _compact(u), g, _rng_state(dev)

        def vjp(j, rec):
            _set_rng_state(rec[2], dev)
            first = j == 0
            with torch.enable_grad(), torch.autocast(dtype, dtype=ac_dtype, enabled=ac_enabled):
                x = rec[0].detach()
                if not first or need_input:
                    x.requires_grad_(True)
                y, _ = plan.run_units(x, rec[1], j, j + 1)
            if not state["checked"]:
                state["checked"] = True
                if y.requires_grad:
                    leaf = _external_leaf(y, {id(x)} | {id(p) for p in params})
                    if leaf is not None:
                        raise RuntimeError(
                            f"checkpointed solve: a step reads a tensor that requires grad (shape "
                            f"{tuple(leaf.shape)}) and is not a parameter or buffer of the scheme; binomial "
                            "checkpointing differentiates the scheme's own parameters only: use "
                            "checkpoint_snapshots=None (torch.utils.checkpoint per block) for this model")
            inputs = ([x] if x.requires_grad else []) + params
            if not y.requires_grad or not inputs:
                state["lam"] = torch.zeros_like(x)
                return
            out = torch.autograd.grad(y, inputs, state["lam"], allow_unused=True)
            if x.requires_grad:
                gx, out = out[0], out[1:]
                state["lam"] = torch.zeros_like(x) if gx is None else gx
            for i, gp in enumerate(out):
                if gp is not None:
                    grads[i] = gp if grads[i] is None else grads[i] + gp

        devices = [dev] if dev.type == "cuda" else []
        with torch.random.fork_rng(devices=devices):
            _reverse(plan.n_units, plan.snapshots, held, run, vjp)
        grad_u = state["lam"] if need_input else None
        return (None, grad_u, *grads)


def revolve_steps(scheme, times, u: Tensor, grid, every: int, snapshots: int):
    """The time loop of :class:`~opsplit.Propagator` with binomial checkpointing: units of
    ``every`` steps, at most ``snapshots`` stored unit states.  Returns ``(u, grid)``;
    the grid is threaded as in :meth:`Scheme.advance` (each snapshot stores its grid)."""
    _check_int(every, "checkpoint_every")
    _check_int(snapshots, "checkpoint_snapshots")
    plan = _Plan(scheme, times, grid, every, snapshots)
    params = [p for p in scheme.parameters() if p.requires_grad]
    params += [b for b in scheme.buffers() if b.requires_grad]
    out = _BinomialCheckpoint.apply(plan, u, *params)
    return out, plan.out_grid


def checkpointed_steps(scheme, times, u: Tensor, grid, k: int):
    """The time loop (:meth:`opsplit.Propagator.forward`, and the replay of an adaptive solve's
    accepted steps) with ``torch.utils.checkpoint`` around every block of ``k`` steps: the
    backward pass stores one state per block and recomputes the block's steps.  Returns
    ``(u, grid)``: the grid is threaded as in :meth:`Scheme.advance` (recorded when a block
    runs; a recomputation records the same grid)."""
    out_grid = [grid]

    def block(u, a, b, g):
        for n in range(a, b):
            u, g = scheme.advance(times[n], times[n + 1] - times[n], u, g)
        out_grid[0] = g
        return u

    n = len(times) - 1
    for a in range(0, n, k):
        b = min(a + k, n)
        u = checkpoint(block, u, a, b, out_grid[0], use_reentrant=False)
    return u, out_grid[0]
