"""Borrowing a spare node: two real multi-node jobs share a pool (``yoco pool``, a real
process), each host a process group of its own on this machine. The high-priority job
loses a host with no spare node; it borrows a host of the low-priority job, which goes
on at reduced data-parallel width and widens again when the host comes back.

What "correct" means for the lender at reduced width: it stays an exact data-parallel
job of whatever width it has at each step -- every step committed once (none lost, none
twice), each step's update the average of the gradients of exactly the ranks of that
step's width over exactly the next global batch of the sampler's order, the state handed
to the returning rank exact. The test checks this bit for bit: the lender's final state
(on every rank) equals a one-process replay of data-parallel training with the width
schedule the lender reports (``status.json``), and that replay equals a real failure-free
run at constant width (so it models the runtime, not itself).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from runtime import ShardedSampler
from runtime.borrowing import CAUSE_LENT, PoolClient
from runtime.errors import ConfigError
from runtime.job import _step_seed
from runtime.nodes import free_rendezvous_port
from runtime.records import validate_record
from runtime.sink import JsonlFileSink
from runtime.state import split_state
from tests.runtime.conftest import Reference
from tests.runtime.test_nodes import NODE_TIMEOUT, _suppress

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = str(ROOT / "examples" / "mlp_train.py")
HI_STEPS = 16
# The lender outlives the loan with room to spare: it starts first (the borrower only once
# it trains), the loan comes while the borrower's hosts start up (10 s, lender step 26, on
# a loaded machine), and the width must come back before its end (a clean-clone run at 40
# steps ended still narrow).
LO_STEPS = 72

pytestmark = pytest.mark.slow


class MultiNodeJob:
    """``yoco run`` of job NAME on HOSTS "hosts" (NAME0, NAME1, ...), sharing the pool."""

    def __init__(self, tmp: Path, name: str, *, hosts: int, priority: int, pool: str,
                 steps: int, sleep: float) -> None:
        self.tmp, self.name, self.hosts = tmp, name, hosts
        self.sink = tmp / f"{name}.jsonl"
        self.out = tmp / f"{name}.pt"
        self.run_dir = tmp / "runs" / name
        port = free_rendezvous_port()
        self.args = ["--nnodes", str(hosts), "--nproc-per-node", "1",
                     "--rdzv-endpoint", f"127.0.0.1:{port}", "--job-id", name,
                     "--runs-root", str(tmp / "runs"), "--sink", f"jsonl:{self.sink}",
                     "--no-nvml", "--progress-every", "0.2", "--pool", pool,
                     "--priority", str(priority),
                     # Hosts are lost here by SIGKILL (seen at once on this machine), never
                     # by silence: a heartbeat timeout a loaded machine cannot fake.
                     "--node-timeout", str(NODE_TIMEOUT)]
        self.script_args = [EXAMPLE, "--steps", str(steps), "--step-sleep", str(sleep),
                            "--out", str(self.out), "--out-all-ranks"]
        self.procs: dict[int, subprocess.Popen[bytes]] = {}

    def start(self) -> None:
        """Start every host's ``yoco run``, each in a process group of its own."""
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        for k in range(self.hosts):
            log = (self.tmp / f"{self.name}{k}.log").open("ab")
            self.procs[k] = subprocess.Popen(
                [sys.executable, "-m", "yoco.cli_runtime", "run", *self.args,
                 "--node-rank", str(k), "--node-name", f"{self.name}{k}", *self.script_args],
                env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)

    def records(self) -> list[dict[str, Any]]:
        """What the job's sink has received."""
        return JsonlFileSink(self.sink).read_all() if self.sink.exists() else []

    def progress_at(self, step: int, logs: Callable[[], str]) -> None:
        """Wait until the job has reported step ``step`` (its outbox)."""
        outbox = self.run_dir / "outbox" / "records.jsonl"
        deadline = time.time() + 180
        while time.time() < deadline:
            if outbox.exists() and any(json.loads(ln).get("step", -1) >= step
                                       for ln in outbox.read_text().splitlines()
                                       if '"job_progress"' in ln):
                return
            time.sleep(0.05)
        pytest.fail(f"{self.name} never reached step {step}; logs:\n{logs()}")

    def wait(self, k: int, logs: Callable[[], str], timeout: float = 240) -> int:
        """Host k's exit status."""
        try:
            return self.procs[k].wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            pytest.fail(f"{self.name}{k} did not end; logs:\n{logs()}")

    def close(self) -> None:
        """Kill whatever is left."""
        for p in self.procs.values():
            if p.poll() is None:
                with _suppress():
                    os.killpg(p.pid, signal.SIGKILL)
                p.wait()


