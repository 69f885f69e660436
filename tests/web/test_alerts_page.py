"""The operator's alerts page: destinations without secrets, deliveries, events; operators only."""

from __future__ import annotations

from datetime import UTC, datetime

from alerts.events import NewEvent, raise_event
from alerts.services import add_webhook
from yoco.database import unit_of_work

SECRET = "whsec_page-test-secret-0123456789"


def test_operators_see_destinations_deliveries_and_events_but_no_secret(
        client_for, seeded) -> None:
    ctx, _ = seeded
    with unit_of_work(ctx.engine) as s:
        add_webhook(s, name="ops-hook", url="http://127.0.0.1:9/hook", secret=SECRET)
        raise_event(s, NewEvent(kind="record_refused", key="record_refused:page",
                                occurred_at=datetime(2026, 5, 1, tzinfo=UTC),
                                contract_id="C-A", subject="the ledger refused a record",
                                data={}))
    op = client_for("op")
    r = op.get("/operator/alerts")
    assert r.status_code == 200
    html = r.text
    assert 'data-destination="ops-hook"' in html and "http://127.0.0.1:9/hook" in html
    assert SECRET not in html
    assert 'data-event="record_refused:page"' in html
    assert "the ledger refused a record" in html
    assert 'data-delivery="' in html and "pending" in html
    failed = op.get("/operator/alerts", params={"status": "failed"})
    assert failed.status_code == 200 and 'data-delivery="' not in failed.text
    assert op.get("/operator/alerts", params={"status": "nope"}).status_code in (400, 422)
    assert "/operator/alerts" in op.get("/operator").text


def test_nobody_but_operators_sees_the_alerts_page(client_for) -> None:
    for who in ("a", "b", "fin"):
        assert client_for(who).get("/operator/alerts").status_code == 404, who
    anonymous = client_for().get("/operator/alerts", follow_redirects=False)
    assert anonymous.status_code in (303, 401)
