"""``/metrics``: the SLA figures, the ledger and recoveries for Prometheus (OpenMetrics).

Who may scrape: a bearer token made with ``yoco tokens create --scope metrics`` (it
may do nothing else), or a logged-in operator.  No credentials: 401 with
``WWW-Authenticate: Bearer``; anyone else (customers, finance, read and ingest tokens):
404, as every operator page.

A scope never widens a token's tenant (:func:`scrape_scope`): a metrics token bound to a
customer (``--customer``) scrapes that customer's contracts only, read under the
portal's row-level security as that customer; one bound to contracts (``--contract``)
scrapes those contracts only; only a token bound to nothing (the vendor's Prometheus)
and a logged-in operator see every contract.

What is exposed (docs/metrics.md): per contract and open contract year, the figures of
``yoco sla`` (the portal's cached year views, :func:`web.services.year_view_for`) and
the credit liability; per contract, the ledger's size and the age of its newest signed
checkpoint; per contract, the recoveries reported into the ledger (outcome entries, so
every runtime that reports there is counted) by outcome, and a histogram of their
recovery seconds.  Labels are ``contract``, ``year`` and (recoveries only) ``outcome``:
one series per open contract year (or per contract) per metric.

A scrape reads two small aggregates (log sizes and checkpoint times); the year figures
come from the year views of the portal's one cache (``web.cache``: recomputed only when
the log grew or the TTL passed), and the recovery aggregates and each year's block of
samples from its pages region, keyed by the log sizes.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.openmetrics.exposition import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.registry import Collector, CollectorRegistry
from starlette.concurrency import run_in_threadpool

from billing.money import credit_minor_units, from_minor_units
from billing.services import current_year
from ledger.checkpoints import latest_signed_times
from ledger.journal import log_sizes
from ledger.projections import outcome_counts, recovery_histograms
from web import billing_bridge, services
from web.accounts import Principal
from web.cache import view_stamp
from web.deps import PortalDep, caller_async
from web.errors import NotFound
from web.portal import Portal
from web.views import YearView

router = APIRouter(tags=["metrics"], include_in_schema=False)

#: The scope a token needs (``yoco tokens create --scope metrics``).
SCOPE = "metrics"
#: Upper bounds (seconds) of the recovery-time histogram's buckets (+Inf added).
RECOVERY_BUCKETS: tuple[float, ...] = (0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600)
#: Reads of the scrape run scoped to every tenant (the figures of all contracts).
_READER = Principal(kind="token", id=0, name="metrics", role="operator", customer=None)

_YEAR_METRICS: tuple[tuple[str, str], ...] = (
    ("yoco_covered_failures", "Covered failures of the contract year so far."),
    ("yoco_resolved_failures", "Covered failures resolved by live migration, no lost progress."),
    ("yoco_pending_failures", "Covered failures with no outcome reported yet."),
    ("yoco_unresolved_failures", "Covered failures not resolved (rolled back, failed, pending)."),
    ("yoco_resolution_rate", "Resolved / covered failures, 0..1 (absent: no covered failure)."),
    ("yoco_guarantee_threshold", "The guaranteed resolution rate, 0..1."),
    ("yoco_guarantee_met", "1 if the year's figures meet the guarantee now, else 0."),
    ("yoco_lost_gpu_hours", "GPU-hours lost to failures in the contract year so far."),
    ("yoco_allocated_gpu_hours", "GPU-hours allocated in the contract year so far."),
    ("yoco_goodput", "1 - lost / allocated GPU-hours of the contract year so far, 0..1."),
    ("yoco_credit_liability", "The credit due if the year closed now (0 when met), in the "
                              "contract's currency (label currency)."),
)


def metrics_caller(request: Request, who: Principal | None) -> Principal | None:
    """``who`` if it may scrape (metrics token, operator user); NotFound for others."""
    if who is None:
        return None
    if who.kind == "token" and SCOPE in who.scopes:
        return who
    if who.kind == "user" and who.role == "operator":
        return who
    raise NotFound()


@dataclass(frozen=True, slots=True)
class ScrapeScope:
    """What one scrape may show: read as ``reader`` (row-level security applies), and,
    when ``contracts`` is not None, only those contracts."""

    reader: Principal
    contracts: frozenset[str] | None = None

    @property
    def key(self) -> tuple[str, tuple[str, ...] | None]:
        """Part of every cache key of the scrape: scopes never share an entry."""
        return (self.reader.customer or "", None if self.contracts is None
                else tuple(sorted(self.contracts)))


def scrape_scope(who: Principal) -> ScrapeScope:
    """The tenant a scraper may see: never wider than the tenant of its token.

    A token bound to a customer reads as that customer (row-level security); a token
    bound to contracts sees those contracts; an unbound metrics token and an operator see
    every contract."""
    if who.kind == "token" and who.customer is not None:
        return ScrapeScope(Principal(kind="token", id=who.id, name=who.name, role="customer",
                                     customer=who.customer))
    if who.kind == "token" and who.contract_ids:
        return ScrapeScope(_READER, frozenset(who.contract_ids))
    return ScrapeScope(_READER)


@router.get("/metrics")
async def metrics(request: Request, portal: PortalDep) -> Response:
    """The OpenMetrics exposition (see docs/metrics.md)."""
    who = metrics_caller(request, await caller_async(request, portal))
    if who is None:
        return Response(
            "Send 'Authorization: Bearer <token>' with a token of scope 'metrics'.\n",
            status_code=401,
            headers={"WWW-Authenticate": "Bearer"},
            media_type="text/plain",
        )
    body = await run_in_threadpool(exposition, portal, scrape_scope(who))
    return Response(body, media_type=CONTENT_TYPE_LATEST, headers={"Cache-Control": "no-store"})


def exposition(portal: Portal, scope: ScrapeScope | None = None) -> bytes:
    """The body of a scrape at ``portal.now()``, showing ``scope``'s contracts only
    (default: every contract)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Snapshot(portal, scope or ScrapeScope(_READER)))
    return generate_latest(registry)


