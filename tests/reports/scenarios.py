"""Ledger contents for the report tests: contracts and records, as producers send them."""

from __future__ import annotations

import random
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

from tests import factories as f


def _rid(rng: random.Random) -> str:
    return str(uuid.UUID(int=rng.getrandbits(128), version=4))


def at(y: int, m: int, d: int, h: int = 12, minute: int = 0) -> datetime:
    """A UTC instant."""
    return datetime(y, m, d, h, minute, tzinfo=UTC)


def failure_with(
    rng: random.Random,
    cid: str,
    when: datetime,
    result: str | None,
    *,
    job: str = "train-1",
    cls: str = "unplanned",
    cause: str = "gpu_lost",
    lost: int = 0,
    recovery: float = 4.5,
    gpus: int = 8,
    node: str | None = "node-07",
    gpu: int | None = 3,
) -> list[dict[str, Any]]:
    """A failure and (unless ``result`` is None: pending) its outcome once the recovery
    is over: a minute later, or at the recovery's end if it took longer (the ledger
    refuses an outcome reported before its recovery ended, docs/definitions.md)."""
    extra: dict[str, Any] = {}
    if node is not None:
        extra["node"] = node
    if gpu is not None:
        extra["gpu"] = gpu
    fail = f.rec("failure", cid, when, event_id=_rid(rng), job_id=job, failure_class=cls,
                 cause=cause, **extra)
    out = [fail]
    if result is not None:
        out.append(
            f.rec("outcome", cid, when + timedelta(seconds=max(60, recovery)),
                  event_id=_rid(rng),
                  failure_event_id=fail["event_id"], outcome=result, lost_steps=lost,
                  recovery_seconds=recovery, step_seconds=2.0, gpus_affected=gpus)
        )
    return out


def job(rng: random.Random, cid: str, name: str, gpus: int, start: datetime,
        end: datetime | None) -> list[dict[str, Any]]:
    """A job span (started, and finished unless ``end`` is None)."""
    recs = [f.rec("job_started", cid, start, event_id=_rid(rng), job_id=name, gpus=gpus)]
    if end is not None:
        recs.append(f.rec("job_finished", cid, end, event_id=_rid(rng), job_id=name, step=1000))
    return recs


def quiet(cid: str = "C-QUIET") -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """March 2026 with a job running and no failure (February had two)."""
    rng = random.Random(1)
    recs = job(rng, cid, "train-1", 64, at(2026, 2, 1), at(2026, 3, 20))
    recs += failure_with(rng, cid, at(2026, 2, 10), "live_migrated")
    recs += failure_with(rng, cid, at(2026, 2, 12), "rolled_back", lost=40, recovery=300)
    return f.contract(cid, customer="Quiet Labs GmbH", start_date="2026-01-01"), recs


