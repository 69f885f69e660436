"""``/api/v1/contracts``: the caller's contracts, SLA figures of a year or month, credits."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Annotated, Any

from fastapi import APIRouter, Query, Request
from fastapi.encoders import jsonable_encoder
from fastapi.responses import JSONResponse, Response
from starlette.concurrency import run_in_threadpool

from billing.services import current_year, sla_figures
from ledger.journal import log_size
from web import billing_bridge, services
from web.accounts import Principal
from web.cache import scope_key, view_stamp
from web.conditional import client_has, json_answer, normalised_query, not_modified
from web.db import LogState
from web.deps import PortalDep, ReaderDep
from web.errors import NotFound
from web.paging import DEFAULT_LIMIT, PAGED_HEADERS, CursorQ, LimitQ, link_headers
from web.portal import Portal
from web.replay import body_kept, declare
from web.schemas import (
    CONDITIONAL,
    ERRORS,
    ContractOut,
    SlaOut,
    YearOut,
    figures_out,
    month_out,
)

router = APIRouter(prefix="/api/v1", tags=["contracts"], responses=ERRORS)

MONTH_PATTERN = r"^[0-9]{4}-(0[1-9]|1[0-2])$"


def _contract_out(spec: Any, now: Any) -> ContractOut:
    rec = spec.to_record()
    return ContractOut(
        contract_id=rec["contract_id"],
        customer=rec["customer"],
        start_date=rec["start_date"],
        timezone=rec["timezone"],
        term_years=rec["term_years"],
        currency=rec["currency"],
        annual_value=rec["annual_value"],
        renewal_value=rec["renewal_value"],
        gpu_hour_price=rec["gpu_hour_price"],
        terms=rec["terms"],
        current_year=current_year(spec, now),
    )


def _visible(portal: Portal, reader: Principal, contract_id: str) -> LogState:
    """The contract's log state if the caller may see it (one round trip), else 404."""
    state = portal.db.visible_state(reader, contract_id)
    if state is None:
        raise NotFound()
    return state


def _json(obj: Any) -> bytes:
    return bytes(JSONResponse(jsonable_encoder(obj)).body)


@router.get(
    "/contracts",
    response_model=list[ContractOut],
    responses={200: {"headers": PAGED_HEADERS}, **CONDITIONAL},
)
async def list_contracts(
    request: Request,
    reader: ReaderDep,
    portal: PortalDep,
    limit: LimitQ = DEFAULT_LIMIT,
    cursor: CursorQ = None,
) -> Response:
    """The caller's contracts (staff: every contract), by contract id.

    At most ``limit`` per page; a ``Link: <…>; rel="next"`` header names the next page.
    """
    return await run_in_threadpool(_list_contracts, request, reader, portal, limit, cursor)


def _list_contracts(
    request: Request, reader: Principal, portal: Portal, limit: int, cursor: str | None
) -> Response:
    scope = scope_key(reader)
    after = None
    if cursor is not None:
        after = str(portal.cursors.decode(cursor, "contracts", scope)[0])
    # What the whole list shows, read first: rows read after it are never older.
    shown = portal.db.visible_list_state(reader)
    with portal.db.read(reader, snapshot=True) as db:
        rows = services.contract_page(db, reader, after, limit + 1)
        more = len(rows) > limit
        rows = rows[:limit]
        at = portal.figures_now()
        etag = portal.etag(
            "contracts", scope, normalised_query(request), tuple(rows), more, at
        )
        nxt = portal.cursors.encode("contracts", scope, [rows[-1][0]]) if more else None
        links = link_headers(request, nxt)
        declare(request, reader, shown, at)  # the tag's parts: rows of that list, instant
        if client_has(request, etag):
            return not_modified(etag, links)
        # The tag names everything the body is made of: the body is kept under it.
        body = body_kept(request, portal.cache.pages, ("api-body", etag), lambda: _json(
            [_contract_out(services.contract_for(db, reader, cid), at) for cid, _ in rows]))
    return json_answer(request, etag, body, links)


@router.get("/contracts/{contract_id}", response_model=ContractOut, responses=CONDITIONAL)
async def get_contract(
    request: Request, contract_id: str, reader: ReaderDep, portal: PortalDep
) -> Response:
    """One contract and its guarantee terms."""
    return await run_in_threadpool(_get_contract, request, contract_id, reader, portal)


