r"""Decoder-only language models (GPT-2, the Llama family) as :math:`G \circ \bar{\mathcal N} \circ F`
with a pre-norm causal splitting scheme (paper 002, §4.2, eq. 36, with causal attention).

**The continuous model.**  On :math:`\Omega_x \times \Omega_y` (tokens, features) and
:math:`t \in [0, T]`, :math:`T` = number of layers,

.. math::  u_t = A\big(N_1(u)\big) + F\big(N_2(u)\big),\qquad u(0) = F_{\text{in}}(\text{tokens}),

with :math:`A` a causal attention term and :math:`F` a feed-forward term, each reading the
state through a normalisation map (:class:`~opsplit.operators.PreNorm`).  The Lie scheme
(Appendix C, eq. 58) with explicit-Euler substeps and :math:`\Delta t = 1` is one layer
``h = h + attn(norm1(h)); h = h + mlp(norm2(h))``; the controls are piecewise constant in
time (one weight set per layer, :class:`~opsplit.controls.LayerwiseConstant`: one parameter
per layer, so the backward pass sends each layer's gradient to its own tensor), so
:math:`N_t` = number of layers, and another :math:`N_t` solves the same continuous model.

===================  ====================================  ==========================================
 piece                GPT-2                                 Llama, Qwen2, Mistral
===================  ====================================  ==========================================
 :math:`N_1, N_2`     :math:`\gamma\odot P_{S_1}+\beta`      :math:`\gamma\odot P_{S_\circ}` (sphere,
                      (LayerNorm, Theorem 3.1)              :class:`~opsplit.operators.ProjectionSphere`)
 :math:`A`            :class:`~opsplit.operators.GroupedQueryAttention`, causal
                      :math:`H_{kv} = H`, biases             rotary positions, :math:`H_{kv} \mid H`
 :math:`F`            :class:`~opsplit.operators.FeedForward`  :class:`~opsplit.operators.GatedFeedForward`
                      (GELU-tanh)                           (SiLU)
 :math:`F_{\text{in}}`  token table + learned positions      token table
                      (:class:`~opsplit.controls.PositionTable`)
 :math:`G`            final norm, then :math:`\langle u, E_v\rangle_{\Omega_y}` (the token table
                      read back when tied, else its own table): logits
===================  ====================================  ==========================================

**Calls.**  ``model(input_ids, attention_mask=None, position_ids=None, cache=None)`` takes
integer ids ``(B, N)`` and an optional 0/1 mask ``(B, past + N)`` (0 = padding; left
padding for batched prompts) as Hugging Face does, and returns a :class:`DecoderOutput`.
Without ``position_ids`` the tokens sit at the coordinates :math:`\xi_i = x_i - x_1` of the
decoder's token grid (after ``past`` cached tokens, :math:`\xi_i = \text{past}\cdot h + x_i
- x_1`): :math:`0, 1, 2, \dots` on the paper's grid (Hugging Face's positions), :math:`0, h,
2h, \dots` on a refined grid of spacing :math:`h` — the rotary angles and the learned
position table (interpolated between its rows) read the same coordinates
(:meth:`DecoderLM.token_positions`), so a model is evaluated on another :math:`N_x` by
setting ``model.decoder.grid``.
The mask, the explicit positions and the key/value cache are call-time inputs of the grid
(:class:`~opsplit.operators.context.ContextGrid`): the propagator, the scheme and the solvers
do not know them.  ``model.generate(...)`` is :func:`opsplit.models.generate.generate`.

**Attention and scheme** (``DecoderConfig.attention``, ``DecoderConfig.scheme``): the same
continuous model with another attention term or another splitting.  ``attention=
"sliced_relu"`` puts causal sliced ReLU attention (:class:`~opsplit.operators.SlicedReLUAttention`,
paper 004, eqs. 3 and 8, MLP projection, :math:`O(N_x \log^2 N_x)`) in the place of
:math:`A` — no rotary positions (it has no query/key heads to rotate), no attention biases
or dropout; left padding is a key-padding mask (the pads get key weight 0 in the causal
sums) and a generation step with the :class:`~opsplit.operators.KVCache` reads the cached
keys as sorted runs, :math:`O(D \log^2 n)` per head (:mod:`opsplit.functional.sliced_runs`;
under autograd the :math:`O(n\,D)` sums of :mod:`opsplit.functional.sliced_decode`);
``scheme="strang"`` advances
:math:`A` over half steps around a full step of :math:`F` (:class:`~opsplit.schemes.Strang`;
first order with these explicit-Euler substeps, and no longer GPT-2's layer at
:math:`\Delta t = 1`); ``scheme="parallel"`` evaluates both terms at the same state,
:math:`u \leftarrow u + \Delta t\,(A(u) + F(u))` (:class:`~opsplit.schemes.Parallel`, eq. 59,
with explicit-Euler substeps exactly one Euler step of :math:`u_t = A + F`: GPT-J's parallel
block at :math:`\Delta t = 1`). Its only discretisation error is the substep solver's — no
splitting error — so a solver swap (:func:`opsplit.control.swap.solved_with`: Heun or RK4
advance both terms together) converges to the flow at the solver's order.

Every input is checked before any compute: integer ids in ``[0, vocab_size)``, at least one
token (``input_ids: empty prompt``), the mask's shape and values, the positions against a
learned table (a sequence longer than ``max_positions`` is refused); so is every parameter
(finite, named by its qualified name), and a key/value cache whose size over :math:`N_t`
steps cannot fit in the available memory (:meth:`DecoderLM.check_cache_memory`).  An empty
batch ``(0, N)`` gives empty outputs, as ``torch.nn``'s modules do (refused with a cache,
and by ``generate``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .._checks import (
    check_parameters_finite,
    check_positive_float,
    check_positive_int,
    check_probability,
)
from .._memory import available_memory, human_bytes
from ..controls import LayerwiseConstant, PositionTable
from ..grid import Grid
from ..operators import (
    FeedForward,
    FieldDropout,
    GatedFeedForward,
    GroupedQueryAttention,
    KVCache,
    PointwiseAffine,
    PreNorm,
    ProjectionS1,
    ProjectionSphere,
    RotaryEmbedding,
    SlicedReLUAttention,
)
from ..operators._fused import frozen_field, frozen_map
from ..operators._guard import check_output
from ..operators.activation import activation_fn
from ..operators.context import ContextGrid
from ..propagator import Propagator
from ..schemes import Lie, Parallel, Strang
from ..solvers import EXPLICIT_SOLVERS, ExplicitEuler, Substep, solver_for
from .nanogpt_init import INITS, nanogpt_init

__all__ = ["DecoderConfig", "DecoderLM", "DecoderOutput"]

#: the refusal of an empty batch with a key/value cache (without one, B = 0 gives an empty batch)
_EMPTY_WITH_CACHE = ("input_ids: empty batch (shape {shape}) with a key/value cache: a cache holds the tokens of at "
                     "least one sequence (an empty batch without cache= gives an empty output)")
#: a cache estimate below this many bytes is never compared with the available memory
_CACHE_GUARD_FROM = 256e6

NORMS = ("rms", "layer")
#: the attention term A (module docstring)
ATTENTION_KINDS = ("softmax", "sliced_relu")
#: the splitting of A and F
DECODER_SCHEMES = ("lie", "strang", "parallel")
MLPS = ("gated", "plain")
POSITIONS = ("rope", "learned")


def _bool(v, name):
    if not isinstance(v, bool):
        raise TypeError(f"DecoderConfig.{name}: expected a bool, got {type(v).__name__} {v!r}")
    return v


@dataclass
class DecoderConfig:
    """The shape and options of a :class:`DecoderLM` (see the module docstring's table).

    ``padding_idx``: the token whose embedding row gets no gradient (``nn.Embedding``'s).
    ``hf_arithmetic=True`` evaluates the RMS norms and the rotary angles in float32 whatever
    the model's dtype, as Hugging Face's Llama family does (the converters set it).
    """

    vocab_size: int
    d_model: int
    n_layers: int
    n_heads: int
    d_ff: int
    n_kv_heads: int | None = None
    head_dim: int | None = None
    norm: str = "rms"
    norm_eps: float = 1e-6
    mlp: str = "gated"
    activation: str = "silu"
    positions: str = "rope"
    rope_theta: float = 10000.0
    max_positions: int | None = None
    qkv_bias: bool = False
    out_bias: bool = False
    mlp_bias: bool = False
    norm_bias: bool = False
    tie_embeddings: bool = False
    lm_head: bool = True
    scale: float | None = None
    attention_dropout: float = 0.0
    residual_dropout: float = 0.0
    embedding_dropout: float = 0.0
    hf_arithmetic: bool = False
    padding_idx: int | None = None
    attention: str = "softmax"
    scheme: str = "lie"

    def __post_init__(self):
        for name in ("vocab_size", "d_model", "n_layers", "n_heads", "d_ff"):
            setattr(self, name, check_positive_int(getattr(self, name), f"DecoderConfig.{name}"))
        if self.n_kv_heads is None:
            self.n_kv_heads = self.n_heads
        self.n_kv_heads = check_positive_int(self.n_kv_heads, "DecoderConfig.n_kv_heads")
        if self.n_heads % self.n_kv_heads:
            raise ValueError(
                f"DecoderConfig.n_kv_heads: {self.n_kv_heads} key/value heads must divide n_heads = {self.n_heads}"
            )
        if self.head_dim is None:
            # sliced attention has no softmax heads to split the features (head_dim is unused there)
            if self.d_model % self.n_heads and self.attention != "sliced_relu":
                raise ValueError(f"DecoderConfig: d_model = {self.d_model} is not divisible by n_heads = "
                                 f"{self.n_heads}; pass head_dim")
            self.head_dim = max(1, self.d_model // self.n_heads)
        self.head_dim = check_positive_int(self.head_dim, "DecoderConfig.head_dim")
        for name, allowed in (("norm", NORMS), ("mlp", MLPS), ("positions", POSITIONS),
                              ("attention", ATTENTION_KINDS), ("scheme", DECODER_SCHEMES)):
            if getattr(self, name) not in allowed:
                raise ValueError(f"DecoderConfig.{name}: expected one of {allowed}, got {getattr(self, name)!r}")
        activation_fn(self.activation)
        self.norm_eps = check_positive_float(self.norm_eps, "DecoderConfig.norm_eps", allow_zero=True)
        self.rope_theta = check_positive_float(self.rope_theta, "DecoderConfig.rope_theta")
        if self.positions == "rope" and self.head_dim % 2:
            raise ValueError(f"DecoderConfig.head_dim: rotary positions need an even head size, got {self.head_dim}")
        if self.positions == "learned":
            if self.max_positions is None:
                raise ValueError("DecoderConfig.max_positions: learned positions need the table size")
            self.max_positions = check_positive_int(self.max_positions, "DecoderConfig.max_positions")
        for name in ("qkv_bias", "out_bias", "mlp_bias", "norm_bias", "tie_embeddings", "lm_head", "hf_arithmetic"):
            _bool(getattr(self, name), name)
        if self.norm_bias and self.norm != "layer":
            raise ValueError("DecoderConfig.norm_bias: only a LayerNorm has a bias (norm='layer')")
        if self.scale is None:
            self.scale = 1.0 / math.sqrt(self.head_dim)
        self.scale = check_positive_float(self.scale, "DecoderConfig.scale")
        for name in ("attention_dropout", "residual_dropout", "embedding_dropout"):
            setattr(self, name, check_probability(getattr(self, name), f"DecoderConfig.{name}"))
        if self.attention == "sliced_relu":
            why = {"positions": self.positions == "rope", "n_kv_heads": self.n_kv_heads != self.n_heads,
                   "qkv_bias": self.qkv_bias, "out_bias": self.out_bias,
                   "attention_dropout": self.attention_dropout > 0}
            bad = [k for k, v in why.items() if v]
            if bad:
                raise ValueError(f"DecoderConfig.{bad[0]}: attention='sliced_relu' has no rotary positions "
                                 "(positions='learned'), no grouped key/value heads, no attention biases and no "
                                 f"attention dropout; got {bad[0]}={getattr(self, bad[0])!r}")
        if self.padding_idx is not None:
            if isinstance(self.padding_idx, bool) or not isinstance(self.padding_idx, int) or \
                    not 0 <= self.padding_idx < self.vocab_size:
                raise ValueError(f"DecoderConfig.padding_idx: expected None or an id in [0, {self.vocab_size - 1}], "
                                 f"got {self.padding_idx!r}")


@dataclass
class DecoderOutput:
    """What :class:`DecoderLM` returns: logits ``(B, N, vocab)`` (``None`` without a head),
    the normalised final state ``(B, N, d_model)`` and the cache passed in (if any)."""

    logits: Tensor | None
    last_hidden_state: Tensor
    cache: KVCache | None = None


def _frozen_substep(s: Substep, t: float, dt: float, grid: Grid, dtype):
    """A substep over ``[t, t + dt]`` as ``f(u, grid)`` with its term's controls evaluated once
    (:mod:`opsplit.operators._fused`): explicit Euler is :meth:`ExplicitEuler.step`'s
    ``u + dt * A(t; u)`` in one fused pass; another solver is called as it is."""
    if type(s.solver) is ExplicitEuler and len(s.terms) == 1:
        f = frozen_field(s.terms[0], t, grid, dtype)
        return lambda u, g: torch.add(u, f(u, g), alpha=dt)
    return lambda u, g: s.solver.step(s.terms, t, dt, u, g)


def _frozen_parallel(scheme: Parallel, t: float, dt: float, grid: Grid, dtype):
    """A step of the parallel scheme of explicit-Euler substeps of one term each, with the
    terms' controls evaluated once: :class:`~opsplit.schemes.Parallel`'s loop (every term from
    the same state with its field scaled by :math:`K`, one Euler step each, then the average)
    in the same operations; ``None`` for any other parallel scheme."""
    subs = list(scheme.substeps)
    if scheme.batch is not False or any(type(s.solver) is not ExplicitEuler or len(s.terms) != 1 for s in subs):
        return None
    K = len(subs)
    fields = [frozen_field(s.terms[0], t, grid, dtype) for s in subs]
    factor = float(K)

    def step(u, g):
        total = None
        for f in fields:
            v = torch.add(u, factor * f(u, g), alpha=dt)
            total = v if total is None else total + v
        return total / K

    return step


def _solve_tag(solver, scheme) -> str | None:
    """The name a key/value cache records for a solve (``None``: the model's own)."""
    if solver is None and scheme is None:
        return None
    return f"solver={solver or 'own'}, scheme={scheme or 'own'}"


def _evaluations(scheme) -> tuple[int, int]:
    """Term evaluations and attention evaluations of one step of a decoder ``scheme``
    (Strang: two half steps of its first terms; a solver of ``s`` stages: ``s`` per term)."""
    subs = list(scheme.substeps)
    weights = [2] * (len(subs) - 1) + [1] if isinstance(scheme, Strang) else [1] * len(subs)
    terms = attn = 0
    for w, sub in zip(weights, subs):
        stages = getattr(sub.solver, "stages", None) or 1
        terms += w * stages * len(sub.terms)
        attn += w * stages * sum(1 for op in sub.terms if _has_attention(op))
    return terms, attn


def _has_attention(op) -> bool:
    return any(isinstance(m, (GroupedQueryAttention, SlicedReLUAttention)) for m in op.modules())


class DecoderLM(nn.Module):
    r""":math:`G \circ \bar{\mathcal N} \circ F_{\text{in}}` of the module docstring.

    Args:
        config: a :class:`DecoderConfig`.
        generator: ``torch.Generator`` for the initialisation (GPT-2's: normal, std 0.02).
        device, dtype: factory kwargs.

    Attributes: ``embedding`` (the token table), ``positions`` (a
    :class:`~opsplit.controls.PositionTable` or ``None``), ``decoder`` (the
    :class:`~opsplit.propagator.Propagator`), ``final_norm`` (the maps of :math:`G`),
    ``head`` (the read-out table, ``None`` when tied or absent); ``attention``, ``ffn``,
    ``norms`` name the scheme's operators.
    """

    def __init__(self, config: DecoderConfig, *, generator: torch.Generator | None = None, device=None, dtype=None):
        super().__init__()
        if not isinstance(config, DecoderConfig):
            raise TypeError(f"DecoderLM.config: expected a DecoderConfig, got {type(config).__name__}")
        self.config = c = config
        fk = {"device": device, "dtype": dtype or torch.get_default_dtype()}
        L, E, H, Hkv, d, Fz = c.n_layers, c.d_model, c.n_heads, c.n_kv_heads, c.head_dim, c.d_ff

        def pc(*shape, fill=0.0):  # one parameter per layer (LayerwiseConstant: no O(L^2) gradient traffic)
            return LayerwiseConstant(torch.full((L, *shape), fill, **fk), t0=0.0, t1=float(L))

        rotary = None
        if c.positions == "rope":
            rotary = RotaryEmbedding(d, c.rope_theta, compute_dtype=torch.float32 if c.hf_arithmetic else None)
        if c.attention == "sliced_relu":
            attention = SlicedReLUAttention.build(E, H, projection="mlp", causal=True, n_steps=L, t0=0.0,
                                                  t1=float(L), cache="kv_cache", key_padding_mask="key_padding_mask",
                                                  **fk)
        else:
            attention = GroupedQueryAttention(
                pc(E, H, d), pc(E, Hkv, d), pc(E, Hkv, d), pc(H, d, E),
                bQ=pc(H, d) if c.qkv_bias else None, bK=pc(Hkv, d) if c.qkv_bias else None,
                bV=pc(Hkv, d) if c.qkv_bias else None, bO=pc(E) if c.out_bias else None,
                scale=c.scale, causal=True, rotary=rotary, dropout=c.attention_dropout,
                key_padding_mask="key_padding_mask", positions="positions", cache="kv_cache",
            )
        b = c.mlp_bias
        if c.mlp == "gated":
            ffn = GatedFeedForward(pc(E, Fz), pc(E, Fz), pc(Fz, E), b_gate=pc(Fz) if b else None,
                                   b_up=pc(Fz) if b else None, b_down=pc(E) if b else None,
                                   activation=c.activation)
        else:
            ffn = FeedForward(pc(E, Fz), pc(Fz) if b else None, pc(Fz, E), pc(E) if b else None,
                              activation=c.activation)
        norm1, norm2 = self._norm(pc(E, fill=1.0), pc(E) if c.norm_bias else None), \
            self._norm(pc(E, fill=1.0), pc(E) if c.norm_bias else None)
        p = c.residual_dropout
        a_term = FieldDropout(attention, p) if p else attention
        f_term = FieldDropout(ffn, p) if p else ffn
        subs = [Substep(PreNorm(a_term, norm1), ExplicitEuler()), Substep(PreNorm(f_term, norm2), ExplicitEuler())]
        if c.scheme == "parallel":
            # both terms from the same state, one Euler step of their sum (eq. 59); the loop, not
            # vmap (the two terms differ, and the attention reads call-time inputs)
            scheme = Parallel(subs, batch=False)
        else:
            scheme = (Strang if c.scheme == "strang" else Lie)(subs)
        self.decoder = Propagator(scheme, L, t0=0.0, t1=float(L), grid=Grid.paper(None, E, nh=H))
        # named access (not registered again: the operators live in the scheme)
        self.__dict__["_parts"] = {"attention": attention, "ffn": ffn, "norms": (norm1, norm2)}

        self.embedding = nn.Embedding(c.vocab_size, E, padding_idx=c.padding_idx, **fk)
        self.positions = None
        if c.positions == "learned":
            self.positions = PositionTable(torch.zeros(c.max_positions, E, **fk))
        self.final_norm = nn.ModuleList(self._norm(nn.Parameter(torch.ones(E, **fk)),
                                                    nn.Parameter(torch.zeros(E, **fk)) if c.norm_bias else None))
        self.head = None
        if c.lm_head and not c.tie_embeddings:
            self.head = nn.Parameter(torch.empty(c.vocab_size, E, **fk))  # (vocab, d_model), as nn.Linear
        self.check_finite_input = True
        #: generate's defaults for eos_token_id / pad_token_id (from_hf: the HF generation config's)
        self.generation_defaults: dict = {}
        self.reset_parameters(generator)

    def _norm(self, weight, bias) -> list:
        c = self.config
        if c.norm == "layer":
            return [PointwiseAffine(weight, bias, projection=ProjectionS1(0.0, 1.0, eps=c.norm_eps))]
        cd = torch.float32 if c.hf_arithmetic else None
        return [ProjectionSphere(1.0, eps=c.norm_eps, compute_dtype=cd), PointwiseAffine(weight, None)]

    # -- named parts ------------------------------------------------------------------------------
    @property
    def attention(self) -> GroupedQueryAttention | SlicedReLUAttention:
        return self._parts["attention"]

    @property
    def ffn(self) -> FeedForward:
        return self._parts["ffn"]

    @property
    def norms(self) -> tuple:
        """The maps of the two pre-norms (lists: [projection, affine] or [fused LayerNorm])."""
        return self._parts["norms"]

    @property
    def head_weight(self) -> Tensor | None:
        """The read-out table ``(vocab, d_model)``: the token table when tied."""
        if not self.config.lm_head:
            return None
        return self.embedding.weight if self.head is None else self.head

    @property
    def n_layers(self) -> int:
        return self.config.n_layers

    @property
    def vocab_size(self) -> int:
        return self.config.vocab_size

    @property
    def max_positions(self) -> int | None:
        """The learned position table's size (``None`` with rotary positions: no limit)."""
        return None if self.positions is None else self.positions.n_positions

    @torch.no_grad()
    def reset_parameters(self, generator: torch.Generator | None = None, *, init: str = "gpt2") -> None:
        """GPT-2's initialisation from ``generator`` (``init="gpt2"``, the default): weights
        normal with std 0.02, biases 0, norm weights 1; a sliced attention term then draws
        its own (:meth:`SlicedReLUAttention.reset_parameters`, as ``nn.Linear``).
        ``init="nanogpt"``: nanoGPT's (the residual projections' std 0.02 / sqrt(2 n_layers),
        drawn as a plain-torch nanoGPT draws them: :mod:`opsplit.models.nanogpt_init`; GPT-2
        layout with softmax attention only)."""
        if init not in INITS:
            raise ValueError(f"DecoderLM.reset_parameters.init: expected one of {INITS}, got {init!r}")
        if generator is not None and not isinstance(generator, torch.Generator):
            raise TypeError(f"DecoderLM.reset_parameters.generator: expected a torch.Generator or None, got "
                            f"{type(generator).__name__}")
        if init == "nanogpt":
            nanogpt_init(self, generator)
            return

        def params(ctl):
            return [] if ctl is None else list(ctl.parameters())

        ones, zeros = [], []
        for m in self.modules():
            if isinstance(m, PointwiseAffine):
                ones += params(m.weight)
                zeros += params(m.bias)
        a, f = self.attention, self.ffn
        sliced = isinstance(a, SlicedReLUAttention)
        for c in (f.b1, f.b2, getattr(f, "b_up", None)) + (() if sliced else (a.bQ, a.bK, a.bV, a.bO)):
            zeros += params(c)
        for p in ones:
            p.fill_(1.0)
        for p in zeros:
            p.zero_()
        done = {id(p) for p in ones + zeros} | ({id(p) for p in a.parameters()} if sliced else set())
        for p in self.parameters():
            if id(p) not in done:
                p.copy_(torch.randn(p.shape, generator=generator, dtype=torch.float64).mul_(0.02).to(p))
        if sliced:
            a.reset_parameters(generator)

    # -- solves ------------------------------------------------------------------------------
    def solve_scheme(self, solver: str | None = None, scheme: str | None = None):
        """The decoder's scheme with another substep ``solver`` (``"euler"``, ``"heun"``,
        ``"rk4"``; ``None``: the model's own) and/or another splitting ``scheme`` (``"lie"``,
        ``"strang"``, ``"parallel"``; ``None``: the model's own), on the same operators (shared
        controls, nothing copied); both ``None``: ``model.decoder.scheme`` itself.

        A parallel scheme with a solver of several stages advances both terms together by that
        solver (one substep of both terms: the flow of :math:`u_t = A + F`, not the average of
        :math:`K`-scaled solves), as :func:`opsplit.control.swap.solved_with` does."""
        if solver is not None and solver not in EXPLICIT_SOLVERS:
            raise ValueError(f"solver: expected None (the model's own) or one of {EXPLICIT_SOLVERS}, got {solver!r}")
        if scheme is not None and scheme not in DECODER_SCHEMES:
            raise ValueError(f"scheme: expected None (the model's own) or one of {DECODER_SCHEMES}, got {scheme!r}")
        own = self.decoder.scheme
        if solver is None and scheme is None:
            return own
        subs = list(own.substeps)
        if type(own) not in (Lie, Strang, Parallel) or len(subs) != 2 or any(len(x.terms) != 1 for x in subs):
            raise ValueError(f"solver: the decoder's scheme ({type(own).__name__} of {len(subs)} substeps) is not the "
                             "splitting of its attention and feed-forward terms this model builds; it cannot be "
                             "solved another way")
        kind = scheme or {Lie: "lie", Strang: "strang", Parallel: "parallel"}[type(own)]
        terms = [x.terms[0] for x in subs]
        solvers = [x.solver for x in subs] if solver is None else [solver_for(solver) for _ in subs]
        if kind == "parallel" and any(type(v) is not ExplicitEuler for v in solvers):
            return Lie([Substep(tuple(terms), solvers[0])])
        new = [Substep(op, v) for op, v in zip(terms, solvers)]
        if kind == "parallel":
            return Parallel(new, batch=False)
        return (Strang if kind == "strang" else Lie)(new)

    def solve_cost(self, n_steps: int | None = None, solver: str | None = None, scheme: str | None = None) -> int:
        """Term evaluations (attention and feed-forward, every stage of a solver counted) of
        one token through the decoder solved with :math:`N_t` = ``n_steps`` (``None``: the
        model's), ``solver`` and ``scheme`` (:meth:`solve_scheme`): what a draft solve of
        speculative decoding is compared by."""
        n = self.decoder.n_steps if n_steps is None else check_positive_int(n_steps, "n_steps (N_t)")
        return n * _evaluations(self.solve_scheme(solver, scheme))[0]

    def _propagator(self, solver, scheme):
        """``model.decoder``, or a propagator of :meth:`solve_scheme` on the same interval and
        grid (made per call: nothing of it is kept)."""
        if solver is None and scheme is None:
            return self.decoder
        d = self.decoder
        return Propagator(self.solve_scheme(solver, scheme), d.n_steps, t0=d.t0, t1=d.t1, grid=d.grid)

    # -- inputs ------------------------------------------------------------------------------
    def _dtype_device(self):
        p = self.embedding.weight
        return p.dtype, p.device

    def check_inputs(self, input_ids, attention_mask=None, position_ids=None, cache=None, *, values: bool = True,
                     n_steps: int | None = None, solve: str | None = None):
        """Validate a call's inputs (before any compute); returns ``(past, mask)`` with the
        mask as a bool tensor ``(B, past + N)`` (``True`` = keep) or ``None``.  ``values=False``
        checks types and shapes only (generation's later steps feed the model's own tokens);
        ``n_steps``, ``solve``: the call's :math:`N_t` and solver/scheme, checked against the
        cache's (:meth:`KVCache.check_use <opsplit.operators.KVCache.check_use>`)."""
        c = self.config
        if not isinstance(input_ids, Tensor):
            raise TypeError(f"input_ids: expected a torch.Tensor of token ids, got {type(input_ids).__name__}")
        if input_ids.is_floating_point() or input_ids.is_complex() or input_ids.dtype == torch.bool:
            raise TypeError(f"input_ids: expected integer token ids, got dtype {input_ids.dtype}")
        if input_ids.dtype not in (torch.int64, torch.int32):
            raise TypeError(f"input_ids: expected token ids of dtype torch.int64 (or torch.int32), as an embedding "
                            f"reads them, got {input_ids.dtype}")
        if input_ids.dim() != 2:
            raise ValueError(f"input_ids: expected shape (B, N), got {tuple(input_ids.shape)}")
        B, N = input_ids.shape
        if N == 0:
            raise ValueError(f"input_ids: empty prompt (shape {tuple(input_ids.shape)}): expected at least one token")
        _, device = self._dtype_device()
        if input_ids.device != device:
            raise ValueError(f"input_ids: on device {input_ids.device}, the model is on {device}")
        # (an empty batch B = 0 has no ids to read: its output is an empty batch, as torch's modules give)
        lo, hi = (int(input_ids.min()), int(input_ids.max())) if values and B else (0, 0)
        if lo < 0 or hi >= c.vocab_size:
            raise ValueError(f"input_ids: token ids must lie in [0, {c.vocab_size - 1}] (vocab_size = "
                             f"{c.vocab_size}), got range [{lo}, {hi}]")
        if cache is not None and not isinstance(cache, KVCache):
            raise TypeError(f"cache: expected an opsplit KVCache or None, got {type(cache).__name__}")
        if cache is not None and B == 0:
            raise ValueError(_EMPTY_WITH_CACHE.format(shape=tuple(input_ids.shape)))
        if cache is not None:
            dtype, _ = self._dtype_device()
            cache.check_use(self, B, self.decoder.n_steps if n_steps is None else n_steps, dtype, device,
                            solve=solve)
        past = 0 if cache is None else cache.length
        mask = None
        if attention_mask is not None:
            if not isinstance(attention_mask, Tensor):
                raise TypeError(f"attention_mask: expected a torch.Tensor (B, N) of 0/1, got {type(attention_mask).__name__}")
            want = (B, past + N)
            if tuple(attention_mask.shape) != want:
                raise ValueError(
                    f"attention_mask: expected shape (B, past + N) = {want} (1 = token, 0 = padding"
                    + (f"; {past} tokens cached" if past else "") + f"), got {tuple(attention_mask.shape)}"
                )
            if attention_mask.device != device:
                raise ValueError(f"attention_mask: on device {attention_mask.device}, the model is on {device}")
            mask = attention_mask if attention_mask.dtype == torch.bool else attention_mask != 0
            if values and attention_mask.dtype != torch.bool and \
                    not bool(((attention_mask == 0) | (attention_mask == 1)).all()):
                raise ValueError("attention_mask: expected values 0 (padding) and 1 (token)")
        if position_ids is not None:
            if not isinstance(position_ids, Tensor) or position_ids.dim() != 2 or \
                    position_ids.shape[0] not in (1, B) or position_ids.shape[1] != N:
                shape = tuple(position_ids.shape) if isinstance(position_ids, Tensor) else type(position_ids).__name__
                raise ValueError(f"position_ids: expected shape (B, N) = ({B}, {N}) or (1, {N}), got {shape}")
            if position_ids.is_floating_point() and not bool(torch.isfinite(position_ids).all()):
                raise ValueError("position_ids: expected finite positions")
        if self.positions is not None and values:
            pos = position_ids if position_ids is not None else self.token_positions(N, past, device)
            if pos.numel() and float(pos.min()) < 0:
                raise ValueError(f"position_ids: expected positions >= 0 (coordinates counted from the first token, "
                                 f"read from the learned position table), got min {float(pos.min()):g}")
            if pos.numel() and (float(pos.max()) > self.positions.n_positions - 1 or float(pos.min()) < 0):
                raise ValueError(
                    f"input_ids: positions up to {float(pos.max()):g} (sequence of {N} tokens"
                    + (f" after {past} cached" if past else "") + f") exceed the learned positions of the model: "
                    f"max_positions = {self.positions.n_positions} (GPT-2's n_positions)"
                )
        return past, mask

    def cache_memory(self, batch_size: int, n_tokens: int, n_steps: int | None = None, *,
                     decode: bool = False, solver: str | None = None,
                     scheme: str | None = None) -> tuple[float, list[str]]:
        """A lower bound of the memory a key/value cache holds once ``n_tokens`` tokens of a
        batch of ``batch_size`` went through the decoder with :math:`N_t` = ``n_steps``
        (default: the model's), and its parts in words: every attention call of every step
        keeps its own keys and values (softmax: :math:`2 H_{kv} d` numbers per token; sliced:
        the :math:`H N_y` value rows), so the cache grows with :math:`N_t`; with ``decode``,
        :meth:`decode_steps`'s kernels evaluated once per attention call (softmax:
        :math:`W^Q, W^K, W^V` side by side and :math:`W^O`); ``solver``, ``scheme``: of
        :meth:`solve_scheme` (every stage of a solver keeps its own keys)."""
        c = self.config
        n = self.decoder.n_steps if n_steps is None else int(n_steps)
        calls = n * _evaluations(self.solve_scheme(solver, scheme))[1]  # Strang: two half steps of A
        item = self.embedding.weight.element_size()
        sliced = c.attention == "sliced_relu"
        per_token = (c.n_heads * c.d_model if sliced else 2 * c.n_kv_heads * c.head_dim) * item
        parts = [(float(calls) * batch_size * n_tokens * per_token,
                  f"keys and values of {batch_size} x {n_tokens} tokens for {calls} attention calls")]
        if decode and not sliced:
            kernel = (c.d_model * (c.n_heads + 2 * c.n_kv_heads) * c.head_dim + c.n_heads * c.head_dim * c.d_model)
            parts.append((float(calls) * kernel * item, f"the decode kernels of {calls} attention calls"))
        return sum(b for b, _ in parts), [f"{what}: {human_bytes(b)}" for b, what in parts]

    def check_cache_memory(self, name: str, batch_size: int, n_tokens: int, n_steps: int | None = None, *,
                           decode: bool = False, solver: str | None = None, scheme: str | None = None) -> None:
        """Refuse, before anything is allocated, a use of a key/value cache whose
        :meth:`cache_memory` exceeds the available memory (``MemAvailable``): a ``ValueError``
        starting with ``name`` (the argument that makes it large) with the estimate.  Nothing is
        read below 256 MB."""
        need, parts = self.cache_memory(batch_size, n_tokens, n_steps, decode=decode, solver=solver, scheme=scheme)
        if need < _CACHE_GUARD_FROM:
            return
        free = available_memory()
        if need > free:
            n = self.decoder.n_steps if n_steps is None else int(n_steps)
            raise ValueError(
                f"{name}: a key/value cache over N_t = {n} steps holds at least {human_bytes(need)} "
                f"({'; '.join(parts)}), more than the {human_bytes(free)} available; expected a smaller n_steps "
                f"(the model's own is {self.decoder.n_steps}), fewer tokens or a smaller batch")

    # -- the map -------------------------------------------------------------------------------
    def token_positions(self, n: int, past: int = 0, device=None) -> Tensor:
        """The coordinates :math:`\\xi` of ``n`` new tokens after ``past`` cached ones on the
        decoder's token grid, read by the learned positions and by the rotary ones alike
        (:meth:`RotaryEmbedding.token_positions`, :math:`\\xi_i = n_{past} h + x_i - x_1`):
        the integers ``past, ..., past + n - 1`` on a grid of spacing 1 (the paper's), real
        coordinates on a refined grid."""
        x = self.decoder.grid.x
        if x.spacing == 1.0:
            return torch.arange(past, past + n, device=device)
        return RotaryEmbedding.token_positions(self.decoder.grid, n, past, device)

    def embed(self, input_ids: Tensor, past: int = 0, position_ids: Tensor | None = None, *,
              check: bool = True) -> Tensor:
        """:math:`F_{\\text{in}}`: token table (+ learned positions :math:`P(\\xi(x), y)` at the
        grid's token coordinates, :meth:`token_positions`, or at ``position_ids``),
        ``(B, N, d_model)`` (``check=False``: the positions were checked against the table
        already)."""
        u = self.embedding(input_ids)
        if self.positions is not None:
            N = input_ids.shape[1]
            pos = position_ids if position_ids is not None else \
                self.token_positions(N, past, input_ids.device).unsqueeze(0)
            u = u + self.positions.at(pos, check=check)
        if self.config.embedding_dropout and self.training:
            u = F.dropout(u, self.config.embedding_dropout, True)
        return u

    def hidden(self, input_ids: Tensor, attention_mask: Tensor | None = None, *,
               position_ids: Tensor | None = None, cache: KVCache | None = None,
               n_steps: int | None = None, check_values: bool = True, solver: str | None = None,
               scheme: str | None = None) -> Tensor:
        """:math:`G` without the read-out: the normalised final state ``(B, N, d_model)``.
        Every parameter is checked finite before any compute, named by its qualified name
        (``DecoderLM: parameters must be finite, but embedding.weight hold(s) NaN/inf``: also
        the row of a token the input does not use; re-read only after a parameter changes);
        a ``ValueError`` raised during the solve (a non-finite state) re-reads every
        parameter first, so a NaN written through ``.data`` is named.  ``check_values=False``
        skips these checks and the propagator's finiteness checks of the input and the
        output (generation: checked at the prompt, unchanged after).  ``solver``, ``scheme``:
        solve the decoder another way (:meth:`solve_scheme`)."""
        if n_steps is not None:
            n_steps = check_positive_int(n_steps, "n_steps (N_t)")
        prop = self._propagator(solver, scheme)
        past, mask = self.check_inputs(input_ids, attention_mask, position_ids, cache, values=check_values,
                                       n_steps=n_steps, solve=_solve_tag(solver, scheme))
        if check_values and self.check_finite_input:
            check_parameters_finite(self, type(self).__name__)
        if cache is not None and check_values:  # the cache grows with N_t: refused before it is filled
            self.check_cache_memory("n_steps (N_t)" if n_steps is not None else "input_ids", input_ids.shape[0],
                                    past + input_ids.shape[1], n_steps, solver=solver, scheme=scheme)
        u = self.embed(input_ids, past, position_ids, check=False)  # check_inputs (or generate) checked them
        ctx = {}
        if mask is not None and not bool(mask.all()):
            ctx["key_padding_mask"] = ~mask
        if position_ids is not None and self.positions is None:
            ctx["positions"] = position_ids
        if cache is not None:
            cache.begin(u.shape[1])
            ctx["kv_cache"] = cache
        # always a ContextGrid: its per-call cache shares the rotary angles and the masks across layers
        g = ContextGrid.of(self.decoder.grid, **ctx).with_shape(u.shape[1], self.config.d_model)
        try:
            u = prop(u, n_steps=n_steps, grid=g, check_finite_input=self.check_finite_input and check_values)
        except ValueError:
            if check_values:  # a NaN written through p.data (the embedding's too) is named before anything else
                check_parameters_finite(self, type(self).__name__, fresh=True)
            raise
        t1 = self.decoder.t1
        for n in self.final_norm:
            u = n.flow(t1, 1.0, u, g) if n.has_flow else n.resolvent(t1, 1.0, u, g)
        return u

    def forward(self, input_ids: Tensor, attention_mask: Tensor | None = None, *, position_ids: Tensor | None = None,
                cache: KVCache | None = None, n_steps: int | None = None, solver: str | None = None,
                scheme: str | None = None) -> DecoderOutput:
        """Logits of every position (see the module docstring); with ``cache`` the ids are the
        new tokens, the mask covers cached and new ones, and the cache is extended; ``solver``,
        ``scheme``: :meth:`solve_scheme`."""
        h = self.hidden(input_ids, attention_mask, position_ids=position_ids, cache=cache, n_steps=n_steps,
                        solver=solver, scheme=scheme)
        W = self.head_weight
        logits = None if W is None else self._read_out(h, W, True)
        return DecoderOutput(logits=logits, last_hidden_state=h, cache=cache)

    def _read_out(self, h: Tensor, W: Tensor, check_values: bool) -> Tensor:
        """The logits ``<h, E_v>``, checked finite (a non-finite one re-reads every parameter
        first: a NaN written through ``.data`` into the read-out table is named)."""
        logits = F.linear(h, W)
        if check_values and self.check_finite_input:
            try:
                check_output(logits, f"{type(self).__name__} logits")
            except ValueError:
                check_parameters_finite(self, type(self).__name__, fresh=True)
                raise
        return logits

    def next_token_logits(self, input_ids: Tensor, attention_mask: Tensor | None = None, *,
                          position_ids: Tensor | None = None, cache: KVCache | None = None,
                          n_steps: int | None = None, check_values: bool = True, solver: str | None = None,
                          scheme: str | None = None) -> Tensor:
        """The logits of the last position only, ``(B, vocab)`` (what generation reads; the
        read-out is applied to one token), solved with ``n_steps`` (default: the model's N_t),
        ``solver`` and ``scheme`` (:meth:`solve_scheme`)."""
        W = self.head_weight
        if W is None:
            raise ValueError("DecoderLM.next_token_logits: the model has no read-out (lm_head=False)")
        h = self.hidden(input_ids, attention_mask, position_ids=position_ids, cache=cache, n_steps=n_steps,
                        check_values=check_values, solver=solver, scheme=scheme)
        return self._read_out(h[:, -1], W, check_values)

    def decode_steps(self, cache: KVCache, *, n_steps: int | None = None, solver: str | None = None,
                     scheme: str | None = None):
        """The decode steps of one generation, after its prompt went through
        :meth:`next_token_logits` with ``cache`` (and the same ``n_steps``, ``solver``,
        ``scheme``): a function ``step(input_ids, position_ids, key_padding_mask, last=True)``
        of the new tokens ``(B, m)``, their positions ``(B, m)`` and the padding of every token
        so far (``(B, past + m)``, ``True`` = padded, or ``None``) that extends ``cache`` and
        returns the next-token logits ``(B, vocab)`` of the last new token (``last=False``:
        ``(B, m, vocab)``, of every new token: the verification of speculative decoding).

        The scheme's steps are made once, here, with every control evaluated at its step's
        time (:mod:`opsplit.operators._fused`; Lie splitting with explicit-Euler substeps,
        the decoder's own, and the parallel scheme of explicit-Euler substeps; another scheme
        or solver is advanced as it is), and the steps run no checks:
        :func:`~opsplit.models.generate.generate` has validated the prompt, the parameters
        (finite), the grid and every operator against it at the prompt, and it feeds tokens
        the model produced, with positions it made.  Valid while the parameters do not change
        and autograd does not record (``torch.no_grad()``); the same operations as
        :meth:`next_token_logits`, bit for bit (``tests/test_llm_decode.py``)."""
        if torch.is_grad_enabled():
            raise RuntimeError("DecoderLM.decode_steps: for calls without autograd (torch.no_grad())")
        W = self.head_weight
        if W is None:
            raise ValueError("DecoderLM.decode_steps: the model has no read-out (lm_head=False)")
        dtype = self.embedding.weight.dtype
        grid = self.decoder.grid.with_shape(1, self.config.d_model)
        sch = self.solve_scheme(solver, scheme)
        if n_steps is not None:  # the kernels are evaluated once per attention call: refused before they are made
            n_steps = check_positive_int(n_steps, "n_steps (N_t)")
            self.check_cache_memory("n_steps (N_t)", 0, 0, n_steps, decode=True, solver=solver, scheme=scheme)
        times = self.decoder.times(n_steps)
        steps = []
        for a, b in zip(times[:-1], times[1:]):
            dt = b - a
            if type(sch) is Lie:
                steps += [_frozen_substep(s, a, dt, grid, dtype) for s in sch.substeps]
                continue
            fused = _frozen_parallel(sch, a, dt, grid, dtype) if type(sch) is Parallel else None
            steps.append(fused if fused is not None else (lambda u, g, a=a, dt=dt: sch.advance(a, dt, u, g)[0]))
        final = [frozen_map(m, self.decoder.t1, grid, dtype) for m in self.final_norm]
        rope = self.positions is None
        x, y, h = grid.x, grid.y, grid.h

        def step(input_ids: Tensor, position_ids: Tensor, key_padding_mask: Tensor | None,
                 last: bool = True) -> Tensor:
            u = self.embed(input_ids, 0, position_ids, check=False)
            ctx = {"kv_cache": cache}
            if key_padding_mask is not None:
                ctx["key_padding_mask"] = key_padding_mask
            if rope:
                ctx["positions"] = position_ids
            g = ContextGrid(x=x, y=y, h=h, context=ctx)
            cache.begin(u.shape[1])
            for f in steps:
                u = f(u, g)
            for f in final:
                u = f(u, g)
            return F.linear(u[:, -1] if last else u, W)

        return step

    def generate(self, input_ids: Tensor, max_new_tokens: int, **kwargs) -> Tensor:
        """:func:`opsplit.models.generate.generate` with this model."""
        from .generate import generate

        return generate(self, input_ids, max_new_tokens, **kwargs)

    def extra_repr(self) -> str:
        c = self.config
        return (f"vocab_size={c.vocab_size}, d_model={c.d_model}, n_layers={c.n_layers}, n_heads={c.n_heads}, "
                f"n_kv_heads={c.n_kv_heads}, norm={c.norm!r}, mlp={c.mlp!r}, positions={c.positions!r}")
