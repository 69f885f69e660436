"""A rank whose collectives keep raising is the one fenced (``collective_error``), not its
healthy peers busy with their forward/backward pass at that moment.

Regression: the supervisor blamed any peer silent for 0.5 s after a report. Steady
training writes no heartbeat, so a peer computing a step longer than that was fenced as
``hang`` each time the same rank raised, while the raising rank stayed: the error was never
escalated to its source, and a healthy rank's failure was recorded under a false cause.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from runtime.faults import parse_fault
from runtime.sink import JsonlFileSink
from runtime.supervisor import LaunchConfig, launch
from tests.runtime.test_migration import EXAMPLE

pytestmark = pytest.mark.slow


def test_a_rank_whose_collectives_keep_raising_is_fenced_not_its_busy_peers(
        tmp_path: Path) -> None:
    # Steps of ~0.8 s (the body sleeps): when rank 1's collective raises, rank 0 has
    # committed that step (rank 1's gradient was in) and is busy in the next body.
    sink = JsonlFileSink(tmp_path / "records.jsonl")
    cfg = LaunchConfig(script=EXAMPLE, args=["--steps", "8", "--step-sleep", "0.8"],
                       workers=2, spares=2, job_id="flaky", contract_id="c-test",
                       runs_root=str(tmp_path / "runs"), nvml=False,
                       faults=[parse_fault("raise:rank=1:step=2"),
                               parse_fault("raise:rank=1:step=4")])
    result = launch(cfg, sink)
    assert result.exit_code == 0, result
    recs = sink.read_all()
    fails = [r for r in recs if r["kind"] == "failure"]
    outs = {r["failure_event_id"]: r for r in recs if r["kind"] == "outcome"}
    # Each time the raising rank (rank 1: w1, then the spare that took its place) is
    # fenced itself, never rank 0.
    assert [(f["cause"], f["step"] in (2, 3, 4, 5)) for f in fails] == [
        ("collective_error", True)] * 2, fails
    assert all("injected collective error" in f["detail"] for f in fails), fails
    assert sorted(outs) == sorted(f["event_id"] for f in fails)
    assert [(outs[f["event_id"]]["outcome"], outs[f["event_id"]]["lost_steps"])
            for f in fails] == [("live_migrated", 0)] * 2
    assert recs[-1]["kind"] == "job_finished" and recs[-1]["step"] == 8
