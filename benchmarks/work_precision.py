"""Work-precision diagrams: error against work and against wall time for every splitting
scheme at fixed steps, the adaptive solves, and torchdiffeq's dopri5 and tsit5 on the
unsplit model at the same tolerances (torchdiffeq 0.2.5 has no tsit5: Tsit5 is torchode's,
with its integral controller; ``pip install torchode``).

    OMP_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE python benchmarks/work_precision.py [--quick] [--repeats 3]
        [--problems both|smooth|s1]

Problems (``opsplit.analysis.smooth_transformer``, float64, batch 2, N_x = N_y = 4, J = 2
FFN terms, controls Legendre series in t on [0, 2], solved on [0.5, 1.5] so that the triple
jump's substeps, which read the controls up to 0.35 dt outside a step, stay inside):

1. smooth terms (softmax attention + 2 FFN integral terms);
2. the same with S1(sigma_1(t), sigma_2(t)) as a constraint (moving set), the projection
   method (tangent-projected substeps, ``CatchUp`` for S1).

Methods: Lie, parallel and hybrid (explicit-Euler substeps: they are first order anyway),
Strang (Heun), the triple jump and Blanes-Moan (RK4) at N_t = 1, 2, 4, ...; the adaptive
solves (step doubling; ``+extrap``: with local extrapolation, Blanes-Moan and Strang/RK4 on
the smooth problem) at rtol = 1e-3 ... 1e-8,
atol = 1e-3 rtol; torchdiffeq's dopri5 and torchode's Tsit5 on the unsplit model at the
same rtol and atol.  With S1 the compositions cannot take the projection (negative substeps): they run
the smooth terms inside an outer Strang step that holds the projection (``SchemeFlow``).

Work: substep calls, term field evaluations (Euler 1, Heun 2, RK4 4 per substep call; K
per unsplit evaluation) and wall time (median of --repeats, one thread, parallel schemes
unbatched so that every term evaluation is counted).  Then, per tolerance, the adaptive
Blanes-Moan solve against the cheapest fixed-step run reaching its error (the smallest N_t
by bisection, per scheme); on the smooth problem, the loose-tolerance study (one step's
error estimate against its true error and the extrapolation's gain, for h = T/16 ... T;
the adaptive solve with other first steps and with I control).  Plots to
docs/figures/work_precision_*.png, JSON to benchmarks/out/work_precision.json.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import time
from pathlib import Path

import _common
import torch

from opsplit import Propagator
from opsplit.analysis import relative_error, smooth_transformer
from opsplit.analysis.work_precision import (
    cheapest_fixed,
    plot_work_precision,
    run_adaptive,
    run_fixed,
    run_unsplit,
)
from opsplit.reference import solve_reference
from opsplit.schemes import BlanesMoan, Hybrid, Lie, Parallel, SchemeFlow, Strang, TripleJump
from opsplit.solvers import RK4, CatchUp, Exact, ExplicitEuler, Heun, ProjectedS1, Substep

T0, T1 = 0.5, 1.5
#: the unsplit model's solvers: torchdiffeq's dopri5 and, where the benchmarks' extra is
#: installed (opsplit[benchmarks]), torchode's Tsit5
UNSPLIT = ("dopri5", "tsit5") if importlib.util.find_spec("torchode") else ("dopri5",)


def problem(constraint: bool):
    return smooth_transformer(
        n_x=4, n_y=4, J=2, seed=1 if constraint else 0, T=2.0, constraint=constraint, moving=True
    )


def schemes(p):
    """name -> (scheme, max N_t) for the fixed-step runs, and the adaptive schemes."""
    s1 = p.norm is not None

    def subs(solver):
        out = [Substep(p.norm, CatchUp())] if s1 else []
        return out + [
            Substep(op, ProjectedS1(solver()) if s1 else solver()) for op in p.smooth_terms
        ]

    def smooth_only(solver):
        return [Substep(op, ProjectedS1(solver()) if s1 else solver()) for op in p.smooth_terms]

    def hybrid(solver):
        sub = subs(solver)
        k = 1 if s1 else 0
        groups = ([[0]] if s1 else []) + [[k], [k + 1, k + 2]]
        return Hybrid(sub, groups=groups, batch=False)

    def comp(cls):
        if not s1:
            return cls(subs(RK4))
        # S1 kept in an outer Strang step (the composition cannot run the projection backwards)
        return Strang(
            [Substep(p.norm, CatchUp()), Substep(SchemeFlow(cls(smooth_only(RK4))), Exact())]
        )

    fixed = {
        "lie / euler": (Lie(subs(ExplicitEuler)), 512),
        "parallel / euler": (Parallel(subs(ExplicitEuler), batch=False), 512),
        "hybrid / euler": (hybrid(ExplicitEuler), 512),
        "strang / heun": (Strang(subs(Heun)), 512),
        ("strang[S1] + triple jump / rk4" if s1 else "triple jump / rk4"): (comp(TripleJump), 128),
        ("strang[S1] + blanes-moan / rk4" if s1 else "blanes-moan / rk4"): (comp(BlanesMoan), 128),
    }
    adaptive = {
        "adaptive strang / heun": (Strang(subs(Heun)), "doubling"),
        ("adaptive strang[S1] + blanes-moan" if s1 else "adaptive blanes-moan"): (
            comp(BlanesMoan),
            "doubling",
        ),
    }
    if not s1:  # an affine combination would leave S1
        adaptive["adaptive blanes-moan +extrap"] = (comp(BlanesMoan), "extrapolate")
        # a cheaper order-4 value: Strang/RK4 extrapolated (3 Strang steps = 15 calls per attempt)
        adaptive["adaptive strang / rk4 +extrap"] = (Strang(subs(RK4)), "extrapolate")
    return fixed, adaptive


def study(constraint: bool, args):
    p = problem(constraint)
    name = "S1 constraint (moving)" if constraint else "smooth terms"
    ops = [*p.smooth_terms] + ([p.norm] if constraint else [])
    terms = p.smooth_terms
    ref = solve_reference(ops, p.f, t0=T0, t1=T1, grid=p.grid, rtol=1e-13, atol=1e-15)
    fixed, adaptive = schemes(p)
    points = []
    print(f"\n== {name}: N_x = N_y = 4, J = 2, batch 2, float64, t in [{T0}, {T1}] ==", flush=True)
    hdr = f"  {'method':<36} {'setting':>9} {'error':>9} {'calls':>7} {'evals':>7} {'acc/rej':>8} {'ms':>8}"
    print(hdr)
    for label, (scheme, n_max) in fixed.items():
        n_max = min(n_max, args.n_max)
        ns = [n for n in (1, 2, 4, 8, 16, 32, 64, 128, 256, 512) if n <= n_max]
        prop = Propagator(scheme, 1, t0=T0, t1=T1, grid=p.grid)
        pts = run_fixed(label, prop, p.f, ref, ns, terms, grid=p.grid, repeats=args.repeats)
        points += pts
        for q in pts:
            print(
                f"  {label:<36} {q.setting:>9} {q.error:9.2e} {q.substep_calls:7d} {q.evaluations:7d} "
                f"{q.accepted:>4}/{q.rejected:<3} {1e3 * q.seconds:8.1f}",
                flush=True,
            )
    for label, (scheme, est) in adaptive.items():
        prop = Propagator(scheme, 1, t0=T0, t1=T1, grid=p.grid)
        pts = run_adaptive(
            label,
            prop,
            p.f,
            ref,
            args.rtols,
            terms,
            grid=p.grid,
            repeats=args.repeats,
            estimator=est,
        )
        points += pts
        for q in pts:
            print(
                f"  {label:<36} {q.setting:>9.0e} {q.error:9.2e} {q.substep_calls:7d} {q.evaluations:7d} "
                f"{q.accepted:>4}/{q.rejected:<3} {1e3 * q.seconds:8.1f}",
                flush=True,
            )
    for solver in UNSPLIT:
        label = f"{solver} ({'torchdiffeq' if solver == 'dopri5' else 'torchode'}, unsplit)"
        pts = run_unsplit(
            label,
            ops,
            p.f,
            ref,
            args.rtols,
            t0=T0,
            t1=T1,
            grid=p.grid,
            solver=solver,
            repeats=args.repeats,
        )
        points += pts
        for q in pts:
            print(
                f"  {label:<36} {q.setting:>9.0e} {q.error:9.2e} {'-':>7} {q.evaluations:7d} {'':>8} "
                f"{1e3 * q.seconds:8.1f}",
                flush=True,
            )
    return p, ref, fixed, adaptive, points, name


def versus_fixed(p, ref, fixed, adaptive_label, points, args, cache):
    """Per tolerance: the adaptive solve against the cheapest fixed-step run reaching its error.

    Schemes are searched in order of their order; a later scheme is searched only up to the
    N_t at which it would cost as many evaluations as the best run found so far (beyond that
    it cannot be cheaper)."""
    terms = p.smooth_terms
    print(
        f"\n  {adaptive_label} against the cheapest fixed-step run reaching the same error "
        "(smallest N_t per scheme, by bisection; evals = term field evaluations)"
    )
    print(
        f"  {'rtol':>7} {'error':>9} {'<=10rtol':>8} {'calls':>7} {'evals':>7} | {'cheapest fixed':<36} "
        f"{'N_t':>5} {'calls':>7} {'evals':>7} | {'calls ratio':>11} {'evals ratio':>11}"
    )
    order = sorted(fixed, key=lambda k: -fixed[k][0].effective_order)
    rows = []
    for q in [q for q in points if q.method == adaptive_label]:
        best = None
        for label in order:
            scheme = fixed[label][0]
            prop = Propagator(scheme, 1, t0=T0, t1=T1, grid=p.grid)
            per_step = cache.setdefault(
                (label, "per_step"),
                run_fixed(label, prop, p.f, ref, [1], terms, grid=p.grid)[0].evaluations,
            )
            n_max = (
                args.search_max
                if best is None
                else min(args.search_max, int(best.evaluations // per_step))
            )
            if n_max < 1:
                continue
            n, _ = cheapest_fixed(
                prop, p.f, ref, q.error, grid=p.grid, n_max=n_max, cache=cache.setdefault(label, {})
            )
            if n is None:
                continue
            run = run_fixed(label, prop, p.f, ref, [n], terms, grid=p.grid)[0]
            if best is None or run.evaluations < best.evaluations:
                best = run
        ok = "yes" if q.error <= 10 * q.setting else "NO"
        rows.append(
            {
                "rtol": q.setting,
                "error": q.error,
                "calls": q.substep_calls,
                "evals": q.evaluations,
                "within_10_rtol": q.error <= 10 * q.setting,
                "fixed": None if best is None else best.to_dict(),
            }
        )
        if best is None:
            print(
                f"  {q.setting:7.0e} {q.error:9.2e} {ok:>8} {q.substep_calls:7d} {q.evaluations:7d} | "
                f"none within N_t <= {args.search_max}"
            )
            continue
        print(
            f"  {q.setting:7.0e} {q.error:9.2e} {ok:>8} {q.substep_calls:7d} {q.evaluations:7d} | {best.method:<36} "
            f"{best.setting:5d} {best.substep_calls:7d} {best.evaluations:7d} | "
            f"{q.substep_calls / best.substep_calls:11.2f} {q.evaluations / best.evaluations:11.2f}",
            flush=True,
        )
    return rows


def loose_tolerance(p, ref, fixed, args, cache):
    """Why the adaptive Blanes-Moan solve (step doubling, local extrapolation) over-solves at
    loose tolerances: (1) the estimate against the true local error of one step from T0 of
    size h (error norm of the controller, and relative L2), and the extrapolated value's
    true error; (2) the solve with other first steps and with I control (pcoeff = 0), and
    each run's substep calls against the cheapest fixed Blanes-Moan run reaching its error."""
    from opsplit.adaptive import PIController, StepDoubling

    label = "blanes-moan / rk4"
    scheme = fixed[label][0]
    prop = Propagator(scheme, 1, t0=T0, t1=T1, grid=p.grid)
    est = StepDoubling(scheme, extrapolate=True)
    ctl = PIController(rtol=1e-3, atol=1e-6)
    out = {"one_step": [], "variants": []}
    print(
        "\n  loose tolerances: one step from t = T0 of Blanes-Moan with step doubling (rtol 1e-3, "
        "atol 1e-6; norm = the controller's error norm, largest sample)"
    )
    print(
        f"  {'h':>7} {'norm est':>9} {'norm true':>9} {'relL2 est':>9} {'relL2 w':>9} "
        f"{'relL2 extr':>10} {'gain':>6}"
    )
    for h in (1 / 16, 1 / 8, 1 / 4, 1 / 2, 1.0):
        loc = solve_reference(
            [*p.smooth_terms], p.f, t0=T0, t1=T0 + h, grid=p.grid, rtol=1e-13, atol=1e-15
        )
        with torch.no_grad():
            w, err = est.attempt(T0, T0 + h, p.f, p.grid, False)
            w = w - err  # the two half steps (attempt returns the extrapolated value)
            row = {
                "h": h,
                "norm_est": float(ctl.error_norm(err, p.f, w).max()),
                "norm_true": float(ctl.error_norm(w - loc, p.f, w).max()),
                "rel_est": relative_error(w + err, w, p.grid),
                "rel_halves": relative_error(w, loc, p.grid),
                "rel_extrapolated": relative_error(w + err, loc, p.grid),
            }
        out["one_step"].append(row)
        print(
            f"  {h:7.4f} {row['norm_est']:9.2e} {row['norm_true']:9.2e} {row['rel_est']:9.2e} "
            f"{row['rel_halves']:9.2e} {row['rel_extrapolated']:10.2e} "
            f"{row['rel_halves'] / row['rel_extrapolated']:6.1f}"
        )
    print(
        "\n  adaptive Blanes-Moan +extrap with other first steps / I control, against the "
        "cheapest fixed Blanes-Moan run reaching its error"
    )
    print(
        f"  {'rtol':>7} {'first step':>10} {'pcoeff':>6} {'error':>9} {'acc/rej':>8} {'calls':>6} "
        f"{'fixed N_t':>9} {'calls':>6} {'ratio':>6}"
    )
    for rtol in (1e-3, 1e-4):
        for first in (None, 0.25, 0.5, 1.0):
            for pcoeff in (0.4, 0.0):
                c = PIController(rtol=rtol, atol=1e-3 * rtol, first_step=first, pcoeff=pcoeff)
                with torch.no_grad():
                    sol = prop.solve(p.f, controller=c, estimator="extrapolate")
                e = relative_error(sol.u, ref, p.grid)
                n, st = cheapest_fixed(
                    prop,
                    p.f,
                    ref,
                    e,
                    grid=p.grid,
                    n_max=args.search_max,
                    cache=cache.setdefault(label, {}),
                )
                row = {
                    "rtol": rtol,
                    "first_step": first,
                    "pcoeff": pcoeff,
                    "error": e,
                    "accepted": sol.stats.n_accepted,
                    "rejected": sol.stats.n_rejected,
                    "calls": sol.stats.n_substep_calls,
                    "fixed_n": n,
                    "fixed_calls": None if st is None else st.n_substep_calls,
                }
                out["variants"].append(row)
                ratio = float("nan") if st is None else row["calls"] / st.n_substep_calls
                print(
                    f"  {rtol:7.0e} {'T/16' if first is None else first:>10} {pcoeff:6.1f} {e:9.2e} "
                    f"{sol.stats.n_accepted:>4}/{sol.stats.n_rejected:<3} {row['calls']:6d} "
                    f"{n if n else '-':>9} {row['fixed_calls'] or '-':>6} {ratio:6.2f}",
                    flush=True,
                )
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--quick", action="store_true", help="fewer tolerances and step counts")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument(
        "--problems",
        choices=("both", "smooth", "s1"),
        default="both",
        help="which problem to run (figures and JSON keys of the others are left as they are)",
    )
    ap.add_argument("--figures", default=str(_common.ROOT / "docs" / "figures"))
    ap.add_argument("--json", default=str(_common.OUT / "work_precision.json"))
    args = ap.parse_args(argv)
    args.rtols = [1e-3, 1e-4, 1e-5, 1e-6] if args.quick else [1e-3, 1e-4, 1e-5, 1e-6, 1e-7, 1e-8]
    args.n_max = 64 if args.quick else 512
    args.search_max = 256 if args.quick else 4096
    if args.quick:
        args.repeats = 1
    torch.set_num_threads(1)
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} thread, OMP_WAIT_POLICY="
        f"{os.environ.get('OMP_WAIT_POLICY', '')}, repeats {args.repeats}"
        + ("" if "tsit5" in UNSPLIT else "; no torchode (pip install torchode): no Tsit5 rows")
    )
    t_start = time.perf_counter()
    out = {}
    if Path(args.json).exists() and args.problems != "both":
        out = json.loads(Path(args.json).read_text())
    _common.pyplot()
    for constraint in (False, True):
        key = "s1" if constraint else "smooth"
        if args.problems not in ("both", key):
            continue
        p, ref, fixed, adaptive, points, name = study(constraint, args)
        cache = {}
        rows = {lab: versus_fixed(p, ref, fixed, lab, points, args, cache) for lab in adaptive}
        out[key] = {"points": [q.to_dict() for q in points], "versus_fixed": rows}
        if not constraint:
            out[key]["loose_tolerance"] = loose_tolerance(p, ref, fixed, args, cache)
        fig = plot_work_precision(points, title=f"work-precision: {name}")
        Path(args.figures).mkdir(parents=True, exist_ok=True)
        fig.savefig(Path(args.figures) / f"work_precision_{key}.png", dpi=110)
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(out, indent=1))
    print(
        f"\ntotal {time.perf_counter() - t_start:.0f} s; figures in {args.figures}, data in {args.json}"
    )
    return out


if __name__ == "__main__":
    main()
