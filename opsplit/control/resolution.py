r"""Multi-resolution training: the :math:`N_t` each optimizer step solves the model at.

With ``TrainConfig.n_steps = (N_1, ..., N_k)`` every step draws one :math:`N_t` from
the list with the trainer's seeded generator.  ``TrainConfig.n_steps_weights`` sets
the probabilities:

* ``None`` — uniform, :math:`p_i = 1/k` (each resolution gets the same number of steps; a
  step at :math:`N_i` costs :math:`\propto N_i`, so the fine grids take most of the time);
* ``"cost"`` — :math:`p_i \propto 1/N_i`: each resolution gets the same *compute*, and the
  expected cost of a step is :math:`k / \sum_i N_i^{-1}` field evaluations (the harmonic
  mean of the list): ``(2, 4, 8, 16)`` costs :math:`4.27` steps on average, about one
  :math:`N_t = 4` step, where the uniform draw costs :math:`7.5`;
* a list of :math:`k` weights :math:`w_i > 0`, :math:`p_i = w_i / \sum_j w_j`.

The controls, functions of :math:`t`, are then fit at several step sizes at once: what the
continuous model is, not one discrete map (:mod:`opsplit.control.continuity` measures it).

``TrainConfig.solvers`` draws the substep solver of every step too (independently;
``solvers_weights="cost"``: probability proportional to 1/stages, so Heun, two field
evaluations per substep, is drawn half as often as Euler): the solver-swap test as a part
of the objective (:func:`opsplit.control.swap.solved_with`).

``TrainConfig.solvers_split = True`` takes the same probabilities as **shares of every
batch** instead of draws: each step solves the share :math:`p_i` of its windows with solver
:math:`i` (:func:`split_sizes`: :math:`m_i \approx p_i B` windows, rounded by largest
remainder) and the objective is the mean over all :math:`B` windows,

.. math::  J = \sum_i \frac{m_i}{B}\, J_i\big(\text{windows of part } i\big),

the expectation of the drawn objective at the same expected work (``(euler, heun)`` with
weights ``(3, 1)``: 1.25 field evaluations per window in every step), without the draw's
variance: every step's gradient holds every solver.
"""

from __future__ import annotations

import math

import torch

from ..data.base import check_int
from .swap import STAGES

__all__ = ["n_steps_probabilities", "expected_n_steps", "draw_n_steps", "check_n_steps_list", "draw_solver",
           "expected_stages", "solver_probabilities", "split_sizes", "solvers_left_out"]


def check_n_steps_list(v, name: str) -> tuple[int, ...]:
    """A non-empty list of distinct integers >= 1 (an N_t list); anything else is refused
    naming ``name``: a zero or negative entry, a repeated one, a non-integer."""
    if isinstance(v, (str, bytes)) or not isinstance(v, (tuple, list)) or not v:
        raise TypeError(f"{name}: expected a non-empty list of integers >= 1, got {v!r}")
    out = tuple(check_int(n, name, 1) for n in v)
    seen = set()
    for n in out:
        if n in seen:
            raise ValueError(f"{name}: N_t = {n} is listed twice, got {list(out)} (each N_t once; weigh the draws "
                             "with n_steps_weights)")
        seen.add(n)
    return out


def check_weights(w, n: int | None, name: str, of: str = "n_steps"):
    """``None``, ``"uniform"`` (as ``None``), ``"cost"`` or a list of positive finite weights
    (of length ``n`` when given: one per entry of the list ``of`` names, e.g.
    ``"solvers"``)."""
    if w is None or w == "uniform":
        return None
    if w == "cost":
        return "cost"
    if isinstance(w, str):
        raise ValueError(f"{name}: expected None, 'uniform', 'cost' or a list of weights > 0, got {w!r}")
    if isinstance(w, bytes) or not isinstance(w, (tuple, list)) or not w:
        raise TypeError(f"{name}: expected None, 'uniform', 'cost' or a list of weights > 0, got {w!r}")
    out = []
    for x in w:
        if isinstance(x, bool) or not isinstance(x, (int, float)):
            raise TypeError(f"{name}: expected numbers > 0, got {x!r}")
        if not math.isfinite(x) or x <= 0:
            raise ValueError(f"{name}: expected finite weights > 0, got {x!r}")
        out.append(float(x))
    if n is not None and len(out) != n:
        raise ValueError(f"{name}: expected one weight per entry of {of} ({n}), got {len(out)}")
    return tuple(out)


