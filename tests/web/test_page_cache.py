"""The rendered-page cache and the year-view cache: behaviour only (no timings).

- a new ledger record invalidates cached pages and API answers at once;
- a cached body is never served across tenants, and never carries the caller's header;
- a view that only aged past the TTL is refreshed in the background.
"""

from __future__ import annotations

import json
import threading
import time
from datetime import timedelta
from types import SimpleNamespace

import pytest
from fastapi.testclient import TestClient

from tests import factories as fx
from tests.web.conftest import login


@pytest.fixture
def cached_app(seeded):
    """The portal with a long figures TTL, so views and pages are really reused."""
    from web.app import create_app
    from web.security import password_hasher
    from web.settings import WebSettings

    ctx, _ = seeded
    return create_app(
        ctx,
        WebSettings(secret_key="test-secret", figures_ttl_seconds=3600),
        hasher=password_hasher(cheap=True),
    )


@pytest.fixture
def client_of(cached_app, seed):
    clients: list[TestClient] = []

    def make(key: str | None = None) -> TestClient:
        c = TestClient(cached_app, raise_server_exceptions=False)
        c.__enter__()
        clients.append(c)
        if key is not None:
            assert login(c, seed.users[key]).status_code == 303
        return c

    yield make
    for c in clients:
        c.__exit__(None, None, None)


def test_a_new_record_invalidates_cached_pages_and_api_answers(client_of, cached_app, seed):
    alice = client_of("a")
    first = alice.get("/contracts/C-A")
    assert first.status_code == 200 and "6 failures in all" in first.text
    again = alice.get("/contracts/C-A")
    assert again.text == first.text  # served from the cache
    assert "6 failures in year 1" in alice.get("/contracts/C-A/failures").text
    api = alice.get("/api/v1/contracts/C-A/failures").json()
    assert api["total"] == 6
    year = alice.get("/api/v1/contracts/C-A/years/1").json()
    pages = cached_app.state.portal.cache.pages
    assert pages.hits >= 1 and len(pages) >= 4

    new = fx.rec("failure", "C-A", fx.T0 + timedelta(days=130), job_id="j1",
                 failure_class="unplanned", cause="gpu_lost", node="node-900", gpu=1, step=5)
    r = alice.post("/api/v1/records", content=json.dumps([new]),
                   headers={"Authorization": f"Bearer {seed.token}",
                            "Content-Type": "application/json"})
    assert r.status_code == 200 and r.json()["appended"] == 1

    assert "7 failures in all" in alice.get("/contracts/C-A").text
    assert "7 failures in year 1" in alice.get("/contracts/C-A/failures").text
    api = alice.get("/api/v1/contracts/C-A/failures").json()
    assert api["total"] == 7 and new["event_id"] in {i["event_id"] for i in api["items"]}
    after = alice.get("/api/v1/contracts/C-A/years/1").json()
    assert after["figures"] != year["figures"]


def test_cached_pages_never_cross_tenants_or_callers(client_of, cached_app, seed):
    alice, bob, olga = client_of("a"), client_of("b"), client_of("op")
    mine = alice.get("/contracts/C-A")
    assert mine.status_code == 200 and "Alice" in mine.text
    assert alice.get("/contracts/C-A/failures").status_code == 200
    assert alice.get("/api/v1/contracts/C-A/failures").status_code == 200
    # B asks for A's cached pages and answers: 404, as for anything unknown.
    for path in ("/contracts/C-A", "/contracts/C-A/failures",
                 "/api/v1/contracts/C-A/failures", "/api/v1/contracts/C-A/years/1"):
        r = bob.get(path)
        assert r.status_code == 404, path
        assert "Acme" not in r.text and "C-A" not in r.text.replace(path, "")
    # Also through B's read token (the API's other way in).
    r = bob.get("/api/v1/contracts/C-A/failures",
                headers={"Authorization": f"Bearer {seed.read_token_b}"})
    assert r.status_code == 404
    # Staff see it under their own scope and their own header, never the customer's.
    staff = olga.get("/contracts/C-A")
    assert staff.status_code == 200 and "Olga" in staff.text and "Alice" not in staff.text
    assert 'value="' in staff.text
    csrf = lambda html: html.split('name="csrf_token" value="')[1].split('"')[0]  # noqa: E731
    assert csrf(staff.text) != csrf(mine.text)
    scopes = {key[1] for key in cached_app.state.portal.cache.pages.kept()}
    assert ("Acme AI", "") in scopes and ("", "all") in scopes
    assert not any(s[0] == "Bravo Labs" for s in scopes)


def test_bob_sees_only_his_own_dashboard(client_of):
    bob = client_of("b")
    r = bob.get("/contracts/C-B")
    assert r.status_code == 200 and "Bravo Labs" in r.text and "Acme" not in r.text


def _view(size: int, tag: str) -> SimpleNamespace:
    return SimpleNamespace(log_size=size, records=("recs", size), tag=tag)


def test_view_cache_refreshes_aged_views_in_the_background() -> None:
    from web.cache import ViewCache

    cache = ViewCache(ttl_seconds=0.05)
    v1 = cache.get(("C", 1), 10, lambda: _view(10, "v1"))
    assert v1.tag == "v1"
    time.sleep(0.06)
    started, release = threading.Event(), threading.Event()

    def refresh(old):
        assert old is v1
        started.set()
        release.wait(5)
        return _view(10, "v2")

    def must_not_compute():
        raise AssertionError("an aged view must not be recomputed in the request")

    # Aged but the log did not grow: the old view at once, the refresh in the background.
    assert cache.get(("C", 1), 10, must_not_compute, refresh) is v1
    assert started.wait(5)
    assert cache.get(("C", 1), 10, must_not_compute, refresh) is v1  # still refreshing
    release.set()
    for _ in range(100):
        if cache.peek(("C", 1), 10) is not None:
            break
        time.sleep(0.01)
    assert cache.peek(("C", 1), 10).tag == "v2"
    # The log grew: computed again now, in the request.
    assert cache.get(("C", 1), 11, lambda: _view(11, "v3"), refresh).tag == "v3"


def test_refreshing_a_view_equals_computing_it_anew(seeded) -> None:
    """The background refresh keeps rows and ended months: the result must not differ."""
    from datetime import timedelta as td

    from billing.amendments import contract_in_force
    from web.accounts import Principal
    from web.db import PortalDb, portal_engine
    from web.views import compute_year_view, refresh_year_view

    ctx, _ = seeded
    db = PortalDb(ctx.engine, portal_engine(ctx.database.portal_url))
    staff = Principal(kind="user", id=0, name="t", role="operator", customer=None)
    try:
        with db.read(staff) as s:
            base = contract_in_force(s, "C-A", 1)
            for days in (10, 45, 130, 200):  # within months, across month ends, past jobs
                now1 = fx.T0 + td(days=days)
                now2 = now1 + td(days=33, hours=5)
                old = compute_year_view(s, base.contract, base.terms, 1, now1)
                fresh = compute_year_view(s, base.contract, base.terms, 1, now2)
                again = refresh_year_view(s, old, now2)
                assert again.figures == fresh.figures
                assert again.months == fresh.months
                assert again.rows == fresh.rows and again.cause_list == fresh.cause_list
    finally:
        db.read_engine.dispose()
