"""Replay a contract's log entries into the records the SLA figures are computed from.

This is the verifier's own reading of the entries, written apart from the operator's
database projections: the contract and its amendments, failures (with any dispute's
reclassification), outcomes, exclusions, job spans (a ``job_started`` opens a span, the
job's next ``job_finished`` closes it, in log order), credits, year closes and reports.
The SLA rules themselves (coverage, resolution, GPU-hours, goodput, the guarantee) are
the shared pure definitions of :mod:`billing.sla`.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import date, datetime
from decimal import Decimal
from typing import Any

from yoco_verify import VerifyError
from yoco_verify.shared.billing import sla
from yoco_verify.shared.ledger.records import ContractSpec, contract_from_record
from yoco_verify.shared.yoco_records.canonical import (
    ABSENT,
    CanonicalizationError,
    JsonInputError,
    NotCanonicalError,
    canonical_fields,
    parse_canonical,
)

__all__ = [
    "Amendment",
    "Credit",
    "Ledger",
    "Reclass",
    "parse_entries",
    "parse_entry",
    "replay",
]


@dataclass(frozen=True, slots=True)
class Amendment:
    """An ``amendment`` entry as the in-force rule reads it."""

    event_id: str
    seq: int
    effective_date: date
    applies_to_year_in_progress: bool
    changes: dict[str, Any]


@dataclass(frozen=True, slots=True)
class Reclass:
    """A ``reclassification`` entry: a dispute's correction of a failure's class/cause."""

    event_id: str
    seq: int
    occurred_at: datetime
    failure_event_id: str
    failure_class: str
    cause: str
    reason: str


@dataclass(slots=True)
class Credit:
    """A ``credit`` entry with what later entries (voids, applications) did to it."""

    event_id: str
    seq: int
    year: int
    body: dict[str, Any]
    void_seq: int | None = None
    applications: list[tuple[int, int]] = field(default_factory=list)  # (seq, minor units)


@dataclass(slots=True)
class Ledger:
    """Everything replayed from entries ``0 .. size-1`` of one contract's log."""

    contract: ContractSpec
    size: int
    bodies: list[dict[str, Any]]
    amendments: list[Amendment]
    failures: dict[str, sla.Failure]
    failure_bodies: dict[str, dict[str, Any]]
    outcomes: list[sla.Outcome]
    exclusions: list[sla.Exclusion]
    reclassifications: list[Reclass]
    jobs: list[tuple[sla.JobSpan, int, int | None]]  # span, start seq, finish seq
    credits: list[Credit]
    year_closes: list[dict[str, Any]]
    latest_time: datetime | None

    def prefix(self, size: int) -> Ledger:
        """The same replay over the first ``size`` entries only."""
        return replay(self.bodies[:size])


def parse_entry(data: bytes, seq: int) -> dict[str, Any]:
    """An entry's JSON object (numbers with a fraction as Decimal, never float)."""
    try:
        body = json.loads(data.decode("utf-8"), parse_float=Decimal)
    except (UnicodeDecodeError, ValueError) as exc:
        raise VerifyError(f"entry {seq}: not a JSON object: {exc}") from None
    if not isinstance(body, dict) or "kind" not in body:
        raise VerifyError(f"entry {seq}: not a ledger entry (no kind)")
    return body


def parse_entries(entries: Sequence[bytes]) -> list[dict[str, Any]]:
    """Every entry parsed, in order, each held to the ledger's own rules first.

    An entry must be strict JSON (RFC 8259 with no key twice in an object, at any depth)
    and byte for byte its own RFC 8785 canonical form; its ``event_id`` must be no earlier
    entry's (a second ``failure`` reusing an old one's id would silently replace it); and
    it must name the log's contract (entry 0's) when it names one.  :class:`VerifyError`
    names the first entry that breaks a rule.  A ``job_progress`` entry (no figure reads
    progress records) becomes ``{"kind": "job_progress", "contract_id": ...}``.

    The rules are first checked over all entries at once (:func:`canonical_fields`
    proves each canonical and gives its kind, event id and contract; the rest are set
    and list operations); when any entry breaks one, the entries are read again one by
    one, and the first that breaks a rule is named as that reading finds it.
    """
    fields = canonical_fields(entries, _FIELDS)
    if fields is not None:
        bodies = _bodies_if_valid(entries, fields)
        if bodies is not None:
            return bodies
    return _parse_one_by_one(entries)


