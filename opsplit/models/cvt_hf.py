r"""Hugging Face ``transformers``' CvT -> :class:`~opsplit.models.CvT` and back.

:func:`cvt_from_hf` converts ``CvtModel`` and ``CvtForImageClassification`` (registered with
:func:`~opsplit.models.hf.from_hf`); :func:`cvt_to_hf` (what :meth:`CvT.to_hf
<opsplit.models.CvT.to_hf>` calls) builds the Hugging Face model back from a CvT's
specification and weights.  Both directions read one weight correspondence
(:func:`_pairs`: exact transposes and reshapes), so a round trip is a pure copy; on the way
back, the :math:`\sigma` of every LayerNorm's :math:`S_1` projection is folded into HF's
weight and bias (weight :math:`\gamma\sigma_2`, bias :math:`\gamma\sigma_1 + \beta`, the
values at :math:`\sigma = (0, 1)` unchanged), as :mod:`opsplit.models.hf_decoders` does for
the decoders.  The model itself is :mod:`opsplit.models.cvt`.
"""

from __future__ import annotations

import math
from dataclasses import asdict

import torch
from torch import Tensor, nn

from ..controls import Constant
from .cvt import CvT, CvtStageSpec, _rows
from .hf import (
    _check_layer_norm,
    _check_linear,
    _dropout_p,
    _need_hf,
    _one_dtype_device,
    _register_hf_exporter,
    register_hf_converter,
)

__all__ = ["cvt_from_hf", "cvt_to_hf"]


def _one(values, where: str, what: str):
    vals = set(values)
    if len(vals) != 1:
        raise ValueError(f"from_hf: {where}: the layers differ in {what} ({sorted(vals)}); opsplit holds one per stage")
    return vals.pop()


