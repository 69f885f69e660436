"""Builders and a validator for ingestion records (DESIGN section 4).

The runtime is the producer of every record the ledger counts, so it checks each record
against the ingestion table *before* it reaches the outbox: a record the ledger would
refuse must never become durable, because the outbox retries forever.
"""

from __future__ import annotations

import math
import uuid
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from runtime.errors import RecordError

MAX_SAFE_INT = 2**53 - 1

FAILURE_CLASSES = ("unplanned", "preemptive", "planned")
OUTCOMES = ("live_migrated", "rolled_back", "failed")

_COMMON = ("kind", "event_id", "contract_id", "occurred_at")
# Required and optional fields per kind, exactly the DESIGN table: the ledger refuses
# anything else, so an extra field here would turn into an undeliverable outbox entry.
_FIELDS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "job_started": (("job_id", "gpus"), ()),
    "job_progress": (("job_id", "step", "step_seconds"), ()),
    "job_finished": (("job_id", "step"), ()),
    "failure": (("job_id", "failure_class", "cause"), ("node", "gpu", "step", "detail")),
    "outcome": (
        (
            "failure_event_id",
            "outcome",
            "lost_steps",
            "recovery_seconds",
            "step_seconds",
            "gpus_affected",
        ),
        (),
    ),
    "exclusion": (("failure_event_id", "reason", "approved_by"), ()),
}


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


def _int(rec: Mapping[str, Any], key: str, minimum: int) -> None:
    v = rec[key]
    # bool is an int subclass; the ledger would see true/false, not a number.
    if isinstance(v, bool) or not isinstance(v, int):
        raise RecordError(f"{rec.get('kind')}.{key}: expected an integer, got {v!r}")
    if v < minimum or v > MAX_SAFE_INT:
        raise RecordError(f"{rec.get('kind')}.{key}: {v} out of range [{minimum}, 2^53-1]")


def _num(rec: Mapping[str, Any], key: str, *, positive: bool) -> None:
    v = rec[key]
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
        raise RecordError(f"{rec.get('kind')}.{key}: expected a finite number, got {v!r}")
    if (positive and v <= 0) or v < 0:
        bound = "> 0" if positive else ">= 0"
        raise RecordError(f"{rec.get('kind')}.{key}: {v} must be {bound}")


def _str(rec: Mapping[str, Any], key: str) -> None:
    v = rec[key]
    if not isinstance(v, str) or not v:
        raise RecordError(f"{rec.get('kind')}.{key}: expected a non-empty string, got {v!r}")


def validate_record(rec: dict[str, Any]) -> dict[str, Any]:
    """Check ``rec`` against the ingestion table and return it unchanged.

    Raises :class:`RecordError` naming the field on a missing, unknown or mistyped field,
    a naive timestamp, a negative number, or ``live_migrated`` with ``lost_steps`` > 0.
    """
    kind = rec.get("kind")
    if kind not in _FIELDS:
        raise RecordError(f"kind: unknown record kind {kind!r}")
    required, optional = _FIELDS[kind]
    missing = [k for k in (*_COMMON, *required) if k not in rec]
    if missing:
        raise RecordError(f"{kind}: missing field(s) {', '.join(missing)}")
    unknown = sorted(set(rec) - set(_COMMON) - set(required) - set(optional))
    if unknown:
        raise RecordError(f"{kind}: unknown field(s) {', '.join(unknown)}")
    try:
        if uuid.UUID(str(rec["event_id"])).version != 4 or not isinstance(rec["event_id"], str):
            raise ValueError
    except ValueError:
        raise RecordError(f"{kind}.event_id: not a UUID4 string: {rec['event_id']!r}") from None
    _str(rec, "contract_id")
    try:
        ts = datetime.fromisoformat(str(rec["occurred_at"]))
    except ValueError:
        raise RecordError(f"{kind}.occurred_at: not ISO 8601: {rec['occurred_at']!r}") from None
    if ts.tzinfo is None or not isinstance(rec["occurred_at"], str):
        raise RecordError(f"{kind}.occurred_at: timestamp without offset")
    if kind in ("job_started", "job_progress", "job_finished", "failure"):
        _str(rec, "job_id")
    if kind == "job_started":
        _int(rec, "gpus", 1)
    elif kind in ("job_progress", "job_finished"):
        _int(rec, "step", 0)
        if kind == "job_progress":
            _num(rec, "step_seconds", positive=True)
    elif kind == "failure":
        if rec["failure_class"] not in FAILURE_CLASSES:
            raise RecordError(f"failure.failure_class: {rec['failure_class']!r} not in "
                              f"{FAILURE_CLASSES}")
        _str(rec, "cause")
        for key in ("node", "detail"):
            if key in rec:
                _str(rec, key)
        if "gpu" in rec:
            _int(rec, "gpu", 0)
        if "step" in rec:
            _int(rec, "step", 0)
    elif kind == "outcome":
        _str(rec, "failure_event_id")
        if rec["outcome"] not in OUTCOMES:
            raise RecordError(f"outcome.outcome: {rec['outcome']!r} not in {OUTCOMES}")
        _int(rec, "lost_steps", 0)
        _num(rec, "recovery_seconds", positive=False)
        _num(rec, "step_seconds", positive=True)
        _int(rec, "gpus_affected", 1)
        if rec["outcome"] == "live_migrated" and rec["lost_steps"] != 0:
            raise RecordError("outcome.lost_steps: live_migrated requires lost_steps = 0")
    elif kind == "exclusion":
        for key in ("failure_event_id", "reason", "approved_by"):
            _str(rec, key)
    return rec
