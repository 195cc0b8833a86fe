r"""A long-range retrieval task, generated (nothing is downloaded): recall the flagged symbol.

Every sequence has ``length`` tokens.  Token :math:`k` carries a symbol
:math:`s_k \in \{0, \dots, C-1\}` drawn uniformly and independently; exactly one position
:math:`p` — drawn uniformly in ``[floor(a N), floor(b N))`` for ``flag_span = (a, b)`` — is
*flagged*: its token id is :math:`C + s_p` instead of :math:`s_p` (vocabulary :math:`2C`).
The target at every position :math:`k > p` is :math:`s_p`, the flagged symbol; positions
:math:`k \le p` have no target (:data:`IGNORE`).  With ``flag_length = m > 1`` the flag is
a span: the :math:`m` tokens :math:`p, \dots, p + m - 1` all carry the flagged symbol
:math:`C + s_p`, and the targets start after the span (:math:`p` is then drawn so that the
span ends before the last token).  A longer span makes the task easier to learn (at
initialisation attention spreads over all keys, and the flag's share of it is
:math:`m / k`), not shorter-ranged: the nearest flagged token is :math:`k - p - m + 1`
tokens back.

A causal model answers position :math:`k` only by retrieving a token :math:`k - p` steps
back — up to ``length - 1`` tokens — among :math:`k` distractors that carry the same
symbols unflagged.  Without attention (or any other mixing along the sequence) the answer
is independent of the input at :math:`k`, and the best accuracy is chance, :math:`1/C`.
Both a softmax head (a large score on the flagged keys) and a sliced ReLU head (paper 004:
the flagged keys' scores far below every other key's, the others equal to the query's) can
represent the solution exactly.

:func:`retrieval_loss` is the cross-entropy over the positions with a target;
:func:`retrieval_accuracy` the fraction of them answered correctly, optionally only those
at least ``min_distance`` tokens after the flag.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from .._checks import skip_value_checks
from .base import TensorData, check_int

__all__ = ["IGNORE", "flag_retrieval", "retrieval_loss", "retrieval_accuracy"]

#: target of the positions that have none (at or before the flag)
IGNORE = -100


def _int(v, name: str, low: int) -> int:
    return check_int(v, f"flag_retrieval.{name}", low)


def flag_retrieval(n_samples: int, length: int, *, n_symbols: int = 8, flag_span=(0.0, 0.5), flag_length: int = 1,
                   seed: int = 0, name: str = "flag_retrieval") -> TensorData:
    """``n_samples`` sequences of the module docstring's task.

    Returns a :class:`TensorData` with inputs ``(n_samples, length)`` (int64 token ids in
    ``[0, 2 n_symbols)``) and targets ``(n_samples, length)`` (int64: the flagged symbol
    after the flag, :data:`IGNORE` elsewhere); ``info["flag"]`` holds the flag positions
    (the first of each span; ``flag_length`` as in the module docstring).
    The same arguments give the same tensors (a ``torch.Generator`` seeded with ``seed``).
    """
    n_samples = _int(n_samples, "n_samples", 1)
    length = _int(length, "length", 2)
    n_symbols = _int(n_symbols, "n_symbols", 2)
    seed = _int(seed, "seed", 0)
    m = _int(flag_length, "flag_length", 1)
    if m > length - 1:
        raise ValueError(f"flag_retrieval.flag_length: expected an integer <= length - 1 = {length - 1} (a span must "
                         f"end before the last token, whatever flag_span), got {m}")
    if not (isinstance(flag_span, (tuple, list)) and len(flag_span) == 2
            and all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in flag_span)):
        raise TypeError(f"flag_retrieval.flag_span: expected a pair of numbers (a, b), got {flag_span!r}")
    a, b = float(flag_span[0]), float(flag_span[1])
    lo, hi = math.floor(a * length), math.floor(b * length)
    last = length - m  # a span starting before `last` leaves at least one position after it
    if not (0.0 <= a < b <= 1.0) or hi <= lo or lo >= last:
        raise ValueError(f"flag_retrieval.flag_span: expected 0 <= a < b <= 1 with at least one flag start in "
                         f"[0, length - flag_length) = [0, {last}), got {flag_span!r} -> starts [{lo}, {hi})")
    hi = min(hi, last)
    g = torch.Generator().manual_seed(seed)
    symbols = torch.randint(0, n_symbols, (n_samples, length), generator=g)
    flag = torch.randint(lo, hi, (n_samples,), generator=g)
    rows = torch.arange(n_samples)
    answer = symbols[rows, flag]
    pos = torch.arange(length)[None, :]
    span = (pos >= flag[:, None]) & (pos < flag[:, None] + m)
    tokens = torch.where(span, (answer + n_symbols)[:, None], symbols)
    after = pos >= flag[:, None] + m
    targets = torch.where(after, answer[:, None], torch.full_like(symbols, IGNORE))
    info = {"task": "flag_retrieval", "length": length, "n_symbols": n_symbols, "vocab_size": 2 * n_symbols,
            "flag_span": (a, b), "flag_length": m, "seed": seed, "flag": flag.tolist(), "ignore_index": IGNORE}
    return TensorData(tokens, targets, name=name, info=info)


def _check(logits: Tensor, targets: Tensor, fn: str) -> None:
    if not isinstance(logits, Tensor) or not isinstance(targets, Tensor):
        raise TypeError(f"{fn}: expected tensors (logits, targets)")
    if logits.dim() != 3 or targets.shape != logits.shape[:2]:
        raise ValueError(f"{fn}: expected logits (B, N, C) and targets (B, N), got {tuple(logits.shape)} and "
                         f"{tuple(targets.shape)}")
    if targets.is_floating_point() or targets.is_complex() or targets.dtype == torch.bool:
        raise TypeError(f"{fn}: expected integer class targets (or {IGNORE}), got dtype {targets.dtype}")
    C = logits.shape[-1]
    if skip_value_checks():  # (a value check: not while torch.compile traces)
        return
    bad = (targets != IGNORE) & ((targets < 0) | (targets >= C))
    if bool(bad.any()):
        raise ValueError(f"{fn}: expected targets in [0, {C - 1}] or {IGNORE} (no target), got "
                         f"{int(targets[bad][0])}")


def retrieval_loss(logits: Tensor, targets: Tensor) -> Tensor:
    """Mean cross-entropy over the positions whose target is not :data:`IGNORE`;
    ``logits (B, N, C)``, ``targets (B, N)``.  A callable loss for
    :class:`~opsplit.control.Objective`."""
    _check(logits, targets, "retrieval_loss")
    return torch.nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=IGNORE)


@torch.no_grad()
def retrieval_accuracy(logits: Tensor, targets: Tensor, *, min_distance: int = 1) -> float:
    """Fraction of the positions with a target whose arg-max logit is the target, among
    those at least ``min_distance`` tokens after their sequence's flag (its last flagged
    token, for a span; ``nan`` if none)."""
    _check(logits, targets, "retrieval_accuracy")
    check_int(min_distance, "retrieval_accuracy.min_distance", 1)
    has = targets != IGNORE
    flag = (~has).sum(1, keepdim=True) - 1  # positions <= flag have no target
    dist = torch.arange(targets.shape[1], device=targets.device)[None, :] - flag
    sel = has & (dist >= min_distance)
    n = int(sel.sum())
    if n == 0:
        return float("nan")
    return float(((logits.argmax(-1) == targets) & sel).sum()) / n
