r"""Seeded test problems for convergence studies: a smooth continuous transformer.

:func:`smooth_transformer` builds the terms of eq. (7) with controls smooth in time (and,
optionally, in space), on a fixed domain :math:`[0, L_x] \times [0, L_y]`:

* softmax attention (eqs. 3–6) with kernels :math:`W^{Q,K,V}(\tilde y, y, t)`;
* :math:`J` FFN integral terms :math:`\langle W_j(\cdot, y, t), u\rangle + b_j(x, t)`;
* optionally :math:`S_1(\sigma_1(t), \sigma_2(t))` as a constraint (``constraint=True``),
  with :math:`\sigma` smooth in time (``moving=True``) or constant;
* optionally :math:`\partial I_{S_2}` (ReLU, ``relu=True``): non-smooth.

:meth:`SmoothTransformer.scheme` assembles any of the schemes with any substep solver, so
the same continuous model is solved by Lie, Strang, parallel and hybrid splitting.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from .._checks import check_choice
from ..controls import PiecewiseLinear, PolynomialSeries, TimeBasis
from ..grid import Grid
from ..operators import FFNIntegral, ProjectionS1, ProjectionS2, SoftmaxAttention
from ..propagator import Propagator
from ..reference import solve_reference
from ..schemes import BlanesMoan, Hybrid, Lie, Parallel, SchemeFlow, Strang, TripleJump
from ..schemes.composition import irreversibility
from ..solvers import (
    EXPLICIT_SOLVERS,
    CatchUp,
    Exact,
    Implicit,
    ODESolve,
    ProjectedS1,
    Substep,
    solver_for,
)

__all__ = ["SmoothTransformer", "smooth_transformer", "SCHEMES", "SOLVERS"]

SCHEMES = ("lie", "strang", "parallel", "hybrid", "triple_jump", "blanes_moan")
#: the explicit Runge–Kutta solvers (:data:`opsplit.solvers.EXPLICIT_SOLVERS`) and ``"odeint"``
#: (dopri5 at rtol 1e-10)
SOLVERS = (*EXPLICIT_SOLVERS, "odeint")


def _solver(name: str):
    if name == "odeint":
        return ODESolve("dopri5", rtol=1e-10, atol=1e-12)
    check_choice(name, SOLVERS, "solver")
    return solver_for(name)


@dataclass
class SmoothTransformer:
    """The terms of a seeded continuous transformer and its initial state."""

    grid: Grid
    attention: SoftmaxAttention
    ffn: list
    norm: ProjectionS1 | None
    relu: ProjectionS2 | None
    f: Tensor
    T: float

    @property
    def smooth_terms(self) -> list:
        return [self.attention, *self.ffn]

    def substeps(self, solver: str = "euler", projection: str = "tangent") -> list:
        """Substeps in the order [S1], attention, FFN_1..J, [S2].

        ``solver`` advances the smooth terms.  With the S1 constraint,
        ``projection="tangent"`` advances them by the projection method
        (:class:`~opsplit.solvers.ProjectedS1` around ``solver``) and the S1 substep by
        :class:`~opsplit.solvers.CatchUp`; ``"plain"`` advances them by ``solver`` itself
        (leaving the manifold) and the S1 substep by ``Implicit`` (the paper's choice).
        """
        if projection not in ("tangent", "plain"):
            raise ValueError(f"projection: expected 'tangent' or 'plain', got {projection!r}")
        tangent = self.norm is not None and projection == "tangent"
        subs = []
        if self.norm is not None:
            subs.append(Substep(self.norm, CatchUp() if tangent else Implicit()))
        for op in self.smooth_terms:
            s = _solver(solver)
            subs.append(Substep(op, ProjectedS1(s) if tangent else s))
        if self.relu is not None:
            subs.append(Substep(self.relu, Implicit()))
        return subs

    def scheme(
        self, kind: str = "lie", solver: str = "euler", projection: str = "tangent", batch="auto"
    ):
        """One of :data:`SCHEMES` over :meth:`substeps`.  ``hybrid`` groups: [S1],
        [attention], [FFN_1..J], [S2].  ``triple_jump`` / ``blanes_moan``: the fourth-order
        composition of the smooth terms; the projections (S1, S2: they cannot run over the
        composition's negative substeps) are kept in an outer Strang step around it
        (:class:`~opsplit.schemes.SchemeFlow`; order 2 with a moving S1)."""
        subs = self.substeps(solver, projection)
        if kind in ("triple_jump", "blanes_moan"):
            cls = TripleJump if kind == "triple_jump" else BlanesMoan
            outer = [s for s in subs if irreversibility(s) is not None]
            if not outer:
                return cls(subs)
            inner = cls([s for s in subs if irreversibility(s) is None])
            return Strang(outer + [Substep(SchemeFlow(inner), Exact())])
        if kind == "lie":
            return Lie(subs)
        if kind == "strang":
            return Strang(subs)
        if kind == "parallel":
            return Parallel(subs, batch=batch)
        if kind == "hybrid":
            groups, i = [], 0
            if self.norm is not None:
                groups.append([i])
                i += 1
            groups.append([i])
            i += 1
            groups.append(list(range(i, i + len(self.ffn))))
            i += len(self.ffn)
            if self.relu is not None:
                groups.append([i])
            return Hybrid(subs, groups=groups, batch=batch)
        raise ValueError(f"scheme: expected one of {SCHEMES}, got {kind!r}")

    def propagator(
        self,
        n_steps: int,
        kind: str = "lie",
        solver: str = "euler",
        projection: str = "tangent",
        batch="auto",
    ) -> Propagator:
        return Propagator(
            self.scheme(kind, solver, projection, batch), n_steps, t0=0.0, t1=self.T, grid=self.grid
        )

    def reference(self, **kw) -> Tensor:
        """The unsplit model by torchdiffeq at tight tolerance (smooth terms, S1 as a
        constraint; raises with ReLU)."""
        ops = list(self.smooth_terms) + ([self.norm] if self.norm is not None else [])
        if self.relu is not None:
            ops.append(self.relu)
        return solve_reference(ops, self.f, t0=0.0, t1=self.T, grid=self.grid, **kw)


def smooth_transformer(
    n_x: int = 4,
    n_y: int = 4,
    *,
    batch: int = 2,
    J: int = 1,
    T: float = 1.0,
    seed: int = 0,
    time: str = "legendre",
    n_time: int = 3,
    space: str = "grid",
    n_modes: int = 4,
    constraint: bool = False,
    moving: bool = True,
    relu: bool = False,
    lx: float = 1.0,
    ly: float = 1.0,
    rule: str = "midpoint",
    scale: float = 1.0,
    margin: float = 0.0,
    dtype=torch.float64,
    device=None,
) -> SmoothTransformer:
    """A seeded smooth continuous transformer.

    Args:
        n_x, n_y: grid node counts on :math:`[0, L_x] \\times [0, L_y]`.
        batch: number of initial states.
        J: number of FFN integral terms.
        T: final time.
        seed: the seed of every random draw.
        time: the time dependence of the controls: ``"legendre"``, ``"chebyshev"``,
            ``"cosine"`` (:class:`~opsplit.controls.TimeBasis` with ``n_time`` modes) or
            ``"piecewise_linear"`` (:class:`~opsplit.controls.PiecewiseLinear` with
            ``n_time`` nodes).
        space: ``"grid"`` (control values stored at the grid's nodes) or
            ``"polynomial"`` (Legendre series in :math:`\\tilde y, y, x` with ``n_modes``
            modes per axis, evaluable on any grid of the same domain; ``f`` is then a smooth
            function sampled at the nodes).
        constraint: add :math:`S_1(\\sigma_1(t), \\sigma_2(t))` as a constraint.
        moving: :math:`\\sigma` smooth in time (else :math:`\\sigma_1 = 0.1`,
            :math:`\\sigma_2 = 1`).
        relu: add :math:`\\partial I_{S_2}` (ReLU).
        scale: magnitude of the discrete operators (their norm is about ``scale``).
        margin: the controls (and a moving S1's sigma) are defined on
            :math:`[-m T, (1 + m) T]` for ``margin`` :math:`= m \\ge 0` (the model is solved
            on :math:`[0, T]`): room for schemes whose substeps read the controls outside a
            step (the triple jump, up to 0.35 dt).  ``0`` (default): on :math:`[0, T]`.
    """
    margin = float(margin)
    if not (math.isfinite(margin) and margin >= 0):
        raise ValueError(f"margin: expected a finite number >= 0, got {margin!r}")
    ct0, ct1 = (-margin * T if margin else 0.0), (1.0 + margin) * T
    gen = torch.Generator().manual_seed(seed)
    fk = dict(dtype=dtype, device=device)
    grid = Grid.uniform(n_x, n_y, lx=lx, ly=ly, rule=rule)

    def randn(*shape):
        return torch.randn(*shape, generator=gen, dtype=torch.float64).to(**fk)

    def time_control(values_fn, shape, axes=(), positive=False):
        # values_fn(k) -> the k-th coefficient / node value (k = 0..n_time-1)
        if time == "piecewise_linear":
            v = torch.stack([values_fn(k) for k in range(n_time)])
            return PiecewiseLinear(v, t0=ct0, t1=ct1, axes=axes, positive=positive)
        c = torch.stack([values_fn(k) / (k + 1) for k in range(n_time)])
        return TimeBasis(c, t0=ct0, t1=ct1, basis=time, axes=axes, positive=positive)

    def kernel(weight):
        if space == "grid":
            # the discrete operator u -> dy * u @ W has entries ~ weight / sqrt(n_y)
            s = weight / (math.sqrt(n_y) * grid.y.spacing)
            return time_control(lambda k: s * randn(n_y, n_y), (n_y, n_y), ("y", "y"))
        # continuous kernel: Legendre coefficients decaying with the degree
        p = torch.arange(n_modes, dtype=torch.float64)
        decay = (1.0 / (1.0 + p[:, None] + p[None, :])).to(**fk)
        s = weight / ly
        coeff = time_control(lambda k: s * decay * randn(n_modes, n_modes), (n_modes, n_modes))
        return PolynomialSeries(coeff, axes=("y", "y"))

    def bias(weight):
        if space == "grid":
            return time_control(lambda k: weight * randn(n_x), (n_x,), ("x",))
        p = torch.arange(n_modes, dtype=torch.float64)
        decay = (1.0 / (1.0 + p)).to(**fk)
        coeff = time_control(lambda k: weight * decay * randn(n_modes), (n_modes,))
        return PolynomialSeries(coeff, axes=("x",))

    attention = SoftmaxAttention(kernel(scale), kernel(scale), kernel(scale))
    ffn = [FFNIntegral(kernel(0.7 * scale), bias(0.5 * scale), bias_axis="x") for _ in range(J)]
    norm = None
    if constraint:
        if moving:
            if time == "piecewise_linear":
                r = torch.linspace(0.0, 1.0, n_time, **fk)
                s1 = PiecewiseLinear(0.1 + 0.2 * r, t0=ct0, t1=ct1)
                s2 = PiecewiseLinear(1.0 + 0.3 * r, t0=ct0, t1=ct1, positive=True)
            else:
                c1 = torch.zeros(n_time, **fk)
                c2 = torch.zeros(n_time, **fk)
                c1[0] = 0.1
                c1[1:] = 0.2 / torch.arange(2, n_time + 1, **fk)
                c2[1:] = 0.3 / torch.arange(2, n_time + 1, **fk)
                s1 = TimeBasis(c1, t0=ct0, t1=ct1, basis=time)
                # sigma_2 = exp(series) > 0 for every t
                s2 = TimeBasis(c2, t0=ct0, t1=ct1, basis=time, positive=True)
            norm = ProjectionS1(s1, s2)
        else:
            norm = ProjectionS1(torch.tensor(0.1, **fk), torch.tensor(1.0, **fk))
    relu_op = ProjectionS2() if relu else None
    if space == "grid":
        f = randn(batch, n_x, n_y)
    else:
        # a smooth function of (x, y) with no symmetry, sampled at the nodes
        xs = grid.x.nodes(torch.float64) / lx
        ys = grid.y.nodes(torch.float64) / ly
        a = torch.randn(batch, 4, generator=gen, dtype=torch.float64)
        f = (
            torch.sin(
                2.0 * xs[None, :, None]
                + 3.0 * a[:, 0, None, None] * ys[None, None, :]
                + a[:, 1, None, None]
            )
            + a[:, 2, None, None] * xs[None, :, None] * ys[None, None, :] ** 2
            + 0.5 * torch.cos(4.0 * ys[None, None, :] + a[:, 3, None, None])
        )
        f = f.to(**fk)
    return SmoothTransformer(grid, attention, ffn, norm, relu_op, f, float(T))
