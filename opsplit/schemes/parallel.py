r"""Parallel splitting (Lu, Neittaanmäki, Tai), paper 002 Appendix C, eq. (59).

Given :math:`u^n`, for :math:`k = 1, \dots, K` solve, independently,

.. math::  v_t = K\,A_k(t; v)\ \text{ on } (t^n, t^{n+1}],\qquad v(t^n) = u^n,   \qquad (59)

and set :math:`u^{n+1} = \frac1K \sum_k v_k(t^{n+1})`.  First order (with first-order or
better substeps): :math:`v_k = u^n + K\Delta t A_k + O(\Delta t^2)` averages to
:math:`u^n + \Delta t \sum_k A_k + O(\Delta t^2)`.  (Sign: opsplit writes eq. 57 as
:math:`u_t = \sum_k A_k`; see :mod:`opsplit.operators.base`.)

**The scaled term** :math:`K A_k` is :class:`ScaledOperator`: its field is
:math:`K A_k(t; v)` at the true times :math:`t \in [t^n, t^{n+1}]`; its resolvent is
:math:`(I - \Delta t\,K A_k)^{-1} = ` the operator's resolvent with step
:math:`K\Delta t`; its flow over :math:`\Delta t` is the operator's flow over
:math:`K\Delta t` (exact for the core's flows, which freeze the controls at the start of
the substep).  For an indicator term, :math:`A = -\partial I_S`, the scaled term
:math:`K\,\partial I_S = \partial I_S` is the same cone, and its resolvent is still the
projection onto :math:`S`, for every :math:`K` and :math:`\Delta t`.  So a projection in a
parallel scheme contributes :math:`v_S = P_S(u^n)`, and the average
:math:`\frac1K (P_S(u^n) + \sum_{k \ne S} v_k)` is in general **not** in :math:`S`: the
projection pulls the average a fraction :math:`1/K` of the way to :math:`S` per step
(a relaxation towards the constraint, not the constraint itself).

**Batched execution.**  The :math:`K` substeps are independent.  Substeps that share
their structure — the same operator and solver types, the same non-tensor settings and
parameter shapes (for instance :math:`J` FFN layers, or several attention heads given as
separate terms) — are run as one batched call: their parameters are stacked along a new
leading dimension and the substep is evaluated once under ``torch.func.vmap`` (with
``torch.func.functional_call``), giving all :math:`v_k` of the group as one tensor.
Other substeps are called one by one: solvers that cannot be vmapped (adaptive
``ODESolve``) and substeps holding a module that declares ``batchable = False`` (an
operator whose field branches on data, for instance the sliced attentions, whose fast
kernels sort their scores and chunk their work by sizes read at run time).
``batch=False`` forces the loop, ``batch=True`` the vmapped calls; both give the same
result (under ``torch.jit.trace`` the loop is used).  The default ``batch="auto"`` batches on CUDA and, on the CPU,
only small states (at most ``ParallelGroup.auto_numel = 8192`` entries): on the CPU the
vmapped call saves dispatch overhead on small substeps but is slower once the stacked
tensors leave the cache (the figures and their command: ``docs/schemes.md``,
``benchmarks/parallel_batching.py``).
"""

from __future__ import annotations

import dataclasses

import torch
from torch import Tensor, nn
from torch.func import functional_call, vmap

from ..operators.base import Operator
from ..solvers import Substep, catch_up
from ..solvers.base import Solver
from .base import Scheme, fixed_at_construction

__all__ = ["Parallel", "ScaledOperator", "ParallelGroup"]


class ScaledOperator(Operator):
    """The term :math:`c\\,A` of an operator :math:`A` (the :math:`K A_k` of eq. 59).

    Shares the wrapped operator (and its parameters); has the same capabilities.
    """
    def __init__(self, op: Operator, factor: float):
        super().__init__()
        factor = float(factor)
        if not factor > 0:
            raise ValueError(f"ScaledOperator.factor: expected a number > 0, got {factor}")
        self.op = op
        self.factor = factor
        self.has_field = bool(getattr(op, "has_field", False))
        self.has_resolvent = bool(getattr(op, "has_resolvent", False))
        self.has_flow = bool(getattr(op, "has_flow", False))
        self.default_solver = getattr(op, "default_solver", "explicit")

    @property
    def is_projection(self) -> bool:
        return catch_up.is_projection(self.op)

    @property
    def order(self):
        return getattr(self.op, "order", 99)

    def check(self, grid) -> None:
        self.op.check(grid)

    def field(self, t, u: Tensor, grid) -> Tensor:
        return self.factor * self.op.field(t, u, grid)

    def resolvent(self, t, dt: float, u: Tensor, grid) -> Tensor:
        return self.op.resolvent(t, self.factor * dt, u, grid)

    def flow(self, t, dt: float, u: Tensor, grid) -> Tensor:
        return self.op.flow(t, self.factor * dt, u, grid)

    def extra_repr(self) -> str:
        return f"factor={self.factor:g}"