def tipping(cid: str = "C-TIP") -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """January–February resolved everything; March's failures bring the year below 90 %.

    In New York time, with a GPU-hour price; March also has an exclusion, an excluded
    cause, a planned (not covered) failure, a pending one and a corrected outcome.
    """
    rng = random.Random(2)
    c = f.contract(cid, customer="Tipping Point AI, Inc.", start_date="2026-01-01",
                   timezone="America/New_York", gpu_hour_price="2.49")
    recs = job(rng, cid, "llm-70b", 512, at(2026, 1, 5), at(2026, 3, 28))
    for d in range(1, 11):
        recs += failure_with(rng, cid, at(2026, 1, d + 5), "live_migrated", job="llm-70b",
                             recovery=3.25, gpus=8)
    for d in range(1, 6):
        recs += failure_with(rng, cid, at(2026, 2, d + 3), "live_migrated", job="llm-70b",
                             cls="preemptive", cause="ecc_rising", recovery=2.0)
    # March: 2 resolved, 2 rolled back, 1 failed, 1 pending -> year 17 of 21 = 80.95 %
    recs += failure_with(rng, cid, at(2026, 3, 2), "live_migrated", job="llm-70b")
    recs += failure_with(rng, cid, at(2026, 3, 3), "rolled_back", job="llm-70b", lost=120,
                         recovery=640, gpus=512, node="node-31", gpu=0)
    recs += failure_with(rng, cid, at(2026, 3, 4), "rolled_back", job="llm-70b", lost=35,
                         recovery=410, gpus=512, cause="ecc_uncorrectable")
    recs += failure_with(rng, cid, at(2026, 3, 5), "failed", job="llm-70b", recovery=1800,
                         gpus=512, cause="node_power", node="node-02", gpu=None)
    recs += failure_with(rng, cid, at(2026, 3, 6), None, job="llm-70b", cause="kernel_panic")
    # corrected: first rolled back, later corrected to live-migrated
    fix = failure_with(rng, cid, at(2026, 3, 7), "rolled_back", job="llm-70b", lost=3)
    recs += fix
    recs.append(f.rec("outcome", cid, at(2026, 3, 8), event_id=_rid(rng),
                      failure_event_id=fix[0]["event_id"], outcome="live_migrated",
                      lost_steps=0, recovery_seconds=6.5, step_seconds=2.0, gpus_affected=8))
    # excluded by an exclusion entry, by its cause, and a planned (not covered) drain
    ex = failure_with(rng, cid, at(2026, 3, 10), "rolled_back", job="llm-70b", lost=10,
                      recovery=90, cause="process_killed")
    recs += ex
    recs.append(f.rec("exclusion", cid, at(2026, 3, 11), event_id=_rid(rng),
                      failure_event_id=ex[0]["event_id"],
                      reason="customer's own OOM killer (ticket 4411)", approved_by="j.doe"))
    recs += failure_with(rng, cid, at(2026, 3, 12), "failed", job="llm-70b",
                         cause="facility_power", recovery=900, gpus=512)
    recs += failure_with(rng, cid, at(2026, 3, 14), "live_migrated", job="llm-70b",
                         cls="planned", cause="maintenance", recovery=12)
    return c, recs


def closed_year(cid: str = "C-CLOSED") -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Contract year 1 is 2025 and missed (3 of 5); December 2025 is its last month."""
    rng = random.Random(3)
    c = f.contract(cid, customer="Closed Year Ltd", start_date="2025-01-01", currency="EUR",
                   annual_value="480000.00", renewal_value="520000.00")
    recs = job(rng, cid, "vision", 32, at(2025, 1, 2), at(2025, 12, 30))
    recs += failure_with(rng, cid, at(2025, 4, 1), "live_migrated", job="vision")
    recs += failure_with(rng, cid, at(2025, 7, 1), "live_migrated", job="vision")
    recs += failure_with(rng, cid, at(2025, 12, 1), "live_migrated", job="vision")
    recs += failure_with(rng, cid, at(2025, 12, 2), "rolled_back", job="vision", lost=7,
                         recovery=120)
    recs += failure_with(rng, cid, at(2025, 12, 3), "failed", job="vision", recovery=60)
    return c, recs


def busy(cid: str = "C-BUSY", n: int = 500) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """March 2026 with ``n`` failures of every kind on 4 jobs."""
    rng = random.Random(4)
    c = f.contract(cid, customer="Busy Cluster Co", start_date="2026-01-01",
                   gpu_hour_price="3.10")
    recs: list[dict[str, Any]] = []
    for j in range(4):
        recs += job(rng, cid, f"job-{j}", 1024, at(2026, 2, 20), at(2026, 3, 31, 20))
    start = at(2026, 3, 1, 0)
    for i in range(n):
        when = start + timedelta(seconds=int(i * 30 * 86400 / n) + 7)
        r = rng.random()
        cls = "unplanned" if r < 0.7 else "preemptive" if r < 0.93 else "planned"
        cause = rng.choice(["gpu_lost", "ecc_uncorrectable", "node_power", "thermal",
                            "ecc_rising", "network_wide_outage"])
        o = rng.random()
        result = ("live_migrated" if o < 0.9 else "rolled_back" if o < 0.96 else "failed"
                  if o < 0.99 else None)
        lost = rng.randint(1, 200) if result == "rolled_back" else 0
        recs += failure_with(rng, cid, when, result, job=f"job-{i % 4}", cls=cls, cause=cause,
                             lost=lost, recovery=round(rng.uniform(0.5, 900), 3),
                             gpus=rng.choice([8, 16, 64]), node=f"node-{rng.randint(1, 128):03d}",
                             gpu=rng.randint(0, 7))
    return c, recs
