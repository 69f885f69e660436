"""One hostile record or destination never stops the other deliveries.

Real PostgreSQL, a real webhook receiver and a real SMTP server.
"""

from __future__ import annotations

import email
import email.policy
import json
from datetime import UTC, datetime

import httpx
import pytest
from sqlalchemy import text
from typer.testing import CliRunner

from alerts.config import AlertsConfig, RetryPolicy
from alerts.events import NewEvent, one_line, raise_event
from alerts.refusals import record_refusal
from alerts.services import add_email, add_webhook
from ledger.records import RecordError
from tests.alerts.conftest import SECRET
from tests.billing.conftest import add_contract
from yoco.alerting import deliver_pending
from yoco.cli import build_app
from yoco.database import unit_of_work

T = datetime(2026, 6, 1, 12, 0, tzinfo=UTC)
CONFIG = AlertsConfig(retry=RetryPolicy(max_attempts=2, base_s=1.0, cap_s=1.0, timeout_s=5.0))
HOSTILE_ID = "x\r\nBcc: victim@elsewhere.example\r\n\r\nhello"

app = build_app()
runner = CliRunner()


def _msg(raw: bytes) -> email.message.EmailMessage:
    """The message as a receiver reads it (folded header lines joined again)."""
    return email.message_from_bytes(raw, policy=email.policy.default)


def _statuses(engine) -> list[tuple[str, str, str | None]]:
    with engine.connect() as c:
        return [tuple(r) for r in c.execute(text(
            "SELECT d2.name, d.status, d.last_error FROM alert_deliveries d "
            "JOIN alert_destinations d2 ON d2.id = d.destination_id ORDER BY d.id"))]


def test_a_refused_record_with_crlf_in_its_id_stops_no_delivery_of_any_tenant(
        engine, receiver, smtp, no_sleep) -> None:
    """The issue's attack: a refused record whose event_id carries CR/LF. Its alert's
    e-mail subject is one line, and every delivery (e-mail, webhooks, both tenants)
    flows."""
    add_contract(engine, "C-A", start_date="2026-01-01")
    add_contract(engine, "C-B", start_date="2026-01-01")
    with unit_of_work(engine) as s:
        add_email(s, name="oncall", host=smtp.host, port=smtp.port,
                  mail_from="yoco@vendor.example", mail_to=["oncall@vendor.example"])
        add_webhook(s, name="ops", url=receiver.url, secret=SECRET)
        add_webhook(s, name="tenant-b", url=receiver.url, secret=SECRET, customer="cust-C-B")
    hostile = {"event_id": HOSTILE_ID, "kind": "outcome", "contract_id": "C-A"}
    with unit_of_work(engine) as s:
        assert record_refusal(s, [hostile], [RecordError("not a UUID v4", field="event_id",
                                                            index=0)], source="ingest API", now=T) is not None
    with unit_of_work(engine) as s:  # a later event of the other tenant
        raise_event(s, NewEvent(kind="test", key="test:later", occurred_at=T,
                                subject="later", data={}, contract_id="C-B"))
    sent = deliver_pending(engine, CONFIG, sleep=no_sleep)
    assert sorted((d.destination, d.status) for d in sent) == [
        ("oncall", "delivered"), ("oncall", "delivered"), ("ops", "delivered"),
        ("ops", "delivered"), ("tenant-b", "delivered")]
    subjects = [_msg(m.content)["Subject"] for m in smtp.messages]
    hostile_subject = next(s for s in subjects if "refused" in s)
    assert "\r" not in hostile_subject and "\n" not in hostile_subject
    assert "\\u000d\\u000a" in hostile_subject
    for m in smtp.messages:  # no header was injected
        assert _msg(m.content)["Bcc"] is None
    # The webhook body keeps the record's exact id (JSON escapes it).
    bodies = [r.json for r in receiver.requests]
    assert any(b["data"].get("records", [{}])[0].get("event_id") == HOSTILE_ID
               for b in bodies if b["kind"] == "record_refused")


