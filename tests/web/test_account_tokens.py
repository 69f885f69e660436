"""A customer's own admin manages their organisation's API tokens in the portal:
create (shown once) and revoke, scoped to their customer, every change CSRF-checked."""

from __future__ import annotations

import re
from html import unescape

from tests.web.conftest import csrf_of
from web.security import token_prefix


def _tokens(client):
    page = client.get("/account/tokens")
    assert page.status_code == 200, page.text
    return page


def _create(client, **form):
    csrf = csrf_of(_tokens(client).text)
    return client.post("/account/tokens", data={"csrf_token": csrf, **form})


def _token_text(html: str) -> str:
    m = re.search(r'data-test="token-text">([^<]+)<', html)
    assert m, html
    return unescape(m.group(1))


def test_only_a_customer_admin_sees_the_page(client_for) -> None:
    alice, bob, olga = client_for("a"), client_for("b"), client_for("op")
    page = _tokens(alice).text
    assert 'href="/account/tokens"' in page and "API tokens of Acme AI" in page
    assert page and "runtime-a" in page and "bravo-tools" not in page  # Acme's tokens only
    assert _tokens(alice).headers["cache-control"] == "no-store"
    for who in (bob, olga):  # no admin, staff: not advertised, not there
        assert who.get("/account/tokens").status_code == 404
        assert 'href="/account/tokens"' not in who.get("/contracts").text
    csrf = csrf_of(bob.get("/contracts/C-B/failures").text)
    assert bob.post("/account/tokens", data={"csrf_token": csrf, "name": "x",
                                              "kind": "read"}).status_code == 404


def test_create_use_and_revoke_a_read_token(client_for, app) -> None:
    from fastapi.testclient import TestClient

    alice = client_for("a")
    made = _create(alice, name="grafana", kind="read")
    assert made.status_code == 200 and made.headers["cache-control"] == "no-store"
    text = _token_text(made.text)
    api = TestClient(app)
    got = api.get("/api/v1/contracts", headers={"Authorization": f"Bearer {text}"})
    assert got.status_code == 200, got.text
    assert sorted(c["contract_id"] for c in got.json()) == ["C-A", "C-A2"]
    # shown once: the list names it by its prefix, never its text again
    listed = _tokens(alice).text
    assert text not in listed and token_prefix(text) in listed
    prefix = token_prefix(text)
    csrf = csrf_of(listed)
    r = alice.post(f"/account/tokens/{prefix}/revoke", data={"csrf_token": csrf},
                   follow_redirects=False)
    assert r.status_code == 303 and r.headers["location"] == f"/account/tokens?revoked={prefix}"
    assert api.get("/api/v1/contracts",
                   headers={"Authorization": f"Bearer {text}"}).status_code == 401
    assert "revoked" in _tokens(alice).text


def test_records_tokens_only_for_the_customers_contracts(client_for, app, seed) -> None:
    from fastapi.testclient import TestClient

    alice = client_for("a")
    refused = _create(alice, name="runtime", kind="records", contract=["C-A", "C-B"])
    assert refused.status_code == 422  # web.errors.Invalid
    assert "not yours: C-B" in refused.text
    assert _create(alice, name="runtime", kind="records").status_code == 422
    assert _create(alice, name="", kind="read").status_code == 422
    assert _create(alice, name="x", kind="admin").status_code == 422
    made = _create(alice, name="runtime-2", kind="records", contract=["C-A2"])
    assert made.status_code == 200, made.text
    text = _token_text(made.text)
    # a records token reads nothing
    assert TestClient(app).get("/api/v1/contracts", headers={
        "Authorization": f"Bearer {text}"}).status_code in (401, 403)
    assert "post records for C-A2" in _tokens(alice).text


def test_no_change_without_the_form_token_and_never_another_customers(client_for, seed) -> None:
    alice = client_for("a")
    before = _tokens(alice).text.count("<tr>")
    r = alice.post("/account/tokens", data={"name": "x", "kind": "read"})
    assert r.status_code == 403
    assert _tokens(alice).text.count("<tr>") == before
    # Bravo's token: not Acme's to revoke (404), and it stays live
    bravo = token_prefix(seed.read_token_b)
    csrf = csrf_of(_tokens(alice).text)
    assert alice.post(f"/account/tokens/{bravo}/revoke",
                      data={"csrf_token": csrf}).status_code == 404
    assert alice.post(f"/account/tokens/{token_prefix(seed.token)}/revoke",
                      data={}).status_code == 403
    bob = client_for("b")
    assert bob.get("/api/v1/contracts",
                   headers={"Authorization": f"Bearer {seed.read_token_b}"}).status_code == 200


