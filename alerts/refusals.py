"""``record_refused``: the ledger refused records that a runtime or an integrator sent.

Raised where the refusal happens — the runtime's ledger sink (its outbox then keeps the
record as a dead letter: ``yoco outbox list``) and ``POST /api/v1/records`` (422) — in a
transaction of its own, since the refused batch itself writes nothing. ``yoco ledger
ingest`` is not alerted: whoever runs it reads the refusal on the terminal (exit 2).

One event per refused batch, keyed by the SHA-256 of the refused records' content (each
record's JSON with sorted keys), so the same refusal is alerted once however often it is
retried: the outbox narrowing a refused batch down to the one bad record, a runtime
re-sending its dead letters, an integrator posting the same bad batch again.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from datetime import UTC, datetime
from typing import Any

from sqlalchemy.orm import Session

from alerts.events import NewEvent, raise_event

__all__ = ["MAX_LISTED", "RefusalRecorder", "record_refusal", "refusal_event"]

log = logging.getLogger("yoco.alerts")

#: Refused records listed in one event's data (the count says how many there were).
MAX_LISTED = 20


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


def record_refusal(session: Session, objs: Sequence[Any], errors: Sequence[Any], *,
                   source: str, now: datetime | None = None) -> int | None:
    """Raise the ``record_refused`` event of a refused batch (once per content); return
    the new event's id or None when it was raised already. Never commits."""
    return raise_event(session, refusal_event(objs, errors, source=source, now=now))


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
