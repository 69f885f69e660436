"""The portal's one cache (``web.cache``) and its one invalidation rule, as behaviour.

- a ledger write (or a signed checkpoint) is seen by the next request in every region:
  nothing is deleted, no value made from the old log state matches the new one;
- a revoked token or an ended session is refused within the bound
  (``YOCO_WEB_SESSION_CACHE_SECONDS``), whatever answers are kept for its tenant;
- one tenant's kept answer (or its tag) never reaches another tenant;
- the store itself: bounded by entries or bytes, each key made once at a time.

The bound is checked by moving the principals' clock on, never by waiting.
"""

from __future__ import annotations

import json
import threading
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from fastapi.testclient import TestClient

from tests import factories as fx
from tests.web.conftest import login

NOW = datetime(2026, 8, 1, 12, 20, 37, tzinfo=UTC)  # contract year 1, jobs running


@pytest.fixture
def cache_app(seeded):
    """The portal with the production figures TTL and every region on, at a fixed time."""
    from web.app import create_app
    from web.security import password_hasher
    from web.settings import WebSettings

    ctx, _ = seeded
    return create_app(ctx, WebSettings(secret_key="test-secret", figures_ttl_seconds=60),
                      hasher=password_hasher(cheap=True), clock=lambda: NOW)


@pytest.fixture
def clients(cache_app):
    """Clients inside the application's lifespan (the fast lane serves them)."""
    made: list[TestClient] = []

    def make() -> TestClient:
        c = TestClient(cache_app, raise_server_exceptions=False)
        c.__enter__()
        made.append(c)
        return c

    yield make
    for c in made:
        c.__exit__(None, None, None)


def _bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def _read_token(seeded: Any, customer: str) -> str:
    from web.accounts import create_token
    from yoco.database import unit_of_work

    ctx, _ = seeded
    with unit_of_work(ctx.engine) as s:
        return create_token(s, name=f"reader-{customer}", customer=customer).text


C = "/api/v1/contracts/C-A"


def _urls(seed: Any) -> list[str]:
    fid = seed.failures["C-A"][1]
    return ["/api/v1/contracts", C, C + "/sla", C + "/sla?year=1", C + "/years/1",
            C + "/failures", C + "/failures?per_page=2&status=resolved",
            C + f"/failures/{fid}", C + f"/entries/{fid}/proof", C + "/checkpoints",
            C + "/credits"]


# --------------------------------------------------------------------------- ledger writes


def test_a_ledger_write_is_seen_by_the_next_request_in_every_region(
    clients, cache_app, seeded, seed
) -> None:
    from ledger.checkpoints import sign_all

    ctx, _ = seeded
    cache = cache_app.state.portal.cache
    api = clients()
    h = _bearer(_read_token(seeded, "Acme AI"))
    alice = clients()
    assert login(alice, seed.users["a"]).status_code == 303
    urls = _urls(seed)
    before = {}
    for u in urls:
        before[u] = api.get(u, headers=h)
        assert before[u].status_code == 200, (u, before[u].text)
        assert api.get(u, headers=h).content == before[u].content  # kept, then replayed
    dashboard = alice.get("/contracts/C-A")
    assert "6 failures in all" in dashboard.text
    assert alice.get("/contracts/C-A").text == dashboard.text
    kept = {name: len(getattr(cache, name)) for name in ("pages", "figures", "replays")}
    assert all(kept.values()), kept
    hits = cache.replays.hits

    # A ledger write through the product's own path (an ingest token, the API).
    new = fx.rec("failure", "C-A", NOW - timedelta(days=1), job_id="j1",
                 failure_class="unplanned", cause="gpu_lost")
    r = api.post("/api/v1/records", content=json.dumps([new]),
                 headers={**_bearer(seed.token), "Content-Type": "application/json"})
    assert r.status_code == 200 and r.json()["appended"] == 1

    after = {u: api.get(u, headers=h) for u in urls}
    assert cache.replays.hits == hits  # no kept answer matched the new log state
    proof, heads = C + f"/entries/{seed.failures['C-A'][1]}/proof", C + "/checkpoints"
    for u in urls:
        assert after[u].status_code == 200, u
        if u in (proof, heads):  # a function of the signed heads alone: none was added
            assert after[u].content == before[u].content, u
        else:
            assert after[u].headers["etag"] != before[u].headers["etag"], u  # a new state
    fails = after[C + "/failures"].json()
    assert fails["total"] == before[C + "/failures"].json()["total"] + 1
    assert fails["items"][0]["event_id"] == new["event_id"]
    assert (after[C + "/sla"].json()["covered_failures"]
            == before[C + "/sla"].json()["covered_failures"] + 1)
    assert after[C + "/years/1"].json()["figures"] != before[C + "/years/1"].json()["figures"]
    assert "7 failures in all" in alice.get("/contracts/C-A").text  # the page too
    # Nothing was deleted to get there: what was kept for the old state is still kept
    # (it goes at the region's bound), it just never matches again.
    for name, count in kept.items():
        assert len(getattr(cache, name)) >= count, name

    # A signed checkpoint adds no entry but a tree head: the proof and the checkpoints
    # that show heads move on; the answers that show none stay kept.
    hits = cache.replays.hits
    with _unit(ctx) as s:
        sign_all(s, ctx.signer, ctx.settings.log_origin)
    for u in (proof, heads):
        r = api.get(u, headers=h)
        assert r.status_code == 200 and r.content != after[u].content, u
    assert cache.replays.hits == hits
    again = api.get(C + "/failures", headers=h)
    assert again.content == after[C + "/failures"].content


