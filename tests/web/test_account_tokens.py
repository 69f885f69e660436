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
