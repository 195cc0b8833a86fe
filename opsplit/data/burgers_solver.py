r"""A pseudo-spectral solver of the 1-D viscous Burgers equation on the periodic
:math:`[0, 1)`:

.. math::  u_t + \big(\tfrac12 u^2\big)_x = \nu\, u_{xx}, \qquad u(x, 0) = u_0(x),
           \qquad u(x + 1, t) = u(x, t).                                          \tag{B}

**Discretisation.**  :math:`u` is the trigonometric polynomial
:math:`\sum_{|m| \le M} c_m(t)\, e^{2\pi i m x}` (real: :math:`c_{-m} = \bar c_m`), and (B)
becomes :math:`\dot c_m = -\nu k_m^2 c_m - \tfrac{i k_m}{2}\,\widehat{(u^2)}_m` with
:math:`k_m = 2\pi m`.  The quadratic term is evaluated on :math:`P = 3(M + 1)` points and
its modes above :math:`M` discarded — the 2/3 rule (only the lowest third of the product
grid's modes is kept, so the square of a degree-:math:`M` polynomial is exact on the modes
kept: no aliasing).  Time: ETDRK4 (Cox & Matthews 2002) with the :math:`\varphi`-function
coefficients evaluated by contour integrals (Kassam & Trefethen 2005), which treats the
stiff linear term exactly.

**Spectral truncation as the solution smooths.**  The viscous term damps mode :math:`m` by
:math:`e^{-\nu k_m^2 t}`: at :math:`\nu = 0.1` the modes above :math:`m \approx 100` of a
rough initial condition are below :math:`10^{-16}` of the largest after the first step of
:math:`10^{-3}`.  After every step the solver finds the highest mode :math:`m^*` whose
coefficient exceeds ``tol`` times the largest (over the batch) and, when a size of the ladder
:math:`M \in \{M_0, \lfloor M_0/2\rfloor, \dots\}` at least ``2 m*`` is smaller than the
current one, drops the modes above it (``tol = 1e-17``: below float64 round-off relative to
the largest coefficient).  ``grid_factor = 2`` keeps twice as many modes at every stage
(the 2x finer grid of a self-convergence study; ``docs/burgers.md``).

**Checks.**  The Cole–Hopf solution :math:`u = -2\nu\,\varphi_x/\varphi` with
:math:`\varphi = 1 + a\,e^{-4\pi^2\nu t}\cos 2\pi x` (``tests/test_burgers_data.py``, to
1e-8), the energy identity :math:`\tfrac{d}{dt}\tfrac12\|u\|^2 = -\nu\|u_x\|^2`, and
self-convergence against a 2x finer grid and time step (``benchmarks/burgers.py
--check-solver``).
"""

from __future__ import annotations

import numpy as np

__all__ = ["etdrk4_coefficients", "solve_burgers"]


def etdrk4_coefficients(L: np.ndarray, dt: float, n_contour: int = 64):
    r"""The ETDRK4 coefficients of a diagonal linear part ``L`` (Kassam & Trefethen 2005,
    eq. 2.5, the :math:`\varphi` functions by a contour integral of radius 1 around every
    :math:`\Delta t L`): ``(E, E2, Q, f1, f2, f3)``."""
    hL = dt * L
    r = np.exp(1j * np.pi * (np.arange(1, n_contour + 1) - 0.5) / n_contour)
    LR = hL[:, None] + r[None, :]
    E = np.exp(hL)
    E2 = np.exp(hL / 2)
    Q = dt * np.real(np.mean((np.exp(LR / 2) - 1) / LR, axis=1))
    f1 = dt * np.real(np.mean((-4 - LR + np.exp(LR) * (4 - 3 * LR + LR**2)) / LR**3, axis=1))
    f2 = dt * np.real(np.mean((2 + LR + np.exp(LR) * (-2 + LR)) / LR**3, axis=1))
    f3 = dt * np.real(np.mean((-4 - 3 * LR - LR**2 + np.exp(LR) * (4 - LR)) / LR**3, axis=1))
    return E, E2, Q, f1, f2, f3


def _nonlinear(c: np.ndarray, M: int, km: np.ndarray) -> np.ndarray:
    r""":math:`-\tfrac{i k_m}{2}\widehat{(u^2)}_m`, :math:`m = 0..M`, exactly (2/3 rule on
    :math:`P = 3(M + 1)` points)."""
    P = 3 * (M + 1)
    u = np.fft.irfft(c, n=P, axis=-1) * P
    w = np.fft.rfft(u * u, axis=-1)[..., : M + 1] / P
    return -0.5j * km * w


