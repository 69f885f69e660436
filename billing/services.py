"""SLA figures of a contract year or month, and the credit status of a year.

Figures are computed in the database: one aggregate query over the period's
failures (each with its latest outcome, its latest reclassification and whether
an exclusion names it) grouped by class and status, plus the job spans.  The
totals go through :func:`billing.sla.figures_from_totals`, the same formulas as
the pure :func:`billing.sla.compute_figures` (a test cross-checks the two on
randomized data).  :func:`load_period` still returns the plain records, for
reports that list failures.

Read-only services for other packages: :func:`sla_figures`, :func:`credit_status`,
:func:`year_status`, :func:`credits_of`.  Services never commit.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

from sqlalchemy import bindparam, select, text, tuple_
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.orm import Session
from sqlalchemy.types import Text

from billing import sla
from billing.amendments import InForce, contract_in_force
from billing.errors import PeriodOutOfRange
from billing.models import BillingYear, Credit, CreditApplication
from billing.money import format_minor
from billing.terms import Terms
from billing.verdict import Verdict
from billing.verdict import verdict as judge
from billing.years import contract_year_bounds, month_bounds, year_of
from ledger.contracts import get_contract
from ledger.records import ContractSpec

__all__ = [
    "PeriodRecords",
    "SlaReport",
    "check_year",
    "credit_json",
    "credit_status",
    "credits_of",
    "current_year",
    "figures_for",
    "load_period",
    "sla_figures",
    "terms_of",
    "year_status",
]


@dataclass(frozen=True, slots=True, kw_only=True)
class PeriodRecords:
    """The plain records a period's figures are computed from."""

    failures: list[sla.Failure]
    outcomes: list[sla.Outcome]
    exclusions: list[sla.Exclusion]
    jobs: list[sla.JobSpan]


@dataclass(frozen=True, slots=True, kw_only=True)
class SlaReport:
    """A contract (as amended for the period), the period asked for, and its figures.

    ``credit`` is None, or the year's credit as ``{amount, minor_units, currency,
    status, credit_note}`` (see :func:`credit_status`); it is only filled for years.
    """

    contract: ContractSpec
    terms: Terms
    year: int | None
    month: tuple[int, int] | None
    figures: sla.SlaFigures
    credit: dict[str, Any] | None = None
    #: Set for the year to date as of an instant (``yoco sla --as-of``).
    as_of: datetime | None = None

    def verdict(self) -> Verdict:
        """Where the guarantee stands for this period (:func:`billing.verdict.verdict`).

        The period is *closed* once its figures are computed at or after its end; the
        year to date ``as_of`` an instant is closed only when the instant ends the year.
        """
        f = self.figures
        end = f.period_end
        if self.as_of is not None and self.year is not None:
            _, end = contract_year_bounds(self.contract.start_date, self.contract.timezone,
                                          self.year)
        return judge(f.resolved_failures, f.covered_failures, f.threshold_percent, f.now >= end)

    def to_json(self) -> dict[str, Any]:
        """The ``yoco sla --json`` object (DESIGN section 4 fields, and a few more)."""
        body = self.figures.to_json()
        return {
            "contract_id": self.contract.contract_id,
            "customer": self.contract.customer,
            "year": self.year,
            "month": f"{self.month[0]:04d}-{self.month[1]:02d}" if self.month else None,
            "timezone": self.contract.timezone,
            **body,
            "credit_percent": format(self.terms.credit_percent, "f"),
            "computed_at": self.figures.now.astimezone(UTC).isoformat(),
            "standing": self.verdict().standing.value,
            "credit": self.credit,
        } | ({"as_of": self.as_of.astimezone(UTC).isoformat()} if self.as_of else {})


def terms_of(contract: ContractSpec) -> Terms:
    """The guarantee terms of ``contract`` (as recorded, without amendments)."""
    record = contract.to_record()
    return Terms.from_json(record.get("terms"))