_FIELDS = ("kind", "event_id", "contract_id")


def _bodies_if_valid(
    entries: Sequence[bytes], fields: list[tuple[Any, ...]]
) -> list[dict[str, Any]] | None:
    """The parsed entries when every one of them (each proved canonical, with ``fields``
    its kind, event id and contract) keeps the rules of :func:`parse_entries`; else None."""
    if not fields:
        return []
    kinds, eids, cids = zip(*fields, strict=True)
    if ABSENT in kinds:
        return None  # an entry with no kind, or not an object
    ids = [e for e in eids if e is not None and e is not ABSENT]
    if not set(map(type, ids)) <= {str} or len(set(ids)) != len(ids):
        return None  # an event id that is not a string, or one used twice
    cid = None if cids[0] is ABSENT else cids[0]
    try:
        if not set(cids[1:]) <= {ABSENT, cid}:
            return None  # another contract's entry
    except TypeError:  # a contract that is an object or a list: compared one by one
        return None
    # One body for every progress entry (nothing changes a body once replayed).
    progress = {"kind": "job_progress", "contract_id": cid}
    return [
        progress if kind == "job_progress" else parse_entry(data, seq)
        for seq, (data, kind) in enumerate(zip(entries, kinds, strict=True))
    ]


def _parse_one_by_one(entries: Sequence[bytes]) -> list[dict[str, Any]]:
    """:func:`parse_entries` entry by entry: the first entry that breaks a rule is named."""
    out: list[dict[str, Any]] = []
    cid: Any = None
    seen: dict[str, int] = {}
    for seq, data in enumerate(entries):
        # The one canonical rule (yoco_records.canonical): equal bytes prove the entry
        # canonical, and so also free of a key twice, of numbers JSON cannot carry
        # exactly and of lone surrogates; a refused entry is parsed strictly to say why.
        try:
            strict = parse_canonical(data)
        except JsonInputError as exc:
            raise VerifyError(f"entry {seq}: not strict JSON: {exc}") from None
        except CanonicalizationError as exc:
            raise VerifyError(f"entry {seq}: has no canonical form: {exc}") from None
        except NotCanonicalError as exc:
            raise VerifyError(
                f"entry {seq}: {exc} (the ledger writes every entry canonical; these were "
                "re-encoded or altered)"
            ) from None
        if not isinstance(strict, dict) or "kind" not in strict:
            raise VerifyError(f"entry {seq}: not a ledger entry (no kind)")
        eid = strict.get("event_id")
        if eid is not None:
            if not isinstance(eid, str):
                raise VerifyError(f"entry {seq}: event_id {eid!r} is not a string")
            if eid in seen:
                raise VerifyError(
                    f"entry {seq} ({strict['kind']}): event id {eid} is already entry "
                    f"{seen[eid]}'s (an id names one event; a second entry may not reuse it)"
                )
            seen[eid] = seq
        if seq == 0:
            cid = strict.get("contract_id")
        elif strict.get("contract_id", cid) != cid:
            raise VerifyError(
                f"entry {seq} ({strict['kind']}): of contract {strict.get('contract_id')!r}, "
                f"in the log of contract {cid!r}"
            )
        if strict["kind"] == "job_progress":
            out.append({"kind": "job_progress", "contract_id": cid})
        else:
            out.append(parse_entry(data, seq))
    return out


def _time(body: dict[str, Any], seq: int, name: str = "occurred_at") -> datetime:
    value = body.get(name)
    try:
        t = datetime.fromisoformat(str(value))
    except ValueError:
        raise VerifyError(f"entry {seq}: {name} {value!r} is not an ISO 8601 time") from None
    if t.tzinfo is None:
        raise VerifyError(f"entry {seq}: {name} {value!r} has no time zone")
    return t


def _dec(value: Any) -> Decimal:
    return value if isinstance(value, Decimal) else Decimal(str(value))


