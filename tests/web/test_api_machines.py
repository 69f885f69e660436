"""The API for machines: conditional GETs (ETag / If-None-Match) and cursor pagination.

- every JSON API GET carries a strong ETag and answers 304 to it, with no figure
  computed for the 304 (the figure functions are replaced by ones that fail);
- a new ledger entry (or a new signed checkpoint, for proofs) changes the tags that
  depend on it; a tag never crosses tenant scopes; two workers give the same tag and
  bytes; a made-up tag is never honoured;
- the SLA figures of a contract year are computed once per log size;
- every list pages with signed cursors: stable while entries are appended, refused
  (400, a clear message) when edited or given to another list;
- every read route, with the new parameters, for every caller and tenant.
"""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from fastapi.testclient import TestClient

from tests import factories as fx
from tests.web.conftest import app_routes, login

NOW = datetime(2026, 8, 1, 12, 20, 37, tzinfo=UTC)  # contract year 1, jobs running


@pytest.fixture
def api_app(seeded):
    """The portal with a fixed clock and an hour's figures TTL (figures really reused)."""
    from web.app import create_app
    from web.security import password_hasher
    from web.settings import WebSettings

    ctx, _ = seeded
    return create_app(
        ctx,
        WebSettings(secret_key="test-secret", figures_ttl_seconds=3600),
        hasher=password_hasher(cheap=True),
        clock=lambda: NOW,
    )


@pytest.fixture
def client_of(api_app, seed):
    clients: list[TestClient] = []

    def make(key: str | None = None, app: Any = None) -> TestClient:
        c = TestClient(app or api_app, raise_server_exceptions=False)
        c.__enter__()
        clients.append(c)
        if key is not None:
            assert login(c, seed.users[key]).status_code == 303
        return c

    yield make
    for c in clients:
        c.__exit__(None, None, None)


def _api_gets(app: Any) -> list[str]:
    return sorted(
        r.path for r in app_routes(app)
        if r.path.startswith("/api/v1/") and "GET" in r.methods
    )


def _issue_march(ctx: Any, *cids: str) -> None:
    """Issue March 2026 of ``cids`` (the report routes serve only issued documents), then
    sign the log as issuing does (the evidence pack needs its entry under a checkpoint)."""
    from ledger.checkpoints import sign_log
    from reports.issued import issue_month
    from yoco.database import unit_of_work

    for cid in cids:
        with unit_of_work(ctx.engine) as s:
            issue_month(s, cid, 2026, 3)
        with unit_of_work(ctx.engine) as s:
            sign_log(s, ctx.signer, cid, ctx.settings.log_origin)


def _target(path: str, cid: str, seed: Any) -> tuple[str, dict[str, Any]]:
    fid = seed.failures[cid][1]
    url = (path.replace("{contract_id}", cid).replace("{event_id}", fid)
           .replace("{year}", "1").replace("{month}", "2026-03").replace("{fmt}", "pdf"))
    query: dict[str, Any] = {}
    if path.endswith("/consistency"):
        query = {"size1": seed.sizes[cid], "size2": seed.sizes[cid]}
    return url, query


def _ingest(client: TestClient, seed: Any, *records: dict[str, Any]) -> None:
    r = client.post("/api/v1/records", content=json.dumps(list(records)),
                    headers={"Authorization": f"Bearer {seed.token}",
                             "Content-Type": "application/json"})
    assert r.status_code == 200, r.text


# --------------------------------------------------------------------------- tags


def test_every_api_get_answers_304_to_its_own_tag(api_app, client_of, seed, seeded) -> None:
    _issue_march(seeded[0], "C-A")
    alice = client_of("a")
    paths = _api_gets(api_app)
    assert len(paths) >= 12
    for path in paths:
        url, query = _target(path, "C-A", seed)
        first = alice.get(url, params=query)
        assert first.status_code == 200, (url, first.status_code, first.text[:200])
        tag = first.headers["etag"]
        assert re.fullmatch(r'"[0-9a-f]{32}"', tag), (url, tag)  # strong
        assert first.headers["cache-control"] == "private, no-cache", url
        for sent in (tag, f"W/{tag}", f'"other", {tag}', "*"):
            again = alice.get(url, params=query, headers={"If-None-Match": sent})
            assert again.status_code == 304, (url, sent, again.status_code)
            assert again.content == b"" and again.headers["etag"] == tag, url
        # The same request answers the same bytes under the same tag.
        same = alice.get(url, params=query)
        assert same.headers["etag"] == tag and same.content == first.content, url
        # A tag the server never issued is not honoured.
        made_up = alice.get(url, params=query,
                            headers={"If-None-Match": '"' + "0" * 32 + '"'})
        assert made_up.status_code == 200 and made_up.content == first.content, url


