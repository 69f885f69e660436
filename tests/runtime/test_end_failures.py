"""Failures at the very end of a job: a rank dies in the job's last step, after its peer's
allreduce already had its gradient (the peer commits the last step), but before any member
has marked its loop finished. The supervisor sees a failure and publishes a recovery; the
job's last commit happens while that recovery is still open. Every failure must still get
exactly one outcome with the true lost steps, and the final state must be the one a
failure-free run ends with.

Regression: the survivor left at once (its end-of-job barrier ended on the new
generation), rank 0 marked the job done, and the open recovery's failure got no outcome
(when rank 0 itself died, nobody marked the job done at all).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from runtime.faults import parse_fault
from runtime.sink import JsonlFileSink
from runtime.state import split_state
from runtime.supervisor import LaunchConfig, launch
from tests.runtime.conftest import Reference
from tests.runtime.test_migration import EXAMPLE

pytestmark = pytest.mark.slow

STEPS = 6


def _run(tmp: Path, name: str, faults: list[str], spares: int = 1) -> tuple[
        Any, list[dict[str, Any]], Path]:
    out = tmp / f"{name}.pt"
    sink = JsonlFileSink(tmp / f"{name}.records.jsonl")
    cfg = LaunchConfig(script=EXAMPLE, args=["--steps", str(STEPS), "--out", str(out)],
                       workers=2, spares=spares, job_id=name, contract_id="c-test",
                       runs_root=str(tmp / "runs"), nvml=False, checkpoint_every=2,
                       faults=[parse_fault(f) for f in faults], finish_timeout_s=60.0)
    return launch(cfg, sink), sink.read_all(), out


def _tensors(path: Path) -> tuple[int, list[torch.Tensor]]:
    state = torch.load(path)
    return state["step"], split_state({"m": state["model"], "o": state["optimizer"]})[1]


@pytest.fixture
def reference(failure_free: Reference) -> Path:
    return failure_free(EXAMPLE, ["--steps", str(STEPS)], workers=2)


@pytest.mark.parametrize("faults,cause", [
    # The dead rank is killed right after its own optimizer step of the last step (its
    # gradient is in the allreduce, so its peer commits that step); the peer lingers 2 s
    # before its finished mark, so the death is seen before anyone has finished: a
    # failure, and a recovery published while the job's last step is committed.
    ((f"kill:rank=1:step={STEPS - 1}:phase=optimizer", f"linger:rank=0:step={STEPS}:seconds=2"),
     "process_killed"),
    ((f"kill:rank=0:step={STEPS - 1}:phase=optimizer", f"linger:rank=1:step={STEPS}:seconds=2"),
     "process_killed"),
    # A drain filed as the last step starts: the move is served at that step's boundary,
    # or (rank 0 already past its check) never -- the job ends on its old members.
    ((f"drain:rank=1:step={STEPS - 1}", f"linger:rank=0:step={STEPS}:seconds=2"),
     "maintenance"),
], ids=["kill-rank1", "kill-rank0", "drain"])
def test_a_failure_in_the_last_step_gets_one_outcome_and_loses_nothing(
        reference: Path, tmp_path: Path, faults: tuple[str, str], cause: str) -> None:
    result, recs, out = _run(tmp_path, "end", list(faults))
    assert result.exit_code == 0, result
    fails = [r for r in recs if r["kind"] == "failure"]
    outs = [r for r in recs if r["kind"] == "outcome"]
    assert len(fails) == 1, recs
    assert [o["failure_event_id"] for o in outs] == [fails[0]["event_id"]]
    assert fails[0]["cause"] == cause
    # The survivors held every committed step: nothing was lost.
    assert (outs[0]["outcome"], outs[0]["lost_steps"]) == ("live_migrated", 0)
    kinds = [r["kind"] for r in recs]
    assert kinds.index("failure") < kinds.index("outcome") < kinds.index("job_finished")
    assert recs[-1]["kind"] == "job_finished" and recs[-1]["step"] == STEPS
    step, got = _tensors(out)
    ref_step, want = _tensors(reference)
    assert step == ref_step == STEPS
    assert len(got) == len(want)
    for x, y in zip(got, want, strict=True):
        assert torch.equal(x, y)
