# A copy of billing/sla.py, written by scripts/vendor_verifier.py: edit the original and
# rerun the script (tests/audit/test_vendored.py holds this copy equal to it).
"""SLA figures of a period, computed from plain ledger records (DESIGN section 2).

Pure functions over immutable records; no database access.  The caller loads the
contract's failures, outcomes, exclusions and job spans and passes them in.  The exact
definitions, and every choice made where DESIGN is silent, are in docs/definitions.md.

Arithmetic is exact: counts are ints, GPU-seconds are Decimals computed in a context that
refuses to round (``Inexact`` is trapped), and the guarantee test is the integer-exact
``resolved * 100 >= covered * threshold_percent``.  Derived ratios (resolution rate,
hours, goodput) are held as Decimals to 28 significant digits (ROUND_HALF_EVEN); their
JSON strings are rounded once, exactly, from the underlying rational numbers.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from decimal import (
    ROUND_HALF_EVEN,
    Context,
    Decimal,
    DivisionByZero,
    Inexact,
    InvalidOperation,
    Overflow,
    localcontext,
)
from enum import StrEnum
from fractions import Fraction
from typing import Any

from yoco_verify.shared.billing.terms import FAILURE_CLASSES, Terms
from yoco_verify.shared.billing.years import require_aware

__all__ = [
    "CLASS_ORDER",
    "JSON_DECIMAL_PLACES",
    "OUTCOMES",
    "Coverage",
    "Exclusion",
    "Failure",
    "FailureRow",
    "FailureStatus",
    "JobSpan",
    "Outcome",
    "SlaFigures",
    "allocated_gpu_seconds",
    "classify",
    "compute_figures",
    "decimal_string",
    "failure_rows",
    "figures_from_totals",
    "is_resolved",
    "latest_exclusions",
    "latest_outcomes",
    "lost_gpu_seconds",
]

OUTCOMES: frozenset[str] = frozenset({"live_migrated", "rolled_back", "failed"})
#: Fixed order of failure classes in breakdowns.
CLASS_ORDER: tuple[str, ...] = ("unplanned", "preemptive", "planned")
#: Decimal places of every decimal string in :meth:`SlaFigures.to_json` (ROUND_HALF_EVEN).
JSON_DECIMAL_PLACES = 6

_ZERO = Decimal(0)
_SECONDS_PER_HOUR = 3600
# Exact context: large precision, and any rounding raises instead of happening silently.
_EXACT = Context(
    prec=200,
    rounding=ROUND_HALF_EVEN,
    Emax=999_999,
    Emin=-999_999,
    traps=[InvalidOperation, DivisionByZero, Overflow, Inexact],
)
# Context of derived ratios (resolution rate, hours, goodput).
_RATIO = Context(prec=28, rounding=ROUND_HALF_EVEN, traps=[InvalidOperation, DivisionByZero])


# --------------------------------------------------------------------------- validation


def _str(name: str, value: object) -> str:
    if not isinstance(value, str) or not value:
        raise ValueError(f"{name}: expected a non-empty string, got {value!r}")
    return value


def _int(name: str, value: object, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name}: expected an integer, got {value!r}")
    if value < minimum:
        raise ValueError(f"{name}: must be >= {minimum}, got {value}")
    return value


def _dec(name: str, value: object, *, positive: bool) -> Decimal:
    if isinstance(value, bool) or not isinstance(value, (Decimal, int)):
        raise ValueError(f"{name}: expected a Decimal (never a float), got {value!r}")
    d = Decimal(value)
    if not d.is_finite():
        raise ValueError(f"{name}: must be finite, got {value!r}")
    if positive and d <= 0:
        raise ValueError(f"{name}: must be > 0, got {d}")
    if d < 0:
        raise ValueError(f"{name}: must be >= 0, got {d}")
    return d


# --------------------------------------------------------------------------- records


@dataclass(frozen=True, slots=True, kw_only=True)
class Failure:
    """A ``failure`` ledger entry.  ``seq`` is its position in the contract's log."""

    event_id: str
    seq: int
    occurred_at: datetime
    failure_class: str
    cause: str
    job_id: str

    def __post_init__(self) -> None:
        _str("event_id", self.event_id)
        _int("seq", self.seq, 0)
        require_aware("occurred_at", self.occurred_at)
        if self.failure_class not in FAILURE_CLASSES:
            raise ValueError(
                f"failure_class: expected one of {sorted(FAILURE_CLASSES)}, "
                f"got {self.failure_class!r}"
            )
        _str("cause", self.cause)
        _str("job_id", self.job_id)


