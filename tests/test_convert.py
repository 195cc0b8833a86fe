"""Converters: from_torch / to_torch round trips, training in opsplit then running in torch,
and clear errors for what is not converted or not valid input."""

from __future__ import annotations

import functools

import pytest
import torch
import torch.nn.functional as F
from _helpers import assert_seeded_pass_close, same_draws, sigma_state
from torch import nn

from opsplit import Grid
from opsplit.models import (
    TorchDecoder,
    TorchEncoder,
    from_torch,
    load_torch_state_dict,
    to_torch,
    torch_state_dict,
)
from opsplit.operators import MultiHeadAttention

F64 = torch.float64


def _perturb(m, seed=0):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in m.parameters():
            p.add_(0.2 * torch.randn(p.shape, generator=g).to(p.dtype))


@pytest.mark.parametrize(
    "make",
    [
        lambda: nn.TransformerEncoderLayer(12, 3, 20, batch_first=True, dtype=F64),
        lambda: nn.TransformerEncoder(nn.TransformerEncoderLayer(12, 4, 20, norm_first=True, dtype=F64), 2,
                                      norm=nn.LayerNorm(12, eps=1e-6, dtype=F64), enable_nested_tensor=False),
        lambda: nn.TransformerDecoderLayer(12, 3, 20, activation="gelu", bias=False, dtype=F64),
        lambda: nn.TransformerDecoder(nn.TransformerDecoderLayer(12, 3, 20, dtype=F64), 2),
    ],
    ids=["encoder layer", "encoder stack", "decoder layer", "decoder stack"],
)
def test_round_trip(make):
    torch.manual_seed(0)
    ref = make().eval()
    _perturb(ref)
    model = from_torch(ref)
    back = to_torch(model)
    assert type(back) is type(ref)
    for (n1, p1), (n2, p2) in zip(ref.named_parameters(), back.named_parameters()):
        assert n1 == n2
        torch.testing.assert_close(p2, p1, rtol=0, atol=0)
    assert back.training == ref.training


def test_train_in_opsplit_run_in_torch():
    """A model built and trained in opsplit is run by plain torch after to_torch."""
    torch.manual_seed(0)
    model = TorchEncoder(10, 1, 13, dropout=0.0, num_layers=3, final_norm=True, batch_first=True, dtype=F64)
    x = torch.randn(4, 6, 10, dtype=F64)
    target = torch.randn(4, 6, 10, dtype=F64)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    for _ in range(3):
        opt.zero_grad()
        F.mse_loss(model(x), target).backward()
        opt.step()
    module = to_torch(model).eval()
    assert isinstance(module, nn.TransformerEncoder) and len(module.layers) == 3
    with torch.no_grad():
        torch.testing.assert_close(module(x), model.eval()(x), rtol=0, atol=1e-10)


def test_multiheadattention_operator():
    torch.manual_seed(0)
    mha = nn.MultiheadAttention(12, 4, batch_first=True, dtype=F64).eval()
    _perturb(mha)
    op = from_torch(mha)
    assert isinstance(op, MultiHeadAttention)
    x = torch.randn(2, 5, 12, dtype=F64)
    torch.testing.assert_close(op.field(0.0, x, Grid.paper(5, 12)), mha(x, x, x, need_weights=False)[0],
                               rtol=0, atol=1e-10)


def test_state_dict_names_and_grads_none_before_backward():
    model = from_torch(nn.TransformerEncoderLayer(12, 3, 20))
    sd = torch_state_dict(model)
    assert set(sd) == {n for n, _ in nn.TransformerEncoderLayer(12, 3, 20).named_parameters()}
    assert all(v is None for v in torch_state_dict(model, grads=True).values())


