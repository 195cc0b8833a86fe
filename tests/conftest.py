import os

# OpenMP threads that spin while waiting slow small ops down by orders of magnitude on a
# busy machine; set before torch starts its thread pool.  One thread (torch, OpenMP, BLAS,
# and every subprocess a test starts): the suite must pass while other CPU-bound jobs run
# beside it, and threads that wait for each other on a loaded machine make the time of a
# test, and so any timeout, depend on the load
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")

import pytest  # noqa: E402
import torch  # noqa: E402
from hypothesis import HealthCheck, settings  # noqa: E402

settings.register_profile(
    "opsplit",
    deadline=None,
    max_examples=int(os.environ.get("OPSPLIT_HYPOTHESIS_EXAMPLES", "60")),
    suppress_health_check=[HealthCheck.too_slow],
    derandomize=True,
)
settings.load_profile("opsplit")

torch.set_num_threads(1)

DEVICE_PARAMS = [
    "cpu",
    pytest.param(
        "cuda",
        marks=[
            pytest.mark.cuda,
            pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device"),
        ],
    ),
]


@pytest.fixture(autouse=True)
def _seed_torch():
    """Every test starts from the same global RNG state, so a test's random inputs do
    not depend on which tests ran before it (or on pytest's ordering/selection)."""
    torch.manual_seed(0)


@pytest.fixture(params=DEVICE_PARAMS)
def device(request):
    return torch.device(request.param)


@pytest.fixture(params=[torch.float32, torch.float64], ids=["f32", "f64"])
def dtype(request):
    return request.param


@pytest.fixture(scope="module")
def one_thread():
    """Run a module's tests on one intra-op thread (for modules of tiny tensors)."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)
