"""The frontier of one trained model in a report (``opsplit train`` and the default job):
:func:`opsplit.control.frontier` measured beside models trained at one :math:`N_t` each,
then one table (CSV + Markdown) and one figure — accuracy against substep calls, one curve
for the one model, points for the models trained alone (docs/multilevel.md).  The command
adds nothing of its own: every number is the analysis'."""

from __future__ import annotations

import warnings

from ..control.frontier import frontier

__all__ = ["measure", "write", "console_lines"]


def measure(model, data, *, n_steps, references=None, batch_size: int = 512, loss="cross_entropy", output=None,
            metric=None):
    """The :class:`~opsplit.control.frontier.Frontier` of a trained ``model`` on ``data``:
    its metric at every :math:`N_t` of ``n_steps`` (steps longer than a control piece read
    the pieces' average), beside ``references`` (``{N_t: model trained there alone}``)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="There is a performance drop")  # torch's vmap note
        return frontier(model, data, n_steps=list(n_steps), references=references, loss=loss, output=output,
                        metric=metric, coarse="average", batch_size=batch_size)


def _rows(f) -> list[dict]:
    m, nan = f.metric, float("nan")
    return [{"n_t": r["n_steps"], "calls": int(r["calls"]) if float(r["calls"]).is_integer() else r["calls"], f"{m} (one model)": r[m],
             f"{m} (trained at this N_t alone)": nan if r["reference"] is None else r["reference"],
             "difference": nan if r["gap"] is None else r["gap"]} for r in f.rows]


def write(out, f, *, grid: int, prefix: str = "", what: str = "test accuracy", budget: str = "") -> list[dict]:
    """Add the frontier table and its figure to the report ``out`` (an
    :class:`~opsplit.cli.output.Output`); ``grid`` is the model's training grid,
    ``budget`` says what each reference was trained with (without references: a sentence
    saying where they are)."""
    # slow to import (about 1 s): loaded when a report draws
    import matplotlib.pyplot as plt

    rows = _rows(f)
    text = (f"One model, every depth (opsplit.control.frontier): the trained controls solved at N_t = "
            f"{', '.join(str(r['n_steps']) for r in f.rows)} (training grid N_t = {grid}; a step longer than a "
            f"control piece reads the pieces' average over the step), against the compute of each solve "
            f"(substep calls per input)")
    if f.references:
        text += (", beside models trained at one N_t each alone" + (f" ({budget})" if budget else "") + ". "
                 "Difference: the one model's " + what + " minus the model trained at that N_t.")
    else:
        text += "." + (f" {budget}" if budget else "")
    out.text(text)
    alone = f"{f.metric} (trained at this N_t alone)"
    notes = ({alone: "no model was trained at this N_t alone", "difference": "no model was trained at this N_t alone"}
             if any(r["gap"] is None for r in f.rows) else None)
    out.table(f"{prefix}frontier", rows, title=f"{what} of one model at every N_t, and of models trained at one N_t "
              "alone", kind="frontier", notes=notes)
    fig = f.plot(title=f"{what} against compute: one model, every depth")
    out.figure(fig, f"{prefix}frontier", f"{what} against substep calls per input: the one model's curve, the "
               "models trained at one N_t alone as points", kind="frontier")
    plt.close(fig)
    return rows


def console_lines(f, what: str = "test accuracy") -> list[str]:
    """Lines for the terminal: the one model at every N_t, beside its reference."""
    m, lines = f.metric, []
    for r in f.rows:
        line = f"one model at N_t = {r['n_steps']:>2} ({r['calls']:g} calls): {what} {r[m]:.3f}"
        if r["reference"] is not None:
            line += f", trained there alone {r['reference']:.3f} ({r['gap']:+.3f})"
        lines.append(line)
    return lines
