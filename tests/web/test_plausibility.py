"""POST /api/v1/records refuses implausible outcomes by index and field."""

from __future__ import annotations

import json
from datetime import timedelta

from sqlalchemy import text

from tests import factories as fx


def _post(client, token, body):
    return client.post(
        "/api/v1/records", content=json.dumps(body),
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"})


def _count(engine) -> int:
    with engine.connect() as c:
        return int(c.execute(text("SELECT count(*) FROM journal_entries")).scalar_one())


def test_the_api_refuses_the_issues_outcomes_naming_index_and_field(
        client_for, seed, engine) -> None:
    """gpus_affected 2^31-1 on an 8-GPU job and lost_steps 2^53-1 on a job at step 2: 422,
    each named by index and field, nothing written; the year's figures do not move."""
    c = client_for()
    t = fx.T0 + timedelta(days=3)
    job = fx.rec("job_started", "C-A", t, job_id="jx", gpus=8)
    prog = fx.rec("job_progress", "C-A", t + timedelta(minutes=1), job_id="jx", step=2,
                  step_seconds=2)
    fail = fx.rec("failure", "C-A", t + timedelta(minutes=2), job_id="jx",
                  failure_class="unplanned", cause="gpu_lost")
    assert _post(c, seed.token, [job, prog, fail]).status_code == 200
    wide = fx.outcome(fail["event_id"], "live_migrated", 0, cid="C-A",
                      at=t + timedelta(minutes=3), gpus_affected=2**31 - 1)
    deep = fx.outcome(fail["event_id"], "rolled_back", 2**53 - 1, cid="C-A",
                      at=t + timedelta(minutes=4))
    before = _count(engine)
    r = _post(c, seed.token, [wide, deep])
    assert r.status_code == 422, r.text
    where = {(e["index"], e["field"]): e["message"] for e in r.json()["errors"]}
    assert "at most the job's 8 GPUs" in where[(0, "gpus_affected")]
    assert "at most 2, the step" in where[(1, "lost_steps")]
    assert _count(engine) == before


def test_the_api_refuses_a_recovery_outside_its_job_naming_index_and_field(
        client_for, seed, engine) -> None:
    """The recovery rule through the API: an outcome reported before its 300 s recovery
    ended, and one whose recovery runs past the job's job_finished: 422 by index and
    field, nothing written; the same outcome reported once the recovery is over passes."""
    c = client_for()
    t = fx.T0 + timedelta(days=4)
    job = fx.rec("job_started", "C-A", t, job_id="jr", gpus=8)
    fail = fx.rec("failure", "C-A", t + timedelta(minutes=2), job_id="jr",
                  failure_class="unplanned", cause="gpu_lost")
    end = fx.rec("job_finished", "C-A", t + timedelta(minutes=6), job_id="jr", step=10)
    assert _post(c, seed.token, [job, fail]).status_code == 200
    early = fx.outcome(fail["event_id"], "live_migrated", 0, cid="C-A",
                       at=t + timedelta(minutes=3), recovery_seconds=300)
    past = fx.outcome(fail["event_id"], "live_migrated", 0, cid="C-A",
                      at=t + timedelta(minutes=9), recovery_seconds=300)
    before = _count(engine)
    r = _post(c, seed.token, [early, end, past])
    assert r.status_code == 422, r.text
    where = {(e["index"], e["field"]): e["message"] for e in r.json()["errors"]}
    assert "must end by the outcome's occurred_at" in where[(0, "recovery_seconds")]
    assert "must end within the failure's job" in where[(2, "recovery_seconds")]
    assert _count(engine) == before
    fine = fx.outcome(fail["event_id"], "live_migrated", 0, cid="C-A",
                      at=t + timedelta(minutes=7), recovery_seconds=300)
    assert _post(c, seed.token, [fine]).status_code == 200
