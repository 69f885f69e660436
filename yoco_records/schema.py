"""The ingestion-record rules, in one torch-free home (DESIGN section 4).

Both the ledger (:mod:`ledger.records`, every batch the command line, the API and the
runtime's sink append) and the runtime (:mod:`runtime.records`, every record before it
becomes durable in the outbox) validate records with :func:`validate_record` here, so a
record one side accepts the other never refuses. Pure functions; the standard library
and ``rfc8785`` only (no database, no torch).

Every refusal is a :class:`RecordError` naming the line (JSONL files) or the batch index
(API), and the field as a JSON path relative to the record (``gpus``). The format and
every rule are documented in ``docs/ingestion.md``.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta, timezone
from decimal import Decimal
from typing import Any, Final, TypeAlias

from yoco_records.canonical import (
    MAX_SAFE_INTEGER,
    CanonicalizationError,
    JsonInputError,
    canonical_bytes,
    decimal_of,
    ecma_float,
    format_path,
    quote,
)

KINDS: Final = (
    "job_started",
    "job_progress",
    "job_finished",
    "failure",
    "outcome",
    "exclusion",
)
FAILURE_CLASSES: Final = ("unplanned", "preemptive", "planned")
OUTCOMES: Final = ("live_migrated", "rolled_back", "failed")

#: The UUID version producers' event ids must have (random; see :func:`is_producer_event_id`).
PRODUCER_UUID_VERSION: Final = 4

ID_MAX_LEN: Final = 200
#: Largest value of an int4 column (gpus, gpu, gpus_affected are stored as integer).
INT4_MAX: Final = 2**31 - 1
#: Largest step_seconds / recovery_seconds: about 31.7 years, far beyond any real step.
SECONDS_MAX: Final = 10**9
#: UTC offsets in use run from -12:00 to +14:00; PostgreSQL takes no more than 15:59.
OFFSET_MAX_MINUTES: Final = 14 * 60
#: Records may be dated at most this far after the ledger's clock (producers' clocks drift).
FUTURE_SKEW_HOURS: Final = 24
FUTURE_SKEW: Final = timedelta(hours=FUTURE_SKEW_HOURS)
#: No record is older than the Unix epoch (and every bound stays inside what
#: datetime and timestamptz hold, in every offset).
EARLIEST: Final = datetime(1970, 1, 1, tzinfo=UTC)
TEXT_MAX_LEN: Final = 4000
#: How far a recovery may end after the outcome's ``occurred_at`` or the job's end and
#: still lie "within" them: producers write ``recovery_seconds`` as a float difference of
#: two clock readings and timestamps to the microsecond, so equal instants can differ by
#: a microsecond or two after rounding (docs/definitions.md, "Plausibility").
RECOVERY_SLACK: Final = timedelta(milliseconds=1)

_CAUSE = re.compile(r"[a-z][a-z0-9_]{0,63}")
_UUID = re.compile(r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}")
_NIL_UUID = "00000000-0000-0000-0000-000000000000"
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")
_TIMESTAMP = re.compile(
    r"(?P<y>[0-9]{4})-(?P<mo>[0-9]{2})-(?P<d>[0-9]{2})[Tt]"
    r"(?P<h>[0-9]{2}):(?P<mi>[0-9]{2}):(?P<s>[0-9]{2})(?:\.(?P<frac>[0-9]{1,6}))?"
    r"(?P<tz>[Zz]|(?P<sign>[+-])(?P<oh>[0-9]{2}):(?P<om>[0-9]{2}))?"
)


# --------------------------------------------------------------------------- errors


class RecordError(ValueError):
    """One refused record (or one refused field of a record).

    ``line`` is the 1-based line in a JSONL file, ``index`` the 0-based position in an
    API batch or a JSON array of contracts (at most one of them is set; neither for a
    record checked on its own). ``field`` is the JSON path of the offending value relative
    to the record (``gpus``, ``terms.threshold_percent``; ``""`` for the record as a
    whole) and ``path`` the same path prefixed with the batch index (``[3].gpus``).
    ``str()`` reads ``line 7: field 'gpus': must be an integer > 0 (got 0)``.
    """

    def __init__(
        self,
        message: str,
        *,
        field: str = "",
        line: int | None = None,
        index: int | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.field = field
        self.line = line
        self.index = index

    @property
    def path(self) -> str:
        """The field's JSON path including the batch index: ``[3].gpus`` (or ``gpus``)."""
        if self.index is None:
            return self.field
        if not self.field or self.field.startswith("["):
            return f"[{self.index}]{self.field}"
        return f"[{self.index}].{self.field}"

    def __str__(self) -> str:
        where = f"line {self.line}: " if self.line is not None else ""
        path = self.path
        if path:
            return f"{where}field '{path}': {self.message}"
        return f"{where}{self.message}"

    def __repr__(self) -> str:
        return (
            f"RecordError({self.message!r}, field={self.field!r}, "
            f"line={self.line!r}, index={self.index!r})"
        )

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild_record_error, (self.message, self.field, self.line, self.index))

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict: ``line``, ``index``, ``field``, ``path``, ``message``."""
        return {
            "line": self.line,
            "index": self.index,
            "field": self.field,
            "path": self.path,
            "message": self.message,
        }


def _rebuild_record_error(
    message: str, field: str, line: int | None, index: int | None
) -> RecordError:
    return RecordError(message, field=field, line=line, index=index)


# --------------------------------------------------------------------------- records


@dataclass(frozen=True, slots=True)
class JobStarted:
    """``job_started``: a job began with ``gpus`` GPUs."""

    job_id: str
    gpus: int


@dataclass(frozen=True, slots=True)
class JobProgress:
    """``job_progress``: the job reached ``step``; a step takes ``step_seconds``."""

    job_id: str
    step: int
    step_seconds: Decimal


@dataclass(frozen=True, slots=True)
class JobFinished:
    """``job_finished``: the job ended at ``step``."""

    job_id: str
    step: int


@dataclass(frozen=True, slots=True)
class FailureRec:
    """``failure``: one interruption of a job by the infrastructure."""

    job_id: str
    failure_class: str
    cause: str
    node: str | None = None
    gpu: int | None = None
    step: int | None = None
    detail: str | None = None


@dataclass(frozen=True, slots=True)
class OutcomeRec:
    """``outcome``: how the failure ``failure_event_id`` was resolved."""

    failure_event_id: str
    outcome: str
    lost_steps: int
    recovery_seconds: Decimal
    step_seconds: Decimal
    gpus_affected: int


@dataclass(frozen=True, slots=True)
class ExclusionRec:
    """``exclusion``: the failure ``failure_event_id`` is excluded from the guarantee."""

    failure_event_id: str
    reason: str
    approved_by: str


RecordData: TypeAlias = (
    JobStarted | JobProgress | JobFinished | FailureRec | OutcomeRec | ExclusionRec
)


@dataclass(frozen=True)
class Record:
    """One valid ingestion record.

    ``event_id`` is the canonical lowercase UUID, ``occurred_at`` an aware datetime (with
    the offset given), ``data`` the typed per-kind fields, ``body`` the parsed object
    exactly as received (do not mutate it) and ``canonical`` its RFC 8785 bytes -- what
    the journal stores and hashes. ``line``/``index`` say where the record came from and
    take no part in equality.
    """

    kind: str
    event_id: str
    contract_id: str
    occurred_at: datetime
    data: RecordData
    body: dict[str, Any] = field(compare=False, repr=False)
    canonical: bytes = field(repr=False)
    line: int | None = field(default=None, compare=False)
    index: int | None = field(default=None, compare=False)


# --------------------------------------------------------------------------- checks

_INVALID: Final = object()
_ABSENT: Final = object()


class _Ctx:
    """Collects the errors of one record."""

    __slots__ = ("errors", "index", "line", "now")

    def __init__(
        self, line: int | None, index: int | None, now: datetime | None = None
    ) -> None:
        self.line = line
        self.index = index
        self.now = now
        self.errors: list[RecordError] = []

    def fail(self, path: str, message: str) -> Any:
        self.errors.append(RecordError(message, field=path, line=self.line, index=self.index))
        return _INVALID


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list | tuple):
        return "an array"
    if isinstance(value, dict):
        return "an object"
    return type(value).__name__


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


_Check = Callable[[_Ctx, str, Any], Any]


def _id_string(ctx: _Ctx, path: str, value: Any) -> Any:
    if not isinstance(value, str):
        return ctx.fail(path, f"must be a non-empty string, not {_json_type(value)}")
    if not value.strip():
        return ctx.fail(path, "must be a non-empty string")
    if len(value) > ID_MAX_LEN:
        return ctx.fail(path, f"must be at most {ID_MAX_LEN} characters (got {len(value)})")
    if _CONTROL.search(value):
        return ctx.fail(path, "must not contain control characters")
    return value


def _text(max_len: int, *, blank_ok: bool) -> _Check:
    def check(ctx: _Ctx, path: str, value: Any) -> Any:
        if not isinstance(value, str):
            return ctx.fail(path, f"must be a string, not {_json_type(value)}")
        if not blank_ok and not value.strip():
            return ctx.fail(path, "must be a non-empty string")
        if len(value) > max_len:
            return ctx.fail(path, f"must be at most {max_len} characters (got {len(value)})")
        if "\x00" in value:
            # PostgreSQL text and jsonb cannot hold U+0000.
            return ctx.fail(path, "must not contain the NUL character (U+0000)")
        return value

    return check


def _integer(minimum: int, maximum: int = MAX_SAFE_INTEGER) -> _Check:
    bound = "an integer > 0" if minimum == 1 else f"an integer >= {minimum}"

    def check(ctx: _Ctx, path: str, value: Any) -> Any:
        if isinstance(value, bool) or not isinstance(value, int | float):
            return ctx.fail(path, f"must be {bound}, not {_json_type(value)}")
        if isinstance(value, float):
            return ctx.fail(
                path, f"must be {bound} written as a JSON integer (got {value!r}, not an integer)"
            )
        if value < minimum:
            return ctx.fail(path, f"must be {bound} (got {value})")
        if value > maximum:
            return ctx.fail(path, f"must be at most {maximum} (got {value})")
        return value

    return check


def _number(*, positive: bool) -> _Check:
    bound = "a number > 0" if positive else "a number >= 0"

    def check(ctx: _Ctx, path: str, value: Any) -> Any:
        if isinstance(value, bool) or not isinstance(value, int | float):
            return ctx.fail(path, f"must be {bound} (a JSON number), not {_json_type(value)}")
        try:
            amount = decimal_of(value)
        except ValueError:
            return ctx.fail(path, f"must be {bound} (got {value!r})")
        if amount < 0 or (positive and amount == 0):
            return ctx.fail(path, f"must be {bound} (got {amount})")
        if amount > SECONDS_MAX:
            return ctx.fail(path, f"must be at most {SECONDS_MAX} seconds (got {amount})")
        return amount

    return check


def _choice(allowed: tuple[str, ...]) -> _Check:
    listed = ", ".join(allowed)

    def check(ctx: _Ctx, path: str, value: Any) -> Any:
        if not isinstance(value, str):
            return ctx.fail(path, f"must be one of {listed}, not {_json_type(value)}")
        if value not in allowed:
            return ctx.fail(path, f"must be one of {listed} (got {_shown(value)})")
        return value

    return check


def _cause(ctx: _Ctx, path: str, value: Any) -> Any:
    if not isinstance(value, str):
        return ctx.fail(path, f"must be a cause code (string), not {_json_type(value)}")
    if not _CAUSE.fullmatch(value):
        return ctx.fail(
            path,
            f"must be a cause code: a lowercase letter, then up to 63 lowercase letters, "
            f"digits or '_' (got {_shown(value)})",
        )
    return value


def _uuid(ctx: _Ctx, path: str, value: Any) -> Any:
    if not isinstance(value, str):
        return ctx.fail(path, f"must be a UUID string, not {_json_type(value)}")
    if not _UUID.fullmatch(value):
        return ctx.fail(
            path,
            f"must be a UUID in the form xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx "
            f"(got {_shown(value)})",
        )
    canonical = value.lower()
    if canonical == _NIL_UUID:
        return ctx.fail(path, "must not be the nil UUID")
    return canonical


def recovery_end(failure_at: datetime, recovery_seconds: Decimal | int | float) -> datetime:
    """The instant a failure's recovery ended: the failure's ``occurred_at`` plus the
    outcome's ``recovery_seconds`` (to the microsecond, rounded down)."""
    micros = int(Decimal(str(recovery_seconds)) * 1_000_000)
    return failure_at + timedelta(microseconds=micros)


