"""A customer's own admin adds, lists and removes the e-mail recipients of their
customer's alerts at ``/account/alerts``: a bad address is refused naming the field and
changes nothing, another tenant never sees or touches them, every change is audited,
and the recipients get the customer's alerts from the one sender (a real SMTP server)
through the operator's relay."""

from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote

import pytest

from tests.alerts.conftest import smtp  # noqa: F401  (fixture)
from tests.web.conftest import csrf_of

RELAY = "vendor-relay"


@pytest.fixture
def app(seeded: tuple[Any, Any]) -> Any:
    """The portal on the seeded database, offering e-mail alerts through ``RELAY``."""
    from web.app import create_app
    from web.security import password_hasher
    from web.settings import WebSettings

    ctx, _ = seeded
    return create_app(ctx, WebSettings(secret_key="test-secret", figures_ttl_seconds=0,
                                       customer_mail_via=RELAY),
                      hasher=password_hasher(cheap=True))


@pytest.fixture
def relay(seeded: tuple[Any, Any], smtp: Any) -> Any:  # noqa: F811
    """The operator's relay: an e-mail destination of theirs on a real SMTP server."""
    from alerts.services import add_email
    from yoco.database import unit_of_work

    ctx, _ = seeded
    with unit_of_work(ctx.engine) as s:
        add_email(s, name=RELAY, host=smtp.host, port=smtp.port,
                  mail_from="alerts@vendor.example", mail_to=["oncall@vendor.example"])
    return smtp


def _page(client: Any) -> str:
    r = client.get("/account/alerts")
    assert r.status_code == 200, r.text
    return str(r.text)


def _add(client: Any, email: str, events: tuple[str, ...] = ()) -> Any:
    csrf = csrf_of(_page(client))
    return client.post("/account/alerts/emails", follow_redirects=False,
                       data={"csrf_token": csrf, "email": email, "event": list(events)})


def _state(ctx: Any) -> tuple[Any, ...]:
    """Every destination and every audited change, as they stand."""
    from sqlalchemy import text

    with ctx.engine.connect() as c:
        dests = c.execute(text("SELECT id, name, kind, enabled, mail_to, removed_at FROM "
                               "alert_destinations ORDER BY id")).all()
        changes = c.execute(text("SELECT id FROM alert_destination_changes")).all()
    return tuple(dests), tuple(changes)


def test_a_customer_admin_adds_lists_and_removes_a_recipient(
    client_for: Any, seeded: tuple[Any, Any], relay: Any
) -> None:
    from alerts.errors import BadDestination
    from alerts.models import AlertDestination, AlertDestinationChange
    from alerts.services import set_enabled
    from yoco.database import unit_of_work

    ctx, _ = seeded
    alice = client_for("a")
    page = _page(alice)
    assert 'data-test="email-form"' in page and "No e-mail recipient yet." in page
    r = _add(alice, "  On-Call@Acme.EXAMPLE ", ("year_missed", "credit_issued"))
    assert r.status_code == 303, r.text
    address = "On-Call@acme.example"  # the domain lower-cased, the spaces dropped
    assert r.headers["location"] == f"/account/alerts?added={quote(address)}#emails-h"
    page = alice.get(r.headers["location"]).text
    assert re.search(rf'data-test="email-added"><span class="mono">{address}</span> added',
                     page)
    row = re.search(r'<table class="data stack" data-test="recipients">.*?</table>', page,
                    re.S)
    assert row and address in row.group(0) and "credit issued, year missed" in row.group(0)
    changes = re.search(r'data-test="changes">.*?</table>', page, re.S)
    assert changes and address in changes.group(0) and ">added<" in changes.group(0)
    assert "Alice (user #" in changes.group(0)
    with unit_of_work(ctx.engine) as s:
        (dest,) = s.query(AlertDestination).filter_by(kind="email", customer_managed=True)
        assert (dest.customer, dest.mail_to, dest.enabled) == ("Acme AI", [address], True)
        assert sorted(dest.event_kinds) == ["credit_issued", "year_missed"]
        # the operator's relay: its server and From address, never the customer's choice
        assert (dest.smtp_host, dest.smtp_port, dest.mail_from) == (
            relay.host, relay.port, "alerts@vendor.example")
        name = dest.name

    csrf = csrf_of(page)
    r = alice.post(f"/account/alerts/emails/{name}/remove", data={"csrf_token": csrf},
                   follow_redirects=False)
    assert r.status_code == 303
    page = alice.get(r.headers["location"]).text
    assert 'data-test="email-removed"' in page and "No e-mail recipient yet." in page
    assert ">removed<" in page
    # removed for good: not again from the portal, nor turned on by the operator
    assert alice.post(f"/account/alerts/emails/{name}/remove",
                      data={"csrf_token": csrf}).status_code == 404
    with unit_of_work(ctx.engine) as s:
        dest = s.query(AlertDestination).filter_by(name=name).one()
        assert dest.enabled is False and dest.removed_at is not None
        actions = [c.action for c in s.query(AlertDestinationChange)
                   .filter_by(destination_id=dest.id).order_by(AlertDestinationChange.id)]
        assert actions == ["added", "removed"]
        with pytest.raises(BadDestination, match="removed by its customer's admin"):
            set_enabled(s, name, True)
    # a confirmation is shown only for what happened
    assert 'data-test="email-added"' not in alice.get(
        "/account/alerts?added=ceo%40acme.example").text


