"""The solve/compare engine of the ``opsplit`` command: a seeded continuous transformer
(:func:`opsplit.analysis.smooth_transformer`) solved by the chosen schemes at the chosen
resolutions, errors against a reference, fitted orders (:mod:`opsplit.analysis`).

No math of its own: the model, the schemes, the errors and the fits are the library's.
"""

from __future__ import annotations

import math
import statistics
import time
import warnings

import numpy as np
import torch
from tqdm.auto import tqdm

from ..adaptive import AdaptiveStepError, PIController, check_adaptive
from ..analysis import ConvergenceStudy, fit_order, relative_error, resample, smooth_transformer
from ..analysis.problems import SCHEMES, SOLVERS
from ..operators.layernorm import constant_tokens
from ..solvers import solver_class
from .budget import Estimate
from .config import ConfigError, Field, at_least, distinct, positive, seed_field

__all__ = ["MODEL_SCHEMA", "THEORY", "build", "preflight", "solve_all", "expected_order", "estimate"]

# the order each scheme has when its substeps are solved to at least its order (Appendix C
# of paper 002; docs/schemes.md); explicit-Euler substeps make every scheme first order
THEORY = {"lie": 1, "strang": 2, "parallel": 1, "hybrid": 1, "triple_jump": 4, "blanes_moan": 4}
#: the fourth-order compositions (with projections they sit inside an outer Strang step)
COMPOSITIONS = ("triple_jump", "blanes_moan")
TIME_BASES = ("legendre", "chebyshev", "cosine", "piecewise_linear")

MODEL_SCHEMA = {
    "seed": seed_field("seed of every random draw"),
    "J": Field("int", 2, "FFN integral terms", at_least(1)),
    "n_modes": Field("int", 4, "modes per axis of the kernels (space = 'polynomial')", at_least(1)),
    "constraint": Field("bool", True, "S1(sigma1(t), sigma2(t)) as a constraint (LayerNorm)"),
    "relu": Field("bool", False, "add the S2 projection (ReLU); no unsplit reference then"),
    "T": Field("float", 1.0, "final time", positive),
    "batch": Field("int", 2, "initial states", at_least(1)),
    "space": Field("str", "polynomial", "controls as Legendre series in space (any grid) or "
                   "values at the nodes of one grid", choices=("polynomial", "grid")),
    "time": Field("str", "legendre", "time dependence of the controls", choices=TIME_BASES),
    "n_time": Field("int", 3, "time modes / nodes of the controls", at_least(2)),
    "scale": Field("float", 1.0, "operator norm of the terms", positive),
    "margin": Field("float", 0.0, "the controls are defined on [-margin T, (1 + margin) T]: room "
                    "for the triple jump, whose substeps read them up to 0.35 dt outside a step",
                    lambda v: None if v >= 0 else "a number >= 0"),
    "dtype": Field("str", "float64", "floating type", choices=("float64", "float32")),
}


def expected_order(scheme: str, solver: str, projections: bool = False) -> int:
    """The scheme's order with these substeps; a composition around projections (an outer
    Strang step) is second order."""
    order = min(THEORY[scheme], solver_class(solver).order)  # odeint: tolerance-limited (99)
    return min(order, 2) if projections and scheme in COMPOSITIONS else order


def build(model: dict, nx: int, ny: int):
    """The seeded model on an ``nx x ny`` grid (same controls on every grid when
    ``space = 'polynomial'``)."""
    return smooth_transformer(
        n_x=nx, n_y=ny, batch=model["batch"], J=model["J"], T=model["T"], seed=model["seed"],
        time=model["time"], n_time=model["n_time"], space=model["space"],
        n_modes=model["n_modes"], constraint=model["constraint"], relu=model["relu"],
        scale=model["scale"], margin=model.get("margin", 0.0), dtype=getattr(torch, model["dtype"]),
    )


def grids(nx: list[int], ny: list[int], section: str) -> list[tuple[int, int]]:
    """``n_x`` and ``n_y`` zipped (a single value is used with every value of the other)."""
    if len(nx) != len(ny) and 1 not in (len(nx), len(ny)):
        raise ConfigError(
            f"{section}.n_x / {section}.n_y: expected lists of equal length (zipped into grids) "
            f"or one of length 1, got {len(nx)} and {len(ny)} values"
        )
    k = max(len(nx), len(ny))
    nx = nx * k if len(nx) == 1 else nx
    ny = ny * k if len(ny) == 1 else ny
    return list(zip(nx, ny))