# -- unsupported torch options --------------------------------------------------------------------
def test_unsupported_options_are_named():
    layer = nn.TransformerEncoderLayer(12, 3, 20, activation=torch.tanh)
    with pytest.raises(ValueError, match="unsupported activation .*tanh"):
        from_torch(layer)
    layer = nn.TransformerEncoderLayer(12, 3, 20)
    layer.self_attn = nn.MultiheadAttention(12, 3, add_bias_kv=True)
    with pytest.raises(ValueError, match="add_bias_kv=True is not supported"):
        from_torch(layer)
    layer = nn.TransformerEncoderLayer(12, 3, 20)
    layer.self_attn = nn.MultiheadAttention(12, 3, add_zero_attn=True)
    with pytest.raises(ValueError, match="add_zero_attn=True is not supported"):
        from_torch(layer)
    layer = nn.TransformerEncoderLayer(12, 3, 20)
    layer.linear1.bias = None
    with pytest.raises(ValueError, match="mixed bias settings"):
        from_torch(layer)
    layer = nn.TransformerEncoderLayer(12, 3, 20)
    layer.norm2.eps = 1e-6
    with pytest.raises(ValueError, match="different eps"):
        from_torch(layer)
    layer = nn.TransformerEncoderLayer(12, 3, 20)
    layer.register_forward_hook(lambda *a: None)
    with pytest.raises(ValueError, match="forward hooks"):
        from_torch(layer)

    class MyLayer(nn.TransformerEncoderLayer):
        pass

    with pytest.raises(TypeError, match="subclass .* pass strict=False"):
        from_torch(MyLayer(12, 3, 20))
    assert isinstance(from_torch(MyLayer(12, 3, 20), strict=False), TorchEncoder)
    enc = nn.TransformerEncoder(nn.TransformerEncoderLayer(12, 3, 20), 2, enable_nested_tensor=False)
    enc.layers[1].linear1 = nn.Linear(12, 24)
    enc.layers[1].linear2 = nn.Linear(24, 12)
    with pytest.raises(ValueError, match="layer 1 differs from layer 0 in .*dim_feedforward"):
        from_torch(enc)
    enc = nn.TransformerEncoder(nn.TransformerEncoderLayer(12, 3, 20), 2, norm=nn.RMSNorm(12),
                                enable_nested_tensor=False)
    with pytest.raises(ValueError, match="expected None or nn.LayerNorm"):
        from_torch(enc)
    with pytest.raises(TypeError, match="unsupported module Linear"):
        from_torch(nn.Linear(3, 3))
    layer = nn.TransformerEncoderLayer(12, 3, 20, activation=functools.partial(F.gelu, approximate="tanh"))
    assert from_torch(layer).activation == "gelu_tanh"


def test_to_torch_refuses_what_torch_cannot_hold():
    model = TorchEncoder(12, 3, 20)
    model.grid = Grid.uniform(None, 12, ly=1.0)
    with pytest.raises(ValueError, match="Omega_y quadrature weights are not 1"):
        to_torch(model)
    model = TorchEncoder(12, 3, 20, num_layers=2)
    model.n_steps = 4
    with pytest.raises(ValueError, match="N_t = num_layers steps of dt = 1"):
        to_torch(model)
    with pytest.raises(ValueError, match="head_dim \\* nhead = 10 != d_model = 12"):
        to_torch(TorchEncoder(12, 2, 20, head_dim=5))
    with pytest.raises(ValueError, match="cannot hold 2 layers"):
        to_torch(TorchEncoder(12, 3, 20, num_layers=2), kind="layer")
    with pytest.raises(TypeError, match="expected an opsplit TorchEncoder or TorchDecoder"):
        to_torch(nn.Linear(2, 2))


