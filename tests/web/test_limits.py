"""Limits that hold against a real server: the ingest body size (streamed, chunked), the
login limiter under concurrency; and ``Cache-Control: no-store`` on tenant data
(``private, no-cache`` with an ETag on the API's answers)."""

from __future__ import annotations

import select
import socket
from typing import Any

from tests.web.conftest import csrf_of

LIMIT = 64 * 1024


def _app(seeded: Any, **settings: Any) -> Any:
    from web.app import create_app
    from web.security import password_hasher
    from web.settings import WebSettings

    ctx, _ = seeded
    return create_app(ctx, WebSettings(secret_key="limits", **settings),
                      hasher=password_hasher(cheap=True))


def _journal_size(seeded: Any) -> int:
    from sqlalchemy import text

    with seeded[0].engine.connect() as c:
        return int(c.execute(text("SELECT count(*) FROM journal_entries")).scalar_one())


def test_a_chunked_ingest_body_is_cut_off_at_the_limit(seeded, seed, serve) -> None:
    """The server answers 413 while the client is still sending: it never buffers it all."""
    host, port = serve(_app(seeded, max_batch_bytes=LIMIT))
    before = _journal_size(seeded)
    chunk = b"[" + b" " * (16 * 1024 - 1)  # whitespace: valid JSON so far, never ends
    total_cap = 64 * 1024 * 1024  # what an unlimited server would have to take in
    sent = 0
    answered_early = False
    with socket.create_connection((host, port), timeout=60) as sock:
        sock.sendall(
            b"POST /api/v1/records HTTP/1.1\r\nHost: test\r\n"
            b"Authorization: Bearer " + seed.token.encode() + b"\r\n"
            b"Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
        )
        while sent < total_cap:
            readable, _, _ = select.select([sock], [], [], 0)
            if readable:
                answered_early = True
                break
            piece = chunk if sent == 0 else b" " * len(chunk)
            try:
                sock.sendall(b"%x\r\n" % len(piece) + piece + b"\r\n")
            except (BrokenPipeError, ConnectionResetError):
                answered_early = True
                break
            sent += len(piece)
        if not answered_early:  # end the body: the server may answer only now
            sock.sendall(b"0\r\n\r\n")
        sock.settimeout(60)
        answer = b""
        try:
            while b"\r\n\r\n" not in answer:
                got = sock.recv(65536)
                if not got:
                    break
                answer += got
        except ConnectionResetError:
            pass
    assert answer.startswith(b"HTTP/1.1 413"), answer[:200]
    assert answered_early, "the server read the whole chunked body before refusing it"
    # TCP buffers take some in flight, but nowhere near what was offered.
    assert sent < total_cap // 4, sent
    assert _journal_size(seeded) == before


def test_a_declared_length_over_the_limit_is_refused_unread(seeded, seed, client_for) -> None:
    from fastapi.testclient import TestClient

    with TestClient(_app(seeded, max_batch_bytes=LIMIT)) as c:
        r = c.post("/api/v1/records", content=b"[" + b" " * LIMIT + b"]",
                   headers={"Authorization": f"Bearer {seed.token}",
                            "Content-Type": "application/json"})
        assert r.status_code == 413 and "nothing written" in r.json()["detail"]
        r = c.post("/api/v1/records", content=b"[" + b" " * (LIMIT - 2) + b"]",
                   headers={"Authorization": f"Bearer {seed.token}",
                            "Content-Type": "application/json"})
        assert r.status_code == 200, r.text  # exactly the limit is fine


def test_tenant_data_is_never_stored_by_caches(client_for, seed) -> None:
    alice = client_for("a")
    fid = seed.failures["C-A"][1]
    oid = seed.outcomes["C-A"][1]
    paths = [
        "/api/v1/contracts", "/api/v1/contracts/C-A", "/api/v1/contracts/C-A/sla",
        "/api/v1/contracts/C-A/failures", f"/api/v1/contracts/C-A/failures/{fid}",
        "/api/v1/contracts/C-A/years/1", f"/api/v1/contracts/C-A/entries/{oid}/proof",
        "/api/v1/contracts/C-A/checkpoints", "/api/v1/contracts/C-A/credits",
        "/api/v1/contracts/C-B",  # an error answer too
        f"/contracts/C-A/entries/{fid}/proof",
        f"/contracts/C-A/checkpoints/consistency?size1={seed.sizes['C-A']}"
        f"&size2={seed.sizes['C-A']}",
        "/contracts/C-A/reports/2026-03.pdf", "/contracts/C-A", "/contracts/C-A/failures",
    ]
    for path in paths:
        r = alice.get(path)
        assert r.status_code in (200, 404), (path, r.status_code)
        if path.startswith("/api/") and r.status_code == 200:
            # A tagged API answer: no shared cache may keep it (private), and a client
            # that keeps a copy must revalidate it with its ETag every time (no-cache).
            assert r.headers.get("cache-control") == "private, no-cache", path
            assert r.headers.get("etag") and "Authorization" in r.headers["vary"], path
        else:
            assert r.headers.get("cache-control") == "no-store", path
    fin = client_for("fin")
    r = fin.post("/finance/export.csv", data={"csrf_token": csrf_of(fin.get("/finance").text)})
    assert r.status_code == 200 and r.headers["cache-control"] == "no-store"
    # Static assets may be cached.
    css = alice.get("/static/style.css")
    assert css.status_code == 200 and "no-store" not in css.headers.get("cache-control", "")


