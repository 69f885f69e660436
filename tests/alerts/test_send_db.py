"""Delivery against a real local webhook receiver and a real SMTP server (real PostgreSQL)."""

from __future__ import annotations

import hashlib
import hmac
import json
from datetime import UTC, datetime

import pytest
from sqlalchemy import text

from alerts.config import AlertsConfig, RetryPolicy
from alerts.events import NewEvent, idempotency_key, raise_event
from alerts.send import sign, verify_signature
from alerts.services import add_email, add_webhook, attempts_of, deliveries, queue_replay
from tests.alerts.conftest import SECRET
from yoco.alerting import deliver_pending
from yoco.database import unit_of_work

T = datetime(2025, 6, 1, 12, 0, tzinfo=UTC)
CONFIG = AlertsConfig(retry=RetryPolicy(max_attempts=4, base_s=1.0, cap_s=3.0, timeout_s=5.0))


def _event(key: str = "record_refused:abc") -> NewEvent:
    return NewEvent(kind="record_refused", key=key, occurred_at=T,
                    subject="the ledger refused a record", data={"n": 1})


def _webhook(engine, receiver, name: str = "ops", **kw) -> None:
    with unit_of_work(engine) as s:
        add_webhook(s, name=name, url=receiver.url, secret=SECRET, **kw)


def _raise(engine, event: NewEvent | None = None) -> int | None:
    with unit_of_work(engine) as s:
        return raise_event(s, event or _event())


def _log(engine) -> list[tuple]:
    with engine.connect() as c:
        return [tuple(r) for r in c.execute(text(
            "SELECT d.id, d.status, d.attempts FROM alert_deliveries d ORDER BY d.id"))]


def test_a_webhook_is_signed_with_the_exact_body_and_carries_the_idempotency_key(
        engine, receiver, no_sleep) -> None:
    _webhook(engine, receiver)
    assert _raise(engine) is not None
    sent = deliver_pending(engine, CONFIG, sleep=no_sleep)
    assert [(d.status, d.attempts) for d in sent] == [("delivered", 1)]
    [req] = receiver.requests
    assert req.signature_ok and req.status == 200
    assert req.headers["Idempotency-Key"] == idempotency_key("record_refused:abc")
    assert req.headers["Content-Type"] == "application/json"
    assert req.headers["Yoco-Event"] == "record_refused"
    body = req.json
    assert body["key"] == "record_refused:abc" and body["kind"] == "record_refused"
    assert body["id"] == req.headers["Idempotency-Key"]
    assert body["data"] == {"n": 1}
    # The recipe of docs/alerts.md, written out independently of alerts.send.
    parts = dict(p.split("=", 1) for p in req.headers["Yoco-Signature"].split(","))
    mac = hmac.new(SECRET.encode(), parts["t"].encode() + b"." + req.body, hashlib.sha256)
    assert hmac.compare_digest(mac.hexdigest(), parts["v1"])
    assert no_sleep.waits == []
    assert _log(engine) == [(sent[0].delivery_id, "delivered", 1)]


def test_signature_checks_refuse_a_changed_body_another_secret_or_an_old_timestamp() -> None:
    body = b'{"a":1}'
    header = sign(SECRET, 1_700_000_000, body)
    assert verify_signature(SECRET, header, body, now=1_700_000_100)
    assert not verify_signature(SECRET, header, b'{"a":2}', now=1_700_000_100)
    assert not verify_signature("another-secret-of-16+", header, body, now=1_700_000_100)
    assert not verify_signature(SECRET, header, body, now=1_700_000_000 + 301)
    assert not verify_signature(SECRET, "v1=deadbeef", body, now=1_700_000_000)


