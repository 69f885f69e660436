"""The plausibility of outcomes against their failure's job, checked at ingest.

The rules are the record schema's (:func:`yoco_records.schema.implausible_outcome`,
stated once in docs/definitions.md, "Plausibility"); this module finds what they need,
which only the ledger knows: the failure's job, its GPUs (the job span that began
before the failure), the step it had reached (the failure's own ``step``, else the
job's latest ``job_progress`` or ``job_finished`` between the span's start and the
failure), the failure's time and the job's end (the span's ``job_finished``). Run
after the batch's entries are projected (a failure or a job in the same batch counts),
at ingest only: a journal replayed by ``yoco ledger verify`` is what was accepted then.

The recovery rule holds from both sides: an outcome whose recovery ends after its
job's end is refused (:func:`check_outcomes`), and so is a ``job_finished`` dated
before the end of a recovery already recorded in the span it closes
(:func:`check_job_ends`).

Cost: one query per batch with outcomes, and, for an outcome whose failure names no
step, one backward primary-key scan of the job's entries that stops at the first
progress entry before the failure; one query per batch with ``job_finished`` entries,
a range scan of the contract's failures from the job's start.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence

from sqlalchemy import text
from sqlalchemy.orm import Session

from ledger.projections import ProjectedEntry, ProjectionError
from yoco_records.schema import RECOVERY_SLACK, implausible_outcome, recovery_end

__all__ = ["check_job_ends", "check_outcomes"]

_FAILURE_JOBS = text(
    "SELECT f.event_id, f.contract_id, f.job_id, f.seq, f.step, s.gpus, s.start_seq, "
    "f.occurred_at, s.finished_at "
    "FROM failures AS f "
    "LEFT JOIN LATERAL (SELECT j.gpus, j.start_seq, j.finished_at FROM job_spans AS j "
    "  WHERE j.contract_id = f.contract_id AND j.job_id = f.job_id AND j.start_seq < f.seq "
    "  ORDER BY j.start_seq DESC LIMIT 1) AS s ON true "
    "WHERE f.event_id = ANY(:ids)"
)
_LATEST_STEP = text(
    "SELECT (e.body ->> 'step')::bigint FROM journal_entries AS e "
    "WHERE e.log_id = :log AND e.seq > :start AND e.seq < :seq "
    "AND e.kind IN ('job_progress', 'job_finished') AND e.body ->> 'job_id' = :job "
    "ORDER BY e.seq DESC LIMIT 1"
)


def check_outcomes(session: Session, entries: Sequence[ProjectedEntry]) -> list[ProjectionError]:
    """The outcomes among ``entries`` (already projected) that break a plausibility
    rule, one error per broken rule naming the field."""
    outcomes = [e for e in entries if e.kind == "outcome"]
    if not outcomes:
        return []
    ids = sorted({uuid.UUID(str(e.body["failure_event_id"])) for e in outcomes})
    jobs = {row[0]: row[1:] for row in session.execute(_FAILURE_JOBS, {"ids": ids})}
    reached: dict[uuid.UUID, int | None] = {}
    errors: list[ProjectionError] = []
    for e in outcomes:
        fid = uuid.UUID(str(e.body["failure_event_id"]))
        job = jobs.get(fid)
        if job is None:  # refused already as an unknown failure
            continue
        log_id, job_id, fseq, fstep, gpus, start_seq, failure_at, job_end = job
        if fid not in reached:
            reached[fid] = fstep if fstep is not None else (
                None if start_seq is None else session.execute(
                    _LATEST_STEP, {"log": log_id, "start": start_seq, "seq": fseq,
                                   "job": job_id}).scalar_one_or_none())
        for field, message in implausible_outcome(
            int(e.body["gpus_affected"]), int(e.body["lost_steps"]), job_gpus=gpus,
            reached_step=reached[fid], recovery_seconds=e.body["recovery_seconds"],
            failure_at=failure_at, reported_at=e.occurred_at, job_end=job_end,
        ):
            errors.append(ProjectionError(e.event_id, field, message))
    return errors


#: Outcomes already recorded (before the job_finished, not in this batch) of failures in
#: the span a job_finished closes, whose recovery ends after that job_finished.
_CUT_RECOVERIES = text(
    "SELECT f.event_id, f.occurred_at, o.recovery_seconds "
    "FROM job_spans AS s "
    "JOIN failures AS f ON f.contract_id = s.contract_id AND f.occurred_at >= s.started_at "
    "  AND f.job_id = s.job_id AND f.seq > s.start_seq AND f.seq < :seq "
    "JOIN outcomes AS o ON o.failure_event_id = f.event_id AND o.seq < :seq "
    "WHERE s.contract_id = :log AND s.job_id = :job AND s.finish_event_id = :eid "
    "  AND NOT (o.event_id = ANY(CAST(:fresh AS uuid[]))) "
    "  AND f.occurred_at + o.recovery_seconds * interval '1 second' > :at "
    "ORDER BY f.occurred_at + o.recovery_seconds * interval '1 second' DESC LIMIT 1"
)


def check_job_ends(session: Session, entries: Sequence[ProjectedEntry]) -> list[ProjectionError]:
    """The ``job_finished`` entries among ``entries`` (already projected) dated before
    the end of a recovery already recorded in the job span they close (the recovery
    rule of :func:`yoco_records.schema.implausible_outcome`, from the job's side), one
    error each naming ``occurred_at``.  Outcomes of this batch are checked by
    :func:`check_outcomes` instead."""
    ends = [(e, e.occurred_at) for e in entries if e.kind == "job_finished"]
    if not ends:
        return []
    fresh = [e.event_id for e in entries if e.kind == "outcome"]
    errors: list[ProjectionError] = []
    for e, at in ends:
        if at is None:
            continue
        row = session.execute(_CUT_RECOVERIES, {
            "seq": e.seq, "log": e.log_id, "job": str(e.body["job_id"]), "eid": e.event_id,
            "fresh": fresh, "at": at + RECOVERY_SLACK,
        }).first()
        if row is None:
            continue
        fid, failure_at, seconds = row
        end = recovery_end(failure_at, seconds)
        errors.append(ProjectionError(e.event_id, "occurred_at", (
            f"must not end the job before a recovery recorded in it is over: failure {fid} "
            f"at {failure_at.isoformat()} recovered for {seconds} s, until {end.isoformat()}")))
    return errors
