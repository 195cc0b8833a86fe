"""The torch-exact schemes against torch's own modules (eval mode): forward and gradients with
respect to the inputs and every weight, for seeded random configurations covering d_model not
a power of two, nhead in {1, 3, 4}, dim_feedforward != d_model, ReLU/GELU, norm_first,
bias, batch_first, causal / key-padding / float masks, float32 / float64; the
TransformerEncoder stack (N_t layers, final norm) and the decoder layer/stack with memory.
Also the new operators on their own (FFN on a hidden grid, pointwise affine, pre-norm,
activation) against direct formulas."""

from __future__ import annotations

import itertools
import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from opsplit import Grid, Interval
from opsplit.models import TorchEncoder, from_torch, torch_state_dict
from opsplit.operators import (
    Activation,
    FeedForward,
    FieldDropout,
    MultiHeadAttention,
    PointwiseAffine,
    PreNorm,
    ProjectionS1,
    ProjectionS2,
)

TOL = {torch.float32: 1e-5, torch.float64: 1e-10}
D_MODEL = {1: 10, 3: 12, 4: 20}  # not powers of two, divisible by nhead


def _perturb(module, seed):
    """Random weights (torch's init has zero biases and unit norms: perturb all of them)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.add_(0.2 * torch.randn(p.shape, generator=g).to(p.dtype))


def _masks(kind, B, N, S, dtype, g):
    am = kpm = None
    if kind in ("causal", "causal+padding"):
        am = nn.Transformer.generate_square_subsequent_mask(N, dtype=dtype) if N == S else \
            torch.ones(N, S, dtype=torch.bool).triu_(1)
    if kind == "float":
        am = torch.randn(N, S, generator=g).to(dtype)
    if kind in ("padding", "causal+padding"):
        kpm = torch.zeros(B, S, dtype=torch.bool)
        kpm[0, S - 2 :] = True  # keep key 0: no query row is fully masked
        if am is not None and am.dtype != torch.bool:
            kpm = torch.zeros(B, S, dtype=dtype).masked_fill(kpm, float("-inf"))
    return am, kpm


def _layout(x, batch_first):
    return x if batch_first else x.transpose(0, 1).contiguous()


def _compare_grads(ref_module, model, tol, kind=None):
    g_ops = torch_state_dict(model, grads=True, kind=kind)
    checked = 0
    for name, p in ref_module.named_parameters():
        assert p.grad is not None, name
        assert g_ops[name] is not None, name
        torch.testing.assert_close(g_ops[name], p.grad, rtol=0, atol=tol, msg=lambda m, n=name: f"{n}: {m}")
        checked += 1
    assert checked == len(g_ops)


def _assert_same_pass(ref_module, model, ref_call, call, x, g):
    """``call(x)`` (opsplit's model) equals ``ref_call(x)`` (torch's ``ref_module``) and so do the
    gradients of a random weighted sum (weights drawn from ``g``) for the input and for every
    parameter, within ``TOL`` of the dtype (rtol 0)."""
    x1, x2 = x.clone().requires_grad_(), x.clone().requires_grad_()
    w = 0.1 * torch.randn(x.shape, generator=g).to(x.dtype)
    ref = ref_call(x1)
    out = call(x2)
    tol = TOL[x.dtype]
    torch.testing.assert_close(out, ref, rtol=0, atol=tol)
    (ref * w).sum().backward()
    (out * w).sum().backward()
    torch.testing.assert_close(x2.grad, x1.grad, rtol=0, atol=tol)
    _compare_grads(ref_module, model, tol)


ENCODER_CONFIGS = list(
    itertools.product([1, 3, 4], ["relu", "gelu"], [False, True], [True, False], [False, True],
                      [torch.float32, torch.float64])
)
MASK_KINDS = ["none", "causal", "padding", "causal+padding", "float"]


@pytest.mark.parametrize("nhead,act,norm_first,bias,batch_first,dtype", ENCODER_CONFIGS)
def test_encoder_layer(nhead, act, norm_first, bias, batch_first, dtype):
    k = ENCODER_CONFIGS.index((nhead, act, norm_first, bias, batch_first, dtype))
    g = torch.Generator().manual_seed(k)
    E = D_MODEL[nhead]
    layer = nn.TransformerEncoderLayer(E, nhead, dim_feedforward=E + 7, dropout=0.1, activation=act,
                                       norm_first=norm_first, bias=bias, batch_first=batch_first,
                                       dtype=dtype).eval()
    _perturb(layer, k)
    model = from_torch(layer)
    B, N = 3, 6
    mask, kpm = _masks(MASK_KINDS[k % len(MASK_KINDS)], B, N, N, dtype, g)
    x = _layout(torch.randn(B, N, E, generator=g).to(dtype), batch_first)
    _assert_same_pass(layer, model, lambda x: layer(x, src_mask=mask, src_key_padding_mask=kpm),
                      lambda x: model(x, mask, kpm), x, g)


STACK_CONFIGS = [
    (nl, nhead, nf, fin, dtype)
    for (nl, nhead, nf, fin), dtype in itertools.product(
        [(2, 4, False, True), (3, 3, True, True), (2, 1, True, False), (3, 4, False, False)],
        [torch.float32, torch.float64],
    )
]


@pytest.mark.parametrize("num_layers,nhead,norm_first,final,dtype", STACK_CONFIGS)
def test_encoder_stack(num_layers, nhead, norm_first, final, dtype):
    k = STACK_CONFIGS.index((num_layers, nhead, norm_first, final, dtype))
    g = torch.Generator().manual_seed(100 + k)
    E = D_MODEL[nhead]
    layer = nn.TransformerEncoderLayer(E, nhead, 2 * E + 1, activation="gelu" if k % 2 else "relu",
                                       norm_first=norm_first, batch_first=True, dtype=dtype)
    enc = nn.TransformerEncoder(layer, num_layers, norm=nn.LayerNorm(E, eps=1e-6, dtype=dtype) if final else None,
                                enable_nested_tensor=False).eval()
    _perturb(enc, k)
    model = from_torch(enc)
    assert model.n_steps == num_layers
    B, N = 2, 7
    mask, kpm = _masks(["causal+padding", "padding", "float", "causal"][k % 4], B, N, N, dtype, g)
    x = torch.randn(B, N, E, generator=g).to(dtype)
    _assert_same_pass(enc, model, lambda x: enc(x, mask=mask, src_key_padding_mask=kpm),
                      lambda x: model(x, mask=mask, src_key_padding_mask=kpm), x, g)


DECODER_CONFIGS = list(itertools.product([3, 4], [False, True], [False, True], ["relu", "gelu"],
                                         [torch.float32, torch.float64]))


@pytest.mark.parametrize("nhead,norm_first,batch_first,act,dtype", DECODER_CONFIGS)
def test_decoder_layer_with_memory(nhead, norm_first, batch_first, act, dtype):
    k = DECODER_CONFIGS.index((nhead, norm_first, batch_first, act, dtype))
    g = torch.Generator().manual_seed(200 + k)
    E = D_MODEL[nhead]
    layer = nn.TransformerDecoderLayer(E, nhead, E + 5, activation=act, norm_first=norm_first,
                                       batch_first=batch_first, bias=bool(k % 3), dtype=dtype).eval()
    _perturb(layer, k)
    model = from_torch(layer)
    B, T, S = 2, 5, 4
    tgt_mask, tkpm = _masks(["causal+padding", "causal", "none"][k % 3], B, T, T, dtype, g)
    mem_mask, mkpm = _masks(["padding", "float", "none", "causal+padding"][k % 4], B, T, S, dtype, g)
    tgt = _layout(torch.randn(B, T, E, generator=g).to(dtype), batch_first)
    mem = _layout(torch.randn(B, S, E, generator=g).to(dtype), batch_first)
    t1, t2 = tgt.clone().requires_grad_(), tgt.clone().requires_grad_()
    m1, m2 = mem.clone().requires_grad_(), mem.clone().requires_grad_()
    w = 0.1 * torch.randn(tgt.shape, generator=g).to(dtype)
    ref = layer(t1, m1, tgt_mask, mem_mask, tkpm, mkpm)
    out = model(t2, m2, tgt_mask, mem_mask, tkpm, mkpm)
    tol = TOL[dtype]
    torch.testing.assert_close(out, ref, rtol=0, atol=tol)
    (ref * w).sum().backward()
    (out * w).sum().backward()
    torch.testing.assert_close(t2.grad, t1.grad, rtol=0, atol=tol)
    torch.testing.assert_close(m2.grad, m1.grad, rtol=0, atol=tol)
    _compare_grads(layer, model, tol)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_decoder_stack(dtype):
    g = torch.Generator().manual_seed(7)
    dec = nn.TransformerDecoder(nn.TransformerDecoderLayer(12, 3, 17, dtype=dtype), 2,
                                norm=nn.LayerNorm(12, dtype=dtype)).eval()
    _perturb(dec, 7)
    model = from_torch(dec)
    tgt = torch.randn(5, 2, 12, generator=g).to(dtype)
    mem = torch.randn(6, 2, 12, generator=g).to(dtype)
    causal = nn.Transformer.generate_square_subsequent_mask(5, dtype=dtype)
    ref = dec(tgt, mem, tgt_mask=causal, tgt_is_causal=True)
    out = model(tgt, mem, tgt_is_causal=True)  # opsplit builds the causal mask from the hint
    torch.testing.assert_close(out, ref, rtol=0, atol=TOL[dtype])


@pytest.mark.parametrize("norm_first", [False, True])
def test_unfused_norm_is_the_core_projection_then_affine(norm_first):
    """fused_norm=False: LayerNorm = the core ProjectionS1 resolvent (Theorem 3.1 with eps)
    then the PointwiseAffine map, as separate substeps; still torch-exact."""
    torch.manual_seed(0)
    enc = nn.TransformerEncoder(nn.TransformerEncoderLayer(12, 3, 20, dropout=0.0, norm_first=norm_first,
                                                           dtype=torch.float64),
                                2, norm=nn.LayerNorm(12, dtype=torch.float64), enable_nested_tensor=False).eval()
    _perturb(enc, 3)
    model = from_torch(enc, fused_norm=False)
    kinds = [type(s.terms[0]).__name__ for s in model.scheme.substeps]
    if not norm_first:
        assert kinds == ["MultiHeadAttention", "ProjectionS1", "PointwiseAffine", "FeedForward",
                         "ProjectionS1", "PointwiseAffine"]
    x = torch.randn(6, 2, 12, dtype=torch.float64)
    torch.testing.assert_close(model(x), enc(x), rtol=0, atol=1e-10)


@pytest.mark.filterwarnings("ignore:The PyTorch API of nested tensors:UserWarning")
def test_fast_path_no_grad_eval():
    """Under no_grad in eval torch runs its fused kernel (_transformer_encoder_layer_fwd; with a
    key-padding mask nn.TransformerEncoder also converts to nested tensors and returns 0 at
    padded positions): opsplit matches on every non-padded token."""
    torch.manual_seed(1)
    enc = nn.TransformerEncoder(nn.TransformerEncoderLayer(20, 4, 33, batch_first=True), 2).eval()
    _perturb(enc, 1)
    model = from_torch(enc)
    x = torch.randn(3, 7, 20)
    kpm = torch.zeros(3, 7, dtype=torch.bool)
    kpm[1, 4:] = True
    with torch.no_grad():
        torch.testing.assert_close(model(x), enc(x), rtol=0, atol=1e-5)
        ref, out = enc(x, src_key_padding_mask=kpm), model(x, src_key_padding_mask=kpm)
    keep = ~kpm
    torch.testing.assert_close(out[keep], ref[keep], rtol=0, atol=1e-5)
    assert bool((ref[kpm] == 0).all())  # torch's nested-tensor fast path zeroes the pads


def test_unbatched_input():
    layer = nn.TransformerEncoderLayer(12, 3, 20, dtype=torch.float64).eval()
    _perturb(layer, 2)
    model = from_torch(layer)
    x = torch.randn(5, 12, dtype=torch.float64)
    kpm = torch.tensor([False, False, False, True, True])
    torch.testing.assert_close(model(x, src_key_padding_mask=kpm), layer(x, src_key_padding_mask=kpm),
                               rtol=0, atol=1e-10)


def test_dropout_identity_in_eval_random_in_train():
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(12, 3, 20, dropout=0.3, batch_first=True)
    model = from_torch(layer.eval())
    x = torch.randn(2, 5, 12)
    torch.testing.assert_close(model(x), layer(x), rtol=0, atol=1e-5)
    model.train()
    a, b = model(x), model(x)
    assert (a - b).abs().max() > 1e-4
    assert any(isinstance(s.terms[0], FieldDropout) for s in model.scheme.substeps)


def test_continuous_model_with_another_time_step():
    """The converted model is a continuous-time model: n_steps = 2 N_t halves dt and keeps
    the controls (piece n on [n, n+1)); n_steps = N_t is torch's network."""
    layer = nn.TransformerEncoderLayer(12, 3, 20, dtype=torch.float64, norm_first=True)
    enc = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False).eval()
    model = from_torch(enc)
    x = torch.randn(5, 2, 12, dtype=torch.float64)
    torch.testing.assert_close(model(x, n_steps=2), enc(x), rtol=0, atol=1e-10)
    fine = model(x, n_steps=64)
    finer = model(x, n_steps=128)
    assert (fine - enc(x)).abs().max() > 1e-3  # a different discretisation ...
    assert (finer - fine).abs().max() < 0.6 * (fine - model(x, n_steps=32)).abs().max()  # ... converging


