"""``opsplit grid``: the continuous transformer (:class:`opsplit.models.ContinuousTransformer`,
paper 002's scheme (13)-(17) with cosine-series kernels on [0, 1] x [0, 1]) solved on nested
midpoint grids N = 9, 27, 81, ... and compared with the next finer level's reference at
the common nodes (no interpolation): the errors fall like N^-2."""

from __future__ import annotations

import math
import time

import torch

from ..models import ContinuousTransformer
from .budget import Estimate, guard
from .config import MAX_SEED, ConfigError, Field, seed_field
from .threads import describe

NAME = "grid"
SUMMARY = "nested-grid convergence of the paper's scheme with smooth kernels (printed table)"
EXAMPLE = """\
examples:
  opsplit grid                     # N = 9, 27, 81, 243 against N = 729
  opsplit grid --levels 2 --steps 2
"""
SCHEMA = None


def _l2(g, e):
    """Discrete L2(Omega_x x Omega_y) norm, per batch entry, averaged."""
    wx = g.x.weights(e.dtype)
    wy = g.y.weights(e.dtype)
    return float(((e * e) * wx[:, None] * wy[None, :]).sum((-1, -2)).sqrt().mean())


def grid_study(resolutions=(9, 27, 81, 243), reference=729, n_steps=4, seed=0, batch=4):
    """Relative L2 and max errors of the solutions at ``resolutions`` against the solution
    at ``reference`` (an odd multiple of each), at the common nodes."""
    for n in resolutions:
        if reference % n or (reference // n) % 2 == 0:
            raise ValueError(f"reference N={reference} must be an odd multiple of N={n}")
    gen = torch.Generator().manual_seed(seed)
    model = ContinuousTransformer(
        n_modes=4, J=2, n_steps=n_steps, T=1.0, generator=gen, dtype=torch.float64
    )
    fc = torch.randn(batch, 4, 4, generator=gen, dtype=torch.float64)
    fc /= (1 + torch.arange(4, dtype=torch.float64))[:, None] ** 2
    rows = []
    with torch.no_grad():
        t0 = time.perf_counter()
        ref = model(model.sample(fc, reference, reference))
        t_ref = time.perf_counter() - t0
        for n in resolutions:
            t0 = time.perf_counter()
            u = model(model.sample(fc, n, n))
            dt = time.perf_counter() - t0
            g = model.grid.with_shape(n, n)
            r = reference // n  # coarse midpoint node i is fine node r*i + (r-1)/2
            ref_n = ref[:, r // 2 :: r, r // 2 :: r]
            e = u - ref_n
            rows.append((n, _l2(g, e) / _l2(g, ref_n), float(e.abs().max()), dt))
    return model, rows, t_ref


def add_arguments(p):
    p.add_argument("--seed", type=int, default=0, help=f"seed of the kernels and inputs (0 to {MAX_SEED})")
    p.add_argument("--steps", type=int, default=4, help="time steps N_t (T = 1)")
    p.add_argument("--levels", type=int, default=4, help="grids N = 9, 27, ... (3^(k+1))")


#: the flags as a schema, for the size and cost guard's messages
ARGS = {"-": {"steps": Field("int", 4), "levels": Field("int", 4)}}
J, BATCH = 2, 4


def estimate(cfg) -> Estimate:
    """Every grid and the reference: per step, the attention term (10 B N^3 flops of matrix
    products) and J FFN terms (2 B N^3 each) on N x N nodes (FlopCounterMode: 56 N^3 with
    B = 4, J = 2); memory: the reference's scores, kernels and states."""
    a = cfg["-"]
    res = [3 ** (k + 2) for k in range(a["levels"])]
    ns = [*res, 3 * res[-1]]
    flops = a["steps"] * sum(BATCH * (10.0 + 2.0 * J) * float(n) ** 3 for n in ns)
    calls = a["steps"] * len(ns) * (J + 3.0)
    big = float(ns[-1])
    return Estimate(flops, calls, 8.0 * (3.0 * BATCH * big * big + (3 + J) * big * big + 12.0 * BATCH * big * big))


def run_grid(args):
    seed_field("--seed").validate(args.seed, "--seed")
    Field("int", 4).validate(args.steps, "--steps")
    if args.steps < 1:
        raise ConfigError(f"--steps: expected N_t >= 1, got {args.steps}")
    if not 1 <= args.levels <= 5:
        raise ConfigError(f"--levels: expected 1 to 5 levels (N up to 3^6 = 729), got {args.levels}")
    guard("opsplit grid", ARGS, {"-": {"steps": args.steps, "levels": args.levels}}, estimate,
          args.force)
    res = tuple(3 ** (k + 2) for k in range(args.levels))
    reference = 3 * res[-1]
    model, rows, t_ref = grid_study(res, reference, args.steps, args.seed)
    print("opsplit: a seeded continuous transformer (paper 002, eq. 7; Lie scheme (13)-(17))")
    print(f"  torch: {describe()}")
    print(f"  Omega = [0, 1] x [0, 1], smooth cosine-series kernels, J = {model.J}, "
          f"N_t = {model.n_steps}, dt = {model.dt():g}, float64, midpoint quadrature")
    print(f"  reference: N_x = N_y = {reference} ({t_ref:.2f} s)")
    print()
    print(f"  {'N_x = N_y':>9}  {'rel. L2 error':>13}  {'max error':>10}  {'order':>5}  {'time':>7}")
    prev = None
    for n, rel, mx, dt in rows:
        order = "" if prev is None else f"{math.log(prev / rel, 3):5.2f}"
        print(f"  {n:>9}  {rel:>13.3e}  {mx:>10.3e}  {order:>5}  {dt:>6.3f}s")
        prev = rel
    print()
    print("  errors at the common nodes of the nested grids; order = log_3 of successive ratios.")
    print("  They fall like N^-2: the discrete operators are quadratures of the continuous")
    print("  integrals (midpoint rule, order 2); the ReLU kinks make the order scatter around 2.")
