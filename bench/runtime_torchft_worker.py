"""TorchFT (0.2.0) peer of examples/mlp_train.py: one replica group of one process, its
``Manager`` and a manual flat-buffer allreduce (``manager.allreduce``), the same model,
data, Adam and StepLR. (TorchFT's DDP wrapper crashed the survivor when a peer was killed.)

    python bench/runtime_torchft_worker.py --replica I --lighthouse ADDR --steps N
        --log FILE [--kill-step T] [model args of examples/mlp_train.py]

Appends ``step time participants`` to FILE after every committed step. With
``--kill-step T`` it SIGKILLs itself in step T after launching its allreduce (writing the
time to FILE.killed first). A restarted replica heals from a peer (TorchFT's HTTP
checkpoint transport) through the ``state_dict`` functions below.
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


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--replica", type=int, required=True)
    ap.add_argument("--lighthouse", required=True)
    ap.add_argument("--steps", type=int, required=True)
    ap.add_argument("--log", required=True)
    ap.add_argument("--kill-step", type=int, default=-1)
    ap.add_argument("--threads", type=int, default=1)
    add_model_args(ap)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    from torchft import Manager, ProcessGroupGloo

    x, y = make_data(a)
    model = build_model(a)
    flat = flat_grads(model)
    opt = make_optimizer(model, a)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=10, gamma=0.9)
    sampler = ShardedSampler(a.dataset, a.batch, seed=a.seed)

    def state_dict() -> dict:
        return {"model": model.state_dict(), "optim": opt.state_dict(),
                "sched": sched.state_dict(), "sampler": sampler.state_dict()}

    def load_state_dict(sd: dict) -> None:
        model.load_state_dict(sd["model"])
        opt.load_state_dict(sd["optim"])
        sched.load_state_dict(sd["sched"])
        sampler.load_state_dict(sd["sampler"])

    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    manager = Manager(pg=ProcessGroupGloo(timeout=timedelta(seconds=10)), min_replica_size=1,
                      load_state_dict=load_state_dict, state_dict=state_dict,
                      replica_id=f"replica{a.replica}", rank=0, world_size=1,
                      store_addr="127.0.0.1", store_port=store.port,
                      lighthouse_addr=a.lighthouse, init_sync=False,
                      timeout=timedelta(seconds=10))
    loss_fn = nn.MSELoss()
    log = open(a.log, "a", buffering=1)  # noqa: SIM115
    while manager.current_step() < a.steps:
        manager.start_quorum()
        flat.zero_()
        idx = sampler.next_batch(a.replica % 2, 2)
        loss_fn(model(x[idx]), y[idx]).backward()
        work = manager.allreduce(flat)
        if manager.current_step() == a.kill_step:
            Path(a.log + ".killed").write_text(repr(time.time()))
            os.kill(os.getpid(), signal.SIGKILL)
        work.wait()
        if manager.should_commit():
            opt.step()
            sched.step()
            log.write(f"{manager.current_step()} {time.time()!r} {manager.num_participants()}\n")
    manager.shutdown(wait=False)


if __name__ == "__main__":
    main()
