"""Validation of ingestion records and contract records (DESIGN.md section 4).

Pure functions, no database. Input is parsed with :func:`ledger.canonical.parse_json_strict`
and every refusal is a :class:`RecordError` naming the line (JSONL files) or the batch
index (API), and the field as a JSON path relative to the record (``gpus``,
``terms.threshold_percent``, ``terms.covered_classes[1]``). The format and every rule are
documented in ``docs/ingestion.md``.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta, timezone
from decimal import Decimal
from typing import Any, Final, TypeAlias
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from ledger.canonical import (
    CanonicalizationError,
    JsonInputError,
    canonical_bytes,
    decimal_of,
    format_path,
    parse_json_strict,
)

__all__ = [
    "COVERED_CLASSES_DEFAULT",
    "CURRENCY_MINOR_UNITS",
    "EXCLUDED_CAUSES_DEFAULT",
    "FAILURE_CLASSES",
    "KINDS",
    "OUTCOMES",
    "ContractSpec",
    "ContractTerms",
    "ExclusionRec",
    "FailureRec",
    "JobFinished",
    "JobProgress",
    "JobStarted",
    "OutcomeRec",
    "Record",
    "RecordData",
    "RecordError",
    "check_references",
    "contract_from_record",
    "parse_contracts",
    "parse_jsonl",
    "validate_batch",
    "validate_contract",
    "validate_record",
]

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
COVERED_CLASSES_DEFAULT: Final = ("unplanned", "preemptive")
EXCLUDED_CAUSES_DEFAULT: Final = ("network_wide_outage", "facility_power", "customer_code")

ID_MAX_LEN: Final = 200
TEXT_MAX_LEN: Final = 4000
TERM_YEARS_MAX: Final = 100
DECIMAL_MAX_LEN: Final = 40

_CAUSE = re.compile(r"[a-z][a-z0-9_]{0,63}")
_UUID = re.compile(r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}")
_NIL_UUID = "00000000-0000-0000-0000-000000000000"
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")
_TIMESTAMP = re.compile(
    r"(?P<y>[0-9]{4})-(?P<mo>[0-9]{2})-(?P<d>[0-9]{2})[Tt]"
    r"(?P<h>[0-9]{2}):(?P<mi>[0-9]{2}):(?P<s>[0-9]{2})(?:\.(?P<frac>[0-9]{1,6}))?"
    r"(?P<tz>[Zz]|(?P<sign>[+-])(?P<oh>[0-9]{2}):(?P<om>[0-9]{2}))?"
)
_DATE = re.compile(r"([0-9]{4})-([0-9]{2})-([0-9]{2})")
_DECIMAL = re.compile(r"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?")
_CURRENCY = re.compile(r"[A-Z]{3}")

# ISO 4217 currency codes (list one) with their minor units, the same set as
# billing/money.py (a test keeps the two equal). Codes for precious metals, SDRs, testing
# and "no currency" (XAU, XAG, XPD, XPT, XDR, XSU, XUA, XBA-XBD, XTS, XXX) are left out on
# purpose: a contract is not priced in them.
_MINOR_0 = "BIF CLP DJF GNF ISK JPY KMF KRW PYG RWF UGX UYI VND VUV XAF XOF XPF"
_MINOR_3 = "BHD IQD JOD KWD LYD OMR TND"
_MINOR_4 = "CLF UYW"
_MINOR_2 = (
    "AED AFN ALL AMD ANG AOA ARS AUD AWG AZN BAM BBD BDT BGN BMD BND BOB BOV BRL BSD "
    "BTN BWP BYN BZD CAD CDF CHE CHF CHW CNY COP COU CRC CUC CUP CVE CZK DKK DOP DZD "
    "EGP ERN ETB EUR FJD FKP GBP GEL GHS GIP GMD GTQ GYD HKD HNL HRK HTG HUF IDR ILS "
    "INR IRR JMD KES KGS KHR KPW KYD KZT LAK LBP LKR LRD LSL MAD MDL MGA MKD MMK MNT "
    "MOP MRU MUR MVR MWK MXN MXV MYR MZN NAD NGN NIO NOK NPR NZD PAB PEN PGK PHP PKR "
    "PLN QAR RON RSD RUB SAR SBD SCR SDG SEK SGD SHP SLE SLL SOS SRD SSP STN SVC SYP "
    "SZL THB TJS TMT TOP TRY TTD TWD TZS UAH USD USN UYU UZS VED VES WST XCD XCG YER "
    "ZAR ZMW ZWG ZWL"
)
CURRENCY_MINOR_UNITS: Final[Mapping[str, int]] = {
    **dict.fromkeys(_MINOR_2.split(), 2),
    **dict.fromkeys(_MINOR_0.split(), 0),
    **dict.fromkeys(_MINOR_3.split(), 3),
    **dict.fromkeys(_MINOR_4.split(), 4),
}


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

    __slots__ = ("errors", "index", "line")

    def __init__(self, line: int | None, index: int | None) -> None:
        self.line = line
        self.index = index
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
        return value

    return check


def _integer(minimum: int) -> _Check:
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
            if hours > 23 or minutes > 59:
                raise ValueError("UTC offset out of range")
            offset = timedelta(hours=hours, minutes=minutes)
            tz = timezone(-offset if m["sign"] == "-" else offset)
        micro = int((m["frac"] or "0").ljust(6, "0")[:6])
        return datetime(
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


@dataclass(frozen=True, slots=True)
class _Field:
    check: _Check
    required: bool = True


_COMMON: Final[dict[str, _Field]] = {
    "kind": _Field(_id_string),  # checked separately; listed so it is not "unknown"
    "event_id": _Field(_uuid),
    "contract_id": _Field(_id_string),
    "occurred_at": _Field(_timestamp),
}

_COMMON_CHECKED: Final = {k: v for k, v in _COMMON.items() if k != "kind"}

_SPECS: Final[dict[str, tuple[type, dict[str, _Field]]]] = {
    "job_started": (
        JobStarted,
        {"job_id": _Field(_id_string), "gpus": _Field(_integer(1))},
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
            "gpu": _Field(_integer(0), required=False),
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
            "gpus_affected": _Field(_integer(1)),
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
    allowed = set(known)
    for key in obj:
        if key not in allowed:
            ctx.fail(format_path((*prefix, key), root=""), f"unknown field for {what}")


def validate_record(
    obj: Any, *, line: int | None = None, index: int | None = None
) -> tuple[Record | None, list[RecordError]]:
    """Validate one parsed ingestion record.

    Promises: either ``(Record, [])`` for a valid record, or ``(None, errors)`` with every
    problem found (each a :class:`RecordError` carrying ``line``/``index`` as given and
    the field): not an object, unknown or missing ``kind``, missing required fields,
    wrong types, values out of range, unknown extra fields, and ``live_migrated`` with
    ``lost_steps`` > 0. Does not check references to other records (see
    :func:`check_references`).
    """
    ctx = _Ctx(line, index)
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
    _check_unknown(ctx, obj, [*_COMMON, *fields], f"kind {kind!r}")
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


def _where(record: Record) -> str:
    if record.line is not None:
        return f"line {record.line}"
    if record.index is not None:
        return f"[{record.index}]"
    return "earlier"


def _collapse(
    record: Record, seen: dict[str, Record], records: list[Record], errors: list[RecordError]
) -> None:
    """Append ``record`` unless its event_id was seen: same bytes collapse, else refuse."""
    first = seen.get(record.event_id)
    if first is None:
        seen[record.event_id] = record
        records.append(record)
    elif first.canonical != record.canonical:
        errors.append(
            RecordError(
                f"event_id {record.event_id} already used at {_where(first)} "
                "with different content",
                field="event_id",
                line=record.line,
                index=record.index,
            )
        )


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


def parse_jsonl(data: bytes | str) -> tuple[list[Record], list[RecordError]]:
    """Parse and validate a JSONL file: one JSON object per line.

    Promises: lines are split on ``\\n`` (a ``\\r`` before it is whitespace) and numbered
    from 1; lines holding only spaces, tabs or ``\\r`` are skipped. Every bad line is
    reported (all its errors, each with its line number), not just the first. Within the
    file, an event_id seen again with identical content (same canonical bytes) is
    collapsed to its first occurrence; seen again with different content it is an error
    on ``event_id`` at the later line. Records come back in file order. The caller must
    write nothing when the error list is not empty.
    """
    records: list[Record] = []
    errors: list[RecordError] = []
    seen: dict[str, Record] = {}
    for number, line in _lines(data):
        try:
            obj = parse_json_strict(line)
        except JsonInputError as exc:
            errors.append(_line_error(exc, number))
            continue
        record, errs = validate_record(obj, line=number)
        if record is None:
            errors.extend(errs)
            continue
        _collapse(record, seen, records, errors)
    return records, errors


def validate_batch(objs: Sequence[Any]) -> tuple[list[Record], list[RecordError]]:
    """Validate an API batch (a JSON array already parsed, ideally by parse_json_strict).

    Promises: the same rules as :func:`parse_jsonl`, with errors carrying ``index`` (the
    0-based position in ``objs``) instead of a line, so ``err.path`` reads ``[3].gpus``;
    identical duplicates of an event_id are collapsed, differing ones refused at the
    later index. Raises ``TypeError`` if ``objs`` is not a list or tuple.
    """
    if not isinstance(objs, list | tuple):
        raise TypeError(f"validate_batch needs a list of records, not {type(objs).__name__}")
    records: list[Record] = []
    errors: list[RecordError] = []
    seen: dict[str, Record] = {}
    for i, obj in enumerate(objs):
        record, errs = validate_record(obj, index=i)
        if record is None:
            errors.extend(errs)
            continue
        _collapse(record, seen, records, errors)
    return records, errors


def _failure_ref(record: Record) -> str:
    data = record.data
    assert isinstance(data, OutcomeRec | ExclusionRec)
    return data.failure_event_id


def check_references(
    records: Sequence[Record], known_failure_ids: Callable[[set[str]], set[str]]
) -> list[RecordError]:
    """Check that every outcome and exclusion names a known failure event.

    Promises: a ``failure_event_id`` resolves if a ``failure`` record with that event_id
    comes *earlier* in ``records``, or if ``known_failure_ids`` returns it. The callback
    is called at most once, with the set of ids not resolved in the batch, and must
    return the subset that are failure events already in the ledger (for any contract).
    Returns one error (field ``failure_event_id``, with the record's line/index) per
    unresolved reference, in record order; an empty list when all resolve.
    """
    kind_by_id: dict[str, str] = {}
    pending: list[Record] = []
    for record in records:
        data = record.data
        if (
            isinstance(data, OutcomeRec | ExclusionRec)
            and kind_by_id.get(data.failure_event_id) != "failure"
        ):
            pending.append(record)
        kind_by_id.setdefault(record.event_id, record.kind)
    if not pending:
        return []
    asked = {_failure_ref(r) for r in pending}
    known = known_failure_ids(set(asked))
    errors: list[RecordError] = []
    for record in pending:
        fid = _failure_ref(record)
        if fid in known:
            continue
        other = kind_by_id.get(fid)
        if other == "failure":
            message = f"failure {fid} comes after this {record.kind} in the batch"
        elif other is not None:
            message = f"{fid} is a {other} record, not a failure"
        else:
            message = f"unknown failure event {fid}"
        errors.append(
            RecordError(message, field="failure_event_id", line=record.line, index=record.index)
        )
    return errors


# --------------------------------------------------------------------------- contracts


def _format_decimal(value: Decimal) -> str:
    return format(value, "f")


@dataclass(frozen=True, slots=True)
class ContractTerms:
    """The guarantee terms of a contract (defaults: 90% threshold, 25% credit)."""

    threshold_percent: Decimal = Decimal(90)
    credit_percent: Decimal = Decimal(25)
    covered_classes: tuple[str, ...] = COVERED_CLASSES_DEFAULT
    excluded_causes: tuple[str, ...] = EXCLUDED_CAUSES_DEFAULT

    def to_record(self) -> dict[str, Any]:
        """The normalized JSON form: percents as decimal strings, lists as given."""
        return {
            "threshold_percent": _format_decimal(self.threshold_percent),
            "credit_percent": _format_decimal(self.credit_percent),
            "covered_classes": list(self.covered_classes),
            "excluded_causes": list(self.excluded_causes),
        }


@dataclass(frozen=True, slots=True)
class ContractSpec:
    """A validated contract. Money is ``Decimal``; ``renewal_value`` None means annual_value."""

    contract_id: str
    customer: str
    start_date: date
    currency: str
    annual_value: Decimal
    timezone: str = "UTC"
    term_years: int = 1
    renewal_value: Decimal | None = None
    gpu_hour_price: Decimal | None = None
    terms: ContractTerms = ContractTerms()

    @property
    def credit_base(self) -> Decimal:
        """The value a credit is a percentage of: ``renewal_value``, else ``annual_value``."""
        return self.renewal_value if self.renewal_value is not None else self.annual_value

    def to_record(self) -> dict[str, Any]:
        """The normalized JSON form that is canonicalised into the journal.

        Promises: every key present (absent optionals as ``null``), defaults filled in,
        decimals as strings with the digits given (``"1200000.00"`` stays so), dates as
        ``YYYY-MM-DD``; :func:`contract_from_record` reads it back to an equal spec.
        """
        return {
            "contract_id": self.contract_id,
            "customer": self.customer,
            "start_date": self.start_date.isoformat(),
            "timezone": self.timezone,
            "term_years": self.term_years,
            "currency": self.currency,
            "annual_value": _format_decimal(self.annual_value),
            "renewal_value": None
            if self.renewal_value is None
            else _format_decimal(self.renewal_value),
            "gpu_hour_price": None
            if self.gpu_hour_price is None
            else _format_decimal(self.gpu_hour_price),
            "terms": self.terms.to_record(),
        }


def _decimal_string(*, positive: bool, money: bool) -> _Check:
    bound = "> 0" if positive else ">= 0"
    example = '"1200000.00"' if money else '"2.50"'

    def check(ctx: _Ctx, path: str, value: Any) -> Any:
        if not isinstance(value, str):
            extra = " (money is never a JSON number)" if isinstance(value, int | float) else ""
            return ctx.fail(
                path,
                f"must be a decimal string {bound} like {example}, not {_json_type(value)}{extra}",
            )
        if len(value) > DECIMAL_MAX_LEN or not _DECIMAL.fullmatch(value):
            return ctx.fail(
                path,
                f"must be a decimal string {bound} like {example}: digits, optional "
                f"fraction, no exponent or leading zeros (got {_shown(value)})",
            )
        amount = Decimal(value)
        if amount < 0 or (positive and amount == 0):
            return ctx.fail(path, f"must be {bound} (got {value})")
        return amount

    return check


def _percent(ctx: _Ctx, path: str, value: Any) -> Any:
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        return ctx.fail(
            path, f"must be a percentage (number or decimal string), not {_json_type(value)}"
        )
    if isinstance(value, str):
        if len(value) > DECIMAL_MAX_LEN or not _DECIMAL.fullmatch(value):
            return ctx.fail(
                path, f'must be a number or decimal string like "90" (got {_shown(value)})'
            )
        amount = Decimal(value)
    else:
        amount = decimal_of(value)
    if not 0 < amount <= 100:
        return ctx.fail(path, f"must be > 0 and <= 100 (got {_format_decimal(amount)})")
    return amount


def _start_date(ctx: _Ctx, path: str, value: Any) -> Any:
    if not isinstance(value, str):
        return ctx.fail(path, f"must be a date string YYYY-MM-DD, not {_json_type(value)}")
    m = _DATE.fullmatch(value)
    if m is None:
        return ctx.fail(path, f"must be a date YYYY-MM-DD (got {_shown(value)})")
    try:
        return date(int(m[1]), int(m[2]), int(m[3]))
    except ValueError as exc:
        return ctx.fail(path, f"not a valid date: {exc} (got {_shown(value)})")


def _timezone(ctx: _Ctx, path: str, value: Any) -> Any:
    if not isinstance(value, str):
        return ctx.fail(path, f"must be an IANA time zone name, not {_json_type(value)}")
    try:
        if not value or value != value.strip() or value.startswith("/"):
            raise ValueError(value)
        ZoneInfo(value)
    except (ZoneInfoNotFoundError, ValueError, OSError):
        return ctx.fail(
            path, f"unknown IANA time zone {_shown(value)} (e.g. 'UTC', 'Europe/Paris')"
        )
    return value


def _currency(ctx: _Ctx, path: str, value: Any) -> Any:
    if not isinstance(value, str):
        return ctx.fail(path, f"must be an ISO 4217 currency code, not {_json_type(value)}")
    if not _CURRENCY.fullmatch(value):
        return ctx.fail(
            path,
            f"must be an ISO 4217 code of 3 uppercase letters like 'USD' (got {_shown(value)})",
        )
    if value not in CURRENCY_MINOR_UNITS:
        return ctx.fail(path, f"unknown ISO 4217 currency code {value!r}")
    return value


def _term_years(ctx: _Ctx, path: str, value: Any) -> Any:
    years = _integer(1)(ctx, path, value)
    if years is not _INVALID and years > TERM_YEARS_MAX:
        return ctx.fail(path, f"must be at most {TERM_YEARS_MAX} (got {years})")
    return years


def _string_list(*, choices: tuple[str, ...] | None, non_empty: bool) -> _Check:
    def check(ctx: _Ctx, path: str, value: Any) -> Any:
        if not isinstance(value, list):
            return ctx.fail(path, f"must be an array of strings, not {_json_type(value)}")
        if non_empty and not value:
            return ctx.fail(path, "must not be empty")
        out: list[str] = []
        ok = True
        for i, item in enumerate(value):
            item_path = f"{path}[{i}]"
            if choices is not None:
                got = _choice(choices)(ctx, item_path, item)
            else:
                got = _cause(ctx, item_path, item)
            if got is _INVALID:
                ok = False
            elif got in out:
                ctx.fail(item_path, f"duplicate {got!r}")
                ok = False
            else:
                out.append(got)
        return tuple(out) if ok else _INVALID

    return check


_CONTRACT_FIELDS: Final[dict[str, _Field]] = {
    "contract_id": _Field(_id_string),
    "customer": _Field(_id_string),
    "start_date": _Field(_start_date),
    "timezone": _Field(_timezone, required=False),
    "term_years": _Field(_term_years, required=False),
    "currency": _Field(_currency),
    "annual_value": _Field(_decimal_string(positive=True, money=True)),
    "renewal_value": _Field(_decimal_string(positive=True, money=True), required=False),
    "gpu_hour_price": _Field(_decimal_string(positive=False, money=True), required=False),
    "terms": _Field(lambda ctx, path, value: value, required=False),
}

_TERMS_FIELDS: Final[dict[str, _Field]] = {
    "threshold_percent": _Field(_percent, required=False),
    "credit_percent": _Field(_percent, required=False),
    "covered_classes": _Field(
        _string_list(choices=FAILURE_CLASSES, non_empty=True), required=False
    ),
    "excluded_causes": _Field(_string_list(choices=None, non_empty=False), required=False),
}


def _check_minor_units(ctx: _Ctx, values: dict[str, Any], name: str) -> None:
    amount = values[name]
    currency = values["currency"]
    if not isinstance(amount, Decimal) or not isinstance(currency, str):
        return
    places = CURRENCY_MINOR_UNITS[currency]
    # Exact and independent of the decimal context (quantize could overflow it).
    if len(_format_decimal(amount).partition(".")[2].rstrip("0")) > places:
        ctx.fail(
            name,
            f"{_format_decimal(amount)} has more decimals than {currency} allows ({places})",
        )


def _check_terms(ctx: _Ctx, value: Any) -> Any:
    if value is None:
        return ContractTerms()
    if not isinstance(value, dict):
        return ctx.fail("terms", f"must be an object, not {_json_type(value)}")
    got = _check_fields(ctx, value, _TERMS_FIELDS, prefix=("terms",))
    _check_unknown(ctx, value, _TERMS_FIELDS, "terms", prefix=("terms",))
    if any(v is _INVALID for v in got.values()):
        return _INVALID
    return ContractTerms(**{k: v for k, v in got.items() if v is not None})


def validate_contract(
    obj: Any, *, line: int | None = None, index: int | None = None
) -> tuple[ContractSpec | None, list[RecordError]]:
    """Validate one parsed contract object.

    Promises: ``(ContractSpec, [])`` with defaults filled in, or ``(None, errors)`` with
    every problem found (missing/mistyped/unknown fields, ``terms`` sub-fields named as
    ``terms.x``, list items as ``terms.covered_classes[1]``), each carrying
    ``line``/``index`` as given. Optional fields may be absent or ``null``.
    """
    ctx = _Ctx(line, index)
    if not isinstance(obj, dict):
        ctx.fail("", f"contract must be a JSON object, not {_json_type(obj)}")
        return None, ctx.errors
    values = _check_fields(ctx, obj, _CONTRACT_FIELDS)
    values["terms"] = _check_terms(ctx, obj.get("terms"))
    _check_unknown(ctx, obj, _CONTRACT_FIELDS, "a contract")
    if values["currency"] is not _INVALID:
        _check_minor_units(ctx, values, "annual_value")
        _check_minor_units(ctx, values, "renewal_value")
    if ctx.errors:
        return None, ctx.errors
    return ContractSpec(**{k: v for k, v in values.items() if v is not None}), []


def contract_from_record(record: object) -> ContractSpec:
    """Read a contract back from its journal form (``ContractSpec.to_record()``).

    Promises: ``contract_from_record(spec.to_record()) == spec``; any input accepted by
    :func:`validate_contract` is accepted (any mapping; anything else is refused).
    Raises the first :class:`RecordError` found, with the others added as notes
    (``__notes__``).
    """
    spec, errors = validate_contract(dict(record) if isinstance(record, Mapping) else record)
    if spec is None:
        first = errors[0]
        for other in errors[1:]:
            first.add_note(str(other))
        raise first
    return spec


def _collapse_contract(
    spec: ContractSpec,
    where: str,
    seen: dict[str, tuple[ContractSpec, str]],
    specs: list[ContractSpec],
    errors: list[RecordError],
    *,
    line: int | None = None,
    index: int | None = None,
) -> None:
    first = seen.get(spec.contract_id)
    if first is None:
        seen[spec.contract_id] = (spec, where)
        specs.append(spec)
    elif first[0] != spec:
        errors.append(
            RecordError(
                f"contract_id {spec.contract_id!r} already defined at {first[1]} "
                "with different content",
                field="contract_id",
                line=line,
                index=index,
            )
        )


def parse_contracts(data: bytes | str) -> tuple[list[ContractSpec], list[RecordError]]:
    """Parse and validate a contracts file.

    Promises: if the first non-whitespace byte is ``[`` the file is one JSON array of
    contract objects and errors carry ``index`` (``err.path`` like ``[2].currency``; a
    JSON syntax error carries the ``line`` instead); otherwise it is one JSON object per
    line (blank lines skipped) and errors carry the ``line``. Every bad contract is
    reported. A contract_id repeated with equal content is collapsed to the first; with
    different content it is an error on ``contract_id`` at the later one.
    """
    specs: list[ContractSpec] = []
    errors: list[RecordError] = []
    seen: dict[str, tuple[ContractSpec, str]] = {}
    raw = data.encode("utf-8", "surrogatepass") if isinstance(data, str) else bytes(data)
    if raw.lstrip(b" \t\r\n").startswith(b"["):
        try:
            items = parse_json_strict(raw)
        except JsonInputError as exc:
            if exc.parts and isinstance(exc.parts[0], int):
                field_path = format_path(exc.parts[1:], root="")
                errors.append(RecordError(exc.message, field=field_path, index=exc.parts[0]))
            else:
                message = exc.message
                if exc.column is not None:
                    message = f"{message} at column {exc.column}"
                errors.append(RecordError(message, line=exc.line))
            return [], errors
        for i, obj in enumerate(items):
            spec, errs = validate_contract(obj, index=i)
            if spec is None:
                errors.extend(errs)
                continue
            _collapse_contract(spec, f"[{i}]", seen, specs, errors, index=i)
        return specs, errors
    for number, line in _lines(raw):
        try:
            obj = parse_json_strict(line)
        except JsonInputError as exc:
            errors.append(_line_error(exc, number))
            continue
        spec, errs = validate_contract(obj, line=number)
        if spec is None:
            errors.extend(errs)
            continue
        _collapse_contract(spec, f"line {number}", seen, specs, errors, line=number)
    return specs, errors
