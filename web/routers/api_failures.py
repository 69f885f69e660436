"""``/api/v1/contracts/{id}/failures``: the filtered list, one failure, an entry's proof."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Query, Request
from fastapi.responses import JSONResponse, Response
from starlette.concurrency import run_in_threadpool

from ledger.journal import log_size
from web import services
from web.accounts import Principal
from web.cache import scope_key, view_stamp
from web.conditional import client_has, json_answer, normalised_query, not_modified
from web.cursors import BadCursor
from web.deps import PortalDep, ReaderDep
from web.errors import NotFound
from web.paging import PAGED_HEADERS, CursorQ, link_headers, next_url
from web.portal import Portal
from web.replay import body_kept, declare
from web.routers.api_contracts import MONTH_PATTERN
from web.schemas import (
    CONDITIONAL,
    ERRORS,
    FailureDetailOut,
    FailurePageOut,
    TimelineOut,
    failure_out,
)

router = APIRouter(prefix="/api/v1", tags=["failures"], responses=ERRORS)

Status = Literal["resolved", "rolled_back", "failed", "pending", "excluded", "not_covered"]
FailureClass = Literal["unplanned", "preemptive", "planned"]


@router.get(
    "/contracts/{contract_id}/failures",
    response_model=FailurePageOut,
    responses={200: {"headers": PAGED_HEADERS}, **CONDITIONAL},
)
async def list_failures(
    request: Request,
    contract_id: str,
    reader: ReaderDep,
    portal: PortalDep,
    year: Annotated[int | None, Query(ge=1, le=100)] = None,
    month: Annotated[str | None, Query(pattern=MONTH_PATTERN)] = None,
    failure_class: FailureClass | None = None,
    cause: Annotated[str | None, Query(max_length=64)] = None,
    status: Status | None = None,
    page: Annotated[
        int, Query(ge=1, le=1_000_000, description="Page number (older clients; prefer cursor).")
    ] = 1,
    per_page: Annotated[int, Query(ge=1, le=services.MAX_PER_PAGE)] = 50,
    cursor: CursorQ = None,
) -> Response:
    """Failures of a contract year (default: the current one), newest first.

    Newest first means by (occurred_at, seq, event_id), descending: a total order.
    Follow ``next`` (also a ``Link`` header) to page through with a cursor: failures
    recorded meanwhile never shift or repeat an item.  ``page`` numbers still work.
    """
    flt = services.FailureFilter(month, failure_class, cause, status)
    return await run_in_threadpool(
        _list_failures, request, contract_id, reader, portal, year, flt, page, per_page,
        cursor,
    )


def _list_failures(
    request: Request,
    contract_id: str,
    reader: Principal,
    portal: Portal,
    year: int | None,
    flt: services.FailureFilter,
    page: int,
    per_page: int,
    cursor: str | None,
) -> Response:
    state = portal.db.visible_state(reader, contract_id)  # the scoped visibility check
    if state is None:
        raise NotFound()
    query = normalised_query(request)
    at = portal.figures_now()

    def tag(size: int, when: datetime) -> str:
        return portal.etag("api-failures", scope_key(reader), contract_id, query, size, when)

    etag = tag(state.size, at)
    if client_has(request, etag):
        declare(request, reader, state, at)
        return not_modified(etag)
    bound = (contract_id, year, flt.month, flt.failure_class, flt.cause, flt.status)
    after = None
    k = year
    if cursor is not None:
        if page != 1:
            raise BadCursor("Give 'cursor' or 'page', not both.")
        k, *position = portal.cursors.decode(cursor, "failures", bound)
        after = services.failure_key_of(position)
    view = services.year_view_for(
        portal, reader, contract_id, k, at, size=state.size, clock=portal.figures_now,
        not_before=at,
    )

    def render() -> tuple[bytes, str | None]:
        if after is None:
            result = services.failures_page(view, flt, page, per_page)
            rows, total = list(result.rows), result.total
            more = page * per_page < total
        else:
            rows, more, total = services.failures_after(view, flt, after, per_page)
        nxt = None
        if more and rows:
            nxt = portal.cursors.encode(
                "failures", bound, [view.year, *services.failure_position(rows[-1])]
            )
        out = FailurePageOut(
            items=[failure_out(r) for r in rows],
            total=total,
            page=page if after is None else None,
            per_page=per_page,
            pages=max(1, -(-total // per_page)),
            next_cursor=nxt,
            next=next_url(request, nxt) if nxt else None,
        )
        return bytes(JSONResponse(out.model_dump(mode="json")).body), nxt

    key = ("api-failures", scope_key(reader), *view_stamp(view), query)
    body, nxt = body_kept(request, portal.cache.pages, key, render)
    if view.log_size == state.size and view.now == at:  # not a view kept from before
        declare(request, reader, state, at)
    return json_answer(request, tag(view.log_size, view.now), body, link_headers(request, nxt))


@router.get(
    "/contracts/{contract_id}/failures/{event_id}",
    response_model=FailureDetailOut,
    responses=CONDITIONAL,
)
async def get_failure(
    request: Request, contract_id: str, event_id: str, reader: ReaderDep, portal: PortalDep
) -> Response:
    """One failure with its outcomes, corrections, exclusions and disputes."""
    return await run_in_threadpool(_get_failure, request, contract_id, event_id, reader, portal)


def _get_failure(
    request: Request, contract_id: str, event_id: str, reader: Principal, portal: Portal
) -> Response:
    state = portal.db.visible_state(reader, contract_id)
    if state is None:
        raise NotFound()
    # Nothing in the answer depends on the time: the log alone.
    etag = portal.etag("api-failure", scope_key(reader), contract_id, event_id, state.size)
    if client_has(request, etag):
        declare(request, reader, state, None)
        return not_modified(etag)

    def render() -> tuple[int, bytes]:
        with portal.db.read(reader, snapshot=True) as db:
            size = log_size(db, contract_id)
            d = services.failure_detail(
                db, reader, portal.cache.views, contract_id, event_id, portal.figures_now()
            )
            out = _detail_out(d)
        return size, bytes(JSONResponse(out.model_dump(mode="json")).body)

    # Kept under its tag (the scope, the failure and the log size name the body), when
    # of that size.
    key = ("api-body", etag)
    size, body = body_kept(request, portal.cache.pages, key, render,
                           keep=lambda made: made[0] == state.size)
    if size != state.size:  # the log grew meanwhile: not what the tag says
        etag = portal.etag("api-failure", scope_key(reader), contract_id, event_id, size)
    else:
        declare(request, reader, state, None)
    return json_answer(request, etag, body)


def _detail_out(d: services.FailureDetail) -> FailureDetailOut:
    f = d.failure
    return FailureDetailOut(
        event_id=str(f.event_id),
        contract_id=f.contract_id,
        occurred_at=f.occurred_at,
        job_id=f.job_id,
        failure_class=f.failure_class,
        cause=f.cause,
        node=f.node,
        gpu=f.gpu,
        step=f.step,
        detail=f.detail,
        contract_year=d.year,
        row=failure_out(d.row) if d.row else None,
        timeline=[
            TimelineOut(
                kind=t.kind,
                event_id=t.event_id,
                seq=t.seq,
                occurred_at=t.at,
                title=t.title,
                detail={k: (str(v) if v is not None else None) for k, v in t.detail.items()},
            )
            for t in d.timeline
        ],
        disputes=[
            {k: (v.isoformat() if hasattr(v, "isoformat") else v) for k, v in x.items()}
            for x in d.disputes
        ],
    )


@router.get(
    "/contracts/{contract_id}/entries/{event_id}/proof",
    response_model=dict[str, Any],
    responses={**CONDITIONAL,
               409: {"model": ERRORS[404]["model"], "description": "Not signed yet."}},
)
async def get_proof(
    request: Request, contract_id: str, event_id: str, reader: ReaderDep, portal: PortalDep
) -> Response:
    """The inclusion proof (``yoco-inclusion-proof/v1``) of one entry of the contract's log.

    Check it offline with ``yoco verify-proof`` and the key at ``/api/v1/public-key``.
    The proof is against the latest signed checkpoint: its tag changes when one is signed.
    """
    return await run_in_threadpool(_get_proof, request, contract_id, event_id, reader, portal)


def _get_proof(
    request: Request, contract_id: str, event_id: str, reader: Principal, portal: Portal
) -> Response:
    state = portal.db.visible_state(reader, contract_id)
    if state is None:
        raise NotFound()
    etag = portal.etag("api-proof", scope_key(reader), contract_id, event_id, state.heads)
    if client_has(request, etag):
        declare(request, reader, state, None)
        return not_modified(etag)

    def render() -> tuple[int, bytes]:
        with portal.db.read(reader, snapshot=True) as db:
            signed = services.latest_signed(db, contract_id)
            bundle = services.entry_proof(
                db, reader, contract_id, event_id,
                checkpoint_every_s=portal.host.settings.checkpoint_every_s,
            )
        return signed, bytes(JSONResponse(bundle).body)

    key = ("api-body", etag)
    signed, body = body_kept(request, portal.cache.pages, key, render,
                             keep=lambda made: made[0] == state.signed)
    if signed != state.signed:  # signed meanwhile: not what the tag says
        etag = portal.etag("api-proof", scope_key(reader), contract_id, event_id,
                           (signed, state.cosigned))
    else:
        declare(request, reader, state, None)
    return json_answer(request, etag, body)
