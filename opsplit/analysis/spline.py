r"""Spline degree of ReLU networks along a line (seed 000, Theorem 3.3; seed 003).

A ReLU-attention module is a cubic spline in its input (seed 000, Thm 3.3 (i)–(iii)); a
:math:`t`-layer ReLU encoder is a spline of degree :math:`3^t` (Thm 3.3 (vii)).  Restricted
to a line :math:`X(\tau) = X_0 + \tau D`, a spline of degree :math:`k` is a piecewise
polynomial of degree :math:`\le k` in :math:`\tau`, whose pieces are separated by *kinks*:
the values of :math:`\tau` where the argument of some ReLU changes sign.  Between kinks the
:math:`(k+1)`-th finite difference on a uniform :math:`\tau` grid vanishes (up to round-off).

This module measures that:

* :func:`relu_sign_patterns` runs a function once on a batch of inputs and records the sign
  of the argument of every ReLU it applies (``torch.relu``, ``F.relu``, ``Tensor.relu``,
  ``relu_``, ``clamp_min``, ``clamp(min=...)``), through a ``TorchFunctionMode`` — no
  instrumentation of the model is needed;
* :func:`finite_difference` is the :math:`k`-th forward difference :math:`\Delta^k`;
* :func:`piecewise_degree` samples :math:`\tau`, keeps the windows of :math:`k + 1` samples
  on which no ReLU changes sign (away from kinks), and reports, for every order :math:`k`,
  the largest :math:`|\Delta^k g|` there, normalised by :math:`2^k \max|g|` (the size of
  round-off in :math:`\Delta^k`, relative to the function); the estimated degree is the
  smallest :math:`d` whose :math:`\Delta^{d+1}` vanishes to ``rtol``.

Use float64 and a :math:`\tau` spacing that is not too small: a piece of degree :math:`d`
has :math:`\Delta^d g = d!\,a_d h^d`, which must stand out of round-off to be seen.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.overrides import TorchFunctionMode

__all__ = [
    "finite_difference",
    "line",
    "relu_sign_patterns",
    "piecewise_degree",
    "DegreeEstimate",
]


def finite_difference(values: Tensor, order: int, dim: int = 0) -> Tensor:
    r"""The forward difference :math:`\Delta^k` of order ``order`` along ``dim``
    (:math:`\Delta g_i = g_{i+1} - g_i`); the length along ``dim`` shrinks by ``order``."""
    if order < 0:
        raise ValueError(f"finite_difference: expected order >= 0, got {order}")
    if order == 0:
        return values
    if values.shape[dim] <= order:
        raise ValueError(
            f"finite_difference: {values.shape[dim]} samples cannot give a difference of order {order}"
        )
    return torch.diff(values, n=order, dim=dim)


def line(x0: Tensor, direction: Tensor, taus: Tensor) -> Tensor:
    r"""The points :math:`X_0 + \tau D` for every ``tau``, stacked on a new leading dimension."""
    if x0.shape != direction.shape:
        raise ValueError(f"line: x0 {tuple(x0.shape)} and direction {tuple(direction.shape)} differ in shape")
    taus = taus.to(dtype=x0.dtype, device=x0.device)
    return x0.unsqueeze(0) + taus.view(-1, *([1] * x0.dim())) * direction.unsqueeze(0)


_RELU_FUNCS = {
    torch.relu, F.relu, torch.Tensor.relu, torch.Tensor.relu_, torch.relu_,
    torch.clamp_min, torch.Tensor.clamp_min, torch.Tensor.clamp_min_,
    torch.clamp, torch.Tensor.clamp, torch.Tensor.clamp_, torch.clip, torch.Tensor.clip,
}


class _ReLURecorder(TorchFunctionMode):
    def __init__(self):
        super().__init__()
        self.records: list[Tensor] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in _RELU_FUNCS and args and isinstance(args[0], Tensor):
            x = args[0]
            hi = None
            if func in (torch.relu, F.relu, torch.Tensor.relu, torch.Tensor.relu_, torch.relu_):
                lo = 0.0
            elif func in (torch.clamp_min, torch.Tensor.clamp_min, torch.Tensor.clamp_min_):
                lo = args[1] if len(args) > 1 else kwargs.get("min")
            else:  # clamp / clip: kinks at min and at max
                lo = args[1] if len(args) > 1 else kwargs.get("min")
                hi = args[2] if len(args) > 2 else kwargs.get("max")
            if lo is not None:
                self.records.append((x > lo).detach())
            if hi is not None:
                self.records.append((x < hi).detach())
        return func(*args, **kwargs)


@torch.no_grad()
def relu_sign_patterns(fn, x: Tensor) -> tuple[Tensor, Tensor]:
    """Run ``fn(x)`` on a batch ``x`` (leading dimension = samples) and return
    ``(fn(x), patterns)`` where ``patterns[i]`` holds, for sample ``i``, the signs of the
    arguments of every ReLU-like call ``fn`` made (flattened, booleans).

    ``fn`` must treat the samples of the batch independently (as a model does)."""
    rec = _ReLURecorder()
    with rec:
        out = fn(x)
    n = x.shape[0]
    pats = [r.reshape(n, -1) if r.dim() > 0 and r.shape[0] == n else r.reshape(1, -1).expand(n, -1) for r in rec.records]
    if not pats:
        return out, torch.zeros(n, 0, dtype=torch.bool, device=x.device)
    return out, torch.cat(pats, dim=1)


@dataclass
class DegreeEstimate:
    """The result of :func:`piecewise_degree`.

    Attributes:
        degree: smallest :math:`d` with ``differences[d + 1] <= rtol`` (``None`` if none up
            to ``max_degree``).
        differences: ``differences[k]`` = max over smooth windows of
            :math:`|\\Delta^k g| / (2^k \\max|g|)`, for :math:`k = 0..` ``max_degree + 1``
            (``nan`` when no window of that length is smooth).
        n_kinks: number of sample intervals in which some ReLU changes sign.
        n_samples: number of :math:`\\tau` samples.
        smooth_fraction: per order, the fraction of windows that are smooth.
    """

    degree: int | None
    differences: list[float]
    n_kinks: int
    n_samples: int
    rtol: float
    smooth_fraction: list[float] = field(default_factory=list)

    def vanishes(self, order: int) -> bool:
        """Whether :math:`\\Delta^{order}` vanishes (to ``rtol``) on every smooth window."""
        v = self.differences[order]
        return bool(v == v and v <= self.rtol)


@torch.no_grad()
def piecewise_degree(
    fn,
    x0: Tensor,
    direction: Tensor,
    taus: Tensor,
    *,
    max_degree: int = 10,
    rtol: float = 1e-9,
    chunk: int = 512,
) -> DegreeEstimate:
    r"""Estimate the polynomial degree of ``fn`` restricted to the line
    :math:`X(\tau) = X_0 + \tau D`, away from the kinks of its ReLUs.

    Args:
        fn: a function of a batch of inputs (leading dimension = samples), e.g. a model.
        x0, direction: a point :math:`X_0` and a direction :math:`D` of the input space (same
            shape, without the sample dimension).
        taus: a uniform grid of :math:`\tau` values.
        max_degree: highest degree tested (differences up to ``max_degree + 1``).
        rtol: threshold on the normalised difference for "vanishes".
        chunk: samples evaluated per call of ``fn``.
    """
    taus = torch.as_tensor(taus)
    if taus.dim() != 1 or taus.numel() < max_degree + 3:
        raise ValueError(
            f"piecewise_degree: expected a 1-D grid of at least max_degree + 3 = {max_degree + 3} taus"
        )
    h = torch.diff(taus.double())
    if not bool(torch.allclose(h, h[0].expand_as(h), rtol=1e-9, atol=0.0)):
        raise ValueError("piecewise_degree: taus must be uniformly spaced")
    outs, pats = [], []
    for i in range(0, taus.numel(), chunk):
        o, p = relu_sign_patterns(fn, line(x0, direction, taus[i : i + chunk]))
        outs.append(o.reshape(o.shape[0], -1))
        pats.append(p)
    g = torch.cat(outs, 0)
    pat = torch.cat(pats, 0)
    n = g.shape[0]
    change = (pat[1:] != pat[:-1]).any(dim=1) if pat.shape[1] else torch.zeros(n - 1, dtype=torch.bool)
    scale = float(g.abs().max())
    scale = scale if scale > 0 else 1.0
    diffs, fracs = [], []
    cum = torch.cat([torch.zeros(1, dtype=torch.long), change.long().cumsum(0)])
    for k in range(max_degree + 2):
        d = finite_difference(g, k, 0).abs().amax(dim=1) if k else g.abs().amax(dim=1)
        # window i covers samples i..i+k: smooth iff no pattern change in intervals i..i+k-1
        smooth = (cum[k:] - cum[: n - k]) == 0 if k else torch.ones(n, dtype=torch.bool)
        fracs.append(float(smooth.float().mean()))
        if bool(smooth.any()):
            diffs.append(float(d[smooth].max()) / (2.0**k * scale))
        else:
            diffs.append(math.nan)
    degree = None
    for dgr in range(max_degree + 1):
        v = diffs[dgr + 1]
        if v == v and v <= rtol:
            degree = dgr
            break
    return DegreeEstimate(degree, diffs, int(change.sum()), n, rtol, fracs)
