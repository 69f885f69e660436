"""Applying credits to renewal or expansion invoices (``credit_application`` entries).

A credit's status follows its applications: ``issued`` → ``partially_applied`` →
``applied``; or ``void`` (an adjustment found the guarantee met).  An application
names the invoice (reference, kind, total) and applies at most what remains of the
credit: without an explicit amount it applies ``min(remaining, invoice total)`` and
the rest of the credit stays available for the next invoice (carried forward); an
explicit amount larger than the remaining balance, or than the invoice, is refused.
"""

from __future__ import annotations

import contextlib
import uuid
from dataclasses import dataclass
from datetime import UTC, date, datetime
from decimal import Decimal, InvalidOperation
from typing import Any

from sqlalchemy import or_, select
from sqlalchemy.orm import Session

from billing import entries
from billing.errors import CreditNotApplicable, InvalidMoney, UnknownCredit
from billing.models import Credit, CreditApplication
from billing.money import format_minor, to_minor_units
from billing.services import credit_json
from billing.years import require_aware
from ledger import journal

__all__ = ["INVOICE_KINDS", "ApplicationResult", "applications_of", "apply_credit", "parse_money"]

INVOICE_KINDS = frozenset({"renewal", "expansion"})


def parse_money(name: str, value: object, currency: str, *, positive: bool = True) -> int:
    """``value`` (a decimal string or Decimal, never a float) as minor units of ``currency``.

    Raises :class:`InvalidMoney` naming ``name`` for malformed, non-finite, negative
    (or zero, when ``positive``) amounts and amounts finer than the currency's minor unit.
    """
    if isinstance(value, bool) or not isinstance(value, (str, Decimal, int)):
        raise InvalidMoney(f'{name}: expected a decimal string like "1250.00", got {value!r}')
    try:
        d = Decimal(value.strip()) if isinstance(value, str) else Decimal(value)
    except InvalidOperation:
        raise InvalidMoney(f"{name}: not a decimal amount: {value!r}") from None
    if not d.is_finite():
        raise InvalidMoney(f"{name}: must be finite, got {value!r}")
    if d < 0 or (positive and d == 0):
        raise InvalidMoney(f"{name}: must be {'> 0' if positive else '>= 0'}, got {value}")
    try:
        return to_minor_units(d, currency)
    except ValueError as exc:
        raise InvalidMoney(f"{name}: {exc}") from None


@dataclass(frozen=True, slots=True, kw_only=True)
class ApplicationResult:
    """The application written (or found again), and the credit after it."""

    event_id: str
    created: bool
    applied_minor_units: int
    carried_forward_minor_units: int
    credit: dict[str, Any]

    def to_json(self) -> dict[str, Any]:
        """Plain JSON of the result."""
        cur = self.credit["currency"]
        return {
            "event_id": self.event_id,
            "created": self.created,
            "applied": format_minor(self.applied_minor_units, cur),
            "applied_minor_units": self.applied_minor_units,
            "carried_forward": format_minor(self.carried_forward_minor_units, cur),
            "carried_forward_minor_units": self.carried_forward_minor_units,
            "credit": self.credit,
        }


def find_credit(session: Session, credit: str, *, lock: bool = False) -> Credit:
    """The credit with id or credit-note number ``credit``; :class:`UnknownCredit` if none."""
    cond = [Credit.credit_note == credit]
    with contextlib.suppress(ValueError, AttributeError, TypeError):
        cond.append(Credit.credit_id == uuid.UUID(credit))
    q = select(Credit).where(or_(*cond))
    if lock:
        q = q.with_for_update()
    row = session.execute(q).scalar_one_or_none()
    if row is None:
        raise UnknownCredit(f"credit: no credit with id or credit-note number {credit!r}")
    return row