def test_a_304_computes_no_figures(api_app, client_of, seed, monkeypatch) -> None:
    import billing.services
    import billing.sla
    import web.routers.api_contracts
    import web.services
    import web.views

    alice = client_of("a")
    fid = seed.failures["C-A"][1]
    urls = ["/api/v1/contracts/C-A/sla", "/api/v1/contracts/C-A/sla?year=1",
            "/api/v1/contracts/C-A/sla?month=2026-04", "/api/v1/contracts/C-A/years/1",
            "/api/v1/contracts/C-A/failures", "/api/v1/contracts/C-A/failures?per_page=2",
            f"/api/v1/contracts/C-A/failures/{fid}", "/api/v1/contracts/C-A",
            "/api/v1/contracts"]
    tags = {u: alice.get(u).headers["etag"] for u in urls}
    calls: list[str] = []

    def counted(name: str, real: Any) -> Any:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            calls.append(name)
            return real(*args, **kwargs)
        return wrapper

    for module, name in ((web.routers.api_contracts, "sla_figures"),
                         (billing.services, "figures_for"),
                         (billing.sla, "compute_figures"),
                         (web.services, "compute_year_view"),
                         (web.views, "compute_year_view"),
                         (web.services, "failure_detail")):
        monkeypatch.setattr(module, name, counted(name, getattr(module, name)))
    # Cold: nothing cached in this worker (as in a fresh one).
    portal = api_app.state.portal
    portal.cache.clear()  # every region: views, pages, figures, the fast lane's answers
    for u, tag in tags.items():
        r = alice.get(u, headers={"If-None-Match": tag})
        assert r.status_code == 304, (u, r.status_code)
    assert calls == []
    # Without the tag the same requests do compute (the counters are live).
    for u in urls:
        assert alice.get(u).status_code == 200
    assert {"sla_figures", "compute_year_view", "failure_detail"} <= set(calls)


def test_a_new_entry_or_checkpoint_changes_the_tags_that_read_it(
    api_app, client_of, seed, seeded
) -> None:
    from ledger.checkpoints import sign_all
    from yoco.database import unit_of_work

    alice = client_of("a")
    oid = seed.outcomes["C-A"][0]
    urls = {
        "sla": "/api/v1/contracts/C-A/sla", "failures": "/api/v1/contracts/C-A/failures",
        "year": "/api/v1/contracts/C-A/years/1",
        "proof": f"/api/v1/contracts/C-A/entries/{oid}/proof",
        "checkpoints": "/api/v1/contracts/C-A/checkpoints",
        "other": "/api/v1/contracts/C-A2/sla",
    }
    before = {k: alice.get(u).headers["etag"] for k, u in urls.items()}
    new = fx.rec("failure", "C-A", fx.T0 + timedelta(days=130), job_id="j1",
                 failure_class="unplanned", cause="gpu_lost", node="n-9", gpu=1, step=5)
    _ingest(alice, seed, new)

    def status(key: str) -> int:
        return alice.get(urls[key], headers={"If-None-Match": before[key]}).status_code

    # The contract's log grew: its figures and lists changed; not the proofs (no new
    # checkpoint) nor another contract's figures.
    assert {k: status(k) for k in urls} == {
        "sla": 200, "failures": 200, "year": 200, "proof": 304, "checkpoints": 304,
        "other": 304,
    }
    assert alice.get(urls["sla"]).json()["covered_failures"] == 5
    ctx, _ = seeded
    with unit_of_work(ctx.engine) as s:
        sign_all(s, ctx.signer, ctx.settings.log_origin)
    assert status("proof") == 200 and status("checkpoints") == 200


