r"""A pre-norm decoder whose attention term is an argument, and a per-token classifier on it
(paper 002, §4.2, eq. 36), for comparing attention integrals on long sequences.

:class:`AttentionDecoder` is the continuous pre-norm model
:math:`u_t = \mathcal A(\mathrm{LN}_1(u)) + F(\mathrm{LN}_2(u))` split by the Lie scheme
(attention, then the feed-forward term :math:`F`; explicit-Euler substeps, so with
:math:`\Delta t = 1` one step is the pre-norm layer ``x + A(LN(x))``, ``x + FFN(LN(x))``).
The attention term :math:`\mathcal A` is one of

=============== =========================================================================
``softmax``     :class:`~opsplit.operators.MultiHeadAttention` (paper 002, eqs. 37–38;
                ``F.scaled_dot_product_attention``, :math:`O(N_x^2)` time)
``sliced_relu`` :class:`~opsplit.operators.SlicedReLUAttention` (paper 004, eqs. 3 and 8,
                MLP projection; :math:`O(N_x \log N_x)`, causal :math:`O(N_x \log^2 N_x)`)
``sliced_bump`` :class:`~opsplit.operators.SlicedReLUBumpAttention` (paper 004, eq. 7,
                linear projection, trainable bandwidth per head)
``none``        no attention term (the feed-forward term only: a token-wise baseline)
=============== =========================================================================

Everything else — the feed-forward term, the LayerNorms, :math:`N_t`, :math:`[0, T]`,
the scheme — is the same for every choice, and :meth:`AttentionDecoder.reset_parameters`
draws the feed-forward and LayerNorm controls *before* the attention controls from the
same generator, so that two decoders built with the same seed and different attention
start from the same feed-forward weights.

:class:`TokenClassifier` is :math:`G \circ \bar{\mathcal N} \circ F` for integer token
sequences: :math:`F` an embedding table (no positions: with ``causal=True`` attention
already sees order), :math:`\bar{\mathcal N}` a propagator, :math:`G` a LayerNorm and a
linear read-out to class logits at every token, ``(B, N) -> (B, N, C)``.

**Padding and generation.**  The attention terms of :class:`AttentionDecoder` read two call-time
inputs of the grid's context: a :class:`~opsplit.operators.KVCache` (``"kv_cache"``, causal
decoders: :func:`~opsplit.models.generate.generate` runs one new token per step) and a
key-padding mask (``"key_padding_mask"``, ``True`` = padded) that removes the left padding of
a batch of prompts from every key measure — softmax by a log-weight of :math:`-\infty`, the
sliced terms by a key weight of 0 — so that a padded sample's real tokens see what they see
unpadded.  :class:`TokenClassifier` takes the 0/1 ``attention_mask`` of Hugging Face
(``forward``, ``next_token_logits``, ``generate``).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from .._checks import (
    check_choice,
    check_parameters_finite,
    check_positive_float,
    check_positive_int,
)
from ..controls import PiecewiseConstant
from ..grid import Grid
from ..operators import (
    FeedForward,
    KVCache,
    MultiHeadAttention,
    PointwiseAffine,
    PreNorm,
    ProjectionS1,
    SlicedReLUAttention,
    SlicedReLUBumpAttention,
)
from ..operators._guard import check_output
from ..operators.context import ContextGrid
from ..propagator import Propagator
from ..schemes import Lie
from ..solvers import ExplicitEuler, Substep
from .decoder_lm import _EMPTY_WITH_CACHE
from .generate import generate as generate_tokens

__all__ = ["ATTENTIONS", "AttentionDecoder", "TokenClassifier"]

ATTENTIONS = ("softmax", "sliced_relu", "sliced_bump", "none")


def _uniform_(raw: Tensor, bound: float, g: torch.Generator | None) -> None:
    raw.copy_((torch.rand(raw.shape, generator=g, dtype=torch.float64) * 2 - 1).mul_(bound).to(raw))


class AttentionDecoder(Propagator):
    r"""The pre-norm decoder of the module docstring as a propagator.

    Args:
        d_model: :math:`N_y`.
        n_heads: :math:`H` (softmax: ``head_dim = d_model // n_heads`` with an output
            projection; sliced: :math:`H` scalar projections, each head with its own
            :math:`N_y \times N_y` value kernel, summed over heads).
        d_ff: hidden width of the feed-forward term.
        attention: one of :data:`ATTENTIONS`.
        n_steps: :math:`N_t`; ``T``: final time (default ``n_steps``, :math:`\Delta t = 1`).
        causal: position :math:`x_i` attends to :math:`x_l \le x_i` only.
        bandwidth: initial bandwidth of ``sliced_bump``.
        activation: feed-forward activation.
        generator: ``torch.Generator`` for the initialisation.
        device, dtype: factory kwargs.
    """

    def __init__(self, d_model: int, n_heads: int, d_ff: int, *, attention: str = "softmax",
                 n_steps: int = 2, T: float | None = None, causal: bool = True, bandwidth: float = 1.0,
                 activation: str = "gelu", layer_norm_eps: float = 1e-5,
                 generator: torch.Generator | None = None, device=None, dtype=None):
        d_model = check_positive_int(d_model, "AttentionDecoder.d_model")
        n_heads = check_positive_int(n_heads, "AttentionDecoder.n_heads")
        d_ff = check_positive_int(d_ff, "AttentionDecoder.d_ff")
        n_steps = check_positive_int(n_steps, "AttentionDecoder.n_steps (N_t)")
        check_choice(attention, ATTENTIONS, "AttentionDecoder.attention")
        if not isinstance(causal, bool):
            raise TypeError(f"AttentionDecoder.causal: expected a bool, got {type(causal).__name__}")
        if attention == "softmax" and d_model % n_heads:
            raise ValueError(f"AttentionDecoder: d_model = {d_model} is not divisible by n_heads = {n_heads}")
        if generator is not None and not isinstance(generator, torch.Generator):
            raise TypeError(f"AttentionDecoder.generator: expected a torch.Generator, got {type(generator).__name__}")
        bandwidth = check_positive_float(bandwidth, "AttentionDecoder.bandwidth")
        T = float(n_steps) if T is None else check_positive_float(T, "AttentionDecoder.T")
        fk = {"device": device, "dtype": dtype or torch.get_default_dtype()}

        def pc(*shape, fill=0.0):
            return PiecewiseConstant(torch.full((n_steps, *shape), fill, **fk), t0=0.0, t1=T)

        def layer_norm():
            return PointwiseAffine(pc(d_model, fill=1.0), pc(d_model),
                                   projection=ProjectionS1(0.0, 1.0, eps=layer_norm_eps))

        ffn = FeedForward.create(d_model, d_ff, n_pieces=n_steps, t0=0.0, t1=T, activation=activation, **fk)
        span = dict(n_steps=n_steps, t0=0.0, t1=T, **fk)
        # call-time inputs of the grid's context: a KVCache (generation) and the key-padding mask
        # of a left-padded batch (True = padded)
        ctx = {"cache": "kv_cache" if causal else None, "key_padding_mask": "key_padding_mask"}
        if attention == "softmax":
            attn = MultiHeadAttention.create(d_model, n_heads, n_pieces=n_steps, t0=0.0, t1=T, causal=causal,
                                             **ctx, **fk)
        elif attention == "sliced_relu":
            attn = SlicedReLUAttention.build(d_model, n_heads, projection="mlp", causal=causal, **ctx, **span)
        elif attention == "sliced_bump":
            attn = SlicedReLUBumpAttention.build(d_model, n_heads, bandwidth=bandwidth, projection="linear",
                                                 causal=causal, **ctx, **span)
        else:
            attn = None
        ln1, ln2 = layer_norm(), layer_norm()
        solver = ExplicitEuler()
        terms = [Substep(PreNorm(ffn, ln2), solver)]
        if attn is not None:
            terms.insert(0, Substep(PreNorm(attn, ln1), solver))
        super().__init__(Lie(terms), n_steps, t0=0.0, t1=T, grid=Grid.paper(None, d_model))
        self.d_model, self.n_heads, self.d_ff = d_model, n_heads, d_ff
        self.attention_kind, self.causal = attention, causal
        # named access (not registered again: the operators live in the scheme)
        self.__dict__.update(_attn=attn, _ffn=ffn, _norms=(ln1, ln2) if attn is not None else (ln2,))
        self.reset_parameters(generator)

    @property
    def attention(self):
        """The attention operator (``None`` for ``attention="none"``)."""
        return self._attn

    @torch.no_grad()
    def reset_parameters(self, generator: torch.Generator | None = None) -> None:
        """Feed-forward kernels as ``nn.Linear`` (uniform :math:`\\pm 1/\\sqrt{n_{in}}`),
        LayerNorm weight 1 / bias 0, then the attention: softmax as
        ``nn.MultiheadAttention`` (Xavier-uniform in-projection, ``nn.Linear`` output
        projection, zero biases), sliced as :meth:`SlicedReLUAttention.build`."""
        g = generator
        f = self._ffn
        for W, b in ((f.W1, f.b1), (f.W2, f.b2)):
            bound = 1.0 / math.sqrt(W.shape[0])
            _uniform_(W.raw, bound, g)
            _uniform_(b.raw, bound, g)
        for ln in self._norms:
            ln.weight.raw.fill_(1.0)
            ln.bias.raw.zero_()
        a = self._attn
        if isinstance(a, MultiHeadAttention):
            for c in (a.WQ, a.WK, a.WV):
                n_in, h, d = c.shape
                _uniform_(c.raw, math.sqrt(6.0 / (n_in + 3 * h * d)), g)
            h, d, _ = a.WO.shape
            _uniform_(a.WO.raw, 1.0 / math.sqrt(h * d), g)
            for c in (a.bQ, a.bK, a.bV, a.bO):
                c.raw.zero_()
        elif a is not None:
            a.reset_parameters(g, self.grid.y.spacing if self.grid.y.spacing is not None else 1.0)

    def extra_repr(self) -> str:
        return (f"d_model={self.d_model}, n_heads={self.n_heads}, d_ff={self.d_ff}, "
                f"attention={self.attention_kind!r}, causal={self.causal}, " + super().extra_repr())


class TokenClassifier(nn.Module):
    r""":math:`G \circ \bar{\mathcal N} \circ F` on integer tokens: logits at every position.

    Args:
        vocab_size: number of token ids (inputs in ``[0, vocab_size)``).
        n_classes: :math:`C`, logits per position.
        encoder: the propagator :math:`\bar{\mathcal N}` (e.g. an :class:`AttentionDecoder`);
            its ``d_model`` (or grid's :math:`N_y`) is the embedding size.
        generator: ``torch.Generator`` for the embedding and read-out initialisation.
        device, dtype: factory kwargs.
    """

    def __init__(self, vocab_size: int, n_classes: int, encoder: Propagator, *,
                 generator: torch.Generator | None = None, device=None, dtype=None):
        super().__init__()
        vocab_size = check_positive_int(vocab_size, "TokenClassifier.vocab_size")
        n_classes = check_positive_int(n_classes, "TokenClassifier.n_classes")
        if not isinstance(encoder, Propagator):
            raise TypeError(f"TokenClassifier.encoder: expected an opsplit Propagator, got {type(encoder).__name__}")
        d = encoder.grid.y.n if encoder.grid.y.n is not None else getattr(encoder, "d_model", None)
        if d is None:
            raise ValueError("TokenClassifier: the encoder's grid must fix N_y (the embedding size)")
        fk = {"device": device, "dtype": dtype or torch.get_default_dtype()}
        self.vocab_size, self.n_classes = vocab_size, n_classes
        self.embedding = nn.Embedding(vocab_size, d, **fk)  # F
        self.encoder = encoder
        self.norm = nn.LayerNorm(d, **fk)  # G
        self.readout = nn.Linear(d, n_classes, **fk)
        self.reset_parameters(generator)

    @torch.no_grad()
    def reset_parameters(self, generator: torch.Generator | None = None) -> None:
        """Embedding :math:`\\mathcal N(0, 1)` (as ``nn.Embedding``), read-out as
        ``nn.Linear``, LayerNorm 1 / 0; the encoder is left as it is."""
        g = generator
        e = self.embedding.weight
        e.copy_(torch.randn(e.shape, generator=g, dtype=torch.float64).to(e))
        bound = 1.0 / math.sqrt(self.readout.in_features)
        _uniform_(self.readout.weight, bound, g)
        _uniform_(self.readout.bias, bound, g)
        self.norm.reset_parameters()

    def _check_tokens(self, tokens, name: str = "TokenClassifier.tokens") -> None:
        if not isinstance(tokens, Tensor):
            raise TypeError(f"{name}: expected a torch.Tensor, got {type(tokens).__name__}")
        if tokens.dim() != 2 or tokens.dtype not in (torch.int64, torch.int32):
            raise ValueError(f"{name}: expected integer ids of shape (B, N), got shape "
                             f"{tuple(tokens.shape)} and dtype {tokens.dtype}")
        if tokens.numel() and (int(tokens.min()) < 0 or int(tokens.max()) >= self.vocab_size):
            raise ValueError(f"{name}: expected ids in [0, {self.vocab_size - 1}], got range "
                             f"[{int(tokens.min())}, {int(tokens.max())}]")

    def forward(self, tokens: Tensor, attention_mask: Tensor | None = None, *, n_steps: int | None = None) -> Tensor:
        """Logits ``(B, N, n_classes)``; ``attention_mask`` ``(B, N)`` of 0/1 (0 = padding)
        removes the padded tokens from every key measure (their own logits are not
        meaningful), as for :meth:`next_token_logits`.  Every parameter is checked finite
        before any compute, named by its qualified name (also the embedding row of a token
        the input does not use); the logits are checked finite, and a non-finite value found
        anywhere re-reads every parameter first (a NaN written through ``.data`` is named)."""
        self._check_tokens(tokens)
        mask = self._check_mask(tokens, attention_mask, 0)
        grid = None if mask is None else ContextGrid.of(self.encoder.grid, key_padding_mask=~mask)
        check_parameters_finite(self, "TokenClassifier")
        try:
            u = self.encoder(self.embedding(tokens), n_steps=n_steps, grid=grid)
            out = self.readout(self.norm(u))
            check_output(out, "TokenClassifier output")
        except ValueError:  # a NaN written through .data (no version change) is named first
            check_parameters_finite(self, "TokenClassifier", fresh=True)
            raise
        return out

    def _check_mask(self, tokens: Tensor, attention_mask, past: int) -> Tensor | None:
        """The 0/1 mask ``(B, past + N)`` as a bool ``True`` = token, or ``None`` when absent or
        all ones (no padding)."""
        if attention_mask is None:
            return None
        if not isinstance(attention_mask, Tensor):
            raise TypeError(f"attention_mask: expected a torch.Tensor (B, past + N) of 0/1 or None, got "
                            f"{type(attention_mask).__name__}")
        want = (tokens.shape[0], past + tokens.shape[1])
        if tuple(attention_mask.shape) != want:
            raise ValueError(f"attention_mask: expected shape (B, past + N) = {want} (1 = token, 0 = padding"
                             + (f"; {past} tokens cached" if past else "") + f"), got {tuple(attention_mask.shape)}")
        if attention_mask.device != tokens.device:
            raise ValueError(f"attention_mask: on device {attention_mask.device}, the tokens are on {tokens.device}")
        if attention_mask.dtype != torch.bool and not bool(((attention_mask == 0) | (attention_mask == 1)).all()):
            raise ValueError("attention_mask: expected values 0 (padding) and 1 (token)")
        mask = attention_mask if attention_mask.dtype == torch.bool else attention_mask != 0
        if bool(mask.all()):
            return None
        if not isinstance(self.encoder, AttentionDecoder):
            raise ValueError(f"attention_mask: padding needs an AttentionDecoder encoder (its attention terms read the "
                             f"key-padding mask); got {type(self.encoder).__name__}")
        return mask

    # -- generation (opsplit.models.generate) ----------------------------------------------------
    def check_inputs(self, input_ids, attention_mask=None, position_ids=None, cache=None, *, n_steps=None):
        """Validation for :func:`~opsplit.models.generate.generate` (before any compute): a
        causal encoder, ``n_classes == vocab_size`` (a language model), integer ids with at
        least one token, the 0/1 mask ``(B, past + N)`` of a left-padded batch.  Returns
        ``(past, mask)`` with the mask as bool (``True`` = token) or ``None`` (no padding)."""
        if self.n_classes != self.vocab_size:
            raise ValueError(f"TokenClassifier: generation feeds the predicted classes back as tokens: needs "
                             f"n_classes == vocab_size, got {self.n_classes} and {self.vocab_size}")
        if not getattr(self.encoder, "causal", False):
            raise ValueError("TokenClassifier: generation needs a causal encoder (AttentionDecoder(causal=True))")
        self._check_tokens(input_ids, "input_ids")
        if input_ids.shape[1] == 0:
            raise ValueError(f"input_ids: empty prompt (shape {tuple(input_ids.shape)}): expected at least one token")
        if cache is not None:
            if not isinstance(cache, KVCache):
                raise TypeError(f"cache: expected an opsplit KVCache or None, got {type(cache).__name__}")
            if input_ids.shape[0] == 0:
                raise ValueError(_EMPTY_WITH_CACHE.format(shape=tuple(input_ids.shape)))
            p = self.embedding.weight
            n_steps = self.encoder.n_steps if n_steps is None else check_positive_int(n_steps, "n_steps (N_t)")
            cache.check_use(self, input_ids.shape[0], n_steps, p.dtype, p.device)
        past = 0 if cache is None else cache.length
        return past, self._check_mask(input_ids, attention_mask, past)

    def next_token_logits(self, input_ids: Tensor, attention_mask: Tensor | None = None, *, position_ids=None,
                          cache=None, n_steps: int | None = None, check_values: bool = True) -> Tensor:
        """The last position's logits ``(B, n_classes)``; with a
        :class:`~opsplit.operators.KVCache` only the new tokens are run (the causal attention
        terms read the earlier tokens' keys and values from it).  ``attention_mask``
        ``(B, past + N)``: 0 at the left padding of a batch, which every attention term
        removes from its keys (a key-padding mask in the grid's context).  ``position_ids``
        are not used: the model has no positions (causal attention sees the order, and the
        real tokens of a padded sample see exactly what they see unpadded)."""
        _, mask = self.check_inputs(input_ids, attention_mask, cache=cache, n_steps=n_steps)
        ctx = {}
        if mask is not None:
            ctx["key_padding_mask"] = ~mask
        if cache is not None:
            cache.begin(input_ids.shape[1])
            ctx["kv_cache"] = cache
        grid = ContextGrid.of(self.encoder.grid, **ctx) if ctx else None
        if not check_values:
            u = self.encoder(self.embedding(input_ids), n_steps=n_steps, grid=grid, check_finite_input=False)
            return self.readout(self.norm(u[:, -1]))
        check_parameters_finite(self, "TokenClassifier")
        try:
            u = self.encoder(self.embedding(input_ids), n_steps=n_steps, grid=grid)
            out = self.readout(self.norm(u[:, -1]))
            check_output(out, "TokenClassifier output")
        except ValueError:
            check_parameters_finite(self, "TokenClassifier", fresh=True)
            raise
        return out

    def generate(self, input_ids: Tensor, max_new_tokens: int, **kwargs) -> Tensor:
        """:func:`opsplit.models.generate.generate` with this model."""
        return generate_tokens(self, input_ids, max_new_tokens, **kwargs)

    def extra_repr(self) -> str:
        return f"vocab_size={self.vocab_size}, n_classes={self.n_classes}"
