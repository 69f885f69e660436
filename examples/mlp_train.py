"""A small MLP regression on synthetic data under the yoco migration runtime.

Deterministic: the data, the initial weights and the data order are functions of
``--seed``; dropout draws from the runtime's per-step RNG. Run it alone
(``python examples/mlp_train.py``) or under ``yoco run --workers 3 --spares 1 ...``.
With ``--out PATH`` rank 0 saves the final model and optimizer state there.
"""

from __future__ import annotations

import argparse
import time
import warnings

warnings.filterwarnings("ignore", message="Failed to initialize NumPy")

import torch  # noqa: E402
from torch import nn  # noqa: E402

from runtime import Job, JobConfig, ShardedSampler, local_device  # noqa: E402


def build(hidden: int, layers: int, dim: int) -> nn.Module:
    """Return the MLP (dim -> hidden x layers -> 1, ReLU and dropout)."""
    mods: list[nn.Module] = [nn.Linear(dim, hidden), nn.ReLU()]
    for _ in range(layers - 1):
        mods += [nn.Linear(hidden, hidden), nn.ReLU(), nn.Dropout(0.1)]
    mods.append(nn.Linear(hidden, 1))
    return nn.Sequential(*mods)


def main() -> None:
    """Parse arguments and train."""
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--layers", type=int, default=3)
    ap.add_argument("--dim", type=int, default=32)
    ap.add_argument("--batch", type=int, default=16, help="per-worker batch size")
    ap.add_argument("--dataset", type=int, default=4096)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--step-sleep", type=float, default=0.0,
                    help="extra seconds per step (to give tests time to act)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", default=None)
    ap.add_argument("--time-file", default=None,
                    help="rank 0 writes the mean step time after --warmup steps here")
    ap.add_argument("--warmup", type=int, default=5)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    device = local_device()

    gen = torch.Generator().manual_seed(args.seed)
    x = torch.randn(args.dataset, args.dim, generator=gen)
    w_true = torch.randn(args.dim, 1, generator=gen)
    y = torch.sin(x @ w_true) + 0.1 * torch.randn(args.dataset, 1, generator=gen)
    torch.manual_seed(args.seed)
    model = build(args.hidden, args.layers, args.dim).to(device)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=10, gamma=0.9)
    sampler = ShardedSampler(args.dataset, args.batch, seed=args.seed)
    job = Job(model=model, optimizer=opt, scheduler=sched, sampler=sampler,
              config=JobConfig(seed=args.seed))

    loss_fn = nn.MSELoss()
    t_warm = time.perf_counter()
    for step in job.steps(args.steps):
        if step == args.warmup:
            t_warm = time.perf_counter()
        idx = sampler.next_batch(job.rank, job.world_size)
        loss = loss_fn(model(x[idx].to(device)), y[idx].to(device))
        loss.backward()
        if args.step_sleep:
            time.sleep(args.step_sleep)

    if args.time_file and job.rank == 0:
        with open(args.time_file, "w") as fh:
            fh.write(str((time.perf_counter() - t_warm) / (args.steps - args.warmup)))
    if args.out and job.rank == 0:
        torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(),
                    "step": job.step}, args.out)


if __name__ == "__main__":
    main()