# -- bad input ------------------------------------------------------------------------------------
def test_bad_inputs_are_named():
    enc = from_torch(nn.TransformerEncoderLayer(12, 3, 20, batch_first=True).eval())
    x = torch.randn(2, 5, 12)
    with pytest.raises(ValueError, match="expected d_model = 12 features .* got 10"):
        enc(torch.randn(2, 5, 10))
    with pytest.raises(ValueError, match=r"src: expected shape \(B, N, d_model\)"):
        enc(torch.randn(2, 5, 12, 1))
    with pytest.raises(TypeError, match="dtype torch.float64 differs from the model's torch.float32"):
        enc(x.double())
    with pytest.raises(ValueError, match=r"src_mask: expected shape \(N_q, N_k\) = \(5, 5\)"):
        enc(x, torch.zeros(4, 4, dtype=torch.bool))
    with pytest.raises(TypeError, match="src_mask: expected a bool mask .* got dtype torch.int64"):
        enc(x, torch.zeros(5, 5, dtype=torch.long))
    with pytest.raises(ValueError, match=r"src_key_padding_mask: expected shape \(B, N_k\) = \(2, 5\)"):
        enc(x, src_key_padding_mask=torch.zeros(5, 2, dtype=torch.bool))
    with pytest.raises(TypeError, match="src_key_padding_mask: expected a bool mask"):
        enc(x, src_key_padding_mask=torch.zeros(2, 5, dtype=torch.int32))
    with pytest.raises(ValueError, match="expected finite values"):
        enc(torch.full((2, 5, 12), float("nan")))
    dec = from_torch(nn.TransformerDecoderLayer(12, 3, 20, batch_first=True).eval())
    with pytest.raises(ValueError, match=r"memory_mask: expected shape \(N_q, N_k\) = \(5, 4\)"):
        dec(x, torch.randn(2, 4, 12), memory_mask=torch.zeros(5, 5, dtype=torch.bool))
    with pytest.raises(ValueError, match="memory: expected d_model = 12"):
        dec(x, torch.randn(2, 4, 11))
    with pytest.raises(ValueError, match="memory: expected the batch of tgt"):
        dec(x, torch.randn(3, 4, 12))
    with pytest.raises(ValueError, match="divisible by nhead"):
        TorchDecoder(10, 3, 20)
    with pytest.raises(ValueError, match="activation: expected one of"):
        TorchEncoder(12, 3, 20, activation="swish")


# -- LayerNorm without elementwise affine or without bias -------------------------------------------
def _with_norms(layer, E, decoder, affine, bias, dtype):
    for k in (1, 2, 3) if decoder else (1, 2):
        setattr(layer, f"norm{k}", nn.LayerNorm(E, eps=1e-5, elementwise_affine=affine, bias=bias, dtype=dtype))
    return layer


@pytest.mark.parametrize("affine,bias", [(False, True), (True, False), (False, False)],
                         ids=["no affine", "no bias", "no affine no bias"])
@pytest.mark.parametrize("decoder", [False, True], ids=["encoder", "decoder"])
@pytest.mark.parametrize("norm_first", [False, True], ids=["post", "pre"])
@pytest.mark.parametrize("fused", [True, False], ids=["fused", "unfused"])
def test_layer_norm_without_affine_or_bias(affine, bias, decoder, norm_first, fused):
    """nn.LayerNorm(elementwise_affine=False) is the S1(0, 1) projection with eps, bias=False an
    affine map without shift: converted exactly (outputs, input and weight gradients), no
    weight that torch does not have, and back to torch with the same parameters."""
    torch.manual_seed(0)
    E = 12
    Layer = nn.TransformerDecoderLayer if decoder else nn.TransformerEncoderLayer
    layer = _with_norms(Layer(E, 3, 20, dropout=0.0, batch_first=True, norm_first=norm_first, dtype=F64),
                        E, decoder, affine, bias, F64)
    Stack = nn.TransformerDecoder if decoder else nn.TransformerEncoder
    kw = {} if decoder else {"enable_nested_tensor": False}
    # the final norm with the other setting: it has its own flags
    ref = Stack(layer, 2, norm=nn.LayerNorm(E, elementwise_affine=not affine, bias=not bias, dtype=F64), **kw)
    _perturb(ref)
    model = from_torch(ref, fused_norm=fused)
    assert sum(p.numel() for p in model.parameters()) == sum(p.numel() for p in ref.parameters())
    x = torch.randn(2, 5, E, dtype=F64)
    args = (torch.randn(2, 4, E, dtype=F64),) if decoder else ()
    x1, x2 = x.clone().requires_grad_(), x.clone().requires_grad_()
    y_ref, y = ref(x1, *args), model(x2, *args)
    torch.testing.assert_close(y, y_ref, rtol=0, atol=1e-10)
    w = torch.randn_like(y)
    (y_ref * w).sum().backward()
    (y * w).sum().backward()
    torch.testing.assert_close(x2.grad, x1.grad, rtol=0, atol=1e-10)
    grads = torch_state_dict(model, grads=True)
    assert set(grads) == {n for n, _ in ref.named_parameters()}
    for name, p in ref.named_parameters():
        torch.testing.assert_close(grads[name], p.grad, rtol=0, atol=1e-10, msg=lambda m, n=name: f"{n}: {m}")
    back = to_torch(model)
    assert [n for n, _ in back.named_parameters()] == [n for n, _ in ref.named_parameters()]
    for (_, p1), (_, p2) in zip(ref.named_parameters(), back.named_parameters()):
        torch.testing.assert_close(p2, p1, rtol=0, atol=0)
    with torch.no_grad():
        torch.testing.assert_close(back(x, *args), y_ref, rtol=0, atol=1e-12)


