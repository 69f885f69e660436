"""Partitions, a coordinator dying right after a node loss, and a full run-folder disk,
with real processes: ``yoco run`` on hosts in network namespaces of their own
(tests/runtime/netns.py) or on this machine, compared bit for bit with a failure-free
run, every record exactly once."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from runtime import protocol as P
from runtime.faults import parse_fault
from runtime.processes import process_exiting
from runtime.sink import JsonlFileSink
from runtime.supervisor import LaunchConfig, launch
from tests.runtime.conftest import Reference
from tests.runtime.netns import Netns, NetnsCluster
from tests.runtime.test_nodes import EXAMPLE, Cluster, _assert_identical

pytestmark = pytest.mark.slow

STEPS = 24


def _exactly_once(recs: list[dict[str, Any]]) -> None:
    ids = [r["event_id"] for r in recs]
    assert len(ids) == len(set(ids))
    fails = [r["event_id"] for r in recs if r["kind"] == "failure"]
    outs = [r["failure_event_id"] for r in recs if r["kind"] == "outcome"]
    assert sorted(fails) == sorted(outs), (fails, outs)  # one outcome per failure
    assert [r["kind"] for r in recs].count("job_started") == 1
    assert [r["kind"] for r in recs].count("job_finished") == 1


def test_a_partitioned_coordinator_blames_nobody_and_resume_continues(
        netns: Callable[[int], Netns], tmp_path: Path, failure_free: Reference) -> None:
    # Three training hosts, each its own machine. host0's link is cut (the coordinator's
    # host): it finds itself cut off from both others, records nothing against them and
    # stops (exit 4); host1 and host2 lose their coordinator (no heartbeat: exit 4, their
    # processes stopped). The link comes back; --resume on every host continues from the
    # checkpoint: the only failure recorded is the coordinator's stop, with the true lost
    # steps; the final state equals a failure-free run's.
    ref = failure_free(EXAMPLE, ["--steps", str(STEPS)], workers=3)
    net = netns(3)
    out = tmp_path / "final.pt"
    c = NetnsCluster(net, tmp_path, script=EXAMPLE,
                     script_args=["--steps", str(STEPS), "--step-sleep", "0.2", "--out",
                                  str(out)],
                     nnodes="3", nproc=1,
                     extra=["--checkpoint-every", "5", "--progress-every", "0.2",
                            "--node-timeout", "2"])
    try:
        c.start_all()
        c.progress_at(8)
        net.cut(0)
        assert c.wait(0, timeout=120) == 4, c.logs()
        assert "cut off" in c.log(0)
        net.heal(0)
        assert c.wait(1, timeout=120) == 4, c.logs()
        assert c.wait(2, timeout=120) == 4, c.logs()
        assert "the coordinator is lost" in c.log(1)
        before = c.outbox()
        assert not [r for r in before if r["kind"] in ("failure", "outcome", "job_finished")]
        assert c.status().get("state") == "stopped"
        c.start_all("--resume")
        assert c.wait(0) == 0, c.logs()
        for k in (1, 2):
            assert c.wait(k) == 0, c.logs()
    finally:
        c.close()
    recs = c.records()
    _exactly_once(recs)
    fails = [r for r in recs if r["kind"] == "failure"]
    assert [(f["cause"], f["node"]) for f in fails] == [("supervisor_lost", "host0")]
    assert "cut off from its hosts" in fails[0]["detail"]
    outcome = next(r for r in recs if r["kind"] == "outcome")
    committed = fails[0]["step"]
    assert outcome["outcome"] == "rolled_back"
    assert outcome["lost_steps"] in (committed % 5, committed % 5 + 5)
    assert recs[-1]["kind"] == "job_finished" and recs[-1]["step"] == STEPS
    _assert_identical(ref, out)


def test_a_frozen_spare_host_is_set_aside_and_nobody_is_blamed(
        netns: Callable[[int], Netns], tmp_path: Path, failure_free: Reference) -> None:
    # Two training hosts and a spare host, each its own machine. The spare host freezes
    # (everything on it SIGSTOPped) while the job trains: the job does not stall, the
    # silent spare is set aside after --node-timeout (fenced: nothing of the job ran
    # there, so nothing is recorded against anyone), the job finishes bit-identical to a
    # failure-free run; thawed, the spare host learns it was fenced and exits 5.
    ref = failure_free(EXAMPLE, ["--steps", str(STEPS)], workers=2)
    net = netns(3)
    out = tmp_path / "final.pt"
    c = NetnsCluster(net, tmp_path, script=EXAMPLE,
                     script_args=["--steps", str(STEPS), "--step-sleep", "0.3", "--out",
                                  str(out)],
                     nnodes="2:+1", nproc=1,
                     extra=["--checkpoint-every", "5", "--progress-every", "0.2",
                            "--node-timeout", "2"])
    try:
        c.start_all()
        c.progress_at(3)
        net.freeze(2)
        c.wait_until(lambda: "node host2 silent" in c.log(0), "the spare host set aside")
        net.thaw(2)
        assert c.wait(0) == 0, c.logs()
        assert c.wait(1) == 0, c.logs()
        assert c.wait(2, timeout=60) == 5, c.logs()
    finally:
        c.close()
    assert "node host2 was fenced by the coordinator (hang: node host2 silent" in c.log(2)
    recs = c.records()
    _exactly_once(recs)
    assert [r for r in recs if r["kind"] in ("failure", "outcome")] == []
    assert recs[-1]["kind"] == "job_finished" and recs[-1]["step"] == STEPS
    _assert_identical(ref, out)


@pytest.mark.parametrize("fault", ["freeze", "cut"])
def test_a_spare_lost_while_it_receives_the_state_is_replaced_and_changes_nothing(
        fault: str, netns: Callable[[int], Netns], tmp_path: Path,
        failure_free: Reference) -> None:
    # Two training hosts and two spare hosts, each its own machine. host1's worker is
    # killed; the spare called in for it joins the new group and waits there before it
    # receives the state (an injected lag: the survivor waits for it in the transfer) --
    # and its host freezes (or is cut off) right then. The coordinator loses that host as
    # hung, calls in the other spare host, and the survivor, stuck in the abandoned
    # transfer, joins the new generation: two failures (the kill; the spare host, naming
    # the first), each with one live outcome and 0 lost steps, the final state
    # bit-identical to a failure-free run. Back, the lost spare host learns it was fenced
    # and exits 5, having changed nothing. (A node floor of 1 s, as in test_fencing: four
    # hosts share two cores with the rest of the suite.)
    ref = failure_free(EXAMPLE, ["--steps", str(STEPS)], workers=2)
    net = netns(4)
    out = tmp_path / "final.pt"
    c = NetnsCluster(net, tmp_path, script=EXAMPLE,
                     script_args=["--steps", str(STEPS), "--step-sleep", "0.15", "--out",
                                  str(out)],
                     nnodes="2:+2", nproc=1,
                     extra=["--checkpoint-every", "5", "--progress-every", "0.2",
                            "--node-timeout", "4", "--node-floor", "1",
                            "--inject", "kill:rank=1:step=8",
                            "--inject", "lag:rank=1:step=0:seconds=60"])
    logs = c.run_dir / "logs"

    def lagging() -> int | None:
        for k in (2, 3):
            for log in (logs / f"host{k}").glob("*.log"):
                if "[yoco-fault] lag:" in log.read_text(errors="replace"):
                    return k
        return None

    try:
        c.start_all()
        c.wait_until(lambda: lagging() is not None, "the spare called in to lag")
        lost = lagging()
        assert lost is not None
        other = 5 - lost
        if fault == "freeze":
            net.freeze(lost)
        else:
            net.cut(lost)
        c.wait_until(lambda: f"node host{lost} silent" in c.log(0), "the spare host lost")
        if fault == "freeze":
            net.thaw(lost)
        else:
            net.heal(lost)
        assert c.wait(0) == 0, c.logs()
        assert c.wait(1) == 0, c.logs()
        assert c.wait(other) == 0, c.logs()
        assert c.wait(lost, timeout=60) == P.EXIT_FENCED, c.logs()
    finally:
        c.close()
    assert f"node host{lost} was fenced by the coordinator (hang: node host{lost} silent" \
        in c.log(lost)
    recs = c.records()
    _exactly_once(recs)
    fails = [r for r in recs if r["kind"] == "failure"]
    outcomes = {r["failure_event_id"]: r for r in recs if r["kind"] == "outcome"}
    assert [(f["node"], f["cause"]) for f in fails] == [
        ("host1", "process_killed"), (f"host{lost}", "hang")], c.logs()
    assert fails[0]["event_id"] in fails[1]["detail"]  # during the first's recovery
    assert [(outcomes[f["event_id"]]["outcome"], outcomes[f["event_id"]]["lost_steps"])
            for f in fails] == [("live_migrated", 0), ("live_migrated", 0)]
    assert recs[-1]["kind"] == "job_finished" and recs[-1]["step"] == STEPS
    _assert_identical(ref, out)


@pytest.mark.parametrize("when", ["inside_the_window", "after_the_record"])
def test_a_node_loss_is_recorded_once_when_the_coordinator_dies_right_after_it(
        tmp_path: Path, failure_free: Reference, when: str) -> None:
    # host1 loses power; the coordinator's host dies right after (a correlated failure:
    # one rack, one switch) -- 0.2 s after the coordinator noticed (its log line), inside
    # the merge window, or once the node loss's record is written. Either way nothing is
    # lost and nothing is twice: after --resume on every host the records hold the node
    # loss exactly once with exactly one outcome, the rollback's, with the true lost
    # steps; the final state equals a failure-free run's.
    ref = failure_free(EXAMPLE, ["--steps", str(STEPS)], workers=2)
    c = Cluster(tmp_path, nnodes="2:+1", nproc=1)
    outbox = tmp_path / "runs" / "mn" / "outbox"
    try:
        c.start_all()
        c.progress_at(8)
        c.signal_host(1, signal.SIGKILL)
        deadline = time.monotonic() + 60
        log0 = tmp_path / "host0.log"
        while "node host1 lost" not in log0.read_text() and time.monotonic() < deadline:
            time.sleep(0.01)
        if when == "inside_the_window":
            time.sleep(0.2)
        else:
            while '"cause":"node_lost"' not in (outbox / "records.jsonl").read_text() \
                    and time.monotonic() < deadline:
                time.sleep(0.01)
        c.signal_host(0, signal.SIGSTOP)  # what it had written, as it dies
        written = [json.loads(ln) for ln in (outbox / "records.jsonl").read_text().splitlines()]
        drafts = (json.loads((outbox / "drafts.json").read_text())
                  if (outbox / "drafts.json").exists() else [])
        c.signal_host(0, signal.SIGKILL)
        assert c.wait(2, timeout=120) == 4, c.logs()
        c.start_all("--resume")
        assert c.wait(0) == 0, c.logs()
    finally:
        c.close()
    recorded = [r for r in written if r["kind"] == "failure"]
    recs = c.records()
    _exactly_once(recs)
    fails = [r for r in recs if r["kind"] == "failure"]
    outcomes = {r["failure_event_id"]: r for r in recs if r["kind"] == "outcome"}
    [node] = [f for f in fails if f["cause"] == "node_lost"]
    assert node["node"] == "host1"
    if when == "inside_the_window":
        # Not recorded yet but durable as a draft: the resume records it under the
        # draft's id, the coordinator's loss folded into it (one incident, one failure).
        assert recorded == [], recorded
        assert [d["event_id"] for d in drafts] == [node["event_id"]]
        assert [f["cause"] for f in fails] == ["node_lost"]
        assert "supervisor lost at step" in node["detail"]
    else:
        # Recorded before the coordinator died: the coordinator's loss is a failure of
        # its own; the node loss has its own outcome (live_migrated/0 when its migration
        # was done before the coordinator died, else the resume's rollback).
        assert [f["event_id"] for f in recorded] == [node["event_id"]]
        # The draft is removed just after its record is appended, so the host may die
        # between the two: a draft already recorded is then left behind, and the resume
        # must not record it again (_exactly_once above).
        assert [d["event_id"] for d in drafts] in ([], [node["event_id"]]), drafts
        assert sorted((f["cause"], f["node"]) for f in fails) == [
            ("node_lost", "host1"), ("supervisor_lost", "host0")]
    # The rollback goes back from the last committed step (the resume's failure's step)
    # to the newest checkpoint: the last multiple of 5 or, with its write still under way
    # when the host died, the one before.
    last = max(f["step"] for f in fails)
    for f in fails:
        out = outcomes[f["event_id"]]
        if f["cause"] == "node_lost" and out["outcome"] == "live_migrated":
            assert when == "after_the_record" and out["lost_steps"] == 0
            continue
        assert out["outcome"] == "rolled_back"
        assert out["lost_steps"] in (last % 5, last % 5 + 5), (f, out)
    _assert_identical(ref, c.out)


@pytest.fixture
def tmpfs(tmp_path: Path) -> Iterator[Path]:
    """A 64 MiB tmpfs mounted under tmp_path (unmounted at the end)."""
    where = tmp_path / "disk"
    where.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", str(where)], check=True)
    yield where
    subprocess.run(["umount", "-l", str(where)], check=False)


def test_a_run_folder_on_a_full_disk_finishes_and_records_the_true_rollback(
        tmpfs: Path, tmp_path: Path, failure_free: Reference,
        caplog: pytest.LogCaptureFixture) -> None:
    # The whole run folder (outbox, status.json, checkpoints, logs) is on a small disk
    # that fills up after the checkpoint of step 5: status.json and the checkpoints of
    # steps 10, 15... fail (logged, shown, no partial file), the outbox releases its
    # reserve, the job goes on. A worker killed at step 14 without a spare rolls back to
    # the checkpoint of step 5 (or of 15, written once the outbox freed its reserve): the
    # lost steps recorded are the true ones.
    steps = STEPS
    ref = failure_free(EXAMPLE, ["--steps", str(steps)], workers=2)
    out = tmp_path / "final.pt"
    sink = JsonlFileSink(tmp_path / "records.jsonl")
    cfg = LaunchConfig(script=EXAMPLE, args=["--steps", str(steps), "--step-sleep", "0.1",
                                             "--out", str(out)],
                       workers=2, spares=0, checkpoint_every=5, job_id="full",
                       contract_id="c-test", runs_root=str(tmpfs), nvml=False,
                       progress_interval_s=0.1,
                       faults=[parse_fault("kill:rank=1:step=14")])
    run_dir = tmpfs / "full"
    filled = threading.Event()

    def fill_after_the_first_checkpoints() -> None:
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError):
                if (run_dir / "checkpoints" / "step-000000005.pt").exists():
                    break
            time.sleep(0.01)
        fd = os.open(tmpfs / "filler", os.O_WRONLY | os.O_CREAT, 0o644)
        st = os.statvfs(tmpfs)  # at once (steps 6-10 take half a second), then to the byte
        with contextlib.suppress(OSError):
            os.posix_fallocate(fd, 0, st.f_bavail * st.f_frsize)
        os.lseek(fd, 0, os.SEEK_END)
        with contextlib.suppress(OSError):
            while os.write(fd, b"\0" * 4096):
                pass
        with contextlib.suppress(OSError):
            while os.write(fd, b"\0"):
                pass
        os.close(fd)
        filled.set()

    filler = threading.Thread(target=fill_after_the_first_checkpoints, daemon=True)
    filler.start()
    result = launch(cfg, sink)
    filler.join(timeout=60)
    assert filled.is_set()
    assert result.exit_code == 0, result
    assert result.delivered
    failed = [r.message for r in caplog.records if "CHECKPOINT WRITE FAILED at step 10" in
              r.message and r.name == "yoco.runtime.supervisor"]
    assert failed and "goes back to the checkpoint of step 5" in failed[0], failed
    assert any("cannot write" in r.message and "status.json" in r.message
               for r in caplog.records)
    ckpts = [p.name for p in (run_dir / "checkpoints").iterdir()]
    assert all(re.fullmatch(r"step-\d{9}\.pt", n) for n in ckpts), ckpts  # no partial file
    # (Later checkpoints may be written again: the outbox's released reserve frees space.)
    recs = sink.read_all()
    _exactly_once(recs)
    [fail] = [r for r in recs if r["kind"] == "failure"]
    outcome = next(r for r in recs if r["kind"] == "outcome")
    assert outcome["outcome"] == "rolled_back"
    # Back to the newest checkpoint written when the recovery was planned: step 5, or 15
    # when rank 0 committed step 15 (the kill's allreduce completed on its side) and its
    # writer wrote that checkpoint in the space the outbox's released reserve freed.
    [target] = [int(m.group(1)) for r in caplog.records
                if (m := re.search(r"rollback recovery from the checkpoint of step (\d+)",
                                   r.message))]
    assert target in (5, 15), target
    assert outcome["lost_steps"] == fail["step"] - target, (fail, outcome, target)
    if target == 5:
        assert outcome["lost_steps"] > 5, (fail, outcome)
    _assert_identical(ref, out)



COORDINATOR = """
import sys, time
from datetime import timedelta
import torch.distributed as dist
s = dist.TCPStore("127.0.0.1", int(sys.argv[1]), is_master=True, wait_for_workers=False,
                  timeout=timedelta(seconds=60))