def apply_credit(
    session: Session,
    credit: str,
    *,
    invoice_ref: str,
    invoice_amount: str | Decimal,
    applied_on: date,
    invoice_kind: str = "renewal",
    amount: str | Decimal | None = None,
    now: datetime | None = None,
) -> ApplicationResult:
    """Record that (part of) ``credit`` was applied to an invoice; never commits.

    ``credit`` is a credit id or credit-note number.  Without ``amount``, applies
    ``min(remaining, invoice_amount)`` (the rest is carried forward).  The same invoice
    and credit recorded twice with the same content is a no-op.  Raises
    :class:`UnknownCredit`, :class:`InvalidMoney` (malformed, negative or too precise
    money), :class:`CreditNotApplicable` (void or fully applied credit, an amount over
    the remaining balance or over the invoice, an invoice already applied with other
    content) or ValueError for a bad invoice reference, kind or date; nothing is
    written then.
    """
    now = require_aware("now", now) if now is not None else datetime.now(UTC)
    if not isinstance(invoice_ref, str) or not invoice_ref.strip():
        raise CreditNotApplicable("invoice_ref: expected a non-empty invoice reference")
    if invoice_kind not in INVOICE_KINDS:
        raise CreditNotApplicable(
            f"invoice_kind: expected one of {sorted(INVOICE_KINDS)}, got {invoice_kind!r}"
        )
    if not isinstance(applied_on, date) or isinstance(applied_on, datetime):
        raise CreditNotApplicable(f"applied_on: expected a date, got {applied_on!r}")
    row = find_credit(session, credit)
    sizes = journal.lock_logs(session, [row.contract_id])
    session.refresh(row)
    cur = row.currency
    invoice_minor = parse_money("invoice_amount", invoice_amount, cur)
    wanted = None if amount is None else parse_money("amount", amount, cur)
    eid = entries.event_id("credit_application", row.credit_id, invoice_ref.strip())
    old = entries.existing(session, eid)
    if old is not None:
        body = journal.entry_body(old.canonical)
        same = body["invoice_minor"] == invoice_minor and (
            wanted is None or body["minor_units"] == wanted
        )
        if not same or body["invoice_kind"] != invoice_kind:
            raise CreditNotApplicable(
                f"invoice_ref: invoice {invoice_ref!r} already has an application of "
                f"{row.credit_note} with other content"
            )
        return ApplicationResult(
            event_id=str(eid),
            created=False,
            applied_minor_units=int(body["minor_units"]),
            carried_forward_minor_units=int(body["remaining_minor"]),
            credit=credit_json(row),
        )
    if row.status == "void":
        raise CreditNotApplicable(f"credit: {row.credit_note} is void; it cannot be applied")
    remaining = row.amount_minor - row.applied_minor
    if remaining <= 0:
        raise CreditNotApplicable(f"credit: {row.credit_note} is already fully applied")
    if wanted is None:
        applied = min(remaining, invoice_minor)
    else:
        if wanted > remaining:
            raise CreditNotApplicable(
                f"amount: {format_minor(wanted, cur)} {cur} is more than the remaining "
                f"balance of {row.credit_note} ({format_minor(remaining, cur)} {cur})"
            )
        if wanted > invoice_minor:
            raise CreditNotApplicable(
                f"amount: {format_minor(wanted, cur)} {cur} is more than the invoice "
                f"({format_minor(invoice_minor, cur)} {cur})"
            )
        applied = wanted
    left = remaining - applied
    entry = entries.make_entry(
        "credit_application",
        eid,
        row.contract_id,
        now,
        {
            "credit_id": str(row.credit_id),
            "credit_note": row.credit_note,
            "year": row.year,
            "invoice_ref": invoice_ref.strip(),
            "invoice_kind": invoice_kind,
            "invoice_amount": format_minor(invoice_minor, cur),
            "invoice_minor": invoice_minor,
            "currency": cur,
            "amount": format_minor(applied, cur),
            "minor_units": applied,
            "remaining_amount": format_minor(left, cur),
            "remaining_minor": left,
            "applied_on": applied_on.isoformat(),
        },
    )
    entries.append(session, [entry], sizes)
    session.refresh(row)
    return ApplicationResult(
        event_id=str(eid),
        created=True,
        applied_minor_units=applied,
        carried_forward_minor_units=left,
        credit=credit_json(row),
    )


def applications_of(session: Session, credit: str) -> list[dict[str, Any]]:
    """Every application of ``credit`` (id or credit-note number), in log order."""
    row = find_credit(session, credit)
    return [
        {
            "event_id": str(a.event_id),
            "invoice_ref": a.invoice_ref,
            "invoice_kind": a.invoice_kind,
            "invoice_amount": format_minor(a.invoice_minor, row.currency),
            "amount": format_minor(a.amount_minor, row.currency),
            "minor_units": a.amount_minor,
            "remaining_amount": format_minor(a.remaining_minor, row.currency),
            "applied_on": a.applied_on.isoformat(),
        }
        for a in session.execute(
            select(CreditApplication)
            .where(CreditApplication.credit_id == row.credit_id)
            .order_by(CreditApplication.seq)
        ).scalars()
    ]