# -- structure signatures for batching ------------------------------------------------------
class _Unbatchable(Exception):
    pass


def _freeze(v):
    if v is None or isinstance(v, (bool, int, float, str, complex, torch.dtype, torch.device)):
        return (type(v).__name__, v)
    if isinstance(v, (tuple, list)):
        return (type(v).__name__, tuple(_freeze(x) for x in v))
    if isinstance(v, dict):
        return ("dict", tuple(sorted((repr(k), _freeze(x)) for k, x in v.items())))
    if isinstance(v, Tensor):
        raise _Unbatchable
    if isinstance(v, Solver):
        return ("solver", type(v), _freeze(vars(v)))
    if dataclasses.is_dataclass(v) and not isinstance(v, type):
        try:
            hash(v)
            return ("dataclass", v)
        except TypeError:
            pass
    return ("id", id(v))


def _signature(sub: nn.Module):
    """A hashable description of everything but the parameter/buffer values, or ``None``
    when the substep cannot be batched."""
    solver = getattr(sub, "solver", None)
    if solver is not None and not getattr(solver, "batchable", True):
        return None
    try:
        mods = []
        for name, m in sub.named_modules():
            if not getattr(m, "batchable", True):
                # a module (typically an operator) that declares it cannot run under vmap
                return None
            attrs = tuple(
                sorted(
                    (k, _freeze(v))
                    for k, v in vars(m).items()
                    if not k.startswith("_") and k != "training"
                )
            )
            mods.append((name, type(m), attrs))
    except _Unbatchable:
        return None
    params = tuple(
        (n, tuple(p.shape), p.dtype, p.device, p.requires_grad) for n, p in sub.named_parameters()
    )
    buffers = tuple((n, tuple(b.shape), b.dtype, b.device) for n, b in sub.named_buffers())
    return (tuple(mods), params, buffers)


def _check_batch(batch, name: str = "batch"):
    if not (batch is True or batch is False or (isinstance(batch, str) and batch == "auto")):
        raise ValueError(f"{name}: expected True, False or 'auto', got {batch!r}")
    return batch


def _slot(module: nn.Module, name: str) -> tuple[nn.Module, str]:
    prefix, _, attr = name.rpartition(".")
    return (module.get_submodule(prefix) if prefix else module), attr


