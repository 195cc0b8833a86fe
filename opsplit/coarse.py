r"""Coarse solves that integrate the controls: a step longer than a control piece reads the
controls *averaged over the step* instead of their value at one time.

A model trained on :math:`P` pieces in time and solved at :math:`N_t < P` steps with the
controls read at each step's start skips pieces: an explicit step of length
:math:`2h` reads :math:`\theta_{2k}` and never :math:`\theta_{2k+1}`.  Solved with
:func:`coarse_controls`, step :math:`k` of a grid of :math:`N` steps (:math:`N` dividing
:math:`P`, :math:`r = P/N`) reads

.. math::  \bar\theta_k = \frac1{\Delta t}\int_{t^k}^{t^{k+1}} \theta(s)\,ds
           = \frac1r \sum_{i=kr}^{kr+r-1} \theta_i

at every time the substep solver asks for (its stages and the left limit at the step's end;
:class:`~opsplit.controls.PieceAverage`, the quadrature being exact for piecewise-constant
controls).  For the linear term :math:`u_t = u\,W(t)` one step of length :math:`\Delta t`
is then :math:`\exp(\Delta t\,\bar W)`, the first term of the Magnus expansion of the exact
:math:`\prod_i \exp(h W_i)`; reading :math:`W(t^k)` instead drops
:math:`\Delta t(\bar W - W_{kr})`, an :math:`O(1)` error per step when the pieces differ
(``tests/test_multilevel.py`` compares both with the matrix exponentials).

Used by training (``TrainConfig.coarse_controls``), the continuity and frontier measurements
(:mod:`opsplit.control`) and speculative decoding's drafts
(:class:`~opsplit.models.speculative.DraftSolve`), hence beside the propagator, below both.

Only piecewise-constant controls (:class:`~opsplit.controls.PiecewiseConstant`,
:class:`~opsplit.controls.LayerwiseConstant`) on the propagator's time interval are
averaged; controls continuous in :math:`t` and solves at :math:`N_t \ge P` are left as they
are.  The swap is undone on exit whatever happens, and the parameters stay the model's
(a training step through it differentiates the pieces, each with weight :math:`1/r`).
"""

from __future__ import annotations

import math

from torch import nn

from ._checks import check_int
from .controls import LayerwiseConstant, PiecewiseConstant
from .controls.refine import PieceAverage
from .propagator import Propagator

__all__ = ["COARSE_MODES", "CoarseControls", "coarse_controls", "piecewise_controls", "check_coarse", "propagators"]


def propagators(model: nn.Module) -> list:
    """The opsplit propagators inside ``model``, in the order of ``model.modules()``."""
    return [m for m in model.modules() if isinstance(m, Propagator)]


#: how a step longer than a control piece reads the controls: at the solver's times
#: (``"point"``), or averaged over the step (``"average"``, :func:`coarse_controls`)
COARSE_MODES = ("point", "average")


def piecewise_controls(module: nn.Module, kinds=(PiecewiseConstant, LayerwiseConstant)) -> list:
    """``(parent, name, control)`` for every control of ``kinds`` below ``module``, in the
    order of ``module.modules()`` (a control shared by several parents once per parent)."""
    out = []
    for parent in module.modules():
        if isinstance(parent, PieceAverage):  # a view already in place: its source is not swapped again
            continue
        for name, child in parent.named_children():
            if isinstance(child, kinds):
                out.append((parent, name, child))
    return out


def _same(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12)


def check_coarse(model: nn.Module, n_steps: int, name: str = "n_steps") -> None:
    """Refuse, naming ``name``, an :math:`N_t` below a piecewise-constant control's pieces
    that does not divide them (a coarse step would straddle a piece)."""
    n = check_int(n_steps, name, 1)
    for prop in propagators(model):
        for _, _, c in piecewise_controls(prop.scheme):
            P = c.n_pieces
            if n < P and P % n:
                raise ValueError(f"{name}: N_t = {n} steps cannot average the {P} pieces of a control (a step would "
                                 f"straddle a piece); expected a divisor of {P} or N_t >= {P}")


class CoarseControls:
    """The swap of :func:`coarse_controls`, made once and entered as often as wanted: ``with
    swap: ...`` puts the averaging views in place, leaving restores the model's controls
    (a speculative draft enters it for each round of drafts, between the target's calls).
    Built by :func:`coarse_controls`; the checks run when it is built."""

    def __init__(self, model: nn.Module, n_steps: int | None):
        self.model, self._swaps, self._inside = model, [], False
        if n_steps is None:
            return
        check_coarse(model, n_steps, "coarse_controls.n_steps")
        views = {}
        for prop in propagators(model):
            for parent, name, c in piecewise_controls(prop.scheme):
                if c.n_pieces <= n_steps:
                    continue
                if not (_same(c.t0, prop.t0) and _same(c.t1, prop.t1)):
                    raise ValueError(f"coarse_controls: a control on [{c.t0:g}, {c.t1:g}] inside a propagator on "
                                     f"[{prop.t0:g}, {prop.t1:g}]; its pieces are not the propagator's steps")
                if id(c) not in views:
                    views[id(c)] = PieceAverage(c, n_steps)
                self._swaps.append((parent, name, c, views[id(c)]))

    def __enter__(self) -> nn.Module:
        if self._inside:
            raise RuntimeError("coarse_controls: already in place (a swap is entered once at a time)")
        self._inside = True
        # each name is already a child module of its parent: Module.__setattr__ would put it
        # in the same place, parent._modules[name] (set directly: entered once per draft round)
        for parent, name, _, view in self._swaps:
            parent._modules[name] = view
        return self.model

    def __exit__(self, *exc) -> bool:
        for parent, name, c, _ in reversed(self._swaps):
            parent._modules[name] = c
        self._inside = False
        return False


def coarse_controls(model: nn.Module, n_steps: int | None) -> CoarseControls:
    """``with coarse_controls(model, N): model(x, n_steps=N)`` — every piecewise-constant
    control of :math:`P > N` pieces inside the model's propagators read as its averages over
    the :math:`N` steps (module docstring).  ``n_steps=None`` (the model's own grid) changes
    nothing.  Refused before anything is swapped: :math:`N` not dividing :math:`P`, a
    control on another time interval than its propagator's.  The returned
    :class:`CoarseControls` may be entered again (one swap built, used many times)."""
    return CoarseControls(model, n_steps)
