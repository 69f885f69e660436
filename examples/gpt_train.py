"""A small GPT (decoder-only transformer) trained the way LLM trainers write it, under the
yoco migration runtime.

What it has, because the jobs the guarantee is sold for have it: AdamW with weight decay
on the matrices only, a linear warm-up then cosine learning-rate schedule, gradient
accumulation over micro-batches, clipping of the global gradient norm *after* the
gradients are averaged over the replicas (``job.reduce_gradients()`` then
``clip_grad_norm_``), optional bf16 autocast (``--bf16``) and ``torch.compile``
(``--compile``). The text is generated (a small grammar, a function of ``--seed``) and
tokenised by character, so nothing is downloaded.

Run it alone (``python examples/gpt_train.py``) or under the runtime
(``yoco run --workers 2 --spares 1 examples/gpt_train.py --steps 100``). Deterministic:
data, initial weights, data order and dropout are functions of ``--seed`` (dropout draws
from the runtime's per-step RNG), so a run with failures ends bit-identical to one
without. ``--out PATH``: rank 0 saves the final model and optimizer state there.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import time
import warnings

warnings.filterwarnings("ignore", message="Failed to initialize NumPy")

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402

from runtime import Job, JobConfig, ShardedSampler, local_device  # noqa: E402

_WORDS = {
    "det": ["the", "a", "every", "no"],
    "adj": ["quick", "lazy", "red", "silent", "old", "bright"],
    "noun": ["fox", "dog", "model", "node", "spare", "ledger", "shard"],
    "verb": ["jumps over", "watches", "replaces", "audits", "follows"],
}


def generate_text(chars: int, seed: int) -> str:
    """Sentences of a tiny grammar (det adj noun verb det noun.), ``chars`` long."""
    gen = torch.Generator().manual_seed(seed)

    def pick(kind: str) -> str:
        words = _WORDS[kind]
        return words[int(torch.randint(len(words), (1,), generator=gen))]

    parts: list[str] = []
    size = 0
    while size < chars:
        s = (f"{pick('det')} {pick('adj')} {pick('noun')} {pick('verb')} "
             f"{pick('det')} {pick('noun')}. ")
        parts.append(s)
        size += len(s)
    return "".join(parts)[:chars]


class Block(nn.Module):
    """Pre-norm transformer block: causal self-attention, then a GELU MLP."""

    def __init__(self, dim: int, heads: int, dropout: float) -> None:
        super().__init__()
        self.heads = heads
        self.dropout = dropout
        self.ln1 = nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.ln2 = nn.LayerNorm(dim)
        self.fc = nn.Linear(dim, 4 * dim)
        self.out = nn.Linear(4 * dim, dim)
        self.drop = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=2)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        att = F.scaled_dot_product_attention(q, k, v, is_causal=True,
                                             dropout_p=self.dropout if self.training else 0.0)
        x = x + self.drop(self.proj(att.transpose(1, 2).reshape(b, t, d)))
        return x + self.drop(self.out(F.gelu(self.fc(self.ln2(x)))))


class GPT(nn.Module):
    """Token and position embeddings, ``layers`` blocks, a final norm, a tied head."""

    def __init__(self, vocab: int, seq: int, dim: int, layers: int, heads: int,
                 dropout: float = 0.0) -> None:
        super().__init__()
        self.wte = nn.Embedding(vocab, dim)
        self.wpe = nn.Embedding(seq, dim)
        self.blocks = nn.ModuleList(Block(dim, heads, dropout) for _ in range(layers))
        self.ln_f = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab, bias=False)
        self.head.weight = self.wte.weight  # tied, as in GPT-2
        for name, p in self.named_parameters():
            if p.dim() >= 2:
                nn.init.normal_(p, 0.0, 0.02 / math.sqrt(2 * layers) if
                                name.endswith(("proj.weight", "out.weight")) else 0.02)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(idx.shape[1], device=idx.device)
        x = self.wte(idx) + self.wpe(pos)
        for blk in self.blocks:
            x = blk(x)
        return self.head(self.ln_f(x))


def add_model_args(ap: argparse.ArgumentParser) -> None:
    """The arguments that define the model, the data and the optimizer."""
    ap.add_argument("--seq", type=int, default=64, help="context length (tokens)")
    ap.add_argument("--dim", type=int, default=64)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--dropout", type=float, default=0.0)
    ap.add_argument("--micro-batch", type=int, default=8, help="sequences per micro-batch")
    ap.add_argument("--accum", type=int, default=2, help="micro-batches per step")
    ap.add_argument("--text-chars", type=int, default=200_000)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--min-lr-ratio", type=float, default=0.1)
    ap.add_argument("--warmup-steps", type=int, default=10)
    ap.add_argument("--weight-decay", type=float, default=0.1)
    ap.add_argument("--clip", type=float, default=1.0, help="max global gradient norm")
    ap.add_argument("--seed", type=int, default=0)


def make_data(args: argparse.Namespace) -> tuple[torch.Tensor, int]:
    """Return (the token ids of the generated text, the vocabulary size)."""
    text = generate_text(args.text_chars, args.seed)
    vocab = sorted(set(text))
    lookup = {c: i for i, c in enumerate(vocab)}
    return torch.tensor([lookup[c] for c in text], dtype=torch.long), len(vocab)


def build_model(args: argparse.Namespace, vocab: int) -> GPT:
    """Return the model with its seed-defined initial weights."""
    torch.manual_seed(args.seed)
    return GPT(vocab, args.seq, args.dim, args.layers, args.heads, args.dropout)


def make_optimizer(model: nn.Module, args: argparse.Namespace) -> torch.optim.Optimizer:
    """AdamW; weight decay on matrices (and the tied embedding), none on biases/norms."""
    decay = [p for p in model.parameters() if p.dim() >= 2]
    rest = [p for p in model.parameters() if p.dim() < 2]
    return torch.optim.AdamW([{"params": decay, "weight_decay": args.weight_decay},
                              {"params": rest, "weight_decay": 0.0}],
                             lr=args.lr, betas=(0.9, 0.95))


def make_schedule(opt: torch.optim.Optimizer, args: argparse.Namespace,
                  total: int) -> torch.optim.lr_scheduler.LambdaLR:
    """Linear warm-up over ``--warmup-steps``, then cosine decay to ``--min-lr-ratio``."""
    warm, floor = args.warmup_steps, args.min_lr_ratio

    def factor(step: int) -> float:
        if step < warm:
            return (step + 1) / warm
        progress = min((step - warm) / max(total - warm, 1), 1.0)
        return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress))

    return torch.optim.lr_scheduler.LambdaLR(opt, factor)


def main() -> None:
    """Parse arguments and train."""
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=60)
    add_model_args(ap)
    ap.add_argument("--bf16", action="store_true", help="bf16 autocast for the forward pass")
    ap.add_argument("--compile", action="store_true", help="torch.compile the model")
    ap.add_argument("--fsdp", action="store_true",
                    help="shard the model with FSDP2 (fully_shard per block and the root) "
                         "over the runtime's shard mesh: HSDP under yoco run --shards S")
    ap.add_argument("--deterministic", action="store_true",
                    help="torch.use_deterministic_algorithms(True): on CUDA the kernels "
                         "that use atomics (attention backward) are not bit-reproducible "
                         "otherwise; set CUBLAS_WORKSPACE_CONFIG=:4096:8 too")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--log-every", type=int, default=10)
    ap.add_argument("--step-sleep", type=float, default=0.0,
                    help="extra seconds per step (to give tests time to act)")
    ap.add_argument("--out", default=None)
    ap.add_argument("--out-all-ranks", action="store_true",
                    help="every rank saves its state, rank r > 0 to OUT.rankR")
    ap.add_argument("--time-file", default=None,
                    help="rank 0 writes the mean step time after --warmup-timing steps here")
    ap.add_argument("--warmup-timing", type=int, default=5)
    args = ap.parse_args()
    if args.accum < 1 or args.micro_batch < 1 or args.steps < 0:
        ap.error("--accum, --micro-batch must be >= 1 and --steps >= 0")
    if args.dim % args.heads:
        ap.error("--dim must be a multiple of --heads")
    torch.set_num_threads(args.threads)
    if args.deterministic:
        torch.use_deterministic_algorithms(True)
    device = local_device()

    tokens, vocab = make_data(args)
    model = build_model(args, vocab).to(device)
    mesh = None
    if args.fsdp:
        from torch.distributed.fsdp import fully_shard

        from runtime.hsdp import shard_mesh

        mesh = shard_mesh()  # this replica group's ranks; the runtime regroups it
        for blk in model.blocks:
            fully_shard(blk, mesh=mesh)
        fully_shard(model, mesh=mesh)
    opt = make_optimizer(model, args)
    sched = make_schedule(opt, args, args.steps)
    starts = len(tokens) - args.seq - 1
    sampler = ShardedSampler(starts, args.micro_batch, seed=args.seed)
    net: nn.Module = torch.compile(model) if args.compile else model

    def micro_batch_loss(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        with job.autocast() if args.bf16 else contextlib.nullcontext():
            logits = net(x)
        return F.cross_entropy(logits.float().reshape(-1, vocab), y.reshape(-1))

    def warmup() -> None:
        # What the runtime runs in a spare before it is called in (and then discards):
        # one micro-batch of made-up tokens of the real shape, forward and backward.
        x = torch.zeros(args.micro_batch, args.seq, dtype=torch.long, device=device)
        micro_batch_loss(x, x).backward()

    job = Job(model=net, optimizer=opt, scheduler=sched, sampler=sampler,
              config=JobConfig(seed=args.seed), mesh=mesh, warmup=warmup)
    offsets = torch.arange(args.seq + 1)

    t_warm = time.perf_counter()
    for step in job.steps(args.steps):
        if step == args.warmup_timing:
            t_warm = time.perf_counter()
        total_loss = 0.0
        for _ in range(args.accum):  # gradient accumulation: backward passes add up
            if job.step_abandoned:  # a peer is gone: the step runs again, stop computing
                break
            idx = sampler.next_batch(job.rank, job.world_size)
            window = tokens[idx.unsqueeze(1) + offsets].to(device)
            x, y = window[:, :-1], window[:, 1:]
            loss = micro_batch_loss(x, y)
            (loss / args.accum).backward()
            total_loss += loss.item() / args.accum
        if not job.reduce_gradients():  # averaged over the replicas, before clipping
            continue  # the membership changed: this step runs again in the new group
        norm = job.clip_grad_norm_(args.clip)  # the global norm (over every shard too)
        if args.step_sleep:
            time.sleep(args.step_sleep)
        if job.rank == 0 and args.log_every and step % args.log_every == 0:
            print(f"step {step} loss {total_loss:.4f} grad-norm {float(norm):.4f} "
                  f"lr {sched.get_last_lr()[0]:.2e}", flush=True)

    if args.time_file and job.rank == 0:
        with open(args.time_file, "w") as fh:
            fh.write(str((time.perf_counter() - t_warm) / max(args.steps - args.warmup_timing,
                                                              1)))
    if args.out and (job.rank == 0 or args.out_all_ranks):
        path = args.out if job.rank == 0 else f"{args.out}.rank{job.rank}"
        state = job.state_dict()  # with --fsdp: this rank's shards, as plain tensors
        torch.save({"model": state["model"], "optimizer": state["optimizer"],
                    "step": job.step}, path)


if __name__ == "__main__":
    main()
