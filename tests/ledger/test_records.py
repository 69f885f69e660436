"""Validation of ingestion and contract records (ledger.records, DESIGN section 4)."""

from __future__ import annotations

import json
import pickle
import re
import uuid
from datetime import UTC, date, datetime, timedelta, timezone
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from ledger.canonical import canonical_bytes
from ledger.records import (
    CURRENCY_MINOR_UNITS,
    ContractSpec,
    ContractTerms,
    ExclusionRec,
    FailureRec,
    JobFinished,
    JobProgress,
    JobStarted,
    OutcomeRec,
    Record,
    RecordError,
    check_references,
    contract_from_record,
    parse_contracts,
    parse_jsonl,
    validate_batch,
    validate_contract,
    validate_record,
)


class _Drop:
    def __repr__(self) -> str:
        return "DROP"


DROP: Any = _Drop()
FAILURE_ID = "1b4e28ba-2fa1-41d2-883f-0016d3cca427"

BASE: dict[str, dict[str, Any]] = {
    "job_started": {"job_id": "job-1", "gpus": 8},
    "job_progress": {"job_id": "job-1", "step": 100, "step_seconds": 1.25},
    "job_finished": {"job_id": "job-1", "step": 1000},
    "failure": {
        "job_id": "job-1",
        "failure_class": "unplanned",
        "cause": "gpu_lost",
        "node": "node-7",
        "gpu": 3,
        "step": 512,
        "detail": "XID 79: GPU has fallen off the bus",
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
        "reason": "customer-requested maintenance window",
        "approved_by": "ops@example.com",
    },
}


def rec(kind: str, /, **changes: Any) -> dict[str, Any]:
    """A valid record of ``kind`` with ``changes`` applied (DROP removes a field)."""
    obj: dict[str, Any] = {
        "kind": kind,
        "event_id": str(uuid.uuid4()),
        "contract_id": "contract-1",
        "occurred_at": "2025-03-01T12:00:00Z",
        **BASE[kind],
    }
    for key, value in changes.items():
        if value is DROP:
            obj.pop(key, None)
        else:
            obj[key] = value
    return obj


def line(obj: Any) -> bytes:
    return json.dumps(obj).encode()


def jsonl(*items: Any) -> bytes:
    return b"\n".join(i if isinstance(i, bytes) else line(i) for i in items) + b"\n"


def only_error_at_line_3(bad: Any) -> RecordError:
    """Put ``bad`` on line 3 (after a good line and a blank one); return its only error."""
    records, errors = parse_jsonl(jsonl(rec("job_started"), b"   ", bad))
    assert len(records) == 1
    assert len(errors) == 1, [str(e) for e in errors]
    err = errors[0]
    assert err.line == 3
    assert err.index is None
    return err


def ok(obj: dict[str, Any]) -> Record:
    record, errors = validate_record(obj)
    assert errors == [], [str(e) for e in errors]
    assert record is not None
    return record


# ------------------------------------------------------------------------ happy paths


def test_job_started() -> None:
    obj = rec("job_started")
    r = ok(obj)
    assert r.kind == "job_started"
    assert r.data == JobStarted(job_id="job-1", gpus=8)
    assert r.event_id == obj["event_id"]
    assert r.contract_id == "contract-1"
    assert r.occurred_at == datetime(2025, 3, 1, 12, tzinfo=UTC)
    assert r.body is obj
    assert r.canonical == canonical_bytes(obj)


def test_job_progress_step_seconds_is_exact_decimal() -> None:
    r = ok(rec("job_progress", step_seconds=0.1))
    assert r.data == JobProgress(job_id="job-1", step=100, step_seconds=Decimal("0.1"))
    r = ok(rec("job_progress", step=0, step_seconds=2))
    assert r.data == JobProgress(job_id="job-1", step=0, step_seconds=Decimal(2))


def test_job_finished() -> None:
    assert ok(rec("job_finished", step=0)).data == JobFinished(job_id="job-1", step=0)


def test_failure_with_all_fields() -> None:
    r = ok(rec("failure"))
    assert r.data == FailureRec(
        job_id="job-1",
        failure_class="unplanned",
        cause="gpu_lost",
        node="node-7",
        gpu=3,
        step=512,
        detail="XID 79: GPU has fallen off the bus",
    )


@pytest.mark.parametrize("absent", [DROP, None])
def test_failure_optional_fields_absent_or_null(absent: Any) -> None:
    r = ok(rec("failure", node=absent, gpu=absent, step=absent, detail=absent))
    assert r.data == FailureRec(job_id="job-1", failure_class="unplanned", cause="gpu_lost")


@pytest.mark.parametrize("failure_class", ["unplanned", "preemptive", "planned"])
def test_failure_classes(failure_class: str) -> None:
    data = ok(rec("failure", failure_class=failure_class, cause="maintenance")).data
    assert isinstance(data, FailureRec)
    assert data.failure_class == failure_class


def test_failure_edge_values() -> None:
    cause = "a" + "b_9" * 21  # 64 characters
    data = ok(rec("failure", cause=cause, gpu=0, step=0, detail="x" * 4000, node="n" * 200)).data
    assert isinstance(data, FailureRec)
    assert (data.cause, data.gpu, data.step) == (cause, 0, 0)
    assert ok(rec("failure", detail="")).data == FailureRec(
        "job-1", "unplanned", "gpu_lost", "node-7", 3, 512, ""
    )
    assert ok(rec("failure", detail="multi\nline\ttext")) is not None


def test_outcome() -> None:
    r = ok(rec("outcome"))
    assert r.data == OutcomeRec(
        failure_event_id=FAILURE_ID,
        outcome="live_migrated",
        lost_steps=0,
        recovery_seconds=Decimal("4.5"),
        step_seconds=Decimal("1.25"),
        gpus_affected=8,
    )


def test_outcome_rolled_back_and_failed_may_lose_steps() -> None:
    for outcome in ("rolled_back", "failed"):
        data = ok(rec("outcome", outcome=outcome, lost_steps=250, recovery_seconds=0)).data
        assert isinstance(data, OutcomeRec)
        assert (data.lost_steps, data.recovery_seconds) == (250, Decimal(0))


