"""The SLA desk's risk view: open contract years by P(ending below the line) or expected credit."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Request
from fastapi.responses import Response

from billing.forecast import open_year_forecasts
from web import services
from web.deps import OperatorDep, PageDb, PortalDep
from web.render import page

router = APIRouter(include_in_schema=False)

ORDERS = {"p_miss": "probability of missing", "expected_credit": "expected credit"}


@router.get("/operator/risk")
def risk_overview(
    request: Request,
    user: OperatorDep,
    db: PageDb,
    portal: PortalDep,
    by: Annotated[str, Query(pattern="^(p_miss|expected_credit)$")] = "p_miss",
) -> Response:
    """Every open contract year with the probability that it ends below its threshold.

    Sorted by that probability or by the expected credit (``?by=expected_credit``);
    docs/risk.md states the model.  The verdict of a year is decided only at its close.
    """
    ids = [c.contract_id for c in services.visible_contracts(db, user)]
    rows = open_year_forecasts(db, now=portal.now(), contract_ids=ids)
    if by == "expected_credit":
        rows.sort(key=lambda f: (-f.expected_credit, -f.p_miss, f.contract_id, f.year))
    return page(
        request,
        "risk.html",
        {"rows": rows, "by": by, "orders": ORDERS, "section": "risk"},
    )
