"""Monthly SLA reports of a contract (pages): the list, and each month as HTML or PDF."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Request
from fastapi.responses import HTMLResponse, Response
from sqlalchemy.orm import Session

from ledger.errors import InvariantBroken
from reports.monthly import MonthlyReport, PreparedReport
from web import services
from web.accounts import Principal
from web.deps import PageDb, PortalDep, UserDep
from web.errors import NotFound
from web.render import attachment, page

router = APIRouter(include_in_schema=False)

#: The report's own HTML carries its styles and fonts inline.
REPORT_CSP = (
    "default-src 'none'; style-src 'unsafe-inline'; img-src data:; font-src data:; "
    "frame-ancestors 'none'"
)


@router.get("/contracts/{contract_id}/reports")
def report_list(
    request: Request,
    contract_id: str,
    user: UserDep,
    db: PageDb,
    portal: PortalDep,
    year: Annotated[int | None, Query(ge=1, le=100)] = None,
) -> Response:
    """The months of a contract year that have a report, with HTML and PDF links."""
    view = services.year_view(db, user, portal.views, contract_id, year, portal.now())
    return page(
        request,
        "reports.html",
        {
            "view": view,
            "contract": view.contract,
            "months": services.months_so_far(view),
            "years": list(range(1, view.contract.term_years + 1)),
            "section": "reports",
        },
    )


def _report(
    db: Session, user: Principal, contract_id: str, month: str, html_only: bool
) -> PreparedReport:
    from reports import monthly

    services.contract_for(db, user, contract_id)
    ym = services.parse_month(month)
    if ym is None:
        raise NotFound()
    if html_only:
        return monthly.prepare_monthly_report(db, contract_id, ym[0], ym[1])
    return monthly.build_monthly_report(db, contract_id, ym[0], ym[1])


@router.get("/contracts/{contract_id}/reports/{month}.html")
def report_html(contract_id: str, month: str, user: UserDep, db: PageDb) -> Response:
    """The monthly report as HTML (over the latest signed checkpoint)."""
    report = _report(db, user, contract_id, month, html_only=True)
    return HTMLResponse(
        report.html, headers={"Content-Security-Policy": REPORT_CSP}
    )


@router.get("/contracts/{contract_id}/reports/{month}.pdf")
def report_pdf(contract_id: str, month: str, user: UserDep, db: PageDb) -> Response:
    """The monthly report as PDF (download)."""
    report = _report(db, user, contract_id, month, html_only=False)
    if not isinstance(report, MonthlyReport):
        raise InvariantBroken("a PDF was asked for, an HTML-only report came back")
    return Response(
        report.pdf,
        media_type="application/pdf",
        headers=attachment(f"sla-{contract_id}-{month}.pdf"),
    )
