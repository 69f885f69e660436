"""After the close: late records, disputes flipping a verdict both ways, rebuild == live."""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta

import pytest
from sqlalchemy import text
from sqlalchemy.orm import Session

from billing.amendments import amend_contract
from billing.credits import apply_credit
from billing.disputes import list_disputes, open_dispute, reject_dispute, resolve_dispute
from billing.errors import DisputeNotOpen, UnknownDispute, UnknownFailure
from billing.export import export_credits
from billing.projections import PROJECTORS, TABLES
from billing.services import credit_status, year_status
from ledger import projections
from tests import factories as f
from tests.billing.conftest import AFTER_Y1, Y1, add_contract, counts, failures, ingest_records
from yoco.database import unit_of_work

LATER = AFTER_Y1 + timedelta(days=10)


def _status(engine, year: int = 1):
    with Session(engine) as s:
        return year_status(s, "C-1", year), credit_status(s, "C-1", year)


def test_a_late_failure_marks_the_year_and_the_adjustment_issues_a_credit(engine, close):
    add_contract(engine)
    recs, _ = failures(resolved=9, unresolved=1)
    ingest_records(engine, recs)
    assert close().guarantee_met
    # Two late unresolved failures of year 1, recorded after the close.
    late, _ = failures(unresolved=2, at=Y1 + timedelta(days=100))
    ingest_records(engine, late)
    st, cr = _status(engine)
    assert st["pending_adjustment"] and cr is None
    adj = close(now=LATER)
    assert adj.action == "adjusted" and not adj.guarantee_met and adj.credit_issued
    assert adj.credit["credit_note"] == "CN-C-1-Y1"
    assert adj.figures["covered_failures"] == 12
    st, cr = _status(engine)
    assert not st["pending_adjustment"] and st["adjustments"] == 1 and cr["status"] == "issued"
    # The first close is never edited; the adjustment names it.
    with engine.connect() as c:
        kinds = c.execute(
            text(
                "SELECT kind, body->>'adjusts' FROM journal_entries WHERE kind IN "
                "('year_close', 'adjustment') ORDER BY seq"
            )
        ).all()
    assert [k for k, _ in kinds] == ["year_close", "adjustment"]
    assert kinds[1][1] == adj.close_event_id
    # Nothing pending any more: a third close is a no-op.
    assert close(now=LATER + timedelta(days=1)).action == "unchanged"


def test_a_late_outcome_for_a_closed_year_marks_it_and_records_in_other_years_do_not(engine, close):
    add_contract(engine)
    fail = f.failure(at=Y1)
    ingest_records(engine, [fail])
    assert not close().guarantee_met  # pending failure: unresolved
    ingest_records(engine, [f.failure(at=datetime(2026, 3, 1, tzinfo=UTC))])  # year 2
    assert not _status(engine)[0]["pending_adjustment"]
    ingest_records(engine, [f.outcome(fail["event_id"], at=AFTER_Y1 + timedelta(days=1))])
    assert _status(engine)[0]["pending_adjustment"]
    adj = close(now=LATER)
    assert adj.guarantee_met and adj.voided is not None and adj.credit is None
    st, cr = _status(engine)
    assert cr["status"] == "void" and cr["remaining_minor_units"] == 0
    assert st["guarantee_met"]


def test_disputes_resolved_by_exclusion_flip_a_missed_year_to_met(engine, close):
    add_contract(engine)
    recs, ids = failures(resolved=8, unresolved=1)
    ingest_records(engine, recs)
    first = close()
    assert first.credit_issued
    with unit_of_work(engine) as s:
        d = open_dispute(s, "C-1", ids[-1], reason="customer's own OOM", now=LATER)
    did = d.dispute["dispute_id"]
    assert not _status(engine)[0]["pending_adjustment"]  # an open dispute changes nothing
    with unit_of_work(engine) as s:
        r = resolve_dispute(
            s, did, resolution="exclusion", decided_by="ops", note="customer code", now=LATER
        )
    assert r.dispute["status"] == "resolved" and r.dispute["resolution"] == "exclusion"
    assert _status(engine)[0]["pending_adjustment"]
    adj = close(now=LATER + timedelta(hours=1))
    assert adj.guarantee_met and adj.voided == first.credit["credit_id"]
    assert adj.figures["excluded_failures"] == 1
    with Session(engine) as s:
        assert [x["status"] for x in list_disputes(s, "C-1")] == ["resolved"]
        assert list_disputes(s, status="open") == []


def test_disputes_resolved_by_reclassification_flip_a_met_year_to_missed(engine, close):
    add_contract(engine)
    recs, _ = failures(resolved=9)
    planned, pids = failures(unresolved=1, cls="planned", at=Y1 + timedelta(days=3))
    ingest_records(engine, recs + planned)
    assert close().guarantee_met
    with unit_of_work(engine) as s:
        did = open_dispute(s, "C-1", pids[0], reason="this was no maintenance").dispute[
            "dispute_id"
        ]
    with unit_of_work(engine) as s:
        resolve_dispute(
            s,
            did,
            resolution="reclassification",
            decided_by="ops",
            note="node died",
            failure_class="unplanned",
            cause="gpu_lost",
        )
    adj = close(now=LATER)
    # 9 of 10 would still meet 90%: the reclassified failure is unresolved, 9/10 = 90%.
    assert adj.guarantee_met and adj.figures["covered_failures"] == 10
    with unit_of_work(engine) as s:
        more, more_ids = failures(unresolved=1, cls="planned", at=Y1 + timedelta(days=4))
    ingest_records(engine, more)
    with unit_of_work(engine) as s:
        did2 = open_dispute(s, "C-1", more_ids[0], reason="also unplanned").dispute["dispute_id"]
    with unit_of_work(engine) as s:
        resolve_dispute(
            s,
            did2,
            resolution="reclassification",
            decided_by="ops",
            note="node died",
            failure_class="unplanned",
        )
    adj2 = close(now=LATER + timedelta(days=1))
    assert not adj2.guarantee_met and adj2.credit_issued
    assert adj2.figures["covered_failures"] == 11 and adj2.figures["resolved_failures"] == 9


