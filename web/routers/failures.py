"""Failures of a contract year: the filtered list, one failure's detail, proofs, disputes."""

from __future__ import annotations

import json
from typing import Annotated, Any

from fastapi import APIRouter, Form, Query, Request
from fastapi.responses import RedirectResponse, Response
from starlette.concurrency import run_in_threadpool

from billing.incidents import INCIDENT_GAP
from web import billing_bridge, services
from web.accounts import Principal
from web.cache import scope_key, view_stamp
from web.deps import CsrfDep, PageDb, PortalDep, UserDep
from web.errors import Forbidden, Invalid
from web.portal import Portal
from web.render import attachment, fragment, page

router = APIRouter(include_in_schema=False)


@router.get("/contracts/{contract_id}/failures")
async def failure_list(
    request: Request,
    contract_id: str,
    user: UserDep,
    portal: PortalDep,
    year: Annotated[int | None, Query(ge=1, le=100)] = None,
    month: Annotated[str, Query(max_length=7)] = "",
    failure_class: Annotated[str, Query(max_length=40)] = "",
    cause: Annotated[str, Query(max_length=64)] = "",
    status: Annotated[str, Query(max_length=40)] = "",
    page_no: Annotated[int, Query(alias="page", ge=1, le=100_000)] = 1,
    per_page: Annotated[int, Query(ge=1, le=services.MAX_PER_PAGE)] = 50,
) -> Response:
    """Failures of a contract year, newest first, filtered by month, class, cause, status."""
    filters = (month, failure_class, cause, status)
    # One hop to the thread pool for the whole request (database, cache, rendering).
    return await run_in_threadpool(
        _failure_list, request, contract_id, user, portal, year, filters, page_no, per_page,
    )