def test_outcome_failure_event_id_is_lowercased() -> None:
    data = ok(rec("outcome", failure_event_id=FAILURE_ID.upper())).data
    assert isinstance(data, OutcomeRec)
    assert data.failure_event_id == FAILURE_ID


def test_exclusion() -> None:
    assert ok(rec("exclusion")).data == ExclusionRec(
        failure_event_id=FAILURE_ID,
        reason="customer-requested maintenance window",
        approved_by="ops@example.com",
    )


@pytest.mark.parametrize(
    "event_id",
    [
        "6F9619FF-8B86-4011-B42D-00C04FC964FF",  # v4, upper case
        "c232ab00-9414-41ec-b3c8-9f6bdeced846",  # v4, lower case
    ],
)
def test_event_id_v4_is_canonical_lowercase(event_id: str) -> None:
    r = ok(rec("job_started", event_id=event_id))
    assert r.event_id == event_id.lower()
    assert r.body["event_id"] == event_id  # the body is kept as received


@pytest.mark.parametrize(
    "event_id",
    [
        "6F9619FF-8B86-D011-B42D-00C04FC964FF",  # version 13
        "c232ab00-9414-11ec-b3c8-9f6bdeced846",  # v1
        "0192e4a5-6c00-7b8a-9f00-0123456789ab",  # v7
        "886313e1-3b8a-5372-9b90-0c9aee199e5d",  # v5: the space of the ledger's own ids
        "ffffffff-ffff-ffff-ffff-ffffffffffff",  # max
        "c232ab00-9414-41ec-73c8-9f6bdeced846",  # version 4 but not the RFC variant
    ],
)
def test_event_id_other_than_random_v4_is_refused(event_id: str) -> None:
    record, errors = validate_record(rec("job_started", event_id=event_id))
    assert record is None
    assert [(e.field, "random UUID v4" in e.message) for e in errors] == [("event_id", True)]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2025-03-01T12:00:00Z", datetime(2025, 3, 1, 12, tzinfo=UTC)),
        ("2025-03-01t12:00:00z", datetime(2025, 3, 1, 12, tzinfo=UTC)),
        ("2025-03-01T12:00:00+00:00", datetime(2025, 3, 1, 12, tzinfo=UTC)),
        ("2025-03-01T12:00:00-00:00", datetime(2025, 3, 1, 12, tzinfo=UTC)),
        (
            "2025-03-01T17:30:00+05:30",
            datetime(2025, 3, 1, 17, 30, tzinfo=timezone(timedelta(hours=5, minutes=30))),
        ),
        (
            "2025-03-01T07:00:00.25-05:00",
            datetime(2025, 3, 1, 7, 0, 0, 250000, tzinfo=timezone(timedelta(hours=-5))),
        ),
        ("2024-02-29T23:59:59.999999Z", datetime(2024, 2, 29, 23, 59, 59, 999999, tzinfo=UTC)),
    ],
)
def test_occurred_at_is_aware(text: str, expected: datetime) -> None:
    r = ok(rec("job_started", occurred_at=text))
    assert r.occurred_at == expected
    assert r.occurred_at.utcoffset() == expected.utcoffset()


def test_record_equality_ignores_location() -> None:
    obj = rec("job_started")
    a, _ = validate_record(obj, line=1)
    b, _ = validate_record(dict(obj), index=7)
    assert a == b
    assert a is not None
    assert hash(a) == hash(b)
    assert (a.line, a.index) == (1, None)


# ------------------------------------------------------------------------ refusals