# -- the new operators on their own ---------------------------------------------------------------
def test_feedforward_hidden_grid_quadrature():
    """F(u)(y) = int_z W2(z, y) act(int_y W1(xi, z) u(xi) dxi + b1(z)) dz + b2(y) with the
    y- and z-quadrature weights; with L = N it is linear2(act(linear1(u)))."""
    torch.manual_seed(0)
    Ny, Nz = 5, 9
    W1, b1, W2, b2 = (torch.randn(*s, dtype=torch.float64) for s in ((Ny, Nz), (Nz,), (Nz, Ny), (Ny,)))
    u = torch.randn(2, 3, Ny, dtype=torch.float64)
    for act, fn in (("relu", torch.relu), ("gelu", F.gelu)):
        op = FeedForward(W1, b1, W2, b2, activation=act)
        ref = F.linear(fn(F.linear(u, W1.t(), b1)), W2.t(), b2)
        torch.testing.assert_close(op.field(0.0, u, Grid.paper(3, Ny)), ref)
        hidden = Interval(length=2.0, rule="trapezoid")
        op = FeedForward(W1, b1, W2, b2, activation=act, hidden=hidden)
        g = Grid.uniform(3, Ny, ly=3.0)
        wy, wz = g.y.weights(torch.float64), hidden.with_n(Nz).weights(torch.float64)
        h = fn(torch.einsum("bxi,i,iz->bxz", u, wy, W1) + b1)
        ref = torch.einsum("bxz,z,zy->bxy", h, wz, W2) + b2
        torch.testing.assert_close(op.field(0.0, u, g), ref)