# --------------------------------------------------------------------------- alerts

PUBLIC = "https://93.184.216.34/yoco-hook"  # a public address literal: nothing resolved


def _add_hook(client, url, events=()):
    csrf = csrf_of(client.get("/account/alerts").text)
    return client.post("/account/alerts", data={"csrf_token": csrf, "url": url,
                                                "event": list(events)})


def test_a_customer_admin_adds_a_webhook_of_their_own(client_for, seeded) -> None:
    from alerts.models import AlertDestination
    from alerts.services import add_webhook
    from yoco.database import unit_of_work

    ctx, _ = seeded
    alice, bob = client_for("a"), client_for("b")
    assert bob.get("/account/alerts").status_code == 404
    made = _add_hook(alice, PUBLIC, ["year_missed", "credit_issued"])
    assert made.status_code == 200 and made.headers["cache-control"] == "no-store"
    secret = re.search(r'data-test="webhook-secret">([^<]+)<', made.text).group(1)
    assert secret.startswith("whsec_")
    with unit_of_work(ctx.engine) as s:
        (dest,) = s.query(AlertDestination).filter_by(url=PUBLIC).all()
        assert (dest.customer, dest.customer_managed, dest.allow_unsafe_address) == (
            "Acme AI", True, False)
        assert sorted(dest.event_kinds) == ["credit_issued", "year_missed"]
        name = dest.name
        # Bravo's own webhook, added by the operator: Acme's admin neither sees nor turns it
        add_webhook(s, name="bravo-ops", url="https://93.184.216.35/b",
                    customer="Bravo Labs")
    page = alice.get("/account/alerts").text
    assert name in page and secret not in page and "bravo-ops" not in page
    csrf = csrf_of(page)
    assert alice.post("/account/alerts/bravo-ops/disable",
                      data={"csrf_token": csrf}).status_code == 404
    r = alice.post(f"/account/alerts/{name}/disable", data={"csrf_token": csrf},
                   follow_redirects=False)
    assert r.status_code == 303
    assert alice.post(f"/account/alerts/{name}/disable", data={}).status_code == 403
    with unit_of_work(ctx.engine) as s:
        assert s.query(AlertDestination).filter_by(name=name).one().enabled is False
        assert s.query(AlertDestination).filter_by(name="bravo-ops").one().enabled is True


def test_a_customers_webhook_reaches_public_addresses_only(client_for, seeded) -> None:
    from alerts.models import AlertDestination
    from alerts.send import send_webhook
    from yoco.database import unit_of_work

    ctx, _ = seeded
    alice = client_for("a")
    for url, why in (("https://127.0.0.1/x", "loopback"),
                     ("https://10.1.2.3/x", "not a public address"),
                     ("https://[::ffff:192.168.1.1]/x", "not a public address"),
                     ("https://169.254.169.254/latest", "metadata")):
        r = _add_hook(alice, url)
        assert r.status_code == 422 and why in r.text, (url, r.text[-800:])
    assert _add_hook(alice, PUBLIC, ["record_refused"]).status_code == 422  # operator's kind
    with unit_of_work(ctx.engine) as s:
        assert s.query(AlertDestination).filter_by(customer_managed=True).count() == 0
    # at each send too: a name that resolves to loopback later is refused, not connected to
    dest = AlertDestination(name="cust-x", kind="webhook", url="https://127.0.0.1:9/x",
                            secret="s" * 20, customer="Acme AI", customer_managed=True,
                            allow_unsafe_address=False)
    from datetime import UTC, datetime

    got = send_webhook(dest, None, delivery_id=1, attempt=1, body=b"{}",  # type: ignore[arg-type]
                       now=datetime.now(UTC), timeout_s=1)
    assert not got.ok and "loopback" in (got.error or "")
