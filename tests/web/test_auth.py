"""Passwords, sessions, cookies, CSRF, login rate limiting, tokens, error pages."""

from __future__ import annotations

from fastapi.testclient import TestClient
from sqlalchemy import text

from tests.web.conftest import PASSWORD, csrf_of, login


def test_login_sets_a_safe_session_cookie_and_logout_ends_it(client_for, seed) -> None:
    c = client_for()
    assert c.get("/contracts/C-A", follow_redirects=False).headers["location"].startswith(
        "/login?next=")
    r = login(c, seed.users["a"])
    assert r.status_code == 303
    cookie = r.headers["set-cookie"]
    assert "yoco_session=" in cookie and "HttpOnly" in cookie and "SameSite=lax" in cookie
    assert "Secure" not in cookie  # plain HTTP in tests
    old = c.cookies.get("yoco_session")
    assert c.get("/contracts/C-A").status_code == 200
    token = csrf_of(c.get("/contracts/C-A").text)
    assert c.post("/logout", data={"csrf_token": token}, follow_redirects=False
                  ).status_code == 303
    # The old cookie is dead server-side, not just forgotten by the browser.
    c.cookies.set("yoco_session", old)
    assert c.get("/contracts/C-A", follow_redirects=False).status_code == 303


def test_cookies_are_secure_over_https(app, seed) -> None:
    with TestClient(app, base_url="https://portal.example") as c:
        r = login(c, seed.users["a"])
        assert r.status_code == 303
        assert "Secure" in r.headers["set-cookie"]


def test_wrong_passwords_are_refused_then_rate_limited(client_for, seed) -> None:
    c = client_for()
    for _ in range(5):
        r = login(c, seed.users["a"], "wrong password!")
        assert r.status_code == 401
        assert "do not match" in r.text
    r = login(c, seed.users["a"])  # even the right password, while limited
    assert r.status_code == 429 and int(r.headers["retry-after"]) > 0
    # Unknown accounts get the same answer as wrong passwords.
    r = login(client_for(), "nobody@nowhere.example", "whatever-pass")
    assert r.status_code == 401 and "do not match" in r.text


def test_every_form_needs_its_csrf_token(client_for, seed) -> None:
    c = client_for()
    c.get("/login")
    r = c.post("/login", data={"email": seed.users["a"], "password": PASSWORD})
    assert r.status_code == 403
    alice = client_for("a")
    fid = seed.failures["C-A"][1]
    r = alice.post(f"/contracts/C-A/failures/{fid}/disputes", data={"reason": "x"})
    assert r.status_code == 403
    r = alice.post(f"/contracts/C-A/failures/{fid}/disputes",
                   data={"reason": "x", "csrf_token": "0" * 64})
    assert r.status_code == 403
    assert alice.post("/logout", data={}).status_code == 403
    # Another session's token does not work either.
    bob = client_for("b")
    bobs = csrf_of(bob.get("/contracts/C-B").text)
    r = alice.post(f"/contracts/C-A/failures/{fid}/disputes",
                   data={"reason": "x", "csrf_token": bobs})
    assert r.status_code == 403


def test_secrets_are_stored_hashed(client_for, seed, owner_engine) -> None:
    client_for("a")
    with owner_engine.connect() as c:
        hashes = c.execute(text("SELECT password_hash FROM portal_users")).scalars().all()
        assert hashes and all(h.startswith("$argon2id$") for h in hashes)
        assert all(PASSWORD not in h for h in hashes)
        stored = c.execute(text("SELECT prefix, secret_hash FROM api_tokens")).all()
        assert all(seed.token.encode() not in bytes(h) for _, h in stored)
        assert seed.token.startswith(stored[0][0]) or seed.token.startswith(stored[1][0])
        sessions = c.execute(text("SELECT token_hash FROM portal_sessions")).scalars().all()
        assert all(len(bytes(s)) == 32 for s in sessions)


def test_a_tampered_session_cookie_is_nobody(client_for) -> None:
    alice = client_for("a")
    value = alice.cookies.get("yoco_session")
    alice.cookies.set("yoco_session", value[:-3] + ("AAA" if value[-3:] != "AAA" else "BBB"))
    assert alice.get("/contracts/C-A", follow_redirects=False).status_code == 303


def test_error_pages_show_no_stack_trace(app, client_for, monkeypatch) -> None:
    import web.services

    def boom(*a, **k):
        raise RuntimeError("secret internals: /srv/db password=hunter2")

    monkeypatch.setattr(web.services, "visible_contracts", boom)
    monkeypatch.setattr(web.services, "contract_page", boom)  # the API's paged list
    alice = client_for("a")
    r = alice.get("/contracts")
    assert r.status_code == 500
    assert "Traceback" not in r.text and "hunter2" not in r.text and "RuntimeError" not in r.text
    assert "Something went wrong" in r.text
    r = alice.get("/api/v1/contracts")
    assert r.status_code == 500 and r.json() == {"detail": r.json()["detail"]}
    assert "hunter2" not in r.text
    r = alice.get("/no/such/page")
    assert r.status_code == 404 and "Traceback" not in r.text


def test_security_headers(client_for) -> None:
    r = client_for().get("/login")
    assert r.headers["x-frame-options"] == "DENY"
    assert "default-src 'self'" in r.headers["content-security-policy"]
    assert r.headers["x-content-type-options"] == "nosniff"


def test_login_redirects_only_to_local_paths(client_for, seed) -> None:
    c = client_for()
    page = c.get("/login")
    r = c.post("/login", data={"email": seed.users["a"], "password": PASSWORD,
                               "csrf_token": csrf_of(page.text),
                               "next": "//evil.example/x"}, follow_redirects=False)
    assert r.headers["location"] == "/"


def test_after_a_refused_login_the_password_field_has_the_focus(client_for, seed) -> None:
    import re

    c = client_for()
    fresh = c.get("/login").text
    assert re.search(r'name="email"[^>]*autofocus', fresh)
    assert not re.search(r'name="password"[^>]*autofocus', fresh)
    r = login(c, seed.users["a"], "wrong password!")
    refused = r.text
    assert 'role="alert" id="login-error"' in refused
    assert re.search(r'name="password"[^>]*autofocus[^>]*aria-describedby="login-error"',
                     refused)
    assert not re.search(r'name="email"[^>]*autofocus', refused)