def check(model: dict, gs: list[tuple[int, int]], n_t: list[int], reference: str,
          section: str) -> None:
    """The cross-key checks that need no model: grids, the reference, resampling."""
    if model["space"] == "grid" and len(set(gs)) > 1:
        raise ConfigError(
            f"{section}.n_x / {section}.n_y: model.space = 'grid' stores the controls at the nodes "
            f"of one grid, so it cannot be evaluated on another; expected one grid, got {gs} "
            f"(use model.space = 'polynomial' to refine the grid)"
        )
    if reference == "unsplit" and model["relu"]:
        raise ConfigError(
            f"{section}.reference: 'unsplit' needs a model without ReLU (the unsplit model with "
            f"the S2 projection has no ODE reference); expected 'finest' with model.relu = true"
        )
    if reference == "finest" and len(n_t) < 2 and len(set(gs)) < 2:
        raise ConfigError(
            f"{section}.reference: 'finest' compares each run with the finest one; expected at "
            f"least two values of n_t or two grids, got n_t = {n_t} and grids {gs}"
        )
    if model["constraint"] and min(g[1] for g in gs) < 2:
        raise ConfigError(
            f"{section}.n_y: with model.constraint = true every token (the N_y values at one x) is "
            f"projected onto S1 (mean sigma1, deviation sigma2), which needs at least two values; "
            f"expected n_y >= 2, got {sorted({g[1] for g in gs})}"
        )
    fx, fy = max(g[0] for g in gs), max(g[1] for g in gs)
    for axis, fine, vals in (("x", fx, {g[0] for g in gs}), ("y", fy, {g[1] for g in gs})):
        if len(vals) > 1 and fine < 4:
            raise ConfigError(
                f"{section}.n_{axis}: the finest grid is resampled to the coarser ones by cubic "
                f"splines, which need >= 4 nodes; expected a finest n_{axis} >= 4, got {fine}"
            )


def adaptive_controller(model: dict, n_t, rtol: float, atol: float) -> PIController:
    """The controller of the command's adaptive solves: ``atol = 1e-3 rtol`` when 0, steps at
    most the largest fixed step ``T / min(n_t)`` (the one :func:`preflight` checked)."""
    return PIController(rtol=rtol, atol=atol or 1e-3 * rtol, max_step=model["T"] / min(n_t))


def preflight(model: dict, gs: list[tuple[int, int]], n_t: list[int], schemes, solver,
              reference: str, section: str, rtol: float = 0.0, atol: float = 0.0) -> None:
    """The library's own checks, before the long work: the model can be evaluated on each
    grid with each scheme, and its initial state can be projected onto S1; with ``rtol > 0``
    each scheme can be solved adaptively (:func:`opsplit.adaptive.check_adaptive`: the
    tolerance is one the dtype can meet, the scheme's error can be estimated)."""
    check(model, gs, n_t, reference, section)
    for nx, ny in gs:
        p = build(model, nx, ny)
        if model["constraint"] and bool(constant_tokens(p.f).any()):
            raise ConfigError(
                f"{section}.n_y: the initial state on the {nx} x {ny} grid has a constant token "
                f"(all N_y = {ny} values equal), whose projection onto S1 (model.constraint = "
                f"true) is not defined; expected more nodes n_y"
            )
        for kind in schemes:
            try:
                prop = p.propagator(max(n_t), kind, solver)
                g = prop.resolve_grid(p.f)
                prop.scheme.check(g)
            except (ValueError, TypeError) as e:
                raise ConfigError(
                    f"{section}.n_x / {section}.n_y = ({nx}, {ny}): the model cannot be evaluated "
                    f"on this grid with scheme {kind!r}: {e}"
                ) from None
            # compositions whose substeps leave the step: the controls, on [-margin T, (1 + margin) T],
            # must cover them at both ends for the largest step (fixed, or an adaptive solve's)
            dt = model["T"] / min(n_t)
            for m in prop.scheme.modules():
                if hasattr(m, "check_span"):
                    try:
                        m.check_span(0.0, dt)
                        m.check_span(model["T"] - dt, dt)
                    except ValueError:
                        lo, hi = m.clock_range
                        out = max(-lo, hi - 1.0)
                        need = math.ceil(1000 * out / min(n_t)) / 1000  # rounded up: a margin that passes
                        raise ConfigError(
                            f"model.margin = {model.get('margin', 0.0):g}: scheme {kind!r} runs substeps up to "
                            f"{out:.3g} dt outside each step (negative coefficients), so at the largest step "
                            f"dt = T / {min(n_t)} the controls must extend {out / min(n_t):.3g} T beyond [0, T]; "
                            f"expected model.margin >= {need:g}"
                        ) from None
            if rtol > 0:
                try:
                    check_adaptive(prop.scheme, 0.0, model["T"], adaptive_controller(model, n_t, rtol, atol),
                                   p.f.dtype)
                except (ValueError, TypeError) as e:
                    raise ConfigError(
                        f"{section}.rtol = {rtol:g}: scheme {kind!r} with {solver} substeps cannot be solved by "
                        f"adaptive steps: {e}"
                    ) from None


