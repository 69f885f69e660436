"""Checkpoint-restart baseline worker (what a job under ``torchrun`` does): plain
data-parallel training of examples/mlp_train.py's model that, at every (re)start, loads
the newest checkpoint of its directory and recomputes from there.

    python bench/runtime_baseline_worker.py --rank R --world W --port P --steps N
        --ckpt-dir D --ckpt-every K [--kill RANK:STEP ...] [model args]

Rank 0 checkpoints every K committed steps (and at step 0) exactly as the runtime does
(a snapshot written on a background thread, atomically, with ``runtime.state``).
``--kill RANK:STEP``: that rank SIGKILLs itself in that step, after launching its
allreduce, once per job (a marker file in D remembers it across restarts). The restart
itself is the supervisor's job (``bench/runtime_bench.py``, like torchrun's agent).
"""

from __future__ import annotations

import argparse
import os
import signal
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
from bench.runtime_ddp_worker import flat_grads  # noqa: E402
from examples.mlp_train import add_model_args, build_model, make_data, make_optimizer  # noqa: E402
from runtime.data import ShardedSampler  # noqa: E402
from runtime.state import (  # noqa: E402
    CheckpointWriter,
    clone_state,
    latest_checkpoint,
    read_checkpoint,
    write_checkpoint,
)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rank", type=int, required=True)
    ap.add_argument("--world", type=int, required=True)
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--steps", type=int, required=True)
    ap.add_argument("--ckpt-dir", required=True)
    ap.add_argument("--ckpt-every", type=int, required=True)
    ap.add_argument("--kill", action="append", default=[])
    ap.add_argument("--threads", type=int, default=1)
    add_model_args(ap)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    ckdir = Path(a.ckpt_dir)
    kills = {int(s): int(r) for r, s in (k.split(":") for k in a.kill)}
    store = dist.TCPStore("127.0.0.1", a.port, is_master=False, timeout=timedelta(seconds=60))
    dist.init_process_group("gloo", store=store, rank=a.rank, world_size=a.world)
    x, y = make_data(a)
    model = build_model(a)
    flat = flat_grads(model)
    opt = make_optimizer(model, a)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=10, gamma=0.9)
    sampler = ShardedSampler(a.dataset, a.batch, seed=a.seed)
    step = 0
    latest = latest_checkpoint(ckdir)
    if latest is not None:
        state = read_checkpoint(latest[1])
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        sched.load_state_dict(state["scheduler"])
        sampler.load_state_dict(state["sampler"])
        step = int(state["step"])
    else:
        for p in model.parameters():
            dist.broadcast(p.data, 0)
    writer = CheckpointWriter(lambda snap, s: write_checkpoint(snap, ckdir, s),
                              lambda s, p: None) if a.rank == 0 else None

    def checkpoint() -> None:
        assert writer is not None
        writer.submit(clone_state({"model": model.state_dict(), "optimizer": opt.state_dict(),
                                   "scheduler": sched.state_dict(),
                                   "sampler": sampler.state_dict(), "step": step}), step)

    if writer is not None and latest is None:
        checkpoint()
    loss_fn = nn.MSELoss()
    while step < a.steps:
        flat.zero_()
        idx = sampler.next_batch(a.rank, a.world)
        loss_fn(model(x[idx]), y[idx]).backward()
        work = dist.all_reduce(flat, async_op=True)
        if kills.get(step) == a.rank:
            marker = ckdir / f"killed-{step}"
            if not marker.exists():
                marker.write_text(repr(time.time()))
                os.kill(os.getpid(), signal.SIGKILL)
        work.wait()
        flat.div_(a.world)
        opt.step()
        sched.step()
        step += 1
        if writer is not None and step % a.ckpt_every == 0:
            checkpoint()
    if writer is not None:
        writer.wait()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
