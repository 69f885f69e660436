"""Fixtures of the portal tests: a seeded database, the app, logged-in clients."""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from tests import factories as fx

PASSWORD = "correct horse battery"


@dataclass
class Seed:
    """What the seeded database holds: contracts, failures, users, a token."""

    contracts: dict[str, str] = field(default_factory=dict)  # contract → customer
    failures: dict[str, list[str]] = field(default_factory=dict)  # contract → failure ids
    outcomes: dict[str, list[str]] = field(default_factory=dict)
    users: dict[str, str] = field(default_factory=dict)  # key → e-mail
    disputes: dict[str, str] = field(default_factory=dict)  # contract → open dispute id
    sizes: dict[str, int] = field(default_factory=dict)  # contract → latest signed size
    token: str = ""
    read_token_b: str = ""


def _records(cid: str) -> tuple[list[dict[str, Any]], list[str], list[str]]:
    recs: list[dict[str, Any]] = [fx.rec("job_started", cid, fx.T0, job_id="j1", gpus=64)]
    fids, oids = [], []
    plan = [
        ("unplanned", "gpu_lost", "live_migrated", 0),
        ("unplanned", "ecc_uncorrectable", "rolled_back", 120),
        ("preemptive", "thermal", "live_migrated", 0),
        ("planned", "maintenance", "live_migrated", 0),
        ("unplanned", "network_wide_outage", "failed", 10),
        ("unplanned", "kernel_panic", None, 0),
    ]
    for n, (cls, cause, result, lost) in enumerate(plan):
        at = fx.T0 + timedelta(days=20 * n + 1)
        f = fx.rec("failure", cid, at, job_id="j1", failure_class=cls, cause=cause,
                   node=f"node-{n:03d}", gpu=n % 8, step=1000 * n)
        recs.append(f)
        fids.append(f["event_id"])
        if result:
            o = fx.rec("outcome", cid, at + timedelta(seconds=30), failure_event_id=f["event_id"],
                       outcome=result, lost_steps=lost, recovery_seconds=2.5,
                       step_seconds=1.5, gpus_affected=8)
            recs.append(o)
            oids.append(o["event_id"])
    return recs, fids, oids


@pytest.fixture
def seeded(yoco_env: dict[str, str], tmp_path: Path) -> Iterator[
    tuple[Any, Seed]
]:
    """An :class:`App` on a fresh database with two customers' contracts, users and a token."""
    from billing.disputes import open_dispute
    from ledger.checkpoints import sign_all
    from ledger.contracts import add_contracts
    from ledger.ingest import ingest
    from ledger.records import parse_contracts, validate_batch
    from web.accounts import add_user, create_token
    from web.security import password_hasher
    from yoco.app import App
    from yoco.database import unit_of_work
    from yoco.settings import Settings

    ctx = App(Settings(**{**yoco_env, "YOCO_DATA_DIR": str(tmp_path / "data")}))
    seed = Seed()
    import json

    specs, errors = parse_contracts(
        json.dumps(
            [
                fx.contract("C-A", customer="Acme AI", gpu_hour_price="2.50"),
                fx.contract("C-A2", customer="Acme AI", timezone="America/New_York"),
                fx.contract("C-B", customer="Bravo Labs"),
            ]
        ).encode()
    )
    assert not errors
    hasher = password_hasher(cheap=True)
    with unit_of_work(ctx.engine) as s:
        add_contracts(s, specs)
        for cid, cust in (("C-A", "Acme AI"), ("C-A2", "Acme AI"), ("C-B", "Bravo Labs")):
            seed.contracts[cid] = cust
            recs, fids, oids = _records(cid)
            records, errs = validate_batch(recs)
            assert not errs
            ingest(s, records, None, ctx.projectors)
            seed.failures[cid] = fids
            seed.outcomes[cid] = oids
        sign_all(s, ctx.signer, ctx.settings.log_origin)
        for cid in seed.contracts:
            extra, errs = validate_batch(
                [fx.rec("job_progress", cid, fx.T0 + timedelta(days=150), job_id="j1",
                        step=90000, step_seconds=1.5)]
            )
            assert not errs
            ingest(s, extra, None, ctx.projectors)
            seed.disputes[cid] = str(
                open_dispute(s, cid, seed.failures[cid][1], reason="we lost more steps",
                             opened_by="seed").dispute["dispute_id"]
            )
        heads = sign_all(s, ctx.signer, ctx.settings.log_origin)
        seed.sizes = {h.log_id: h.tree_size for h in heads}
        for key, email, role, cust in (
            ("a", "alice@acme.example", "customer", "Acme AI"),
            ("b", "bob@bravo.example", "customer", "Bravo Labs"),
            ("op", "olga@vendor.example", "operator", None),
            ("fin", "finn@vendor.example", "finance", None),
        ):
            # Alice is Acme's admin (she manages its API tokens); Bob is no admin.
            add_user(s, hasher, email=email, name=email.split("@")[0].title(), role=role,
                     password=PASSWORD, customer=cust, customer_admin=key == "a")
            seed.users[key] = email
        seed.token = create_token(s, name="runtime-a", contract_ids=["C-A"]).text
        seed.read_token_b = create_token(s, name="bravo-tools", customer="Bravo Labs").text
    yield ctx, seed
    ctx.close()