def implausible_outcome(
    gpus_affected: int,
    lost_steps: int,
    *,
    job_gpus: int | None,
    reached_step: int | None,
    recovery_seconds: Decimal | int | float | None = None,
    failure_at: datetime | None = None,
    reported_at: datetime | None = None,
    job_end: datetime | None = None,
) -> list[tuple[str, str]]:
    """The plausibility rules of an ``outcome`` against its failure's job, as
    ``(field, message)`` pairs (empty: plausible). Checked where the job is known (the
    ledger's ingest, :mod:`ledger.plausibility`), so that one record cannot make a year's
    lost GPU-hours 1e30 (docs/definitions.md, "Plausibility", is the one statement):

    * ``gpus_affected`` is at most the job's GPUs (its ``job_started``), when known;
    * ``lost_steps`` is at most the step the job had reached at the failure (the
      failure's ``step``, else the job's latest ``job_progress`` before it), when known:
      a job cannot lose steps it never made;
    * the recovery lies within the failure's job: it begins at the failure
      (``failure_at``) and its end, ``failure_at + recovery_seconds``
      (:func:`recovery_end`), is no later than the outcome's own ``occurred_at``
      (``reported_at``: a recovery is reported once it is over) nor than the job's end
      (``job_end``, its ``job_finished``, when it has one), each up to
      :data:`RECOVERY_SLACK`.
    """
    problems: list[tuple[str, str]] = []
    if job_gpus is not None and gpus_affected > job_gpus:
        problems.append(("gpus_affected", f"must be at most the job's {job_gpus} GPUs "
                                          f"(got {gpus_affected})"))
    if reached_step is not None and lost_steps > reached_step:
        problems.append(("lost_steps", f"must be at most {reached_step}, the step the job "
                                       f"had reached at the failure (got {lost_steps})"))
    if recovery_seconds is not None and failure_at is not None:
        end = recovery_end(failure_at, recovery_seconds)
        shown = f"{_plain_seconds(recovery_seconds)} s after the failure at {_instant(failure_at)}"
        if reported_at is not None and end > reported_at + RECOVERY_SLACK:
            problems.append(("recovery_seconds", (
                f"must end by the outcome's occurred_at {_instant(reported_at)} (a recovery "
                f"is reported once it is over): {shown} ends at {_instant(end)}")))
        elif job_end is not None and end > job_end + RECOVERY_SLACK:
            problems.append(("recovery_seconds", (
                f"must end within the failure's job, which finished at {_instant(job_end)}: "
                f"{shown} ends at {_instant(end)}")))
    return problems


