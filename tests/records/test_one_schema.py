"""One schema for records: the runtime's validator and the ledger's agree.

Before ``yoco_records`` the runtime kept its own rules and accepted records the ledger
refuses (a space instead of ``T``, 7 fraction digits, a basic-format timestamp, an
upper-case cause, a 300-character contract id, a newline in a job id), which then
stalled the outbox. Both now call :func:`yoco_records.schema.validate_record`; these
tests hold them to it, through the ledger's real file path (``parse_jsonl``).
"""

from __future__ import annotations

import json
import uuid
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ledger.records import parse_jsonl
from runtime import records as R
from runtime.errors import RecordError as RuntimeRecordError

FAILURE_ID = "3f0c8a3e-2d1b-4c5e-9f6a-7b8c9d0e1f2a"

BASE: dict[str, dict[str, Any]] = {
    "job_started": {"job_id": "job-1", "gpus": 8},
    "job_progress": {"job_id": "job-1", "step": 100, "step_seconds": 1.5},
    "job_finished": {"job_id": "job-1", "step": 200},
    "failure": {
        "job_id": "job-1",
        "failure_class": "unplanned",
        "cause": "gpu_lost",
        "node": "node-7",
        "gpu": 3,
        "step": 150,
        "detail": "Xid 79",
    },
    "outcome": {
        "failure_event_id": FAILURE_ID,
        "outcome": "live_migrated",
        "lost_steps": 0,
        "recovery_seconds": 4.5,
        "step_seconds": 1.25,
        "gpus_affected": 8,
    },
    "exclusion": {
        "failure_event_id": FAILURE_ID,
        "reason": "maintenance window",
        "approved_by": "ops@example.com",
    },
}

DROP = object()

# The values that once split the two validators, and their neighbours.
NASTY: dict[str, list[Any]] = {
    "occurred_at": [
        "2026-03-02T12:00:00Z",
        "2026-03-02 12:00:00Z",
        "2026-03-02T12:00:00.1234567Z",
        "2026-03-02T12:00:00.123456+00:00",
        "20260302T120000Z",
        "2026-03-02T12:00:00",
        "2026-03-02T12:00:00+16:00",
        "2026-03-02T12:00:00-23:59",
        "2026-03-02T12:00:00+24:00",
        "9999-12-31T23:59:59Z",
        "0001-01-01T00:00:00Z",
        "2026-02-30T12:00:00Z",
        "2026-03-02t12:00:00z",
        "2026-W09-1T12:00:00Z",
        1_772_452_800,
        None,
    ],
    "event_id": [
        str(uuid.uuid4()),
        str(uuid.uuid4()).upper(),
        str(uuid.uuid5(uuid.NAMESPACE_URL, "year_close")),
        str(uuid.uuid1()),
        "0192e4a5-6c00-7b8a-9f00-0123456789ab",
        "00000000-0000-0000-0000-000000000000",
        "1b4e28ba2fa141d2883f0016d3cca427",
        "not-a-uuid",
        42,
    ],
    "contract_id": ["C-1", "c" * 200, "c" * 201, "c" * 300, "a\nb", "a\x00b", " ", "", 7],
    "job_id": ["job-1", "job\n1", "job\x00", "j" * 300, "", "\t", 3],
    "cause": ["gpu_lost", "GPU-Lost", "gpu-lost", "x" * 64, "x" * 65, "_gpu", "", None],
    "gpus": [1, 0, -1, 2**31 - 1, 2**31, 2**53 - 1, 2**53, 1.0, 1.5, True, "8"],
    "gpu": [0, -1, 2**31 - 1, 2**31, 2**40, None, False],
    "step": [0, -1, 2**53 - 1, 2**53, 2**63, 1e3, "1"],
    "lost_steps": [0, 1, -1, 2**53 - 1, 2**53],
    "step_seconds": [1.5, 0, -1.0, 1e-6, 1e300, 1e16, float("nan"), float("inf"), "1.5"],
    "recovery_seconds": [0, 0.0, 4.5, -0.1, 1e20, float("nan")],
    "gpus_affected": [1, 0, 2**31, True],
    "detail": ["Xid 79", "", "x" * 4000, "x" * 4001, "a\x00b", None],
    "node": ["node-7", "", "n\x00", None],
    "failure_class": ["unplanned", "Unplanned", "bogus"],
    "outcome": ["live_migrated", "rolled_back", "failed", "LIVE"],
    "reason": ["why", "", " ", "r\x00"],
    "approved_by": ["ops", "", "a\nb"],
    "failure_event_id": [FAILURE_ID, "x", FAILURE_ID.upper()],
    "kind": ["job_started", "nope", None],
    "extra": [DROP, 1],
}