def test_a_failing_receiver_is_retried_with_backoff_and_jitter_then_delivered(
        engine, receiver, no_sleep) -> None:
    _webhook(engine, receiver)
    _raise(engine)
    receiver.fail(2, 503)
    sent = deliver_pending(engine, CONFIG, sleep=no_sleep, jitter=lambda: 0.5)
    assert [(d.status, d.attempts) for d in sent] == [("delivered", 3)]
    assert [r.status for r in receiver.requests] == [503, 503, 200]
    # Exponential (1, 2 s caps) with jitter in the second half: 0.75, 1.5.
    assert no_sleep.waits == [0.75, 1.5]
    keys = {r.headers["Idempotency-Key"] for r in receiver.requests}
    assert len(keys) == 1, "every attempt carries the same idempotency key"
    assert len({r.body for r in receiver.requests}) == 1, "and the same body"
    with unit_of_work(engine) as s:
        tries = attempts_of(s, sent[0].delivery_id)
        assert [(a.attempt, a.ok, a.status_code, a.backoff_s) for a in tries] == [
            (1, False, 503, 0.75), (2, False, 503, 1.5), (3, True, 200, None)]


def test_backoff_grows_and_is_capped() -> None:
    p = RetryPolicy(max_attempts=10, base_s=1.0, cap_s=8.0)
    lows = [p.backoff(n, 0.0) for n in range(1, 7)]
    highs = [p.backoff(n, 1.0) for n in range(1, 7)]
    assert lows == [0.5, 1.0, 2.0, 4.0, 4.0, 4.0]
    assert highs == [1.0, 2.0, 4.0, 8.0, 8.0, 8.0]
    with pytest.raises(ValueError, match="max_attempts"):
        RetryPolicy(max_attempts=0)
    with pytest.raises(ValueError, match="base_s"):
        RetryPolicy(base_s=5, cap_s=1)


def test_a_refusing_receiver_ends_in_a_failed_delivery_in_the_log_and_replay_resends(
        engine, receiver, no_sleep) -> None:
    _webhook(engine, receiver)
    _raise(engine)
    receiver.fail(100, 500)
    [d] = deliver_pending(engine, CONFIG, sleep=no_sleep, jitter=lambda: 0.0)
    assert (d.status, d.attempts) == ("failed", 4)
    assert len(receiver.requests) == 4 and len(no_sleep.waits) == 3
    assert no_sleep.waits == [0.5, 1.0, 1.5]  # capped at 3 s: half of it at jitter 0
    with unit_of_work(engine) as s:
        [row] = deliveries(s, status="failed")
        assert row.id == d.delivery_id and row.attempts == 4
        assert row.last_status == 500 and "HTTP 500" in (row.last_error or "")
    # Nothing is pending any more: a later run does not send it again on its own.
    assert deliver_pending(engine, CONFIG, sleep=no_sleep) == []
    receiver.fail(0)
    with unit_of_work(engine) as s:
        assert queue_replay(s, [d.delivery_id], requested_by="olga", via="cli") == [
            d.delivery_id]
    [again] = deliver_pending(engine, CONFIG, delivery_ids=[d.delivery_id], replay=True,
                              sleep=no_sleep)
    assert again.status == "delivered"
    assert len({r.headers["Idempotency-Key"] for r in receiver.requests}) == 1
    assert receiver.requests[-1].body == receiver.requests[0].body
    assert receiver.requests[-1].signature_ok
    with unit_of_work(engine) as s:
        tries = attempts_of(s, d.delivery_id)
    assert [(a.attempt, a.ok, a.replay) for a in tries][-1] == (5, True, True)


def test_a_client_error_is_not_retried(engine, receiver, no_sleep) -> None:
    _webhook(engine, receiver)
    _raise(engine)
    receiver.fail(1, 410)
    [d] = deliver_pending(engine, CONFIG, sleep=no_sleep)
    assert (d.status, d.attempts) == ("failed", 1)
    assert no_sleep.waits == []


def test_a_wrong_secret_is_refused_by_the_receiver_and_fails(engine, receiver, no_sleep) -> None:
    with unit_of_work(engine) as s:
        add_webhook(s, name="wrong", url=receiver.url, secret="not-the-receivers-secret")
    _raise(engine)
    [d] = deliver_pending(engine, CONFIG, sleep=no_sleep)
    assert d.status == "failed" and "HTTP 401" in (d.error or "")
    assert [r.signature_ok for r in receiver.requests] == [False]


