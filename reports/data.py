"""The records a report is computed from, as the ledger stood at one signed checkpoint.

A checkpoint of size N signs the log's entries ``0 .. N-1``.  Everything here is read
from the projections but restricted to entries with ``seq < N``: failures, outcomes and
exclusions by their own ``seq``, job spans by the ``seq`` of the entry that started them
and of the entry that finished them (a job whose ``job_finished`` came after the
checkpoint was still running as far as the checkpoint knows).  So the figures of a
report depend only on the signed tree, never on what was appended later.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Text, and_, cast, or_, select
from sqlalchemy.orm import Session, aliased

from billing import sla
from billing.services import PeriodRecords, exclusion_from_row, outcome_from_row
from ledger.models import Exclusion, Failure, JobSpan, JournalEntry, Outcome

__all__ = ["CheckpointRecords", "FailureDetail", "load_at_checkpoint"]


@dataclass(frozen=True, slots=True, kw_only=True)
class FailureDetail:
    """What the failures table shows beyond the figures' records: where it happened."""

    node: str | None
    gpu: int | None
    step: int | None
    detail: str | None


@dataclass(frozen=True, slots=True, kw_only=True)
class CheckpointRecords:
    """A period's records as of a checkpoint, plus per-failure details for the table.

    ``outcome_counts`` is how many outcome entries each failure has (more than one
    means a later outcome superseded an earlier one); ``approved_by`` is, per failure,
    who approved its latest exclusion; ``reclassified`` is, per failure whose class or
    cause a dispute corrected, its recorded ``(class, cause, reason)`` (the records
    carry the corrected ones, as billing's figures do).
    """

    records: PeriodRecords
    details: dict[str, FailureDetail]
    outcome_counts: dict[str, int]
    approved_by: dict[str, str]
    reclassified: dict[str, tuple[str, str, str]]


def load_at_checkpoint(
    session: Session, contract_id: str, start: datetime, end: datetime, tree_size: int
) -> CheckpointRecords:
    """Failures of ``[start, end)`` with their outcomes and exclusions, and overlapping job
    spans, counting only entries of the contract's log with ``seq < tree_size``.

    Promises the same records as :func:`billing.services.load_period` when ``tree_size``
    is the log's size (the checkpoint covers everything).
    """
    in_period = and_(
        Failure.contract_id == contract_id,
        Failure.occurred_at >= start,
        Failure.occurred_at < end,
        Failure.seq < tree_size,
    )
    frows = session.execute(
        select(
            cast(Failure.event_id, Text),
            Failure.seq,
            Failure.occurred_at,
            Failure.failure_class,
            Failure.cause,
            Failure.job_id,
            Failure.node,
            Failure.gpu,
            Failure.step,
            Failure.detail,
        ).where(in_period)
    ).all()
    corrections = _reclassifications(session, in_period, tree_size)
    failures: list[sla.Failure] = []
    details: dict[str, FailureDetail] = {}
    reclassified: dict[str, tuple[str, str, str]] = {}
    for r in frows:
        cls, cause = r[3], r[4]
        fix = corrections.get(r[0])
        if fix is not None and (fix[0], fix[1]) != (cls, cause):
            reclassified[r[0]] = (cls, cause, fix[2])
            cls, cause = fix[0], fix[1]
        failures.append(
            sla.Failure(
                event_id=r[0],
                seq=r[1],
                occurred_at=r[2],
                failure_class=cls,
                cause=cause,
                job_id=r[5],
            )
        )
        details[r[0]] = FailureDetail(node=r[6], gpu=r[7], step=r[8], detail=r[9])

    orows = session.execute(
        select(
            cast(Outcome.event_id, Text),
            cast(Outcome.failure_event_id, Text),
            Outcome.seq,
            Outcome.occurred_at,
            Outcome.outcome,
            Outcome.lost_steps,
            Outcome.recovery_seconds,
            Outcome.step_seconds,
            Outcome.gpus_affected,
        )
        .join(Failure, Failure.event_id == Outcome.failure_event_id)
        .where(in_period, Outcome.seq < tree_size)
    ).all()
    outcomes = [outcome_from_row(r) for r in orows]
    outcome_counts: dict[str, int] = {}
    for o in outcomes:
        outcome_counts[o.failure_event_id] = outcome_counts.get(o.failure_event_id, 0) + 1

    xrows = session.execute(
        select(
            cast(Exclusion.event_id, Text),
            cast(Exclusion.failure_event_id, Text),
            Exclusion.seq,
            Exclusion.occurred_at,
            Exclusion.reason,
            Exclusion.approved_by,
        )
        .join(Failure, Failure.event_id == Exclusion.failure_event_id)
        .where(in_period, Exclusion.seq < tree_size)
    ).all()
    exclusions = [exclusion_from_row(r) for r in xrows]
    latest_x = sla.latest_exclusions(exclusions)
    approved = {r[0]: r[5] for r in xrows}
    approved_by = {fid: approved[x.event_id] for fid, x in latest_x.items()}

    finish = aliased(JournalEntry)
    jrows = session.execute(
        select(JobSpan.job_id, JobSpan.gpus, JobSpan.started_at, JobSpan.finished_at, finish.seq)
        .outerjoin(finish, finish.event_id == JobSpan.finish_event_id)
        .where(
            JobSpan.contract_id == contract_id,
            JobSpan.start_seq < tree_size,
            JobSpan.started_at < end,
            or_(
                JobSpan.finished_at.is_(None),
                JobSpan.finished_at > start,
                finish.seq >= tree_size,
            ),
        )
    ).all()
    jobs = [
        sla.JobSpan(
            job_id=r[0],
            gpus=r[1],
            started_at=r[2],
            # A job_finished after the checkpoint: the checkpoint saw the job running.
            finished_at=r[3] if r[4] is not None and r[4] < tree_size else None,
        )
        for r in jrows
    ]
    return CheckpointRecords(
        records=PeriodRecords(
            failures=failures, outcomes=outcomes, exclusions=exclusions, jobs=jobs
        ),
        details=details,
        outcome_counts=outcome_counts,
        approved_by=approved_by,
        reclassified=reclassified,
    )


def _reclassifications(
    session: Session, in_period: Any, tree_size: int
) -> dict[str, tuple[str, str, str]]:
    """Per failure, its latest reclassification under the checkpoint: (class, cause, reason).

    Reclassifications are billing's (a dispute resolved by correcting a failure's class or
    cause).  Latest = greatest ``occurred_at``, then ``seq``, then event id, as billing
    orders them.
    """
    from billing.models import Reclassification

    rows = session.execute(
        select(
            cast(Reclassification.failure_event_id, Text),
            Reclassification.occurred_at,
            Reclassification.seq,
            cast(Reclassification.event_id, Text),
            Reclassification.failure_class,
            Reclassification.cause,
            Reclassification.reason,
        )
        .join(Failure, Failure.event_id == Reclassification.failure_event_id)
        .where(in_period, Reclassification.seq < tree_size)
    ).all()
    latest: dict[str, tuple[Any, ...]] = {}
    for r in rows:
        cur = latest.get(r[0])
        if cur is None or (r[1], r[2], r[3]) > (cur[1], cur[2], cur[3]):
            latest[r[0]] = tuple(r)
    return {fid: (r[4], r[5], r[6]) for fid, r in latest.items()}
