"""Projections of billing's entries, wired into ingest and ``yoco ledger rebuild``.

``PROJECTORS`` and ``TABLES`` are what the composition root (``yoco.app``)
loads.  The projector sees every entry of a batch (ledger kinds too) in log
order and

* applies billing's own kinds to ``billing_*`` tables, one entry at a time in
  ``(log, seq)`` order, so a batch replayed by a rebuild gives exactly the rows the
  live writes gave;
* marks a closed contract year as having a *pending adjustment* when a late
  record arrives for it: a ``failure`` whose ``occurred_at`` is in the year, or an
  ``outcome``, ``exclusion`` or ``reclassification`` naming a failure of the year,
  appended after the year's latest close or adjustment.

Only state derived from entries is written (no clocks), so rebuild == live.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import date, datetime
from decimal import Decimal
from typing import Any

from sqlalchemy import select, update
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.orm import Session

from billing.models import (
    TABLES,
    Amendment,
    BillingYear,
    Close,
    Credit,
    CreditApplication,
    Dispute,
    ExportRecord,
    Reclassification,
)
from billing.years import year_of
from ledger.bulk import probe
from ledger.errors import InvariantBroken
from ledger.models import Contract
from ledger.projections import ProjectedEntry, ProjectionError, Projector

__all__ = ["BILLING_KINDS", "KINDS", "LATE_KINDS", "PROJECTORS", "TABLES", "project_billing"]

#: Entry kinds billing owns.
BILLING_KINDS = frozenset(
    {
        "year_close",
        "adjustment",
        "credit",
        "credit_void",
        "credit_application",
        "dispute_opened",
        "dispute_resolved",
        "dispute_rejected",
        "reclassification",
        "amendment",
        "export",
    }
)
#: Kinds that can change a closed year's figures.
LATE_KINDS = frozenset({"failure", "outcome", "exclusion", "reclassification"})
#: Every kind :func:`project_billing` reads (a replay may skip the others).
KINDS = BILLING_KINDS | LATE_KINDS

#: When each failure happened, by event id: one index probe an id whatever the
#: statistics (:func:`ledger.bulk.probe`: never a scan of the table).
FAILURE_TIMES = (
    "SELECT f.event_id, f.occurred_at FROM unnest(%s::uuid[]) AS q(id) "
    "JOIN failures f ON f.event_id = q.id"
)


def _uuid(value: Any) -> uuid.UUID:
    return value if isinstance(value, uuid.UUID) else uuid.UUID(str(value))


def _ts(value: str) -> datetime:
    return datetime.fromisoformat(value)


@dataclass(slots=True)
class _YearState:
    last_seq: int
    pending_seq: int | None


def _credit_status(applied: int, amount: int) -> str:
    if applied == 0:
        return "issued"
    return "applied" if applied >= amount else "partially_applied"


class _Batch:
    """State of one projection batch: closed years of the contracts it touches."""

    def __init__(self, session: Session, contract_ids: set[str]) -> None:
        self.session = session
        self.years: dict[str, dict[int, _YearState]] = {c: {} for c in contract_ids}
        for cid, year, last_seq, pending_seq in session.execute(
            select(
                BillingYear.contract_id,
                BillingYear.year,
                BillingYear.last_seq,
                BillingYear.pending_seq,
            ).where(BillingYear.contract_id.in_(sorted(contract_ids)))
        ):
            self.years[cid][year] = _YearState(last_seq, pending_seq)
        self._contracts: dict[str, tuple[date, str]] = {}
        self._failure_times: dict[uuid.UUID, datetime] = {}

    def contract(self, cid: str) -> tuple[date, str]:
        if cid not in self._contracts:
            row = self.session.execute(
                select(Contract.start_date, Contract.timezone).where(Contract.contract_id == cid)
            ).one()
            self._contracts[cid] = (row[0], row[1])
        return self._contracts[cid]

    def prefetch_failures(self, ids: set[uuid.UUID]) -> None:
        missing = sorted(ids - set(self._failure_times))
        for eid, at in probe(self.session, FAILURE_TIMES, missing):
            self._failure_times[eid] = at

    def failure_time(self, eid: uuid.UUID) -> datetime | None:
        return self._failure_times.get(eid)


def project_billing(session: Session, entries: Sequence[ProjectedEntry]) -> list[ProjectionError]:
    """Apply billing's entries and mark late records; ignore every other kind.

    Promises: the same entries in the same log order give the same rows, whether they
    arrive in one batch or many (live writes and ``yoco ledger rebuild`` agree).
    Returns contradictions (e.g. an application to an unknown credit) as errors.
    """
    own = [e for e in entries if e.kind in BILLING_KINDS]
    late = [e for e in entries if e.kind in LATE_KINDS]
    if not own and not late:
        return []
    touched = {e.log_id for e in own} | {e.log_id for e in late}
    batch = _Batch(session, touched)
    if not own:
        # The common case (ingest): only late-record checks, and only where a year is closed.
        late = [e for e in late if batch.years.get(e.log_id)]
        if not late:
            return []
    refs = {
        _uuid(e.body["failure_event_id"])
        for e in late
        if e.kind != "failure" and batch.years.get(e.log_id) is not None
    }
    batch.prefetch_failures(refs)
    errors: list[ProjectionError] = []
    work = sorted({id(e): e for e in (*own, *late)}.values(), key=lambda e: (e.log_id, e.seq))
    for e in work:
        if e.kind in LATE_KINDS:
            _check_late(batch, e)
        if e.kind in BILLING_KINDS:
            error = _HANDLERS[e.kind](session, batch, e)
            if error is not None:
                errors.append(error)
    return errors


def _check_late(batch: _Batch, e: ProjectedEntry) -> None:
    closed = batch.years.get(e.log_id)
    if not closed:
        return
    if e.kind == "failure":
        at = e.occurred_at
    else:
        at = batch.failure_time(_uuid(e.body["failure_event_id"]))
    if at is None:
        return
    start_date, tz = batch.contract(e.log_id)
    k = year_of(start_date, tz, at)
    state = closed.get(k) if k is not None else None
    if state is None or state.last_seq > e.seq or state.pending_seq is not None:
        return
    state.pending_seq = e.seq
    batch.session.execute(
        update(BillingYear)
        .where(BillingYear.contract_id == e.log_id, BillingYear.year == k)
        .values(pending_seq=e.seq, pending_event_id=e.event_id)
    )


def _close(session: Session, batch: _Batch, e: ProjectedEntry) -> ProjectionError | None:
    b = e.body
    fig = b["figures"]
    year = int(b["year"])
    if e.occurred_at is None:
        raise InvariantBroken(f"entry {e.event_id} has no occurred_at")
    session.execute(
        pg_insert(Close).values(
            event_id=e.event_id,
            contract_id=e.log_id,
            year=year,
            seq=e.seq,
            kind=e.kind,
            occurred_at=e.occurred_at,
            period_start=_ts(b["period_start"]),
            period_end=_ts(b["period_end"]),
            covered_failures=int(fig["covered_failures"]),
            resolved_failures=int(fig["resolved_failures"]),
            excluded_failures=int(fig["excluded_failures"]),
            pending_failures=int(fig["pending_failures"]),
            threshold_percent=Decimal(fig["threshold_percent"]),
            guarantee_met=bool(fig["guarantee_met"]),
            tree_size=int(b["tree_size"]),
            root_hash=b["root_hash"],
            figures=fig,
            terms=b["terms"],
        )
    )
    years = batch.years.setdefault(e.log_id, {})
    if e.kind == "year_close":
        if year in years:
            return ProjectionError(e.event_id, "year", f"year {year} is already closed")
        session.execute(
            pg_insert(BillingYear).values(
                contract_id=e.log_id,
                year=year,
                close_event_id=e.event_id,
                closed_seq=e.seq,
                closed_at=e.occurred_at,
                last_event_id=e.event_id,
                last_seq=e.seq,
                guarantee_met=bool(fig["guarantee_met"]),
                adjustments=0,
                pending_seq=None,
                pending_event_id=None,
            )
        )
    else:
        if year not in years:
            return ProjectionError(e.event_id, "year", f"year {year} was never closed")
        session.execute(
            update(BillingYear)
            .where(BillingYear.contract_id == e.log_id, BillingYear.year == year)
            .values(
                last_event_id=e.event_id,
                last_seq=e.seq,
                guarantee_met=bool(fig["guarantee_met"]),
                adjustments=BillingYear.adjustments + 1,
                pending_seq=None,
                pending_event_id=None,
            )
        )
    years[year] = _YearState(e.seq, None)
    return None


def _credit(session: Session, batch: _Batch, e: ProjectedEntry) -> ProjectionError | None:
    b = e.body
    if e.occurred_at is None:
        raise InvariantBroken(f"entry {e.event_id} has no occurred_at")
    session.execute(
        pg_insert(Credit).values(
            credit_id=e.event_id,
            contract_id=e.log_id,
            year=int(b["year"]),
            seq=e.seq,
            credit_note=b["credit_note"],
            issued_at=e.occurred_at,
            close_event_id=_uuid(b["close_event_id"]),
            period_start=_ts(b["period_start"]),
            period_end=_ts(b["period_end"]),
            covered_failures=int(b["covered_failures"]),
            resolved_failures=int(b["resolved_failures"]),
            threshold_percent=Decimal(b["threshold_percent"]),
            credit_percent=Decimal(b["credit_percent"]),
            currency=b["currency"],
            base_minor=int(b["base_minor"]),
            amount_minor=int(b["minor_units"]),
            applied_minor=0,
            status="issued",
            void_event_id=None,
            voided_at=None,
        )
    )
    return None


def _credit_void(session: Session, batch: _Batch, e: ProjectedEntry) -> ProjectionError | None:
    cid = _uuid(e.body["credit_id"])
    done = session.execute(
        update(Credit)
        .where(Credit.credit_id == cid, Credit.contract_id == e.log_id, Credit.status != "void")
        .values(status="void", void_event_id=e.event_id, voided_at=e.occurred_at)
    )
    if done.rowcount != 1:  # type: ignore[attr-defined]
        return ProjectionError(e.event_id, "credit_id", f"no live credit {cid} to void")
    return None


def _application(session: Session, batch: _Batch, e: ProjectedEntry) -> ProjectionError | None:
    b = e.body
    cid = _uuid(b["credit_id"])
    row = session.execute(
        select(Credit.amount_minor, Credit.applied_minor, Credit.status)
        .where(Credit.credit_id == cid, Credit.contract_id == e.log_id)
        .with_for_update()
    ).one_or_none()
    amount = int(b["minor_units"])
    if row is None or row.status == "void":
        return ProjectionError(e.event_id, "credit_id", f"no live credit {cid}")
    applied = row.applied_minor + amount
    if amount <= 0 or applied > row.amount_minor:
        return ProjectionError(
            e.event_id, "amount", f"applying {amount} exceeds the credit's remaining balance"
        )
    if e.occurred_at is None:
        raise InvariantBroken(f"entry {e.event_id} has no occurred_at")
    session.execute(
        pg_insert(CreditApplication).values(
            event_id=e.event_id,
            credit_id=cid,
            contract_id=e.log_id,
            seq=e.seq,
            invoice_ref=b["invoice_ref"],
            invoice_kind=b["invoice_kind"],
            invoice_minor=int(b["invoice_minor"]),
            amount_minor=amount,
            remaining_minor=row.amount_minor - applied,
            applied_on=date.fromisoformat(b["applied_on"]),
            occurred_at=e.occurred_at,
        )
    )
    session.execute(
        update(Credit)
        .where(Credit.credit_id == cid)
        .values(applied_minor=applied, status=_credit_status(applied, row.amount_minor))
    )
    return None


def _dispute_opened(session: Session, batch: _Batch, e: ProjectedEntry) -> ProjectionError | None:
    b = e.body
    if e.occurred_at is None:
        raise InvariantBroken(f"entry {e.event_id} has no occurred_at")
    session.execute(
        pg_insert(Dispute).values(
            dispute_id=e.event_id,
            contract_id=e.log_id,
            failure_event_id=_uuid(b["failure_event_id"]),
            seq=e.seq,
            opened_at=e.occurred_at,
            opened_by=b["opened_by"],
            reason=b["reason"],
            status="open",
            resolution=None,
            decision_event_id=None,
            decided_at=None,
            decided_by=None,
            note=None,
        )
    )
    return None


def _dispute_decided(session: Session, batch: _Batch, e: ProjectedEntry) -> ProjectionError | None:
    b = e.body
    did = _uuid(b["dispute_id"])
    done = session.execute(
        update(Dispute)
        .where(Dispute.dispute_id == did, Dispute.contract_id == e.log_id, Dispute.status == "open")
        .values(
            status="resolved" if e.kind == "dispute_resolved" else "rejected",
            resolution=b.get("resolution"),
            decision_event_id=e.event_id,
            decided_at=e.occurred_at,
            decided_by=b["decided_by"],
            note=b.get("note"),
        )
    )
    if done.rowcount != 1:  # type: ignore[attr-defined]
        return ProjectionError(e.event_id, "dispute_id", f"no open dispute {did}")
    return None


def _reclassification(session: Session, batch: _Batch, e: ProjectedEntry) -> ProjectionError | None:
    b = e.body
    if e.occurred_at is None:
        raise InvariantBroken(f"entry {e.event_id} has no occurred_at")
    session.execute(
        pg_insert(Reclassification).values(
            event_id=e.event_id,
            failure_event_id=_uuid(b["failure_event_id"]),
            contract_id=e.log_id,
            seq=e.seq,
            failure_class=b["failure_class"],
            cause=b["cause"],
            reason=b["reason"],
            occurred_at=e.occurred_at,
        )
    )
    return None


def _amendment(session: Session, batch: _Batch, e: ProjectedEntry) -> ProjectionError | None:
    b = e.body
    if e.occurred_at is None:
        raise InvariantBroken(f"entry {e.event_id} has no occurred_at")
    session.execute(
        pg_insert(Amendment).values(
            event_id=e.event_id,
            contract_id=e.log_id,
            seq=e.seq,
            amendment_type=b["amendment_type"],
            effective_date=date.fromisoformat(b["effective_date"]),
            applies_to_year_in_progress=bool(b["applies_to_year_in_progress"]),
            changes=b["changes"],
            occurred_at=e.occurred_at,
        )
    )
    return None


def _export(session: Session, batch: _Batch, e: ProjectedEntry) -> ProjectionError | None:
    b = e.body
    if e.occurred_at is None:
        raise InvariantBroken(f"entry {e.event_id} has no occurred_at")
    session.execute(
        pg_insert(ExportRecord).values(
            event_id=e.event_id,
            log_id=e.log_id,
            seq=e.seq,
            batch_id=b["batch_id"],
            format=b["format"],
            selection=b["selection"],
            row_count=int(b["row_count"]),
            sha256=b["sha256"],
            occurred_at=e.occurred_at,
        )
    )
    return None


_Handler = Callable[[Session, _Batch, ProjectedEntry], ProjectionError | None]
_HANDLERS: dict[str, _Handler] = {
    "year_close": _close,
    "adjustment": _close,
    "credit": _credit,
    "credit_void": _credit_void,
    "credit_application": _application,
    "dispute_opened": _dispute_opened,
    "dispute_resolved": _dispute_decided,
    "dispute_rejected": _dispute_decided,
    "reclassification": _reclassification,
    "amendment": _amendment,
    "export": _export,
}

#: Wired by ``yoco.app`` into ingest and rebuild.
PROJECTORS: list[Projector] = [project_billing]
