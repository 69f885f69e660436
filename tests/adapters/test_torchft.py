"""A real TorchFT (0.2.0) job on CPU: its Rust lighthouse, two replica groups of one
process on gloo; one group SIGKILLs itself mid-step, is restarted (as torchx or Slurm
would) and heals from its live peer. Its failure and outcome land in the real ledger
through the ledger's sink, exactly once."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.adapters.conftest import by_kind

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "examples" / "torchft_train.py"


def test_a_lost_replica_group_healed_from_its_peer_is_live_migrated_once(
        tmp_path, sink_url, ledger_contract, journal, monkeypatch) -> None:
    monkeypatch.setenv("RUST_LOG", "error")  # the lighthouse logs every quorum otherwise
    from torchft.coordination import LighthouseServer

    lighthouse = LighthouseServer(bind="[::]:0", min_replicas=1, join_timeout_ms=500,
                                  quorum_tick_ms=10, heartbeat_timeout_ms=500)
    env = {**os.environ, "YOCO_CONTRACT_ID": ledger_contract, "YOCO_JOB_ID": "ft-1",
           "YOCO_ADAPTER_DIR": str(tmp_path / "state"), "YOCO_SINK": "yoco.sink:ledger_sink",
           "YOCO_SINK_ARGS": json.dumps({"database_url": sink_url}), "PYTHONPATH": str(ROOT),
           "OMP_NUM_THREADS": "1"}

    def start(replica: int, kill: int | None) -> subprocess.Popen[bytes]:
        args = [sys.executable, str(SCRIPT), "--replica", str(replica), "--replicas", "2",
                "--lighthouse", lighthouse.address(), "--steps", "20", "--max-steps", "2000"]
        if kill is not None:
            args += ["--kill-step", str(kill)]
        return subprocess.Popen(args, env=env, cwd=tmp_path,
                                stdout=(tmp_path / f"r{replica}.log").open("ab"),
                                stderr=subprocess.STDOUT)

    try:
        survivor, victim = start(0, None), start(1, 5)
        assert victim.wait(timeout=300) == -signal.SIGKILL
        assert survivor.poll() is None, "the survivor should train on alone"
        restarted = start(1, None)  # what torchx / Slurm do with a dead replica group
        assert restarted.wait(timeout=300) == 0, (tmp_path / "r1.log").read_text()[-3000:]
        assert survivor.wait(timeout=300) == 0, (tmp_path / "r0.log").read_text()[-3000:]
    finally:
        lighthouse.shutdown()
    closed = subprocess.run([sys.executable, "-m", "adapters.torchft", "close"], env=env,
                            capture_output=True, text=True, timeout=120)
    assert closed.returncode == 0, closed.stderr
    recs = journal()
    assert len({r["event_id"] for r in recs}) == len(recs) == 4
    kinds = by_kind(recs)
    (start_rec,), (fail,), (out,), (done,) = (kinds["job_started"], kinds["failure"],
                                              kinds["outcome"], kinds["job_finished"])
    assert (start_rec["job_id"], start_rec["gpus"]) == ("ft-1", 2)
    # Killed mid-step with (usually) 5 steps committed: those survive in the other group.
    said = re.search(r"killing myself with (\d+) steps committed",
                     (tmp_path / "r1.log").read_text())
    assert said, (tmp_path / "r1.log").read_text()[-3000:]
    # On a busy machine the survivor may train alone until the victim joins, healed from
    # it at a step past the kill step: the victim then dies in its first step having
    # committed none itself (no progress marker), and its failure truthfully names no step
    # (seen once in a clean-clone run).
    victim_progress = tmp_path / "state" / "groups" / "1" / "attempts" / "000000.progress"
    assert (fail["failure_class"], fail["cause"]) == ("unplanned", "process_killed")
    if victim_progress.exists():
        assert fail["step"] == int(said.group(1))
    else:
        assert "step" not in fail and "before committing a step" in fail["detail"], fail
    assert "replica group 1" in fail["detail"]
    assert out["failure_event_id"] == fail["event_id"]
    assert (out["outcome"], out["lost_steps"], out["gpus_affected"]) == ("live_migrated", 0, 1)
    assert out["recovery_seconds"] > 0 and out["step_seconds"] > 0
    assert done["step"] >= 20
