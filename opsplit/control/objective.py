r"""The training objective: paper 002, eqs. (10), (12) and (36), with running costs.

.. math::

    J(\theta) = \frac1B \sum_{i=1}^B \ell\big(\mathcal N_\theta(u_i), v_i\big)
        \;+\; \alpha \int_{t_0}^{T} \|\theta'(t)\|^2\,dt
        \;+\; \beta \int_{t_0}^{T} \|\theta(t)\|^2\,dt
        \;+\; \kappa \int_{t_0}^{T} \|u_t\|_r^2\,dt \;+\; \gamma \int_{t_0}^{T} \|u_{tt}\|_r^2\,dt .

* eq. (10): :math:`\mathcal N_\theta` the continuous map :math:`f \mapsto u(T)` (the
  unsplit reference, :class:`~opsplit.control.Unsplit`);
* eq. (12): :math:`\bar{\mathcal N}_{\bar\theta}` the splitting discretisation (a
  :class:`~opsplit.Propagator`);
* eq. (36): :math:`G \circ \bar{\mathcal N} \circ F` with pre/post-processing (ViT, §4.2;
  any ``nn.Module`` whose forward maps inputs to outputs).

The data term is the same for all three: :class:`Objective` calls the model.  The running
costs (:mod:`opsplit.control.costs`) act on the model's controls :math:`\theta(t)`;
:math:`\alpha` = ``smoothness``, :math:`\beta` = ``energy`` (both 0 by default: the paper's
objective).  :math:`\kappa` = ``kinetic`` and :math:`\gamma` = ``acceleration`` weigh running
costs on the *state*, read off the forward solve's steps
(:mod:`opsplit.control.flow_costs`: the relative speed and acceleration of the flow, what
makes it easy to solve at other :math:`N_t`).

**Self-distillation at coarse** :math:`N_t` (``TrainConfig.n_steps_distill`` = :math:`\lambda`).
A step of multi-resolution training drawn at an :math:`N_t` below the finest of the draws
fits, besides the targets, the model's own solution at the finest :math:`N_t`
(:math:`w^{\mathrm{fine}}_i`, computed without gradient):

.. math::

    J_{\mathrm{coarse}} = (1-\lambda)\,\frac1B \sum_i \ell(w_i, v_i)
        + \lambda\,\frac1B \sum_i D\big(w^{\mathrm{fine}}_i \,\|\, w_i\big) + \text{running costs},

:math:`D` the Kullback-Leibler divergence of the softmax distributions over the last
dimension for logits (``distill="kl"``, the mean over positions), the mean of squares
otherwise (``"mse"``): in-place distillation (Yu and Huang, "Universally Slimmable
Networks", ICCV 2019), the coarse solve learning what the fine one predicts rather than
only the labels.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .._checks import check_bool
from ..analysis.metrics import relative_l2
from ..propagator import Propagator
from .costs import check_controls, energy_cost, smoothness_cost
from .flow_costs import record_flow

__all__ = ["Objective", "ObjectiveValue", "LOSSES", "DISTILL", "model_interval", "WEIGHTS", "check_objective"]

#: the named losses ell
LOSSES = ("mse", "cross_entropy", "relative_l2")
#: the divergences of self-distillation (TrainConfig.n_steps_distill)
DISTILL = ("kl", "mse")
#: the weights of the running costs, with the cost each weighs (in words)
WEIGHTS = {"smoothness": "the controls' smoothness cost", "energy": "the controls' energy cost",
           "kinetic": "the flow's kinetic energy", "acceleration": "the flow's acceleration",
           "defect": "the steps' error estimate"}


@dataclass
class ObjectiveValue:
    """The terms of :math:`J`: ``total = data + smoothness * alpha + energy * beta
    + kinetic * kappa + acceleration * gamma``."""

    total: Tensor
    data: Tensor
    smoothness: Tensor | None
    energy: Tensor | None
    outputs: Tensor
    kinetic: Tensor | None = None
    acceleration: Tensor | None = None
    defect: Tensor | None = None
    distill: Tensor | None = None

    @classmethod
    def mixture(cls, values, weights) -> ObjectiveValue:
        """``sum_i weights[i] * values[i]`` term by term (the objective of a batch solved in
        parts, ``weights`` their shares); the outputs of the parts concatenated along the
        batch, in order.  A term present in one part is present in all (the same objective)."""
        values, weights = list(values), [float(w) for w in weights]
        if not values or len(values) != len(weights):
            raise ValueError(f"ObjectiveValue.mixture: expected one weight per value, got {len(values)} values and "
                             f"{len(weights)} weights")

        def mix(name):
            terms = [getattr(v, name) for v in values]
            if any(t is None for t in terms):
                return None
            return sum(w * t for w, t in zip(weights, terms))

        outs = [v.outputs for v in values]
        outputs = outs[0] if len(outs) == 1 else torch.cat(outs, dim=0)
        return cls(mix("total"), mix("data"), mix("smoothness"), mix("energy"), outputs, mix("kinetic"),
                   mix("acceleration"), mix("defect"), mix("distill"))

    def as_floats(self) -> dict:
        out = {"loss": float(self.total.detach()), "data": float(self.data.detach())}
        if self.smoothness is not None:
            out["smoothness"] = float(self.smoothness.detach())
        if self.energy is not None:
            out["energy"] = float(self.energy.detach())
        for k in ("kinetic", "acceleration", "defect", "distill"):
            v = getattr(self, k)
            if v is not None:
                out[k] = float(v.detach())
        return out


def model_interval(model: nn.Module):
    """``(t0, T)`` of the first :class:`~opsplit.Propagator` inside ``model`` (or ``None``)."""
    for m in model.modules():
        if isinstance(m, Propagator):
            return (m.t0, m.t1)
    return None


def _select(out, output, name="model output"):
    if output is None:
        if not isinstance(out, Tensor):
            raise TypeError(
                f"{name}: the model returned a {type(out).__name__}, not a tensor; pass "
                "Objective(output=...) (an attribute name such as 'logits', or a callable)"
            )
        return out
    if callable(output):
        return output(out)
    if not hasattr(out, output):
        raise ValueError(f"Objective.output: the model output has no attribute {output!r}")
    return getattr(out, output)


class Objective(nn.Module):
    r""":math:`J(\theta)` of the module docstring.

    Args:
        loss: ``"mse"`` (mean of squares over all entries: :math:`\ell(w, v) =
            \mathrm{mean}|w - v|^2` averaged over the batch), ``"cross_entropy"``
            (outputs ``(B, C)`` logits with targets ``(B,)`` class indices, or sequence
            logits ``(B, N, C)`` with targets ``(B, N)``: the mean over all positions),
            ``"relative_l2"`` (:math:`\|w_i - v_i\|_2 / \|v_i\|_2` averaged over the batch:
            :func:`opsplit.analysis.metrics.relative_l2`), or a callable
            ``loss(outputs, targets)`` returning a scalar or a per-sample ``(B,)`` tensor
            (then averaged: the :math:`\frac1B \sum_i`).
        smoothness: :math:`\alpha \ge 0`, weight of :math:`\int\|\theta'\|^2 dt`.
        energy: :math:`\beta \ge 0`, weight of :math:`\int\|\theta\|^2 dt`.
        kinetic: :math:`\kappa \ge 0`, weight of the flow's kinetic energy
            :math:`\int\|u_t\|_r^2 dt` (:mod:`opsplit.control.flow_costs`).
        acceleration: :math:`\gamma \ge 0`, weight of :math:`\int\|u_{tt}\|_r^2 dt`.
        defect: weight :math:`\ge 0` of the steps' embedded local error estimate
            (:meth:`~opsplit.control.flow_costs.FlowRecorder.defect`), estimated on the
            fraction ``defect_fraction`` of each batch (one extra step there).
        flow_relative: the flow costs' norm relative to each token's centred state
            (default) or absolute.
        output: what of the model's output the loss reads: ``None`` (the output is a
            tensor), an attribute name (``"logits"`` of a ViT output) or a callable.
        controls: the controls the running costs act on (default: every leaf control of
            the model, :func:`~opsplit.control.costs.leaf_controls`).
        distill: the divergence :math:`D` of self-distillation (module docstring):
            ``"kl"`` (outputs are logits over the last dimension), ``"mse"``, or ``None``
            (the default: ``"kl"`` for ``"cross_entropy"``, ``"mse"`` for ``"mse"`` and
            ``"relative_l2"``, none for a callable loss, which must name it to be distilled).
    """

    def __init__(self, loss="mse", *, smoothness: float = 0.0, energy: float = 0.0, output=None,
                 controls=None, kinetic: float = 0.0, acceleration: float = 0.0, defect: float = 0.0,
                 defect_fraction: float = 0.25, flow_relative: bool = True, distill: str | None = None):
        super().__init__()
        if isinstance(loss, str):
            if loss not in LOSSES:
                raise ValueError(f"Objective.loss: expected one of {LOSSES} or a callable, got {loss!r}")
        elif not callable(loss):
            raise TypeError(f"Objective.loss: expected a name {LOSSES} or a callable, got {type(loss).__name__}")
        self.loss = loss
        for name, v in (("smoothness", smoothness), ("energy", energy), ("kinetic", kinetic),
                        ("acceleration", acceleration), ("defect", defect)):
            if isinstance(v, bool) or not isinstance(v, (int, float)):
                raise TypeError(f"Objective.{name}: expected a number (a weight >= 0), got {v!r}")
            if not math.isfinite(v) or v < 0:
                raise ValueError(f"Objective.{name}: expected a finite weight >= 0, got {v!r}")
        self.smoothness = float(smoothness)
        self.energy = float(energy)
        self.kinetic = float(kinetic)
        self.acceleration = float(acceleration)
        self.defect = float(defect)
        if isinstance(defect_fraction, bool) or not isinstance(defect_fraction, (int, float)) or \
                not 0 < defect_fraction <= 1:
            raise ValueError(f"Objective.defect_fraction: expected a number in (0, 1] (the part of the batch the "
                             f"defect is estimated on), got {defect_fraction!r}")
        self.defect_fraction = float(defect_fraction)
        self.flow_relative = check_bool(flow_relative, "Objective.flow_relative")
        if output is not None and not (isinstance(output, str) or callable(output)):
            raise TypeError(f"Objective.output: expected None, an attribute name or a callable, got {output!r}")
        self.output = output
        self.controls = None if controls is None else check_controls(controls, "Objective.controls")
        if distill is not None and distill not in DISTILL:
            raise ValueError(f"Objective.distill: expected None or one of {DISTILL}, got {distill!r}")
        self.distill = distill

    @property
    def distill_kind(self) -> str | None:
        """The divergence of self-distillation: ``distill``, or the loss's own (``None``
        for a callable loss without ``distill``)."""
        if self.distill is not None:
            return self.distill
        if self.loss == "cross_entropy":
            return "kl"
        return "mse" if self.loss in ("mse", "relative_l2") else None

    @property
    def is_classification(self) -> bool:
        return self.loss == "cross_entropy"

    # -- checks -----------------------------------------------------------------------------
    def check(self, outputs: Tensor, targets: Tensor) -> None:
        """Raise a clear error when ``outputs`` and ``targets`` do not fit the loss."""
        if not isinstance(targets, Tensor):
            raise TypeError(f"targets: expected a torch.Tensor, got {type(targets).__name__}")
        if not isinstance(outputs, Tensor):
            raise TypeError(f"model output: expected a torch.Tensor, got {type(outputs).__name__}")
        if self.loss in ("mse", "relative_l2"):
            if outputs.shape != targets.shape:
                raise ValueError(
                    f"loss {self.loss!r}: model output shape {tuple(outputs.shape)} and targets shape "
                    f"{tuple(targets.shape)} differ"
                )
            if not targets.is_floating_point():
                raise TypeError(f"loss {self.loss!r}: expected floating-point targets, got dtype {targets.dtype}")
        elif self.loss == "cross_entropy":
            if outputs.dim() < 2:
                raise ValueError(
                    f"loss 'cross_entropy': expected model output (B, C) logits or (B, N, C) sequence logits, got "
                    f"shape {tuple(outputs.shape)}"
                )
            if tuple(targets.shape) != tuple(outputs.shape[:-1]):
                want = ", ".join(map(str, outputs.shape[:-1]))
                what = "class indices" if outputs.dim() == 2 else "token ids, one per position"
                raise ValueError(
                    f"loss 'cross_entropy': expected targets ({want}{',' if outputs.dim() == 2 else ''}) of {what} "
                    f"for model output {tuple(outputs.shape)}, got shape {tuple(targets.shape)}"
                )
            if targets.dtype not in (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8):
                raise TypeError(f"loss 'cross_entropy': expected integer class targets, got dtype {targets.dtype}")
            C = outputs.shape[-1]
            if targets.numel() and (int(targets.min()) < 0 or int(targets.max()) >= C):
                raise ValueError(
                    f"loss 'cross_entropy': targets must be class indices in [0, {C - 1}], got range "
                    f"[{int(targets.min())}, {int(targets.max())}]"
                )

    # -- terms --------------------------------------------------------------------------------
    def data_term(self, outputs: Tensor, targets: Tensor) -> Tensor:
        r""":math:`\frac1B \sum_i \ell(w_i, v_i)` (cross-entropy of sequence logits: the mean
        over all positions)."""
        if self.loss == "mse":
            return F.mse_loss(outputs, targets)
        if self.loss == "cross_entropy":
            return F.cross_entropy(outputs.reshape(-1, outputs.shape[-1]), targets.reshape(-1).long())
        if self.loss == "relative_l2":
            return relative_l2(outputs, targets)
        val = self.loss(outputs, targets)
        if not isinstance(val, Tensor):
            raise TypeError(f"Objective.loss: the callable returned {type(val).__name__}, expected a tensor")
        if val.dim() == 1 and val.shape[0] == outputs.shape[0]:
            return val.mean()
        if val.dim() != 0:
            raise ValueError(
                f"Objective.loss: the callable returned shape {tuple(val.shape)}; expected a scalar or "
                f"per-sample values ({outputs.shape[0]},)"
            )
        return val

    def distill_term(self, outputs: Tensor, teacher: Tensor) -> Tensor:
        r""":math:`\frac1B \sum_i D(w^{\mathrm{fine}}_i \| w_i)` of the module docstring
        (``teacher`` = :math:`w^{\mathrm{fine}}`, no gradient flows into it)."""
        kind = self.distill_kind
        if kind is None:
            raise ValueError("Objective.distill: a callable loss has no divergence of its own for self-distillation; "
                             f"expected Objective(distill=...) with one of {DISTILL}")
        if not isinstance(teacher, Tensor) or teacher.shape != outputs.shape:
            got = tuple(teacher.shape) if isinstance(teacher, Tensor) else type(teacher).__name__
            raise ValueError(f"Objective.distill_term: expected the fine solution's outputs of the outputs' shape "
                             f"{tuple(outputs.shape)}, got {got}")
        teacher = teacher.detach()
        if kind == "mse":
            return F.mse_loss(outputs, teacher)
        C = outputs.shape[-1]
        return F.kl_div(F.log_softmax(outputs.reshape(-1, C), -1), F.log_softmax(teacher.reshape(-1, C), -1),
                        reduction="batchmean", log_target=True)

    def running_costs(self, model: nn.Module) -> tuple[Tensor | None, Tensor | None]:
        smooth = smoothness_cost(model, controls=self.controls) if self.smoothness else None
        energy = (
            energy_cost(model, controls=self.controls, default_interval=model_interval(model))
            if self.energy
            else None
        )
        return smooth, energy

    def select(self, out):
        return _select(out, self.output)

    def forward(self, model: nn.Module, inputs, targets: Tensor, *, costs_model: nn.Module | None = None,
                teacher: Tensor | None = None, distill_weight: float = 0.0, **forward_kwargs) -> ObjectiveValue:
        """Evaluate :math:`J` on one batch.

        ``model`` is called as ``model(inputs, **forward_kwargs)``; ``costs_model`` is the
        module whose controls the running costs read (default ``model``; pass the bare
        model when ``model`` is a wrapper such as DistributedDataParallel).  ``teacher``
        (the outputs of the fine solve) and ``distill_weight`` :math:`\\lambda \\in [0, 1]`:
        the self-distillation of the module docstring (``ObjectiveValue.data`` stays the
        targets' term, ``distill`` the divergence).
        """
        kin = acc = dfc = None
        if self.kinetic or self.acceleration or self.defect:
            with record_flow(costs_model if costs_model is not None else model, relative=self.flow_relative,
                             defect_fraction=self.defect_fraction if self.defect else 0.0) as rec:
                outputs = self.select(model(inputs, **forward_kwargs))
            kin = rec.kinetic() if self.kinetic else None
            acc = rec.acceleration() if self.acceleration else None
            dfc = rec.defect() if self.defect else None
        else:
            outputs = self.select(model(inputs, **forward_kwargs))
        data = self.data_term(outputs, targets)
        smooth, energy = self.running_costs(costs_model if costs_model is not None else model)
        total, dist = data, None
        if teacher is not None:
            w = float(distill_weight)
            if not 0.0 <= w <= 1.0:
                raise ValueError(f"Objective.forward.distill_weight: expected a number in [0, 1], got {distill_weight!r}")
            dist = self.distill_term(outputs, teacher)
            total = (1.0 - w) * data + w * dist
        if smooth is not None:
            total = total + self.smoothness * smooth
        if energy is not None:
            total = total + self.energy * energy
        if kin is not None:
            total = total + self.kinetic * kin
        if acc is not None:
            total = total + self.acceleration * acc
        if dfc is not None:
            total = total + self.defect * dfc
        return ObjectiveValue(total, data, smooth, energy, outputs, kin, acc, dfc, dist)

    def check_weights(self, dtype: torch.dtype) -> None:
        """Refuse a weight beyond the largest number of ``dtype`` (the parameters' type, in
        which the weighted terms are computed): the weight itself is ``inf`` there, so its
        term would be ``inf`` (or ``NaN`` for a zero cost) at the first step."""
        big = torch.finfo(dtype).max
        for name in WEIGHTS:
            w = getattr(self, name)
            if w > big:
                raise ValueError(f"Objective.{name}: a weight of {w:g} is beyond the largest {str(dtype)[6:]} number "
                                 f"({big:.3g}), in which the objective is computed: its term would be inf or NaN from "
                                 f"the first step; expected a weight w with w x ({WEIGHTS[name]}) finite, far below "
                                 f"{big:.3g}")

    def extra_repr(self) -> str:
        loss = self.loss if isinstance(self.loss, str) else getattr(self.loss, "__name__", "callable")
        flow = "".join(f", {k}={getattr(self, k):g}" for k in ("kinetic", "acceleration", "defect")
                       if getattr(self, k))
        return f"loss={loss!r}, smoothness={self.smoothness:g}, energy={self.energy:g}{flow}"


def check_objective(objective: Objective, model: nn.Module, inputs, targets: Tensor, *, what: str = "training samples",
                    **forward_kwargs) -> dict:
    r"""Before training: the weighted running costs of :math:`J` of the untrained ``model`` on a
    few samples, and their gradients, must be finite in the parameters' dtype.

    **The rule for the weights.**  A weight :math:`w` of a running cost :math:`C` is refused
    (``ValueError`` naming ``Objective.<weight>``, with the largest weight that passes) when

    * :math:`w` exceeds the largest number :math:`M` of the parameters' dtype
      (:meth:`Objective.check_weights`: :math:`w` is ``inf`` there);
    * :math:`w\,C \ge M`, with :math:`C` the (finite) cost of the untrained model on these
      samples: the objective would be ``inf`` at the first step;
    * :math:`w\,\|\nabla_\theta C\| \ge \sqrt{M}`: the trainer's global gradient norm (a sum
      of squares in the dtype) would overflow at the first step, which stops the run.

    A finite start is necessary, not sufficient: a term that grows during training until it
    overflows stops the run there, with a ``FloatingPointError`` naming the step.  The model
    is solved once, in eval mode (``model``'s flag restored), only when a flow cost is
    weighted; the loss is not evaluated (the data term is checked by the trainer); no
    parameter's ``.grad`` is touched.  Returns ``{weight name: cost}`` of the weighted costs."""
    params = [p for p in model.parameters() if p.is_floating_point()]
    dtype = params[0].dtype if params else torch.get_default_dtype()
    objective.check_weights(dtype)
    trainable = [p for p in params if p.requires_grad]
    active = [k for k in WEIGHTS if getattr(objective, k)]
    if not active:
        return {}
    flows = [k for k in ("kinetic", "acceleration", "defect") if getattr(objective, k)]
    costs = {}
    was = model.training
    model.eval()
    try:
        with torch.set_grad_enabled(bool(trainable)):
            if flows:
                with record_flow(model, relative=objective.flow_relative,
                                 defect_fraction=objective.defect_fraction if objective.defect else 0.0) as rec:
                    model(inputs, **forward_kwargs)
                costs.update({k: getattr(rec, k)() for k in flows})
            smooth, energy = objective.running_costs(model)
            costs.update({k: v for k, v in (("smoothness", smooth), ("energy", energy)) if v is not None})
    finally:
        model.train(was)
    big, kind, n = torch.finfo(dtype).max, str(dtype).replace("torch.", ""), len(targets)
    total = 0.0
    for name, term in costs.items():
        w, c = getattr(objective, name), float(term.detach())
        if math.isfinite(c) and not math.isfinite(float(term.detach() * w)):
            raise ValueError(f"Objective.{name}: the weight {w:g} times {WEIGHTS[name]} {c:.4g} of the untrained model "
                             f"on {n} {what} is not finite in {kind} (largest {big:.3g}): the objective would be inf at "
                             f"the first step; expected a weight below {big / c:.3g}, and far below it (the term grows "
                             "with training)")
        if math.isfinite(c) and term.requires_grad:
            grads = torch.autograd.grad(term, trainable, retain_graph=True, allow_unused=True)
            norm = math.sqrt(sum(float(g.double().square().sum()) for g in grads if g is not None))
            if math.isfinite(norm) and w * norm >= math.sqrt(big):
                raise ValueError(
                    f"Objective.{name}: the weight {w:g} times the gradient of {WEIGHTS[name]} (norm {norm:.4g}) of the "
                    f"untrained model on {n} {what} has a norm of {w * norm:.3g}, whose square overflows {kind} "
                    f"(largest {big:.3g}): the global gradient norm would be inf at the first step; expected a weight "
                    f"below {math.sqrt(big) / norm:.3g}, and far below it")
        total += w * c
    if math.isfinite(total) and total >= big:
        worst = max(costs, key=lambda k: getattr(objective, k) * float(costs[k].detach()))
        raise ValueError(f"Objective.{worst}: the weighted costs of the untrained model on {n} {what} sum to "
                         f"{total:.3g}, beyond the largest {kind} number ({big:.3g}): the objective would be inf at the "
                         "first step; expected smaller weights")
    return {k: float(v.detach()) for k, v in costs.items()}
