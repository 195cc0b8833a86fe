r"""Nadaraya–Watson kernel attention (paper 001, §2.3–§3.3).

The Nadaraya–Watson estimator is attention with a radial smoothing kernel:

.. math::

    o_i = \sum_j \alpha(q_i, k_j)\, v_j,\qquad
    \alpha(q_i, k_j) = \frac{w_j\,K_h(\|q_i - k_j\|)}{\sum_l w_l\,K_h(\|q_i - k_l\|)},
    \qquad K_h(r) = K(r / h)

(paper 001, eq. 5 and the display after eq. 6; the factor :math:`1/h` of :math:`K_h` and the
kernels' normalising constants cancel).  Kernels (§2.2), as functions of :math:`r \ge 0`:

========================  =====================================  ==================
``"gaussian"``            :math:`e^{-r^2/2}`                     support :math:`\mathbb R`
``"boxcar"``              :math:`\tfrac12\,\mathbf 1[r \le 1]`   compact
``"epanechnikov"``        :math:`\tfrac34\,(1 - r^2)_+`          compact
========================  =====================================  ==================

**Softmax as an RBF kernel (paper 001, eq. 8).**
:math:`e^{\langle q, k\rangle/\sqrt d} = e^{-\|q-k\|^2/(2\sqrt d)}\,
e^{(\|q\|^2 + \|k\|^2)/(2\sqrt d)}`: the factor in :math:`q` cancels in the normalisation,
and the one in :math:`k` is a constant when all keys have the same norm (after a LayerNorm
without affine, :math:`\|k\| = \sqrt d`).  Then Gaussian kernel attention with bandwidth
:math:`h` *equals* softmax attention with scale :math:`1/h^2`; :math:`h = d^{1/4}` gives the
usual :math:`1/\sqrt d`.  The Gaussian case is evaluated exactly this way, through
``torch.nn.functional.scaled_dot_product_attention`` with the additive mask
:math:`-\|k_j\|^2/(2h^2) + \log w_j` in float32 (with heads, ``(..., H, N, d)``: torch's
fused kernel, memory linear in the sequence length, no double backward on the CPU; 3-D
inputs: SDPA's math path, see :mod:`opsplit.functional._sdpa_path`), and
as an explicit softmax in float64 (SDPA rounds the float64 case on the CPU); the compact
kernels are evaluated densely.  Dense evaluations go in slices of queries, so the
temporaries are bounded by ``N_k`` times a fixed slice.

**Distances where they cancel.**  The expanded form :math:`\|q\|^2 + \|k\|^2 - 2\langle q,
k\rangle` (one matrix product) loses :math:`\varepsilon(\|q - c\|^2 + \|k - c\|^2)/h^2` to
cancellation: float32 keys 0, 1e4, 1e4 + 0.7 and the query 1e4 + 0.2 (h = 1) gave the boxcar
2.0 instead of 3.0.  So the compact kernels always use the difference form
:math:`\sum_d (q_{id} - k_{jd})^2 / h^2` (the differences of the inputs themselves, exact for
nearby points; the same :math:`O(N_q N_k d)` work, in slices of queries), and the Gaussian
kernel does when :math:`\kappa = \max(\|q - c\|, \|k - c\|)^2 / h^2` exceeds
:data:`KAPPA_EXPANDED` (float32: 128, where the logits would lose more than about
:math:`10^{-5}`; float64: :math:`2^{16}`); below it, the expanded form above (SDPA).

**Empty neighbourhoods.**  With a compact kernel a query may have no key within
distance :math:`h`; its denominator is 0 and opsplit returns :math:`o_i = 0` there (finite,
with zero gradient), as for a query whose keys are all masked.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from .._checks import skip_value_checks
from ._inputs import key_weights as combine_key_weights
from ._sdpa_path import sdpa

__all__ = ["KERNELS", "kernel_profile", "nadaraya_watson_attention"]

#: the radial kernels K(r) of paper 001 §2.2 (normalising constants included)
KERNELS = ("gaussian", "boxcar", "epanechnikov")

# query rows per slice of the dense evaluation (bounds the N_q x N_k (x d) temporaries)
_SLICE_ELEMS = 1 << 22
#: largest max(|q - c|, |k - c|)^2 / h^2 for which the Gaussian kernel uses the expanded form
KAPPA_EXPANDED = {torch.float32: 2.0**7, torch.float64: 2.0**16}


def kernel_profile(name: str, r: Tensor) -> Tensor:
    """:math:`K(r)` of paper 001 §2.2 for ``r >= 0`` (with its normalising constant)."""
    if name == "gaussian":
        return torch.exp(-0.5 * r * r) / math.sqrt(2 * math.pi)
    if name == "boxcar":
        return 0.5 * (r <= 1).to(r.dtype)
    if name == "epanechnikov":
        return 0.75 * (1 - r * r).clamp_min(0)
    raise ValueError(f"kernel: expected one of {KERNELS}, got {name!r}")


def _check(q, k, v, kernel, bandwidth, key_padding_mask, key_weights):
    fn = "nadaraya_watson_attention"
    for name, x in (("q", q), ("k", k), ("v", v)):
        if not isinstance(x, Tensor):
            raise TypeError(f"{fn}: {name}: expected a torch.Tensor, got {type(x).__name__}")
        if x.dtype not in (torch.float32, torch.float64):
            raise TypeError(f"{fn}: {name}: expected float32 or float64, got {x.dtype}")
    if not (q.dtype == k.dtype == v.dtype):
        raise TypeError(f"{fn}: q, k, v must share one dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if not (q.device == k.device == v.device):
        raise ValueError(
            f"{fn}: q, k, v must be on one device, got {q.device}, {k.device}, {v.device}")
    if q.dim() < 2 or k.dim() != q.dim() or v.dim() != q.dim():
        raise ValueError(
            f"{fn}: expected q (..., N_q, d), k (..., N_k, d), v (..., N_k, D); got "
            f"{tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}"
        )
    if (q.shape[:-2] != k.shape[:-2] or v.shape[:-2] != k.shape[:-2]
            or q.shape[-1] != k.shape[-1] or v.shape[-2] != k.shape[-2]):
        raise ValueError(
            f"{fn}: shape mismatch: expected q (..., N_q, d), k (..., N_k, d), v (..., N_k, D) "
            f"with equal leading dims; got {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}"
        )
    if k.shape[-2] == 0:
        raise ValueError(f"{fn}: k: expected at least one key (N_k >= 1), got {tuple(k.shape)}")
    if q.shape[-1] == 0:
        raise ValueError(f"{fn}: q, k: expected a feature dimension d >= 1, got {tuple(q.shape)}")
    if not isinstance(kernel, str) or kernel not in KERNELS:
        raise ValueError(f"{fn}: kernel: expected one of {KERNELS}, got {kernel!r}")
    if isinstance(bandwidth, Tensor):
        if not bandwidth.is_floating_point():
            raise TypeError(f"{fn}: bandwidth: expected a floating-point tensor, got {bandwidth.dtype}")
        h = bandwidth.detach()
    elif isinstance(bandwidth, (int, float)) and not isinstance(bandwidth, bool):
        h = torch.tensor(float(bandwidth), dtype=torch.float64)
    else:
        raise TypeError(f"{fn}: bandwidth: expected a number or a tensor, got {bandwidth!r}")
    values = not _graph_mode(q, k, v, bandwidth)
    if values and (not bool(torch.isfinite(h).all()) or bool((h <= 0).any())):
        raise ValueError(f"{fn}: bandwidth: expected finite values > 0, got {bandwidth!r}")
    lead, Nk = k.shape[:-2], k.shape[-2]
    try:
        ok = h.dim() <= len(lead) and torch.broadcast_shapes(h.shape, lead) == lead
    except RuntimeError:
        ok = False
    if not ok:
        raise ValueError(
            f"{fn}: bandwidth: expected a number or a shape broadcastable to the leading dims "
            f"{tuple(lead)}, got {tuple(h.shape)}")
    for name, x in (("q", q), ("k", k), ("v", v)) if values else ():
        if not bool(torch.isfinite(x).all()):
            n_bad = int((~torch.isfinite(x)).sum())
            raise ValueError(f"{fn}: {name}: expected finite values, found {n_bad} NaN/inf entries")
    kappa = 0.0
    if values and q.numel() and k.numel():
        # the kernel is evaluated on (q - c)/h, (k - c)/h (c: the mean key): their squared
        # norms and products must be representable
        c = k.mean(-2, keepdim=True)
        m = torch.maximum((q - c).abs().amax(), (k - c).abs().amax()).detach().double()
        kappa = float(m / h.double().amin()) ** 2
        big = kappa * 4 * q.shape[-1]
        if not big < torch.finfo(q.dtype).max:
            raise ValueError(
                f"{fn}: q, k: the scaled squared distances |q - k|^2 / h^2 overflow {q.dtype} "
                f"(max |q - c|, |k - c| = {float(m):.3g} with c the mean key, min h = "
                f"{float(h.amin()):.3g}); rescale q and k, increase the bandwidth or use float64"
            )
    logw = None
    w = combine_key_weights(fn, key_padding_mask, key_weights, (*lead, Nk), k.dtype, k.device,
                            check_values=values, differentiable=True)
    if w is not None:
        logw = torch.where(w > 0, w.clamp_min(1e-300).log(), torch.full_like(w, -math.inf))
    return bandwidth_tensor(bandwidth, q), logw, kappa > KAPPA_EXPANDED[q.dtype]


def _graph_mode(*xs) -> bool:
    """Under torch.compile / torch.jit tracing / torch.func.vmap: no value checks."""
    f = getattr(getattr(torch._C, "_functorch", None), "is_batchedtensor", None)
    return skip_value_checks() or (
        f is not None and any(isinstance(x, Tensor) and f(x) for x in xs))


def bandwidth_tensor(bandwidth, like: Tensor) -> Tensor:
    """The bandwidth as a tensor of ``like``'s dtype and device (differentiable)."""
    if isinstance(bandwidth, Tensor):
        return bandwidth.to(dtype=like.dtype, device=like.device)
    return torch.tensor(float(bandwidth), dtype=like.dtype, device=like.device)


