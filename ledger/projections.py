"""Projections of the journal: contracts, job spans, failures, outcomes, exclusions.

They are written in the same transaction as the entries (by :func:`project`)
and can be recreated from the journal alone (:func:`rebuild`); both paths go
through the same code, entry by entry in log order, so a rebuild reproduces
the live tables exactly.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass
from datetime import date, datetime
from decimal import Decimal
from typing import Any

from sqlalchemy import select, text, tuple_
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.orm import Session

from ledger.bulk import copy_dicts, probe
from ledger.errors import ensure
from ledger.models import (
    PROJECTION_TABLES,
    Contract,
    Exclusion,
    Failure,
    JobSpan,
    JournalEntry,
    Outcome,
)

#: Failures by event id, for the references of outcomes and exclusions: a join on the
#: failures' primary key against the unnested ids (:func:`ledger.bulk.probe`), one index
#: probe an id whatever the statistics (never a scan of the table).
FAILURES_BY_ID = (
    "SELECT f.event_id, f.contract_id, f.seq FROM unnest(%s::uuid[]) AS q(id) "
    "JOIN failures f ON f.event_id = q.id"
)


@dataclass(frozen=True, slots=True)
class ProjectedEntry:
    """What a projection needs of an entry: where it stands and what it says."""

    log_id: str
    seq: int
    event_id: uuid.UUID
    kind: str
    occurred_at: datetime | None
    body: dict[str, Any]


@dataclass(frozen=True, slots=True)
class ProjectionError:
    """An entry that contradicts the state it would be applied to (refuses the batch)."""

    event_id: uuid.UUID
    field: str
    message: str

    def __str__(self) -> str:
        return f"event {self.event_id}: field '{self.field}': {self.message}"


#: Extra projectors for kinds other packages own (billing), wired by the composition root.
Projector = Callable[[Session, Sequence[ProjectedEntry]], list[ProjectionError]]

#: The entry kinds the ledger's own projections read; every other kind leaves them as they
#: are, so a replay may skip it (``yoco ledger verify`` replays only projected kinds).
KINDS = frozenset({"contract", "job_started", "job_finished", "failure", "outcome", "exclusion"})


def _dec(value: Any) -> Decimal:
    if isinstance(value, bool):
        raise TypeError("bool is not a number")
    if isinstance(value, int):
        return Decimal(value)
    if isinstance(value, float):
        # As the canonical bytes say it (RFC 8785: 2.0 is written 2), so that a value
        # projected at ingest and the same value replayed from the journal are one text.
        return Decimal(int(value)) if value.is_integer() else Decimal(repr(value))
    return Decimal(str(value))


def _uuid(value: Any) -> uuid.UUID:
    return value if isinstance(value, uuid.UUID) else uuid.UUID(str(value))


def project(
    session: Session,
    entries: Sequence[ProjectedEntry],
    extra: Iterable[Projector] = (),
) -> list[ProjectionError]:
    """Apply ``entries`` (in log order) to the projection tables; return contradictions.

    A non-empty result means the caller must roll the transaction back.
    """
    errors: list[ProjectionError] = []
    contracts = [e for e in entries if e.kind == "contract"]
    if contracts:
        session.execute(pg_insert(Contract), [_contract_row(e) for e in contracts])
    errors += _project_jobs(session, [e for e in entries if e.kind.startswith("job_")])
    errors += _project_failures(session, entries)
    for projector in extra:
        errors += projector(session, entries)
    return errors


def _contract_row(e: ProjectedEntry) -> dict[str, Any]:
    c = e.body["contract"]
    return {
        "contract_id": c["contract_id"],
        "customer": c["customer"],
        "start_date": date.fromisoformat(c["start_date"]),
        "timezone": c["timezone"],
        "term_years": int(c["term_years"]),
        "currency": c["currency"],
        "annual_value": Decimal(c["annual_value"]),
        "renewal_value": Decimal(c["renewal_value"]) if c.get("renewal_value") else None,
        "gpu_hour_price": Decimal(c["gpu_hour_price"]) if c.get("gpu_hour_price") else None,
        "terms": c["terms"],
        "event_id": e.event_id,
    }


def _project_jobs(session: Session, entries: Sequence[ProjectedEntry]) -> list[ProjectionError]:
    """Open a span at job_started and close the job's open span at job_finished.

    Processed one by one in log order against the open spans already stored,
    so a batch that starts and finishes a job is handled like two batches.
    """
    starts_and_ends = [e for e in entries if e.kind in ("job_started", "job_finished")]
    if not starts_and_ends:
        return []
    keys = {(e.log_id, str(e.body["job_id"])) for e in starts_and_ends}
    open_spans: dict[tuple[str, str], uuid.UUID] = {}
    for start_id, contract_id, job_id in session.execute(
        select(JobSpan.start_event_id, JobSpan.contract_id, JobSpan.job_id).where(
            JobSpan.finished_at.is_(None),
            tuple_(JobSpan.contract_id, JobSpan.job_id).in_(sorted(keys)),
        )
    ):
        open_spans[(contract_id, job_id)] = start_id

    errors: list[ProjectionError] = []
    inserts: list[dict[str, Any]] = []
    closes: list[dict[str, Any]] = []
    for e in sorted(starts_and_ends, key=lambda x: (x.log_id, x.seq)):
        key = (e.log_id, str(e.body["job_id"]))
        if e.kind == "job_started":
            if key in open_spans:
                errors.append(
                    ProjectionError(
                        e.event_id,
                        "job_id",
                        f"job {key[1]!r} is already running (started by event "
                        f"{open_spans[key]}); finish it before starting it again",
                    )
                )
                continue
            open_spans[key] = e.event_id
            inserts.append(
                {
                    "start_event_id": e.event_id,
                    "contract_id": e.log_id,
                    "job_id": key[1],
                    "gpus": int(e.body["gpus"]),
                    "started_at": e.occurred_at,
                    "start_seq": e.seq,
                    "finished_at": None,
                    "finish_event_id": None,
                }
            )
        else:
            closing = open_spans.pop(key, None)
            if closing is None:
                errors.append(
                    ProjectionError(
                        e.event_id, "job_id", f"job {key[1]!r} is not running (no job_started)"
                    )
                )
                continue
            closes.append({"sid": closing, "at": e.occurred_at, "fid": e.event_id})
    if errors:
        return errors
    # A span opened and closed in this batch is written closed: one row, not an
    # INSERT then an UPDATE (a replay holds whole years of jobs in a batch).
    opened = {row["start_event_id"]: row for row in inserts}
    still_open = []
    for close in closes:
        row = opened.get(close["sid"])
        if row is None:
            still_open.append(close)
        else:
            row["finished_at"] = close["at"]
            row["finish_event_id"] = close["fid"]
    closes = still_open
    if inserts:
        copy_dicts(session, "job_spans", inserts)
    if closes:
        session.execute(
            text(
                "UPDATE job_spans SET finished_at = :at, finish_event_id = :fid "
                "WHERE start_event_id = :sid"
            ),
            closes,
        )
    return []


def _project_failures(session: Session, entries: Sequence[ProjectedEntry]) -> list[ProjectionError]:
    failures = [e for e in entries if e.kind == "failure"]
    refs = [e for e in entries if e.kind in ("outcome", "exclusion")]
    errors: list[ProjectionError] = []
    if failures:
        copy_dicts(
            session,
            "failures",
            [
                {
                    "event_id": e.event_id,
                    "contract_id": e.log_id,
                    "seq": e.seq,
                    "job_id": str(e.body["job_id"]),
                    "failure_class": e.body["failure_class"],
                    "cause": e.body["cause"],
                    "node": e.body.get("node"),
                    "gpu": e.body.get("gpu"),
                    "step": e.body.get("step"),
                    "detail": e.body.get("detail"),
                    "occurred_at": e.occurred_at,
                }
                for e in failures
            ],
        )
    if not refs:
        return errors
    # An outcome or exclusion must name an earlier failure of the same contract.
    known: dict[uuid.UUID, tuple[str, int]] = {e.event_id: (e.log_id, e.seq) for e in failures}
    wanted = {_uuid(e.body["failure_event_id"]) for e in refs} - set(known)
    if wanted:
        for eid, contract_id, seq in probe(session, FAILURES_BY_ID, sorted(wanted)):
            known[eid] = (contract_id, seq)
    outcome_rows: list[dict[str, Any]] = []
    exclusion_rows: list[dict[str, Any]] = []
    for e in refs:
        fid = _uuid(e.body["failure_event_id"])
        where = known.get(fid)
        if where is None or where[0] != e.log_id or where[1] > e.seq:
            errors.append(
                ProjectionError(
                    e.event_id,
                    "failure_event_id",
                    f"unknown failure {fid} for contract {e.log_id!r}"
                    + (" (it comes later in the log)" if where and where[0] == e.log_id else ""),
                )
            )
            continue
        if e.kind == "outcome":
            outcome_rows.append(
                {
                    "event_id": e.event_id,
                    "failure_event_id": fid,
                    "contract_id": e.log_id,
                    "seq": e.seq,
                    "outcome": e.body["outcome"],
                    "lost_steps": int(e.body["lost_steps"]),
                    "recovery_seconds": _dec(e.body["recovery_seconds"]),
                    "step_seconds": _dec(e.body["step_seconds"]),
                    "gpus_affected": int(e.body["gpus_affected"]),
                    "occurred_at": e.occurred_at,
                }
            )
        else:
            exclusion_rows.append(
                {
                    "event_id": e.event_id,
                    "failure_event_id": fid,
                    "contract_id": e.log_id,
                    "seq": e.seq,
                    "reason": e.body["reason"],
                    "approved_by": e.body["approved_by"],
                    "occurred_at": e.occurred_at,
                }
            )
    if errors:
        return errors
    if outcome_rows:
        copy_dicts(session, "outcomes", outcome_rows)
    if exclusion_rows:
        copy_dicts(session, "exclusions", exclusion_rows)
    return []


def clear(session: Session, extra_tables: Sequence[str] = ()) -> None:
    """Empty every projection table (children first)."""
    for table in (*extra_tables, "outcomes", "exclusions", "failures", "job_spans", "contracts"):
        session.execute(text(f"DELETE FROM {table}"))


def rebuild(
    session: Session,
    extra: Iterable[Projector] = (),
    extra_tables: Sequence[str] = (),
    batch: int = 20000,
    progress: Callable[[int], None] | None = None,
) -> int:
    """Recreate every projection from the journal alone; return the number of entries replayed.

    Logs are replayed in (log, seq) order in batches, through :func:`project`.
    """
    clear(session, extra_tables)
    return replay(session, extra, batch=batch, progress=progress)


def replay(
    session: Session,
    extra: Iterable[Projector] = (),
    *,
    kinds: Collection[str] | None = None,
    batch: int = 20000,
    progress: Callable[[int], None] | None = None,
) -> int:
    """Apply the journal's entries (all, or only ``kinds``) to the projection tables in view.

    Entries go through :func:`project` in (log, seq) order, in batches; returns how many
    were replayed.  ``kinds`` may leave out only kinds no projector reads (see
    :data:`KINDS`): a projector must see every entry of the kinds it owns.
    """
    extra = list(extra)
    wanted = sorted(kinds) if kinds is not None else None
    done = 0
    last: tuple[str, int] | None = None
    while True:
        q = select(
            JournalEntry.log_id,
            JournalEntry.seq,
            JournalEntry.event_id,
            JournalEntry.kind,
            JournalEntry.occurred_at,
            JournalEntry.body,
        ).order_by(JournalEntry.log_id, JournalEntry.seq)
        if wanted is not None:
            q = q.where(JournalEntry.kind.in_(wanted))
        if last is not None:
            q = q.where(tuple_(JournalEntry.log_id, JournalEntry.seq) > last)
        rows = session.execute(q.limit(batch)).all()
        if not rows:
            break
        entries = [ProjectedEntry(r[0], r[1], r[2], r[3], r[4], r[5]) for r in rows]
        errors = project(session, entries, extra)
        ensure(not errors, f"journal contradicts itself: {errors[:3]}")
        done += len(entries)
        last = (rows[-1][0], rows[-1][1])
        if progress:
            progress(done)
    return done


def snapshot(
    session: Session, extra_tables: Sequence[str] = ()
) -> dict[str, list[tuple[Any, ...]]]:
    """Every projection row, sorted: for comparing a rebuild with the live tables."""
    out: dict[str, list[tuple[Any, ...]]] = {}
    for table in (*PROJECTION_TABLES, *extra_tables):
        rows = session.execute(text(f"SELECT * FROM {table}")).all()
        out[table] = sorted((tuple(r) for r in rows), key=repr)
    return out


# ---------------------------------------------------------------------------- reads


def failure_of(session: Session, contract_id: str, event_id: uuid.UUID) -> Failure | None:
    """The failure ``event_id`` of contract ``contract_id``; None when that contract has
    no such failure (another contract's failure is not found either)."""
    found: Failure | None = session.execute(
        select(Failure).where(Failure.event_id == event_id, Failure.contract_id == contract_id)
    ).scalar_one_or_none()
    return found


def outcomes_of_failure(
    session: Session, contract_id: str, failure_event_id: uuid.UUID
) -> list[Outcome]:
    """The outcomes recorded in contract ``contract_id`` for one failure, in time then
    ledger order (the last one counts: a later outcome corrects an earlier one)."""
    return list(
        session.execute(
            select(Outcome)
            .where(Outcome.failure_event_id == failure_event_id,
                   Outcome.contract_id == contract_id)
            .order_by(Outcome.occurred_at, Outcome.seq)
        ).scalars()
    )


def exclusions_of_failure(
    session: Session, contract_id: str, failure_event_id: uuid.UUID
) -> list[Exclusion]:
    """The exclusions recorded in contract ``contract_id`` for one failure, in time then
    ledger order."""
    return list(
        session.execute(
            select(Exclusion)
            .where(Exclusion.failure_event_id == failure_event_id,
                   Exclusion.contract_id == contract_id)
            .order_by(Exclusion.occurred_at, Exclusion.seq)
        ).scalars()
    )


def failures_with_ids(session: Session, event_ids: Collection[uuid.UUID]) -> list[Failure]:
    """The failures among ``event_ids`` that the session may see (row-level security
    scopes a portal session to its tenant), in no particular order."""
    return list(
        session.execute(select(Failure).where(Failure.event_id.in_(list(event_ids)))).scalars()
    )


def outcomes_of_failures(
    session: Session, failure_event_ids: Collection[uuid.UUID]
) -> list[Outcome]:
    """The outcomes of any of ``failure_event_ids`` that the session may see, in time then
    ledger order (for each failure, the last one counts)."""
    return list(
        session.execute(
            select(Outcome)
            .where(Outcome.failure_event_id.in_(list(failure_event_ids)))
            .order_by(Outcome.occurred_at, Outcome.seq)
        ).scalars()
    )


def outcome_counts(session: Session) -> dict[str, list[tuple[str, int]]]:
    """How many outcome entries each contract the session may see holds, by outcome:
    contract id -> [(outcome, count)], outcomes sorted."""
    out: dict[str, list[tuple[str, int]]] = {}
    for cid, outcome, n in session.execute(
        text(
            "SELECT contract_id, outcome, count(*) FROM outcomes "
            "GROUP BY contract_id, outcome ORDER BY contract_id, outcome"
        )
    ):
        out.setdefault(cid, []).append((outcome, int(n)))
    return out


def recovery_histograms(
    session: Session, bounds: Sequence[float]
) -> dict[str, tuple[tuple[int, ...], float]]:
    """The recovery seconds of each contract's outcome entries (the contracts the session
    may see) as a cumulative histogram: contract id -> (how many recovered within each of
    ``bounds`` seconds, then how many in all; the sum of their recovery seconds)."""
    cols = ", ".join(
        f"count(*) FILTER (WHERE recovery_seconds <= {Decimal(str(b))})"
        for b in bounds
    )
    out: dict[str, tuple[tuple[int, ...], float]] = {}
    for row in session.execute(
        text(
            f"SELECT contract_id, {cols}, count(*), coalesce(sum(recovery_seconds), 0) "
            "FROM outcomes GROUP BY contract_id"
        )
    ):
        cid, *counts, total = row
        out[cid] = (tuple(int(n) for n in counts), float(total))
    return out
