"""A direct transcription of paper 002's discrete transformer, eqs. (27)-(35), written
independently of opsplit (plain tensor arithmetic, L = N, Delta t = 1).

One step u^n -> u^{n+1} (M = 4 + J substeps):

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
"""

import torch


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