def current_year(contract: ContractSpec, now: datetime) -> int:
    """The contract year containing ``now``, clamped to the term (1 before the start)."""
    k = year_of(contract.start_date, contract.timezone, now)
    if k is None:
        return 1
    return min(k, contract.term_years)


def check_year(contract: ContractSpec, k: int) -> None:
    """Refuse a contract year outside 1..term_years (:class:`PeriodOutOfRange`)."""
    if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= contract.term_years:
        raise PeriodOutOfRange(
            f"year: {k!r} is outside the term of contract {contract.contract_id!r} "
            f"(years 1 to {contract.term_years})"
        )


# --------------------------------------------------------------------------- loading

# The failures of the period with their class and cause as (latest) reclassified.
_FAILURES_CTE = """
r AS (
    SELECT DISTINCT ON (rc.failure_event_id) rc.failure_event_id, rc.failure_class, rc.cause
    FROM billing_reclassifications rc
    WHERE rc.contract_id = :cid
    ORDER BY rc.failure_event_id, rc.occurred_at DESC, rc.seq DESC, rc.event_id DESC
),
f AS (
    SELECT fl.event_id, fl.seq, fl.occurred_at, fl.job_id,
           COALESCE(r.failure_class, fl.failure_class) AS failure_class,
           COALESCE(r.cause, fl.cause) AS cause
    FROM failures fl
    LEFT JOIN r ON r.failure_event_id = fl.event_id
    WHERE fl.contract_id = :cid AND fl.occurred_at >= :start AND fl.occurred_at < :end
)"""

# Latest outcome per failure: greatest occurred_at, then seq, then event id (the tie
# rule of billing.sla.latest_outcomes; uuid order is the order of their text form).
_AGGREGATE_SQL = text(
    "WITH"
    + _FAILURES_CTE
    + """,
o AS (
    SELECT DISTINCT ON (oc.failure_event_id)
           oc.failure_event_id, oc.outcome, oc.lost_steps,
           oc.gpus_affected * (oc.recovery_seconds + oc.lost_steps * oc.step_seconds) AS lost
    FROM outcomes oc JOIN f ON f.event_id = oc.failure_event_id
    ORDER BY oc.failure_event_id, oc.occurred_at DESC, oc.seq DESC, oc.event_id DESC
)
SELECT f.failure_class,
       CASE
           WHEN NOT (f.failure_class = ANY(:covered)) THEN 'not_covered'
           WHEN f.cause = ANY(:excluded)
                OR EXISTS (SELECT 1 FROM exclusions x WHERE x.failure_event_id = f.event_id)
               THEN 'excluded'
           WHEN o.outcome IS NULL THEN 'pending'
           WHEN o.outcome = 'live_migrated' AND o.lost_steps = 0 THEN 'resolved'
           WHEN o.outcome = 'rolled_back' THEN 'rolled_back'
           ELSE 'failed'
       END AS status,
       count(*) AS n,
       COALESCE(sum(o.lost), 0) AS lost
FROM f LEFT JOIN o ON o.failure_event_id = f.event_id
GROUP BY 1, 2
"""
).bindparams(
    bindparam("covered", type_=ARRAY(Text)),
    bindparam("excluded", type_=ARRAY(Text)),
)

_FAILURES_SQL = text(
    "WITH" + _FAILURES_CTE + " SELECT f.event_id::text, f.seq, f.occurred_at, f.failure_class, "
    "f.cause, f.job_id FROM f"
)
_OUTCOMES_SQL = text(
    "WITH"
    + _FAILURES_CTE
    + " SELECT oc.event_id::text, oc.failure_event_id::text, oc.seq, oc.occurred_at, "
    "oc.outcome, oc.lost_steps, oc.recovery_seconds, oc.step_seconds, oc.gpus_affected "
    "FROM outcomes oc JOIN f ON f.event_id = oc.failure_event_id"
)
_EXCLUSIONS_SQL = text(
    "WITH"
    + _FAILURES_CTE
    + " SELECT x.event_id::text, x.failure_event_id::text, x.seq, x.occurred_at, x.reason "
    "FROM exclusions x JOIN f ON f.event_id = x.failure_event_id"
)
_JOBS_SQL = text(
    "SELECT job_id, gpus, started_at, finished_at FROM job_spans "
    "WHERE contract_id = :cid AND started_at < :end "
    "AND (finished_at IS NULL OR finished_at > :start)"
)