def test_tags_never_cross_tenant_scopes_and_agree_between_workers(
    api_app, client_of, seed, seeded
) -> None:
    from web.app import create_app
    from web.security import password_hasher
    from web.settings import WebSettings

    alice, bob, olga = client_of("a"), client_of("b"), client_of("op")
    url = "/api/v1/contracts/C-A/sla"
    mine = alice.get(url)
    staff = olga.get(url)
    assert mine.json() == staff.json()  # the same figures…
    assert mine.headers["etag"] != staff.headers["etag"]  # …under each scope's own tag
    # Staff's tag does not make the customer's copy current, nor the reverse.
    assert alice.get(url, headers={"If-None-Match": staff.headers["etag"]}).status_code == 200
    assert olga.get(url, headers={"If-None-Match": mine.headers["etag"]}).status_code == 200
    # Another tenant with A's tag: 404, as without it.
    r = bob.get(url, headers={"If-None-Match": mine.headers["etag"]})
    assert r.status_code == 404 and "C-A" not in r.text
    # A read token of A's customer shares the customer's scope.
    ctx, _ = seeded
    token = _read_token(ctx, "Acme AI")
    tok = client_of()
    r = tok.get(url, headers={"Authorization": f"Bearer {token}",
                              "If-None-Match": mine.headers["etag"]})
    assert r.status_code == 304
    # A second worker (its own caches, the same secret and clock): the same tag and bytes.
    other = create_app(ctx, WebSettings(secret_key="test-secret", figures_ttl_seconds=3600),
                       hasher=password_hasher(cheap=True), clock=lambda: NOW)
    alice2 = client_of("a", app=other)
    for u in (url, "/api/v1/contracts/C-A/years/1", "/api/v1/contracts/C-A/failures"):
        first, second = alice.get(u), alice2.get(u)
        assert first.headers["etag"] == second.headers["etag"], u
        assert first.content == second.content, u
        assert alice2.get(u, headers={"If-None-Match": first.headers["etag"]}
                          ).status_code == 304


def test_an_unknown_id_is_404_whatever_tag_comes_with_it(client_of, seed) -> None:
    alice = client_of("a")
    fid = seed.failures["C-A"][1]
    tag = alice.get(f"/api/v1/contracts/C-A/failures/{fid}").headers["etag"]
    for other in ("00000000-0000-4000-8000-000000000000", seed.failures["C-B"][1]):
        r = alice.get(f"/api/v1/contracts/C-A/failures/{other}", headers={"If-None-Match": tag})
        assert r.status_code == 404, other


def test_sla_is_computed_once_per_log_size(api_app, client_of, seed, monkeypatch) -> None:
    import web.routers.api_contracts as api

    real = api.sla_figures
    calls: list[Any] = []

    def counted(*args: Any, **kwargs: Any) -> Any:
        calls.append(kwargs)
        return real(*args, **kwargs)

    monkeypatch.setattr(api, "sla_figures", counted)
    alice, olga = client_of("a"), client_of("op")
    first = alice.get("/api/v1/contracts/C-A/sla", params={"year": 1}).json()
    for c in (alice, olga, alice):
        assert c.get("/api/v1/contracts/C-A/sla", params={"year": 1}).json() == first
    assert len(calls) == 1
    # Computed at the request's time rounded down to the TTL (an hour here).
    assert calls[0]["now"] == datetime(2026, 8, 1, 12, 0, tzinfo=UTC)
    assert first["computed_at"] == "2026-08-01T12:00:00+00:00"
    _ingest(alice, seed, fx.rec("failure", "C-A", fx.T0 + timedelta(days=131), job_id="j1",
                                failure_class="unplanned", cause="gpu_lost"))
    assert alice.get("/api/v1/contracts/C-A/sla", params={"year": 1}).json()[
        "covered_failures"] == first["covered_failures"] + 1
    assert olga.get("/api/v1/contracts/C-A/sla", params={"year": 1}).status_code == 200
    assert len(calls) == 2
    # Bounded: the cache keeps at most its configured number of answers.
    assert len(api_app.state.portal.cache.figures) <= api_app.state.portal.cache.figures.limit


