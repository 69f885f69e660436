"""One TorchFT replica group (one process) training a small regression, reporting into
the yoco ledger through :class:`adapters.torchft.TorchFTReporter`.

TorchFT (0.2.0) does the fault tolerance: a ``Manager`` per replica group, a lighthouse
for the quorum, gloo, and healing of a restarted group from a live peer. The only yoco
lines are the reporter's. Run a lighthouse (``torchft_lighthouse --min_replicas 1 ...``
or ``torchft.coordination.LighthouseServer``), then one process per replica group::

    YOCO_CONTRACT_ID=c1 YOCO_JOB_ID=j1 YOCO_ADAPTER_DIR=/shared/runs/j1 \\
    YOCO_SINK=yoco.sink:ledger_sink YOCO_SINK_ARGS='{"database_url": "..."}' \\
    python examples/torchft_train.py --replica 0 --replicas 2 --lighthouse ADDR --steps 30

and restart a group that dies (what torchx or Slurm do); after every group has exited,
``python -m adapters.torchft close``. ``--kill-step T`` SIGKILLs the process in its first
step with at least T steps committed, after its allreduce is launched (it prints the
steps first). The job ends once ``--steps`` are
committed *and* every replica group is back in the quorum (``--end-at-full-width``, the
default), so that a restarted group has rejoined before the others stop.
"""

from __future__ import annotations

import argparse
import os
import signal
import time
import warnings
from datetime import timedelta

warnings.filterwarnings("ignore")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch import nn  # noqa: E402

from adapters.torchft import TorchFTReporter  # noqa: E402


def main() -> None:
    """Train one replica group under TorchFT's Manager."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--replica", type=int, required=True)
    ap.add_argument("--replicas", type=int, default=2)
    ap.add_argument("--lighthouse", required=True)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--kill-step", type=int, default=-1)
    ap.add_argument("--step-sleep", type=float, default=0.05)
    ap.add_argument("--max-steps", type=int, default=100_000,
                    help="stop here even if a group never came back")
    ap.add_argument("--no-end-at-full-width", dest="full_width", action="store_false")
    a = ap.parse_args()
    torch.set_num_threads(1)
    from torchft import Manager, ProcessGroupGloo

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    gen = torch.Generator().manual_seed(1)
    x, y = torch.randn(256, 8, generator=gen), torch.randn(256, 1, generator=gen)

    def state_dict() -> dict:
        return {"model": model.state_dict(), "opt": opt.state_dict()}

    def load_state_dict(sd: dict) -> None:
        model.load_state_dict(sd["model"])
        opt.load_state_dict(sd["opt"])

    rep = TorchFTReporter.from_env(replica_group=str(a.replica), replica_groups=a.replicas)
    with rep:
        store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
        manager = Manager(pg=ProcessGroupGloo(timeout=timedelta(seconds=10)),
                          min_replica_size=1, load_state_dict=load_state_dict,
                          state_dict=state_dict, replica_id=f"replica{a.replica}", rank=0,
                          world_size=1, store_addr="127.0.0.1", store_port=store.port,
                          lighthouse_addr=a.lighthouse, init_sync=False,
                          timeout=timedelta(seconds=10))
        loss_fn = nn.MSELoss()
        while True:
            step = manager.current_step()
            whole = manager.num_participants() >= a.replicas or not a.full_width
            if (step >= a.steps and whole) or step >= a.max_steps:
                break
            manager.start_quorum()
            opt.zero_grad()
            idx = (torch.arange(8) + 8 * (2 * step + a.replica)) % len(x)
            loss_fn(model(x[idx]), y[idx]).backward()
            works = [manager.allreduce(p.grad) for p in model.parameters()
                     if p.grad is not None]
            if 0 <= a.kill_step <= manager.current_step():
                print(f"killing myself with {manager.current_step()} steps committed",
                      flush=True)
                os.kill(os.getpid(), signal.SIGKILL)
            for w in works:
                w.wait()
            if manager.should_commit():
                opt.step()
                rep.committed(manager.current_step(), manager.num_participants())
            time.sleep(a.step_sleep)
        rep.finished(manager.current_step())
        manager.shutdown(wait=False)


if __name__ == "__main__":
    main()
