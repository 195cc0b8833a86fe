r"""Converters between torch's transformer modules and opsplit's torch-exact propagators.

``from_torch(module)`` takes an ``nn.TransformerEncoderLayer``, ``nn.TransformerEncoder``,
``nn.TransformerDecoderLayer``, ``nn.TransformerDecoder`` (or an ``nn.MultiheadAttention``,
giving a :class:`~opsplit.operators.MultiHeadAttention` operator) and returns the opsplit
model with the same weights, whose ``forward`` takes the same inputs and returns the same
outputs (to round-off).  ``to_torch(model)`` goes back, so a model trained in opsplit runs
in plain torch.

Weight layouts (per layer :math:`n`, i.e. per piece of the piecewise-constant controls):

=================================  ==========================================================
torch                              opsplit (kernel orientation: rows integrate)
=================================  ==========================================================
``in_proj_weight[:E]`` (H·d, E)     ``WQ`` (E, H, d) = ``W.T.reshape(E, H, d)`` (same for K, V)
``in_proj_bias[:E]``                ``bQ`` (H, d)
``out_proj.weight`` (E, H·d)        ``WO`` (H, d, E) = ``W.T.reshape(H, d, E)``
``linear1.weight`` (F, E)           ``W1`` (E, F) = ``W.T``
``linear2.weight`` (E, F)           ``W2`` (F, E) = ``W.T``
``normK.weight`` / ``.bias``        the affine map of the K-th LayerNorm substep, with the
                                   projection's :math:`\sigma_1, \sigma_2` folded in
                                   (weight :math:`\gamma\sigma_2`, bias
                                   :math:`\gamma\sigma_1 + \beta`: a pure copy at 0, 1)
``normK.eps``                       the K-th LayerNorm projection's ``eps``
=================================  ==========================================================

``to_torch`` exports what the model computes, or refuses what torch's layers cannot hold: a
substep solver other than explicit Euler, a scheme other than Lie, a score scale other than
:math:`1/\sqrt{d}`, :math:`\sigma` of a LayerNorm without weight (or a nonzero
:math:`\sigma_1` without bias), another :math:`N_t` or time step.

What is not converted (a clear error names it): activations other than ReLU/GELU,
``add_bias_kv``, ``add_zero_attn``, ``kdim``/``vdim`` different from ``d_model``, mixed
bias settings, LayerNorms of different ``eps`` within a layer, layers of a stack that differ
in configuration, a final ``norm`` that is not an ``nn.LayerNorm``, subclasses of the torch
modules (their ``forward`` may differ; pass ``strict=False`` to convert them anyway), and
modules with forward hooks.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .._checks import check_finite, check_float_dtype, check_shape, check_tensor
from ..controls import Constant, PiecewiseConstant
from ..operators import MultiHeadAttention
from ..operators.activation import activation_fn
from ..schemes import Lie
from ..solvers import ExplicitEuler
from .hf import _one_dtype_device
from .torch_exact import TorchDecoder, TorchEncoder

__all__ = ["from_torch", "to_torch", "torch_state_dict", "load_torch_state_dict"]

_ENC_LAYER = nn.TransformerEncoderLayer
_DEC_LAYER = nn.TransformerDecoderLayer


# -- reading torch modules -----------------------------------------------------------------
def _activation_name(act, where: str) -> str:
    if isinstance(act, str):
        if act in ("relu", "gelu"):
            return act
    if act is F.relu or isinstance(act, nn.ReLU):
        return "relu"
    if act is F.gelu:
        return "gelu"
    if isinstance(act, nn.GELU):
        return "gelu" if act.approximate == "none" else "gelu_tanh"
    if isinstance(act, functools.partial) and act.func is F.gelu and act.keywords.get("approximate") == "tanh":
        return "gelu_tanh"
    raise ValueError(
        f"{where}: unsupported activation {act!r}; opsplit converts relu and gelu "
        "(F.relu, F.gelu, nn.ReLU, nn.GELU(approximate='none'|'tanh'))"
    )


def _check_mha(mha: nn.MultiheadAttention, where: str, d_model: int) -> None:
    if not isinstance(mha, nn.MultiheadAttention):
        raise TypeError(f"{where}: expected an nn.MultiheadAttention, got {type(mha).__name__}")
    if mha.bias_k is not None or mha.bias_v is not None:
        raise ValueError(f"{where}: add_bias_kv=True is not supported (extra learned key/value tokens)")
    if mha.add_zero_attn:
        raise ValueError(f"{where}: add_zero_attn=True is not supported (an extra zero key/value token)")
    if mha.embed_dim != d_model or mha.kdim != d_model or mha.vdim != d_model:
        raise ValueError(
            f"{where}: embed_dim/kdim/vdim = {mha.embed_dim}/{mha.kdim}/{mha.vdim}; opsplit converts "
            f"attention with kdim = vdim = embed_dim = d_model = {d_model}"
        )


def _mha_weights(mha: nn.MultiheadAttention):
    """(Wq, Wk, Wv) in torch layout (out, in) and (bq, bk, bv) or None."""
    E = mha.embed_dim
    if mha._qkv_same_embed_dim:
        W = mha.in_proj_weight
        Wq, Wk, Wv = W[:E], W[E : 2 * E], W[2 * E :]
    else:
        Wq, Wk, Wv = mha.q_proj_weight, mha.k_proj_weight, mha.v_proj_weight
    b = mha.in_proj_bias
    bs = (None, None, None) if b is None else (b[:E], b[E : 2 * E], b[2 * E :])
    return (Wq, Wk, Wv), bs


def _has_hooks(module: nn.Module) -> bool:
    return any(
        len(getattr(m, "_forward_hooks", {})) + len(getattr(m, "_forward_pre_hooks", {}))
        for m in module.modules()
    )


def _layer_config(layer, where: str, strict: bool) -> dict:
    decoder = isinstance(layer, _DEC_LAYER)
    kind = _DEC_LAYER if decoder else _ENC_LAYER
    if strict and type(layer) is not kind:
        raise TypeError(
            f"{where}: {type(layer).__name__} is a subclass of {kind.__name__} whose forward may differ; "
            "pass strict=False to convert it as a plain " + kind.__name__
        )
    E = layer.self_attn.embed_dim
    _check_mha(layer.self_attn, f"{where}.self_attn", E)
    if decoder:
        _check_mha(layer.multihead_attn, f"{where}.multihead_attn", E)
    norms = [layer.norm1, layer.norm2] + ([layer.norm3] if decoder else [])
    for k, nrm in enumerate(norms, 1):
        _check_layer_norm(nrm, f"{where}.norm{k}", E, strict)
    eps = {float(n.eps) for n in norms}
    if len(eps) != 1:
        raise ValueError(f"{where}: LayerNorms with different eps {sorted(eps)} are not supported")
    norm_flags = {f"norm{k}": _norm_flags(n) for k, n in enumerate(norms, 1)}
    if len(set(norm_flags.values())) != 1:
        shown = {k: f"elementwise_affine={a}, bias={b}" for k, (a, b) in norm_flags.items()}
        raise ValueError(f"{where}: the LayerNorms of a layer must share elementwise_affine and bias, got {shown}")
    norm_affine, norm_bias = norm_flags["norm1"]
    for name in ("linear1", "linear2"):
        if type(getattr(layer, name)) is not nn.Linear and strict:
            raise TypeError(f"{where}.{name}: expected nn.Linear, got {type(getattr(layer, name)).__name__}")
    mhas = [layer.self_attn] + ([layer.multihead_attn] if decoder else [])
    biases = {
        "linear1.bias": layer.linear1.bias is not None,
        "linear2.bias": layer.linear2.bias is not None,
        **{f"attn{k}.in_proj_bias": m.in_proj_bias is not None for k, m in enumerate(mhas)},
        **{f"attn{k}.out_proj.bias": m.out_proj.bias is not None for k, m in enumerate(mhas)},
    }
    if len(set(biases.values())) != 1:
        raise ValueError(
            f"{where}: mixed bias settings of the linear maps are not supported (all with or all without "
            f"bias): {biases}"
        )
    # torch: dropout1/2(/3) after each sub-block (the residual dropout), layer.dropout on the
    # FFN's hidden activation, MultiheadAttention.dropout on the attention weights
    res = {f"dropout{k}.p": float(getattr(layer, f"dropout{k}").p) for k in ((1, 2, 3) if decoder else (1, 2))}
    if len(set(res.values())) != 1:
        raise ValueError(f"{where}: different residual dropout probabilities {res} are not supported")
    att = {f"attn{k}.dropout": float(m.dropout) for k, m in enumerate(mhas)}
    if len(set(att.values())) != 1:
        raise ValueError(f"{where}: different attention dropout probabilities {att} are not supported")
    return dict(
        d_model=E,
        nhead=layer.self_attn.num_heads,
        dim_feedforward=layer.linear1.out_features,
        dropout=next(iter(res.values())),
        attention_dropout=next(iter(att.values())),
        activation_dropout=float(layer.dropout.p),
        activation=_activation_name(layer.activation, f"{where}.activation"),
        layer_norm_eps=eps.pop(),
        batch_first=bool(layer.self_attn.batch_first),
        norm_first=bool(layer.norm_first),
        bias=next(iter(biases.values())),
        norm_affine=norm_affine,
        norm_bias=norm_bias,
    )


def _norm_flags(norm: nn.LayerNorm) -> tuple[bool, bool]:
    """(has a weight, has a bias): torch's (elementwise_affine, bias and elementwise_affine)."""
    return norm.weight is not None, norm.bias is not None