def solve_burgers(u0: np.ndarray, *, nu: float = 0.1, t_final: float = 1.0, n_steps: int = 1000,
                  out_points: int | None = None, grid_factor: int = 1, tol: float = 1e-17,
                  save_times: int = 0):
    r"""Solve (B) from periodic samples ``u0`` ``(B, N)`` at :math:`x_j = j/N`.

    The initial condition is the trigonometric interpolant of the samples (modes
    :math:`|m| < N/2`; the Nyquist mode is dropped).  Returns the samples of
    :math:`u(\cdot, t_{final})` on ``out_points`` (default ``N``) points :math:`x_j = j/n`
    (the band-limited solution evaluated exactly there), float64; with ``save_times = k > 0``
    also ``(times, coefficients)`` at ``k + 1`` equally spaced times (the coefficients
    :math:`c_m`, ``(k + 1, B, M_0 + 1)``, for the energy check).

    Args:
        nu: viscosity :math:`\nu > 0`.
        t_final: final time.
        n_steps: ETDRK4 steps (:math:`\Delta t` = ``t_final / n_steps``).
        out_points: output grid size.
        grid_factor: keep ``grid_factor`` times as many modes at every stage (1 or 2).
        tol: relative size below which the top modes are dropped (see the module docstring).
    """
    u0 = np.asarray(u0, dtype=np.float64)
    if u0.ndim == 1:
        u0 = u0[None]
    B, N = u0.shape
    out_points = N if out_points is None else int(out_points)
    c = np.fft.rfft(u0, axis=-1) / N
    M0 = (N - 1) // 2  # drop the Nyquist mode of an even N
    c = c[:, : M0 + 1]
    if grid_factor != 1:
        M0f = grid_factor * (M0 + 1) - 1
        c = np.concatenate([c, np.zeros((B, M0f - M0), complex)], axis=1)
        M0 = M0f
    dt = t_final / n_steps
    km_all = 2 * np.pi * np.arange(M0 + 1)
    coef_all = etdrk4_coefficients(-nu * km_all**2, dt)
    ladder = []
    m = M0
    while m >= 8 * grid_factor:
        ladder.append(m)
        m = (m + 1) // 2 - 1
    M = M0
    saves = []
    if save_times:
        every = n_steps // save_times
        if every * save_times != n_steps:
            raise ValueError(f"solve_burgers: save_times = {save_times} must divide n_steps = {n_steps}")
        saves.append(c.copy())
    for step in range(n_steps):
        km = km_all[: M + 1]
        E, E2, Q, f1, f2, f3 = (a[: M + 1] for a in coef_all)
        Nv = _nonlinear(c, M, km)
        a = E2 * c + Q * Nv
        Na = _nonlinear(a, M, km)
        b = E2 * c + Q * Na
        Nb = _nonlinear(b, M, km)
        cc = E2 * a + Q * (2 * Nb - Nv)
        Nc = _nonlinear(cc, M, km)
        c = E * c + Nv * f1 + 2 * (Na + Nb) * f2 + Nc * f3
        c[:, 0] = c[:, 0].real  # the mean is real (and conserved)
        # drop the top modes once they are below tol (relative to the largest coefficient)
        mag = np.abs(c).max(axis=0)
        big = np.nonzero(mag > tol * mag.max())[0]
        m_star = int(big[-1]) if big.size else 0
        target = M
        for size in ladder:
            if size < target and size >= 2 * grid_factor * m_star:
                target = size
        if target < M:
            c = c[:, : target + 1]
            M = target
        if save_times and (step + 1) % every == 0:
            full = np.zeros((B, M0 + 1), complex)
            full[:, : M + 1] = c
            saves.append(full)
    n_out_modes = (out_points - 1) // 2
    if M > n_out_modes:
        raise ValueError(
            f"solve_burgers: the solution keeps {M} modes, more than {out_points} output points resolve"
        )
    out = np.zeros((B, out_points // 2 + 1), complex)
    out[:, : M + 1] = c
    u = np.fft.irfft(out, n=out_points, axis=-1) * out_points
    if save_times:
        times = np.linspace(0.0, t_final, save_times + 1)
        return u, (times, np.stack(saves))
    return u
