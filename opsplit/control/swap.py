r"""Solving a model another way, for the length of a block: another substep solver (Euler,
Heun, RK4), or the Strang splitting of its terms, on every :class:`~opsplit.Propagator`
inside it — the swap of the solver-swap test (:mod:`opsplit.control.continuity`) and of
training with solvers drawn per step (``TrainConfig.solvers``).  The operators and
their controls are shared; nothing is copied, and everything is restored on exit."""

from __future__ import annotations

import contextlib

from torch import nn

from ..coarse import propagators
from ..schemes import Hybrid, Lie, Parallel, SchemeFlow, Strang
from ..solvers import EXPLICIT_SOLVERS, Exact, ODESolve, Solver, Substep, name_of, solver_class

__all__ = ["solved_with", "strang_of", "solver_name", "SOLVERS", "STAGES", "propagators", "field_substeps",
           "check_solver_names", "as_solver"]


#: the substep solvers a swap takes by name (explicit Runge–Kutta methods of order 1, 2, 4:
#: :data:`opsplit.solvers.EXPLICIT_SOLVERS`)
SOLVERS = EXPLICIT_SOLVERS
#: field evaluations per substep call of the named solvers (their ``stages``)
STAGES = {name: solver_class(name).stages for name in SOLVERS}


def field_substeps(scheme: nn.Module) -> list:
    """The substeps of ``scheme`` whose solver integrates an explicit field (the ones a
    solver swap replaces); projections, implicit steps and exact flows are kept."""
    out = []
    for m in scheme.modules():
        if isinstance(m, Substep) and getattr(m.solver, "requires", None) == "field" and m not in out:
            out.append(m)
    return out


def solver_name(solver) -> str:
    """``"euler"``, ``"heun"``, ``"rk4"`` for those solvers, ``"odeint:<method>"`` for an
    :class:`~opsplit.solvers.ODESolve`, else the class name."""
    name = name_of(solver)
    if name in SOLVERS:
        return name
    if isinstance(solver, ODESolve):
        return f"odeint:{solver.method}"
    return type(solver).__name__


def as_solver(solver, where: str):
    if isinstance(solver, Solver):
        return solver
    if isinstance(solver, str) and solver in SOLVERS:
        return solver_class(solver)()
    raise ValueError(f"{where}: expected one of {SOLVERS} or an opsplit Solver, got {solver!r}")


def _groups(scheme):
    """The parallel groups of a hybrid or parallel scheme (index tuples), else ``None``."""
    if type(scheme) is Hybrid:
        if any(scheme._transfers):
            raise ValueError("solved_with: a hybrid scheme with grid transfers cannot be rebuilt")
        return [tuple(g) for g in scheme.groups]
    if type(scheme) is Parallel:
        return [tuple(range(len(scheme.substeps)))]
    return None


def _units(scheme, solver):
    """The terms of a hybrid / parallel ``scheme`` as sequential units: each group of several
    substeps one substep of all its operators advanced together by ``solver`` (the unsplit
    group: their fields summed), a single substep with ``solver``; ``None`` when ``solver``
    cannot advance a group's operators together (explicit Euler takes one: there the
    parallel group *is* Euler on the sum, eq. 59) or a group holds a substep without a field
    solver."""
    units = []
    for g in _groups(scheme):
        subs = [scheme.substeps[i] for i in g]
        if any(getattr(s.solver, "requires", None) != "field" for s in subs):
            if len(subs) > 1:
                return None
            units.append(subs[0])
            continue
        terms = tuple(op for s in subs for op in s.terms)
        try:
            solver.check(terms)
        except ValueError:
            return None
        units.append(Substep(terms, solver))
    return units


def strang_of(scheme: nn.Module, solver=None):
    """The Strang splitting of the terms of ``scheme``, on the same operators (shared
    controls): a Lie, parallel or Strang scheme's substeps in their order; a hybrid scheme's
    groups as the terms — a group of several substeps advanced by one parallel step of its
    own (:class:`~opsplit.schemes.SchemeFlow`), or, with a multi-term ``solver``, its
    operators advanced together by ``solver`` (:func:`solved_with`).  Other schemes
    (compositions, stages, relaxations) are refused."""
    if isinstance(scheme, Strang):
        return scheme
    units = _units(scheme, solver) if solver is not None and _groups(scheme) is not None else None
    if units is not None:
        if len(units) == 1:
            raise ValueError("schemes: 'strang' needs a scheme of at least two terms")
        return Strang(units)
    if type(scheme) in (Lie, Parallel):
        return Strang(list(scheme.substeps))
    if type(scheme) is Hybrid:
        _groups(scheme)  # refuses grid transfers
        units = []
        for g in scheme.groups:
            subs = [scheme.substeps[i] for i in g]
            units.append(subs[0] if len(subs) == 1 else
                         Substep(SchemeFlow(Parallel(subs, batch=scheme.batch)), Exact()))
        if len(units) == 1:
            raise ValueError("schemes: 'strang' needs a scheme of at least two terms; the hybrid scheme has one "
                             "group")
        return Strang(units)
    raise ValueError(f"schemes: 'strang' rebuilds Lie, Strang, parallel and hybrid schemes; the model's scheme is "
                     f"{type(scheme).__name__}")