@dataclass(frozen=True, slots=True, kw_only=True)
class Outcome:
    """An ``outcome`` ledger entry for the failure ``failure_event_id``.

    ``live_migrated`` with ``lost_steps > 0`` is refused (DESIGN section 4), so a
    ``live_migrated`` outcome always resolves its failure.  Integer seconds are accepted
    and stored as Decimals.
    """

    event_id: str
    failure_event_id: str
    seq: int
    occurred_at: datetime
    outcome: str
    lost_steps: int
    recovery_seconds: Decimal
    step_seconds: Decimal
    gpus_affected: int

    def __post_init__(self) -> None:
        _str("event_id", self.event_id)
        _str("failure_event_id", self.failure_event_id)
        _int("seq", self.seq, 0)
        require_aware("occurred_at", self.occurred_at)
        if self.outcome not in OUTCOMES:
            raise ValueError(f"outcome: expected one of {sorted(OUTCOMES)}, got {self.outcome!r}")
        _int("lost_steps", self.lost_steps, 0)
        if self.outcome == "live_migrated" and self.lost_steps != 0:
            raise ValueError(
                f"lost_steps: a live_migrated outcome loses no steps, got {self.lost_steps}"
            )
        object.__setattr__(
            self,
            "recovery_seconds",
            _dec("recovery_seconds", self.recovery_seconds, positive=False),
        )
        object.__setattr__(
            self, "step_seconds", _dec("step_seconds", self.step_seconds, positive=True)
        )
        _int("gpus_affected", self.gpus_affected, 1)


@dataclass(frozen=True, slots=True, kw_only=True)
class Exclusion:
    """An ``exclusion`` ledger entry that removes ``failure_event_id`` from coverage."""

    event_id: str
    failure_event_id: str
    seq: int
    occurred_at: datetime
    reason: str

    def __post_init__(self) -> None:
        _str("event_id", self.event_id)
        _str("failure_event_id", self.failure_event_id)
        _int("seq", self.seq, 0)
        require_aware("occurred_at", self.occurred_at)
        _str("reason", self.reason)


@dataclass(frozen=True, slots=True, kw_only=True)
class JobSpan:
    """A job's running interval ``[started_at, finished_at)``; ``finished_at`` None: running."""

    job_id: str
    gpus: int
    started_at: datetime
    finished_at: datetime | None

    def __post_init__(self) -> None:
        _str("job_id", self.job_id)
        _int("gpus", self.gpus, 1)
        require_aware("started_at", self.started_at)
        if self.finished_at is not None:
            require_aware("finished_at", self.finished_at)
            if self.finished_at < self.started_at:
                raise ValueError(
                    f"finished_at: {self.finished_at.isoformat()} is before started_at "
                    f"{self.started_at.isoformat()} (job {self.job_id})"
                )


# --------------------------------------------------------------------------- building blocks


class Coverage(StrEnum):
    """How the guarantee sees a failure: the three sets partition all failures."""

    COVERED = "covered"
    EXCLUDED = "excluded"
    NOT_COVERED = "not_covered"


class FailureStatus(StrEnum):
    """Status of one failure in a report row."""

    RESOLVED = "resolved"
    ROLLED_BACK = "rolled_back"
    FAILED = "failed"
    PENDING = "pending"
    EXCLUDED = "excluded"
    NOT_COVERED = "not_covered"


def _entry_key(entry: Outcome | Exclusion) -> tuple[datetime, int, str]:
    return (entry.occurred_at, entry.seq, entry.event_id)


def latest_outcomes(outcomes: Iterable[Outcome]) -> dict[str, Outcome]:
    """Return, per ``failure_event_id``, its latest outcome.

    Latest = greatest ``occurred_at``; ties broken by the higher ``seq`` (ledger order),
    then by the greater ``event_id`` so the result never depends on input order.  Outcomes
    recorded after a period still count for that period's failures.
    """
    latest: dict[str, Outcome] = {}
    for o in outcomes:
        cur = latest.get(o.failure_event_id)
        if cur is None or _entry_key(o) > _entry_key(cur):
            latest[o.failure_event_id] = o
    return latest