def test_bad_input_names_the_field_and_changes_nothing(
    client_for: Any, seeded: tuple[Any, Any], relay: Any, app: Any
) -> None:
    ctx, _ = seeded
    alice = client_for("a")
    assert _add(alice, "ops@acme.example").status_code == 303
    before = _state(ctx)
    for bad, words in (
        ("", "email: enter an e-mail address"),
        ("ops.acme.example", "is not an e-mail address"),
        ("ops@localhost", "is not a mail domain"),
        ("ops@acme.example.", "is not a mail domain"),
        ("ops@-acme.example", "is not a mail domain"),
        ("ops@acme_labs.example", "is not a mail domain"),
        ("ops@10.0.0.7", "is not a mail domain"),
        ("o ps@acme.example", "is not a plain mailbox name"),
        ("ops..x@acme.example", "is not a plain mailbox name"),
        ("<ops@acme.example>", "is not a plain mailbox name"),
        ("ops@acme.example\r\nBcc: x@evil.example", "is not a plain mailbox name"),
        ("x" * 65 + "@acme.example", "at most 64"),
        ("ops@" + "a" * 250 + ".example", "at most 254 characters"),
        ("OPS@ACME.example", "email: OPS@acme.example receives your alerts already"),
    ):
        r = _add(alice, bad)
        assert r.status_code == 422, (bad, r.status_code)
        assert "email: " in r.text and words in r.text, (bad, r.text[-600:])
    r = _add(alice, "new@acme.example", ("record_refused",))  # the operator's kind
    assert r.status_code == 422 and "event: not a customer&#39;s alert" in r.text
    csrf = csrf_of(_page(alice))
    assert alice.post("/account/alerts/emails",
                      data={"email": "new@acme.example"}).status_code == 403  # no form token
    assert _state(ctx) == before

    # Without a relay configured the page offers no form, and a post is refused.
    app.state.portal.settings.customer_mail_via = None
    page = _page(alice)
    assert 'data-test="email-form"' not in page and 'data-test="email-not-offered"' in page
    r = alice.post("/account/alerts/emails", data={"csrf_token": csrf,
                                                   "email": "new@acme.example"})
    assert r.status_code == 422 and "not offered by this operator" in r.text
    assert _state(ctx) == before


