"""The API's fast lane (``web.fastlane``): a repeated GET answered from what its handler
sent for the identical request in the identical state, and only then.

- what is replayed is byte for byte the handler's answer (status, headers, body), 200s
  and 304s alike, on every GET route of ``/api/v1``;
- a new entry or a new checkpoint, another tenant, a caller who may not read, an unknown
  or revoked token, a new figures instant: each goes to the handler again;
- concurrent requests of one contract share a probe, but never one that started before
  they arrived; the probe sees what row-level security lets the caller see, as the
  portal role, and refuses a superuser login.
"""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from fastapi.testclient import TestClient

from tests import factories as fx
from tests.web.conftest import login

NOW = datetime(2026, 8, 1, 12, 20, 37, tzinfo=UTC)  # contract year 1, jobs running


class Clock:
    """A clock the test moves on."""

    def __init__(self, now: datetime) -> None:
        self.now = now

    def __call__(self) -> datetime:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock(NOW)


@pytest.fixture
def lane_app(seeded, clock):
    """The portal with the production figures TTL, on a clock the test holds."""
    from web.app import create_app
    from web.security import password_hasher
    from web.settings import WebSettings

    ctx, _ = seeded
    return create_app(ctx, WebSettings(secret_key="test-secret", figures_ttl_seconds=60),
                      hasher=password_hasher(cheap=True), clock=clock)


@pytest.fixture
def api(lane_app):
    with TestClient(lane_app, raise_server_exceptions=False) as c:
        yield c


def _bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def _read_token(seeded, customer: str) -> str:
    from web.accounts import create_token
    from yoco.database import unit_of_work

    ctx, _ = seeded
    with unit_of_work(ctx.engine) as s:
        return create_token(s, name=f"reader-{customer}", customer=customer).text


def _urls(client: TestClient, seed, headers: dict[str, str]) -> list[str]:
    """Every GET route of /api/v1 on contract C-A (the next page by its cursor too)."""
    c = "/api/v1/contracts/C-A"
    fid = seed.failures["C-A"][1]
    size = seed.sizes["C-A"]
    page = client.get(c + "/failures", params={"per_page": 2}, headers=headers).json()
    return [
        "/api/v1/contracts", "/api/v1/contracts?limit=1", c, c + "/sla", c + "/sla?year=1",
        c + "/sla?month=2026-04", c + "/years/1", c + "/failures",
        c + "/failures?per_page=2&status=resolved", page["next"], c + f"/failures/{fid}",
        c + f"/entries/{fid}/proof", c + "/checkpoints",
        c + f"/checkpoints/consistency?size1={size}&size2={size}", c + "/credits",
        "/api/v1/public-key",
    ]


def _same(a: Any, b: Any) -> bool:
    return (a.status_code, a.headers.raw, a.content) == (b.status_code, b.headers.raw, b.content)


def test_a_repeated_get_is_replayed_byte_for_byte(api, lane_app, seeded, seed) -> None:
    portal = lane_app.state.portal
    h = _bearer(_read_token(seeded, "Acme AI"))
    urls = _urls(api, seed, h)
    for url in urls:
        first = api.get(url, headers=h)
        assert first.status_code == 200, (url, first.text)
        before = portal.cache.replays.hits
        again = api.get(url, headers=h)
        assert portal.cache.replays.hits == before + 1, url  # answered by the fast lane
        assert _same(first, again), url
        # The conditional form: the handler's 304, then the same 304 replayed.
        cond = {**h, "If-None-Match": first.headers["etag"]}
        not_modified = api.get(url, headers=cond)
        assert not_modified.status_code == 304 and not_modified.content == b"", url
        replayed = api.get(url, headers=cond)
        assert portal.cache.replays.hits == before + 2, url
        assert _same(not_modified, replayed), url
    # The tenant data answers keep their caching rules; the security headers are there.
    r = api.get(urls[2], headers=h)
    assert r.headers["cache-control"] == "private, no-cache"
    assert r.headers["x-frame-options"] == "DENY" and r.headers["vary"] == "Authorization, Cookie"


def test_a_session_cookie_reader_is_replayed_under_its_tenant(api, lane_app, seed) -> None:
    portal = lane_app.state.portal
    assert login(api, seed.users["a"]).status_code == 303
    first = api.get("/api/v1/contracts/C-A/failures")
    before = portal.cache.replays.hits
    assert _same(first, api.get("/api/v1/contracts/C-A/failures"))
    assert portal.cache.replays.hits == before + 1


