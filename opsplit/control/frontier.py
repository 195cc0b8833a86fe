r"""One model, every depth: a trained model's metric against its :math:`N_t` and against the
compute of a solve, beside models trained at each :math:`N_t` alone.

A continuous model serves every compute budget from one set of controls: solved at
:math:`N_t = N/4, N/2, N, \dots` steps it costs :math:`N_t` times the substep calls of one
step.  :func:`frontier` measures that curve — the metric at every :math:`N_t` of
``n_steps``, a coarse :math:`N_t` (below the controls' pieces) solved with the controls
averaged over each step (``coarse="average"``, :func:`~opsplit.coarse.coarse_controls`)
or read at the solver's times (``"point"``) — and places beside it ``references``: models
trained at one :math:`N_t` each, solved at their own grid.  :meth:`Frontier.plot` draws the
metric against the substep calls (field evaluations) per input: one curve for the model,
one point per reference.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field

import torch
from torch import nn

from ..coarse import COARSE_MODES, check_coarse, coarse_controls
from ..data.base import check_int
from .continuity import _cost, _metric_fn, _n_list
from .objective import Objective
from .swap import propagators
from .trainer import as_dataset

__all__ = ["Frontier", "frontier", "default_frontier_n_steps"]


def default_frontier_n_steps(n: int) -> list[int]:
    """``n / 4``, ``n / 2`` (where integers), ``n``, ``2n``: from a quarter to twice the grid."""
    return [n // k for k in (4, 2) if n % k == 0 and n // k >= 1] + [n, 2 * n]


@dataclass
class Frontier:
    """What :func:`frontier` measured.

    Attributes:
        rows: the model's solves, one dict each: ``n_steps``, ``calls`` (field evaluations of
            one solve per input: substep calls times the solvers' stages), the metric (key
            ``metric``), ``loss``, and ``reference`` / ``gap`` (the reference trained at that
            :math:`N_t`, its metric minus the reference's; ``None`` without one).
        references: one dict per reference model: ``label``, ``n_steps``, ``calls``, the
            metric, ``loss``.
        metric: the metric's name; higher_is_better: its direction.
        coarse: how a coarse :math:`N_t` read the model's controls.
    """

    rows: list
    references: list
    metric: str
    higher_is_better: bool = True
    coarse: str = "average"
    extra: dict = field(default_factory=dict)

    def gaps(self) -> dict:
        """``{n_steps: model metric − reference metric}`` at every :math:`N_t` with a reference."""
        return {r["n_steps"]: r["gap"] for r in self.rows if r["gap"] is not None}

    def worst_gap(self) -> float:
        """The largest shortfall of the model against a reference (its sign: worse is
        positive), ``nan`` without references."""
        g = list(self.gaps().values())
        if not g:
            return float("nan")
        return max(-x for x in g) if self.higher_is_better else max(g)

    def table(self) -> list[dict]:
        return [dict(r) for r in self.rows]

    def markdown(self, digits: int = 4) -> str:
        m = self.metric
        lines = [f"| N_t | substep calls | {m} (one model) | {m} (trained at this N_t) | difference |",
                 "|---|---|---|---|---|"]
        for r in self.rows:
            ref = "" if r["reference"] is None else f"{r['reference']:.{digits}f}"
            gap = "" if r["gap"] is None else f"{r['gap']:+.{digits}f}"
            lines.append(f"| {r['n_steps']} | {r['calls']:g} | {r[m]:.{digits}f} | {ref} | {gap} |")
        return "\n".join(lines)

    def to_dict(self) -> dict:
        return asdict(self)

    def plot(self, path=None, *, title: str | None = None):
        """The metric against the substep calls per input: the model's curve, the
        references' points; written to ``path`` when given.  Returns the figure."""
        import matplotlib  # noqa: PLC0415 - slow to import; only for a plot

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt  # noqa: PLC0415

        fig, ax = plt.subplots(figsize=(5.2, 3.6))
        m = self.metric
        ax.plot([r["calls"] for r in self.rows], [r[m] for r in self.rows], "o-", color="C0",
                label=f"one model ({self.coarse} controls below its pieces)")
        for r in self.rows:
            ax.annotate(f"N_t={r['n_steps']}", (r["calls"], r[m]), textcoords="offset points", xytext=(4, -10),
                        fontsize=7, color="C0")
        if self.references:
            ax.plot([r["calls"] for r in self.references], [r[m] for r in self.references], "s", color="C3",
                    ls="none", label="trained at one N_t each")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("substep calls (field evaluations) per input")
        ax.set_ylabel(m)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        ax.set_title(title or f"{m} against compute")
        fig.tight_layout()
        if path is not None:
            fig.savefig(path, dpi=120)
            plt.close(fig)
        return fig


def _score(model, data, objective, mfn, n: int, coarse: str, bs: int) -> tuple[float, float]:
    tot, cnt, ltot, seen = 0.0, 0, 0.0, 0
    ctx = coarse_controls(model, n) if coarse == "average" else coarse_controls(model, None)
    with ctx:
        for a in range(0, len(data), bs):
            x, y = data[torch.arange(a, min(len(data), a + bs))]
            out = objective.select(model(x, n_steps=n))
            s_, c_ = mfn(out, y)
            tot, cnt = tot + s_, cnt + c_
            ltot += float(objective.data_term(out, y)) * x.shape[0]
            seen += x.shape[0]
    return tot / cnt, ltot / seen


@torch.no_grad()
def frontier(model: nn.Module, data, *, n_steps: Sequence[int] | None = None,
             references: Mapping[int, nn.Module] | None = None, loss="cross_entropy",
             metric: str | Callable | None = None, output=None, coarse: str = "average",
             batch_size: int = 256) -> Frontier:
    """The metric of ``model`` at every :math:`N_t` of ``n_steps`` and its compute, beside
    ``references`` (module docstring).

    Args:
        model: a trained model whose forward takes ``n_steps=`` (as for
            :func:`~opsplit.control.continuity`).
        data: a :class:`~opsplit.data.TensorData` or ``(inputs, targets)``.
        n_steps: the :math:`N_t` of the curve (default: a quarter, half, one and two times
            the model's own, :func:`default_frontier_n_steps`).
        references: ``{N_t: model trained at that N_t}``, each solved at its own ``N_t``.
        loss, metric, output: as in :func:`~opsplit.control.continuity` (``"accuracy"`` for
            classifiers by default, ``"bits"`` for a language model).
        coarse: ``"average"`` (default) or ``"point"``: how a solve with fewer steps than the
            controls' pieces reads them (:data:`~opsplit.coarse.COARSE_MODES`).
        batch_size: samples per forward call.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"frontier.model: expected an nn.Module, got {type(model).__name__}")
    props = propagators(model)
    if not props:
        raise ValueError("frontier.model: the model holds no opsplit Propagator (nothing to solve at other N_t)")
    data = as_dataset(data, "frontier.data")
    if len(data) == 0:
        raise ValueError("frontier.data: expected at least one sample, got none")
    if coarse not in COARSE_MODES:
        raise ValueError(f"frontier.coarse: expected one of {COARSE_MODES}, got {coarse!r}")
    ns = default_frontier_n_steps(props[0].n_steps) if n_steps is None else _n_list(n_steps, "frontier.n_steps")
    ns = sorted(ns)
    if coarse == "average":
        for n in ns:
            check_coarse(model, n, "frontier.n_steps")
    refs = {}
    if references is not None:
        if not isinstance(references, Mapping):
            raise TypeError(f"frontier.references: expected a dict {{N_t: model}}, got {type(references).__name__}")
        for n, m in references.items():
            n = check_int(n, "frontier.references (N_t)", 1)
            if not isinstance(m, nn.Module) or not propagators(m):
                raise TypeError(f"frontier.references[{n}]: expected a model holding an opsplit Propagator, got "
                                f"{type(m).__name__}")
            refs[n] = m
    bs = check_int(batch_size, "frontier.batch_size", 1)
    objective = loss if isinstance(loss, Objective) else Objective(loss, output=output)
    if metric is None:
        metric = "accuracy" if objective.is_classification else "loss"
    mname, mfn, higher = _metric_fn(metric, objective, objective.data_term)
    ref_rows = []
    for n, m in sorted(refs.items()):
        was = m.training
        m.eval()
        try:
            v, lo = _score(m, data, objective, mfn, n, "point", bs)
        finally:
            m.train(was)
        ref_rows.append({"label": f"trained at N_t = {n}", "n_steps": n, "calls": _cost(m, n), mname: v, "loss": lo})
    rows = []
    was = model.training
    model.eval()
    try:
        for n in ns:
            v, lo = _score(model, data, objective, mfn, n, coarse, bs)
            ref = next((r[mname] for r in ref_rows if r["n_steps"] == n), None)
            rows.append({"n_steps": n, "calls": _cost(model, n), mname: v, "loss": lo, "reference": ref,
                         "gap": None if ref is None else v - ref})
    finally:
        model.train(was)
    return Frontier(rows, ref_rows, mname, higher, coarse)
