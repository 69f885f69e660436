"""Closing ended contract years without anyone asking: one run, safe from several places.

The guarantee's credits are claim-free: when a contract year ends, the year is closed
and, if the guarantee was missed, the credit issued — by a scheduler, not by a person.
:func:`close_due_run` is one run of that scheduler. It is what ``yoco serve`` runs in the
background every :data:`CLOSE_DUE_EVERY` and what ``yoco billing close-due`` runs from
cron, a systemd timer or a Kubernetes CronJob (deploy/).

Several runs at once (two ``yoco serve`` replicas and a CronJob) are safe twice over: a
run first takes a transaction-scoped PostgreSQL advisory lock, and a run that cannot
get it does nothing and says so; and underneath, :func:`billing.closing.close_year`
locks the contract's log and the live-credit unique index refuses a second credit, so
even runs that bypassed the lock could not issue a credit twice.

:func:`year_phase` says where a year stands for people (billing.yearend's words: ``not
started``, ``open``, ``ended, closing`` — ended, waiting for the next run — or
``closed``), and when its credit, if any, is issued.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from billing.closing import CloseResult, close_due
from billing.models import BillingYear
from billing.yearend import year_state, year_state_label
from billing.years import contract_year_bounds, require_aware
from ledger.checkpoints import SignedHead, sign_grown
from ledger.contracts import get_contract
from ledger.errors import CheckpointRefused
from ledger.note import Signer

__all__ = [
    "CHECKPOINT_LOCK",
    "CLOSE_DUE_EVERY",
    "CLOSE_DUE_LOCK",
    "CheckpointRun",
    "DueRun",
    "YearPhase",
    "checkpoint_run",
    "close_due_run",
    "year_phase",
]

#: How often the built-in scheduler (``yoco serve``) looks for ended years; the deploy/
#: timer and CronJob entries use the same period. A year is closed at most this long
#: after it ends.
CLOSE_DUE_EVERY = timedelta(hours=1)

#: Key of the advisory lock a close-due run holds for its transaction ("yococlos").
CLOSE_DUE_LOCK = 0x796F636F636C6F73


@dataclass(frozen=True, slots=True, kw_only=True)
class DueRun:
    """One scheduler run: ``ran`` is False when another run held the lock (nothing done)."""

    ran: bool
    now: datetime
    results: list[CloseResult] = field(default_factory=list)

    @property
    def credits_issued(self) -> int:
        """How many credits this run issued."""
        return sum(1 for r in self.results if r.credit_issued)

    def to_json(self) -> dict[str, Any]:
        """Plain JSON: ``ran``, ``now`` (ISO 8601 UTC) and every close's result."""
        return {
            "ran": self.ran,
            "now": self.now.astimezone(UTC).isoformat(),
            "results": [r.to_json() for r in self.results],
        }


def close_due_run(
    session: Session,
    *,
    now: datetime | None = None,
    signer: Signer | None = None,
    origin_prefix: str = "",
    include_pending: bool = False,
    wait: bool = False,
) -> DueRun:
    """Close every contract year that has ended by ``now``, unless another run is at it.

    Takes the :data:`CLOSE_DUE_LOCK` advisory lock for the session's transaction (with
    ``wait``, waits for it; otherwise returns ``DueRun(ran=False)`` at once when another
    run holds it), then does :func:`billing.closing.close_due`. Never commits: the
    caller's unit of work does, and the lock is released with that transaction.
    Idempotent: a year already closed is left as it is, a credit is issued at most once.
    """
    now = require_aware("now", now) if now is not None else datetime.now(UTC)
    if wait:
        session.execute(select(func.pg_advisory_xact_lock(CLOSE_DUE_LOCK)))
    elif not session.execute(select(func.pg_try_advisory_xact_lock(CLOSE_DUE_LOCK))).scalar_one():
        return DueRun(ran=False, now=now)
    results = close_due(
        session, now=now, signer=signer, origin_prefix=origin_prefix,
        include_pending=include_pending,
    )
    return DueRun(ran=True, now=now, results=results)


#: Key of the advisory lock a scheduled checkpoint run holds for its transaction
#: ("yocockpt"). Its own, not :data:`CLOSE_DUE_LOCK`: a close-due run that found it held
#: would be skipped for a whole :data:`CLOSE_DUE_EVERY`. Signing next to a close (which
#: signs the logs it closes) is safe without it: both lock the log's row first
#: (:func:`ledger.checkpoints.sign_log`), and the second finds the head signed.
CHECKPOINT_LOCK = 0x796F636F636B7074