def _check_layer_norm(norm, where: str, E: int, strict: bool = True) -> None:
    if not isinstance(norm, nn.LayerNorm) or (strict and type(norm) is not nn.LayerNorm):
        raise ValueError(f"{where}: expected nn.LayerNorm(d_model={E}), got {norm!r}")
    if tuple(norm.normalized_shape) != (E,):
        raise ValueError(f"{where}: expected nn.LayerNorm(d_model={E}), got normalized_shape {tuple(norm.normalized_shape)}")
    if norm.weight is None and norm.bias is not None:
        raise ValueError(f"{where}: a LayerNorm with a bias but no weight is not supported")


# -- the weight map ----------------------------------------------------------------------
def _value(c, n: int, grad: bool) -> Tensor | None:
    """Piece ``n`` of a control (or its gradient)."""
    if isinstance(c, PiecewiseConstant):
        if c.positive:
            raise ValueError("torch weights cannot come from a log-parametrised (positive) control")
        if grad:
            return None if c.raw.grad is None else c.raw.grad[n]
        return c.raw[n]
    if isinstance(c, Constant):
        if grad:
            v = c.value
            return None if not isinstance(v, nn.Parameter) or v.grad is None else v.grad
        return c.value
    if isinstance(c, nn.Parameter):
        return c.grad if grad else c
    raise TypeError(f"cannot read torch weights from a {type(c).__name__} control (expected piecewise-constant)")