# -- the size and cost estimate (opsplit.cli.budget) -----------------------------------------


def dopri5_evaluations(x: float, coupled: bool = False) -> float:
    """Field evaluations of ``torchdiffeq``'s dopri5 at rtol 1e-10 over an interval of length
    ``x`` (in units of 1 / model.scale), for one term (a substep) or all terms together
    (``coupled``: the unsplit reference).  Fitted to counts on the seeded model: one term,
    16 at x = 1/32, 30 at 1/4, 43 at 1; all terms, 135 at x = 1, 189 at 4, 507 at 16,
    1263 at 64 (tests/test_cli.py checks a factor 2)."""
    start = 120.0 if coupled else 40.0
    return 14.0 + start * min(x, 1.0) + 20.0 * max(x - 1.0, 0.0)


def field_flops(model: dict, nx: int, ny: int) -> tuple[float, float]:
    """Matrix-product flops of one evaluation of the attention term and of one FFN term on
    the ``nx x ny`` grid, the kernels' evaluation at the time included (the counts of
    ``FlopCounterMode``, checked in tests/test_cli.py)."""
    B, m, q = model["batch"], model["n_modes"], model["n_time"]
    if model["space"] == "polynomial":
        kernel = 2.0 * ny * m * m + 2.0 * ny * ny * m + 2.0 * q * m * m
    else:
        kernel = 2.0 * q * ny * ny
    attention = 6.0 * B * nx * ny * ny + 4.0 * B * nx * nx * ny + 3 * kernel
    ffn = 2.0 * B * nx * ny * ny + kernel
    return attention, ffn


def memory_bytes(model: dict, nx: int, ny: int, kept_states: int = 0, kernels: float = 2.0) -> float:
    """Peak bytes of a solve on the ``nx x ny`` grid: the score matrices (B N_x^2, two to
    three alive), ``kernels`` kernel matrices (N_y^2 each: a split solve evaluates one term
    at a time, the unsplit reference all 3 + J), the solver's states, the controls stored
    at the nodes (model.space = 'grid') and ``kept_states`` float64 solutions."""
    el = 8 if model["dtype"] == "float64" else 4
    B, J, q, m = model["batch"], model["J"], model["n_time"], model["n_modes"]
    state = float(B) * nx * ny
    b = el * (3.0 * B * nx * nx + kernels * float(ny) * ny + 12.0 * state)
    if model["space"] == "grid":
        b += 16.0 * (3 + J) * q * float(ny) * ny
    else:
        b += 16.0 * (3 + J) * q * m * m
    return b + 8.0 * kept_states * state


#: Strang steps' worth of work in one step of a composition (3 Strang steps; 12 sweeps)
STRANG_STEPS = {"triple_jump": 3, "blanes_moan": 6}


