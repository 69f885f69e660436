"""Plain FSDP2 HSDP peer of ``examples/gpt_train.py --fsdp``, no fault tolerance: one
``init_process_group`` (gloo) over every rank, ``init_device_mesh`` ("replicate", "shard"),
``fully_shard`` per block and the root on that 2-D mesh (FSDP2 reduce-scatters inside a
replica group and all-reduces across them itself), the same model, data, AdamW, schedule,
accumulation and clipping (``torch.nn.utils.clip_grad_norm_`` on the DTensor gradients).

    python bench/hsdp_baseline_worker.py --rank R --world N --shards S --port P
        --steps T --time-file F [model args of examples/gpt_train.py]

Rank 0 writes the mean step time after ``--warmup-timing`` steps to F.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time
import warnings
from datetime import timedelta
from pathlib import Path

warnings.filterwarnings("ignore")
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch.distributed.device_mesh import init_device_mesh  # noqa: E402
from torch.distributed.fsdp import fully_shard  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from examples.gpt_train import (  # noqa: E402
    add_model_args,
    build_model,
    make_data,
    make_optimizer,
    make_schedule,
)
from runtime.data import ShardedSampler  # noqa: E402


def main() -> None:
    """Train like the example, under plain torch.distributed."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--rank", type=int, required=True)
    ap.add_argument("--world", type=int, required=True)
    ap.add_argument("--shards", type=int, required=True)
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--steps", type=int, required=True)
    ap.add_argument("--time-file", required=True)
    ap.add_argument("--warmup-timing", type=int, default=5)
    ap.add_argument("--bf16", action="store_true")
    ap.add_argument("--threads", type=int, default=1)
    add_model_args(ap)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    store = dist.TCPStore("127.0.0.1", args.port, is_master=False,
                          timeout=timedelta(seconds=120))
    dist.init_process_group("gloo", store=store, rank=args.rank, world_size=args.world)
    mesh = init_device_mesh("cpu", (args.world // args.shards, args.shards),
                            mesh_dim_names=("replicate", "shard"))
    tokens, vocab = make_data(args)
    model = build_model(args, vocab)
    for blk in model.blocks:
        fully_shard(blk, mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = make_optimizer(model, args)
    sched = make_schedule(opt, args, args.steps)
    sampler = ShardedSampler(len(tokens) - args.seq - 1, args.micro_batch, seed=args.seed)
    offsets = torch.arange(args.seq + 1)
    t_warm = time.perf_counter()
    for step in range(args.steps):
        if step == args.warmup_timing:
            t_warm = time.perf_counter()
        torch.manual_seed(args.seed * 1_000_003 + step * 10_007 + args.rank)
        opt.zero_grad(set_to_none=True)
        for _ in range(args.accum):
            idx = sampler.next_batch(args.rank, args.world)
            window = tokens[idx.unsqueeze(1) + offsets]
            x, y = window[:, :-1], window[:, 1:]
            with (torch.autocast("cpu", dtype=torch.bfloat16) if args.bf16
                  else contextlib.nullcontext()):
                logits = model(x)
            loss = F.cross_entropy(logits.float().reshape(-1, vocab), y.reshape(-1))
            (loss / args.accum).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip)
        opt.step()
        sched.step()
    if args.rank == 0:
        Path(args.time_file).write_text(
            str((time.perf_counter() - t_warm) / max(args.steps - args.warmup_timing, 1)))
    dist.barrier()
    dist.destroy_process_group()
    os._exit(0)


if __name__ == "__main__":
    main()