def test_a_new_entry_or_checkpoint_is_never_answered_from_the_older_state(
    api, lane_app, seeded, seed
) -> None:
    from ledger.checkpoints import sign_all
    from ledger.ingest import ingest
    from ledger.records import validate_batch
    from yoco.database import unit_of_work

    ctx, _ = seeded
    portal = lane_app.state.portal
    h = _bearer(_read_token(seeded, "Acme AI"))
    c = "/api/v1/contracts/C-A"
    fid = seed.failures["C-A"][0]
    urls = [c + "/failures", c + "/sla", c, "/api/v1/contracts", c + f"/entries/{fid}/proof",
            c + "/checkpoints"]
    old = {u: api.get(u, headers=h) for u in urls}
    for u in urls:
        api.get(u, headers=h)  # kept now
    new = fx.rec("failure", "C-A", NOW - timedelta(days=1), job_id="j1",
                 failure_class="unplanned", cause="gpu_lost")
    records, errs = validate_batch([new])
    assert not errs
    with unit_of_work(ctx.engine) as s:
        ingest(s, records, None, ctx.projectors)
    before = portal.cache.replays.hits
    fails = api.get(c + "/failures", headers=h)
    assert fails.json()["total"] == old[c + "/failures"].json()["total"] + 1
    assert fails.json()["items"][0]["event_id"] == new["event_id"]
    for u in (c + "/sla", c, "/api/v1/contracts"):
        assert api.get(u, headers=h).headers["etag"] != old[u].headers["etag"], u
    assert portal.cache.replays.hits == before  # none of them from the kept answers
    # Signing adds no entry but a tree head: the proofs and the checkpoints move on.
    with unit_of_work(ctx.engine) as s:
        sign_all(s, ctx.signer, ctx.settings.log_origin)
    for u in (c + f"/entries/{fid}/proof", c + "/checkpoints"):
        r = api.get(u, headers=h)
        assert r.status_code == 200 and r.content != old[u].content, u
    assert portal.cache.replays.hits == before


def test_kept_answers_never_reach_another_tenant_or_a_caller_who_may_not_read(
    api, lane_app, seeded, seed
) -> None:
    portal = lane_app.state.portal
    mine = _bearer(_read_token(seeded, "Acme AI"))
    urls = _urls(api, seed, mine)
    for u in urls:  # twice: kept, then replayed
        api.get(u, headers=mine)
        api.get(u, headers=mine)
    assert portal.cache.replays.hits >= len(urls)
    before = portal.cache.replays.hits
    bravo = _bearer(seed.read_token_b)
    for u in urls:
        if u in ("/api/v1/public-key",):
            continue
        r = api.get(u, headers=bravo)
        if u.startswith("/api/v1/contracts?") or u == "/api/v1/contracts":
            assert r.status_code == 200 and "C-A" not in r.text, u  # Bravo's own list
        else:
            assert r.status_code == 404, (u, r.status_code)
        # An ingest token of this very contract may not read; garbage is nobody.
        assert api.get(u, headers=_bearer(seed.token)).status_code == 403, u
        assert api.get(u, headers=_bearer("yoco_00000000_" + "x" * 43)).status_code == 401, u
        assert api.get(u).status_code == 401, u
    assert portal.cache.replays.hits == before
    # Staff read under their own scope: answered by the handler, then kept for staff.
    with TestClient(lane_app) as staff:
        assert login(staff, seed.users["op"]).status_code == 303
        r = staff.get("/api/v1/contracts")
        assert {c["contract_id"] for c in r.json()} == {"C-A", "C-A2", "C-B"}
    assert portal.cache.replays.hits == before


def test_a_revoked_token_reads_kept_answers_only_while_it_is_remembered(
    api, lane_app, seeded
) -> None:
    from web.accounts import revoke_token, token_prefix
    from web.deps import _token_key
    from yoco.database import unit_of_work

    ctx, _ = seeded
    token = _read_token(seeded, "Acme AI")
    url = "/api/v1/contracts/C-A/sla"
    api.get(url, headers=_bearer(token))
    with unit_of_work(ctx.engine) as s:
        assert revoke_token(s, token_prefix(token) or "")
    # Within session_cache_seconds this process still lets it read (docs/security.md)...
    assert api.get(url, headers=_bearer(token)).status_code == 200
    # ...and once it is no longer remembered (what the TTL's end does), never again,
    # though its answer is still kept.
    lane_app.state.portal.cache.tokens.drop(_token_key(token))
    assert api.get(url, headers=_bearer(token)).status_code == 401


