"""The customer's whole log up to a signed checkpoint (C2SP tlog-tiles), for ``yoco-verify``.

``GET /contracts/{id}/log.tar.gz`` (portal) and ``GET /api/v1/contracts/{id}/log.tar.gz``
(API) return the export of :mod:`ledger.export` as a gzip'd tar: ``checkpoint``,
``tile/entries/…`` and ``tile/<L>/…``.  Tenant-scoped like every route: the contract must
be visible to the caller (another customer's contract is a 404, as a missing one).
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Request
from fastapi.responses import Response
from sqlalchemy.orm import Session

from ledger.errors import LedgerError
from web import services
from web.accounts import Principal
from web.cache import scope_key
from web.conditional import client_has, conditional_headers, not_modified
from web.deps import PageDb, PortalDep, ReaderDep, UserDep
from web.errors import Invalid, NotFound
from web.render import attachment
from web.schemas import ERRORS

router = APIRouter(tags=["proofs"], responses=ERRORS)

_CheckpointQ = Annotated[
    int | None,
    Query(ge=1, le=2**53, description="Tree size of the signed checkpoint (default: latest)."),
]


def _download(
    db: Session, principal: Principal, contract_id: str, checkpoint: int | None
) -> Response:
    from ledger.export import export_tar

    services.contract_for(db, principal, contract_id)
    try:
        info, data = export_tar(db, contract_id, checkpoint)
    except LedgerError as exc:
        raise Invalid(str(exc)) from None
    name = f"{contract_id}-log-{info.tree_size}.tar.gz"
    return Response(
        data,
        media_type="application/gzip",
        headers={
            **attachment(name),
            "X-Yoco-Tree-Size": str(info.tree_size),
        },
    )


@router.get(
    "/api/v1/contracts/{contract_id}/log.tar.gz",
    response_class=Response,
    responses={
        200: {"content": {"application/gzip": {}}, "description": "The log's tiles."},
        304: {"description": "Not modified: the tag in If-None-Match is still current."},
    },
)
def api_log_export(
    request: Request,
    contract_id: str,
    reader: ReaderDep,
    portal: PortalDep,
    checkpoint: _CheckpointQ = None,
) -> Response:
    """The contract's log up to a signed checkpoint in the C2SP tlog-tiles layout (tar.gz).

    The same checkpoint gives the same bytes; the tag names the checkpoint (the latest
    one when none is asked for).
    """
    state = portal.db.visible_state(reader, contract_id)
    if state is None:
        raise NotFound()
    # The export's checkpoint note carries the cosignatures stored for it: tagged by them.
    etag = portal.etag("api-log", scope_key(reader), contract_id, checkpoint or state.signed,
                       state.cosigned)
    if client_has(request, etag):
        return not_modified(etag)
    with portal.db.read(reader, snapshot=True) as db:
        response = _download(db, reader, contract_id, checkpoint)
    if checkpoint is None and response.headers["X-Yoco-Tree-Size"] != str(state.signed):
        etag = portal.etag("api-log", scope_key(reader), contract_id,
                           int(response.headers["X-Yoco-Tree-Size"]), state.cosigned)
    response.headers.update(conditional_headers(etag))
    return response


@router.get("/contracts/{contract_id}/log.tar.gz", include_in_schema=False)
def portal_log_export(
    contract_id: str, user: UserDep, db: PageDb, checkpoint: _CheckpointQ = None
) -> Response:
    """Portal download of the same export (logged-in users)."""
    return _download(db, user, contract_id, checkpoint)
