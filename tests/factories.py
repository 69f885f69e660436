"""Builders of ingestion records and contracts for tests (plain dicts, as producers send)."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

T0 = datetime(2026, 3, 2, 12, 0, tzinfo=UTC)


def ts(t: datetime) -> str:
    """ISO 8601 with offset."""
    return t.isoformat()


def contract(cid: str = "C-1", **over: Any) -> dict[str, Any]:
    """A contract object as `yoco contracts import` takes it."""
    obj: dict[str, Any] = {
        "contract_id": cid,
        "customer": f"cust-{cid}",
        "start_date": "2026-01-01",
        "timezone": "UTC",
        "term_years": 2,
        "currency": "USD",
        "annual_value": "1000000.00",
    }
    obj.update(over)
    return obj


def rec(kind: str, cid: str = "C-1", at: datetime = T0, **fields: Any) -> dict[str, Any]:
    """An ingestion record of ``kind`` with a fresh event id."""
    return {
        "kind": kind,
        "event_id": str(fields.pop("event_id", uuid.uuid4())),
        "contract_id": cid,
        "occurred_at": ts(at),
        **fields,
    }


def job_started(job: str = "j1", gpus: int = 8, **kw: Any) -> dict[str, Any]:
    """A job_started record."""
    return rec("job_started", job_id=job, gpus=gpus, **kw)


def failure(
    job: str = "j1", cls: str = "unplanned", cause: str = "gpu_lost", **kw: Any
) -> dict[str, Any]:
    """A failure record."""
    return rec("failure", job_id=job, failure_class=cls, cause=cause, **kw)


def outcome(fid: str, result: str = "live_migrated", lost: int = 0, **kw: Any) -> dict[str, Any]:
    """An outcome record for failure ``fid``."""
    return rec(
        "outcome",
        failure_event_id=fid,
        outcome=result,
        lost_steps=lost,
        recovery_seconds=kw.pop("recovery_seconds", 1.5),
        step_seconds=kw.pop("step_seconds", 2.0),
        gpus_affected=kw.pop("gpus_affected", 8),
        **kw,
    )


def jsonl(records: list[dict[str, Any]]) -> bytes:
    """Records as a JSONL file's bytes."""
    return "".join(json.dumps(r) + "\n" for r in records).encode()


def later(minutes: float) -> datetime:
    """T0 plus ``minutes``."""
    return T0 + timedelta(minutes=minutes)
