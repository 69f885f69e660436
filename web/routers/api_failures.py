"""``/api/v1/contracts/{id}/failures``: the filtered list, one failure, an entry's proof."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter, Query
from fastapi.responses import JSONResponse, Response
from starlette.concurrency import run_in_threadpool

from web import services
from web.accounts import Principal
from web.deps import ApiDb, PortalDep, ReaderDep
from web.pagecache import scope_key, view_stamp
from web.portal import Portal
from web.routers.api_contracts import MONTH_PATTERN
from web.schemas import (
    ERRORS,
    FailureDetailOut,
    FailurePageOut,
    TimelineOut,
    failure_out,
)

router = APIRouter(prefix="/api/v1", tags=["failures"], responses=ERRORS)

Status = Literal["resolved", "rolled_back", "failed", "pending", "excluded", "not_covered"]
FailureClass = Literal["unplanned", "preemptive", "planned"]


@router.get("/contracts/{contract_id}/failures", response_model=FailurePageOut)
async def list_failures(
    contract_id: str,
    reader: ReaderDep,
    portal: PortalDep,
    year: Annotated[int | None, Query(ge=1, le=100)] = None,
    month: Annotated[str | None, Query(pattern=MONTH_PATTERN)] = None,
    failure_class: FailureClass | None = None,
    cause: Annotated[str | None, Query(max_length=64)] = None,
    status: Status | None = None,
    page: Annotated[int, Query(ge=1, le=1_000_000)] = 1,
    per_page: Annotated[int, Query(ge=1, le=services.MAX_PER_PAGE)] = 50,
) -> Response:
    """Failures of a contract year (default: the current one), newest first."""
    flt = services.FailureFilter(month, failure_class, cause, status)
    return await run_in_threadpool(
        _list_failures, contract_id, reader, portal, year, flt, page, per_page
    )


def _list_failures(
    contract_id: str,
    reader: Principal,
    portal: Portal,
    year: int | None,
    flt: services.FailureFilter,
    page: int,
    per_page: int,
) -> Response:
    # the scoped visibility check (one round trip), then the cached view
    view = services.year_view_for(portal, reader, contract_id, year, portal.now())

    def render() -> bytes:
        result = services.failures_page(view, flt, page, per_page)
        out = FailurePageOut(
            items=[failure_out(r) for r in result.rows],
            total=result.total,
            page=result.page,
            per_page=result.per_page,
            pages=result.pages,
        )
        return bytes(JSONResponse(out.model_dump(mode="json")).body)

    key = ("api-failures", scope_key(reader), *view_stamp(view), flt, page, per_page)
    return Response(portal.pages.get_or_make(key, render), media_type="application/json")


@router.get("/contracts/{contract_id}/failures/{event_id}", response_model=FailureDetailOut)
def get_failure(
    contract_id: str, event_id: str, reader: ReaderDep, db: ApiDb, portal: PortalDep
) -> FailureDetailOut:
    """One failure with its outcomes, corrections, exclusions and disputes."""
    d = services.failure_detail(db, reader, portal.views, contract_id, event_id, portal.now())
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
    responses={409: {"model": ERRORS[404]["model"], "description": "Not signed yet."}},
)
def get_proof(contract_id: str, event_id: str, reader: ReaderDep, db: ApiDb) -> dict[str, Any]:
    """The inclusion proof (``yoco-inclusion-proof/v1``) of one entry of the contract's log.

    Check it offline with ``yoco verify-proof`` and the key at ``/api/v1/public-key``.
    """
    return services.entry_proof(db, reader, contract_id, event_id)
