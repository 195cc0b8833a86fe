r"""CvT, the convolutional vision transformer, as a multi-stage splitting scheme (paper 002, §6).

Paper 002 §6.2: CvT "consists of two components, convolutional token embedding and
convolutional Transformer block"; the token embedding is an extra substep (eq. 44) with its
projection onto :math:`S_1` (eq. 45), the attention reads :math:`Q, K, V` through
convolutions (eq. 42), and "for a K-stage CvT [...] the number of tokens changes from stage
to stage", realised by composing the scheme with a hybrid splitting scheme on grids of
different scales.  In opsplit that is literally how the model is built:

* the state :math:`u(x, y, t)` lives on an :class:`~opsplit.grid.ImageGrid`: :math:`x` runs
  over the 2-D image domain (the tokens are the pixels of the current stage), :math:`y` over
  the channels; the initial state is the image itself (:math:`N_y = 3` colour channels);
* one :class:`~opsplit.schemes.Stages` scheme holds the :math:`K` stages.  Stage :math:`k`
  lasts ``depth[k]`` steps (:math:`\Delta t = 1`, one step = one CvT layer) and has

  - an **entry**, a :class:`~opsplit.schemes.Hybrid` of map substeps applied once at the
    stage's start time :math:`\tau_{k-1}`: the strided convolution
    :math:`u \mapsto W^{C,k} *_s u + b^{C,k}` to the coarser grid
    (:class:`~opsplit.operators.ConvTransfer`, eq. 44 as a restriction), the projection onto
    :math:`S_1` with LayerNorm's affine map (eq. 45), dropout (training mode) and, in a stage
    with a class token, :class:`~opsplit.operators.PrependTokens`;
  - a **body**, a Lie scheme run at every step on the stage's grid: the attention term with
    convolutional projections (:class:`~opsplit.operators.ConvAttention`, eq. 42: depthwise
    convolution, batch norm as an affine map, pointwise linear maps; strides for K and V)
    in pre-norm form, explicit Euler (eq. 13); the feed-forward term in pre-norm form,
    explicit Euler (eq. 15 with torch's FFN); and, when the drop-path rate is positive, the
    drop-path map where Hugging Face applies it.

:func:`~opsplit.models.cvt_from_hf` converts ``transformers``' ``CvtModel`` and
``CvtForImageClassification`` (registered with :func:`~opsplit.models.hf.from_hf`);
:meth:`CvT.to_hf` copies the weights back (both in :mod:`opsplit.models.cvt_hf`, as
:mod:`opsplit.models.hf_decoders` is for the decoders).  :func:`one_head_cvt` is §6.2's "one-head CvT with one stage and without
convolutional token embedding": paper 002's scheme (13)–(17) with the attention of eq. (42).

``print(model.schedule())`` lists the stages, their time intervals, grids and substeps.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from .._checks import (
    check_finite,
    check_float_dtype,
    check_like_module,
    check_parameters_finite,
    check_positive_int,
    check_probability,
)
from ..controls import Constant, LayerwiseConstant
from ..grid import ImageGrid
from ..operators import (
    BatchNormMap,
    ConvAttention,
    ConvTransfer,
    DropPath,
    FeedForward,
    FFNIntegral,
    FieldDropout,
    FieldDropPath,
    PointwiseAffine,
    PreNorm,
    PrependTokens,
    ProjectionS1,
    StateDropout,
)
from ..operators._guard import check_output
from ..operators._linear import fan_in_uniform_
from ..propagator import Propagator
from ..schemes import Hybrid, Lie, Stage, Stages
from ..solvers import Exact, ExplicitEuler, Substep
from .hf import _export_to_hf
from .paper import paper_scheme

__all__ = ["CvtStageSpec", "CvT", "CvTOutput", "CvtReadout", "build_cvt", "one_head_cvt"]


def _pair(v, name: str) -> tuple[int, int]:
    vals = tuple(v) if isinstance(v, (tuple, list)) else (v, v)
    if len(vals) != 2:
        raise ValueError(f"{name}: expected an int or a pair (height, width), got {v!r}")
    return tuple(check_positive_int(x, name) for x in vals)


def _grid_keeping_sizes(k: int, s: int, p: int):
    """The sizes N that a convolution (kernel k, stride s, padding p) maps to N nodes:
    ``None`` for every N (stride 1, padding (k - 1)/2), else the tuple of them (finite for
    s >= 2: N' <= (N + 2p - k)/s + 1 < N once N > (2p - k + s)/(s - 1))."""
    if s == 1:
        return None if 2 * p == k - 1 else ()
    top = max(0, (2 * p - k + s) // (s - 1))
    return tuple(n for n in range(1, top + 1) if n + 2 * p >= k and (n + 2 * p - k) // s + 1 == n)


@dataclass
class CvtStageSpec:
    """The configuration of one CvT stage (``transformers.CvtConfig``'s per-stage lists).

    ``drop_path_rate`` is the rate of every layer of the stage (Hugging Face's ``CvtStage``
    gives all its layers the same rate, ``linspace(0, rate, depth)[stage]``; the converter
    reads the rate off the modules).
    """

    in_channels: int
    embed_dim: int
    depth: int
    num_heads: int
    patch_size: int = 7
    patch_stride: int = 4
    patch_padding: int = 2
    mlp_hidden: int | None = None
    kernel_qkv: int = 3
    padding_q: int = 1
    padding_kv: int = 1
    stride_q: int = 1
    stride_kv: int = 2
    qkv_bias: bool = True
    cls_token: bool = False
    drop_rate: float = 0.0
    attention_drop_rate: float = 0.0
    drop_path_rate: float = 0.0
    layer_norm_eps: float = 1e-5
    batch_norm_eps: float = 1e-5
    batch_norm_momentum: float | None = 0.1

    def __post_init__(self):
        for name in ("in_channels", "embed_dim", "depth", "num_heads", "patch_size", "patch_stride",
                     "kernel_qkv", "stride_q", "stride_kv"):
            setattr(self, name, check_positive_int(getattr(self, name), f"CvtStageSpec.{name}"))
        for name in ("patch_padding", "padding_q", "padding_kv"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise ValueError(f"CvtStageSpec.{name}: expected an integer >= 0, got {v!r}")
        if self.embed_dim % self.num_heads:
            raise ValueError(
                f"CvtStageSpec: embed_dim = {self.embed_dim} is not divisible by num_heads = {self.num_heads}"
            )
        if self.mlp_hidden is None:
            self.mlp_hidden = 4 * self.embed_dim
        elif isinstance(self.mlp_hidden, bool) or not isinstance(self.mlp_hidden, int) or self.mlp_hidden < 0:
            raise ValueError(
                f"CvtStageSpec.mlp_hidden: expected an integer >= 0 (transformers builds int(embed_dim * mlp_ratio) "
                f"hidden units, 0 for a small ratio), got {self.mlp_hidden!r}"
            )
        if _grid_keeping_sizes(self.kernel_qkv, self.stride_q, self.padding_q) == ():
            raise ValueError(
                f"CvtStageSpec: the query projection keeps no token grid (kernel_qkv = {self.kernel_qkv}, stride_q = "
                f"{self.stride_q}, padding_q = {self.padding_q}: floor((N + 2 padding_q - kernel_qkv)/stride_q) + 1 "
                "!= N for every N; stride_q = 1 needs padding_q = (kernel_qkv - 1)/2): the attention output is "
                "added to the state on its grid"
            )
        for name in ("drop_rate", "attention_drop_rate", "drop_path_rate"):
            setattr(self, name, check_probability(getattr(self, name), f"CvtStageSpec.{name}"))


class CvtReadout(nn.Module):
    r"""The post-processing :math:`G` of ``CvtForImageClassification``: LayerNorm of the class
    token (or of every token when the last stage has none), the mean over the tokens, a
    linear map: :math:`G(u) = \frac{1}{|X|}\sum_{x \in X} \mathrm{LN}(u)(x)\,\mathbf B + \mathbf b`
    (paper 002 §4.2's read-out, with a mean over the token set :math:`X`).

    Args:
        n_y: channels of the last stage.
        num_labels: output size (``0``: no linear map, the logits are the pooled tokens).
        use_cls_token: read the class token only.
    """

    def __init__(self, n_y: int, num_labels: int, *, use_cls_token: bool, eps: float = 1e-5, bias: bool = True,
                 device=None, dtype=None):
        super().__init__()
        fk = {"device": device, "dtype": dtype or torch.get_default_dtype()}
        self.n_y = check_positive_int(n_y, "CvtReadout.n_y")
        if isinstance(num_labels, bool) or not isinstance(num_labels, int) or num_labels < 0:
            raise ValueError(f"CvtReadout.num_labels: expected an integer >= 0, got {num_labels!r}")
        self.use_cls_token = bool(use_cls_token)
        self.norm = PointwiseAffine(nn.Parameter(torch.ones(n_y, **fk)), nn.Parameter(torch.zeros(n_y, **fk)),
                                    projection=ProjectionS1(0.0, 1.0, eps=eps))
        self.weight = nn.Parameter(torch.zeros(n_y, num_labels, **fk)) if num_labels else None
        self.bias = nn.Parameter(torch.zeros(num_labels, **fk)) if num_labels and bias else None
        self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self) -> None:
        self.norm.weight.value.fill_(1.0)
        self.norm.bias.value.zero_()
        if self.weight is not None:
            fan_in_uniform_(self.n_y, self.weight, self.bias)

    def forward(self, u: Tensor, grid: ImageGrid) -> Tensor:
        check_parameters_finite(self, "CvtReadout")
        if self.use_cls_token:
            if grid.n_prefix < 1:
                raise ValueError("CvtReadout: use_cls_token=True, but the last stage has no class token")
            u = u[:, :1]
        else:
            u = grid.split(u)[1]
        z = self.norm.flow(0.0, 1.0, u, grid).mean(1)
        if self.weight is None:
            return z
        return torch.nn.functional.linear(z, self.weight.t(), self.bias)

    def extra_repr(self) -> str:
        n = 0 if self.weight is None else self.weight.shape[1]
        return f"n_y={self.n_y}, num_labels={n}, use_cls_token={self.use_cls_token}"


@dataclass
class CvTOutput:
    """What :class:`CvT` returns (Hugging Face's layouts): the last stage's spatial tokens as an
    image ``(B, C, H, W)``, its class token ``(B, 1, C)`` (or ``None``), and the logits."""

    last_hidden_state: Tensor
    cls_token_value: Tensor | None = None
    logits: Tensor | None = None


def _pc(n: int, shape, t0: float, fk, fill: float = 0.0, axes=()) -> LayerwiseConstant:
    """One value per layer on ``[t0, t0 + n]`` (piecewise constant in t; one parameter per
    layer, so a deep stage's backward pass does not build a full-size gradient per layer)."""
    return LayerwiseConstant(torch.full((n, *shape), fill, **fk), t0=t0, t1=t0 + n, axes=axes)


def _rows(c):
    """The per-layer tensors of a per-layer control (pieces of a :class:`LayerwiseConstant`,
    rows of a stacked ``PiecewiseConstant``)."""
    return list(c.pieces) if isinstance(c, LayerwiseConstant) else [c.raw[n] for n in range(c.n_pieces)]


def _layer_norm(eps: float, n: int | None, E: int, t0: float, fk) -> PointwiseAffine:
    """``nn.LayerNorm(E, eps)``: the projection onto S1(0, 1) (Theorem 3.1 with torch's eps)
    and its affine map; one set per layer (``n`` pieces) or one set (``n=None``)."""
    if n is None:
        w, b = nn.Parameter(torch.ones(E, **fk)), nn.Parameter(torch.zeros(E, **fk))
    else:
        w, b = _pc(n, (E,), t0, fk, 1.0, ("y",)), _pc(n, (E,), t0, fk, 0.0, ("y",))
    return PointwiseAffine(w, b, projection=ProjectionS1(0.0, 1.0, eps=eps))


def _stage(spec: CvtStageSpec, t0: float, name: str, fk) -> Stage:
    """One CvT stage: entry (eqs. 44–45, dropout, class token) and body (one step = one layer)."""
    s, n, E = spec, spec.depth, spec.embed_dim
    H, d = s.num_heads, s.embed_dim // s.num_heads
    # -- entry: convolutional token embedding (eq. 44) and its projection onto S1 (eq. 45)
    embed = ConvTransfer(nn.Parameter(torch.zeros(E, s.in_channels, s.patch_size, s.patch_size, **fk)),
                         nn.Parameter(torch.zeros(E, **fk)), stride=s.patch_stride, padding=s.patch_padding,
                         prefix="drop")
    entry = [[embed], [_layer_norm(s.layer_norm_eps, None, E, t0, fk)]]
    labels = ["eq. 44: u <- W^C *_s u + b^C (new grid)", "eq. 45: projection onto S1, then LayerNorm's affine"]
    if s.drop_rate > 0:
        entry.append([StateDropout(s.drop_rate)])
        labels.append("dropout (training mode)")
    if s.cls_token:
        entry.append([PrependTokens(nn.Parameter(torch.zeros(1, E, **fk)))])
        labels.append("class token [v_0; u] (§4.2)")

    # -- body: one step = one CvT layer
    def proj(stride, padding):
        return [ConvTransfer(_pc(n, (E, 1, s.kernel_qkv, s.kernel_qkv), t0, fk), stride=stride, padding=padding,
                             groups="depthwise", prefix="keep"),
                BatchNormMap(E, n_pieces=n, t0=t0, t1=t0 + n, eps=s.batch_norm_eps, momentum=s.batch_norm_momentum,
                             **fk)]

    qb = s.qkv_bias
    attn = ConvAttention(
        _pc(n, (E, H, d), t0, fk), _pc(n, (E, H, d), t0, fk), _pc(n, (E, H, d), t0, fk), _pc(n, (H, d, E), t0, fk),
        bQ=_pc(n, (H, d), t0, fk) if qb else None, bK=_pc(n, (H, d), t0, fk) if qb else None,
        bV=_pc(n, (H, d), t0, fk) if qb else None, bO=_pc(n, (E,), t0, fk),
        q_proj=proj(s.stride_q, s.padding_q), k_proj=proj(s.stride_kv, s.padding_kv),
        v_proj=proj(s.stride_kv, s.padding_kv), scale=None, dropout=s.attention_drop_rate,
    )
    Fz = s.mlp_hidden
    ffn = FeedForward(_pc(n, (E, Fz), t0, fk), _pc(n, (Fz,), t0, fk), _pc(n, (Fz, E), t0, fk),
                      _pc(n, (E,), t0, fk), activation="gelu")
    a = FieldDropout(attn, s.drop_rate) if s.drop_rate > 0 else attn
    f = FieldDropout(ffn, s.drop_rate) if s.drop_rate > 0 else ffn
    if s.drop_path_rate > 0:
        a = FieldDropPath(a, s.drop_path_rate, t0=t0, t1=t0 + n)
    body = [Substep(PreNorm(a, _layer_norm(s.layer_norm_eps, n, E, t0, fk)), ExplicitEuler()),
            Substep(PreNorm(f, _layer_norm(s.layer_norm_eps, n, E, t0, fk)), ExplicitEuler())]
    body_labels = ["eqs. 42, 13: u <- u + dt A(LN_1(u)), conv. attention", "eq. 15: u <- u + dt F(LN_2(u)), FFN"]
    if s.drop_path_rate > 0:
        body.append(Substep(DropPath(s.drop_path_rate, t0=t0, t1=t0 + n), Exact()))
        body_labels.append("drop path on the state (training mode)")
    return Stage(Lie(body), n, entry=Hybrid(entry), name=name, entry_labels=labels, body_labels=body_labels)


class CvT(nn.Module):
    r"""A K-stage CvT: :math:`G \circ \bar{\mathcal N}` with :math:`\bar{\mathcal N}` a
    :class:`~opsplit.Propagator` over a :class:`~opsplit.schemes.Stages` scheme (see the
    module docstring) and :math:`G` the optional :class:`CvtReadout`.

    Args:
        num_channels: colour channels of the input (the first stage's ``in_channels``).
        stages: one :class:`CvtStageSpec` per stage.
        num_labels: ``None`` (``CvtModel``: no read-out) or the classifier's output size
            (``CvtForImageClassification``; ``0``: identity head).
        layer_norm_eps: of the read-out's LayerNorm.
        reset: initialise the parameters (:meth:`reset_parameters`); ``False`` leaves them at
            zeros and ones (for a converter that overwrites them).
        device, dtype: factory kwargs.

    ``forward(pixel_values)`` takes ``(B, C, H, W)`` floating-point images of any size
    Hugging Face's ``CvtModel`` takes (the input grid ``ImageGrid.paper((H, W), C)`` and the
    stages' grids are read from the input: a stride-:math:`s` convolution maps :math:`N`
    nodes to :math:`\lfloor (N + 2p - k)/s \rfloor + 1`, see
    :mod:`opsplit.operators.transfer`) and returns a :class:`CvTOutput`.  Errors name
    ``pixel_values`` and are raised before any compute: a size some stencil does not fit
    (or whose query grid is not the state's grid), channel mismatches, a dtype or device
    other than the model's, non-finite values, and in training mode a batch norm that would
    see one value per channel.  Before them, every parameter and buffer is checked finite,
    named by its qualified name (``CvT: parameters must be finite, but propagator.….sigma2.value
    hold(s) NaN/inf``); the output and the logits are checked finite, and a non-finite one
    re-reads every parameter first (a NaN written through ``.data`` is named).  An empty batch
    ``(0, C, H, W)`` gives empty outputs, as Hugging Face's ``CvtModel`` does.
    """

    def __init__(self, num_channels: int, stages, *, num_labels: int | None = None,
                 layer_norm_eps: float = 1e-5, reset: bool = True, device=None, dtype=None):
        super().__init__()
        fk = {"device": device, "dtype": dtype or torch.get_default_dtype()}
        self.num_channels = check_positive_int(num_channels, "CvT.num_channels")
        specs = [stages] if isinstance(stages, CvtStageSpec) else list(stages)
        if not specs:
            raise ValueError("CvT.stages: expected at least one CvtStageSpec")
        c = self.num_channels
        for k, s in enumerate(specs):
            if not isinstance(s, CvtStageSpec):
                raise TypeError(f"CvT.stages[{k}]: expected a CvtStageSpec, got {type(s).__name__}")
            if s.in_channels != c:
                raise ValueError(
                    f"CvT.stages[{k}]: channel mismatch: in_channels = {s.in_channels}, the previous "
                    f"{'stage has embed_dim' if k else 'input has num_channels'} = {c}"
                )
            c = s.embed_dim
        self.specs = tuple(specs)
        built, t0 = [], 0.0
        for k, s in enumerate(specs):
            built.append(_stage(s, t0, f"stage {k + 1}", fk))
            t0 += s.depth
        scheme = Stages(built)
        self.propagator = Propagator(scheme, scheme.n_steps, t0=0.0, t1=scheme.t1)
        self.num_labels = num_labels
        self.readout = None
        if num_labels is not None:
            self.readout = CvtReadout(c, num_labels, use_cls_token=specs[-1].cls_token, eps=layer_norm_eps, **fk)
        if reset:
            self.reset_parameters()

    # -- structure ------------------------------------------------------------------------------------
    @property
    def scheme(self) -> Stages:
        return self.propagator.scheme

    def input_grid(self, image_size) -> ImageGrid:
        """The grid of the input images: ``ImageGrid.paper((H, W), num_channels)``."""
        return ImageGrid.paper(_pair(image_size, "image_size"), self.num_channels)

    def schedule(self, image_size=224):
        """The schedule of one solve for images of ``image_size``: per stage its time interval,
        grid, entry substeps (once, at the stage's start) and the substeps of every step (a
        :class:`~opsplit.schemes.Schedule`; print it)."""
        g = self.input_grid(image_size)
        self.scheme.check(g)
        return self.scheme.schedule(g)

    def output_grid(self, image_size) -> ImageGrid:
        """The grid of the last stage for images of ``image_size`` (checks every stride)."""
        g = self.input_grid(image_size)
        self.scheme.check(g)
        return self.scheme.output_grid(g)

    def stage_operators(self, k: int) -> dict:
        """Named access to stage ``k``'s operators: ``embed``, ``embed_norm``, ``cls``,
        ``attention``, ``norm1``, ``ffn``, ``norm2``."""
        st = self.scheme.stages[k]
        entry = [s.terms[0] for s in st.entry.substeps]
        out = {"embed": entry[0], "embed_norm": entry[1],
               "cls": next((op for op in entry if isinstance(op, PrependTokens)), None)}

        def inner(op):
            while isinstance(op, (FieldDropout, FieldDropPath)):
                op = op.inner
            return op

        p1, p2 = st.body.substeps[0].terms[0], st.body.substeps[1].terms[0]
        out.update(attention=inner(p1.inner), norm1=p1.norm, ffn=inner(p2.inner), norm2=p2.norm)
        return out

    @torch.no_grad()
    def reset_parameters(self) -> None:
        """Hugging Face's initialisation: truncated normal (std 0.02) for the convolutions,
        linear maps and class tokens, zero biases, LayerNorm and BatchNorm at identity."""
        for k in range(len(self.specs)):
            ops = self.stage_operators(k)
            nn.init.trunc_normal_(ops["embed"].weight.value, std=0.02)
            ops["embed"].bias.value.zero_()
            ops["embed_norm"].weight.value.fill_(1.0)
            ops["embed_norm"].bias.value.zero_()
            if ops["cls"] is not None:
                nn.init.trunc_normal_(ops["cls"].tokens.value, std=0.02)
            a, f = ops["attention"], ops["ffn"]
            for c in (a.WQ, a.WK, a.WV, a.WO, a.q_proj[0].weight, a.k_proj[0].weight, a.v_proj[0].weight,
                      f.W1, f.W2):
                for r in _rows(c):
                    nn.init.trunc_normal_(r, std=0.02)
            for c in (a.bQ, a.bK, a.bV, a.bO, f.b1, f.b2, ops["norm1"].bias, ops["norm2"].bias):
                if c is not None:
                    for r in _rows(c):
                        r.zero_()
            for c in (ops["norm1"].weight, ops["norm2"].weight):
                for r in _rows(c):
                    r.fill_(1.0)
            for proj in (a.q_proj, a.k_proj, a.v_proj):
                proj[1].reset_parameters()
        if self.readout is not None:
            self.readout.reset_parameters()

    # -- forward ------------------------------------------------------------------------------------
    def _check_pixels(self, pixel_values) -> ImageGrid:
        """Every check of the input, before any compute (type, layout, channels, dtype and
        device, the image size against every stage, batch norm's needs in training mode,
        finiteness); returns the input grid."""
        if not isinstance(pixel_values, Tensor):
            raise TypeError(f"pixel_values: expected a torch.Tensor (B, C, H, W), got {type(pixel_values).__name__}")
        check_float_dtype(pixel_values, "pixel_values")
        if pixel_values.dim() != 4:
            raise ValueError(f"pixel_values: expected shape (B, C, H, W), got {tuple(pixel_values.shape)}")
        B, C, H, W = pixel_values.shape
        if C != self.num_channels:
            raise ValueError(f"pixel_values: channel mismatch: expected {self.num_channels} channels, got {C}")
        if H < 1 or W < 1:
            raise ValueError(f"pixel_values: empty images (H, W) = ({H}, {W})")
        check_like_module(pixel_values, self, "pixel_values", "the CvT")
        grid = self.input_grid((H, W))
        self._check_image_size(grid, B)
        check_finite(pixel_values, "pixel_values")
        return grid

    def _check_image_size(self, grid: ImageGrid, batch: int) -> None:
        """Every stage's transfers and projections on the grids that images on ``grid`` give,
        as one error naming ``pixel_values`` and the stage; in training mode, batch norm's
        need of more than one value per channel (``nn.BatchNorm2d`` refuses one)."""
        H, W = grid.size
        g = grid
        for k, st in enumerate(self.scheme.stages):
            where = f"stage {k + 1}'s entry (from the {g.size[0]}x{g.size[1]} grid)"
            try:
                st.entry.check(g)
                g = st.entry.output_grid(g)
                where = f"stage {k + 1} (on the {g.size[0]}x{g.size[1]} token grid)"
                st.body.check(g)
            except ValueError as e:
                raise ValueError(f"pixel_values: images of {H}x{W} pixels do not fit {where}: {e}") from None
            if self.training:
                for name, gg in self.stage_operators(k)["attention"].projection_grids(g).items():
                    if batch * gg.n_spatial == 1:
                        raise ValueError(
                            f"pixel_values: stage {k + 1}'s {name} projection has a 1x1 token grid for {H}x{W} images, "
                            "and batch norm in training mode needs more than one value per channel (one image gives "
                            "one; nn.BatchNorm2d refuses it too): use a batch of 2 or more images, or eval mode"
                        )
            g = st.body.output_grid(g)

    def forward(self, pixel_values: Tensor) -> CvTOutput:
        # every parameter first, by its qualified name (a NaN in a sigma_2 is named, not reported
        # as a stage the images do not fit); re-read only after a parameter changes
        check_parameters_finite(self, "CvT")
        grid = self._check_pixels(pixel_values)
        try:
            f = ImageGrid.from_image(pixel_values)  # the image is the initial state on the input grid
            # the pixels and the parameters are checked above, naming them (one pass over the pixels)
            u = self.propagator(f, grid=grid, check_finite_input=False)
            check_output(u, "CvT output")
            g = self.scheme.output_grid(grid)
            prefix, spatial = g.split(u)
            B = u.shape[0]
            image = spatial.transpose(1, 2).reshape(B, g.y.n, *g.size)
            cls = None if self.specs[-1].cls_token is False else prefix
            logits = None
            if self.readout is not None:
                logits = self.readout(u, g)
                check_output(logits, "CvT logits")
        except ValueError:  # a NaN written through .data (no version change) is named first
            check_parameters_finite(self, "CvT", fresh=True)
            raise
        return CvTOutput(last_hidden_state=image, cls_token_value=cls, logits=logits)

    # -- Hugging Face ---------------------------------------------------------------------------------
    def to_hf(self):
        r"""The Hugging Face model with these weights: ``CvtModel`` or, with a read-out,
        ``CvtForImageClassification``, in this model's training mode, dtype and device.  A
        pure weight copy, but for the LayerNorms: the :math:`\sigma_1, \sigma_2` of their
        :math:`S_1` projections are folded into HF's weight and bias (:math:`\gamma\sigma_2`,
        :math:`\gamma\sigma_1 + \beta`; unchanged at :math:`\sigma = (0, 1)`), and a
        :math:`\sigma` that is not a constant is refused, naming it.  Needs ``transformers``
        (:func:`opsplit.models.cvt_hf.cvt_to_hf`)."""
        return _export_to_hf(self)

    def extra_repr(self) -> str:
        return (f"num_channels={self.num_channels}, stages={len(self.specs)}, "
                f"depths={[s.depth for s in self.specs]}, embed_dims={[s.embed_dim for s in self.specs]}")


def build_cvt(num_channels: int, stages, **kwargs) -> CvT:
    """:class:`CvT` from per-stage dicts or :class:`CvtStageSpec` objects."""
    specs = [s if isinstance(s, CvtStageSpec) else CvtStageSpec(**s) for s in stages]
    return CvT(num_channels, specs, **kwargs)


# -- paper 002 §6.2: the one-head, one-stage CvT without convolutional token embedding ------------------------------
def one_head_cvt(size, n_y: int, *, kernel_size: int = 3, J: int = 2, n_steps: int = 2, eps: float = 1e-5,
                 device=None, dtype=None) -> Propagator:
    r"""Paper 002 §6.2's "one-head CvT with one stage and without convolutional token
    embedding": the Lie scheme (13)–(17) (:func:`~opsplit.models.paper_scheme`) whose
    attention reads :math:`Q, K, V` through convolutions (eq. 42):

    .. math::  Q = W^Q * u,\ K = W^K * u,\ V = W^V * u,\qquad
               \gamma = \mathrm{Softmax}_2\big(\tfrac{1}{\sqrt{|\Omega_y|}}\langle Q, K\rangle_{\Omega_y}\big),

    with one scalar kernel :math:`W^Q(\xi, t)` (``kernel_size`` x ``kernel_size``, shared by
    all channels, as printed in eq. 42) per projection and step, no pointwise maps (identity),
    zero padding.  The state lives on ``ImageGrid.paper(size, n_y)``: :math:`N_1 N_2` tokens
    (the pixels) of :math:`N_y` channels.  The FFN is the paper's: :math:`J` square layers
    :math:`W_j` with ReLU projections, relaxation (16) and LayerNorm projections (14), (17)
    with :math:`\sigma_1 = 0, \sigma_2 = 1` and ``eps``.

    Returns a :class:`~opsplit.Propagator` with :math:`N_t` = ``n_steps``, initialised by
    ``reset_parameters()`` from torch's global generator (seed it with ``torch.manual_seed``
    for a reproducible model).
    """
    k = check_positive_int(kernel_size, "one_head_cvt.kernel_size")
    if k % 2 == 0:
        raise ValueError(f"one_head_cvt.kernel_size: expected an odd size (a centred stencil), got {k}")
    n_y = check_positive_int(n_y, "one_head_cvt.n_y")
    n = check_positive_int(n_steps, "one_head_cvt.n_steps")
    J = check_positive_int(J, "one_head_cvt.J")
    fk = {"device": device, "dtype": dtype or torch.get_default_dtype()}
    grid = ImageGrid.paper(size, n_y)
    eye = torch.eye(n_y, **fk)
    ident = Constant(eye.reshape(n_y, 1, n_y))  # the pointwise maps are the identity (eq. 42 has none)

    def conv():
        return ConvTransfer(_pc(n, (1, 1, k, k), 0.0, fk), padding=k // 2, groups="depthwise", prefix="keep")

    attn = ConvAttention(ident, ident, ident, None, q_proj=conv(), k_proj=conv(), v_proj=conv(), scale=None)
    norm = ProjectionS1(0.0, 1.0, eps=eps)
    ffn = [FFNIntegral(_pc(n, (n_y, n_y), 0.0, fk, axes=("y", "y")), _pc(n, (n_y,), 0.0, fk, axes=("y",)),
                       bias_axis="y") for _ in range(J)]
    prop = Propagator(paper_scheme(attn, norm, ffn), n, grid=grid)
    with torch.no_grad():
        for p in prop.parameters():
            nn.init.uniform_(p, -1.0 / math.sqrt(n_y), 1.0 / math.sqrt(n_y))
        for c in (attn.q_proj[0], attn.k_proj[0], attn.v_proj[0]):
            for r in _rows(c.weight):
                nn.init.uniform_(r, -1.0 / k, 1.0 / k)
    return prop