def _failure_list(
    request: Request,
    contract_id: str,
    user: Principal,
    portal: Portal,
    year: int | None,
    filters: tuple[str, str, str, str],
    page_no: int,
    per_page: int,
) -> Response:
    # the scoped visibility check (one round trip), then the cached view
    view = services.year_view_for(portal, user, contract_id, year, portal.now())
    month, failure_class, cause, status = filters

    def render() -> object:
        flt = services.FailureFilter(
            month=month or None,
            failure_class=failure_class or None,
            cause=cause or None,
            status=status or None,
        )
        result = services.failures_page(view, flt, page_no, per_page)
        query = {
            k: v
            for k, v in {
                "year": str(view.year),
                "month": month,
                "failure_class": failure_class,
                "cause": cause,
                "status": status,
                "per_page": str(per_page) if per_page != 50 else "",
            }.items()
            if v
        }
        return fragment(
            request,
            "failures_body.html",
            {
                "view": view,
                "contract": view.contract,
                "tz": view.contract.timezone,
                "result": result,
                "groups": services.incident_groups(view, result.rows),
                "gap_minutes": int(INCIDENT_GAP.total_seconds() // 60),
                "flt": flt,
                "query": query,
                "months": [m.label for m in view.months],
                "classes": services.CLASSES,
                "statuses": services.STATUSES,
            },
        )

    key = ("failures", scope_key(user), *view_stamp(view), filters, page_no, per_page)
    body = portal.cache.pages.get_or_make(key, render)
    return _failures_page(request, view, body)


@router.get("/contracts/{contract_id}/failures.csv")
def failures_csv(
    contract_id: str,
    user: UserDep,
    portal: PortalDep,
    year: Annotated[int | None, Query(ge=1, le=100)] = None,
    month: Annotated[str, Query(max_length=7)] = "",
    failure_class: Annotated[str, Query(max_length=40)] = "",
    cause: Annotated[str, Query(max_length=64)] = "",
    status: Annotated[str, Query(max_length=40)] = "",
) -> Response:
    """Download the contract year's failures (with the list's filters) as CSV: only a
    contract the caller may see (another customer's is not found), formula-safe cells."""
    view = services.year_view_for(portal, user, contract_id, year, portal.now())
    flt = services.FailureFilter(month=month or None, failure_class=failure_class or None,
                                 cause=cause or None, status=status or None)
    return Response(
        services.failures_csv(view, flt),
        media_type="text/csv; charset=utf-8",
        headers=attachment(f"failures-{view.contract.contract_id}-year-{view.year}.csv"),
    )


def _failures_page(request: Request, view: Any, body: Any) -> Response:
    """The failures list: the caller's header around the cached ``body`` of ``view``."""
    return page(
        request,
        "failures.html",
        {"body": body, "view": view, "contract": view.contract, "section": "failures"},
    )


@router.get("/contracts/{contract_id}/failures/{event_id}")
def failure_page(
    request: Request,
    contract_id: str,
    event_id: str,
    user: UserDep,
    db: PageDb,
    portal: PortalDep,
) -> Response:
    """One failure: status, lost GPU-hours, its timeline, proofs and the dispute form."""
    now = portal.now()
    detail = services.failure_detail(db, user, portal.cache.views, contract_id, event_id, now)
    return page(
        request,
        "failure.html",
        {
            "d": detail,
            "now": now,
            "contract": detail.contract,
            "tz": detail.contract.timezone,
            "can_dispute": user.role == "customer",
            "disputed": request.query_params.get("disputed") == "1",
            "verifier_key": portal.verifier_key,
            "section": "failures",
        },
    )


@router.get("/contracts/{contract_id}/entries/{event_id}/proof")
def entry_proof(
    contract_id: str, event_id: str, user: UserDep, db: PageDb, portal: PortalDep
) -> Response:
    """Download the inclusion proof of one ledger entry (``yoco-inclusion-proof/v1``)."""
    bundle = services.entry_proof(
        db, user, contract_id, event_id,
        checkpoint_every_s=portal.host.settings.checkpoint_every_s,
    )
    return Response(
        json.dumps(bundle, indent=2, ensure_ascii=False) + "\n",
        media_type="application/json",
        headers=attachment(f"proof-{bundle['event_id']}.json"),
    )


@router.get("/contracts/{contract_id}/disputes")
def contract_disputes(
    request: Request, contract_id: str, user: UserDep, db: PageDb, portal: PortalDep
) -> Response:
    """The contract's disputes, open and decided, newest first: each with its failure, how
    long an open one has waited against the operator's response target, and the
    decision with its note once taken."""
    contract = services.contract_for(db, user, contract_id)
    rows = billing_bridge.disputes_of_contract(db, contract_id)
    failures = services.failure_summaries(db, [d["failure_event_id"] for d in rows])
    return page(
        request,
        "contract_disputes.html",
        {
            "contract": contract,
            "disputes": rows,
            "failures": failures,
            "now": portal.now(),
            "target_days": portal.settings.dispute_response_days,
            "tz": contract.timezone,
            "section": "contract-disputes",
        },
    )


@router.post("/contracts/{contract_id}/failures/{event_id}/disputes")
def open_dispute(
    contract_id: str,
    event_id: str,
    user: UserDep,
    portal: PortalDep,
    _csrf: CsrfDep,
    reason: Annotated[str, Form(max_length=4000)] = "",
) -> Response:
    """Open a dispute of a failure, recorded in the contract's ledger.

    Only the contract's customer may (staff decide disputes; nobody decides their own),
    and a failure has at most one open dispute at a time (409 for a second).
    """
    if user.role != "customer":
        raise Forbidden("Only the contract's customer opens disputes.")
    with portal.db.read(user) as db:
        detail = services.failure_detail(
            db, user, portal.cache.views, contract_id, event_id, portal.now()
        )
        fid = str(detail.failure.event_id)
    if not reason.strip():
        raise Invalid("Say why you dispute this failure (the reason is recorded).")
    with portal.db.write() as db:
        billing_bridge.open_dispute(
            db,
            contract_id=contract_id,
            failure_event_id=fid,
            reason=reason.strip(),
            opened_by=user.name,
            now=portal.now(),
        )
    return RedirectResponse(
        f"/contracts/{contract_id}/failures/{fid}?disputed=1#disputes",
        status_code=303,
    )
