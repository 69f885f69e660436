"""Year close and credits on a real PostgreSQL: every edge case of DESIGN section 2."""

from __future__ import annotations

import threading
import uuid
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import text
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from billing.closing import close_due, close_year
from billing.errors import PeriodOutOfRange, YearNotEnded
from billing.services import credit_status, sla_figures, year_status
from ledger.errors import UnknownContract
from ledger.note import Verifier
from ledger.verify import verify_all
from tests import factories as f
from tests.billing.conftest import (
    AFTER_Y1,
    Y1,
    add_contract,
    counts,
    failures,
    ingest_records,
)
from yoco.database import make_engine, unit_of_work

TABLES = ("billing_years", "billing_closes", "billing_credits", "checkpoints")


def test_a_missed_year_gets_one_credit_and_a_second_close_is_a_no_op(engine, close, signer):
    add_contract(engine)
    recs, _ = failures(resolved=8, unresolved=1)  # 8 of 9 < 90%
    ingest_records(engine, recs)
    first = close()
    assert first.action == "closed" and not first.guarantee_met and first.credit_issued
    assert first.figures["covered_failures"] == 9 and first.figures["resolved_failures"] == 8
    assert first.credit["credit_note"] == "CN-C-1-Y1"
    assert first.credit["amount"] == "250000.00" and first.credit["minor_units"] == 25_000_000
    assert first.checkpoint_size is not None
    before = counts(engine, *TABLES)
    again = close(now=AFTER_Y1 + timedelta(days=30))
    assert again.action == "unchanged" and again.event_id == first.event_id
    assert again.closed_at == first.closed_at and again.credit == first.credit
    assert counts(engine, *TABLES) == before
    with Session(engine) as s:
        st = year_status(s, "C-1", 1)
        assert st and st["closed"] and not st["pending_adjustment"]
        report = sla_figures(s, "C-1", year=1, now=AFTER_Y1)
        assert report.credit == {
            "amount": "250000.00",
            "minor_units": 25_000_000,
            "currency": "USD",
            "status": "issued",
            "credit_note": "CN-C-1-Y1",
        }
        assert report.to_json()["credit"]["status"] == "issued"
        assert credit_status(s, "C-1", 2) is None


def test_the_close_entry_holds_figures_terms_and_the_tree_it_was_computed_over(
    engine, close, signer
):
    add_contract(engine)
    recs, _ = failures(resolved=1, unresolved=1)
    ingest_records(engine, recs)
    with engine.connect() as c:
        size_before = c.execute(text("SELECT size FROM ledger_logs WHERE log_id = 'C-1'")).scalar()
    r = close()
    with engine.connect() as c:
        body, kind = c.execute(
            text("SELECT body, kind FROM journal_entries WHERE event_id = :e"), {"e": r.event_id}
        ).one()
        cp = c.execute(text("SELECT max(tree_size) FROM checkpoints WHERE log_id = 'C-1'")).scalar()
    assert kind == "year_close"
    assert body["tree_size"] == size_before and len(body["root_hash"]) == 64
    assert body["terms"]["threshold_percent"] == "90"
    assert body["figures"]["resolution_rate"] == "0.500000"
    assert body["contract"]["credit_base"] == "1000000.00"
    assert cp == size_before + 2  # the close and the credit are in the signed tree
    with Session(engine) as s:
        report = verify_all(s, Verifier.from_text(signer.verifier_text()))
    assert report.entries == size_before + 2


@pytest.mark.parametrize(
    ("resolved", "unresolved", "met"),
    [(9, 1, True), (8, 1, False), (0, 0, True), (18, 2, True), (17, 2, False)],
    ids=["exactly-90", "8-of-9", "zero-covered", "18-of-20", "17-of-19"],
)
def test_the_verdict_is_exact(engine, close, resolved, unresolved, met):
    add_contract(engine)
    recs, _ = failures(resolved=resolved, unresolved=unresolved)
    if recs:
        ingest_records(engine, recs)
    r = close()
    assert r.guarantee_met is met
    assert (r.credit is None) is met


def test_all_failures_excluded_meets_the_guarantee(engine, close):
    add_contract(engine)
    recs = [f.failure(at=Y1 + timedelta(hours=i), cause="facility_power") for i in range(3)]
    recs.append(f.failure(at=Y1 + timedelta(hours=5), cls="planned", cause="maintenance"))
    ingest_records(engine, recs)
    r = close()
    assert r.guarantee_met and r.credit is None
    assert r.figures["covered_failures"] == 0 and r.figures["excluded_failures"] == 3
    assert r.figures["resolution_rate"] is None


@pytest.mark.parametrize(
    ("currency", "annual", "renewal", "percent", "amount", "minor"),
    [
        ("USD", "1000000.02", None, None, "250000.01", 25_000_001),  # half-up tie
        ("JPY", "1000002", None, None, "250001", 250_001),  # 250,000.5 -> 250,001
        ("KWD", "10.002", None, None, "2.501", 2501),  # 2.5005 -> 2.501
        ("USD", "500.00", "1000000.02", None, "250000.01", 25_000_001),  # renewal value wins
        ("EUR", "100.00", None, "12.5", "12.50", 1250),
        ("KRW", "3", None, "50", "2", 2),  # 1.5 -> 2
    ],
)
def test_credit_rounding_half_up_at_the_currency_exponent(
    engine, close, currency, annual, renewal, percent, amount, minor
):
    over = {"currency": currency, "annual_value": annual}
    if renewal:
        over["renewal_value"] = renewal
    if percent:
        over["terms"] = {"credit_percent": percent}
    add_contract(engine, **over)
    recs, _ = failures(resolved=0, unresolved=1)
    ingest_records(engine, recs)
    r = close()
    assert r.credit["amount"] == amount and r.credit["minor_units"] == minor
    assert r.credit["currency"] == currency
    with engine.connect() as c:
        stored = c.execute(text("SELECT amount_minor FROM billing_credits")).scalar_one()
    assert stored == minor


