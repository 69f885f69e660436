"""Several node agents on one machine, each a "host" with its own name and process group
(``setsid``): whole-node loss (SIGKILL of the group), a frozen node (SIGSTOP of the
group), a spare node lost before it is called in, and the coordinator lost. Real
processes, real signals, the real ``yoco run`` command line on every host."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from runtime.nodes import free_rendezvous_port
from runtime.sink import JsonlFileSink
from runtime.state import split_state
from tests.runtime.conftest import Reference

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = str(ROOT / "examples" / "mlp_train.py")
STEPS = 24
# Every host of these tests runs on this machine, where a lost host is seen at once
# (its agent's PF_EXITING) and a frozen one by /proc (its processes stopped): no test
# here relies on the heartbeat timeout, which a loaded 2-core machine (9+ processes
# importing torch at once) can exceed with a healthy host whose beat thread waits for a
# CPU. Silence alone is tested on its own: test_a_remote_node_silent_for_the_timeout_*.
NODE_TIMEOUT = 30.0

pytestmark = pytest.mark.slow


class Cluster:
    """``yoco run`` on NODES "hosts" (hostK), each in a process group of its own."""

    def __init__(self, tmp: Path, *, nnodes: str, nproc: int, steps: int = STEPS,
                 sleep: float = 0.2, extra: tuple[str, ...] = (),
                 node_timeout: float = NODE_TIMEOUT) -> None:
        self.tmp = tmp
        self.port = free_rendezvous_port()
        self.sink = tmp / "records.jsonl"
        self.out = tmp / "final.pt"
        n, _, s = nnodes.partition(":+")
        self.total = int(n) + int(s or 0)
        self.args = ["--nnodes", nnodes, "--nproc-per-node", str(nproc),
                     "--rdzv-endpoint", f"127.0.0.1:{self.port}", "--job-id", "mn",
                     "--runs-root", str(tmp / "runs"), "--sink", f"jsonl:{self.sink}",
                     "--no-nvml", "--progress-every", "0.2", "--checkpoint-every", "5",
                     "--node-timeout", str(node_timeout), *extra]
        self.script_args = [EXAMPLE, "--steps", str(steps), "--step-sleep", str(sleep),
                            "--out", str(self.out)]
        self.env = {**os.environ, "PYTHONPATH": str(ROOT)}
        self.procs: dict[int, subprocess.Popen[bytes]] = {}

    def start(self, k: int, *more: str) -> None:
        """Start host k's ``yoco run`` (more: options such as --resume)."""
        log = (self.tmp / f"host{k}.log").open("ab")
        self.procs[k] = subprocess.Popen(
            [sys.executable, "-m", "yoco.cli_runtime", "run", *self.args, *more,
             "--node-rank", str(k), "--node-name", f"host{k}", *self.script_args],
            env=self.env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)

    def start_all(self, *more: str) -> None:
        """Start every host."""
        for k in range(self.total):
            self.start(k, *more)

    def records(self) -> list[dict[str, Any]]:
        """What the sink has received."""
        return JsonlFileSink(self.sink).read_all() if self.sink.exists() else []

    def wait_for(self, pred: Any, what: str, timeout: float = 180) -> None:
        """Wait until ``pred(records)`` holds."""
        deadline = time.time() + timeout
        while time.time() < deadline:
            if pred(self.records()):
                return
            time.sleep(0.1)
        pytest.fail(f"timed out waiting for {what}; logs:\n{self.logs()}")

    def progress_at(self, step: int) -> None:
        """Wait until rank 0 has reported step ``step`` (outbox progress records)."""
        outbox = self.tmp / "runs" / "mn" / "outbox" / "records.jsonl"
        deadline = time.time() + 180
        while time.time() < deadline:
            if outbox.exists():
                steps = [json.loads(ln).get("step", -1) for ln in outbox.read_text().splitlines()
                         if '"job_progress"' in ln]
                if steps and max(steps) >= step:
                    return
            time.sleep(0.05)
        pytest.fail(f"never reached step {step}; logs:\n{self.logs()}")

    def signal_host(self, k: int, sig: int) -> None:
        """Send ``sig`` to host k's whole process group (the agent and its processes)."""
        os.killpg(self.procs[k].pid, sig)

    def wait(self, k: int, timeout: float = 240) -> int:
        """Host k's exit status."""
        try:
            return self.procs[k].wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            pytest.fail(f"host{k} did not end; logs:\n{self.logs()}")

    def logs(self) -> str:
        """Every host's log, for failure messages."""
        return "\n".join(f"--- {p.name}\n{p.read_text()[-3000:]}"
                         for p in sorted(self.tmp.glob("host*.log")))

    def close(self) -> None:
        """Kill whatever is left."""
        for p in self.procs.values():
            if p.poll() is None:
                with _suppress():
                    os.killpg(p.pid, signal.SIGCONT)
                    os.killpg(p.pid, signal.SIGKILL)
                p.wait()