def test_a_timeout_is_retried(engine, receiver, no_sleep) -> None:
    _webhook(engine, receiver)
    _raise(engine)
    receiver.hang_s = 2.0
    quick = AlertsConfig(retry=RetryPolicy(max_attempts=2, base_s=1.0, cap_s=1.0,
                                           timeout_s=0.2))
    [d] = deliver_pending(engine, quick, sleep=no_sleep)
    assert (d.status, d.attempts) == ("failed", 2)
    assert "timed out" in (d.error or "") and len(no_sleep.waits) == 1


def test_an_unreachable_receiver_is_retried_then_failed(engine, no_sleep) -> None:
    import socket

    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with unit_of_work(engine) as s:
        add_webhook(s, name="down", url=f"http://127.0.0.1:{port}/x", secret=SECRET)
    _raise(engine)
    [d] = deliver_pending(engine, CONFIG, sleep=no_sleep)
    assert (d.status, d.attempts) == ("failed", 4) and "Connect" in (d.error or "")


def test_an_event_raised_twice_is_stored_and_delivered_once(engine, receiver, no_sleep) -> None:
    _webhook(engine, receiver)
    assert _raise(engine) is not None
    assert _raise(engine) is None
    deliver_pending(engine, CONFIG, sleep=no_sleep)
    deliver_pending(engine, CONFIG, sleep=no_sleep)
    assert len(receiver.requests) == 1


def test_an_email_reaches_a_real_smtp_server(engine, smtp, no_sleep) -> None:
    with unit_of_work(engine) as s:
        add_email(s, name="oncall", host=smtp.host, port=smtp.port,
                  mail_from="yoco@vendor.example", mail_to=["oncall@vendor.example",
                                                           "sla@vendor.example"])
    _raise(engine)
    [d] = deliver_pending(engine, CONFIG, sleep=no_sleep)
    assert (d.status, d.attempts) == ("delivered", 1)
    [env] = smtp.messages
    assert env.mail_from == "yoco@vendor.example"
    assert sorted(env.rcpt_tos) == ["oncall@vendor.example", "sla@vendor.example"]
    import email

    msg = email.message_from_bytes(env.content)
    assert msg["Subject"] == "[yoco] the ledger refused a record"
    key = idempotency_key("record_refused:abc")
    assert msg["Idempotency-Key"] == key and msg["Message-ID"] == f"<{key}@alerts.yoco>"
    text_ = msg.get_payload(decode=True).decode()
    assert '"key": "record_refused:abc"' in text_


def test_an_smtp_login_without_its_password_variable_fails_clearly(
        engine, smtp, no_sleep) -> None:
    with unit_of_work(engine) as s:
        add_email(s, name="auth", host=smtp.host, port=smtp.port, mail_from="a@b.example",
                  mail_to=["c@d.example"], username="yoco", password_env="YOCO_TEST_NO_SUCH")
    _raise(engine)
    [d] = deliver_pending(engine, CONFIG, sleep=no_sleep, env={})
    assert d.status == "failed" and "YOCO_TEST_NO_SUCH" in (d.error or "")
    assert smtp.messages == []


def test_an_smtp_server_that_is_down_is_retried(engine, no_sleep) -> None:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with unit_of_work(engine) as s:
        add_email(s, name="down", host="127.0.0.1", port=port, mail_from="a@b.example",
                  mail_to=["c@d.example"])
    _raise(engine)
    [d] = deliver_pending(engine, CONFIG, sleep=no_sleep)
    assert (d.status, d.attempts) == ("failed", 4)


def test_two_senders_at_once_send_each_delivery_once(engine, receiver) -> None:
    import threading

    _webhook(engine, receiver)
    for i in range(6):
        _raise(engine, _event(f"record_refused:{i}"))
    results: list = []
    threads = [threading.Thread(target=lambda: results.extend(
        deliver_pending(engine, CONFIG, sleep=lambda s: None))) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert sorted(d.delivery_id for d in results) == sorted({d.delivery_id for d in results})
    assert len(results) == 6
    assert sorted(json.loads(r.body)["key"] for r in receiver.requests) == sorted(
        f"record_refused:{i}" for i in range(6))