def _plain_seconds(value: Decimal | int | float) -> str:
    text = format(Decimal(str(value)), "f")
    return text.rstrip("0").rstrip(".") if "." in text else text


def _instant(when: datetime) -> str:
    return when.astimezone(UTC).isoformat().replace("+00:00", "Z")


def is_producer_event_id(value: str | uuid.UUID) -> bool:
    """Whether ``value`` is a random UUID v4 (RFC 9562 variant, version 4).

    Producers choose their event ids this way (DESIGN section 4); the ids the system
    derives for its own entries (contracts, year closes, credits, disputes, reports...)
    are never v4, so a producer can neither take one in advance nor ask about one.
    """
    if type(value) is str and len(value) == 36 and _UUID.fullmatch(value):
        # The hyphenated form: the version is the 13th hex digit, the RFC 9562 variant
        # the 17th (8, 9, a or b); as uuid.UUID reads them, without building one.
        return value[14] == "4" and value[19] in "89abAB"
    try:
        u = value if isinstance(value, uuid.UUID) else uuid.UUID(value)
    except ValueError:
        return False
    return u.variant == uuid.RFC_4122 and u.version == PRODUCER_UUID_VERSION


def _event_id(ctx: _Ctx, path: str, value: Any) -> Any:
    canonical = _uuid(ctx, path, value)
    if canonical is _INVALID:
        return canonical
    if not is_producer_event_id(canonical):
        return ctx.fail(
            path,
            "must be a random UUID v4 (version digit 4, variant 8, 9, a or b: "
            "xxxxxxxx-xxxx-4xxx-[89ab]xxx-xxxxxxxxxxxx); other versions are reserved for "
            f"the ledger's own entries (got {_shown(value)})",
        )
    return canonical