def replay(bodies: Sequence[dict[str, Any]]) -> Ledger:
    """Replay parsed entries in log order; :class:`VerifyError` names a malformed entry."""
    if not bodies or bodies[0].get("kind") != "contract":
        raise VerifyError("entry 0: a contract's log starts with its contract entry")
    try:
        contract = contract_from_record(bodies[0]["contract"])
    except (KeyError, ValueError) as exc:
        raise VerifyError(f"entry 0: malformed contract: {exc}") from None
    led = Ledger(
        contract=contract,
        size=len(bodies),
        bodies=list(bodies),
        amendments=[],
        failures={},
        failure_bodies={},
        outcomes=[],
        exclusions=[],
        reclassifications=[],
        jobs=[],
        credits=[],
        year_closes=[],
        latest_time=None,
    )
    open_jobs: dict[str, tuple[str, int, int, datetime]] = {}
    credits: dict[str, Credit] = {}
    closed_spans: list[tuple[sla.JobSpan, int, int | None]] = []
    for seq, b in enumerate(bodies):
        kind = b.get("kind")
        if kind == "job_progress":
            continue  # no figure reads progress records
        try:
            if "occurred_at" in b:
                t = _time(b, seq)
                if led.latest_time is None or t > led.latest_time:
                    led.latest_time = t
            if kind == "failure":
                f = sla.Failure(
                    event_id=b["event_id"],
                    seq=seq,
                    occurred_at=_time(b, seq),
                    failure_class=b["failure_class"],
                    cause=b["cause"],
                    job_id=str(b["job_id"]),
                )
                led.failures[f.event_id] = f
                led.failure_bodies[f.event_id] = b
            elif kind == "outcome":
                led.outcomes.append(
                    sla.Outcome(
                        event_id=b["event_id"],
                        failure_event_id=b["failure_event_id"],
                        seq=seq,
                        occurred_at=_time(b, seq),
                        outcome=b["outcome"],
                        lost_steps=b["lost_steps"],
                        recovery_seconds=_dec(b["recovery_seconds"]),
                        step_seconds=_dec(b["step_seconds"]),
                        gpus_affected=b["gpus_affected"],
                    )
                )
            elif kind == "exclusion":
                led.exclusions.append(
                    sla.Exclusion(
                        event_id=b["event_id"],
                        failure_event_id=b["failure_event_id"],
                        seq=seq,
                        occurred_at=_time(b, seq),
                        reason=b["reason"],
                    )
                )
            elif kind == "reclassification":
                led.reclassifications.append(
                    Reclass(
                        b["event_id"],
                        seq,
                        _time(b, seq),
                        b["failure_event_id"],
                        b["failure_class"],
                        b["cause"],
                        b.get("reason", ""),
                    )
                )
            elif kind == "job_started":
                job = str(b["job_id"])
                if job in open_jobs:
                    raise VerifyError(f"entry {seq}: job {job!r} started while running")
                open_jobs[job] = (b["event_id"], seq, int(b["gpus"]), _time(b, seq))
            elif kind == "job_finished":
                job = str(b["job_id"])
                if job not in open_jobs:
                    raise VerifyError(f"entry {seq}: job {job!r} finished but was not running")
                _, start_seq, gpus, started = open_jobs.pop(job)
                span = sla.JobSpan(
                    job_id=job, gpus=gpus, started_at=started, finished_at=_time(b, seq)
                )
                closed_spans.append((span, start_seq, seq))
            elif kind == "amendment":
                led.amendments.append(
                    Amendment(
                        b["event_id"],
                        seq,
                        date.fromisoformat(b["effective_date"]),
                        bool(b.get("applies_to_year_in_progress")),
                        dict(b["changes"]),
                    )
                )
            elif kind == "credit":
                c = Credit(b["event_id"], seq, int(b["year"]), b)
                credits[c.event_id] = c
                led.credits.append(c)
            elif kind == "credit_void":
                voided = credits.get(str(b.get("credit_id")))
                if voided is None:
                    raise VerifyError(f"entry {seq}: voids an unknown credit")
                voided.void_seq = seq
            elif kind == "credit_application":
                applied = credits.get(str(b.get("credit_id")))
                if applied is None:
                    raise VerifyError(f"entry {seq}: applies an unknown credit")
                applied.applications.append((seq, int(b["minor_units"])))
            elif kind in ("year_close", "adjustment"):
                led.year_closes.append({**b, "_seq": seq})
        except (KeyError, TypeError, ValueError) as exc:
            if isinstance(exc, VerifyError):
                raise
            raise VerifyError(f"entry {seq} ({kind}): malformed: {exc}") from None
    still_running: list[tuple[sla.JobSpan, int, int | None]] = [
        (sla.JobSpan(job_id=j, gpus=g, started_at=t, finished_at=None), s, None)
        for j, (_, s, g, t) in open_jobs.items()
    ]
    led.jobs = sorted(closed_spans + still_running, key=lambda x: x[1])
    return led
