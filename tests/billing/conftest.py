"""Helpers of billing's database tests: contracts, records, closes (real PostgreSQL)."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import text
from sqlalchemy.engine import Engine

from ledger.contracts import add_contracts
from ledger.ingest import ingest
from ledger.note import Signer, generate_signer
from ledger.records import parse_contracts, parse_jsonl
from tests import factories as f
from yoco.database import unit_of_work

#: Year 1 of the default test contract (start 2025-01-01 UTC, two years).
Y1 = datetime(2025, 3, 1, 12, 0, tzinfo=UTC)
AFTER_Y1 = datetime(2026, 2, 1, tzinfo=UTC)
AFTER_Y2 = datetime(2027, 2, 1, tzinfo=UTC)


def add_contract(engine: Engine, cid: str = "C-1", **over: Any) -> None:
    """Create one contract (start 2025-01-01, UTC, two years, 1,000,000.00 USD)."""
    obj = f.contract(cid, **{"start_date": "2025-01-01", **over})
    specs, errors = parse_contracts(f.jsonl([obj]))
    assert not errors, errors
    with unit_of_work(engine) as s:
        add_contracts(s, specs)


def ingest_records(engine: Engine, records: list[dict[str, Any]]) -> None:
    """Ingest ``records`` through the ledger, with billing's projectors wired in.

    The stories here run until :data:`AFTER_Y2`: records are validated against a clock
    at least that late (the ledger refuses records dated more than 24 h ahead).
    """
    from billing.projections import PROJECTORS

    clock = max(datetime.now(UTC), AFTER_Y2 + timedelta(days=30))
    recs, errors = parse_jsonl(f.jsonl(records), now=clock)
    assert not errors, errors
    with unit_of_work(engine) as s:
        ingest(s, recs, extra_projectors=PROJECTORS)


def failures(
    cid: str = "C-1",
    *,
    resolved: int = 0,
    unresolved: int = 0,
    at: datetime = Y1,
    cls: str = "unplanned",
) -> tuple[list[dict[str, Any]], list[str]]:
    """Records of ``resolved`` live-migrated and ``unresolved`` rolled-back failures.

    Returns the records and the failure ids (resolved first).
    """
    records: list[dict[str, Any]] = []
    ids: list[str] = []
    for i in range(resolved + unresolved):
        t = at + timedelta(minutes=10 * i)
        fail = f.failure(cid=cid, at=t, cls=cls)
        ids.append(fail["event_id"])
        records.append(fail)
        if i < resolved:
            records.append(f.outcome(fail["event_id"], cid=cid, at=t + timedelta(minutes=1)))
        else:
            records.append(
                f.outcome(fail["event_id"], "rolled_back", 30, cid=cid, at=t + timedelta(minutes=1))
            )
    return records, ids


def counts(engine: Engine, *tables: str) -> dict[str, int]:
    """Row counts of ``tables`` (and of the journal), to assert that nothing was written."""
    with engine.connect() as c:
        return {
            t: c.execute(text(f"SELECT count(*) FROM {t}")).scalar_one()
            for t in ("journal_entries", *tables)
        }


@pytest.fixture
def signer() -> Signer:
    """A throwaway checkpoint signer."""
    key, _ = generate_signer("test.example/log")
    return Signer.from_text(key)


@pytest.fixture
def close(engine: Engine, signer: Signer) -> Callable[..., Any]:
    """``close(cid, year, now=...)``: close a year in its own unit of work."""
    from billing.closing import close_year

    def run(cid: str = "C-1", year: int = 1, now: datetime = AFTER_Y1) -> Any:
        with unit_of_work(engine) as s:
            return close_year(
                s, cid, year, now=now, signer=signer, origin_prefix="test.example/log"
            )

    return run
