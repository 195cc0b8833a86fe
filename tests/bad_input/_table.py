"""The row type of the bad-input sweep, the assertion every row runs, and the inputs the rows share."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass

import pytest
import torch

import opsplit

_PKG = os.path.dirname(os.path.abspath(opsplit.__file__))

# what the rows build their inputs from
F64 = torch.float64
NAN, INF = float("nan"), float("inf")


def u(*shape, fill=None, at=None, dtype=F64, device=None):
    """A random tensor of ``shape`` (on ``device``: an uninitialised one), with ``fill`` written
    at the index ``at`` when given."""
    t = torch.randn(*shape, dtype=dtype) if device is None else torch.empty(*shape, dtype=dtype, device=device)
    if fill is not None:
        t[at] = fill
    return t


@dataclass(frozen=True)
class Case:
    id: str
    call: Callable[[], object]
    exc: type[BaseException]
    match: str


def cases(*rows) -> list:
    """``pytest.param`` per row ``(id, call, exc, match)``; ids must be unique."""
    out = [Case(*r) for r in rows]
    ids = [c.id for c in out]
    dup = {i for i in ids if ids.count(i) > 1}
    assert not dup, f"duplicate case ids: {dup}"
    return [pytest.param(c, id=c.id) for c in out]


def run_case(case: Case) -> None:
    with pytest.raises(BaseException) as info:
        case.call()
    err = info.value
    assert type(err) is case.exc, f"{case.id}: expected {case.exc.__name__}, got {type(err).__name__}: {err}"
    info.match(case.match)
    # raised by opsplit's checks, not deep inside torch/numpy compute
    origin = os.path.abspath(str(info.traceback[-1].path))
    assert origin.startswith(_PKG), f"{case.id}: raised in {origin}, not by opsplit's checks: {err}"
