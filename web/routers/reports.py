"""Monthly SLA reports of a contract (pages): the list, each month's issued report as
stored (HTML or PDF), and drafts over the latest checkpoint, marked as drafts.

``/contracts/{id}/reports/{YYYY-MM}.html`` / ``.pdf`` serve the issued document's exact
bytes (their SHA-256 is the ``report`` ledger entry's); a month not issued yet is sent
to its draft (``?draft=1``), which is rendered over the latest signed checkpoint and
says on every page that it is a draft and not the issued report.  ``year-K`` in place
of the month serves contract year K's issued year-end statement (no drafts of those).
``/contracts/{id}/reports/{YYYY-MM}/evidence.zip`` is an issued month's evidence pack,
``…/reports/year-K/evidence.zip`` an issued year-end statement's (:mod:`reports.evidence`;
the API serves the same, :func:`evidence_download`).
"""

from __future__ import annotations

import base64
import hashlib
from typing import Annotated

from fastapi import APIRouter, Query, Request
from fastapi.responses import RedirectResponse, Response
from sqlalchemy.orm import Session

from billing.witness_policy import WitnessStatus, checkpoint_statuses
from ledger.checkpoints import at_sizes, latest
from reports import issued as ri
from reports.documents import document_of
from reports.errors import NotIssued
from reports.evidence import EvidenceNotReady, build_evidence_pack
from reports.models import STATEMENT
from reports.monthly import PreparedReport, finish_report
from web import services
from web.accounts import Principal
from web.deps import PageDb, PortalDep, UserDep
from web.errors import Conflict, NotFound
from web.portal import Portal
from web.render import attachment, page

router = APIRouter(include_in_schema=False)

#: The report's own HTML carries its styles and fonts inline.
REPORT_CSP = (
    "default-src 'none'; style-src 'unsafe-inline'; img-src data:; font-src data:; "
    "frame-ancestors 'none'"
)
#: Says what a report download is: ``issued`` (the stored bytes) or ``draft``.
STATUS_HEADER = "X-Yoco-Report"


def repr_digest(data: bytes) -> str:
    """The ``Repr-Digest`` header value (RFC 9530) of ``data``: its SHA-256."""
    return "sha-256=:" + base64.b64encode(hashlib.sha256(data).digest()).decode() + ":"


def issued_headers(doc: ri.IssuedReport, body: bytes) -> dict[str, str]:
    """Headers of an issued document's download: what it is, its entry and checkpoint,
    and its digest (the entry's)."""
    return {
        STATUS_HEADER: (
            f"issued; checkpoint={doc.checkpoint_size}; entry={doc.seq}; "
            f"event-id={doc.event_id}"
        ),
        "Repr-Digest": repr_digest(body),
    }


def download_name(contract_id: str, period: str, ext: str, draft: bool) -> str:
    """The file name of a report (``YYYY-MM``) or statement (``year-K``) download (a
    draft's says so), with the contract id as it is: :func:`web.render.attachment` gives
    it exactly in ``filename*`` and a safe ASCII form for older clients."""
    if document_of(period) == STATEMENT:
        return f"yoco-statement-{contract_id}-{period}.{ext}"
    return f"yoco-sla-{contract_id}-{period}{'-draft' if draft else ''}.{ext}"


@router.get("/contracts/{contract_id}/reports")
def report_list(
    request: Request,
    contract_id: str,
    user: UserDep,
    db: PageDb,
    portal: PortalDep,
    year: Annotated[int | None, Query(ge=1, le=100)] = None,
) -> Response:
    """The months of a contract year: each issued report with its checkpoint, ledger
    entry, proof and digests; months not issued yet with a draft."""
    view = services.year_view(db, user, portal.cache.views, contract_id, year, portal.now())
    issued = {d.period: d for d in ri.list_issued(db, contract_id)}
    statements = ri.list_issued(db, contract_id, STATEMENT)
    witness, draft_witness = _witness_statuses(
        db, contract_id, {d.checkpoint_size for d in [*issued.values(), *statements]})
    return page(
        request,
        "reports.html",
        {
            "view": view,
            "contract": view.contract,
            "months": services.months_so_far(view),
            "issued": issued,
            "statements": statements,
            "witness": witness,
            "draft_witness": draft_witness,
            "years": list(range(1, view.contract.term_years + 1)),
            "section": "reports",
        },
    )


def _witness_statuses(
    db: Session, contract_id: str, sizes: set[int]
) -> tuple[dict[int, WitnessStatus], WitnessStatus | None]:
    """The witness status of the checkpoints of ``sizes`` (the issued documents') and of
    the latest checkpoint (the drafts'); empty and None when the contract names no
    witness policy at any of them."""
    head = latest(db, contract_id)
    if head is not None:
        sizes = sizes | {head.tree_size}
    cps = at_sizes(db, contract_id, sizes)
    statuses = {st.tree_size: st for st in checkpoint_statuses(db, contract_id, cps)}
    if not any(st.policy is not None for st in statuses.values()):
        return {}, None
    return statuses, statuses.get(head.tree_size) if head is not None else None


def _month(db: Session, user: Principal, contract_id: str, month: str) -> tuple[int, int]:
    services.contract_for(db, user, contract_id)
    ym = services.parse_month(month)
    if ym is None:
        raise NotFound()
    return ym