def latest_exclusions(exclusions: Iterable[Exclusion]) -> dict[str, Exclusion]:
    """Return, per ``failure_event_id``, the latest exclusion entry naming it.

    Same order as :func:`latest_outcomes`.  Every exclusion excludes its failure; the
    latest one only supplies the reason shown in reports.
    """
    latest: dict[str, Exclusion] = {}
    for e in exclusions:
        cur = latest.get(e.failure_event_id)
        if cur is None or _entry_key(e) > _entry_key(cur):
            latest[e.failure_event_id] = e
    return latest


def classify(failure: Failure, terms: Terms, excluded_ids: Collection[str]) -> Coverage:
    """Return whether ``failure`` is covered, excluded or not covered under ``terms``.

    * NOT_COVERED: its class is not in ``terms.covered_classes`` (checked first, so a
      failure of an uncovered class is NOT_COVERED even if an exclusion names it or its
      cause is excluded);
    * EXCLUDED: its class is covered but its cause is in ``terms.excluded_causes`` or its
      ``event_id`` is in ``excluded_ids`` (ids named by an exclusion entry);
    * COVERED: otherwise.
    """
    if failure.failure_class not in terms.covered_classes:
        return Coverage.NOT_COVERED
    if failure.cause in terms.excluded_causes or failure.event_id in excluded_ids:
        return Coverage.EXCLUDED
    return Coverage.COVERED


def is_resolved(outcome: Outcome | None) -> bool:
    """Return True when the (latest) outcome is ``live_migrated`` with 0 lost steps."""
    return outcome is not None and outcome.outcome == "live_migrated" and outcome.lost_steps == 0


def lost_gpu_seconds(outcome: Outcome | None) -> Decimal:
    """Return ``gpus_affected * (recovery_seconds + lost_steps * step_seconds)``, exactly.

    Returns ``Decimal(0)`` for None (a pending failure).
    """
    if outcome is None:
        return _ZERO
    with localcontext(_EXACT):
        return outcome.gpus_affected * (
            outcome.recovery_seconds + outcome.lost_steps * outcome.step_seconds
        )


def _micros(delta: timedelta) -> int:
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds


def _check_period(start: datetime, end: datetime, now: datetime | None) -> None:
    require_aware("period_start", start)
    require_aware("period_end", end)
    if now is not None:
        require_aware("now", now)
    if end <= start:
        raise ValueError(
            f"period_end {end.isoformat()} must be after period_start {start.isoformat()}"
        )


def allocated_gpu_seconds(
    jobs: Iterable[JobSpan], start: datetime, end: datetime, now: datetime
) -> Decimal:
    """Return the GPU-seconds allocated to ``jobs`` inside ``[start, min(end, now))``.

    Each span counts ``gpus * |[started_at, finished_at) ∩ [start, min(end, now))|``; a job
    still running runs to ``min(end, now)``.  Spans are counted independently (a restarted
    job with two spans counts both).  Exact to the microsecond.  Raises ValueError for
    naive datetimes or ``end <= start``.
    """
    _check_period(start, end, now)
    stop = min(end, now)
    total = 0
    for job in jobs:
        lo = max(job.started_at, start)
        hi = stop if job.finished_at is None else min(job.finished_at, stop)
        if hi > lo:
            total += job.gpus * _micros(hi - lo)
    return Decimal(f"{total}E-6") if total else _ZERO


def decimal_string(value: Fraction | Decimal | int, places: int = JSON_DECIMAL_PLACES) -> str:
    """Return ``value`` rounded once, exactly, ROUND_HALF_EVEN to ``places`` decimals.

    A plain string with exactly ``places`` decimals and no exponent, never ``-0``:
    ``decimal_string(Fraction(2, 3)) == "0.666667"``.
    """
    fr = Fraction(value)
    scale = 10**places
    scaled = fr * scale
    q, r = divmod(scaled.numerator, scaled.denominator)  # floor division, r >= 0
    twice = 2 * r
    if twice > scaled.denominator or (twice == scaled.denominator and q % 2 == 1):
        q += 1
    sign = "-" if q < 0 else ""
    q = abs(q)
    if places == 0:
        return f"{sign}{q}"
    whole, frac = divmod(q, scale)
    return f"{sign}{whole}.{frac:0{places}d}"