@torch.no_grad()
def _assign(c, n: int, value: Tensor) -> None:
    if isinstance(c, PiecewiseConstant):
        c.raw[n].copy_(value)
    elif isinstance(c, Constant):
        c.value.copy_(value)
    elif isinstance(c, nn.Parameter):
        c.copy_(value)
    else:
        raise TypeError(f"cannot write torch weights into a {type(c).__name__} control")


def _pairs_mha(op: MultiHeadAttention, prefix: str):
    """(torch name, (opsplit controls...), to_torch(values), to_opsplit(tensor) -> values)."""
    E = op.WQ.shape[0]
    H, d = op.WQ.shape[1], op.WQ.shape[2]

    def w_to_torch(*ws):
        return torch.cat([w.reshape(E, H * d).t() for w in ws], 0)

    def w_to_ops(W):
        return [W[k * E : (k + 1) * E].t().reshape(E, H, d) for k in range(3)]

    out = [(prefix + "in_proj_weight", (op.WQ, op.WK, op.WV), w_to_torch, w_to_ops)]
    if op.bQ is not None:
        out.append(
            (
                prefix + "in_proj_bias", (op.bQ, op.bK, op.bV),
                lambda *bs: torch.cat([b.reshape(-1) for b in bs]),
                lambda b: [b[k * E : (k + 1) * E].reshape(H, d) for k in range(3)],
            )
        )
    out.append(
        (prefix + "out_proj.weight", (op.WO,), lambda w: w.reshape(H * d, E).t(), lambda W: [W.t().reshape(H, d, E)])
    )
    if op.bO is not None:
        out.append((prefix + "out_proj.bias", (op.bO,), lambda b: b, lambda b: [b]))
    return out


def _pairs_ffn(ffn, prefix: str = ""):
    T = lambda w: w.t()  # noqa: E731
    out = [(prefix + "linear1.weight", (ffn.W1,), T, lambda W: [W.t()])]
    if ffn.b1 is not None:
        out.append((prefix + "linear1.bias", (ffn.b1,), lambda b: b, lambda b: [b]))
    out.append((prefix + "linear2.weight", (ffn.W2,), T, lambda W: [W.t()]))
    if ffn.b2 is not None:
        out.append((prefix + "linear2.bias", (ffn.b2,), lambda b: b, lambda b: [b]))
    return out


def _pairs_norm(aff, name: str):
    """A LayerNorm's weight and bias (those it has; none without elementwise_affine)."""
    I = lambda v: v  # noqa: E731
    out = []
    if aff is not None and aff.weight is not None:
        out.append((name + ".weight", (aff.weight,), I, lambda v: [v]))
    if aff is not None and aff.bias is not None:
        out.append((name + ".bias", (aff.bias,), I, lambda v: [v]))
    return out


def _pairs(model, stacked: bool):
    """[(layer index or None, torch name, controls, to_torch, to_opsplit)] for every weight."""
    pairs = []
    for n in range(model.num_layers):
        p = f"layers.{n}." if stacked else ""
        if isinstance(model, TorchEncoder):
            items = _pairs_mha(model.attention, p + "self_attn.") + _pairs_ffn(model.ffn, p)
            items += _pairs_norm(model.norm(1), p + "norm1") + _pairs_norm(model.norm(2), p + "norm2")
        else:
            items = _pairs_mha(model.self_attention, p + "self_attn.")
            items += _pairs_mha(model.cross_attention, p + "multihead_attn.") + _pairs_ffn(model.ffn, p)
            for k in (1, 2, 3):
                items += _pairs_norm(model.norm(k), p + f"norm{k}")
        pairs += [(n, *it) for it in items]
    if model.final_norm is not None:
        pairs += [(None, *it) for it in _pairs_norm(model.final_affine, "norm")]
    return pairs


