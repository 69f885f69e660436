"""``record_refused``: the ledger refused records that a runtime or an integrator sent.

Raised where the refusal happens — the runtime's ledger sink (its outbox then keeps the
record as a dead letter: ``yoco outbox list``) and ``POST /api/v1/records`` (422) — in a
transaction of its own, since the refused batch itself writes nothing. ``yoco ledger
ingest`` is not alerted: whoever runs it reads the refusal on the terminal (exit 2).

One event per refused batch, keyed by the SHA-256 of the refused records' content (each
record's JSON with sorted keys), so the same refusal is alerted once however often it is
retried: the outbox narrowing a refused batch down to the one bad record, a runtime
re-sending its dead letters, an integrator posting the same bad batch again.

**Flood limit** (:func:`raise_refusal`): many *different* refused batches (an integrator
with a broken exporter, a runtime of a wrong version) must not page someone hundreds of
times. Per contract (refusals attributed to no contract count together), in fixed
windows of :data:`REFUSAL_WINDOW` (10 minutes, aligned to the epoch), the first
:data:`REFUSALS_PER_WINDOW` (10) refusals are sent one by one; the next one raises ONE
more event, ``record_refused:flood:<contract or ->:<window start>``, saying that the
limit was reached and until when; every further refusal of that window is still stored
in the event log (``yoco alerts list --kind record_refused``, the operator's page) with
``data.held_back`` set, but gets no delivery. So a window sends at most 11 messages per
contract and destination, and nothing refused goes unrecorded. Counting runs under a
transaction-scoped advisory lock per contract, so concurrent refusals cannot all slip
under the limit.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import func, select, text
from sqlalchemy.orm import Session

from alerts.events import NewEvent, raise_event
from alerts.models import AlertEvent

__all__ = [
    "MAX_LISTED",
    "REFUSALS_PER_WINDOW",
    "REFUSAL_WINDOW",
    "RefusalRecorder",
    "raise_refusal",
    "record_refusal",
    "refusal_event",
]

log = logging.getLogger("yoco.alerts")

#: Refused records listed in one event's data (the count says how many there were).
MAX_LISTED = 20
#: Refusals sent one by one per contract and window; later ones are held back.
REFUSALS_PER_WINDOW = 10
#: The flood limit's window (fixed, aligned to the epoch).
REFUSAL_WINDOW = timedelta(minutes=10)
_FLOOD = "record_refused:flood:"


def _digest(obj: Any) -> str:
    data = json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False,
                      default=str)
    return hashlib.sha256(data.encode()).hexdigest()


def refusal_event(objs: Sequence[Any], errors: Sequence[Any], *, source: str,
                  now: datetime | None = None,
                  scope: frozenset[str] | None = None) -> NewEvent:
    """The ``record_refused`` event for ``errors`` (RecordErrors with ``index``) about the
    batch ``objs`` (the records as sent) from ``source`` (``runtime sink``, ``API``).

    The event belongs to a contract (and so its customer's destinations) only when every
    refused record names that one contract and, with ``scope``, the sender may write to
    it; otherwise it goes to the operator's destinations only."""
    now = now or datetime.now(UTC)
    by_index: dict[int | None, list[Any]] = {}
    for e in errors:
        idx = getattr(e, "index", None)
        by_index.setdefault(idx if isinstance(idx, int) and 0 <= idx < len(objs) else None,
                            []).append(e)
    refused: list[dict[str, Any]] = []
    digests: list[str] = []
    for idx in sorted(i for i in by_index if i is not None):
        obj = objs[idx]
        digests.append(_digest(obj))
        rec = obj if isinstance(obj, Mapping) else {}
        refused.append({
            "event_id": str(rec.get("event_id")) if rec.get("event_id") is not None else None,
            "kind": rec.get("kind") if isinstance(rec.get("kind"), str) else None,
            "contract_id": rec.get("contract_id") if isinstance(rec.get("contract_id"), str)
            else None,
            "errors": [{"field": getattr(e, "field", ""), "message": getattr(e, "message", str(e))}
                       for e in by_index[idx]],
        })
    loose = [str(e) for e in by_index.get(None, [])]
    digests.extend(hashlib.sha256(m.encode()).hexdigest() for m in loose)
    key_hash = hashlib.sha256("\n".join(sorted(digests)).encode()).hexdigest()
    contracts = {r["contract_id"] for r in refused}
    contract_id = next(iter(contracts)) if len(contracts) == 1 and not loose else None
    if scope is not None and contract_id not in scope:
        contract_id = None
    first = refused[0] if refused else None
    what = (
        f"{first['kind'] or 'record'} {first['event_id']}" if first else "a batch"
    )
    why = (
        f"{first['errors'][0]['field'] or 'record'}: {first['errors'][0]['message']}"
        if first else (loose[0] if loose else "refused")
    )
    more = len(refused) + len(loose) - 1
    return NewEvent(
        kind="record_refused",
        key=f"record_refused:{key_hash}",
        occurred_at=now,
        contract_id=contract_id,
        subject=(f"the ledger refused {what} from the {source} ({why})"
                 + (f" and {more} more" if more > 0 else ""))[:500],
        data={
            "source": source,
            "refused_records": len(refused),
            "records": refused[:MAX_LISTED],
            "errors": loose[:MAX_LISTED],
            "batch_size": len(objs),
        },
    )


def window_start(at: datetime, window: timedelta = REFUSAL_WINDOW) -> datetime:
    """The start of the flood limit's window that contains ``at`` (aligned to the epoch)."""
    step = int(window.total_seconds())
    if step <= 0:
        raise ValueError("window: must be at least a second")
    secs = int(at.timestamp())
    return datetime.fromtimestamp(secs - secs % step, UTC)


def raise_refusal(session: Session, event: NewEvent, *, limit: int = REFUSALS_PER_WINDOW,
                  window: timedelta = REFUSAL_WINDOW) -> int | None:
    """Raise a ``record_refused`` event under the flood limit (module docstring): sent
    while fewer than ``limit`` refusals of its contract were raised in its window, else
    stored with ``data.held_back`` and no delivery, after raising the window's one flood
    event. Returns the new event's id, or None when this refusal was raised already.
    Never commits."""
    if event.kind != "record_refused" or event.key.startswith(_FLOOD):
        raise ValueError("raise_refusal takes a record_refused event of one refusal")
    if limit < 1:
        raise ValueError("limit: at least 1")
    bucket = event.contract_id or ""
    # Serialise the counting per contract: concurrent refusals cannot all pass the limit.
    session.execute(text("SELECT pg_advisory_xact_lock(hashtext(:k))"),
                    {"k": "yoco:record_refused:" + bucket})
    known = session.execute(
        select(AlertEvent.id).where(AlertEvent.key == event.key)
    ).scalar_one_or_none()
    if known is not None:
        return None
    start = window_start(event.occurred_at, window)
    end = start + window
    contract = (AlertEvent.contract_id.is_(None) if event.contract_id is None
                else AlertEvent.contract_id == event.contract_id)
    raised = session.execute(
        select(func.count()).select_from(AlertEvent).where(
            AlertEvent.kind == "record_refused", contract,
            AlertEvent.occurred_at >= start, AlertEvent.occurred_at < end,
            ~AlertEvent.key.startswith(_FLOOD, autoescape=True),
        )
    ).scalar_one()
    if raised < limit:
        return raise_event(session, event)
    minutes = int(window.total_seconds() // 60)
    flood_key = f"{_FLOOD}{bucket or '-'}:{start.isoformat()}"
    who = f"contract {event.contract_id}" if event.contract_id else "no single contract"
    raise_event(session, NewEvent(
        kind="record_refused",
        key=flood_key,
        occurred_at=event.occurred_at,
        contract_id=event.contract_id,
        subject=(f"the ledger refused more than {limit} batches ({who}) within "
                 f"{minutes} minutes; further refusals until {end.isoformat()} are logged "
                 "but not sent one by one"),
        data={"flood": True, "limit": limit, "window_start": start.isoformat(),
              "window_end": end.isoformat(), "source": event.data.get("source"),
              "first_held_back": event.subject},
    ))
    held = replace(event, data={**event.data, "held_back": (
        f"not sent: more than {limit} refusals ({who}) in the window from "
        f"{start.isoformat()}; see {flood_key}")})
    return raise_event(session, held, deliver=False)


def record_refusal(session: Session, objs: Sequence[Any], errors: Sequence[Any], *,
                   source: str, now: datetime | None = None) -> int | None:
    """Raise the ``record_refused`` event of a refused batch (once per content, under the
    flood limit of :func:`raise_refusal`); return the new event's id or None when it was
    raised already. Never commits."""
    return raise_refusal(session, refusal_event(objs, errors, source=source, now=now))


class RefusalRecorder:
    """A callable that raises ``record_refused`` in its own unit of work and never fails
    the caller: the refusal itself must reach its sender even if the alert cannot be
    stored (the failure is logged)."""

    def __init__(self, unit: Callable[[], AbstractContextManager[Session]], source: str) -> None:
        self._unit = unit
        self.source = source

    def __call__(self, objs: Sequence[Any], errors: Sequence[Any]) -> None:
        """Record the refusal of ``errors`` in ``objs``."""
        try:
            with self._unit() as session:
                record_refusal(session, objs, errors, source=self.source)
        except Exception:
            log.exception("could not store the record_refused alert (the refusal stands)")
