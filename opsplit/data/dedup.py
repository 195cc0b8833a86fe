r"""Validation text that shares no long substring with the training text.

Held-out documents of a corpus whose documents quote each other (``pydoc_data.topics``:
the sections of the language reference repeat each other's paragraphs; half of the
40-character substrings of the validation split by document occur in the training split)
flatter every model, and a model that memorises the training text most.
:func:`deduplicate` removes from the validation text every *unit* that contains a
``k``-character substring occurring in the training text, and joins the units that are
left with ``sep``:

* ``unit="paragraph"`` (default): blocks separated by blank lines — whole paragraphs,
  headings, code blocks go or stay, so the text that is left reads as text;
* ``unit="char"``: every character covered by a shared substring (the most text kept, in
  pieces of a few words to a few lines).

Joining can create a new shared substring across a seam; the units at such a seam are
removed too, until none is left.  The result shares no ``k``-character substring with the
training text (:func:`shared_substrings` counts them; the tests check zero).
"""

from __future__ import annotations

import re

from .._checks import check_choice

__all__ = ["deduplicate", "shared_substrings", "UNITS"]

UNITS = ("paragraph", "char")


def _grams(text: str, k: int) -> set:
    return {text[i:i + k] for i in range(len(text) - k + 1)}


def _check(text, reference, k, where):
    if not isinstance(text, str) or not isinstance(reference, str):
        raise TypeError(f"{where}: expected two strings (the text and the training text), got "
                        f"{type(text).__name__} and {type(reference).__name__}")
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f"{where}.k: expected an integer >= 1 (the substring length), got {k!r}")


def shared_substrings(text: str, reference: str, k: int = 40) -> int:
    """How many of the ``k``-character substrings of ``text`` (counted with repetition)
    occur in ``reference``."""
    _check(text, reference, k, "shared_substrings")
    grams = _grams(reference, k)
    return sum(text[i:i + k] in grams for i in range(len(text) - k + 1))


def _covered(text: str, grams: set, k: int) -> bytearray:
    cov = bytearray(len(text))
    for i in range(len(text) - k + 1):
        if text[i:i + k] in grams:
            cov[i:i + k] = b"\x01" * k
    return cov


def deduplicate(text: str, reference: str, k: int = 40, *, unit: str = "paragraph", sep: str | None = None,
                max_rounds: int = 50) -> tuple[str, dict]:
    """``text`` without every unit (module docstring) that contains a ``k``-character
    substring of ``reference``; the units left joined with ``sep`` (default a blank line
    between paragraphs, a newline between character pieces).  Returns ``(text, info)``:
    characters before and after, units before and kept, rounds.

    Raises ``ValueError`` when nothing is left."""
    _check(text, reference, k, "deduplicate")
    check_choice(unit, UNITS, "deduplicate.unit")
    sep = ("\n\n" if unit == "paragraph" else "\n") if sep is None else sep
    if not isinstance(sep, str) or len(sep) > k - 1:
        raise ValueError(f"deduplicate.sep: expected a string shorter than k = {k}, got {sep!r}")
    grams = _grams(reference, k)
    before = len(text)
    if unit == "paragraph":
        units = [u for u in re.split(r"\n[ \t]*\n", text) if u.strip()]
    else:
        cov = _covered(text, grams, k)
        units, start = [], None
        for i, c in enumerate(cov):
            if not c and start is None:
                start = i
            elif c and start is not None:
                units.append(text[start:i])
                start = None
        if start is not None:
            units.append(text[start:])
    n_units = len(units)
    keep = [u for u in units if not _covered(u, grams, k).count(1)]
    for r in range(1, max_rounds + 1):
        if not keep:
            raise ValueError(f"deduplicate: every {unit} of the text contains a {k}-character substring of the "
                             "reference; nothing is left")
        joined = sep.join(keep)
        cov = _covered(joined, grams, k)
        if not cov.count(1):
            return joined, {"chars_before": before, "chars_after": len(joined), "units_before": n_units,
                            "units_kept": len(keep), "rounds": r, "k": k, "unit": unit}
        # drop every unit that a shared substring touches (they all straddle seams)
        bad, pos = set(), 0
        for j, u in enumerate(keep):
            end = pos + len(u) + len(sep)
            if cov[pos:min(end, len(cov))].count(1):
                bad.add(j)
            pos = end
        keep = [u for j, u in enumerate(keep) if j not in bad]
    raise RuntimeError(f"deduplicate: still a shared substring after {max_rounds} rounds")  # pragma: no cover
