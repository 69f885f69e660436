"""The plausibility of outcomes against their failure's job, checked at ingest.

The rules are the record schema's (:func:`yoco_records.schema.implausible_outcome`);
this module finds what they need, which only the ledger knows: the failure's job, its
GPUs (the job span that began before the failure) and the step it had reached (the
failure's own ``step``, else the job's latest ``job_progress`` or ``job_finished``
between the span's start and the failure). Run after the batch's entries are
projected (a failure or a job in the same batch counts), at ingest only: a journal
replayed by ``yoco ledger verify`` is what was accepted then.

Cost: one query per batch with outcomes, and, for an outcome whose failure names no
step, one backward primary-key scan of the job's entries that stops at the first
progress entry before the failure.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence

from sqlalchemy import text
from sqlalchemy.orm import Session

from ledger.projections import ProjectedEntry, ProjectionError
from yoco_records.schema import implausible_outcome

__all__ = ["check_outcomes"]

_FAILURE_JOBS = text(
    "SELECT f.event_id, f.contract_id, f.job_id, f.seq, f.step, s.gpus, s.start_seq "
    "FROM failures AS f "
    "LEFT JOIN LATERAL (SELECT j.gpus, j.start_seq FROM job_spans AS j "
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
        log_id, job_id, fseq, fstep, gpus, start_seq = job
        if fid not in reached:
            reached[fid] = fstep if fstep is not None else (
                None if start_seq is None else session.execute(
                    _LATEST_STEP, {"log": log_id, "start": start_seq, "seq": fseq,
                                   "job": job_id}).scalar_one_or_none())
        for field, message in implausible_outcome(
            int(e.body["gpus_affected"]), int(e.body["lost_steps"]), job_gpus=gpus,
            reached_step=reached[fid],
        ):
            errors.append(ProjectionError(e.event_id, field, message))
    return errors
