"""``/metrics``: the OpenMetrics exposition checked against ``yoco sla``, and who may scrape."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from prometheus_client.openmetrics.parser import text_string_to_metric_families

from tests.web.conftest import Seed, login

REPO = Path(__file__).resolve().parents[2]
NOW = datetime(2026, 11, 1, 12, 0, tzinfo=UTC)  # in year 1 of every seeded contract
LATER = datetime(2027, 2, 1, 12, 0, tzinfo=UTC)  # in year 2; year 1 ended, not closed


def _metrics_token(ctx: Any) -> str:
    from web.accounts import create_token
    from yoco.database import unit_of_work

    with unit_of_work(ctx.engine) as s:
        return create_token(s, name="prometheus", scopes=["metrics"]).text


def _client(ctx: Any, clock: datetime) -> TestClient:
    from web.app import create_app
    from web.security import password_hasher
    from web.settings import WebSettings

    app = create_app(
        ctx,
        WebSettings(secret_key="test-secret", figures_ttl_seconds=0),
        hasher=password_hasher(cheap=True),
        clock=lambda: clock,
    )
    return TestClient(app, raise_server_exceptions=False)


@pytest.fixture
def scraper(seeded: tuple[Any, Seed]) -> Iterator[tuple[Any, TestClient, str]]:
    ctx, _ = seeded
    token = _metrics_token(ctx)
    with _client(ctx, NOW) as client:
        yield ctx, client, token


def scrape(client: TestClient, token: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """The samples of a scrape: (name, sorted labels) → value (parsed as OpenMetrics)."""
    r = client.get("/metrics", headers={"Authorization": f"Bearer {token}"})
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("application/openmetrics-text")
    out = {}
    for family in text_string_to_metric_families(r.text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def _sla_json(ctx: Any, cid: str, year: int, now: datetime) -> dict[str, Any]:
    from billing.services import sla_figures
    from yoco.database import unit_of_work

    with unit_of_work(ctx.engine) as s:
        out: dict[str, Any] = sla_figures(s, cid, year=year, now=now).to_json()
        return out


def _expected_credit(ctx: Any, cid: str, year: int) -> float:
    from billing.amendments import contract_in_force
    from billing.money import credit_minor_units, from_minor_units
    from yoco.database import unit_of_work

    with unit_of_work(ctx.engine) as s:
        force = contract_in_force(s, cid, year)
        c = force.contract
        minor = credit_minor_units(c.credit_base, force.terms.credit_percent, c.currency)
        return float(from_minor_units(minor, c.currency))


def _check_year(samples: dict[Any, float], ctx: Any, cid: str, year: int, now: datetime) -> None:
    want = _sla_json(ctx, cid, year, now)
    labels = (("contract", cid), ("year", str(year)))
    assert samples[("yoco_covered_failures", labels)] == want["covered_failures"]
    assert samples[("yoco_resolved_failures", labels)] == want["resolved_failures"]
    assert samples[("yoco_pending_failures", labels)] == want["pending_failures"]
    assert samples[("yoco_unresolved_failures", labels)] == (
        want["covered_failures"] - want["resolved_failures"]
    )
    if want["resolution_rate"] is None:
        assert ("yoco_resolution_rate", labels) not in samples
    else:
        assert samples[("yoco_resolution_rate", labels)] == pytest.approx(
            float(Decimal(want["resolution_rate"])), abs=1e-6
        )
    for name in ("lost_gpu_hours", "allocated_gpu_hours", "goodput"):
        assert samples[(f"yoco_{name}", labels)] == pytest.approx(
            float(Decimal(want[name])), abs=1e-6
        ), name
    assert samples[("yoco_guarantee_met", labels)] == (1.0 if want["guarantee_met"] else 0.0)
    assert samples[("yoco_guarantee_threshold", labels)] == pytest.approx(
        float(Decimal(want["threshold_percent"]) / 100)
    )
    credit = 0.0 if want["guarantee_met"] else _expected_credit(ctx, cid, year)
    liability = [v for (n, ls), v in samples.items()
                 if n == "yoco_credit_liability" and dict(ls).get("contract") == cid
                 and dict(ls)["year"] == str(year)]
    assert liability == [pytest.approx(credit)]


def test_year_figures_are_those_of_yoco_sla(scraper: tuple[Any, TestClient, str]) -> None:
    ctx, client, token = scraper
    samples = scrape(client, token)
    for cid in ("C-A", "C-A2", "C-B"):
        _check_year(samples, ctx, cid, 1, NOW)
    # the seeded years miss the guarantee: a credit is owed if they closed now
    want = _sla_json(ctx, "C-A", 1, NOW)
    assert not want["guarantee_met"]
    assert ("yoco_credit_liability",
            (("contract", "C-A"), ("currency", "USD"), ("year", "1"))) in samples
    # one series per open contract year per metric: only year 1 has begun
    years = {dict(ls)["year"] for (n, ls) in samples if n == "yoco_goodput"}
    assert years == {"1"}


def test_every_open_year_is_exposed_and_no_other(seeded: tuple[Any, Seed]) -> None:
    ctx, _ = seeded
    token = _metrics_token(ctx)
    with _client(ctx, LATER) as client:
        samples = scrape(client, token)
    pairs = {(dict(ls)["contract"], dict(ls)["year"]) for (n, ls) in samples
             if n == "yoco_covered_failures"}
    assert pairs == {(c, y) for c in ("C-A", "C-A2", "C-B") for y in ("1", "2")}
    _check_year(samples, ctx, "C-B", 1, LATER)
    _check_year(samples, ctx, "C-B", 2, LATER)


def test_ledger_size_and_checkpoint_age(scraper: tuple[Any, TestClient, str]) -> None:
    from sqlalchemy import func, select

    from ledger.models import Checkpoint, LedgerLog
    from yoco.database import unit_of_work

    ctx, client, token = scraper
    samples = scrape(client, token)
    with unit_of_work(ctx.engine) as s:
        sizes = dict(s.execute(select(LedgerLog.log_id, LedgerLog.size)).all())
        signed = dict(s.execute(select(Checkpoint.log_id, func.max(Checkpoint.signed_at))
                                .group_by(Checkpoint.log_id)).all())
    for cid in ("C-A", "C-A2", "C-B"):
        labels = (("contract", cid),)
        assert samples[("yoco_ledger_entries", labels)] == sizes[cid] > 0
        assert samples[("yoco_checkpoint_age_seconds", labels)] == pytest.approx(
            max(0.0, (NOW - signed[cid]).total_seconds())
        )


def test_recoveries_come_from_the_ledgers_outcome_entries(
    scraper: tuple[Any, TestClient, str],
) -> None:
    _, client, token = scraper
    samples = scrape(client, token)
    for cid in ("C-A", "C-A2", "C-B"):
        # the seed reports 3 live migrations, 1 roll-back, 1 failure, each in 2.5 s
        for outcome, n in (("live_migrated", 3), ("rolled_back", 1), ("failed", 1)):
            assert samples[("yoco_recoveries_total",
                            (("contract", cid), ("outcome", outcome)))] == n
        c = (("contract", cid),)
        assert samples[("yoco_recovery_seconds_count", c)] == 5
        assert samples[("yoco_recovery_seconds_sum", c)] == pytest.approx(12.5)
        assert samples[("yoco_recovery_seconds_bucket", (*c, ("le", "1.0")))] == 0
        assert samples[("yoco_recovery_seconds_bucket", (*c, ("le", "2.5")))] == 5
        assert samples[("yoco_recovery_seconds_bucket", (*c, ("le", "+Inf")))] == 5


def test_a_scrape_reuses_the_cached_figures(scraper: tuple[Any, TestClient, str]) -> None:
    _, client, token = scraper
    first = scrape(client, token)
    portal = client.app.state.portal  # type: ignore[attr-defined]
    hits = portal.cache.pages.hits
    assert scrape(client, token) == first
    assert portal.cache.pages.hits >= hits + 4  # recoveries + one block per contract year


def test_who_may_scrape(seeded: tuple[Any, Seed]) -> None:
    from web.accounts import revoke_token, token_prefix
    from yoco.database import unit_of_work

    ctx, seed = seeded
    token = _metrics_token(ctx)
    with _client(ctx, NOW) as anon:
        r = anon.get("/metrics")
        assert r.status_code == 401
        assert r.headers["www-authenticate"] == "Bearer"
        assert "yoco_" not in r.text
        assert anon.get("/metrics", headers={"Authorization": "Bearer nope"}).status_code == 401
        for other in (seed.token, seed.read_token_b):  # ingest and read tokens
            r = anon.get("/metrics", headers={"Authorization": f"Bearer {other}"})
            assert r.status_code == 404, other
            assert "yoco_" not in r.text
        assert anon.get("/metrics", headers={"Authorization": f"Bearer {token}"}).status_code == 200
        # the metrics token reads nothing else
        r = anon.get("/api/v1/contracts", headers={"Authorization": f"Bearer {token}"})
        assert r.status_code == 403
        r = anon.get("/api/v1/contracts/C-A/sla", headers={"Authorization": f"Bearer {token}"})
        assert r.status_code == 403
    for key, status in (("a", 404), ("b", 404), ("fin", 404), ("op", 200)):
        with _client(ctx, NOW) as c:
            assert login(c, seed.users[key]).status_code == 303
            r = c.get("/metrics")
            assert r.status_code == status, key
            assert ("yoco_covered_failures" in r.text) == (status == 200)
    prefix = token_prefix(token)
    assert prefix
    with unit_of_work(ctx.engine) as s:
        assert revoke_token(s, prefix)
    with _client(ctx, NOW) as c:
        assert c.get("/metrics", headers={"Authorization": f"Bearer {token}"}).status_code == 401


def test_token_scopes_are_checked(seeded: tuple[Any, Seed]) -> None:
    from web.accounts import create_token
    from web.errors import Invalid
    from yoco.database import unit_of_work

    ctx, _ = seeded
    with unit_of_work(ctx.engine) as s, pytest.raises(Invalid, match="unknown scope"):
        create_token(s, name="x", scopes=["admin"])
    with unit_of_work(ctx.engine) as s, pytest.raises(Invalid, match="--scope metrics"):
        create_token(s, name="x")


def test_grafana_dashboard_queries_only_exposed_metrics(
    scraper: tuple[Any, TestClient, str],
) -> None:
    _, client, token = scraper
    exposed = {name for name, _ in scrape(client, token)}
    dashboard = json.loads((REPO / "deploy" / "grafana" / "yoco.json").read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
    assert exprs
    queried = {m for e in exprs for m in re.findall(r"\byoco_\w+", e)}
    assert queried
    assert queried <= exposed, queried - exposed
    # every metric family the endpoint has is on the dashboard
    families = {re.sub(r"_(bucket|count|sum|total)$", "", n) for n in exposed}
    shown = {re.sub(r"_(bucket|count|sum|total)$", "", n) for n in queried}
    assert families <= shown, families - shown


def _contracts_in(samples: dict[Any, float]) -> set[str]:
    return {dict(ls)["contract"] for (_, ls) in samples if "contract" in dict(ls)}


def test_a_customer_metrics_token_scrapes_only_its_customers_contracts(
    scraper: tuple[Any, TestClient, str],
) -> None:
    """A customer's metrics token: `yoco tokens create --customer "Acme AI" --scope metrics` used to scrape
    every tenant's contracts. A scope never widens the tenant: the customer's token sees
    its own contracts (with the very figures the operator's scrape shows for them), one
    bound to contracts sees those, the unbound token every contract."""
    from typer.testing import CliRunner

    from web.accounts import create_token
    from yoco.cli import build_app
    from yoco.database import unit_of_work

    ctx, client, operator_token = scraper
    with unit_of_work(ctx.engine) as s:
        acme = create_token(s, name="m", customer="Acme AI", scopes=["metrics"]).text
        bravo = create_token(s, name="mb", customer="Bravo Labs", scopes=["metrics"]).text
        runtime = create_token(s, name="mr", contract_ids=["C-A2"], scopes=["metrics"]).text
    everything = scrape(client, operator_token)
    assert _contracts_in(everything) == {"C-A", "C-A2", "C-B"}
    mine = scrape(client, acme)
    assert _contracts_in(mine) == {"C-A", "C-A2"}
    assert mine == {k: v for k, v in everything.items()
                    if dict(k[1]).get("contract") in {"C-A", "C-A2"}}
    assert _contracts_in(scrape(client, bravo)) == {"C-B"}
    assert _contracts_in(scrape(client, runtime)) == {"C-A2"}
    # Asked again (from the caches now): still the tenant's own.
    assert _contracts_in(scrape(client, acme)) == {"C-A", "C-A2"}
    # The command line says what the token will see.
    result = CliRunner().invoke(build_app(), ["tokens", "create", "--name", "m2", "--customer",
                                              "Acme AI", "--scope", "metrics"])
    assert result.exit_code == 0, result.output
    assert "scrape /metrics for customer 'Acme AI''s contracts only" in result.output
