"""POST /api/v1/records: the same validation as `yoco ledger ingest`, all or nothing, idempotent."""

from __future__ import annotations

import json
from datetime import timedelta

from sqlalchemy import text

from ledger.records import parse_jsonl, validate_batch
from tests import factories as fx


def _post(client, token, body, raw=False):
    return client.post(
        "/api/v1/records",
        content=body if raw else json.dumps(body),
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
    )


def _count(engine, cid="C-A"):
    with engine.connect() as c:
        return c.execute(text("SELECT count(*) FROM journal_entries WHERE log_id = :c"),
                         {"c": cid}).scalar()


def test_batch_is_appended_once_and_retries_are_no_ops(client_for, seed, engine) -> None:
    c = client_for()
    f = fx.rec("failure", "C-A", fx.T0 + timedelta(days=3), job_id="j1",
               failure_class="unplanned", cause="gpu_lost")
    o = fx.rec("outcome", "C-A", fx.T0 + timedelta(days=3, seconds=9),
               failure_event_id=f["event_id"], outcome="live_migrated", lost_steps=0,
               recovery_seconds=1.25, step_seconds=2, gpus_affected=8)
    before = _count(engine)
    r = _post(c, seed.token, [f, o])
    assert r.status_code == 200, r.text
    assert r.json() == {"appended": 2, "duplicates": 0, "by_kind": {"failure": 1, "outcome": 1}}
    r = _post(c, seed.token, [f, o])
    assert r.json() == {"appended": 0, "duplicates": 2, "by_kind": {}}
    assert _count(engine) == before + 2
    # The customer sees it at once (the cached figures follow the log's size).
    alice = client_for("a")
    got = alice.get(f"/api/v1/contracts/C-A/failures/{f['event_id']}").json()
    assert got["row"]["status"] == "resolved"


def test_refused_records_name_index_and_field_and_nothing_is_written(
    client_for, seed, engine
) -> None:
    c = client_for()
    good = fx.rec("job_started", "C-A", fx.T0, job_id="j9", gpus=8)
    bad_gpus = fx.rec("job_started", "C-A", fx.T0, job_id="j8", gpus=0)
    naive = fx.rec("job_started", "C-A", fx.T0, job_id="j7", gpus=8)
    naive["occurred_at"] = "2026-03-02T12:00:00"
    lm_lost = fx.outcome(seed.failures["C-A"][0], "live_migrated", lost=5, cid="C-A")
    before = _count(engine)
    batch = [good, bad_gpus, naive, lm_lost]
    r = _post(c, seed.token, batch)
    assert r.status_code == 422
    errors = r.json()["errors"]
    where = {(e["index"], e["field"]) for e in errors}
    assert (1, "gpus") in where and (2, "occurred_at") in where
    assert any(e["index"] == 3 for e in errors)
    assert all(e["index"] != 0 for e in errors)
    assert _count(engine) == before
    # Exactly what the command line says, for the same records.
    _, cli_errors = parse_jsonl(fx.jsonl(batch))
    assert [(e.field, e.message) for e in cli_errors] == [
        (e["field"], e["message"]) for e in errors
    ]
    assert [(e.field, e.message) for e in validate_batch(batch)[1]] == [
        (e["field"], e["message"]) for e in errors
    ]


def test_database_refusals_are_422_by_index(client_for, seed, engine) -> None:
    c = client_for()
    unknown_failure = fx.outcome("6d1f3f4e-1111-4a4a-9a9a-123456789abc", cid="C-A")
    ok = fx.rec("job_started", "C-A", fx.T0, job_id="j5", gpus=8)
    before = _count(engine)
    r = _post(c, seed.token, [ok, unknown_failure])
    assert r.status_code == 422, r.text
    [err] = r.json()["errors"]
    assert err["index"] == 1 and err["field"] == "failure_event_id"
    assert _count(engine) == before


def test_event_id_reuse_is_refused_without_naming_another_log(client_for, seed) -> None:
    c = client_for()
    with_b_id = fx.rec("job_started", "C-A", fx.T0, job_id="jx", gpus=8,
                       event_id=seed.failures["C-B"][0])
    r = _post(c, seed.token, [with_b_id])
    assert r.status_code == 422
    text_ = r.text
    assert "C-B" not in text_ and "seq" not in text_
    assert r.json()["errors"][0]["field"] == "event_id"


def test_token_may_only_post_for_its_contracts(client_for, seed, engine) -> None:
    c = client_for()
    mine = fx.rec("job_started", "C-A", fx.T0, job_id="j3", gpus=8)
    other = fx.rec("job_started", "C-B", fx.T0, job_id="j3", gpus=8)
    nowhere = fx.rec("job_started", "C-NOPE", fx.T0, job_id="j3", gpus=8)
    before_a, before_b = _count(engine, "C-A"), _count(engine, "C-B")
    r = _post(c, seed.token, [mine, other, nowhere])
    assert r.status_code == 403
    errors = r.json()["errors"]
    assert [(e["index"], e["field"]) for e in errors] == [(1, "contract_id"), (2, "contract_id")]
    # A foreign contract and a missing one read the same.
    assert errors[0]["message"].replace("C-B", "X") == errors[1]["message"].replace("C-NOPE", "X")
    assert (_count(engine, "C-A"), _count(engine, "C-B")) == (before_a, before_b)


def test_authentication_and_body_shape(client_for, seed) -> None:
    c = client_for()
    assert c.post("/api/v1/records", json=[]).status_code == 401
    assert _post(c, seed.read_token_b, []).status_code == 403
    alice = client_for("a")  # a session cookie is not an ingest token
    assert alice.post("/api/v1/records", json=[]).status_code == 401
    assert _post(c, seed.token, []).json() == {"appended": 0, "duplicates": 0, "by_kind": {}}
    r = _post(c, seed.token, b'{"kind": "job_started"}', raw=True)
    assert r.status_code == 422 and "array" in r.json()["detail"]
    r = _post(c, seed.token, b'[{"a": 1, "a": 2}]', raw=True)
    assert r.status_code == 422 and r.json()["errors"][0]["message"]
    r = _post(c, seed.token, b"[1e400]", raw=True)
    assert r.status_code == 422


def test_a_body_that_is_not_json_says_where_it_stops_being_json(client_for, seed) -> None:
    c = client_for()
    r = _post(c, seed.token, b'[{"kind": "job_started",\n  "job_id": "abc', raw=True)
    assert r.status_code == 422
    assert r.json()["errors"][0]["message"] == (
        "invalid JSON: Unterminated string starting at line 2 column 13"
    )
