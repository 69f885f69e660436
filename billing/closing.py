"""Contract-year close: final figures, the verdict, and the credit — exactly once.

``close_year`` locks the contract's log (so concurrent closes, ingests and
applications of the same contract queue), computes the year's figures with the
terms in force at the year's start, and appends in one transaction:

* a ``year_close`` entry (first close) holding the figures, the terms and contract
  values used, and the Merkle ``tree_size`` / ``root_hash`` the figures were
  computed over; or, when the year is closed and a late record or resolved dispute
  has made it *pending*, an ``adjustment`` entry of the same shape;
* a ``credit`` entry when the guarantee is not met and the year has no live credit,
  or a ``credit_void`` entry when an adjustment finds the guarantee met after all;

then signs a checkpoint of the log.  A closed year with nothing pending is a no-op
that reports the first close.  Event ids are deterministic (UUID v5 of contract,
year and ordinal) and ``billing_credits`` has a partial unique index on
``(contract_id, year)`` among live credits, so a year never gets two live credits
even if two closes race past the code's checks.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from billing import entries
from billing.amendments import InForce, contract_in_force
from billing.errors import PeriodOutOfRange, YearNotEnded
from billing.models import BillingYear, Credit
from billing.money import credit_minor_units, format_minor, to_minor_units
from billing.services import credit_json, figures_for
from billing.sla import SlaFigures
from billing.years import contract_year_bounds, require_aware
from ledger import journal, tree
from ledger.checkpoints import sign_log
from ledger.contracts import get_contract, list_contracts
from ledger.errors import InvariantBroken
from ledger.note import Signer

__all__ = ["CloseResult", "close_due", "close_year", "credit_note_number"]


@dataclass(frozen=True, slots=True, kw_only=True)
class CloseResult:
    """What a close did: ``closed`` (first close), ``adjusted``, or ``unchanged`` (no-op).

    ``event_id`` is the entry written (or, for ``unchanged``, the first close);
    ``credit`` the year's credit after the close (None if none); ``voided`` the credit
    voided by this adjustment; ``checkpoint_size`` the size of the signed tree head.
    """

    contract_id: str
    year: int
    action: str
    event_id: str
    close_event_id: str
    closed_at: str
    guarantee_met: bool
    figures: dict[str, Any]
    credit: dict[str, Any] | None = None
    credit_issued: bool = False
    voided: str | None = None
    checkpoint_size: int | None = None
    pending_adjustment: bool = False
    extra: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        """Plain JSON of the result (for ``--json`` output)."""
        return {
            "contract_id": self.contract_id,
            "year": self.year,
            "action": self.action,
            "event_id": self.event_id,
            "close_event_id": self.close_event_id,
            "closed_at": self.closed_at,
            "guarantee_met": self.guarantee_met,
            "figures": self.figures,
            "credit": self.credit,
            "credit_issued": self.credit_issued,
            "voided": self.voided,
            "checkpoint_size": self.checkpoint_size,
            "pending_adjustment": self.pending_adjustment,
        }


def credit_note_number(contract_id: str, year: int, n: int = 1) -> str:
    """The credit-note number of the ``n``-th credit of a year: ``CN-<contract>-Y<k>``
    for the first, ``CN-<contract>-Y<k>-<n>`` after a void and a re-issue."""
    return f"CN-{contract_id}-Y{year}" + ("" if n == 1 else f"-{n}")


def _live_credit(session: Session, contract_id: str, year: int) -> Credit | None:
    return session.execute(
        select(Credit).where(
            Credit.contract_id == contract_id, Credit.year == year, Credit.status != "void"
        )
    ).scalar_one_or_none()


def _unchanged(session: Session, state: BillingYear, contract_id: str, year: int) -> CloseResult:
    from billing.models import Close

    first = session.get(Close, state.close_event_id)
    if first is None:
        raise InvariantBroken(f"close {state.close_event_id} is in the year but not projected")
    live = _live_credit(session, contract_id, year)
    return CloseResult(
        contract_id=contract_id,
        year=year,
        action="unchanged",
        event_id=str(state.close_event_id),
        close_event_id=str(state.close_event_id),
        closed_at=state.closed_at.astimezone(UTC).isoformat(),
        guarantee_met=state.guarantee_met,
        figures=first.figures,
        credit=credit_json(live) if live else None,
        pending_adjustment=state.pending_seq is not None,
    )


def _contract_values(in_force: InForce) -> dict[str, Any]:
    c = in_force.contract
    return {
        "currency": c.currency,
        "annual_value": format(c.annual_value, "f"),
        "renewal_value": None if c.renewal_value is None else format(c.renewal_value, "f"),
        "credit_base": format(c.credit_base, "f"),
        "term_years": in_force.term_years,
        "amendments": list(in_force.amendments),
    }


def close_year(
    session: Session,
    contract_id: str,
    year: int,
    *,
    now: datetime | None = None,
    signer: Signer | None = None,
    origin_prefix: str = "",
) -> CloseResult:
    """Close contract year ``year`` of ``contract_id`` (or adjust it); never commits.

    Promises: at most one ``year_close`` and one live credit per contract year, whatever
    the concurrency; a second call with nothing pending writes nothing and reports the
    first close; with a pending adjustment, writes an ``adjustment`` and, when the
    verdict flips, a new credit or a void of the live one.  Signs a checkpoint of the
    log when ``signer`` is given.  Raises :class:`~ledger.errors.UnknownContract`,
    :class:`PeriodOutOfRange` (year outside the term), :class:`YearNotEnded` (the year
    ends after ``now``) or ValueError (a naive ``now``); nothing is written then.
    """
    now = require_aware("now", now) if now is not None else datetime.now(UTC)
    if isinstance(year, bool) or not isinstance(year, int):
        raise PeriodOutOfRange(f"year: expected a contract year number, got {year!r}")
    get_contract(session, contract_id)
    sizes = journal.lock_logs(session, [contract_id])
    in_force = contract_in_force(session, contract_id, year)
    contract = in_force.contract
    if not 1 <= year <= in_force.term_years:
        raise PeriodOutOfRange(
            f"year: {year} is outside the term of contract {contract_id!r} "
            f"(years 1 to {in_force.term_years})"
        )
    start, end = contract_year_bounds(contract.start_date, contract.timezone, year)
    if now < end:
        raise YearNotEnded(
            f"year: contract year {year} of {contract_id!r} ends at {end.isoformat()}; "
            f"it cannot be closed before then (now is {now.astimezone(UTC).isoformat()})"
        )
    state = session.get(BillingYear, (contract_id, year))
    if state is not None and state.pending_seq is None:
        return _unchanged(session, state, contract_id, year)

    figures: SlaFigures = figures_for(session, contract, start, end, now, in_force.terms)
    size = sizes[contract_id]
    payload: dict[str, Any] = {
        "year": year,
        "period_start": start.isoformat(),
        "period_end": end.isoformat(),
        "figures": figures.to_json(),
        "terms": in_force.terms.to_json(),
        "contract": _contract_values(in_force),
        "tree_size": size,
        "root_hash": tree.root(session, contract_id, size).hex(),
    }
    if state is None:
        kind = "year_close"
        eid = entries.event_id("year_close", contract_id, year)
        close_id = eid
    else:
        kind = "adjustment"
        n = state.adjustments + 1
        eid = entries.event_id("adjustment", contract_id, year, n)
        close_id = state.close_event_id
        payload |= {
            "adjusts": str(state.close_event_id),
            "adjustment_number": n,
            "previous_event_id": str(state.last_event_id),
            "previous_guarantee_met": state.guarantee_met,
            "late_event_id": str(state.pending_event_id),
        }
    new = [entries.make_entry(kind, eid, contract_id, now, payload)]

    live = _live_credit(session, contract_id, year)
    credit_issued = False
    voided: str | None = None
    if not figures.guarantee_met and live is None:
        n_credits = session.execute(
            select(func.count())
            .select_from(Credit)
            .where(Credit.contract_id == contract_id, Credit.year == year)
        ).scalar_one()
        new.append(_credit_entry(in_force, year, n_credits + 1, eid, figures, start, end, now))
        credit_issued = True
    elif figures.guarantee_met and live is not None:
        voided = str(live.credit_id)
        new.append(
            entries.make_entry(
                "credit_void",
                entries.event_id("credit_void", live.credit_id),
                contract_id,
                now,
                {
                    "credit_id": str(live.credit_id),
                    "credit_note": live.credit_note,
                    "year": year,
                    "reason": "the guarantee is met after adjustment",
                    "adjustment_event_id": str(eid),
                    "applied_minor_units": live.applied_minor,
                },
            )
        )
    entries.append(session, new, sizes)
    head = sign_log(session, signer, contract_id, origin_prefix) if signer else None
    after = _live_credit(session, contract_id, year)
    return CloseResult(
        contract_id=contract_id,
        year=year,
        action="closed" if kind == "year_close" else "adjusted",
        event_id=str(eid),
        close_event_id=str(close_id),
        closed_at=now.astimezone(UTC).isoformat(),
        guarantee_met=figures.guarantee_met,
        figures=payload["figures"],
        credit=credit_json(after) if after else None,
        credit_issued=credit_issued,
        voided=voided,
        checkpoint_size=head.tree_size if head else None,
    )


def _credit_entry(
    in_force: InForce,
    year: int,
    n: int,
    close_id: Any,
    figures: SlaFigures,
    start: datetime,
    end: datetime,
    now: datetime,
) -> journal.NewEntry:
    c = in_force.contract
    base = c.credit_base
    percent = in_force.terms.credit_percent
    minor = credit_minor_units(base, percent, c.currency)
    base_minor = to_minor_units(base, c.currency)
    return entries.make_entry(
        "credit",
        entries.event_id("credit", c.contract_id, year, n),
        c.contract_id,
        now,
        {
            "year": year,
            "credit_note": credit_note_number(c.contract_id, year, n),
            "close_event_id": str(close_id),
            "period_start": start.isoformat(),
            "period_end": end.isoformat(),
            "covered_failures": figures.covered_failures,
            "resolved_failures": figures.resolved_failures,
            "threshold_percent": format(figures.threshold_percent, "f"),
            "credit_percent": format(percent, "f"),
            "currency": c.currency,
            "base_amount": format_minor(base_minor, c.currency),
            "base_minor": base_minor,
            "amount": format_minor(minor, c.currency),
            "minor_units": minor,
        },
    )


def close_due(
    session: Session,
    *,
    now: datetime | None = None,
    signer: Signer | None = None,
    origin_prefix: str = "",
    include_pending: bool = False,
) -> list[CloseResult]:
    """Close every contract year that has ended by ``now`` and is not closed yet.

    With ``include_pending``, also adjust closed years that have a pending adjustment.
    Returns one result per year acted on, by contract and year; never commits.
    """
    now = require_aware("now", now) if now is not None else datetime.now(UTC)
    state = {
        (c, y): pending is not None
        for c, y, pending in session.execute(
            select(BillingYear.contract_id, BillingYear.year, BillingYear.pending_seq)
        )
    }
    results: list[CloseResult] = []
    for row in list_contracts(session):
        in_force = contract_in_force(session, row.contract_id, 1)
        c = in_force.contract
        for k in range(1, in_force.term_years + 1):
            _, end = contract_year_bounds(c.start_date, c.timezone, k)
            if end > now:
                break
            key = (row.contract_id, k)
            if key in state and not (include_pending and state[key]):
                continue
            results.append(
                close_year(
                    session, row.contract_id, k, now=now, signer=signer, origin_prefix=origin_prefix
                )
            )
    return results