def test_every_input_of_the_figures_renews_the_cached_sla(
    api_app, client_of, seed, seeded, monkeypatch
) -> None:
    """The cached /sla is keyed by the log size: every input of the figures is an entry
    of the contract's own log (records, exclusions, dispute decisions, amendments), so
    each one changes the key, and the next answer is computed anew and differs."""
    from datetime import date

    import web.routers.api_contracts as api
    from billing.amendments import amend_contract
    from billing.disputes import resolve_dispute
    from yoco.database import unit_of_work

    real = api.sla_figures
    calls: list[Any] = []

    def counted(*args: Any, **kwargs: Any) -> Any:
        calls.append(kwargs)
        return real(*args, **kwargs)

    monkeypatch.setattr(api, "sla_figures", counted)
    alice = client_of("a")
    url = "/api/v1/contracts/C-A/sla"
    ctx, _ = seeded
    seen: list[tuple[str, dict[str, Any]]] = []

    def answer() -> tuple[str, dict[str, Any]]:
        r = alice.get(url, params={"year": 1})
        assert r.status_code == 200, r.text
        again = alice.get(url, params={"year": 1})  # served from the cache: same tag
        assert again.headers["etag"] == r.headers["etag"] and again.content == r.content
        assert alice.get(url, params={"year": 1}, headers={
            "If-None-Match": r.headers["etag"]}).status_code == 304
        for tag, _body in seen:  # no earlier tag is current any more
            assert alice.get(url, params={"year": 1},
                             headers={"If-None-Match": tag}).status_code == 200
        seen.append((r.headers["etag"], r.json()))
        return seen[-1]

    _, first = answer()
    assert len(calls) == 1
    fids = seed.failures["C-A"]
    # 1. A dispute decided by an exclusion (dispute_resolved + exclusion entries).
    with unit_of_work(ctx.engine) as s:
        resolve_dispute(s, seed.disputes["C-A"], resolution="exclusion", decided_by="olga",
                        note="agreed", now=NOW)
    _, after_dispute = answer()
    assert len(calls) == 2
    assert after_dispute["covered_failures"] == first["covered_failures"] - 1
    # 2. An exclusion posted as a record (the pending kernel panic).
    _ingest(alice, seed, fx.rec("exclusion", "C-A", fx.T0 + timedelta(days=102),
                                failure_event_id=fids[5], reason="customer's kernel",
                                approved_by="olga"))
    _, after_exclusion = answer()
    assert len(calls) == 3
    assert after_exclusion["covered_failures"] == after_dispute["covered_failures"] - 1
    # 3. A contract edit: an amendment of the guarantee terms of the year in progress.
    with unit_of_work(ctx.engine) as s:
        amend_contract(s, "C-A", amendment_type="terms", effective_date=date(2026, 5, 1),
                       changes={"terms": {"threshold_percent": "75"}},
                       applies_to_year_in_progress=True, now=NOW)
    _, amended = answer()
    assert len(calls) == 4
    assert amended["threshold_percent"] == "75" != after_exclusion["threshold_percent"]
    # 4. A new failure record.
    _ingest(alice, seed, fx.rec("failure", "C-A", fx.T0 + timedelta(days=132), job_id="j1",
                                failure_class="unplanned", cause="gpu_lost"))
    _, grown = answer()
    assert len(calls) == 5
    assert grown["covered_failures"] == amended["covered_failures"] + 1


