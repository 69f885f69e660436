"""``/api/v1/contracts``: the caller's contracts, SLA figures of a year or month, credits."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query
from fastapi.responses import JSONResponse, Response
from starlette.concurrency import run_in_threadpool

from billing.services import current_year, sla_figures
from web import billing_bridge, services
from web.accounts import Principal
from web.deps import ApiDb, PortalDep, ReaderDep
from web.errors import NotFound
from web.pagecache import scope_key, view_stamp
from web.portal import Portal
from web.schemas import ERRORS, ContractOut, SlaOut, YearOut, figures_out, month_out

router = APIRouter(prefix="/api/v1", tags=["contracts"], responses=ERRORS)

MONTH_PATTERN = r"^[0-9]{4}-(0[1-9]|1[0-2])$"


def _contract_out(spec: Any, now: Any) -> ContractOut:
    rec = spec.to_record()
    return ContractOut(
        contract_id=rec["contract_id"],
        customer=rec["customer"],
        start_date=rec["start_date"],
        timezone=rec["timezone"],
        term_years=rec["term_years"],
        currency=rec["currency"],
        annual_value=rec["annual_value"],
        renewal_value=rec["renewal_value"],
        gpu_hour_price=rec["gpu_hour_price"],
        terms=rec["terms"],
        current_year=current_year(spec, now),
    )


@router.get("/contracts", response_model=list[ContractOut])
def list_contracts(reader: ReaderDep, db: ApiDb, portal: PortalDep) -> list[ContractOut]:
    """The caller's contracts (staff: every contract)."""
    now = portal.now()
    return [
        _contract_out(services.contract_for(db, reader, c.contract_id), now)
        for c in services.visible_contracts(db, reader)
    ]


@router.get("/contracts/{contract_id}", response_model=ContractOut)
def get_contract(
    contract_id: str, reader: ReaderDep, db: ApiDb, portal: PortalDep
) -> ContractOut:
    """One contract and its guarantee terms."""
    return _contract_out(services.contract_for(db, reader, contract_id), portal.now())


@router.get("/contracts/{contract_id}/sla", response_model=SlaOut)
def get_sla(
    contract_id: str,
    reader: ReaderDep,
    db: ApiDb,
    portal: PortalDep,
    year: Annotated[int | None, Query(ge=1, le=100, description="Contract year K.")] = None,
    month: Annotated[
        str | None, Query(pattern=MONTH_PATTERN, description="A calendar month, YYYY-MM.")
    ] = None,
) -> SlaOut:
    """The figures of a contract year (default: the current one) or of a month.

    The same object as ``yoco sla CONTRACT --json``.
    """
    services.contract_for(db, reader, contract_id)
    if year is not None and month is not None:
        raise NotFound("Give year or month, not both.")
    ym = services.parse_month(month)
    report = sla_figures(db, contract_id, year=year, month=ym, now=portal.now())
    return SlaOut(**report.to_json())


@router.get("/contracts/{contract_id}/years/{year}", response_model=YearOut)
async def get_year(
    contract_id: str,
    year: int,
    reader: ReaderDep,
    portal: PortalDep,
) -> Response:
    """A contract year's figures and its months (the dashboard's chart, as data)."""
    return await run_in_threadpool(_get_year, contract_id, year, reader, portal)


def _get_year(contract_id: str, year: int, reader: Principal, portal: Portal) -> Response:
    # the scoped visibility check (one round trip), then the cached view
    view = services.year_view_for(portal, reader, contract_id, year, portal.now())

    def render() -> bytes:
        out = YearOut(
            contract_id=contract_id,
            year=view.year,
            figures=figures_out(view.figures),
            months=[month_out(m) for m in view.months],
        )
        return bytes(JSONResponse(out.model_dump(mode="json")).body)

    key = ("api-year", scope_key(reader), *view_stamp(view))
    return Response(portal.pages.get_or_make(key, render), media_type="application/json")


@router.get("/contracts/{contract_id}/credits", response_model=list[dict[str, Any]])
def get_credits(contract_id: str, reader: ReaderDep, db: ApiDb) -> list[dict[str, Any]]:
    """The renewal credits of a contract (amounts as decimal strings in its currency)."""
    services.contract_for(db, reader, contract_id)
    rows = billing_bridge.credit_rows(db, [contract_id])
    for r in rows:
        r["issued_at"] = r["issued_at"].isoformat()
    return rows