def nadaraya_watson_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    kernel: str = "gaussian",
    bandwidth=1.0,
    key_padding_mask: Tensor | None = None,
    key_weights: Tensor | None = None,
) -> Tensor:
    r"""Nadaraya–Watson kernel attention :math:`o_i = \sum_j \alpha(q_i, k_j)\, v_j` (paper 001).

    Args:
        q: queries ``(..., N_q, d)``; k: keys ``(..., N_k, d)``; v: values ``(..., N_k, D)``.
        kernel: ``"gaussian"``, ``"boxcar"`` or ``"epanechnikov"``.
        bandwidth: :math:`h > 0`, a number or a tensor broadcastable to the leading dims.
        key_padding_mask: bool, ``True`` = ignore the key (shape ``(B, N_k)`` for
            ``(B, H, N, d)`` inputs, or broadcastable to ``(..., N_k)``).
        key_weights: quadrature weights :math:`w_j \ge 0` broadcastable to ``(..., N_k)``.

    Returns:
        ``(..., N_q, D)``; 0 for a query with no key in the kernel's support.
    """
    h, logw, difference = _check(q, k, v, kernel, bandwidth, key_padding_mask, key_weights)
    return evaluate(q, k, v, kernel, h, logw, difference=difference)


def _sq_distances(q: Tensor, k: Tensor, hb) -> Tensor:
    """``|q_i - k_j|^2 / h^2`` ``(..., M, N_k)`` from the differences of the inputs."""
    d = (q.unsqueeze(-2) - k.unsqueeze(-3)) / (hb.unsqueeze(-1) if hb.dim() else hb)
    return (d * d).sum(-1)


