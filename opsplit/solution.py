r"""What a solve returns: the state, the states at requested times, and statistics.

:meth:`opsplit.Propagator.solve` (fixed steps, or adaptive steps with ``rtol``/``atol``)
returns a :class:`Solution`; its ``stats`` (:class:`SolveStats`) are the analogue of
diffrax's ``sol.stats``: accepted and rejected steps, substep calls per operator, and
the time grid that was used.

**Substep calls** count the substep solves the forward solve made (one call of a
:class:`~opsplit.solvers.Substep`: one operator advanced over one sub-interval by its
solver, whatever the solver's own internal stages), per substep of the scheme, labelled
``"<index>:<operator>"`` in the order of ``scheme.modules()`` (leaf substeps: the inner
substeps of a composite term are counted, not the composite).  The substeps of a
parallel group run as one vmapped call count one call each.  An adaptive solve's counts
include its rejected attempts and the work of its error estimate; the backward pass
(and a checkpointed recomputation) is not counted.  Counting uses forward hooks on the
substeps while the solve runs (nothing is recorded by a plain ``forward`` call).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field

from torch import Tensor, nn

from .schemes.parallel import ParallelGroup, ScaledOperator
from .solvers.base import Substep

__all__ = ["Solution", "SolveStats", "count_substep_calls", "substep_labels"]


@dataclass
class SolveStats:
    """Statistics of one solve (fields as diffrax's ``sol.stats`` where they agree).

    Attributes:
        n_accepted: accepted steps (fixed steps: :math:`N_t`).
        n_rejected: rejected attempts (fixed steps: 0).
        substep_calls: substep calls per substep of the scheme, ``{"<index>:<operator>": n}``.
        times: the time grid used, :math:`t^0 < \\dots < t^{n}` (accepted step ends); for
            per-sample adaptive solves ``None`` (each sample's grid is in ``per_sample``).
        success: whether the solve reached the final time (``False`` only for an adaptive
            solve stopped at ``max_steps`` with ``on_failure="return"``).
        message: why it stopped, when it did not succeed.
        per_sample: the statistics of each sample (per-sample adaptive solves), else ``None``;
            the fields above are then totals over the samples.
    """

    n_accepted: int = 0
    n_rejected: int = 0
    substep_calls: dict = field(default_factory=dict)
    times: list | None = None
    success: bool = True
    message: str = ""
    per_sample: list | None = None

    @property
    def n_steps(self) -> int:
        """Accepted plus rejected steps (attempts)."""
        return self.n_accepted + self.n_rejected

    @property
    def n_substep_calls(self) -> int:
        """All substep calls."""
        return int(sum(self.substep_calls.values()))

    @property
    def step_sizes(self) -> list | None:
        """The accepted step sizes (``None`` for per-sample solves)."""
        if self.times is None:
            return None
        return [b - a for a, b in zip(self.times[:-1], self.times[1:])]

    @staticmethod
    def total(stats: list) -> SolveStats:
        """Totals over several solves (per-sample statistics)."""
        calls: dict = {}
        for s in stats:
            for k, v in s.substep_calls.items():
                calls[k] = calls.get(k, 0) + v
        bad = [s.message for s in stats if not s.success]
        return SolveStats(
            n_accepted=sum(s.n_accepted for s in stats),
            n_rejected=sum(s.n_rejected for s in stats),
            substep_calls=calls,
            times=None,
            success=not bad,
            message="; ".join(bad),
            per_sample=list(stats),
        )

    def __str__(self) -> str:
        s = (
            f"{self.n_accepted} accepted, {self.n_rejected} rejected steps; "
            f"{self.n_substep_calls} substep calls"
        )
        if self.per_sample is not None:
            s += f" ({len(self.per_sample)} samples, each its own steps)"
        if not self.success:
            s += f"; stopped: {self.message}"
        return s


@dataclass
class Solution:
    """The result of :meth:`opsplit.Propagator.solve`.

    Attributes:
        u: the state at the final time ``t1`` (or where an adaptive solve stopped), the shape
            of the input.
        ts: the requested output times (``t_eval``), or ``None``.
        ys: the states at ``ts``, stacked on dimension 1 (after the batch; dimension 0 for
            an unbatched input), or ``None``.
        stats: :class:`SolveStats`.
    """

    u: Tensor
    ts: list | None
    ys: Tensor | None
    stats: SolveStats


def substep_labels(scheme: nn.Module) -> dict:
    """``{substep module: "<index>:<operator>"}`` for every leaf substep of ``scheme``, in the
    order of ``scheme.modules()``: substeps nested in a composite term (a
    :class:`~opsplit.schemes.Relaxation`, a :class:`~opsplit.schemes.SchemeFlow`) are
    listed, the composite's own substep is not (its work is its inner substeps')."""
    out = {}
    for m in scheme.modules():
        if isinstance(m, Substep) and m not in out:
            if any(isinstance(x, Substep) for op in m.terms for x in op.modules()):
                continue
            out[m] = f"{len(out)}:{type(m.terms[0]).__name__}"
    return out


@contextlib.contextmanager
def count_substep_calls(scheme: nn.Module, counts: dict | None = None):
    """Count substep calls of ``scheme`` while the block runs: yields the dict
    ``{"<index>:<operator>": calls}`` (every substep listed, from 0), updated in place."""
    labels = substep_labels(scheme)
    counts = {} if counts is None else counts
    for lab in labels.values():
        counts.setdefault(lab, 0)
    by_op = {}
    for sub, lab in labels.items():
        by_op.setdefault(id(sub.terms[0]), lab)
    handles = []

    def on_call(lab):
        def hook(module, args, output):
            counts[lab] += 1

        return hook

    def on_group(group, labs):
        def hook(module, args):
            for lab in labs:
                counts[lab] += 1

        return hook

    try:
        for sub, lab in labels.items():
            handles.append(sub.register_forward_hook(on_call(lab)))
        for m in scheme.modules():
            # a parallel group of K > 1 runs scaled copies (not registered submodules, so not
            # hooked above), possibly as one vmapped call: count one call per member
            if isinstance(m, ParallelGroup) and m.K > 1:
                labs = []
                for s in m._scaled:
                    op = s.terms[0]
                    op = op.op if isinstance(op, ScaledOperator) else op
                    labs.append(by_op.get(id(op), f"?:{type(op).__name__}"))
                for lab in labs:
                    counts.setdefault(lab, 0)
                handles.append(m.register_forward_pre_hook(on_group(m, labs)))
        yield counts
    finally:
        for h in handles:
            h.remove()
