"""Event ids the system gives its own entries, kept out of every producer's id space.

Producers choose random UUID v4 event ids and ingest refuses any other version
(:func:`yoco_records.schema.is_producer_event_id`). Every entry the system writes itself
gets an id of another version: UUID v5 when it must be deterministic (a contract, a year
close, a credit, an export, a report: the same action always gets the same id, which is
what makes it idempotent), UUID v8 with 122 random bits when it needs no name (a
dispute, an amendment without an id). So a producer can never take such an id before
the system writes it, and asking about one gets the same refusal whether it exists or
not. See docs/ingestion.md ("Event ids") and docs/security.md.
"""

from __future__ import annotations

import secrets
import uuid

from ledger.errors import ensure
from yoco_records.schema import is_producer_event_id

__all__ = ["derived_id", "is_producer_event_id", "random_internal_id"]

_VERSION_MASK = 0xF << 76
_VARIANT_MASK = 0x3 << 62


def derived_id(namespace: uuid.UUID, name: str) -> uuid.UUID:
    """The deterministic id (UUID v5) of the system's entry ``name`` in ``namespace``."""
    eid = uuid.uuid5(namespace, name)
    ensure(not is_producer_event_id(eid), f"derived id {eid} is in the producers' space")
    return eid


def random_internal_id() -> uuid.UUID:
    """An unpredictable id for an entry of the system's own: UUID v8, 122 random bits."""
    n = int.from_bytes(secrets.token_bytes(16), "big")
    n = (n & ~_VERSION_MASK) | (0x8 << 76)
    n = (n & ~_VARIANT_MASK) | (0x2 << 62)
    eid = uuid.UUID(int=n)
    ensure(eid.version == 8 and not is_producer_event_id(eid),
           f"random id {eid} is not a version 8 id outside the producers' space")
    return eid
