# A copy of ledger/records.py, written by scripts/vendor_verifier.py: edit the original and
# rerun the script (tests/audit/test_vendored.py holds this copy equal to it).
"""Validation of ingestion records and contract records (DESIGN.md section 4).

Pure functions, no database. The rules of a single ingestion record live in
:mod:`yoco_records.schema` (shared with the runtime) and are re-exported here; this module
adds files and batches, references between records, and contracts. Input is parsed with
:func:`yoco_records.canonical.parse_json_strict` and every refusal is a
:class:`RecordError` naming the line (JSONL files) or the batch index (API), and the
field as a JSON path relative to the record (``gpus``, ``terms.threshold_percent``,
``terms.covered_classes[1]``). The format and every rule are documented in
``docs/ingestion.md``.
"""

from __future__ import annotations

import bisect
import heapq
import itertools
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import date, datetime
from decimal import Decimal
from typing import Any, Final, NamedTuple
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from yoco_verify.shared.ledger.cosign import WitnessPolicy
from yoco_verify.shared.ledger.errors import InvariantBroken, WitnessPolicyError
from yoco_verify.shared.yoco_records.canonical import (
    JsonInputError,
    decimal_of,
    format_path,
    parse_json_strict,
)
from yoco_verify.shared.yoco_records.schema import (
    _INVALID,
    FAILURE_CLASSES,
    KINDS,
    OUTCOMES,
    ExclusionRec,
    FailureRec,
    JobFinished,
    JobProgress,
    JobStarted,
    OutcomeRec,
    Record,
    RecordData,
    RecordError,
    _cause,
    _Check,
    _check_fields,
    _check_unknown,
    _choice,
    _Ctx,
    _Field,
    _id_string,
    _integer,
    _json_type,
    _line_error,
    _lines,
    _shown,
    validate_record,
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
    "OrderKey",
    "OutcomeRec",
    "Record",
    "RecordData",
    "RecordError",
    "causal_order",
    "check_references",
    "contract_from_record",
    "order_key",
    "parse_contracts",
    "parse_jsonl",
    "validate_batch",
    "validate_contract",
    "validate_record",
]

COVERED_CLASSES_DEFAULT: Final = ("unplanned", "preemptive")
EXCLUDED_CAUSES_DEFAULT: Final = ("network_wide_outage", "facility_power", "customer_code")

TERM_YEARS_MAX: Final = 100
DECIMAL_MAX_LEN: Final = 40

_DATE = re.compile(r"([0-9]{4})-([0-9]{2})-([0-9]{2})")
_DECIMAL = re.compile(r"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?")
_CURRENCY = re.compile(r"[A-Z]{3}")

# ISO 4217 currency codes (list one) with their minor units: the one home of the list
# (billing.money takes its exponents from here). Codes for precious metals, SDRs, testing
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


def parse_jsonl(
    data: bytes | str, *, now: datetime | None = None
) -> tuple[list[Record], list[RecordError]]:
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
        record, errs = validate_record(obj, line=number, now=now)
        if record is None:
            errors.extend(errs)
            continue
        _collapse(record, seen, records, errors)
    return records, errors


def validate_batch(
    objs: Sequence[Any], *, now: datetime | None = None
) -> tuple[list[Record], list[RecordError]]:
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
        record, errs = validate_record(obj, index=i, now=now)
        if record is None:
            errors.extend(errs)
            continue
        _collapse(record, seen, records, errors)
    return records, errors


def _failure_ref(record: Record) -> str:
    data = record.data
    if not isinstance(data, OutcomeRec | ExclusionRec):
        raise InvariantBroken(f"a {record.kind} record names no failure")
    return data.failure_event_id


class OrderKey(NamedTuple):
    """What :func:`causal_order` needs of a record (a compact index entry).

    ``job_id`` is set for job and failure records, ``failure_ref`` for outcomes and
    exclusions; ``line``/``index`` say where the record stands in its batch. A named
    tuple: one is built per record of every batch, and a tuple is built in a tenth of
    the time of a frozen dataclass.
    """

    kind: str
    event_id: str
    contract_id: str
    occurred_at: datetime
    job_id: str | None = None
    failure_ref: str | None = None
    line: int | None = None
    # Shadows tuple.index (no caller uses the method): the field's name is the one
    # RecordError and Record use.
    index: int | None = None  # type: ignore[assignment]


_REFERRING = (OutcomeRec, ExclusionRec)


def order_key(record: Record) -> OrderKey:
    """The :class:`OrderKey` of ``record``."""
    data = record.data
    job_id: str | None
    ref: str | None
    if isinstance(data, _REFERRING):
        job_id, ref = None, data.failure_event_id
    else:
        job_id, ref = data.job_id, None
    return OrderKey(
        record.kind,
        record.event_id,
        record.contract_id,
        record.occurred_at,
        job_id,
        ref,
        record.line,
        record.index,
    )