class _suppress:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> bool:
        return exc[0] is not None and issubclass(exc[0], OSError)  # type: ignore[arg-type]


def _reference(failure_free: Reference, workers: int) -> Path:
    return failure_free(EXAMPLE, ["--steps", str(STEPS)], workers=workers)


def _assert_identical(a: Path, b: Path) -> None:
    sa, sb = torch.load(a), torch.load(b)
    assert sa["step"] == sb["step"] == STEPS
    ta = split_state({"m": sa["model"], "o": sa["optimizer"]})[1]
    tb = split_state({"m": sb["model"], "o": sb["optimizer"]})[1]
    assert len(ta) == len(tb) and all(torch.equal(x, y) for x, y in zip(ta, tb, strict=True))


def _incidents(recs: list[dict[str, Any]]) -> list[tuple[str, str, str, str, int]]:
    outcomes = {r["failure_event_id"]: r for r in recs if r["kind"] == "outcome"}
    assert len(outcomes) == sum(r["kind"] == "outcome" for r in recs)  # one per failure
    return [(r["node"], r["failure_class"], r["cause"], outcomes[r["event_id"]]["outcome"],
             outcomes[r["event_id"]]["lost_steps"]) for r in recs if r["kind"] == "failure"]


@pytest.fixture
def cluster_factory(tmp_path: Path) -> Any:
    made: list[Cluster] = []

    def make(**kw: Any) -> Cluster:
        c = Cluster(tmp_path, **kw)
        made.append(c)
        return c

    yield make
    for c in made:
        c.close()


def test_whole_node_loss_is_one_incident_naming_the_node_and_a_lost_spare_node_none(
        failure_free: Reference, cluster_factory: Any) -> None:
    # Two training hosts with two ranks each, two spare hosts with two spares each. The
    # first spare host dies before it is needed (no failure of the job: nothing of it ran
    # there); then host1 (two ranks of the job) loses power mid-training -- its agent and
    # workers at once: one incident naming it, and the live spare host takes its ranks
    # (live migration, bit-identical).
    ref = _reference(failure_free, workers=4)
    c = cluster_factory(nnodes="2:+2", nproc=2)
    c.start_all()
    c.progress_at(3)
    c.signal_host(2, signal.SIGKILL)
    c.progress_at(10)
    c.signal_host(1, signal.SIGKILL)
    assert c.wait(0) == 0, c.logs()
    recs = c.records()
    assert _incidents(recs) == [("host1", "unplanned", "node_lost", "live_migrated", 0)]
    assert recs[0]["kind"] == "job_started" and recs[0]["gpus"] == 4
    assert recs[-1]["kind"] == "job_finished" and recs[-1]["step"] == STEPS
    _assert_identical(ref, c.out)
    assert c.wait(3) == 0  # the second spare host served and ended normally


def test_a_frozen_node_is_fenced_as_hung_and_replaced(
        failure_free: Reference, cluster_factory: Any) -> None:
    ref = _reference(failure_free, workers=2)
    c = cluster_factory(nnodes="2:+1", nproc=1)
    c.start_all()
    c.progress_at(6)
    c.signal_host(1, signal.SIGSTOP)  # the whole host freezes
    assert c.wait(0) == 0, c.logs()
    recs = c.records()
    assert _incidents(recs) == [("host1", "unplanned", "hang", "live_migrated", 0)]
    fail = next(r for r in recs if r["kind"] == "failure")
    # Fenced by the stopped-host check (/proc shows its agent and worker stopped), within
    # a few steady steps, not by the heartbeat timeout.
    assert "silent" in fail["detail"] and "stopped (/proc)" in fail["detail"], fail
    _assert_identical(ref, c.out)
    # Fenced: the frozen host's processes were killed (reachable on this machine).
    assert c.wait(1, timeout=30) == -signal.SIGKILL


