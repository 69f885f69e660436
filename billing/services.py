"""SLA figures of a contract year or month, loaded from the ledger's projections.

The database work is one query per record type over the period; the figures
themselves come from the pure functions of :mod:`billing.sla`.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import Text, and_, cast, or_, select
from sqlalchemy.orm import Session

from billing import sla
from billing.errors import PeriodOutOfRange
from billing.terms import Terms
from billing.years import contract_year_bounds, month_bounds, year_of
from ledger.contracts import get_contract
from ledger.models import Exclusion, Failure, JobSpan, Outcome
from ledger.records import ContractSpec


@dataclass(frozen=True, slots=True, kw_only=True)
class PeriodRecords:
    """The plain records a period's figures are computed from."""

    failures: list[sla.Failure]
    outcomes: list[sla.Outcome]
    exclusions: list[sla.Exclusion]
    jobs: list[sla.JobSpan]


@dataclass(frozen=True, slots=True, kw_only=True)
class SlaReport:
    """A contract, the period asked for, and its figures."""

    contract: ContractSpec
    terms: Terms
    year: int | None
    month: tuple[int, int] | None
    figures: sla.SlaFigures
    credit: dict[str, Any] | None = None

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
            "credit": self.credit,
        }


def terms_of(contract: ContractSpec) -> Terms:
    """The guarantee terms of ``contract`` as billing's value object."""
    record = contract.to_record()
    return Terms.from_json(record.get("terms"))


def current_year(contract: ContractSpec, now: datetime) -> int:
    """The contract year containing ``now``, clamped to the term (1 before the start)."""
    k = year_of(contract.start_date, contract.timezone, now)
    if k is None:
        return 1
    return min(k, contract.term_years)


def check_year(contract: ContractSpec, k: int) -> None:
    """Refuse a contract year outside 1..term_years."""
    if not 1 <= k <= contract.term_years:
        raise PeriodOutOfRange(
            f"year {k} is outside contract {contract.contract_id!r}'s term "
            f"(years 1 to {contract.term_years})"
        )


def _text(column: Any) -> Any:
    # UUIDs as text from the server: building uuid.UUID objects only to str() them
    # again was a third of the load time.
    return cast(column, Text)


def load_period(
    session: Session, contract_id: str, start: datetime, end: datetime
) -> PeriodRecords:
    """Failures of ``[start, end)`` with their outcomes and exclusions, and overlapping jobs."""
    frows = session.execute(
        select(
            Failure.event_id,
            Failure.seq,
            Failure.occurred_at,
            Failure.failure_class,
            Failure.cause,
            Failure.job_id,
        ).where(
            Failure.contract_id == contract_id,
            Failure.occurred_at >= start,
            Failure.occurred_at < end,
        )
    ).all()
    failures = [
        sla.Failure(
            event_id=str(r[0]),
            seq=r[1],
            occurred_at=r[2],
            failure_class=r[3],
            cause=r[4],
            job_id=r[5],
        )
        for r in frows
    ]
    in_period = and_(
        Failure.contract_id == contract_id,
        Failure.occurred_at >= start,
        Failure.occurred_at < end,
    )
    orows = session.execute(
        select(
            Outcome.event_id,
            Outcome.failure_event_id,
            Outcome.seq,
            Outcome.occurred_at,
            Outcome.outcome,
            Outcome.lost_steps,
            Outcome.recovery_seconds,
            Outcome.step_seconds,
            Outcome.gpus_affected,
        )
        .join(Failure, Failure.event_id == Outcome.failure_event_id)
        .where(in_period)
    ).all()
    outcomes = [
        sla.Outcome(
            event_id=str(r[0]),
            failure_event_id=str(r[1]),
            seq=r[2],
            occurred_at=r[3],
            outcome=r[4],
            lost_steps=r[5],
            recovery_seconds=r[6],
            step_seconds=r[7],
            gpus_affected=r[8],
        )
        for r in orows
    ]
    xrows = session.execute(
        select(
            Exclusion.event_id,
            Exclusion.failure_event_id,
            Exclusion.seq,
            Exclusion.occurred_at,
            Exclusion.reason,
        )
        .join(Failure, Failure.event_id == Exclusion.failure_event_id)
        .where(in_period)
    ).all()
    exclusions = [
        sla.Exclusion(
            event_id=str(r[0]), failure_event_id=str(r[1]), seq=r[2], occurred_at=r[3], reason=r[4]
        )
        for r in xrows
    ]
    jrows = session.execute(
        select(JobSpan.job_id, JobSpan.gpus, JobSpan.started_at, JobSpan.finished_at).where(
            JobSpan.contract_id == contract_id,
            JobSpan.started_at < end,
            or_(JobSpan.finished_at.is_(None), JobSpan.finished_at > start),
        )
    ).all()
    jobs = [sla.JobSpan(job_id=r[0], gpus=r[1], started_at=r[2], finished_at=r[3]) for r in jrows]
    return PeriodRecords(failures=failures, outcomes=outcomes, exclusions=exclusions, jobs=jobs)


def figures_for(
    session: Session,
    contract: ContractSpec,
    start: datetime,
    end: datetime,
    now: datetime,
) -> sla.SlaFigures:
    """The figures of ``contract`` over ``[start, end)`` as of ``now``."""
    recs = load_period(session, contract.contract_id, start, end)
    return sla.compute_figures(
        terms=terms_of(contract),
        period_start=start,
        period_end=end,
        now=now,
        failures=recs.failures,
        outcomes=recs.outcomes,
        exclusions=recs.exclusions,
        jobs=recs.jobs,
    )


def sla_figures(
    session: Session,
    contract_id: str,
    *,
    year: int | None = None,
    month: tuple[int, int] | None = None,
    now: datetime | None = None,
) -> SlaReport:
    """The figures of contract year ``year`` (default: the current one) or of ``month``.

    A month is a calendar month in the contract's time zone.  Raises
    :class:`~ledger.errors.UnknownContract` or :class:`PeriodOutOfRange`.
    """
    now = now or datetime.now(UTC)
    contract = get_contract(session, contract_id)
    terms = terms_of(contract)
    if month is not None:
        start, end = month_bounds(month[0], month[1], contract.timezone)
        k = year_of(contract.start_date, contract.timezone, start)
        first, _ = contract_year_bounds(contract.start_date, contract.timezone, 1)
        _, last = contract_year_bounds(contract.start_date, contract.timezone, contract.term_years)
        if end <= first or start >= last:
            raise PeriodOutOfRange(
                f"month {month[0]:04d}-{month[1]:02d} is outside contract {contract_id!r}'s "
                f"term ({first.date().isoformat()} to {last.date().isoformat()})"
            )
    else:
        k = current_year(contract, now) if year is None else year
        check_year(contract, k)
        start, end = contract_year_bounds(contract.start_date, contract.timezone, k)
    figures = figures_for(session, contract, start, end, now)
    return SlaReport(contract=contract, terms=terms, year=k, month=month, figures=figures)
