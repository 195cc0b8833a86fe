"""gradcheck and gradgradcheck in float64 for every public non-kernel operator, every
scheme step, every solver and every model (issue 8).  The attention kernels (sliced,
ReLU-bump, kernel, softmax, multi-head) are audited in tests/bad_input/test_kernels.py and
the attention tests; here a softmax/multi-head attention appears only inside the models.

Inputs have ties where they matter: repeated tokens (identical rows: equal attention
scores, equal token statistics) and tokens whose max-abs is attained twice (the S1
projection rescales by max|u| as a constant for autograd, so a tie there must not split
or lose a derivative).  ReLU kinks are avoided (pre-activations kept away from 0), since
ReLU has no derivative there.  Small sizes keep the module well under 20 s."""


import pytest
import torch
from torch.autograd import gradcheck, gradgradcheck

from opsplit import Grid, Interval, Propagator
from opsplit.controls import PiecewiseConstant
from opsplit.models import ContinuousTransformer, PaperTransformer, TorchDecoder, TorchEncoder
from opsplit.operators import (
    Activation,
    FeedForward,
    FFNIntegral,
    FieldDropout,
    PointwiseAffine,
    PreNorm,
    ProjectionS1,
    ProjectionS2,
    project_s1,
)
from opsplit.schemes import Hybrid, Lie, Parallel, Relaxation, Strang
from opsplit.solvers import (
    RK4,
    CatchUp,
    Exact,
    ExactMidpoint,
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
G = Grid.paper(3, 4)
GW = Grid(x=Interval(n=3, length=1.0, rule="trapezoid"), y=Interval(n=4, length=2.0, rule="trapezoid"))


def _r(*shape, seed=0, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    return (scale * torch.randn(*shape, generator=g, dtype=D)).requires_grad_(True)


def state_with_ties(seed=0):
    """(1, 3, 4) with token 2 = token 0 (repeated tokens) and token 1's max-abs attained
    twice (entries 0 and 3 equal and extremal)."""
    u = torch.randn(1, 3, 4, generator=torch.Generator().manual_seed(seed), dtype=D)
    u[0, 2] = u[0, 0]
    u[0, 1] = torch.tensor([1.5, -0.3, 0.4, 1.5], dtype=D)
    return u.requires_grad_(True)


def away_from_zero(u, margin=0.1):
    with torch.no_grad():
        u[u.abs() < margin] = torch.sign(u[u.abs() < margin]) * margin + (u[u.abs() < margin] == 0) * margin
    return u


def both(f, inputs, fast=False):
    assert gradcheck(f, inputs, fast_mode=fast)
    assert gradgradcheck(f, inputs, fast_mode=fast)


def ffn(W, b=None, bias_axis="y"):
    return FFNIntegral(W, b, bias_axis=bias_axis)


# -- operators --------------------------------------------------------------------------------
@pytest.mark.parametrize("grid", [G, GW], ids=["paper", "trapezoid"])
@pytest.mark.parametrize("eps", [0.0, 1e-2])
def test_projection_s1_operator_with_ties(grid, eps):
    u = state_with_ties()
    s1, s2 = _r((), seed=1), (torch.tensor(1.3, dtype=D)).requires_grad_(True)

    def f(u, s1, s2):
        return ProjectionS1(s1, s2, eps=eps).resolvent(0.0, 1.0, u, grid)

    both(f, (u, s1, s2))


def test_project_s1_function_with_per_token_sigma():
    v = state_with_ties()[0]
    s1, s2 = _r(3, 1, seed=2), (torch.rand(3, 1, dtype=D) + 0.5).requires_grad_(True)
    both(lambda v, a, b: project_s1(v, a, b), (v, s1, s2))


def test_projection_s2_away_from_kinks_with_ties():
    u = away_from_zero(state_with_ties(3).detach()).requires_grad_(True)
    both(lambda u: ProjectionS2().resolvent(0.0, 1.0, u, G), (u,))


@pytest.mark.parametrize("eps,projection", [(None, False), (0.0, True), (1e-5, True)], ids=["affine", "S1", "fused-eps"])
def test_pointwise_affine(eps, projection):
    u = state_with_ties(4)
    w, b = _r(4, seed=5), _r(4, seed=6)

    def f(u, w, b):
        P = ProjectionS1(eps=eps) if projection else None
        return PointwiseAffine(w, b, projection=P).flow(0.0, 1.0, u, G)

    both(f, (u, w, b))


@pytest.mark.parametrize("method", ["field", "resolvent", "flow"])
@pytest.mark.parametrize("grid", [G, GW], ids=["paper", "trapezoid"])
def test_ffn_integral(method, grid):
    u, W, b = state_with_ties(7), _r(4, 4, seed=8, scale=0.3), _r(3, seed=9)

    def f(u, W, b):
        op = ffn(W, b, "x")
        return op.field(0.0, u, grid) if method == "field" else getattr(op, method)(0.0, 0.4, u, grid)

    both(f, (u, W, b))


@pytest.mark.parametrize("activation", ["relu", "gelu", "gelu_tanh", "silu", "tanh", "quick_gelu", "identity"])
def test_feedforward(activation):
    u = state_with_ties(10)
    W1, b1, W2, b2 = _r(4, 5, seed=11), _r(5, seed=12), _r(5, 4, seed=13), _r(4, seed=14)
    if activation == "relu":  # keep the hidden pre-activations away from the kink
        with torch.no_grad():
            pre = u @ W1 + b1
            b1 += torch.where(pre.abs().amin((0, 1)) < 0.1, 0.3, 0.0)

    def f(u, W1, b1, W2, b2):
        return FeedForward(W1, b1, W2, b2, activation=activation, hidden=Interval(length=2.0)).field(0.0, u, GW)

    both(f, (u, W1, b1, W2, b2), fast=True)


@pytest.mark.parametrize("name", ["gelu", "gelu_tanh", "silu", "tanh", "quick_gelu", "identity", "relu"])
def test_activation(name):
    u = away_from_zero(state_with_ties(15).detach()).requires_grad_(True)
    both(lambda u: Activation(name).flow(0.0, 1.0, u, G), (u,))


@pytest.mark.parametrize("train", [False, True], ids=["eval", "train"])
def test_field_dropout(train):
    u, W = state_with_ties(16), _r(4, 4, seed=17)

    def f(u, W):
        op = FieldDropout(ffn(W), 0.5).train(train)
        with torch.random.fork_rng():
            torch.manual_seed(0)  # the same mask in every evaluation
            return op.field(0.0, u, G)

    both(f, (u, W))


def test_prenorm():
    u, W = state_with_ties(18), _r(4, 4, seed=19)
    g = _r(4, seed=20)
    both(lambda u, W, g: PreNorm(ffn(W), [ProjectionS1(), PointwiseAffine(g)]).field(0.0, u, G), (u, W, g))


def test_relaxation():
    u, W = state_with_ties(21), _r(4, 4, seed=22, scale=0.3)
    with torch.no_grad():  # inner FFN+ReLU step away from its kink
        pre = u + 0.5 * ffn(W).field(0.0, u, G)
        u[pre.abs() < 0.1] += 0.25

    def f(u, W):
        inner = [Substep((ffn(W), ProjectionS2()), SemiImplicit())]
        return Relaxation(inner, weight=0.5).flow(0.0, 0.5, u, G)

    both(f, (u, W))


# -- solvers ----------------------------------------------------------------------------------
def _fields(W1, W2):
    return (ffn(W1), ffn(W2))


SOLVERS = {
    "ExplicitEuler": lambda W1, W2: Substep(ffn(W1), ExplicitEuler()),
    "Heun": lambda W1, W2: Substep(ffn(W1), Heun()),
    "RK4": lambda W1, W2: Substep(_fields(W1, W2), RK4()),
    "Implicit": lambda W1, W2: Substep(ffn(W1), Implicit()),
    "Exact": lambda W1, W2: Substep(ffn(W1), Exact()),
    "ExactMidpoint": lambda W1, W2: Substep(ffn(W1), ExactMidpoint()),
    "SemiImplicit": lambda W1, W2: Substep((ffn(W1), ProjectionS1()), SemiImplicit()),
    "CatchUp": lambda W1, W2: Substep(ProjectionS1(), CatchUp()),
    "ProjectedS1(Euler)": lambda W1, W2: Substep(ffn(W1), ProjectedS1()),
    "ProjectedS1(RK4)": lambda W1, W2: Substep(_fields(W1, W2), ProjectedS1(RK4())),
    "ODESolve(rk4)": lambda W1, W2: Substep(ffn(W1), ODESolve("rk4", options={"step_size": 0.5})),
}


@pytest.mark.parametrize("name", list(SOLVERS))
def test_solver_substep(name):
    u, W1, W2 = state_with_ties(23), _r(4, 4, seed=24, scale=0.5), _r(4, 4, seed=25, scale=0.5)
    both(lambda u, W1, W2: SOLVERS[name](W1, W2)(0.0, 0.5, u, GW), (u, W1, W2), fast=True)


# -- schemes ----------------------------------------------------------------------------------
SCHEMES = {
    "Lie": lambda ops: Lie(ops),
    "Strang": lambda ops: Strang(ops),
    "Parallel": lambda ops: Parallel(ops, batch=False),
    "Parallel(batched)": lambda ops: Parallel(ops, batch=True),
    "Hybrid": lambda ops: Hybrid(ops, groups=[[0, 1], [2]]),
}


@pytest.mark.parametrize("name", list(SCHEMES))
def test_scheme_step(name):
    u, W1, W2 = state_with_ties(26), _r(4, 4, seed=27, scale=0.5), _r(4, 4, seed=28, scale=0.5)

    def f(u, W1, W2):
        scheme = SCHEMES[name]([ffn(W1), ffn(W2), ProjectionS1()])
        return scheme(0.0, 0.5, u, G)

    both(f, (u, W1, W2), fast=True)


# -- propagator and models --------------------------------------------------------------------
def params_check(model, *inputs, fast=True, create=True):
    """gradcheck/gradgradcheck w.r.t. the inputs and every parameter of ``model``."""
    names = [n for n, _ in model.named_parameters()]
    leaves = tuple(p.detach().clone().requires_grad_(True) for p in model.parameters())
    k = len(inputs)

    def f(*args):
        return torch.func.functional_call(model, dict(zip(names, args[k:])), args[:k])

    assert gradcheck(f, (*inputs, *leaves), fast_mode=fast)
    assert gradgradcheck(f, (*inputs, *leaves), fast_mode=fast)


def test_propagator():
    W = PiecewiseConstant(0.3 * torch.randn(2, 4, 4, dtype=D), t1=1.0, axes=("y", "y"))
    prop = Propagator(Lie([ffn(W), ProjectionS1()]), 2, t1=1.0, grid=GW)
    params_check(prop, state_with_ties(29))


def test_paper_transformer():
    torch.manual_seed(0)
    model = PaperTransformer(4, n_x=3, J=1, n_steps=1, sigma1=0.5, dtype=D)
    params_check(model, state_with_ties(30))


def test_continuous_transformer():
    model = ContinuousTransformer(2, J=1, n_steps=1, dtype=D, generator=torch.Generator().manual_seed(0))
    params_check(model, state_with_ties(31))


def _math_sdpa():
    from torch.nn.attention import SDPBackend, sdpa_kernel

    return sdpa_kernel(SDPBackend.MATH)


SDPA_NO_DOUBLE_BACKWARD = r"derivative for aten::_scaled_dot_product_\w+_backward is not implemented"


@pytest.mark.parametrize("norm_first", [False, True], ids=["post", "pre"])
def test_torch_encoder(norm_first):
    """First derivatives pass.  Double backward: torch's fused CPU attention kernel (which
    TorchEncoder calls through ``F.scaled_dot_product_attention``, as
    ``nn.TransformerEncoderLayer`` does) has no derivative of its backward, so
    gradgradcheck is refused with torch's RuntimeError, exactly as for torch's own layer
    (asserted below); under ``sdpa_kernel(SDPBackend.MATH)`` it passes."""
    torch.manual_seed(0)
    model = TorchEncoder(4, 2, 6, dropout=0.0, activation="gelu", batch_first=True, norm_first=norm_first, dtype=D)
    x = state_with_ties(32)
    assert gradcheck(model, (x,), fast_mode=True)
    with pytest.raises(RuntimeError, match=SDPA_NO_DOUBLE_BACKWARD):
        gradgradcheck(model, (x,), fast_mode=True)
    torch_layer = torch.nn.TransformerEncoderLayer(4, 2, 6, dropout=0.0, batch_first=True, norm_first=norm_first, dtype=D)
    with pytest.raises(RuntimeError, match=SDPA_NO_DOUBLE_BACKWARD):
        gradgradcheck(torch_layer, (x,), fast_mode=True)
    with _math_sdpa():
        params_check(model, x)


def test_torch_decoder():
    torch.manual_seed(0)
    model = TorchDecoder(4, 2, 6, dropout=0.0, activation="gelu", batch_first=True, dtype=D)
    x, mem = state_with_ties(33), _r(1, 2, 4, seed=34)
    with pytest.raises(RuntimeError, match=SDPA_NO_DOUBLE_BACKWARD):
        gradgradcheck(model, (x, mem), fast_mode=True)
    with _math_sdpa():
        params_check(model, x, mem)


def test_attention_operators_double_backward():
    """What works, precisely (torch's CPU SDPA): ``SoftmaxAttention`` (3-D q, k, v: SDPA's
    math path) passes gradgradcheck as is.  ``MultiHeadAttention`` (4-D heads: the fused
    flash kernel) is refused by torch with a RuntimeError in float32 and float64 (never a
    number), and under ``sdpa_kernel(SDPBackend.MATH)`` its Hessian-vector product passes
    gradgradcheck and equals finite differences of the first derivative."""
    from opsplit.operators import MultiHeadAttention, SoftmaxAttention

    G = Grid.uniform(5, 4, 1.0, 1.0, rule="trapezoid")  # non-uniform key weights: a log-weight mask
    x = _r(2, 5, 4, seed=40).requires_grad_()
    sm = SoftmaxAttention(*(_r(4, 4, seed=41 + i) for i in range(3)))
    assert gradgradcheck(lambda u: sm.field(0.0, u, G), (x,))
    torch.manual_seed(0)
    mha = MultiHeadAttention.create(4, 2, dtype=D)
    with torch.no_grad():
        for p in mha.parameters():
            p.normal_()

    def f(u):
        return mha.field(0.0, u, G)

    for dt in (torch.float32, D):
        xx = x.detach().to(dt).requires_grad_()
        m = MultiHeadAttention.create(4, 2, dtype=dt)
        (g,) = torch.autograd.grad(m.field(0.0, xx, G).square().sum(), xx, create_graph=True)
        with pytest.raises(RuntimeError, match=SDPA_NO_DOUBLE_BACKWARD):
            torch.autograd.grad(g.sum(), xx)
    with _math_sdpa():
        assert gradgradcheck(f, (x,))
        t = _r(2, 5, 4, seed=45)
        (g,) = torch.autograd.grad(f(x).square().sum(), x, create_graph=True)
        (hvp,) = torch.autograd.grad((g * t).sum(), x)

    def grad_at(u):  # first derivative (default backend), for finite differences
        u = u.detach().requires_grad_()
        return torch.autograd.grad(f(u).square().sum(), u)[0]

    e = 1e-6
    fd = (grad_at(x + e * t) - grad_at(x - e * t)) / (2 * e)
    torch.testing.assert_close(hvp, fd, rtol=1e-6, atol=1e-6)


def test_cvt_operators_double_backward():
    """``Convolution2d`` passes gradgradcheck; ``ConvAttention`` (multi-head, 4-D SDPA) is
    refused by torch as ``MultiHeadAttention`` and passes under the math backend."""
    from opsplit.grid import ImageGrid
    from opsplit.operators import ConvAttention, Convolution2d, ConvTransfer

    g = ImageGrid.paper((2, 4), 4, n_prefix=1)
    x = _r(2, 9, 4, seed=50).requires_grad_()
    w = _r(4, 1, 3, 3, seed=51).requires_grad_()
    b = _r(4, seed=52).requires_grad_()
    assert gradgradcheck(lambda u, w, b: Convolution2d(w, b, groups="depthwise").field(0.0, u, g), (x, w, b))
    Wh = [_r(4, 2, 2, seed=53 + i) for i in range(3)]
    kv = ConvTransfer(_r(4, 1, 3, 3, seed=57), stride=2, padding=1, groups="depthwise", prefix="keep")
    op = ConvAttention(*Wh, _r(2, 2, 4, seed=56), k_proj=kv, v_proj=kv)
    op.check(g)
    with pytest.raises(RuntimeError, match=SDPA_NO_DOUBLE_BACKWARD):
        gradgradcheck(lambda u: op.field(0.0, u, g), (x,), fast_mode=True)
    with _math_sdpa():
        assert gradgradcheck(lambda u: op.field(0.0, u, g), (x,), fast_mode=True)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["f32", "f64"])
def test_single_head_softmax_paths_differentiate_twice_on_every_torch(dtype):
    """Issue 17, finding 3: from torch 2.14 the dispatcher sends 3-D SDPA inputs to the
    CPU flash kernel, which has no double backward. opsplit picks SDPA's math path for
    one head itself: a Hessian-vector product through ``SoftmaxAttention`` and through the
    float32 Gaussian kernel attention (SDPA with an additive mask) must run, in both
    dtypes, and agree with the float64 one."""
    from opsplit.functional import nadaraya_watson_attention
    from opsplit.operators import SoftmaxAttention

    gen = torch.Generator().manual_seed(3)
    x = torch.randn(2, 5, 4, generator=gen, dtype=torch.float64)
    w = [torch.randn(4, 4, generator=gen, dtype=torch.float64) * 0.5 for _ in range(3)]
    t = torch.randn(2, 5, 4, generator=gen, dtype=torch.float64)
    grid = Grid.paper(5, 4)
    fns = {
        "softmax": lambda u, ws: SoftmaxAttention(*ws).field(0.0, u, grid),
        "gaussian": lambda u, ws: nadaraya_watson_attention(u, u, u, kernel="gaussian",
                                                            bandwidth=1.5),
    }
    for name, fn in fns.items():
        hvps = []
        for dt in (dtype, torch.float64):
            u = x.to(dt).requires_grad_()
            out = fn(u, [a.to(dt) for a in w])
            (g,) = torch.autograd.grad((out * out).sum(), u, create_graph=True)
            (h,) = torch.autograd.grad((g * t.to(dt)).sum(), u)
            hvps.append(h.double())
        tol = 1e-4 if dtype == torch.float32 else 1e-12
        torch.testing.assert_close(hvps[0], hvps[1], rtol=tol, atol=tol, msg=name)


@pytest.mark.parametrize("which", ["paper", "continuous"])
def test_torch_func_transforms_of_the_models(which):
    """Issue 17: torch.func's grad, jacrev, jvp, hessian and vmap through the models equal
    plain autograd (vmap: the per-sample loop). vmap raised torch's data-dependent
    control-flow error (the input's finiteness check read a batched tensor's values)."""
    from torch.func import grad, hessian, jacrev, jvp, vmap

    torch.manual_seed(0)
    if which == "paper":
        m = PaperTransformer(n_y=4, n_x=3, J=1, n_steps=2, sigma1=1.0, dtype=D)
    else:
        m = ContinuousTransformer(2, n_steps=2, dtype=D)
    x = torch.randn(2, 3, 4, dtype=D) if which == "paper" else torch.randn(2, 2, dtype=D)

    def f(u):
        return m(u).pow(2).sum()

    xa = x.clone().requires_grad_()
    (g_ref,) = torch.autograd.grad(f(xa), xa)
    torch.testing.assert_close(grad(f)(x), g_ref, rtol=1e-12, atol=1e-12)
    jac_ref = torch.autograd.functional.jacobian(m, x)
    torch.testing.assert_close(jacrev(m)(x), jac_ref, rtol=1e-12, atol=1e-12)
    t = torch.randn_like(x)
    _, jv = jvp(m, (x,), (t,))
    torch.testing.assert_close(jv, (jac_ref.reshape(jv.numel(), -1) @ t.flatten()).reshape(jv.shape),
                               rtol=1e-10, atol=1e-10)
    h_ref = torch.autograd.functional.hessian(f, x[:1])
    torch.testing.assert_close(hessian(f)(x[:1]), h_ref, rtol=1e-10, atol=1e-10)
    per_sample = vmap(lambda u: m(u.unsqueeze(0)).squeeze(0))(x)
    torch.testing.assert_close(per_sample, torch.cat([m(x[i:i + 1]) for i in range(2)]),
                               rtol=1e-12, atol=1e-12)
