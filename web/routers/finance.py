"""Finance: credits of every contract, and the finance export in each format."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import Response

from web import billing_bridge
from web.deps import CsrfDep, FinanceDep, PageDb, PortalDep
from web.errors import NotFound
from web.render import attachment, page

router = APIRouter(include_in_schema=False)

FORMATS = {
    "csv": "text/csv; charset=utf-8",
    "xlsx": "application/vnd.openxmlformats-officedocument.spreadsheetml.sheet",
    "json": "application/json",
}


@router.get("/finance")
def finance_page(request: Request, user: FinanceDep, db: PageDb) -> Response:
    """Every credit (issued, applied, void) and links to the export."""
    return page(
        request,
        "finance.html",
        {
            "credits": billing_bridge.credit_rows(db, None),
            "formats": list(FORMATS),
            "section": "finance",
        },
    )


@router.post("/finance/export.{fmt}")
def export(fmt: str, user: FinanceDep, portal: PortalDep, _csrf: CsrfDep) -> Response:
    """The finance export of credits as CSV, XLSX or JSON (download).

    A POST with the form's CSRF token: every export is recorded in finance's log, so a
    GET (a link, a prefetch, a crawler, another site's ``<img>``) must not make one.
    """
    if fmt not in FORMATS:
        raise NotFound()
    with portal.db.write() as db:
        data, name = billing_bridge.export(db, fmt=fmt, now=portal.now())
    return Response(
        data,
        media_type=FORMATS[fmt],
        headers=attachment(name),
    )