def evaluate(q: Tensor, k: Tensor, v: Tensor, kernel: str, h: Tensor,
             logw: Tensor | None = None, *, difference: bool = False) -> Tensor:
    r"""The evaluation of :func:`nadaraya_watson_attention` without its input validation:
    ``h`` a tensor broadcastable to the leading dims (``> 0``), ``logw`` the log key weights
    ``(..., N_k)`` (``-inf`` = masked) or ``None``; ``difference``: the Gaussian kernel from
    the differences ``q_i - k_j`` (the compact kernels always are; module docstring).  Free
    of data-dependent Python control flow, so it runs under ``torch.func.vmap`` (for
    operators whose inputs are validated where they enter the model)."""
    lead = q.shape[:-2]
    hb = h.expand(lead).unsqueeze(-1).unsqueeze(-1) if h.dim() else h  # (..., 1, 1)
    if kernel != "gaussian" or difference:
        return _evaluate_difference(q, k, v, kernel, hb, logw)
    # the kernel depends on (q - k)/h only: centre on the mean key and divide by h first,
    # so that no intermediate is larger than the scaled distances themselves
    c = k.mean(-2, keepdim=True)
    q = (q - c) / hb
    k = (k - c) / hb
    if q.dtype == torch.float32:
        # exp(-|q-k|^2/2) = exp(-|q|^2/2) * exp(<q,k>) * exp(-|k|^2/2): softmax attention
        # with scale 1 and the additive mask -|k|^2/2 + log w
        bias = -(k * k).sum(-1) / 2  # (..., N_k)
        if logw is not None:
            bias = bias + logw
        mask = bias.unsqueeze(-2)  # (..., 1, N_k)
        out = sdpa(q, k, v, attn_mask=mask, scale=1.0)
        if logw is not None:
            # a row whose keys are all masked: SDPA gives NaN; opsplit's convention is 0
            empty = torch.isinf(logw).all(-1).unsqueeze(-1).unsqueeze(-1)
            out = torch.where(empty, torch.zeros_like(out), out)
        return out
    Nq, Nk = q.shape[-2], k.shape[-2]
    step = max(1, _SLICE_ELEMS // max(1, Nk))
    kk = (k * k).sum(-1).unsqueeze(-2)  # (..., 1, N_k)
    outs = []
    for q0 in range(0, Nq, step):
        qs = q[..., q0 : q0 + step, :]
        # the same identity, as an explicit softmax (float64: SDPA on the CPU rounds it)
        lg = (qs @ k.transpose(-1, -2)) - kk / 2
        outs.append(_softmax_rows(lg, logw, v))
    return torch.cat(outs, dim=-2) if len(outs) > 1 else outs[0]


def _softmax_rows(lg: Tensor, logw: Tensor | None, v: Tensor) -> Tensor:
    """``softmax(lg + log w) @ v`` over the keys, 0 for a row whose keys are all masked."""
    if logw is not None:
        lg = lg + logw.unsqueeze(-2)
    mx = lg.amax(-1, keepdim=True)
    mx = torch.where(torch.isfinite(mx), mx, torch.zeros_like(mx))
    return _normalised(torch.exp(lg - mx), v)


def _normalised(Kx: Tensor, v: Tensor) -> Tensor:
    den = Kx.sum(-1, keepdim=True)
    safe = torch.where(den > 0, den, torch.ones_like(den))
    return torch.where(den > 0, (Kx @ v) / safe, torch.zeros((), dtype=v.dtype, device=v.device))


def _evaluate_difference(q: Tensor, k: Tensor, v: Tensor, kernel: str, hb, logw: Tensor | None) -> Tensor:
    """:func:`evaluate` with the squared distances from the differences ``q_i - k_j``
    (module docstring), in slices of queries of at most ``_SLICE_ELEMS / (N_k d)`` rows."""
    Nq, Nk, d = q.shape[-2], k.shape[-2], q.shape[-1]
    step = max(1, _SLICE_ELEMS // max(1, Nk * d))
    outs = []
    for q0 in range(0, Nq, step):
        d2 = _sq_distances(q[..., q0 : q0 + step, :], k, hb)
        if kernel == "gaussian":
            outs.append(_softmax_rows(-d2 / 2, logw, v))
            continue
        if kernel == "epanechnikov":  # K(r/h) from r^2 (no square root: smooth in q, k)
            Kx = 0.75 * (1 - d2).clamp_min(0)
        else:
            Kx = 0.5 * (d2 <= 1).to(q.dtype)
        if logw is not None:
            Kx = Kx * logw.exp().unsqueeze(-2)
        outs.append(_normalised(Kx, v))
    return torch.cat(outs, dim=-2) if len(outs) > 1 else outs[0]