def _hf_stage(stage, k: int, c_in: int, where: str) -> tuple[CvtStageSpec, dict]:
    """Read and check one ``CvtStage`` (modules and options), before any compute."""
    _need_hf(stage, where, "CvtStage")
    cfg = stage.config
    method = cfg.qkv_projection_method[k]
    if method != "dw_bn":
        raise ValueError(
            f"from_hf: {where}: qkv_projection_method={method!r} is not converted: transformers' "
            "CvtSelfAttentionProjection builds no convolution for it and fails at its first forward; opsplit "
            "converts 'dw_bn' (depthwise convolution + batch norm)"
        )
    emb = stage.embedding
    _need_hf(emb, where + ".embedding", "CvtEmbeddings")
    ce = emb.convolution_embeddings
    _need_hf(ce, where + ".embedding.convolution_embeddings", "CvtConvEmbeddings")
    conv = ce.projection
    _need_hf(conv, where + ".embedding.convolution_embeddings.projection", nn.Conv2d)
    E = conv.out_channels
    if conv.in_channels != c_in:
        raise ValueError(
            f"from_hf: {where}: channel mismatch: the embedding convolution takes {conv.in_channels} channels, "
            f"the {'previous stage gives' if k else 'input has'} {c_in}"
        )
    ks, st, pd = tuple(conv.kernel_size), tuple(conv.stride), tuple(conv.padding)
    if (ks[0] != ks[1] or st[0] != st[1] or not isinstance(conv.padding, tuple) or pd[0] != pd[1]
            or tuple(conv.dilation) != (1, 1) or conv.groups != 1 or conv.bias is None
            or conv.padding_mode != "zeros"):
        raise ValueError(
            f"from_hf: {where}.embedding: expected a square zero-padded nn.Conv2d with bias, groups=1, dilation 1; "
            f"got {conv!r}"
        )
    eps = {_check_layer_norm(ce.normalization, where + ".embedding.convolution_embeddings.normalization", E)}
    p_emb = _dropout_p(emb.dropout, where + ".embedding.dropout")
    cls = getattr(stage, "cls_token", None)
    has_cls = bool(cfg.cls_token[k])
    if has_cls and (not isinstance(cls, Tensor) or tuple(cls.shape) != (1, 1, E)):
        raise ValueError(
            f"from_hf: {where}.cls_token: expected shape (1, 1, {E}) (transformers sizes the class token by "
            f"embed_dim[-1] = {cfg.embed_dim[-1]}), got {None if cls is None else tuple(cls.shape)}"
        )
    layers = list(stage.layers)
    if not layers:
        raise ValueError(f"from_hf: {where}: no layers (depth 0) to convert")
    opts, mods = [], []
    for i, layer in enumerate(layers):
        w = f"{where}.layers[{i}]"
        _need_hf(layer, w, "CvtLayer")
        sa = layer.attention.attention
        _need_hf(layer.attention, w + ".attention", "CvtAttention")
        _need_hf(sa, w + ".attention.attention", "CvtSelfAttention")
        if bool(sa.with_cls_token) != has_cls or sa.embed_dim != E:
            raise ValueError(f"from_hf: {w}: with_cls_token/embed_dim differ from the stage's")
        H = int(sa.num_heads)
        if E % H:
            raise ValueError(f"from_hf: {w}: embed_dim {E} is not divisible by num_heads {H}")
        if abs(float(sa.scale) - E ** -0.5) > 1e-12 * E ** -0.5:
            raise ValueError(f"from_hf: {w}: score scale {sa.scale} is not embed_dim**-0.5")
        projs = {}
        for name in ("query", "key", "value"):
            p = getattr(sa, f"convolution_projection_{name}")
            _need_hf(p, f"{w}.attention.attention.convolution_projection_{name}", "CvtSelfAttentionProjection")
            cp = getattr(p, "convolution_projection", None)
            _need_hf(cp, f"{w}.attention.attention.convolution_projection_{name}.convolution_projection",
                  "CvtSelfAttentionConvProjection")
            c, bn = cp.convolution, cp.normalization
            _need_hf(c, f"{w} {name} convolution", nn.Conv2d)
            _need_hf(bn, f"{w} {name} batch norm", nn.BatchNorm2d)
            if (c.in_channels != E or c.out_channels != E or c.groups != E or c.bias is not None
                    or c.kernel_size[0] != c.kernel_size[1] or c.stride[0] != c.stride[1]
                    or not isinstance(c.padding, tuple) or c.padding[0] != c.padding[1]
                    or tuple(c.dilation) != (1, 1) or c.padding_mode != "zeros"):
                raise ValueError(f"from_hf: {w} {name} convolution: expected a square depthwise nn.Conv2d({E}, {E}, "
                                 f"groups={E}, bias=False), got {c!r}")
            if (bn.num_features != E or not bn.affine or not bn.track_running_stats
                    or bn.running_mean is None):
                raise ValueError(f"from_hf: {w} {name} batch norm: expected nn.BatchNorm2d({E}) with affine "
                                 "parameters and running statistics")
            projs[name] = (c, bn)
        ln = {_check_layer_norm(layer.layernorm_before, w + ".layernorm_before", E),
              _check_layer_norm(layer.layernorm_after, w + ".layernorm_after", E)}
        eps |= ln
        qkv_bias = sa.projection_query.bias is not None
        for name in ("query", "key", "value"):
            _check_linear(getattr(sa, f"projection_{name}"), f"{w}.attention.attention.projection_{name}", E, E,
                          bias=qkv_bias)
        so = layer.attention.output
        _need_hf(so, w + ".attention.output", "CvtSelfOutput")
        _check_linear(so.dense, w + ".attention.output.dense", E, E)
        _need_hf(layer.intermediate, w + ".intermediate", "CvtIntermediate")
        _need_hf(layer.intermediate.activation, w + ".intermediate.activation", nn.GELU)
        if layer.intermediate.activation.approximate != "none":
            raise ValueError(f"from_hf: {w}.intermediate.activation: expected exact GELU, got "
                             f"approximate={layer.intermediate.activation.approximate!r}")
        fc1 = layer.intermediate.dense
        _check_linear(fc1, w + ".intermediate.dense", E)
        _need_hf(layer.output, w + ".output", "CvtOutput")
        _check_linear(layer.output.dense, w + ".output.dense", fc1.out_features, E)
        dp = layer.drop_path
        if isinstance(dp, nn.Identity):
            p_dp = 0.0
        else:
            _need_hf(dp, w + ".drop_path", "CvtDropPath", nn.Identity)
            p_dp = float(dp.drop_prob)
        qc, kc = projs["query"][0], projs["key"][0]
        opts.append(dict(
            H=H, F=fc1.out_features, kernel=qc.kernel_size[0], kv_kernel=kc.kernel_size[0],
            stride_q=qc.stride[0], padding_q=qc.padding[0], stride_kv=kc.stride[0], padding_kv=kc.padding[0],
            same_kv=(tuple(projs["value"][0].kernel_size), projs["value"][0].stride, projs["value"][0].padding)
            == (tuple(kc.kernel_size), kc.stride, kc.padding),
            qkv_bias=qkv_bias, p_attn=_dropout_p(sa.dropout, w + ".attention.attention.dropout"),
            p_out=_dropout_p(so.dropout, w + ".attention.output.dropout"),
            p_mlp=_dropout_p(layer.output.dropout, w + ".output.dropout"), p_dp=p_dp,
            bn=tuple((float(bn.eps), bn.momentum) for _, bn in projs.values()),
        ))
        mods.append(dict(projs=projs, q=sa.projection_query, k=sa.projection_key, v=sa.projection_value,
                         o=so.dense, fc1=fc1, fc2=layer.output.dense, ln1=layer.layernorm_before,
                         ln2=layer.layernorm_after))
    o = {key: _one([op[key] for op in opts], where, key) for key in opts[0]}
    if not o["same_kv"] or o["kernel"] != o["kv_kernel"]:
        raise ValueError(f"from_hf: {where}: the key and value projections differ in kernel/stride/padding")
    if len(eps) != 1:
        raise ValueError(f"from_hf: {where}: LayerNorms with different eps {sorted(eps)}")
    if len(set(o["bn"])) != 1:
        raise ValueError(f"from_hf: {where}: batch norms with different eps/momentum {o['bn']}")
    if len({p_emb, o["p_out"], o["p_mlp"]}) != 1:
        raise ValueError(f"from_hf: {where}: different dropout rates {(p_emb, o['p_out'], o['p_mlp'])}")
    bn_eps, bn_mom = o["bn"][0]
    spec = CvtStageSpec(
        in_channels=c_in, embed_dim=E, depth=len(layers), num_heads=o["H"], patch_size=ks[0], patch_stride=st[0],
        patch_padding=pd[0], mlp_hidden=o["F"], kernel_qkv=o["kernel"], padding_q=o["padding_q"],
        padding_kv=o["padding_kv"], stride_q=o["stride_q"], stride_kv=o["stride_kv"], qkv_bias=o["qkv_bias"],
        cls_token=has_cls, drop_rate=p_emb, attention_drop_rate=o["p_attn"], drop_path_rate=o["p_dp"],
        layer_norm_eps=eps.pop(), batch_norm_eps=bn_eps, batch_norm_momentum=bn_mom,
    )
    return spec, dict(conv=conv, ln=ce.normalization, cls=cls if has_cls else None, layers=mods)


