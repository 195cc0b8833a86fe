r"""The transformer of paper 002, §3.2–3.4: the Lie scheme (13)–(17) for eq. (7).

One step :math:`u^n \mapsto u^{n+1}` has :math:`M = 4 + J` substeps:

====  ============================================  =====================  ===================
 #    substep                                       equations              transformer layer
====  ============================================  =====================  ===================
 1    explicit Euler, softmax attention integral    (13), (19), (27)–(29)  attention + skip
 2    projection onto :math:`S_1(\sigma_1,\sigma_2)` (14), (22), (30)–(31) LayerNorm
 2+j  forward–backward: FFN layer j, then ReLU      (15), (23)–(24),       linear "I + W_j",
      (j = 1..J)                                    (34)–(35)              ReLU
 3+J  relaxation :math:`\tfrac12(u^{(2+J)/M} + u^{2/M})` (16), (33)         skip around the FFN
 4+J  projection onto :math:`S_1`                   (17), (22), (32)       LayerNorm
====  ============================================  =====================  ===================

With ``L = N`` and :math:`\Delta t = 1` (the defaults) the propagator is eqs. (27)–(35)
composed :math:`N_t` times.  See ``docs/paper_scheme.md`` for how this differs from
``torch.nn.TransformerEncoderLayer``.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from .._checks import check_dtype_arg, check_finite_float, check_positive_float, check_positive_int
from ..controls import PiecewiseConstant
from ..grid import Grid, check_grid
from ..operators import FFNIntegral, ProjectionS1, ProjectionS2, SoftmaxAttention
from ..propagator import Propagator
from ..schemes import Lie, Relaxation
from ..solvers import ExplicitEuler, Implicit, SemiImplicit, Substep

__all__ = ["PaperTransformer", "PaperSchemePropagator", "paper_scheme"]


def paper_scheme(
    attention: SoftmaxAttention,
    norm: ProjectionS1,
    ffn_layers,
    relu: ProjectionS2 | None = None,
    relax_weight: float = 0.5,
) -> Lie:
    """The Lie scheme (13)–(17) of paper 002 with :math:`M = 4 + J` substeps.

    ``norm`` is used for both LayerNorm substeps (14) and (17), with the same
    :math:`\\sigma_1^n, \\sigma_2^n`, as in the paper.
    """
    relu = ProjectionS2() if relu is None else relu
    ffn = [Substep((layer, relu), SemiImplicit()) for layer in ffn_layers]
    if not ffn:
        raise ValueError("paper_scheme: expected J >= 1 FFN layers")
    return Lie(
        [
            Substep(attention, ExplicitEuler()),  # (13)
            Substep(norm, Implicit()),  # (14)
            Relaxation(ffn, weight=relax_weight),  # (15) j = 1..J, then (16)
            Substep(norm, Implicit()),  # (17)
        ]
    )


class PaperSchemePropagator(Propagator):
    """A propagator over :func:`paper_scheme`, with named access to its operators."""

    @property
    def attention(self) -> SoftmaxAttention:
        return self.scheme.substeps[0].terms[0]

    @property
    def norm(self) -> ProjectionS1:
        """The :math:`S_1` projection of substeps (14) and (17)."""
        return self.scheme.substeps[1].terms[0]

    @property
    def ffn(self) -> tuple[FFNIntegral, ...]:
        """The FFN layers :math:`j = 1, \\dots, J` of substeps (15)."""
        return tuple(s.terms[0] for s in self.scheme.substeps[2].terms[0].steps)


class PaperTransformer(PaperSchemePropagator):
    r"""The paper's single-head transformer: :math:`N_t` steps of the scheme (13)–(17).

    Args:
        n_y: embedding size :math:`N_y` (``L_y = N_y`` unless ``grid`` is given).
        n_x: number of tokens :math:`N_x`; required when ``bias_axis="x"`` (the paper's
            :math:`b_j(x)` has one value per token), else read from the input.
        J: number of FFN layers (:math:`J = 2` in the paper).
        n_steps: :math:`N_t` (6 in the paper).
        T: final time; defaults to ``n_steps`` (:math:`\Delta t = 1`).
        scale: attention score scale; ``None`` is :math:`1/\sqrt{|\Omega_y|}` (eq. 6),
            ``1.0`` is eq. (29) as printed.
        bias_axis: ``"x"`` (paper, eq. 8 and 34) or ``"y"`` (``nn.Linear``).
        eps: variance regulariser of the :math:`S_1` projection (0: Theorem 3.1 exactly).
        sigma1, sigma2: initial :math:`\sigma_1, \sigma_2 > 0` (trainable controls, one value
            per step; :math:`\sigma_2` is log-parametrised so it stays positive).
        relax_weight: weight of the relaxation step (16), 1/2 in the paper.
        grid: a :class:`~opsplit.grid.Grid`; defaults to ``Grid.paper(n_x, n_y)``.
        device, dtype: factory kwargs for the controls.
    """

    def __init__(
        self,
        n_y: int,
        *,
        n_x: int | None = None,
        J: int = 2,
        n_steps: int = 6,
        T: float | None = None,
        scale: float | None = None,
        bias_axis: str = "x",
        eps: float = 0.0,
        sigma1: float = 0.0,
        sigma2: float = 1.0,
        relax_weight: float = 0.5,
        grid: Grid | None = None,
        device=None,
        dtype=None,
    ):
        # every argument checked here, so that errors name this constructor's arguments
        n_y = check_positive_int(n_y, "PaperTransformer.n_y")
        if n_x is not None:
            n_x = check_positive_int(n_x, "PaperTransformer.n_x")
        J = check_positive_int(J, "PaperTransformer.J")
        n_steps = check_positive_int(n_steps, "PaperTransformer.n_steps (N_t)")
        if T is not None:
            T = check_positive_float(T, "PaperTransformer.T")
        if scale is not None:
            scale = check_positive_float(scale, "PaperTransformer.scale")
        if bias_axis not in ("x", "y"):
            raise ValueError(f"PaperTransformer.bias_axis: expected 'x' or 'y', got {bias_axis!r}")
        eps = check_positive_float(eps, "PaperTransformer.eps", allow_zero=True)
        sigma1 = check_finite_float(sigma1, "PaperTransformer.sigma1")
        sigma2 = check_positive_float(sigma2, "PaperTransformer.sigma2")
        relax_weight = check_finite_float(relax_weight, "PaperTransformer.relax_weight")
        if not 0.0 < relax_weight <= 1.0:
            raise ValueError(f"PaperTransformer.relax_weight: expected 0 < weight <= 1, got {relax_weight}")
        grid = check_grid(grid, "PaperTransformer.grid")
        dtype = check_dtype_arg(dtype, "PaperTransformer.dtype")
        if bias_axis == "x" and n_x is None and (grid is None or grid.nx is None):
            raise ValueError(
                "PaperTransformer: bias_axis='x' (the paper's b_j(x)) needs the number of tokens "
                "n_x; pass n_x, or bias_axis='y' for a per-feature bias"
            )
        if grid is None:
            grid = Grid.paper(n_x, n_y)
        grid.check_shape((grid.nx if n_x is None else n_x, n_y), "PaperTransformer grid")
        n_x = grid.nx
        fk = {"device": device, "dtype": dtype or torch.get_default_dtype()}
        t1 = float(n_steps) if T is None else float(T)

        def pc(shape, axes=(), positive=False, fill=0.0):
            return PiecewiseConstant(
                torch.full((n_steps, *shape), fill, **fk), t0=0.0, t1=t1, axes=axes,
                positive=positive,
            )

        attention = SoftmaxAttention(
            pc((n_y, n_y), ("y", "y")), pc((n_y, n_y), ("y", "y")), pc((n_y, n_y), ("y", "y")),
            scale=scale,
        )
        norm = ProjectionS1(pc(()), pc((), positive=True, fill=1.0), eps=eps)
        bias_n = n_x if bias_axis == "x" else n_y
        ffn = [
            FFNIntegral(pc((n_y, n_y), ("y", "y")), pc((bias_n,), (bias_axis,)), bias_axis=bias_axis)
            for _ in range(J)
        ]
        super().__init__(paper_scheme(attention, norm, ffn, relax_weight=relax_weight),
                         n_steps, t0=0.0, t1=t1, grid=grid)
        self.n_y, self.J, self.bias_axis = n_y, J, bias_axis
        self._sigma_init = (float(sigma1), float(sigma2))
        self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self) -> None:
        """Kernels uniform in :math:`\\pm 1/(\\sqrt{N_y}\\,\\Delta y)` (the scale of
        ``nn.Linear``'s init for the discrete map), biases uniform in the same bound,
        :math:`\\sigma_1, \\sigma_2` at their initial values."""
        dy = self.grid.y.spacing
        bound = 1.0 / (math.sqrt(self.n_y) * dy)
        a = self.attention
        for c in (a.WQ, a.WK, a.WV):
            nn.init.uniform_(c.raw, -bound, bound)
        for layer in self.ffn:
            nn.init.uniform_(layer.W.raw, -bound, bound)
            nn.init.uniform_(layer.b.raw, -1.0 / math.sqrt(self.n_y), 1.0 / math.sqrt(self.n_y))
        s1, s2 = self._sigma_init
        self.norm.sigma1.fill_(torch.tensor(s1))
        self.norm.sigma2.fill_(torch.tensor(s2))

    def extra_repr(self) -> str:
        return f"n_y={self.n_y}, J={self.J}, bias_axis={self.bias_axis!r}, " + super().extra_repr()