def test_another_tenant_never_sees_or_touches_them(
    client_for: Any, seeded: tuple[Any, Any], relay: Any
) -> None:
    from alerts.services import add_customer_email, add_email, customer_recipients
    from yoco.database import unit_of_work

    ctx, _ = seeded
    with unit_of_work(ctx.engine) as s:
        bravo = add_customer_email(s, customer="Bravo Labs", address="ops@bravo.example",
                                   events=["year_missed"], relay=RELAY,
                                   changed_by="Bravo's admin").name
        # the operator's own e-mail destination for Acme: theirs, not the admin's
        add_email(s, name="acme-by-operator", host=relay.host, port=relay.port,
                  mail_from="alerts@vendor.example", mail_to=["cfo@acme.example"],
                  customer="Acme AI")
    alice, bob = client_for("a"), client_for("b")
    page = _page(alice)
    assert "ops@bravo.example" not in page and "Bravo&#39;s admin" not in page
    assert "cfo@acme.example" not in page
    csrf = csrf_of(page)
    for name in (bravo, "acme-by-operator", RELAY):
        assert alice.post(f"/account/alerts/emails/{name}/remove",
                          data={"csrf_token": csrf}).status_code == 404
    # Bob is Bravo's user, not its admin: nothing of the page, nor of its forms
    assert bob.get("/account/alerts").status_code == 404
    bcsrf = csrf_of(bob.get("/contracts/C-B").text)
    assert bob.post("/account/alerts/emails", data={
        "csrf_token": bcsrf, "email": "x@bravo.example"}).status_code == 404
    assert bob.post(f"/account/alerts/emails/{bravo}/remove",
                    data={"csrf_token": bcsrf}).status_code == 404
    with unit_of_work(ctx.engine) as s:
        assert [d.name for d in customer_recipients(s, "Bravo Labs")] == [bravo]
        assert customer_recipients(s, "Acme AI") == []


def test_recipients_get_their_customers_alerts_from_the_one_sender(
    client_for: Any, seeded: tuple[Any, Any], relay: Any
) -> None:
    from alerts.config import AlertsConfig, RetryPolicy
    from alerts.events import NewEvent, raise_event
    from yoco.alerting import deliver_pending
    from yoco.database import unit_of_work

    ctx, _ = seeded
    alice = client_for("a")
    assert _add(alice, "sla@acme.example", ("year_missed",)).status_code == 303
    assert _add(alice, "cfo@acme.example", ("credit_issued",)).status_code == 303
    at = datetime(2026, 6, 1, tzinfo=UTC)

    def event(kind: str, cid: str, n: int) -> NewEvent:
        return NewEvent(kind=kind, key=f"{kind}:{cid}:1:{n}", occurred_at=at,
                        contract_id=cid, year=1, subject=f"{cid} year 1: {kind}",
                        data={"contract_id": cid})

    with unit_of_work(ctx.engine) as s:
        raise_event(s, event("year_missed", "C-A", 1))
        raise_event(s, event("year_missed", "C-B", 1))  # Bravo's: never to Acme's
    config = AlertsConfig(retry=RetryPolicy(max_attempts=1, timeout_s=5.0))
    sent = deliver_pending(ctx.engine, config, sleep=lambda _s: None)
    # the relay (the operator's, every kind) gets both; Acme's recipient only Acme's
    assert sent and all(d.status == "delivered" for d in sent), sent
    assert sum(d.destination.startswith("cust-mail-") for d in sent) == 1, sent
    mine = [m for m in relay.messages if "sla@acme.example" in m.rcpt_tos]
    assert len(mine) == 1 and mine[0].mail_from == "alerts@vendor.example"
    assert b"C-A year 1: year_missed" in mine[0].content
    assert not any("cfo@acme.example" in m.rcpt_tos for m in relay.messages)  # not its kind
    assert not any(b"C-B" in m.content and set(m.rcpt_tos) & {"sla@acme.example"}
                   for m in relay.messages)

    # Removed: the next alert of that kind reaches nobody at Acme.
    page = _page(alice)
    name = re.search(r'action="/account/alerts/emails/([^/"]+)/remove"', page)
    assert name
    alice.post(f"/account/alerts/emails/{name.group(1)}/remove",
               data={"csrf_token": csrf_of(page)})
    count = len(relay.messages)
    with unit_of_work(ctx.engine) as s:
        raise_event(s, event("year_missed", "C-A", 2))
    deliver_pending(ctx.engine, config, sleep=lambda _s: None)
    assert not any("sla@acme.example" in m.rcpt_tos for m in relay.messages[count:])
