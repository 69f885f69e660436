"""One rank of replica group 0 writing its shard of a sharded (DCP) checkpoint, for
tests/runtime/test_sharded_checkpoint.py: the tiny GPT sharded with FSDP2 over a shard
mesh of ``--shards`` (this process is shard ``--shard``; no process group is needed to
write), ``--steps`` AdamW steps on fixed gradients, then its part of the checkpoint of
step ``--steps``. ``--out`` saves its local state (what the test compares with).
``--hang-in-write FILE``: after the data is written, before its metadata, touch FILE and
sleep (the test SIGKILLs it there)."""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]


def main() -> None:
    """Parse arguments, build the shard, step, write."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", required=True)
    ap.add_argument("--shard", type=int, required=True)
    ap.add_argument("--shards", type=int, default=2)
    ap.add_argument("--steps", type=int, required=True)
    ap.add_argument("--attempt", type=int, default=0)
    ap.add_argument("--out", default=None)
    ap.add_argument("--hang-in-write", default=None)
    a = ap.parse_args()
    os.environ["YOCO_SHARDS"] = str(a.shards)
    os.environ["YOCO_SHARD_INDEX"] = str(a.shard)
    sys.path.insert(0, str(ROOT / "examples"))
    import gpt_train  # type: ignore[import-not-found]
    from torch.distributed.fsdp import fully_shard

    from runtime.hsdp import shard_mesh, to_local_state
    from runtime.sharded_checkpoint import sharded_snapshot, write_sharded_checkpoint

    mp = argparse.ArgumentParser()
    gpt_train.add_model_args(mp)
    args = mp.parse_args(["--seq", "16", "--dim", "32", "--layers", "2", "--heads", "2",
                          "--text-chars", "2000", "--warmup-steps", "2"])
    _, vocab = gpt_train.make_data(args)
    model = gpt_train.build_model(args, vocab)
    mesh = shard_mesh()
    for blk in model.blocks:
        fully_shard(blk, mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = gpt_train.make_optimizer(model, args)
    sched = gpt_train.make_schedule(opt, args, 10)
    for s in range(a.steps):
        for i, p in enumerate(model.parameters()):
            p.grad = torch.full_like(p, 0.01 * (i + 1) * (s + 1))
        opt.step()
        sched.step()
    state = {"model": to_local_state(model.state_dict()),
             "optimizer": to_local_state(opt.state_dict()), "scheduler": sched.state_dict(),
             "sampler": {"epoch": 0, "position": 8 * a.steps}, "step": a.steps, "seed": 0}
    if a.out:
        torch.save(state, a.out)

    def hang() -> None:
        Path(a.hang_in_write).write_text("writing")
        time.sleep(600)

    final = write_sharded_checkpoint(
        sharded_snapshot(state, model, opt, a.shard), Path(a.dir), a.steps,
        attempt=a.attempt, shard=a.shard, shards=a.shards,
        torn=hang if a.hang_in_write else None)
    print(f"final {final}")


if __name__ == "__main__":
    main()