def _timestamp(ctx: _Ctx, path: str, value: Any) -> Any:
    if not isinstance(value, str):
        return ctx.fail(path, f"must be an ISO 8601 timestamp string, not {_json_type(value)}")
    m = _TIMESTAMP.fullmatch(value)
    if m is None:
        return ctx.fail(
            path,
            "must be an ISO 8601 timestamp with offset, YYYY-MM-DDTHH:MM:SS[.fff](Z|+HH:MM) "
            f"(got {_shown(value)})",
        )
    if m["tz"] is None:
        return ctx.fail(
            path, f"naive timestamp: must carry a UTC offset, Z or +HH:MM (got {_shown(value)})"
        )
    try:
        if m["tz"] in ("Z", "z"):
            tz = UTC
        else:
            hours, minutes = int(m["oh"]), int(m["om"])
            if minutes > 59 or hours * 60 + minutes > OFFSET_MAX_MINUTES:
                return ctx.fail(
                    path,
                    "UTC offset must lie between -14:00 and +14:00, the offsets in use "
                    f"(got {_shown(value)})",
                )
            offset = timedelta(hours=hours, minutes=minutes)
            tz = timezone(-offset if m["sign"] == "-" else offset)
        micro = int((m["frac"] or "0").ljust(6, "0")[:6])
        when = datetime(
            int(m["y"]),
            int(m["mo"]),
            int(m["d"]),
            int(m["h"]),
            int(m["mi"]),
            int(m["s"]),
            micro,
            tzinfo=tz,
        )
    except ValueError as exc:
        return ctx.fail(path, f"not a valid timestamp: {exc} (got {_shown(value)})")
    if when < EARLIEST:
        return ctx.fail(path, f"must not be before 1970-01-01T00:00:00Z (got {_shown(value)})")
    now = ctx.now if ctx.now is not None else datetime.now(UTC)
    if when > now + FUTURE_SKEW:
        return ctx.fail(
            path,
            f"lies in the future: more than {FUTURE_SKEW_HOURS} h after the ledger's clock "
            f"({now.astimezone(UTC).isoformat(timespec='seconds')}) (got {_shown(value)})",
        )
    return when


