"""Amendments: terms in force at a year's start, renewals extend the term, closed years stay."""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta

import pytest
from sqlalchemy.orm import Session

from billing.amendments import amend_contract, amendments_of, contract_in_force
from billing.errors import AmendmentRefused, PeriodOutOfRange
from billing.services import sla_figures
from tests.billing.conftest import (
    AFTER_Y1,
    AFTER_Y2,
    Y1,
    add_contract,
    counts,
    failures,
    ingest_records,
)
from yoco.database import unit_of_work

Y2 = datetime(2026, 3, 1, tzinfo=UTC)


def _amend(engine, **kw):
    kw.setdefault("now", datetime(2025, 6, 1, tzinfo=UTC))
    with unit_of_work(engine) as s:
        return amend_contract(s, "C-1", **kw)


def test_a_year_uses_the_terms_in_force_at_its_start(engine, close):
    add_contract(engine)
    # 17 of 20 = 85%: missed at 90%, met at 85%.
    ingest_records(engine, failures(resolved=17, unresolved=3)[0])
    ingest_records(engine, failures(resolved=17, unresolved=3, at=Y2)[0])
    _amend(
        engine,
        amendment_type="terms",
        effective_date=date(2025, 6, 1),
        changes={"terms": {"threshold_percent": "85"}},
    )
    _amend(
        engine,
        amendment_type="expansion",
        effective_date=date(2025, 9, 1),
        changes={"renewal_value": "2000000.00"},
    )
    with Session(engine) as s:
        y1 = sla_figures(s, "C-1", year=1, now=AFTER_Y1)
        y2 = sla_figures(s, "C-1", year=2, now=AFTER_Y2)
    assert not y1.figures.guarantee_met and y1.to_json()["threshold_percent"] == "90"
    assert y2.figures.guarantee_met and y2.to_json()["threshold_percent"] == "85"
    r1 = close()
    assert r1.credit["amount"] == "250000.00"  # the renewal value of year 2 does not apply
    assert close(year=2, now=AFTER_Y2).guarantee_met


def test_an_amendment_may_govern_the_year_in_progress(engine, close):
    add_contract(engine)
    ingest_records(engine, failures(resolved=0, unresolved=1)[0])
    _amend(
        engine,
        amendment_type="expansion",
        effective_date=date(2025, 9, 1),
        changes={"renewal_value": "2000000.00", "terms": {"credit_percent": "10"}},
        applies_to_year_in_progress=True,
    )
    r = close()
    assert r.credit["amount"] == "200000.00" and r.credit["base_amount"] == "2000000.00"


def test_a_renewal_extends_the_term(engine, close):
    add_contract(engine)
    with Session(engine) as s, pytest.raises(PeriodOutOfRange):
        sla_figures(s, "C-1", year=3, now=datetime(2027, 6, 1, tzinfo=UTC))
    _amend(
        engine,
        amendment_type="renewal",
        effective_date=date(2027, 1, 1),
        changes={"term_years": 3, "annual_value": "1200000.00"},
        amendment_id="R-2027",
    )
    again = _amend(
        engine,
        amendment_type="renewal",
        effective_date=date(2027, 1, 1),
        changes={"term_years": 3, "annual_value": "1200000.00"},
        amendment_id="R-2027",
    )
    assert not again.created
    ingest_records(engine, failures(unresolved=1, at=datetime(2027, 2, 1, tzinfo=UTC))[0])
    with Session(engine) as s:
        assert sla_figures(s, "C-1", year=3, now=datetime(2027, 6, 1, tzinfo=UTC)).year == 3
        assert contract_in_force(s, "C-1", 3).contract.annual_value == 1200000
        assert contract_in_force(s, "C-1", 2).contract.annual_value == 1000000
        assert len(amendments_of(s, "C-1")) == 1
    r = close(year=3, now=datetime(2028, 1, 2, tzinfo=UTC))
    assert r.credit["amount"] == "300000.00"


@pytest.mark.parametrize(
    ("kw", "match"),
    [
        ({"amendment_type": "renewal", "changes": {"term_years": 1}}, "term_years"),
        ({"amendment_type": "renewal", "changes": {"annual_value": "1.00"}}, "term_years"),
        ({"amendment_type": "value", "changes": {"annual_value": "-5.00"}}, "annual_value"),
        ({"amendment_type": "value", "changes": {"annual_value": "1.001"}}, "annual_value"),
        ({"amendment_type": "value", "changes": {"colour": "red"}}, "unknown"),
        (
            {"amendment_type": "terms", "changes": {"terms": {"threshold_percent": "101"}}},
            "threshold",
        ),
        ({"amendment_type": "upgrade", "changes": {"annual_value": "1.00"}}, "amendment_type"),
        ({"amendment_type": "value", "changes": {}}, "changes"),
        (
            {
                "amendment_type": "value",
                "changes": {"annual_value": "1.00"},
                "effective_date": date(2024, 1, 1),
            },
            "before the contract start",
        ),
        # Year 1 is closed: a change effective at its start, or during it, is refused.
        (
            {
                "amendment_type": "value",
                "changes": {"annual_value": "1.00"},
                "effective_date": date(2025, 1, 1),
            },
            "closed",
        ),
        (
            {
                "amendment_type": "value",
                "changes": {"annual_value": "1.00"},
                "effective_date": date(2025, 5, 1),
                "applies_to_year_in_progress": True,
            },
            "closed",
        ),
    ],
)
def test_bad_amendments_are_refused_and_write_nothing(engine, close, kw, match):
    add_contract(engine)
    close()
    before = counts(engine, "billing_amendments")
    kw = {"effective_date": date(2026, 1, 1), **kw}
    with pytest.raises(AmendmentRefused, match=match):
        _amend(engine, **kw)
    assert counts(engine, "billing_amendments") == before
    # An amendment for the next year is fine.
    assert _amend(
        engine,
        amendment_type="value",
        effective_date=date(2026, 1, 1),
        changes={"annual_value": "5.00"},
    ).created
    _ = Y1, timedelta