def test_a_new_instant_serves_the_previous_answer_while_computing_the_new_one(
    seeded, seed, monkeypatch
) -> None:
    """When only the figures instant moved on (the log did not grow), /sla answers the
    previous instant's figures under that instant's own tag at once and computes the
    new instant in the background; a grown log is always computed in the request."""
    import threading
    import time

    import web.routers.api_contracts as api
    from web.app import create_app
    from web.security import password_hasher
    from web.settings import WebSettings

    real = api.sla_figures
    release = threading.Event()
    calls: list[datetime] = []

    def slow(*args: Any, **kwargs: Any) -> Any:
        calls.append(kwargs["now"])
        if len(calls) == 2:  # the background computation of the second instant
            assert release.wait(60)
        return real(*args, **kwargs)

    monkeypatch.setattr(api, "sla_figures", slow)
    ctx, _ = seeded
    clock = [NOW]
    app = create_app(ctx, WebSettings(secret_key="test-secret", figures_ttl_seconds=60),
                     hasher=password_hasher(cheap=True), clock=lambda: clock[0])
    url = "/api/v1/contracts/C-A/sla?year=1"
    with TestClient(app) as c:
        assert login(c, seed.users["a"]).status_code == 303
        first = c.get(url)
        assert first.json()["computed_at"] == "2026-08-01T12:20:00+00:00"
        clock[0] = NOW + timedelta(minutes=1)
        for _ in range(3):  # while the new instant is being computed (once)
            stale = c.get(url)
            assert stale.content == first.content
            assert stale.headers["etag"] == first.headers["etag"]
            # The client's copy is what it would get: 304.
            assert c.get(url, headers={"If-None-Match": first.headers["etag"]}
                         ).status_code == 304
        # The background computation was asked for by the first of those requests; on a
        # busy machine its thread may not have called in yet: wait for it (it then blocks
        # on `release`), never for a fixed time.
        began = time.monotonic() + 60
        while len(calls) < 2 and time.monotonic() < began:
            time.sleep(0.01)
        assert calls == [datetime(2026, 8, 1, 12, 20, tzinfo=UTC),
                         datetime(2026, 8, 1, 12, 21, tzinfo=UTC)]
        release.set()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            fresh = c.get(url)
            if fresh.json()["computed_at"] == "2026-08-01T12:21:00+00:00":
                break
            time.sleep(0.05)
        else:
            raise AssertionError("the new instant was never computed")
        assert fresh.headers["etag"] != first.headers["etag"]
        assert c.get(url, headers={"If-None-Match": fresh.headers["etag"]}
                     ).status_code == 304
        # A grown log: never the previous answer, computed now.
        clock[0] = NOW + timedelta(minutes=2)
        _ingest(c, seed, fx.rec("failure", "C-A", fx.T0 + timedelta(days=133), job_id="j1",
                                failure_class="unplanned", cause="gpu_lost"))
        grown = c.get(url).json()
        assert grown["computed_at"] == "2026-08-01T12:22:00+00:00"
        assert len(calls) == 3
        assert grown["covered_failures"] == first.json()["covered_failures"] + 1


def test_figures_instant_rounds_down_to_the_ttl() -> None:
    from web.conditional import figures_instant

    t = datetime(2026, 8, 1, 12, 20, 37, 123456, tzinfo=UTC)
    assert figures_instant(t, 60) == datetime(2026, 8, 1, 12, 20, tzinfo=UTC)
    assert figures_instant(t, 3600) == datetime(2026, 8, 1, 12, 0, tzinfo=UTC)
    assert figures_instant(t, 0) == t
    assert figures_instant(t, 0.5) == datetime(2026, 8, 1, 12, 20, 37, 0, tzinfo=UTC)


# --------------------------------------------------------------------------- cursors


def _walk(client: TestClient, url: str, key: str = "items", **kw: Any) -> list[Any]:
    """Every item of a list, following ``Link: <…>; rel="next"``."""
    items: list[Any] = []
    seen = 0
    while url:
        r = client.get(url, **kw)
        assert r.status_code == 200, (url, r.text)
        body = r.json()
        items.extend(body[key] if isinstance(body, dict) else body)
        link = r.headers.get("link")
        if isinstance(body, dict):
            assert (link is None) == (body["next"] is None)
            if link:
                assert link == f'<{body["next"]}>; rel="next"'
        url = re.fullmatch(r'<([^>]+)>; rel="next"', link).group(1) if link else ""
        seen += 1
        assert seen < 50
    return items