def test_rejected_and_bad_disputes(engine, close):
    add_contract(engine)
    add_contract(engine, "C-2")
    recs, ids = failures(unresolved=1)
    ingest_records(engine, recs)
    with unit_of_work(engine) as s:
        did = open_dispute(s, "C-1", ids[0], reason="r").dispute["dispute_id"]
    with unit_of_work(engine) as s:
        assert reject_dispute(s, did, decided_by="ops", note="no").dispute["status"] == "rejected"
    before = counts(engine, "billing_disputes", "exclusions", "billing_reclassifications")
    bad = [
        (lambda s: open_dispute(s, "C-2", ids[0], reason="r"), UnknownFailure),
        (lambda s: open_dispute(s, "C-1", "not-a-uuid", reason="r"), ValueError),
        (lambda s: open_dispute(s, "C-1", ids[0], reason="  "), ValueError),
        (
            lambda s: resolve_dispute(s, did, resolution="exclusion", decided_by="o", note="n"),
            DisputeNotOpen,
        ),
        (lambda s: reject_dispute(s, did, decided_by="o", note="n"), DisputeNotOpen),
        (
            lambda s: reject_dispute(
                s, "0f6c6f7e-5a53-4c1b-9a3e-6b2f0d1c9e84", decided_by="o", note="n"
            ),
            UnknownDispute,
        ),
        (
            lambda s: resolve_dispute(s, did, resolution="refund", decided_by="o", note="n"),
            ValueError,
        ),
    ]
    for call, error in bad:
        with pytest.raises(error), unit_of_work(engine) as s:
            call(s)
    with unit_of_work(engine) as s:
        did2 = open_dispute(s, "C-1", ids[0], reason="again").dispute["dispute_id"]
    with pytest.raises(ValueError, match="failure_class"), unit_of_work(engine) as s:
        resolve_dispute(
            s, did2, resolution="reclassification", decided_by="o", note="n", failure_class="cosmic"
        )
    after = counts(engine, "billing_disputes", "exclusions", "billing_reclassifications")
    assert after["billing_disputes"] == before["billing_disputes"] + 1
    assert after["exclusions"] == before["exclusions"]
    assert after["billing_reclassifications"] == before["billing_reclassifications"]


def test_rebuild_reproduces_billing_projections(engine, rebuild_engine, close):
    add_contract(engine)
    add_contract(engine, "C-2", currency="JPY", annual_value="1000002")
    recs, ids = failures(resolved=8, unresolved=2)
    recs2, _ = failures("C-2", unresolved=1)
    ingest_records(engine, recs + recs2)
    with unit_of_work(engine) as s:
        amend_contract(
            s,
            "C-1",
            amendment_type="terms",
            effective_date=date(2026, 1, 1),
            changes={"terms": {"threshold_percent": "80"}},
            now=AFTER_Y1,
        )
    close()
    close("C-2")
    with unit_of_work(engine) as s:
        apply_credit(
            s,
            "CN-C-1-Y1",
            invoice_ref="INV-1",
            invoice_amount="100000.00",
            applied_on=date(2026, 2, 2),
            now=LATER,
        )
        d = open_dispute(s, "C-1", ids[-1], reason="r", now=LATER)
    with unit_of_work(engine) as s:
        resolve_dispute(
            s, d.dispute["dispute_id"], resolution="exclusion", decided_by="o", note="n", now=LATER
        )
    with unit_of_work(engine) as s:
        d2 = open_dispute(s, "C-1", ids[0], reason="r2", now=LATER)
    with unit_of_work(engine) as s:
        reject_dispute(s, d2.dispute["dispute_id"], decided_by="o", note="n", now=LATER)
    ingest_records(engine, failures("C-2", resolved=1, at=Y1 + timedelta(days=9))[0])  # pending
    close(now=LATER + timedelta(days=1))  # C-1 adjusted: 8/9 still missed, credit stays
    with unit_of_work(engine) as s:
        export_credits(s, "csv", now=LATER)
    with unit_of_work(rebuild_engine) as s:
        live = projections.snapshot(s, TABLES)
        projections.rebuild(s, PROJECTORS, TABLES, batch=7)
        rebuilt = projections.snapshot(s, TABLES)
    assert live == rebuilt
    assert len(live["billing_credits"]) == 2 and len(live["billing_closes"]) == 3
    assert len(live["billing_credit_applications"]) == 1 and len(live["billing_exports"]) == 1
    assert len(live["billing_amendments"]) == 1 and len(live["billing_disputes"]) == 2
    pending = [r for r in live["billing_years"] if r[0] == "C-2"]
    assert pending[0][9] is not None  # pending_seq survives the rebuild
