"""Markers for ``torch.compile`` that do not import ``torch._dynamo`` at import time.

``torch.compiler.disable`` and ``torch.compiler.assume_constant_result`` import
``torch._dynamo`` when they decorate a function, which adds ~1.5 s to ``import opsplit``
(every CLI start, notebook kernel and ``torchrun`` process pays it) although most users
never compile.  The markers here have the same effect under ``torch.compile`` and import
nothing until dynamo itself is running:

* :func:`eager_under_compile` — the function runs eagerly (a graph break) when a compiled
  caller reaches it; through torch's lazy ``_disable_dynamo`` where the installed torch
  has it, else ``torch.compiler.disable``.
* :func:`constant_under_compile` — dynamo evaluates the call at trace time and treats the
  result as a constant (what ``torch.compiler.assume_constant_result`` records: one
  attribute on the function).

Both are checked by the compile tests (``tests/test_issue8_regressions.py``,
``tests/test_sliced_causal.py``): a torch that changed either mechanism fails there.
"""

from __future__ import annotations

import torch

__all__ = ["eager_under_compile", "constant_under_compile"]


def eager_under_compile(reason: str):
    """Decorator: run ``fn`` eagerly under ``torch.compile`` (``reason`` says why; it is
    shown by the eager fallback of torches without the lazy marker)."""
    lazy = getattr(torch, "_disable_dynamo", None)

    def deco(fn):
        if lazy is not None:
            return lazy(fn)
        return torch.compiler.disable(fn, reason=reason)

    return deco


def constant_under_compile(fn):
    """Decorator: under ``torch.compile`` the call is evaluated at trace time and its
    result is a constant of the graph; eager calls are unchanged."""
    fn._dynamo_marked_constant = True
    return fn
