"""``/api/v1``: signed checkpoints, consistency proofs and the signer's public key."""

from __future__ import annotations

import base64
from typing import Annotated, Any

from fastapi import APIRouter, Query, Request
from fastapi.encoders import jsonable_encoder
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from starlette.concurrency import run_in_threadpool

from ledger.witnessing import cosigned_notes
from web import services
from web.accounts import Principal
from web.cache import scope_key
from web.conditional import (
    client_has,
    conditional_headers,
    json_answer,
    normalised_query,
    not_modified,
)
from web.db import LogState
from web.deps import PortalDep, ReaderDep
from web.errors import NotFound
from web.paging import DEFAULT_LIMIT, PAGED_HEADERS, CursorQ, LimitQ, link_headers
from web.portal import Portal
from web.replay import body_kept, declare
from web.schemas import CONDITIONAL, CheckpointOut, ErrorBody

router = APIRouter(prefix="/api/v1", tags=["proofs"], responses=CONDITIONAL)


def _state(portal: Portal, reader: Principal, contract_id: str) -> LogState:
    state = portal.db.visible_state(reader, contract_id)
    if state is None:
        raise NotFound()
    return state


@router.get(
    "/contracts/{contract_id}/checkpoints",
    response_model=list[CheckpointOut],
    responses={200: {"headers": PAGED_HEADERS}},
)
async def list_checkpoints(
    request: Request,
    contract_id: str,
    reader: ReaderDep,
    portal: PortalDep,
    limit: LimitQ = DEFAULT_LIMIT,
    cursor: CursorQ = None,
) -> Response:
    """The signed tree heads of the contract's log, newest first.

    At most ``limit`` per page; a ``Link: <…>; rel="next"`` header names the next page.
    """
    return await run_in_threadpool(
        _list_checkpoints, request, contract_id, reader, portal, limit, cursor
    )


def _list_checkpoints(
    request: Request,
    contract_id: str,
    reader: Principal,
    portal: Portal,
    limit: int,
    cursor: str | None,
) -> Response:
    state = _state(portal, reader, contract_id)
    below = None
    if cursor is not None:
        below = int(portal.cursors.decode(cursor, "checkpoints", (contract_id,))[0])
    # Checkpoints only ever add larger tree sizes and cosignatures only ever arrive
    # (append-only, ids rising): the largest head and the latest cosignature name the
    # whole list, cosignature lines included.
    etag = portal.etag("api-checkpoints", scope_key(reader), contract_id,
                       normalised_query(request), state.heads)
    declare(request, reader, state, None)  # the heads and their cosignatures name it
    if client_has(request, etag):
        return not_modified(etag)

    def render() -> tuple[bytes, str | None]:
        with portal.db.read(reader) as db:
            heads = services.checkpoints(db, reader, contract_id, below=below,
                                         limit=limit + 1)
            nxt = None
            if len(heads) > limit:
                heads = heads[:limit]
                nxt = portal.cursors.encode("checkpoints", (contract_id,),
                                            [heads[-1].tree_size])
            # The notes with the witnesses' cosignatures (extra signature lines).
            notes = cosigned_notes(db, heads)
            body = [
                CheckpointOut(
                    tree_size=cp.tree_size,
                    root_hash=base64.b64encode(bytes(cp.root_hash)).decode(),
                    origin=cp.origin,
                    signed_at=cp.signed_at,
                    note=text,
                ).model_dump(mode="json")
                for cp, text in zip(heads, notes, strict=True)
            ]
        return bytes(JSONResponse(body).body), nxt

    # Kept under its tag: once a newer head is signed or a cosignature stored, every
    # probe sees it, so the tag (and the key) differ and this body is not served again.
    body, nxt = body_kept(request, portal.cache.pages, ("api-body", etag), render)
    return json_answer(request, etag, body, link_headers(request, nxt))


@router.get(
    "/contracts/{contract_id}/checkpoints/consistency",
    response_model=dict[str, Any],
    responses={422: {"model": ErrorBody, "description": "No signed head of that size."}},
)
async def get_consistency(
    request: Request,
    contract_id: str,
    reader: ReaderDep,
    portal: PortalDep,
    size1: Annotated[int, Query(ge=1, le=2**53)],
    size2: Annotated[int, Query(ge=1, le=2**53)],
) -> Response:
    """A consistency proof (``yoco-consistency-proof/v1``) between two signed heads."""
    return await run_in_threadpool(
        _get_consistency, request, contract_id, reader, portal, size1, size2
    )


def _get_consistency(
    request: Request, contract_id: str, reader: Principal, portal: Portal, size1: int,
    size2: int,
) -> Response:
    state = _state(portal, reader, contract_id)
    # Two signed heads never change, the proof between them neither; their notes gain
    # the witnesses' cosignature lines as they arrive.
    etag = portal.etag("api-consistency", scope_key(reader), contract_id, size1, size2,
                       state.cosigned)
    declare(request, reader, state, None)
    if client_has(request, etag):
        return not_modified(etag)

    def render() -> bytes:
        with portal.db.read(reader) as db:
            bundle = services.consistency(db, reader, contract_id, size1, size2)
        return bytes(JSONResponse(jsonable_encoder(bundle)).body)

    return json_answer(request, etag,
                       body_kept(request, portal.cache.pages, ("api-body", etag), render))


@router.get(
    "/public-key",
    response_class=PlainTextResponse,
    responses={200: {"content": {"text/plain": {"schema": {"type": "string"}}}}},
)
def get_public_key(request: Request, portal: PortalDep) -> Response:
    """The checkpoint signer's verifier key (C2SP note verifier key); public."""
    key = portal.verifier_key
    etag = portal.etag("public-key", key)
    declare(request, None, None, None)  # the same for everyone, always
    if client_has(request, etag):
        return not_modified(etag)
    return Response(key + "\n", media_type="text/plain; charset=utf-8",
                    headers=conditional_headers(etag))
