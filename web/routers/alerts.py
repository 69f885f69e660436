"""The SLA desk's alerts page: destinations (never their secrets), deliveries, events.

Read-only and operators only (everyone else gets 404, as every operator page). The
alerts' tables are not readable by the portal's tenant role, so the page reads them
through the application role once the caller is known to be an operator. Destinations
are configured, and deliveries replayed, with ``yoco alerts`` (docs/alerts.md).
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Request
from fastapi.responses import Response

from alerts.services import deliveries, destination_json, events, list_destinations
from web.deps import OperatorDep, PortalDep
from web.render import page

router = APIRouter(include_in_schema=False)


@router.get("/operator/alerts")
def alerts_page(
    request: Request,
    user: OperatorDep,
    portal: PortalDep,
    status: Annotated[str | None, Query(pattern="^(pending|delivered|failed)$")] = None,
) -> Response:
    """Destinations, the latest 100 deliveries (``?status=failed`` for the failed ones)
    and the latest 50 events."""
    with portal.db.write() as db:
        dests = [destination_json(d) for d in list_destinations(db)]
        log = deliveries(db, status=status, limit=100)
        recent = events(db, all_tenants=True, limit=50)
        failed = len(deliveries(db, status="failed", limit=10_000))
    return page(
        request,
        "alerts.html",
        {"destinations": dests, "deliveries": log, "events": recent, "status": status,
         "failed": failed, "section": "alerts"},
    )
