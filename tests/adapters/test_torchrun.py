"""A real torchrun job (torch.distributed.elastic, 2 CPU workers on gloo, DDP) whose
workers are SIGKILLed at chosen steps; its records land in the real ledger through the
ledger's sink, each exactly once, with the true lost steps."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.adapters.conftest import by_kind

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "examples" / "torchrun_train.py"


def _torchrun(tmp: Path, sink_url: str, contract: str, *, faults: str, steps: int,
              max_restarts: int) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "YOCO_CONTRACT_ID": contract, "YOCO_JOB_ID": "tr-1",
           "YOCO_ADAPTER_DIR": str(tmp / "state"), "YOCO_SINK": "yoco.sink:ledger_sink",
           "YOCO_SINK_ARGS": json.dumps({"database_url": sink_url}),
           "YOCO_TORCHRUN_FAULTS": faults, "PYTHONPATH": str(ROOT),
           "OMP_NUM_THREADS": "1"}
    return subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nnodes=1",
         "--nproc-per-node=2", f"--max-restarts={max_restarts}", "--monitor-interval=0.1",
         str(SCRIPT), "--steps", str(steps), "--ckpt-every", "5"],
        env=env, cwd=tmp, capture_output=True, text=True, timeout=540)


def _close(tmp: Path, sink_url: str, contract: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "YOCO_CONTRACT_ID": contract, "YOCO_JOB_ID": "tr-1",
           "YOCO_ADAPTER_DIR": str(tmp / "state"), "YOCO_SINK": "yoco.sink:ledger_sink",
           "YOCO_SINK_ARGS": json.dumps({"database_url": sink_url}), "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "adapters.torchrun", "close"], env=env,
                          capture_output=True, text=True, timeout=120)


def _outcome_of(kinds: dict[str, list[dict[str, Any]]], failure: dict[str, Any]
                ) -> dict[str, Any]:
    outs = [o for o in kinds["outcome"] if o["failure_event_id"] == failure["event_id"]]
    assert len(outs) == 1, outs
    return outs[0]


def test_a_killed_worker_is_a_rollback_recorded_once_in_the_ledger(
        tmp_path, sink_url, ledger_contract, journal) -> None:
    # Checkpoints every 5 steps; rank 1 is SIGKILLed in step 8 (7 steps done): torchrun
    # restarts the group, which loads the checkpoint at 5: 2 steps lost.
    run = _torchrun(tmp_path, sink_url, ledger_contract, faults="kill:rank=1:step=7:restart=0",
                    steps=12, max_restarts=2)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "exitcode: -9" in run.stderr  # torchrun saw the SIGKILL and restarted
    recs = journal()
    assert len(recs) == 4 and len({r["event_id"] for r in recs}) == 4
    kinds = by_kind(recs)
    (start,), (fail,), (done,) = kinds["job_started"], kinds["failure"], kinds["job_finished"]
    assert (start["job_id"], start["gpus"]) == ("tr-1", 2)
    assert (fail["failure_class"], fail["cause"], fail["step"]) == \
        ("unplanned", "process_killed", 7)
    # Rank 1 vanished; rank 0 may have noted its collective error before the agent's
    # SIGTERM, or not.
    assert re.search(r"ranks? (0, )?1: no exit note", fail["detail"]), fail["detail"]
    out = _outcome_of(kinds, fail)
    assert (out["outcome"], out["lost_steps"], out["gpus_affected"]) == ("rolled_back", 2, 2)
    assert out["recovery_seconds"] > 0 and out["step_seconds"] > 0
    assert done["step"] == 12
    # Closing afterwards (what a wrapper script does whatever torchrun's exit) adds nothing.
    assert _close(tmp_path, sink_url, ledger_contract).returncode == 0
    assert journal() == recs


def test_a_killed_reporter_and_exhausted_restarts_are_each_recorded_once(
        tmp_path, sink_url, ledger_contract, journal) -> None:
    # Restart 0: rank 1 killed after 7 steps. Restart 1: rank 0 -- the reporter -- killed
    # right after it recorded that failure. Restart 2: rank 1 killed after 8 steps;
    # torchrun has no restart left and gives up; `close` records the end.
    faults = ("kill:rank=1:step=7:restart=0,kill:rank=0:step=resumed:restart=1,"
              "kill:rank=1:step=8:restart=2")
    run = _torchrun(tmp_path, sink_url, ledger_contract, faults=faults, steps=12,
                    max_restarts=2)
    assert run.returncode != 0, "torchrun should have given up"
    closed = _close(tmp_path, sink_url, ledger_contract)
    assert closed.returncode == 0, closed.stderr
    assert "3 failure(s) recorded; every record delivered" in closed.stdout
    recs = journal()
    assert len({r["event_id"] for r in recs}) == len(recs)
    kinds = by_kind(recs)
    assert [len(kinds[k]) for k in ("job_started", "failure", "outcome", "job_finished")] == \
        [1, 3, 3, 1]
    f0, f1, f2 = sorted(kinds["failure"], key=lambda f: f["occurred_at"])
    assert [f["step"] for f in (f0, f1, f2)] == [7, 5, 8]
    assert all(f["cause"] == "process_killed" for f in (f0, f1, f2))
    lost = [(_outcome_of(kinds, f)["outcome"], _outcome_of(kinds, f)["lost_steps"])
            for f in (f0, f1, f2)]
    # 7 -> checkpoint 5: 2 lost; restart 1 held the 5 it loaded and restart 2 loaded the
    # same checkpoint: 0 more; restart 2 reached 8 and nothing recovered: all 8 lost.
    assert lost == [("rolled_back", 2), ("rolled_back", 0), ("failed", 8)]
    assert kinds["job_finished"][0]["step"] == 8
    assert _close(tmp_path, sink_url, ledger_contract).returncode == 0
    assert journal() == recs