def _kind(model, kind: str | None) -> str:
    """'layer' or 'stack': given, else the torch type the model came from, else a layer for
    one layer without a final norm."""
    if kind is None:
        src = getattr(model, "torch_source", None)
        if src is not None:
            return "stack" if src in ("TransformerEncoder", "TransformerDecoder") else "layer"
        return "stack" if model.num_layers > 1 or model.final_norm is not None else "layer"
    if kind not in ("layer", "stack"):
        raise ValueError(f"kind: expected 'layer' or 'stack', got {kind!r}")
    if kind == "layer" and (model.num_layers != 1 or model.final_norm is not None):
        raise ValueError(
            f"a single torch layer cannot hold {model.num_layers} layers"
            + (" and a final norm" if model.final_norm is not None else "")
        )
    return kind


def _split_norm(norm):
    """``(projection, affine)`` of a LayerNorm as the model holds it: a fused
    :class:`~opsplit.operators.PointwiseAffine` with its projection, or ``[projection]`` /
    ``[projection, affine]`` (unfused)."""
    if isinstance(norm, (list, tuple, nn.ModuleList)):
        return norm[0], (norm[1] if len(norm) > 1 else None)
    return norm.projection, norm


def _norm_maps(model, stacked: bool) -> list:
    """``(where, [torch names of the norm], projection, affine)`` for every LayerNorm: the
    layers' ``norm{k}`` (one map for all layers) and the final ``norm``."""
    out = []
    for k, norm in enumerate(model._parts["norms"], 1):
        P, aff = _split_norm(norm)
        names = [f"layers.{n}.norm{k}" for n in range(model.num_layers)] if stacked else [f"norm{k}"]
        out.append((f"norm{k}", names, P, aff))
    if model.final_norm is not None:
        out.append(("final norm", ["norm"], model.final_projection, model.final_affine))
    return out


def _sigmas(P, where: str) -> tuple:
    """``(sigma_1, sigma_2)`` of a LayerNorm's S1 projection (constant scalars: torch's
    LayerNorm has no time-dependent ones)."""
    vals = []
    for name in ("sigma1", "sigma2"):
        c = getattr(P, name)
        if not isinstance(c, Constant) or c.value.dim() != 0:
            raise ValueError(f"{where}.{name}: expected a constant scalar, got {type(c).__name__}; torch's LayerNorm "
                             "has one weight and bias per layer")
        vals.append(c.value.detach())
    return tuple(vals)


def _fold_sigmas(model, out: dict, stacked: bool, grads: bool) -> None:
    r"""The norms' :math:`\sigma_1, \sigma_2` (0 and 1 from ``from_torch``: nothing to do)
    folded into torch's LayerNorm weight and bias as the fused forward folds them — weight
    :math:`\gamma\sigma_2`, bias :math:`\gamma\sigma_1 + \beta` — or, for gradients, their
    gradients with respect to those (``(g_\gamma - \sigma_1 g_\beta)/\sigma_2``, ``g_\beta``);
    a norm torch cannot hold them in (no weight, or no bias for a nonzero :math:`\sigma_1`)
    is refused."""
    for where, names, P, aff in _norm_maps(model, stacked):
        s1, s2 = _sigmas(P, f"torch_state_dict: {where}")
        if float(s1) == 0.0 and float(s2) == 1.0:
            continue
        has_w, has_b = aff is not None and aff.weight is not None, aff is not None and aff.bias is not None
        if not has_w or (float(s1) != 0.0 and not has_b):
            raise ValueError(f"torch_state_dict: {where}: sigma1 = {float(s1):g}, sigma2 = {float(s2):g}; torch's "
                             f"LayerNorm{'' if has_w else ' without elementwise_affine'}"
                             f"{' without bias' if has_w and not has_b else ''} cannot hold them (it is "
                             "the S1(0, 1) projection then its affine map)")
        for name in names:
            w, b = out[name + ".weight"], out.get(name + ".bias")
            if w is None:
                continue
            t1, t2 = s1.to(w.dtype), s2.to(w.dtype)
            if grads:
                out[name + ".weight"] = (w - t1 * b) / t2 if b is not None else w / t2
            else:
                out[name + ".weight"] = w * t2
                if b is not None:
                    out[name + ".bias"] = w * t1 + b


