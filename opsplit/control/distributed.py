r"""Data-parallel training with ``torch.distributed``: ``DistributedDataParallel`` (DDP)
launched by ``torchrun``, through :class:`~opsplit.control.Trainer`.

``torchrun --nproc_per_node P script.py`` starts ``P`` processes per node and gives each
its place in the environment (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``,
``LOCAL_WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``).  A training script then does::

    from opsplit.control import Objective, TrainConfig, Trainer
    from opsplit.control import distributed as od

    env = od.init_from_env()                    # process group: gloo on CPU, NCCL on CUDA
    model = build_model().to(env.device)        # same seed on every rank (DDP also broadcasts rank 0's)
    trainer = Trainer(model, Objective("cross_entropy"), config,
                      forward_model=od.wrap(model, env), **env.trainer_kwargs())
    trainer.fit(train, test, out_dir="runs/x")  # checkpoints, CSV, plots: rank 0 only
    od.assert_in_sync(model)                    # every rank holds the same parameters
    del trainer                                 # nothing may hold the DDP wrapper at exit
    od.shutdown()

What is averaged: DDP all-reduces (sums, then divides by the world size) every parameter's
gradient during the backward pass.  Every rank computes the mean loss over its slice of
``config.batch_size`` samples of a global batch of ``world_size * batch_size`` samples
(:class:`~opsplit.control.Trainer` draws the global batch from the shared seeded order and
keeps slice ``rank``), so the averaged gradient is the gradient of the mean loss over the
global batch — the gradient of single-process training with ``batch_size * world_size``.
The running costs (smoothness / energy of the controls) are computed from the same
parameters on every rank, so their average is themselves.

Run without ``torchrun`` (no ``RANK``/``WORLD_SIZE`` in the environment), the same script
is single-process training: :func:`init_from_env` creates no process group, :func:`wrap`
returns the model itself, :func:`assert_in_sync` and :func:`shutdown` do nothing.

:func:`check_data_parallel` (called by :meth:`Trainer.fit`) refuses a trainer whose
``rank`` / ``world_size`` disagree with the process group, a data-parallel trainer without
a process group or without a gradient-averaging wrapper, and a DDP wrapper of another module.
"""

from __future__ import annotations

import gc
import os
from dataclasses import dataclass, field, replace
from datetime import timedelta

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

__all__ = [
    "DistEnv",
    "BACKENDS",
    "env_from_environ",
    "init_from_env",
    "wrap",
    "check_data_parallel",
    "any_rank",
    "assert_in_sync",
    "shutdown",
]

#: the process-group backends this module sets up
BACKENDS = ("gloo", "nccl")


@dataclass(frozen=True)
class DistEnv:
    """Where this process stands in a data-parallel run.

    Attributes:
        rank, world_size: the process's global rank and the number of processes.
        local_rank, local_world_size: its rank and the number of processes on its node.
        backend: ``"gloo"`` / ``"nccl"`` once a process group is initialised, ``None`` for a
            single process without one.
        device: where this process trains (``cuda:<local_rank>`` with NCCL, else CPU).
    """
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    local_world_size: int = 1
    backend: str | None = None
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))

    @property
    def is_main(self) -> bool:
        """Rank 0: the process that writes checkpoints, CSV files and plots."""
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        """A process group is initialised (``backend`` is set)."""
        return self.backend is not None

    def trainer_kwargs(self) -> dict:
        """``{"rank": ..., "world_size": ...}`` for :class:`~opsplit.control.Trainer`."""
        return {"rank": self.rank, "world_size": self.world_size}


def _env_int(environ, name: str) -> int:
    raw = environ[name]
    try:
        return int(str(raw).strip())
    except ValueError:
        raise ValueError(f"environment variable {name}: expected an integer, got {raw!r}") from None


