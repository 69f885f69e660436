"""``/api/v1/contracts/{id}/reports``: the issued monthly reports and their exact bytes.

A report is listed once it is issued (:mod:`reports.issued`), with its checkpoint, its
``report`` ledger entry and the links to its bytes and the entry's inclusion proof.  A
download is the stored bytes, whose SHA-256 is the entry's (``Repr-Digest``); a month
not issued is a 404 (the portal's pages show drafts; the API serves only issued
documents, so nothing it sends can be taken for one that is not).
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Request
from fastapi.encoders import jsonable_encoder
from fastapi.responses import JSONResponse, Response
from starlette.concurrency import run_in_threadpool

from reports import issued as ri
from reports.documents import document_of
from reports.models import MONTHLY, STATEMENT
from web import services
from web.accounts import Principal
from web.cache import scope_key
from web.conditional import client_has, conditional_headers, json_answer, not_modified
from web.db import LogState
from web.deps import PortalDep, ReaderDep
from web.errors import NotFound
from web.portal import Portal
from web.render import attachment
from web.replay import body_kept, declare
from web.routers.reports import download_name, evidence_download, issued_headers
from web.schemas import CONDITIONAL, IssuedReportOut

router = APIRouter(prefix="/api/v1", tags=["reports"], responses=CONDITIONAL)

MEDIA = {"html": "text/html; charset=utf-8", "pdf": "application/pdf"}


def _state(portal: Portal, reader: Principal, contract_id: str) -> LogState:
    state = portal.db.visible_state(reader, contract_id)
    if state is None:
        raise NotFound()
    return state


def issued_out(doc: ri.IssuedReport) -> IssuedReportOut:
    """The API's view of an issued report (one home for its fields and links)."""
    base = f"/api/v1/contracts/{doc.contract_id}"
    return IssuedReportOut(
        contract_id=doc.contract_id,
        report=doc.document,
        period=doc.period,
        month=doc.period if doc.document == MONTHLY else None,
        year=int(doc.period.removeprefix("year-")) if doc.document == STATEMENT else None,
        checkpoint_tree_size=doc.checkpoint_size,
        checkpoint_root_hash=doc.checkpoint_root,
        event_id=str(doc.event_id),
        seq=doc.seq,
        html_sha256=doc.html_sha256,
        pdf_sha256=doc.pdf_sha256,
        issued_at=doc.issued_at,
        html=f"{base}/reports/{doc.period}.html",
        pdf=f"{base}/reports/{doc.period}.pdf",
        proof=f"{base}/entries/{doc.event_id}/proof",
        evidence=f"{base}/reports/{doc.period}/evidence.zip",
    )


@router.get("/contracts/{contract_id}/reports", response_model=list[IssuedReportOut])
async def list_reports(
    request: Request, contract_id: str, reader: ReaderDep, portal: PortalDep
) -> Response:
    """The contract's issued monthly reports (by month), then its year-end statements."""
    return await run_in_threadpool(_list_reports, request, contract_id, reader, portal)


def _list_reports(
    request: Request, contract_id: str, reader: Principal, portal: Portal
) -> Response:
    state = _state(portal, reader, contract_id)
    # Issuing appends the report entry: the log's size names the list.
    etag = portal.etag("api-reports", scope_key(reader), contract_id, state.size)
    declare(request, reader, state, None)
    if client_has(request, etag):
        return not_modified(etag)

    def render() -> bytes:
        with portal.db.read(reader) as db:
            services.contract_for(db, reader, contract_id)
            docs = ri.list_issued(db, contract_id, None)
        return bytes(JSONResponse(jsonable_encoder([issued_out(d) for d in docs])).body)

    return json_answer(request, etag,
                       body_kept(request, portal.cache.pages, ("api-body", etag), render))


@router.get(
    "/contracts/{contract_id}/reports/{month}.{fmt}",
    response_class=Response,
    responses={200: {"content": {"text/html": {}, "application/pdf": {}},
                     "description": "The issued bytes; Repr-Digest is their SHA-256."}},
)
async def get_report(
    request: Request,
    contract_id: str,
    month: Annotated[str, Path(description="YYYY-MM, or year-K for a year-end statement")],
    fmt: Annotated[str, Path(description="html or pdf")],
    reader: ReaderDep,
    portal: PortalDep,
) -> Response:
    """The issued report's (or year-end statement's) exact bytes, HTML or PDF; 404 when
    it is not issued."""
    return await run_in_threadpool(
        _get_report, request, contract_id, month, fmt, reader, portal
    )


def _get_report(
    request: Request,
    contract_id: str,
    month: str,
    fmt: str,
    reader: Principal,
    portal: Portal,
) -> Response:
    state = _state(portal, reader, contract_id)
    document = document_of(month)
    if fmt not in MEDIA or document is None:
        raise NotFound()
    with portal.db.read(reader) as db:
        services.contract_for(db, reader, contract_id)
        meta = ri.issued_document(db, contract_id, month, document, with_bytes=False)
        if meta is None:
            raise NotFound(f"{month} of this contract has not been issued (yet).")
        digest = meta.html_sha256 if fmt == "html" else meta.pdf_sha256
        # An issued document never changes: its digest names the answer.
        etag = portal.etag("api-report", scope_key(reader), contract_id, month, fmt, digest)
        declare(request, reader, state, None)
        if client_has(request, etag):
            return not_modified(etag)
        doc = ri.issued_document(db, contract_id, month, document)
    if doc is None:  # pragma: no cover - issued documents are never deleted
        raise NotFound()
    body = doc.html_bytes if fmt == "html" else doc.pdf
    headers = conditional_headers(etag) | issued_headers(doc, body)
    if fmt == "pdf":
        name = download_name(contract_id, month, "pdf", draft=False)
        headers.update(attachment(name))
    return Response(body, media_type=MEDIA[fmt], headers=headers)


@router.get(
    "/contracts/{contract_id}/reports/{month}/evidence.zip",
    response_class=Response,
    responses={200: {"content": {"application/zip": {}},
                     "description": "The evidence pack: README.txt says how to check it."},
               404: {"description": "No such contract for you, or the month (or the "
                     "year-end statement) is not issued."},
               409: {"description": "No signed checkpoint holds the report's entry yet."}},
)
def get_evidence(
    request: Request,
    contract_id: str,
    month: Annotated[str, Path(description="YYYY-MM: an issued month, or year-K: an "
                                           "issued year-end statement")],
    reader: ReaderDep,
    portal: PortalDep,
) -> Response:
    """An issued month's (or year-end statement's) evidence pack (ZIP): the document's
    exact bytes, their digests, its ``report`` entry and inclusion proof, the checkpoint
    it was issued over (with its cosignatures), the contract's log archive up to a
    checkpoint holding the entry (what ``yoco-verify`` reads), and a README giving the
    ``yoco-verify`` command.  The tag names the pack's bytes (its log checkpoint moves on
    as the log is signed)."""
    _state(portal, reader, contract_id)
    response = evidence_download(portal, reader, contract_id, month)
    etag = portal.etag("api-evidence", scope_key(reader), contract_id, month,
                       response.headers["Repr-Digest"])
    if client_has(request, etag):
        return not_modified(etag)
    response.headers.update(conditional_headers(etag))
    return response
