"""Grid convergence of the 2-D convolution integral operator (paper 002, eq. 42).

The operator ``Convolution2d`` with a continuous kernel ``ContinuousKernel`` approximates

    (W * u)(x) = \\int_{[-r, r]^2} W(xi) u(x - xi) dxi        on Omega = [0, 1]^2

by the product rule on the grid's offsets (cell area h^2 times the stencil weights).  With a
separable kernel W(xi) = g1(xi_1) g2(xi_2) and a separable u = a(x_1) b(x_2) (zero outside
Omega, C^3 across its boundary) the exact value factorises into two 1-D integrals, computed
here independently by Gauss-Legendre quadrature.  The kernel does not vanish on the boundary
of its support, so the stencil rule decides the order: the trapezoid rule (default) is
second order, equal weights ("rectangle") first order.  r = 1/4 is a multiple of h = 1/N.

Run:  OMP_NUM_THREADS=1 python benchmarks/cvt_convergence.py
"""

from __future__ import annotations

import argparse
import math

import numpy as np
import torch

from opsplit.grid import ImageGrid
from opsplit.operators import ContinuousKernel, Convolution2d

SIGMA, R = 0.15, 0.25


def g1(x):
    return torch.exp(-x * x / (2 * SIGMA**2)) * (1 + x)  # not even: catches a flipped kernel


def g2(x):
    return torch.exp(-x * x / (2 * SIGMA**2)) * (1 - 0.5 * x)


def a(s):
    return np.where((s > 0) & (s < 1), np.sin(np.pi * s) ** 4, 0.0)


def b(s):
    return np.where((s > 0) & (s < 1), np.sin(np.pi * s) ** 4 * (1 + s), 0.0)


def reference_1d(g, f, x, n=400):
    """int_{-R}^{R} g(xi) f(x - xi) dxi for every x, by composite Gauss-Legendre (8 panels)."""
    xg, wg = np.polynomial.legendre.leggauss(n // 8)
    edges = np.linspace(-R, R, 9)
    total = np.zeros_like(x)
    for lo, hi in zip(edges[:-1], edges[1:]):
        xi = 0.5 * (hi - lo) * xg + 0.5 * (hi + lo)
        w = 0.5 * (hi - lo) * wg
        gv = g(torch.from_numpy(xi)).numpy()
        total += (f(x[:, None] - xi[None, :]) * (gv * w)[None, :]).sum(1)
    return total


def error(n: int, rule: str) -> float:
    grid = ImageGrid.uniform(n, 1, length=1.0)
    kernel = ContinuousKernel(lambda x1, x2: g1(x1) * g2(x2), R, rule=rule, dtype=torch.float64)
    op = Convolution2d(kernel, groups="depthwise")
    x = grid.rows.nodes(torch.float64).numpy()
    u = torch.from_numpy(np.outer(a(x), b(x))).reshape(1, n * n, 1)
    out = op(u, grid=grid).reshape(n, n).numpy()
    exact = np.outer(reference_1d(g1, a, x), reference_1d(g2, b, x))
    return float(np.abs(out - exact).max())


def study(rule: str, ns=(16, 32, 64, 128)):
    errs = [error(n, rule) for n in ns]
    orders = [math.log2(e0 / e1) for e0, e1 in zip(errs[:-1], errs[1:])]
    return errs, orders


THEORY = {"trapezoid": 2, "rectangle": 1}

def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[16, 32, 64, 128, 256], help="grid sizes N")
    ns = tuple(ap.parse_args(argv).sizes)
    print("2-D convolution operator, max error at the grid nodes, Omega = [0,1]^2, support r = 1/4")
    print(f"{'rule':>10} {'N':>5} {'error':>12} {'order':>7}   theory")
    for rule in ("trapezoid", "rectangle"):
        errs, orders = study(rule, ns)
        for i, (n, e) in enumerate(zip(ns, errs)):
            o = "" if i == 0 else f"{orders[i - 1]:7.3f}"
            print(f"{rule:>10} {n:5d} {e:12.4e} {o:>7}   {THEORY[rule]}")


if __name__ == "__main__":
    main()
