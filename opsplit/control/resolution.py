r"""Multi-resolution training: the :math:`N_t` each optimizer step solves the model at.

With ``TrainConfig.train_n_steps = (N_1, ..., N_k)`` every step draws one :math:`N_t` from
the list with the trainer's seeded generator.  ``TrainConfig.train_n_steps_weights`` sets
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

``TrainConfig.train_solvers`` draws the substep solver of every step too (independently;
``train_solvers_weights="cost"``: probability proportional to 1/stages, so Heun, two field
evaluations per substep, is drawn half as often as Euler): the solver-swap test as a part
of the objective (:func:`opsplit.control.swap.solved_with`).
"""

from __future__ import annotations

import math

import torch

__all__ = ["n_steps_probabilities", "expected_n_steps", "draw_n_steps", "check_n_steps_list", "draw_solver",
           "expected_stages"]


def check_n_steps_list(v, name: str) -> tuple[int, ...]:
    """A non-empty list of distinct integers >= 1 (an N_t list); anything else is refused
    naming ``name``: a zero or negative entry, a repeated one, a non-integer."""
    from ..data.base import check_int

    if isinstance(v, (str, bytes)) or not isinstance(v, (tuple, list)) or not v:
        raise TypeError(f"{name}: expected a non-empty list of integers >= 1, got {v!r}")
    out = tuple(check_int(n, name, 1) for n in v)
    seen = set()
    for n in out:
        if n in seen:
            raise ValueError(f"{name}: N_t = {n} is listed twice, got {list(out)} (each N_t once; weigh the draws "
                             "with train_n_steps_weights)")
        seen.add(n)
    return out


def check_weights(w, n: int | None, name: str):
    """``None``, ``"uniform"`` (as ``None``), ``"cost"`` or a list of positive finite weights
    (of length ``n`` when given)."""
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
        raise ValueError(f"{name}: expected one weight per entry of train_n_steps ({n}), got {len(out)}")
    return tuple(out)


def n_steps_probabilities(n_steps, weights=None) -> list[float]:
    """The draw's probabilities for ``n_steps`` (module docstring)."""
    if weights is None:
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


def _solver_probabilities(solvers, weights) -> list[float]:
    from .swap import STAGES

    if weights is None:
        return [1.0 / len(solvers)] * len(solvers)
    w = [1.0 / STAGES[s] for s in solvers] if weights == "cost" else list(weights)
    return [x / sum(w) for x in w]


def expected_stages(solvers, weights=None) -> float:
    """The mean field evaluations per substep of a solver draw."""
    from .swap import STAGES

    return sum(p * STAGES[s] for p, s in zip(_solver_probabilities(solvers, weights), solvers))


def draw_solver(solvers, weights, generator: torch.Generator) -> str:
    """One solver name of ``solvers`` drawn with ``generator`` (``weights``: ``None``,
    ``"cost"``: probability proportional to 1 / stages, or a list)."""
    p = torch.tensor(_solver_probabilities(solvers, weights), dtype=torch.float64)
    return solvers[int(torch.multinomial(p, 1, generator=generator))]
