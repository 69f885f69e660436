"""The SLA desk's alerts page: destinations (never their secrets), deliveries, events, and
replays of deliveries.

Operators only (everyone else gets 404, as every operator page). The alerts' tables are
not readable by the portal's tenant role, so the page reads them through the
application role once the caller is known to be an operator. Destinations are
configured with ``yoco alerts`` (docs/alerts.md).

**Replay** (``POST /operator/alerts/replay``, a CSRF-checked form): puts one delivery
(``delivery_id``), or every failed one (``failed=1``), back in the queue and records who
asked (``alert_replays``, ``via = portal``) in the same transaction; then a background
thread of this process sends them, one transaction each, with the deployment's retry
policy and the same body and ``Idempotency-Key`` as before. Should the process stop
first, they stay pending and the next ``yoco alerts run`` (or ``yoco serve``'s scheduler)
sends them.
"""

from __future__ import annotations

import logging
import threading
from typing import Annotated

from fastapi import APIRouter, Form, Query, Request
from fastapi.responses import RedirectResponse, Response

from alerts.config import retry_policy_of
from alerts.errors import UnknownDelivery
from alerts.send import deliver_next
from alerts.services import deliveries, destination_json, events, list_destinations, replays
from alerts.services import queue_replay as _queue_replay
from reports.issued import document_files
from web.deps import CsrfDep, OperatorDep, PortalDep
from web.errors import Invalid, NotFound
from web.portal import Portal
from web.render import page

router = APIRouter(include_in_schema=False)
log = logging.getLogger("yoco.alerts")


@router.get("/operator/alerts")
def alerts_page(
    request: Request,
    user: OperatorDep,
    portal: PortalDep,
    status: Annotated[str | None, Query(pattern="^(pending|delivered|failed)$")] = None,
    replayed: Annotated[int | None, Query(ge=0, le=1_000_000)] = None,
) -> Response:
    """Destinations, the latest 100 deliveries (``?status=failed`` for the failed ones),
    the latest 50 events and the latest 20 replays (who asked, when, from where)."""
    with portal.db.write() as db:
        dests = [destination_json(d) for d in list_destinations(db)]
        log_rows = deliveries(db, status=status, limit=100)
        recent = events(db, all_tenants=True, limit=50)
        failed = len(deliveries(db, status="failed", limit=10_000))
        asked = [
            {"delivery_id": r.delivery_id, "requested_by": r.requested_by, "via": r.via,
             "requested_at": r.requested_at}
            for r in replays(db, limit=20)
        ]
    return page(
        request,
        "alerts.html",
        {"destinations": dests, "deliveries": log_rows, "events": recent, "status": status,
         "failed": failed, "replays": asked, "replayed": replayed, "section": "alerts"},
    )


@router.post("/operator/alerts/replay")
def replay(
    user: OperatorDep,
    portal: PortalDep,
    _csrf: CsrfDep,
    delivery_id: Annotated[int | None, Form(ge=1, le=2**63 - 1)] = None,
    failed: Annotated[bool, Form()] = False,
) -> Response:
    """Send a delivery (or every failed one) again: same body, same Idempotency-Key.

    Audited (``alert_replays``: the operator, ``portal``, the time); the sending happens
    in the background and its attempts appear in the log."""
    if delivery_id is None and not failed:
        raise Invalid("Choose a delivery to replay, or replay every failed delivery.")
    who = f"{user.name} (user #{user.id})"
    try:
        with portal.db.write() as db:
            ids = _queue_replay(db, [delivery_id] if delivery_id else [], failed=failed,
                                requested_by=who, via="portal")
    except UnknownDelivery:
        raise NotFound("No such delivery.") from None
    if ids:
        threading.Thread(target=send_replays, args=(portal, ids), name="yoco-alert-replay",
                         daemon=True).start()
    return RedirectResponse(f"/operator/alerts?replayed={len(ids)}", status_code=303)


def send_replays(portal: Portal, ids: list[int]) -> None:
    """Send the queued deliveries ``ids`` now, one transaction each (a replay's attempts
    are marked as such). Never raises: a failure is logged, and a delivery that could
    not be sent stays pending for the next alerts run."""
    policy = retry_policy_of(portal.host.settings)
    for delivery_id in ids:
        try:
            with portal.db.write() as db:
                done = deliver_next(db, policy=policy, delivery_id=delivery_id, replay=True,
                                    files=document_files)
            if done is not None and done.status == "failed":
                log.warning("replayed delivery %s to %s failed: %s", done.delivery_id,
                            done.destination, done.error)
        except Exception:
            log.exception("replaying delivery %s failed; it stays pending", delivery_id)
