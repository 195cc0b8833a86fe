r"""Running costs on the *state*: how hard the flow :math:`u(t)` is to solve.

The running costs of :mod:`opsplit.control.costs` act on the controls :math:`\theta(t)`.
These act on the trajectory the forward solve produces, in the spirit of Finlay et al.,
*How to Train Your Neural ODE* (ICML 2020: the kinetic energy :math:`\int\|u_t\|^2 dt`) and
Kelly et al., *Learning Differential Equations that are Easy to Solve* (NeurIPS 2020: the
higher derivatives :math:`\int\|d^k u/dt^k\|^2 dt`).  A flow with a small speed and a small
acceleration is one that a coarse explicit step already follows closely: Euler's local
error over a step is :math:`\tfrac12\Delta t^2 u_{tt}`, so the acceleration cost is the
scheme's own local error estimate summed over the steps.

Both are read off the steps :math:`u^n \to u^{n+1}` of every propagator of the model
(:meth:`opsplit.Propagator.register_step_hook`), at the cost of a few reductions: no extra
field evaluation.  A third, the **defect** (:meth:`FlowRecorder.defect`), is the
embedded local error estimate of each step — the step taken once more from its end point
with the same controls, Heun's second stage for the whole splitting step — and costs one
extra step on the fraction ``defect_fraction`` of the batch it is estimated on.  With :math:`\delta^n = u^{n+1} - u^n` and :math:`\Delta t_n` the step,

.. math::

    K = \sum_n \Delta t_n \Big\| \frac{\delta^n}{\Delta t_n} \Big\|^2_{r},\qquad
    A = \sum_{n \ge 1} \bar{\Delta t}_n \Big\| \frac{\delta^n/\Delta t_n - \delta^{n-1}/\Delta t_{n-1}}{\bar{\Delta t}_n} \Big\|^2_{r},

:math:`\bar{\Delta t}_n = (\Delta t_{n-1} + \Delta t_n)/2`: quadratures of
:math:`\int\|u_t\|^2 dt` and :math:`\int\|u_{tt}\|^2 dt` that converge as :math:`\Delta t
\to 0` (so their values at different :math:`N_t` are comparable).  The norm
:math:`\|\cdot\|_r` is **relative** by default (``relative=True``): for every token
(every x, every sample) the squared norm over the features divided by the squared norm of
the token's centred state :math:`\|u^n - \bar u^n\|^2 + \varepsilon N_y`, then averaged
over tokens and samples.  A model that normalises its state before every term (pre-norm
LayerNorm, eqs. 13–17 with S1) computes the same function from :math:`c\,u` and
:math:`c\,A` for every :math:`c > 0`; an absolute cost would just shrink both and change
nothing, while the relative speed — how far a step moves the state compared with its own
size, which is what the explicit step's error depends on — cannot be gamed that way.
``relative=False`` gives the plain mean over tokens of the squared feature norms.
"""

from __future__ import annotations

import contextlib

import torch
from torch import Tensor, nn

from ..propagator import Propagator

__all__ = ["FlowRecorder", "record_flow", "FLOW_COSTS", "check_flow_costs"]

#: the state running costs (weights of :class:`~opsplit.control.Objective`)
FLOW_COSTS = ("kinetic", "acceleration", "defect")


def _sq(v: Tensor, scale: Tensor | None) -> Tensor:
    """Mean over tokens (every dim but the last) of ``|v|^2`` over the last dim, relative to
    ``scale`` (per token) when given."""
    s = v.square().sum(-1)
    if scale is not None:
        s = s / scale
    return s.mean()