def _unfold_sigmas(model, state: dict, stacked: bool) -> dict:
    r"""torch's LayerNorm weight and bias as the model's :math:`\gamma, \beta` given its norms'
    :math:`\sigma` (:func:`_fold_sigmas` inverted; a copy of ``state``)."""
    state = dict(state)
    for where, names, P, aff in _norm_maps(model, stacked):
        s1, s2 = _sigmas(P, f"load_torch_state_dict: {where}")
        if (float(s1) == 0.0 and float(s2) == 1.0) or aff is None or aff.weight is None:
            continue
        for name in names:
            w = state[name + ".weight"]
            g = w / s2.to(w.dtype)
            state[name + ".weight"] = g
            if name + ".bias" in state:
                state[name + ".bias"] = state[name + ".bias"] - g * s1.to(w.dtype)
    return state


def torch_state_dict(model, *, grads: bool = False, kind: str | None = None) -> dict[str, Tensor]:
    """The model's weights (or their gradients, ``grads=True``) under torch's names and
    layouts (``nn.TransformerEncoderLayer`` names for ``kind="layer"``, ``layers.{n}.…`` and
    ``norm.…`` for ``kind="stack"``; default as :func:`to_torch`).  A weight with no
    gradient yet maps to ``None``."""
    _check_model(model)
    out = {}
    stacked = _kind(model, kind) == "stack"
    for n, name, controls, to_t, _ in _pairs(model, stacked):
        vals = [_value(c, 0 if n is None else n, grads) for c in controls]
        if any(v is None for v in vals):
            out[name] = None
            continue
        out[name] = to_t(*vals).detach().clone()
    with torch.no_grad():
        _fold_sigmas(model, out, stacked, grads)
    return out


def load_torch_state_dict(model, state: dict[str, Tensor], *, kind: str | None = None) -> None:
    r"""Copy torch-named weights (as :func:`torch_state_dict` names them) into ``model``: the
    model then computes torch's layers (LayerNorm weights and biases unfolded by the model's
    norms' :math:`\sigma`, when they are not 0 and 1)."""
    _check_model(model)
    if not isinstance(state, Mapping):
        raise TypeError(f"load_torch_state_dict: state: expected a dict of tensors, got {type(state).__name__}")
    pairs = _pairs(model, _kind(model, kind) == "stack")
    for where, _, P, _ in _norm_maps(model, _kind(model, kind) == "stack"):
        _sigmas(P, f"load_torch_state_dict: {where}")
    missing = [name for _, name, *_ in pairs if name not in state]
    if missing:
        raise KeyError(f"load_torch_state_dict: missing torch weights {missing}")
    # every tensor checked before any is copied (no half-loaded model, no error inside copy_)
    expected = torch_state_dict(model, kind=kind)
    for name, ref in expected.items():
        v, where = state[name], f"load_torch_state_dict: state[{name!r}]"
        check_tensor(v, where)
        check_float_dtype(v, where)
        check_shape(v, ref.shape, where)
        check_finite(v, where)
    with torch.no_grad():
        state = _unfold_sigmas(model, {k: state[k] for k in expected}, _kind(model, kind) == "stack")
    for n, name, controls, _, to_o in pairs:
        vals = to_o(state[name])
        for c, v in zip(controls, vals):
            _assign(c, 0 if n is None else n, v)


def _check_model(model) -> None:
    if not isinstance(model, (TorchEncoder, TorchDecoder)):
        raise TypeError(f"expected an opsplit TorchEncoder or TorchDecoder, got {type(model).__name__}")


# -- from torch ---------------------------------------------------------------------------
def _torch_state(layers, decoder: bool, final_norm, stacked: bool) -> dict:
    """torch's parameters under their names (the tensors themselves: their requires_grad is
    the torch module's)."""
    state = {}
    for n, layer in enumerate(layers):
        p = f"layers.{n}." if stacked else ""
        mhas = [("self_attn.", layer.self_attn)] + ([("multihead_attn.", layer.multihead_attn)] if decoder else [])
        for name, mha in mhas:  # kdim = vdim = embed_dim (checked): one in_proj_weight
            state[p + name + "in_proj_weight"] = mha.in_proj_weight
            if mha.in_proj_bias is not None:
                state[p + name + "in_proj_bias"] = mha.in_proj_bias
            state[p + name + "out_proj.weight"] = mha.out_proj.weight
            if mha.out_proj.bias is not None:
                state[p + name + "out_proj.bias"] = mha.out_proj.bias
        for lin in ("linear1", "linear2"):
            m = getattr(layer, lin)
            state[p + lin + ".weight"] = m.weight
            if m.bias is not None:
                state[p + lin + ".bias"] = m.bias
        for k in (1, 2, 3) if decoder else (1, 2):
            nrm = getattr(layer, f"norm{k}")
            for w in ("weight", "bias"):
                if getattr(nrm, w) is not None:
                    state[p + f"norm{k}.{w}"] = getattr(nrm, w)
    if final_norm is not None:
        for w in ("weight", "bias"):
            if getattr(final_norm, w) is not None:
                state[f"norm.{w}"] = getattr(final_norm, w)
    return state