def test_a_new_figures_instant_goes_to_the_handler(api, lane_app, seeded, clock) -> None:
    portal = lane_app.state.portal
    h = _bearer(_read_token(seeded, "Acme AI"))
    url = "/api/v1/contracts/C-A/years/1"
    first = api.get(url, headers=h)
    api.get(url, headers=h)
    clock.now = NOW + timedelta(seconds=60)
    before = portal.cache.replays.hits
    api.get(url, headers=h)
    assert portal.cache.replays.hits == before
    # The view of the new instant is computed in the background meanwhile; once the
    # handler answers from it, that answer is kept in turn.
    for _ in range(600):
        r = api.get(url, headers=h)
        if r.headers["etag"] != first.headers["etag"]:
            break
        time.sleep(0.05)
    assert r.status_code == 200 and r.headers["etag"] != first.headers["etag"]
    again = api.get(url, headers=h)
    assert portal.cache.replays.hits == before + 1 and _same(r, again)


def test_the_replay_comes_after_the_normal_authentication(api, lane_app, seeded) -> None:
    # One authentication path: a token this process does not remember is asked of the
    # database the usual way, and then gets the kept answer.
    from web.deps import _token_key

    portal = lane_app.state.portal
    token = _read_token(seeded, "Acme AI")
    url = "/api/v1/contracts/C-A/sla?year=1"
    first = api.get(url, headers=_bearer(token))
    assert first.status_code == 200
    portal.cache.tokens.drop(_token_key(token))  # forgotten: only the database knows it now
    before = portal.cache.replays.hits
    again = api.get(url, headers=_bearer(token))
    assert portal.cache.replays.hits == before + 1 and _same(first, again)
    assert portal.cache.tokens.entry(_token_key(token)) is not None  # looked up, remembered


def test_no_fast_lane_outside_the_servers_event_loop(lane_app, seeded) -> None:
    # Without the lifespan (a client used without `with`), requests run in throwaway
    # loops: no probe connection is made there, every answer is the handler's.
    h = _bearer(_read_token(seeded, "Acme AI"))
    c = TestClient(lane_app)
    for _ in range(3):
        assert c.get("/api/v1/contracts/C-A/sla", headers=h).status_code == 200
    assert lane_app.state.portal.cache.replays.hits == 0
    assert lane_app.state.portal.probes.round_trips == 0


def test_concurrent_probes_share_a_round_trip_that_began_after_them(
    seeded, owner_url
) -> None:
    """A request that arrives while a probe of its contract runs waits for the next
    one; requests that arrive together share one."""
    from sqlalchemy import create_engine, text

    from web.app import create_app
    from web.settings import WebSettings

    ctx, seed = seeded
    portal = create_app(ctx, WebSettings(secret_key="test-secret")).state.portal
    probe = portal.probes
    acme = ("Acme AI", "")
    owner = create_engine(owner_url)
    try:
        lock = owner.connect()
        lock.execute(text("LOCK TABLE ledger_logs IN ACCESS EXCLUSIVE MODE"))

        async def scenario() -> None:
            probe.start()
            try:
                first = asyncio.ensure_future(probe.state(acme, "C-A"))
                for _ in range(3000):  # until the first probe is sent (it then waits)
                    if probe.round_trips == 1:
                        break
                    await asyncio.sleep(0.01)
                assert probe.round_trips == 1
                second = asyncio.ensure_future(probe.state(acme, "C-A"))
                await asyncio.sleep(0.05)
                assert not first.done() and not second.done()
                lock.commit()  # the first probe goes on; the second is sent after it
                a, b = await asyncio.gather(first, second)
                assert a == b and a is not None and a.size == seed.sizes["C-A"]
                assert probe.round_trips == 2
                together = await asyncio.gather(*(probe.state(acme, "C-A") for _ in range(20)))
                assert set(together) == {a} and probe.round_trips == 3
                # What row-level security and the customer filter let each scope see.
                assert await probe.state(("Bravo Labs", ""), "C-A") is None
                assert await probe.state(("", ""), "C-A") is None
                assert await probe.state(acme, "NOPE") is None
                assert await probe.state(("", "all"), "C-B") is not None
                mine = await probe.state(acme, None)
                theirs = await probe.state(("Bravo Labs", ""), None)
                assert mine is not None and theirs is not None
                assert (mine.count, theirs.count) == (2, 1)  # type: ignore[union-attr]
            finally:
                await probe.stop()

        asyncio.run(scenario())
        lock.close()
    finally:
        owner.dispose()
        portal.close()