# ---------------------------------------------------------------------------- collecting


@dataclass(frozen=True, slots=True)
class _Recoveries:
    by_outcome: tuple[tuple[str, int], ...]
    buckets: tuple[int, ...]  # cumulative counts per RECOVERY_BUCKETS, then +Inf
    total_seconds: float


class _Snapshot(Collector):
    def __init__(self, portal: Portal, scope: ScrapeScope) -> None:
        self.portal = portal
        self.scope = scope

    def collect(self) -> Iterator[Metric]:
        portal = self.portal
        now = portal.now()
        reader = self.scope.reader
        only = self.scope.contracts
        with portal.db.read(reader) as db:
            contracts = [c.contract_id for c in services.visible_contracts(db, reader)
                         if only is None or c.contract_id in only]
            sizes = log_sizes(db)
            signed = latest_signed_times(db)
            stamp = tuple((c, sizes.get(c, 0)) for c in contracts)
            recoveries: dict[str, _Recoveries] = portal.cache.pages.get_or_make(
                ("metrics-recoveries", self.scope.key, stamp), lambda: _recoveries(db)
            )
            closes = {c: billing_bridge.year_closes(db, c) for c in contracts}
            views: list[YearView] = []
            for cid in contracts:
                views.extend(_open_years(portal, db, reader, cid, closes[cid], now))
        yield from _ledger_metrics(contracts, sizes, signed, now)
        yield from _recovery_metrics(contracts, recoveries)
        yield from _year_metrics(portal, views)


def _open_years(
    portal: Portal, db: Any, reader: Principal, contract_id: str, closed: dict[int, Any],
    now: datetime
) -> list[YearView]:
    """The views of the contract's years that have begun (or the first) and are not closed."""
    spec = services.contract_for(db, reader, contract_id, portal.cache.views)
    last = current_year(spec, now)
    out = []
    for k in range(1, last + 1):
        if k in closed:
            continue
        out.append(services.year_view_for(portal, reader, contract_id, k, now))
    return out


def _recoveries(db: Any) -> dict[str, _Recoveries]:
    """Outcome entries per contract: counts by outcome, and recovery-seconds buckets."""
    by_outcome = outcome_counts(db)
    return {
        cid: _Recoveries(
            by_outcome=tuple(by_outcome.get(cid, [])),
            buckets=counts,
            total_seconds=total,
        )
        for cid, (counts, total) in recovery_histograms(db, RECOVERY_BUCKETS).items()
    }


