"""Every state-changing route, as every kind of caller, for every tenant: the allowed set, exactly.

The routes are enumerated from the FastAPI app itself, so a new POST/PUT/PATCH/DELETE
route without an entry in :data:`CASES` fails :func:`test_every_write_route_allows_exactly`.
Callers: anonymous, customer A's and customer B's users, an operator, finance, and API
tokens of each scope (ingest for A, ingest for B, read for A, read for B).  Tenants: A's
contract ``C-A`` and B's ``C-B``.  Every refused request must leave the ledger (every
log's entries and every signed checkpoint) exactly as it was; every allowed one that
records something must have added to it.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import text

from tests import factories as fx
from tests.web.conftest import PASSWORD, app_routes, csrf_of, login

USERS = {"cust_a": "a", "cust_b": "b", "op": "op", "fin": "fin"}
TOKENS = ("ingest_a", "ingest_b", "read_a", "read_b")
CALLERS = ("anon", *USERS, *TOKENS)
TENANTS = {"A": "C-A", "B": "C-B"}
WRITES = {"POST", "PUT", "PATCH", "DELETE"}
NOW = datetime(2027, 1, 5, tzinfo=UTC)  # contract year 1 (2026) has ended: it can be closed


@dataclass(frozen=True)
class Case:
    """How to call one route for a tenant, and what each caller must get.

    ``expect(caller, tenant)`` is ``"ok"`` (allowed: 2xx, or a 303 anywhere but the
    login form), ``"login"`` (401, or a 303 to the login form) or a refusal status.
    ``writes``: an allowed call adds to the ledger.
    """

    call: Callable[[TestClient, str, str, Any], Any]
    expect: Callable[[str, str | None], str | int]
    writes: bool
    tenanted: bool = True
    done_at: str | None = None  # where a 303 sends the caller when it was done, if /login


def _page_refusal(caller: str) -> str | int | None:
    """What a page (a logged-in person's route) answers callers that are not persons."""
    if caller == "anon" or caller in TOKENS:
        return "login"  # a bearer token is nobody on the pages
    return None


def _dispute_open(c: TestClient, cid: str, csrf: str, seed: Any) -> Any:
    fid = seed.failures[cid][0]  # no dispute open on it yet
    return c.post(f"/contracts/{cid}/failures/{fid}/disputes",
                  data={"csrf_token": csrf, "reason": "the walk disputes this"},
                  follow_redirects=False)


def _expect_dispute_open(caller: str, tenant: str | None) -> str | int:
    refused = _page_refusal(caller)
    if refused is not None:
        return refused
    if caller in ("op", "fin"):
        return 403  # staff see the failure but only the customer disputes it
    return "ok" if caller == f"cust_{tenant.lower()}" else 404  # type: ignore[union-attr]


def _operator_only(caller: str, tenant: str | None) -> str | int:
    refused = _page_refusal(caller)
    if refused is not None:
        return refused
    return "ok" if caller == "op" else 404  # staff pages are not advertised to others


def _finance_or_operator(caller: str, tenant: str | None) -> str | int:
    refused = _page_refusal(caller)
    if refused is not None:
        return refused
    return "ok" if caller in ("op", "fin") else 404


def _expect_ingest(caller: str, tenant: str | None) -> str | int:
    if caller == "anon" or caller in USERS:
        return "login"  # ingestion takes a bearer token only
    if caller.startswith("read_"):
        return 403
    return "ok" if caller == f"ingest_{tenant.lower()}" else 403  # type: ignore[union-attr]


def _a_failed_delivery(c: TestClient) -> int:
    """A failed delivery to a disabled webhook (a replay fails at once, sending nothing)."""
    from alerts.events import NewEvent, raise_event
    from alerts.services import add_webhook, list_destinations, set_enabled

    portal = c.app.state.portal  # type: ignore[attr-defined]
    with portal.db.write() as s:
        if "walk-hook" not in {d.name for d in list_destinations(s)}:
            add_webhook(s, name="walk-hook", url="http://127.0.0.1:9/walk")
        set_enabled(s, "walk-hook", True)
        raise_event(s, NewEvent(kind="test", key=f"test:walk:{uuid.uuid4()}",
                                occurred_at=NOW, subject="walk", data={}))
        set_enabled(s, "walk-hook", False)
        did = s.execute(text("SELECT max(id) FROM alert_deliveries")).scalar_one()
        s.execute(text("UPDATE alert_deliveries SET status = 'failed' WHERE id = :i"),
                  {"i": did})
    return int(did)


def _expect_login(caller: str, tenant: str | None) -> str | int:
    return 403 if caller in TOKENS else "ok"  # a token has no form (no CSRF token)


def _expect_logout(caller: str, tenant: str | None) -> str | int:
    # anyone with the form (a visitor has one, bound to its anonymous cookie) may end
    # their own session; a token has no form
    return 403 if caller in TOKENS else "ok"


def _customer_admin_only(caller: str, tenant: str | None) -> str | int:
    refused = _page_refusal(caller)
    if refused is not None:
        return refused
    # Acme's admin (cust_a), for Acme's own tokens and webhooks; everyone else: 404
    return "ok" if caller == "cust_a" and tenant in ("A", None) else 404


_CUSTOMERS = {"C-A": "Acme AI", "C-B": "Bravo Labs"}


def _a_fresh_token(c: TestClient, cid: str) -> str:
    """A new read token of the contract's customer (each call revokes one)."""
    from web.accounts import create_token

    with c.app.state.portal.db.write() as s:  # type: ignore[attr-defined]
        return create_token(s, name="walk", customer=_CUSTOMERS[cid]).row.prefix


def _a_fresh_hook(c: TestClient, cid: str) -> str:
    """A new webhook of the contract's customer (each call turns one off)."""
    from alerts.services import add_webhook

    name = f"walk-{uuid.uuid4().hex[:8]}"
    with c.app.state.portal.db.write() as s:  # type: ignore[attr-defined]
        add_webhook(s, name=name, url="https://93.184.216.34/walk", customer=_CUSTOMERS[cid])
    return name


def _relay(c: TestClient) -> None:
    """The operator's e-mail relay the walk app names (customer_mail_via), once."""
    from alerts.services import add_email, list_destinations

    with c.app.state.portal.db.write() as s:  # type: ignore[attr-defined]
        if "walk-relay" not in {d.name for d in list_destinations(s)}:
            add_email(s, name="walk-relay", host="127.0.0.1", port=25,
                      mail_from="alerts@vendor.example", mail_to=["ops@vendor.example"])


def _a_fresh_recipient(c: TestClient, cid: str) -> str:
    """A new e-mail recipient of the contract's customer (each call removes one)."""
    from alerts.services import add_customer_email

    _relay(c)
    with c.app.state.portal.db.write() as s:  # type: ignore[attr-defined]
        return add_customer_email(
            s, customer=_CUSTOMERS[cid], address=f"walk-{uuid.uuid4().hex[:8]}@acme.example",
            events=["year_missed"], relay="walk-relay", changed_by="walk").name


def _add_recipient(c: TestClient, csrf: str) -> Any:
    _relay(c)
    return c.post("/account/alerts/emails", data={
        "csrf_token": csrf, "email": f"walk-{uuid.uuid4().hex[:8]}@acme.example"},
        follow_redirects=False)


CASES: dict[tuple[str, str], Case] = {
    ("POST", "/account/tokens"): Case(
        call=lambda c, cid, csrf, seed: c.post(
            "/account/tokens", data={"csrf_token": csrf, "name": "walk", "kind": "read"},
            follow_redirects=False),
        expect=_customer_admin_only, writes=False, tenanted=False),
    ("POST", "/account/tokens/{prefix}/revoke"): Case(
        call=lambda c, cid, csrf, seed: c.post(
            f"/account/tokens/{_a_fresh_token(c, cid)}/revoke", data={"csrf_token": csrf},
            follow_redirects=False),
        expect=_customer_admin_only, writes=False),
    ("POST", "/account/alerts"): Case(
        call=lambda c, cid, csrf, seed: c.post(
            "/account/alerts", data={"csrf_token": csrf,
                                     "url": "https://93.184.216.34/walk"},
            follow_redirects=False),
        expect=_customer_admin_only, writes=False, tenanted=False),
    ("POST", "/account/alerts/{name}/{action}"): Case(
        call=lambda c, cid, csrf, seed: c.post(
            f"/account/alerts/{_a_fresh_hook(c, cid)}/disable", data={"csrf_token": csrf},
            follow_redirects=False),
        expect=_customer_admin_only, writes=False),
    ("POST", "/account/alerts/emails"): Case(
        call=lambda c, cid, csrf, seed: _add_recipient(c, csrf),
        expect=_customer_admin_only, writes=False, tenanted=False),
    ("POST", "/account/alerts/emails/{name}/remove"): Case(
        call=lambda c, cid, csrf, seed: c.post(
            f"/account/alerts/emails/{_a_fresh_recipient(c, cid)}/remove",
            data={"csrf_token": csrf}, follow_redirects=False),
        expect=_customer_admin_only, writes=False),
    ("POST", "/login"): Case(
        call=lambda c, cid, csrf, seed: c.post(
            "/login", data={"email": seed.users["a"], "password": PASSWORD,
                            "csrf_token": csrf, "next": "/"}, follow_redirects=False),
        expect=_expect_login, writes=False, tenanted=False),
    ("POST", "/logout"): Case(
        call=lambda c, cid, csrf, seed: c.post(
            "/logout", data={"csrf_token": csrf}, follow_redirects=False),
        expect=_expect_logout, writes=False, tenanted=False, done_at="/login"),
    ("POST", "/contracts/{contract_id}/failures/{event_id}/disputes"): Case(
        call=_dispute_open, expect=_expect_dispute_open, writes=True),
    ("POST", "/operator/checkpoints"): Case(
        call=lambda c, cid, csrf, seed: c.post(
            "/operator/checkpoints", data={"csrf_token": csrf}, follow_redirects=False),
        expect=_operator_only, writes=False, tenanted=False),  # writes only if a log grew
    ("POST", "/operator/disputes/{dispute_id}"): Case(
        call=lambda c, cid, csrf, seed: c.post(
            f"/operator/disputes/{seed.disputes[cid]}",
            data={"csrf_token": csrf, "decision": "reject", "note": "walked"},
            follow_redirects=False),
        expect=_operator_only, writes=True),
    ("POST", "/operator/years/close"): Case(
        call=lambda c, cid, csrf, seed: c.post(
            "/operator/years/close", data={"csrf_token": csrf, "contract_id": cid, "year": "1"},
            follow_redirects=False),
        expect=_operator_only, writes=True),
    ("POST", "/operator/alerts/replay"): Case(
        call=lambda c, cid, csrf, seed: c.post(
            "/operator/alerts/replay",
            data={"csrf_token": csrf, "delivery_id": str(_a_failed_delivery(c))},
            follow_redirects=False),
        expect=_operator_only, writes=True, tenanted=False),  # writes the replay's audit row
    ("POST", "/finance/export.{fmt}"): Case(
        call=lambda c, cid, csrf, seed: c.post(
            "/finance/export.csv", data={"csrf_token": csrf}, follow_redirects=False),
        # the first export is recorded; an identical one again is not (billing's rule)
        expect=_finance_or_operator, writes=False, tenanted=False),
    ("POST", "/api/v1/records"): Case(
        call=lambda c, cid, csrf, seed: c.post(
            "/api/v1/records",
            json=[fx.rec("job_started", cid, fx.T0, job_id=f"walk-{uuid.uuid4().hex[:8]}",
                         gpus=8)]),
        expect=_expect_ingest, writes=True),
}


def write_routes(app: Any) -> set[tuple[str, str]]:
    """Every (method, path) of the app that can change state."""
    return {
        (m, r.path)
        for r in app_routes(app)
        for m in r.methods
        if m in WRITES
    }


def outcome(r: Any, done_at: str | None = None) -> str | int:
    """``ok``, ``login`` or the refusal status of a response."""
    if r.status_code == 303:
        if done_at is not None and r.headers["location"] == done_at:
            return "ok"
        return "login" if r.headers["location"].startswith("/login") else "ok"
    if r.status_code == 401:
        return "login"
    if 200 <= r.status_code < 300:
        return "ok"
    return int(r.status_code)


def ledger_state(engine: Any) -> tuple[Any, ...]:
    """Every log's entry count and last hash, and every signed checkpoint."""
    with engine.connect() as c:
        logs = c.execute(text(
            "SELECT log_id, count(*), max(seq) FROM journal_entries GROUP BY log_id "
            "ORDER BY log_id")).all()
        heads = c.execute(text(
            "SELECT log_id, tree_size FROM checkpoints ORDER BY log_id, tree_size")).all()
        disputes = c.execute(text(
            "SELECT dispute_id, status FROM billing_disputes ORDER BY dispute_id")).all()
        replays = c.execute(text("SELECT count(*) FROM alert_replays")).scalar_one()
    return tuple(logs), tuple(heads), tuple(disputes), replays


@pytest.fixture
def walk_app(seeded: Any) -> Any:
    from web.app import create_app
    from web.security import password_hasher
    from web.settings import WebSettings

    ctx, _ = seeded
    return create_app(ctx, WebSettings(secret_key="walk", figures_ttl_seconds=0,
                                       customer_mail_via="walk-relay"),
                      hasher=password_hasher(cheap=True), clock=lambda: NOW)


@pytest.fixture
def tokens(seeded: Any) -> dict[str, str]:
    from web.accounts import create_token
    from yoco.database import unit_of_work

    ctx, seed = seeded
    with unit_of_work(ctx.engine) as s:
        made = {
            "ingest_b": create_token(s, name="runtime-b", contract_ids=["C-B"]).text,
            "read_a": create_token(s, name="acme-tools", customer="Acme AI").text,
        }
    return {"ingest_a": seed.token, "read_b": seed.read_token_b, **made}


def _client(app: Any, caller: str, seed: Any, tokens: dict[str, str]) -> tuple[TestClient, str]:
    """A client acting as ``caller`` and the CSRF token it can show (empty if none)."""
    c = TestClient(app, raise_server_exceptions=False)
    c.__enter__()
    if caller in TOKENS:
        c.headers["Authorization"] = f"Bearer {tokens[caller]}"
        return c, ""
    if caller == "anon":
        return c, csrf_of(c.get("/login").text)
    assert login(c, seed.users[USERS[caller]]).status_code == 303
    return c, csrf_of(c.get("/contracts").text)


def test_every_write_route_has_a_case(app) -> None:
    assert len(app_routes(app)) >= 30  # the walk really sees the app's routes
    missing = write_routes(app) - set(CASES)
    assert not missing, f"state-changing routes with no entry in CASES: {sorted(missing)}"
    assert not set(CASES) - write_routes(app), "CASES names a route the app does not have"


def test_every_write_route_allows_exactly(walk_app, seeded, tokens) -> None:
    ctx, seed = seeded
    assert write_routes(walk_app) == set(CASES)
    got: dict[tuple[str, str, str, str | None], str | int] = {}
    want: dict[tuple[str, str, str, str | None], str | int] = {}
    for (method, path), case in sorted(CASES.items()):
        tenants: list[str | None] = list(TENANTS) if case.tenanted else [None]
        for tenant in tenants:
            cid = TENANTS[tenant] if tenant else "C-A"
            for caller in CALLERS:
                c, csrf = _client(walk_app, caller, seed, tokens)
                try:
                    before = ledger_state(ctx.engine)
                    r = case.call(c, cid, csrf, seed)
                    after = ledger_state(ctx.engine)
                finally:
                    c.__exit__(None, None, None)
                key = (method, path, caller, tenant)
                got[key] = outcome(r, case.done_at)
                want[key] = case.expect(caller, tenant)
                assert r.status_code < 500, (key, r.status_code, r.text[:300])
                if got[key] != "ok":
                    assert after == before, f"refused {key} changed the ledger"
                elif case.writes:
                    assert after != before, f"allowed {key} recorded nothing"
    with ctx.engine.connect() as c:  # the allowed export was recorded (once: same content)
        assert c.execute(text("SELECT count(*) FROM billing_exports")).scalar() == 1
    wrong = {k: (got[k], want[k]) for k in want if got[k] != want[k]}
    assert not wrong, f"(got, wanted) where they differ: {wrong}"
    allowed = sorted(k for k, v in got.items() if v == "ok" and k[0:2] not in (
        ("POST", "/login"), ("POST", "/logout")))
    assert allowed == sorted([
        ("POST", "/account/alerts", "cust_a", None),
        ("POST", "/account/alerts/emails", "cust_a", None),
        ("POST", "/account/alerts/emails/{name}/remove", "cust_a", "A"),
        ("POST", "/account/alerts/{name}/{action}", "cust_a", "A"),
        ("POST", "/account/tokens", "cust_a", None),
        ("POST", "/account/tokens/{prefix}/revoke", "cust_a", "A"),
        ("POST", "/api/v1/records", "ingest_a", "A"),
        ("POST", "/api/v1/records", "ingest_b", "B"),
        ("POST", "/contracts/{contract_id}/failures/{event_id}/disputes", "cust_a", "A"),
        ("POST", "/contracts/{contract_id}/failures/{event_id}/disputes", "cust_b", "B"),
        ("POST", "/finance/export.{fmt}", "fin", None),
        ("POST", "/finance/export.{fmt}", "op", None),
        ("POST", "/operator/alerts/replay", "op", None),
        ("POST", "/operator/checkpoints", "op", None),
        ("POST", "/operator/disputes/{dispute_id}", "op", "A"),
        ("POST", "/operator/disputes/{dispute_id}", "op", "B"),
        ("POST", "/operator/years/close", "op", "A"),
        ("POST", "/operator/years/close", "op", "B"),
    ])


def test_only_the_customer_opens_and_nobody_decides_their_own(client_for, seed, seeded) -> None:
    """Staff cannot open a dispute, so an operator cannot open one and decide it alone."""
    ctx, _ = seeded
    fid = seed.failures["C-A"][0]
    for who in ("op", "fin"):
        c = client_for(who)
        token = csrf_of(c.get(f"/contracts/C-A/failures/{fid}").text)
        before = ledger_state(ctx.engine)
        r = c.post(f"/contracts/C-A/failures/{fid}/disputes",
                   data={"csrf_token": token, "reason": "staff try"}, follow_redirects=False)
        assert r.status_code == 403 and "customer" in r.text
        assert ledger_state(ctx.engine) == before
    # The page offers staff no dispute form either.
    assert "Open a dispute" not in client_for("op").get(f"/contracts/C-A/failures/{fid}").text


def test_one_open_dispute_per_failure(client_for, seed, seeded) -> None:
    ctx, _ = seeded
    alice = client_for("a")
    fid = seed.failures["C-A"][0]
    url = f"/contracts/C-A/failures/{fid}/disputes"
    token = csrf_of(alice.get(f"/contracts/C-A/failures/{fid}").text)
    first = alice.post(url, data={"csrf_token": token, "reason": "first"},
                       follow_redirects=False)
    assert first.status_code == 303
    before = ledger_state(ctx.engine)
    for n in range(3):
        again = alice.post(url, data={"csrf_token": token, "reason": f"again {n}"},
                           follow_redirects=False)
        assert again.status_code == 409 and "already has an open dispute" in again.text
    assert ledger_state(ctx.engine) == before
    # Once the operator decided it, the customer may dispute the failure again.
    olga = client_for("op")
    queue = olga.get("/operator/disputes").text
    with ctx.engine.connect() as c:
        did = c.execute(text("SELECT dispute_id FROM billing_disputes WHERE status = 'open' "
                             "AND failure_event_id = :f"), {"f": fid}).scalar_one()
    r = olga.post(f"/operator/disputes/{did}", data={"csrf_token": csrf_of(queue),
                  "decision": "reject", "note": "no"}, follow_redirects=False)
    assert r.status_code == 303
    assert alice.post(url, data={"csrf_token": token, "reason": "new evidence"},
                      follow_redirects=False).status_code == 303