@dataclass(frozen=True, slots=True, kw_only=True)
class CheckpointRun:
    """One scheduled checkpoint run: ``ran`` is False when another run held the lock
    (it is signing every grown log itself); ``heads``: the heads this run signed."""

    ran: bool = True
    heads: list[SignedHead] = field(default_factory=list)
    #: logs that could not be signed, each with the named error that says why (the others
    #: are signed all the same)
    refused: list[CheckpointRefused] = field(default_factory=list)


def checkpoint_run(
    session: Session, *, signer: Signer, origin_prefix: str, wait: bool = False
) -> CheckpointRun:
    """Sign every log with new entries (:func:`ledger.checkpoints.sign_grown`) unless
    another checkpoint run is at it (:data:`CHECKPOINT_LOCK`; ``wait``: wait for it, then
    sign what is left).

    Never commits: the caller's unit of work does, which releases the lock.
    """
    if wait:
        session.execute(select(func.pg_advisory_xact_lock(CHECKPOINT_LOCK)))
    elif not session.execute(select(func.pg_try_advisory_xact_lock(CHECKPOINT_LOCK))).scalar_one():
        return CheckpointRun(ran=False)
    signed = sign_grown(session, signer, origin_prefix)
    return CheckpointRun(heads=signed.heads, refused=signed.refused)


@dataclass(frozen=True, slots=True, kw_only=True)
class YearPhase:
    """Where a contract year stands, for people.

    ``state`` (billing.yearend.YEAR_STATES): ``not_started``, ``open`` (not ended),
    ``closing`` (ended, not closed yet: the scheduler closes it within
    :data:`CLOSE_DUE_EVERY`) or ``closed``. ``label`` is the words to show (``not
    started``, ``open``, ``ended, closing``, ``closed``); ``credit_note`` says when a credit,
    if the guarantee is missed, is (or was) issued.
    """

    contract_id: str
    year: int
    state: str
    ends_at: datetime
    closes_by: datetime
    closed_at: datetime | None
    label: str
    credit_note: str

    def to_json(self) -> dict[str, Any]:
        """Plain JSON, times as ISO 8601 UTC."""
        return {
            "contract_id": self.contract_id,
            "year": self.year,
            "state": self.state,
            "label": self.label,
            "ends_at": self.ends_at.isoformat(),
            "closes_by": self.closes_by.isoformat(),
            "closed_at": self.closed_at.isoformat() if self.closed_at else None,
            "credit_note": self.credit_note,
        }


def _when(t: datetime) -> str:
    return t.astimezone(UTC).strftime("%Y-%m-%d %H:%M UTC")


def year_phase(
    session: Session, contract_id: str, year: int, *, now: datetime | None = None
) -> YearPhase:
    """Where contract year ``year`` of ``contract_id`` stands at ``now``; read-only.  The
    state and its words are billing.yearend's (the credits page and the export use them).

    Raises :class:`~ledger.errors.UnknownContract` or ValueError (bad year, naive now).
    """
    now = require_aware("now", now) if now is not None else datetime.now(UTC)
    contract = get_contract(session, contract_id)
    start, end = contract_year_bounds(contract.start_date, contract.timezone, year)
    closes_by = end + CLOSE_DUE_EVERY
    row = session.get(BillingYear, (contract_id, year))
    state = year_state(start, end, now, row is not None)
    closed_at = row.closed_at.astimezone(UTC) if row is not None else None
    if row is not None and closed_at is not None:
        note = (
            f"closed {_when(closed_at)}: the guarantee was met, no credit is due"
            if row.guarantee_met
            else f"closed {_when(closed_at)}: the guarantee was missed and the credit was "
            "issued then"
        )
    elif state in ("open", "not_started"):
        note = (
            (f"the year starts {_when(start)} and ends {_when(end)}"
             if state == "not_started" else f"the year ends {_when(end)}")
            + f"; it is closed automatically by {_when(closes_by)}, "
            "and if the guarantee was missed the renewal credit is issued then, "
            "without any claim"
        )
    else:
        note = (
            f"the year ended {_when(end)} and is being closed automatically (by "
            f"{_when(max(closes_by, now))}); if the guarantee was missed the renewal credit "
            "is issued then, without any claim"
        )
    return YearPhase(contract_id=contract_id, year=year, state=state, ends_at=end,
                     closes_by=closes_by, closed_at=closed_at,
                     label=year_state_label(state), credit_note=note)