# (kind, field to change, value (DROP = remove), field named in the error, message part)
REFUSALS: list[tuple[str, str, Any, str, str]] = [
    # kind
    ("job_started", "kind", DROP, "kind", "missing required field"),
    ("job_started", "kind", "job_paused", "kind", "unknown kind 'job_paused'"),
    ("job_started", "kind", "JOB_STARTED", "kind", "unknown kind"),
    # more precision than the ledger keeps (microseconds) would not round-trip
    ("job_started", "occurred_at", "2025-03-01T12:00:00.123456789Z", "occurred_at", "ISO 8601"),
    ("job_started", "kind", 5, "kind", "unknown kind a number"),
    ("job_started", "kind", None, "kind", "unknown kind null"),
    # event_id
    ("job_started", "event_id", DROP, "event_id", "missing required field"),
    ("job_started", "event_id", "not-a-uuid", "event_id", "must be a UUID"),
    ("job_started", "event_id", 12345, "event_id", "not a number"),
    ("job_started", "event_id", "1b4e28ba2fa141d2883f0016d3cca427", "event_id", "must be a UUID"),
    (
        "job_started",
        "event_id",
        "{1b4e28ba-2fa1-41d2-883f-0016d3cca427}",
        "event_id",
        "must be a UUID",
    ),
    ("job_started", "event_id", "1b4e28ba-2fa1-41d2-883f-0016d3cca42g", "event_id", "UUID"),
    ("job_started", "event_id", "00000000-0000-0000-0000-000000000000", "event_id", "nil UUID"),
    # contract_id
    ("job_started", "contract_id", DROP, "contract_id", "missing required field"),
    ("job_started", "contract_id", "", "contract_id", "non-empty"),
    ("job_started", "contract_id", "   ", "contract_id", "non-empty"),
    ("job_started", "contract_id", "c" * 201, "contract_id", "at most 200 characters"),
    ("job_started", "contract_id", "a\u0000b", "contract_id", "control characters"),
    ("job_started", "contract_id", "a\nb", "contract_id", "control characters"),
    ("job_started", "contract_id", "a\u0085b", "contract_id", "control characters"),
    ("job_started", "contract_id", 7, "contract_id", "not a number"),
    # occurred_at
    ("job_started", "occurred_at", DROP, "occurred_at", "missing required field"),
    ("job_started", "occurred_at", "2025-03-01T12:00:00", "occurred_at", "naive timestamp"),
    ("job_started", "occurred_at", "2025-03-01T12:00:00.5", "occurred_at", "naive timestamp"),
    ("job_started", "occurred_at", "2025-03-01", "occurred_at", "ISO 8601"),
    ("job_started", "occurred_at", "2025-03-01 12:00:00Z", "occurred_at", "ISO 8601"),
    ("job_started", "occurred_at", "2025-03-01T12:00Z", "occurred_at", "ISO 8601"),
    ("job_started", "occurred_at", "2025-03-01T12:00:00+0530", "occurred_at", "ISO 8601"),
    ("job_started", "occurred_at", "20250301T120000Z", "occurred_at", "ISO 8601"),
    ("job_started", "occurred_at", "yesterday", "occurred_at", "ISO 8601"),
    ("job_started", "occurred_at", 1740830400, "occurred_at", "not a number"),
    ("job_started", "occurred_at", "2025-13-01T00:00:00Z", "occurred_at", "month must be"),
    ("job_started", "occurred_at", "2025-02-29T00:00:00Z", "occurred_at", "day is out of range"),
    ("job_started", "occurred_at", "2025-03-01T24:00:00Z", "occurred_at", "hour must be"),
    ("job_started", "occurred_at", "2025-03-01T23:59:60Z", "occurred_at", "second must be"),
    ("job_started", "occurred_at", "2025-03-01T12:00:00+24:00", "occurred_at", "offset"),
    ("job_started", "occurred_at", "2025-03-01T12:00:00+05:60", "occurred_at", "offset"),
    # job_started
    ("job_started", "job_id", DROP, "job_id", "missing required field"),
    ("job_started", "job_id", "", "job_id", "non-empty"),
    ("job_started", "job_id", 42, "job_id", "not a number"),
    ("job_started", "gpus", DROP, "gpus", "missing required field"),
    ("job_started", "gpus", 0, "gpus", "must be an integer > 0 (got 0)"),
    ("job_started", "gpus", -8, "gpus", "must be an integer > 0 (got -8)"),
    ("job_started", "gpus", True, "gpus", "not a boolean"),
    ("job_started", "gpus", 8.0, "gpus", "JSON integer"),
    ("job_started", "gpus", 8.5, "gpus", "JSON integer"),
    ("job_started", "gpus", "8", "gpus", "not a string"),
    ("job_started", "gpus", None, "gpus", "not null"),
    ("job_started", "gpus", [8], "gpus", "not an array"),
    ("job_started", "gpu_count", 8, "gpu_count", "unknown field for kind 'job_started'"),
    ("job_started", "step", 3, "step", "unknown field for kind 'job_started'"),
    ("job_started", "Kind", "x", "Kind", "unknown field"),
    ("job_started", "odd key", 1, '["odd key"]', "unknown field"),
    # job_progress
    ("job_progress", "step", DROP, "step", "missing required field"),
    ("job_progress", "step", -1, "step", "must be an integer >= 0 (got -1)"),
    ("job_progress", "step", 1.5, "step", "JSON integer"),
    ("job_progress", "step", False, "step", "not a boolean"),
    ("job_progress", "step_seconds", DROP, "step_seconds", "missing required field"),
    ("job_progress", "step_seconds", 0, "step_seconds", "must be a number > 0 (got 0)"),
    ("job_progress", "step_seconds", 0.0, "step_seconds", "must be a number > 0"),
    ("job_progress", "step_seconds", -0.5, "step_seconds", "must be a number > 0 (got -0.5)"),
    ("job_progress", "step_seconds", "1.2", "step_seconds", "JSON number), not a string"),
    ("job_progress", "step_seconds", True, "step_seconds", "not a boolean"),
    ("job_progress", "step_seconds", None, "step_seconds", "not null"),
    # job_finished
    ("job_finished", "step", DROP, "step", "missing required field"),
    ("job_finished", "step", -1, "step", ">= 0"),
    ("job_finished", "job_id", DROP, "job_id", "missing required field"),
    ("job_finished", "gpus", 8, "gpus", "unknown field"),
    # failure
    ("failure", "job_id", DROP, "job_id", "missing required field"),
    ("failure", "failure_class", DROP, "failure_class", "missing required field"),
    ("failure", "failure_class", "sudden", "failure_class", "must be one of unplanned"),
    ("failure", "failure_class", "Unplanned", "failure_class", "must be one of"),
    ("failure", "failure_class", 1, "failure_class", "not a number"),
    ("failure", "cause", DROP, "cause", "missing required field"),
    ("failure", "cause", "GPU_LOST", "cause", "cause code"),
    ("failure", "cause", "gpu-lost", "cause", "cause code"),
    ("failure", "cause", "1gpu", "cause", "cause code"),
    ("failure", "cause", "_gpu", "cause", "cause code"),
    ("failure", "cause", "", "cause", "cause code"),
    ("failure", "cause", "a" * 65, "cause", "cause code"),
    ("failure", "cause", "gpu lost", "cause", "cause code"),
    ("failure", "cause", 3, "cause", "not a number"),
    ("failure", "node", "", "node", "non-empty"),
    ("failure", "node", "n" * 201, "node", "at most 200"),
    ("failure", "node", "n\x07", "node", "control characters"),
    ("failure", "node", 7, "node", "not a number"),
    ("failure", "gpu", -1, "gpu", ">= 0 (got -1)"),
    ("failure", "gpu", 1.0, "gpu", "JSON integer"),
    ("failure", "gpu", True, "gpu", "not a boolean"),
    ("failure", "step", -5, "step", ">= 0"),
    ("failure", "detail", "x" * 4001, "detail", "at most 4000 characters"),
    ("failure", "detail", 5, "detail", "must be a string"),
    ("failure", "severity", "high", "severity", "unknown field for kind 'failure'"),
    # outcome
    ("outcome", "failure_event_id", DROP, "failure_event_id", "missing required field"),
    ("outcome", "failure_event_id", "f-1", "failure_event_id", "must be a UUID"),
    ("outcome", "outcome", DROP, "outcome", "missing required field"),
    ("outcome", "outcome", "migrated", "outcome", "must be one of live_migrated"),
    ("outcome", "lost_steps", DROP, "lost_steps", "missing required field"),
    ("outcome", "lost_steps", -1, "lost_steps", ">= 0"),
    ("outcome", "lost_steps", 0.0, "lost_steps", "JSON integer"),
    ("outcome", "lost_steps", 3, "lost_steps", "must be 0 when outcome is 'live_migrated'"),
    ("outcome", "recovery_seconds", DROP, "recovery_seconds", "missing required field"),
    ("outcome", "recovery_seconds", -1, "recovery_seconds", "must be a number >= 0 (got -1)"),
    ("outcome", "recovery_seconds", -0.001, "recovery_seconds", ">= 0"),
    ("outcome", "recovery_seconds", "0", "recovery_seconds", "not a string"),
    ("outcome", "step_seconds", DROP, "step_seconds", "missing required field"),
    ("outcome", "step_seconds", 0, "step_seconds", "> 0"),
    ("outcome", "gpus_affected", DROP, "gpus_affected", "missing required field"),
    ("outcome", "gpus_affected", 0, "gpus_affected", "must be an integer > 0"),
    ("outcome", "gpus_affected", True, "gpus_affected", "not a boolean"),
    ("outcome", "job_id", "job-1", "job_id", "unknown field for kind 'outcome'"),
    # exclusion
    ("exclusion", "failure_event_id", DROP, "failure_event_id", "missing required field"),
    ("exclusion", "failure_event_id", "", "failure_event_id", "must be a UUID"),
    ("exclusion", "reason", DROP, "reason", "missing required field"),
    ("exclusion", "reason", "", "reason", "non-empty"),
    ("exclusion", "reason", " \t", "reason", "non-empty"),
    ("exclusion", "reason", 1, "reason", "must be a string"),
    ("exclusion", "reason", "r" * 4001, "reason", "at most 4000"),
    ("exclusion", "approved_by", DROP, "approved_by", "missing required field"),
    ("exclusion", "approved_by", "", "approved_by", "non-empty"),
    ("exclusion", "approved_by", None, "approved_by", "not null"),
    ("exclusion", "note", "x", "note", "unknown field"),
]


