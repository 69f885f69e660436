"""A plain torch.distributed training script (runs under ``torchrun``): DDP MLP with
dropout, a DataLoader over a DistributedSampler (shuffled), AdamW and a cosine schedule.
It imports nothing of yoco's: the transparent-mode tests run it unmodified."""

import argparse

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--out", required=True)
    ap.add_argument("--custom-iterator", action="store_true",
                    help="feed batches from a generator instead of a DataLoader")
    args = ap.parse_args()

    dist.init_process_group(backend="gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(384, 16, generator=g)
    y = (x @ torch.randn(16, 4, generator=g)).tanh()
    ds = TensorDataset(x, y)
    model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(),
                                torch.nn.Dropout(0.1), torch.nn.Linear(64, 4))
    model = DDP(model)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01)
    sampler = DistributedSampler(ds, num_replicas=world, rank=rank, shuffle=True, seed=0)
    loader = DataLoader(ds, batch_size=16, sampler=sampler)
    total = args.epochs * len(loader)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=total)

    def batches():  # a custom iterator: the same batches, not through a DataLoader
        for epoch in range(args.epochs):
            sampler.set_epoch(epoch)
            idx = list(iter(sampler))
            for i in range(0, len(idx), 16):
                j = torch.tensor(idx[i:i + 16])
                yield x[j], y[j]

    def step(xb: torch.Tensor, yb: torch.Tensor) -> None:
        opt.zero_grad()
        F.mse_loss(model(xb), yb).backward()
        opt.step()
        sched.step()

    if args.custom_iterator:
        for xb, yb in batches():
            step(xb, yb)
    else:
        for epoch in range(args.epochs):
            sampler.set_epoch(epoch)
            for xb, yb in loader:
                step(xb, yb)
    if rank == 0:
        torch.save({"model": model.module.state_dict(), "optimizer": opt.state_dict(),
                    "scheduler": sched.state_dict(), "steps": total}, args.out)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