def test_layer_norm_flags_in_one_layer_must_agree():
    layer = nn.TransformerEncoderLayer(12, 3, 20)
    layer.norm2 = nn.LayerNorm(12, elementwise_affine=False)
    with pytest.raises(ValueError, match="LayerNorms of a layer must share elementwise_affine and bias"):
        from_torch(layer)


# -- requires_grad -----------------------------------------------------------------------------------
@pytest.mark.parametrize("no_grad", [False, True], ids=["grad mode", "under no_grad"])
def test_requires_grad_is_kept(no_grad):
    torch.manual_seed(0)
    ref = nn.TransformerEncoder(nn.TransformerEncoderLayer(12, 3, 20, dropout=0.0, batch_first=True, dtype=F64), 2,
                                norm=nn.LayerNorm(12, dtype=F64), enable_nested_tensor=False)
    frozen = {"norm.weight"} | {f"layers.{n}.{w}" for n in range(2)
                                for w in ("self_attn.in_proj_weight", "linear1.bias", "norm2.weight")}
    for name, p in ref.named_parameters():
        p.requires_grad_(name not in frozen)
    with torch.set_grad_enabled(not no_grad):
        model = from_torch(ref)
    m = model
    assert not m.attention.WQ.raw.requires_grad and not m.attention.WV.raw.requires_grad
    assert m.attention.bQ.raw.requires_grad and m.attention.WO.raw.requires_grad
    assert not m.ffn.b1.raw.requires_grad and m.ffn.W1.raw.requires_grad
    assert not m.norm(2).weight.raw.requires_grad and m.norm(1).weight.raw.requires_grad
    assert not m.final_affine.weight.value.requires_grad and m.final_affine.bias.value.requires_grad
    model(torch.randn(2, 5, 12, dtype=F64)).sum().backward()
    for name, g in torch_state_dict(model, grads=True).items():
        assert (g is None) == (name in frozen), name
    back = to_torch(model)
    assert {n for n, p in back.named_parameters() if not p.requires_grad} == frozen
    ref.layers[1].linear2.weight.requires_grad_(False)  # frozen in one layer only
    with pytest.raises(ValueError, match=r"linear2.weight.requires_grad differs between layers \(frozen in layers \[1\]\)"):
        from_torch(ref)
    mha = nn.MultiheadAttention(12, 3, batch_first=True)
    mha.out_proj.weight.requires_grad_(False)
    op = from_torch(mha)
    assert not op.WO.raw.requires_grad and op.WQ.raw.requires_grad and op.bO.raw.requires_grad


def test_to_torch_refuses_split_requires_grad():
    model = TorchEncoder(12, 3, 20)
    model.attention.WK.raw.requires_grad_(False)  # WQ, WK, WV are one in_proj_weight in torch
    with pytest.raises(ValueError, match="in_proj_weight is made of opsplit weights of which some require grad"):
        to_torch(model)


# -- training mode: dropout exactly where torch has it ---------------------------------------------------
def _dropouts(layer, residual, activation, attention):
    for k in (1, 2, 3):
        if hasattr(layer, f"dropout{k}"):
            getattr(layer, f"dropout{k}").p = residual
    layer.dropout.p = activation
    layer.self_attn.dropout = attention
    if hasattr(layer, "multihead_attn"):
        layer.multihead_attn.dropout = attention
    return layer