def _final_norm(norm, E: int, where: str, strict: bool):
    if norm is None:
        return None
    if not isinstance(norm, nn.LayerNorm):
        raise ValueError(f"{where}.norm: expected None or nn.LayerNorm(d_model={E}), got {norm!r}")
    _check_layer_norm(norm, f"{where}.norm", E, strict)
    return norm


def _stacked_requires_grad(state: dict, where: str) -> None:
    """A weight is one opsplit parameter for all layers (piecewise constant in t): its
    ``requires_grad`` must be the same in every layer."""
    by = {}
    for name, v in state.items():
        if name.startswith("layers."):
            n, rest = name[len("layers."):].split(".", 1)
            by.setdefault(rest, {})[int(n)] = bool(v.requires_grad)
    for rest, flags in by.items():
        if len(set(flags.values())) != 1:
            frozen = [n for n, f in flags.items() if not f]
            raise ValueError(
                f"from_torch: {where}: {rest}.requires_grad differs between layers (frozen in layers "
                f"{frozen}); opsplit holds a weight of all layers in one parameter, with one requires_grad"
            )


def _leaf(c) -> Tensor:
    """The tensor that holds a control's values (its requires_grad is the control's)."""
    if isinstance(c, PiecewiseConstant):
        return c.raw
    if isinstance(c, Constant):
        return c.value
    if isinstance(c, Tensor):
        return c
    raise TypeError(f"cannot read requires_grad of a {type(c).__name__} control")


def from_torch(module: nn.Module, *, strict: bool = True, fused_norm: bool = True):
    """The opsplit model of a torch transformer module, with the same weights.

    Args:
        module: ``nn.TransformerEncoderLayer``, ``nn.TransformerEncoder``,
            ``nn.TransformerDecoderLayer``, ``nn.TransformerDecoder`` (-> a
            :class:`~opsplit.models.TorchEncoder` / :class:`~opsplit.models.TorchDecoder`
            propagator), or ``nn.MultiheadAttention`` (-> a
            :class:`~opsplit.operators.MultiHeadAttention` operator, batch-first, self-attention).
        strict: reject subclasses of the torch modules (whose forward may differ).
        fused_norm: compute each LayerNorm with ``F.layer_norm`` (default) or as the core
            :math:`S_1` projection's resolvent followed by the affine map (post-norm layers).

    The result is on the module's device and dtype and in its training mode.
    """
    if not isinstance(module, nn.Module):
        raise TypeError(f"from_torch: expected a torch.nn.Module, got {type(module).__name__}")
    if _has_hooks(module):
        raise ValueError("from_torch: the module has forward hooks or pre-hooks, which are not converted")
    if isinstance(module, nn.MultiheadAttention):
        if strict and type(module) is not nn.MultiheadAttention:
            raise TypeError(f"from_torch: {type(module).__name__} is a subclass of nn.MultiheadAttention; "
                            "pass strict=False")
        return _mha_from_torch(module)
    if isinstance(module, (nn.TransformerEncoderLayer, nn.TransformerDecoderLayer)):
        layers, final, source, where = [module], None, type(module).__name__, type(module).__name__
    elif isinstance(module, (nn.TransformerEncoder, nn.TransformerDecoder)):
        if strict and type(module) not in (nn.TransformerEncoder, nn.TransformerDecoder):
            raise TypeError(f"from_torch: {type(module).__name__} is a subclass; pass strict=False")
        layers, final = list(module.layers), module.norm
        source = "TransformerEncoder" if isinstance(module, nn.TransformerEncoder) else "TransformerDecoder"
        where = source
    else:
        raise TypeError(
            f"from_torch: unsupported module {type(module).__name__}; expected nn.TransformerEncoderLayer, "
            "nn.TransformerEncoder, nn.TransformerDecoderLayer, nn.TransformerDecoder or nn.MultiheadAttention"
        )
    decoder = source.startswith("TransformerDecoder")
    want = _DEC_LAYER if decoder else _ENC_LAYER
    configs = []
    for n, layer in enumerate(layers):
        if not isinstance(layer, want):
            raise TypeError(f"{where}.layers[{n}]: expected {want.__name__}, got {type(layer).__name__}")
        configs.append(_layer_config(layer, f"{where}.layers[{n}]" if len(layers) > 1 or final is not None else where, strict))
    for n, cfg in enumerate(configs[1:], 1):
        if cfg != configs[0]:
            diff = {k: (configs[0][k], v) for k, v in cfg.items() if configs[0][k] != v}
            raise ValueError(f"{where}: layer {n} differs from layer 0 in {diff}; a stack must share one configuration")
    cfg = configs[0]
    final = _final_norm(final, cfg["d_model"], where, strict)
    dtype, device = _one_dtype_device(module, f"from_torch: {where}")
    kind = "stack" if source in ("TransformerEncoder", "TransformerDecoder") else "layer"
    state = _torch_state(layers, decoder, final, kind == "stack")
    _stacked_requires_grad(state, where)
    cls = TorchDecoder if decoder else TorchEncoder
    fa, fb = (None, None) if final is None else _norm_flags(final)
    model = cls(**cfg, num_layers=len(layers), final_norm=final is not None, fused_norm=fused_norm,
                final_norm_affine=fa, final_norm_bias=fb, device=device, dtype=dtype)
    if final is not None:
        model.final_projection.eps = float(final.eps)
    model.torch_source = source
    if source == "TransformerEncoder":
        model.torch_options = {"enable_nested_tensor": bool(module.enable_nested_tensor),
                               "mask_check": bool(getattr(module, "mask_check", True))}
    load_torch_state_dict(model, {k: v.detach() for k, v in state.items()}, kind=kind)
    for _, name, controls, _, _ in _pairs(model, kind == "stack"):
        for c in controls:
            _leaf(c).requires_grad_(bool(state[name].requires_grad))
    model.train(module.training)
    return model