@dataclass(frozen=True, slots=True)
class _Field:
    check: _Check
    required: bool = True


_COMMON: Final[dict[str, _Field]] = {
    "kind": _Field(_id_string),  # checked separately; listed so it is not "unknown"
    "event_id": _Field(_event_id),
    "contract_id": _Field(_id_string),
    "occurred_at": _Field(_timestamp),
}

_COMMON_CHECKED: Final = {k: v for k, v in _COMMON.items() if k != "kind"}

_SPECS: Final[dict[str, tuple[type, dict[str, _Field]]]] = {
    "job_started": (
        JobStarted,
        {"job_id": _Field(_id_string), "gpus": _Field(_integer(1, INT4_MAX))},
    ),
    "job_progress": (
        JobProgress,
        {
            "job_id": _Field(_id_string),
            "step": _Field(_integer(0)),
            "step_seconds": _Field(_number(positive=True)),
        },
    ),
    "job_finished": (
        JobFinished,
        {"job_id": _Field(_id_string), "step": _Field(_integer(0))},
    ),
    "failure": (
        FailureRec,
        {
            "job_id": _Field(_id_string),
            "failure_class": _Field(_choice(FAILURE_CLASSES)),
            "cause": _Field(_cause),
            "node": _Field(_id_string, required=False),
            "gpu": _Field(_integer(0, INT4_MAX), required=False),
            "step": _Field(_integer(0), required=False),
            "detail": _Field(_text(TEXT_MAX_LEN, blank_ok=True), required=False),
        },
    ),
    "outcome": (
        OutcomeRec,
        {
            "failure_event_id": _Field(_uuid),
            "outcome": _Field(_choice(OUTCOMES)),
            "lost_steps": _Field(_integer(0)),
            "recovery_seconds": _Field(_number(positive=False)),
            "step_seconds": _Field(_number(positive=True)),
            "gpus_affected": _Field(_integer(1, INT4_MAX)),
        },
    ),
    "exclusion": (
        ExclusionRec,
        {
            "failure_event_id": _Field(_uuid),
            "reason": _Field(_text(TEXT_MAX_LEN, blank_ok=False)),
            "approved_by": _Field(_id_string),
        },
    ),
}