def _hf_parts(model) -> dict:
    cls = type(model).__name__
    if cls == "CvtForImageClassification":
        cvt, head, ln = model.cvt, model.classifier, model.layernorm
        where = f"{cls}.cvt"
    else:
        cvt, head, ln, where = model, None, None, cls
    _need_hf(cvt, where, "CvtModel")
    enc = cvt.encoder
    _need_hf(enc, where + ".encoder", "CvtEncoder")
    cfg = cvt.config
    stages = list(enc.stages)
    if not stages:
        raise ValueError(f"from_hf: {where}: no stages to convert")
    specs, parts, c = [], [], int(cfg.num_channels)
    for k, st in enumerate(stages):
        spec, p = _hf_stage(st, k, c, f"{where}.encoder.stages[{k}]")
        specs.append(spec)
        parts.append(p)
        c = spec.embed_dim
    ro_eps = None
    if head is not None:
        ro_eps = _check_layer_norm(ln, f"{cls}.layernorm", c)
        if isinstance(head, nn.Linear):
            _check_linear(head, f"{cls}.classifier", c, bias=None)
        else:
            _need_hf(head, f"{cls}.classifier", nn.Identity)
    dtype, device = _one_dtype_device(model, f"from_hf: {cls}")
    return dict(specs=specs, parts=parts, head=head, ln=ln, ro_eps=ro_eps, cfg=cfg, cls=cls,
                fk={"dtype": dtype, "device": device})