def _mha_from_torch(mha: nn.MultiheadAttention) -> MultiHeadAttention:
    _check_mha(mha, "nn.MultiheadAttention", mha.embed_dim)
    E, H = mha.embed_dim, mha.num_heads
    d = E // H
    (Wq, Wk, Wv), bs = _mha_weights(mha)
    p0 = mha.out_proj.weight
    fk = {"device": p0.device, "dtype": p0.dtype}

    def pc(x, src):
        c = PiecewiseConstant(x.detach().clone().unsqueeze(0).to(**fk))
        c.raw.requires_grad_(bool(src.requires_grad))
        return c

    W, b = mha.in_proj_weight, mha.in_proj_bias
    op = MultiHeadAttention(
        pc(Wq.t().reshape(E, H, d), W), pc(Wk.t().reshape(E, H, d), W), pc(Wv.t().reshape(E, H, d), W),
        pc(mha.out_proj.weight.t().reshape(H, d, E), mha.out_proj.weight),
        bQ=None if bs[0] is None else pc(bs[0].reshape(H, d), b),
        bK=None if bs[1] is None else pc(bs[1].reshape(H, d), b),
        bV=None if bs[2] is None else pc(bs[2].reshape(H, d), b),
        bO=None if mha.out_proj.bias is None else pc(mha.out_proj.bias, mha.out_proj.bias),
        scale=d ** -0.5, dropout=float(mha.dropout), attn_mask="attn_mask", key_padding_mask="key_padding_mask",
    )
    op.train(mha.training)
    return op


