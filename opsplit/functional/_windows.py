r"""The sliced ReLU-bump attention (paper 004, eq. 7) when the bandwidth is small against
the spread of the scores: which evaluation is exact enough, and a pair-by-pair evaluation
over the keys inside each query's window.

**Conditioning.**  The fast kernels read the hat kernel off prefix tables (Lemma B.4):

.. math::  \sum_j w_j\,\mathrm{hat}_b(q - z_j)\,\gamma_j = \tfrac1b\big[(q - b)\,\Delta A
           - \Delta B + \dots\big],\qquad B_p = \sum_{j<p} w_j z_j \gamma_j ,

a difference of prefix sums of the size of :math:`\max |z - c|\,|\gamma|` divided by
:math:`b`.  Their rounding error, relative to :math:`\max|v|`, is about
:math:`c\,\varepsilon\,\kappa` with :math:`\kappa = (\max z - \min z) / b` (the spread of
the row's scores over the bandwidth; measured with 200-2000 random scores, :math:`b` from
:math:`10^{-1}` to :math:`10^{-5}` of the spread: :math:`c \le 0.1` for the full kernel,
:math:`c \le 0.3` for the causal one, in both dtypes).  With :math:`b` below a few ulps of
the largest score the windows :math:`q \pm b` collapse onto :math:`q` in the dtype, and
the table form has no meaning at all.  So, per call (:func:`route`):

* every row with :math:`\kappa \le` :data:`KAPPA_FAST` (:math:`2^7` in float32,
  :math:`2^{18}` in float64: errors below :math:`5\cdot 10^{-6}` and
  :math:`2\cdot 10^{-11}` of :math:`\max|v|`) and :math:`b` at least 8 ulps of its largest
  score: the fast kernel in the inputs' dtype;
* otherwise, without autograd and with at most :data:`PAIRS_CHEAP` (query, key) pairs per
  query and key inside the windows: this module's :func:`bump_by_windows`, eq. 7 summed
  pair by pair (kernel values in float64, exact to rounding; about the cost of float64
  tables);
* otherwise, for float32 inputs with :math:`\kappa \le` :data:`KAPPA_MAX`
  (:math:`2^{32}`): the fast kernel in float64 (error below :math:`3\cdot 10^{-7}`; about
  2.5 times the float32 kernel);
* otherwise, with at most :data:`PAIRS_PER_TOKEN` pairs per query and key: the pair-by-pair
  sum (with autograd it materialises a D-vector per pair and is several times slower; it
  is differentiable to any order);
* otherwise a ``ValueError`` naming the bandwidth.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from ._inputs import scales

__all__ = [
    "KAPPA_FAST",
    "KAPPA_MAX",
    "PAIRS_CHEAP",
    "PAIRS_PER_TOKEN",
    "route",
    "bump_by_windows",
    "evaluate",
]

#: spread / bandwidth up to which the prefix-table kernels run in the inputs' dtype
KAPPA_FAST = {torch.float32: 2.0**7, torch.float64: 2.0**18}
#: spread / bandwidth up to which float32 inputs may use the float64 prefix tables
KAPPA_MAX = 2.0**32
#: pairs per query and key up to which the pair-by-pair sum is preferred to float64 tables
#: (without autograd: ``embedding_bag``, about the cost of float64 tables)
PAIRS_CHEAP = 8
#: pairs per query and key that the pair-by-pair evaluation may enumerate at most
PAIRS_PER_TOKEN = 64
#: pairs enumerated at a time (memory: this many D-vectors in float64)
_CHUNK = 1 << 17


def _windows(zq64: Tensor, zk64: Tensor, w: Tensor | None, b64: Tensor):
    """Sorted keys (masked keys last, never inside a window), their order and the window
    ranks ``[a0, a2)`` of every query, widened by one ulp on each side (the kernel is
    evaluated pair by pair, so an extra key on an edge adds its exact zero)."""
    zs = zk64 if w is None else torch.where(w > 0, zk64, math.inf)
    ks, order = torch.sort(zs, dim=1)
    lo, hi = zq64 - b64, zq64 + b64
    lo = torch.nextafter(lo, torch.full_like(lo, -math.inf))
    hi = torch.nextafter(hi, torch.full_like(hi, math.inf))
    a0 = torch.searchsorted(ks, lo.contiguous(), side="left")
    a2 = torch.searchsorted(ks, hi.contiguous(), side="right")
    return order, a0, a2


def route(
    zq: Tensor, zk: Tensor, w: Tensor | None, b: Tensor, *, graph: bool = False
) -> tuple[str, float]:
    """``("fast" | "windows" | "float64" | "refuse", kappa)`` for rows ``zq (R, N_q)``,
    ``zk (R, N_k)``, weights ``w (R, N_k)`` or ``None``, bandwidths ``b (R, 1)`` (see the
    module docstring); ``kappa`` is the largest spread / bandwidth of the call.  ``graph``:
    a gradient will be taken (the pair-by-pair sum is then materialised per pair and is
    used only where no table evaluation is accurate)."""
    dt = zq.dtype
    with torch.no_grad():
        zq64, zk64, b64 = zq.double(), zk.double(), b.double()
        kmax = zk64 if w is None else torch.where(w > 0, zk64, -math.inf)
        kmin = zk64 if w is None else torch.where(w > 0, zk64, math.inf)
        hi = torch.maximum(zq64.amax(1), kmax.amax(1))
        lo = torch.minimum(zq64.amin(1), kmin.amin(1))
        spread = torch.where(hi >= lo, hi - lo, 0.0)
        big = torch.maximum(hi.abs(), lo.abs()).nan_to_num(0.0, posinf=0.0)
        kappa = spread / b64.view(-1)
        ulps = b64.view(-1) < big * (8 * torch.finfo(dt).eps)
        fast = (kappa <= KAPPA_FAST[dt]) & ~ulps
        kmax_, all_fast = torch.stack([kappa.max(), fast.all().double()]).tolist()
        if all_fast:
            return "fast", kmax_
        order, a0, a2 = _windows(zq64, zk64, w, b64)
        R, Nq = zq.shape
        per_token = float((a2 - a0).sum()) / (R * (Nq + zk.shape[1]))
        if per_token <= PAIRS_CHEAP and not graph:
            return "windows", kmax_
        ulps64 = bool((b64.view(-1) < big * (8 * torch.finfo(torch.float64).eps)).any())
        if dt == torch.float32 and kmax_ <= KAPPA_MAX and not ulps64:
            return "float64", kmax_
        if per_token <= PAIRS_PER_TOKEN:
            return "windows", kmax_
        return "refuse", kmax_


def bump_by_windows(
    zq: Tensor, zk: Tensor, v: Tensor, w: Tensor | None, b: Tensor, *, causal: bool
) -> Tensor:
    r"""Eq. 7 summed over the pairs inside the windows ``|q_i - z_j| < b``: the kernel values
    in float64 from the scores themselves, the weighted values summed in ``v``'s dtype
    (``embedding_bag``, or, when a gradient is needed, ``index_add``: plain torch operations,
    differentiable by autograd in ``zq``, ``zk``, ``v`` and ``b`` to any order;
    :math:`\mathrm{hat}'` follows ``torch.relu`` / ``torch.abs``, as the naive formula).
    Rows: ``zq (R, N_q)``, ``zk (R, N_k)``, ``v (R, N_k, D)``, ``w (R, N_k)`` or ``None``,
    ``b (R, 1)``.  With ``causal``, query ``i`` sees the keys ``l <= i + N_k - N_q`` and is
    normalised by their weight.  Returns ``(R, N_q, D)`` in ``v``'s dtype; 0 where the
    (visible) weight is 0."""
    R, Nq = zq.shape
    Nk, D = v.shape[1], v.shape[2]
    dev, dt = zq.device, v.dtype
    graph = torch.is_grad_enabled() and any(x.requires_grad for x in (zq, zk, v, b))
    zq64, zk64, b64 = zq.double(), zk.double(), b.double()
    wk = torch.ones(R, Nk, dtype=torch.float64, device=dev) if w is None else w.double()
    with torch.no_grad():
        order, a0, a2 = _windows(zq64.detach(), zk64.detach(), w, b64.detach())
        n = (a2 - a0).reshape(-1)
        cs = torch.cumsum(n, 0)
    qf, kf, bf, wf = zq64.reshape(-1), zk64.reshape(-1), b64.reshape(-1), wk.reshape(-1)
    vf = v.reshape(R * Nk, D)
    a0f, of = a0.reshape(-1), order.reshape(-1)
    F_ = R * Nq
    outs = []
    f0 = 0
    while f0 < F_:
        base = int(cs[f0 - 1]) if f0 > 0 else 0
        f1 = int(torch.searchsorted(cs, torch.tensor([base + _CHUNK], device=dev), side="right"))
        f1 = min(F_, max(f0 + 1, f1))
        nn = n[f0:f1]
        with torch.no_grad():
            first = torch.cumsum(nn, 0) - nn  # each query's first pair
            fq = torch.repeat_interleave(torch.arange(f0, f1, device=dev), nn)
            pos = (
                a0f[fq] + torch.arange(fq.shape[0], device=dev) - torch.repeat_interleave(first, nn)
            )
            row = torch.div(fq, Nq, rounding_mode="floor")
            j = of[row * Nk + pos]  # key index in its row
            kg = row * Nk + j
            keep = (j <= fq - row * Nq + (Nk - Nq)) if causal else None
        hat = torch.relu(1 - (qf[fq] - kf[kg]).abs() / bf[row]) * wf[kg]
        if keep is not None:
            hat = hat * keep
        if graph:
            contrib = hat.to(dt).unsqueeze(1) * vf[kg]
            outs.append(
                torch.zeros(f1 - f0, D, dtype=dt, device=dev).index_add(0, fq - f0, contrib)
            )
        else:
            outs.append(
                torch.nn.functional.embedding_bag(
                    kg, vf, first, mode="sum", per_sample_weights=hat.to(dt)
                )
            )
        f0 = f1
    out = torch.cat(outs).view(R, Nq, D) if outs else v.new_zeros(R, Nq, D)
    if causal:
        t = torch.arange(Nq, device=dev) + (Nk - Nq)
        Wc = torch.cumsum(wk, 1)
        W = torch.where(t >= 0, Wc[:, t.clamp_min(0)], 0.0)  # (R, N_q)
    else:
        W = wk.sum(1, keepdim=True).expand(R, Nq)
    nz = W > 0
    out = torch.where(nz.unsqueeze(-1), out.double() / torch.where(nz, W, 1.0).unsqueeze(-1), 0.0)
    return out.to(dt)


def evaluate(
    fn: str, zq: Tensor, zk: Tensor, v: Tensor, w: Tensor | None, b: Tensor, fast, *, causal: bool
) -> Tensor:
    """The bump attention of rows ``zq (R, N_q)``, ``zk (R, N_k)``, ``v (R, N_k, D)``,
    ``w (R, N_k)`` or ``None``, ``b (R, 1)`` by the evaluation :func:`route` picks:
    ``fast(zq, zk, v, w, b, scales)`` (a prefix-table kernel) in the inputs' dtype or in
    float64, :func:`bump_by_windows`, or a ``ValueError`` naming the bandwidth.  Checks
    that the scores and values are finite first."""
    sc = scales(fn, zq, zk, v, w, b)
    graph = torch.is_grad_enabled() and any(x.requires_grad for x in (zq, zk, v, b))
    how, kappa = route(zq, zk, w, b, graph=graph)
    if how == "fast":
        return fast(zq, zk, v, w, b, sc)
    if how == "windows":
        return bump_by_windows(zq, zk, v, w, b, causal=causal)
    if how == "float64":
        z64 = [x.double() for x in (zq, zk, v)]
        w64 = None if w is None else w.double()
        b64 = b.double()
        return fast(*z64, w64, b64, scales(fn, *z64, w64, b64)).to(v.dtype)
    bmin = float(b.detach().amin())
    limit = KAPPA_MAX if zq.dtype == torch.float32 else KAPPA_FAST[zq.dtype]
    raise ValueError(
        f"{fn}: bandwidth: b = {bmin:.3g} is too small against the spread of the scores "
        f"(max spread / b = {kappa:.3g}, beyond {limit:.3g} for {zq.dtype}, or b "
        f"below 8 ulps of the largest score), and the (query, key) pairs inside the windows "
        f"|z_q - z_k| < b are too many to sum one by one: the prefix sums of eq. 7 would "
        f"lose every digit; use a larger bandwidth (or rescale the scores of a row)"
    )
