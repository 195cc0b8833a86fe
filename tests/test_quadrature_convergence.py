"""With L fixed and N growing, the discrete attention and FFN integrals converge to the
continuous ones (paper 002, eqs. 3-7) at the quadrature rule's order.

The reference evaluates the continuous formulas with 48-point Gauss-Legendre quadrature
(numpy), independently of opsplit's grid code."""

import math

import numpy as np
import pytest
import torch

from opsplit import Grid, Interval
from opsplit.operators import FFNIntegral, SoftmaxAttention

LX, LY = 1.0, 2.0
NS = [8, 16, 32, 64, 128]


def u_fn(x, y):
    return np.sin(2 * x + 0.5) + np.cos(1.3 * y - 0.2 * x) + 0.3 * x * y


def wq(xi, y):
    return 0.8 * np.cos(xi - 0.5 * y)


def wk(xi, y):
    return 0.5 * np.sin(xi + y) + 0.2


def wv(xi, y):
    return np.exp(-((xi - y) ** 2))


def b_fn(x):
    return np.cos(3 * x)


def gauss(L, n=48):
    t, w = np.polynomial.legendre.leggauss(n)
    return 0.5 * L * (t + 1), 0.5 * L * w


def transform(W, X, Yt):
    """int_0^LY W(xi, y) u(x, xi) dxi at x in X, y in Yt -> (len X, len Yt)."""
    xi, w = gauss(LY)
    return (w[None, :] * u_fn(X[:, None], xi[None, :])) @ W(xi[:, None], Yt[None, :])


def attention_reference(X, Y, x_quad=None):
    """Continuous attention at nodes (X, Y).  ``x_quad=(nodes, weights)`` replaces the
    Omega_x integral by that quadrature (default: Gauss-Legendre, i.e. exact)."""
    xi, wxi = gauss(LY)
    eta, weta = gauss(LX) if x_quad is None else x_quad
    s = 1 / math.sqrt(LY)
    Qc = transform(wq, X, xi)  # Q(x, xi)
    Kc = transform(wk, eta, xi)  # K(eta, xi)
    Vc = transform(wv, eta, Y)  # V(eta, y)
    a = s * (Qc * wxi[None, :]) @ Kc.T
    e = weta[None, :] * np.exp(a - a.max(axis=1, keepdims=True))
    return (e @ Vc) / e.sum(axis=1, keepdims=True)


def ffn_reference(X, Y):
    return transform(wv, X, Y) + b_fn(X)[:, None]


def _sample(g):
    X = g.x.nodes(torch.float64).numpy()
    Y = g.y.nodes(torch.float64).numpy()
    u = torch.from_numpy(u_fn(X[:, None], Y[None, :]))[None]
    return X, Y, u


def _kernel(fn, Y):
    return torch.from_numpy(fn(Y[:, None], Y[None, :]))


def _slope(ns, errs):
    return -np.polyfit(np.log(ns), np.log(errs), 1)[0]


RULE_ORDERS = [("midpoint", 2), ("trapezoid", 2), ("right", 1)]


def _assert_order(rule, order, grid, op, reference):
    """On ``grid(n)`` for n in NS, the max error of ``op(X, Y)`` applied to u against
    ``reference(X, Y, g)`` falls at the quadrature ``order`` (slope within 0.2)."""
    errs = []
    for n in NS:
        g = grid(n)
        X, Y, u = _sample(g)
        errs.append(float(np.abs(op(X, Y)(u, grid=g)[0].numpy() - reference(X, Y, g)).max()))
    p = _slope(NS, errs)
    assert abs(p - order) < 0.2, f"{rule}: measured order {p:.3f} (expected {order}); errors {errs}"


def _attention(X, Y):
    return SoftmaxAttention(_kernel(wq, Y), _kernel(wk, Y), _kernel(wv, Y))


@pytest.mark.parametrize("rule,order", RULE_ORDERS)
def test_attention_converges_in_Ny_at_quadrature_order(rule, order):
    nx = 7
    _assert_order(rule, order, lambda n: Grid(x=Interval(n=nx, length=LX), y=Interval(n=n, length=LY, rule=rule)),
                  _attention, lambda X, Y, g: attention_reference(X, Y, x_quad=(X, g.x.weights(torch.float64).numpy())))


@pytest.mark.parametrize("rule,order", RULE_ORDERS)
def test_attention_converges_in_Nx_and_Ny_at_quadrature_order(rule, order):
    _assert_order(rule, order, lambda n: Grid.uniform(n, n, lx=LX, ly=LY, rule=rule),
                  _attention, lambda X, Y, g: attention_reference(X, Y))


@pytest.mark.parametrize("rule,order", RULE_ORDERS)
def test_ffn_integral_converges_in_Ny_at_quadrature_order(rule, order):
    _assert_order(rule, order, lambda n: Grid(x=Interval(n=5, length=LX), y=Interval(n=n, length=LY, rule=rule)),
                  lambda X, Y: FFNIntegral(_kernel(wv, Y), torch.from_numpy(b_fn(X)), bias_axis="x"),
                  lambda X, Y, g: ffn_reference(X, Y))