# --------------------------------------------------------------------------- logins


class CountingHasher:
    """argon2 with a count of password checks (threads of the server call it at once)."""

    def __init__(self, inner: Any) -> None:
        import threading

        self.inner = inner
        self.checks = 0
        self._lock = threading.Lock()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def verify(self, stored: str, password: str) -> bool:
        with self._lock:
            self.checks += 1
        return bool(self.inner.verify(stored, password))


def test_concurrent_wrong_passwords_get_exactly_the_limit_of_checks(seeded, seed, serve) -> None:
    """40 wrong passwords at once, over real connections to a real server: 5 checks."""
    from concurrent.futures import ThreadPoolExecutor

    import httpx
    from argon2 import PasswordHasher

    from web.app import create_app
    from web.settings import WebSettings

    ctx, _ = seeded
    # A hash that takes a while, so that the attempts really overlap.
    hasher = CountingHasher(PasswordHasher(time_cost=2, memory_cost=8192, parallelism=1))
    app = create_app(ctx, WebSettings(secret_key="limits", threads=40, pool_size=16,
                                      max_overflow=30), hasher=hasher)  # type: ignore[arg-type]
    host, port = serve(app)
    base = f"http://{host}:{port}"

    def form() -> httpx.Client:
        c = httpx.Client(base_url=base, timeout=120)
        c.get("/login")  # the anonymous cookie the form's CSRF token is bound to
        return c

    clients = [form() for _ in range(40)]
    tokens = [csrf_of(c.get("/login").text) for c in clients]
    import threading

    go = threading.Barrier(40)

    def attempt(i: int) -> int:
        go.wait()
        r = clients[i].post("/login", data={"email": seed.users["a"], "password": "wrong!",
                                            "csrf_token": tokens[i]})
        return r.status_code

    with ThreadPoolExecutor(40) as pool:
        codes = list(pool.map(attempt, range(40)))
    for c in clients:
        c.close()
    assert sorted(codes) == [401] * 5 + [429] * 35, codes
    assert hasher.checks == 5


def _limited_app(seeded: Any, clock: list[Any], **settings: Any) -> Any:
    from web.app import create_app
    from web.security import password_hasher
    from web.settings import WebSettings

    return create_app(seeded[0], WebSettings(secret_key="limits", **settings),
                      hasher=password_hasher(cheap=True), clock=lambda: clock[0])


def _try(app: Any, address: str, email: str, password: str) -> Any:
    from fastapi.testclient import TestClient

    from tests.web.conftest import login

    with TestClient(app, client=(address, 40000)) as c:
        return login(c, email, password)


def test_a_guesser_elsewhere_does_not_lock_the_user_out_and_backs_off(seeded, seed) -> None:
    from datetime import UTC, datetime, timedelta

    from tests.web.conftest import PASSWORD

    clock = [datetime(2026, 6, 1, tzinfo=UTC)]
    app = _limited_app(seeded, clock)
    alice = seed.users["a"]
    for _ in range(5):
        assert _try(app, "203.0.113.9", alice, "guess guess").status_code == 401
    r = _try(app, "203.0.113.9", alice, PASSWORD)  # even the right one, from there
    assert r.status_code == 429 and 1 <= int(r.headers["retry-after"]) <= 31
    # The real user, at her own client, is not locked out.
    assert _try(app, "198.51.100.7", alice, PASSWORD).status_code == 303
    # The guesser backs off: one try after 30 s, then 60 s, then 120 s...
    for wait in (30, 60, 120):
        r = _try(app, "203.0.113.9", alice, "guess guess")
        assert r.status_code == 429 and int(r.headers["retry-after"]) <= wait + 1
        clock[0] += timedelta(seconds=wait)
        assert _try(app, "203.0.113.9", alice, "guess guess").status_code == 401
    r = _try(app, "203.0.113.9", alice, "guess guess")
    assert r.status_code == 429 and 200 <= int(r.headers["retry-after"]) <= 241
    # Quiet for a whole window after the block: the count starts again.
    clock[0] += timedelta(minutes=15, seconds=240)
    assert _try(app, "203.0.113.9", alice, PASSWORD).status_code == 303


def test_limits_per_client_and_per_account_everywhere(seeded, seed) -> None:
    from datetime import UTC, datetime

    from tests.web.conftest import PASSWORD

    clock = [datetime(2026, 6, 1, tzinfo=UTC)]
    app = _limited_app(seeded, clock, login_failures_per_address=4,
                       login_failures_per_account_everywhere=6)
    # One client spraying many accounts is stopped by its own limit.
    for n in range(4):
        assert _try(app, "192.0.2.1", f"user{n}@x.example", "guess guess").status_code == 401
    assert _try(app, "192.0.2.1", seed.users["b"], PASSWORD).status_code == 429
    assert _try(app, "192.0.2.2", seed.users["b"], PASSWORD).status_code == 303
    # Many clients guessing one account: past its own (higher) limit it backs off for all.
    for n in range(6):
        assert _try(app, f"192.0.2.{10 + n}", seed.users["a"], "guess guess").status_code == 401
    assert _try(app, "192.0.2.99", seed.users["a"], PASSWORD).status_code == 429