@pytest.mark.parametrize(
    ("kind", "key", "value", "field", "message"),
    REFUSALS,
    ids=[f"{k}.{f}={v!r:.20}" for k, f, v, _, _ in REFUSALS],
)
def test_refusal_names_line_and_field(
    kind: str, key: str, value: Any, field: str, message: str
) -> None:
    err = only_error_at_line_3(rec(kind, **{key: value}))
    assert err.field == field
    assert message in err.message
    assert str(err).startswith(f"line 3: field '{field}': ")


def test_refusal_in_api_batch_names_index_and_path() -> None:
    records, errors = validate_batch(
        [rec("job_started"), rec("job_started"), rec("job_started"), rec("job_started", gpus=0)]
    )
    assert len(records) == 3
    [err] = errors
    assert (err.index, err.line, err.field, err.path) == (3, None, "gpus", "[3].gpus")
    assert str(err) == "field '[3].gpus': must be an integer > 0 (got 0)"


def test_unknown_kind_skips_kind_fields_but_checks_common_ones() -> None:
    err_list = parse_jsonl(jsonl(rec("job_started", kind="nope", event_id="x")))[1]
    assert [(e.line, e.field) for e in err_list] == [(1, "kind"), (1, "event_id")]


def test_all_errors_of_one_record_are_reported_in_field_order() -> None:
    bad = rec("outcome", outcome="migrated", lost_steps=-1, gpus_affected=0, extra=1)
    del bad["occurred_at"]
    errors = parse_jsonl(jsonl(bad))[1]
    assert [(e.line, e.field) for e in errors] == [
        (1, "occurred_at"),
        (1, "outcome"),
        (1, "lost_steps"),
        (1, "gpus_affected"),
        (1, "extra"),
    ]


def test_live_migrated_with_lost_steps_is_reported_with_other_errors() -> None:
    bad = rec("outcome", lost_steps=2, gpus_affected=0)
    errors = parse_jsonl(jsonl(bad))[1]
    assert [e.field for e in errors] == ["gpus_affected", "lost_steps"]


# ------------------------------------------------------------------------ JSON-level refusals


@pytest.mark.parametrize(
    ("text", "field", "message"),
    [
        (b"[1, 2]", "", "must be a JSON object, not an array"),
        (b'"job_started"', "", "not a string"),
        (b"42", "", "not a number"),
        (b"null", "", "not null"),
        (b"{", "", "invalid JSON"),
        (b'{"kind": "job_started"', "", "invalid JSON"),
        (b'{"kind": "job_started"} {}', "", "Extra data"),
        (b"{'kind': 'job_started'}", "", "invalid JSON"),
        (b'{"gpus": 1, "gpus": 2}', "gpus", "duplicate key 'gpus'"),
        (b'{"a": {"b": 1, "b": 1}}', "a.b", "duplicate key 'b'"),
        (b'{"gpus": NaN}', "gpus", "NaN"),
        (b'{"step_seconds": Infinity}', "step_seconds", "Infinity"),
        (b'{"gpus": 9007199254740992}', "gpus", "2^53"),
        (b'{"step_seconds": 1e999}', "step_seconds", "too large"),
        (b'{"job_id": "\xff"}', "", "invalid UTF-8"),
        (b'{"job_id": "\\ud800"}', "job_id", "surrogate"),
    ],
)
def test_bad_json_line_names_line_and_field(text: bytes, field: str, message: str) -> None:
    err = only_error_at_line_3(text)
    assert err.field == field
    assert message in err.message


def test_invalid_json_names_the_column() -> None:
    err = only_error_at_line_3(b'{"kind": }')
    assert err.message.endswith("at column 10")
    assert str(err).startswith("line 3: invalid JSON")


def test_big_integer_in_a_real_record_names_gpus() -> None:
    text = line(rec("job_started")).replace(b'"gpus": 8', b'"gpus": 9007199254740992')
    err = only_error_at_line_3(text)
    assert err.field == "gpus"


def test_duplicate_key_in_a_real_record_is_refused() -> None:
    text = line(rec("job_started")).replace(b'"gpus": 8', b'"gpus": 8, "gpus": 8')
    err = only_error_at_line_3(text)
    assert (err.field, err.message) == ("gpus", "duplicate key 'gpus'")


