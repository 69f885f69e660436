"""A plain torch.distributed training script (runs under ``torchrun``): a small GPT
(causal self-attention blocks) under DDP, a DataLoader over a DistributedSampler of
fixed-length token windows, AdamW with weight decay on the matrices, linear warm-up then
cosine, gradient clipping. It imports nothing of yoco's. ``--timing PATH``: rank 0 writes
the seconds of each step (as a script's own throughput log would)."""

import argparse
import json
import math
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


class Block(nn.Module):
    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.attn = nn.MultiheadAttention(d, heads, dropout=0.1, batch_first=True)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d),
                                 nn.Dropout(0.1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n = x.shape[1]
        mask = torch.triu(torch.ones(n, n, dtype=torch.bool), 1)
        h = self.ln1(x)
        x = x + self.attn(h, h, h, attn_mask=mask, need_weights=False)[0]
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self, vocab: int, d: int, layers: int, heads: int, ctx: int) -> None:
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, d), nn.Embedding(ctx, d)
        self.blocks = nn.ModuleList(Block(d, heads) for _ in range(layers))
        self.ln, self.head = nn.LayerNorm(d), nn.Linear(d, vocab, bias=False)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1]))
        for b in self.blocks:
            x = b(x)
        return self.head(self.ln(x))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--samples", type=int, default=256)
    ap.add_argument("--dim", type=int, default=64)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--out", required=True)
    ap.add_argument("--timing", default=None)
    args = ap.parse_args()

    dist.init_process_group(backend="gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    ctx, vocab = 32, 128
    g = torch.Generator().manual_seed(1)
    text = torch.randint(0, vocab, (args.samples * ctx + 1,), generator=g)
    windows = text[:-1].view(args.samples, ctx)
    targets = text[1:].view(args.samples, ctx)
    ds = TensorDataset(windows, targets)
    model = DDP(GPT(vocab, args.dim, args.layers, 4, ctx))
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    other = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                             {"params": other, "weight_decay": 0.0}], lr=1e-3)
    sampler = DistributedSampler(ds, shuffle=True, seed=0)
    loader = DataLoader(ds, batch_size=8, sampler=sampler, drop_last=True)
    total, warm = args.epochs * len(loader), 4
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: (s + 1) / warm if s < warm
        else 0.5 * (1 + math.cos(math.pi * (s - warm) / max(1, total - warm))))
    times = []
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        for x, y in loader:
            t0 = time.perf_counter()
            opt.zero_grad(set_to_none=True)
            loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten())
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            sched.step()
            times.append(time.perf_counter() - t0)
    if rank == 0:
        torch.save({"model": model.module.state_dict(), "optimizer": opt.state_dict(),
                    "scheduler": {k: v for k, v in sched.state_dict().items()
                                  if k != "lr_lambdas"}, "steps": total}, args.out)
        if args.timing:
            with open(args.timing, "w") as f:
                json.dump({"world": world, "step_seconds": times}, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