@pytest.mark.parametrize("decoder", [False, True], ids=["encoder", "decoder"])
@pytest.mark.parametrize("norm_first", [False, True], ids=["post", "pre"])
@pytest.mark.parametrize("ps", [(0.4, 0.4, 0.4), (0.4, 0.2, 0.3)], ids=["one p", "three ps"])
def test_train_mode_dropout_is_torchs(decoder, norm_first, ps):
    """torch draws, per layer: attention weights, after attention (dropout1), [cross-attention
    weights, dropout2], inside the FFN (dropout), after the FFN: the converted model draws the
    same masks in the same order.  With batch size 1 the masks are the same numbers (torch
    draws the attention output's mask in its internal (N, B, E) layout, opsplit in (B, N, E):
    for B > 1 the same draws, placed differently), so outputs and gradients agree exactly."""
    torch.manual_seed(0)
    Layer = nn.TransformerDecoderLayer if decoder else nn.TransformerEncoderLayer
    layer = _dropouts(Layer(12, 3, 20, batch_first=True, norm_first=norm_first, dtype=F64), *ps)
    Stack = nn.TransformerDecoder if decoder else nn.TransformerEncoder
    ref = Stack(layer, 2, **({} if decoder else {"enable_nested_tensor": False})).train()
    _perturb(ref)
    model = from_torch(ref)
    assert model.training and (model.dropout_p, model.activation_dropout, model.attention_dropout) == ps
    back = to_torch(model)
    for mod in back.layers:
        assert (mod.dropout1.p, mod.dropout.p, mod.self_attn.dropout) == ps
    mem = (torch.randn(3, 4, 12, dtype=F64),) if decoder else ()
    x = torch.randn(3, 5, 12, dtype=F64)
    assert len(same_draws(ref, model, x, *mem)) == 2 * (6 if decoder else 4)
    assert_seeded_pass_close(ref, model, x[:1], *(m[:1] for m in mem), seed=5, atol=1e-12)


# -- to_torch exports what the model computes -----------------------------------------------------
def _sigma_eps(model, s1=0.3, s2=1.7, eps=1e-2):
    """The model with every LayerNorm's S1 sigmas changed through load_state_dict and every
    projection's eps set to ``eps``."""
    from opsplit.operators import ProjectionS1

    model.load_state_dict(sigma_state(model, s1, s2))
    for m in model.modules():
        if isinstance(m, ProjectionS1):
            m.eps = eps
    return model


@pytest.mark.parametrize("decoder", [False, True], ids=["encoder", "decoder"])
@pytest.mark.parametrize("norm_first", [False, True], ids=["post-norm", "pre-norm"])
@pytest.mark.parametrize("fused", [True, False], ids=["fused", "unfused"])
def test_to_torch_exports_layer_norm_sigmas_and_eps(decoder, norm_first, fused):
    """A converted stack whose LayerNorms' S1 sigmas (0.3, 1.7) were changed through
    load_state_dict and whose projections' eps were set to 1e-2: to_torch's module computes
    the changed model's outputs (it was 1.96-2.54 off for the sigmas, 3e-3-2e-2 for the eps:
    torch's LayerNorms kept gamma, beta and the recorded eps), torch_state_dict(grads=True) is
    the gradient of torch's parameters of that module, and load_torch_state_dict of its
    weights into a model with the same sigmas gives the same outputs."""
    torch.manual_seed(0)
    E = 12
    Layer = nn.TransformerDecoderLayer if decoder else nn.TransformerEncoderLayer
    Stack = nn.TransformerDecoder if decoder else nn.TransformerEncoder
    kw = {} if decoder else {"enable_nested_tensor": False}
    ref = Stack(Layer(E, 3, 20, dropout=0.0, batch_first=True, norm_first=norm_first, dtype=F64), 2,
                norm=nn.LayerNorm(E, dtype=F64), **kw)
    _perturb(ref)
    model = _sigma_eps(from_torch(ref, fused_norm=fused))
    x = torch.randn(2, 5, E, dtype=F64)
    args = (torch.randn(2, 4, E, dtype=F64),) if decoder else ()
    y = model(x, *args)
    back = to_torch(model)
    y_back = back(x, *args)
    torch.testing.assert_close(y_back, y, rtol=0, atol=1e-12)
    assert float((ref(x, *args) - y).detach().abs().max()) > 1e-1  # the change is seen
    w = torch.randn_like(y)
    (y * w).sum().backward()
    (y_back * w).sum().backward()
    grads = torch_state_dict(model, grads=True)
    for name, p in back.named_parameters():
        torch.testing.assert_close(grads[name], p.grad, rtol=0, atol=1e-10, msg=lambda m, n=name: f"{n}: {m}")
    other = _sigma_eps(from_torch(ref, fused_norm=fused))
    load_torch_state_dict(other, {k: v.detach() for k, v in back.state_dict().items()})
    with torch.no_grad():
        torch.testing.assert_close(other(x, *args), y, rtol=0, atol=1e-12)