def record(kind: str, /, **changes: Any) -> dict[str, Any]:
    """A valid record of ``kind`` with ``changes`` applied (DROP removes a field)."""
    obj: dict[str, Any] = {
        "kind": kind,
        "event_id": str(uuid.uuid4()),
        "contract_id": "C-1",
        "occurred_at": "2026-03-02T12:00:00Z",
        **BASE[kind],
    }
    for key, value in changes.items():
        if value is DROP:
            obj.pop(key, None)
        else:
            obj[key] = value
    return obj


def runtime_accepts(rec: dict[str, Any]) -> bool:
    try:
        R.validate_record(rec)
    except RuntimeRecordError:
        return False
    return True


def ledger_accepts(rec: dict[str, Any]) -> bool:
    """What `yoco ledger ingest` would say of the record as the outbox writes it."""
    try:
        line = json.dumps(rec, separators=(",", ":"))
    except (TypeError, ValueError):
        return False
    records, errors = parse_jsonl(line.encode("utf-8", "surrogatepass"))
    return not errors and len(records) == 1


@pytest.mark.parametrize(
    "field, value",
    [
        ("occurred_at", "2026-03-02 12:00:00Z"),
        ("occurred_at", "2026-03-02T12:00:00.1234567Z"),
        ("occurred_at", "20260302T120000Z"),
        ("cause", "GPU-Lost"),
        ("contract_id", "c" * 300),
        ("job_id", "job\n1"),
    ],
)
def test_the_records_that_once_split_the_validators_are_refused_by_both(
    field: str, value: Any
) -> None:
    rec = record("failure", **{field: value})
    assert not ledger_accepts(rec)
    with pytest.raises(RuntimeRecordError, match=field):
        R.validate_record(rec)


def test_a_valid_record_of_every_kind_is_accepted_by_both() -> None:
    for kind in BASE:
        rec = record(kind)
        assert runtime_accepts(rec), kind
        assert ledger_accepts(rec), kind


@st.composite
def records(draw: st.DrawFn) -> dict[str, Any]:
    kind = draw(st.sampled_from(sorted(BASE)))
    fields = draw(st.lists(st.sampled_from(sorted(NASTY)), max_size=3, unique=True))
    changes: dict[str, Any] = {}
    for name in fields:
        choices = [*NASTY[name], DROP]
        changes[name] = draw(st.sampled_from(choices))
    if draw(st.booleans()):
        # Free text too: whatever a producer might put in an id or a timestamp.
        name = draw(st.sampled_from(["job_id", "contract_id", "occurred_at", "cause", "node"]))
        changes[name] = draw(st.text(max_size=40))
    return record(kind, **changes)


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(records())
def test_runtime_and_ledger_validators_agree(rec: dict[str, Any]) -> None:
    assert runtime_accepts(rec) == ledger_accepts(rec), rec


def test_the_runtime_builders_make_records_the_ledger_accepts() -> None:
    fail = R.failure(contract_id="C-1", job_id="j", failure_class="unplanned",
                     cause="process_killed", node="n1", gpu=3, step=7, detail="w1 exit -9")
    built = [
        R.job_started(contract_id="C-1", job_id="j", gpus=2),
        R.job_progress(contract_id="C-1", job_id="j", step=5, step_seconds=0.25),
        fail,
        R.outcome(contract_id="C-1", failure_event_id=fail["event_id"], outcome="rolled_back",
                  lost_steps=3, recovery_seconds=1.5, step_seconds=0.25, gpus_affected=2),
        R.job_finished(contract_id="C-1", job_id="j", step=9),
    ]
    text = "\n".join(json.dumps(r) for r in built).encode()
    records, errors = parse_jsonl(text)
    assert errors == [] and len(records) == len(built)
    assert all(uuid.UUID(r["event_id"]).version == 4 for r in built)