# --------------------------------------------------------------------------- figures


@dataclass(frozen=True, slots=True, kw_only=True)
class SlaFigures:
    """The SLA figures of one period ``[period_start, period_end)`` (DESIGN section 2).

    Counts partition the failures of the period: ``total = covered + excluded +
    not_covered`` and ``covered = resolved + rolled_back + failed + pending``.  Lost
    GPU-seconds count every failure of the period (covered or not); allocated GPU-seconds
    run to ``min(period_end, now)``.
    """

    period_start: datetime
    period_end: datetime
    now: datetime
    threshold_percent: Decimal
    total_failures: int
    covered_failures: int
    resolved_failures: int
    excluded_failures: int
    not_covered_failures: int
    pending_failures: int
    rolled_back_failures: int
    failed_failures: int
    resolution_rate: Decimal | None
    guarantee_met: bool
    allocated_gpu_seconds: Decimal
    allocated_gpu_hours: Decimal
    lost_gpu_seconds: Decimal
    lost_gpu_hours: Decimal
    goodput: Decimal
    lost_gpu_seconds_by_class: tuple[tuple[str, Decimal], ...]

    @property
    def unresolved_failures(self) -> int:
        """Covered failures that are not resolved (rolled back, failed or pending)."""
        return self.covered_failures - self.resolved_failures

    def lost_by_class(self) -> dict[str, Decimal]:
        """Return lost GPU-seconds per failure class (all three classes, fixed order)."""
        return dict(self.lost_gpu_seconds_by_class)

    def to_json(self) -> dict[str, Any]:
        """Return the ``yoco sla --json`` fields computable from the records.

        Counts are ints, ``guarantee_met`` a bool, ``resolution_rate`` a decimal string or
        None (no covered failure), and every other number a decimal string with exactly
        six decimals, rounded ROUND_HALF_EVEN once from the exact value; never a float.
        ``period_start``/``period_end`` are ISO 8601 in UTC.
        """
        allocated = Fraction(self.allocated_gpu_seconds)
        lost = Fraction(self.lost_gpu_seconds)
        rate = (
            None
            if self.covered_failures == 0
            else decimal_string(Fraction(self.resolved_failures, self.covered_failures))
        )
        goodput = Fraction(1) if allocated == 0 else 1 - lost / allocated
        return {
            "period_start": self.period_start.astimezone(UTC).isoformat(),
            "period_end": self.period_end.astimezone(UTC).isoformat(),
            "covered_failures": self.covered_failures,
            "resolved_failures": self.resolved_failures,
            "excluded_failures": self.excluded_failures,
            "not_covered_failures": self.not_covered_failures,
            "pending_failures": self.pending_failures,
            "rolled_back_failures": self.rolled_back_failures,
            "failed_failures": self.failed_failures,
            "resolution_rate": rate,
            "threshold_percent": format(self.threshold_percent, "f"),
            "guarantee_met": self.guarantee_met,
            "allocated_gpu_hours": decimal_string(allocated / _SECONDS_PER_HOUR),
            "lost_gpu_hours": decimal_string(lost / _SECONDS_PER_HOUR),
            "goodput": decimal_string(goodput),
            "lost_gpu_hours_by_class": {
                cls: decimal_string(Fraction(sec) / _SECONDS_PER_HOUR)
                for cls, sec in self.lost_gpu_seconds_by_class
            },
        }


@dataclass(frozen=True, slots=True, kw_only=True)
class FailureRow:
    """One failure of a report, with its status and lost GPU-seconds.

    ``status`` is RESOLVED / ROLLED_BACK / FAILED / PENDING for covered failures (from the
    latest outcome), else EXCLUDED or NOT_COVERED.  For EXCLUDED, ``excluded_by`` is
    ``"exclusion"`` (an exclusion entry names it; ``reason`` is the latest entry's reason,
    even if the cause is also excluded) or ``"cause"`` (``reason`` is the cause code);
    both are None otherwise.  ``outcome`` is the latest outcome (None while pending) and
    ``lost_gpu_seconds`` comes from it, whatever the status.
    """

    failure: Failure
    status: FailureStatus
    excluded_by: str | None
    reason: str | None
    outcome: Outcome | None
    lost_gpu_seconds: Decimal