def test_pointwise_affine_after_projection_is_layernorm():
    torch.manual_seed(0)
    ln = nn.LayerNorm(7, eps=1e-5, dtype=torch.float64)
    _perturb(ln, 0)
    u = torch.randn(3, 4, 7, dtype=torch.float64)
    g = Grid.paper(4, 7)
    fused = PointwiseAffine(ln.weight, ln.bias, projection=ProjectionS1(0.0, 1.0, eps=1e-5))
    torch.testing.assert_close(fused.flow(0.0, 1.0, u, g), ln(u), rtol=0, atol=1e-12)
    P = ProjectionS1(0.0, 1.0, eps=1e-5)
    two = PointwiseAffine(ln.weight, ln.bias).flow(0.0, 1.0, P.resolvent(0.0, 1.0, u, g), g)
    torch.testing.assert_close(two, ln(u), rtol=0, atol=1e-12)
    # with the paper's scalar sigma_1, sigma_2 the fused map is gamma (sigma2 n + sigma1) + beta
    # (sigma as float64 tensors: a Python float would be stored as a float32 buffer)
    P2 = ProjectionS1(torch.tensor(0.3, dtype=torch.float64), torch.tensor(2.0, dtype=torch.float64), eps=1e-5)
    n = (u - u.mean(-1, keepdim=True)) / torch.sqrt(u.var(-1, unbiased=False, keepdim=True) + 1e-5)
    ref = ln.weight * (2.0 * n + 0.3) + ln.bias
    torch.testing.assert_close(PointwiseAffine(ln.weight, ln.bias, projection=P2).flow(0.0, 1.0, u, g), ref,
                               rtol=0, atol=1e-12)
    # non-uniform y-weights: the general path (weighted mean and variance, Theorem 3.1)
    gt = Grid.uniform(4, 7, rule="trapezoid")
    wy = gt.y.weights(torch.float64) / gt.y.measure
    a = (u * wy).sum(-1, keepdim=True)
    b = ((u - a) ** 2 * wy).sum(-1, keepdim=True)
    ref = ln.weight * (u - a) / torch.sqrt(b + 1e-5) + ln.bias
    torch.testing.assert_close(fused.flow(0.0, 1.0, u, gt), ref, rtol=0, atol=1e-12)


