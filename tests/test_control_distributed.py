"""Data-parallel training (opsplit.control.distributed, examples/train_ddp.py).

The main test launches ``torchrun --nproc_per_node 2`` on CPU (gloo, loopback) and checks
that the parameters equal those of single-process training with the same global batch
(float64, relative 1e-12), and that a DDP checkpoint resumes, under torchrun bit for bit
and in one process to the same tolerance.
"""

import importlib.util
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

from opsplit.control import Objective, Trainer, load_checkpoint
from opsplit.control import distributed as od
from opsplit.control.distributed import (
    DistEnv,
    check_data_parallel,
    env_from_environ,
    init_from_env,
)

sys.path.insert(0, str(Path(__file__).parent))
from _train_helpers import TinyClassifier, tiny_config, tiny_data  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "examples" / "train_ddp.py"


def _example():
    spec = importlib.util.spec_from_file_location("opsplit_example_train_ddp", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _clean_env(**extra) -> dict:
    env = {k: v for k, v in os.environ.items()
           if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
                        "GROUP_RANK", "ROLE_RANK", "TORCHELASTIC_RUN_ID")}
    env.update(OMP_NUM_THREADS="1", OMP_WAIT_POLICY="PASSIVE", PYTHONPATH=str(ROOT), **extra)
    return env


# -- the environment torchrun sets --------------------------------------------------------------

def test_env_from_environ_reads_torchrun_variables():
    assert env_from_environ({}) == DistEnv()
    e = env_from_environ({"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2"})
    assert (e.rank, e.world_size, e.local_rank, e.local_world_size) == (3, 4, 1, 2)
    assert not e.is_main and not e.distributed and e.trainer_kwargs() == {"rank": 3, "world_size": 4}
    e = env_from_environ({"RANK": "0", "WORLD_SIZE": "2"})
    assert (e.local_rank, e.local_world_size, e.is_main) == (0, 2, True)


