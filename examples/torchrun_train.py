"""A plain ``torchrun`` DDP training script that reports into the yoco ledger.

Nothing of yoco's runtime: torch.distributed.elastic restarts the worker group on a
failure and the script resumes from its newest checkpoint, like any torchrun job. The only
yoco lines are the :class:`adapters.torchrun.TorchrunReporter` calls::

    YOCO_CONTRACT_ID=c1 YOCO_ADAPTER_DIR=/shared/runs/j1 YOCO_JOB_ID=j1 \\
    YOCO_SINK=yoco.sink:ledger_sink YOCO_SINK_ARGS='{"database_url": "postgresql+psycopg://..."}' \\
    torchrun --standalone --nproc-per-node=2 --max-restarts=2 \\
        examples/torchrun_train.py --steps 20 --ckpt-every 5
    python -m adapters.torchrun close        # after torchrun exits: closes what is open

Checkpoints (rank 0, every ``--ckpt-every`` steps, atomically) go to
``--ckpt-dir`` (default ``$YOCO_ADAPTER_DIR/ckpt``). Fault injection for tests and demos:
``YOCO_TORCHRUN_FAULTS="kill:rank=1:step=7:restart=0,raise:rank=0:step=resumed:restart=1"``
-- ``kill`` SIGKILLs the rank, ``raise`` raises RuntimeError, at the start of step
``step`` (after ``step`` steps are done) or right after ``resumed`` is recorded, in the
worker group whose ``TORCHELASTIC_RESTART_COUNT`` is ``restart``.
"""

from __future__ import annotations

import argparse
import os
import signal
import time
import warnings
from datetime import timedelta
from pathlib import Path

warnings.filterwarnings("ignore", message="Failed to initialize NumPy")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch import nn  # noqa: E402
from torch.nn.parallel import DistributedDataParallel  # noqa: E402

from adapters.torchrun import TorchrunReporter  # noqa: E402


def faults(rank: int, restart: int) -> dict[str, str]:
    """``{when: action}`` of the faults for this rank and restart count."""
    out: dict[str, str] = {}
    for spec in filter(None, os.environ.get("YOCO_TORCHRUN_FAULTS", "").split(",")):
        action, *fields = spec.strip().split(":")
        kv = dict(f.split("=", 1) for f in fields)
        if int(kv["rank"]) == rank and int(kv.get("restart", 0)) == restart:
            out[kv["step"]] = action
    return out


def fire(action: str | None) -> None:
    """Do the injected fault ``action`` (if any)."""
    if action == "kill":
        # A second into the step, so that every rank has surely noted the steps done
        # before (however loaded the machine): the steps lost are then exactly known.
        time.sleep(1.0)
        os.kill(os.getpid(), signal.SIGKILL)
    elif action == "raise":
        raise RuntimeError("injected fault")


def main() -> None:
    """Train a small regression with DDP on gloo under torchrun."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--ckpt-every", type=int, default=5)
    ap.add_argument("--ckpt-dir", type=Path, default=None)
    ap.add_argument("--step-sleep", type=float, default=0.0)
    a = ap.parse_args()
    torch.set_num_threads(1)
    rep = TorchrunReporter.from_env()
    rank, world = rep.rank, rep.world_size
    plan = faults(rank, rep.restart_count)
    ckpt_dir = a.ckpt_dir or Path(os.environ["YOCO_ADAPTER_DIR"]) / "ckpt"
    ckpt = ckpt_dir / "newest.pt"
    with rep:
        # Under torchrun the workers share the agent's store across restarts, so a restarted
        # group would read the previous group's gloo addresses and fail to connect (seen
        # here with torch 2.13; pytorch/pytorch#167288): one key prefix per restart.
        store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]),
                              is_master=False, timeout=timedelta(seconds=120))
        dist.init_process_group("gloo", store=dist.PrefixStore(
            f"restart{rep.restart_count}", store), rank=rank, world_size=world)
        torch.manual_seed(0)
        model = DistributedDataParallel(nn.Sequential(nn.Linear(8, 16), nn.ReLU(),
                                                      nn.Linear(16, 1)))
        opt = torch.optim.SGD(model.parameters(), lr=0.05)
        start = 0
        if ckpt.exists():
            state = torch.load(ckpt, weights_only=True)
            model.module.load_state_dict(state["model"])
            opt.load_state_dict(state["opt"])
            start = int(state["steps"])
        rep.resumed(start)
        fire(plan.get("resumed"))
        gen = torch.Generator().manual_seed(1)
        x, y = torch.randn(256, 8, generator=gen), torch.randn(256, 1, generator=gen)
        for step in range(start, a.steps):
            fire(plan.get(str(step)))
            idx = torch.arange(step * 8 * world + rank * 8, step * 8 * world + rank * 8 + 8)
            idx = idx % len(x)
            opt.zero_grad()
            nn.functional.mse_loss(model(x[idx]), y[idx]).backward()
            opt.step()
            rep.step_done(step + 1)
            if rank == 0 and a.ckpt_every and (step + 1) % a.ckpt_every == 0:
                ckpt_dir.mkdir(parents=True, exist_ok=True)
                tmp = ckpt.with_suffix(".tmp")
                torch.save({"model": model.module.state_dict(), "opt": opt.state_dict(),
                            "steps": step + 1}, tmp)
                with tmp.open("rb") as fh:
                    os.fsync(fh.fileno())
                tmp.replace(ckpt)
            if a.step_sleep:
                time.sleep(a.step_sleep)
        rep.finished(a.steps)
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