def test_a_hung_worker_is_fenced_and_a_slow_one_is_not(
        tmp_path: Path, failure_free: Reference, cluster_factory: Any) -> None:
    # host1's worker first sleeps 1.5 s in step 4 (a slow step: many steady steps, far
    # past the stopped deadline; its agent beats on): not fenced. At step 10 the worker
    # alone (not its agent) is SIGSTOPped: the watchdog fences it as hung, the spare
    # host takes its rank, bit-identical.
    ref = _reference(failure_free, workers=2)
    c = cluster_factory(nnodes="2:+1", nproc=1, sleep=0.1,
                        extra=("--inject", "slow:rank=1:step=4:seconds=1.5"))
    c.start_all()
    c.progress_at(10)
    status = json.loads((tmp_path / "runs" / "mn" / "status.json").read_text())
    rank1 = status["members"][1]
    os.kill(status["pids"][rank1], signal.SIGSTOP)
    assert c.wait(0) == 0, c.logs()
    recs = c.records()
    assert _incidents(recs) == [("host1", "unplanned", "hang", "live_migrated", 0)]
    fail = next(r for r in recs if r["kind"] == "failure")
    assert fail["detail"].startswith(f"{rank1} hung") and "state T in /proc" in fail["detail"]
    assert fail["step"] >= 10
    _assert_identical(ref, c.out)
    assert c.wait(1) == 0  # host1's agent was healthy: it served on and ended normally


def test_a_spare_node_lost_before_it_is_called_in(cluster_factory: Any) -> None:
    # The spare host dies first (nothing of the job runs there: no failure of the job);
    # a training host lost later has no spare node left: rollback to the checkpoint.
    c = cluster_factory(nnodes="2:+1", nproc=1)
    c.start_all()
    c.progress_at(3)
    c.signal_host(2, signal.SIGKILL)
    c.progress_at(12)
    c.signal_host(1, signal.SIGKILL)
    code = c.wait(0)
    recs = c.records()
    incidents = _incidents(recs)
    assert len(incidents) == 1, c.logs()
    node, klass, cause, outcome, _lost = incidents[0]
    assert (node, klass, cause) == ("host1", "unplanned", "node_lost")
    # No place is left for host1's rank (the spare host is gone, host0 is full): the job
    # cannot go on at its width, which is recorded as failed.
    assert (outcome, code) == ("failed", 1), c.logs()
    assert recs[-1]["kind"] == "job_finished"