def test_prenorm_reads_the_normalised_state():
    torch.manual_seed(0)
    ffn = FeedForward(torch.randn(6, 8), torch.randn(8), torch.randn(8, 6), None)
    norm = PointwiseAffine(torch.rand(6) + 0.5, torch.randn(6), projection=ProjectionS1(eps=1e-5))
    u = torch.randn(2, 3, 6)
    g = Grid.paper(3, 6)
    torch.testing.assert_close(PreNorm(ffn, norm).field(0.0, u, g), ffn.field(0.0, norm.flow(0.0, 1.0, u, g), g))
    with pytest.raises(TypeError, match="Δt-independent map"):
        PreNorm(ffn, ffn)


def test_gelu_is_not_a_projection_relu_is():
    x = torch.linspace(-4, 4, 8001, dtype=torch.float64, requires_grad=True)
    gelu, relu = Activation("gelu"), Activation("relu")
    g = Grid.paper(1, x.numel())
    y = gelu.flow(0.0, 1.0, x.view(1, 1, -1), g).view(-1)
    (slope,) = torch.autograd.grad(y.sum(), x)
    assert slope.min() < -0.12 and slope.max() > 1.12  # not firmly non-expansive: no resolvent
    yy = gelu.flow(0.0, 1.0, y.view(1, 1, -1), g).view(-1)
    assert (yy - y).abs().max() > 0.1  # not idempotent: no projection
    r = relu.flow(0.0, 1.0, x.view(1, 1, -1), g)
    torch.testing.assert_close(relu.flow(0.0, 1.0, r, g), r)
    torch.testing.assert_close(r, ProjectionS2().resolvent(0.0, 1.0, x.view(1, 1, -1), g))
    assert relu.is_projection and not gelu.is_projection
    with pytest.raises(ValueError, match="activation: expected one of"):
        Activation("softplus")