def _get_contract(
    request: Request, contract_id: str, reader: Principal, portal: Portal
) -> Response:
    state = _visible(portal, reader, contract_id)
    at = portal.figures_now()
    etag = portal.etag("contract", scope_key(reader), contract_id, state.size, at)
    declare(request, reader, state, at)  # the tag's parts name the answer
    if client_has(request, etag):
        return not_modified(etag)

    def render() -> bytes:
        with portal.db.read(reader) as db:
            return _json(_contract_out(services.contract_for(db, reader, contract_id), at))

    return json_answer(request, etag,
                       body_kept(request, portal.cache.pages, ("api-body", etag), render))


@router.get("/contracts/{contract_id}/sla", response_model=SlaOut, responses=CONDITIONAL)
async def get_sla(
    request: Request,
    contract_id: str,
    reader: ReaderDep,
    portal: PortalDep,
    year: Annotated[int | None, Query(ge=1, le=100, description="Contract year K.")] = None,
    month: Annotated[
        str | None, Query(pattern=MONTH_PATTERN, description="A calendar month, YYYY-MM.")
    ] = None,
) -> Response:
    """The figures of a contract year (default: the current one) or of a month.

    The same object as ``yoco sla CONTRACT --json``, computed at ``computed_at`` (the
    request's time rounded down to the figures TTL), once per contract log size.
    """
    return await run_in_threadpool(
        _get_sla, request, contract_id, reader, portal, year, month
    )


def _get_sla(
    request: Request,
    contract_id: str,
    reader: Principal,
    portal: Portal,
    year: int | None,
    month: str | None,
) -> Response:
    state = _visible(portal, reader, contract_id)
    if year is not None and month is not None:
        raise NotFound("Give year or month, not both.")
    at = portal.figures_now()

    def tag(size: int) -> str:
        return portal.etag("sla", scope_key(reader), contract_id, year, month, size, at)

    etag = tag(state.size)
    if client_has(request, etag):
        declare(request, reader, state, at)
        return not_modified(etag)
    ym = services.parse_month(month)

    def compute() -> tuple[int, bytes]:
        # One snapshot: the log size read first is the size the figures are of.
        with portal.db.read(reader, snapshot=True) as db:
            size = log_size(db, contract_id)
            report = sla_figures(db, contract_id, year=year, month=ym, now=at)
        return size, _json(report.to_json())

    base = ("sla", contract_id, year, ym, state.size)
    key = (*base, at)
    if portal.cache.figures.get(key) is None:
        stale = _previous_sla(portal, base, at, compute)
        if stale is not None:
            # The log has not grown; only the instant moved on: the answer of the
            # previous instant (under its own tag) while the new one is computed.
            prev_at, body = stale
            etag = portal.etag("sla", scope_key(reader), contract_id, year, month,
                               state.size, prev_at)
            return json_answer(request, etag, body)
    # Kept only when of the size the key names (the log may grow meanwhile).
    size, body = body_kept(request, portal.cache.figures, key, compute,
                           keep=lambda made: made[0] == state.size)
    if size != state.size:  # the log grew meanwhile: not what the key says
        etag = tag(size)
    else:
        _computed_at(portal, base, at)
        declare(request, reader, state, at)  # the figures of this size and instant
    return json_answer(request, etag, body)


def _computed_at(portal: Portal, base: tuple[Any, ...], at: datetime) -> None:
    """Note that the ``/sla`` answer of ``base`` (contract, period, log size) is kept for
    instant ``at`` (the latest such instant is what :func:`_previous_sla` serves)."""
    latest = portal.cache.instants.get(base)
    portal.cache.instants.put(base, at if latest is None else max(at, latest))


def _previous_sla(
    portal: Portal,
    base: tuple[Any, ...],
    at: datetime,
    compute: Callable[[], tuple[int, bytes]],
) -> tuple[datetime, bytes] | None:
    """For a log that has not grown since: the answer of the latest earlier instant, if
    still cached, after starting (once) the computation of ``at``'s in the background.

    Time-dependent figures are computed per instant (the request's time rounded down to
    the figures TTL): without this, the first request of each new instant in each worker
    would wait for a whole year's figures.  None when there is no such answer (the
    caller computes in the request) or the TTL is 0 (no instants to reuse).
    """
    if portal.settings.figures_ttl_seconds <= 0:
        return None
    prev_at = portal.cache.instants.get(base)
    if prev_at is None or prev_at >= at:
        return None
    cached = portal.cache.figures.get((*base, prev_at))
    if cached is None:
        return None

    def fresh() -> tuple[int, bytes] | None:
        made = compute()
        return made if made[0] == base[-1] else None  # the log grew: not this key's

    portal.cache.figures.make_later((*base, at), fresh,
                                    then=lambda _: _computed_at(portal, base, at))
    return prev_at, cached[1]