def env_from_environ(environ=None) -> DistEnv:
    """Read ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK`` and ``LOCAL_WORLD_SIZE`` (as set by
    ``torchrun``) from ``environ`` (default ``os.environ``); no process group is created.

    Neither ``RANK`` nor ``WORLD_SIZE`` set: a single process (rank 0 of 1).  One of them
    without the other, a non-integer, ``WORLD_SIZE < 1``, ``RANK`` outside
    ``[0, WORLD_SIZE)`` or ``LOCAL_RANK`` outside ``[0, LOCAL_WORLD_SIZE)``: ``ValueError``
    naming the variable.  ``LOCAL_RANK`` defaults to 0, ``LOCAL_WORLD_SIZE`` to
    ``WORLD_SIZE``.
    """
    environ = os.environ if environ is None else environ
    has_rank, has_ws = "RANK" in environ, "WORLD_SIZE" in environ
    if not has_rank and not has_ws:
        return DistEnv()
    if has_rank != has_ws:
        missing, present = ("WORLD_SIZE", "RANK") if has_rank else ("RANK", "WORLD_SIZE")
        raise ValueError(f"environment variable {missing}: not set although {present} is; launch with "
                         "torchrun (which sets both) or set both")
    rank, ws = _env_int(environ, "RANK"), _env_int(environ, "WORLD_SIZE")
    if ws < 1:
        raise ValueError(f"environment variable WORLD_SIZE: expected an integer >= 1, got {ws}")
    if not 0 <= rank < ws:
        raise ValueError(f"environment variable RANK: expected 0 <= RANK < WORLD_SIZE = {ws}, got {rank}")
    local_rank = _env_int(environ, "LOCAL_RANK") if "LOCAL_RANK" in environ else 0
    lws = _env_int(environ, "LOCAL_WORLD_SIZE") if "LOCAL_WORLD_SIZE" in environ else ws
    if not 1 <= lws <= ws:
        raise ValueError(f"environment variable LOCAL_WORLD_SIZE: expected 1 <= LOCAL_WORLD_SIZE <= "
                         f"WORLD_SIZE = {ws}, got {lws}")
    if not 0 <= local_rank < lws:
        raise ValueError(f"environment variable LOCAL_RANK: expected 0 <= LOCAL_RANK < LOCAL_WORLD_SIZE = "
                         f"{lws}, got {local_rank}")
    return DistEnv(rank=rank, world_size=ws, local_rank=local_rank, local_world_size=lws)


def _resolve_device(device, local_rank: int) -> torch.device:
    if device is None or device == "auto":
        return torch.device("cuda", local_rank) if torch.cuda.is_available() else torch.device("cpu")
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError):
        raise ValueError(f"init_from_env.device: expected 'auto', 'cpu', 'cuda' or a torch.device, "
                         f"got {device!r}") from None
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError("init_from_env.device: 'cuda' requested but no CUDA device is available")
        if dev.index is None:
            dev = torch.device("cuda", local_rank)
        if dev.index >= torch.cuda.device_count():
            raise ValueError(f"init_from_env.device: {dev} requested but this node has "
                             f"{torch.cuda.device_count()} CUDA device(s) (LOCAL_RANK={local_rank})")
    elif dev.type != "cpu":
        raise ValueError(f"init_from_env.device: expected a CPU or CUDA device, got {dev}")
    return dev


def _resolve_backend(backend, dev: torch.device) -> str:
    if backend is None or backend == "auto":
        backend = "nccl" if dev.type == "cuda" else "gloo"
    if backend not in BACKENDS:
        raise ValueError(f"init_from_env.backend: expected 'auto' or one of {BACKENDS}, got {backend!r}")
    if backend == "nccl" and dev.type != "cuda":
        raise ValueError(f"init_from_env.backend: 'nccl' needs a CUDA device, got device {dev}; use 'gloo' on CPU")
    available = dist.is_nccl_available() if backend == "nccl" else dist.is_gloo_available()
    if not available:
        raise ValueError(f"init_from_env.backend: this torch build has no {backend!r} backend")
    return backend


