"""The SLA desk (operators): contracts at risk first, the disputes queue, year close."""

from __future__ import annotations

import logging
from typing import Annotated, Any

from fastapi import APIRouter, Form, Query, Request
from fastapi.responses import RedirectResponse, Response

from web import billing_bridge, services
from web.deps import CsrfDep, OperatorDep, PageDb, PortalDep
from web.errors import Invalid
from web.render import page
from web.views import elapsed_share, projected_margin, urgency, year_verdict

router = APIRouter(include_in_schema=False)
log = logging.getLogger("yoco.web")


@router.get("/operator")
def overview(request: Request, user: OperatorDep, db: PageDb, portal: PortalDep) -> Response:
    """Every contract's current year, those below their threshold first (lowest margin first)."""
    now = portal.now()
    items: list[dict[str, Any]] = []
    for c in services.visible_contracts(db, user):
        view = services.year_view(db, user, portal.cache.views, c.contract_id, None, now)
        at_risk, margin = projected_margin(view)
        items.append(
            {
                "contract": c,
                "view": view,
                "verdict": year_verdict(view),
                "at_risk": at_risk,
                "margin": margin,
                "elapsed": elapsed_share(view),
            }
        )
    items.sort(key=lambda i: (*urgency(i["view"]), i["contract"].contract_id))
    return page(
        request,
        "operator.html",
        {
            "items": items,
            "open_disputes": len(billing_bridge.dispute_queue(db)),
            "waiting": [
                r for r in ended_years(db, user, now)
                if r["close"] is None or r["close"]["needs_adjustment"]
            ],
            "section": "operator",
        },
    )


@router.post("/operator/checkpoints")
def sign_checkpoints(user: OperatorDep, portal: PortalDep, _csrf: CsrfDep) -> Response:
    """Sign a new tree head for every log that grew (so new entries become provable)."""
    from ledger.checkpoints import sign_every_log

    with portal.db.write() as db:
        run = sign_every_log(db, portal.host.signer, portal.host.settings.log_origin)
    signed = sum(1 for h in run.heads if h.created)
    for exc in run.refused:  # the others are signed; this one waits for `yoco ledger verify`
        log.error("checkpoint not signed: %s", exc)
    return RedirectResponse(f"/operator?signed={signed}&refused={len(run.refused)}",
                            status_code=303)


@router.get("/operator/disputes")
def disputes(request: Request, user: OperatorDep, db: PageDb) -> Response:
    """Open disputes, oldest first, and the latest decided ones; after a decision, which
    dispute was just decided and how (``?decided=ID``)."""
    decided = [d for d in billing_bridge.dispute_queue(db, None) if d["status"] != "open"]
    just = request.query_params.get("decided")
    just_decided = next((d for d in decided if d["dispute_id"] == just), None)
    queue = billing_bridge.dispute_queue(db)
    failures = services.failure_summaries(db, [x["failure_event_id"] for x in queue])
    timezones = {c.contract_id: c.timezone for c in services.visible_contracts(db, user)}
    return page(
        request,
        "disputes.html",
        {
            "queue": queue,
            "failures": failures,
            "timezones": timezones,
            "decided": list(reversed(decided))[:50],
            "just_decided": just_decided,
            "classes": services.CLASSES,
            "section": "disputes",
        },
    )


@router.post("/operator/disputes/{dispute_id}")
def decide(
    dispute_id: str,
    user: OperatorDep,
    portal: PortalDep,
    _csrf: CsrfDep,
    decision: Annotated[str, Form(max_length=20)] = "",
    note: Annotated[str, Form(max_length=4000)] = "",
    failure_class: Annotated[str, Form(max_length=40)] = "",
    cause: Annotated[str, Form(max_length=64)] = "",
) -> Response:
    """Decide a dispute: exclude the failure, reclassify it, or reject the dispute."""
    if decision not in ("exclusion", "reclassification", "reject"):
        raise Invalid("Choose to exclude the failure, reclassify it, or reject the dispute.")
    if not note.strip():
        raise Invalid("Write a note: it is recorded with the decision.")
    with portal.db.read(user) as db:
        known = {d["dispute_id"] for d in billing_bridge.dispute_queue(db)}
    if dispute_id not in known:
        raise services.NotFound()
    with portal.db.write() as db:
        billing_bridge.decide_dispute(
            db,
            dispute_id=dispute_id,
            decision=decision,
            note=note.strip(),
            by=user.name,
            now=portal.now(),
            failure_class=failure_class,
            cause=cause,
        )
    # the queue says what was just recorded (the decided dispute is looked up there)
    return RedirectResponse(f"/operator/disputes?decided={dispute_id}", status_code=303)


def ended_years(db: Any, user: Any, now: Any) -> list[dict[str, Any]]:
    """Contract years that have ended by ``now``: waiting to be closed first, then closed."""
    from billing.years import contract_year_bounds

    rows = []
    for c in services.visible_contracts(db, user):
        closes = billing_bridge.year_closes(db, c.contract_id)
        for k in range(1, c.term_years + 1):
            start, end = contract_year_bounds(c.start_date, c.timezone, k)
            if end > now:
                break
            rows.append({"contract": c, "year": k, "start": start, "end": end,
                         "close": closes.get(k)})
    rows.sort(key=lambda r: (r["close"] is not None, r["end"]))
    return rows


@router.get("/operator/years")
def years(request: Request, user: OperatorDep, db: PageDb, portal: PortalDep) -> Response:
    """Contract years that have ended: closed (with their verdict) or waiting to be closed."""
    return page(
        request,
        "years.html",
        {"rows": ended_years(db, user, portal.now()), "section": "years"},
    )


@router.get("/operator/years/confirm")
def confirm_close(
    request: Request,
    user: OperatorDep,
    db: PageDb,
    portal: PortalDep,
    contract_id: Annotated[str, Query(max_length=200)] = "",
    year: Annotated[int, Query(ge=1, le=100)] = 1,
) -> Response:
    """What closing a year will record (its verdict, and the credit if it was missed),
    with the button that does it: a credit is never issued by a single click."""
    from billing.money import credit_minor_units, format_money

    now = portal.now()
    view = services.year_view(db, user, portal.cache.views, contract_id, year, now)
    if view.end > now:
        raise Invalid(f"Contract year {year} of {contract_id} has not ended yet.")
    v = year_verdict(view)
    c = view.contract
    credit = None
    if not v.guarantee_met:
        credit = format_money(
            credit_minor_units(c.credit_base, view.terms.credit_percent, c.currency),
            c.currency, minor=True,
        )
    return page(
        request,
        "year_close.html",
        {
            "view": view,
            "verdict": v,
            "credit": credit,
            "credit_base": format_money(c.credit_base, c.currency),
            "close": view.closed,
            "section": "years",
        },
    )


@router.post("/operator/years/close")
def close_year(
    user: OperatorDep,
    portal: PortalDep,
    _csrf: CsrfDep,
    contract_id: Annotated[str, Form(max_length=200)] = "",
    year: Annotated[int, Form(ge=1, le=100)] = 1,
) -> Response:
    """Close a contract year: record the verdict and issue the credit when it was missed."""
    with portal.db.read(user) as db:
        services.contract_for(db, user, contract_id)
    with portal.db.write() as db:
        billing_bridge.close_year(
            db, contract_id=contract_id, year=year, host=portal.host, now=portal.now()
        )
    return RedirectResponse("/operator/years", status_code=303)