@router.get(
    "/contracts/{contract_id}/years/{year}", response_model=YearOut, responses=CONDITIONAL
)
async def get_year(
    request: Request,
    contract_id: str,
    year: int,
    reader: ReaderDep,
    portal: PortalDep,
) -> Response:
    """A contract year's figures and its months (the dashboard's chart, as data)."""
    return await run_in_threadpool(_get_year, request, contract_id, year, reader, portal)


def _get_year(
    request: Request, contract_id: str, year: int, reader: Principal, portal: Portal
) -> Response:
    state = _visible(portal, reader, contract_id)
    at = portal.figures_now()

    def tag(size: int, when: datetime) -> str:
        return portal.etag("api-year", scope_key(reader), contract_id, year, size, when)

    etag = tag(state.size, at)
    if client_has(request, etag):
        declare(request, reader, state, at)
        return not_modified(etag)
    view = services.year_view_for(
        portal, reader, contract_id, year, at, size=state.size, clock=portal.figures_now,
        not_before=at,
    )

    def render() -> bytes:
        out = YearOut(
            contract_id=contract_id,
            year=view.year,
            figures=figures_out(view.figures),
            months=[month_out(m) for m in view.months],
        )
        return bytes(JSONResponse(out.model_dump(mode="json")).body)

    key = ("api-year", scope_key(reader), *view_stamp(view))
    body = body_kept(request, portal.cache.pages, key, render)
    if view.log_size == state.size and view.now == at:  # not a view kept from before
        declare(request, reader, state, at)
    return json_answer(request, tag(view.log_size, view.now), body)


@router.get(
    "/contracts/{contract_id}/credits",
    response_model=list[dict[str, Any]],
    responses={200: {"headers": PAGED_HEADERS}, **CONDITIONAL},
)
async def get_credits(
    request: Request,
    contract_id: str,
    reader: ReaderDep,
    portal: PortalDep,
    limit: LimitQ = DEFAULT_LIMIT,
    cursor: CursorQ = None,
) -> Response:
    """The renewal credits of a contract, newest first (amounts as decimal strings in its
    currency).  At most ``limit`` per page; a ``Link`` header names the next page."""
    return await run_in_threadpool(
        _get_credits, request, contract_id, reader, portal, limit, cursor
    )


def _get_credits(
    request: Request,
    contract_id: str,
    reader: Principal,
    portal: Portal,
    limit: int,
    cursor: str | None,
) -> Response:
    state = _visible(portal, reader, contract_id)
    before = None
    if cursor is not None:
        at_s, cid, seq = portal.cursors.decode(cursor, "credits", (contract_id,))
        before = (datetime.fromisoformat(at_s), cid, int(seq))
    etag = portal.etag(
        "credits", scope_key(reader), contract_id, normalised_query(request), state.size
    )
    declare(request, reader, state, None)  # the log alone (and the cursor, in the query)
    if client_has(request, etag):
        return not_modified(etag)

    def render() -> tuple[bytes, str | None]:
        nxt = None
        with portal.db.read(reader) as db:
            rows = billing_bridge.credit_rows(db, [contract_id], before=before,
                                              limit=limit + 1)
        if len(rows) > limit:
            rows = rows[:limit]
            last = rows[-1]
            nxt = portal.cursors.encode(
                "credits", (contract_id,),
                [last["issued_at"].isoformat(), last["contract_id"], last["seq"]],
            )
        for r in rows:
            r["issued_at"] = r["issued_at"].isoformat()
        return _json(rows), nxt

    # Credits are entries of the contract's log: the tag (its size) names the body.
    body, nxt = body_kept(request, portal.cache.pages, ("api-body", etag), render)
    return json_answer(request, etag, body, link_headers(request, nxt))