#: The fields a record of each kind may carry (its own and the common ones).
_ALLOWED: Final[dict[str, frozenset[str]]] = {
    kind: frozenset([*_COMMON, *fields]) for kind, (_, fields) in _SPECS.items()
}


def _check_fields(
    ctx: _Ctx, obj: Mapping[str, Any], spec: Mapping[str, _Field], prefix: tuple[str, ...] = ()
) -> dict[str, Any]:
    """Check the fields of ``spec`` in ``obj``; absent/null optional fields come back None."""
    values: dict[str, Any] = {}
    for name, fld in spec.items():
        path = format_path((*prefix, name), root="") if prefix else name
        value = obj.get(name, _ABSENT)
        if value is _ABSENT or (value is None and not fld.required):
            if fld.required:
                ctx.fail(path, "missing required field")
                values[name] = _INVALID
            else:
                values[name] = None
            continue
        values[name] = fld.check(ctx, path, value)
    return values


def _check_unknown(
    ctx: _Ctx,
    obj: Mapping[str, Any],
    known: Iterable[str],
    what: str,
    prefix: tuple[str, ...] = (),
) -> None:
    allowed = known if isinstance(known, frozenset) else set(known)
    for key in obj:
        if key not in allowed:
            ctx.fail(format_path((*prefix, key), root=""), f"unknown field for {what}")


def validate_record(
    obj: Any,
    *,
    line: int | None = None,
    index: int | None = None,
    now: datetime | None = None,
) -> tuple[Record | None, list[RecordError]]:
    """Validate one parsed ingestion record.

    Promises: either ``(Record, [])`` for a valid record, or ``(None, errors)`` with every
    problem found (each a :class:`RecordError` carrying ``line``/``index`` as given and
    the field): not an object, unknown or missing ``kind``, missing required fields,
    wrong types, values out of range, unknown extra fields, and ``live_migrated`` with
    ``lost_steps`` > 0, values the database cannot store (NUL in text, an int4 column
    over 2**31 - 1, a timestamp before 1970 or with an offset beyond ±14:00) and
    records dated more than ``FUTURE_SKEW_HOURS`` after ``now`` (default: the clock).
    Does not check references to other records (see :func:`ledger.records.causal_order`).
    """
    if type(obj) is dict and obj.get("kind") == "job_progress":
        record = _valid_progress(obj, line, index, now)
        if record is not None:
            return record, []
    return _validate_general(obj, line, index, now)