def test_failures_page_through_with_cursors(client_of, seed) -> None:
    alice = client_of("a")
    everything = alice.get("/api/v1/contracts/C-A/failures").json()
    assert everything["next"] is None and "link" not in alice.get(
        "/api/v1/contracts/C-A/failures").headers
    walked = _walk(alice, "/api/v1/contracts/C-A/failures?per_page=2")
    assert walked == everything["items"] and len(walked) == 6
    # The order is the sort key's, newest first.
    keys = [(i["occurred_at"], i["event_id"]) for i in walked]
    assert keys == sorted(keys, reverse=True)
    # With a filter, the cursor keeps the filter.
    rolled = _walk(alice, "/api/v1/contracts/C-A/failures?per_page=1&status=resolved")
    assert [i["status"] for i in rolled] == ["resolved"] * 2
    # Page numbers still work, and give a cursor to continue.
    p2 = alice.get("/api/v1/contracts/C-A/failures?per_page=2&page=2").json()
    assert p2["page"] == 2 and p2["items"] == everything["items"][2:4]
    rest = _walk(alice, p2["next"])
    assert rest == everything["items"][4:]


def test_a_cursor_stays_valid_while_entries_are_appended(client_of, seed) -> None:
    alice = client_of("a")
    first = alice.get("/api/v1/contracts/C-A/failures?per_page=2").json()
    assert [i["event_id"] for i in first["items"]] == list(reversed(seed.failures["C-A"]))[:2]
    newer = fx.rec("failure", "C-A", fx.T0 + timedelta(days=140), job_id="j1",
                   failure_class="unplanned", cause="gpu_lost")
    older = fx.rec("failure", "C-A", fx.T0 + timedelta(days=5), job_id="j1",
                   failure_class="unplanned", cause="hang")
    _ingest(alice, seed, newer, older)
    rest = _walk(alice, first["next"])
    got = [i["event_id"] for i in first["items"] + rest]
    # Nothing repeated, nothing of the first page's kind skipped; the newer failure is
    # before the cursor (on a page already seen), the older one after it (on a later page).
    assert len(got) == len(set(got)) == 7
    assert newer["event_id"] not in got and older["event_id"] in got
    assert set(seed.failures["C-A"]) <= set(got)


def test_lists_of_contracts_checkpoints_and_credits_page(client_of, seed, seeded) -> None:
    from ledger.checkpoints import sign_all
    from yoco.database import unit_of_work

    alice, olga = client_of("a"), client_of("op")
    assert [c["contract_id"] for c in _walk(alice, "/api/v1/contracts?limit=1")] == [
        "C-A", "C-A2"]
    assert [c["contract_id"] for c in _walk(olga, "/api/v1/contracts?limit=2")] == [
        "C-A", "C-A2", "C-B"]
    assert alice.get("/api/v1/contracts").json() == _walk(alice, "/api/v1/contracts?limit=1")
    ctx, _ = seeded
    _ingest(alice, seed, fx.rec("failure", "C-A", fx.T0 + timedelta(days=140), job_id="j1",
                                failure_class="unplanned", cause="gpu_lost"))
    with unit_of_work(ctx.engine) as s:
        sign_all(s, ctx.signer, ctx.settings.log_origin)
    heads = _walk(alice, "/api/v1/contracts/C-A/checkpoints?limit=1")
    sizes = [h["tree_size"] for h in heads]
    assert len(sizes) == 3 and sizes == sorted(sizes, reverse=True)
    assert heads == alice.get("/api/v1/contracts/C-A/checkpoints").json()
    assert _walk(alice, "/api/v1/contracts/C-A/credits?limit=1") == []


def test_credits_page_through(client_of, seed, seeded) -> None:
    """A year closed with a credit (the guarantee missed): the list, paged by one; the
    keyset query finds nothing before the only credit."""
    from billing.closing import close_year
    from yoco.database import unit_of_work

    ctx, _ = seeded
    with unit_of_work(ctx.engine) as s:
        close_year(s, "C-B", 1, now=datetime(2027, 1, 5, tzinfo=UTC), signer=None)
    bob = client_of("b")
    credits = _walk(bob, "/api/v1/contracts/C-B/credits?limit=1")
    assert len(credits) == 1 and credits[0]["contract_id"] == "C-B"
    assert credits == bob.get("/api/v1/contracts/C-B/credits").json()
    from web import billing_bridge

    with unit_of_work(ctx.engine) as s:
        rows = billing_bridge.credit_rows(s, ["C-B"])
        key = (rows[0]["issued_at"], "C-B", rows[0]["seq"])
        assert billing_bridge.credit_rows(s, ["C-B"], before=key) == []
        assert len(billing_bridge.credit_rows(s, ["C-B"], before=(key[0], "C-B", key[2] + 1))
                   ) == 1