def run_estimate(model: dict, nx: int, ny: int, n: int, scheme: str, solver: str) -> Estimate:
    """One solve at N_t = ``n`` (flops and operator calls; memory: :func:`memory_bytes`); a
    composition counts as ``STRANG_STEPS`` Strang steps per step."""
    if scheme in STRANG_STEPS:
        return run_estimate(model, nx, ny, n * STRANG_STEPS[scheme], "strang", solver)
    attention, ffn = field_flops(model, nx, ny)
    J, dt = model["J"], model["T"] / n * model["scale"]
    projections = int(model["constraint"]) + int(model["relu"])
    K = 1 + J + projections
    # (evaluations of the attention term, of each FFN term) per step
    if solver != "odeint":
        per = solver_class(solver).stages  # field evaluations per substep (opsplit.solvers.SOLVERS)
        a, f = (2 * per, (2 * (J - 1) + 1) * per / J) if scheme == "strang" else (per, per)
    elif scheme == "strang":  # half steps, the last FFN term over the whole step
        a = 2 * dopri5_evaluations(dt / 2)
        f = (2 * (J - 1) * dopri5_evaluations(dt / 2) + dopri5_evaluations(dt)) / J
    elif scheme == "parallel":  # K A_k over the whole step
        a = f = dopri5_evaluations(K * dt)
    elif scheme == "hybrid":  # attention alone, the J FFN terms one group (J A_k)
        a, f = dopri5_evaluations(dt), dopri5_evaluations(J * dt)
    else:
        a = f = dopri5_evaluations(dt)
    n = float(n)
    return Estimate(flops=n * (a * attention + J * f * ffn),
                    calls=n * (a + J * f + projections * (2 if scheme == "strang" else 1)),
                    bytes=memory_bytes(model, nx, ny))


def reference_estimate(model: dict, nx: int, ny: int) -> Estimate:
    """The unsplit reference by dopri5 over [0, T]: every term per evaluation."""
    attention, ffn = field_flops(model, nx, ny)
    evals = dopri5_evaluations(model["T"] * model["scale"], coupled=True)
    return Estimate(flops=evals * (attention + model["J"] * ffn),
                    calls=evals * (1 + model["J"] + int(model["constraint"])),
                    bytes=memory_bytes(model, nx, ny, kernels=3 + model["J"]) * 1.5)


def estimate(model: dict, gs, n_t, schemes, solvers, reference: str, repeats: int = 1,
             rtol: float = 0.0) -> Estimate:
    """What :func:`solve_all` costs: the reference, every run (``repeats`` times), and the
    solutions it keeps (one per run, float64) at the peak.  An adaptive solve (``rtol > 0``)
    is not known before it runs: it is counted as three solves at the largest N_t on the
    finest grid (step doubling's three steps per attempt)."""
    gs = sorted(set(gs))
    n_t = sorted(set(n_t))
    fine = (max(g[0] for g in gs), max(g[1] for g in gs))
    total = Estimate()
    if reference == "unsplit":
        total += reference_estimate(model, *fine)
    else:
        for s in schemes:
            for v in solvers:
                total += run_estimate(model, *fine, max(n_t), s, v)
    for s in schemes:
        for v in solvers:
            for g in gs:
                for n in n_t:
                    total += run_estimate(model, *g, n, s, v).times(repeats)
            if rtol > 0:
                total += run_estimate(model, *fine, max(n_t), s, v).times(3 * repeats)
    kept = len(schemes) * len(solvers) * len(n_t)
    peak = max(memory_bytes(model, *g, kept_states=0) for g in gs)
    kept_bytes = 8.0 * kept * sum(float(model["batch"]) * g[0] * g[1] for g in gs)
    return Estimate(total.flops, total.calls, max(total.bytes, peak) + kept_bytes)


def _timed(fn, repeats: int):
    times, out = [], None
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return out, statistics.median(times)