def causal_order(keys: Sequence[OrderKey]) -> tuple[list[int], list[RecordError]]:
    """The order in which to append a batch so every reference points backwards.

    Promises: a permutation of ``range(len(keys))`` in which
    * an ``outcome`` or ``exclusion`` comes after the ``failure`` it names, wherever that
      failure stands in the batch (a reference to a record of another kind is an error;
      one found nowhere in the batch is left for the ledger to resolve);
    * the ``job_started`` and ``job_finished`` records of one job (contract and job id)
      come in time order (``occurred_at``, then batch order), so a job can finish and
      start again within one batch;
    * a ``job_progress`` or ``failure`` comes after the latest ``job_started`` of its job
      at or before its ``occurred_at`` (nothing needs it before the job's finish, so it
      is not moved there: file order is kept wherever nothing requires otherwise);
    * records with no such constraint between them keep their batch order: this is a
      stable topological sort (always the earliest ready record first).
    Errors (field ``failure_event_id``, with the record's line/index) come back with the
    order; the batch must then be refused. Runs in O(n log n).
    """
    n = len(keys)
    succ: list[list[int]] = [[] for _ in range(n)]
    indegree = [0] * n
    errors: list[RecordError] = []

    def edge(first: int, then: int) -> None:
        succ[first].append(then)
        indegree[then] += 1

    by_id: dict[str, int] = {}
    for i, k in enumerate(keys):
        by_id.setdefault(k.event_id, i)
    jobs: dict[tuple[str, str], list[int]] = {}
    for i, k in enumerate(keys):
        if k.failure_ref is not None:
            j = by_id.get(k.failure_ref)
            if j is not None:
                if keys[j].kind == "failure":
                    edge(j, i)
                else:
                    errors.append(
                        RecordError(
                            f"{k.failure_ref} is a {keys[j].kind} record, not a failure",
                            field="failure_event_id",
                            line=k.line,
                            index=k.index,
                        )
                    )
        elif k.job_id is not None:
            jobs.setdefault((k.contract_id, k.job_id), []).append(i)
    for members in jobs.values():
        bounds = sorted(
            (i for i in members if keys[i].kind in ("job_started", "job_finished")),
            key=lambda i: (keys[i].occurred_at, i),
        )
        for first, then in itertools.pairwise(bounds):
            edge(first, then)
        starts = [i for i in bounds if keys[i].kind == "job_started"]
        start_times = [keys[i].occurred_at for i in starts]
        for i in members:
            if keys[i].kind in ("job_progress", "failure"):
                at = bisect.bisect_right(start_times, keys[i].occurred_at)
                if at:
                    edge(starts[at - 1], i)
    ready = [i for i in range(n) if indegree[i] == 0]
    heapq.heapify(ready)
    order: list[int] = []
    while ready:
        i = heapq.heappop(ready)
        order.append(i)
        for then in succ[i]:
            indegree[then] -= 1
            if indegree[then] == 0:
                heapq.heappush(ready, then)
    if len(order) < n:  # pragma: no cover - the constraints above cannot form a cycle
        stuck = sorted(set(range(n)) - set(order))
        for i in stuck:
            errors.append(
                RecordError(
                    "circular reference within the batch",
                    field="",
                    line=keys[i].line,
                    index=keys[i].index,
                )
            )
        order.extend(stuck)
    return order, errors


def check_references(
    records: Sequence[Record], known_failure_ids: Callable[[set[str]], set[str]]
) -> list[RecordError]:
    """Check that every outcome and exclusion names a known failure event.

    Promises: a ``failure_event_id`` resolves if a ``failure`` record with that event_id
    stands *anywhere* in ``records`` (the batch is appended in :func:`causal_order`), or
    if ``known_failure_ids`` returns it. The callback is called at most once, with the
    set of ids not resolved in the batch, and must return the subset that are failure
    events already in the ledger. Returns one error (field ``failure_event_id``, with
    the record's line/index) per unresolved reference, in record order.
    """
    kind_by_id: dict[str, str] = {}
    for record in records:
        kind_by_id.setdefault(record.event_id, record.kind)
    pending = [
        r
        for r in records
        if isinstance(r.data, OutcomeRec | ExclusionRec)
        and kind_by_id.get(_failure_ref(r)) != "failure"
    ]
    if not pending:
        return []
    outside = {_failure_ref(r) for r in pending if _failure_ref(r) not in kind_by_id}
    known = known_failure_ids(outside) if outside else set()
    errors: list[RecordError] = []
    for record in pending:
        fid = _failure_ref(record)
        if fid in known:
            continue
        other = kind_by_id.get(fid)
        if other is not None:
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
    """The guarantee terms of a contract (defaults: 90% threshold, 25% credit, no witness
    policy)."""

    threshold_percent: Decimal = Decimal(90)
    credit_percent: Decimal = Decimal(25)
    covered_classes: tuple[str, ...] = COVERED_CLASSES_DEFAULT
    excluded_causes: tuple[str, ...] = EXCLUDED_CAUSES_DEFAULT
    #: Which witnesses must cosign a checkpoint before it counts for this contract
    #: (:class:`ledger.cosign.WitnessPolicy`); None: the operator's signature alone.
    witnesses: WitnessPolicy | None = None

    def to_record(self) -> dict[str, Any]:
        """The normalized JSON form: percents as decimal strings, lists as given;
        ``witnesses`` only when the contract has a policy (so a contract without one
        keeps the canonical bytes it always had)."""
        out: dict[str, Any] = {
            "threshold_percent": _format_decimal(self.threshold_percent),
            "credit_percent": _format_decimal(self.credit_percent),
            "covered_classes": list(self.covered_classes),
            "excluded_causes": list(self.excluded_causes),
        }
        if self.witnesses is not None:
            out["witnesses"] = self.witnesses.to_json()
        return out


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

def _witnesses(ctx: _Ctx, path: str, value: Any) -> Any:
    try:
        return WitnessPolicy.from_json(value, path)
    except WitnessPolicyError as exc:
        return ctx.fail(exc.field, exc.reason)


_TERMS_FIELDS: Final[dict[str, _Field]] = {
    "threshold_percent": _Field(_percent, required=False),
    "credit_percent": _Field(_percent, required=False),
    "covered_classes": _Field(
        _string_list(choices=FAILURE_CLASSES, non_empty=True), required=False
    ),
    "excluded_causes": _Field(_string_list(choices=None, non_empty=False), required=False),
    "witnesses": _Field(_witnesses, required=False),
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
