"""The solver-swap table of a trained model in a report (``opsplit train`` and the default
job): :func:`opsplit.control.continuity` measured, then one table (CSV + Markdown), the
convergence table of the outputs and one figure.  The command adds nothing of its own:
every number is the analysis'."""

from __future__ import annotations

import warnings

from ..control.continuity import continuity

__all__ = ["measure", "write", "refined_worst", "console_lines"]


def measure(model, data, *, n_steps, reference: int, solvers=("trained", "heun", "rk4"), schemes=("trained",),
            levels=None, batch_size: int = 512, loss="cross_entropy", output=None, metric=None, coarse="point"):
    """The :class:`~opsplit.analysis.Continuity` of a trained model on ``data`` (a
    classifier by default; ``loss``, ``output``, ``metric``, ``coarse`` as in
    :func:`~opsplit.control.continuity`: a language model's bits per character; the
    coarse N_t read the controls as the model was trained to, ``TrainConfig.coarse_controls``)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="There is a performance drop")  # torch's vmap note
        return continuity(model, data, n_steps=list(n_steps), reference=reference, solvers=list(solvers),
                          schemes=list(schemes), levels=levels, batch_size=batch_size, loss=loss, output=output,
                          metric=metric, coarse=coarse)


def refined_worst(c) -> dict | None:
    """The refined setting (a finer :math:`N_t` or another solver or scheme at :math:`N_t \\ge`
    the training grid's) furthest below the training grid, or ``None``."""
    n = c.reference["n_steps"]
    rows = [r for r in c.rows if not r["reference"] and r["n_steps"] >= n]
    if not rows:
        return None
    sign = 1.0 if c.higher_is_better else -1.0
    return min(rows, key=lambda r: sign * r["delta"])


def _rows(c) -> list[dict]:
    out = []
    for r in c.rows:
        out.append({"scheme": r["scheme"], "solver": r["solver"], "n_t": r["n_steps"], "dt": r["dt"],
                    c.metric: r[c.metric], "difference": r["delta"], "cost": r["cost"],
                    "training grid": "yes" if r["reference"] else ""})
    return out


def write(out, c, *, prefix: str = "", what: str = "test accuracy") -> list[dict]:
    """Add the solver-swap table, the convergence table and the figure of ``c`` to the
    report ``out`` (an :class:`~opsplit.cli.output.Output`)."""
    # slow to import (about 1 s): loaded when a report draws
    import matplotlib.pyplot as plt

    ref = c.reference
    rows = _rows(c)
    worst = refined_worst(c)
    text = (f"The solver-swap test (opsplit.control.continuity): the trained controls θ(t) solved without "
            f"retraining at other N_t, with Euler, Heun and RK4 substeps; the training grid is N_t = "
            f"{ref['n_steps']} with {ref['solver']} substeps ({what} {ref[c.metric]:.4f}). A model of θ(t) keeps "
            f"its {what} on every refined setting.")
    if worst is not None:
        text += (f" Worst refined setting: {worst['solver']} at N_t = {worst['n_steps']} ({worst['scheme']}), "
                 f"{worst[c.metric]:.4f} ({worst['delta']:+.4f}).")
    if c.fit is not None:
        text += (f" The outputs (logits) converge to the N_t = {c.levels[-1]} solution at a fitted order of "
                 f"{c.fit.order:.2f}.")
    out.text(text)
    out.table(f"{prefix}continuity", rows, title=f"{what} at other N_t, substep solvers and schemes (difference "
              "to the training grid; cost: field evaluations relative to it)", kind="continuity", key=True)
    if c.levels:
        out.table(f"{prefix}continuity_convergence", c.convergence_table(),
                  title="distance of the outputs to the finest solution and to the next level (relative L2)",
                  kind="continuity_convergence")
    fig = c.plot()
    out.figure(fig, f"{prefix}continuity", f"{what} against N_t for each substep solver, and the convergence of "
               "the outputs", kind="continuity")
    plt.close(fig)
    return rows


def console_lines(c, what: str = "test accuracy") -> list[str]:
    """Lines for the terminal: the training grid, every N_t of its own solver, the worst
    refined setting and the fitted order."""
    ref = c.reference
    lines = []
    for r in c.rows:
        if r["solver"] == ref["solver"] and r["scheme"] == ref["scheme"]:
            lines.append(f"{what} at N_t = {r['n_steps']:>2}: {r[c.metric]:.3f}"
                         + ("  (training grid)" if r["reference"] else ""))
    worst = refined_worst(c)
    if worst is not None:
        lines.append(f"worst refined setting: {worst['solver']} at N_t = {worst['n_steps']}: "
                     f"{worst[c.metric]:.3f} ({worst['delta']:+.3f})")
    if c.fit is not None:
        lines.append(f"outputs converge at a fitted order of {c.fit.order:.2f}")
    return lines
