"""Contracts and the dashboard of a contract year (pages)."""

from __future__ import annotations

from fractions import Fraction
from typing import Annotated, Any

from fastapi import APIRouter, Query, Request
from fastapi.responses import RedirectResponse, Response
from starlette.concurrency import run_in_threadpool

from billing.money import format_money
from web import services
from web.accounts import Principal
from web.cache import scope_key, view_stamp
from web.deps import PageDb, PortalDep, UserDep, caller
from web.forecast import view_forecast
from web.portal import Portal
from web.render import fragment, page
from web.views import elapsed_share, projected_margin, year_verdict

router = APIRouter(include_in_schema=False)


@router.get("/")
def home(request: Request, portal: PortalDep) -> Response:
    """Where a visitor starts: login, the operator overview, or their contracts."""
    who = caller(request, portal)
    if who is None or who.kind != "user":
        return RedirectResponse("/login", status_code=303)
    if who.role == "operator":
        return RedirectResponse("/operator", status_code=303)
    if who.role == "finance":
        return RedirectResponse("/finance", status_code=303)
    return RedirectResponse("/contracts", status_code=303)


@router.get("/contracts")
def contract_list(request: Request, user: UserDep, db: PageDb, portal: PortalDep) -> Response:
    """The caller's contracts with their current year at a glance (one contract: its page)."""
    rows = services.visible_contracts(db, user)
    if len(rows) == 1 and not user.is_staff:
        return RedirectResponse(f"/contracts/{rows[0].contract_id}", status_code=303)
    now = portal.now()
    items = []
    for c in rows:
        view = services.year_view(db, user, portal.cache.views, c.contract_id, None, now)
        at_risk, _margin = projected_margin(view)
        items.append(
            {"contract": c, "view": view, "verdict": year_verdict(view), "at_risk": at_risk}
        )
    return page(request, "contracts.html", {"items": items})


@router.get("/contracts/{contract_id}")
async def dashboard(
    request: Request,
    contract_id: str,
    user: UserDep,
    portal: PortalDep,
    year: Annotated[int | None, Query(ge=1, le=100)] = None,
) -> Response:
    """A contract year at a glance: rate against threshold, counts, goodput, credit, chart."""
    # One hop to the thread pool for the whole request (database, cache, rendering).
    # (Answering cached pages in the event loop instead gave more pages per second but a
    # worse tail: a render there holds up every connection of the worker; measured.)
    return await run_in_threadpool(_dashboard, request, contract_id, user, portal, year)


def _dashboard(
    request: Request, contract_id: str, user: Principal, portal: Portal, year: int | None
) -> Response:
    # the scoped visibility check (one round trip), then the cached view
    view = services.year_view_for(portal, user, contract_id, year, portal.now())
    contract = view.contract

    def render() -> Any:
        lost_cost = None
        if contract.gpu_hour_price is not None:
            lost_cost = format_money(
                Fraction(view.figures.lost_gpu_seconds) * Fraction(contract.gpu_hour_price)
                / 3600,
                contract.currency,
            )
        return fragment(
            request,
            "dashboard_body.html",
            {
                "view": view,
                "contract": contract,
                "f": view.figures,
                "verdict": year_verdict(view),
                "forecast": view_forecast(portal, user, view),
                "credit": view.credit,
                "closed": view.closed,
                "years": list(range(1, contract.term_years + 1)),
                "elapsed": elapsed_share(view),
                "lost_cost": lost_cost,
                "tz": contract.timezone,
            },
        )

    body = portal.cache.pages.get_or_make(("dashboard", scope_key(user), *view_stamp(view)), render)
    return _dashboard_page(request, view, body)


def _dashboard_page(request: Request, view: Any, body: Any) -> Response:
    """The dashboard: the caller's header around the cached ``body`` of ``view``."""
    return page(
        request,
        "dashboard.html",
        {"body": body, "view": view, "contract": view.contract, "section": "dashboard"},
    )
