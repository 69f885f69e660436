"""Faults recorded truthfully: real worker processes on gloo/CPU, real signals,
a sink that refuses or is down. Each incident: exactly one failure, one outcome, the true
lost steps."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from runtime.faults import parse_fault
from runtime.sink import JsonlFileSink
from runtime.supervisor import LaunchConfig, launch
from tests.runtime.test_migration import EXAMPLE, ROOT, _failures

pytestmark = pytest.mark.slow

HERE = Path(__file__).parent


def _config(tmp: Path, name: str, *, steps: int, workers: int = 2, spares: int = 1,
            sleep: float = 0.1, faults: tuple[str, ...] = (), **kw: Any) -> LaunchConfig:
    return LaunchConfig(script=EXAMPLE, args=["--steps", str(steps), "--out",
                                              str(tmp / f"{name}.pt"), "--step-sleep",
                                              str(sleep)],
                        workers=workers, spares=spares, job_id=name, contract_id="c-test",
                        runs_root=str(tmp / "runs"), nvml=False,
                        faults=[parse_fault(f) for f in faults],
                        **{"progress_interval_s": 0.5, **kw})


def _when_step(run_dir: Path, step: int, action: Any, timeout: float = 180) -> threading.Thread:
    """Run ``action()`` on a thread once the job's status reports ``step``."""

    def watch() -> None:
        deadline = time.time() + timeout
        while time.time() < deadline:
            try:
                if json.loads((run_dir / "status.json").read_text())["step"] >= step:
                    action()
                    return
            except (OSError, ValueError, KeyError):
                pass
            time.sleep(0.05)

    t = threading.Thread(target=watch, daemon=True)
    t.start()
    return t


def _one_outcome_each(recs: list[dict[str, Any]]) -> None:
    fails = [r["event_id"] for r in recs if r["kind"] == "failure"]
    outs = [r["failure_event_id"] for r in recs if r["kind"] == "outcome"]
    assert sorted(fails) == sorted(outs), (fails, outs)