def solve_all(model: dict, gs, n_t, schemes, solvers, reference: str, *, repeats: int = 1,
              progress: bool = True, desc: str = "solving", rtol: float = 0.0, atol: float = 0.0):
    """Solve every (scheme, solver, N_t, grid); returns ``(rows, reference_info)``.

    Errors are relative discrete L2 errors (:func:`opsplit.analysis.relative_error`) against
    ``reference``: ``"unsplit"`` -- the unsplit model by torchdiffeq on the finest grid;
    ``"finest"`` -- the same scheme at the largest N_t on the finest grid.  A coarser grid's
    error is measured after resampling the reference to its nodes.  Substep solves are the
    solve's statistics (``Propagator.solve``; per operator in ``substep_calls``, and the adaptive
    solves' accepted time grid in ``times``).  With ``rtol > 0`` every (scheme, solver) is
    also solved by adaptive steps on the finest grid (``atol``: ``1e-3 rtol`` when 0; steps
    at most ``T / min(n_t)``, the largest fixed step); those rows are
    ``reference_info["adaptive"]``.
    """
    fine = (max(g[0] for g in gs), max(g[1] for g in gs))
    p_fine = build(model, *fine)
    ref_info = {"reference": reference, "n_x": fine[0], "n_y": fine[1]}
    refs = {}
    if reference == "unsplit":
        t0 = time.perf_counter()
        with torch.no_grad():
            u = p_fine.reference()
        ref_info["seconds"] = time.perf_counter() - t0
        for s in schemes:
            for v in solvers:
                refs[s, v] = u
    else:
        ref_info["n_t"] = max(n_t)
        for s in schemes:
            for v in solvers:
                with torch.no_grad():
                    refs[s, v] = p_fine.propagator(max(n_t), s, v)(p_fine.f)
    problems = {g: (p_fine if g == fine else build(model, *g)) for g in gs}
    jobs = [(s, v, n, g) for s in schemes for v in solvers for g in gs for n in n_t]
    if rtol > 0:
        jobs += [(s, v, None, fine) for s in schemes for v in solvers]
    rows, sols, adaptive = [], {}, []
    for s, v, n, g in tqdm(jobs, desc=desc, disable=not progress, leave=False):
        p = problems[g]
        prop = p.propagator(n or 1, s, v)
        # an adaptive step is at most the largest fixed step (the one preflight checked)
        kw = {} if n is not None else {"controller": adaptive_controller(model, n_t, rtol, atol)}
        with torch.no_grad(), warnings.catch_warnings():
            # torch's vmap fallback for SDPA (parallel/hybrid terms batched): a speed note only
            warnings.filterwarnings("ignore", message="There is a performance drop")
            try:
                sol, sec = _timed(lambda prop=prop, p=p, kw=kw: prop.solve(p.f, **kw), repeats)
            except AdaptiveStepError as e:  # one line on stderr, exit status 2 (opsplit.cli.app)
                raise ConfigError(
                    f"{desc}.rtol = {rtol:g}: the adaptive solve of scheme {s!r} with {v} substeps failed: {e}"
                ) from None
        u = sol.u.to(torch.float64).cpu()
        if n is None:
            ref = refs[s, v].to(torch.float64).cpu()
            st = sol.stats
            adaptive.append({
                "scheme": s, "solver": v, "rtol": rtol, "atol": kw["controller"].atol, "n_x": g[0], "n_y": g[1],
                "accepted": st.n_accepted, "rejected": st.n_rejected, "substeps": st.n_substep_calls,
                "min_dt": min(st.step_sizes), "max_dt": max(st.step_sizes),
                "rel_error": relative_error(u, ref, p.grid), "seconds": sec,
                "substep_calls": dict(st.substep_calls), "times": list(st.times),
            })
            continue
        sols[s, v, n, g] = u
        if reference == "finest" and n == max(n_t) and g == fine:
            err = float("nan")  # the reference itself
        else:
            ref = refs[s, v].to(torch.float64).cpu()
            if g != fine:
                ref = resample(ref, p_fine.grid, p.grid)
            err = relative_error(u, ref, p.grid)
        rows.append({
            "scheme": s, "solver": v, "n_t": n, "n_x": g[0], "n_y": g[1],
            "dt": model["T"] / n, "dx": p.grid.x.spacing, "dy": p.grid.y.spacing,
            "substeps": sol.stats.n_substep_calls,
            "rel_error": err, "seconds": sec, "substep_calls": dict(sol.stats.substep_calls),
        })
    # grid error alone: against the same scheme and N_t on the finest grid
    for r in rows:
        g = (r["n_x"], r["n_y"])
        if g == fine:
            r["grid_error"] = float("nan")
            continue
        ref = resample(sols[r["scheme"], r["solver"], r["n_t"], fine], p_fine.grid, problems[g].grid)
        r["grid_error"] = relative_error(sols[r["scheme"], r["solver"], r["n_t"], g], ref,
                                         problems[g].grid)
    if rtol > 0:
        ref_info["adaptive"] = adaptive
    return rows, ref_info


