"""Fourth-order compositions: Yoshida's triple jump and Blanes-Moan's S6.

Independent references: the order conditions evaluated from the published coefficients,
products of ``scipy.linalg.expm`` of random matrices (not through the scheme code), three
opsplit Strang steps composed by hand, and the unsplit model by torchdiffeq.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import scipy.linalg as sla
import torch

from opsplit import Grid, Propagator
from opsplit.analysis import fit_order, relative_error, smooth_transformer, temporal_convergence
from opsplit.controls import TimeBasis
from opsplit.operators import (
    Activation,
    FFNIntegral,
    FieldDropout,
    PointwiseAffine,
    ProjectionS1,
    ProjectionS2,
    SoftmaxAttention,
)
from opsplit.reference import solve_reference
from opsplit.schemes import BlanesMoan, Relaxation, Strang, TripleJump
from opsplit.schemes.blanes_moan import BLANES_MOAN_A, BLANES_MOAN_B
from opsplit.schemes.yoshida import TRIPLE_JUMP_GAMMAS
from opsplit.solvers import (
    RK4,
    CatchUp,
    Exact,
    ExplicitEuler,
    Heun,
    Implicit,
    ODESolve,
    ProjectedS1,
    SemiImplicit,
    Substep,
)

D = torch.float64
pytestmark = pytest.mark.usefixtures("one_thread")
SCHEMES = {"triple_jump": TripleJump, "blanes_moan": BlanesMoan}


# -- the order conditions, from the published coefficients only ---------------------------------
def test_triple_jump_coefficients_satisfy_the_order_conditions():
    g1, g2, g3 = TRIPLE_JUMP_GAMMAS
    # Yoshida (1990): gamma_1 = 1/(2 - 2^(1/3)), gamma_2 = -2^(1/3)/(2 - 2^(1/3)), symmetric
    assert g1 == g3 == pytest.approx(1.3512071919596578, abs=1e-15)
    assert g2 == pytest.approx(-1.7024143839193153, abs=1e-15)
    assert g1 + g2 + g3 == pytest.approx(1.0, abs=1e-15)  # consistency
    assert g1**3 + g2**3 + g3**3 == pytest.approx(0.0, abs=1e-14)  # the h^3 error term cancels
    # (with symmetry, order 3 implies order 4)


def _bm_matrix(h, A, B):
    """exp(a1 h A) exp(b1 h B) ... exp(a7 h A) as maps applied left to right to row vectors."""
    M = np.eye(A.shape[0])
    for i, a in enumerate(BLANES_MOAN_A):
        M = M @ sla.expm(a * h * A)
        if i < len(BLANES_MOAN_B):
            M = M @ sla.expm(BLANES_MOAN_B[i] * h * B)
    return M


def test_blanes_moan_coefficients_have_order_four_on_a_matrix_problem():
    a, b = np.array(BLANES_MOAN_A), np.array(BLANES_MOAN_B)
    assert a.sum() == pytest.approx(1.0, abs=1e-15) and b.sum() == pytest.approx(1.0, abs=1e-15)
    assert np.allclose(a, a[::-1]) and np.allclose(b, b[::-1])  # symmetric (palindromic)
    rng = np.random.default_rng(0)
    A, B = rng.standard_normal((6, 6)) / 2, rng.standard_normal((6, 6)) / 2
    ns = [4, 8, 16, 32]
    hs = np.array([1.0 / n for n in ns])
    # global error at T = 1 with N = 1/h steps
    errs = []
    for h, n in zip(hs, ns):
        P = np.linalg.matrix_power(_bm_matrix(h, A, B), n)
        errs.append(np.linalg.norm(P - sla.expm(A + B)) / np.linalg.norm(sla.expm(A + B)))
    fit = fit_order(hs, errs)
    assert fit.within(4.0, 0.15), fit
    # not order 5: the local error of one step is ~h^5, not smaller
    local = [np.linalg.norm(_bm_matrix(h, A, B) - sla.expm(h * (A + B))) for h in hs]
    assert fit_order(hs, local).within(5.0, 0.15)


# -- the order conditions in the free algebra ---------------------------------------------------
def _signature(flows, depth):
    """The product of ``exp(c X_j)`` over ``flows`` = [(j, c), ...] (j = 0: A, 1: B) in the free
    associative algebra over {A, B}, truncated at words of length ``depth``: {word: coefficient}.
    A splitting method has order p for *every* pair of operators exactly when this product
    equals exp(A + B) (each word of length k: 1/k!) on all words up to length p — the order
    conditions (Hairer, Lubich, Wanner, III.3; the iterated sums of the coefficients)."""
    out = {(): 1.0}
    for j, c in flows:
        new = {}
        for w, v in out.items():
            for k in range(depth - len(w) + 1):  # w followed by (X_j)^k c^k / k!
                u = w + (j,) * k
                new[u] = new.get(u, 0.0) + v * c**k / math.factorial(k)
        out = new
    return out


def _condition_residuals(flows, depth=5):
    """max over words of each length k <= depth of |coefficient - 1/k!|."""
    sig = _signature(flows, depth)
    res = [0.0] * (depth + 1)
    for w, v in sig.items():
        res[len(w)] = max(res[len(w)], abs(v - 1.0 / math.factorial(len(w))))
    return res


def test_blanes_moan_coefficients_satisfy_the_order_conditions():
    """Every order condition up to order 4 holds to round-off for S6's published
    coefficients (all 30 words of length <= 4), and an order-5 condition fails."""
    flows = []
    for i, a in enumerate(BLANES_MOAN_A):
        flows.append((0, a))
        if i < len(BLANES_MOAN_B):
            flows.append((1, BLANES_MOAN_B[i]))
    res = _condition_residuals(flows)
    assert max(res[1:5]) < 1e-13, res
    assert res[5] > 1e-5, res  # order 4, not 5


def test_triple_jump_satisfies_the_order_conditions_as_a_splitting():
    """Three Strang steps exp(g h A/2) exp(g h B) exp(g h A/2) over gamma_1, gamma_2, gamma_3:
    order 4 in the free algebra, not 5; one Strang step has order 2, not 3 (the check itself
    tells orders apart)."""
    flows = [f for g in TRIPLE_JUMP_GAMMAS for f in ((0, g / 2), (1, g), (0, g / 2))]
    res = _condition_residuals(flows)
    assert max(res[1:5]) < 1e-13 and res[5] > 1e-3, res
    strang = _condition_residuals([(0, 0.5), (1, 1.0), (0, 0.5)])
    assert max(strang[1:3]) < 1e-15 and strang[3] > 1e-2, strang


# -- the scheme code against independent products of exponentials -----------------------------
def _ffn_terms(k, n_y=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    Ws = [torch.randn(n_y, n_y, generator=g, dtype=D) / math.sqrt(n_y) for _ in range(k)]
    return [FFNIntegral(W.clone()) for W in Ws], Ws


def test_blanes_moan_with_two_terms_is_the_published_splitting():
    (a, b), (Wa, Wb) = _ffn_terms(2, seed=1)
    scheme = BlanesMoan([Substep(a, Exact()), Substep(b, Exact())])
    u = torch.randn(2, 3, 4, dtype=D)
    h = 0.3
    want = u.numpy() @ _bm_matrix(h, Wa.numpy(), Wb.numpy())
    got = scheme.step(0.0, h, u, Grid.paper(3, 4))
    # (torch.linalg.matrix_exp is accurate to ~4e-12 for matrices of norm ~0.03, scipy's
    # expm to round-off: the tolerance is set by torch's kernel, not by the scheme)
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-10, atol=1e-10)
    assert scheme.n_calls == 13  # 7 flows of A, 6 of B


def test_triple_jump_is_three_strang_steps():
    (a, b, c), _ = _ffn_terms(3, seed=2)
    subs = [Substep(op, Exact()) for op in (a, b, c)]
    tj, strang = TripleJump(subs), Strang(subs)
    g, u, h = Grid.paper(3, 4), torch.randn(2, 3, 4, dtype=D), 0.4
    want = u
    for gam in TRIPLE_JUMP_GAMMAS:  # opsplit's Strang step over gamma h (negative for gamma_2)
        want = strang.step(0.0, gam * h, want, g)
    # merged calls: one matrix_exp over the merged time instead of two (equal to ~1e-12)
    torch.testing.assert_close(tj.step(0.0, h, u, g), want, rtol=1e-10, atol=1e-10)
    assert tj.n_calls == 6 * 3 - 5 and BlanesMoan(subs).n_calls == 12 * 3 - 11


@pytest.mark.parametrize("name", SCHEMES)
@pytest.mark.parametrize("k", [2, 3])
def test_order_four_for_any_number_of_terms_exact_flows(name, k):
    # u_t = u (W_1 + ... + W_k): the exact solution is u expm(T sum W), computed by scipy
    ops, Ws = _ffn_terms(k, seed=3 + k)
    scheme = SCHEMES[name]([Substep(op, Exact()) for op in ops])
    u = torch.randn(2, 3, 4, dtype=D)
    exact = torch.from_numpy(u.numpy() @ sla.expm(sum(W.numpy() for W in Ws)))
    st = temporal_convergence(
        lambda n: Propagator(scheme, n, t1=1.0, grid=Grid.paper(3, 4))(u), [2, 4, 8, 16], exact
    )
    assert st.fit.within(4.0, 0.15), str(st)


# -- measured order on the smooth continuous transformer (controls smooth in time) --------------
@pytest.fixture(scope="module")
def smooth():
    # controls on [0, 2], solved on [0.5, 1.5]: the triple jump's substeps read the controls
    # up to 0.35 dt outside each step
    p = smooth_transformer(n_x=4, n_y=4, J=2, seed=0, T=2.0, scale=0.5)
    ref = solve_reference(p.smooth_terms, p.f, t0=0.5, t1=1.5, grid=p.grid, rtol=1e-13, atol=1e-15)
    return p, ref


def _window_study(scheme, p, ref, ns):
    """The fitted order of ``scheme`` on [0.5, 1.5] against ``ref``."""
    return temporal_convergence(
        lambda n: Propagator(scheme, n, t0=0.5, t1=1.5, grid=p.grid)(p.f), ns, ref, t0=0.5, t1=1.5
    )


@pytest.mark.parametrize("name", SCHEMES)
def test_measured_order_four_on_the_smooth_problem(smooth, name):
    p, ref = smooth
    scheme = SCHEMES[name](p.substeps("rk4"))
    assert scheme.effective_order == 4
    st = _window_study(scheme, p, ref, [2, 4, 8, 16])
    assert st.fit.within(4.0, 0.15), str(st)
    assert (st.errors[1:] < st.errors[:-1]).all()


def test_substep_order_caps_the_composition(smooth):
    p, ref = smooth
    scheme = BlanesMoan(p.substeps("heun"))
    assert scheme.order == 4 and scheme.effective_order == 2
    st = _window_study(scheme, p, ref, [4, 8, 16, 32])
    assert st.fit.within(2.0, 0.15), str(st)


def test_blanes_moan_is_more_accurate_than_the_triple_jump_at_equal_work(smooth):
    p, ref = smooth
    # 25 substep calls per BM step, 13 per triple-jump step: BM at N_t = 8 costs 200 calls,
    # the triple jump at N_t = 16 costs 208
    bm = Propagator(BlanesMoan(p.substeps("rk4")), 8, t0=0.5, t1=1.5, grid=p.grid)(p.f)
    tj = Propagator(TripleJump(p.substeps("rk4")), 16, t0=0.5, t1=1.5, grid=p.grid)(p.f)
    assert relative_error(bm, ref) < 0.2 * relative_error(tj, ref)


def test_clocks_and_the_control_interval():
    tj = TripleJump(_ffn_terms(2)[0])
    # the middle substep of the Strang steps: gamma_1, then back by gamma_2 < 0
    assert tj.clock_range[0] == pytest.approx(TRIPLE_JUMP_GAMMAS[0] + TRIPLE_JUMP_GAMMAS[1])
    assert tj.clock_range[1] == pytest.approx(TRIPLE_JUMP_GAMMAS[0])
    lo, hi = BlanesMoan(_ffn_terms(3)[0]).clock_range
    assert lo >= 0.0 and hi <= 1.0 + 1e-12  # Blanes-Moan's substeps stay inside the step
    W = TimeBasis(0.3 * torch.randn(2, 3, 3, dtype=D), t1=1.0, axes=("y", "y"))
    prop = Propagator(
        TripleJump([Substep(FFNIntegral(W), RK4()), Substep(FFNIntegral(W), RK4())]), 2, t1=1.0
    )
    with pytest.raises(
        ValueError, match=r"TripleJump: a step over \[0, 0.5\] runs substeps over \[-0.17"
    ):
        prop(torch.randn(1, 2, 3, dtype=D))
    bm = Propagator(
        BlanesMoan([Substep(FFNIntegral(W), RK4()), Substep(FFNIntegral(W), RK4())]), 2, t1=1.0
    )
    assert torch.isfinite(bm(torch.randn(1, 2, 3, dtype=D))).all()


# -- negative substeps: what cannot run backwards is refused before compute ----------------------
def _ffn():
    return _ffn_terms(1)[0][0]


IRREVERSIBLE = {
    "S1 projection (CatchUp)": (
        lambda: Substep(ProjectionS1(0.0, 1.0), CatchUp()),
        r"ProjectionS1\).*solver CatchUp\(\) is a resolvent",
    ),
    "S2 projection (Implicit)": (
        lambda: Substep(ProjectionS2(), Implicit()),
        r"ProjectionS2\).*Implicit\(\) is a resolvent",
    ),
    "implicit step": (
        lambda: Substep(_ffn(), Implicit()),
        r"FFNIntegral\).*Implicit\(\) is a resolvent",
    ),
    "semi-implicit": (
        lambda: Substep((_ffn(), ProjectionS2()), SemiImplicit()),
        r"SemiImplicit\(\) is not declared reversible",
    ),
    "dropout (training)": (
        lambda: Substep(FieldDropout(_ffn(), 0.1)),
        r"FieldDropout\).*cannot run backwards \(a random field",
    ),
    "relaxation": (lambda: Substep(Relaxation([_ffn()])), r"Relaxation\).*cannot run backwards"),
    "activation map": (
        lambda: Substep(Activation("gelu")),
        r"Activation is a map applied once per step",
    ),
    "affine map": (
        lambda: Substep(PointwiseAffine(torch.ones(4, dtype=D))),
        r"PointwiseAffine is a map",
    ),
}


@pytest.mark.parametrize("name", SCHEMES)
@pytest.mark.parametrize("case", IRREVERSIBLE)
def test_negative_substeps_are_refused(name, case):
    make, match = IRREVERSIBLE[case]
    with pytest.raises(
        ValueError, match=r"would be advanced over a negative time step \(-[0-9.]+ dt\)"
    ) as info:
        SCHEMES[name]([Substep(_ffn(), RK4()), make(), Substep(_ffn(), RK4())])
    info.match(match)
    info.match("Sheng-Suzuki")
    # and Strang (positive substeps only) takes them
    if case not in ("dropout (training)",):
        Strang([Substep(_ffn(), RK4()), make()])


def test_reversible_substeps_are_accepted_and_dropout_in_eval_mode():
    att = SoftmaxAttention(*(torch.randn(4, 4, dtype=D) / 2 for _ in range(3)))
    drop = FieldDropout(_ffn(), 0.1)
    drop.eval()
    subs = [
        Substep(att, ExplicitEuler()),
        Substep(_ffn(), Heun()),
        Substep(_ffn(), ODESolve("rk4")),
        Substep(_ffn(), Exact()),
        Substep(_ffn(), ProjectedS1(RK4())),
        Substep(drop),
    ]
    for cls in SCHEMES.values():
        s = cls(subs)
        assert s.effective_order == 1
        drop.train()  # switched to a random field after construction: refused at the next solve
        with pytest.raises(ValueError, match=r"substep 5 \(FieldDropout\)"):
            Propagator(s, 1)(torch.randn(1, 3, 4, dtype=D))
        drop.eval()
        assert torch.isfinite(Propagator(s, 1)(torch.randn(1, 3, 4, dtype=D))).all()


# -- dtypes, autograd, gradcheck, CUDA -------------------------------------------------------------
def _small(dtype, device=None):
    g = torch.Generator().manual_seed(5)

    def Wt():
        w = 0.5 * torch.randn(2, 3, 3, generator=g, dtype=D).to(dtype=dtype, device=device)
        return TimeBasis(w, t0=-1.0, t1=2.0, axes=("y", "y"))

    return [Substep(SoftmaxAttention(Wt(), Wt(), Wt()), RK4()), Substep(FFNIntegral(Wt()), RK4())]


@pytest.mark.parametrize("name", SCHEMES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_dtypes_and_autograd(name, dtype):
    subs = _small(dtype)
    prop = Propagator(SCHEMES[name](subs), 3, t1=1.0, grid=Grid.uniform(2, 3))
    f = torch.randn(2, 2, 3, dtype=dtype, requires_grad=True)
    out = prop(f)
    assert out.dtype == dtype and torch.isfinite(out).all()
    out.square().sum().backward()
    assert torch.isfinite(f.grad).all() and subs[0].terms[0].WV.coefficients.grad is not None


@pytest.mark.parametrize("name", SCHEMES)
def test_gradcheck(name):
    from torch.func import functional_call

    subs = _small(D)
    prop = Propagator(SCHEMES[name](subs), 2, t1=1.0, grid=Grid.uniform(2, 3))
    f = torch.randn(1, 2, 3, dtype=D, requires_grad=True)
    assert torch.autograd.gradcheck(lambda x: prop(x), (f,))
    w0 = subs[1].terms[0].W.coefficients
    key = next(k for k, p in prop.named_parameters() if p is w0)
    w = w0.detach().clone().requires_grad_(True)
    assert torch.autograd.gradcheck(lambda w: functional_call(prop, {key: w}, (f.detach(),)), (w,))


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("name", SCHEMES)
def test_cuda_matches_cpu(name):
    prop = Propagator(SCHEMES[name](_small(D)), 3, t1=1.0, grid=Grid.uniform(2, 3))
    f = torch.randn(2, 2, 3, dtype=D)
    cpu = prop(f)
    gpu = prop.to("cuda")(f.cuda())
    torch.testing.assert_close(gpu.cpu(), cpu, rtol=1e-10, atol=1e-10)


# -- the projected model: S1 kept in an outer Strang step (SchemeFlow) ----------------------------
@pytest.mark.parametrize("moving, expected", [(False, 4.0), (True, 2.0)])
def test_s1_in_an_outer_strang_step(moving, expected):
    # the composition runs the tangent-projected smooth terms (ProjectedS1(RK4): reversible);
    # the S1 projection (CatchUp, not reversible) stays in the outer Strang step.  With a
    # fixed S1 the outer projection is the identity on the manifold after the first step and
    # the inner order 4 shows; with sigma(t) moving the outer Strang splitting is order 2.
    from opsplit.schemes import SchemeFlow

    p = smooth_transformer(
        n_x=4, n_y=4, J=2, seed=1, T=2.0, constraint=True, moving=moving, scale=0.5
    )
    ref = solve_reference(
        [*p.smooth_terms, p.norm], p.f, t0=0.5, t1=1.5, grid=p.grid, rtol=1e-13, atol=1e-15
    )
    inner = BlanesMoan([Substep(op, ProjectedS1(RK4())) for op in p.smooth_terms])
    scheme = Strang([Substep(p.norm, CatchUp()), Substep(SchemeFlow(inner), Exact())])
    assert scheme.effective_order == 2  # what is guaranteed; the fixed-S1 case measures 4
    st = _window_study(scheme, p, ref, [2, 4, 8, 16])
    assert st.fit.within(expected, 0.15), str(st)
    with pytest.raises(
        ValueError, match=r"substep 0 \(ProjectionS1\) would be advanced over a negative"
    ):
        BlanesMoan([Substep(p.norm, CatchUp()), *inner.substeps])
