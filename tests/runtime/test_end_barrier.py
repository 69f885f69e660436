"""The end-of-job barrier: no member leaves (tearing down its gloo sockets) while a peer
may still be inside its last step's collective.

Regression: under load, a finished member exited first and a peer still finishing its last
step died with gloo's "Connection closed by peer", so a job whose every step was committed
was called failed (``test_live_migrations_are_bit_identical`` flaked). Here the test plays
the supervisor with its own store, so the order of events is fixed: one rank lingers
before its finished mark (an injected slow teardown) and the other must still be there.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from datetime import timedelta
from pathlib import Path

import pytest
import torch.distributed as dist

from runtime import protocol as P
from runtime.faults import encode_faults, parse_fault
from runtime.sink import JsonlFileSink
from runtime.supervisor import LaunchConfig, launch

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = str(ROOT / "examples" / "mlp_train.py")

pytestmark = pytest.mark.slow


def _start(store: dist.TCPStore, tmp: Path, slot: str, faults: str,
           steps: int) -> subprocess.Popen[bytes]:
    env = {**os.environ, P.ENV_STORE: f"127.0.0.1:{store.port}", P.ENV_SLOT: slot,
           P.ENV_RUN_DIR: str(tmp), P.ENV_DEVICE: "cpu", P.ENV_FAULTS: faults}
    log = (tmp / f"{slot}.log").open("wb")
    return subprocess.Popen([sys.executable, EXAMPLE, "--steps", str(steps)], env=env,
                            stdout=log, stderr=subprocess.STDOUT)


def _two_members(tmp: Path, faults: str, steps: int = 3) -> tuple[
        dist.TCPStore, list[subprocess.Popen[bytes]]]:
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    procs = [_start(store, tmp, slot, faults, steps) for slot in ("w0", "w1")]
    store.wait([P.waiting_key("w0"), P.waiting_key("w1")], timedelta(seconds=120))
    store.set(P.plan_key(0), P.Plan(gen=0, mode=P.PlanMode.START, members=["w0", "w1"]).encode())
    store.set(P.KEY_GEN, "0")
    return store, procs


def _stop(store: dist.TCPStore, procs: list[subprocess.Popen[bytes]]) -> None:
    store.set(P.KEY_SHUTDOWN, "1")
    for p in procs:
        if p.poll() is None:
            p.kill()
            p.wait()


def test_no_member_leaves_before_every_member_has_finished(tmp_path: Path) -> None:
    # w1 (rank 1) waits 4 s after its last step before marking it finished.
    faults = encode_faults([parse_fault("linger:rank=1:step=3:seconds=4")])
    store, procs = _two_members(tmp_path, faults)
    try:
        store.wait([P.finished_key("w0")], timedelta(seconds=120))
        # Without the barrier w0 exits at once here, while w1 is still finishing.
        while not store.check([P.finished_key("w1")]):
            assert procs[0].poll() is None, "w0 left before w1 had finished"
            time.sleep(0.05)
        assert [p.wait(timeout=60) for p in procs] == [0, 0]
        assert store.get(P.KEY_DONE) == b"3"
    finally:
        _stop(store, procs)


def test_the_barrier_ends_when_a_peer_dies_before_its_mark(tmp_path: Path) -> None:
    # w1 lingers for ten minutes, and is killed meanwhile; the supervisor (here: the
    # test) publishes a new generation with a spare in w1's place. w0 must stop waiting
    # and join it (it holds the committed state the spare needs); the new generation has
    # no step left, so it is marked ready at once and both leave, w0 marking the end.
    faults = encode_faults([parse_fault("linger:rank=1:step=3:seconds=600")])
    store, procs = _two_members(tmp_path, faults)
    procs.append(_start(store, tmp_path, "w2", faults, 3))
    try:
        store.wait([P.finished_key("w0"), P.waiting_key("w2")], timedelta(seconds=120))
        # w0 waits for w1's mark: it beats from inside that wait (Membership.await_finished)
        # after its own mark; a w0 that left instead would never beat again.
        finished = time.time()
        deadline = time.monotonic() + 120
        while not (store.check([P.beat_key("w0")])
                   and float(store.get(P.beat_key("w0")).split()[2]) > finished):
            assert procs[0].poll() is None, "w0 left before w1 had finished"
            assert time.monotonic() < deadline, "w0 never beat while waiting for w1's mark"
            time.sleep(0.02)
        assert procs[0].poll() is None  # waiting for w1's mark
        procs[1].send_signal(signal.SIGKILL)
        procs[1].wait(timeout=30)
        store.set(P.plan_key(1), P.Plan(gen=1, mode=P.PlanMode.LIVE, members=["w0", "w2"]).encode())
        store.set(P.KEY_GEN, "1")
        assert procs[0].wait(timeout=60) == 0
        assert procs[2].wait(timeout=60) == 0
        assert "generation 1 was published while finishing: joining it" in \
            (tmp_path / "w0.log").read_text()
        assert json.loads(store.get(P.ready_key(1)))["step"] == 3
        assert store.get(P.KEY_DONE) == b"3"
    finally:
        _stop(store, procs)


def test_a_member_killed_after_the_last_commit_is_not_a_failure(tmp_path: Path) -> None:
    # Under the supervisor: w1 is SIGKILLed while it lingers after the last step (every
    # step committed, w0 already finished). Nothing is lost and nothing is recovered: no
    # failure record, no new generation, and w0 is told not to wait for w1's mark.
    sink = JsonlFileSink(tmp_path / "records.jsonl")
    cfg = LaunchConfig(script=EXAMPLE, args=["--steps", "6", "--out", str(tmp_path / "o.pt")],
                       workers=2, spares=1, job_id="gone", contract_id="c-test",
                       runs_root=str(tmp_path / "runs"), nvml=False,
                       faults=[parse_fault("linger:rank=1:step=6:seconds=600")])
    killer_done = threading.Event()

    def killer() -> None:
        status = tmp_path / "runs" / "gone" / "status.json"
        deadline = time.time() + 180
        while time.time() < deadline:
            if status.exists():
                info = json.loads(status.read_text())
                port = info.get("store_port")
                pids = info.get("pids", {})
                if port and "w1" in pids:
                    client = dist.TCPStore("127.0.0.1", int(port), is_master=False,
                                           timeout=timedelta(seconds=30))
                    if client.check([P.finished_key("w0")]):
                        time.sleep(0.5)
                        os.kill(int(pids["w1"]), signal.SIGKILL)
                        killer_done.set()
                        return
            time.sleep(0.1)

    t = threading.Thread(target=killer, daemon=True)
    t.start()
    result = launch(cfg, sink)
    t.join(timeout=5)
    assert killer_done.is_set()
    recs = sink.read_all()
    assert [r["kind"] for r in recs if r["kind"] != "job_progress"] == [
        "job_started", "job_finished"]
    assert recs[-1]["step"] == 6
    assert result.final_step == 6 and result.exit_code == 0


@pytest.mark.parametrize("guard", [True, False])
def test_a_wait_left_blocked_by_an_abandoned_generation_does_not_abort_the_exit(
        tmp_path: Path, guard: bool) -> None:
    """The mechanism of the abort at the end of a job with migrations: a helper thread
    still blocked in a gloo receive of an abandoned generation, and a peer exiting while
    the interpreter finalizes. Without the exit guard the process dies of SIGABRT (the
    second case shows the mechanism is real); with it, it exits 0."""
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    script = str(Path(__file__).parent / "stuck_wait_worker.py")
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    procs = [subprocess.Popen([sys.executable, script, slot, str(rank), str(store.port),
                               "1" if guard else "0"], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
             for rank, slot in enumerate(("w0", "w1"))]
    try:
        store.set(P.plan_key(0), P.Plan(gen=0, mode=P.PlanMode.START,
                                        members=["w0", "w1"]).encode())
        store.set(P.KEY_GEN, "0")
        store.wait(["posted", "formed0"], timedelta(seconds=120))
        store.set(P.plan_key(1), P.Plan(gen=1, mode=P.PlanMode.START, members=["w1"]).encode())
        store.set(P.KEY_GEN, "1")
        rc = procs[1].wait(timeout=120)
        out = procs[1].stdout.read().decode() if procs[1].stdout else ""
        assert "abandoned" in out
        if guard:
            assert rc == 0, out
            assert "still pending: leaving without the interpreter's teardown" in out
        else:
            assert rc == -signal.SIGABRT, out
        assert procs[0].wait(timeout=60) == 0, procs[0].stdout.read().decode() \
            if procs[0].stdout else ""
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