def _unit(ctx: Any) -> Any:
    from yoco.database import unit_of_work

    return unit_of_work(ctx.engine)


# --------------------------------------------------------------------------- principals


def _past_the_bound(region: Any) -> None:
    """Move the region's clock on by its whole TTL: what the bound's end does."""
    real = region.clock
    region.clock = lambda: real() + region.ttl + 0.001


def test_a_revoked_read_token_is_refused_within_the_bound(
    clients, cache_app, seeded, seed
) -> None:
    from web.accounts import revoke_token, token_prefix

    cache = cache_app.state.portal.cache
    assert cache.tokens.ttl == 10  # the documented bound (YOCO_WEB_SESSION_CACHE_SECONDS)
    api = clients()
    token = _read_token(seeded, "Acme AI")
    urls = _urls(seed)
    for u in urls:  # remembered, and every answer kept for the tenant
        assert api.get(u, headers=_bearer(token)).status_code == 200, u
        assert api.get(u, headers=_bearer(token)).status_code == 200, u
    with _unit(seeded[0]) as s:  # as `yoco tokens revoke` does, from another process
        assert revoke_token(s, token_prefix(token) or "")
    # Within the bound this process may still let it read (the database said "live"
    # less than 10 s ago); past it, never -- though its tenant's answers are still kept.
    _past_the_bound(cache.tokens)
    for u in urls:
        r = api.get(u, headers=_bearer(token))
        assert r.status_code == 401, (u, r.status_code)
        assert r.json() == {"detail": "Send a session cookie or an 'Authorization: Bearer' "
                                      "token."}
    assert len(cache.replays) > 0
    # The same tenant's live token still gets them.
    other = _read_token(seeded, "Acme AI")
    assert api.get(C + "/sla", headers=_bearer(other)).status_code == 200


def test_a_revoked_token_stops_writing_at_once(clients, seeded, seed) -> None:
    from web.accounts import revoke_token, token_prefix

    api = clients()
    rec = fx.rec("failure", "C-A", NOW - timedelta(days=2), job_id="j1",
                 failure_class="unplanned", cause="gpu_lost")
    with _unit(seeded[0]) as s:
        assert revoke_token(s, token_prefix(seed.token) or "")
    r = api.post("/api/v1/records", content=json.dumps([rec]),
                 headers={**_bearer(seed.token), "Content-Type": "application/json"})
    assert r.status_code == 401  # writes always ask the database: no bound at all


def test_an_ended_session_is_refused_within_the_bound(clients, cache_app, seeded, seed) -> None:
    from sqlalchemy import text

    cache = cache_app.state.portal.cache
    alice = clients()
    assert login(alice, seed.users["a"]).status_code == 303
    assert alice.get(C + "/sla").status_code == 200
    assert alice.get(C + "/sla").status_code == 200  # kept
    assert alice.get("/contracts/C-A").status_code == 200
    with _unit(seeded[0]) as s:  # the user disabled elsewhere ends every session of hers
        s.execute(text("UPDATE portal_users SET disabled = true WHERE email = :e"),
                  {"e": seed.users["a"]})
    _past_the_bound(cache.sessions)
    assert alice.get(C + "/sla").status_code == 401
    page = alice.get("/contracts/C-A", follow_redirects=False)
    assert page.status_code == 303 and page.headers["location"].startswith("/login")


# --------------------------------------------------------------------------- tenants


