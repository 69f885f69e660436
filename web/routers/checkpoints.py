"""Signed checkpoints of a contract's log and consistency proofs between them (pages)."""

from __future__ import annotations

import json
from typing import Annotated

from fastapi import APIRouter, Query, Request
from fastapi.responses import PlainTextResponse, Response

from billing.witness_policy import checkpoint_statuses, policy_at
from web import services
from web.deps import PageDb, PortalDep, UserDep
from web.render import attachment, page

router = APIRouter(include_in_schema=False)

#: The newest heads whose witness status the page states (each costs an Ed25519 check per
#: cosignature); older ones show none.
WITNESS_STATUS_HEADS = 200


@router.get("/contracts/{contract_id}/checkpoints")
def checkpoint_page(
    request: Request, contract_id: str, user: UserDep, db: PageDb, portal: PortalDep
) -> Response:
    """Every signed tree head of the log, and a form for a consistency proof between two;
    with the contract's witness policy, whether each of the newest heads meets it."""
    contract = services.contract_for(db, user, contract_id)
    heads = services.checkpoints(db, user, contract_id)
    shown = heads[:WITNESS_STATUS_HEADS]
    statuses = dict(zip((h.tree_size for h in shown),
                        checkpoint_statuses(db, contract_id, shown), strict=True))
    policy = policy_at(db, contract_id, heads[0].tree_size) if heads else None
    return page(
        request,
        "checkpoints.html",
        {
            "contract": contract,
            "heads": heads,
            "tz": contract.timezone,
            "verifier_key": portal.verifier_key,
            "witness": statuses if any(st.policy for st in statuses.values()) else None,
            "policy": policy,
            "section": "checkpoints",
        },
    )


@router.get("/contracts/{contract_id}/checkpoints/consistency")
def consistency_download(
    contract_id: str,
    user: UserDep,
    db: PageDb,
    size1: Annotated[int, Query(ge=1)],
    size2: Annotated[int, Query(ge=1)],
) -> Response:
    """Download a consistency proof between the signed heads of sizes ``size1`` and ``size2``."""
    bundle = services.consistency(db, user, contract_id, size1, size2)
    name = f"consistency-{contract_id}-{bundle['size1']}-{bundle['size2']}.json"
    return Response(
        json.dumps(bundle, indent=2, ensure_ascii=False) + "\n",
        media_type="application/json",
        headers=attachment(name),
    )


@router.get("/verify")
def verify_guide(request: Request, user: UserDep, db: PageDb, portal: PortalDep) -> Response:
    """How to check the figures yourself: the signer's key, where to download the log,
    reports and proofs of each of the caller's contracts, and what checks them."""
    return page(
        request,
        "verify.html",
        {"contracts": services.visible_contracts(db, user), "verifier_key": portal.verifier_key},
    )


@router.get("/public-key")
def public_key(portal: PortalDep) -> Response:
    """The checkpoint signer's verifier key (public)."""
    return PlainTextResponse(portal.verifier_key + "\n")
