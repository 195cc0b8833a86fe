"""Converters: from_torch / to_torch round trips, training in opsplit then running in torch,
and clear errors for what is not converted or not valid input."""

from __future__ import annotations

import functools

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from opsplit import Grid
from opsplit.models import TorchDecoder, TorchEncoder, from_torch, to_torch, torch_state_dict
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