@contextlib.contextmanager
def solved_with(model: nn.Module, *, solver=None, scheme: str | None = None):
    """Solve every propagator of ``model`` with another substep ``solver`` (``"euler"``,
    ``"heun"``, ``"rk4"`` or a :class:`~opsplit.solvers.Solver`) and/or ``scheme="strang"``
    (:func:`strang_of`) inside the block; everything is restored on exit.

    **What "another solver" means.**  Every substep that integrates an explicit field gets
    ``solver``; projections, implicit steps and exact flows keep theirs.  A *parallel group*
    of a hybrid or parallel scheme (eq. 59: every term from the same state with its field
    scaled by the group size :math:`K`, then the average) is, with explicit-Euler substeps,
    exactly one Euler step of the sum of its fields; with a higher-order solver the average
    of :math:`K` scaled solves is not (each stage is taken :math:`K` times too far, and the
    group stays a first-order splitting).  A more accurate solve of the same continuous
    model advances the group's terms together, so a solver that takes several terms
    (Heun, RK4, ``ODESolve``) replaces each group by one substep of all its operators, and
    the groups run in sequence (a Lie scheme of the groups, or Strang with
    ``scheme="strang"``); explicit Euler keeps the groups as they are (the same map).

    Checked before anything changes: a model without a propagator, a solver that cannot run
    a term, a scheme that cannot be rebuilt."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"solved_with.model: expected an nn.Module, got {type(model).__name__}")
    props = propagators(model)
    if not props:
        raise ValueError("solved_with.model: the model holds no opsplit Propagator to solve another way")
    new = None if solver is None else as_solver(solver, "solved_with.solver")
    if scheme not in (None, "trained", "strang"):
        raise ValueError(f"solved_with.scheme: expected 'trained' or 'strang', got {scheme!r}")
    schemes, subs = {}, []
    for p in props:
        units = _units(p.scheme, new) if new is not None and _groups(p.scheme) is not None else None
        if units is not None:
            schemes[p] = Strang(units) if scheme == "strang" else Lie(units)
            continue
        subs += [s for s in field_substeps(p.scheme) if s not in subs]
        if scheme == "strang":
            schemes[p] = strang_of(p.scheme)
    if new is not None:
        if not subs and not schemes:
            raise ValueError(f"solved_with.solver: no substep of the model integrates an explicit field, so there is "
                             f"no solver to replace by {solver_name(new)!r}")
        for s in subs:
            try:
                new.check(tuple(s.terms))
            except ValueError as e:
                raise ValueError(f"solved_with.solver: {solver_name(new)!r} cannot run the term "
                                 f"{type(s.terms[0]).__name__}: {e}") from None
    old_solvers = [(s, s.solver) for s in subs] if new is not None else []
    old_schemes = {p: p.scheme for p in schemes}
    try:
        for s, _ in old_solvers:
            s.solver = new
        for p, sch in schemes.items():
            p.scheme = sch
        yield model
    finally:
        for s, v in old_solvers:
            s.solver = v
        for p, sch in old_schemes.items():
            p.scheme = sch


def check_solver_names(names, name: str) -> tuple:
    """A non-empty list of distinct names of :data:`SOLVERS` (refused naming ``name``)."""
    if isinstance(names, (str, bytes)) or not isinstance(names, (tuple, list)) or not names:
        raise TypeError(f"{name}: expected a non-empty list of solver names {SOLVERS}, got {names!r}")
    for i, v in enumerate(names):
        if v not in SOLVERS:
            raise ValueError(f"{name}: expected solver names from {SOLVERS}, got {v!r}")
        if v in names[:i]:
            raise ValueError(f"{name}: solver {v!r} is listed twice, got {list(names)}")
    return tuple(names)