#: The fields of a job_progress record (sorted, as its canonical bytes list them).
_PROGRESS_FIELDS: Final = frozenset(_ALLOWED["job_progress"])


def _valid_progress(
    obj: dict[str, Any], line: int | None, index: int | None, now: datetime | None
) -> Record | None:
    """The record :func:`_validate_general` makes of a valid ``job_progress`` object, or None.

    Progress records are almost every record a ledger takes, so they have this shortcut:
    exactly the kind's fields, each of the plain type its rule wants, the same rules
    read directly, and the canonical bytes written in the fields' sorted order. Anything
    else (an unusual type or layout, any refusal) returns None and goes the general way,
    which names the problem; ``tests/records/test_fast_paths.py`` holds the two equal.
    """
    if len(obj) != len(_PROGRESS_FIELDS):
        return None
    try:
        kind = obj["kind"]
        event_id = obj["event_id"]
        contract_id = obj["contract_id"]
        occurred = obj["occurred_at"]
        job_id = obj["job_id"]
        step = obj["step"]
        seconds = obj["step_seconds"]
    except KeyError:
        return None
    if not (
        type(kind) is str
        and kind == "job_progress"
        and type(event_id) is str
        and type(contract_id) is str
        and type(occurred) is str
        and type(job_id) is str
        and type(step) is int
        and 0 <= step <= MAX_SAFE_INTEGER
    ):
        return None
    # step_seconds: a number > 0, at most SECONDS_MAX, kept as its canonical decimal.
    if type(seconds) is int:
        if not 0 < seconds <= SECONDS_MAX:
            return None
        amount = Decimal(seconds)
        seconds_text = int.__repr__(seconds)
    elif type(seconds) is float and 0 < seconds <= SECONDS_MAX:
        # Far below 2**53: its canonical text is the ECMAScript layout of its shortest
        # digits, which lie on the same side of 0 and of SECONDS_MAX as the float.
        seconds_text = ecma_float(seconds)
        amount = Decimal(seconds_text)
    else:
        return None
    # event_id (_event_id): a hyphenated UUID of random version 4 (so not the nil UUID),
    # kept lowercase.
    if _UUID.fullmatch(event_id) is None:
        return None
    eid = event_id.lower()
    if eid[14] != "4" or eid[19] not in "89ab":
        return None
    # contract_id, job_id (_id_string).
    for name in (contract_id, job_id):
        if not name.strip() or len(name) > ID_MAX_LEN or _CONTROL.search(name):
            return None
    when = _common_time(occurred, now)
    if when is None:
        return None
    try:
        canonical = (
            '{"contract_id":' + quote(contract_id)
            + ',"event_id":' + quote(event_id)
            + ',"job_id":' + quote(job_id)
            + ',"kind":"job_progress","occurred_at":' + quote(occurred)
            + ',"step":' + int.__repr__(step)
            + ',"step_seconds":' + seconds_text + "}"
        ).encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate
        return None
    record = _new_record(Record)
    # Record's own __init__ sets its nine fields one object.__setattr__ call at a time (it
    # is frozen); the same fields set at once make an equal record (the tests compare).
    record.__dict__.update(
        kind="job_progress",
        event_id=eid,
        contract_id=contract_id,
        occurred_at=when,
        data=JobProgress(job_id, step, amount),
        body=obj,
        canonical=canonical,
        line=line,
        index=index,
    )
    return record


_new_record = object.__new__