def outcome_from_row(r: Sequence[Any]) -> sla.Outcome:
    """An outcome from a row of (event id, failure event id, seq, occurred_at, outcome,
    lost steps, recovery seconds, step seconds, GPUs affected), ids as text."""
    return sla.Outcome(
        event_id=r[0],
        failure_event_id=r[1],
        seq=r[2],
        occurred_at=r[3],
        outcome=r[4],
        lost_steps=r[5],
        recovery_seconds=r[6],
        step_seconds=r[7],
        gpus_affected=r[8],
    )


def exclusion_from_row(r: Sequence[Any]) -> sla.Exclusion:
    """An exclusion from a row starting (event id, failure event id, seq, occurred_at,
    reason), ids as text; further columns are ignored."""
    return sla.Exclusion(
        event_id=r[0], failure_event_id=r[1], seq=r[2], occurred_at=r[3], reason=r[4]
    )


def load_period(
    session: Session, contract_id: str, start: datetime, end: datetime
) -> PeriodRecords:
    """Failures of ``[start, end)`` with their outcomes and exclusions, and overlapping jobs.

    A failure's class and cause are those of its latest reclassification, if any
    (disputes resolved by reclassification); ids are returned as text.
    """
    params = {"cid": contract_id, "start": start, "end": end}
    failures = [
        sla.Failure(
            event_id=r[0], seq=r[1], occurred_at=r[2], failure_class=r[3], cause=r[4], job_id=r[5]
        )
        for r in session.execute(_FAILURES_SQL, params)
    ]
    outcomes = [outcome_from_row(r) for r in session.execute(_OUTCOMES_SQL, params)]
    exclusions = [exclusion_from_row(r) for r in session.execute(_EXCLUSIONS_SQL, params)]
    jobs = [
        sla.JobSpan(job_id=r[0], gpus=r[1], started_at=r[2], finished_at=r[3])
        for r in session.execute(_JOBS_SQL, params)
    ]
    return PeriodRecords(failures=failures, outcomes=outcomes, exclusions=exclusions, jobs=jobs)


# Allocated GPU-seconds, exact: EXTRACT(EPOCH FROM interval) is numeric (microseconds).
_ALLOCATED_SQL = text(
    "SELECT COALESCE(sum(gpus * EXTRACT(EPOCH FROM hi - lo)), 0) FROM ("
    "  SELECT gpus, GREATEST(started_at, :start) AS lo,"
    "         LEAST(COALESCE(finished_at, :stop), :stop) AS hi"
    "  FROM job_spans"
    "  WHERE contract_id = :cid AND started_at < :stop"
    "    AND (finished_at IS NULL OR finished_at > :start)"
    ") spans WHERE hi > lo"
)


def _allocated(
    session: Session, contract_id: str, start: datetime, end: datetime, now: datetime
) -> Decimal:
    stop = min(end, now)
    if stop <= start:
        return Decimal(0)
    total = session.execute(
        _ALLOCATED_SQL, {"cid": contract_id, "start": start, "stop": stop}
    ).scalar_one()
    micros = int(Decimal(total) * 1_000_000)  # exact: intervals have microsecond precision
    return Decimal(f"{micros}E-6") if micros else Decimal(0)


