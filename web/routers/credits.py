"""Credits of a contract (page): the verdict of each year and any renewal credit."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import Response

from web import billing_bridge, services
from web.deps import PageDb, PortalDep, UserDep
from web.render import page

router = APIRouter(include_in_schema=False)


@router.get("/contracts/{contract_id}/credits")
def credit_page(
    request: Request, contract_id: str, user: UserDep, db: PageDb, portal: PortalDep
) -> Response:
    """Every year of the term: closed or not, guarantee met or not, and the credit issued."""
    from billing.yearend import period_text, year_days, year_state, year_state_label
    from billing.years import contract_year_bounds

    contract = services.contract_for(db, user, contract_id)
    closes = billing_bridge.year_closes(db, contract_id)
    credits = billing_bridge.credit_rows(db, [contract_id])
    now = portal.now()
    years = []
    for k in range(1, contract.term_years + 1):
        start, end = contract_year_bounds(contract.start_date, contract.timezone, k)
        close = closes.get(k)
        years.append(
            {
                "year": k,
                # first and last day, both included: the words of the export and the CLI
                "period": period_text(*year_days(contract.start_date, k)),
                "state": year_state_label(year_state(start, end, now, close is not None)),
                "ended": end <= now,
                "close": close,
                "credit": next((c for c in credits if c["year"] == k), None),
            }
        )
    return page(
        request,
        "credits.html",
        {
            "contract": contract,
            "years": years,
            "credits": credits,
            "tz": contract.timezone,
            "section": "credits",
        },
    )