def _statement(
    db: Session, user: Principal, contract_id: str, period: str, draft: bool
) -> ri.IssuedReport | None:
    """The issued statement ``period`` (``year-K``) names; None when it names a month;
    404 for a statement not issued (there are no drafts of statements)."""
    if document_of(period) != STATEMENT:
        return None
    services.contract_for(db, user, contract_id)
    doc = None if draft else ri.issued_document(db, contract_id, period, STATEMENT)
    if doc is None:
        raise NotFound()
    return doc


def _draft(db: Session, contract_id: str, ym: tuple[int, int]) -> PreparedReport:
    return ri.render_draft(db, contract_id, ym[0], ym[1], with_pdf=False)


def _draft_headers(report: PreparedReport) -> dict[str, str]:
    return {STATUS_HEADER: f"draft; checkpoint={report.checkpoint_size}"}


@router.get("/contracts/{contract_id}/reports/{month}.html")
def report_html(
    contract_id: str,
    month: str,
    user: UserDep,
    db: PageDb,
    draft: Annotated[bool, Query(description="A draft over the latest checkpoint.")] = False,
) -> Response:
    """The issued report as stored (HTML); ``?draft=1``: a draft over the latest
    checkpoint.  A month not issued yet redirects to its draft."""
    headers = {"Content-Security-Policy": REPORT_CSP}
    statement = _statement(db, user, contract_id, month, draft)
    if statement is not None:
        return Response(statement.html_bytes, media_type="text/html; charset=utf-8",
                        headers=headers | issued_headers(statement, statement.html_bytes))
    ym = _month(db, user, contract_id, month)
    if not draft:
        doc = ri.issued_document(db, contract_id, month)
        if doc is None:
            return RedirectResponse(f"{month}.html?draft=1", status_code=303)
        return Response(doc.html_bytes, media_type="text/html; charset=utf-8",
                        headers=headers | issued_headers(doc, doc.html_bytes))
    report = _draft(db, contract_id, ym)
    return Response(report.html.encode("utf-8"), media_type="text/html; charset=utf-8",
                    headers=headers | _draft_headers(report))


@router.get("/contracts/{contract_id}/reports/{month}.pdf")
def report_pdf(
    contract_id: str,
    month: str,
    user: UserDep,
    db: PageDb,
    draft: Annotated[bool, Query(description="A draft over the latest checkpoint.")] = False,
) -> Response:
    """The issued report as stored (PDF download); ``?draft=1``: a draft over the latest
    checkpoint.  A month not issued yet redirects to its draft."""
    statement = _statement(db, user, contract_id, month, draft)
    if statement is not None:
        name = download_name(contract_id, month, "pdf", draft=False)
        return Response(statement.pdf, media_type="application/pdf", headers={
            **attachment(name),
            **issued_headers(statement, statement.pdf),
        })
    ym = _month(db, user, contract_id, month)
    if not draft:
        doc = ri.issued_document(db, contract_id, month)
        if doc is None:
            return RedirectResponse(f"{month}.pdf?draft=1", status_code=303)
        name = download_name(contract_id, month, "pdf", draft=False)
        return Response(doc.pdf, media_type="application/pdf", headers={
            **attachment(name),
            **issued_headers(doc, doc.pdf),
        })
    report = finish_report(_draft(db, contract_id, ym))
    name = download_name(contract_id, month, "pdf", draft=True)
    return Response(report.pdf, media_type="application/pdf", headers={
        **attachment(name), **_draft_headers(report),
    })


def evidence_download(
    portal: Portal, principal: Principal, contract_id: str, period: str
) -> Response:
    """The evidence pack of ``contract_id``'s issued document for ``period`` -- a month's
    report (``YYYY-MM``) or a year-end statement (``year-K``) -- as a ZIP download, for
    the portal and the API alike: 404 for a contract the caller may not see (as a
    missing one), a period that is neither, or a document not issued (saying so); 409
    while no signed checkpoint (meeting the contract's witness policy) holds its entry."""
    document = document_of(period)
    if document is None:
        raise NotFound()
    with portal.db.read(principal, snapshot=True) as db:
        services.contract_for(db, principal, contract_id)
        try:
            pack = build_evidence_pack(db, contract_id, period)
        except NotIssued:
            if document == STATEMENT:
                raise NotFound(
                    f"The statement of contract {period.replace('-', ' ')} has not been "
                    "issued (yet): only an issued statement has an evidence pack. A "
                    "statement is issued after the year is closed."
                ) from None
            raise NotFound(
                f"The report of {period} has not been issued (yet): only an issued month "
                "has an evidence pack. A month is issued after it ends."
            ) from None
        except EvidenceNotReady as exc:
            raise Conflict(str(exc)) from None
    return Response(pack.data, media_type="application/zip", headers={
        **attachment(pack.file_name),
        "Repr-Digest": repr_digest(pack.data),
        "X-Yoco-Evidence": (f"issued-checkpoint={pack.issued_checkpoint}; "
                            f"entry={pack.report_seq}; log-checkpoint={pack.log_tree_size}"),
    })


@router.get("/contracts/{contract_id}/reports/{month}/evidence.zip")
def report_evidence(
    contract_id: str, month: str, user: UserDep, portal: PortalDep
) -> Response:
    """The evidence pack (ZIP) of an issued month (``YYYY-MM``) or year-end statement
    (``year-K``): the document as issued, its digests, its ledger entry and proof, the
    checkpoint it was issued over, the log archive and a README saying how to check it
    with yoco-verify."""
    return evidence_download(portal, user, contract_id, month)
