r"""Direct transcriptions of the papers' discrete formulas, written from the equations and
independent of opsplit's implementation: an independent check of opsplit's operators and
schemes (the tests compare against them; ``benchmarks/paper_float32.py`` and
``benchmarks/attention_magnitudes.py`` measure rounding against them).  Plain tensor
arithmetic, no opsplit import.

**Paper 002's discrete transformer**, eqs. (27)-(35) (:func:`paper_transformer`,
:func:`paper_step`; L = N, Delta t = 1).  One step u^n -> u^{n+1} (M = 4 + J substeps)::

    Q = u W^Q, K = u W^K, V = u W^V                                   (27)
    Softmax_dis(A)_{k,l} = exp(a_kl) / sum_l exp(a_kl)                 (28)
    u^{1/M} = u^0 + Softmax_dis(s Q K^T) V                             (29)
    alpha_k = (1/L_y) sum_l v_kl, beta_k = (1/L_y) sum_l (v_kl - alpha_k)^2   (30)
    u^{2/M} = sigma_2 (u^{1/M} - alpha)/sqrt(beta) + sigma_1           (31)
    ubar^{(2+j)/M} = u^{(1+j)/M} + u^{(1+j)/M} W_j + b_j   (b_j per token, row k)  (34)
    u^{(2+j)/M} = ReLU(ubar^{(2+j)/M})                                 (35)
    u^{(3+J)/M} = (u^{(2+J)/M} + u^{2/M}) / 2                           (33)
    u^{1} = sigma_2 (u^{(3+J)/M} - alpha)/sqrt(beta) + sigma_1          (32)

Eq. (29) is printed without a score scale; eq. (19) has 1/sqrt(|Omega_y|) = 1/sqrt(L_y).
``scale`` selects which (1.0 is (29) literally).

**Paper 004's sliced attention**, eqs. (2), (3) and (7) (:func:`naive_sliced_relu`,
:func:`naive_sliced_bump`): naive O(N_q N_k) sums over a dense N_q x N_k kernel matrix,
independent of the sorted prefix sums of :mod:`opsplit.functional`; :func:`causal` and
:func:`causal_rescaled` make a causal kernel's reference from a full one, one query at a
time.
"""

from __future__ import annotations

import torch

__all__ = ["softmax_dis", "layer_norm_31", "paper_step", "paper_transformer", "naive_sliced_relu",
           "naive_sliced_bump", "causal", "causal_rescaled"]


# -- paper 002, eqs. (27)-(35) --------------------------------------------------------------------
def softmax_dis(A):
    # (28), with the row maximum subtracted (exact in exact arithmetic)
    E = torch.exp(A - A.max(dim=-1, keepdim=True).values)
    return E / E.sum(dim=-1, keepdim=True)


def layer_norm_31(v, s1, s2, L_y):
    alpha = v.sum(-1, keepdim=True) / L_y
    beta = ((v - alpha) ** 2).sum(-1, keepdim=True) / L_y
    return s2 * (v - alpha) / torch.sqrt(beta) + s1


def paper_step(u0, WQ, WK, WV, Ws, bs, s1, s2, scale):
    L_y = u0.shape[-1]
    Q, K, V = u0 @ WQ, u0 @ WK, u0 @ WV  # (27)
    u1 = u0 + softmax_dis(scale * Q @ K.transpose(-1, -2)) @ V  # (29)
    u2 = layer_norm_31(u1, s1, s2, L_y)  # (31)
    v = u2
    for W, b in zip(Ws, bs):
        vbar = v + v @ W + b[:, None]  # (34): z_{k,l} = (vW)_{k,l} + b_k
        v = torch.relu(vbar)  # (35)
    u3 = 0.5 * (v + u2)  # (33)
    return layer_norm_31(u3, s1, s2, L_y)  # (32)


def paper_transformer(f, weights, scale):
    """``weights``: list over steps of dicts with WQ, WK, WV, Ws, bs, s1, s2."""
    u = f
    for w in weights:
        u = paper_step(u, w["WQ"], w["WK"], w["WV"], w["Ws"], w["bs"], w["s1"], w["s2"], scale)
    return u