#: why a fitted order has no confidence interval (the report shows the cell empty, with this)
CI_NOTE = "a 95 % confidence interval needs at least three points (this fit has two)"


#: why a run has no error (the report shows the cell empty, with this)
REFERENCE_NOTE = "this run is the reference (the finest run, reference = 'finest')"
GRID_NOTE = "the finest grid is the reference of the grid error"


def statistics_tables(out, rows, ref: dict, prefix: str = "") -> None:
    """Every solve's statistics (``Propagator.solve(...).stats``): ``substep_calls`` -- one row
    per run (fixed N_t, and the adaptive solve of each scheme), accepted and rejected steps
    and the substep calls per operator (columns ``"<index>:<operator>"`` of
    :func:`opsplit.solution.substep_labels`; empty where a scheme has no such substep);
    ``adaptive_times`` -- the time grid each adaptive solve accepted, one row per step."""
    adaptive = ref.get("adaptive") or []
    runs = [{"scheme": r["scheme"], "solver": r["solver"], "run": f"N_t = {r['n_t']}", "n_x": r["n_x"],
             "n_y": r["n_y"], "accepted": r["n_t"], "rejected": 0, **r["substep_calls"], "total": r["substeps"]}
            for r in rows]
    runs += [{"scheme": r["scheme"], "solver": r["solver"], "run": f"adaptive, rtol {r['rtol']:g}", "n_x": r["n_x"],
              "n_y": r["n_y"], "accepted": r["accepted"], "rejected": r["rejected"], **r["substep_calls"],
              "total": r["substeps"]} for r in adaptive]
    ops = sorted({k for r in rows + adaptive for k in r["substep_calls"]}, key=lambda k: (int(k.split(":")[0]), k))
    out.table(f"{prefix}substep_calls", runs,
              ["scheme", "solver", "run", "n_x", "n_y", "accepted", "rejected", *ops, "total"],
              "every solve's statistics: accepted and rejected steps, substep calls per operator (the scheme's "
              "substeps in order; an adaptive solve's include its rejected attempts and its error estimate)")
    if adaptive:
        times = [{"scheme": r["scheme"], "solver": r["solver"], "step": i, "t": t,
                  "dt": "" if i == 0 else t - r["times"][i - 1]}
                 for r in adaptive for i, t in enumerate(r["times"])]
        out.table(f"{prefix}adaptive_times", times, ["scheme", "solver", "step", "t", "dt"],
                  "the time grid of each adaptive solve: the accepted step ends t (step 0: the initial time)")


def add_arguments(p, section: str, *, several_solvers: bool) -> None:
    """The flags ``opsplit solve`` and ``opsplit compare`` share (the schemes, the substep
    solver(s), N_t, the adaptive tolerances, the model's seed and margin); the accepted
    names are the config's (:data:`SCHEMES`, :data:`SOLVERS`)."""
    p.add_argument("--schemes", nargs="+", metavar="S", help=f"{section}.schemes: {' '.join(SCHEMES)}")
    if several_solvers:
        p.add_argument("--solvers", nargs="+", metavar="S", help=f"{section}.solvers: {' '.join(SOLVERS)}")
    else:
        p.add_argument("--solver", help=f"{section}.solver: {', '.join(SOLVERS)}")
    p.add_argument("--n-t", nargs="+", type=int, metavar="N", help="time steps N_t")
    p.add_argument("--rtol", type=float, help="also solve by adaptive steps to this tolerance")
    p.add_argument("--atol", type=float, help="absolute tolerance of the adaptive solve")
    p.add_argument("--seed", type=int, help="model seed")
    p.add_argument("--margin", type=float, help="model.margin: the controls on [-margin T, (1 + margin) T] "
                   "(room for the triple jump's substeps outside a step)")


