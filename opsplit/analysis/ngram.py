r"""Character n-gram language models fitted by counting: the baselines a character-level
model's bits per character are compared with (``docs/continuity.md`` states its text target
against interpolated Kneser–Ney).

Both methods interpolate every order down to the uniform distribution over the
vocabulary of ``vocab_size`` characters, so every character has a probability > 0:

* interpolated **Witten–Bell** (Witten & Bell 1991; Chen & Goodman 1998, eq. 14):
  :math:`p(c \mid h) = \big(C(hc) + N_{1+}(h\,\cdot)\, p(c \mid h')\big) /
  \big(C(h\,\cdot) + N_{1+}(h\,\cdot)\big)`;
* interpolated **Kneser–Ney** (Chen & Goodman 1998, eq. 17; one absolute discount
  :math:`D` for every order): :math:`p(c \mid h) = \max(C(hc) - D, 0) / C(h\,\cdot) +
  D\, N_{1+}(h\,\cdot) / C(h\,\cdot)\; p(c \mid h')`, where below the top order the counts
  :math:`C` are continuation counts :math:`N_{1+}(\cdot\, h c)` (the number of distinct
  characters seen before :math:`hc`),

with :math:`h'` the context :math:`h` without its first character and a context never
seen giving :math:`p(c \mid h')` unchanged.  A model of order :math:`n` reads up to
:math:`n - 1` characters of context::

    from opsplit.analysis import NGram
    p = NGram(order=7, method="kneser_ney").fit(train_text, vocab_size)
    p.bits_per_char(val_text)       # mean -log2 p(c_i | c_{i-n+1} .. c_{i-1})
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict

from .._checks import check_choice

__all__ = ["NGram", "METHODS"]

#: the smoothing methods
METHODS = ("witten_bell", "kneser_ney")


def _text(v, name: str) -> str:
    if not isinstance(v, str):
        raise TypeError(f"{name}: expected a str, got {type(v).__name__}")
    if not v:
        raise ValueError(f"{name}: expected a non-empty text")
    return v


class NGram:
    """A character n-gram model of ``order`` >= 1 (``order - 1`` characters of context),
    smoothed by ``method`` (:data:`METHODS`); ``discount`` is Kneser–Ney's :math:`D` in
    (0, 1] (unused by Witten–Bell)."""

    def __init__(self, order: int, method: str = "kneser_ney", discount: float = 0.75):
        if isinstance(order, bool) or not isinstance(order, int):
            raise TypeError(f"NGram.order: expected an integer >= 1, got {order!r}")
        if order < 1:
            raise ValueError(f"NGram.order: expected an integer >= 1, got {order}")
        check_choice(method, METHODS, "NGram.method")
        if isinstance(discount, bool) or not isinstance(discount, (int, float)) or not 0 < discount <= 1:
            raise ValueError(f"NGram.discount: expected a number in (0, 1], got {discount!r}")
        self.order, self.method, self.D = order, method, float(discount)
        self.counts = None

    def fit(self, text: str, vocab_size: int) -> NGram:
        """Count every k-gram of ``text``, k = 1 .. order; ``vocab_size`` is the number of
        characters the model spreads probability over (at least the distinct characters of
        ``text``).  Returns ``self``."""
        text = _text(text, "NGram.fit.text")
        distinct = len(set(text))
        if isinstance(vocab_size, bool) or not isinstance(vocab_size, int):
            raise TypeError(f"NGram.fit.vocab_size: expected an integer, got {vocab_size!r}")
        if vocab_size < distinct:
            raise ValueError(f"NGram.fit.vocab_size: the text has {distinct} distinct characters, expected a "
                             f"vocabulary at least that large, got {vocab_size}")
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
        """:math:`p(c \\mid h)`, ``h`` the last ``order - 1`` characters of ``history``."""
        if self.counts is None:
            raise ValueError("NGram.prob: the model is not fitted; call fit(text, vocab_size) first")
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
        """Mean :math:`-\\log_2 p` over the characters of ``text`` (each from the characters
        before it, up to ``order - 1`` of them; the first from fewer)."""
        text = _text(text, "NGram.bits_per_char.text")
        if self.counts is None:
            raise ValueError("NGram.bits_per_char: the model is not fitted; call fit(text, vocab_size) first")
        n = self.order
        tot = 0.0
        for i in range(len(text)):
            tot -= math.log2(self.prob(text[max(0, i - n + 1):i], text[i]))
        return tot / len(text)

    def __repr__(self) -> str:
        return f"NGram(order={self.order}, method={self.method!r}, discount={self.D:g})"