def test_telemetry_signals_are_checked_at_the_door(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A signal exactly as the docs show it (no detail) moves the job; a cause in another
    spelling is normalised; junk, unknown workers and unusable causes are refused with a
    log line; nothing crashes the supervisor."""
    signals = tmp_path / "signals.jsonl"
    cfg = _config(tmp_path, "tel", steps=40, sleep=0.15, signal_file=str(signals))
    lines = ['{"worker":"w1","cause":"ecc_rising"}', "not json at all", "[1, 2]",
             '{"worker":"w9","cause":"thermal"}', '{"worker":"w0","cause":"--"}',
             '{"gpu":"zero","metric":"ecc_corrected","value":1}',
             '{"metric":"temperature_c","value":"hot"}',
             '{"worker":"w0","cause":"NVLink-Down"}']

    def write() -> None:
        with signals.open("a") as fh:
            fh.write("\n".join(lines) + "\n")

    _when_step(tmp_path / "runs" / "tel", 3, write)
    sink = JsonlFileSink(tmp_path / "tel.records.jsonl")
    with caplog.at_level(logging.WARNING):
        result = launch(cfg, sink)
    assert result.exit_code == 0, result
    assert result.delivered
    recs = sink.read_all()
    assert _failures(recs) == [("preemptive", "ecc_rising", "live_migrated", 0),
                               ("preemptive", "nvlink_down", "live_migrated", 0)]
    _one_outcome_each(recs)
    fails = [r for r in recs if r["kind"] == "failure"]
    assert fails[0]["detail"]  # a default detail, never an empty string
    text = "\n".join(caplog.messages)
    assert "not a member of this job" in text  # w9
    assert "refused" in text  # the cause "--"
    assert "normalised to 'nvlink_down'" in text
    assert "malformed telemetry line" in text


def test_merged_deaths_are_one_failure_naming_every_worker(tmp_path: Path) -> None:
    # Two workers die in the same step (within the merge window): one incident -- one
    # failure naming both, one outcome, one recovery.
    cfg = _config(tmp_path, "two", steps=20, workers=3, spares=2,
                  faults=("kill:rank=0:step=5", "kill:rank=1:step=5"), checkpoint_every=0)
    sink = JsonlFileSink(tmp_path / "two.records.jsonl")
    result = launch(cfg, sink)
    assert result.exit_code == 0, result
    recs = sink.read_all()
    assert _failures(recs) == [("unplanned", "process_killed", "live_migrated", 0)]
    _one_outcome_each(recs)
    [fail] = [r for r in recs if r["kind"] == "failure"]
    assert "w0 exit -9" in fail["detail"] and "w1 exit -9" in fail["detail"], fail
    assert len(result.recoveries) == 1
    assert not (tmp_path / "runs" / "two" / "outbox" / "drafts.json").exists()


def test_a_script_failing_after_its_loop_exits_1_and_says_every_step_is_committed(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    # Every rank's save after the loop fails (its folder does not exist): the job's steps
    # are all committed and recorded as finished, no failure is recorded (none happened
    # to the training), and the exit status 1 comes with the line that says why.
    cfg = _config(tmp_path, "after", steps=6, sleep=0.0, checkpoint_every=0)
    cfg.args[cfg.args.index("--out") + 1] = str(tmp_path / "no-such-folder" / "out.pt")
    sink = JsonlFileSink(tmp_path / "after.records.jsonl")
    with caplog.at_level(logging.ERROR, logger="yoco.runtime.supervisor"):
        result = launch(cfg, sink)
    assert result.exit_code == 1, result
    recs = sink.read_all()
    assert not [r for r in recs if r["kind"] in ("failure", "outcome")], recs
    assert recs[-1]["kind"] == "job_finished" and recs[-1]["step"] == 6
    assert "job after committed every step (6), but w0 exited 1 after the end" \
        in caplog.text, caplog.text


def test_a_death_after_the_recovery_was_ready_is_a_failure_of_its_own(tmp_path: Path
                                                                     ) -> None:
    """w1 killed at step 5; the new generation forms and trains on; w0 killed at step 8,
    ~0.3 s later, before the supervisor has read that the new generation was ready (its
    store poll here every 2 s, as a supervisor descheduled on a loaded machine is late;
    deaths it sees at once). Two failures, each live: the second is not folded into the
    first (once "w1, w0 at step 5", rolled back: the record named a death 3 steps before it
    happened and gave a live recovery the outcome of the next)."""
    cfg = _config(tmp_path, "after", steps=20, spares=2, sleep=0.1, checkpoint_every=0,
                  faults=("kill:rank=1:step=5", "kill:rank=0:step=8"),
                  store_poll_interval_s=2.0)
    sink = JsonlFileSink(tmp_path / "after.records.jsonl")
    result = launch(cfg, sink)
    assert result.exit_code == 0, result
    recs = sink.read_all()
    _one_outcome_each(recs)
    assert _failures(recs) == [("unplanned", "process_killed", "live_migrated", 0)] * 2
    first, second = [r for r in recs if r["kind"] == "failure"]
    # Each at the step its kill hit, or the next one if the survivor's commit of it was
    # read first (as everywhere: the step committed when the death was seen).
    assert first["step"] in (5, 6) and first["detail"] == "w1 exit -9", first
    assert second["step"] in (8, 9) and second["detail"].startswith("w0 exit -9"), second
    assert recs[-1]["kind"] == "job_finished" and recs[-1]["step"] == 20


def _yoco_run(tmp: Path, name: str, sink_args: list[str], *extra: str
              ) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": f"{ROOT}:{HERE}"}
    cmd = [sys.executable, "-m", "yoco.cli_runtime", "run", "--workers", "1", "--spares",
           "0", "--cold-spares", "--no-nvml", "--job-id", name, "--runs-root",
           str(tmp / "runs"), "--progress-every", "0.2", "--sink", "flaky_sink:FlakySink",
           *[a for kv in sink_args for a in ("--sink-arg", kv)], *extra,
           EXAMPLE, "--steps", "8", "--step-sleep", "0.05"]
    return subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True,
                          timeout=300, check=False)


def test_yoco_run_exit_status_says_which_records_are_refused(tmp_path: Path) -> None:
    ledger = tmp_path / "ledger.jsonl"
    proc = _yoco_run(tmp_path, "refused", [f"path={ledger}", f"down_flag={tmp_path}/none",
                                           "refuse_kinds=job_started"])
    assert proc.returncode == 3, proc.stderr
    outbox = [json.loads(ln) for ln in
              (tmp_path / "runs" / "refused" / "outbox" / "records.jsonl").read_text()
              .splitlines()]
    started = next(r for r in outbox if r["kind"] == "job_started")
    assert f"refused by the sink (dead letter): job_started {started['event_id']}" \
        in proc.stderr
    assert "DEAD LETTER" in proc.stderr and "sink unreachable" not in proc.stderr
    stored = JsonlFileSink(ledger).read_all()
    assert stored[-1]["kind"] == "job_finished"  # later records kept flowing
    assert len(stored) == len(outbox) - 1


def test_yoco_run_exit_status_says_which_records_are_pending(tmp_path: Path) -> None:
    down = tmp_path / "down"
    down.touch()
    proc = _yoco_run(tmp_path, "pending", [f"path={tmp_path}/ledger.jsonl",
                                           f"down_flag={down}"], "--deliver-timeout", "1")
    assert proc.returncode == 3, proc.stderr
    assert "pending (sink unreachable: SinkError: ledger unavailable): job_finished" \
        in proc.stderr
    assert "dead letter" not in proc.stderr.split("not delivered")[1].split("deliver pending")[0]
    down.unlink()
    env = {**os.environ, "PYTHONPATH": f"{ROOT}:{HERE}"}
    again = subprocess.run(
        [sys.executable, "-m", "yoco.cli_runtime", "outbox", "deliver", "pending",
         "--runs-root", str(tmp_path / "runs"), "--sink", "flaky_sink:FlakySink",
         "--sink-arg", f"path={tmp_path}/ledger.jsonl", "--sink-arg", f"down_flag={down}"],
        env=env, cwd=ROOT, capture_output=True, text=True, timeout=120, check=False)
    assert again.returncode == 0, again.stderr
    assert JsonlFileSink(tmp_path / "ledger.jsonl").read_all()[-1]["kind"] == "job_finished"


def _stop_rank1(run_dir: Path, stopped: list[int]) -> Any:
    def stop() -> None:
        pid = json.loads((run_dir / "status.json").read_text())["pids"]["w1"]
        os.kill(pid, signal.SIGSTOP)
        stopped.append(pid)
    return stop


@pytest.mark.parametrize("how", ["watchdog", "collective_timeout"])
def test_a_stopped_worker_is_fenced_as_hung_and_replaced(tmp_path: Path, how: str) -> None:
    """SIGSTOP one worker mid-training. The step watchdog (or, with the watchdog out of
    reach, the healthy rank's collective timeout) finds the rank that stopped beating and
    fences *it*: one ``hang`` failure, live migration, no lost step; the healthy rank that
    reported the timeout is not blamed."""
    # The stopped-rank watchdog (test_hang.py) is off here: these are the paths for a
    # hang /proc cannot confirm (a deadlock, a rank stuck in a kernel).
    kw: dict[str, Any] = ({"hang_floor_s": 3.0} if how == "watchdog"
                          else {"hang_floor_s": 600.0, "collective_timeout_s": 4.0})
    kw["hang_stopped_factor"] = 0.0
    cfg = _config(tmp_path, how, steps=30, sleep=0.1, **kw)
    stopped: list[int] = []
    _when_step(tmp_path / "runs" / how, 5, _stop_rank1(tmp_path / "runs" / how, stopped))
    sink = JsonlFileSink(tmp_path / f"{how}.records.jsonl")
    try:
        result = launch(cfg, sink)
    finally:
        for pid in stopped:  # never leave a stopped process behind
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    assert stopped and result.exit_code == 0, result
    recs = sink.read_all()
    assert _failures(recs) == [("unplanned", "hang", "live_migrated", 0)]
    _one_outcome_each(recs)
    [fail] = [r for r in recs if r["kind"] == "failure"]
    assert fail["detail"].startswith("w1 hung"), fail
    # Dated when progress stopped: the stall before the fence counts as recovery time.
    [out] = [r for r in recs if r["kind"] == "outcome"]
    assert out["recovery_seconds"] >= 3.0
    assert recs[-1]["kind"] == "job_finished" and recs[-1]["step"] == 30


# ----------------------------------------------------------------- supervisor loss
_SUPERVISOR = """
import json, sys
sys.path[:0] = {paths!r}
from runtime.supervisor import LaunchConfig, launch
from runtime.faults import parse_fault
from runtime.sink import SinkSpec
kw = json.loads({kw!r})
kw['faults'] = [parse_fault(f) for f in kw.get('faults', [])]
kw['sink'] = SinkSpec(target='flaky_sink:FlakySink', kwargs=kw.pop('sink_kwargs'))
sys.exit(launch(LaunchConfig(**kw)).exit_code)
"""


def _supervisor(tmp: Path, name: str, *, steps: int, resume: bool, down: Path,
                **kw: Any) -> subprocess.Popen[bytes]:
    args = {"script": EXAMPLE, "args": ["--steps", str(steps), "--step-sleep", "0.1"],
            "workers": 2, "spares": 1, "job_id": name, "contract_id": "c-test",
            "runs_root": str(tmp / "runs"), "nvml": False, "progress_interval_s": 0.3,
            "resume": resume, "deliver_timeout_s": 5.0,
            "sink_kwargs": {"path": str(tmp / "ledger.jsonl"), "down_flag": str(down)}, **kw}
    code = _SUPERVISOR.format(paths=[str(ROOT), str(HERE)], kw=json.dumps(args))
    return subprocess.Popen([sys.executable, "-c", code], cwd=ROOT)


def _outbox(tmp: Path, name: str) -> list[dict[str, Any]]:
    path = tmp / "runs" / name / "outbox" / "records.jsonl"
    return [json.loads(ln) for ln in path.read_text().splitlines()] if path.exists() else []


def _kill_supervisor_when(proc: subprocess.Popen[bytes], tmp: Path, name: str,
                          ready: Any) -> tuple[int, int | None, float]:
    """SIGKILL the supervisor once ``ready(status, outbox)``; return (committed step,
    newest checkpoint step, kill time) as they are once its workers are gone."""
    run_dir = tmp / "runs" / name
    deadline = time.time() + 240
    while time.time() < deadline:
        try:
            status = json.loads((run_dir / "status.json").read_text())
        except (OSError, ValueError):
            status = {}
        if status and ready(status, _outbox(tmp, name)):
            break
        time.sleep(0.05)
    else:
        proc.kill()
        pytest.fail("the supervisor never reached the point to kill it")
    proc.send_signal(signal.SIGKILL)
    killed = time.time()
    proc.wait()
    # Its workers die with it (parent-death signal): wait until they are gone.
    for _ in range(200):
        if not any(Path(f"/proc/{pid}").exists() and
                   Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] != "Z"
                   for pid in status.get("pids", {}).values()):
            break
        time.sleep(0.05)
    committed = int((run_dir / "committed").read_text().split()[0])
    ckpts = sorted((run_dir / "checkpoints").glob("step-*.pt"))
    return committed, int(ckpts[-1].stem.split("-")[1]) if ckpts else None, killed


def test_supervisor_loss_records_the_true_lost_steps_and_closes_open_failures(
        tmp_path: Path) -> None:
    """SIGKILL the supervisor while a worker's failure is still recovering (a cold
    replacement, no spare): the resume records the loss with the committed step minus
    the checkpoint's, counts the dead supervisor's time, and gives the open failure its
    outcome. Then a `--resume` of the finished job only delivers what is pending."""
    down = tmp_path / "down"
    first = _supervisor(tmp_path, "sl", steps=40, resume=False, down=down, spares=0,
                        checkpoint_every=5, faults=["kill:rank=1:step=12"],
                        fork_spares=False)

    def recovering(status: dict[str, Any], recs: list[dict[str, Any]]) -> bool:
        fails = {r["event_id"] for r in recs if r["kind"] == "failure"}
        return bool(fails - {r["failure_event_id"] for r in recs if r["kind"] == "outcome"})

    committed, ck_step, _ = _kill_supervisor_when(first, tmp_path, "sl", recovering)
    assert ck_step is not None
    time.sleep(2.0)  # the supervisor stays dead for a while
    down.touch()  # the ledger is down while the job resumes: records stay pending
    second = _supervisor(tmp_path, "sl", steps=40, resume=True, down=down,
                         checkpoint_every=5)
    assert second.wait(timeout=300) == 0
    recs = _outbox(tmp_path, "sl")
    _one_outcome_each(recs)
    outcomes = {r["failure_event_id"]: r for r in recs if r["kind"] == "outcome"}
    fails = [r for r in recs if r["kind"] == "failure"]
    assert [f["cause"] for f in fails] == ["process_killed", "supervisor_lost"]
    lost = outcomes[fails[1]["event_id"]]
    assert lost["outcome"] == "rolled_back"
    assert lost["lost_steps"] == committed - ck_step
    assert lost["recovery_seconds"] >= 2.0  # the dead supervisor's time counts
    assert fails[1]["step"] == committed
    # The failure the dead supervisor left open is closed by the same rollback.
    assert outcomes[fails[0]["event_id"]]["outcome"] == "rolled_back"
    assert recs[-1]["kind"] == "job_finished" and recs[-1]["step"] == 40
    # Resuming the finished job: no worker starts, nothing new is recorded, the pending
    # records are delivered exactly once.
    logs_before = sorted(p.name for p in (tmp_path / "runs" / "sl" / "logs").iterdir())
    down.unlink()
    third = _supervisor(tmp_path, "sl", steps=40, resume=True, down=down)
    assert third.wait(timeout=120) == 0
    assert _outbox(tmp_path, "sl") == recs
    assert sorted(p.name for p in (tmp_path / "runs" / "sl" / "logs").iterdir()) == logs_before
    stored = [r["event_id"] for r in JsonlFileSink(tmp_path / "ledger.jsonl").read_all()]
    assert sorted(stored) == sorted(r["event_id"] for r in recs)


def test_supervisor_loss_without_checkpoint_records_every_step_lost(tmp_path: Path) -> None:
    down = tmp_path / "down"
    first = _supervisor(tmp_path, "nock", steps=30, resume=False, down=down,
                        checkpoint_every=0)
    committed, ck_step, _ = _kill_supervisor_when(
        first, tmp_path, "nock", lambda status, recs: status.get("step", 0) >= 8)
    assert ck_step is None and committed >= 8
    second = _supervisor(tmp_path, "nock", steps=30, resume=True, down=down)
    assert second.wait(timeout=300) == 0
    recs = _outbox(tmp_path, "nock")
    _one_outcome_each(recs)
    [fail] = [r for r in recs if r["kind"] == "failure"]
    [out] = [r for r in recs if r["kind"] == "outcome"]
    assert fail["cause"] == "supervisor_lost" and "no checkpoint" in fail["detail"]
    assert (out["outcome"], out["lost_steps"]) == ("rolled_back", committed)
    assert recs[-1]["kind"] == "job_finished" and recs[-1]["step"] == 30


def test_drain_without_a_spare_is_refused_and_changes_nothing(tmp_path: Path) -> None:
    cfg = _config(tmp_path, "nospare", steps=150, spares=0)
    answer: list[subprocess.CompletedProcess[str]] = []

    def drain() -> None:
        answer.append(subprocess.run(
            [sys.executable, "-m", "yoco.cli_runtime", "drain", "nospare", "w1",
             "--runs-root", str(tmp_path / "runs")],
            env={**os.environ, "PYTHONPATH": str(ROOT)}, cwd=ROOT, capture_output=True,
            text=True, timeout=120, check=False))

    watcher = _when_step(tmp_path / "runs" / "nospare", 4, drain)
    sink = JsonlFileSink(tmp_path / "nospare.records.jsonl")
    result = launch(cfg, sink)
    watcher.join(timeout=120)
    assert result.exit_code == 0, result
    [proc] = answer
    assert proc.returncode == 2 and "no spare" in proc.stderr, proc
    assert not list((tmp_path / "runs" / "nospare" / "control").glob("drain-*"))
    assert [r["kind"] for r in sink.read_all() if r["kind"] in ("failure", "outcome")] == []


def test_a_second_death_during_a_recovery_replans_with_a_new_spare(tmp_path: Path) -> None:
    """One spare. Worker w1 is killed; the spare called in for it (w2) is killed the moment
    it appears among the members, during the recovery. w0 still holds the state, so the
    supervisor starts a new spare and migrates again: no rollback, no failed job."""
    run_dir = tmp_path / "runs" / "second"
    cfg = _config(tmp_path, "second", steps=30, spares=1, sleep=0.1, checkpoint_every=0,
                  faults=("kill:rank=1:step=5",))
    killed: list[int] = []

    def kill_replacement() -> None:
        deadline = time.time() + 180
        while time.time() < deadline:
            try:
                status = json.loads((run_dir / "status.json").read_text())
            except (OSError, ValueError):
                time.sleep(0.002)
                continue
            if "w2" in status.get("members", []):
                os.kill(status["pids"]["w2"], signal.SIGKILL)
                killed.append(status["gen"])
                return
            time.sleep(0.002)

    threading.Thread(target=kill_replacement, daemon=True).start()
    sink = JsonlFileSink(tmp_path / "second.records.jsonl")
    result = launch(cfg, sink)
    assert killed and result.exit_code == 0, result
    recs = sink.read_all()
    _one_outcome_each(recs)
    got = _failures(recs)
    assert got and all(g[2:] == ("live_migrated", 0) for g in got), got
    details = " ".join(r.get("detail", "") for r in recs if r["kind"] == "failure")
    assert "w1 exit -9" in details and "w2 exit -9" in details
    assert recs[-1]["kind"] == "job_finished" and recs[-1]["step"] == 30


# ----------------------------------------------------------------- the outbox's disk
@pytest.fixture
def small_disk(tmp_path: Path) -> Any:
    """Mount a tmpfs of a given size at a folder; unmounted afterwards."""
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root")
    mounted: list[Path] = []

    def mount(where: Path, size: str) -> Path:
        where.mkdir(parents=True, exist_ok=True)
        subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)],
                       check=True)
        mounted.append(where)
        return where

    yield mount
    for where in mounted:
        subprocess.run(["umount", "-l", str(where)], check=False)


def _fill(disk: Path, name: str) -> None:
    with contextlib.suppress(OSError), (disk / name).open("wb") as fh:
        while True:
            fh.write(b"\0" * 4096)
            fh.flush()
            os.fsync(fh.fileno())


def test_an_outbox_that_cannot_reserve_its_space_does_not_start(
        tmp_path: Path, small_disk: Any) -> None:
    from runtime.errors import OutboxError

    small_disk(tmp_path / "runs" / "tiny" / "outbox", "64k")
    cfg = _config(tmp_path, "tiny", steps=5, outbox_reserve_bytes=1 << 20)
    with pytest.raises(OutboxError, match="cannot reserve 1048576 bytes"):
        launch(cfg, JsonlFileSink(tmp_path / "tiny.records.jsonl"))
    assert not (tmp_path / "runs" / "tiny" / "logs" / "w0.log").exists()


def test_a_full_outbox_disk_keeps_records_in_memory_and_loses_none(
        tmp_path: Path, small_disk: Any, caplog: pytest.LogCaptureFixture) -> None:
    disk = small_disk(tmp_path / "runs" / "full" / "outbox", "512k")
    cfg = _config(tmp_path, "full", steps=40, sleep=0.1, outbox_reserve_bytes=128 << 10,
                  faults=("kill:rank=1:step=20",), progress_interval_s=0.05)
    run_dir = tmp_path / "runs" / "full"

    def fill_twice() -> None:
        _fill(disk, "filler1")  # the outbox releases its reserve and keeps writing
        deadline = time.time() + 120
        while (disk / "reserve").exists() and time.time() < deadline:
            time.sleep(0.05)
        _fill(disk, "filler2")  # now really full: records stay in memory

    # Room is made once the outbox has said it keeps records in memory (not at a fixed
    # step: on a loaded machine the job once reached that step before the disk was full
    # again, and nothing was ever held in memory).
    held = threading.Event()

    class _Held(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if "records are kept in memory" in record.getMessage():
                held.set()

    def make_room() -> None:
        held.wait(120)
        for name in ("filler1", "filler2"):
            (disk / name).unlink(missing_ok=True)

    _when_step(run_dir, 4, fill_twice)
    threading.Thread(target=make_room, daemon=True).start()
    sink = JsonlFileSink(tmp_path / "full.records.jsonl")
    watcher = _Held()
    logging.getLogger("yoco.runtime.outbox").addHandler(watcher)
    try:
        with caplog.at_level(logging.WARNING, logger="yoco.runtime.outbox"):
            result = launch(cfg, sink)
    finally:
        logging.getLogger("yoco.runtime.outbox").removeHandler(watcher)
    assert result.exit_code == 0 and result.delivered, result
    text = "\n".join(caplog.messages)
    assert "released the outbox's 131072-byte reserve" in text
    assert "records are kept in memory" in text and "writable again" in text
    stored = sink.read_all()
    assert _failures(stored) == [("unplanned", "process_killed", "live_migrated", 0)]
    _one_outcome_each(stored)
    on_disk = [r["event_id"] for r in _outbox(tmp_path, "full")]
    assert len(on_disk) == len(set(on_disk))
    assert sorted(on_disk) == sorted(r["event_id"] for r in stored)  # nothing lost


def test_a_read_only_outbox_disk_still_delivers_every_record(
        tmp_path: Path, small_disk: Any) -> None:
    disk = small_disk(tmp_path / "runs" / "ro" / "outbox", "4m")
    cfg = _config(tmp_path, "ro", steps=30, sleep=0.1, faults=("kill:rank=1:step=15",))
    _when_step(tmp_path / "runs" / "ro", 4, lambda: subprocess.run(
        ["mount", "-o", "remount,ro", str(disk)], check=True))
    sink = JsonlFileSink(tmp_path / "ro.records.jsonl")
    result = launch(cfg, sink)
    assert result.exit_code == 0, result
    assert result.outbox_error and "Read-only" in result.outbox_error
    assert result.rescued is None  # the sink took every record the disk refused
    assert any("could not be written" in ln for ln in result.delivery_report())
    stored = sink.read_all()
    assert _failures(stored) == [("unplanned", "process_killed", "live_migrated", 0)]
    _one_outcome_each(stored)
    assert stored[-1]["kind"] == "job_finished" and stored[-1]["step"] == 30


def test_a_supervisor_error_stops_the_workers_and_records_the_end(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Anything the supervisor cannot handle: the workers are killed at once (never left
    training unsupervised) and the end is recorded -- one failure, outcome failed."""
    from runtime.supervisor import Supervisor

    real = Supervisor._handle_progress
    procs: list[Any] = []

    def broken(self: Supervisor) -> None:
        real(self)
        if self.last_step >= 5:
            procs.extend(self.pool.procs.values())
            raise RuntimeError("simulated supervisor bug")

    monkeypatch.setattr(Supervisor, "_handle_progress", broken)
    cfg = _config(tmp_path, "bug", steps=200, sleep=0.05)
    sink = JsonlFileSink(tmp_path / "bug.records.jsonl")
    result = launch(cfg, sink)
    assert result.exit_code == 1
    assert procs and all(p.poll() == -signal.SIGKILL for p in procs)
    recs = sink.read_all()
    assert _failures(recs) == [("unplanned", "supervisor_error", "failed", result.final_step)]
    [fail] = [r for r in recs if r["kind"] == "failure"]
    assert "simulated supervisor bug" in fail["detail"]
    assert recs[-1]["kind"] == "job_finished"
    committed = int((tmp_path / "runs" / "bug" / "committed").read_text().split()[0])
    assert committed < 200  # stopped, not trained on to the end


def test_a_drain_waiting_for_a_spare_is_visible_and_dated_when_requested(
        tmp_path: Path) -> None:
    """One spare, replaced by a cold process (seconds): a second drain filed right after
    the first waits for it, status.json lists it meanwhile, and its failure record is
    dated when it was requested, not when it was served."""
    from runtime.control import drain

    run_dir = tmp_path / "runs" / "queued"
    cfg = _config(tmp_path, "queued", steps=120, sleep=0.1, fork_spares=False)
    seen: list[dict[str, Any]] = []

    def drain_both() -> None:
        drain("queued", "w0", runs_root=tmp_path / "runs")
        deadline = time.time() + 120
        while time.time() < deadline:  # the first move under way: the spare is used
            status = json.loads((run_dir / "status.json").read_text())
            if "w2" in status["members"]:
                break
            time.sleep(0.01)
        drain("queued", "w1", runs_root=tmp_path / "runs")
        while time.time() < deadline:
            status = json.loads((run_dir / "status.json").read_text())
            if status["moves_pending"]:
                seen.append(status)
                return
            time.sleep(0.01)

    _when_step(run_dir, 4, drain_both)
    sink = JsonlFileSink(tmp_path / "queued.records.jsonl")
    result = launch(cfg, sink)
    assert result.exit_code == 0, result
    assert seen and seen[0]["moves_pending"][0]["worker"] == "w1"
    assert seen[0]["moves_pending"][0]["class"] == "planned"
    recs = sink.read_all()
    assert _failures(recs) == [("planned", "maintenance", "live_migrated", 0)] * 2
    _one_outcome_each(recs)
    fails = [r for r in recs if r["kind"] == "failure"]
    first_outcome = next(r for r in recs if r["kind"] == "outcome")
    # Requested while the first move was still under way, served after it.
    requested = datetime.fromisoformat(fails[1]["occurred_at"])
    assert requested < datetime.fromisoformat(first_outcome["occurred_at"])