@pytest.mark.parametrize("bad", [
    "x", "", "a.b", "a" * 600,
])
def test_a_bad_cursor_is_a_clear_400(client_of, bad) -> None:
    alice = client_of("a")
    for url in ("/api/v1/contracts", "/api/v1/contracts/C-A/failures",
                "/api/v1/contracts/C-A/checkpoints", "/api/v1/contracts/C-A/credits"):
        r = alice.get(url, params={"cursor": bad})
        assert r.status_code in (400, 422), (url, r.status_code)
        if r.status_code == 400:
            assert "cursor" in r.json()["detail"], url


def test_an_edited_or_misplaced_cursor_is_refused(client_of) -> None:
    alice = client_of("a")
    page = alice.get("/api/v1/contracts/C-A/failures?per_page=2").json()
    cursor = page["next_cursor"]
    body, sig = cursor.split(".")
    # Edit the position (a different key, re-encoded) but keep the signature.
    import base64

    raw = json.loads(base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)))
    raw["p"][2] = 0
    forged = base64.urlsafe_b64encode(json.dumps(raw).encode()).rstrip(b"=").decode()
    for bad in (forged + "." + sig, cursor[:-2], body + "." + sig[::-1]):
        r = alice.get("/api/v1/contracts/C-A/failures", params={"cursor": bad,
                                                                "per_page": 2})
        assert r.status_code == 400
        assert "not a cursor this server issued" in r.json()["detail"]
    # The cursor of another list: another filter, another contract.
    r = alice.get("/api/v1/contracts/C-A/failures", params={"cursor": cursor,
                                                            "status": "resolved"})
    assert r.status_code == 400 and "another list" in r.json()["detail"]
    r = alice.get("/api/v1/contracts/C-A2/failures", params={"cursor": cursor})
    assert r.status_code == 400 and "another list" in r.json()["detail"]
    # A cursor and a page number.
    r = alice.get("/api/v1/contracts/C-A/failures", params={"cursor": cursor, "page": 2})
    assert r.status_code == 400 and "'cursor' or 'page'" in r.json()["detail"]


# --------------------------------------------------------------------------- roles


def _read_token(ctx: Any, customer: str) -> str:
    from web.accounts import create_token
    from yoco.database import unit_of_work

    with unit_of_work(ctx.engine) as s:
        return create_token(s, name=f"read-{customer}", customer=customer).text


