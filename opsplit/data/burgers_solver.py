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

**The viscosity the solver takes.**  By the Cole–Hopf transform every solution is
:math:`u = -2\nu\,\varphi_x/\varphi` with :math:`\varphi > 0` a solution of the heat equation,
so :math:`u` is analytic in a strip about the real axis whose edge is the nearest complex zero
:math:`x_0 \pm i d` of :math:`\varphi`, a simple pole of :math:`u` with residue :math:`-2\nu`.
On the real axis the pair of poles gives :math:`-4\nu (x - x_0)/((x - x_0)^2 + d^2)`, of size
:math:`2\nu/d`; with :math:`|u| \le A = \max|u_0|` (the maximum principle) the strip is at
least :math:`d = 2\nu/A` wide and the Fourier coefficients decay at least like
:math:`e^{-2\pi d |m|} = e^{-4\pi\nu |m|/A}`: gradients :math:`\sim A^2/\nu`.  The solution
:math:`\varphi = 1 + a\,e^{-4\pi^2\nu t}\cos 2\pi x` has exactly this front as :math:`a \to 1`.
Two conditions follow, checked before anything is computed (:func:`viscosity_range`):

- *resolution*: the :math:`M` modes resolve the steepest front,
  :math:`e^{-4\pi\nu M/A} \le` :data:`RESOLUTION_TOL` :math:`= 10^{-3}`, i.e.
  :math:`\nu \ge A \ln(10^3) / (4\pi M)` (at this bound the solver matches the Cole–Hopf
  solutions of :math:`a = 0.9, 0.99, 0.999`, :math:`\nu = 0.01`, to :math:`5 \cdot 10^{-4}` of
  :math:`\max|u|`; with two thirds of the modes the error is :math:`1.6` to
  :math:`4.1 \cdot 10^{-3}`);
- *stability*: linearised about a state of speed :math:`|u| \le A`, mode :math:`k` is the test
  problem :math:`\dot c = (-\nu k^2 - i k u)\,c`.  ETDRK4's amplification of
  :math:`\dot c = (-x + i y)\,c` (:math:`\Delta t = 1`) has modulus at most 1 for
  :math:`|y| \le a + b\,x`, :math:`a = 2.82` (RK4's bound on the imaginary axis,
  :math:`2\sqrt 2`) and :math:`b = 0.34` (the least slope of the exact boundary, 0.349 near
  :math:`x = 2`; ``tests/test_burgers_data.py`` checks the segment from the closed-form
  coefficients), so every kept mode is stable when
  :math:`\Delta t \max_{0 < k \le 2\pi M} (k A - b \nu k^2) \le a`: at most
  :math:`\Delta t\, A^2 / (4 b \nu)`, hence :math:`\nu \ge A^2 \Delta t / (4ab)` always
  suffices;
- and at most :math:`\nu\,\Delta t\,(2\pi M)^2 \le 10^{100}` (:data:`MAX_STIFFNESS`): beyond it
  the cube of :math:`\Delta t L` in the coefficients overflows float64.

Both are sufficient conditions.  Four draws of the data's random field at 32 to 1024 nodes
and 20 to 1000 steps (eight settings), solved at the bound, are within 3.2e-5 (relative L2) of
the same draws on a 4x finer grid with a 16x finer step.  At half the bound the
step-limited setting (1024 nodes, 100 steps) blows up and the others stay within 1.8e-4; at
a quarter four of the eight blow up: the stability bound has a margin of about 2, the
resolution bound more for these draws, whose fronts are less steep than it allows.