# -- to torch -----------------------------------------------------------------------------
def to_torch(model, kind: str | None = None) -> nn.Module:
    """The torch module with ``model``'s weights: ``nn.TransformerEncoderLayer`` /
    ``nn.TransformerEncoder`` (from a :class:`~opsplit.models.TorchEncoder`) or the decoder
    counterparts.

    Args:
        model: a torch-exact opsplit model.
        kind: ``"layer"`` or ``"stack"``; default: the type the model was converted from, else
            a layer for one layer without a final norm and a stack otherwise.

    Raises a clear error when the model is not a torch network: a grid whose quadrature
    weights are not all 1 (``L = N``), a time step other than 1, a head size other than
    ``d_model / nhead``, Q/K/V biases that differ from the other biases.
    """
    _check_model(model)
    g = model.grid
    if g.x.rule == "trapezoid":  # equal x-weights cancel in the softmax; unequal ones do not
        raise ValueError(
            f"to_torch: the model's Omega_x quadrature weights are not equal ({g.x}); torch's "
            "layers are the L = N discretisation"
        )
    for name, itv in (("y", g.y), ("h", g.h)):
        if itv is not None and itv.uniform_weight != 1.0:
            raise ValueError(
                f"to_torch: the model's Omega_{name} quadrature weights are not 1 ({itv}); torch's "
                "layers are the L = N discretisation"
            )
    if model.n_steps != model.num_layers or abs(model.dt() - 1.0) > 1e-12 or model.t0 != 0.0:
        raise ValueError(
            f"to_torch: torch's network is N_t = num_layers steps of dt = 1 from t = 0; the model has "
            f"n_steps = {model.n_steps}, dt = {model.dt():g}, t0 = {model.t0:g}"
        )
    if model.head_dim * model.nhead != model.d_model:
        raise ValueError(
            f"to_torch: head_dim * nhead = {model.head_dim * model.nhead} != d_model = {model.d_model}; "
            "nn.MultiheadAttention cannot hold it"
        )
    if model.qkv_bias != model.bias:
        raise ValueError(f"to_torch: qkv_bias = {model.qkv_bias} differs from bias = {model.bias}")
    _check_torch_solve(model)
    act = model.activation
    if act not in ("relu", "gelu"):
        act = activation_fn(act)
    p0 = next(model.parameters())
    kw = dict(
        d_model=model.d_model, nhead=model.nhead, dim_feedforward=model.dim_feedforward,
        dropout=model.dropout_p, activation=act, layer_norm_eps=model.layer_norm_eps,
        batch_first=model.batch_first, norm_first=model.norm_first, bias=model.bias,
        device=p0.device, dtype=p0.dtype,
    )
    decoder = isinstance(model, TorchDecoder)
    kind = _kind(model, kind)
    requires_grad = _torch_requires_grad(model, kind == "stack")
    layer = (nn.TransformerDecoderLayer if decoder else nn.TransformerEncoderLayer)(**kw)
    # the options nn.Transformer*Layer's constructor does not take: set on the prototype layer
    # (the stack deep-copies it)
    layer.dropout.p = model.activation_dropout
    for mha in (layer.self_attn, layer.multihead_attn) if decoder else (layer.self_attn,):
        mha.dropout = model.attention_dropout
    if (model.norm_affine, model.norm_bias) != (True, model.bias):
        for k in (1, 2, 3) if decoder else (1, 2):
            setattr(layer, f"norm{k}", nn.LayerNorm(model.d_model, eps=model.layer_norm_eps,
                                                    elementwise_affine=model.norm_affine, bias=model.norm_bias,
                                                    device=p0.device, dtype=p0.dtype))
    if kind == "layer":
        module = layer
    else:
        norm = None
        if model.final_norm is not None:
            norm = nn.LayerNorm(model.d_model, eps=model.final_projection.eps,
                                elementwise_affine=model.final_norm_affine, bias=model.final_norm_bias,
                                device=p0.device, dtype=p0.dtype)
        if decoder:
            module = nn.TransformerDecoder(layer, model.num_layers, norm=norm)
        else:
            opts = getattr(model, "torch_options", {})
            module = nn.TransformerEncoder(
                layer, model.num_layers, norm=norm,
                enable_nested_tensor=opts.get("enable_nested_tensor", False) and _nested_ok(kw),
                mask_check=opts.get("mask_check", True),
            )
    state = torch_state_dict(model, kind=kind)
    # every LayerNorm's eps is its projection's (the layers' norm{k} share one)
    for _, names, P, _ in _norm_maps(model, kind == "stack"):
        for name in names:
            module.get_submodule(name).eps = float(P.eps)
    own = dict(module.named_parameters())
    if set(own) != set(state):
        raise RuntimeError(f"to_torch: torch's parameters {sorted(set(own) ^ set(state))} have no opsplit counterpart")
    with torch.no_grad():
        for name, v in state.items():
            own[name].copy_(v)
    for name, p in own.items():
        p.requires_grad_(requires_grad[name])
    module.train(model.training)
    return module


def _check_torch_solve(model) -> None:
    r"""What torch's layers compute: the Lie scheme of the model's substeps with explicit-Euler
    field substeps (a residual connection each), attention scaled by :math:`1/\sqrt{d}`."""
    if type(model.scheme) is not Lie:
        raise ValueError(f"to_torch: model.scheme is {type(model.scheme).__name__}; torch's layer is the Lie scheme "
                         "of its substeps")
    for i, sub in enumerate(model.scheme.substeps):
        solver = getattr(sub, "solver", None)
        if getattr(solver, "requires", None) == "field" and type(solver) is not ExplicitEuler:
            raise ValueError(f"to_torch: model.scheme.substeps[{i}] is solved by {type(solver).__name__}; torch's "
                             "layer is an explicit-Euler step of each term (a residual connection)")
    attns = [("attention", model.attention)] if isinstance(model, TorchEncoder) else \
        [("self_attention", model.self_attention), ("cross_attention", model.cross_attention)]
    want = 1.0 / math.sqrt(model.head_dim)
    for name, op in attns:
        sc = getattr(op, "scale", None)
        if sc is None or not math.isclose(float(sc), want, rel_tol=1e-12):
            raise ValueError(f"to_torch: model.{name}.scale = {sc!r}; torch's nn.MultiheadAttention scales the scores "
                             f"by 1/sqrt(head_dim) = {want!r}")


def _torch_requires_grad(model, stacked: bool) -> dict[str, bool]:
    """torch name -> requires_grad, from the controls each torch parameter is made of (all of
    them must agree: WQ, WK, WV make one in_proj_weight)."""
    out = {}
    for _, name, controls, _, _ in _pairs(model, stacked):
        flags = {bool(_leaf(c).requires_grad) for c in controls}
        if len(flags) != 1:
            raise ValueError(
                f"to_torch: {name} is made of opsplit weights of which some require grad and some do not; "
                "torch holds it in one parameter with one requires_grad"
            )
        out[name] = flags.pop()
    return out


def _nested_ok(kw) -> bool:
    """Whether nn.TransformerEncoder would accept enable_nested_tensor without a warning."""
    return (not kw["norm_first"]) and kw["batch_first"] and kw["bias"] and kw["nhead"] % 2 == 0
