"""Splitting schemes: Strang, parallel (eq. 59), hybrid; their orders and bad input.

Independent references: matrix exponentials of the discrete linear operators (computed
here from the kernels, not through the library's flows), a direct transcription of the
paper's eqs. (27)-(35), and the unsplit model by torchdiffeq.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from opsplit import Grid, Propagator
from opsplit.analysis import smooth_transformer, temporal_convergence
from opsplit.controls import PiecewiseConstant, TimeBasis
from opsplit.models import PaperTransformer
from opsplit.operators import FFNIntegral, ProjectionS1, SoftmaxAttention
from opsplit.operators.base import Operator
from opsplit.schemes import Hybrid, Lie, Parallel, ScaledOperator, Strang
from opsplit.solvers import (
    RK4,
    CatchUp,
    Exact,
    ExplicitEuler,
    Heun,
    Implicit,
    ODESolve,
    ProjectedS1,
    Substep,
)

D = torch.float64


# tiny tensors: one thread keeps OpenMP start-up from dominating every op
pytestmark = pytest.mark.usefixtures("one_thread")


def _ffn(n_y, seed, dtype=D, bias=False, n_x=3):
    g = torch.Generator().manual_seed(seed)
    W = torch.randn(n_y, n_y, generator=g, dtype=D).to(dtype) / math.sqrt(n_y)
    b = torch.randn(n_x, generator=g, dtype=D).to(dtype) if bias else None
    return FFNIntegral(W, b), W


def _att(n_y, seed, dtype=D):
    g = torch.Generator().manual_seed(seed)
    Ws = [torch.randn(n_y, n_y, generator=g, dtype=D).to(dtype) / math.sqrt(n_y) for _ in range(3)]
    return SoftmaxAttention(*Ws)


# -- each scheme against an independent formula ----------------------------------------------
def test_strang_is_the_symmetric_composition_of_exact_flows():
    # paper grid, L = N: the discrete operator of FFN_k is u -> u @ W_k, flow u @ expm(h W_k)
    (a, Wa), (b, Wb), (c, Wc) = _ffn(4, 1), _ffn(4, 2), _ffn(4, 3)
    scheme = Strang([Substep(a, Exact()), Substep(b, Exact()), Substep(c, Exact())])
    u = torch.randn(2, 3, 4, dtype=D)
    h = 0.3
    E = torch.linalg.matrix_exp
    want = u @ E(h / 2 * Wa) @ E(h / 2 * Wb) @ E(h * Wc) @ E(h / 2 * Wb) @ E(h / 2 * Wa)
    got = scheme.step(0.0, h, u, Grid.paper(3, 4))
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    assert scheme.order == 2 and scheme.effective_order == 2


class _Recorder(Operator):
    """Records the (start, length) of every call of its flow."""

    has_flow = True
    default_solver = "exact"

    def __init__(self, log, name):
        super().__init__()
        self.log, self.name = log, name

    def flow(self, t, dt, u, grid):
        self.log.append((self.name, float(t), float(dt)))
        return u


def test_strang_substeps_use_the_right_time_intervals():
    log = []
    s = Strang([_Recorder(log, "a"), _Recorder(log, "b"), _Recorder(log, "c")])
    s.step(1.0, 0.5, torch.zeros(1, 2, 2, dtype=D), Grid.paper(2, 2))
    assert log == [
        ("a", 1.0, 0.25),
        ("b", 1.0, 0.25),
        ("c", 1.0, 0.5),
        ("b", 1.25, 0.25),
        ("a", 1.25, 0.25),
    ]


def test_parallel_is_eq59_average_of_scaled_flows():
    (a, Wa), (b, Wb), (c, Wc) = _ffn(4, 4), _ffn(4, 5), _ffn(4, 6)
    scheme = Parallel([Substep(a, Exact()), Substep(b, Exact()), Substep(c, Exact())])
    u = torch.randn(2, 3, 4, dtype=D)
    h, K = 0.2, 3
    E = torch.linalg.matrix_exp
    want = (u @ E(K * h * Wa) + u @ E(K * h * Wb) + u @ E(K * h * Wc)) / K
    got = scheme.step(0.0, h, u, Grid.paper(3, 4))
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    assert scheme.order == 1


def test_parallel_explicit_euler_is_forward_euler_of_the_sum():
    # K * A_k with one Euler step each, averaged: u + h * sum_k A_k(u) exactly
    atts = [_att(4, s) for s in range(2)]
    (f1, _), (f2, _) = _ffn(4, 7, bias=True), _ffn(4, 8, bias=True)
    g = Grid.uniform(3, 4)
    u = torch.randn(2, 3, 4, dtype=D)
    ops = [*atts, f1, f2]
    want = u + 0.1 * sum(op.field(0.0, u, g) for op in ops)
    for batch in (True, False):
        got = Parallel(ops, batch=batch).step(0.0, 0.1, u, g)
        torch.testing.assert_close(got, want, rtol=1e-13, atol=1e-13)


def test_scaled_projection_is_still_the_projection():
    norm = ProjectionS1(0.2, 1.5)
    g = Grid.uniform(3, 5)
    u = torch.randn(2, 3, 5, dtype=D)
    for K in (1, 2, 7):
        torch.testing.assert_close(
            ScaledOperator(norm, K).resolvent(0.0, 0.3, u, g), norm.resolvent(0.0, 0.3, u, g)
        )


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_parallel_batched_equals_loop_values_and_gradients(dtype):
    # two attention heads and three FFN layers as separate terms: two vmapped groups
    g = Grid.uniform(5, 4)

    def build():
        torch.manual_seed(0)
        ops = [
            _att(4, 10, dtype),
            _ffn(4, 11, dtype, bias=True, n_x=5)[0],
            _att(4, 12, dtype),
            _ffn(4, 13, dtype, bias=True, n_x=5)[0],
            _ffn(4, 14, dtype, bias=True, n_x=5)[0],
        ]
        for op in ops:
            for c in op.children():
                if hasattr(c, "value"):
                    c.value.requires_grad_(True)
        return ops

    u = torch.randn(2, 5, 4, dtype=dtype)
    outs, grads = [], []
    for batch in (True, False):
        ops = build()
        scheme = Parallel([Substep(op, Heun()) for op in ops], batch=batch)
        if batch:
            plan = scheme._group.plan()
            assert sorted(len(idx) for idx, names in plan if names is not None) == [2, 3]
        out = scheme.step(0.0, 0.1, u, g)
        out.square().sum().backward()
        outs.append(out.detach())
        grads.append(
            [c.value.grad.clone() for op in ops for c in op.children() if hasattr(c, "value")]
        )
    tol = dict(rtol=1e-5, atol=1e-5) if dtype == torch.float32 else dict(rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(outs[0], outs[1], **tol)
    for a, b in zip(grads[0], grads[1]):
        torch.testing.assert_close(a, b, **tol)


def test_parallel_does_not_batch_across_different_settings():
    # same shapes, different attention scale: must not share a vmapped call
    a1 = _att(4, 1)
    a2 = SoftmaxAttention(*(c.value for c in (a1.WQ, a1.WK, a1.WV)), scale=0.3)
    p = Parallel([a1, a2, _att(4, 2)])
    plan = p._group.plan()
    groups = sorted(tuple(idx) for idx, names in plan)
    assert groups == [(0, 2), (1,)]
    # adaptive torchdiffeq substeps are never vmapped
    q = Parallel([Substep(_att(4, s), ODESolve("dopri5")) for s in range(3)])
    assert all(names is None for _, names in q._group.plan())


def test_parallel_batch_auto_and_bad_value():
    p = Parallel([_att(4, 0), _att(4, 1)])
    assert p.batch == "auto"
    assert p._group.use_batch(torch.zeros(2, 3, 4))
    assert not p._group.use_batch(torch.zeros(2, 3, p._group.auto_numel))
    assert not Parallel([_att(4, 0), _att(4, 1)], batch=False)._group.use_batch(
        torch.zeros(1, 1, 4)
    )
    with pytest.raises(ValueError, match="batch: expected True, False or 'auto'"):
        Parallel([_att(4, 0)], batch="yes")
    with pytest.raises(ValueError, match="batch: expected True, False or 'auto'"):
        Hybrid([[_att(4, 0)]], batch=2)


def test_hybrid_reduces_to_lie_and_parallel_and_nested_equals_indexed():
    g = Grid.uniform(3, 4)
    u = torch.randn(2, 3, 4, dtype=D)
    ops = [_att(4, 1), _ffn(4, 2, bias=True)[0], _ffn(4, 3, bias=True)[0]]
    lie = Lie(ops).step(0.0, 0.2, u, g)
    par = Parallel(ops).step(0.0, 0.2, u, g)
    torch.testing.assert_close(Hybrid([[o] for o in ops]).step(0.0, 0.2, u, g), lie)
    torch.testing.assert_close(Hybrid([ops]).step(0.0, 0.2, u, g), par)
    # groups run in the given order: [[2], [0, 1]] = FFN_2, then parallel(attention, FFN_1)
    h1 = Hybrid(ops, groups=[[2], [0, 1]]).step(0.0, 0.2, u, g)
    h2 = Hybrid([[ops[2]], [ops[0], ops[1]]]).step(0.0, 0.2, u, g)
    torch.testing.assert_close(h1, h2)
    v = ops[2].field(0.0, u, g) * 0.2 + u
    want = v + 0.2 * (ops[0].field(0.0, v, g) + ops[1].field(0.0, v, g))
    torch.testing.assert_close(h1, want)


# -- bad input --------------------------------------------------------------------------------
@pytest.mark.parametrize("cls", [Lie, Strang, Parallel])
def test_scheme_with_no_operators_raises(cls):
    with pytest.raises(ValueError, match="at least one operator"):
        cls([])


def test_hybrid_groups_must_cover_the_operators():
    ops = [_ffn(3, s)[0] for s in range(3)]
    with pytest.raises(ValueError, match=r"do not cover the operators: substep\(s\) \[2\]"):
        Hybrid(ops, groups=[[0], [1]])
    with pytest.raises(ValueError, match="appears in group 0 and in group 1"):
        Hybrid(ops, groups=[[0, 1], [1, 2]])
    with pytest.raises(ValueError, match="index 3 is out of range"):
        Hybrid(ops, groups=[[0, 1, 2, 3]])
    with pytest.raises(ValueError, match="non-empty list of substep indices"):
        Hybrid(ops, groups=[[0, 1, 2], []])
    with pytest.raises(TypeError, match="integer substep indices"):
        Hybrid(ops, groups=[[0, 1, "2"]])
    with pytest.raises(ValueError, match="group 1 is empty"):
        Hybrid([[ops[0]], []])
    with pytest.raises(ValueError, match="at least one operator"):
        Hybrid([])
    with pytest.raises(ValueError, match="list of groups"):
        Hybrid(ops)


def test_n_steps_below_one_and_grid_mismatch_raise():
    with pytest.raises(ValueError, match="N_t"):
        Propagator(Strang([_ffn(3, 0)[0]]), 0)
    good = Propagator(Strang([_att(4, 0)]), 3, t1=1.0, grid=Grid.uniform(None, 4))
    with pytest.raises(ValueError, match="N_t"):
        good(torch.randn(2, 3, 4, dtype=D), n_steps=0)
    prop = Propagator(Strang([_att(4, 0)]), 3, t1=1.0, grid=Grid.uniform(None, 5))
    # controls with 4 x 4 kernels, grid with N_y = 5
    with pytest.raises(ValueError, match="grid/control mismatch on Omega_y"):
        prop(torch.randn(2, 3, 5, dtype=D))


def test_effective_orders():
    a, f = _att(4, 0), _ffn(4, 1)[0]
    assert Strang([a, f]).effective_order == 1  # explicit Euler substeps
    assert Strang([Substep(a, Heun()), Substep(f, RK4())]).effective_order == 2
    n = ProjectionS1()
    proj = Strang(
        [Substep(n, CatchUp()), Substep(a, ProjectedS1(Heun())), Substep(f, ProjectedS1(RK4()))]
    )
    assert proj.effective_order == 2
    assert Strang([Substep(n, Implicit()), Substep(a, Heun())]).effective_order == 1
    assert Parallel([Substep(a, RK4()), Substep(f, RK4())]).effective_order == 1
    assert Hybrid([[Substep(a, RK4())], [Substep(f, RK4())]]).effective_order == 1


# -- measured temporal orders on the smooth problem --------------------------------------------
NS = [8, 16, 32, 64]


@pytest.fixture(scope="module")
def smooth():
    p = smooth_transformer(n_x=4, n_y=4, J=2, seed=0)
    return p, p.reference()


@pytest.mark.parametrize(
    "kind, solver, expected",
    [
        ("lie", "euler", 1),
        ("parallel", "euler", 1),
        ("hybrid", "euler", 1),
        ("strang", "euler", 1),
        ("strang", "heun", 2),
        ("strang", "rk4", 2),
        ("lie", "heun", 1),
        ("hybrid", "heun", 1),
    ],
)
def test_temporal_order_smooth(smooth, kind, solver, expected):
    p, ref = smooth
    st = temporal_convergence(lambda n: p.propagator(n, kind, solver)(p.f), NS, ref, t1=p.T)
    assert st.fit.within(expected, 0.15), str(st)
    assert (st.errors[1:] < st.errors[:-1]).all()


def test_strang_with_torchdiffeq_substeps_is_second_order(smooth):
    p, ref = smooth
    st = temporal_convergence(lambda n: p.propagator(n, "strang", "odeint")(p.f), [4, 8, 16], ref)
    assert st.fit.within(2, 0.15), str(st)


@pytest.fixture(scope="module")
def constrained():
    # S1 as a constraint, sigma_1(t), sigma_2(t) smooth in time (a moving manifold)
    p = smooth_transformer(n_x=4, n_y=4, J=1, seed=1, constraint=True, moving=True)
    return p, p.reference()


@pytest.mark.parametrize(
    "kind, solver, expected", [("strang", "heun", 2), ("lie", "euler", 1), ("strang", "euler", 1)]
)
def test_temporal_order_s1_projection_method(constrained, kind, solver, expected):
    p, ref = constrained
    st = temporal_convergence(lambda n: p.propagator(n, kind, solver)(p.f), NS, ref)
    assert st.fit.within(expected, 0.15), str(st)
    # the projection method keeps the state on S1(sigma(T)) exactly
    u = p.propagator(8, kind, solver)(p.f)
    m = u.mean(-1)
    s1 = p.norm.sigma1(p.T, p.grid)
    s2 = p.norm.sigma2(p.T, p.grid)
    torch.testing.assert_close(m, torch.full_like(m, float(s1.detach())), rtol=0, atol=1e-12)
    torch.testing.assert_close(
        ((u - m[..., None]) ** 2).mean(-1).sqrt(), torch.full_like(m, float(s2.detach()))
    )


def test_plain_substeps_with_s1_projection_are_first_order_even_for_strang(constrained):
    # Heun on the untangled field + projection: second-order terms leave the manifold
    p, ref = constrained
    st = temporal_convergence(
        lambda n: p.propagator(n, "strang", "heun", projection="plain")(p.f), NS, ref
    )
    assert st.fit.within(1, 0.15), str(st)


# -- the paper's transformer is unchanged ------------------------------------------------------
def _paper_direct(model, u):
    """Eqs. (27)-(35) transcribed: one layer per step with Delta t = 1, L = N."""
    a, n, ffn = model.attention, model.norm, model.ffn
    ny = u.shape[-1]
    for k in range(model.n_steps):
        WQ, WK, WV = (c.values[k] for c in (a.WQ, a.WK, a.WV))
        s1, s2 = n.sigma1.values[k], n.sigma2.values[k]

        def ln(v, s1=s1, s2=s2):
            al = v.sum(-1, keepdim=True) / ny
            be = ((v - al) ** 2).sum(-1, keepdim=True) / ny
            return s2 * (v - al) / be.sqrt() + s1

        scores = (u @ WQ) @ (u @ WK).transpose(-1, -2) / math.sqrt(ny)
        u1 = u + torch.softmax(scores, -1) @ (u @ WV)  # (27)-(29)
        u2 = ln(u1)  # (31)
        v = u2
        for layer in ffn:
            v = F.relu(v + v @ layer.W.values[k] + layer.b.values[k][:, None])  # (34)-(35)
        u = ln(0.5 * (v + u2))  # (33), (32)
    return u


def test_lie_at_unit_step_is_still_the_paper_transformer():
    torch.manual_seed(3)
    model = PaperTransformer(n_y=6, n_x=5, J=2, n_steps=3, dtype=D)
    with torch.no_grad():
        model.norm.sigma1.fill_(torch.tensor([0.1, -0.2, 0.3], dtype=D)[:, None].squeeze(-1))
        model.norm.sigma2.fill_(torch.tensor([1.0, 0.7, 1.3], dtype=D))
    u = torch.randn(3, 5, 6, dtype=D)
    torch.testing.assert_close(model(u), _paper_direct(model, u), rtol=1e-12, atol=1e-12)


# -- dtypes, autograd, gradcheck, CUDA ---------------------------------------------------------
def _small_controls(dtype, device=None):
    torch.manual_seed(5)

    def Wt():
        w = 0.5 * torch.randn(2, 3, 3, dtype=dtype, device=device)
        return TimeBasis(w, t1=1.0, axes=("y", "y"))

    a = SoftmaxAttention(Wt(), Wt(), Wt())
    f1 = FFNIntegral(
        Wt(), PiecewiseConstant(torch.randn(2, 2, dtype=dtype, device=device), t1=1.0, axes=("x",))
    )
    f2 = FFNIntegral(Wt())
    return a, f1, f2


def _schemes(a, f1, f2):
    n = ProjectionS1(0.1, 1.2)
    return {
        "strang": Strang([Substep(a, Heun()), Substep(f1, RK4()), Substep(f2, Heun())]),
        "parallel": Parallel([Substep(a, Heun()), Substep(f1, Heun()), Substep(f2, Heun())]),
        "hybrid": Hybrid([[a], [f1, f2]]),
        "strang_s1": Strang(
            [
                Substep(n, CatchUp()),
                Substep(a, ProjectedS1(Heun())),
                Substep(f1, ProjectedS1(ExplicitEuler())),
            ]
        ),
    }


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_schemes_dtypes_and_autograd(dtype):
    a, f1, f2 = _small_controls(dtype)
    g = Grid.uniform(2, 3)
    for name, s in _schemes(a, f1, f2).items():
        f = torch.randn(2, 2, 3, dtype=dtype, requires_grad=True)
        out = Propagator(s, 4, t1=1.0, grid=g)(f)
        assert out.dtype == dtype and torch.isfinite(out).all(), name
        out.square().sum().backward()
        assert f.grad is not None and torch.isfinite(f.grad).all(), name
        assert a.WQ.coefficients.grad is not None, name


def test_schemes_gradcheck():
    from torch.func import functional_call

    a, f1, f2 = _small_controls(D)
    g = Grid.uniform(2, 3)
    for name, s in _schemes(a, f1, f2).items():
        prop = Propagator(s, 2, t1=1.0, grid=g)
        f = torch.randn(1, 2, 3, dtype=D, requires_grad=True)
        assert torch.autograd.gradcheck(lambda x, prop=prop: prop(x), (f,)), name
        # a parameter's gradient: the attention value kernel's time coefficients
        key = next(k for k, p in prop.named_parameters() if p is a.WV.coefficients)
        w = a.WV.coefficients.detach().clone().requires_grad_(True)
        x = f.detach()
        fn = lambda w, prop=prop, key=key, x=x: functional_call(prop, {key: w}, (x,))  # noqa: E731
        assert torch.autograd.gradcheck(fn, (w,)), name


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_schemes_cuda_match_cpu():
    a, f1, f2 = _small_controls(D)
    g = Grid.uniform(2, 3)
    f = torch.randn(2, 2, 3, dtype=D)
    for s in _schemes(a, f1, f2).values():
        prop = Propagator(s, 3, t1=1.0, grid=g)
        cpu = prop(f)
        gpu = prop.to("cuda")(f.cuda())
        torch.testing.assert_close(gpu.cpu(), cpu, rtol=1e-10, atol=1e-10)
        prop.to("cpu")


def test_exact_midpoint_rejects_composite_relaxation():
    from opsplit.operators import ProjectionS2
    from opsplit.schemes import Relaxation
    from opsplit.solvers import ExactMidpoint

    with pytest.raises(ValueError, match="ExactMidpoint cannot advance Relaxation"):
        Substep(Relaxation([ProjectionS2()]), ExactMidpoint())


# -- issue 42, finding 13e: attributes set after construction -------------------------------------
def test_attributes_set_after_construction_act_as_given_to_the_constructor():
    """A valid value set after construction gives the propagator (scheme) the constructor
    builds with it: N_t, the interval (moved past its end: t1 first), the compositions'
    merge, Parallel's batch (it used to stay with the group)."""
    from opsplit.schemes import TripleJump

    (a, _), (b, _) = _ffn(4, 1), _ffn(4, 2)
    x = torch.randn(2, 3, 4, dtype=D, generator=torch.Generator().manual_seed(0))
    p = Propagator(Strang([a, b]), 2)
    p.n_steps = 5
    torch.testing.assert_close(p(x), Propagator(Strang([a, b]), 5, t1=2.0)(x), rtol=0, atol=0)
    p.t1, p.t0 = 4.0, 3.0  # [0, 2] -> [3, 4]: t1 first
    torch.testing.assert_close(p(x), Propagator(Strang([a, b]), 5, t0=3.0, t1=4.0)(x), rtol=0, atol=0)
    p.t0, p.t1 = 0.5, 1.0  # back below: t0 first
    assert (p.t0, p.t1, p.dt()) == (0.5, 1.0, 0.1)
    tj = TripleJump([a, b])
    tj.merge = False
    fresh = TripleJump([a, b], merge=False)
    assert tj.calls == fresh.calls and tj.clock_range == fresh.clock_range and len(tj.calls) > len(TripleJump([a, b]).calls)
    torch.testing.assert_close(Propagator(tj, 3)(x), Propagator(fresh, 3)(x), rtol=0, atol=0)
    par = Parallel([a, b])
    par.batch = False
    assert par.batch is False and par._group.batch is False  # the group that batches follows
    torch.testing.assert_close(Propagator(par, 2)(x), Propagator(Parallel([a, b], batch=False), 2)(x), rtol=0, atol=0)