def test_boundary_integer_is_accepted() -> None:
    r = ok(rec("job_progress", step=2**53 - 1))
    assert isinstance(r.data, JobProgress)
    assert r.data.step == 2**53 - 1


# ------------------------------------------------------------------------ JSONL files


def test_every_bad_line_is_reported_with_its_number() -> None:
    data = jsonl(
        rec("job_started"),  # 1
        rec("job_started", gpus=0),  # 2
        b"",  # 3
        rec("failure"),  # 4
        b"not json",  # 5
        rec("outcome", outcome="nope"),  # 6
        rec("exclusion"),  # 7
    )
    records, errors = parse_jsonl(data)
    assert [r.line for r in records] == [1, 4, 7]
    assert [(e.line, e.field) for e in errors] == [(2, "gpus"), (5, ""), (6, "outcome")]


def test_blank_and_whitespace_lines_are_skipped_but_counted() -> None:
    data = (
        b"\n  \n\t\r\n" + line(rec("job_started")) + b"\r\n\n" + line(rec("job_started", gpus=-1))
    )
    records, errors = parse_jsonl(data)
    assert [r.line for r in records] == [4]
    assert [(e.line, e.field) for e in errors] == [(6, "gpus")]


def test_crlf_and_no_final_newline() -> None:
    data = line(rec("job_started")) + b"\r\n" + line(rec("job_finished"))
    records, errors = parse_jsonl(data)
    assert errors == []
    assert [(r.line, r.kind) for r in records] == [(1, "job_started"), (2, "job_finished")]


def test_empty_file() -> None:
    assert parse_jsonl(b"") == ([], [])
    assert parse_jsonl(b"\n\n  \n") == ([], [])


def test_form_feed_is_not_blank() -> None:
    records, errors = parse_jsonl(b"\x0c\n")
    assert records == []
    assert [(e.line, e.field) for e in errors] == [(1, "")]


def test_bad_utf8_only_spoils_its_line() -> None:
    data = jsonl(rec("job_started"), b'{"kind": "\xc3("}', rec("job_started"))
    records, errors = parse_jsonl(data)
    assert [r.line for r in records] == [1, 3]
    assert [(e.line, "UTF-8" in e.message) for e in errors] == [(2, True)]


def test_str_input_is_accepted() -> None:
    records, errors = parse_jsonl(jsonl(rec("job_started")).decode())
    assert (len(records), errors) == (1, [])


def test_identical_duplicates_in_a_file_collapse_to_the_first() -> None:
    obj = rec("failure")
    data = jsonl(obj, rec("job_started"), obj, obj)
    records, errors = parse_jsonl(data)
    assert errors == []
    assert [r.line for r in records] == [1, 2]


def test_same_bytes_differently_spelled_is_still_identical() -> None:
    obj = rec("job_progress", step_seconds=1.5)
    other = line(obj).replace(b"1.5", b"15e-1")
    assert other != line(obj)
    records, errors = parse_jsonl(jsonl(obj, other))
    assert errors == []
    assert len(records) == 1


def test_same_event_id_with_different_content_is_refused_at_the_later_line() -> None:
    first = rec("job_started")
    second = dict(first, gpus=16)
    records, errors = parse_jsonl(jsonl(first, rec("job_finished"), second))
    assert [r.line for r in records] == [1, 2]
    [err] = errors
    assert (err.line, err.field) == (3, "event_id")
    assert "already used at line 1 with different content" in err.message


def test_event_id_case_variants_are_the_same_id_and_differ_in_content() -> None:
    first = rec("job_started")
    second = dict(first, event_id=first["event_id"].upper())
    [err] = parse_jsonl(jsonl(first, second))[1]
    assert (err.line, err.field) == (2, "event_id")


def test_batch_duplicates() -> None:
    obj = rec("job_started")
    records, errors = validate_batch([obj, dict(obj), dict(obj, gpus=2)])
    assert len(records) == 1
    [err] = errors
    assert (err.index, err.field, err.path) == (2, "event_id", "[2].event_id")
    assert "already used at [0]" in err.message


def test_batch_not_an_object() -> None:
    records, errors = validate_batch([rec("job_started"), True])
    assert len(records) == 1
    [err] = errors
    assert (err.index, err.field, err.path) == (1, "", "[1]")
    assert str(err) == "field '[1]': record must be a JSON object, not a boolean"


def test_batch_must_be_a_list() -> None:
    with pytest.raises(TypeError):
        validate_batch("[]")
    with pytest.raises(TypeError):
        validate_batch({"kind": "job_started"})  # type: ignore[arg-type]


def test_empty_batch() -> None:
    assert validate_batch([]) == ([], [])


# ------------------------------------------------------------------------ references


def _records(*objs: dict[str, Any]) -> list[Record]:
    records, errors = parse_jsonl(jsonl(*objs))
    assert errors == []
    return records


def test_reference_to_earlier_failure_in_batch_needs_no_lookup() -> None:
    failure = rec("failure")
    fid = failure["event_id"]
    records = _records(
        failure, rec("outcome", failure_event_id=fid), rec("exclusion", failure_event_id=fid)
    )

    def lookup(ids: set[str]) -> set[str]:
        raise AssertionError("no lookup expected")

    assert check_references(records, lookup) == []


def test_reference_resolved_by_lookup_called_once() -> None:
    known, unknown = str(uuid.uuid4()), str(uuid.uuid4())
    records = _records(
        rec("outcome", failure_event_id=known),
        rec("exclusion", failure_event_id=known.upper()),
        rec("outcome", failure_event_id=unknown, outcome="failed", lost_steps=9),
    )
    calls: list[set[str]] = []

    def lookup(ids: set[str]) -> set[str]:
        calls.append(set(ids))
        return ids & {known}

    errors = check_references(records, lookup)
    assert calls == [{known, unknown}]
    [err] = errors
    assert (err.line, err.field) == (3, "failure_event_id")
    assert err.message == f"unknown failure event {unknown}"