def test_torch_exact_model_trains_and_gradchecks():
    model = TorchEncoder(6, 2, 7, dropout=0.0, num_layers=2, batch_first=True, norm_first=True,
                         final_norm=True, dtype=torch.float64)
    x = torch.randn(2, 3, 6, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda x: model(x), (x,))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loss0 = model(x.detach()).square().mean()
    loss0.backward()
    opt.step()
    assert model(x.detach()).square().mean() < loss0


def test_scale_is_exposed():
    model = TorchEncoder(12, 3, 20)
    assert isinstance(model.attention, MultiHeadAttention)
    assert math.isclose(model.attention.scale, 1 / math.sqrt(4))


def test_gradcheck_new_operators():
    """float64 gradcheck of every new operator's step (inputs and a weight)."""
    torch.manual_seed(0)
    d = dict(dtype=torch.float64)
    u = torch.randn(2, 3, 4, **d, requires_grad=True)
    g = Grid.uniform(3, 4, rule="trapezoid")
    W1 = torch.randn(4, 5, **d, requires_grad=True)
    for act in ("relu", "gelu", "gelu_tanh"):
        ffn = FeedForward(W1, torch.randn(5, **d), torch.randn(5, 4, **d), torch.randn(4, **d), activation=act,
                          hidden=Interval(length=1.0, rule="trapezoid"))
        assert torch.autograd.gradcheck(lambda u, W, ffn=ffn: FeedForward(
            W, ffn.b1.value, ffn.W2.value, ffn.b2.value, activation=ffn.activation, hidden=ffn.hidden
        ).field(0.0, u, g), (u, W1))
    w = torch.rand(4, **d).add_(0.5).requires_grad_()
    for eps, grid in ((1e-5, Grid.paper(3, 4)), (1e-5, g), (0.0, g)):
        P = ProjectionS1(0.2, 1.5, eps=eps)
        assert torch.autograd.gradcheck(
            lambda u, w, P=P, grid=grid: PointwiseAffine(w, torch.ones(4, **d), projection=P).flow(0.0, 1.0, u, grid),
            (u, w),
        )
    ffn = FeedForward(W1.detach(), None, torch.randn(5, 4, **d), None)
    norm = PointwiseAffine(torch.rand(4, **d) + 0.5, None, projection=ProjectionS1(eps=1e-5))
    assert torch.autograd.gradcheck(lambda u: PreNorm(ffn, norm).field(0.0, u, g), (u,))
    assert torch.autograd.gradcheck(lambda u: Activation("gelu").flow(0.0, 1.0, u, g), (u,))


