"""Plain DDP peer of examples/mlp_train.py (same model, data, optimizer), for the
throughput ratio. Usage: python bench/runtime_ddp_worker.py RANK WORLD PORT STEPS OUT ARGS"""

from __future__ import annotations

import sys
import time
import warnings
from datetime import timedelta

warnings.filterwarnings("ignore")
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch import nn  # noqa: E402

sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[1]))
from examples.mlp_train import build  # noqa: E402
from runtime.data import ShardedSampler  # noqa: E402


def main() -> None:
    rank, world, port, steps = (int(a) for a in sys.argv[1:5])
    out = sys.argv[5]
    hidden, layers, dim, batch, warmup = (int(a) for a in sys.argv[6:11])
    torch.set_num_threads(1)
    store = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=60))
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world)
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(4096, dim, generator=gen)
    w = torch.randn(dim, 1, generator=gen)
    y = torch.sin(x @ w)
    torch.manual_seed(0)
    model = nn.parallel.DistributedDataParallel(build(hidden, layers, dim))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    sampler = ShardedSampler(4096, batch, seed=0)
    loss_fn = nn.MSELoss()
    t0 = time.perf_counter()
    for step in range(steps):
        if step == warmup:
            t0 = time.perf_counter()
        opt.zero_grad()
        idx = sampler.next_batch(rank, world)
        loss_fn(model(x[idx]), y[idx]).backward()
        opt.step()
    if rank == 0:
        with open(out, "w") as fh:
            fh.write(str((time.perf_counter() - t0) / (steps - warmup)))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