**Checks.**  The Cole–Hopf solution :math:`u = -2\nu\,\varphi_x/\varphi` with
:math:`\varphi = 1 + a\,e^{-4\pi^2\nu t}\cos 2\pi x` (``tests/test_burgers_data.py``, to
1e-8), the energy identity :math:`\tfrac{d}{dt}\tfrac12\|u\|^2 = -\nu\|u_x\|^2`, and
self-convergence against a 2x finer grid and time step (``benchmarks/burgers.py
--check-solver``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .._memory import available_memory, human_bytes, human_seconds

__all__ = ["etdrk4_coefficients", "solve_burgers", "viscosity_range", "ViscosityRange", "solve_cost",
           "STABILITY_A", "STABILITY_B", "RESOLUTION_TOL", "MAX_STIFFNESS", "MAX_SECONDS"]

#: ETDRK4 is stable for the test problem c' = (-x + i y) c (dt = 1) on |y| <= STABILITY_A + STABILITY_B x
STABILITY_A = 2.82
#: (see :data:`STABILITY_A`)
STABILITY_B = 0.34
#: the relative size of the top kept mode of the steepest viscous front (the resolution condition)
RESOLUTION_TOL = 1e-3
#: the largest nu dt k_max^2: beyond it (dt L)^3 in :func:`etdrk4_coefficients` overflows float64
MAX_STIFFNESS = 1e100
#: a solve (or a data set) estimated to take longer than this (s) needs ``force=True``
MAX_SECONDS = 3600.0
#: the cost model of a step (:func:`solve_cost`), fitted to one core of the development machine
#: with no mode dropped (tol = 0; 1.7, 10, 54 and 880 us per pair and step at 64, 256, 1024
#: and 8192 nodes in batches of 50, 20 ms at 65536 nodes, after the batch's fixed cost):
#: seconds per P log2 P of one pair's step (its eight transforms on the product grid of
#: P = 3 (M + 1) points) up to P = 4000, growing like sqrt(P / 4000) above (the caches), and
#: per step of a batch (Python and dispatch)
_SECONDS_PER_PLOGP = 3e-9
_SECONDS_PER_BATCH_STEP = 1.5e-4
#: modes of the coefficient's contour integrals computed at once (bounds their memory)
_CHUNK = 1 << 14


# -- argument checks (shared with opsplit.data.burgers) ------------------------------------------
def check_count(v, name: str, lo: int = 1) -> int:
    """An integer (Python or numpy; ``bool`` and ``float`` refused: ``TypeError``) ``>= lo``."""
    if isinstance(v, np.integer):
        v = int(v)
    if isinstance(v, bool) or not isinstance(v, int):
        raise TypeError(f"{name}: expected an integer >= {lo}, got {v!r} ({type(v).__name__})")
    if v < lo:
        raise ValueError(f"{name}: expected an integer >= {lo}, got {v}")
    return v


def check_real(v, name: str, *, lo: float | None = None, strict: bool = True) -> float:
    """A finite real number (``> lo``, or ``>= lo`` with ``strict=False``)."""
    if isinstance(v, (bool, np.bool_, complex, np.complexfloating, str, bytes)):
        raise TypeError(f"{name}: expected a real number, got {v!r}")
    try:
        x = float(v)
    except (TypeError, ValueError):
        raise TypeError(f"{name}: expected a real number, got {v!r}") from None
    if not math.isfinite(x) or (lo is not None and (x <= lo if strict else x < lo)):
        bound = "" if lo is None else f" {'>' if strict else '>='} {lo:g}"
        raise ValueError(f"{name}: expected a finite number{bound}, got {v!r}")
    return x


def check_bool(v, name: str) -> bool:
    if not isinstance(v, (bool, np.bool_)):
        raise TypeError(f"{name}: expected True or False, got {v!r}")
    return bool(v)


def size_guard(who: str, *, seconds: float, nbytes: float, sizes: dict, force: bool, what: str,
               memory: float | None = None) -> None:
    """Refuse (``ValueError``) a job estimated above the available memory or above
    :data:`MAX_SECONDS` unless ``force``.  ``sizes`` maps an argument to ``(value, default)``:
    the message names the argument(s) furthest above their defaults (each within a factor 10
    of the largest ratio)."""
    if force:
        return
    memory = available_memory() if memory is None else memory
    ratios = sorted(((float(v) / max(float(d), 1.0), k) for k, (v, d) in sizes.items()), reverse=True)
    names = [k for r, k in ratios if r >= ratios[0][0] / 10 and r > 1.0] if ratios else []
    lead = ", ".join(f"{who}.{k}" for k in names) or who
    args = ", ".join(f"{k} = {sizes[k][0]}" for k in sizes)
    if nbytes > memory:
        raise ValueError(f"{lead}: {what} needs an estimated {human_bytes(nbytes)} of memory at its peak ({args}), "
                         f"more than the {human_bytes(memory)} available; expected a smaller value (or force=True "
                         f"to try anyway)")
    if seconds > MAX_SECONDS:
        raise ValueError(f"{lead}: {what} needs an estimated {human_seconds(seconds)} of compute ({args}), more "
                         f"than the {human_seconds(MAX_SECONDS)} {who} runs without asking; expected a smaller value "
                         f"(or force=True to run it anyway)")


# -- the viscosity the solver takes ----------------------------------------------------------------
@dataclass(frozen=True)
class ViscosityRange:
    """The viscosities :math:`\\nu` for which :func:`solve_burgers` with ``modes`` modes and
    the step ``dt`` is stable and resolves the solution from initial conditions with
    :math:`\\max|u_0| \\le` ``amplitude`` (the module docstring): ``smallest <= nu <= largest``."""

    modes: int
    dt: float
    amplitude: float
    resolved: float  # the least nu whose steepest front the modes resolve
    stable: float  # the least nu for which the step is stable for every kept mode
    largest: float  # the largest nu whose coefficients are finite

    @property
    def smallest(self) -> float:
        return max(self.resolved, self.stable)

    def __contains__(self, nu) -> bool:
        return self.smallest <= nu <= self.largest

    def refusal(self, name: str, nu, where: str) -> str:
        """The message of a ``nu`` outside the range (``name`` first)."""
        why = []
        if nu < self.resolved:
            why.append(f"below {self.resolved:.3g} the {self.modes} modes do not resolve the steepest viscous front "
                       f"(Fourier modes decaying like exp(-4 pi nu m / max|u0|): nu >= max|u0| ln(1e3) / (4 pi M)); "
                       f"more points lower this bound")
        if nu < self.stable:
            why.append(f"below {self.stable:.3g} the ETDRK4 step dt = {self.dt:.3g} is unstable for the advection of "
                       f"the top modes (dt max_k (k max|u0| - {STABILITY_B} nu k^2) <= {STABILITY_A} over "
                       f"k <= 2 pi M); more steps lower this bound")
        if nu > self.largest:
            why.append(f"above {self.largest:.3g} the ETDRK4 coefficients overflow float64 "
                       f"(nu dt (2 pi M)^2 <= {MAX_STIFFNESS:g})")
        return (f"{name}: expected a viscosity in [{self.smallest:.3g}, {self.largest:.3g}] at {where} "
                f"(max|u0| = {self.amplitude:.3g}), got {nu!r}: " + "; ".join(why))


def _stable_nu(k: float, dt: float, A: float) -> float:
    a, b = STABILITY_A, STABILITY_B
    if k * A * dt <= a:
        return 0.0
    nu = A * A * dt / (4 * a * b)  # max over all k of k A - b nu k^2 is A^2 / (4 b nu), at k = A / (2 b nu)
    if A / (2 * b * nu) <= k:
        return nu
    return (k * A * dt - a) / (b * k * k * dt)  # the maximum over k <= k_max is at k_max


def viscosity_range(modes: int, dt: float, amplitude: float) -> ViscosityRange:
    """The viscosities the solver takes with ``modes`` modes (:math:`M`, the initial
    ``(N - 1) // 2`` times ``grid_factor``), the step ``dt`` and initial conditions bounded by
    ``amplitude`` (:math:`\\max|u_0|`)."""
    k = 2 * math.pi * modes
    resolved = amplitude * math.log(1 / RESOLUTION_TOL) / (4 * math.pi * modes) if modes else 0.0
    largest = MAX_STIFFNESS / (dt * k * k) if modes and dt > 0 else math.inf
    return ViscosityRange(modes, dt, amplitude, resolved, _stable_nu(k, dt, amplitude), largest)


def least_steps(modes: int, t_final: float, nu: float, amplitude: float) -> int:
    """The fewest steps on ``[0, t_final]`` for which the step is stable for every kept mode
    (the stability condition of :func:`viscosity_range` solved for ``dt``)."""
    k, A, b = 2 * math.pi * modes, amplitude, STABILITY_B
    top = A * A / (4 * b * nu) if A / (2 * b * nu) <= k else k * A - b * nu * k * k
    return max(1, math.ceil(t_final * top / STABILITY_A)) if top > 0 else 1


def least_modes(nu: float, amplitude: float) -> int:
    """The fewest modes that resolve the steepest front (the resolution condition solved for M)."""
    return max(1, math.ceil(amplitude * math.log(1 / RESOLUTION_TOL) / (4 * math.pi * nu)))


# -- the cost of a solve -----------------------------------------------------------------------------
def _ladder(M0: int, grid_factor: int) -> list[int]:
    ladder, m = [], M0
    while m >= 8 * grid_factor:
        ladder.append(m)
        m = (m + 1) // 2 - 1
    return ladder


def _steps_per_size(M0: int, n_steps: int, dt: float, nu: float, amplitude: float, tol: float,
                    grid_factor: int) -> list[tuple[int, float]]:
    """``(M, steps)``: how many of the steps run with ``M`` modes, by a model of the mode
    dropping: after a time ``t`` the modes above :math:`\\sqrt{\\ln(1/tol)/(\\nu t)}/2\\pi` of
    any initial condition have decayed below ``tol``, and the steepest front keeps those up to
    ``amplitude ln(1/tol) / (4 pi nu)`` (the resolution condition at ``tol``)."""
    if not tol > 0 or n_steps <= 1:
        return [(M0, float(n_steps))]
    L = math.log(1 / tol)
    m_front = amplitude * L / (4 * math.pi * nu)
    sizes = [s for s in _ladder(M0, grid_factor) if s >= 2 * grid_factor * m_front]
    if not sizes or sizes[0] != M0:
        sizes = [M0] + [s for s in sizes if s < M0]

    def steps_within(s):  # steps j + 1 (j = 1 .. n_steps - 1) run with at most s modes
        if s >= M0:
            return float(n_steps)
        t = L * grid_factor**2 / (nu * math.pi**2 * s * s)  # m_visc(t) <= s / (2 grid_factor)
        first = max(1.0, math.ceil(t / dt)) if t / dt < 1e300 else math.inf
        return max(0.0, n_steps - first)

    out = []
    for i, s in enumerate(sizes):
        nxt = steps_within(sizes[i + 1]) if i + 1 < len(sizes) else 0.0
        out.append((s, max(0.0, steps_within(s) - nxt)))
    return out


def solve_cost(B: int, N: int, n_steps: int, *, t_final: float = 1.0, nu: float = 0.1, amplitude: float = 0.0,
               tol: float = 1e-17, grid_factor: int = 1, out_points: int | None = None, save_times: int = 0,
               batches: int = 1) -> tuple[float, float]:
    """``(seconds, bytes)``: an estimate of :func:`solve_burgers` on ``B`` pairs of ``N``
    nodes (``batches`` such solves one after the other): the steps' transforms by the mode
    dropping of :func:`_steps_per_size`, a fixed cost per step, the coefficients; memory: the
    coefficients, a step's work arrays and the saved levels.  A rough figure (a factor of a
    few either way, high for smooth data), enough to tell minutes from days."""
    out_points = N if out_points is None else out_points
    M0 = grid_factor * ((N - 1) // 2 + 1) - 1
    dt = t_final / n_steps
    seconds = 0.0
    for M, steps in _steps_per_size(M0, n_steps, dt, nu, amplitude, tol, grid_factor):
        P = 3.0 * (M + 1)
        rate = _SECONDS_PER_PLOGP * math.sqrt(max(1.0, P / 4000.0))
        seconds += steps * B * rate * P * math.log2(max(P, 2.0))
    seconds += n_steps * _SECONDS_PER_BATCH_STEP
    seconds += (M0 + 1) * 64 * 1e-7 + B * (N + out_points) * 1e-7  # the coefficients, the transforms in and out
    nbytes = (6 * 8.0 * (M0 + 1) + 8 * 16.0 * 64 * min(M0 + 1, _CHUNK)  # coefficients, a chunk's integrals
              + 240.0 * B * (M0 + 1) + 16.0 * (save_times + 1) * B * (M0 + 1)
              + 8.0 * B * N * 2 + 24.0 * B * out_points)
    return seconds * batches, nbytes


def etdrk4_coefficients(L: np.ndarray, dt: float, n_contour: int = 64):
    r"""The ETDRK4 coefficients of a diagonal linear part ``L`` (Kassam & Trefethen 2005,
    eq. 2.5, the :math:`\varphi` functions by a contour integral of radius 1 around every
    :math:`\Delta t L`): ``(E, E2, Q, f1, f2, f3)`` (computed :data:`_CHUNK` entries of ``L``
    at a time)."""
    L = np.asarray(L)
    if L.size > _CHUNK:
        parts = [etdrk4_coefficients(L[i:i + _CHUNK], dt, n_contour) for i in range(0, L.size, _CHUNK)]
        return tuple(np.concatenate(p) for p in zip(*parts))
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


def check_initial_conditions(u0, name: str) -> np.ndarray:
    """``u0`` as a float64 ``(B, N)`` array: real numbers, ``(N,)`` or ``(B, N)`` with
    ``B >= 1`` and ``N >= 3``, finite."""
    if isinstance(u0, (str, bytes)) or u0 is None:
        raise TypeError(f"{name}: expected an array of real numbers of shape (B, N) or (N,), got {u0!r}")
    try:
        arr = np.asarray(u0)
    except Exception as e:  # a ragged list, an object numpy cannot take
        raise TypeError(f"{name}: expected an array of real numbers of shape (B, N) or (N,), got "
                        f"{type(u0).__name__} ({e})") from None
    if arr.dtype.kind not in "iuf":
        raise TypeError(f"{name}: expected real numbers (integer or floating dtype), got dtype {arr.dtype}")
    if arr.ndim not in (1, 2):
        raise ValueError(f"{name}: expected shape (B, N) or (N,), got {arr.shape}")
    if arr.ndim == 1:
        arr = arr[None]
    B, N = arr.shape
    if B < 1 or N < 3:
        raise ValueError(f"{name}: expected at least one field of at least 3 nodes, got shape {tuple(arr.shape)}")
    arr = np.asarray(arr, dtype=np.float64)
    bad = ~np.isfinite(arr)
    if bad.any():
        n_nan = int(np.isnan(arr).sum())
        raise ValueError(f"{name}: expected finite values, found {n_nan} NaN and {int(bad.sum()) - n_nan} inf")
    return arr


def solve_burgers(u0: np.ndarray, *, nu: float = 0.1, t_final: float = 1.0, n_steps: int = 1000,
                  out_points: int | None = None, grid_factor: int = 1, tol: float = 1e-17,
                  save_times: int = 0, force: bool = False):
    r"""Solve (B) from periodic samples ``u0`` ``(B, N)`` at :math:`x_j = j/N`.

    The initial condition is the trigonometric interpolant of the samples (modes
    :math:`|m| < N/2`; the Nyquist mode is dropped).  Returns the samples of
    :math:`u(\cdot, t_{final})` on ``out_points`` (default ``N``) points :math:`x_j = j/n`
    (the band-limited solution evaluated exactly there), float64; with ``save_times = k > 0``
    also ``(times, coefficients)`` at ``k + 1`` equally spaced times (the coefficients
    :math:`c_m`, ``(k + 1, B, M_0 + 1)``, for the energy check).

    Every argument is checked before anything is computed: ``u0`` finite, ``nu`` within
    :func:`viscosity_range` of these modes, step and initial conditions, and the estimated
    memory and time (:func:`solve_cost`) within the available memory and :data:`MAX_SECONDS`.

    Args:
        nu: viscosity :math:`\nu > 0` (see :func:`viscosity_range`).
        t_final: final time (> 0).
        n_steps: ETDRK4 steps (:math:`\Delta t` = ``t_final / n_steps``).
        out_points: output grid size.
        grid_factor: keep ``grid_factor`` times as many modes at every stage (1 or 2).
        tol: relative size below which the top modes are dropped (see the module docstring).
        force: run even when the estimated memory or time exceeds the machine's memory or
            :data:`MAX_SECONDS`.
    """
    u0 = check_initial_conditions(u0, "solve_burgers.u0")
    B, N = u0.shape
    t_final = check_real(t_final, "solve_burgers.t_final", lo=0.0)
    n_steps = check_count(n_steps, "solve_burgers.n_steps")
    out_points = N if out_points is None else check_count(out_points, "solve_burgers.out_points")
    grid_factor = check_count(grid_factor, "solve_burgers.grid_factor")
    tol = check_real(tol, "solve_burgers.tol", lo=0.0, strict=False)
    save_times = check_count(save_times, "solve_burgers.save_times", 0)
    force = check_bool(force, "solve_burgers.force")
    if save_times and n_steps % save_times:
        raise ValueError(f"solve_burgers.save_times: expected a divisor of n_steps = {n_steps}, got {save_times}")
    nu_in = nu
    nu = check_real(nu, "solve_burgers.nu", lo=0.0)
    M0 = grid_factor * ((N - 1) // 2 + 1) - 1  # drop the Nyquist mode of an even N
    dt = t_final / n_steps
    A = float(np.abs(u0).max())
    allowed = viscosity_range(M0, dt, A)
    if nu not in allowed:
        raise ValueError(allowed.refusal("solve_burgers.nu", nu_in,
                                         f"N = {N} nodes ({M0} modes) and dt = t_final / n_steps = {dt:.3g}"))
    seconds, nbytes = solve_cost(B, N, n_steps, t_final=t_final, nu=nu, amplitude=A, tol=tol, grid_factor=grid_factor,
                                 out_points=out_points, save_times=save_times)
    size_guard("solve_burgers", seconds=seconds, nbytes=nbytes, force=force, what="the solve",
               sizes={"n_steps": (n_steps, 1000), "u0": (B * N, 50 * 8192), "grid_factor": (grid_factor, 1),
                      "out_points": (out_points, max(N, 8192)), "save_times": (save_times + 1, 1)})
    c = np.fft.rfft(u0, axis=-1) / N
    M0 = (N - 1) // 2
    c = c[:, : M0 + 1]
    if grid_factor != 1:
        M0f = grid_factor * (M0 + 1) - 1
        c = np.concatenate([c, np.zeros((B, M0f - M0), complex)], axis=1)
        M0 = M0f
    km_all = 2 * np.pi * np.arange(M0 + 1)
    coef_all = etdrk4_coefficients(-nu * km_all**2, dt)
    ladder = _ladder(M0, grid_factor)
    M = M0
    saves = []
    if save_times:
        every = n_steps // save_times
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
            f"solve_burgers.out_points: expected at least {2 * M + 1} points, the solution keeps {M} modes; got "
            f"{out_points}"
        )
    out = np.zeros((B, out_points // 2 + 1), complex)
    out[:, : M + 1] = c
    u = np.fft.irfft(out, n=out_points, axis=-1) * out_points
    if save_times:
        times = np.linspace(0.0, t_final, save_times + 1)
        return u, (times, np.stack(saves))
    return u