def overrides(a, section: str, *, several_solvers: bool) -> dict:
    """The config keys of the flags of :func:`add_arguments`."""
    solvers = {f"{section}.solvers": a.solvers} if several_solvers else {f"{section}.solver": a.solver}
    return {f"{section}.schemes": a.schemes, **solvers, f"{section}.n_t": a.n_t, f"{section}.rtol": a.rtol,
            f"{section}.atol": a.atol, "model.seed": a.seed, "model.margin": a.margin}


def check_tolerances(c: dict, section: str) -> None:
    """``atol`` without ``rtol`` has nothing to apply to."""
    if c["atol"] > 0 and c["rtol"] == 0:
        raise ConfigError(
            f"{section}.atol: the adaptive solve runs only with {section}.rtol > 0; expected "
            f"{section}.rtol in (0, 1) with atol = {c['atol']:g}, or atol = 0"
        )


def adaptive_table(out, ref_info: dict, prefix: str = "") -> None:
    """The adaptive solves of :func:`solve_all` (``rtol > 0``), with their statistics."""
    rows = ref_info.get("adaptive")
    if not rows:
        return
    r0 = rows[0]
    out.table(
        f"{prefix}adaptive", rows,
        ["scheme", "solver", "rtol", "atol", "n_x", "n_y", "accepted", "rejected", "substeps", "min_dt",
         "max_dt", "rel_error", "seconds"],
        f"adaptive steps (step doubling, PI controller; rtol {r0['rtol']:g}, atol {r0['atol']:g}, steps at "
        "most the largest fixed step) on the finest grid: accepted and rejected steps, substep solves (the estimate's included), step sizes "
        "(docs/adaptive.md)",
    )


def studies(rows, variable: str, fixed: dict, label_keys=("scheme", "solver"),
            error: str = "rel_error", projections: bool = False):
    """One :class:`~opsplit.analysis.ConvergenceStudy` per (scheme, solver) from ``rows``
    restricted to ``fixed`` (e.g. the finest grid): the column ``error`` against ``dt`` or
    ``h = max(dx, dy)``; rows without a finite positive error are left out.  ``projections``:
    the model has projection terms (the theory of a composition is then 2)."""
    groups: dict = {}
    for r in rows:
        if all(r[k] == v for k, v in fixed.items()):
            groups.setdefault(tuple(r[k] for k in label_keys), []).append(r)
    out = []
    for key, rs in groups.items():
        if variable == "dt":
            rs = sorted(rs, key=lambda r: r["n_t"])
            h = np.array([r["dt"] for r in rs])
            n = [r["n_t"] for r in rs]
        else:
            rs = sorted(rs, key=lambda r: (r["n_x"], r["n_y"]))
            h = np.array([max(r["dx"], r["dy"]) for r in rs])
            n = [(r["n_x"], r["n_y"]) for r in rs]
        e = np.array([r[error] for r in rs])
        keep = np.isfinite(e) & (e > 0)
        h, e, n = h[keep], e[keep], [v for v, k in zip(n, keep) if k]
        if len(np.unique(h)) < 2:
            continue
        label = " / ".join(key)
        if variable == "dt":
            exp = expected_order(*key, projections) if len(key) == 2 else None
        else:
            exp = 2  # midpoint quadrature of the integral operators (docs/grid_convergence.md)
        var = "dt" if variable == "dt" else "dx=dy"
        out.append(ConvergenceStudy(label, var, n, h, e, fit_order(h, e), exp))
    return out


def order_rows(sts, what: str):
    rows = []
    for st in sts:
        f = st.fit
        rows.append({
            "scheme / solver": st.label, "variable": what, "points": f.n_points,
            "order": f.order, "ci95_low": f.ci_low, "ci95_high": f.ci_high,
            "theory": "" if st.expected is None else st.expected,
            "finest error": float(st.errors.min()),
        })
    return rows


__all__ += ["add_arguments", "overrides", "CI_NOTE", "REFERENCE_NOTE", "GRID_NOTE", "statistics_tables", "distinct", "adaptive_controller", "grids", "check", "check_tolerances", "adaptive_table", "studies", "order_rows", "SCHEMES", "SOLVERS", "run_estimate",
            "reference_estimate", "field_flops", "memory_bytes", "dopri5_evaluations"]