def figures_for(
    session: Session,
    contract: ContractSpec,
    start: datetime,
    end: datetime,
    now: datetime,
    terms: Terms | None = None,
) -> sla.SlaFigures:
    """The figures of ``contract`` over ``[start, end)`` as of ``now`` (one SQL aggregate).

    ``terms`` default to the contract's recorded terms.  Promises: equal to
    ``sla.compute_figures`` over :func:`load_period`'s records with the same terms.
    """
    terms = terms if terms is not None else terms_of(contract)
    if end <= start:
        raise ValueError(
            f"period_end {end.isoformat()} must be after period_start {start.isoformat()}"
        )
    counts: dict[str, int] = {}
    lost: dict[str, Decimal] = {}
    for cls, status, n, lost_s in session.execute(
        _AGGREGATE_SQL,
        {
            "cid": contract.contract_id,
            "start": start,
            "end": end,
            "covered": sorted(terms.covered_classes),
            "excluded": sorted(terms.excluded_causes),
        },
    ):
        counts[status] = counts.get(status, 0) + int(n)
        lost[cls] = lost.get(cls, Decimal(0)) + Decimal(lost_s)
    return sla.figures_from_totals(
        terms=terms,
        period_start=start,
        period_end=end,
        now=now,
        counts=counts,
        lost_by_class=lost,
        allocated=_allocated(session, contract.contract_id, start, end, now),
    )


# --------------------------------------------------------------------------- figures


def sla_figures(
    session: Session,
    contract_id: str,
    *,
    year: int | None = None,
    month: tuple[int, int] | None = None,
    now: datetime | None = None,
    as_of: datetime | None = None,
) -> SlaReport:
    """The figures of contract year ``year`` (default: the current one) or of ``month``,
    or of the year to date ``as_of`` an instant.

    A month is a calendar month in the contract's time zone.  The contract and terms
    are those in force at the start of the year (of the year containing the month's
    first day), after amendments; a renewal extends the range of valid years.
    ``as_of``: the contract year that the instant ends or falls in (the year ``k`` with
    ``start < as_of <= end``), from its start to ``as_of`` and computed at ``as_of`` (at
    ``now`` if that is earlier): the year-to-date column of a monthly report.
    ``credit`` is filled for years (:func:`credit_status`, short form).  Raises
    :class:`~ledger.errors.UnknownContract`, :class:`PeriodOutOfRange`, or ValueError for
    a naive ``as_of`` or more than one of ``year``, ``month``, ``as_of``.
    """
    now = now or datetime.now(UTC)
    if sum(x is not None for x in (year, month, as_of)) > 1:
        raise ValueError("give one of year, month or as_of")
    base = contract_in_force(session, contract_id, 1)
    contract = base.contract
    credit: dict[str, Any] | None = None
    if as_of is not None:
        if as_of.tzinfo is None or as_of.utcoffset() is None:
            raise ValueError(f"as_of: a time needs a UTC offset, got {as_of.isoformat()}")
        k_of = year_of(contract.start_date, contract.timezone, as_of - timedelta(microseconds=1))
        first, _ = contract_year_bounds(contract.start_date, contract.timezone, 1)
        if k_of is None or as_of <= first:
            raise PeriodOutOfRange(
                f"as_of: {as_of.isoformat()} is not after contract {contract_id!r}'s start "
                f"({first.isoformat()})"
            )
        check_year(base.contract, k_of)
        start, _end = contract_year_bounds(contract.start_date, contract.timezone, k_of)
        in_force = _in_force(session, contract_id, k_of, base)
        figures = figures_for(
            session, in_force.contract, start, as_of, min(now, as_of), in_force.terms
        )
        return SlaReport(
            contract=in_force.contract,
            terms=in_force.terms,
            year=k_of,
            month=None,
            figures=figures,
            credit=None,
            as_of=as_of,
        )
    if month is not None:
        start, end = month_bounds(month[0], month[1], contract.timezone)
        k = year_of(contract.start_date, contract.timezone, start)
        first, _ = contract_year_bounds(contract.start_date, contract.timezone, 1)
        _, last = contract_year_bounds(contract.start_date, contract.timezone, base.term_years)
        if end <= first or start >= last:
            raise PeriodOutOfRange(
                f"month {month[0]:04d}-{month[1]:02d} is outside the term of contract "
                f"{contract_id!r} ({first.date().isoformat()} to {last.date().isoformat()})"
            )
        in_force = _in_force(session, contract_id, k or 1, base)
    else:
        k = current_year(contract, now) if year is None else year
        check_year(contract, k)
        start, end = contract_year_bounds(contract.start_date, contract.timezone, k)
        in_force = _in_force(session, contract_id, k, base)
        status = credit_status(session, contract_id, k)
        if status is not None:
            credit = {
                key: status[key]
                for key in ("amount", "minor_units", "currency", "status", "credit_note")
            }
    figures = figures_for(session, in_force.contract, start, end, now, in_force.terms)
    return SlaReport(
        contract=in_force.contract,
        terms=in_force.terms,
        year=k,
        month=month,
        figures=figures,
        credit=credit,
    )


