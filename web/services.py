"""Tenant-scoped reads of the portal.

Every function takes the caller's :class:`~web.accounts.Principal` and filters by its
customer in the query itself (the service-layer half of tenant isolation); the session
it runs in is the portal role's, under row-level security (the database half).
Anything the caller may not see raises :class:`~web.errors.NotFound`, exactly as
something that does not exist.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from sqlalchemy.orm import Session

from billing.amendments import InForce, contract_in_force
from billing.incidents import Incident, group_incidents
from billing.labels import CLASS_ORDER, cause_label, class_label, outcome_label, status_label
from billing.verdict import format_number, format_seconds
from billing.years import year_of
from ledger import checkpoints as ledger_checkpoints
from ledger import contracts as ledger_contracts
from ledger import journal, projections
from ledger.cadence import CHECKPOINT_EVERY, describe_interval
from ledger.contracts import TenantScope, get_contract
from ledger.errors import LedgerError, UnknownContract, UnknownEntry
from ledger.records import ContractSpec
from web import billing_bridge
from web.accounts import Principal
from web.cache import ViewCache
from web.errors import Conflict, Invalid, NotFound
from web.views import (
    Row,
    YearView,
    compute_year_view,
    log_size,
    refresh_year_view,
)

if TYPE_CHECKING:
    from ledger.models import Checkpoint, Contract, Failure

STATUSES = (
    "resolved", "unresolved", "rolled_back", "failed", "pending", "excluded", "not_covered",
)
#: ``unresolved`` in the filter: every covered failure not resolved (the dashboard's card).
UNRESOLVED = frozenset({"rolled_back", "failed", "pending"})
CLASSES = CLASS_ORDER
MAX_PER_PAGE = 200


def tenant(principal: Principal) -> TenantScope:
    """The tenant scope of ``principal``'s reads: staff see every customer, anyone else
    only their own customer (and nothing when bound to none)."""
    if principal.is_staff:
        return TenantScope(everyone=True)
    return TenantScope(customer=principal.customer or "")


def visible_contracts(session: Session, principal: Principal) -> list[Contract]:
    """The contracts the caller may see, by id."""
    return ledger_contracts.visible_contracts(session, tenant(principal))


def contract_page(
    session: Session, principal: Principal, after: str | None, limit: int
) -> list[tuple[str, int]]:
    """The first ``limit`` contracts the caller may see with an id after ``after`` (all
    when None), by id, each with its log size (keyset pagination)."""
    return ledger_contracts.contract_page(session, tenant(principal), after, limit)


def visible_size(session: Session, principal: Principal, contract_id: str) -> int:
    """The size of the contract's log if the caller may see the contract, else NotFound.

    One indexed query, the same whether the contract is another customer's or missing.
    """
    size = ledger_contracts.visible_log_size(session, tenant(principal), contract_id)
    if size is None:
        raise NotFound()
    return size


def contract_for(
    session: Session, principal: Principal, contract_id: str, cache: ViewCache | None = None
) -> ContractSpec:
    """The contract ``contract_id`` if the caller may see it, else :class:`NotFound`."""
    size = visible_size(session, principal, contract_id)

    def load() -> ContractSpec:
        try:
            return get_contract(session, contract_id)
        except UnknownContract:
            raise NotFound() from None

    if cache is None:
        return load()
    spec: ContractSpec = cache.memo(("spec", contract_id, size), load)
    return spec


def pick_year(contract: ContractSpec, term_years: int, year: int | None, now: datetime) -> int:
    """Contract year ``year`` (default the current one); NotFound outside the term."""
    if year is None:
        k = year_of(contract.start_date, contract.timezone, now) or 1
        return min(k, term_years)
    if not 1 <= year <= term_years:
        raise NotFound(f"Contract year {year} is outside this contract's term.")
    return year


def in_force(session: Session, contract_id: str, year: int | None, now: datetime) -> InForce:
    """The contract as amended for ``year`` (default: the current year), with its terms."""
    base = contract_in_force(session, contract_id, 1)
    k = pick_year(base.contract, base.term_years, year, now)
    return base if k == 1 else contract_in_force(session, contract_id, k)


def term_years(session: Session, contract_id: str, cache: ViewCache) -> int:
    """The number of years of the term, renewals included."""
    size = log_size(session, contract_id)
    base: InForce = cache.memo(
        ("in_force", contract_id, size), lambda: contract_in_force(session, contract_id, 1)
    )
    return base.term_years


def year_view(
    session: Session,
    principal: Principal,
    cache: ViewCache,
    contract_id: str,
    year: int | None,
    now: datetime,
    reader: Callable[[], AbstractContextManager[Session]] | None = None,
    clock: Callable[[], datetime] | None = None,
    not_before: datetime | None = None,
) -> YearView:
    """The (cached) view of a contract year the caller may see.

    ``reader`` opens a new session scoped to the caller: given, a view that only aged
    past the TTL is refreshed in the background through it (see :class:`ViewCache`).
    ``not_before``: a view computed at an earlier time counts as aged.
    """
    size = visible_size(session, principal, contract_id)
    base: InForce = cache.memo(
        ("in_force", contract_id, size), lambda: contract_in_force(session, contract_id, 1)
    )
    k = pick_year(base.contract, base.term_years, year, now)

    def compute() -> YearView:
        force = base if k == 1 else contract_in_force(session, contract_id, k)
        return compute_year_view(session, force.contract, force.terms, k, now)

    refresh = None
    if reader is not None and clock is not None:
        open_session, time_now = reader, clock

        def refresh(old: YearView) -> YearView:
            with open_session() as s:
                return refresh_year_view(s, old, time_now())

    return cache.get((contract_id, k), size, compute, refresh, not_before)


def year_view_for(
    portal: Any,
    principal: Principal,
    contract_id: str,
    year: int | None,
    now: datetime,
    *,
    size: int | None = None,
    clock: Callable[[], datetime] | None = None,
    not_before: datetime | None = None,
) -> YearView:
    """:func:`year_view` with one database round trip when the cached view is fresh.

    The visibility check (:meth:`web.db.PortalDb.visible_size`: the customer filter
    and row-level security, one round trip) gives the log size; when the terms and the
    year's view cached for that size are fresh, nothing else is read.  Otherwise the
    usual scoped session does it all (and recomputes the view).  ``size``: the caller
    made that check already and got this size.  ``clock``: the time a view that aged
    is refreshed at (default ``portal.now``; the API's rounded instant).
    ``not_before``: a view computed at an earlier time has aged (the API passes its
    figures instant: its answers then move on with the instant, as their tags do).
    """
    if size is None:
        size = portal.db.visible_size(principal, contract_id)
        if size is None:
            raise NotFound()
    cache: ViewCache = portal.cache.views
    view = cached_year_view(cache, contract_id, year, now, size, not_before)
    if view is not None:
        return view
    with portal.db.read(principal, snapshot=True) as session:
        return year_view(
            session, principal, cache, contract_id, year, now,
            reader=lambda: portal.db.read(principal, snapshot=True),
            clock=clock or portal.now,
            not_before=not_before,
        )


def cached_year_view(
    cache: ViewCache,
    contract_id: str,
    year: int | None,
    now: datetime,
    size: int,
    not_before: datetime | None = None,
) -> YearView | None:
    """The view :func:`year_view_for` answers for a visible contract whose log has
    ``size`` entries when it is cached and fresh (nothing is read), else None."""
    base = cache.peek_memo(("in_force", contract_id, size))
    if base is None:
        return None
    k = pick_year(base.contract, base.term_years, year, now)
    return cache.peek((contract_id, k), size, not_before)


@dataclass(frozen=True, slots=True)
class FailureFilter:
    """Filters of the failures list; None (or empty) means any."""

    month: str | None = None
    failure_class: str | None = None
    cause: str | None = None
    status: str | None = None

    def matches(self, row: Row) -> bool:
        """True when ``row`` passes every filter."""
        f = row.row.failure
        return (
            (not self.month or row.month == self.month)
            and (not self.failure_class or f.failure_class == self.failure_class)
            and (not self.cause or f.cause == self.cause)
            and (
                not self.status
                or row.row.status.value == self.status
                or (self.status == "unresolved" and row.row.status.value in UNRESOLVED)
            )
        )


@dataclass(frozen=True, slots=True)
class Page:
    """One page of failure rows, newest first."""

    rows: Sequence[Row]
    total: int
    page: int
    per_page: int

    @property
    def pages(self) -> int:
        """Number of pages (at least 1)."""
        return max(1, -(-self.total // self.per_page))


def failures_page(view: YearView, flt: FailureFilter, page: int, per_page: int) -> Page:
    """Page ``page`` (1-based) of the year's failures that pass ``flt``, newest first."""
    per_page = max(1, min(per_page, MAX_PER_PAGE))
    chosen = [r for r in reversed(view.rows) if flt.matches(r)]
    page = max(1, page)
    lo = (page - 1) * per_page
    return Page(rows=chosen[lo : lo + per_page], total=len(chosen), page=page, per_page=per_page)


def incident_groups(view: YearView, rows: Sequence[Row]) -> list[tuple[Incident | None, list[Row]]]:
    """``rows`` (a page of the list, newest first) with the failures of one incident
    (billing.incidents, over the whole year) brought together where its newest one on the
    page stands, oldest last as the list runs; a failure in no incident is its own group
    with None."""
    incidents = group_incidents([r.row.failure for r in view.rows])
    groups: list[tuple[Incident | None, list[Row]]] = []
    at: dict[int, list[Row]] = {}
    for r in rows:
        inc = incidents.get(r.event_id)
        if inc is None:
            groups.append((None, [r]))
        elif inc.number in at:
            at[inc.number].append(r)
        else:
            at[inc.number] = [r]
            groups.append((inc, at[inc.number]))
    return groups


#: Columns of the failures CSV (:func:`failures_csv`), in order.
FAILURE_CSV_COLUMNS = (
    "event_id", "occurred_at_utc", "month", "job_id", "failure_class", "cause", "status",
    "outcome", "lost_steps", "recovery_seconds", "gpus_affected", "lost_gpu_hours",
    "excluded_because",
)


def failures_csv(view: YearView, flt: FailureFilter) -> bytes:
    """The year's failures that pass ``flt`` as CSV (UTF-8 with a byte-order mark, so a
    spreadsheet reads the names right), oldest first, one row each, with the columns of
    :data:`FAILURE_CSV_COLUMNS`.

    Classes, causes, statuses and outcomes are written in billing.labels' words (as the
    pages show them); numbers are plain decimals (GPU-hours with six places, as the
    report); a pending failure's outcome is "pending" and its lost figures are empty
    (unknown, not zero).  Every cell taken from the ledger (ids, jobs, causes, reasons)
    goes through :func:`billing.export.spreadsheet_text`, so no cell runs as a formula.
    """
    import csv
    import io
    from fractions import Fraction

    from billing.export import spreadsheet_text
    from billing.sla import decimal_string

    buf = io.StringIO()
    out = csv.writer(buf, lineterminator="\r\n")
    out.writerow(FAILURE_CSV_COLUMNS)
    for r in view.rows:
        if not flt.matches(r):
            continue
        row, f, o = r.row, r.row.failure, r.row.outcome
        excluded = ""
        if row.excluded_by == "cause":
            excluded = f"excluded cause: {cause_label(row.reason)}"
        elif row.excluded_by == "exclusion":
            excluded = f"exclusion: {row.reason}"
        cells = [
            f.event_id,
            f.occurred_at.astimezone(UTC).isoformat(),
            r.month,
            f.job_id,
            class_label(f.failure_class),
            cause_label(f.cause),
            status_label(row.status.value),
            outcome_label(o.outcome) if o else "pending",
            str(o.lost_steps) if o else "",
            format(o.recovery_seconds, "f") if o else "",
            str(o.gpus_affected) if o else "",
            decimal_string(Fraction(row.lost_gpu_seconds) / 3600) if o else "",
            excluded,
        ]
        out.writerow([spreadsheet_text(c) for c in cells])
    return ("\ufeff" + buf.getvalue()).encode("utf-8")


FailureKey = tuple[datetime, int, str]


def failure_key(row: Row) -> FailureKey:
    """The sort key of a failure row: (occurred_at, seq, event_id), a total order (seq
    is unique in the contract's log); lists are newest first, i.e. descending."""
    f = row.row.failure
    return (f.occurred_at, f.seq, f.event_id)


def failure_position(row: Row) -> list[Any]:
    """:func:`failure_key` of ``row`` as JSON values (a cursor's position)."""
    at, seq, eid = failure_key(row)
    return [at.isoformat(), seq, eid]


def failure_key_of(position: list[Any]) -> FailureKey:
    """The key a cursor's position names (:func:`failure_position`)."""
    at, seq, eid = position
    return (datetime.fromisoformat(str(at)), int(seq), str(eid))


def failures_after(
    view: YearView, flt: FailureFilter, after: FailureKey, limit: int
) -> tuple[list[Row], bool, int]:
    """The first ``limit`` rows passing ``flt`` that come after ``after`` newest first
    (keyset: key < after), whether more follow, and how many pass ``flt`` in all."""
    limit = max(1, min(limit, MAX_PER_PAGE))
    chosen = [r for r in reversed(view.rows) if flt.matches(r)]
    rows = [r for r in chosen if failure_key(r) < after]
    return rows[:limit], len(rows) > limit, len(chosen)


def latest_signed(session: Session, contract_id: str) -> int:
    """The tree size of the contract log's latest signed checkpoint (0: none)."""
    return ledger_checkpoints.latest_signed_size(session, contract_id)


@dataclass(frozen=True, slots=True)
class TimelineItem:
    """One ledger entry about a failure: the failure, an outcome, an exclusion, a dispute…"""

    kind: str
    event_id: str
    seq: int | None
    at: datetime
    title: str
    detail: dict[str, Any]
    #: ``ok``, ``warn``, ``bad`` or empty: the colour of the item's dot (an outcome's).
    tone: str = ""


@dataclass(frozen=True, slots=True)
class FailureDetail:
    """A failure, its row in its contract year (status, lost GPU-hours) and its timeline."""

    contract: ContractSpec
    failure: Failure
    year: int | None
    row: Row | None
    timeline: list[TimelineItem]
    disputes: list[dict[str, Any]]


def _uuid(value: str) -> uuid.UUID:
    try:
        return uuid.UUID(value)
    except ValueError:
        raise NotFound() from None


_OUTCOME_TONES = {"live_migrated": "ok", "rolled_back": "warn", "failed": "bad"}


def failure_detail(
    session: Session,
    principal: Principal,
    cache: ViewCache,
    contract_id: str,
    event_id: str,
    now: datetime,
) -> FailureDetail:
    """A failure of a contract the caller may see, with everything recorded about it."""
    contract = contract_for(session, principal, contract_id, cache)
    fid = _uuid(event_id)
    failure = projections.failure_of(session, contract_id, fid)
    if failure is None:
        raise NotFound()
    items = [
        TimelineItem(
            "failure",
            str(failure.event_id),
            failure.seq,
            failure.occurred_at,
            f"{class_label(failure.failure_class).capitalize()} failure: "
            f"{cause_label(failure.cause)}",
            {
                "Job": failure.job_id,
                "Node": failure.node,
                "GPU": failure.gpu,
                "Step": format_number(failure.step) if failure.step is not None else None,
                "Detail": failure.detail,
            },
            "bad",
        )
    ]
    for n, o in enumerate(projections.outcomes_of_failure(session, contract_id, fid)):
        items.append(
            TimelineItem(
                "outcome",
                str(o.event_id),
                o.seq,
                o.occurred_at,
                ("Corrected outcome: " if n else "Outcome: ") + outcome_label(o.outcome),
                {
                    "Lost steps": format_number(o.lost_steps),
                    "Recovery time": format_seconds(o.recovery_seconds),
                    "Step time": format_seconds(o.step_seconds),
                    "GPUs affected": format_number(o.gpus_affected),
                },
                _OUTCOME_TONES.get(o.outcome, ""),
            )
        )
    for x in projections.exclusions_of_failure(session, contract_id, fid):
        items.append(
            TimelineItem(
                "exclusion",
                str(x.event_id),
                x.seq,
                x.occurred_at,
                "Excluded from the guarantee",
                {"Reason": x.reason, "Approved by": x.approved_by},
            )
        )
    items.extend(
        TimelineItem(**t) for t in billing_bridge.failure_timeline(session, contract_id, fid)
    )
    items.sort(key=lambda t: (t.at, t.seq if t.seq is not None else -1))
    year = year_of(contract.start_date, contract.timezone, failure.occurred_at)
    row = None
    if year is not None and 1 <= year <= term_years(session, contract_id, cache):
        row = year_view(session, principal, cache, contract_id, year, now).by_id.get(
            str(failure.event_id)
        )
    disputes = billing_bridge.disputes_of_failure(session, contract_id, fid)
    return FailureDetail(contract, failure, year, row, items, disputes)


def failure_summaries(session: Session, event_ids: Sequence[str]) -> dict[str, dict[str, Any]]:
    """For the disputes queue: each failure's class, cause, time, job and latest outcome
    (``outcome`` None while pending), by event id; ids the session cannot see are absent."""
    ids = [_uuid(i) for i in event_ids]
    if not ids:
        return {}
    out: dict[str, dict[str, Any]] = {}
    for f in projections.failures_with_ids(session, ids):
        out[str(f.event_id)] = {
            "failure_class": f.failure_class, "cause": f.cause, "occurred_at": f.occurred_at,
            "job_id": f.job_id, "outcome": None, "lost_steps": None, "recovery_seconds": None,
        }
    # the latest (time, then ledger order) wins, as in the figures
    for o in projections.outcomes_of_failures(session, ids):
        item = out.get(str(o.failure_event_id))
        if item is not None:
            item.update(outcome=o.outcome, lost_steps=o.lost_steps,
                        recovery_seconds=o.recovery_seconds)
    return out


def entry_proof(
    session: Session,
    principal: Principal,
    contract_id: str,
    event_id: str,
    *,
    checkpoint_every_s: float = CHECKPOINT_EVERY.total_seconds(),
) -> dict[str, Any]:
    """The inclusion proof bundle of an entry of a contract the caller may see.

    An entry not under a signed checkpoint yet is a :class:`Conflict` that says when it
    will be: within ``checkpoint_every_s``, the deployment's checkpoint interval.
    """
    from ledger.services import inclusion_bundle

    contract_for(session, principal, contract_id)
    eid = _uuid(event_id)
    if journal.log_of_entry(session, eid) != contract_id:
        raise NotFound()
    try:
        return inclusion_bundle(session, str(eid))
    except UnknownEntry:
        raise NotFound() from None
    except LedgerError:
        raise Conflict(
            "This entry is not covered by a signed checkpoint yet. Every log with new "
            "entries is signed on a schedule: its proof is available within "
            f"{describe_interval(checkpoint_every_s)} of the entry."
        ) from None


def checkpoints(
    session: Session,
    principal: Principal,
    contract_id: str,
    *,
    below: int | None = None,
    limit: int | None = None,
) -> list[Checkpoint]:
    """The signed checkpoints of a contract's log, newest (largest) first; ``below``:
    only those smaller than that tree size; ``limit``: the first ones (keyset)."""
    contract_for(session, principal, contract_id)
    return ledger_checkpoints.newest_first(session, contract_id, below=below, limit=limit)


def consistency(
    session: Session, principal: Principal, contract_id: str, size1: int, size2: int
) -> dict[str, Any]:
    """A consistency proof between two signed checkpoints of a contract's log."""
    from ledger.services import consistency_bundle

    contract_for(session, principal, contract_id)
    if size1 > size2:
        size1, size2 = size2, size1
    try:
        return consistency_bundle(session, contract_id, size1, size2)
    except LedgerError as exc:
        raise Invalid(str(exc)) from None


def months_so_far(view: YearView) -> list[str]:
    """Months of the year that have begun (newest first): those with a report."""
    return [m.label for m in reversed(view.months) if m.start < view.now]


#: The last calendar year a month can be asked of (billing's ``month_bounds`` limit).
MAX_YEAR = 9998


def parse_month(value: str | None) -> tuple[int, int] | None:
    """``YYYY-MM`` as (year, month); None for empty; :class:`NotFound` when malformed."""
    if not value:
        return None
    from billing.years import parse_month as _parse

    try:
        return _parse(value)  # years 1..MAX_YEAR: a month's end must be in the calendar
    except ValueError:
        raise NotFound() from None
