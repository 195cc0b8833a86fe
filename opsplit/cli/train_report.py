"""The training's part of a report (``opsplit train`` and the default job): its tables,
with the kinds the findings read (:mod:`opsplit.cli.findings`), and its plots."""

from __future__ import annotations

from . import continuity_report, plots

__all__ = ["report_training"]


def report_training(out, prefix: str, sub: str, steps: list, epochs: list, evals: list | None, n_steps: int, *,
                    continuity=None):
    """The training's tables and plots in the report: the history per evaluated epoch, the
    training curve, and the trained model at other N_t — the solver-swap table of
    ``continuity`` (an :class:`~opsplit.analysis.Continuity`, :mod:`opsplit.cli.continuity_report`)
    or the accuracy at each N_t evaluated (``evals``); the trainer's own files linked."""

    out.table(f"{prefix}train_epochs", epochs, title="training history (per evaluated epoch)",
              kind="train_epochs")
    out.figure(plots.training_curve(steps, epochs), f"{prefix}training_curve", "the training curve: "
               "the objective per step, test loss and accuracy per evaluated epoch", kind="training_curve")
    if continuity is not None:
        continuity_report.write(out, continuity, prefix=prefix)
    else:
        out.table(f"{prefix}eval_n_t", evals, title=f"test accuracy at other N_t (trained at N_t = {n_steps})",
                  kind="eval_n_t", key=True)
        out.figure(plots.accuracy_vs_n_t(evals, n_steps), f"{prefix}accuracy_vs_n_t",
                   "the trained model evaluated at other N_t", kind="accuracy_vs_n_t")
    out.files([f"{sub}/{f}" for f in ("steps.csv", "epochs.csv", "curves.png")],
              "The trainer's own files (opsplit.control): every step, every epoch, its plot of the same curves")