def test_unknown_reference_for_exclusion_in_api_batch() -> None:
    records, _ = validate_batch([rec("job_started"), rec("exclusion")])
    [err] = check_references(records, lambda ids: set())
    assert (err.index, err.path) == (1, "[1].failure_event_id")


def test_reference_to_a_later_failure_in_the_batch_resolves() -> None:
    failure = rec("failure")
    records = _records(rec("outcome", failure_event_id=failure["event_id"]), failure)
    assert check_references(records, lambda ids: pytest.fail("called")) == []


def test_reference_to_a_non_failure_record_is_refused() -> None:
    job = rec("job_started")
    records = _records(job, rec("outcome", failure_event_id=job["event_id"]))
    [err] = check_references(records, lambda ids: set())
    assert (err.line, err.field) == (2, "failure_event_id")
    assert "is a job_started record, not a failure" in err.message


def test_no_references_no_lookup() -> None:
    records = _records(rec("job_started"), rec("failure"))
    assert check_references(records, lambda ids: pytest.fail("called")) == []


# ------------------------------------------------------------------------ RecordError


def test_record_error_format_and_dict() -> None:
    err = RecordError("must be an integer > 0", field="gpus", line=7)
    assert str(err) == "line 7: field 'gpus': must be an integer > 0"
    assert isinstance(err, ValueError)
    assert err.to_dict() == {
        "line": 7,
        "index": None,
        "field": "gpus",
        "path": "gpus",
        "message": "must be an integer > 0",
    }
    assert str(RecordError("bad", line=2)) == "line 2: bad"
    assert str(RecordError("bad")) == "bad"
    assert RecordError("x", field="[0]", index=3).path == "[3][0]"


def test_record_error_pickles() -> None:
    err = RecordError("m", field="terms.credit_percent", index=2)
    again = pickle.loads(pickle.dumps(err))
    assert (again.message, again.field, again.line, again.index) == ("m", err.field, None, 2)


# ------------------------------------------------------------------------ contracts


def contract(**changes: Any) -> dict[str, Any]:
    obj: dict[str, Any] = {
        "contract_id": "acme-2025",
        "customer": "Acme Corp",
        "start_date": "2025-01-01",
        "currency": "USD",
        "annual_value": "1200000.00",
    }
    for key, value in changes.items():
        if value is DROP:
            obj.pop(key, None)
        else:
            obj[key] = value
    return obj


def good_contract(obj: dict[str, Any]) -> ContractSpec:
    spec, errors = validate_contract(obj)
    assert errors == [], [str(e) for e in errors]
    assert spec is not None
    return spec


def test_minimal_contract_gets_defaults() -> None:
    spec = good_contract(contract())
    assert spec == ContractSpec(
        contract_id="acme-2025",
        customer="Acme Corp",
        start_date=date(2025, 1, 1),
        currency="USD",
        annual_value=Decimal("1200000.00"),
    )
    assert spec.timezone == "UTC"
    assert spec.term_years == 1
    assert spec.terms == ContractTerms(
        threshold_percent=Decimal(90),
        credit_percent=Decimal(25),
        covered_classes=("unplanned", "preemptive"),
        excluded_causes=("network_wide_outage", "facility_power", "customer_code"),
    )
    assert spec.credit_base == Decimal("1200000.00")


def test_contract_to_record_is_normalized_with_defaults() -> None:
    record = good_contract(contract()).to_record()
    assert record == {
        "contract_id": "acme-2025",
        "customer": "Acme Corp",
        "start_date": "2025-01-01",
        "timezone": "UTC",
        "term_years": 1,
        "currency": "USD",
        "annual_value": "1200000.00",
        "renewal_value": None,
        "gpu_hour_price": None,
        "terms": {
            "threshold_percent": "90",
            "credit_percent": "25",
            "covered_classes": ["unplanned", "preemptive"],
            "excluded_causes": ["network_wide_outage", "facility_power", "customer_code"],
        },
    }
    assert canonical_bytes(record) == (
        b'{"annual_value":"1200000.00","contract_id":"acme-2025","currency":"USD",'
        b'"customer":"Acme Corp","gpu_hour_price":null,"renewal_value":null,'
        b'"start_date":"2025-01-01","term_years":1,"terms":{"covered_classes":'
        b'["unplanned","preemptive"],"credit_percent":"25","excluded_causes":'
        b'["network_wide_outage","facility_power","customer_code"],"threshold_percent":"90"},'
        b'"timezone":"UTC"}'
    )


def test_full_contract_round_trip() -> None:
    obj = contract(
        start_date="2024-02-29",
        timezone="America/New_York",
        term_years=3,
        currency="EUR",
        annual_value="1200000.50",
        renewal_value="1500000",
        gpu_hour_price="2.4975",
        terms={
            "threshold_percent": 92.5,
            "credit_percent": "30.0",
            "covered_classes": ["planned", "unplanned"],
            "excluded_causes": [],
        },
    )
    spec = good_contract(obj)
    assert spec.start_date == date(2024, 2, 29)
    assert spec.renewal_value == Decimal("1500000")
    assert spec.credit_base == Decimal("1500000")
    assert spec.terms.threshold_percent == Decimal("92.5")
    record = spec.to_record()
    assert record["annual_value"] == "1200000.50"
    assert record["gpu_hour_price"] == "2.4975"
    assert record["terms"] == {
        "threshold_percent": "92.5",
        "credit_percent": "30.0",
        "covered_classes": ["planned", "unplanned"],
        "excluded_causes": [],
    }
    assert contract_from_record(record) == spec
    assert contract_from_record(record).to_record() == record
    # through JSON text (as it comes back from the journal) too
    assert contract_from_record(json.loads(canonical_bytes(record))) == spec


def test_small_decimal_is_kept_without_exponent() -> None:
    record = good_contract(contract(gpu_hour_price="0.0000001")).to_record()
    assert record["gpu_hour_price"] == "0.0000001"


@pytest.mark.parametrize(
    ("currency", "value"),
    [("JPY", "1200000"), ("JPY", "1200000.00"), ("KWD", "10.125"), ("CLF", "1.2345")],
)
def test_contract_value_within_minor_units(currency: str, value: str) -> None:
    assert good_contract(contract(currency=currency, annual_value=value)).annual_value == Decimal(
        value
    )