def test_one_tenants_kept_answer_never_reaches_another(clients, cache_app, seeded, seed) -> None:
    cache = cache_app.state.portal.cache
    api = clients()
    acme = _bearer(_read_token(seeded, "Acme AI"))
    bravo = _bearer(seed.read_token_b)
    urls = _urls(seed)
    tags = {}
    for u in urls:
        tags[u] = api.get(u, headers=acme).headers["etag"]
        api.get(u, headers=acme)
        api.get(u, headers={**acme, "If-None-Match": tags[u]})  # the 304 kept too
    hits = cache.replays.hits
    for u in urls:
        # The identical request target, even with Acme's own tag: Bravo is not Acme.
        for headers in (bravo, {**bravo, "If-None-Match": tags[u]}):
            r = api.get(u, headers=headers)
            if u == "/api/v1/contracts":
                assert r.status_code == 200 and "C-A" not in r.text, u  # Bravo's own list
                assert r.headers["etag"] != tags[u]
            else:
                assert r.status_code == 404 and "Acme" not in r.text, (u, r.status_code)
    assert cache.replays.hits == hits
    # Staff may see C-A, but under their own scope: Acme's tag is not theirs (a 200).
    staff = clients()
    assert login(staff, seed.users["op"]).status_code == 303
    r = staff.get(C + "/sla", headers={"If-None-Match": tags[C + "/sla"]})
    assert r.status_code == 200 and r.headers["etag"] != tags[C + "/sla"]
    # What is kept names the tenant it was made for: of C-A, only Acme's and staff's.
    kept = cache.replays.kept()  # (scope, raw path, raw query, If-None-Match)
    assert {k[0] for k in kept if k[1].startswith(C.encode())} == {("Acme AI", ""), ("", "all")}
    assert {k[1] for k in kept if k[0] == ("Bravo Labs", "")} == {b"/api/v1/contracts"}
    assert all(k[1][0] != "Bravo Labs" for k in cache.pages.kept() if k[0] != "api-body")


def test_path_variants_and_headers_are_answered_as_their_handler_would(
    clients, cache_app, seeded, seed
) -> None:
    """Kept answers are keyed by the raw target and ``If-None-Match`` (besides the
    scope): a spelling of the same path gets the same figures, a header that is not in
    the key changes nothing in the answer, and each is what the handler itself sends."""
    cache = cache_app.state.portal.cache
    api = clients()
    acme = _bearer(_read_token(seeded, "Acme AI"))
    plain = api.get(C + "/sla", headers=acme)
    encoded = "/api/v1/contracts/C%2DA/sla"  # the same contract, spelt otherwise
    first = api.get(encoded, headers=acme)
    assert first.status_code == 200 and first.json() == plain.json()
    assert first.headers["etag"] == plain.headers["etag"]  # the tag names the answer
    hits = cache.replays.hits
    assert api.get(encoded, headers=acme).content == first.content
    assert cache.replays.hits == hits + 1
    assert api.get(encoded, headers=_bearer(seed.read_token_b)).status_code == 404
    # The order of the query is not part of the answer, nor of its tag.
    a = api.get(C + "/failures?per_page=2&status=resolved", headers=acme)
    b = api.get(C + "/failures?status=resolved&per_page=2", headers=acme)
    assert a.headers["etag"] == b.headers["etag"]
    assert a.json()["items"] == b.json()["items"]
    # If-None-Match: the tag (strong or weak) gets a 304, any other tag the answer.
    tag = plain.headers["etag"]
    for inm in (tag, "W/" + tag, f'"other", {tag}'):
        assert api.get(C + "/sla", headers={**acme, "If-None-Match": inm}).status_code == 304
    other = api.get(C + "/sla", headers={**acme, "If-None-Match": '"other"'})
    assert other.status_code == 200 and other.content == plain.content
    # Headers outside the key: the kept answer is byte for byte the handler's own.
    odd = {**acme, "Host": "elsewhere.example", "Accept": "text/html",
           "Accept-Encoding": "gzip"}
    url = C + "/failures?per_page=2"
    api.get(url, headers=acme)
    hits = cache.replays.hits
    replayed = api.get(url, headers=odd)
    assert cache.replays.hits == hits + 1
    cache.clear()
    handlers = api.get(url, headers=odd)
    assert (replayed.status_code, replayed.headers.raw, replayed.content) == (
        handlers.status_code, handlers.headers.raw, handlers.content)


def _copies(cache: Any, body: bytes) -> int:
    """How many times ``body`` is held across the regions of answers (a value that is
    the body, or a tuple holding it; a replay's own body)."""
    n = 0
    for region in (cache.pages, cache.figures):
        for key in region.kept():
            value = region.get(key)
            parts = value if isinstance(value, tuple) else (value,)
            n += sum(1 for v in parts if v == body)
    for key in cache.replays.kept():
        n += cache.replays.get(key).body == body
    return n


