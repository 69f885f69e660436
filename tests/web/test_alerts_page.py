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


# --------------------------------------------------------------------------- replays


def _failed_delivery(ctx, url: str, secret: str = SECRET, key: str = "record_refused:replay"
                     ) -> int:
    """A webhook destination at ``url`` and one delivery to it that failed for good."""
    from sqlalchemy import select

    from alerts.config import RetryPolicy
    from alerts.models import AlertDelivery, AlertDestination
    from alerts.send import deliver_next

    with unit_of_work(ctx.engine) as s:
        known = s.execute(select(AlertDestination).where(AlertDestination.url == url)
                          ).scalar_one_or_none()
        if known is None:
            add_webhook(s, name=f"hook-{abs(hash(url)) % 10**6}", url=url, secret=secret)
        raise_event(s, NewEvent(kind="record_refused", key=key,
                                occurred_at=datetime(2026, 5, 1, tzinfo=UTC),
                                contract_id="C-A", subject="the ledger refused a record",
                                data={}))
    with unit_of_work(ctx.engine) as s:
        done = deliver_next(s, policy=RetryPolicy(max_attempts=1))
        assert done is not None and done.status == "failed"
        status = s.get(AlertDelivery, done.delivery_id).status  # type: ignore[union-attr]
        assert status == "failed"
        return done.delivery_id


def _state(ctx) -> tuple[tuple, ...]:
    from sqlalchemy import text

    with ctx.engine.connect() as c:
        deliveries = tuple(c.execute(text(
            "SELECT id, status, attempts FROM alert_deliveries ORDER BY id")).all())
        replays = tuple(c.execute(text(
            "SELECT delivery_id, requested_by, via FROM alert_replays ORDER BY id")).all())
    return deliveries, replays


def _wait_for(ctx, delivery_id: int, status: str) -> None:
    """Wait (bounded) for the background sender to bring a delivery to ``status``."""
    import time

    from sqlalchemy import text

    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        with ctx.engine.connect() as c:
            now = c.execute(text("SELECT status FROM alert_deliveries WHERE id = :i"),
                            {"i": delivery_id}).scalar_one()
        if now == status:
            return
        time.sleep(0.05)
    raise AssertionError(f"delivery {delivery_id} did not become {status} (is {now})")


def test_an_operator_replays_a_failed_delivery_from_the_page(client_for, seeded) -> None:
    import threading
    from http.server import ThreadingHTTPServer

    from tests.alerts.conftest import Receiver, _handler  # the real local receiver
    from tests.web.conftest import csrf_of

    ctx, _ = seeded
    rec = Receiver(url="")
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(rec))
    rec.url = f"http://127.0.0.1:{server.server_address[1]}/hook"
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        rec.secret = SECRET
        rec.fail(1, 400)  # a client error: failed at once, not retried
        did = _failed_delivery(ctx, rec.url)
        op = client_for("op")
        page = op.get("/operator/alerts").text
        assert f'data-test="replay-{did}"' in page and 'data-test="replay-failed"' in page
        r = op.post("/operator/alerts/replay",
                    data={"csrf_token": csrf_of(page), "delivery_id": str(did)},
                    follow_redirects=False)
        assert r.status_code == 303 and r.headers["location"] == "/operator/alerts?replayed=1"
        _wait_for(ctx, did, "delivered")
        first, again = rec.requests
        assert (first.status, again.status) == (400, 200) and again.signature_ok
        assert again.body == first.body
        assert again.headers["Idempotency-Key"] == first.headers["Idempotency-Key"]
        # Audited: who asked, from the portal; the attempt is marked as a replay.
        _, replays = _state(ctx)
        [(replayed, by, via)] = replays
        assert (replayed, via) == (did, "portal") and by.startswith("Olga (user #")
        from alerts.services import attempts_of

        with unit_of_work(ctx.engine) as s:
            assert [(a.ok, a.replay) for a in attempts_of(s, did)] == [(False, False),
                                                                       (True, True)]
        shown = op.get("/operator/alerts?replayed=1").text
        assert 'id="replayed"' in shown and f'data-replay="{did}"' in shown
        assert "Olga (user #" in shown
    finally:
        server.shutdown()
        server.server_close()


def test_replay_every_failed_delivery_from_the_page(client_for, seeded) -> None:
    from tests.web.conftest import csrf_of

    ctx, _ = seeded
    # A disabled destination: its replays fail at once (nothing is sent anywhere).
    one = _failed_delivery(ctx, "http://127.0.0.1:9/one", key="record_refused:one")
    two = _failed_delivery(ctx, "http://127.0.0.1:9/one", key="record_refused:two")
    from alerts.services import list_destinations, set_enabled

    with unit_of_work(ctx.engine) as s:
        [dest] = list_destinations(s)
        set_enabled(s, dest.name, False)
    op = client_for("op")
    page = op.get("/operator/alerts").text
    assert "Replay every failed delivery (2)" in page
    r = op.post("/operator/alerts/replay", data={"csrf_token": csrf_of(page), "failed": "1"},
                follow_redirects=False)
    assert r.headers["location"] == "/operator/alerts?replayed=2"
    _, replays = _state(ctx)
    assert sorted(x[0] for x in replays) == [one, two]
    for d in (one, two):
        _wait_for(ctx, d, "failed")  # the destination is disabled: failed again, logged
    # A request naming no delivery is refused, an unknown one is not found.
    bad = op.post("/operator/alerts/replay", data={"csrf_token": csrf_of(page)},
                  follow_redirects=False)
    assert bad.status_code == 422 and "Choose a delivery" in bad.text
    unknown = op.post("/operator/alerts/replay",
                      data={"csrf_token": csrf_of(page), "delivery_id": "999999"},
                      follow_redirects=False)
    assert unknown.status_code == 404
    assert len(_state(ctx)[1]) == 2  # the refused requests recorded nothing


def test_nobody_but_an_operator_may_replay_and_never_without_the_form_token(
        client_for, seeded, seed) -> None:
    from tests.web.conftest import csrf_of

    ctx, _ = seeded
    did = _failed_delivery(ctx, "http://127.0.0.1:9/nobody")
    before = _state(ctx)
    for who in ("a", "b", "fin"):  # customers of either tenant, finance: not found
        c = client_for(who)
        token = csrf_of(c.get("/contracts").text)
        r = c.post("/operator/alerts/replay", data={"csrf_token": token,
                                                    "delivery_id": str(did)},
                   follow_redirects=False)
        assert r.status_code == 404, who
    anonymous = client_for()
    r = anonymous.post("/operator/alerts/replay",
                       data={"csrf_token": csrf_of(anonymous.get("/login").text),
                             "delivery_id": str(did)}, follow_redirects=False)
    assert r.status_code in (303, 401) and (
        r.status_code == 401 or r.headers["location"].startswith("/login"))
    for token in (seed.token, seed.read_token_b):  # API tokens are nobody on the pages
        r = client_for().post("/operator/alerts/replay", data={"delivery_id": str(did)},
                              headers={"Authorization": f"Bearer {token}"},
                              follow_redirects=False)
        assert r.status_code in (303, 401, 403), r.status_code
        assert r.status_code != 303 or r.headers["location"].startswith("/login")
    op = client_for("op")
    for data in ({"delivery_id": str(did)}, {"delivery_id": str(did), "csrf_token": "forged"}):
        r = op.post("/operator/alerts/replay", data=data, follow_redirects=False)
        assert r.status_code == 403, data
    assert _state(ctx) == before  # nothing queued, nothing audited
