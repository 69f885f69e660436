"""``/api/v1``: signed checkpoints, consistency proofs and the signer's public key."""

from __future__ import annotations

import base64
from typing import Annotated, Any

from fastapi import APIRouter, Query
from fastapi.responses import PlainTextResponse

from web import services
from web.deps import ApiDb, PortalDep, ReaderDep
from web.schemas import ERRORS, CheckpointOut, ErrorBody

router = APIRouter(prefix="/api/v1", tags=["proofs"], responses=ERRORS)


@router.get("/contracts/{contract_id}/checkpoints", response_model=list[CheckpointOut])
def list_checkpoints(contract_id: str, reader: ReaderDep, db: ApiDb) -> list[CheckpointOut]:
    """Every signed tree head of the contract's log, newest first."""
    return [
        CheckpointOut(
            tree_size=cp.tree_size,
            root_hash=base64.b64encode(bytes(cp.root_hash)).decode(),
            origin=cp.origin,
            signed_at=cp.signed_at,
            note=cp.note,
        )
        for cp in services.checkpoints(db, reader, contract_id)
    ]


@router.get(
    "/contracts/{contract_id}/checkpoints/consistency",
    response_model=dict[str, Any],
    responses={422: {"model": ErrorBody, "description": "No signed head of that size."}},
)
def get_consistency(
    contract_id: str,
    reader: ReaderDep,
    db: ApiDb,
    size1: Annotated[int, Query(ge=1, le=2**53)],
    size2: Annotated[int, Query(ge=1, le=2**53)],
) -> dict[str, Any]:
    """A consistency proof (``yoco-consistency-proof/v1``) between two signed heads."""
    return services.consistency(db, reader, contract_id, size1, size2)


@router.get(
    "/public-key",
    response_class=PlainTextResponse,
    responses={200: {"content": {"text/plain": {"schema": {"type": "string"}}}}},
)
def get_public_key(portal: PortalDep) -> str:
    """The checkpoint signer's verifier key (C2SP note verifier key); public."""
    return portal.verifier_key + "\n"
