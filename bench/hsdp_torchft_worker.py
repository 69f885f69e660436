"""TorchFT (0.2.0) HSDP peer of ``examples/gpt_train.py --fsdp``: the way TorchFT does HSDP
-- FSDP2 (``fully_shard``) over an ordinary 1-D mesh of the replica group (its own gloo
world, its own TCPStore), and the cross-replica-group average in FSDP2's
``all_reduce_hook`` through TorchFT's ``Manager.allreduce`` (its fault-tolerant gloo group,
one per shard index, reconfigured per quorum by the Lighthouse). Same model, data, AdamW,
schedule, accumulation and clipping (``torch.nn.utils.clip_grad_norm_`` on the DTensor
gradients) as ``bench/hsdp_baseline_worker.py``; the step is applied only when
``manager.should_commit()``.

    python bench/hsdp_torchft_worker.py --replica G --group-rank R --shards S --port P
        --lighthouse ADDR --steps T --time-file F [model args of examples/gpt_train.py]

Rank 0 of replica group 0 writes the mean step time after ``--warmup-timing`` steps to F.
Steady state only: no fault is injected (TorchFT restarts a whole replica group on a lost
rank; its recovery is measured for plain DDP in bench/runtime_bench.py --section torchft).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import warnings
from datetime import timedelta
from pathlib import Path
from typing import Any

warnings.filterwarnings("ignore")
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch.distributed.device_mesh import init_device_mesh  # noqa: E402
from torch.distributed.fsdp import FSDPModule, fully_shard  # noqa: E402

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
    """Train like the example, under TorchFT's Manager."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--replica", type=int, required=True)
    ap.add_argument("--group-rank", type=int, required=True)
    ap.add_argument("--replicas", type=int, required=True)
    ap.add_argument("--shards", type=int, required=True)
    ap.add_argument("--port", type=int, required=True, help="the replica group's TCPStore")
    ap.add_argument("--lighthouse", required=True)
    ap.add_argument("--steps", type=int, required=True)
    ap.add_argument("--time-file", required=True)
    ap.add_argument("--warmup-timing", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    add_model_args(ap)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    from torchft import Manager, ProcessGroupGloo

    rank, shards = args.group_rank, args.shards
    store = dist.TCPStore("127.0.0.1", args.port, is_master=False,
                          timeout=timedelta(seconds=120))
    dist.init_process_group("gloo", store=dist.PrefixStore("fsdp/", store), rank=rank,
                            world_size=shards)
    mesh = init_device_mesh("cpu", (shards,), mesh_dim_names=("shard",))
    tokens, vocab = make_data(args)
    model = build_model(args, vocab)
    for blk in model.blocks:
        fully_shard(blk, mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = make_optimizer(model, args)
    sched = make_schedule(opt, args, args.steps)
    sampler = ShardedSampler(len(tokens) - args.seq - 1, args.micro_batch, seed=args.seed)

    def state_dict() -> dict[str, Any]:
        return {"model": model.state_dict(), "optim": opt.state_dict(),
                "sched": sched.state_dict(), "sampler": sampler.state_dict()}

    def load_state_dict(sd: dict[str, Any]) -> None:
        model.load_state_dict(sd["model"])
        opt.load_state_dict(sd["optim"])
        sched.load_state_dict(sd["sched"])
        sampler.load_state_dict(sd["sampler"])

    manager = Manager(pg=ProcessGroupGloo(timeout=timedelta(seconds=30)), min_replica_size=1,
                      load_state_dict=load_state_dict, state_dict=state_dict,
                      replica_id=f"replica{args.replica}", rank=rank, world_size=shards,
                      store_addr="127.0.0.1", store_port=args.port,
                      lighthouse_addr=args.lighthouse, init_sync=False,
                      timeout=timedelta(seconds=30))

    def all_reduce_hook(output: torch.Tensor) -> None:
        # FSDP2 calls it with the reduce-scattered gradient of one FSDP module, per
        # micro-batch (as TorchFT's HSDP does); averaged over the participating replicas.
        manager.allreduce(output).wait()

    for mod in model.modules():
        if isinstance(mod, FSDPModule):
            mod.set_all_reduce_hook(all_reduce_hook)
    me, world = args.replica * shards + rank, args.replicas * shards
    offsets = torch.arange(args.seq + 1)
    t_warm = time.perf_counter()
    while manager.current_step() < args.steps:
        step = manager.current_step()
        if step == args.warmup_timing:
            t_warm = time.perf_counter()
        manager.start_quorum()
        torch.manual_seed(args.seed * 1_000_003 + step * 10_007 + me)
        opt.zero_grad(set_to_none=True)
        for _ in range(args.accum):
            idx = sampler.next_batch(me, world)
            window = tokens[idx.unsqueeze(1) + offsets]
            x, y = window[:, :-1], window[:, 1:]
            logits = model(x)
            loss = F.cross_entropy(logits.float().reshape(-1, vocab), y.reshape(-1))
            (loss / args.accum).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip)
        if manager.should_commit():
            opt.step()
            sched.step()
    if me == 0:
        Path(args.time_file).write_text(
            str((time.perf_counter() - t_warm) / max(args.steps - args.warmup_timing, 1)))
    manager.shutdown(wait=False)
    dist.barrier()
    dist.destroy_process_group()
    os._exit(0)


if __name__ == "__main__":
    main()
