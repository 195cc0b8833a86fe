"""Data-parallel training with DistributedDataParallel, launched by torchrun: a continuous
ViT-style classifier (paper 002, eq. 36: patch embedding F, split encoder, class-token
read-out G) on scikit-learn's bundled digits, through opsplit's Trainer.

One node, two processes on CPU (gloo):

    torchrun --standalone --nproc_per_node 2 examples/train_ddp.py --epochs 5 --out runs/ddp

Two nodes, two processes each (run on every node; node_rank 0 on the first):

    torchrun --nnodes 2 --nproc_per_node 2 --node_rank 0 --master_addr 10.0.0.1 --master_port 29500 \\
        examples/train_ddp.py --out /shared/runs/ddp

Without torchrun (`python examples/train_ddp.py`) the same script trains in one process.
`--batch` is per process: the global batch is batch x world size.  Gradients are averaged
by DDP's all-reduce; only rank 0 writes checkpoints, CSV files and the curves; `--resume`
continues from a checkpoint (every rank reads it).  See docs/distributed.md.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from opsplit.control import Objective, TrainConfig, Trainer  # noqa: E402
from opsplit.control import distributed as od  # noqa: E402
from opsplit.data import TensorData, load_digits  # noqa: E402
from opsplit.models import ImageClassifier, SplitEncoder  # noqa: E402

DTYPES = {"float32": torch.float32, "float64": torch.float64}


def build(args, device=None) -> torch.nn.Module:
    """The model, from ``args.seed`` (the same weights on every rank; DDP would also
    broadcast rank 0's at wrapping)."""
    torch.manual_seed(args.seed)  # the embedding, norm and read-out draw from the global RNG
    g = torch.Generator().manual_seed(args.seed)
    enc = SplitEncoder(args.d_model, args.heads, args.d_ff, n_steps=args.n_steps, scheme=args.scheme,
                       generator=g)
    return ImageClassifier(8, 2, 1, 10, enc).to(device=device, dtype=DTYPES[args.dtype])


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--epochs", type=int, default=10)
    p.add_argument("--max-steps", type=int, default=None)
    p.add_argument("--batch", type=int, default=32, help="samples per process and step")
    p.add_argument("--n-train", type=int, default=None, help="use the first N training images only")
    p.add_argument("--d-model", type=int, default=32)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--d-ff", type=int, default=64)
    p.add_argument("--n-steps", type=int, default=4)
    p.add_argument("--scheme", default="hybrid")
    p.add_argument("--optimizer", default="adamw", choices=("adamw", "adam", "sgd"))
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--momentum", type=float, default=0.0)
    p.add_argument("--wd", type=float, default=0.05)
    p.add_argument("--schedule", default="cosine")
    p.add_argument("--warmup", type=int, default=20)
    p.add_argument("--grad-clip", type=float, default=1.0)
    p.add_argument("--gradient", default="backprop", choices=("backprop", "checkpoint", "adjoint"))
    p.add_argument("--dtype", default="float32", choices=tuple(DTYPES))
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--save-every", type=int, default=None)
    p.add_argument("--keep", type=int, default=2, help="step checkpoints to keep")
    p.add_argument("--out", default=None, help="run folder (written by rank 0)")
    p.add_argument("--no-plot", action="store_true", help="do not draw curves.png")
    p.add_argument("--resume", default=None, help="checkpoint or run folder to continue")
    p.add_argument("--backend", default="auto", choices=("auto", "gloo", "nccl"))
    p.add_argument("--device", default="auto", help="auto (cuda:LOCAL_RANK if CUDA is available), cpu or cuda")
    p.add_argument("--threads", type=int, default=None, help="intra-op threads per process (torchrun "
                   "sets OMP_NUM_THREADS=1)")
    return p


def main(argv=None) -> dict:
    args = parser().parse_args(argv)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    env = od.init_from_env(args.backend, args.device)  # no process group without torchrun
    try:
        train, test = load_digits(seed=0, dtype=DTYPES[args.dtype])
        if args.n_train is not None:
            train = TensorData(train.inputs[:args.n_train], train.targets[:args.n_train], name="train")
        train, test = train.to(env.device), test.to(env.device)
        model = build(args, env.device)
        cfg = TrainConfig(epochs=args.epochs, max_steps=args.max_steps, batch_size=args.batch,
                          optimizer=args.optimizer, lr=args.lr, momentum=args.momentum, weight_decay=args.wd,
                          schedule=args.schedule, warmup_steps=args.warmup, grad_clip=args.grad_clip,
                          gradient=args.gradient, seed=args.seed, drop_last=True, save_every=args.save_every,
                          keep_checkpoints=args.keep, progress=False)
        trainer = Trainer(model, Objective("cross_entropy"), cfg, forward_model=od.wrap(model, env),
                          **env.trainer_kwargs())
        t = time.perf_counter()
        # every rank evaluates the same model on the same data: rank 0 alone is enough
        trainer.fit(train, test if env.is_main else None, out_dir=args.out, resume=args.resume,
                    plot=not args.no_plot)
        wall = time.perf_counter() - t
        od.assert_in_sync(model)  # DDP keeps the replicas bitwise equal; check it
        result = {"world_size": env.world_size, "backend": env.backend, "device": str(env.device),
                  "global_batch": args.batch * env.world_size, "steps": trainer.step, "wall_s": wall,
                  "train_loss_last_step_rank0": trainer.history.steps[-1]["loss"] if trainer.history.steps
                  else None}
        if env.is_main:
            result.update({f"test_{k}": v for k, v in trainer.evaluate(test).items()})
            print(json.dumps(result, indent=1), flush=True)
    except BaseException:
        od.shutdown(barrier=False)  # the other ranks may be waiting in a collective
        raise
    od.shutdown()
    return {"trainer": trainer, "model": model, "env": env, **result}


if __name__ == "__main__":
    main()