@pytest.mark.parametrize("environ, match", [
    ({"RANK": "0"}, "WORLD_SIZE: not set"),
    ({"WORLD_SIZE": "2"}, "RANK: not set"),
    ({"RANK": "x", "WORLD_SIZE": "2"}, "RANK: expected an integer"),
    ({"RANK": "0", "WORLD_SIZE": "0"}, "WORLD_SIZE: expected an integer >= 1"),
    ({"RANK": "2", "WORLD_SIZE": "2"}, "RANK: expected 0 <= RANK < WORLD_SIZE = 2, got 2"),
    ({"RANK": "-1", "WORLD_SIZE": "2"}, "RANK: expected 0 <= RANK"),
    ({"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "1"}, "LOCAL_RANK"),
    ({"RANK": "1", "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "3"}, "LOCAL_WORLD_SIZE"),
])
def test_env_from_environ_refuses_a_bad_environment(environ, match):
    with pytest.raises(ValueError, match=match):
        env_from_environ(environ)


def test_init_from_env_without_torchrun_is_single_process():
    import torch.distributed as dist

    env = init_from_env(environ={}, device="cpu")
    assert env == DistEnv() and not dist.is_initialized()
    m = nn.Linear(2, 2)
    assert od.wrap(m, env) is m
    od.assert_in_sync(m)
    od.shutdown()  # nothing to do


@pytest.mark.parametrize("kwargs, environ, match", [
    ({"backend": "mpi"}, {}, "backend: expected 'auto' or one of"),
    ({"backend": "nccl", "device": "cpu"}, {}, "'nccl' needs a CUDA device"),
    ({"device": "tpu"}, {}, "device: expected"),
    ({"device": "meta"}, {}, "device: expected a CPU or CUDA device"),
    ({"timeout": 0}, {}, "timeout"),
    ({"device": "cpu"}, {"MASTER_ADDR": "127.0.0.1"}, "MASTER_PORT: not set"),
])
def test_init_from_env_refuses_bad_arguments(kwargs, environ, match):
    import torch.distributed as dist

    with pytest.raises(ValueError, match=match):
        init_from_env(environ={"RANK": "0", "WORLD_SIZE": "1", **environ}, **kwargs)
    assert not dist.is_initialized()


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error without CUDA")
def test_init_from_env_cuda_without_cuda_is_refused():
    with pytest.raises(ValueError, match="no CUDA device"):
        init_from_env(device="cuda", environ={"RANK": "0", "WORLD_SIZE": "1"})


# -- the trainer against the process group (a real one-process gloo group) ------------------------

@pytest.fixture
def one_process_group():
    import torch.distributed as dist

    env = init_from_env(environ={"RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1",
                                 "MASTER_PORT": str(_free_port())}, device="cpu", timeout=60)
    try:
        yield env
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def test_trainer_refuses_a_world_size_or_rank_that_is_not_the_process_group(one_process_group):
    env = one_process_group
    assert env.backend == "gloo" and env.distributed and env.device == torch.device("cpu")
    data = tiny_data()
    m = TinyClassifier()
    ddp = od.wrap(m, env)
    assert isinstance(ddp, nn.parallel.DistributedDataParallel) and ddp.module is m
    # world size 2 claimed, the group has 1 process
    with pytest.raises(ValueError, match=r"Trainer.world_size: expected the process group's size 1, got 2"):
        Trainer(m, Objective("cross_entropy"), tiny_config(drop_last=True, batch_size=4), forward_model=ddp,
                rank=0, world_size=2).fit(data)
    # data parallel without an averaging wrapper
    with pytest.raises(ValueError, match="forward_model: with world_size=2"):
        Trainer(m, Objective("cross_entropy"), tiny_config(drop_last=True, batch_size=4),
                rank=1, world_size=2).fit(data)
    # a DDP wrapper of another module
    other = od.wrap(TinyClassifier(), env)
    with pytest.raises(ValueError, match="wrapper of another module"):
        Trainer(m, Objective("cross_entropy"), tiny_config(), forward_model=other).fit(data)


def test_ddp_with_one_process_equals_plain_training(one_process_group):
    """A one-process DDP run is plain training (its all-reduce averages one gradient):
    bit for bit, through the same trainer."""
    cfg = tiny_config(epochs=1, batch_size=8, drop_last=True, gradient="checkpoint")
    data = tiny_data()
    plain = TinyClassifier(seed=4)
    Trainer(plain, Objective("cross_entropy"), cfg).fit(data)
    m = TinyClassifier(seed=4)
    tr = Trainer(m, Objective("cross_entropy"), cfg, forward_model=od.wrap(m, one_process_group),
                 **one_process_group.trainer_kwargs())
    tr.fit(data)
    assert tr.step == 5
    for (k, a), b in zip(plain.state_dict().items(), m.state_dict().values()):
        assert torch.equal(a, b), k
    od.assert_in_sync(m)
    od.shutdown()
    import torch.distributed as dist

    assert not dist.is_initialized()


def test_trainer_refuses_data_parallel_without_a_process_group():
    m = TinyClassifier()
    with pytest.raises(ValueError, match="world_size=2: expected an initialised torch.distributed process group"):
        Trainer(m, Objective("cross_entropy"), tiny_config(drop_last=True, batch_size=4), forward_model=nn.Identity(),
                rank=0, world_size=2).fit(tiny_data())


def test_rank_mismatch_is_refused(monkeypatch):
    """A process that is rank 1 of 2 in the group but tells the trainer rank 0 would train
    on rank 0's slice (every sample twice, half never): refused."""
    import torch.distributed as dist

    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(dist, "get_rank", lambda group=None: 1)
    monkeypatch.setattr(dist, "get_world_size", lambda group=None: 2)
    m, wrapper = nn.Linear(2, 2), nn.Identity()
    with pytest.raises(ValueError, match=r"Trainer.rank: expected this process's rank 1 in the process group, got 0"):
        check_data_parallel(0, 2, m, wrapper)
    with pytest.raises(ValueError, match=r"Trainer.world_size: expected the process group's size 2, got 4"):
        check_data_parallel(1, 4, m, wrapper)
    check_data_parallel(1, 2, m, wrapper)  # consistent: accepted


# -- torchrun: two processes against one ------------------------------------------------------------

# a tiny float64 model; 4 steps of 16 = 2 x 8 samples cross an epoch boundary (48 samples: 3 steps per
# epoch, reshuffled); SGD with momentum, weight decay, cosine schedule with warm-up, clipping active
COMMON = ["--dtype", "float64", "--n-train", "48", "--max-steps", "4", "--d-model", "8", "--heads", "2",
          "--d-ff", "16", "--n-steps", "2", "--optimizer", "sgd", "--lr", "0.05", "--momentum", "0.9",
          "--wd", "0.01", "--warmup", "1", "--grad-clip", "1.0", "--save-every", "2", "--no-plot"]
CPU = [*COMMON, "--device", "cpu"]  # gloo even where CUDA is available
RTOL = 1e-12


def _torchrun(args, nproc=2, timeout=1800):  # a guard against a hang, not a measure of speed
    last = None
    for _ in range(3):  # a port taken between _free_port and torchrun: try another
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc_per_node", str(nproc),
               "--master_addr", "127.0.0.1", "--master_port", str(_free_port()), str(SCRIPT), *args]
        last = subprocess.run(cmd, cwd=ROOT, env=_clean_env(), capture_output=True, text=True, timeout=timeout)
        if last.returncode == 0:
            return last
        if "address already in use" not in (last.stdout + last.stderr).lower():
            break
    raise AssertionError(f"torchrun failed (rc {last.returncode}):\n{last.stdout[-3000:]}\n{last.stderr[-6000:]}")


def _state(model):
    return {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}


def _checkpoint_state(path, ex, argv):
    model = ex.build(ex.parser().parse_args(argv))
    load_checkpoint(path, model, restore_rng=False)
    return _state(model)


def _rel_diff(a: dict, b: dict) -> float:
    """max |a - b| / max |b| over every tensor of the state (the parameters' scale)."""
    assert a.keys() == b.keys()
    num = max(float((a[k] - b[k]).abs().max()) for k in a)
    den = max(float(b[k].abs().max()) for k in b)
    return num / den


@pytest.fixture(scope="module")
def ddp_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("ddp")
    res = _torchrun([*CPU, "--batch", "8", "--out", str(out)])
    return out, res


@pytest.mark.slow
def test_torchrun_two_processes_equal_single_process_with_the_global_batch(ddp_run, tmp_path):
    out, res = ddp_run
    assert '"world_size": 2' in res.stdout and '"backend": "gloo"' in res.stdout
    ex = _example()
    # the DDP run's final checkpoint, written by rank 0, loaded into a bare model (no "module." prefix)
    ck = out / "checkpoints" / "step-00000004"
    ddp = _checkpoint_state(ck, ex, CPU)
    # the reference: one process, no process group, batch 16 = 2 x 8
    single = _state(ex.main([*CPU, "--batch", "16"])["model"])
    init = _state(ex.build(ex.parser().parse_args(CPU)))
    moved = _rel_diff(single, init)
    assert moved > 1e-3  # training changed the parameters
    err = _rel_diff(ddp, single)
    assert err <= RTOL, f"DDP vs single process: relative difference {err:.3e} > {RTOL:g}"
    # the comparison is discriminating: one process with the per-rank batch (8) is another run
    per_rank = _state(ex.main([*CPU, "--batch", "8"])["model"])
    assert _rel_diff(per_rank, single) > 1e3 * RTOL


@pytest.mark.slow
def test_ddp_checkpoint_resumes_in_one_process(ddp_run, tmp_path):
    """The step-2 checkpoint of the two-process run, continued by one process with the
    global batch, ends where the two-process run ended (float tolerance)."""
    out, _ = ddp_run
    ex = _example()
    ddp = _checkpoint_state(out / "checkpoints" / "step-00000004", ex, CPU)
    r = ex.main([*CPU, "--batch", "16", "--resume", str(out / "checkpoints" / "step-00000002")])
    assert r["steps"] == 4
    err = _rel_diff(_state(r["model"]), ddp)
    assert err <= RTOL, f"resumed in one process vs DDP: relative difference {err:.3e}"


@pytest.mark.slow
def test_torchrun_resume_is_bit_exact(ddp_run, tmp_path):
    """Two processes resumed from the step-2 checkpoint end bit for bit where the
    uninterrupted two-process run ended."""
    out, _ = ddp_run
    ex = _example()
    _torchrun([*CPU, "--batch", "8", "--out", str(tmp_path),
               "--resume", str(out / "checkpoints" / "step-00000002")])
    a = _checkpoint_state(tmp_path / "checkpoints" / "step-00000004", ex, CPU)
    b = _checkpoint_state(out / "checkpoints" / "step-00000004", ex, CPU)
    for k in b:
        assert torch.equal(a[k], b[k]), k


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_torchrun_on_cuda_nccl_equals_single_process(tmp_path):
    """NCCL on CUDA: one process per GPU (up to two)."""
    nproc = min(2, torch.cuda.device_count())
    args = [*COMMON, "--device", "cuda"]
    res = _torchrun([*args, "--batch", "8", "--out", str(tmp_path)], nproc=nproc)
    assert '"backend": "nccl"' in res.stdout
    ex = _example()
    ddp = _checkpoint_state(tmp_path / "checkpoints" / "step-00000004", ex, COMMON)
    single = _state(ex.main([*args, "--batch", str(8 * nproc)])["model"])
    err = _rel_diff(ddp, single)
    assert err <= 1e-10, f"NCCL DDP vs single process: relative difference {err:.3e}"
