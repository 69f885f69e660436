"""The ingest API learns nothing about other tenants' logs."""

from __future__ import annotations

import json
import uuid
from typing import Any

from sqlalchemy import text

from billing import entries
from ledger.contracts import contract_event_id
from tests import factories as fx


def _post(client: Any, token: str, body: Any) -> Any:
    return client.post(
        "/api/v1/records",
        content=json.dumps(body),
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
    )


def _size(engine: Any) -> int:
    with engine.connect() as c:
        return int(c.execute(text("SELECT count(*) FROM journal_entries")).scalar_one())


def test_the_api_learns_nothing_about_other_tenants_logs(client_for, seed, engine) -> None:
    c = client_for()

    def answer(eid: str) -> tuple[int, Any]:
        rec = fx.rec("job_started", "C-A", fx.T0, job_id="jx", gpus=8, event_id=eid)
        r = _post(c, seed.token, [rec])
        body = r.json()
        for e in body.get("errors", []):
            e["message"] = e["message"].replace(eid, "<ID>")
        return r.status_code, body

    before = _size(engine)
    # B's internal ids, existing or not: refused for their version, identically.
    dispute_b = seed.disputes["C-B"]
    probes = [
        str(contract_event_id("C-B")),
        str(contract_event_id("C-NEVER")),
        dispute_b,
        str(entries.event_id("dispute_decision", dispute_b)),
        str(entries.event_id("year_close", "C-B", 1)),
        str(entries.event_id("year_close", "C-B", 7)),
        str(entries.event_id("credit", "C-B", 1, 1)),
    ]
    answers = [answer(p) for p in probes]
    assert all(a == answers[0] for a in answers), answers
    assert answers[0][0] == 422 and "random UUID v4" in str(answers[0][1])
    # A failure id of B's log and one of A's own log: the same answer, naming no log.
    own = answer(seed.failures["C-A"][0])
    other = answer(seed.failures["C-B"][0])
    assert own == other and own[0] == 422
    assert "C-B" not in str(other) and "seq" not in str(other)
    assert "failure" not in str(other)

    # An outcome naming B's failure reads exactly like one naming a failure never seen.
    def ref(fid: str) -> tuple[int, Any]:
        r = _post(c, seed.token, [fx.outcome(fid, cid="C-A", at=fx.T0)])
        body = r.json()
        for e in body.get("errors", []):
            e["message"] = e["message"].replace(fid, "<ID>")
        return r.status_code, body

    assert ref(seed.failures["C-B"][0]) == ref(str(uuid.uuid4()))
    assert ref(str(uuid.uuid4()))[0] == 422
    assert _size(engine) == before
