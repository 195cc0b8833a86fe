"""The metrics history of a training run: one row per optimizer step, one per epoch; saved
as CSV and plotted with matplotlib."""

from __future__ import annotations

import csv
import math
from pathlib import Path

__all__ = ["History"]


class History:
    """Rows of metrics.

    ``steps``: per optimizer step — ``step``, ``epoch``, ``loss`` (the objective), ``data``
    (its data term), running costs when used, ``lr``, ``grad_norm`` (before clipping),
    ``time`` (seconds since the run started, summed over resumed segments).

    ``epochs``: per evaluated epoch — ``epoch``, ``step``, ``train_loss`` (mean over the
    epoch's steps), evaluation metrics prefixed ``eval_`` (``eval_loss``,
    ``eval_accuracy``, ...), ``epoch_time`` (seconds), ``peak_mem_mb`` (see
    :func:`opsplit.control.trainer.peak_memory_mb`), ``time``.
    """

    def __init__(self, steps=None, epochs=None):
        self.steps: list[dict] = list(steps or [])
        self.epochs: list[dict] = list(epochs or [])

    def to_dict(self) -> dict:
        return {"steps": self.steps, "epochs": self.epochs}

    @classmethod
    def from_dict(cls, d: dict | None) -> History:
        d = d or {}
        return cls(d.get("steps"), d.get("epochs"))

    def column(self, name: str, table: str = "steps") -> list:
        return [r.get(name) for r in getattr(self, table)]

    @property
    def losses(self) -> list[float]:
        return self.column("loss")

    @staticmethod
    def _write(rows: list[dict], path: Path) -> None:
        keys: list[str] = []
        for r in rows:
            keys += [k for k in r if k not in keys]
        with open(path, "w", newline="") as fh:
            w = csv.DictWriter(fh, fieldnames=keys)
            w.writeheader()
            for r in rows:
                w.writerow({k: r.get(k, "") for k in keys})

    def save_csv(self, folder) -> tuple[Path, Path]:
        """Write ``steps.csv`` and ``epochs.csv`` into ``folder``."""
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        a, b = folder / "steps.csv", folder / "epochs.csv"
        self._write(self.steps, a)
        self._write(self.epochs, b)
        return a, b

    @classmethod
    def read_csv(cls, folder) -> History:
        folder = Path(folder)

        def read(p):
            if not p.is_file():
                return []
            with open(p, newline="") as fh:
                rows = list(csv.DictReader(fh))
            out = []
            for r in rows:
                out.append({k: (float(v) if v not in ("", None) else None) for k, v in r.items()})
            return out

        return cls(read(folder / "steps.csv"), read(folder / "epochs.csv"))

    def plot(self, path=None, *, title: str | None = None):
        """Learning curves: the objective per step (log scale) and the evaluation metrics per
        epoch.  Returns the matplotlib figure; saved to ``path`` when given."""
        # on use: matplotlib is slow to import (~1 s), and the backend is chosen first
        import matplotlib

        if path is not None:
            matplotlib.use("Agg", force=False)
        # on use: after the backend is chosen
        import matplotlib.pyplot as plt

        eval_keys = [k for k in (self.epochs[0] if self.epochs else {}) if k.startswith("eval_")]
        n = 1 + (1 if eval_keys else 0)
        fig, axes = plt.subplots(1, n, figsize=(5.5 * n, 3.8), squeeze=False)
        ax = axes[0, 0]
        steps, loss = self.column("step"), self.column("loss")
        ok = [(s, v) for s, v in zip(steps, loss) if v is not None and math.isfinite(v) and v > 0]
        if ok:
            ax.plot([s for s, _ in ok], [v for _, v in ok], lw=0.8, label="objective (batch)")
        if self.epochs:
            ax.plot(self.column("step", "epochs"), self.column("train_loss", "epochs"), "o-", ms=3,
                    label="train (epoch mean)")
            if "eval_loss" in eval_keys:
                ax.plot(self.column("step", "epochs"), self.column("eval_loss", "epochs"), "s-", ms=3,
                        label="eval loss")
        ax.set_yscale("log")
        ax.set_xlabel("optimizer step")
        ax.set_ylabel("loss")
        ax.legend(fontsize=8)
        ax.grid(alpha=0.3)
        if eval_keys:
            ax = axes[0, 1]
            ep = self.column("epoch", "epochs")
            for k in eval_keys:
                if k == "eval_loss":
                    continue
                ax.plot(ep, self.column(k, "epochs"), "o-", ms=3, label=k[5:])
            ax.set_xlabel("epoch")
            ax.legend(fontsize=8)
            ax.grid(alpha=0.3)
        if title:
            fig.suptitle(title)
        fig.tight_layout()
        if path is not None:
            fig.savefig(path, dpi=120)
            plt.close(fig)
        return fig