def test_an_agent_refuses_another_jobs_coordinator(tmp_path: Path) -> None:
    # The rendezvous port is held by another job's coordinator (a port reused on a shared
    # machine, two jobs given one endpoint): the host must not join it -- a clear error,
    # exit 2, and nothing registered in that job's store.
    from datetime import timedelta

    import torch.distributed as dist

    from runtime import protocol as P

    port = free_rendezvous_port()
    other = dist.TCPStore("127.0.0.1", port, is_master=True, wait_for_workers=False,
                          timeout=timedelta(seconds=30))
    other.set(P.KEY_JOB, "someone-else")
    proc = subprocess.run(
        [sys.executable, "-m", "yoco.cli_runtime", "run", "--nnodes", "2", "--node-rank", "1",
         "--node-name", "host1", "--rdzv-endpoint", f"127.0.0.1:{port}", "--job-id", "mine",
         "--runs-root", str(tmp_path / "runs"), "--no-nvml", EXAMPLE, "--steps", "2"],
        env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True,
        timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert "runs job 'someone-else', not 'mine'" in proc.stderr
    assert not other.check([P.node_info_key(1)]) and not other.check([P.node_beat_key(1)])


def test_coordinator_loss_stops_cleanly_and_resume_loses_no_record(
        tmp_path: Path, failure_free: Reference, cluster_factory: Any) -> None:
    # host0 (the coordinator and its agent) is killed. The other agents see the store go,
    # stop their processes (training unrecorded is not allowed) and exit 4; `yoco run
    # --resume` on every host continues from the newest checkpoint, recording the loss
    # with the true lost steps; every record reaches the sink exactly once.
    ref = _reference(failure_free, workers=2)
    c = cluster_factory(nnodes="2:+1", nproc=1)
    c.start_all()
    c.progress_at(8)
    c.signal_host(0, signal.SIGKILL)
    assert c.wait(1, timeout=120) == 4, c.logs()
    assert c.wait(2, timeout=120) == 4, c.logs()
    c.start_all("--resume")
    assert c.wait(0) == 0, c.logs()
    recs = c.records()
    ids = [r["event_id"] for r in recs]
    assert len(ids) == len(set(ids))
    outbox = tmp_path / "runs" / "mn" / "outbox" / "records.jsonl"
    assert sorted(ids) == sorted(json.loads(ln)["event_id"]
                                 for ln in outbox.read_text().splitlines())
    fails = [r for r in recs if r["kind"] == "failure"]
    assert [f["cause"] for f in fails] == ["supervisor_lost"]
    outcome = next(r for r in recs if r["kind"] == "outcome")
    committed = fails[0]["step"]
    assert committed >= 8
    assert outcome["outcome"] == "rolled_back"
    # The newest checkpoint: the last multiple of 5 (or the one before, if the last one's
    # asynchronous write had not finished when host0 died).
    assert outcome["lost_steps"] in (committed % 5, committed % 5 + 5)
    assert [r["kind"] for r in recs].count("job_started") == 1
    assert recs[-1]["kind"] == "job_finished" and recs[-1]["step"] == STEPS
    _assert_identical(ref, c.out)


def test_two_nodes_lost_100_ms_apart(failure_free: Reference, cluster_factory: Any) -> None:
    # Two of three training hosts go down 100 ms apart; two spare hosts take their ranks.
    # Deaths within the merge window are one incident: one failure (the first host in
    # `node`, both hosts in `detail`) and one outcome.
    ref = _reference(failure_free, workers=3)
    c = cluster_factory(nnodes="3:+2", nproc=1)
    c.start_all()
    c.progress_at(6)
    c.signal_host(1, signal.SIGKILL)
    time.sleep(0.1)
    c.signal_host(2, signal.SIGKILL)
    assert c.wait(0) == 0, c.logs()
    recs = c.records()
    assert _incidents(recs) == [("host1", "unplanned", "node_lost", "live_migrated", 0)]
    fail = next(r for r in recs if r["kind"] == "failure")
    assert "host1" in fail["detail"] and "host2" in fail["detail"], fail
    _assert_identical(ref, c.out)


def test_a_remote_node_silent_for_the_timeout_is_fenced_as_hung(remote_pair_store: Any
                                                               ) -> None:
    # The coordinator's heartbeat check alone, on a real store: node 1 is on another
    # machine (nothing of it can be read in /proc or signalled), so silence is all the
    # coordinator can go by. While both nodes beat, neither is lost, however long that
    # lasts; once node 1 stops beating it is lost as hung, not before --node-timeout and
    # dated when it was last heard. Each beat is followed by the coordinator's look in
    # this one thread, so a loaded machine delays both alike and cannot fake a silence.
    from runtime import protocol as P
    from runtime.nodepool import NodePool

    timeout = 1.0
    store = remote_pair_store
    pool = NodePool(store, nodes=2, node_timeout_s=timeout, register_timeout_s=10)
    assert not pool.nodes[1].reachable
    alive_until = time.monotonic() + 3 * timeout
    while time.monotonic() < alive_until:
        for rank in (0, 1):
            store.add(P.node_beat_key(rank), 1)
        time.sleep(0.06)  # past the coordinator's 50 ms between looks at the beats
        assert pool.take_node_failures() == []
    last_heard = time.monotonic()
    lost = []
    while not lost and time.monotonic() < last_heard + 30:
        store.add(P.node_beat_key(0), 1)
        time.sleep(0.06)
        lost = pool.take_node_failures()
    [failure] = lost
    assert (failure.node, failure.cause) == ("host1", "hang")
    silent = float(failure.detail.split("silent for ")[1].split(" s")[0])
    assert silent >= timeout and f"(no heartbeat; lost after {timeout:.2f} s): fenced" \
        in failure.detail, failure
    # Dated at its last beat (3 timeouts after it registered), not at registration (on
    # the coordinator's monotonic clock).
    assert last_heard - 0.5 <= failure.since <= last_heard
    assert pool.nodes[0].lost is None and pool.nodes[1].lost == "hang"