def test_encoder_on_device(device):
    """CPU torch module vs opsplit on the device (float32)."""
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(20, 4, 33, batch_first=True, norm_first=True).eval()
    _perturb(layer, 5)
    model = from_torch(layer).to(device)
    x = torch.randn(2, 6, 20)
    mask = nn.Transformer.generate_square_subsequent_mask(6)
    out = model(x.to(device), mask.to(device))
    torch.testing.assert_close(out.cpu(), layer(x, mask), rtol=0, atol=1e-5)


def test_gelu_as_a_substep_of_a_scheme():
    """Activation is a map substep (Exact solver): the paper's FFN layer with GELU in place of
    the ReLU projection is u <- gelu(u + dt (u W + b))."""
    from opsplit import Propagator
    from opsplit.operators import FFNIntegral
    from opsplit.schemes import Lie
    from opsplit.solvers import Exact, ExplicitEuler, Substep

    torch.manual_seed(0)
    W, b = torch.randn(5, 5, dtype=torch.float64) * 0.3, torch.randn(5, dtype=torch.float64)
    scheme = Lie([Substep(FFNIntegral(W, b, bias_axis="y"), ExplicitEuler()), Substep(Activation("gelu"), Exact())])
    u = torch.randn(2, 3, 5, dtype=torch.float64)
    out = Propagator(scheme, 2)(u)
    ref = u
    for _ in range(2):
        ref = F.gelu(ref + ref @ W + b)
    torch.testing.assert_close(out, ref, rtol=0, atol=1e-12)
