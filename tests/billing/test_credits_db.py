"""Applying credits: partial application, carry-forward, refusals that write nothing."""

from __future__ import annotations

from datetime import date, timedelta
from decimal import Decimal

import pytest
from sqlalchemy.orm import Session

from billing.credits import applications_of, apply_credit
from billing.errors import CreditNotApplicable, InvalidMoney, UnknownCredit
from billing.services import credit_status
from tests.billing.conftest import AFTER_Y1, add_contract, counts, failures, ingest_records
from yoco.database import unit_of_work

LATER = AFTER_Y1 + timedelta(days=3)
TABLES = ("billing_credit_applications", "billing_credits")


@pytest.fixture
def credit(engine, close) -> str:
    """A 250,000.00 USD credit, CN-C-1-Y1."""
    add_contract(engine)
    ingest_records(engine, failures(unresolved=1)[0])
    return close().credit["credit_note"]


def _apply(engine, credit: str, ref: str, invoice: str, amount: str | None = None, **kw):
    with unit_of_work(engine) as s:
        return apply_credit(
            s,
            credit,
            invoice_ref=ref,
            invoice_amount=invoice,
            amount=amount,
            applied_on=date(2026, 2, 10),
            now=LATER,
            **kw,
        )


def test_partial_application_then_carry_forward_then_fully_applied(engine, credit):
    r1 = _apply(engine, credit, "INV-1", "500000.00", amount="100000.00")
    assert r1.applied_minor_units == 10_000_000 and r1.credit["status"] == "partially_applied"
    assert r1.credit["remaining_amount"] == "150000.00"
    # An invoice smaller than the balance takes what it can; the rest is carried forward.
    r2 = _apply(engine, credit, "INV-2", "90000.00", invoice_kind="expansion")
    assert r2.applied_minor_units == 9_000_000 and r2.carried_forward_minor_units == 6_000_000
    assert r2.credit["status"] == "partially_applied"
    r3 = _apply(engine, credit, "INV-3", "1000000.00")
    assert r3.applied_minor_units == 6_000_000 and r3.carried_forward_minor_units == 0
    assert r3.credit["status"] == "applied" and r3.credit["remaining_minor_units"] == 0
    with Session(engine) as s:
        st = credit_status(s, "C-1", 1)
        apps = applications_of(s, credit)
    assert st["applied_amount"] == "250000.00" and st["status"] == "applied"
    assert [a["amount"] for a in apps] == ["100000.00", "90000.00", "60000.00"]
    assert [a["remaining_amount"] for a in apps] == ["150000.00", "60000.00", "0.00"]
    # A retry of the same application is a no-op.
    again = _apply(engine, credit, "INV-1", "500000.00", amount="100000.00")
    assert not again.created and again.applied_minor_units == 10_000_000
    with pytest.raises(CreditNotApplicable, match="fully applied"):
        _apply(engine, credit, "INV-4", "1.00")


@pytest.mark.parametrize(
    ("ref", "invoice", "amount", "error", "field"),
    [
        ("INV-9", "500000.00", "250000.01", CreditNotApplicable, "remaining balance"),
        ("INV-9", "100.00", "200.00", CreditNotApplicable, "more than the invoice"),
        ("INV-9", "-5.00", None, InvalidMoney, "invoice_amount"),
        ("INV-9", "100.00", "-1", InvalidMoney, "amount"),
        ("INV-9", "0", None, InvalidMoney, "invoice_amount"),
        ("INV-9", "12,50", None, InvalidMoney, "invoice_amount"),
        ("INV-9", "1.005", None, InvalidMoney, "invoice_amount"),
        ("INV-9", "NaN", None, InvalidMoney, "invoice_amount"),
        ("INV-9", 1.5, None, InvalidMoney, "invoice_amount"),
        ("", "100.00", None, CreditNotApplicable, "invoice_ref"),
    ],
)
def test_bad_applications_are_refused_and_write_nothing(
    engine, credit, ref, invoice, amount, error, field
):
    _apply(engine, credit, "INV-0", "1.00")
    before = counts(engine, *TABLES)
    with pytest.raises(error, match=field):
        _apply(engine, credit, ref, invoice, amount)
    assert counts(engine, *TABLES) == before


def test_unknown_credit_bad_kind_and_conflicting_retry_are_refused(engine, credit):
    _apply(engine, credit, "INV-1", "10.00")
    before = counts(engine, *TABLES)
    with pytest.raises(UnknownCredit):
        _apply(engine, "CN-NOPE-Y1", "INV-2", "10.00")
    with pytest.raises(CreditNotApplicable, match="invoice_kind"):
        _apply(engine, credit, "INV-2", "10.00", invoice_kind="refund")
    with pytest.raises(CreditNotApplicable, match="other content"):
        _apply(engine, credit, "INV-1", "20.00")
    assert counts(engine, *TABLES) == before


def test_money_is_decimal_or_string_and_credit_id_works_too(engine, credit):
    with Session(engine) as s:
        cid = credit_status(s, "C-1", 1)["credit_id"]
    r = _apply(engine, cid, "INV-1", Decimal("10.50"))
    assert r.applied_minor_units == 1050


def test_credit_status_as_of_a_tree_size_ignores_later_applications(engine, credit):
    from ledger.journal import log_size

    with Session(engine) as s:
        before = log_size(s, "C-1")
    _apply(engine, credit, "INV-1", "500000.00", amount="100000.00")
    with Session(engine) as s:
        now = credit_status(s, "C-1", 1)
        then = credit_status(s, "C-1", 1, tree_size=before)
        none_yet = credit_status(s, "C-1", 1, tree_size=1)
    assert now["status"] == "partially_applied" and now["applied_amount"] == "100000.00"
    assert then["status"] == "issued" and then["applied_amount"] == "0.00"
    assert then["remaining_amount"] == "250000.00" and then["credit_note"] == credit
    assert none_yet is None