# -- paper 004, eqs. (2), (3), (7) ----------------------------------------------------------------
def _weights(zk, key_padding_mask=None, key_weights=None):
    w = torch.ones_like(zk)
    if key_weights is not None:
        w = w * key_weights
    if key_padding_mask is not None:
        m = key_padding_mask
        if m.dim() == 2 and zk.dim() == 3:
            m = m.unsqueeze(1)
        w = w * (~m).to(zk.dtype)
    return w


def naive_sliced_relu(zq, zk, v, centered=True, key_padding_mask=None, key_weights=None):
    """eq. (3) (eq. (2) if not centered): sum_j w_j relu(zq_i - zk_j)(v_j - vbar) / sum_l w_l |zq_i - zk_l|,
    with 0 where the denominator vanishes."""
    w = _weights(zk, key_padding_mask, key_weights)
    diff = zq.unsqueeze(-1) - zk.unsqueeze(-2)  # (..., Nq, Nk)
    num_k = torch.relu(diff) * w.unsqueeze(-2)
    den = (diff.abs() * w.unsqueeze(-2)).sum(-1, keepdim=True)
    if centered:
        W = w.sum(-1, keepdim=True)
        vbar = (w.unsqueeze(-1) * v).sum(-2, keepdim=True) / W.unsqueeze(-1).clamp_min(1e-300)
        v = v - vbar
    num = num_k @ v
    safe = torch.where(den > 0, den, torch.ones_like(den))
    return torch.where(den > 0, num / safe, torch.zeros_like(num))


def naive_sliced_bump(zq, zk, v, bandwidth, key_padding_mask=None, key_weights=None):
    """eq. (7): (1/sum w) sum_j w_j relu(1 - |zq_i - zk_j| / b) v_j."""
    w = _weights(zk, key_padding_mask, key_weights)
    b = torch.as_tensor(bandwidth, dtype=zq.dtype, device=zq.device)
    b = b.expand(zq.shape[:-1]).unsqueeze(-1).unsqueeze(-1)
    diff = zq.unsqueeze(-1) - zk.unsqueeze(-2)
    K = torch.relu(1 - diff.abs() / b) * w.unsqueeze(-2)
    W = w.sum(-1, keepdim=True).unsqueeze(-1)
    out = (K @ v)
    return torch.where(W > 0, out / torch.where(W > 0, W, torch.ones_like(W)), torch.zeros_like(out))


def causal(naive, zq, zk, v, **kw):
    """A causal kernel's reference from a full one: query i is ``naive`` over the keys
    l <= i + N_k - N_q (0 if there is none), one query at a time."""
    Nq, Nk = zq.shape[-1], zk.shape[-1]
    out = torch.zeros(*zq.shape, v.shape[-1], dtype=v.dtype, device=v.device)
    for i in range(Nq):
        t = i + Nk - Nq
        if t >= 0:
            out[..., i : i + 1, :] = naive(zq[..., i : i + 1], zk[..., : t + 1], v[..., : t + 1, :], **kw)
    return out


def causal_rescaled(naive, zq, zk, v, key_weights, **kw):
    """:func:`causal` with the key weights of every query divided by the largest weight it
    sees (in float64; the outputs are of degree 0 in the weights, so this is the same
    formula), so that weights spread over 1e-300 .. 1e300 neither overflow nor underflow
    the reference's sums.  ``key_weights`` of the shape of ``zk``."""
    Nq, Nk = zq.shape[-1], zk.shape[-1]
    out = torch.zeros(*zq.shape, v.shape[-1], dtype=v.dtype, device=v.device)
    for i in range(Nq):
        t = i + Nk - Nq
        if t >= 0:
            w = key_weights[..., : t + 1]
            m = w.amax(-1, keepdim=True)
            w = torch.where(m > 0, w / torch.where(m > 0, m, 1.0), 0.0)
            out[..., i : i + 1, :] = naive(zq[..., i : i + 1], zk[..., : t + 1], v[..., : t + 1, :],
                                           key_weights=w, **kw)
    return out
