"""Naive, loop-based transcriptions of the attention formulas, independent of opsplit's code.

* :func:`naive_multihead` — paper 002 eq. (38) discretised with explicit quadrature weights:
  per head, the value kernel is the folded product W^V_m W^O_m; the softmax is written out
  with exp and the key weights (no SDPA, no log-weights).
* :func:`naive_relu_attention` — seed 000 eq. (13) in seed 000's own convention (tokens as
  columns: alpha(X) = V(X) ReLU(K(X)^T Q(X))), heads summed through W^O.
"""

from __future__ import annotations

import torch


def naive_multihead(u, WQ, WK, WV, WO=None, bQ=None, bK=None, bV=None, bO=None, *, scale, wy=None, wk=None,
                    wh=None, memory=None, allowed=None, bias=None, qk_weights=None):
    """u (B, N, Ny); kernels (Ny, H, d); WO (H, dv, Ny) or None (identity); wy (Ny,) y-weights;
    wk (Nk,) key weights; wh (H,) head weights; allowed (B, H, N, Nk) bool; bias additive.
    qk_weights (dk,) weights of the score inner product (paper eq. 37), else plain sums."""
    src = u if memory is None else memory
    B, N, Ny = u.shape
    Nk = src.shape[1]
    H = WQ.shape[1]
    dt = u.dtype
    wy = torch.ones(Ny, dtype=dt) if wy is None else wy
    wk = torch.ones(Nk, dtype=dt) if wk is None else wk
    wh = torch.ones(H, dtype=dt) if wh is None else wh
    out = torch.zeros(B, N, WQ.shape[0] if WO is None else WO.shape[2], dtype=dt)
    for m in range(H):
        Wv = WV[:, m, :] if WO is None else WV[:, m, :] @ WO[m]  # folded value kernel (Ny, Ny)
        bv = None
        if bV is not None:
            bv = bV[m] if WO is None else bV[m] @ WO[m]
        for b in range(B):
            for x in range(N):
                num = torch.zeros(out.shape[2], dtype=dt)
                den = torch.zeros((), dtype=dt)
                q = sum(wy[xi] * WQ[xi, m, :] * u[b, x, xi] for xi in range(Ny))
                if bQ is not None:
                    q = q + bQ[m]
                for j in range(Nk):
                    if allowed is not None and not allowed[b, m, x, j]:
                        continue
                    k = sum(wy[xi] * WK[xi, m, :] * src[b, j, xi] for xi in range(Ny))
                    if bK is not None:
                        k = k + bK[m]
                    qk = (q * k * qk_weights).sum() if qk_weights is not None else (q * k).sum()
                    a = scale * qk
                    if bias is not None:
                        a = a + bias[b, m, x, j]
                    e = torch.exp(a) * wk[j]
                    v = sum(wy[xi] * Wv[xi, :] * src[b, j, xi] for xi in range(Ny))
                    if bv is not None:
                        v = v + bv
                    num = num + e * v
                    den = den + e
                out[b, x] += wh[m] * num / den
    if bO is not None:
        out = out + bO
    return out


def naive_relu_attention(X, AQ, AK, AV, BQ=None, BK=None, BV=None, *, WO, scale=1.0, Y=None, causal=False):
    """Seed 000 eq. (13), tokens as columns.  X (n, p) keys/values input, Y (r, p') queries
    input (Y = X for self-attention); AQ, AK (H, d, n), AV (H, dv, n); biases (H, d) added to
    every column; WO (H, dv, n_out): head outputs are mapped and summed."""
    Y = X if Y is None else Y
    H = AQ.shape[0]
    outs = 0
    for m in range(H):
        Q = AQ[m] @ Y + (0 if BQ is None else BQ[m][:, None])
        K = AK[m] @ X + (0 if BK is None else BK[m][:, None])
        V = AV[m] @ X + (0 if BV is None else BV[m][:, None])
        S = scale * (K.T @ Q)  # (p_keys, p_queries)
        if causal:  # mask(X)_ij = -inf for key i after query j
            p = S.shape[0]
            S = torch.where(torch.arange(p)[:, None] > torch.arange(S.shape[1])[None, :], torch.zeros_like(S), S)
            S = torch.clamp(S, min=0)
        else:
            S = torch.clamp(S, min=0)
        head = V @ S  # (dv, p_queries)
        outs = outs + WO[m].T @ head
    return outs  # (n_out, p_queries)
