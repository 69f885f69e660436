"""The detector: one run looks at the ledger and billing and raises what is new.

It runs where close-due runs — in ``yoco serve``'s scheduler thread after each close-due
run, and from cron with ``yoco billing close-due`` or ``yoco alerts run`` — and like
:func:`billing.schedule.close_due_run` it is safe from several places at once, twice
over: a run holds a transaction-scoped advisory lock (:data:`DETECT_LOCK`; a run that
cannot get it does nothing), and every event's key is unique in ``alert_events``.

What it raises (docs/alerts.md):

* ``year_at_risk`` / ``year_below`` — an open contract year (started, not ended, not
  closed) whose standing, by :func:`billing.verdict.verdict` on ``yoco sla``'s figures,
  worsened to *at risk* (one more unresolved covered failure would break the guarantee)
  or to *below so far*. The last standing seen is kept per year; the key counts the
  worsenings (``year_at_risk:C-1:1:1``), so a year that recovers and turns at risk again
  is alerted again, and the same turn only once.
* ``year_missed`` — a closed year whose (latest) close or adjustment missed the
  guarantee; keyed by that ledger entry.
* ``credit_issued`` — every renewal credit, keyed by its id.
* ``checkpoint_stale`` — a ledger log with entries not under any signed checkpoint,
  whose newest checkpoint (or, with none, the log itself) is older than the configured
  age; keyed by the checkpoint's tree size, so each stale head is alerted once.
* ``report_issued`` — with ``report_emails`` on (``YOCO_ALERTS_REPORT_EMAILS``): every
  issued report (a ``report`` entry: a monthly report or a year-end statement), keyed by
  the entry's event id; opt-in, so only the contract's subscribers (destinations that
  name the kind) get it, by e-mail with the issued PDF and HTML attached.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

from sqlalchemy import func, select, text
from sqlalchemy.orm import Session

from alerts.config import AlertsConfig
from alerts.events import NewEvent, raise_event
from alerts.models import AlertYearStanding
from billing.amendments import contract_in_force
from billing.models import BillingYear, Close, Credit
from billing.money import format_minor, format_money
from billing.services import sla_figures
from billing.verdict import Standing, Verdict, format_number
from billing.years import contract_year_bounds, require_aware
from ledger.contracts import list_contracts
from ledger.models import Checkpoint, LedgerLog

__all__ = ["DETECT_LOCK", "DetectRun", "detect_run", "standing_level"]

#: Key of the advisory lock a detector run holds for its transaction ("yocoalrt").
DETECT_LOCK = 0x796F636F616C7274

#: How bad a standing is: an event is raised when a year's level goes up.
_LEVELS = {
    Standing.NO_COVERED: 0,
    Standing.ON_TRACK: 0,
    Standing.MET: 0,
    Standing.AT_RISK: 1,
    Standing.BELOW: 2,
    Standing.MISSED: 2,
}


def standing_level(standing: Standing | str) -> int:
    """0 (fine), 1 (at risk) or 2 (below the guarantee) for a :class:`Standing`."""
    return _LEVELS[Standing(standing)]


@dataclass(frozen=True, slots=True, kw_only=True)
class DetectRun:
    """One detector run: ``ran`` is False when another run held the lock (nothing done);
    ``raised`` holds the keys of the events this run stored (new ones only)."""

    ran: bool
    now: datetime
    raised: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        """Plain JSON: ``ran``, ``now`` and the keys raised."""
        return {"ran": self.ran, "now": self.now.astimezone(UTC).isoformat(),
                "raised": list(self.raised)}


def detect_run(
    session: Session,
    *,
    now: datetime | None = None,
    config: AlertsConfig | None = None,
    wait: bool = False,
) -> DetectRun:
    """Raise every event that is due at ``now`` (once per key), unless another run is at it.

    Takes :data:`DETECT_LOCK` for the transaction (``wait``: wait for it; otherwise return
    ``DetectRun(ran=False)`` at once when another run holds it). Never commits.
    """
    now = require_aware("now", now) if now is not None else datetime.now(UTC)
    config = config or AlertsConfig()
    if wait:
        session.execute(select(func.pg_advisory_xact_lock(DETECT_LOCK)))
    elif not session.execute(select(func.pg_try_advisory_xact_lock(DETECT_LOCK))).scalar_one():
        return DetectRun(ran=False, now=now)
    events: list[NewEvent] = []
    events += _standings(session, now)
    events += _missed(session)
    events += _credits(session)
    events += _stale_checkpoints(session, now, config)
    if config.report_emails:
        events += _reports_issued(session)
    raised = [e.key for e in events if raise_event(session, e) is not None]
    return DetectRun(ran=True, now=now, raised=raised)


def _figures_json(v: Verdict) -> dict[str, Any]:
    return {
        "standing": v.standing.value,
        "resolved_failures": v.resolved,
        "covered_failures": v.covered,
        "threshold_percent": format(v.threshold_percent, "f"),
        "resolution_rate": v.rate,
        "sentence": v.sentence,
    }


def _standings(session: Session, now: datetime) -> list[NewEvent]:
    closed = {(c, y) for c, y in session.execute(select(BillingYear.contract_id,
                                                        BillingYear.year))}
    seen = {
        (r.contract_id, r.year): r
        for r in session.execute(select(AlertYearStanding).with_for_update()).scalars()
    }
    out: list[NewEvent] = []
    for c in list_contracts(session):
        base = contract_in_force(session, c.contract_id, 1)
        for k in range(1, base.term_years + 1):
            start, end = contract_year_bounds(base.contract.start_date,
                                              base.contract.timezone, k)
            if start > now:
                break
            if end <= now or (c.contract_id, k) in closed:
                continue  # ended: the close (year_missed) speaks for it
            report = sla_figures(session, c.contract_id, year=k, now=now)
            v = report.verdict()
            level = standing_level(v.standing)
            row = seen.get((c.contract_id, k))
            if row is None:
                row = AlertYearStanding(contract_id=c.contract_id, year=k,
                                        standing=v.standing.value, escalations=0)
                session.add(row)
                before = 0
            else:
                before = standing_level(row.standing)
            if level > before:
                row.escalations = (row.escalations or 0) + 1
                kind = "year_at_risk" if v.standing is Standing.AT_RISK else "year_below"
                out.append(NewEvent(
                    kind=kind,
                    key=f"{kind}:{c.contract_id}:{k}:{row.escalations}",
                    occurred_at=now,
                    contract_id=c.contract_id,
                    year=k,
                    subject=f"{c.contract_id} year {k}: {v.headline.lower()} — {v.sentence}",
                    data={
                        "contract_id": c.contract_id,
                        "customer": c.customer,
                        "year": k,
                        "period_start": start.isoformat(),
                        "period_end": end.isoformat(),
                        "previous_standing": None if row.standing == v.standing.value
                        else row.standing,
                        **_figures_json(v),
                    },
                ))
            if row.standing != v.standing.value:
                row.standing = v.standing.value
                row.updated_at = now
    session.flush()
    return out


def _missed(session: Session) -> list[NewEvent]:
    rows = session.execute(
        select(BillingYear, Close)
        .join(Close, Close.event_id == BillingYear.last_event_id)
        .where(BillingYear.guarantee_met.is_(False))
        .order_by(BillingYear.contract_id, BillingYear.year)
    ).all()
    out = []
    for year, close in rows:
        rate_text = (
            f"{format_number(close.resolved_failures)} of "
            f"{format_number(close.covered_failures)} covered failures resolved"
        )
        out.append(NewEvent(
            kind="year_missed",
            key=f"year_missed:{year.contract_id}:{year.year}:{year.last_event_id}",
            occurred_at=close.occurred_at,
            contract_id=year.contract_id,
            year=year.year,
            subject=f"{year.contract_id} year {year.year}: guarantee missed — {rate_text} "
                    f"(threshold {_plain(close.threshold_percent)} %)",
            data={
                "contract_id": year.contract_id,
                "year": year.year,
                "close_event_id": str(year.last_event_id),
                "close_kind": close.kind,
                "closed_at": close.occurred_at.astimezone(UTC).isoformat(),
                "covered_failures": close.covered_failures,
                "resolved_failures": close.resolved_failures,
                "threshold_percent": _plain(close.threshold_percent),
                "tree_size": close.tree_size,
            },
        ))
    return out


def _credits(session: Session) -> list[NewEvent]:
    out = []
    for c in session.execute(select(Credit).order_by(Credit.issued_at, Credit.credit_id)).scalars():
        amount = format_minor(c.amount_minor, c.currency)
        out.append(NewEvent(
            kind="credit_issued",
            key=f"credit_issued:{c.credit_id}",
            occurred_at=c.issued_at,
            contract_id=c.contract_id,
            year=c.year,
            subject=f"{c.contract_id} year {c.year}: credit {c.credit_note} of "
                    f"{format_money(c.amount_minor, c.currency, minor=True)} issued",
            data={
                "contract_id": c.contract_id,
                "year": c.year,
                "credit_id": str(c.credit_id),
                "credit_note": c.credit_note,
                "amount": amount,
                "amount_minor": c.amount_minor,
                "currency": c.currency,
                "issued_at": c.issued_at.astimezone(UTC).isoformat(),
            },
        ))
    return out


#: ``report`` entries not raised yet as ``report_issued`` (the events' unique key index
#: makes the anti-join cheap however many reports were issued before).
_UNRAISED_REPORTS = text(
    "SELECT e.log_id, e.seq, e.event_id, e.occurred_at, e.body FROM journal_entries AS e "
    "WHERE e.kind = 'report' AND NOT EXISTS (SELECT 1 FROM alert_events AS a "
    "  WHERE a.key = 'report_issued:' || e.event_id::text) "
    "ORDER BY e.occurred_at, e.log_id, e.seq"
)
#: What each kind of issued document is called in an e-mail's subject.
_DOCUMENT_WORDS = {"monthly-sla": "monthly SLA report", "year-statement": "year-end statement"}


def _reports_issued(session: Session) -> list[NewEvent]:
    out = []
    for log_id, seq, event_id, occurred_at, body in session.execute(_UNRAISED_REPORTS):
        document = str(body.get("report", ""))
        if "month" in body:
            period = str(body["month"])
        elif "year" in body:
            period = f"year-{body['year']}"
        else:  # a report entry of a shape this version does not issue: nothing to send
            continue
        size = body.get("checkpoint_tree_size")
        words = _DOCUMENT_WORDS.get(document, document)
        out.append(NewEvent(
            kind="report_issued",
            key=f"report_issued:{event_id}",
            occurred_at=occurred_at,
            contract_id=log_id,
            year=int(body["year"]) if "year" in body else None,
            subject=f"{log_id}: {words} {period} issued over checkpoint {size}",
            data={
                "contract_id": log_id,
                "document": document,
                "period": period,
                "checkpoint_tree_size": size,
                "ledger_seq": seq,
                "report_event_id": str(event_id),
                "html_sha256": body.get("html_sha256"),
                "pdf_sha256": body.get("pdf_sha256"),
            },
        ))
    return out


def _stale_checkpoints(session: Session, now: datetime, config: AlertsConfig) -> list[NewEvent]:
    newest = (
        select(Checkpoint.log_id, func.max(Checkpoint.tree_size).label("tree_size"))
        .group_by(Checkpoint.log_id)
        .subquery()
    )
    rows = session.execute(
        select(LedgerLog.log_id, LedgerLog.size, LedgerLog.created_at,
               newest.c.tree_size, Checkpoint.signed_at)
        .outerjoin(newest, newest.c.log_id == LedgerLog.log_id)
        .outerjoin(Checkpoint, (Checkpoint.log_id == LedgerLog.log_id)
                   & (Checkpoint.tree_size == newest.c.tree_size))
        .where(LedgerLog.size > 0)
        .order_by(LedgerLog.log_id)
    ).all()
    contracts = {c.contract_id for c in list_contracts(session)}
    out = []
    for log_id, size, created_at, signed_size, signed_at in rows:
        signed_size = int(signed_size or 0)
        if signed_size >= size:
            continue  # everything is under a signed head: nothing waits to be signed
        since = signed_at if signed_at is not None else created_at
        age = now - since
        if age <= config.checkpoint_max_age:
            continue
        hours = Decimal(int(age.total_seconds())) / 3600
        out.append(NewEvent(
            kind="checkpoint_stale",
            key=f"checkpoint_stale:{log_id}:{signed_size}",
            occurred_at=since + config.checkpoint_max_age,
            contract_id=log_id if log_id in contracts else None,
            subject=f"ledger log {log_id}: {size - signed_size} entr"
                    f"{'y' if size - signed_size == 1 else 'ies'} not under a signed "
                    f"checkpoint for {hours:.1f} h (limit "
                    f"{config.checkpoint_max_age.total_seconds() / 3600:g} h); run "
                    "`yoco ledger checkpoint`",
            data={
                "log_id": log_id,
                "log_size": size,
                "signed_tree_size": signed_size,
                "signed_at": signed_at.astimezone(UTC).isoformat() if signed_at else None,
                "max_age_seconds": int(config.checkpoint_max_age.total_seconds()),
            },
        ))
    return out


def _plain(d: Decimal) -> str:
    s = format(d, "f")
    return s.rstrip("0").rstrip(".") if "." in s else s
