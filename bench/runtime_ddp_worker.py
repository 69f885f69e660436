"""Peers of examples/mlp_train.py for the throughput ratio: the same model, data, Adam,
StepLR, per-worker batch and data order, without the runtime.

    python bench/runtime_ddp_worker.py --mode ddp|manual --rank R --world W --port P
        --steps N --warmup K --out FILE [model args of examples/mlp_train.py]

* ``ddp``: ``DistributedDataParallel`` (gloo, default 25 MB buckets; gradients averaged);
* ``manual``: gradients as views of one flat buffer, one ``allreduce`` after backward,
  divided by the world size: the runtime's step without the runtime.

Rank 0 writes the mean step time of the steps after the warmup to FILE.
"""

from __future__ import annotations

import argparse
import sys
import time
import warnings
from datetime import timedelta
from pathlib import Path

warnings.filterwarnings("ignore")
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch import nn  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from examples.mlp_train import add_model_args, build_model, make_data, make_optimizer  # noqa: E402
from runtime.data import ShardedSampler  # noqa: E402


def flat_grads(model: nn.Module) -> torch.Tensor:
    """Make every gradient a view of one zeroed flat buffer and return the buffer."""
    params = [p for p in model.parameters() if p.requires_grad]
    flat = torch.zeros(sum(p.numel() for p in params))
    off = 0
    for p in params:
        p.grad = flat[off:off + p.numel()].view_as(p)
        off += p.numel()
    return flat


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mode", choices=["ddp", "manual"], required=True)
    ap.add_argument("--rank", type=int, required=True)
    ap.add_argument("--world", type=int, required=True)
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--steps", type=int, required=True)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--out", required=True)
    ap.add_argument("--threads", type=int, default=1)
    add_model_args(ap)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    store = dist.TCPStore("127.0.0.1", a.port, is_master=False, timeout=timedelta(seconds=60))
    dist.init_process_group("gloo", store=store, rank=a.rank, world_size=a.world)
    x, y = make_data(a)
    model = build_model(a)
    flat = None
    if a.mode == "ddp":
        model = nn.parallel.DistributedDataParallel(model)
    else:
        flat = flat_grads(model)
        # The same starting weights as the runtime's rank 0 broadcast at start.
        for p in model.parameters():
            dist.broadcast(p.data, 0)
    opt = make_optimizer(model, a)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=10, gamma=0.9)
    sampler = ShardedSampler(a.dataset, a.batch, seed=a.seed)
    loss_fn = nn.MSELoss()
    t0 = time.perf_counter()
    for step in range(a.steps):
        if step == a.warmup:
            t0 = time.perf_counter()
        if flat is not None:
            flat.zero_()
        else:
            opt.zero_grad(set_to_none=False)
        idx = sampler.next_batch(a.rank, a.world)
        loss_fn(model(x[idx]), y[idx]).backward()
        if flat is not None:
            dist.all_reduce(flat)
            flat.div_(a.world)
        opt.step()
        sched.step()
    if a.rank == 0:
        Path(a.out).write_text(str((time.perf_counter() - t0) / (a.steps - a.warmup)))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
