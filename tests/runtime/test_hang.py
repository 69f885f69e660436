"""The stopped-rank watchdog on one host: a worker that ``/proc`` shows stopped while its
peers wait is fenced after a few steady steps (cause ``hang``); a worker that is merely
slow -- asleep for many steady steps, far past that deadline -- is not. Real processes,
a real SIGSTOP."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import re
import signal
from pathlib import Path

import pytest

from runtime.faults import parse_fault
from runtime.sink import JsonlFileSink
from runtime.supervisor import LaunchConfig, launch
from tests.runtime.conftest import Reference
from tests.runtime.test_faults_recorded import _one_outcome_each, _stop_rank1, _when_step
from tests.runtime.test_migration import EXAMPLE, _assert_identical, _failures

pytestmark = pytest.mark.slow

STEPS = 30


def _config(tmp: Path, name: str, faults: tuple[str, ...] = ()) -> LaunchConfig:
    return LaunchConfig(script=EXAMPLE, args=["--steps", str(STEPS), "--out",
                                              str(tmp / f"{name}.pt"), "--step-sleep", "0.1"],
                        workers=2, spares=1, job_id=name,
                        contract_id="c-test", runs_root=str(tmp / "runs"), nvml=False,
                        faults=[parse_fault(f) for f in faults], progress_interval_s=0.5)


def test_a_slow_step_is_not_fenced_and_a_stopped_worker_is(
        tmp_path: Path, failure_free: Reference) -> None:
    ref = failure_free(EXAMPLE, ["--steps", str(STEPS)], workers=2)
    # w1 sleeps 1.5 s in step 6: ~10 steady steps (0.1 s sleep + compute), five times
    # the stopped deadline max(0.25 s, 3 steps), but asleep, not stopped: not fenced.
    # At step 12 it is SIGSTOPped: fenced as hung (its replacement gets the state from w0).
    cfg = _config(tmp_path, "hang", faults=("slow:rank=1:step=6:seconds=1.5",))
    stopped: list[int] = []
    _when_step(tmp_path / "runs" / "hang", 12, _stop_rank1(tmp_path / "runs" / "hang", stopped))
    sink = JsonlFileSink(tmp_path / "hang.records.jsonl")
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
    assert fail["detail"].startswith("w1 hung") and "stopped (state T in /proc)" in fail["detail"]
    assert fail["step"] >= 12  # the slow step (6) was no incident
    assert recs[-1]["kind"] == "job_finished" and recs[-1]["step"] == STEPS
    _assert_identical(ref, tmp_path / "hang.pt", steps=STEPS)


ADAPTED_STEPS = 60  # the deadline adapts after 32 steps seen past a 2-step warm-up


def test_a_hang_proc_cannot_see_is_fenced_on_the_adaptive_deadline(
        tmp_path: Path, failure_free: Reference) -> None:
    """The stopped-rank check off (a deadlock or a busy loop looks like this): w1 is
    SIGSTOPped once the step deadline has adapted to the steady step; the step watchdog
    fences it on that deadline (its failure says which: under the 3 s startup one), and
    the spare takes over with the state of w0 -- bit-identical, nothing lost, and no
    healthy rank fenced before."""
    ref = failure_free(EXAMPLE, ["--steps", str(ADAPTED_STEPS)], workers=2)
    cfg = dataclasses.replace(
        _config(tmp_path, "adaptive"), hang_stopped_factor=0.0,
        args=["--steps", str(ADAPTED_STEPS), "--out", str(tmp_path / "adaptive.pt"),
              "--step-sleep", "0.1"])
    stopped: list[int] = []
    run_dir = tmp_path / "runs" / "adaptive"
    _when_step(run_dir, 42, _stop_rank1(run_dir, stopped))
    sink = JsonlFileSink(tmp_path / "adaptive.records.jsonl")
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
    assert fail["detail"].startswith("w1 hung") and "peers were waiting" in fail["detail"]
    deadline = float(re.search(r"deadline (\d+\.\d+) s", fail["detail"])[1])  # type: ignore[index]
    assert deadline < cfg.hang_startup_s  # adapted: max(floor, 2 x the longest step)
    assert fail["step"] >= 42
    assert recs[-1]["kind"] == "job_finished" and recs[-1]["step"] == ADAPTED_STEPS
    _assert_identical(ref, tmp_path / "adaptive.pt", steps=ADAPTED_STEPS)