def _logs(tmp: Path) -> str:
    return "\n".join(f"--- {p.name}\n{p.read_text()[-4000:]}" for p in sorted(tmp.glob("*.log")))


def _tensors(state: dict[str, Any]) -> list[torch.Tensor]:
    return split_state({"m": state["model"], "o": state["optimizer"]})[1]


def _equal(a: dict[str, Any], b: dict[str, Any]) -> bool:
    ta, tb = _tensors(a), _tensors(b)
    return len(ta) == len(tb) and all(torch.equal(x, y) for x, y in zip(ta, tb, strict=True))


def replay(steps: int, width: Callable[[int], int]) -> dict[str, Any]:
    """Data-parallel training of examples/mlp_train.py in one process: at step ``s``,
    ``width(s)`` ranks each draw rank r's slice of the next global batch with rank r's
    per-step RNG, and the update uses the average of their gradients (summed in rank
    order, then divided by the width: what the runtime's allreduce and ``div_`` do)."""
    sys.path.insert(0, str(ROOT / "examples"))
    try:
        from mlp_train import add_model_args, build_model, make_data, make_optimizer
    finally:
        sys.path.pop(0)
    ap = argparse.ArgumentParser()
    add_model_args(ap)
    args = ap.parse_args([])
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as the script
    try:
        x, y = make_data(args)
        model = build_model(args)
        opt = make_optimizer(model, args)
        sched = torch.optim.lr_scheduler.StepLR(opt, step_size=10, gamma=0.9)
        sampler = ShardedSampler(args.dataset, args.batch, seed=args.seed)
        params = list(model.parameters())
        for s in range(steps):
            w = width(s)
            snap = sampler.state_dict()
            total: list[torch.Tensor] = []
            for r in range(w):
                sampler.load_state_dict(snap)
                seed = _step_seed(args.seed, s, r)
                torch.manual_seed(seed)
                random.seed(seed)
                for p in params:
                    p.grad = None
                idx = sampler.next_batch(r, w)
                nn.MSELoss()(model(x[idx]), y[idx]).backward()
                grads = [p.grad.detach().clone() for p in params if p.grad is not None]
                total = grads if not total else [a + g for a, g in zip(total, grads, strict=True)]
            for p, t in zip(params, total, strict=True):
                p.grad = t.div_(w)
            opt.step()
            sched.step()
        return {"model": model.state_dict(), "optimizer": opt.state_dict(), "step": steps}
    finally:
        torch.set_num_threads(threads)


