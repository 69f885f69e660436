"""Implausible outcomes are refused: an outcome's gpus_affected is at
most its job's GPUs, its lost_steps at most the step the job had reached. Through
`yoco ledger ingest` (here) and the API (tests/web/test_plausibility.py); real
PostgreSQL."""

from __future__ import annotations

import json
from datetime import timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import create_engine, text
from typer.testing import CliRunner

from tests import factories as f
from yoco.cli import build_app
from yoco_records.schema import implausible_outcome

app = build_app()
runner = CliRunner()


def _journal(db_url: str) -> int:
    eng = create_engine(db_url)
    try:
        with eng.connect() as c:
            return int(c.execute(text("SELECT count(*) FROM journal_entries")).scalar_one())
    finally:
        eng.dispose()


@pytest.fixture
def contract(yoco_env: dict[str, str], tmp_path: Path) -> Path:
    p = tmp_path / "contracts.json"
    p.write_text(json.dumps([f.contract("C-1", start_date="2026-01-01")]))
    assert runner.invoke(app, ["contracts", "import", str(p)]).exit_code == 0
    return tmp_path


def _ingest(tmp: Path, records: list[Any]) -> Any:
    path = tmp / "batch.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return runner.invoke(app, ["ledger", "ingest", str(path)])


def _job(step: int | None = 2) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """An 8-GPU job at ``step`` (a progress record) and its failure (naming no step)."""
    recs = [f.job_started(cid="C-1", gpus=8, at=f.T0)]
    if step is not None:
        recs.append(f.rec("job_progress", "C-1", f.T0 + timedelta(minutes=1), job_id="j1",
                          step=step, step_seconds=2))
    fail = f.failure(cid="C-1", at=f.T0 + timedelta(minutes=2))
    return [*recs, fail], fail


ISSUE = [
    ({"gpus_affected": 2**31 - 1}, "gpus_affected", "at most the job's 8 GPUs"),
    ({"gpus_affected": 9}, "gpus_affected", "at most the job's 8 GPUs"),
    ({"outcome": "rolled_back", "lost": 2**53 - 1}, "lost_steps", "at most 2, the step"),
    ({"outcome": "rolled_back", "lost": 3}, "lost_steps", "at most 2, the step"),
]


@pytest.mark.parametrize("change, field, words", ISSUE)
@pytest.mark.parametrize("same_batch", [True, False])
def test_the_issues_implausible_outcomes_are_refused_naming_line_and_field(
        contract, db_url, change, field, words, same_batch) -> None:
    """The issue's records (gpus_affected 2^31-1 on an 8-GPU job, lost_steps 2^53-1 on a
    job at step 2): exit 2, the line and field named, nothing written — whether the job
    came in the same batch or an earlier one."""
    recs, fail = _job()
    kw = dict(change)
    out_rec = f.outcome(fail["event_id"], kw.pop("outcome", "live_migrated"),
                        kw.pop("lost", 0), cid="C-1", at=f.T0 + timedelta(minutes=3), **kw)
    if not same_batch:
        assert _ingest(contract, recs).exit_code == 0
        recs = []
    before = _journal(db_url)
    out = _ingest(contract, [*recs, out_rec])
    assert out.exit_code == 2, out.output
    assert "Traceback" not in out.output
    assert f"line {len(recs) + 1}" in out.output and f"field '{field}'" in out.output
    assert words in out.output, out.output
    assert _journal(db_url) == before


def test_plausible_outcomes_still_pass(contract, db_url) -> None:
    """At the bounds, a failure's own step, and a job whose step is unknown."""
    recs, fail = _job(step=2)
    ok = [f.outcome(fail["event_id"], "rolled_back", 2, cid="C-1", gpus_affected=8,
                    at=f.T0 + timedelta(minutes=3))]
    assert _ingest(contract, recs + ok).exit_code == 0
    # The failure says its step (100): that is what the job had reached.
    f2 = f.failure(cid="C-1", at=f.T0 + timedelta(minutes=4), step=100)
    o2 = f.outcome(f2["event_id"], "rolled_back", 100, cid="C-1", gpus_affected=4,
                   at=f.T0 + timedelta(minutes=5))
    assert _ingest(contract, [f2, o2]).exit_code == 0
    # No step known for the job at all: the step rule cannot apply; the GPUs one does.
    j2 = f.job_started("j2", gpus=2, cid="C-1", at=f.T0 + timedelta(minutes=6))
    f3 = f.failure("j2", cid="C-1", at=f.T0 + timedelta(minutes=7))
    o3 = f.outcome(f3["event_id"], "rolled_back", 50, cid="C-1", gpus_affected=2,
                   at=f.T0 + timedelta(minutes=8))
    assert _ingest(contract, [j2, f3, o3]).exit_code == 0
    o4 = f.outcome(f3["event_id"], "rolled_back", 50, cid="C-1", gpus_affected=3,
                   at=f.T0 + timedelta(minutes=9))
    out = _ingest(contract, [o4])
    assert out.exit_code == 2 and "at most the job's 2 GPUs" in out.output


def test_the_rule_is_the_record_schemas() -> None:
    assert implausible_outcome(8, 2, job_gpus=8, reached_step=2) == []
    assert implausible_outcome(9, 3, job_gpus=None, reached_step=None) == []
    assert [p[0] for p in implausible_outcome(9, 3, job_gpus=8, reached_step=2)] == [
        "gpus_affected", "lost_steps"]