def n_steps_probabilities(n_steps, weights=None) -> list[float]:
    """The draw's probabilities for ``n_steps`` (module docstring; ``"uniform"`` is ``None``)."""
    if weights is None or weights == "uniform":
        return [1.0 / len(n_steps)] * len(n_steps)
    w = [1.0 / n for n in n_steps] if weights == "cost" else list(weights)
    s = sum(w)
    return [x / s for x in w]


def expected_n_steps(n_steps, weights=None) -> float:
    """The mean :math:`N_t` of a draw (the expected cost of a step, in steps)."""
    return sum(p * n for p, n in zip(n_steps_probabilities(n_steps, weights), n_steps))


def draw_n_steps(n_steps, weights, generator: torch.Generator) -> int:
    """One :math:`N_t` drawn with ``generator``.  The uniform draw is the trainer's
    historical one (``randint``), so runs without weights repeat bit for bit."""
    if weights is None:
        return n_steps[int(torch.randint(len(n_steps), (), generator=generator))]
    p = torch.tensor(n_steps_probabilities(n_steps, weights), dtype=torch.float64)
    return n_steps[int(torch.multinomial(p, 1, generator=generator))]


def solver_probabilities(solvers, weights=None) -> list[float]:
    """The probability of each of ``solvers`` (``weights``: ``None`` uniform, ``"cost"``
    proportional to 1 / stages, or one weight > 0 per solver; ``"uniform"`` is ``None``)."""
    if weights is None or weights == "uniform":
        return [1.0 / len(solvers)] * len(solvers)
    w = [1.0 / STAGES[s] for s in solvers] if weights == "cost" else list(weights)
    return [x / sum(w) for x in w]


def expected_stages(solvers, weights=None) -> float:
    """The mean field evaluations per substep of a solver draw."""
    return sum(p * STAGES[s] for p, s in zip(solver_probabilities(solvers, weights), solvers))


def draw_solver(solvers, weights, generator: torch.Generator) -> str:
    """One solver name of ``solvers`` drawn with ``generator`` (``weights``: ``None``,
    ``"cost"``: probability proportional to 1 / stages, or a list)."""
    p = torch.tensor(solver_probabilities(solvers, weights), dtype=torch.float64)
    return solvers[int(torch.multinomial(p, 1, generator=generator))]


def split_sizes(batch: int, solvers, weights=None) -> list[int]:
    """Windows of a batch of ``batch`` for each of ``solvers`` under
    ``TrainConfig.solvers_split``: :math:`p_i B` (:func:`solver_probabilities`)
    rounded down, the remaining windows to the largest remainders (ties to the earlier
    solver); the sizes sum to ``batch``, and a solver may get none in a small batch."""
    p = solver_probabilities(solvers, weights)
    exact = [q * batch for q in p]
    sizes = [math.floor(e + 1e-9) for e in exact]
    order = sorted(range(len(p)), key=lambda i: (-(exact[i] - sizes[i]), i))
    for i in order[: batch - sum(sizes)]:
        sizes[i] += 1
    return sizes


def solvers_left_out(batch: int, solvers, weights=None) -> tuple[list[str], dict]:
    """The solvers a split of a batch of ``batch`` gives no window (:func:`split_sizes`), and
    the windows of each: what a config with ``solvers_split`` is checked by."""
    sizes = dict(zip(solvers, split_sizes(batch, solvers, weights)))
    return [s for s, m in sizes.items() if m == 0], sizes
