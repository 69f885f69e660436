"""A plain torch.distributed training script (runs under ``torchrun``): DDP MLP with
dropout, a DataLoader over a DistributedSampler (shuffled), AdamW and a cosine schedule;
``--two-optimizers``: AdamW for the hidden layer and SGD with momentum (its own step
schedule) for the output layer, both stepped each iteration; ``--grad-scaler``: fp16
autocast with a ``torch.amp.GradScaler``. It imports nothing of yoco's: the transparent-mode tests run it unmodified."""

import argparse
import time

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
    ap.add_argument("--two-optimizers", action="store_true")
    ap.add_argument("--grad-scaler", action="store_true")
    ap.add_argument("--keep-grads", action="store_true",
                    help="zero_grad(set_to_none=False): the gradients are zeroed in place")
    ap.add_argument("--step-sleep", type=float, default=0.0,
                    help="seconds to sleep after each step (no effect on the numbers)")
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
    if args.two_optimizers:
        opt = torch.optim.AdamW(model.module[0].parameters(), lr=3e-3, weight_decay=0.01)
        head = torch.optim.SGD(model.module[3].parameters(), lr=0.05, momentum=0.9)
        opts = [opt, head]
    else:
        opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01)
        opts = [opt]
    # (A short growth interval: the scale grows until fp16 overflows, steps are skipped.)
    scaler = torch.amp.GradScaler("cpu", growth_interval=4, enabled=args.grad_scaler)
    sampler = DistributedSampler(ds, num_replicas=world, rank=rank, shuffle=True, seed=0)
    loader = DataLoader(ds, batch_size=16, sampler=sampler)
    total = args.epochs * len(loader)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=total)
    scheds = [sched]
    if args.two_optimizers:
        scheds.append(torch.optim.lr_scheduler.StepLR(head, step_size=10, gamma=0.5))

    def batches():  # a custom iterator: the same batches, not through a DataLoader
        for epoch in range(args.epochs):
            sampler.set_epoch(epoch)
            idx = list(iter(sampler))
            for i in range(0, len(idx), 16):
                j = torch.tensor(idx[i:i + 16])
                yield x[j], y[j]

    def step(xb: torch.Tensor, yb: torch.Tensor) -> None:
        for o in opts:
            o.zero_grad(set_to_none=not args.keep_grads)
        with torch.autocast("cpu", dtype=torch.float16, enabled=args.grad_scaler):
            loss = F.mse_loss(model(xb).float(), yb)
        scaler.scale(loss).backward()
        for o in opts:
            scaler.step(o)  # (o.step() when the scaler is disabled)
        scaler.update()
        for s in scheds:
            s.step()
        if args.step_sleep:
            time.sleep(args.step_sleep)

    if args.custom_iterator:
        for xb, yb in batches():
            step(xb, yb)
    else:
        for epoch in range(args.epochs):
            sampler.set_epoch(epoch)
            for xb, yb in loader:
                step(xb, yb)
    if rank == 0:
        torch.save({"model": model.module.state_dict(),
                    "optimizer": opt.state_dict() if len(opts) == 1
                    else [o.state_dict() for o in opts],
                    "scheduler": sched.state_dict() if len(scheds) == 1
                    else [s.state_dict() for s in scheds],
                    "scaler": scaler.state_dict(), "steps": total}, args.out)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