def init_from_env(backend: str | None = "auto", device=None, *, environ=None,
                  timeout: float | None = None) -> DistEnv:
    """Initialise the default process group from ``torchrun``'s environment.

    Args:
        backend: ``"auto"`` (NCCL when ``device`` is CUDA, gloo otherwise), ``"gloo"`` or
            ``"nccl"``.
        device: ``"auto"``/``None`` (``cuda:<LOCAL_RANK>`` when CUDA is available, else CPU),
            ``"cpu"``, ``"cuda"`` (index ``LOCAL_RANK``) or a ``torch.device``.  On CUDA the
            process's current device is set to it.
        environ: the environment to read (default ``os.environ``).
        timeout: seconds a collective may wait before failing (default: torch's).

    Returns:
        a :class:`DistEnv` with ``backend`` set, or the single-process ``DistEnv()`` (no
        process group) when neither ``RANK`` nor ``WORLD_SIZE`` is set.

    Rendezvous is ``env://``: ``MASTER_ADDR`` and ``MASTER_PORT`` must be set (torchrun does).
    If a default process group already exists it is reused after checking that its rank and
    size are the environment's.
    """
    environ = os.environ if environ is None else environ
    env = env_from_environ(environ)
    if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, (int, float))
                                or not timeout > 0):
        raise ValueError(f"init_from_env.timeout: expected a number of seconds > 0, got {timeout!r}")
    dev = _resolve_device(device, env.local_rank)
    if "RANK" not in environ:
        return replace(env, device=dev)
    if not dist.is_available():
        raise ValueError("init_from_env: this torch build has no torch.distributed")
    be = _resolve_backend(backend, dev)
    if dist.is_initialized():
        if dist.get_rank() != env.rank or dist.get_world_size() != env.world_size:
            raise ValueError(f"init_from_env: a process group (rank {dist.get_rank()} of "
                             f"{dist.get_world_size()}) already exists and disagrees with the environment "
                             f"(RANK={env.rank}, WORLD_SIZE={env.world_size})")
        return replace(env, backend=dist.get_backend(), device=dev)
    missing = [v for v in ("MASTER_ADDR", "MASTER_PORT") if v not in environ]
    if missing:
        raise ValueError(f"environment variable {', '.join(missing)}: not set; the env:// rendezvous needs "
                         "MASTER_ADDR and MASTER_PORT (torchrun sets them)")
    if dev.type == "cuda":
        torch.cuda.set_device(dev)
    kw = {} if timeout is None else {"timeout": timedelta(seconds=float(timeout))}
    if environ is not os.environ:  # env:// reads os.environ; pass the rendezvous explicitly
        kw["init_method"] = f"tcp://{environ['MASTER_ADDR']}:{_env_int(environ, 'MASTER_PORT')}"
    else:
        kw["init_method"] = "env://"
    dist.init_process_group(be, rank=env.rank, world_size=env.world_size, **kw)
    return replace(env, backend=be, device=dev)