def _common_time(value: str, now: datetime | None) -> datetime | None:
    """What :func:`_timestamp` accepts ``value`` as, for its usual layout, else None.

    The layout of :data:`_TIMESTAMP` with a ``Z`` or ``±HH:MM`` offset, read by
    ``datetime.fromisoformat`` (a tenth of the time of building the datetime from its
    parts); the same bounds. Anything else returns None (the general check decides).
    """
    m = _TIMESTAMP.fullmatch(value)
    # datetime() refuses hour 24 and second 60; say so here whatever fromisoformat takes.
    if m is None or m["h"] > "23" or m["s"] > "59":
        return None
    tz = m["tz"]
    if tz is None or tz == "z":
        return None
    if tz != "Z":
        minutes = int(m["om"])
        if minutes > 59 or int(m["oh"]) * 60 + minutes > OFFSET_MAX_MINUTES:
            return None
    try:
        when = datetime.fromisoformat(value)
    except ValueError:
        return None
    if when < EARLIEST or when > (now if now is not None else datetime.now(UTC)) + FUTURE_SKEW:
        return None
    return when


def _validate_general(
    obj: Any, line: int | None, index: int | None, now: datetime | None
) -> tuple[Record | None, list[RecordError]]:
    """:func:`validate_record` for any object: every rule, every error."""
    ctx = _Ctx(line, index, now)
    if not isinstance(obj, dict):
        ctx.fail("", f"record must be a JSON object, not {_json_type(obj)}")
        return None, ctx.errors
    kind = obj.get("kind", _ABSENT)
    spec: tuple[type, dict[str, _Field]] | None = None
    if kind is _ABSENT:
        ctx.fail("kind", "missing required field")
    elif not isinstance(kind, str) or kind not in _SPECS:
        shown = _shown(kind) if isinstance(kind, str) else _json_type(kind)
        ctx.fail("kind", f"unknown kind {shown} (expected one of {', '.join(KINDS)})")
    else:
        spec = _SPECS[kind]
    common = _check_fields(ctx, obj, _COMMON_CHECKED)
    if spec is None:
        return None, ctx.errors
    cls, fields = spec
    values = _check_fields(ctx, obj, fields)
    _check_unknown(ctx, obj, _ALLOWED[kind], f"kind {kind!r}")
    if (
        kind == "outcome"
        and values["outcome"] == "live_migrated"
        and isinstance(values["lost_steps"], int)
        and values["lost_steps"] > 0
    ):
        ctx.fail(
            "lost_steps",
            f"must be 0 when outcome is 'live_migrated' (got {values['lost_steps']})",
        )
    if ctx.errors:
        return None, ctx.errors
    try:
        canonical = canonical_bytes(obj)
    except CanonicalizationError as exc:
        ctx.fail((exc.path or "$")[1:].removeprefix("."), exc.message)
        return None, ctx.errors
    record = Record(
        kind=kind,
        event_id=common["event_id"],
        contract_id=common["contract_id"],
        occurred_at=common["occurred_at"],
        data=cls(**values),
        body=obj,
        canonical=canonical,
        line=line,
        index=index,
    )
    return record, []


def _line_error(exc: JsonInputError, line: int) -> RecordError:
    """A JSON error inside one JSONL line, reported at that line."""
    if exc.parts is not None:
        return RecordError(exc.message, field=format_path(exc.parts, root=""), line=line)
    message = exc.message
    if exc.column is not None:
        message = f"{message} at column {exc.column}"
    return RecordError(message, field="", line=line)


def _lines(data: bytes | str) -> Iterable[tuple[int, bytes]]:
    """Yield ``(line_number, line)`` for the non-blank lines of a JSONL text."""
    raw = data.encode("utf-8", "surrogatepass") if isinstance(data, str) else bytes(data)
    for number, line in enumerate(raw.split(b"\n"), start=1):
        if line.strip(b" \t\r"):
            yield number, line