def test_percent_numbers_and_strings() -> None:
    for given, expected in [(100, "100"), ("0.5", "0.5"), (1e2, "100"), (99.99, "99.99")]:
        spec = good_contract(contract(terms={"threshold_percent": given}))
        assert spec.to_record()["terms"]["threshold_percent"] == expected


def test_terms_null_means_defaults() -> None:
    assert good_contract(contract(terms=None)).terms == ContractTerms()
    assert good_contract(contract(terms={})).terms == ContractTerms()


CONTRACT_REFUSALS: list[tuple[str, Any, str, str]] = [
    ("contract_id", DROP, "contract_id", "missing required field"),
    ("contract_id", "", "contract_id", "non-empty"),
    ("contract_id", "x" * 201, "contract_id", "at most 200"),
    ("contract_id", "a\tb", "contract_id", "control characters"),
    ("customer", DROP, "customer", "missing required field"),
    ("customer", 5, "customer", "not a number"),
    ("start_date", DROP, "start_date", "missing required field"),
    ("start_date", "2025-1-5", "start_date", "YYYY-MM-DD"),
    ("start_date", "20250105", "start_date", "YYYY-MM-DD"),
    ("start_date", "2025-01-05T00:00:00Z", "start_date", "YYYY-MM-DD"),
    ("start_date", "2023-02-29", "start_date", "day is out of range"),
    ("start_date", 20250105, "start_date", "not a number"),
    ("timezone", "Mars/Olympus_Mons", "timezone", "unknown IANA time zone"),
    ("timezone", "", "timezone", "unknown IANA time zone"),
    ("timezone", "../../etc/passwd", "timezone", "unknown IANA time zone"),
    ("timezone", "/etc/localtime", "timezone", "unknown IANA time zone"),
    ("timezone", " UTC", "timezone", "unknown IANA time zone"),
    ("timezone", 0, "timezone", "not a number"),
    ("term_years", 0, "term_years", "must be an integer > 0"),
    ("term_years", -1, "term_years", "must be an integer > 0"),
    ("term_years", 1.0, "term_years", "JSON integer"),
    ("term_years", True, "term_years", "not a boolean"),
    ("term_years", "2", "term_years", "not a string"),
    ("term_years", 101, "term_years", "at most 100"),
    ("currency", DROP, "currency", "missing required field"),
    ("currency", "usd", "currency", "3 uppercase letters"),
    ("currency", "US", "currency", "3 uppercase letters"),
    ("currency", "USDX", "currency", "3 uppercase letters"),
    ("currency", "ABC", "currency", "unknown ISO 4217 currency code 'ABC'"),
    ("currency", "XAU", "currency", "unknown ISO 4217"),
    ("currency", 840, "currency", "not a number"),
    ("annual_value", DROP, "annual_value", "missing required field"),
    ("annual_value", 1200000.0, "annual_value", "money is never a JSON number"),
    ("annual_value", 1200000, "annual_value", "money is never a JSON number"),
    ("annual_value", "0", "annual_value", "must be > 0"),
    ("annual_value", "0.00", "annual_value", "must be > 0"),
    ("annual_value", "-5", "annual_value", "must be > 0"),
    ("annual_value", "1e6", "annual_value", "no exponent"),
    ("annual_value", "1,200,000.00", "annual_value", "decimal string"),
    ("annual_value", "01200000", "annual_value", "leading zeros"),
    ("annual_value", "+5", "annual_value", "decimal string"),
    ("annual_value", "5.", "annual_value", "decimal string"),
    ("annual_value", ".5", "annual_value", "decimal string"),
    ("annual_value", " 5", "annual_value", "decimal string"),
    ("annual_value", "", "annual_value", "decimal string"),
    ("annual_value", "NaN", "annual_value", "decimal string"),
    ("annual_value", "1" * 41, "annual_value", "decimal string"),
    ("annual_value", "1200000.001", "annual_value", "more decimals than USD allows (2)"),
    ("renewal_value", "0", "renewal_value", "must be > 0"),
    ("renewal_value", 5.0, "renewal_value", "never a JSON number"),
    ("renewal_value", "1.005", "renewal_value", "more decimals than USD"),
    ("gpu_hour_price", "-1", "gpu_hour_price", "must be >= 0"),
    ("gpu_hour_price", 2.5, "gpu_hour_price", "never a JSON number"),
    ("terms", [], "terms", "must be an object, not an array"),
    ("terms", "default", "terms", "must be an object"),
    ("region", "eu", "region", "unknown field for a contract"),
]


@pytest.mark.parametrize(
    ("key", "value", "field", "message"),
    CONTRACT_REFUSALS,
    ids=[f"{k}={v!r:.20}" for k, v, _, _ in CONTRACT_REFUSALS],
)
def test_contract_refusal_jsonl_names_line_and_field(
    key: str, value: Any, field: str, message: str
) -> None:
    data = jsonl(contract(contract_id="first"), b"", contract(**{key: value}))
    specs, errors = parse_contracts(data)
    assert [s.contract_id for s in specs] == ["first"]
    assert len(errors) == 1, [str(e) for e in errors]
    err = errors[0]
    assert (err.line, err.index, err.field) == (3, None, field)
    assert message in err.message
    assert str(err).startswith(f"line 3: field '{field}': ")