def _norms(model: CvT, parts=None, ln=None) -> list:
    """``(our PointwiseAffine, layer or None, HF nn.LayerNorm)`` of every LayerNorm: each
    stage's embedding norm, both norms of every layer, the read-out's (``parts=None``: ours
    only, the HF entry ``None``)."""
    out = []
    for k, spec in enumerate(model.specs):
        ops = model.stage_operators(k)
        p = None if parts is None else parts[k]
        out.append((ops["embed_norm"], None, None if p is None else p["ln"]))
        for n in range(spec.depth):
            m = None if p is None else p["layers"][n]
            out += [(ops["norm1"], n, None if m is None else m["ln1"]),
                    (ops["norm2"], n, None if m is None else m["ln2"])]
    if model.readout is not None and (parts is None or ln is not None):
        out.append((model.readout.norm, None, ln))
    return out


def _gamma_beta(norm, n) -> tuple:
    """A LayerNorm's weight and bias (``n``: its layer's, of a per-layer control)."""
    if n is None:
        return norm.weight.value, norm.bias.value
    return _rows(norm.weight)[n], _rows(norm.bias)[n]


def _pairs(model: CvT, parts, head=None, ln=None):
    """``(opsplit tensor, HF tensor, HF -> opsplit view)`` for every weight and buffer.

    The views are exact rearrangements (transposes and reshapes), so the copy is lossless in
    both directions.  A LayerNorm's weight and bias are paired with HF's as they are: the
    :math:`\\sigma` of its :math:`S_1` projection is folded in on the way back
    (:func:`_fold_sigmas`)."""
    out = []
    for k, p in enumerate(parts):
        ops = model.stage_operators(k)
        E = model.specs[k].embed_dim
        H = model.specs[k].num_heads
        d = E // H
        out += [(ops["embed"].weight.value, p["conv"].weight, lambda x: x),
                (ops["embed"].bias.value, p["conv"].bias, lambda x: x)]
        if p["cls"] is not None:
            out.append((ops["cls"].tokens.value, p["cls"], lambda x, E=E: x.reshape(1, E)))
        a = ops["attention"]
        for n, m in enumerate(p["layers"]):
            for ours, name in ((a.q_proj, "query"), (a.k_proj, "key"), (a.v_proj, "value")):
                c, bn = m["projs"][name]
                out += [(_rows(ours[0].weight)[n], c.weight, lambda x: x),
                        (ours[1].weight.raw[n], bn.weight, lambda x: x),
                        (ours[1].bias.raw[n], bn.bias, lambda x: x),
                        (ours[1].running_mean[n], bn.running_mean, lambda x: x),
                        (ours[1].running_var[n], bn.running_var, lambda x: x),
                        (ours[1].num_batches_tracked[n], bn.num_batches_tracked, lambda x: x)]
            for W, b, lin in ((a.WQ, a.bQ, m["q"]), (a.WK, a.bK, m["k"]), (a.WV, a.bV, m["v"])):
                out.append((_rows(W)[n], lin.weight, lambda x, E=E, H=H, d=d: x.t().reshape(E, H, d)))
                if b is not None:
                    out.append((_rows(b)[n], lin.bias, lambda x, H=H, d=d: x.reshape(H, d)))
            out += [(_rows(a.WO)[n], m["o"].weight, lambda x, E=E, H=H, d=d: x.t().reshape(H, d, E)),
                    (_rows(a.bO)[n], m["o"].bias, lambda x: x)]
            f = ops["ffn"]
            out += [(_rows(f.W1)[n], m["fc1"].weight, lambda x: x.t()), (_rows(f.b1)[n], m["fc1"].bias, lambda x: x),
                    (_rows(f.W2)[n], m["fc2"].weight, lambda x: x.t()), (_rows(f.b2)[n], m["fc2"].bias, lambda x: x)]
    for norm, n, hl in _norms(model, parts, ln):
        gamma, beta = _gamma_beta(norm, n)
        out += [(gamma, hl.weight, lambda x: x), (beta, hl.bias, lambda x: x)]
    if ln is not None and isinstance(head, nn.Linear):
        r = model.readout
        out.append((r.weight, head.weight, lambda x: x.t()))
        if head.bias is not None:
            out.append((r.bias, head.bias, lambda x: x))
    return out