def test_the_probe_connection_is_the_portal_role_and_refuses_a_superuser(
    db_url, portal_url
) -> None:
    from sqlalchemy import create_engine

    from ledger.errors import SuperuserLogin
    from web.db import probe_connection

    async def check() -> None:
        conn = await probe_connection(create_engine(portal_url))
        try:
            cur = await conn.execute("SELECT current_user, session_user")
            assert await cur.fetchone() == ("yoco_portal", "yoco_web")
            assert conn.autocommit
        finally:
            await conn.close()
        with pytest.raises(SuperuserLogin, match="YOCO_PORTAL_DATABASE_URL"):
            await probe_connection(create_engine(db_url))

    asyncio.run(check())


def test_the_replay_cache_is_bounded_by_bytes() -> None:
    from web.cache import Cache
    from web.replay import Kept

    cache = Cache(10_000, weigh=lambda kept: kept.size)
    for i in range(10):
        cache.put(("k", i), Kept(None, None, 200, [(b"x", b"y")], b"z" * 3000))
    assert len(cache) == 3 and cache.get(("k", 9)) is not None and cache.get(("k", 0)) is None
    cache.put(("big",), Kept(None, None, 200, [], b"z" * 20_000))  # larger than it all
    assert cache.get(("big",)) is None and len(cache) == 3


def _wait_until(cond: Any) -> None:
    for _ in range(600):
        if cond():
            return
        time.sleep(0.05)
    raise AssertionError("never happened")


def test_an_aging_token_is_rechecked_in_the_background(api, lane_app, seeded) -> None:
    """Past half its TTL a remembered token is asked about again while it keeps
    working: a live one is renewed (no request waits for it), a revoked one ends before
    the TTL would have ended it."""
    from web.accounts import revoke_token, token_prefix
    from web.deps import _token_key
    from yoco.database import unit_of_work

    ctx, _ = seeded
    portal = lane_app.state.portal
    url = "/api/v1/contracts/C-A/sla"
    token = _read_token(seeded, "Acme AI")
    key = _token_key(token)
    assert api.get(url, headers=_bearer(token)).status_code == 200

    def age() -> float:
        hit = portal.cache.tokens.entry(key)
        assert hit is not None
        aged = hit[0] - portal.cache.tokens.ttl * 0.75  # as if checked 7.5 s ago
        portal.cache.tokens.put(key, hit[1], checked=aged)
        return aged

    aged = age()
    assert api.get(url, headers=_bearer(token)).status_code == 200
    _wait_until(lambda: (portal.cache.tokens.entry(key) or (aged,))[0] > aged)  # renewed
    aged = age()
    with unit_of_work(ctx.engine) as s:
        assert revoke_token(s, token_prefix(token) or "")
    assert api.get(url, headers=_bearer(token)).status_code == 200  # within the TTL...
    _wait_until(lambda: portal.cache.tokens.entry(key) is None)  # ...ended by the recheck
    assert api.get(url, headers=_bearer(token)).status_code == 401


def test_a_recheck_never_brings_back_a_session_logged_out_meanwhile() -> None:
    from web.accounts import Principal
    from web.cache import PrincipalCache

    cache = PrincipalCache(10)
    who = Principal(kind="user", id=1, name="A", role="customer", customer="Acme AI")
    cache.put("t", who)
    hit = cache.entry("t")
    assert hit is not None
    cache.drop("t")  # logout while the database was being asked
    cache.renew("t", hit[0], who)
    assert cache.get("t") is None
    cache.put("t", who)
    hit = cache.entry("t")
    assert hit is not None
    cache.renew("t", hit[0], None)  # the database says: no longer live
    assert cache.get("t") is None


def test_an_answer_that_sets_a_cookie_is_never_replayed(api, lane_app, seeded, seed,
                                                        monkeypatch) -> None:
    # Answers are kept by tenant scope, not by caller: one that set a cookie (a session
    # renewal, a CSRF binding) must never reach another caller of the tenant. No route of
    # /api/v1 sets one today, so one is made to: the handler's answer goes out with its
    # cookie, and the next identical request is answered by the handler again.
    from starlette.responses import Response

    portal = lane_app.state.portal
    h = _bearer(_read_token(seeded, "Acme AI"))
    url = "/api/v1/contracts/C-A"
    init = Response.init_headers

    def with_cookie(self: Response, headers: Any = None) -> None:
        init(self, headers)
        self.raw_headers.append((b"set-cookie", b"probe=1; HttpOnly"))

    monkeypatch.setattr(Response, "init_headers", with_cookie)
    first = api.get(url, headers=h)
    assert first.status_code == 200 and first.headers["set-cookie"].startswith("probe=1")
    before = portal.cache.replays.hits
    again = api.get(url, headers=h)
    assert again.status_code == 200 and portal.cache.replays.hits == before
