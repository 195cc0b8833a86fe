"""The n-gram baselines of the text benchmarks (benchmarks/train_text.py,
benchmarks/continuity_text.py): :class:`opsplit.analysis.NGram` (interpolated Witten–Bell
and Kneser–Ney) fitted at every order, the best on the validation text or chosen on a
development part of the training text.
"""

from __future__ import annotations

import json

from opsplit.analysis.ngram import METHODS, NGram
from opsplit.data.dedup import deduplicate

__all__ = ["NGram", "METHODS", "best_baseline", "dev_selected"]


def best_baseline(train: str, val: str, vocab_size: int, orders=range(2, 9), others: dict | None = None) -> dict:
    """Both methods at every order on ``val``; the best (lowest bits/char) of each method and
    every figure (the order is chosen on ``val`` itself: the strongest baseline).  Each
    model is fitted once and also scored on the texts of ``others`` (``{name: text}``):
    ``rows[i][name]`` and ``best_<name>``."""
    rows = []
    others = others or {}
    for method in METHODS:
        for k in orders:
            m = NGram(k, method).fit(train, vocab_size)
            rows.append({"method": method, "order": k, "val_bpc": m.bits_per_char(val),
                         **{name: m.bits_per_char(t) for name, t in others.items()}})
            print(json.dumps(rows[-1]), flush=True)
    best = min(rows, key=lambda r: r["val_bpc"])
    return {"rows": rows, "best": best, **{f"best_{name}": min(rows, key=lambda r: r[name]) for name in others}}


def dev_selected(train: str, vocab_size: int, orders=range(2, 9), dev_fraction: float = 0.1, k: int = 40,
                 within: int | None = None) -> dict:
    """The baseline chosen without the validation text: the last ``dev_fraction`` of the
    training text (of its first ``within`` characters, when given: the part that is like
    the validation text), deduplicated against the rest as the validation text is against
    the whole (``opsplit.data.dedup``), picks the method and order fitted on the rest;
    returns them (refit on the whole training text by the caller) with the development
    figures."""
    end = len(train) if within is None else within
    cut = int(end * (1 - dev_fraction))
    cut = train.rfind("\n\n", 0, cut) + 2 or cut  # at a paragraph boundary
    fit_part, dev = train[:cut] + train[end:], train[cut:end]
    dev, info = deduplicate(dev, fit_part, k=k)
    rows = [{"method": m, "order": n, "dev_bpc": NGram(n, m).fit(fit_part, vocab_size).bits_per_char(dev)}
            for m in METHODS for n in orders]
    return {"choice": min(rows, key=lambda r: r["dev_bpc"]), "rows": rows, "dev_chars": len(dev), "dedup": info}
