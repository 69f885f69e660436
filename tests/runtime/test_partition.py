"""Partitions, unrecorded failures and full disks, decided in-process on real stores,
real processes and real (tmpfs) disks: the coordinator cut off from a majority blames
nobody; a death's failure is durable before its recovery is decided and never
rewritten; status.json and checkpoints on a full disk are survived and shown."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist

from runtime import protocol as P
from runtime import records as R
from runtime import supervisor as supervisor_module
from runtime.checkpointing import Checkpointer
from runtime.errors import CheckpointError
from runtime.nodepool import NodePool, machine_id
from runtime.processes import process_exiting
from runtime.sink import JsonlFileSink
from runtime.state import write_checkpoint
from runtime.supervisor import LaunchConfig, Supervisor

# --------------------------------------------------------------------- the cut-off verdict


def _pool(nodes: int, timeout: float) -> tuple[Any, NodePool]:
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                          timeout=timedelta(seconds=30))
    for rank in range(nodes):
        here = rank == 0  # the coordinator's host; the others on "other machines"
        info = {"name": f"host{rank}", "pid": os.getpid() if here else 1,
                "pgid": os.getpgid(0) if here else 1,
                "machine": machine_id() if here else f"machine-{rank}", "nproc": 1}
        store.set(P.node_beat_key(rank), "0")
        store.set(P.node_info_key(rank), json.dumps(info))
    return store, NodePool(store, nodes=nodes, node_timeout_s=timeout, register_timeout_s=10)


def _beat(store: Any, ranks: list[int], until: float) -> None:
    while time.monotonic() < until:
        for rank in ranks:
            store.add(P.node_beat_key(rank), 1)
        time.sleep(0.06)  # past the coordinator's 50 ms between looks


def test_a_coordinator_cut_off_from_the_majority_blames_nobody() -> None:
    # Four hosts; hosts 1-3 fall silent together (host0's link is cut, as seen from
    # host0): the coordinator finds itself cut off and loses nobody, however long it
    # keeps looking; the silent hosts were quiet (the watchdogs defer to this verdict).
    timeout = 0.6
    store, pool = _pool(4, timeout)
    _beat(store, [0, 1, 2, 3], time.monotonic() + 2 * timeout)
    assert pool.take_node_failures() == [] and pool.cut_off is None
    deadline = time.monotonic() + 30
    while pool.cut_off is None and time.monotonic() < deadline:
        store.add(P.node_beat_key(0), 1)
        time.sleep(0.06)
        assert pool.take_node_failures() == []
    assert pool.cut_off is not None and "host1, host2, host3 (3 of 4)" in pool.cut_off
    assert pool.quiet_nodes() == {"host1", "host2", "host3"}
    _beat(store, [0], time.monotonic() + 2 * timeout)
    assert pool.take_node_failures() == []
    assert all(n.lost is None for n in pool.nodes)


def test_a_minority_silent_together_is_lost_as_hung() -> None:
    # Five hosts; hosts 3 and 4 fall silent together (a rack): the coordinator reaches
    # three of five, so both are lost (one failure each, as a whole node each).
    timeout = 0.6
    store, pool = _pool(5, timeout)
    _beat(store, [0, 1, 2, 3, 4], time.monotonic() + 2 * timeout)
    lost: list[Any] = []
    deadline = time.monotonic() + 30
    while len(lost) < 2 and time.monotonic() < deadline:
        for rank in (0, 1, 2):
            store.add(P.node_beat_key(rank), 1)
        time.sleep(0.06)
        lost += pool.take_node_failures()
    assert sorted((f.node, f.cause) for f in lost) == [("host3", "hang"), ("host4", "hang")]
    assert pool.cut_off is None


# --------------------------------------------------------------------- failures recorded first

SLEEPER = "import time\nwhile True:\n    time.sleep(1)\n"


@pytest.fixture
def supervisor(tmp_path: Path) -> Iterator[Callable[..., Supervisor]]:
    """``make(workers, spares, start=True, **cfg)``: a Supervisor in this process whose
    workers are real processes that sleep (nothing trains: the test drives its
    decisions); ``start``: its job started and generation 0 published."""
    made: list[Supervisor] = []
    script = tmp_path / "sleeper.py"
    script.write_text(SLEEPER)

    def make(workers: int = 2, spares: int = 2, start: bool = True, **kw: Any) -> Supervisor:
        cfg = LaunchConfig(script=str(script), workers=workers, spares=spares,
                           job_id=kw.pop("job_id", f"j{len(made)}"), contract_id="c-test",
                           nvml=False, runs_root=str(kw.pop("runs_root", tmp_path / "runs")),
                           fork_spares=False, replenish_spares=False, **kw)
        sup = Supervisor(cfg, sink=JsonlFileSink(tmp_path / f"sink{len(made)}.jsonl"))
        made.append(sup)
        if not start:  # the test plans generation 0 itself (a resume)
            return sup
        sup._emit(R.job_started(contract_id="c-test", job_id=sup.job_id, gpus=workers))
        members = [sup._spawn() for _ in range(workers)]
        sup.spares = [sup._spawn() for _ in range(spares)]
        sup.holders = set(members)
        sup._publish(P.Plan(gen=0, mode=P.PlanMode.START, members=members))
        return sup

    yield make
    for sup in made:
        for p in sup.pool.procs.values():
            with contextlib.suppress(OSError):
                p.kill()
        sup.pool.shutdown(grace_s=1)


def _outbox_lines(sup: Supervisor) -> list[str]:
    return (sup.outbox.dir / "records.jsonl").read_text().splitlines()


def _failures(sup: Supervisor) -> list[dict[str, Any]]:
    return [r for r in map(json.loads, _outbox_lines(sup)) if r["kind"] == "failure"]


def _until_recorded(sup: Supervisor, n: int) -> None:
    deadline = time.monotonic() + 30
    while len(_failures(sup)) < n and time.monotonic() < deadline:
        sup._handle_deaths()
        sup._emit_deaths(block=False)
        time.sleep(0.005)
    assert len(_failures(sup)) == n


def _until(sup: Supervisor, done: Callable[[], bool]) -> None:
    """Let ``sup`` act on deaths (not write their records) until ``done()``."""
    deadline = time.monotonic() + 30
    while not done() and time.monotonic() < deadline:
        sup._handle_deaths()
        time.sleep(0.005)
    assert done()


def _outcomes(sup: Supervisor) -> list[dict[str, Any]]:
    return [r for r in map(json.loads, _outbox_lines(sup)) if r["kind"] == "outcome"]


def test_deaths_within_the_merge_window_are_one_failure_durable_from_the_first(
        supervisor: Callable[..., Supervisor], monkeypatch: pytest.MonkeyPatch) -> None:
    # A window no test run can outlast: the deaths are in it whatever the machine's load.
    monkeypatch.setattr(supervisor_module, "MERGE_WINDOW_S", 3600.0)
    sup = supervisor(workers=2, spares=2)
    w0, w1 = sup.members
    sup.last_step = 7
    sup.pool.kill(w0)
    _until(sup, lambda: sup.recovery.gen == 1)
    # Acted on (the recovery is planned) and durable as a draft -- fsync'd before the
    # plan was published -- while its record waits for the window.
    [d0] = sup.outbox.read_drafts()
    assert d0["cause"] == "process_killed" and d0["detail"].startswith(f"{w0} exit")
    assert d0["step"] == 7 and _failures(sup) == []
    # The spare called in dies too (the same incident, seen one process later): it joins
    # the draft, and the recovery is planned again from both.
    spare = next(m for m in sup.members if m not in (w0, w1))
    sup.pool.kill(spare)
    _until(sup, lambda: sup.recovery.gen == 2)
    [d1] = sup.outbox.read_drafts()
    assert d1["event_id"] == d0["event_id"] and spare in d1["detail"] and w0 in d1["detail"]
    assert _failures(sup) == [] and len(sup.recovery.incidents) == 1
    # The outcome is due: the record is written now -- one failure naming both, under
    # its draft's id and date -- and the draft goes.
    sup.store.set(P.ready_key(2), json.dumps({"step_seconds": 0.1, "first_step": 0.0}))
    sup._handle_ready()
    [f] = _failures(sup)
    assert f["event_id"] == d0["event_id"] and f["occurred_at"] == d0["occurred_at"]
    assert f"{w0} exit -9" in f["detail"] and f"{spare} exit -9" in f["detail"]
    assert sup.outbox.read_drafts() == []
    assert not (sup.outbox.dir / "drafts.json").exists()
    [o] = _outcomes(sup)
    assert o["failure_event_id"] == f["event_id"] and o["outcome"] == "live_migrated"


def test_a_death_after_the_window_is_a_failure_of_its_own_naming_the_first(
        supervisor: Callable[..., Supervisor], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(supervisor_module, "MERGE_WINDOW_S", 0.0)  # every death is late
    sup = supervisor(workers=2, spares=2)
    w0, w1 = sup.members
    sup.pool.kill(w0)
    _until_recorded(sup, 1)
    assert sup.recovery.active and sup.recovery.gen == 1
    first = _outbox_lines(sup)
    [f0] = _failures(sup)
    assert f0["cause"] == "process_killed" and f0["detail"] == f"{w0} exit -9"
    spare = next(m for m in sup.members if m not in (w0, w1))
    sup.pool.kill(spare)
    _until_recorded(sup, 2)
    assert _outbox_lines(sup)[:len(first)] == first  # nothing written is rewritten
    f1 = _failures(sup)[1]
    assert f1["detail"].startswith(f"{spare} exit -9") and f0["event_id"] in f1["detail"]
    assert sup.recovery.gen == 2 and len(sup.recovery.incidents) == 2
    assert sup.outbox.read_drafts() == []
    sup.store.set(P.ready_key(2), json.dumps({"step_seconds": 0.1, "first_step": 0.0}))
    sup._handle_ready()
    outs = _outcomes(sup)
    assert sorted(o["failure_event_id"] for o in outs) == sorted([f0["event_id"],
                                                                  f1["event_id"]])
    assert all(o["outcome"] == "live_migrated" and o["recovery_seconds"] >= 0 for o in outs)


def test_a_supervisor_lost_inside_the_window_leaves_one_failure_that_resume_closes(
        supervisor: Callable[..., Supervisor], monkeypatch: pytest.MonkeyPatch,
        tmp_path: Path) -> None:
    # The first supervisor acts on a death and dies before the window closes (a node
    # and its coordinator lost together): nothing of the death is in the records yet.
    monkeypatch.setattr(supervisor_module, "MERGE_WINDOW_S", 3600.0)
    ckpt = tmp_path / "ckpt"
    sup = supervisor(workers=2, spares=1, checkpoint_every=5, checkpoint_dir=str(ckpt))
    w0, _ = sup.members
    write_checkpoint({"w": torch.zeros(4)}, ckpt, 5)
    (sup.run_dir / P.COMMITTED_FILE).write_text(f"8 {time.time()}\n")  # rank 0's note
    sup.last_step = 8
    sup.pool.kill(w0)
    _until(sup, lambda: sup.recovery.gen == 1)
    [draft] = sup.outbox.read_drafts()
    assert _failures(sup) == []
    for p in sup.pool.procs.values():  # the supervisor is gone with its workers
        p.kill()
    # --resume: the draft becomes the one failure (its id, date, cause), saying that the
    # coordinator was lost too; no supervisor_lost failure beside it; the rollback to
    # step 5 is its one outcome, with the true lost steps (8 - 5).
    again = supervisor(workers=2, spares=0, checkpoint_every=5, checkpoint_dir=str(ckpt),
                       job_id=sup.job_id, resume=True, start=False)
    prior = [json.loads(ln) for ln in _outbox_lines(again)]
    members = [again._spawn() for _ in range(2)]
    again._resume(prior, (8, time.time()), members)
    [f] = _failures(again)
    assert f["event_id"] == draft["event_id"] and f["occurred_at"] == draft["occurred_at"]
    assert f["cause"] == "process_killed" and f["step"] == 8
    assert "supervisor lost at step 8 before recording it" in f["detail"]
    assert again.outbox.read_drafts() == []
    assert [i.event_id for i in again.recovery.incidents] == [f["event_id"]]
    again.store.set(P.ready_key(0), json.dumps({"step_seconds": 0.1, "first_step": 0.0}))
    again._handle_ready()
    [o] = _outcomes(again)
    assert (o["failure_event_id"], o["outcome"], o["lost_steps"]) == (f["event_id"],
                                                                      "rolled_back", 3)
    # A draft already recorded (the resume died before removing it) is not recorded
    # twice: the next resume records its own loss instead.
    again.outbox.write_drafts([draft])
    third = supervisor(workers=2, spares=0, checkpoint_every=5, checkpoint_dir=str(ckpt),
                       job_id=sup.job_id, resume=True, start=False)
    third._resume([json.loads(ln) for ln in _outbox_lines(third)], (8, time.time()),
                  [third._spawn() for _ in range(2)])
    fails = _failures(third)
    assert [x["cause"] for x in fails] == ["process_killed", "supervisor_lost"]
    assert third.outbox.read_drafts() == []


def test_deaths_seen_in_one_pass_are_one_failure(supervisor: Callable[..., Supervisor]) -> None:
    sup = supervisor(workers=3, spares=3)
    w0, w1, _ = sup.members
    pids = [sup.pool.procs[w].pid for w in (w0, w1)]
    for pid in pids:
        os.kill(pid, signal.SIGKILL)
    for pid in pids:  # both dying before the supervisor looks
        while not process_exiting(pid):
            time.sleep(0.005)
    _until_recorded(sup, 1)
    [f] = _failures(sup)
    assert f"{w0} exit -9" in f["detail"] and f"{w1} exit -9" in f["detail"]


# --------------------------------------------------------------------- full disks


@pytest.fixture
def tmpfs(tmp_path: Path) -> Iterator[Callable[[str], Path]]:
    """``make(size)``: a fresh tmpfs of ``size`` (e.g. "4m") mounted under tmp_path."""
    mounts: list[Path] = []

    def make(size: str) -> Path:
        where = tmp_path / f"tmpfs{len(mounts)}"
        where.mkdir()
        subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)],
                       check=True)
        mounts.append(where)
        return where

    yield make
    for where in mounts:
        subprocess.run(["umount", "-l", str(where)], check=False)


def _fill(where: Path) -> Path:
    """Fill the disk under ``where`` to the last byte; return the filler file."""
    filler = where / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        with contextlib.suppress(OSError):
            while os.write(fd, b"\0" * 4096):
                pass
        with contextlib.suppress(OSError):
            while os.write(fd, b"\0"):
                pass
    finally:
        os.close(fd)
    return filler


def test_status_on_a_full_disk_is_logged_and_written_again_later(
        supervisor: Callable[..., Supervisor], tmpfs: Callable[[str], Path],
        caplog: pytest.LogCaptureFixture) -> None:
    disk = tmpfs("4m")
    sup = supervisor(workers=1, spares=0, runs_root=disk)
    status = sup.run_dir / "status.json"
    before = status.read_text()
    filler = _fill(disk)
    sup.last_step = 7
    sup._write_status(sup.state)  # ENOSPC: no exception, the old file intact
    assert sup.status_error and "No space left" in sup.status_error
    assert status.read_text() == before
    assert not list(sup.run_dir.glob(".status.json.tmp"))
    assert any("cannot write" in r.message and r.levelname == "ERROR" for r in caplog.records)
    filler.unlink()
    sup._write_status(sup.state)
    assert sup.status_error is None and json.loads(status.read_text())["step"] == 7


def test_a_failed_checkpoint_write_leaves_no_partial_file_and_is_shown(
        supervisor: Callable[..., Supervisor], tmpfs: Callable[[str], Path],
        caplog: pytest.LogCaptureFixture) -> None:
    disk = tmpfs("1m")
    small = {"w": torch.zeros(1000)}
    big = {"w": torch.zeros(1 << 20)}  # 4 MB: more than the disk
    assert write_checkpoint(small, disk, 5).exists()
    with pytest.raises(CheckpointError, match="cannot write checkpoint"):
        write_checkpoint(big, disk, 10)
    assert sorted(p.name for p in disk.iterdir()) == ["step-000000005.pt"]
    # Through the worker's checkpointer to the supervisor: logged, in status.json, the
    # rollback target still the checkpoint of step 5.
    sup = supervisor(workers=1, spares=0, checkpoint_every=5, checkpoint_dir=str(disk))
    store = dist.TCPStore("127.0.0.1", sup.store.port, is_master=False,
                          timeout=timedelta(seconds=30))
    ck = Checkpointer(every=5, directory=disk, store=store)
    ck.submit(small, 5)
    ck.wait()
    ck.submit(big, 10)
    ck.wait()
    assert sorted(p.name for p in disk.iterdir()) == ["step-000000005.pt"]
    sup._handle_checkpoint_errors()
    shown = json.loads((sup.run_dir / "status.json").read_text())["checkpoint_error"]
    assert shown["step"] == 10 and shown["failed_writes"] == 1
    assert shown["newest_checkpoint"] == 5 and "cannot write checkpoint" in shown["error"]
    assert sup._latest_ckpt() == (5, disk / "step-000000005.pt")
    assert any("CHECKPOINT WRITE FAILED at step 10" in r.message for r in caplog.records
               if r.name == "yoco.runtime.supervisor")
    # The next good checkpoint clears it.
    ck.submit(small, 15)
    ck.wait()
    sup._handle_checkpoint_errors()
    assert json.loads((sup.run_dir / "status.json").read_text())["checkpoint_error"] is None
