"""Naive O(N_q N_k) transcriptions of paper 004's eqs. (2), (3) and (7), for the tests.

Written directly from the equations (a dense N_q x N_k kernel matrix), independent of the
sorted prefix-sum implementation in opsplit.functional.
"""

import torch


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
