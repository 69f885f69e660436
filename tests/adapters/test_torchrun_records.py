"""The torchrun adapter's decisions, with the reporter driven as torchrun would start it
(the environment of each worker group's rank 0), without torch: which records, how many
steps lost, exactly once whoever reports. The real torchrun jobs are in test_torchrun.py."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import pytest

from adapters.common import AdapterConfig, StateDir, write_new
from adapters.torchrun import TorchrunReporter, close_job, main
from runtime.errors import ConfigError
from runtime.sink import JsonlFileSink, SinkSpec
from yoco_records.schema import validate_record


def _config(tmp: Path, **kw: Any) -> AdapterConfig:
    return AdapterConfig(contract_id="c1", job_id="j1", state_dir=tmp / "state",
                         sink=SinkSpec(target="runtime.sink:JsonlFileSink",
                                       kwargs={"path": str(tmp / "sink.jsonl")}),
                         deliver_timeout_s=10, **kw)


def _env(rank: int, restart: int, world: int = 2) -> dict[str, str]:
    return {"RANK": str(rank), "WORLD_SIZE": str(world),
            "TORCHELASTIC_RESTART_COUNT": str(restart), "TORCHELASTIC_MAX_RESTARTS": "3",
            "TORCHELASTIC_RUN_ID": "run-1"}


def _attempt(tmp: Path, restart: int, resume: int, upto: int | None, *,
             finish: bool = False, **kw: Any) -> TorchrunReporter:
    """Rank 0 of one worker group: resumes, does steps resume+1..upto, then finishes or
    just stops (the group was torn down)."""
    rep = TorchrunReporter(_config(tmp, **kw), _env(0, restart))
    rep.resumed(resume)
    for s in range(resume + 1, (upto or resume) + 1):
        rep.step_done(s)
    if finish:
        assert rep.finished(upto or resume)
    else:
        rep.close(10)
    return rep


def _stored(tmp: Path) -> list[dict[str, Any]]:
    return JsonlFileSink(tmp / "sink.jsonl").read_all()


def _by_kind(recs: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    for r in recs:
        out.setdefault(r["kind"], []).append(r)
    return out


def test_a_restart_is_a_rollback_with_the_steps_since_the_checkpoint_lost(tmp_path) -> None:
    _attempt(tmp_path, 0, 0, 7)                 # checkpoint at 5, killed after 7 steps
    _attempt(tmp_path, 1, 5, 12, finish=True)   # resumes from the checkpoint at 5
    recs = _stored(tmp_path)
    for r in recs:
        assert validate_record(json.loads(json.dumps(r)))[1] == []
    kinds = _by_kind(recs)
    assert [len(kinds[k]) for k in ("job_started", "failure", "outcome", "job_finished")] == \
        [1, 1, 1, 1]
    fail, out = kinds["failure"][0], kinds["outcome"][0]
    assert fail["failure_class"] == "unplanned" and fail["step"] == 7
    # No rank left an exit note: both ended without a word.
    assert fail["cause"] == "process_killed" and "ranks 0, 1: no exit note" in fail["detail"]
    assert out["failure_event_id"] == fail["event_id"]
    assert (out["outcome"], out["lost_steps"], out["gpus_affected"]) == ("rolled_back", 2, 2)
    assert out["recovery_seconds"] >= 0 and out["step_seconds"] > 0
    assert kinds["job_started"][0]["gpus"] == 2
    assert kinds["job_finished"][0]["step"] == 12


def test_exit_notes_name_the_cause(tmp_path) -> None:
    rep0 = TorchrunReporter(_config(tmp_path), _env(0, 0))
    rep1 = TorchrunReporter(_config(tmp_path), _env(1, 0))
    rep0.resumed(0)
    rep0.step_done(1)
    with pytest.raises(ValueError), rep1:
        raise ValueError("bad batch")  # the script's own exception on rank 1
    with pytest.raises(RuntimeError), rep0:
        raise RuntimeError("Connection closed by peer")
    _attempt(tmp_path, 1, 0, 2, finish=True)
    fail = _by_kind(_stored(tmp_path))["failure"][0]
    assert fail["cause"] == "process_crashed"  # every rank ended by an exception
    assert "rank 1: ValueError: bad batch" in fail["detail"]
    assert "rank 0: RuntimeError: Connection closed by peer" in fail["detail"]
    out = _by_kind(_stored(tmp_path))["outcome"][0]
    assert out["lost_steps"] == 1  # one step done since the start, restarted from 0


def test_only_rank_0_reports(tmp_path) -> None:
    for rank in (1, 2, 3):
        rep = TorchrunReporter(_config(tmp_path), _env(rank, 0, world=4))
        rep.resumed(0)
        rep.step_done(1)
        assert rep.finished(1) and rep.outbox is None
    assert not (tmp_path / "sink.jsonl").exists()
    assert not (tmp_path / "state" / "outbox").exists()


def test_a_reporter_killed_after_deciding_is_not_reported_twice(tmp_path) -> None:
    _attempt(tmp_path, 0, 0, 7)
    # Restart 1: its rank 0 decides the failure and dies before its outbox has it.
    cfg = _config(tmp_path)
    rep = TorchrunReporter(cfg, _env(0, 1))
    write_new(rep.job._side(rep.attempt, "resume"), b'{"steps": 5, "at": 0}')
    decided = rep.job.state.claim("failure-000000",
                                  lambda: rep.job.failure_record(rep.job.attempts(), 0))
    assert rep.outbox is not None and rep.outbox.outbox.pending_count() == 0
    rep.close(0)
    # Restart 2 appends the decided record, not a new one; then it recovers.
    _attempt(tmp_path, 2, 5, 9, finish=True)
    kinds = _by_kind(_stored(tmp_path))
    assert [f["event_id"] for f in kinds["failure"]].count(decided["event_id"]) == 1
    assert len(kinds["failure"]) == 2 and len(kinds["outcome"]) == 2
    first = next(o for o in kinds["outcome"] if o["failure_event_id"] == decided["event_id"])
    second = next(o for o in kinds["outcome"] if o is not first)
    # The job had done 7 steps; restart 1 loaded the checkpoint at 5 (2 lost); restart 1
    # itself held 5 steps and restart 2 resumed from 5: nothing more lost.
    assert (first["outcome"], first["lost_steps"]) == ("rolled_back", 2)
    assert (second["outcome"], second["lost_steps"]) == ("rolled_back", 0)


def test_the_same_record_twice_in_the_sink_is_one_record(tmp_path) -> None:
    _attempt(tmp_path, 0, 0, 3)
    _attempt(tmp_path, 1, 0, 3)
    # A third reporter re-emits everything decided so far: nothing new is stored.
    before = _stored(tmp_path)
    _attempt(tmp_path, 2, 0, 4, finish=True)
    after = _stored(tmp_path)
    assert after[: len(before)] == before
    ids = [r["event_id"] for r in after]
    assert len(ids) == len(set(ids))


def test_concurrent_claims_decide_one_record(tmp_path) -> None:
    state = StateDir(tmp_path)
    got: list[dict[str, Any]] = []
    from runtime import records as R

    def claim() -> None:
        got.append(state.claim("x", lambda: R.job_started(contract_id="c", job_id="j",
                                                           gpus=1)))

    threads = [threading.Thread(target=claim) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len({g["event_id"] for g in got}) == 1


def test_a_restart_without_a_failure_count_is_a_planned_membership_change(tmp_path) -> None:
    _attempt(tmp_path, 0, 0, 4)
    _attempt(tmp_path, 0, 0, 5, finish=True)  # the agent restarted without counting
    fail = _by_kind(_stored(tmp_path))["failure"][0]
    assert (fail["failure_class"], fail["cause"]) == ("planned", "membership_change")


def test_closing_after_torchrun_gave_up_records_failed(tmp_path) -> None:
    _attempt(tmp_path, 0, 0, 7)
    _attempt(tmp_path, 1, 5, 6)   # the last restart dies too: torchrun gives up
    failures, delivered = close_job(_config(tmp_path))
    assert (failures, delivered) == (2, True)
    kinds = _by_kind(_stored(tmp_path))
    outs = {o["failure_event_id"]: o for o in kinds["outcome"]}
    f0, f1 = sorted(kinds["failure"], key=lambda f: f["occurred_at"])
    assert (outs[f0["event_id"]]["outcome"], outs[f0["event_id"]]["lost_steps"]) == \
        ("rolled_back", 2)
    # The job did not recover from the last one: every step it held is lost.
    assert (outs[f1["event_id"]]["outcome"], outs[f1["event_id"]]["lost_steps"]) == ("failed", 6)
    assert kinds["job_finished"][0]["step"] == 6
    # Closing again changes nothing.
    close_job(_config(tmp_path))
    assert len(_stored(tmp_path)) == 6


def test_close_command_and_its_errors(tmp_path, monkeypatch, capsys) -> None:
    monkeypatch.setenv("YOCO_CONTRACT_ID", "c1")
    monkeypatch.setenv("YOCO_SINK", f"jsonl:{tmp_path / 'sink.jsonl'}")
    assert main(["close", "--state-dir", str(tmp_path / "none"), "--job-id", "j1"]) == 2
    assert "no torchrun attempt recorded" in capsys.readouterr().err
    _attempt(tmp_path, 0, 0, 2, finish=True)
    assert main(["close", "--state-dir", str(tmp_path / "state"), "--job-id", "j1"]) == 0
    assert "0 failure(s) recorded; every record delivered" in capsys.readouterr().out
    with pytest.raises(ConfigError, match="has finished"):
        TorchrunReporter(_config(tmp_path), _env(0, 1))


def test_configuration_errors_name_the_setting(tmp_path) -> None:
    with pytest.raises(ConfigError, match="YOCO_CONTRACT_ID is not set"):
        AdapterConfig.from_env({"YOCO_ADAPTER_DIR": str(tmp_path), "YOCO_JOB_ID": "j"})
    with pytest.raises(ConfigError, match="YOCO_SINK_ARGS is not JSON"):
        AdapterConfig.from_env({"YOCO_ADAPTER_DIR": str(tmp_path), "YOCO_JOB_ID": "j",
                                "YOCO_CONTRACT_ID": "c", "YOCO_SINK": "jsonl:x",
                                "YOCO_SINK_ARGS": "{"})
    with pytest.raises(ConfigError, match="contract_id"):
        AdapterConfig(contract_id=" ", job_id="j", state_dir=tmp_path)
    with pytest.raises(ConfigError, match="gpus_per_process"):
        AdapterConfig(contract_id="c", job_id="j", state_dir=tmp_path, gpus_per_process=0)
    with pytest.raises(ConfigError, match="start the script with torchrun"):
        TorchrunReporter(_config(tmp_path), {})
    rep = TorchrunReporter(_config(tmp_path), _env(0, 0))
    with pytest.raises(ValueError, match="steps must be an integer"):
        rep.resumed(-1)
    rep.close(0)
    cfg = AdapterConfig.from_env({"YOCO_ADAPTER_DIR": str(tmp_path), "YOCO_CONTRACT_ID": "c",
                                  "TORCHELASTIC_RUN_ID": "r"}, default_job_id="r")
    assert cfg.job_id == "r" and cfg.sink is None


def test_without_a_sink_records_wait_for_yoco_outbox(tmp_path) -> None:
    from typer.testing import CliRunner

    from yoco.cli import build_app

    cfg = AdapterConfig(contract_id="c1", job_id="j1", state_dir=tmp_path / "runs" / "j1")
    rep = TorchrunReporter(cfg, _env(0, 0))
    rep.resumed(0)
    rep.step_done(1)
    assert not rep.finished(1)  # nothing delivered: no sink
    runner, app = CliRunner(), build_app()
    listed = runner.invoke(app, ["outbox", "list", "j1", "--runs-root", str(tmp_path / "runs")])
    assert listed.exit_code == 3 and "2 pending, 0 dead letter(s)" in listed.output
    sent = runner.invoke(app, ["outbox", "deliver", "j1", "--runs-root",
                               str(tmp_path / "runs"), "--sink", f"jsonl:{tmp_path / 'sink.jsonl'}"])
    assert sent.exit_code == 0, sent.output
    assert [r["kind"] for r in _stored(tmp_path)] == ["job_started", "job_finished"]


@pytest.mark.parametrize(("raised", "cause"), [
    # Rank 0's own exception started it; rank 1 was stopped by the agent without a word.
    ({0: ValueError("loss is NaN")}, "process_crashed"),
    # Rank 1 vanished; rank 0 only lost its peer.
    ({0: RuntimeError("[gloo/transport/tcp/pair.cc:553] Connection closed by peer")},
     "process_killed"),
    # Every rank lost a peer and none died (a network fault between them).
    ({0: RuntimeError("Connection reset by peer"), 1: RuntimeError("NCCL watchdog timeout")},
     "collective_error"),
])
def test_the_cause_is_the_first_thing_that_went_wrong(tmp_path, raised, cause) -> None:
    reps = [TorchrunReporter(_config(tmp_path), _env(r, 0)) for r in (0, 1)]
    reps[0].resumed(0)
    for rank, exc in raised.items():
        with pytest.raises(type(exc)), reps[rank]:
            raise exc
    reps[0].close(0)
    _attempt(tmp_path, 1, 0, 1, finish=True)
    assert _by_kind(_stored(tmp_path))["failure"][0]["cause"] == cause