# ------------------------------------------------- the recovery lies within the failure's job

MS = timedelta(milliseconds=1)
US = timedelta(microseconds=1)


def _recovery_case(seconds: float, reported: timedelta,
                   ) -> tuple[list[dict[str, Any]], dict[str, Any], dict[str, Any]]:
    """An 8-GPU job, its failure at T0+2 min, and an outcome of ``seconds`` of recovery
    reported ``reported`` after the failure."""
    recs, fail = _job(step=None)
    at = f.T0 + timedelta(minutes=2)
    out = f.outcome(fail["event_id"], "live_migrated", 0, cid="C-1", at=at + reported,
                    recovery_seconds=seconds)
    return recs, fail, out


@pytest.mark.parametrize("reported, ok", [
    (timedelta(seconds=300), True),             # reported as the recovery ends
    (timedelta(seconds=300) - MS, True),        # within the 1 ms slack
    (timedelta(seconds=300) - MS - US, False),  # a microsecond past it
    (timedelta(seconds=60), False),             # the old scenario data: 300 s, 60 s later
])
def test_an_outcome_reported_before_its_recovery_ended_is_refused(
        contract, db_url, reported, ok) -> None:
    """Recovery end = failure + recovery_seconds must be no later than the outcome's
    occurred_at (+1 ms): the boundary accepted, a microsecond past it refused with the
    line, the field and both instants; nothing written."""
    recs, _, out_rec = _recovery_case(300, reported)
    before = _journal(db_url)
    out = _ingest(contract, [*recs, out_rec])
    if ok:
        assert out.exit_code == 0, out.output
        return
    assert out.exit_code == 2, out.output
    text_ = " ".join(out.output.split())
    assert f"line {len(recs) + 1}" in text_ and "field 'recovery_seconds'" in text_
    assert "must end by the outcome's occurred_at" in text_
    assert "300 s after the failure at 2026-03-02T12:02:00Z ends at 2026-03-02T12:07:00Z" in text_
    assert _journal(db_url) == before


@pytest.mark.parametrize("finished, ok", [
    (timedelta(seconds=300), True),             # the job ends as the recovery does
    (timedelta(seconds=300) - MS, True),        # within the 1 ms slack
    (timedelta(seconds=300) - MS - US, False),  # a microsecond too early
])
@pytest.mark.parametrize("order", ["end_first", "outcome_first", "outcome_earlier_batch"])
def test_a_recovery_past_its_jobs_end_is_refused_from_either_side(
        contract, db_url, finished, ok, order) -> None:
    """The job's job_finished bounds the recovery: an outcome whose recovery ends after it
    is refused (field recovery_seconds), and so is a job_finished dated before the end
    of a recovery already recorded (field occurred_at), in one batch or two."""
    recs, _, out_rec = _recovery_case(300, timedelta(hours=1))
    end = f.rec("job_finished", "C-1", f.T0 + timedelta(minutes=2) + finished, job_id="j1",
                step=10)
    before = _journal(db_url)
    if order == "end_first":
        out = _ingest(contract, [*recs, end, out_rec])
        line, field = len(recs) + 2, "recovery_seconds"
    elif order == "outcome_first":
        # in one batch the outcome is named, wherever the job_finished stands
        out = _ingest(contract, [*recs, out_rec, end])
        line, field = len(recs) + 1, "recovery_seconds"
    else:
        assert _ingest(contract, [*recs, out_rec]).exit_code == 0
        before = _journal(db_url)
        out = _ingest(contract, [end])
        line, field = 1, "occurred_at"
    if ok:
        assert out.exit_code == 0, out.output
        return
    assert out.exit_code == 2, out.output
    text_ = " ".join(out.output.split())
    assert f"line {line}" in text_ and f"field '{field}'" in text_, text_
    if field == "recovery_seconds":
        assert "must end within the failure's job, which finished at" in text_
    else:
        assert "before a recovery recorded in it is over" in text_
    assert _journal(db_url) == before


def test_the_recovery_rule_is_the_record_schemas() -> None:
    """The pure rule: inclusive bounds with the slack; nothing to check without the
    failure's time; the outcome's own time is checked first."""
    from yoco_records.schema import RECOVERY_SLACK, recovery_end

    t = f.T0
    end = recovery_end(t, 300)
    assert end == t + timedelta(seconds=300) and RECOVERY_SLACK == MS
    assert recovery_end(t, Decimal("0.0000019")) == t + US  # rounded down to the microsecond
    ok = dict(job_gpus=8, reached_step=None, recovery_seconds=300, failure_at=t)
    assert implausible_outcome(8, 0, **ok, reported_at=end, job_end=end) == []
    assert implausible_outcome(8, 0, **ok, reported_at=end - MS, job_end=end - MS) == []
    late = implausible_outcome(8, 0, **ok, reported_at=end - MS - US, job_end=None)
    assert [p[0] for p in late] == ["recovery_seconds"] and "occurred_at" in late[0][1]
    cut = implausible_outcome(8, 0, **ok, reported_at=end, job_end=end - MS - US)
    assert [p[0] for p in cut] == ["recovery_seconds"] and "finished at" in cut[0][1]
    assert implausible_outcome(8, 0, job_gpus=8, reached_step=None, recovery_seconds=10**9,
                               failure_at=None, reported_at=t) == []