class ParallelGroup(nn.Module):
    """The substeps of one parallel step (eq. 59): each solved with its term scaled by
    ``K = len(substeps)`` from the same state, then averaged.

    Holds no parameters of its own: the wrapped operators are owned by the scheme.
    """
    #: with ``batch="auto"``, the largest state (``u.numel()``) batched on the CPU
    auto_numel: int = 8192

    def __init__(self, substeps, batch="auto"):
        super().__init__()
        substeps = list(substeps)
        if not substeps:
            raise ValueError("ParallelGroup: expected at least one substep")
        K = len(substeps)
        self.K = K
        self.batch = _check_batch(batch)
        # plain list: the scaled wrappers share the scheme's operators, registering them
        # again would duplicate every parameter in the state dict
        self._scaled = [
            s if K == 1 else Substep(tuple(ScaledOperator(op, K) for op in s.terms), s.solver)
            for s in substeps
        ]
        # the substeps the scaled copies were made from: a copy follows its substep's solver
        # when it is replaced (``substep.solver = Heun()``), never the stale one
        self._sources = substeps
        self._plan = None
        self._edges = []

    def __setattr__(self, name, value):
        # ``batch`` may change after construction (the plan is made again); ``auto_numel``
        # must stay a positive integer; ``K`` is the number of substeps the group was built with
        if name == "batch":
            value = _check_batch(value, f"{type(self).__name__}.batch")
            self.__dict__["_plan"] = None
        elif name == "auto_numel":
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"ParallelGroup.auto_numel: expected an integer >= 0 (the largest state batched on "
                                 f"the CPU), got {value!r}")
            self.__dict__["_plan"] = None
        elif name == "K" and "K" in self.__dict__:
            raise fixed_at_construction(self, name, "the number of substeps the group scales its terms by")
        super().__setattr__(name, value)

    def _follow_solvers(self) -> None:
        for s, src in zip(self._scaled, self._sources):
            if s.solver is not src.solver:
                s.solver = src.solver
                self._plan = None

    def reset_plan(self) -> None:
        """Forget the batching plan (recomputed at the next call)."""
        self._plan = None

    def _tree_changed(self) -> bool:
        """Whether a module below the batched members was replaced since the plan was made
        (a control prolonged to more pieces, a coarse solve's averaging view put in place):
        the plan's slots would then read the old module's parameters."""
        return any(parent._modules.get(name) is not child for parent, name, child in self._edges)

    def plan(self):
        """The batching plan: a list of index groups (singletons run unbatched), made again
        when a module below a batched member was replaced (:meth:`_tree_changed`)."""
        if self._plan is not None and self._tree_changed():
            self._plan = None
        if self._plan is None:
            groups: dict = {}
            order = []
            for i, s in enumerate(self._scaled):
                sig = _signature(s) if self.batch is not False else None
                key = ("single", i) if sig is None else sig
                if key not in groups:
                    groups[key] = []
                    order.append(key)
                groups[key].append(i)
            plan = []
            for key in order:
                idx = groups[key]
                if len(idx) == 1:
                    plan.append((idx, None))
                else:
                    members = [self._scaled[i] for i in idx]
                    names_p = [n for n, _ in members[0].named_parameters()]
                    names_b = [n for n, _ in members[0].named_buffers()]
                    # (module, attribute) slots of every member, read afresh at each call
                    # (cheap dict lookups instead of walking the module tree)
                    slots_p = [[_slot(m, n) for n in names_p] for m in members]
                    slots_b = [[_slot(m, n) for n in names_b] for m in members]
                    plan.append((idx, (names_p, names_b, slots_p, slots_b)))
            # every (parent, name, child) edge below the batched members, to see a replacement
            self._edges = [(parent, name, child) for idx, names in plan if names is not None
                           for i in idx for parent in self._scaled[i].modules()
                           for name, child in parent._modules.items()]
            self._plan = plan
        return self._plan

    def _apply(self, fn, *args, **kwargs):
        self._plan = None
        return super()._apply(fn, *args, **kwargs)

    def _batched(self, idx, names, t, dt, u, grid) -> Tensor:
        names_p, names_b, slots_p, slots_b = names
        params = {
            n: torch.stack([mod._parameters[a] for mod, a in (sl[j] for sl in slots_p)])
            for j, n in enumerate(names_p)
        }
        buffers = {
            n: torch.stack([mod._buffers[a] for mod, a in (sl[j] for sl in slots_b)])
            for j, n in enumerate(names_b)
        }
        base = self._scaled[idx[0]]

        def one(p, b, x):
            return functional_call(base, (p, b), (t, dt, x, grid))

        return vmap(one, in_dims=(0, 0, None))(params, buffers, u)

    def forward(self, t, dt: float, u: Tensor, grid) -> Tensor:
        if self.K == 1:
            return self._scaled[0](t, dt, u, grid)
        self._follow_solvers()
        total = None
        if self.use_batch(u):
            for idx, names in self.plan():
                if names is None:
                    v = self._scaled[idx[0]](t, dt, u, grid)
                else:
                    v = self._batched(idx, names, t, dt, u, grid).sum(0)
                total = v if total is None else total + v
        else:
            for s in self._scaled:
                v = s(t, dt, u, grid)
                total = v if total is None else total + v
        return total / self.K

    def use_batch(self, u: Tensor) -> bool:
        """Whether this call runs same-structure substeps as one vmapped call."""
        if torch.jit.is_tracing() or torch.jit.is_scripting():
            # torch.func.functional_call does not run on traced modules
            if self.batch is True:
                raise RuntimeError(
                    "Parallel(batch=True) cannot be traced by torch.jit (the batched call "
                    "uses torch.func.functional_call); use batch=False or 'auto'"
                )
            return False
        if self.batch == "auto":
            return u.is_cuda or u.numel() <= self.auto_numel
        return self.batch

    def extra_repr(self) -> str:
        return f"K={self.K}, batch={self.batch}"


class Parallel(Scheme):
    """Parallel splitting, eq. (59): every substep from :math:`u^n` with its term scaled by
    :math:`K`, then the average. Order 1.

    Args:
        substeps: operators or :class:`~opsplit.solvers.Substep` objects.
        batch: run substeps of the same structure as one vmapped call: ``True``, ``False``
            (a loop), or ``"auto"`` (default): batched on CUDA, and on the CPU when the state
            has at most ``ParallelGroup.auto_numel`` entries (see the module docstring).
    """
    order = 1

    def __init__(self, substeps, *, batch="auto"):
        super().__init__(substeps)
        self._group = ParallelGroup(list(self.substeps), batch=_check_batch(batch))
        self.batch = batch

    def __setattr__(self, name, value):
        if name == "batch":  # checked, and passed on to the group that batches (a new plan)
            value = _check_batch(value, f"{type(self).__name__}.batch")
            self._group.batch = value
        super().__setattr__(name, value)

    def _apply(self, fn, *args, **kwargs):
        self._group.reset_plan()
        return super()._apply(fn, *args, **kwargs)

    def step(self, t, dt: float, u: Tensor, grid) -> Tensor:
        return self._group(t, dt, u, grid)

    def extra_repr(self) -> str:
        return super().extra_repr() + f", batch={self.batch}"