@pytest.fixture
def app(seeded: tuple[Any, Seed]) -> FastAPI:
    """The portal on the seeded database (cheap argon2 parameters, fixed secret)."""
    from web.app import create_app
    from web.security import password_hasher
    from web.settings import WebSettings

    ctx, _ = seeded
    return create_app(
        ctx,
        WebSettings(secret_key="test-secret", figures_ttl_seconds=0),
        hasher=password_hasher(cheap=True),
    )


@pytest.fixture
def seed(seeded: tuple[Any, Seed]) -> Seed:
    """The seeded ids."""
    return seeded[1]


def csrf_of(html: str) -> str:
    """The CSRF token of the first form of a page."""
    m = re.search(r'name="csrf_token" value="([^"]+)"', html)
    assert m, "no CSRF token on the page"
    return m.group(1)


def login(client: TestClient, email: str, password: str = PASSWORD) -> Any:
    """Log ``client`` in through the form (GET for the token, then POST)."""
    page = client.get("/login")
    return client.post(
        "/login",
        data={"email": email, "password": password, "csrf_token": csrf_of(page.text),
              "next": "/"},
        follow_redirects=False,
    )


@pytest.fixture
def client_for(app: FastAPI, seed: Seed) -> Iterator[Any]:
    """``client_for("a")``: a TestClient logged in as seeded user ``a`` / ``b`` / ``op`` / ``fin``."""
    clients: list[TestClient] = []

    def make(key: str | None = None) -> TestClient:
        c = TestClient(app, raise_server_exceptions=False)
        c.__enter__()
        clients.append(c)
        if key is not None:
            r = login(c, seed.users[key])
            assert r.status_code == 303, r.text
        return c

    yield make
    for c in clients:
        c.__exit__(None, None, None)


def app_routes(app: Any) -> list[Any]:
    """Every endpoint route of ``app`` (``APIRoute``), walking included routers.

    FastAPI (0.16x) keeps included routers as lazy wrappers in ``app.routes``; their
    routes are reached through ``original_router`` (the include prefix is empty here:
    each router carries its own).
    """
    from fastapi.routing import APIRoute

    out: list[Any] = []

    def walk(routes: Any, prefix: str) -> None:
        for r in routes:
            inner = getattr(r, "original_router", None)
            if inner is not None:
                ctx = getattr(r, "include_context", None)
                walk(inner.routes, prefix + (getattr(ctx, "prefix", "") or ""))
            elif isinstance(r, APIRoute):
                assert not prefix, "an include prefix: join it to the route's path"
                out.append(r)

    walk(app.routes, "")
    return out


@pytest.fixture
def serve() -> Iterator[Any]:
    """``serve(app)``: run ``app`` under a real uvicorn server on 127.0.0.1 (a thread of
    this process), and return its ``(host, port)``; stopped at the end of the test."""
    import threading
    import time

    import uvicorn

    running: list[tuple[Any, threading.Thread]] = []

    def start(app: Any) -> tuple[str, int]:
        config = uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning",
                                lifespan="on")
        server = uvicorn.Server(config)
        thread = threading.Thread(target=server.run, daemon=True)
        thread.start()
        deadline = time.monotonic() + 60
        while not server.started:
            assert time.monotonic() < deadline, "uvicorn did not start"
            assert thread.is_alive(), "uvicorn stopped while starting"
            time.sleep(0.02)
        running.append((server, thread))
        port = server.servers[0].sockets[0].getsockname()[1]
        return "127.0.0.1", int(port)

    yield start
    for server, thread in running:
        server.should_exit = True
        thread.join(timeout=30)