def _sigmas(norm, where: str) -> tuple:
    r""":math:`(\sigma_1, \sigma_2)` of a LayerNorm's :math:`S_1` projection: constant scalars
    (a control that varies in time has no place in HF's LayerNorm), else refused naming it."""
    out = []
    for name in ("sigma1", "sigma2"):
        c = getattr(norm.projection, name)
        if not isinstance(c, Constant) or c.value.dim() != 0:
            raise ValueError(f"CvT.to_hf: {where}.projection.{name} is a {type(c).__name__}; Hugging Face's "
                             "LayerNorm holds a constant sigma only (folded into its weight and bias)")
        out.append(c.value.detach())
    return tuple(out)


def _fold_sigmas(model: CvT, parts, ln=None) -> None:
    r"""Write every HF LayerNorm's weight and bias as the forward of ours computes them:
    :math:`\gamma P_{S_1(\sigma_1, \sigma_2)}(u) + \beta = (\gamma\sigma_2) P_{S_1(0, 1)}(u) +
    (\gamma\sigma_1 + \beta)` (:class:`~opsplit.operators.PointwiseAffine`'s fused form; the
    same values at :math:`\sigma = (0, 1)`)."""
    names = {id(m): name for name, m in model.named_modules()}
    for norm, n, hl in _norms(model, parts, ln):
        s1, s2 = _sigmas(norm, names[id(norm)])
        gamma, beta = _gamma_beta(norm, n)
        hl.weight.copy_(gamma * s2.to(gamma.dtype))
        hl.bias.copy_(gamma * s1.to(gamma.dtype) + beta)


def _cvt_from_hf(model) -> CvT:
    P = _hf_parts(model)
    cfg = P["cfg"]
    num_labels = None
    if P["head"] is not None:
        num_labels = P["head"].out_features if isinstance(P["head"], nn.Linear) else 0
    head_bias = isinstance(P["head"], nn.Linear) and P["head"].bias is not None
    out = CvT(int(cfg.num_channels), P["specs"], num_labels=num_labels,
              layer_norm_eps=P["ro_eps"] or 1e-5, reset=False, **P["fk"])
    if out.readout is not None and isinstance(P["head"], nn.Linear) and not head_bias:
        out.readout.bias = None
    pairs = _pairs(out, P["parts"], P["head"], P["ln"])
    # requires_grad: one flag per opsplit parameter (per layer for LayerwiseConstant pieces; per stage for
    # the stacked batch-norm parameters, refused when the layers differ)
    flags: dict[int, tuple] = {}
    with torch.no_grad():
        for dst, src, view in pairs:
            dst.copy_(view(src))
            owner = dst if isinstance(dst, nn.Parameter) else dst._base
            if not isinstance(owner, nn.Parameter):
                continue  # a buffer (batch-norm statistics)
            prev = flags.get(id(owner))
            if prev is not None and prev[1] != src.requires_grad:
                raise ValueError(
                    "from_hf: requires_grad differs between the layers of a stage for one weight; opsplit holds "
                    "a weight of all layers of a stage in one parameter (piecewise constant in t), with one flag"
                )
            flags[id(owner)] = (owner, src.requires_grad)
    for owner, flag in flags.values():
        owner.requires_grad_(flag)
    out.hf_config = cfg.to_dict()
    out.hf_class = P["cls"]
    out.train(model.training)
    return out


def cvt_from_hf(model) -> CvT:
    """``transformers``' ``CvtModel`` / ``CvtForImageClassification`` -> :class:`CvT`.

    Same weights and batch-norm statistics, same outputs to round-off, training mode, dtype,
    device and per-parameter ``requires_grad`` (the batch-norm parameters of a stage are one
    stacked parameter: layers that differ in their ``requires_grad`` are refused).  Registered with :func:`~opsplit.models.hf.from_hf`.

    The model takes images of every size Hugging Face's model takes (the stages' grids are
    built from the input, as Hugging Face's model does).  Checked before any compute: the
    class of every sub-module and every option that changes the math —
    ``qkv_projection_method`` other than ``"dw_bn"`` (transformers' ``"avg"`` builds no
    convolution and fails at its first forward), a query projection that keeps no token
    grid, key and value projections that differ, LayerNorms / batch norms / dropout rates
    that differ within a stage, channel mismatches between stages; at the forward, image
    sizes that some stencil does not fit.
    """
    _need_hf(model, "cvt_from_hf: model", "CvtModel", "CvtForImageClassification")
    return _cvt_from_hf(model)


