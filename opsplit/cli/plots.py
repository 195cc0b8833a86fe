"""The plots of the command's reports: axis labels with units, the legend beside the axes
(never over the data), one message per figure, sizes that sit two to a row on a laptop
screen (:mod:`opsplit.cli.page`)."""

from __future__ import annotations

from ..analysis import plot_convergence

__all__ = ["SIZE", "label", "legend_outside", "convergence", "training_curve", "accuracy_vs_n_t",
           "DT", "H", "REL_ERROR", "GRID_ERROR", "SECONDS"]

#: a report figure's size in inches (about 700 x 480 pixels at the report's 110 dpi)
SIZE = (6.4, 4.4)
#: axis labels (the model's time and space are dimensionless: T = 1, Omega = [0, 1]^2 by default)
DT = "time step Δt = T / N_t  (model time units)"
H = "grid spacing max(Δx, Δy)  (units of Ω_x, Ω_y)"
REL_ERROR = "relative L2 error  ‖u − u_ref‖ / ‖u_ref‖"
GRID_ERROR = "grid error: relative L2 against the finest grid"
SECONDS = "wall time per solve (s)"


def legend_outside(ax, fontsize: float = 8) -> None:
    """Move the legend of ``ax`` (if it has entries) to the right of the axes, outside the
    plotting area (the figure's constrained layout makes room for it)."""
    handles, labels = ax.get_legend_handles_labels()
    if ax.get_legend() is not None:
        ax.get_legend().remove()
    if handles:
        ax.legend(handles, labels, loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0.0,
                  fontsize=fontsize, frameon=False)


def label(ax, xlabel: str, ylabel: str, title: str | None = None) -> None:
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    if title:
        ax.set_title(title, fontsize=11)
    legend_outside(ax)


def convergence(studies, xlabel: str, ylabel: str, title: str):
    """Error against step size, the fitted orders in the legend (beside the axes)."""
    # slow to import (about 1 s): loaded when a report draws
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=SIZE, layout="constrained")
    plot_convergence(studies, ax=ax, title=title)
    label(ax, xlabel, ylabel, title)
    return fig


def training_curve(steps: list, epochs: list):
    """The training curve: the objective J per optimizer step and the test loss per
    evaluated epoch (left), the test accuracy per evaluated epoch (right) on one step axis."""
    # slow to import (about 1 s): loaded when a report draws
    import matplotlib.pyplot as plt

    fig, (a1, a2) = plt.subplots(1, 2, figsize=(2 * SIZE[0], SIZE[1] * 0.85), layout="constrained")
    a1.plot([r["step"] for r in steps], [r["loss"] for r in steps], lw=0.8, label="training objective J (batch)")
    if epochs:
        a1.plot([r["step"] for r in epochs], [r["eval_loss"] for r in epochs], "o-", label="test loss")
        a2.plot([r["step"] for r in epochs], [r["eval_accuracy"] for r in epochs], "o-", color="C1",
                label="test accuracy")
        a2.set_ylim(0, 1.02)
    a1.set_xlabel("optimizer step")
    a1.set_ylabel("cross-entropy (nats)")
    a1.set_title("loss", fontsize=11)
    a1.legend(loc="upper center", bbox_to_anchor=(0.5, -0.17), ncol=2, fontsize=8, frameon=False)  # below the axes
    a2.set_xlabel("optimizer step")
    a2.set_ylabel("test accuracy (fraction correct)")
    a2.set_title("held-out accuracy per evaluated epoch", fontsize=11)
    for a in (a1, a2):
        a.grid(True, alpha=0.3)
    a2.set_xlim(a1.get_xlim())
    return fig


def accuracy_vs_n_t(evals: list, trained_at: int):
    """Test accuracy of the trained model at each N_t evaluated; the N_t of training marked."""
    # slow to import (about 1 s): loaded when a report draws
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=SIZE, layout="constrained")
    ns = [r["n_t"] for r in evals]
    ax.semilogx(ns, [r["test_accuracy"] for r in evals], "o-", base=2, label="test accuracy")
    ax.set_xticks(ns, [str(n) for n in ns])
    ax.minorticks_off()
    ax.axvline(trained_at, color="gray", ls=":", label=f"trained at N_t = {trained_at}")
    ax.set_ylim(0, 1.02)
    ax.grid(True, which="both", alpha=0.3)
    label(ax, "N_t at evaluation (steps on [0, T])", "test accuracy (fraction correct)",
          "the trained model at other N_t")
    return fig