def _status(coverage: Coverage, outcome: Outcome | None) -> FailureStatus:
    if coverage is Coverage.NOT_COVERED:
        return FailureStatus.NOT_COVERED
    if coverage is Coverage.EXCLUDED:
        return FailureStatus.EXCLUDED
    if outcome is None:
        return FailureStatus.PENDING
    if is_resolved(outcome):
        return FailureStatus.RESOLVED
    if outcome.outcome == "rolled_back":
        return FailureStatus.ROLLED_BACK
    return FailureStatus.FAILED


def _in_period(failures: Iterable[Failure], start: datetime, end: datetime) -> list[Failure]:
    seen: set[str] = set()
    out: list[Failure] = []
    for f in failures:
        if f.event_id in seen:
            raise ValueError(f"failures: duplicate event_id {f.event_id!r}")
        seen.add(f.event_id)
        if start <= f.occurred_at < end:
            out.append(f)
    return out


def failure_rows(
    *,
    terms: Terms,
    period_start: datetime,
    period_end: datetime,
    failures: Iterable[Failure],
    outcomes: Iterable[Outcome],
    exclusions: Iterable[Exclusion],
) -> tuple[FailureRow, ...]:
    """Return one :class:`FailureRow` per failure with ``occurred_at`` in the period.

    Rows are sorted by ``(occurred_at, seq, event_id)``.  Statuses agree with
    :func:`compute_figures` on the same input.  Raises ValueError for naive datetimes,
    an empty period or duplicate failure ids.
    """
    _check_period(period_start, period_end, None)
    chosen = _in_period(failures, period_start, period_end)
    latest = latest_outcomes(outcomes)
    excl = latest_exclusions(exclusions)
    rows = []
    for f in sorted(chosen, key=lambda f: (f.occurred_at, f.seq, f.event_id)):
        coverage = classify(f, terms, excl)
        outcome = latest.get(f.event_id)
        excluded_by: str | None = None
        reason: str | None = None
        if coverage is Coverage.EXCLUDED:
            entry = excl.get(f.event_id)
            if entry is not None:
                excluded_by, reason = "exclusion", entry.reason
            else:
                excluded_by, reason = "cause", f.cause
        rows.append(
            FailureRow(
                failure=f,
                status=_status(coverage, outcome),
                excluded_by=excluded_by,
                reason=reason,
                outcome=outcome,
                lost_gpu_seconds=lost_gpu_seconds(outcome),
            )
        )
    return tuple(rows)


