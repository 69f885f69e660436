"""The TorchFT adapter's decisions, driven as TorchFT's loop would drive it, without
torchft: live when the group rejoins at or beyond its steps, rolled back when behind,
exactly once whoever reports. The real TorchFT job is in test_torchft.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from adapters.common import AdapterConfig
from adapters.torchft import TorchFTReporter, close_job, main
from runtime.errors import ConfigError
from runtime.sink import JsonlFileSink, SinkSpec
from tests.adapters.conftest import by_kind


def _config(tmp: Path) -> AdapterConfig:
    return AdapterConfig(contract_id="c1", job_id="ft", state_dir=tmp / "state",
                         sink=SinkSpec(target="runtime.sink:JsonlFileSink",
                                       kwargs={"path": str(tmp / "sink.jsonl")}),
                         deliver_timeout_s=10)


def _group(tmp: Path, group: str, steps: range, *, participants: int = 2,
           finish: int | None = None, world: int = 1) -> TorchFTReporter:
    rep = TorchFTReporter(_config(tmp), replica_group=group, replica_groups=2,
                          group_world_size=world)
    for s in steps:
        rep.committed(s, participants)
    if finish is not None:
        rep.finished(finish)
    else:
        rep.close(10)
    return rep


def _stored(tmp: Path) -> list[dict[str, Any]]:
    # One sink file written by several reporters: keep each event id once, as the ledger.
    seen: dict[str, dict[str, Any]] = {}
    for r in JsonlFileSink(tmp / "sink.jsonl").read_all():
        assert seen.setdefault(r["event_id"], r) == r
    return list(seen.values())


def test_a_group_healed_from_a_live_peer_is_live_migrated(tmp_path) -> None:
    survivor = TorchFTReporter(_config(tmp_path), replica_group="0", replica_groups=2)
    for s in range(1, 21):
        survivor.committed(s, 2 if s <= 5 else 1)
    _group(tmp_path, "1", range(1, 6))               # killed after 5 committed steps
    _group(tmp_path, "1", range(21, 31), finish=30)  # back: healed at 20, first commit 21
    for s in range(21, 31):
        survivor.committed(s, 2)
    assert survivor.finished(30)
    kinds = by_kind(_stored(tmp_path))
    assert [len(kinds[k]) for k in ("job_started", "failure", "outcome", "job_finished")] == \
        [1, 1, 1, 1]
    fail, out = kinds["failure"][0], kinds["outcome"][0]
    assert (fail["failure_class"], fail["cause"], fail["step"]) == \
        ("unplanned", "process_killed", 5)
    assert "replica group 1" in fail["detail"] and "quorum of 2" in fail["detail"]
    assert (out["outcome"], out["lost_steps"], out["gpus_affected"]) == ("live_migrated", 0, 1)
    assert out["failure_event_id"] == fail["event_id"] and out["step_seconds"] > 0
    assert kinds["job_started"][0]["gpus"] == 2


def test_a_group_that_rejoins_behind_its_steps_is_rolled_back(tmp_path) -> None:
    _group(tmp_path, "1", range(1, 9), world=2)      # 8 steps done
    _group(tmp_path, "1", range(6, 10), finish=9, world=2)   # whole job restarted from 5
    out = by_kind(_stored(tmp_path))["outcome"][0]
    assert (out["outcome"], out["lost_steps"], out["gpus_affected"]) == ("rolled_back", 3, 2)


def test_a_restarted_reporter_never_reports_twice(tmp_path) -> None:
    _group(tmp_path, "1", range(1, 6))
    # The restarted group decides its failure at start, then dies before committing.
    _group(tmp_path, "1", range(0))
    _group(tmp_path, "1", range(21, 25), finish=24)
    kinds = by_kind(_stored(tmp_path))
    assert len(kinds["failure"]) == 2 and len(kinds["outcome"]) == 2
    steps = sorted(f.get("step", -1) for f in kinds["failure"])
    assert steps == [-1, 5]  # the second start committed nothing: no step on its failure
    assert {o["outcome"] for o in kinds["outcome"]} == {"live_migrated"}


def test_exit_notes_and_other_group_ranks(tmp_path) -> None:
    r0 = TorchFTReporter(_config(tmp_path), replica_group="g", replica_groups=1,
                         group_world_size=2)
    r1 = TorchFTReporter(_config(tmp_path), replica_group="g", replica_groups=1,
                         group_rank=1, group_world_size=2)
    r1.committed(1, 1)
    assert r1.outbox is None and r1.finished(1)
    r0.committed(1, 1)
    for rep in (r0, r1):
        with pytest.raises(RuntimeError), rep:
            raise RuntimeError("CUDA error: uncorrectable ECC error encountered")
    _group(tmp_path, "g", range(2, 4), finish=3, world=2)
    fail = by_kind(_stored(tmp_path))["failure"][0]
    assert fail["cause"] == "process_crashed"
    assert "group rank 1: RuntimeError: CUDA error" in fail["detail"]


def test_close_records_a_group_that_never_came_back(tmp_path, monkeypatch, capsys) -> None:
    _group(tmp_path, "1", range(1, 6))
    _group(tmp_path, "0", range(1, 31), finish=30)   # the survivor finishes alone
    monkeypatch.setenv("YOCO_CONTRACT_ID", "c1")
    monkeypatch.setenv("YOCO_SINK", f"jsonl:{tmp_path / 'sink.jsonl'}")
    assert main(["close", "--state-dir", str(tmp_path / "state"), "--job-id", "ft"]) == 0
    assert "1 failure(s) recorded" in capsys.readouterr().out
    kinds = by_kind(_stored(tmp_path))
    (out,) = kinds["outcome"]
    # The others carried the job to step 30: nothing lost; the group's device idled until
    # the end of the job.
    assert (out["outcome"], out["lost_steps"]) == ("live_migrated", 0)
    assert out["occurred_at"] == kinds["job_finished"][0]["occurred_at"]
    assert close_job(_config(tmp_path)) == (1, True)
    assert len(_stored(tmp_path)) == 4


def test_close_when_every_group_died_records_failed(tmp_path) -> None:
    _group(tmp_path, "0", range(1, 8))
    _group(tmp_path, "1", range(1, 8))
    assert close_job(_config(tmp_path)) == (2, True)
    kinds = by_kind(_stored(tmp_path))
    # No group finished the job: it did not recover, every step done is lost.
    assert sorted((o["outcome"], o["lost_steps"]) for o in kinds["outcome"]) == \
        [("failed", 7), ("failed", 7)]
    assert kinds["job_finished"][0]["step"] == 7


def test_configuration_errors(tmp_path) -> None:
    with pytest.raises(ConfigError, match="replica_group"):
        TorchFTReporter(_config(tmp_path), replica_group="../x", replica_groups=2)
    with pytest.raises(ConfigError, match="group_rank"):
        TorchFTReporter(_config(tmp_path), replica_group="0", replica_groups=2, group_rank=1)
    with pytest.raises(ConfigError, match="no TorchFT replica group"):
        close_job(_config(tmp_path))
    _group(tmp_path, "0", range(1, 3), finish=2)
    with pytest.raises(ConfigError, match="has finished"):
        TorchFTReporter(_config(tmp_path), replica_group="0", replica_groups=2)
