"""Tenant isolation: every route, as customer A with customer B's ids, answers 404.

And the database enforces it on its own: the portal role under row-level security sees
only the customer named in the transaction, whatever the query asks for.
"""

from __future__ import annotations

import re
from typing import Any

import pytest
from fastapi.routing import APIRoute
from sqlalchemy import text

from tests.web.conftest import csrf_of

SKIP = {"/login", "/logout", "/api/v1/records"}  # no tenant ids (records: see test_ingest_api)


def _ids(seed: Any) -> dict[str, str]:
    return {
        "contract_id": "C-B",
        "event_id": seed.failures["C-B"][1],
        "dispute_id": seed.disputes["C-B"],
        "month": "2026-03",
        "year": "1",
        "fmt": "csv",
        # Bravo's read token: Acme's admin may not revoke it (/account/tokens/{prefix})
        "prefix": seed.read_token_b.split("_")[0] + "_" + seed.read_token_b.split("_")[1],
        # /account/alerts/{name}/{action}: no destination of Acme's has this name
        "name": "cust-bravo",
        "action": "disable",
    }


def test_every_route_answers_404_for_another_customers_ids(app, client_for, seed) -> None:
    alice = client_for("a")
    token = csrf_of(alice.get("/contracts/C-A").text)
    ids = _ids(seed)
    outcome_b = seed.outcomes["C-B"][0]
    walked = 0
    from web.routers import ROUTERS

    for route in [r for router in ROUTERS for r in router.routes]:
        if not isinstance(route, APIRoute) or route.path in SKIP:
            continue
        params = re.findall(r"{(\w+)}", route.path)
        if not params and not route.path.startswith(("/operator", "/finance")):
            continue
        path = route.path
        for p in params:
            path = path.replace("{" + p + "}", ids[p])
        query = {}
        if "consistency" in path:
            query = {"size1": 1, "size2": seed.sizes["C-B"]}
        for method in route.methods:
            if method == "GET":
                paths = [path]
                if "{event_id}" in route.path:  # an outcome of B's, too
                    paths.append(route.path.replace("{contract_id}", "C-B").replace(
                        "{event_id}", outcome_b))
                for target in paths:
                    r = alice.get(target, params=query, follow_redirects=False)
                    assert r.status_code == 404, (target, r.status_code, r.text[:300])
                    assert "Bravo" not in r.text and "C-B" not in r.text, target
            elif method == "POST":
                data = {"csrf_token": token, "reason": "x", "decision": "reject", "note": "x",
                        "contract_id": "C-B", "year": "1"}
                r = alice.post(path, data=data, follow_redirects=False)
                assert r.status_code == 404, (path, r.status_code, r.text[:300])
            walked += 1
    assert walked >= 25


def test_nothing_of_b_shows_on_a_s_own_pages(client_for, seed) -> None:
    alice = client_for("a")
    for path in ("/contracts", "/contracts/C-A", "/contracts/C-A/failures",
                 "/contracts/C-A/checkpoints", "/contracts/C-A/credits",
                 "/api/v1/contracts", "/contracts/C-A/reports"):
        r = alice.get(path)
        assert r.status_code == 200, path
        assert "Bravo" not in r.text and "C-B" not in r.text, path
    assert [c["contract_id"] for c in alice.get("/api/v1/contracts").json()] == ["C-A", "C-A2"]


def test_unknown_and_foreign_ids_answer_alike(client_for, seed) -> None:
    alice = client_for("a")
    foreign = alice.get(f"/api/v1/contracts/C-B/failures/{seed.failures['C-B'][0]}")
    unknown = alice.get("/api/v1/contracts/C-Z/failures/00000000-0000-4000-8000-000000000000")
    mine_unknown = alice.get(
        "/api/v1/contracts/C-A/failures/00000000-0000-4000-8000-000000000000"
    )
    assert foreign.status_code == unknown.status_code == mine_unknown.status_code == 404
    assert foreign.json() == unknown.json() == mine_unknown.json()


def test_read_token_sees_only_its_customer(client_for, seed) -> None:
    c = client_for()
    h = {"Authorization": f"Bearer {seed.read_token_b}"}
    assert [x["contract_id"] for x in c.get("/api/v1/contracts", headers=h).json()] == ["C-B"]
    assert c.get("/api/v1/contracts/C-A", headers=h).status_code == 404
    assert c.get("/api/v1/contracts/C-B/failures", headers=h).json()["total"] == 6
    # An ingest token cannot read, and a made-up token is nobody.
    assert c.get("/api/v1/contracts", headers={"Authorization": f"Bearer {seed.token}"}
                 ).status_code == 403
    bad = seed.read_token_b[:-4] + "AAAA"
    assert c.get("/api/v1/contracts", headers={"Authorization": f"Bearer {bad}"}
                 ).status_code == 401


def test_staff_pages_are_not_found_for_customers(client_for) -> None:
    alice = client_for("a")
    for path in ("/operator", "/operator/disputes", "/operator/years", "/finance"):
        assert alice.get(path).status_code == 404, path
    token = csrf_of(alice.get("/contracts/C-A").text)
    r = alice.post("/finance/export.csv", data={"csrf_token": token})
    assert r.status_code == 404


@pytest.mark.parametrize("table", ["contracts", "failures", "outcomes", "journal_entries",
                                   "merkle_nodes", "checkpoints", "job_spans", "ledger_logs",
                                   "billing_disputes"])
def test_row_level_security_scopes_the_portal_role(app, table, request) -> None:
    """The database alone, with no service-layer filter, hides other customers' rows."""
    if table == "merkle_nodes":
        # Logs this small store no node (stored ones start at height
        # ledger.tree.STORED_FROM): give them the low nodes a ledger written when every
        # node was stored still holds.
        from tests.ledger.legacy_nodes import store_low_nodes

        for log_id in ("C-A", "C-A2", "C-B"):
            assert store_low_nodes(request.getfixturevalue("owner_engine"), log_id)
    portal = app.state.portal
    col = "log_id" if table in ("journal_entries", "merkle_nodes", "checkpoints",
                                "ledger_logs") else "contract_id"
    engine = portal.db.read_engine
    with engine.connect() as conn:
        def seen(customer: str, scope: str = "") -> set[str]:
            with conn.begin():
                conn.execute(text("SELECT set_config('yoco.customer', :c, true), "
                                  "set_config('yoco.scope', :s, true)"),
                             {"c": customer, "s": scope})
                return set(conn.execute(text(f"SELECT DISTINCT {col} FROM {table}")).scalars())

        assert seen("Acme AI") == {"C-A", "C-A2"}
        assert seen("Bravo Labs") == {"C-B"}
        assert seen("") == set()
        assert {"C-A", "C-A2", "C-B"} <= seen("", "all")
        # Outside any transaction setting (a pooled connection reused): nothing.
        with conn.begin():
            assert conn.execute(text(f"SELECT count(*) FROM {table}")).scalar() == 0
        # The portal role may not write anything.
        with pytest.raises(Exception, match="permission denied"), conn.begin():
            conn.execute(text("DELETE FROM portal_users"))