def compute_figures(
    *,
    terms: Terms,
    period_start: datetime,
    period_end: datetime,
    now: datetime,
    failures: Iterable[Failure],
    outcomes: Iterable[Outcome],
    exclusions: Iterable[Exclusion],
    jobs: Iterable[JobSpan],
) -> SlaFigures:
    """Return the SLA figures of ``[period_start, period_end)`` as of ``now``.

    Only failures with ``period_start <= occurred_at < period_end`` count (whatever
    ``now`` is); their latest outcomes and any exclusions naming them apply whenever those
    were recorded, even after the period.  Outcomes and exclusions naming other failures
    are ignored.  The guarantee is met iff ``resolved * 100 >= covered *
    threshold_percent`` (so it is met with no covered failure; ``resolution_rate`` is then
    None).  Goodput is ``1 - lost / allocated`` (1 when nothing was allocated), not
    clamped: it can be negative when lost exceeds allocated.  Raises ValueError for naive
    datetimes, an empty period or duplicate failure ids.
    """
    _check_period(period_start, period_end, now)
    chosen = _in_period(failures, period_start, period_end)
    latest = latest_outcomes(outcomes)
    excluded_ids = {e.failure_event_id for e in exclusions}

    # The loop inlines classify(), _status() and lost_gpu_seconds() (same rules; the
    # tests check that failure_rows() agrees) to stay fast on large contract years.
    covered_classes = terms.covered_classes
    excluded_causes = terms.excluded_causes
    resolved = rolled_back = failed = pending = excluded = not_covered = 0
    lost_by_class = dict.fromkeys(CLASS_ORDER, _ZERO)
    with localcontext(_EXACT):
        for f in chosen:
            o = latest.get(f.event_id)
            if o is not None:
                lost_by_class[f.failure_class] += o.gpus_affected * (
                    o.recovery_seconds + o.lost_steps * o.step_seconds
                )
            if f.failure_class not in covered_classes:
                not_covered += 1
            elif f.cause in excluded_causes or f.event_id in excluded_ids:
                excluded += 1
            elif o is None:
                pending += 1
            elif o.outcome == "live_migrated" and o.lost_steps == 0:
                resolved += 1
            elif o.outcome == "rolled_back":
                rolled_back += 1
            else:
                failed += 1
    return figures_from_totals(
        terms=terms,
        period_start=period_start,
        period_end=period_end,
        now=now,
        counts={
            FailureStatus.RESOLVED: resolved,
            FailureStatus.ROLLED_BACK: rolled_back,
            FailureStatus.FAILED: failed,
            FailureStatus.PENDING: pending,
            FailureStatus.EXCLUDED: excluded,
            FailureStatus.NOT_COVERED: not_covered,
        },
        lost_by_class=lost_by_class,
        allocated=allocated_gpu_seconds(jobs, period_start, period_end, now),
    )


def figures_from_totals(
    *,
    terms: Terms,
    period_start: datetime,
    period_end: datetime,
    now: datetime,
    counts: Mapping[str, int],
    lost_by_class: Mapping[str, Decimal],
    allocated: Decimal,
) -> SlaFigures:
    """Return the figures of a period from its totals (what :func:`compute_figures` sums).

    ``counts`` maps each :class:`FailureStatus` value to the number of failures with that
    status (missing keys: 0); ``lost_by_class`` maps failure classes to exact lost
    GPU-seconds (missing: 0); ``allocated`` is the exact allocated GPU-seconds.  Used by
    the SQL aggregate of :mod:`billing.services`, so both paths share every formula.
    """
    _check_period(period_start, period_end, now)
    resolved = int(counts.get(FailureStatus.RESOLVED, 0))
    rolled_back = int(counts.get(FailureStatus.ROLLED_BACK, 0))
    failed = int(counts.get(FailureStatus.FAILED, 0))
    pending = int(counts.get(FailureStatus.PENDING, 0))
    excluded = int(counts.get(FailureStatus.EXCLUDED, 0))
    not_covered = int(counts.get(FailureStatus.NOT_COVERED, 0))
    by_class = {c: Decimal(lost_by_class.get(c, _ZERO)) for c in CLASS_ORDER}
    with localcontext(_EXACT):
        lost = sum(by_class.values(), _ZERO)
        covered = resolved + rolled_back + failed + pending
        met = resolved * 100 >= covered * terms.threshold_percent
    with localcontext(_RATIO):
        rate = None if covered == 0 else Decimal(resolved) / Decimal(covered)
        goodput = Decimal(1) if allocated == 0 else 1 - lost / allocated
        lost_hours = lost / _SECONDS_PER_HOUR
        allocated_hours = allocated / _SECONDS_PER_HOUR

    return SlaFigures(
        period_start=period_start,
        period_end=period_end,
        now=now,
        threshold_percent=terms.threshold_percent,
        total_failures=covered + excluded + not_covered,
        covered_failures=covered,
        resolved_failures=resolved,
        excluded_failures=excluded,
        not_covered_failures=not_covered,
        pending_failures=pending,
        rolled_back_failures=rolled_back,
        failed_failures=failed,
        resolution_rate=rate,
        guarantee_met=met,
        allocated_gpu_seconds=allocated,
        allocated_gpu_hours=allocated_hours,
        lost_gpu_seconds=lost,
        lost_gpu_hours=lost_hours,
        goodput=goodput,
        lost_gpu_seconds_by_class=tuple((c, by_class[c]) for c in CLASS_ORDER),
    )