s.set("job", "wd")
while True:
    s.add("coordinator/beat", 1)
    time.sleep(0.1)
"""


def test_an_agent_blocked_on_a_frozen_coordinator_stops_its_processes_and_exits_4(
        tmp_path: Path) -> None:
    # The coordinator's process (its store and its heartbeat) is frozen: every store call
    # of the agent blocks. Its watchdog still ends it: the worker it started is killed
    # and the agent exits 4 (documented deadline: 5 s after the last beat it saw).
    from datetime import timedelta

    import torch.distributed as dist

    from runtime import protocol as P
    from runtime.nodes import free_rendezvous_port
    from tests.runtime.test_nodes import ROOT

    port = free_rendezvous_port()
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    coord = subprocess.Popen([sys.executable, "-c", COORDINATOR, str(port)], env=env)
    sleeper = tmp_path / "sleeper.py"
    sleeper.write_text("import time\nwhile True:\n    time.sleep(1)\n")
    log = (tmp_path / "agent.log").open("wb")
    agent = subprocess.Popen(
        [sys.executable, "-m", "yoco.cli_runtime", "run", "--nnodes", "2", "--node-rank", "1",
         "--node-name", "host1", "--rdzv-endpoint", f"127.0.0.1:{port}", "--job-id", "wd",
         "--runs-root", str(tmp_path / "runs"), "--no-nvml", str(sleeper)],
        env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        store = dist.TCPStore("127.0.0.1", port, is_master=False,
                              timeout=timedelta(seconds=60))
        deadline = time.monotonic() + 240
        while not store.check([P.node_info_key(1)]) and time.monotonic() < deadline:
            time.sleep(0.05)
        store.queue_push(P.node_requests_key(1), json.dumps({"op": "spawn", "slot": "w0"}))
        pid = 0
        while not pid and time.monotonic() < deadline:
            if int(store.queue_len(P.KEY_AGENT_EVENTS)):
                ev = json.loads(store.queue_pop(P.KEY_AGENT_EVENTS, False))
                pid = int(ev["pid"]) if ev["kind"] == "started" else 0
            time.sleep(0.05)
        assert pid, (tmp_path / "agent.log").read_text()
        os.kill(coord.pid, signal.SIGSTOP)
        assert agent.wait(timeout=120) == 4, (tmp_path / "agent.log").read_text()
        assert "the coordinator is lost (no coordinator heartbeat" in \
            (tmp_path / "agent.log").read_text()
        while time.monotonic() < deadline and Path(f"/proc/{pid}").exists() and \
                not process_exiting(pid):
            time.sleep(0.05)
        assert process_exiting(pid)  # killed (dead, or being reaped)
    finally:
        with contextlib.suppress(OSError):
            os.kill(coord.pid, signal.SIGKILL)
        with contextlib.suppress(OSError):
            os.killpg(agent.pid, signal.SIGKILL)
        coord.wait()
        agent.wait()