def test_a_delivery_that_breaks_is_dead_lettered_with_its_reason_and_the_rest_flow(
        engine, receiver, smtp, no_sleep) -> None:
    """Whatever goes wrong inside one delivery — here an exception no sender expects,
    raised by the HTTP client for one destination only — fails that delivery for good
    with the reason; the deliveries after it are sent in the same run, and the next run
    does not retry it first."""
    with unit_of_work(engine) as s:
        add_webhook(s, name="breaks", url=receiver.url + "/breaks", secret=SECRET)
        add_webhook(s, name="fine", url=receiver.url, secret=SECRET)
        add_email(s, name="mail", host=smtp.host, port=smtp.port,
                  mail_from="yoco@vendor.example", mail_to=["oncall@vendor.example"])
    for i in range(3):
        with unit_of_work(engine) as s:
            raise_event(s, NewEvent(kind="test", key=f"test:{i}", occurred_at=T,
                                    subject=f"event {i}", data={}))

    def explode(request: httpx.Request) -> None:
        if request.url.path.endswith("/breaks"):
            raise RuntimeError("a bug in one delivery")

    client = httpx.Client(follow_redirects=False, trust_env=False,
                          event_hooks={"request": [explode]})
    try:
        sent = deliver_pending(engine, CONFIG, sleep=no_sleep, client=client)
    finally:
        client.close()
    assert len(sent) == 9
    rows = _statuses(engine)
    assert {(n, st) for n, st, _ in rows} == {("breaks", "failed"), ("fine", "delivered"),
                                               ("mail", "delivered")}
    for name, _, why in rows:
        if name == "breaks":
            assert why is not None and why.startswith("dead-lettered: RuntimeError: a bug")
    assert len(receiver.accepted) == 3 and len(smtp.messages) == 3
    assert deliver_pending(engine, CONFIG, sleep=no_sleep) == []  # nothing left pending


def test_a_stored_subject_with_crlf_is_sent_as_one_line(engine, owner_engine, smtp,
                                                        no_sleep) -> None:
    """A subject stored before the check (written straight into the table) still goes
    out as one header line: checked where it enters and where it leaves."""
    with unit_of_work(engine) as s:
        add_email(s, name="mail", host=smtp.host, port=smtp.port,
                  mail_from="yoco@vendor.example", mail_to=["oncall@vendor.example"])
        raise_event(s, NewEvent(kind="test", key="test:old", occurred_at=T, subject="x",
                                data={}))
    with owner_engine.begin() as c:
        c.execute(text("UPDATE alert_events SET subject = :s"), {"s": "a\r\nBcc: v@x.example"})
    [d] = deliver_pending(engine, CONFIG, sleep=no_sleep)
    assert d.status == "delivered"
    msg = _msg(smtp.messages[0].content)
    assert msg["Bcc"] is None and msg["Subject"] == "[yoco] a\\u000d\\u000aBcc: v@x.example"


def test_one_line_escapes_controls_bidi_and_separators_only() -> None:
    assert one_line("plain — ünïcode") == "plain — ünïcode"
    assert one_line("a\rb\nc\x7f\u202ed\u2028") == "a\\u000db\\u000ac\\u007f\\u202ed\\u2028"


@pytest.mark.parametrize("url", ["http://127.0.0.1:18026/a\x7fb", "http://127.0.0.1/a\r\nb",
                                 "http://127.0.0.1/a\tb", "http://127.0.0.1/\u202e",
                                 "http://127.0.0.1/a b"])
def test_add_webhook_with_a_control_character_in_the_url_is_refused(
        yoco_env, engine, url: str) -> None:
    """The issue's command: refused with exit 2 naming the field, nothing written."""
    result = runner.invoke(app, ["alerts", "add-webhook", "x", "--url", url])
    assert result.exit_code == 2, result.output
    assert "url: character" in result.output and "Traceback" not in result.output
    with engine.connect() as c:
        assert c.execute(text("SELECT count(*) FROM alert_destinations")).scalar_one() == 0


def test_alerts_test_never_tracebacks_on_a_url_stored_before_the_check(
        yoco_env, engine, owner_engine, receiver) -> None:
    """A destination whose URL was stored before the check (straight into the table):
    `yoco alerts test` fails that delivery with the reason, exit 1, no traceback."""
    with unit_of_work(engine) as s:
        add_webhook(s, name="x", url=receiver.url, secret=SECRET)
    with owner_engine.begin() as s:
        s.execute(text("UPDATE alert_destinations SET url = :u"),
                  {"u": "http://127.0.0.1:18026/a\x7fb"})
    result = runner.invoke(app, ["alerts", "test", "x"])
    assert result.exit_code == 1, result.output
    assert "FAILED" in result.output and "url:" in result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)
    rows = json.loads(runner.invoke(app, ["alerts", "deliveries", "--json"]).output)
    assert [r["status"] for r in rows] == ["failed"]