TERMS_REFUSALS: list[tuple[str, Any, str, str]] = [
    ("threshold_percent", 0, "terms.threshold_percent", "must be > 0 and <= 100 (got 0)"),
    ("threshold_percent", 100.5, "terms.threshold_percent", "<= 100"),
    ("threshold_percent", "101", "terms.threshold_percent", "<= 100"),
    ("threshold_percent", "-5", "terms.threshold_percent", "> 0"),
    ("threshold_percent", "90%", "terms.threshold_percent", "decimal string"),
    ("threshold_percent", True, "terms.threshold_percent", "not a boolean"),
    ("threshold_percent", [90], "terms.threshold_percent", "not an array"),
    ("credit_percent", 0, "terms.credit_percent", "> 0"),
    ("credit_percent", "0.0", "terms.credit_percent", "> 0"),
    ("covered_classes", [], "terms.covered_classes", "must not be empty"),
    ("covered_classes", "unplanned", "terms.covered_classes", "must be an array"),
    (
        "covered_classes",
        ["unplanned", "unplanned"],
        "terms.covered_classes[1]",
        "duplicate 'unplanned'",
    ),
    ("covered_classes", ["unplanned", "sudden"], "terms.covered_classes[1]", "must be one of"),
    ("covered_classes", [1], "terms.covered_classes[0]", "not a number"),
    ("excluded_causes", ["Bad-Code"], "terms.excluded_causes[0]", "cause code"),
    ("excluded_causes", ["thermal", "thermal"], "terms.excluded_causes[1]", "duplicate"),
    ("excluded_causes", None, "", ""),  # null = default: not an error (checked below)
    ("excluded_causes", {}, "terms.excluded_causes", "must be an array"),
    ("surprise", 1, "terms.surprise", "unknown field for terms"),
]


@pytest.mark.parametrize(
    ("key", "value", "field", "message"),
    TERMS_REFUSALS,
    ids=[f"{k}={v!r:.20}" for k, v, _, _ in TERMS_REFUSALS],
)
def test_terms_refusal_array_names_index_and_path(
    key: str, value: Any, field: str, message: str
) -> None:
    data = json.dumps([contract(contract_id="a"), contract(terms={key: value})]).encode()
    specs, errors = parse_contracts(data)
    if not field:
        assert errors == []
        return
    assert [s.contract_id for s in specs] == ["a"]
    assert len(errors) == 1, [str(e) for e in errors]
    err = errors[0]
    assert (err.line, err.index, err.field, err.path) == (None, 1, field, f"[1].{field}")
    assert message in err.message


def test_contract_array_paths_like_index_currency() -> None:
    data = json.dumps(
        [contract(contract_id="a"), contract(contract_id="b"), contract(currency="usd")]
    ).encode()
    specs, errors = parse_contracts(b"\n  " + data)
    assert [s.contract_id for s in specs] == ["a", "b"]
    [err] = errors
    assert err.path == "[2].currency"
    assert str(err).startswith("field '[2].currency': ")


def test_contract_array_element_not_an_object() -> None:
    specs, errors = parse_contracts(b'[1, "x"]')
    assert specs == []
    assert [(e.index, e.field) for e in errors] == [(0, ""), (1, "")]


def test_contract_array_json_error_names_line() -> None:
    specs, errors = parse_contracts(b'[\n  {"contract_id": "a"},\n  {"contract_id": }\n]')
    assert specs == []
    [err] = errors
    assert (err.line, err.index, err.field) == (3, None, "")
    assert "invalid JSON" in err.message


def test_contract_array_duplicate_key_names_index_and_field() -> None:
    text = b'[{"contract_id": "a"}, {"currency": "USD", "currency": "EUR"}]'
    _, errors = parse_contracts(text)
    [err] = errors
    assert (err.index, err.field, err.path) == (1, "currency", "[1].currency")


def test_contract_jsonl_not_an_object_and_bad_json() -> None:
    specs, errors = parse_contracts(jsonl(contract(), b"not json", b'"x"'))
    assert len(specs) == 1
    assert [(e.line, e.field) for e in errors] == [(2, ""), (3, "")]


def test_contract_array_with_trailing_garbage() -> None:
    specs, errors = parse_contracts(json.dumps([contract()]).encode() + b" []")
    assert specs == []
    assert len(errors) == 1
    assert errors[0].line == 1


def test_all_contract_errors_reported() -> None:
    bad = contract(currency="usd", annual_value=5.0, terms={"credit_percent": 0, "x": 1})
    del bad["customer"]
    _, errors = parse_contracts(jsonl(bad))
    assert [e.field for e in errors] == [
        "customer",
        "currency",
        "annual_value",
        "terms.credit_percent",
        "terms.x",
    ]


def test_duplicate_contract_ids_in_a_file() -> None:
    same = contract()
    changed = contract(annual_value="1.00")
    specs, errors = parse_contracts(jsonl(same, same, changed))
    assert len(specs) == 1
    [err] = errors
    assert (err.line, err.field) == (3, "contract_id")
    assert "already defined at line 1 with different content" in err.message
    specs, errors = parse_contracts(json.dumps([same, changed]).encode())
    [err] = errors
    assert (err.index, err.field) == (1, "contract_id")
    assert "already defined at [0]" in err.message


def test_empty_contract_files() -> None:
    assert parse_contracts(b"") == ([], [])
    assert parse_contracts(b"[]") == ([], [])


def test_contract_from_record_raises_first_error() -> None:
    with pytest.raises(RecordError) as info:
        contract_from_record(contract(currency="usd", annual_value="-1"))
    assert info.value.field == "currency"
    assert info.value.line is None


def test_currency_list_has_one_home() -> None:
    # billing.money takes its exponents from the ledger's table: one list, not two copies.
    from billing import money

    assert money.CURRENCY_EXPONENTS is CURRENCY_MINOR_UNITS
    assert money.minor_unit_exponent("JPY") == 0 and money.minor_unit_exponent("KWD") == 3


# ------------------------------------------------------------------------ the documentation

DOC = Path(__file__).resolve().parents[2] / "docs" / "ingestion.md"


def _blocks(lang: str) -> list[str]:
    text = DOC.read_text(encoding="utf-8")
    return re.findall(rf"```{lang}\n(.*?)```", text, flags=re.DOTALL)


def test_documented_examples_are_valid() -> None:
    records_block, contracts_block = _blocks("jsonl")
    records, errors = parse_jsonl(records_block.encode())
    assert errors == []
    assert [r.kind for r in records] == [
        "job_started",
        "job_progress",
        "failure",
        "outcome",
        "exclusion",
        "job_finished",
    ]
    assert check_references(records, lambda ids: set()) == []
    specs, errors = parse_contracts(contracts_block.encode())
    assert errors == []
    [journal_form] = _blocks("json")
    assert specs[0].to_record() == json.loads(journal_form)
    assert len(specs) == 2
