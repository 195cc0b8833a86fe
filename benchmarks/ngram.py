"""Character n-gram language models fitted by counting: the baselines of the text benchmark
(benchmarks/train_text.py).  Interpolated Witten–Bell and interpolated Kneser–Ney (one
absolute discount D per order), both backing off to the uniform distribution over the
vocabulary, so every character has a probability > 0.

    p = NGram(order=5, method="kneser_ney").fit(train_text, vocab_size)
    p.bits_per_char(val_text)       # mean -log2 p(c_i | c_{i-n+1} .. c_{i-1})

Witten–Bell (Witten & Bell 1991; Chen & Goodman 1998, eq. 14):
    p(c|h) = (C(hc) + N1+(h.) p(c|h')) / (C(h.) + N1+(h.)),
Kneser–Ney (interpolated; Chen & Goodman 1998, eq. 17; continuation counts N1+(.hc) below
the top order):
    p(c|h) = max(C(hc) - D, 0) / C(h.) + D N1+(h.) / C(h.) p(c|h'),
h' the context without its first character, an empty count sum giving p(c|h').
"""

from __future__ import annotations

import json
import math
from collections import Counter, defaultdict

METHODS = ("witten_bell", "kneser_ney")


class NGram:
    def __init__(self, order: int, method: str = "kneser_ney", discount: float = 0.75):
        if order < 1:
            raise ValueError(f"order: expected >= 1, got {order}")
        if method not in METHODS:
            raise ValueError(f"method: expected one of {METHODS}, got {method!r}")
        self.order, self.method, self.D = order, method, discount

    def fit(self, text: str, vocab_size: int):
        """Count every k-gram of ``text``, k = 1 .. order."""
        self.V = vocab_size
        n = self.order
        # counts[k][h][c]: k = len(h) (0 .. n-1)
        counts = [defaultdict(Counter) for _ in range(n)]
        for k in range(n):
            for i in range(k, len(text)):
                counts[k][text[i - k:i]][text[i]] += 1
        if self.method == "kneser_ney":
            # below the top order: continuation counts N1+(. h c) (distinct characters before h c)
            cont = [defaultdict(Counter) for _ in range(n)]
            for k in range(n - 1):
                seen = set()
                for i in range(k + 1, len(text)):
                    g = text[i - k - 1:i + 1]  # x h c with len(h) = k
                    if g not in seen:
                        seen.add(g)
                        cont[k][g[1:-1]][g[-1]] += 1
            cont[n - 1] = counts[n - 1]
            counts = cont
        self.counts = [{h: (dict(c), sum(c.values()), len(c)) for h, c in ck.items()} for ck in counts]
        return self

    def prob(self, history: str, c: str) -> float:
        p = 1.0 / self.V
        for k in range(0, self.order):
            if k > len(history):
                break
            h = history[len(history) - k:] if k else ""
            entry = self.counts[k].get(h)
            if entry is None:
                continue
            cnt, total, types = entry
            x = cnt.get(c, 0)
            if self.method == "witten_bell":
                p = (x + types * p) / (total + types)
            else:
                p = max(x - self.D, 0.0) / total + self.D * types / total * p
        return p

    def bits_per_char(self, text: str) -> float:
        """Mean -log2 p over the characters of ``text`` (each from the characters before it,
        up to order - 1 of them; the first from fewer)."""
        n = self.order
        tot = 0.0
        for i in range(len(text)):
            tot -= math.log2(self.prob(text[max(0, i - n + 1):i], text[i]))
        return tot / len(text)


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
    from opsplit.data.dedup import deduplicate

    end = len(train) if within is None else within
    cut = int(end * (1 - dev_fraction))
    cut = train.rfind("\n\n", 0, cut) + 2 or cut  # at a paragraph boundary
    fit_part, dev = train[:cut] + train[end:], train[cut:end]
    dev, info = deduplicate(dev, fit_part, k=k)
    rows = [{"method": m, "order": n, "dev_bpc": NGram(n, m).fit(fit_part, vocab_size).bits_per_char(dev)}
            for m in METHODS for n in orders]
    return {"choice": min(rows, key=lambda r: r["dev_bpc"]), "rows": rows, "dev_chars": len(dev), "dedup": info}