def wrap(model: nn.Module, env: DistEnv, **ddp_kwargs) -> nn.Module:
    """``DistributedDataParallel(model)`` when ``env`` has a process group (on CUDA with
    ``device_ids=[env.device.index]``), else ``model`` itself.  ``model`` must already be
    on ``env.device``; ``ddp_kwargs`` go to DDP."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"wrap.model: expected an nn.Module, got {type(model).__name__}")
    if not isinstance(env, DistEnv):
        raise TypeError(f"wrap.env: expected a DistEnv (from init_from_env), got {type(env).__name__}")
    if not env.distributed:
        return model
    devs = {p.device for p in model.parameters()}
    if devs != {env.device}:
        raise ValueError(f"wrap.model: expected every parameter on {env.device} (move the model with "
                         f".to(env.device) first), got {sorted(map(str, devs))}")

    if env.device.type == "cuda":
        ddp_kwargs.setdefault("device_ids", [env.device.index])
    return DDP(model, **ddp_kwargs)


def check_data_parallel(rank: int, world_size: int, model: nn.Module, forward_model: nn.Module) -> None:
    """Refuse a data-parallel set-up that would train silently wrong (``ValueError``).

    * ``world_size > 1`` needs an initialised default process group of that size in which
      this process has rank ``rank`` (otherwise ranks would train on the wrong slices of the
      global batch), and a ``forward_model`` that averages gradients (a DDP wrapper of
      ``model``; calling ``model`` itself would let every rank step on its own slice only);
    * a ``DistributedDataParallel`` forward model must wrap ``model`` (checkpoints and
      running costs read ``model``), and its process group must be the trainer's
      ``world_size`` (a DDP run with the default ``world_size=1`` would feed the whole
      batch to every rank).
    """
    is_ddp = isinstance(forward_model, DDP)
    if is_ddp and forward_model.module is not model:
        raise ValueError("Trainer.forward_model: a DistributedDataParallel wrapper of another module; expected "
                         "DistributedDataParallel(model) of the trainer's model")
    initialised = dist.is_available() and dist.is_initialized()
    if world_size > 1:
        if not initialised:
            raise ValueError(f"Trainer.world_size={world_size}: expected an initialised torch.distributed process "
                             "group (torch.distributed.init_process_group, or opsplit.control.distributed."
                             "init_from_env() under torchrun); none is")
        if forward_model is model:
            raise ValueError(f"Trainer.forward_model: with world_size={world_size} the training step must average "
                             "gradients across processes; pass forward_model=DistributedDataParallel(model)")
    if initialised and (world_size > 1 or is_ddp):
        g_rank, g_ws = dist.get_rank(), dist.get_world_size()
        if g_ws != world_size:
            raise ValueError(f"Trainer.world_size: expected the process group's size {g_ws}, got {world_size}; "
                             "pass rank=torch.distributed.get_rank(), world_size=torch.distributed."
                             "get_world_size() (or **env.trainer_kwargs())")
        if g_rank != rank:
            raise ValueError(f"Trainer.rank: expected this process's rank {g_rank} in the process group, got "
                             f"{rank}; pass rank=torch.distributed.get_rank() (or **env.trainer_kwargs())")


def any_rank(flags, device=None) -> list[bool]:
    """``flags`` (booleans) OR-ed over every rank: ``[True, False]`` on every rank if the
    first flag is set on any rank.  A collective (every rank must call it, with as many
    flags): how the ranks agree to stop together — on a non-finite objective or gradient,
    an unwritable output folder — instead of one rank raising while the others wait in
    the next all-reduce.  Without a process group (or with one process): ``flags``."""
    flags = [bool(f) for f in flags]
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return flags
    if device is None or (dist.get_backend() == "nccl" and torch.device(device).type != "cuda"):
        device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else "cpu"
    t = torch.tensor([1.0 if f else 0.0 for f in flags], dtype=torch.float32, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return [v > 0 for v in t.tolist()]


def _flat_state(model: nn.Module) -> torch.Tensor:
    ts = [t.detach().reshape(-1) for t in list(model.parameters()) + list(model.buffers())
          if t.is_floating_point() or t.is_complex()]
    if not ts:
        return torch.zeros(0, dtype=torch.float64)
    dev = ts[0].device
    return torch.cat([torch.view_as_real(t).reshape(-1) if t.is_complex() else t for t in ts]
                     ).to(device=dev, dtype=torch.float64)  # float32/16 -> float64 is exact


def assert_in_sync(model: nn.Module) -> None:
    """Check that every rank holds bitwise the same floating-point parameters and buffers
    as rank 0 (a collective: every rank must call it).  Raises ``RuntimeError`` on every
    rank, naming the ranks that differ; does nothing without a process group."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return
    mine = _flat_state(model)
    size = torch.tensor([mine.numel()], dtype=torch.float64, device=mine.device)
    sizes = [torch.zeros_like(size) for _ in range(dist.get_world_size())]
    dist.all_gather(sizes, size)
    if len({int(s) for s in sizes}) != 1:
        raise RuntimeError(f"assert_in_sync: the ranks' models have different sizes {[int(s) for s in sizes]}")
    ref = mine.clone()
    dist.broadcast(ref, src=0)
    bad = torch.tensor([0.0 if torch.equal(ref, mine) else 1.0], dtype=torch.float64, device=mine.device)
    flags = [torch.zeros_like(bad) for _ in range(dist.get_world_size())]
    dist.all_gather(flags, bad)
    differ = [r for r, f in enumerate(flags) if float(f) != 0.0]
    if differ:
        raise RuntimeError(f"assert_in_sync: the parameters of rank(s) {differ} differ from rank 0's")


def shutdown(*, barrier: bool = True) -> None:
    """Wait for every rank (``barrier``: so that no process leaves while rank 0 still
    writes its checkpoint), then destroy the default process group; nothing without one.
    After an error on this rank pass ``barrier=False``: the other ranks may be blocked in
    another collective.

    Drop the trainer and the DDP wrapper before the interpreter exits (``del trainer`` in a
    module-level script): the group is freed only when nothing refers to it, and a gloo group
    still alive at interpreter finalisation aborts the process (docs/distributed.md)."""
    if not (dist.is_available() and dist.is_initialized()):
        return
    gc.collect()  # a trainer dropped by the caller but kept in a reference cycle holds the group
    if not barrier:
        pass
    elif dist.get_backend() == "nccl":
        dist.barrier(device_ids=[torch.cuda.current_device()])
    else:
        dist.barrier()
    dist.destroy_process_group()