def test_29_february_start_closes_on_28_february(engine, close):
    add_contract(engine, start_date="2024-02-29")
    inside, _ = failures(resolved=0, unresolved=1, at=datetime(2025, 2, 27, 23, 59, tzinfo=UTC))
    outside, _ = failures(resolved=1, at=datetime(2025, 2, 28, 0, 0, tzinfo=UTC))
    ingest_records(engine, inside + outside)
    with pytest.raises(YearNotEnded):
        close(now=datetime(2025, 2, 27, 23, 59, 59, tzinfo=UTC))
    r = close(now=datetime(2025, 2, 28, 0, 0, tzinfo=UTC))
    assert r.figures["period_end"] == "2025-02-28T00:00:00+00:00"
    assert r.figures["covered_failures"] == 1 and not r.guarantee_met
    with Session(engine) as s:
        y2 = sla_figures(s, "C-1", year=2, now=datetime(2025, 6, 1, tzinfo=UTC))
    assert y2.figures.covered_failures == 1 and y2.figures.resolved_failures == 1


def test_time_zone_midnight_decides_the_year_and_when_it_may_close(engine, close):
    add_contract(engine, timezone="America/New_York")
    # 23:30 on 31 December in New York is 04:30 UTC on 1 January: still year 1.
    late_evening = datetime.fromisoformat("2025-12-31T23:30:00-05:00")
    recs, _ = failures(resolved=0, unresolved=1, at=late_evening)
    ingest_records(engine, recs)
    before = counts(engine, *TABLES)
    with pytest.raises(YearNotEnded, match="year"):
        close(now=datetime(2026, 1, 1, 4, 59, tzinfo=UTC))
    assert counts(engine, *TABLES) == before
    r = close(now=datetime(2026, 1, 1, 5, 0, tzinfo=UTC))
    assert r.figures["period_end"] == "2026-01-01T05:00:00+00:00"
    assert r.figures["covered_failures"] == 1 and r.credit is not None


@pytest.mark.parametrize(
    ("cid", "year", "error"),
    [
        ("C-404", 1, UnknownContract),
        ("C-1", 0, PeriodOutOfRange),
        ("C-1", 3, PeriodOutOfRange),
        ("C-1", 2, YearNotEnded),
    ],
)
def test_bad_closes_are_refused_and_write_nothing(engine, close, cid, year, error):
    add_contract(engine)
    recs, _ = failures(unresolved=1)
    ingest_records(engine, recs)
    before = counts(engine, *TABLES, "ledger_logs")
    with pytest.raises(error):
        close(cid, year, now=AFTER_Y1)
    assert counts(engine, *TABLES, "ledger_logs") == before


def test_a_naive_close_time_is_refused(engine):
    add_contract(engine)
    with unit_of_work(engine) as s, pytest.raises(ValueError, match="now"):
        close_year(s, "C-1", 1, now=datetime(2026, 2, 1))


def test_parallel_closes_issue_exactly_one_credit(engine, app_url, signer):
    add_contract(engine)
    recs, _ = failures(resolved=1, unresolved=3)
    ingest_records(engine, recs)
    n = 4
    barrier = threading.Barrier(n)
    results: list[object] = []
    errors: list[BaseException] = []

    def worker() -> None:
        eng = make_engine(app_url)
        try:
            barrier.wait()
            with unit_of_work(eng) as s:
                results.append(close_year(s, "C-1", 1, now=AFTER_Y1, signer=signer))
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)
        finally:
            eng.dispose()

    threads = [threading.Thread(target=worker) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    actions = sorted(r.action for r in results)  # type: ignore[attr-defined]
    assert actions == ["closed"] + ["unchanged"] * (n - 1)
    with engine.connect() as c:
        assert c.execute(text("SELECT count(*) FROM billing_credits")).scalar() == 1
        assert (
            c.execute(
                text("SELECT count(*) FROM journal_entries WHERE kind IN ('credit', 'year_close')")
            ).scalar()
            == 2
        )


def test_the_database_refuses_a_second_live_credit_for_a_year(engine, close):
    add_contract(engine)
    recs, _ = failures(unresolved=1)
    ingest_records(engine, recs)
    close()
    with engine.begin() as c, pytest.raises(IntegrityError, match="uq_billing_credits_live_year"):
        c.execute(
            text(
                "INSERT INTO billing_credits SELECT :id, contract_id, year, seq + 100, "
                "credit_note || '-X', issued_at, close_event_id, period_start, period_end, "
                "covered_failures, resolved_failures, threshold_percent, credit_percent, "
                "currency, base_minor, amount_minor, 0, 'issued', NULL, NULL FROM billing_credits"
            ),
            {"id": uuid.uuid4()},
        )


def test_close_due_closes_every_ended_year_once(engine, signer):
    add_contract(engine, "C-1")
    add_contract(engine, "C-2", start_date="2025-07-01")
    recs, _ = failures("C-1", unresolved=1)
    ingest_records(engine, recs)
    now = datetime(2026, 3, 1, tzinfo=UTC)
    with unit_of_work(engine) as s:
        done = close_due(s, now=now, signer=signer)
    assert [(r.contract_id, r.year, r.action) for r in done] == [("C-1", 1, "closed")]
    with unit_of_work(engine) as s:
        assert close_due(s, now=now, signer=signer) == []
    with unit_of_work(engine) as s:
        later = close_due(s, now=datetime(2027, 1, 2, tzinfo=UTC), signer=signer)
    assert [(r.contract_id, r.year) for r in later] == [("C-1", 2), ("C-2", 1)]
