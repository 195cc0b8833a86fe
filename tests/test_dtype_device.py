"""Every core operator and the propagator in float32 and float64, on CPU and CUDA
(CUDA cases are skipped without a device), under autograd."""

import pytest
import torch

from opsplit import Grid
from opsplit.models import PaperTransformer
from opsplit.operators import FFNIntegral, ProjectionS1, ProjectionS2, SoftmaxAttention


def _ops(ny, nx, dtype, device):
    def r(*s):
        return (0.3 * torch.randn(*s, dtype=dtype, device=device)).requires_grad_(True)

    return {
        "attention": SoftmaxAttention(r(ny, ny), r(ny, ny), r(ny, ny)),
        "s1": ProjectionS1(sigma1=0.1, sigma2=1.2),
        "s2": ProjectionS2(),
        "ffn": FFNIntegral(r(ny, ny), r(nx)),
    }


@pytest.mark.parametrize("name", ["attention", "s1", "s2", "ffn"])
def test_operator_dtype_device_autograd(name, dtype, device):
    torch.manual_seed(0)
    op = _ops(5, 4, dtype, device)[name].to(device)
    u = torch.randn(2, 4, 5, dtype=dtype, device=device, requires_grad=True)
    out = op(u, grid=Grid.uniform(4, 5, lx=2.0, ly=1.5))
    assert out.dtype == dtype and out.device.type == device.type and out.shape == u.shape
    out.square().sum().backward()
    assert u.grad is not None and torch.isfinite(u.grad).all()


def test_propagator_dtype_device_autograd(dtype, device):
    torch.manual_seed(0)
    model = PaperTransformer(6, n_x=4, J=2, n_steps=3, dtype=dtype, device=device)
    f = torch.randn(2, 4, 6, dtype=dtype, device=device)
    out = model(f)
    assert out.dtype == dtype and out.device.type == device.type
    out.square().sum().backward()
    grads = [p.grad for p in model.parameters()]
    assert all(g is not None and torch.isfinite(g).all() for g in grads)


def test_module_to_and_state_dict_roundtrip(device):
    torch.manual_seed(0)
    a = PaperTransformer(6, n_x=4, n_steps=2)
    b = PaperTransformer(6, n_x=4, n_steps=2, dtype=torch.float64)
    b.load_state_dict({k: v.double() for k, v in a.state_dict().items()})
    a = a.to(device=device, dtype=torch.float64)
    f = torch.randn(2, 4, 6, dtype=torch.float64)
    assert torch.allclose(a(f.to(device)).cpu(), b(f), atol=1e-12)


def test_cuda_matches_cpu(dtype):
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    torch.manual_seed(0)
    m = PaperTransformer(8, n_x=5, n_steps=3, dtype=dtype)
    f = torch.randn(3, 5, 8, dtype=dtype)
    tol = 1e-5 if dtype == torch.float32 else 1e-12
    assert torch.allclose(m(f), m.to("cuda")(f.cuda()).cpu(), atol=tol)