def _in_force(session: Session, contract_id: str, k: int, base: InForce) -> InForce:
    return base if k == 1 else contract_in_force(session, contract_id, k)


# --------------------------------------------------------------------------- credits


def credit_json(c: Credit) -> dict[str, Any]:
    """A credit row as plain JSON: money as decimal strings at the currency's exponent
    and as integer minor units, times as ISO 8601 UTC."""
    remaining = 0 if c.status == "void" else c.amount_minor - c.applied_minor
    return {
        "credit_id": str(c.credit_id),
        "credit_note": c.credit_note,
        "contract_id": c.contract_id,
        "year": c.year,
        "status": c.status,
        "currency": c.currency,
        "amount": format_minor(c.amount_minor, c.currency),
        "minor_units": c.amount_minor,
        "base_amount": format_minor(c.base_minor, c.currency),
        "credit_percent": format(c.credit_percent, "f"),
        "applied_amount": format_minor(c.applied_minor, c.currency),
        "applied_minor_units": c.applied_minor,
        "remaining_amount": format_minor(remaining, c.currency),
        "remaining_minor_units": remaining,
        "issued_at": c.issued_at.astimezone(UTC).isoformat(),
        "voided_at": c.voided_at.astimezone(UTC).isoformat() if c.voided_at else None,
        "period_start": c.period_start.astimezone(UTC).isoformat(),
        "period_end": c.period_end.astimezone(UTC).isoformat(),
    }


def credit_status(
    session: Session, contract_id: str, year: int, *, tree_size: int | None = None
) -> dict[str, Any] | None:
    """The credit of contract year ``year``, or None when none was ever issued for it.

    Returns the live credit (issued, partially_applied or applied) when there is one,
    else the latest void one, as :func:`credit_json`: ``credit_id``, ``credit_note``
    (``CN-<contract>-Y<k>``), ``status``, ``currency``, ``amount`` (decimal string at the
    currency's exponent), ``minor_units``, ``applied_amount`` / ``applied_minor_units``,
    ``remaining_amount`` / ``remaining_minor_units`` (0 when void), ``issued_at``,
    ``voided_at``, …  With ``tree_size``, the credit as the first ``tree_size`` entries
    of the contract's log left it (credits, voids and applications recorded later are
    ignored), so a report over a signed checkpoint never changes.  Raises
    :class:`~ledger.errors.UnknownContract` for an unknown contract.  Read-only.
    """
    query = select(Credit).where(Credit.contract_id == contract_id, Credit.year == year)
    if tree_size is not None:
        query = query.where(Credit.seq < tree_size)
    rows = list(session.execute(query.order_by(Credit.seq.desc())).scalars())
    if not rows:
        get_contract(session, contract_id)
        return None
    if tree_size is None:
        live = [c for c in rows if c.status != "void"]
        return credit_json(live[0] if live else rows[0])
    views = [_credit_at(session, c, tree_size) for c in rows]
    live_views = [v for v in views if v["status"] != "void"]
    return live_views[0] if live_views else views[0]