def test_every_read_route_for_every_caller_and_tenant(api_app, client_of, seed, seeded) -> None:
    """Each API GET, plain, conditional (with A's owner's tag) and paged (with a cursor of
    A's list), as anonymous, both customers, staff and four tokens, for A's and B's
    contract: exactly who sees what, and nothing of the other tenant."""
    ctx, _ = seeded
    _issue_march(ctx, "C-A", "C-B")
    headers = {
        "ingest_a": {"Authorization": f"Bearer {seed.token}"},
        "read_a": {"Authorization": f"Bearer {_read_token(ctx, 'Acme AI')}"},
        "read_b": {"Authorization": f"Bearer {seed.read_token_b}"},
    }
    users = {"cust_a": "a", "cust_b": "b", "op": "op", "fin": "fin"}
    clients = {k: client_of(v) for k, v in users.items()}
    clients["anon"] = client_of()
    for k in headers:
        clients[k] = client_of()
    # A's owner's tags and cursors, per route.
    alice = clients["cust_a"]
    tags: dict[str, str] = {}
    cursors: dict[str, str] = {}
    for path in _api_gets(api_app):
        url, query = _target(path, "C-A", seed)
        r = alice.get(url, params={**query, **({"per_page": 1} if "failures" in path
                                             and "{event_id}" not in path else {}),
                                   **({"limit": 1} if path.endswith(("/checkpoints",
                                                                     "/contracts")) else {})})
        tags[path] = r.headers["etag"]
        if "link" in r.headers:
            cursors[path] = re.search(r"cursor=([^&>]+)", r.headers["link"]).group(1)
    assert {"/api/v1/contracts", "/api/v1/contracts/{contract_id}/failures",
            "/api/v1/contracts/{contract_id}/checkpoints"} <= set(cursors)

    def allowed(caller: str, tenant: str) -> int:
        if caller == "anon":
            return 401
        if caller == "ingest_a":
            return 403
        if caller in ("op", "fin"):
            return 200
        return 200 if caller.endswith(tenant.lower()) else 404

    checked = 0
    for path in _api_gets(api_app):
        for tenant, cid in (("A", "C-A"), ("B", "C-B")):
            url, query = _target(path, cid, seed)
            public = path == "/api/v1/public-key"
            tenanted = "{contract_id}" in path
            for caller, client in clients.items():
                h = headers.get(caller, {})
                if tenanted:
                    want = allowed(caller, tenant)
                elif public:
                    want = 200
                else:
                    want = {"anon": 401, "ingest_a": 403}.get(caller, 200)
                plain = client.get(url, params=query, headers=h)
                assert plain.status_code == want, (path, tenant, caller, plain.status_code)
                if tenanted and want == 200:
                    other = "Bravo" if tenant == "A" else "Acme"
                    assert other not in plain.text, (path, tenant, caller)
                # Conditional, with A's owner's tag: a 304 only for A's own scope on A.
                cond = client.get(url, params=query, headers={**h, "If-None-Match": tags[path]})
                same_scope = caller in ("cust_a", "read_a") or public
                if want == 200 and (same_scope and (tenant == "A" or not tenanted)):
                    expect_cond = 304 if path not in cursors else 200  # paged: other query
                else:
                    expect_cond = want
                assert cond.status_code == expect_cond, (path, tenant, caller, cond.status_code)
                # Paged, with a cursor of A's list: continues A's list for A's readers; for
                # anyone else it is refused as another list, or 404/401/403 first.
                if path in cursors:
                    paged = client.get(url, params={**query, "cursor": cursors[path]},
                                       headers=h)
                    if want != 200:
                        expect_paged = want
                    elif tenanted and tenant == "B":
                        expect_paged = 400  # A's cursor on B's list
                    elif not tenanted and caller not in ("cust_a", "read_a"):
                        expect_paged = 400  # another scope's list of contracts
                    else:
                        expect_paged = 200
                    assert paged.status_code == expect_paged, (
                        path, tenant, caller, paged.status_code, paged.text[:200])
                checked += 1
    assert checked >= 12 * 2 * 8


def test_a_revoked_token_stops_posting_at_once_and_reading_within_the_cache_ttl(
    seeded, seed
) -> None:
    """Live tokens are remembered for ``session_cache_seconds`` by the readers (a GET
    asks no database for its caller); ingest always asks, so revoking stops it at once."""
    from web.accounts import create_token, revoke_token, token_prefix
    from web.app import create_app
    from web.security import password_hasher
    from web.settings import WebSettings
    from yoco.database import unit_of_work

    ctx, _ = seeded
    with unit_of_work(ctx.engine) as s:
        token = create_token(s, name="both", contract_ids=["C-A"], customer="Acme AI").text

    def app(ttl: float) -> Any:
        return create_app(ctx, WebSettings(secret_key="test-secret", session_cache_seconds=ttl),
                          hasher=password_hasher(cheap=True), clock=lambda: NOW)

    h = {"Authorization": f"Bearer {token}"}
    rec = fx.rec("job_started", "C-A", fx.T0, job_id="jt", gpus=8)
    with TestClient(app(3600)) as cached, TestClient(app(0)) as uncached:
        for c in (cached, uncached):
            assert c.get("/api/v1/contracts/C-A", headers=h).status_code == 200
        with unit_of_work(ctx.engine) as s:
            assert revoke_token(s, token_prefix(token) or "")
        assert cached.post("/api/v1/records", json=[rec], headers=h).status_code == 401
        assert uncached.get("/api/v1/contracts/C-A", headers=h).status_code == 401
        # Within the TTL, this process still lets the revoked token read (documented).
        assert cached.get("/api/v1/contracts/C-A", headers=h).status_code == 200
    with TestClient(app(3600)) as fresh:  # another process: asks the database
        assert fresh.get("/api/v1/contracts/C-A", headers=h).status_code == 401