class FlowRecorder:
    """The steps of every propagator of a model during one forward call, and the state
    running costs computed from them (module docstring).  Use :func:`record_flow`."""

    def __init__(self, model: nn.Module, *, relative: bool = True, eps: float = 1e-5, defect_fraction: float = 0.0):
        self.props = [m for m in model.modules() if isinstance(m, Propagator)]
        if not self.props:
            raise ValueError("flow costs (kinetic / acceleration): the model holds no opsplit Propagator whose "
                             "trajectory they could measure")
        self.relative, self.eps = bool(relative), float(eps)
        self.steps: dict = {id(p): [] for p in self.props}
        self.defect_fraction = float(defect_fraction)
        self.defects: list = []
        self._handles = []

    def _hook(self, prop, t, dt, before, after, grid):
        self.steps[id(prop)].append((float(dt), before, after))
        if self.defect_fraction and before.shape == after.shape:
            # the scheme's own step again from the Euler end point, with the same controls (time t):
            # Heun's second stage at the level of the whole splitting step, on a part of the batch
            m = max(1, int(round(self.defect_fraction * after.shape[0])))
            w = prop.scheme.step(t, dt, after[:m], grid)
            self.defects.append((float(dt), before[:m], after[:m], w))

    def __enter__(self):
        for p in self.props:
            self._handles.append(p.register_step_hook(self._hook))
        return self

    def __exit__(self, *exc):
        for h in self._handles:
            h.remove()
        self._handles = []
        return False

    def _scale(self, u: Tensor) -> Tensor | None:
        if not self.relative:
            return None
        c = u - u.mean(-1, keepdim=True)
        return c.square().sum(-1) + self.eps * u.shape[-1]

    def kinetic(self) -> Tensor:
        r""":math:`\sum_n \Delta t_n \|\delta^n / \Delta t_n\|_r^2` over every propagator."""
        total = None
        for steps in self.steps.values():
            for dt, a, b in steps:
                if a.shape != b.shape:  # a grid transfer: no speed across it
                    continue
                term = _sq(b - a, self._scale(a)) / dt
                total = term if total is None else total + term
        if total is None:
            raise ValueError("flow costs: the forward call made no step (a model whose propagator was not called, "
                             "or the adaptive solve, which has no step hooks)")
        return total

    def acceleration(self) -> Tensor:
        r""":math:`\sum_{n\ge1} \bar{\Delta t}_n \|(\delta^n/\Delta t_n - \delta^{n-1}/\Delta t_{n-1})
        / \bar{\Delta t}_n\|_r^2` over every propagator (zero for a single step)."""
        total = None
        for steps in self.steps.values():
            for (dt0, a0, b0), (dt1, a1, b1) in zip(steps[:-1], steps[1:]):
                if not (a0.shape == b0.shape == b1.shape):
                    continue
                h = 0.5 * (dt0 + dt1)
                dv = (b1 - a1) / dt1 - (b0 - a0) / dt0
                term = _sq(dv, self._scale(a1)) / h
                total = term if total is None else total + term
        if total is None:
            p = self.props[0]
            ref = next(iter(p.parameters()), None)
            return torch.zeros((), dtype=ref.dtype if ref is not None else torch.get_default_dtype())
        return total

    def defect(self) -> Tensor:
        r""":math:`\sum_n \Delta t_n \|(\delta_*^n - \delta^n)/\Delta t_n^2\|_r^2` with
        :math:`\delta_*^n = \Psi_{\Delta t_n}(u^{n+1}; t_n) - u^{n+1}` one more step of the
        scheme from the step's end with the step's own controls: twice the difference of
        Heun's (trapezoidal) step and Euler's, i.e. the embedded local error estimate of the
        step, on the first ``defect_fraction`` of the batch."""
        total = None
        for dt, a, b, w in self.defects:
            term = _sq(((w - b) - (b - a)) / (dt * dt), self._scale(b)) * dt
            total = term if total is None else total + term
        if total is None:
            raise ValueError("flow costs: no step to estimate the defect of (defect_fraction = 0, or no step made)")
        return total


def check_flow_costs(objective, model: nn.Module) -> None:
    """Before training: an objective with a flow cost needs a propagator in ``model`` and the
    plain time loop (the checkpointed loop would record its recomputed steps again)."""
    active = [k for k in FLOW_COSTS if getattr(objective, k, 0.0)]
    if not active:
        return
    props = [m for m in model.modules() if isinstance(m, Propagator)]
    if not props:
        raise ValueError(f"Objective.{active[0]}: the model holds no opsplit Propagator whose trajectory the flow "
                         "cost could measure")
    if any(p.checkpoint_every for p in props):
        raise ValueError(f"Objective.{active[0]}: a flow cost reads every step of the forward solve, and the "
                         "checkpointed time loop (gradient='checkpoint', or 'adjoint' with snapshots) recomputes "
                         "steps; train with gradient='backprop'")


@contextlib.contextmanager
def record_flow(model: nn.Module, *, relative: bool = True, eps: float = 1e-5, defect_fraction: float = 0.0):
    """``with record_flow(model) as rec: out = model(x)``, then ``rec.kinetic()``,
    ``rec.acceleration()`` and (``defect_fraction > 0``) ``rec.defect()`` (differentiable)."""
    rec = FlowRecorder(model, relative=relative, eps=eps, defect_fraction=defect_fraction)
    with rec:
        yield rec
