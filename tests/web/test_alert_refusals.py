"""POST /api/v1/records: a refused batch raises the record_refused alert once, tenant-safely."""

from __future__ import annotations

import json
import uuid
from datetime import timedelta

from sqlalchemy import text

from tests import factories as fx


def _post(client, token, body):
    return client.post("/api/v1/records", content=json.dumps(body),
                       headers={"Authorization": f"Bearer {token}",
                                "Content-Type": "application/json"})


def _events(engine) -> list[tuple]:
    with engine.connect() as c:
        return [tuple(r) for r in c.execute(text(
            "SELECT kind, contract_id, customer, data FROM alert_events ORDER BY id"))]


def test_a_refused_batch_raises_one_alert_however_often_it_is_posted(
        client_for, seed, engine) -> None:
    c = client_for()
    bad = fx.rec("job_started", "C-A", fx.T0, job_id="j8", gpus=0)
    good = fx.rec("job_started", "C-A", fx.T0, job_id="j9", gpus=8)
    assert _post(c, seed.token, [good, bad]).status_code == 422
    assert _post(c, seed.token, [good, bad]).status_code == 422
    assert _post(c, seed.token, [bad]).status_code == 422  # the same refused record
    [(kind, cid, customer, data)] = _events(engine)
    assert (kind, cid, customer) == ("record_refused", "C-A", "Acme AI")
    assert data["source"] == "API" and data["refused_records"] == 1
    [r] = data["records"]
    assert r["event_id"] == bad["event_id"] and r["errors"][0]["field"] == "gpus"
    # A database refusal (an outcome for an unknown failure) is another alert.
    ghost = fx.outcome(str(uuid.uuid4()), cid="C-A", at=fx.T0 + timedelta(days=1))
    assert _post(c, seed.token, [ghost]).status_code == 422
    assert [e[0] for e in _events(engine)] == ["record_refused", "record_refused"]


def test_a_refused_record_naming_another_tenants_contract_stays_with_the_operator(
        client_for, seed, engine) -> None:
    c = client_for()
    bad = fx.rec("job_started", "C-B", fx.T0, job_id="j8", gpus=0)  # not this token's
    assert _post(c, seed.token, [bad]).status_code == 422
    [(kind, cid, customer, _)] = _events(engine)
    assert (kind, cid, customer) == ("record_refused", None, None)


def test_an_accepted_batch_or_a_foreign_one_raises_nothing(client_for, seed, engine) -> None:
    c = client_for()
    good = fx.rec("job_started", "C-A", fx.T0, job_id="j9", gpus=8)
    assert _post(c, seed.token, [good]).status_code == 200
    foreign = fx.rec("job_started", "C-B", fx.T0, job_id="j9", gpus=8)
    assert _post(c, seed.token, [foreign]).status_code == 403
    assert _events(engine) == []
