"""Adaptive steps and the projections of paper 002's model: which models step doubling can
solve to a tolerance, measured.

    OMP_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE python benchmarks/adaptive_projections.py [--quick]

Problem: ``opsplit.analysis.smooth_transformer(n_x=4, n_y=4, J=1, seed=0)`` (softmax
attention + one FFN integral term, controls Legendre series in t on [0, 1], float64,
batch 2), with the S1 constraint (moving sigma(t); tangent-projected RK4 substeps,
``CatchUp`` for S1), the ReLU (``ProjectionS2``, ``Implicit``), or both.

1. **The step-doubling difference** ``|Psi_{h/2} Psi_{h/2} u - Psi_h u| / |u|`` (Strang and
   Lie, RK4 substeps) at h = 1e-2, 1e-4, 1e-6, from the initial state f and from the state
   at t = 0.5 of a fixed-step solve (N_t = 512): it must shrink like h^(p+1) for an error
   estimate to exist.  Measured with ``StepDoubling`` directly (the adaptive solve refuses
   the models with the ReLU before compute).
2. **Tolerance proportionality** of the admitted model (S1 alone): the adaptive solve
   (step doubling, PI controller, atol = 1e-3 rtol) of Lie, Strang, hybrid and Blanes-Moan
   (in an outer Strang step with S1) at rtol = 1e-2 ... 1e-6, error against the unsplit
   model (torchdiffeq dopri5 at rtol 1e-10, S1 as a constraint), relative discrete L2.
3. **What is refused**, and the first clause of the message.
4. **Near the dtype's tolerance floor** (``opsplit.adaptive.min_rtol``: 100 eps): the
   smooth model (no projection) in float32 at rtol = 2e-5 and in float64 at rtol = 3e-14,
   error against the unsplit float64 model (dopri5 at rtol 1e-13).

Prints the tables and writes benchmarks/out/adaptive_projections.json.  ``--quick``:
rtol = 1e-2 ... 1e-4 in part 2.
"""

from __future__ import annotations

import argparse
import json
import time
import warnings

import _common
import torch

from opsplit.adaptive import PIController, StepDoubling, adaptive_obstacle
from opsplit.analysis import relative_error, smooth_transformer


def problem(constraint: bool, relu: bool):
    return smooth_transformer(n_x=4, n_y=4, J=1, seed=0, constraint=constraint, relu=relu)


def differences(rows: list) -> None:
    print("\n1. step doubling |w - v| / |w| (w: two half steps, v: one step)")
    print(f"{'model':<10} {'scheme':<7} {'from':<8} {'h=1e-2':>9} {'h=1e-4':>9} {'h=1e-6':>9}")
    for name, c, r in (("S1", True, False), ("ReLU", False, True), ("S1 + ReLU", True, True)):
        p = problem(c, r)
        for kind in ("lie", "strang"):
            prop = p.propagator(512, kind, "rk4")
            with torch.no_grad():
                mid = prop.solve(p.f, t_eval=[0.5]).ys[:, 0]
            est = StepDoubling(prop.scheme)  # propagates the two half steps (no extrapolation)
            for where, t, u in (("f, t=0", 0.0, p.f), ("t=0.5", 0.5, mid)):
                ds = []
                for h in (1e-2, 1e-4, 1e-6):
                    with torch.no_grad():
                        w = est.propagate(t, t + h, u, p.grid)
                        v = prop.scheme.step(t, h, u, p.grid)
                    ds.append(float((w - v).norm() / w.norm()))
                rows.append({"model": name, "scheme": kind, "from": where, "h": [1e-2, 1e-4, 1e-6], "diff": ds})
                print(f"{name:<10} {kind:<7} {where:<8} " + " ".join(f"{d:9.2e}" for d in ds))


def proportionality(rows: list, rtols) -> None:
    print("\n2. S1 alone, adaptive: error against the unsplit model")
    print(f"{'scheme':<12} {'rtol':>7} {'accepted':>8} {'rejected':>8} {'error':>9} {'error/rtol':>10} {'s':>6}")
    p = problem(True, False)
    ref = p.reference()
    for kind in ("lie", "strang", "hybrid", "blanes_moan"):
        prop = p.propagator(1, kind, "rk4")
        for rtol in rtols:
            t0 = time.perf_counter()
            with torch.no_grad():
                sol = prop.solve(p.f, controller=PIController(rtol=rtol, atol=1e-3 * rtol))
            sec = time.perf_counter() - t0
            e = relative_error(sol.u, ref)
            st = sol.stats
            rows.append({"scheme": kind, "rtol": rtol, "accepted": st.n_accepted, "rejected": st.n_rejected,
                         "error": e, "seconds": sec})
            print(f"{kind:<12} {rtol:7.0e} {st.n_accepted:8d} {st.n_rejected:8d} {e:9.2e} {e / rtol:10.2f} {sec:6.1f}")


def refused(rows: list) -> None:
    print("\n3. refused before compute")
    for name, c, r in (("S1", True, False), ("ReLU", False, True), ("S1 + ReLU", True, True)):
        p = problem(c, r)
        for kind in ("lie", "strang", "parallel", "hybrid", "triple_jump", "blanes_moan"):
            why = adaptive_obstacle(p.scheme(kind, "rk4"))
            rows.append({"model": name, "scheme": kind, "refused": why})
            verdict = "accepted" if why is None else "refused: " + why.split(" (")[0]
            print(f"{name:<10} {kind:<12} {verdict}")


def near_floor(rows: list) -> None:
    print("\n4. near the tolerance floor (100 eps), smooth model, RK4 substeps")
    ref = smooth_transformer(n_x=4, n_y=4, J=1, seed=0).reference(rtol=1e-13, atol=1e-15)
    for dtype, rtol, kind in ((torch.float32, 2e-5, "strang"), (torch.float32, 2e-5, "blanes_moan"),
                              (torch.float64, 3e-14, "blanes_moan")):
        p = smooth_transformer(n_x=4, n_y=4, J=1, seed=0, dtype=dtype)
        t0 = time.perf_counter()
        with torch.no_grad():
            sol = p.propagator(1, kind, "rk4").solve(p.f, controller=PIController(rtol=rtol, atol=1e-3 * rtol))
        e = relative_error(sol.u.double(), ref)
        rows.append({"dtype": str(dtype), "rtol": rtol, "scheme": kind, "accepted": sol.stats.n_accepted, "error": e})
        print(f"{str(dtype):<14} {kind:<12} rtol {rtol:7.0e} accepted {sol.stats.n_accepted:4d} error {e:9.2e} "
              f"({e / rtol:.2f} rtol) {time.perf_counter() - t0:6.1f} s")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    warnings.filterwarnings("ignore", message="There is a performance drop")
    print(f"load: {_common.loadavg():.2f} (1-minute average), threads {torch.get_num_threads()}")
    out = {"differences": [], "proportionality": [], "refused": [], "near_floor": []}
    differences(out["differences"])
    proportionality(out["proportionality"], [1e-2, 1e-3, 1e-4] if args.quick else [1e-2, 1e-3, 1e-4, 1e-5, 1e-6])
    refused(out["refused"])
    near_floor(out["near_floor"])
    (_common.out_dir() / "adaptive_projections.json").write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