def _mlp_ratio(hidden: int, embed_dim: int) -> float:
    """A ratio r with ``int(embed_dim * r) == hidden`` (transformers' hidden width): ``hidden /
    embed_dim`` can round below (``int(11 * (15 / 11)) == 14``); step it by ulps until it fits."""
    r = hidden / embed_dim
    while int(embed_dim * r) < hidden:
        r = math.nextafter(r, math.inf)
    while int(embed_dim * r) > hidden:
        r = math.nextafter(r, -math.inf)
    return r


@torch.no_grad()
def cvt_to_hf(model: CvT):
    """:class:`CvT` -> ``transformers``' ``CvtModel`` or, with a read-out,
    ``CvtForImageClassification`` (what :meth:`CvT.to_hf` calls; see there)."""
    if not isinstance(model, CvT):
        raise TypeError(f"cvt_to_hf: model: expected a CvT, got {type(model).__name__}")
    names = {id(m): name for name, m in model.named_modules()}
    for norm in {id(x): x for x, _, _ in _norms(model)}.values():  # what HF cannot hold, before building
        _sigmas(norm, names[id(norm)])
    try:
        import transformers  # optional (opsplit[test]) and slow to import (~0.6 s): loaded only to convert
    except ImportError as e:  # pragma: no cover - test dependency
        raise ImportError("CvT.to_hf needs transformers") from e
    cfg_dict = getattr(model, "hf_config", None)
    if cfg_dict is None:
        s = model.specs
        cfg_dict = dict(
            num_channels=model.num_channels, patch_sizes=[x.patch_size for x in s],
            patch_stride=[x.patch_stride for x in s], patch_padding=[x.patch_padding for x in s],
            embed_dim=[x.embed_dim for x in s], num_heads=[x.num_heads for x in s], depth=[x.depth for x in s],
            mlp_ratio=[_mlp_ratio(x.mlp_hidden, x.embed_dim) for x in s], attention_drop_rate=[x.attention_drop_rate for x in s],
            drop_rate=[x.drop_rate for x in s], drop_path_rate=[x.drop_path_rate for x in s],
            qkv_bias=[x.qkv_bias for x in s], cls_token=[x.cls_token for x in s],
            qkv_projection_method=["dw_bn"] * len(s), kernel_qkv=[x.kernel_qkv for x in s],
            padding_kv=[x.padding_kv for x in s], stride_kv=[x.stride_kv for x in s],
            padding_q=[x.padding_q for x in s], stride_q=[x.stride_q for x in s],
            num_labels=model.num_labels or 0,
        )
    cfg = transformers.CvtConfig(**cfg_dict)
    cls = getattr(model, "hf_class", "CvtForImageClassification" if model.readout is not None else "CvtModel")
    hf = getattr(transformers, cls)(cfg)
    P = _hf_parts(hf)
    if [asdict(s) for s in P["specs"]] != [asdict(s) for s in model.specs]:
        raise ValueError("CvT.to_hf: the model's stages are not a transformers CvtConfig (e.g. per-layer drop-path "
                         "rates or eps that transformers does not build); no pure weight copy exists")
    fk = {}
    for t in model.parameters():
        fk = {"dtype": t.dtype, "device": t.device}
        break
    hf.to(**fk)
    P = _hf_parts(hf)
    for dst, src, view in _pairs(model, P["parts"], P["head"], P["ln"]):
        # src is opsplit's dst here: write the HF tensor from ours through the inverse view
        target = view(src)
        target.copy_(dst)
        if not torch.equal(view(src), dst):  # the views are views (transposes, splits of a dimension)
            raise RuntimeError("CvT.to_hf: internal error: a weight view of the transformers model is a copy")
        src.requires_grad_(dst.requires_grad if src.is_floating_point() else False)
    _fold_sigmas(model, P["parts"], P["ln"])
    hf.train(model.training)
    return hf


register_hf_converter("CvtModel", cvt_from_hf)
register_hf_converter("CvtForImageClassification", cvt_from_hf)
_register_hf_exporter(CvT, cvt_to_hf)
