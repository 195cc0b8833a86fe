"""Measured convergence orders of the splitting schemes, in time and in space.

Run from the repository root::

    python3 benchmarks/convergence.py            # full tables and plots (a few minutes)
    python3 benchmarks/convergence.py --quick    # fewer points

For a seeded smooth continuous transformer (``opsplit.analysis.smooth_transformer``:
softmax attention + J = 2 FFN integral terms, controls Legendre series in time, on
[0, 1] x [0, 1]) it prints the fitted temporal order (least squares on log-log, 95%
confidence interval) of Lie, Strang, parallel and hybrid splitting with explicit-Euler,
Heun (RK2), RK4 and torchdiffeq (dopri5, rtol 1e-10) substeps:

1. smooth terms only, against the unsplit model solved by torchdiffeq (rtol 1e-10);
2. with S1(sigma_1(t), sigma_2(t)) as a constraint (moving manifold): the projection
   method (tangent-projected fields, ``ProjectedS1``; ``CatchUp`` for S1) and the
   paper-style substeps (plain fields, then the S1 projection), against the constrained
   reference;
3. with ReLU (S2) (a) instead of S1 and (b) together with S1: no ODE reference exists,
   so the order is measured by self-convergence (successive differences) and reported as
   measured;

then a model with controls piecewise-linear in time trained 10 Adam steps at N_t = 6,
solved at N_t = 6, 12, 24, 48; and the spatial study: one continuous model (Legendre
kernels in (y~, y, x) and time) solved at N_y = 16, 32, 64, 128 and at N_x alike, against
N = 1024.  Tables go to stdout, plots and JSON to benchmarks/out/.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import _common
import torch

from opsplit.analysis import (
    fit_order,
    plot_convergence,
    self_convergence,
    smooth_transformer,
    spatial_convergence,
    temporal_convergence,
)

OUT = str(_common.OUT)
SCHEMES = ["lie", "strang", "parallel", "hybrid"]
SOLVERS = ["euler", "heun", "rk4", "odeint"]
THEORY = {"lie": 1, "strang": 2, "parallel": 1, "hybrid": 1}


def expected(kind, solver):
    return 1 if solver == "euler" else THEORY[kind]


def row(label, st, theory=None):
    e = " ".join(f"{v:.2e}" for v in st.errors)
    th = "" if theory is None else f"{theory:>6}"
    print(f"  {label:<34} {str(st.fit):<34} {th}   errors: {e}", flush=True)


def temporal_table(title, problem, ns, projection="tangent", solvers=SOLVERS, reference=True):
    print(f"\n{title}\n  N_t = {ns}", flush=True)
    print(f"  {'scheme / substeps':<34} {'fitted order (95% CI)':<34} {'theory':>6}")
    ref = problem.reference() if reference else None
    studies = []
    for kind in SCHEMES:
        for solver in solvers:
            t = time.perf_counter()

            def solve(n, kind=kind, solver=solver):
                with torch.no_grad():
                    return problem.propagator(n, kind, solver, projection)(problem.f)

            label = f"{kind} / {solver}"
            if reference:
                st = temporal_convergence(
                    solve, ns, ref, t1=problem.T, label=label, expected=expected(kind, solver)
                )
                row(label, st, expected(kind, solver))
            else:
                st = self_convergence(solve, ns, t1=problem.T, label=label)
                row(label + " (self)", st, "-")
            st.meta["seconds"] = time.perf_counter() - t
            studies.append(st)
    return studies


def trained_nt6(quick):
    p = smooth_transformer(
        n_x=4, n_y=4, J=1, time="piecewise_linear", n_time=7, constraint=True, moving=True, seed=3
    )
    train = p.propagator(6, "lie", "euler")
    torch.manual_seed(0)
    target = torch.randn_like(p.f)
    opt = torch.optim.Adam(train.parameters(), lr=1e-2)
    for _ in range(10):
        opt.zero_grad()
        (train(p.f) - target).square().mean().backward()
        opt.step()
    ns = [6, 12, 24, 48]
    print(
        f"\nTrained at N_t = 6 (10 Adam steps, Lie / projected Euler), solved at N_t = {ns}; "
        "S1 constraint; controls piecewise-linear with nodes t^n = n/6"
    )
    studies = []
    with torch.no_grad():
        ref = p.reference()
        for kind, solver in [
            ("lie", "euler"),
            ("strang", "heun"),
            ("strang", "rk4"),
            ("hybrid", "euler"),
            ("parallel", "euler"),
        ]:
            st = temporal_convergence(
                lambda n, k=kind, s=solver: p.propagator(6, k, s)(p.f, n_steps=n),
                ns,
                ref,
                label=f"{kind} / {solver}",
                expected=expected(kind, solver),
            )
            tail = fit_order(st.h[1:], st.errors[1:])
            row(f"{kind} / {solver}", st, expected(kind, solver))
            print(f"  {'':<34} from N_t = 12: {tail}")
            studies.append(st)
    return studies


def spatial(quick):
    ns = [16, 32, 64] if quick else [16, 32, 64, 128]
    n_ref = 256 if quick else 1024
    out = []
    for axis in ("y", "x"):

        def solve(n, axis=axis):
            kw = dict(n_x=6, n_y=n) if axis == "y" else dict(n_x=n, n_y=6)
            p = smooth_transformer(**kw, space="polynomial", J=1, constraint=True, seed=4)
            with torch.no_grad():
                return p.reference(rtol=1e-11, atol=1e-13), p.grid

        t = time.perf_counter()
        st = spatial_convergence(
            solve, ns, solve(n_ref), axis=axis, label=f"N_{axis} (midpoint rule)", expected=2
        )
        print(
            f"  N_{axis} = {ns} vs N_{axis} = {n_ref}: order {st.fit}  theory 2   errors: "
            + " ".join(f"{v:.2e}" for v in st.errors)
            + f"   ({time.perf_counter() - t:.0f} s)",
            flush=True,
        )
        out.append(st)
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="fewer points, smaller reference grids")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (tiny tensors: 1)")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.set_default_dtype(torch.float64)
    os.makedirs(OUT, exist_ok=True)
    ns = [8, 16, 32, 64] if args.quick else [8, 16, 32, 64, 128]
    t0 = time.perf_counter()
    results = {}

    smooth = smooth_transformer(n_x=4, n_y=4, J=2, seed=0)
    results["smooth"] = temporal_table(
        "1. Smooth terms (softmax attention + 2 FFN integral terms, no projections), vs torchdiffeq",
        smooth,
        ns,
    )
    s1 = smooth_transformer(n_x=4, n_y=4, J=2, seed=1, constraint=True, moving=True)
    results["s1_tangent"] = temporal_table(
        "2a. S1 as a constraint (sigma(t) moving): projection method on the tangent-projected fields",
        s1,
        ns,
    )
    results["s1_plain"] = temporal_table(
        "2b. S1 as a constraint: paper-style substeps (plain fields, then the S1 projection)",
        s1,
        ns,
        projection="plain",
        solvers=["euler", "heun"],
    )
    relu = smooth_transformer(n_x=4, n_y=4, J=2, seed=1, relu=True)
    results["relu"] = temporal_table(
        "3a. Smooth terms + ReLU (S2), no S1: non-smooth, no ODE reference; self-convergence "
        "(difference to the solution at 2 N_t), measured only",
        relu,
        ns + [ns[-1] * 2],
        solvers=["euler", "heun"],
        reference=False,
    )
    relu_s1 = smooth_transformer(n_x=4, n_y=4, J=2, seed=1, constraint=True, moving=True, relu=True)
    results["relu_s1"] = temporal_table(
        "3b. S1 constraint + ReLU (S2): self-convergence, measured only",
        relu_s1,
        ns + [ns[-1] * 2],
        solvers=["euler", "heun"],
        reference=False,
    )
    results["nt6"] = trained_nt6(args.quick)
    print(
        "\n4. Spatial: one continuous model (Legendre kernels in y~, y, x and t; S1 constraint), "
        "solved by torchdiffeq (rtol 1e-11) on each grid"
    )
    results["space"] = spatial(args.quick)

    plot_convergence(
        [s for s in results["smooth"] if s.label.split(" / ")[1] in ("euler", "heun")],
        os.path.join(OUT, "convergence_time.png"),
        title="smooth transformer: error vs Δt (Euler and Heun substeps)",
    )
    plot_convergence(
        [s for s in results["s1_tangent"] if s.label.split(" / ")[1] in ("euler", "heun")],
        os.path.join(OUT, "convergence_time_s1.png"),
        title="S1 constraint, projection method: error vs Δt",
    )
    plot_convergence(
        results["nt6"],
        os.path.join(OUT, "convergence_nt6.png"),
        title="trained at N_t = 6, solved at N_t = 6, 12, 24, 48",
    )
    plot_convergence(
        results["space"],
        os.path.join(OUT, "convergence_space.png"),
        title="same continuous model at N_y, N_x = 16 ... 128",
    )
    _common.pyplot().close("all")
    with open(os.path.join(OUT, "convergence.json"), "w") as fh:
        json.dump({k: [s.to_dict() for s in v] for k, v in results.items()}, fh, indent=1)
    print(f"\nplots and JSON in {OUT}  (total {time.perf_counter() - t0:.0f} s)")


if __name__ == "__main__":
    main()
