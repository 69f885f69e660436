"""Builders and a validator for ingestion records (DESIGN section 4).

The runtime is the producer of every record the ledger counts, so it checks each record
against the ingestion table *before* it reaches the outbox: a record the ledger would
refuse must never become durable. The rules are not restated here: both sides use the
one torch-free module :mod:`yoco_records.schema` (a property test shows they agree).
"""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime
from typing import Any

from runtime.errors import RecordError
from yoco_records import schema
from yoco_records.canonical import MAX_SAFE_INTEGER, parse_json_strict

MAX_SAFE_INT = MAX_SAFE_INTEGER

FAILURE_CLASSES = schema.FAILURE_CLASSES
OUTCOMES = schema.OUTCOMES


def now_iso() -> str:
    """Return the current time as ISO 8601 with a UTC offset (never naive)."""
    return datetime.now(UTC).isoformat()


def new_event_id() -> str:
    """Return a fresh producer-chosen event id (a UUID4 string)."""
    return str(uuid.uuid4())


def _base(kind: str, contract_id: str, occurred_at: str | None) -> dict[str, Any]:
    return {
        "kind": kind,
        "event_id": new_event_id(),
        "contract_id": contract_id,
        "occurred_at": occurred_at or now_iso(),
    }


def job_started(*, contract_id: str, job_id: str, gpus: int, occurred_at: str | None = None
                ) -> dict[str, Any]:
    """Build a validated ``job_started`` record."""
    rec = _base("job_started", contract_id, occurred_at) | {"job_id": job_id, "gpus": gpus}
    return validate_record(rec)


def job_progress(*, contract_id: str, job_id: str, step: int, step_seconds: float,
                 occurred_at: str | None = None) -> dict[str, Any]:
    """Build a validated ``job_progress`` record."""
    rec = _base("job_progress", contract_id, occurred_at) | {
        "job_id": job_id, "step": step, "step_seconds": float(step_seconds)}
    return validate_record(rec)


def job_finished(*, contract_id: str, job_id: str, step: int, occurred_at: str | None = None
                 ) -> dict[str, Any]:
    """Build a validated ``job_finished`` record."""
    rec = _base("job_finished", contract_id, occurred_at) | {"job_id": job_id, "step": step}
    return validate_record(rec)


def failure(*, contract_id: str, job_id: str, failure_class: str, cause: str,
            node: str | None = None, gpu: int | None = None, step: int | None = None,
            detail: str | None = None, occurred_at: str | None = None) -> dict[str, Any]:
    """Build a validated ``failure`` record; optional fields that are None are omitted."""
    rec = _base("failure", contract_id, occurred_at) | {
        "job_id": job_id, "failure_class": failure_class, "cause": cause}
    for key, value in (("node", node), ("gpu", gpu), ("step", step), ("detail", detail)):
        if value is not None:
            rec[key] = value
    return validate_record(rec)


def outcome(*, contract_id: str, failure_event_id: str, outcome: str, lost_steps: int,
            recovery_seconds: float, step_seconds: float, gpus_affected: int,
            occurred_at: str | None = None) -> dict[str, Any]:
    """Build a validated ``outcome`` record for the failure ``failure_event_id``."""
    rec = _base("outcome", contract_id, occurred_at) | {
        "failure_event_id": failure_event_id,
        "outcome": outcome,
        "lost_steps": lost_steps,
        "recovery_seconds": float(recovery_seconds),
        "step_seconds": float(step_seconds),
        "gpus_affected": gpus_affected,
    }
    return validate_record(rec)


def validate_record(rec: dict[str, Any]) -> dict[str, Any]:
    """Check ``rec`` against the ingestion table and return it unchanged.

    The rules are the ledger's own (:func:`yoco_records.schema.validate_record`), applied
    to exactly what the ledger will receive: ``rec`` written as JSON and read back
    strictly. Raises :class:`RecordError` naming the field (``field 'gpus': ...``) on a
    missing, unknown or mistyped field, a naive or out-of-range timestamp, an event id
    that is not a random UUID v4, a number out of range, or ``live_migrated`` with
    ``lost_steps`` > 0; several problems are joined with ``; ``.
    """
    if not isinstance(rec, dict):
        raise RecordError(f"a record must be a dict, not {type(rec).__name__}")
    try:
        text = json.dumps(rec, allow_nan=False, separators=(",", ":"))
        parsed = parse_json_strict(text)
    except (TypeError, ValueError) as exc:
        # JsonInputError is a ValueError; json.dumps raises TypeError/ValueError for
        # values JSON cannot carry (NaN, objects).
        raise RecordError(f"{rec.get('kind')!s}: not plain JSON: {exc}") from None
    _, errors = schema.validate_record(parsed)
    if errors:
        raise RecordError("; ".join(str(e) for e in errors))
    return rec