def test_an_api_body_is_kept_once_and_the_replay_serves_the_handlers_entry(
    clients, cache_app, seeded, seed
) -> None:
    cache = cache_app.state.portal.cache
    api = clients()
    acme = _bearer(_read_token(seeded, "Acme AI"))
    for u in _urls(seed):
        cache.clear()
        first = api.get(u, headers=acme)
        assert first.status_code == 200 and first.content, u
        assert _copies(cache, first.content) == 1, u
        # The replay's answer: status and headers, and a reference to that entry.
        (key,) = cache.replays.kept()
        kept = cache.replays.get(key)
        assert kept.body == b"" and kept.source is not None, u
        # ...which weighs its status line and headers only: the body is not counted twice.
        head = sum(len(k) + len(v) for k, v in kept.headers) + 64
        assert cache.replays.weight == kept.size == head, u
        hits = cache.replays.hits
        again = api.get(u, headers=acme)
        assert cache.replays.hits == hits + 1, u  # replayed, from the handler's entry
        assert (again.status_code, again.headers.raw, again.content) == (
            first.status_code, first.headers.raw, first.content), u
        # The body falls out of its region: the replay does not answer without it, the
        # handler does (the same bytes), and the body is again kept once.
        cache.pages.clear()
        cache.figures.clear()
        third = api.get(u, headers=acme)
        assert cache.replays.hits == hits + 1, u
        assert (third.status_code, third.headers.raw, third.content) == (
            first.status_code, first.headers.raw, first.content), u
        assert _copies(cache, first.content) == 1, u


# --------------------------------------------------------------------------- the store


def test_a_region_is_bounded_by_entries_or_by_bytes() -> None:
    from web.cache import Cache

    entries = Cache(3)
    for i in range(5):
        entries.put(i, str(i))
    assert entries.kept() == [2, 3, 4]
    assert entries.get(2) == "2"  # now the most recently used: 3 goes next
    entries.put(5, "5")
    assert entries.kept() == [4, 2, 5]
    weighed = Cache(10, weigh=len)
    weighed.put("a", b"x" * 6)
    weighed.put("b", b"x" * 4)
    weighed.put("c", b"x" * 3)  # 13 > 10: the oldest goes
    assert weighed.kept() == ["b", "c"]
    weighed.put("big", b"x" * 11)  # heavier than the whole region: not kept
    assert weighed.get("big") is None and weighed.kept() == ["b", "c"]
    off = Cache(0)
    assert off.get_or_make("k", lambda: 1) == 1 and len(off) == 0


def test_each_key_is_made_once_at_a_time_and_only_fresh_values_are_served() -> None:
    from web.cache import Cache

    cache = Cache(10)
    made: list[int] = []
    entered, release = threading.Event(), threading.Event()

    def make() -> str:
        made.append(1)
        entered.set()
        release.wait(60)
        return "v1"

    results: list[str] = []
    first = threading.Thread(target=lambda: results.append(cache.get_or_make("k", make)))
    first.start()
    assert entered.wait(60)
    others = [threading.Thread(target=lambda: results.append(cache.get_or_make("k", make)))
              for _ in range(4)]
    for t in others:
        t.start()
    release.set()
    for t in (first, *others):
        t.join(60)
    assert results == ["v1"] * 5 and len(made) == 1
    assert cache.hits == 4 and cache.misses == 1
    # A value that is not fresh for the request (another state) is made again.
    assert cache.get_or_make("k", lambda: "v2", fresh=lambda v: v == "v2") == "v2"
    # In the background: once, and a None made keeps nothing.
    gate = threading.Event()
    assert cache.make_later("j", lambda: gate.wait(60) and "j1")
    assert not cache.make_later("j", lambda: "j2")  # already being made
    gate.set()
    for _ in range(3000):  # until the background thread is done (under load too)
        if not cache.making("j"):
            break
        time.sleep(0.01)
    assert cache.get("j") == "j1"
    assert cache.make_later("n", lambda: None)
    for _ in range(3000):  # until the background thread is done (under load too)
        if not cache.making("n"):
            break
        time.sleep(0.01)
    assert cache.get("n") is None


def test_a_made_value_the_key_does_not_name_is_not_kept_and_serials_tell_values_apart(
) -> None:
    from web.cache import Cache

    cache = Cache(10)
    # ``keep`` false: returned, not kept (never, even for a moment, under that key).
    assert cache.get_or_make("k", lambda: (2, b"x"), keep=lambda v: v[0] == 1) == (2, b"x")
    assert cache.get("k") is None and cache.misses == 1
    assert cache.get_or_make("k", lambda: (1, b"y"), keep=lambda v: v[0] == 1) == (1, b"y")
    stamped = cache.stamped("k")
    assert stamped is not None and stamped[1] == (1, b"y")
    # The same key made again (after it fell out) is another entry: a new serial.
    cache.forget("k")
    cache.put("k", (1, b"y"))
    again = cache.stamped("k")
    assert again is not None and again[1] == stamped[1] and again[0] != stamped[0]
    assert cache.stamped("nothing") is None and cache.weight == 1