@pytest.fixture
def pool_server(tmp_path: Path) -> Any:
    port = free_rendezvous_port()
    log = (tmp_path / "pool.log").open("ab")
    proc = subprocess.Popen([sys.executable, "-m", "yoco.cli_runtime", "pool", "--port",
                             str(port)], env={**os.environ, "PYTHONPATH": str(ROOT)},
                            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    endpoint = f"127.0.0.1:{port}"
    deadline = time.time() + 60
    while True:
        try:
            PoolClient(endpoint, timeout_s=2)
            break
        except ConfigError:
            if time.time() > deadline or proc.poll() is not None:
                pytest.fail(f"the pool did not start: {(tmp_path / 'pool.log').read_text()}")
            time.sleep(0.2)
    yield endpoint
    proc.kill()
    proc.wait()


def test_a_high_priority_job_borrows_a_host_and_the_lender_goes_on_narrower(
        tmp_path: Path, pool_server: str, failure_free: Reference) -> None:
    ref = failure_free(EXAMPLE, ["--steps", str(HI_STEPS)], workers=2)
    lo = MultiNodeJob(tmp_path, "lo", hosts=2, priority=1, pool=pool_server,
                      steps=LO_STEPS, sleep=0.4)
    hi = MultiNodeJob(tmp_path, "hi", hosts=2, priority=10, pool=pool_server,
                      steps=HI_STEPS, sleep=0.2)
    logs = lambda: _logs(tmp_path)  # noqa: E731
    try:
        # The lender trains before the borrower starts: waiting for lo after starting hi,
        # a loaded machine once let hi run to its last step (16 at 0.2 s) before the kill
        # below, which then lost nothing to recover and borrowed nothing.
        lo.start()
        lo.progress_at(1, logs)
        hi.start()
        hi.progress_at(4, logs)
        os.killpg(hi.procs[1].pid, signal.SIGKILL)  # hi1 loses power; hi has no spare
        assert hi.wait(0, logs) == 0, logs()
        assert lo.wait(0, logs) == 0, logs()
        assert lo.wait(1, logs, timeout=60) == 0, logs()  # lo1's agent came home, ended
    finally:
        hi.close()
        lo.close()

    # The borrower: one incident naming the lost host and the borrowed one, live,
    # final weights bit-identical to a failure-free run.
    his = hi.records()
    fails = [r for r in his if r["kind"] == "failure"]
    outs = [r for r in his if r["kind"] == "outcome"]
    assert len(fails) == 1 and len(outs) == 1, his
    assert (fails[0]["node"], fails[0]["failure_class"], fails[0]["cause"]) == \
        ("hi1", "unplanned", "node_lost")
    assert "lo1 borrowed from job lo (priority 1)" in fails[0]["detail"]
    assert outs[0]["failure_event_id"] == fails[0]["event_id"]
    assert (outs[0]["outcome"], outs[0]["lost_steps"]) == ("live_migrated", 0)
    assert his[-1]["kind"] == "job_finished" and his[-1]["step"] == HI_STEPS
    reference = torch.load(ref)
    assert _equal(torch.load(hi.out), reference)

    # The lender: one planned failure naming the lent host (the shrink) and its outcome
    # (the width back): live, nothing lost, the GPUs lent for the time they were away.
    los = lo.records()
    fails = [r for r in los if r["kind"] == "failure"]
    outs = [r for r in los if r["kind"] == "outcome"]
    assert len(fails) == 1 and len(outs) == 1, los
    assert (fails[0]["node"], fails[0]["failure_class"], fails[0]["cause"]) == \
        ("lo1", "planned", CAUSE_LENT)
    assert "lent to job hi (priority 10 > 1): data-parallel width 2 -> 1" in fails[0]["detail"]
    assert outs[0]["failure_event_id"] == fails[0]["event_id"]
    assert (outs[0]["outcome"], outs[0]["lost_steps"], outs[0]["gpus_affected"]) == \
        ("live_migrated", 0, 1)
    assert outs[0]["recovery_seconds"] > 0
    assert los.index(outs[0]) < len(los) - 1 and los[-1]["kind"] == "job_finished"
    assert los[-1]["step"] == LO_STEPS
    for rec in his + los:  # every record passes the ledger's own rules
        validate_record(rec)

    # Its width over time: 2, 1 while lo1 was away, 2 again -- all before the end.
    widths = json.loads((lo.run_dir / "status.json").read_text())["widths"]
    assert [w["width"] for w in widths] == [2, 1, 2], widths
    shrink, grow = widths[1]["from_step"], widths[2]["from_step"]
    assert 0 < shrink < grow < LO_STEPS, widths

    # Correct at every width: both ranks hold the same final state, and it is bit for bit
    # the replay of data-parallel training with that schedule...
    lo_final = torch.load(lo.out)
    assert lo_final["step"] == LO_STEPS
    assert _equal(lo_final, torch.load(f"{lo.out}.rank1"))
    assert _equal(lo_final, replay(LO_STEPS, lambda s: 1 if shrink <= s < grow else 2))
    # ... a replay that is the runtime's own training at constant width (the reference).
    assert _equal(reference, replay(HI_STEPS, lambda s: 2))

    # The pool: lo1 is home again, and both jobs are over.
    pool = PoolClient(pool_server)
    got = pool.get("lo1")
    assert got is not None and got[1].state == "home" and got[1].borrower is None
    assert got[1].home_ended
