"""Contract amendments: effective-dated changes of values, term and guarantee terms.

An ``amendment`` entry names what changes (``annual_value``, ``renewal_value``,
``gpu_hour_price``, ``term_years``, ``terms`` keys) and from which local date.
A contract year is computed with the contract as amended by every amendment in
force at the year's first day (``effective_date <= `` the year's start date); an
amendment with ``applies_to_year_in_progress`` also governs the year that
contains its effective date.  A renewal extends the term (``term_years``); the
extended term counts from the moment the renewal is recorded, whatever its
effective date.  An amendment that would change the terms of a closed year is
refused (reopen nothing: corrections of a closed year go through adjustments).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, date, datetime
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from billing import entries
from billing.errors import AmendmentRefused
from billing.inforce import InForce, in_force, merge_changes, term_years_of
from billing.models import Amendment, BillingYear
from billing.terms import Terms
from billing.years import contract_year_dates
from ledger import ids, journal
from ledger.contracts import get_contract
from ledger.records import contract_from_record

__all__ = [
    "AMENDMENT_TYPES",
    "AmendmentResult",
    "InForce",
    "amend_contract",
    "amendments_of",
    "contract_in_force",
]

AMENDMENT_TYPES = frozenset({"expansion", "renewal", "value", "terms"})
_CHANGE_KEYS = ("annual_value", "renewal_value", "gpu_hour_price", "term_years", "terms")


@dataclass(frozen=True, slots=True, kw_only=True)
class AmendmentResult:
    """The amendment entry written (or found, for an identical retry)."""

    event_id: str
    contract_id: str
    created: bool


def _rows(session: Session, contract_id: str, tree_size: int | None = None) -> list[Amendment]:
    query = select(Amendment).where(Amendment.contract_id == contract_id)
    if tree_size is not None:
        query = query.where(Amendment.seq < tree_size)
    return list(
        session.execute(query.order_by(Amendment.effective_date, Amendment.seq)).scalars()
    )


_merge = merge_changes
_term_years = term_years_of


def contract_in_force(
    session: Session, contract_id: str, year: int, *, tree_size: int | None = None
) -> InForce:
    """The contract as amended for contract year ``year`` (terms in force at its start).

    Raises :class:`~ledger.errors.UnknownContract` for an unknown contract.  Promises:
    with no amendments, the contract as recorded; ``term_years`` is the term extended
    by every renewal recorded so far (with ``tree_size``: only amendments among the
    first ``tree_size`` entries of the contract's log count, as a report over a signed
    checkpoint needs).
    """
    base = get_contract(session, contract_id)
    return in_force(base, _rows(session, contract_id, tree_size), year)


def amendments_of(session: Session, contract_id: str) -> list[dict[str, Any]]:
    """Every amendment of ``contract_id`` as plain dicts, by effective date then log order."""
    get_contract(session, contract_id)
    return [
        {
            "event_id": str(r.event_id),
            "amendment_type": r.amendment_type,
            "effective_date": r.effective_date.isoformat(),
            "applies_to_year_in_progress": r.applies_to_year_in_progress,
            "changes": r.changes,
            "recorded_at": r.occurred_at.astimezone(UTC).isoformat(),
        }
        for r in _rows(session, contract_id)
    ]


def _check_changes(amendment_type: str, changes: Mapping[str, Any]) -> dict[str, Any]:
    if amendment_type not in AMENDMENT_TYPES:
        raise AmendmentRefused(
            f"amendment_type: expected one of {sorted(AMENDMENT_TYPES)}, got {amendment_type!r}"
        )
    if not isinstance(changes, Mapping) or not changes:
        raise AmendmentRefused("changes: expected a non-empty object of changed fields")
    unknown = sorted(set(changes) - set(_CHANGE_KEYS))
    if unknown:
        raise AmendmentRefused(
            f"changes: unknown field(s) {unknown}; an amendment may change {list(_CHANGE_KEYS)}"
        )
    out = dict(changes)
    if "terms" in out:
        if not isinstance(out["terms"], Mapping) or not out["terms"]:
            raise AmendmentRefused("changes.terms: expected a non-empty object")
        try:
            Terms.from_json(out["terms"])
        except ValueError as exc:
            raise AmendmentRefused(f"changes.{exc}") from exc
        out["terms"] = dict(out["terms"])
    if amendment_type == "renewal" and "term_years" not in out:
        raise AmendmentRefused("changes.term_years: a renewal extends the term; give term_years")
    if amendment_type == "expansion" and not {"annual_value", "renewal_value"} & set(out):
        raise AmendmentRefused(
            "changes: an expansion changes annual_value or renewal_value; give one of them"
        )
    if amendment_type == "terms" and "terms" not in out:
        raise AmendmentRefused("changes.terms: a terms amendment must change terms")
    return out


def amend_contract(
    session: Session,
    contract_id: str,
    *,
    amendment_type: str,
    effective_date: date,
    changes: Mapping[str, Any],
    applies_to_year_in_progress: bool = False,
    amendment_id: str | None = None,
    now: datetime | None = None,
) -> AmendmentResult:
    """Record an amendment of ``contract_id``; never commits.

    ``changes`` may set ``annual_value``, ``renewal_value``, ``gpu_hour_price``
    (decimal strings), ``term_years`` (an extension only) and ``terms`` keys.  Raises
    :class:`AmendmentRefused` (nothing written) for a malformed change, a shortened
    term, or a change that would alter a year already closed.  ``amendment_id`` makes
    the entry idempotent (same id and content: no-op; same id, other content: refused).
    """
    now = now or datetime.now(UTC)
    if not isinstance(effective_date, date) or isinstance(effective_date, datetime):
        raise AmendmentRefused(f"effective_date: expected a date, got {effective_date!r}")
    clean = _check_changes(amendment_type, changes)
    sizes = journal.lock_logs(session, [contract_id])
    base = get_contract(session, contract_id)
    rows = _rows(session, contract_id)
    current_term = _term_years(base, rows)
    if "term_years" in clean:
        t = clean["term_years"]
        if isinstance(t, bool) or not isinstance(t, int) or t < current_term:
            raise AmendmentRefused(
                f"changes.term_years: must be an integer >= the current term "
                f"({current_term} years), got {t!r}"
            )
    # The merged contract must still be a valid contract (money precision, percents…).
    record = base.to_record()
    for row in rows:
        record = _merge(record, row.changes)
    try:
        contract_from_record(_merge(record, clean))
    except ValueError as exc:
        raise AmendmentRefused(f"changes: {exc}") from exc
    if effective_date < base.start_date:
        raise AmendmentRefused(
            f"effective_date: {effective_date.isoformat()} is before the contract start "
            f"{base.start_date.isoformat()}"
        )
    closed = sorted(
        session.execute(
            select(BillingYear.year).where(BillingYear.contract_id == contract_id)
        ).scalars()
    )
    for k in closed:
        start, end = contract_year_dates(base.start_date, k)
        if effective_date <= start or (applies_to_year_in_progress and effective_date < end):
            raise AmendmentRefused(
                f"effective_date: {effective_date.isoformat()} would change the terms of "
                f"contract year {k}, which is closed"
            )
    eid = (
        entries.event_id("amendment", contract_id, amendment_id)
        if amendment_id
        else ids.random_internal_id()
    )
    payload = {
        "amendment_type": amendment_type,
        "effective_date": effective_date.isoformat(),
        "applies_to_year_in_progress": bool(applies_to_year_in_progress),
        "changes": clean,
    }
    old = entries.existing(session, eid)
    if old is not None:
        body = journal.entry_body(old.canonical)
        if {k: body.get(k) for k in payload} != payload:
            raise AmendmentRefused(
                f"amendment_id: {amendment_id!r} was already recorded with other content"
            )
        return AmendmentResult(event_id=str(eid), contract_id=contract_id, created=False)
    entry = entries.make_entry("amendment", eid, contract_id, now, payload)
    entries.append(session, [entry], sizes)
    return AmendmentResult(event_id=str(eid), contract_id=contract_id, created=True)
