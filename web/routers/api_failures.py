"""``/api/v1/contracts/{id}/failures``: the filtered list, one failure, an entry's proof."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter, Query

from web import services
from web.deps import ApiDb, PortalDep, ReaderDep
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
def list_failures(
    contract_id: str,
    reader: ReaderDep,
    db: ApiDb,
    portal: PortalDep,
    year: Annotated[int | None, Query(ge=1, le=100)] = None,
    month: Annotated[str | None, Query(pattern=MONTH_PATTERN)] = None,
    failure_class: FailureClass | None = None,
    cause: Annotated[str | None, Query(max_length=64)] = None,
    status: Status | None = None,
    page: Annotated[int, Query(ge=1, le=1_000_000)] = 1,
    per_page: Annotated[int, Query(ge=1, le=services.MAX_PER_PAGE)] = 50,
) -> FailurePageOut:
    """Failures of a contract year (default: the current one), newest first."""
    view = services.year_view(db, reader, portal.views, contract_id, year, portal.now())
    flt = services.FailureFilter(month, failure_class, cause, status)
    result = services.failures_page(view, flt, page, per_page)
    return FailurePageOut(
        items=[failure_out(r) for r in result.rows],
        total=result.total,
        page=result.page,
        per_page=result.per_page,
        pages=result.pages,
    )


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
