"""The finiteness checks of a model's (or a model part's) call: its parameters at the entry,
its output at the end.

Every model checks all its floating parameters and buffers at its forward entry
(:func:`opsplit._checks.check_parameters_finite`, named by qualified name, e.g.
``projection.fc2.weight``; re-read only after a tensor's version counter or storage
changes, so repeated forwards with the same parameters read nothing), then its input, then
computes, then checks its output (:func:`check_output`).  A write through ``p.data``
changes no version counter: the cached check does not see it.  Such a write shows up as a
non-finite output or intermediate (a ``ValueError`` from a check inside the call); the
model then re-reads every parameter (``fresh=True``) before re-raising, so the parameter is
named rather than the symptom (:func:`checked_call`).  A ``.data`` write whose effect stays
finite (a NaN in the embedding row of a token the input does not use) changes nothing the
call returns and is not reported by it; it is caught by the next call after any in-place
update of that tensor, and by ``generate``, which re-reads every parameter at its start.
"""

from __future__ import annotations

from collections.abc import Callable

from torch import Tensor, nn

from .._checks import check_finite, check_parameters_finite

__all__ = ["check_output", "checked_call"]


def check_output(x: Tensor, name: str) -> None:
    """Raise naming ``name`` if the output ``x`` holds NaN/inf (one reduction; skipped under
    ``torch.compile`` / ``torch.jit`` tracing)."""
    check_finite(x, name, f"produced from a finite input and finite parameters: an intermediate value left "
                          f"the range of {x.dtype}; scale the input down or use float64")


def checked_call(module: nn.Module, what: str, compute: Callable[[], Tensor]) -> Tensor:
    """``compute()`` with its result checked finite (``{what} output``); a ``ValueError`` from
    it or from that check re-reads every parameter of ``module`` first (``fresh=True``), so a
    non-finite parameter written through ``.data`` is named.  The caller has run the cached
    :func:`~opsplit._checks.check_parameters_finite` and its input checks before."""
    try:
        out = compute()
        check_output(out, f"{what} output")
    except ValueError:
        check_parameters_finite(module, what, fresh=True)
        raise
    return out
