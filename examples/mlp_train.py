"""A small MLP regression on synthetic data under the yoco migration runtime.

Deterministic: the data, the initial weights and the data order are functions of
``--seed``; dropout draws from the runtime's per-step RNG. Run it alone
(``python examples/mlp_train.py``) or under ``yoco run --workers 3 --spares 1 ...``.
With ``--out PATH`` rank 0 saves the final model and optimizer state there.

With ``--tables N`` the model is a recommender-style one instead: N embedding tables of
``--rows`` x ``--emb-dim`` (dense gradients), each bag mean-pooled, and the MLP on top.
Its state is large (parameters + Adam state = 12 bytes per parameter) while a step with a
small batch is short: the benchmarks use it for the ~200 MB recovery. With ``--sparse``
as well the tables get sparse gradients (only the rows a step looked up) and the optimizer
is Adagrad, as in recommender training: the state stays large (8 bytes per parameter)
while a step only reduces and updates the rows it touched.
The peers in ``bench/`` import :func:`add_model_args`, :func:`make_data`,
:func:`build_model` and :func:`make_optimizer`, so they train exactly this model.
"""

from __future__ import annotations

import argparse
import time
import warnings

warnings.filterwarnings("ignore", message="Failed to initialize NumPy")
warnings.filterwarnings("ignore", message="Sparse invariant checks")  # Adagrad, sparse

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


class EmbeddingModel(nn.Module):
    """``tables`` embedding bags (mean-pooled) concatenated into the MLP of :func:`build`."""

    def __init__(self, tables: int, rows: int, emb_dim: int, hidden: int, layers: int,
                 sparse: bool = False) -> None:
        super().__init__()
        self.tables = nn.ModuleList(nn.Embedding(rows, emb_dim, sparse=sparse)
                                    for _ in range(tables))
        self.mlp = build(hidden, layers, tables * emb_dim)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        pooled = [t(ids[:, i]).mean(1) for i, t in enumerate(self.tables)]
        return self.mlp(torch.cat(pooled, 1))


def add_model_args(ap: argparse.ArgumentParser) -> None:
    """The arguments that define the model, the data and the optimizer."""
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--layers", type=int, default=3)
    ap.add_argument("--dim", type=int, default=32)
    ap.add_argument("--batch", type=int, default=16, help="per-worker batch size")
    ap.add_argument("--dataset", type=int, default=4096)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--tables", type=int, default=0,
                    help="embedding tables (0: the plain MLP on --dim features)")
    ap.add_argument("--rows", type=int, default=16384, help="rows per embedding table")
    ap.add_argument("--emb-dim", type=int, default=128)
    ap.add_argument("--bag", type=int, default=16, help="ids per table per sample")
    ap.add_argument("--fused", action="store_true", help="fused Adam (CPU kernel)")
    ap.add_argument("--sparse", action="store_true",
                    help="with --tables: sparse embedding gradients and Adagrad")


def make_data(args: argparse.Namespace) -> tuple[torch.Tensor, torch.Tensor]:
    """Return (inputs, targets) of the synthetic dataset (a function of --seed)."""
    gen = torch.Generator().manual_seed(args.seed)
    if args.tables:
        ids = torch.randint(0, args.rows, (args.dataset, args.tables, args.bag), generator=gen)
        return ids, torch.randn(args.dataset, 1, generator=gen)
    x = torch.randn(args.dataset, args.dim, generator=gen)
    w_true = torch.randn(args.dim, 1, generator=gen)
    y = torch.sin(x @ w_true) + 0.1 * torch.randn(args.dataset, 1, generator=gen)
    return x, y


def build_model(args: argparse.Namespace) -> nn.Module:
    """Return the model with its seed-defined initial weights."""
    torch.manual_seed(args.seed)
    if args.tables:
        return EmbeddingModel(args.tables, args.rows, args.emb_dim, args.hidden, args.layers,
                              sparse=args.sparse)
    return build(args.hidden, args.layers, args.dim)


def make_optimizer(model: nn.Module, args: argparse.Namespace) -> torch.optim.Optimizer:
    """Adam, lr 1e-3 (fused with --fused); Adagrad, lr 1e-2, with --sparse."""
    if args.tables and args.sparse:
        return torch.optim.Adagrad(model.parameters(), lr=1e-2)
    return torch.optim.Adam(model.parameters(), lr=1e-3, **({"fused": True} if args.fused else {}))


def main() -> None:
    """Parse arguments and train."""
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--steps", type=int, default=40)
    add_model_args(ap)
    ap.add_argument("--step-sleep", type=float, default=0.0,
                    help="extra seconds per step (to give tests time to act)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", default=None)
    ap.add_argument("--out-all-ranks", action="store_true",
                    help="every rank saves its state, rank r > 0 to OUT.rankR")
    ap.add_argument("--time-file", default=None,
                    help="rank 0 writes the mean step time after --warmup steps here")
    ap.add_argument("--warmup", type=int, default=5)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    device = local_device()

    x, y = make_data(args)
    model = build_model(args).to(device)
    opt = make_optimizer(model, args)
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
    if args.out and (job.rank == 0 or args.out_all_ranks):
        path = args.out if job.rank == 0 else f"{args.out}.rank{job.rank}"
        torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(),
                    "step": job.step}, path)


if __name__ == "__main__":
    main()