def _ledger_metrics(
    contracts: list[str], sizes: dict[str, int], signed: dict[str, datetime], now: datetime
) -> Iterable[Metric]:
    entries = GaugeMetricFamily(
        "yoco_ledger_entries", "Entries in the contract's ledger log.", labels=["contract"]
    )
    age = GaugeMetricFamily(
        "yoco_checkpoint_age_seconds",
        "Seconds since the newest signed checkpoint of the contract's log.",
        labels=["contract"],
        unit="seconds",
    )
    for cid in contracts:
        entries.add_metric([cid], sizes.get(cid, 0))
        if cid in signed:
            age.add_metric([cid], max(0.0, (now - signed[cid]).total_seconds()))
    return (entries, age)


def _recovery_metrics(contracts: list[str], found: dict[str, _Recoveries]) -> Iterable[Metric]:
    counts = CounterMetricFamily(
        "yoco_recoveries",
        "Outcome entries reported into the ledger (every runtime), by outcome.",
        labels=["contract", "outcome"],
    )
    hist = HistogramMetricFamily(
        "yoco_recovery_seconds",
        "Recovery seconds of the outcome entries reported into the ledger.",
        labels=["contract"],
        unit="seconds",
    )
    for cid in contracts:
        r = found.get(cid)
        if r is None:
            continue
        for outcome, n in r.by_outcome:
            counts.add_metric([cid, outcome], n)
        bounds = [*(_le(b) for b in RECOVERY_BUCKETS), "+Inf"]
        hist.add_metric([cid], list(zip(bounds, r.buckets, strict=True)), r.total_seconds)
    return (counts, hist)


def _le(bound: float) -> str:
    return str(float(bound))


def _year_metrics(portal: Portal, views: list[YearView]) -> Iterable[Metric]:
    families = {
        name: GaugeMetricFamily(name, doc, labels=["contract", "year"])
        for name, doc in _YEAR_METRICS
        if name != "yoco_credit_liability"
    }
    liability = GaugeMetricFamily(
        "yoco_credit_liability",
        dict(_YEAR_METRICS)["yoco_credit_liability"],
        labels=["contract", "year", "currency"],
    )
    for view in views:
        samples: tuple[tuple[str, float], ...] = portal.cache.pages.get_or_make(
            ("metrics-year", *view_stamp(view)), lambda v=view: year_samples(v)  # type: ignore[misc]
        )
        labels = [view.contract.contract_id, str(view.year)]
        for name, value in samples:
            if name == "yoco_credit_liability":
                liability.add_metric([*labels, view.contract.currency], value)
            else:
                families[name].add_metric(labels, value)
    return (*families.values(), liability)


def year_samples(view: YearView) -> tuple[tuple[str, float], ...]:
    """(metric, value) of one contract year's view."""
    f = view.figures
    out: list[tuple[str, float]] = [
        ("yoco_covered_failures", f.covered_failures),
        ("yoco_resolved_failures", f.resolved_failures),
        ("yoco_pending_failures", f.pending_failures),
        ("yoco_unresolved_failures", f.unresolved_failures),
    ]
    if f.resolution_rate is not None:
        out.append(("yoco_resolution_rate", float(f.resolution_rate)))
    out += [
        ("yoco_guarantee_threshold", float(f.threshold_percent / 100)),
        ("yoco_guarantee_met", 1.0 if f.guarantee_met else 0.0),
        ("yoco_lost_gpu_hours", float(f.lost_gpu_hours)),
        ("yoco_allocated_gpu_hours", float(f.allocated_gpu_hours)),
        ("yoco_goodput", float(f.goodput)),
        ("yoco_credit_liability", credit_liability(view)),
    ]
    return tuple(out)


def credit_liability(view: YearView) -> float:
    """The credit billing would issue if the year closed with its figures now (0 if met)."""
    if view.figures.guarantee_met:
        return 0.0
    c = view.contract
    minor = credit_minor_units(c.credit_base, view.terms.credit_percent, c.currency)
    return float(from_minor_units(minor, c.currency))
