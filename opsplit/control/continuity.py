r"""Is a trained model a continuous-time model?  The solver-swap test (Ott et al., *ResNet
After All? Neural ODEs and Their Numerical Solution*, ICLR 2021) for any model the
:class:`~opsplit.control.Trainer` trains.

A model trained with a splitting scheme at :math:`N_t` steps is a map of its controls
:math:`\theta(t)`.  If it is a model of the continuous equation (and not of its training
grid), solving the same :math:`\theta(t)` more accurately — more steps, a higher-order
substep solver, another splitting — changes its outputs little, and the outputs converge
as :math:`\Delta t \to 0` at the order of the method.  :func:`continuity` measures both:

* **the metric table**: the model's metric (accuracy, loss, bits per character, ...) on a
  data set at every :math:`N_t` of ``n_steps`` (default: from half to 16 times the training
  :math:`N_t`), for every substep solver of ``solvers`` (explicit Euler, Heun, RK4: the
  solvers with an explicit field; a substep solved by a resolvent or an exact flow — a
  projection, an implicit step — keeps its solver) and every scheme of ``schemes`` (the
  training scheme and Strang), each row with its difference to the training grid;
* **the convergence of the outputs** (the logits): the outputs at :math:`N, 2N, \dots,
  16N` steps of the training scheme and solver; their relative :math:`L^2` distance to the
  finest (the ":math:`16\times` limit"), and the order fitted to the successive
  differences :math:`\|z_{2^{k}N} - z_{2^{k+1}N}\|` (which shrink like :math:`\Delta t^p`
  for a method of order :math:`p` in its asymptotic range; the distances to the finest
  solution do not, since the finest carries an error of its own).

The model is called as ``model(inputs, n_steps=N)``, as the trainer's ``evaluate`` does;
the solver and scheme swaps are applied to every :class:`~opsplit.Propagator` inside the
model for the duration of the call (:func:`solved_with`) and undone afterwards, whatever
happens.  Nothing is trained and no gradient is recorded.

**The training grid.**  ``n_steps=None`` takes the model's own :math:`N_t` (the
``n_steps`` of its first propagator): the grid a model built with ``n_steps=N`` and
trained by the trainer without ``TrainConfig.n_steps`` was trained on.  A model trained at
several :math:`N_t` names its reference grid with ``reference=``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field

import numpy as np
import torch
from torch import Tensor, nn

from .._checks import check_choice
from ..analysis.convergence import OrderFit, fit_order
from ..coarse import COARSE_MODES, check_coarse, coarse_controls
from ..data.base import check_int
from ..schemes import Strang
from ..schemes.nested import SchemeFlow
from ..solvers import name_of
from ..solvers.base import Substep
from .objective import Objective, _select
from .swap import (
    SOLVERS,
    STAGES,
    as_solver,
    field_substeps,
    propagators,
    solved_with,
    solver_name,
    strang_of,
)
from .trainer import as_dataset

__all__ = ["Continuity", "continuity", "solved_with", "SOLVERS", "strang_of", "solver_name"]


#: the schemes named by :func:`continuity`: the model's own and Strang
SCHEMES = ("trained", "strang")


def _trained_solver(model) -> str:
    names = {solver_name(s.solver) for p in propagators(model) for s in field_substeps(p.scheme)}
    if not names:
        return "none"
    return names.pop() if len(names) == 1 else "mixed"


def _scheme_name(model) -> str:
    names = {type(p.scheme).__name__.lower() for p in propagators(model)}
    return names.pop() if len(names) == 1 else "mixed"


@dataclass
class Continuity:
    """What :func:`continuity` measured.

    Attributes:
        rows: one dict per solve: ``scheme``, ``solver``, ``n_steps``, ``dt``, the metric
            (``metric`` key: its name), ``loss``, ``delta`` (metric minus the training grid's),
            ``cost`` (field evaluations relative to the training grid), ``reference``
            (``True`` for the training grid's row).
        metric: the metric's name.
        reference: the training grid's row.
        levels: the :math:`N_t` of the output-convergence study (training scheme and solver).
        errors: relative :math:`L^2` distance of the outputs at each level but the last to
            the last (the finest: the limit).
        differences: relative :math:`L^2` distance between the outputs of successive
            levels (relative to the finest's norm).
        fit: the order fitted to ``differences`` against :math:`\\Delta t`
            (:class:`~opsplit.analysis.OrderFit`; ``None`` with fewer than two differences
            or a zero difference).
        higher_is_better: whether a larger metric is better (accuracy) or a smaller one (loss).
    """

    rows: list
    metric: str
    reference: dict
    levels: list = field(default_factory=list)
    errors: list = field(default_factory=list)
    differences: list = field(default_factory=list)
    fit: OrderFit | None = None
    higher_is_better: bool = True
    T: float = 1.0

    @property
    def order(self) -> float:
        """The fitted order of the outputs' convergence (NaN when not fitted)."""
        return float("nan") if self.fit is None else self.fit.order

    def worst(self, *, n_min: int | None = None, exclude_reference: bool = True) -> dict:
        """The row whose metric is furthest on the bad side of the training grid's (rows with
        ``n_steps >= n_min`` when given)."""
        rows = [r for r in self.rows if not (exclude_reference and r["reference"])
                and (n_min is None or r["n_steps"] >= n_min)]
        if not rows:
            raise ValueError("Continuity.worst: no row to compare")
        sign = 1.0 if self.higher_is_better else -1.0
        return min(rows, key=lambda r: sign * r["delta"])

    def table(self) -> list[dict]:
        """The rows as plain dicts (for CSV / Markdown)."""
        return [dict(r) for r in self.rows]

    def convergence_table(self) -> list[dict]:
        """One row per level: :math:`N_t`, :math:`\\Delta t`, the distance to the finest
        level's outputs and to the next level's."""
        out = []
        for i, n in enumerate(self.levels):
            out.append({"n_steps": n, "dt": self.T / n,
                        "error_vs_finest": self.errors[i] if i < len(self.errors) else None,
                        "difference_to_next": self.differences[i] if i < len(self.differences) else None})
        return out

    def markdown(self, digits: int = 4) -> str:
        """The metric table (one row per :math:`N_t`, one column per scheme and solver) and
        the convergence line, as Markdown."""
        cols = list(dict.fromkeys((r["scheme"], r["solver"]) for r in self.rows))
        ns = sorted({r["n_steps"] for r in self.rows})
        at = {(r["scheme"], r["solver"], r["n_steps"]): r for r in self.rows}
        head = "| N_t | " + " | ".join(f"{s} / {v}" for s, v in cols) + " |"
        lines = [head, "|---" * (len(cols) + 1) + "|"]
        for n in ns:
            cells = []
            for s, v in cols:
                r = at.get((s, v, n))
                if r is None:
                    cells.append("")
                    continue
                c = f"{r[self.metric]:.{digits}f}"
                cells.append(f"**{c}** (trained)" if r["reference"] else f"{c} ({r['delta']:+.{digits}f})")
            lines.append(f"| {n} | " + " | ".join(cells) + " |")
        out = "\n".join(lines)
        if self.levels:
            out += "\n\n" + self.summary_line()
        return out

    def summary_line(self) -> str:
        if not self.levels:
            return ""
        errs = ", ".join(f"{e:.2e}" for e in self.errors)
        fit = "not fitted" if self.fit is None else f"{self.fit.order:.2f}"
        return (f"outputs at N_t = {', '.join(map(str, self.levels[:-1]))} against N_t = {self.levels[-1]}: "
                f"relative distance {errs}; fitted order (successive differences) {fit}")

    def to_dict(self) -> dict:
        return {"metric": self.metric, "rows": self.table(), "reference": dict(self.reference),
                "levels": list(self.levels), "errors": list(self.errors),
                "differences": list(self.differences), "order": self.order,
                "fit": None if self.fit is None else asdict(self.fit), "higher_is_better": self.higher_is_better,
                "T": self.T}

    def plot(self, path=None, *, title: str | None = None):
        """Two panels: the metric against :math:`N_t` for every scheme and solver (the
        training grid marked), and the outputs' distance to the finest level against
        :math:`\\Delta t` with the successive differences and the fitted order.  Returns the
        figure; ``path`` saves it."""
        # on use: matplotlib is slow to import (~1 s)
        import matplotlib.pyplot as plt

        fig, (a1, a2) = plt.subplots(1, 2, figsize=(10, 3.8), layout="constrained")
        cols = list(dict.fromkeys((r["scheme"], r["solver"]) for r in self.rows))
        for s, v in cols:
            rs = sorted((r for r in self.rows if (r["scheme"], r["solver"]) == (s, v)), key=lambda r: r["n_steps"])
            a1.semilogx([r["n_steps"] for r in rs], [r[self.metric] for r in rs], "o-", base=2, label=f"{s} / {v}",
                        ms=4)
        ref = self.reference
        a1.plot([ref["n_steps"]], [ref[self.metric]], "k*", ms=12, label="training grid")
        a1.set_xlabel("N_t")
        a1.set_ylabel(self.metric)
        a1.legend(fontsize=7)
        a1.set_title("solver-swap table")
        if self.errors:
            h = [self.T / n for n in self.levels[:-1]]
            a2.loglog(h, self.errors, "o-", label=f"to N_t = {self.levels[-1]}")
            if self.differences and all(d > 0 for d in self.differences):
                a2.loglog(h, self.differences, "s--", label="to the next level"
                          + ("" if self.fit is None else f" (order {self.fit.order:.2f})"))
            a2.set_xlabel("Δt")
            a2.set_ylabel("relative distance of the outputs")
            a2.legend(fontsize=7)
            a2.set_title("convergence of the outputs")
        else:
            a2.set_visible(False)
        if title:
            fig.suptitle(title)
        if path is not None:
            fig.savefig(path, dpi=120)
        return fig


def _metric_fn(metric, objective, data_term):
    """``(name, fn(outputs, targets) -> (sum, count), higher_is_better)``."""
    if callable(metric) and not isinstance(metric, str):
        name = getattr(metric, "__name__", "metric")

        def fn(out, y):
            return float(metric(out, y)) * out.shape[0], out.shape[0]

        return name, fn, True
    if metric == "accuracy":
        if not objective.is_classification:
            raise ValueError("continuity.metric: 'accuracy' needs the cross-entropy loss (class logits)")

        def fn(out, y):
            return float((out.argmax(-1) == y).sum()), y.numel()

        return "accuracy", fn, True
    if metric in ("loss", "bits", "bits_per_char"):
        scale = 1.0 if metric == "loss" else 1.0 / math.log(2.0)

        def fn(out, y):
            return float(data_term(out, y)) * scale * out.shape[0], out.shape[0]

        return metric, fn, False
    if metric == "mse":
        def fn(out, y):
            return float((out - y).square().mean()) * out.shape[0], out.shape[0]

        return "mse", fn, False
    raise ValueError(f"continuity.metric: expected 'accuracy', 'loss', 'bits', 'bits_per_char', 'mse' or a callable "
                     f"fn(outputs, targets) -> float, got {metric!r}")


def _n_list(n_steps, name: str) -> list[int]:
    if isinstance(n_steps, (str, bytes)) or not isinstance(n_steps, Sequence) or not n_steps:
        raise TypeError(f"{name}: expected a non-empty list of integers >= 1, got {n_steps!r}")
    out = []
    for n in n_steps:
        if isinstance(n, bool) or not isinstance(n, (int, np.integer)):
            raise TypeError(f"{name}: expected integers >= 1, got {n!r}")
        if n < 1:
            raise ValueError(f"{name}: expected integers >= 1, got {int(n)}")
        if int(n) in out:
            raise ValueError(f"{name}: N_t = {int(n)} is listed twice")
        out.append(int(n))
    return out


def default_n_steps(n: int) -> list[int]:
    """From half to 16 times ``n`` (half only when ``n`` is even)."""
    return ([n // 2] if n % 2 == 0 and n >= 2 else []) + [n * k for k in (1, 2, 4, 8, 16)]


@torch.no_grad()
def continuity(model: nn.Module, data, *, loss="cross_entropy", metric: str | Callable | None = None,
               output=None, n_steps: Sequence[int] | None = None, reference: int | None = None,
               solvers: Sequence = ("trained", "heun", "rk4"), schemes: Sequence[str] = ("trained",),
               levels: Sequence[int] | None = None, batch_size: int = 256, full: bool = False,
               coarse: str = "point") -> Continuity:
    """The solver-swap table and the convergence of the outputs of a trained ``model``
    (module docstring).

    Args:
        model: an ``nn.Module`` holding opsplit propagators whose forward takes ``n_steps=``
            (what the trainer trains: an ``ImageClassifier``, a ``DecoderLM``, a
            ``Propagator``, ...).
        data: a :class:`~opsplit.data.TensorData` or ``(inputs, targets)``.  For a language
            model: windows of token ids ``(B, N)`` and their next-token targets ``(B, N)``
            (``targets[:, i]`` the token after ``inputs[:, i]``), as
            :func:`~opsplit.data.text_windows` makes them and the trainer reads them; targets
            equal to the inputs are refused (the shift forgotten).
        loss, output: as in :class:`~opsplit.control.Objective` (``"cross_entropy"``,
            ``"mse"`` or a callable; ``output`` selects a field of a structured output, e.g.
            ``"logits"``).  ``"cross_entropy"`` takes class logits ``(B, C)`` with targets
            ``(B,)``, or sequence logits ``(B, N, C)`` with targets ``(B, N)``: the mean over
            every position, the figure ``Trainer.evaluate`` reports for the text objective
            (``opsplit.cli.train_text.lm_loss``).  The outputs of the first sample are checked
            against ``loss``, ``metric`` and every target before the table is computed.
        metric: ``"accuracy"`` (default for cross-entropy; per position for sequence logits),
            ``"loss"`` (default otherwise), ``"bits"`` or ``"bits_per_char"`` (the loss in bits:
            bits per character of a character-level language model, ``loss / ln 2``), ``"mse"``
            or a callable ``fn(outputs, targets) -> float`` (a batch mean).
        n_steps: the :math:`N_t` of the table (default: half to 16 times ``reference``).
        reference: the training grid's :math:`N_t` (default: the model's own, the
            ``n_steps`` of its first propagator).
        solvers: substep solvers of the table: ``"trained"`` (the model's own), ``"euler"``,
            ``"heun"``, ``"rk4"`` or :class:`~opsplit.solvers.Solver` objects.
        schemes: ``"trained"`` and/or ``"strang"``.
        levels: the :math:`N_t` of the output-convergence study, coarse to fine, the last
            the limit (default: ``reference`` times 1, 2, 4, 8, 16); ``[]`` skips it.
        batch_size: samples per forward call.
        full: every :math:`N_t` for every scheme and solver; otherwise (default) the
            training scheme and solver at every :math:`N_t`, and the other schemes and
            solvers at the :math:`N_t` from ``reference`` up.
        coarse: ``"point"`` (default) or ``"average"``: how a solve with fewer steps than the
            controls' pieces reads them (:func:`~opsplit.coarse.coarse_controls`:
            averaged over each step).

    Returns:
        a :class:`Continuity`.
    """
    props, data = _model_and_data(model, data, "continuity")
    objective = loss if isinstance(loss, Objective) else Objective(loss, output=output)
    if metric is None:
        metric = "accuracy" if objective.is_classification else "loss"
    data_term = objective.data_term
    mname, mfn, higher = _metric_fn(metric, objective, data_term)
    ref = props[0].n_steps if reference is None else check_int(reference, "continuity.reference", 1)
    ns = default_n_steps(ref) if n_steps is None else _n_list(n_steps, "continuity.n_steps")
    if ref not in ns:
        ns = sorted(ns + [ref])
    lv = [ref * k for k in (1, 2, 4, 8, 16)] if levels is None else (
        _n_list(levels, "continuity.levels") if len(levels) else [])
    if lv and (len(lv) < 2 or any(b <= a for a, b in zip(lv, lv[1:]))):
        raise ValueError(f"continuity.levels: expected at least two increasing N_t, got {list(levels)}")
    bs = check_int(batch_size, "continuity.batch_size", 1)
    check_choice(coarse, COARSE_MODES, "continuity.coarse")
    if coarse == "average":
        for n in ns:
            check_coarse(model, n, "continuity.n_steps")
    if isinstance(solvers, (str, bytes)) or not isinstance(solvers, Sequence) or not solvers:
        raise TypeError(f"continuity.solvers: expected a non-empty list, got {solvers!r}")
    if isinstance(schemes, (str, bytes)) or not isinstance(schemes, Sequence) or not schemes:
        raise TypeError(f"continuity.schemes: expected a non-empty list of 'trained' / 'strang', got {schemes!r}")
    for s in schemes:
        if s not in SCHEMES:
            raise ValueError(f"continuity.schemes: expected 'trained' or 'strang', got {s!r}")
    trained_solver, trained_scheme = _trained_solver(model), _scheme_name(model)
    combos = []  # (scheme, solver label, solver object or None)
    for sch in schemes:
        for s in solvers:
            obj = None if s == "trained" else as_solver(s, "continuity.solvers")
            label = trained_solver if obj is None else solver_name(obj)
            if sch == "trained" and label == trained_solver:
                obj = None  # the model's own solver: nothing to swap
            if (sch, label) not in [(c[0], c[1]) for c in combos]:
                combos.append((sch, label, obj))
    if ("trained", trained_solver) not in [(c[0], c[1]) for c in combos]:
        combos.insert(0, ("trained", trained_solver, None))
    # every swap is checked (on entering it) before the first solve
    for sch, _, obj in combos:
        with solved_with(model, solver=obj, scheme=None if sch == "trained" else sch):
            pass
    T = float(props[0].t1 - props[0].t0)
    _check_outputs(model, data, objective, mname, mfn, data_term, ref, output if not isinstance(loss, Objective)
                   else loss.output)

    was = model.training
    model.eval()
    rows, outs = [], {}
    try:
        for sch, label, obj in combos:
            base = sch == "trained" and obj is None
            table_ns = ns if (base or full) else [n for n in ns if n >= ref]
            run_ns = sorted(set(table_ns) | (set(lv) if base else set()))
            with solved_with(model, solver=obj, scheme=None if sch == "trained" else sch):
                for n in run_ns:
                    tot, cnt, ltot, seen, chunks = 0.0, 0, 0.0, 0, []
                    for a in range(0, len(data), bs):
                        x, y = data[torch.arange(a, min(len(data), a + bs))]
                        with coarse_controls(model, n if coarse == "average" else None):
                            out = objective.select(model(x, n_steps=n))
                        s_, c_ = mfn(out, y)
                        tot, cnt = tot + s_, cnt + c_
                        ltot += float(data_term(out, y)) * x.shape[0]
                        seen += x.shape[0]
                        if base and n in lv:
                            chunks.append(out.detach().to(torch.float64).cpu())
                    if chunks:
                        outs[n] = torch.cat(chunks)
                    if n in table_ns:
                        rows.append({"scheme": trained_scheme if sch == "trained" else "strang", "solver": label,
                                     "n_steps": n, "dt": T / n, mname: tot / cnt, "loss": ltot / seen,
                                     "cost": _cost(model, n), "reference": base and n == ref})
    finally:
        model.train(was)
    refrow = next(r for r in rows if r["reference"])
    ref_cost = refrow["cost"]
    for r in rows:
        r["delta"] = r[mname] - refrow[mname]
    for r in rows:
        r["cost"] = r["cost"] / ref_cost if ref_cost else float("nan")
    errors, diffs, fit = [], [], None
    if lv:
        limit = outs[lv[-1]]
        norm = float(limit.norm()) or 1.0
        errors = [float((outs[n] - limit).norm()) / norm for n in lv[:-1]]
        diffs = [float((outs[a] - outs[b]).norm()) / norm for a, b in zip(lv[:-1], lv[1:])]
        if len(diffs) >= 2 and all(d > 0 for d in diffs):
            fit = fit_order([T / n for n in lv[:-1]], diffs)
    return Continuity(rows, mname, refrow, lv, errors, diffs, fit, higher, T)


def _shape(t) -> str:
    return "(" + ", ".join(map(str, t)) + ("," if len(t) == 1 else "") + ")"


def _bshape(t) -> str:
    """``(B, n1, n2, ...)``: a sample shape ``t`` behind the batch."""
    return "(B" + "".join(f", {n}" for n in t) + ")"


@torch.no_grad()
def _check_outputs(model, data, objective, mname: str, mfn, data_term, ref: int, output) -> None:
    """The model's outputs on the first sample (at the training grid) against the loss, the
    metric and the targets of every sample, before the table is computed: a mismatch of
    ``data``, ``loss`` and ``output`` is named with the shapes expected."""
    was = model.training
    model.eval()
    try:
        x, y = data[torch.arange(1)]
        raw = model(x, n_steps=ref)
    finally:
        model.train(was)
    shown = "the model's output" if output is None else f"the model's output {output!r}"
    if output is None and not isinstance(raw, Tensor):
        raise TypeError(f"continuity.output: the model returns a {type(raw).__name__}, not a tensor; pass output= "
                        f"(an attribute name such as 'logits', or a callable)")
    if isinstance(output, str) and not hasattr(raw, output):
        fields = list(getattr(raw, "__dataclass_fields__", {})) or (
            [k for k in vars(raw) if not k.startswith("_")] if hasattr(raw, "__dict__") else [])
        raise ValueError(f"continuity.output: the model's {type(raw).__name__} has no field {output!r}"
                         + (f"; it has {fields}" if fields else ""))
    out = _select(raw, output)
    if not isinstance(out, Tensor):
        raise TypeError(f"continuity.output: {shown} is a {type(out).__name__}, expected a tensor")
    if out.dim() == 0 or out.shape[0] != 1:
        raise ValueError(f"continuity.output: {shown} on one input has shape {_shape(out.shape)}; expected the batch "
                         "first, (1, ...)")
    targets = data.targets
    tshape = tuple(targets.shape[1:]) if isinstance(targets, Tensor) else None
    oshape = tuple(out.shape[1:])
    loss = objective.loss
    if loss == "cross_entropy":
        if not out.is_floating_point() or out.dim() < 2:
            raise ValueError(f"continuity.loss: 'cross_entropy' reads class logits (B, C) or sequence logits (B, N, C) "
                             f"(output='logits' of a language model); {shown} has shape {_bshape(oshape)} "
                             f"and dtype {out.dtype}")
        C = out.shape[-1]
        want = _bshape(oshape[:-1])
        kind = "class indices" if out.dim() == 2 else "next-token ids (the inputs shifted by one)"
        if tshape is None or tshape != oshape[:-1]:
            got = type(targets).__name__ if tshape is None else _shape(tuple(targets.shape))
            raise ValueError(f"continuity.data: loss 'cross_entropy' on {shown} of shape {_bshape(oshape)} "
                             f"expects targets {want} of {kind}; got targets of shape {got}")
        if targets.is_floating_point() or targets.is_complex() or targets.dtype == torch.bool:
            raise TypeError(f"continuity.data: loss 'cross_entropy' expects integer targets ({kind}), got dtype "
                            f"{targets.dtype}")
        inputs = data.inputs
        if out.dim() > 2 and isinstance(inputs, Tensor) and inputs.shape == targets.shape and \
                bool(torch.equal(inputs, targets.to(inputs.dtype))):
            raise ValueError(
                "continuity.data: the targets are the inputs; the cross-entropy of sequence logits reads "
                "next-token targets, targets[:, i] the token after inputs[:, i] (the trainer's text convention: "
                "opsplit.data.text_windows(ids, context), or (ids[:, :-1], ids[:, 1:]) from windows of context + 1 "
                "tokens)")
        if targets.numel():
            lo, hi = int(targets.min()), int(targets.max())
            if lo < 0 or hi >= C:
                raise ValueError(f"continuity.data: loss 'cross_entropy' on {C} classes expects targets in "
                                 f"[0, {C - 1}], got range [{lo}, {hi}]")
    elif loss == "mse":
        if tshape is None or tshape != oshape:
            got = type(targets).__name__ if tshape is None else _shape(tuple(targets.shape))
            raise ValueError(f"continuity.data: loss 'mse' expects targets of the shape of {shown}, "
                             f"{_bshape(oshape)}; got targets of shape {got}")
        if not targets.is_floating_point():
            raise TypeError(f"continuity.data: loss 'mse' expects floating-point targets, got dtype {targets.dtype}")
    if mname == "mse" and loss != "mse" and (tshape is None or tshape != oshape):
        got = type(targets).__name__ if tshape is None else _shape(tuple(targets.shape))
        raise ValueError(f"continuity.metric: 'mse' compares {shown}, {_bshape(oshape)}, with targets of "
                         f"that shape; got targets of shape {got}")
    for what, fn in (("loss", data_term), ("metric", mfn)):
        try:
            v = fn(out, y)
        except (RuntimeError, ValueError, TypeError, IndexError) as e:
            raise ValueError(f"continuity.{what}: it fails on {shown} of shape {_shape(tuple(out.shape))} and targets "
                             f"of shape {_shape(tuple(y.shape))} (the first sample): {e}") from e
        if what == "loss":
            try:
                float(v)
            except (RuntimeError, ValueError, TypeError) as e:
                raise ValueError(f"continuity.loss: expected a scalar loss on {shown} of shape "
                                 f"{_shape(tuple(out.shape))}, got {e}") from e


def _model_and_data(model, data, where: str):
    """``model``'s propagators and ``data`` as a dataset, for a measurement that solves the
    model at other grids (``where``: ``"continuity"``, ``"frontier"``, the name the errors
    carry): a ``TypeError`` unless ``model`` is an ``nn.Module``, a ``ValueError`` when it
    holds no :class:`~opsplit.propagator.Propagator` or ``data`` has no sample."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"{where}.model: expected an nn.Module, got {type(model).__name__}")
    props = propagators(model)
    if not props:
        raise ValueError(f"{where}.model: the model holds no opsplit Propagator (nothing to solve at other N_t)")
    data = as_dataset(data, f"{where}.data")
    if len(data) == 0:
        raise ValueError(f"{where}.data: expected at least one sample, got none")
    return props, data


def _cost(model, n: int) -> float:
    """Field evaluations of one forward solve at ``n`` steps, per input: the substep calls
    of one step of every propagator times their solvers' stages (a substep of another
    solver counts one)."""
    return float(sum(n * _scheme_evals(p.scheme) for p in propagators(model)))


def _scheme_evals(scheme) -> float:
    """Field evaluations of one step of ``scheme`` (substep calls times solver stages)."""
    def sub_cost(s) -> float:
        inner = [op for op in s.terms if isinstance(op, SchemeFlow)]
        if inner:
            return sum(_scheme_evals(op.scheme) for op in inner)
        return float(STAGES.get(name_of(s.solver), 1)) * len(s.terms)

    subs = [s for s in scheme.substeps if isinstance(s, Substep)]
    if isinstance(scheme, Strang):
        *outer, middle = subs
        return 2.0 * sum(sub_cost(s) for s in outer) + sub_cost(middle)
    return sum(sub_cost(s) for s in subs)