def _credit_at(session: Session, c: Credit, tree_size: int) -> dict[str, Any]:
    """:func:`credit_json` of ``c`` as of the first ``tree_size`` entries of its log."""
    from sqlalchemy import func

    from ledger.models import JournalEntry

    view = credit_json(c)
    voided = False
    if c.void_event_id is not None:
        void_seq = session.execute(
            select(JournalEntry.seq).where(JournalEntry.event_id == c.void_event_id)
        ).scalar_one_or_none()
        voided = void_seq is not None and void_seq < tree_size
    applied = int(
        session.execute(
            select(func.coalesce(func.sum(CreditApplication.amount_minor), 0)).where(
                CreditApplication.credit_id == c.credit_id,
                CreditApplication.seq < tree_size,
            )
        ).scalar_one()
    )
    if voided:
        status = "void"
    elif applied == 0:
        status = "issued"
    elif applied >= c.amount_minor:
        status = "applied"
    else:
        status = "partially_applied"
    remaining = 0 if voided else c.amount_minor - applied
    view.update(
        status=status,
        applied_amount=format_minor(applied, c.currency),
        applied_minor_units=applied,
        remaining_amount=format_minor(remaining, c.currency),
        remaining_minor_units=remaining,
        voided_at=view["voided_at"] if voided else None,
    )
    return view


def credits_of(session: Session, contract_id: str) -> list[dict[str, Any]]:
    """Every credit of ``contract_id`` (void ones too), by year then issue order."""
    get_contract(session, contract_id)
    return [
        credit_json(c)
        for c in session.execute(
            select(Credit)
            .where(Credit.contract_id == contract_id)
            .order_by(Credit.year, Credit.seq)
        ).scalars()
    ]


def year_status(session: Session, contract_id: str, year: int) -> dict[str, Any] | None:
    """Whether contract year ``year`` is closed; None when it is not.

    Returns ``{closed: True, closed_at, close_event_id, last_event_id, guarantee_met``
    (the latest verdict) ``, adjustments, pending_adjustment}``; ``pending_adjustment`` is
    True when a late record or a resolved dispute arrived after the latest close or
    adjustment (``yoco billing close-year`` run again adjusts it).
    """
    row = session.get(BillingYear, (contract_id, year))
    if row is None:
        return None
    return {
        "closed": True,
        "closed_at": row.closed_at.astimezone(UTC).isoformat(),
        "close_event_id": str(row.close_event_id),
        "last_event_id": str(row.last_event_id),
        "guarantee_met": row.guarantee_met,
        "adjustments": row.adjustments,
        "pending_adjustment": row.pending_seq is not None,
    }


def credits_newest_first(
    session: Session,
    contract_ids: Collection[str] | None,
    *,
    before: tuple[datetime, str, int] | None = None,
    limit: int | None = None,
) -> list[Credit]:
    """The credits of ``contract_ids`` (None: of every contract the session may see;
    row-level security scopes a portal session to its tenant), newest first.

    The order is ``(issued_at, contract_id, seq)`` descending, a total order (``seq`` is
    unique in a contract's log); ``before`` keeps the credits after that key in it, and
    ``limit`` the first ones (a page of keyset pagination).
    """
    q = select(Credit).order_by(
        Credit.issued_at.desc(), Credit.contract_id.desc(), Credit.seq.desc()
    )
    if contract_ids is not None:
        q = q.where(Credit.contract_id.in_(list(contract_ids)))
    if before is not None:
        q = q.where(tuple_(Credit.issued_at, Credit.contract_id, Credit.seq) < before)
    if limit is not None:
        q = q.limit(limit)
    return list(session.execute(q).scalars())


def closed_years(session: Session, contract_id: str) -> list[BillingYear]:
    """The closed years of contract ``contract_id`` (each with its latest verdict and
    adjustment state), in no particular order."""
    return list(
        session.execute(
            select(BillingYear).where(BillingYear.contract_id == contract_id)
        ).scalars()
    )
