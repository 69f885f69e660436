"""Configuring destinations and reading the delivery log; replays and test events.

Services take a session and never commit (the unit of work does). Bad configuration
raises :class:`~alerts.errors.BadDestination` naming the field, before anything is
written.
"""

from __future__ import annotations

import re
import secrets
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from alerts.config import check_host, check_webhook_url
from alerts.errors import BadDestination, UnknownDelivery, UnknownDestination
from alerts.models import (
    EVENT_KINDS,
    REPLAY_VIAS,
    AlertAttempt,
    AlertDelivery,
    AlertDestination,
    AlertEvent,
    AlertReplay,
)
from ledger.models import Contract

__all__ = [
    "DeliveryRow",
    "add_email",
    "add_webhook",
    "attempts_of",
    "deliveries",
    "destination_json",
    "events",
    "get_destination",
    "list_destinations",
    "new_secret",
    "queue_replay",
    "queue_test",
    "replays",
    "set_enabled",
]

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")
_EMAIL = re.compile(r"^[^@\s<>,;\"]+@[^@\s<>,;\"]+$")
_ENV = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")
_HOST = re.compile(r"^[A-Za-z0-9.:\-\[\]%]{1,253}$")


def new_secret() -> str:
    """A fresh webhook signing secret (``whsec_`` and 256 random bits, URL-safe)."""
    return "whsec_" + secrets.token_urlsafe(32)


def _check_name(session: Session, name: str) -> None:
    if not isinstance(name, str) or not _NAME.match(name):
        raise BadDestination(
            "name: 1 to 100 letters, digits, '.', '_' or '-', starting with a letter or digit"
        )
    exists = session.execute(
        select(AlertDestination.id).where(AlertDestination.name == name)
    ).scalar_one_or_none()
    if exists is not None:
        raise BadDestination(f"name: a destination named {name!r} exists already")


def _check_kinds(kinds: Sequence[str] | None) -> list[str]:
    out = sorted(set(kinds or ()))
    unknown = [k for k in out if k not in EVENT_KINDS]
    if unknown:
        raise BadDestination(
            f"events: unknown event kind(s) {', '.join(unknown)} (known: "
            f"{', '.join(EVENT_KINDS)})"
        )
    return out


def _check_customer(session: Session, customer: str | None) -> str | None:
    if customer is None:
        return None
    known = session.execute(
        select(func.count()).select_from(Contract).where(Contract.customer == customer)
    ).scalar_one()
    if not known:
        raise BadDestination(f"customer: no contract belongs to customer {customer!r}")
    return customer


def add_webhook(
    session: Session,
    *,
    name: str,
    url: str,
    secret: str | None = None,
    customer: str | None = None,
    events: Sequence[str] | None = None,
    allow_unsafe_address: bool = False,
    customer_managed: bool = False,
) -> tuple[AlertDestination, str]:
    """Add a webhook destination; return it and its signing secret (generated when not
    given: show it once, the receiver needs it). Raises BadDestination/UnsafeAddress.
    ``customer_managed``: added by the customer's own admin (the portal): a customer is
    required and only public addresses are accepted, now and at each send."""
    _check_name(session, name)
    if customer_managed and (customer is None or allow_unsafe_address):
        raise BadDestination("customer: a customer's own webhook names its customer and "
                             "only public addresses")
    check_webhook_url(url, allow_unsafe=allow_unsafe_address, strict=customer_managed)
    if secret is None:
        secret = new_secret()
    elif not isinstance(secret, str) or len(secret) < 16 or len(secret) > 200 \
            or not secret.isprintable() or secret != secret.strip():
        raise BadDestination("secret: 16 to 200 printable characters, no surrounding spaces")
    dest = AlertDestination(
        name=name, kind="webhook", url=url, secret=secret,
        customer=_check_customer(session, customer), event_kinds=_check_kinds(events),
        allow_unsafe_address=bool(allow_unsafe_address), enabled=True, mail_to=[],
        smtp_starttls=False, customer_managed=customer_managed,
    )
    session.add(dest)
    session.flush()
    return dest, secret


def add_email(
    session: Session,
    *,
    name: str,
    host: str,
    port: int,
    mail_from: str,
    mail_to: Sequence[str],
    starttls: bool = False,
    username: str | None = None,
    password_env: str | None = None,
    customer: str | None = None,
    events: Sequence[str] | None = None,
    allow_unsafe_address: bool = False,
) -> AlertDestination:
    """Add an e-mail destination (SMTP submission). The password is never stored: name
    the environment variable that holds it (``password_env``) in the sending process."""
    _check_name(session, name)
    if not isinstance(host, str) or not _HOST.match(host):
        raise BadDestination(f"host: expected an SMTP host name or address, got {host!r}")
    if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535:
        raise BadDestination(f"port: expected 1 to 65535, got {port!r}")
    check_host(host, field="host", allow_unsafe=allow_unsafe_address)
    if not isinstance(mail_from, str) or not _EMAIL.match(mail_from):
        raise BadDestination(f"from: expected an e-mail address, got {mail_from!r}")
    to = list(mail_to)
    if not to:
        raise BadDestination("to: at least one recipient")
    for i, addr in enumerate(to):
        if not isinstance(addr, str) or not _EMAIL.match(addr):
            raise BadDestination(f"to[{i}]: expected an e-mail address, got {addr!r}")
    if (username is None) != (password_env is None):
        raise BadDestination("password_env: give both --username and --password-env, or "
                             "neither")
    if password_env is not None and not _ENV.match(password_env):
        raise BadDestination(f"password_env: not an environment variable name: {password_env!r}")
    if username is not None and (not username or not username.isprintable()):
        raise BadDestination("username: expected printable text")
    dest = AlertDestination(
        name=name, kind="email", smtp_host=host, smtp_port=port, smtp_starttls=bool(starttls),
        smtp_username=username, smtp_password_env=password_env, mail_from=mail_from,
        mail_to=to, customer=_check_customer(session, customer),
        event_kinds=_check_kinds(events), allow_unsafe_address=bool(allow_unsafe_address),
        enabled=True,
    )
    session.add(dest)
    session.flush()
    return dest


def get_destination(session: Session, name: str) -> AlertDestination:
    """The destination named ``name`` (UnknownDestination otherwise)."""
    dest = session.execute(
        select(AlertDestination).where(AlertDestination.name == name)
    ).scalar_one_or_none()
    if dest is None:
        raise UnknownDestination(f"no alert destination named {name!r} (see `yoco alerts "
                                 "destinations`)")
    return dest


def list_destinations(session: Session) -> list[AlertDestination]:
    """Every destination, oldest first."""
    return list(session.execute(select(AlertDestination).order_by(AlertDestination.id)).scalars())


def set_enabled(session: Session, name: str, enabled: bool) -> AlertDestination:
    """Enable or disable a destination (its delivery log stays)."""
    dest = get_destination(session, name)
    dest.enabled = enabled
    session.flush()
    return dest


def destination_json(d: AlertDestination) -> dict[str, Any]:
    """A destination as JSON, without its secret (only a fingerprint of it)."""
    import hashlib

    out: dict[str, Any] = {
        "name": d.name, "kind": d.kind, "enabled": d.enabled, "customer": d.customer,
        "events": list(d.event_kinds) or "all",
        "allow_unsafe_address": d.allow_unsafe_address,
        "created_at": d.created_at.astimezone(UTC).isoformat() if d.created_at else None,
    }
    if d.kind == "webhook":
        out["url"] = d.url
        out["secret_sha256"] = hashlib.sha256((d.secret or "").encode()).hexdigest()[:12]
    else:
        out.update(host=d.smtp_host, port=d.smtp_port, starttls=d.smtp_starttls,
                   username=d.smtp_username, password_env=d.smtp_password_env,
                   mail_from=d.mail_from, mail_to=list(d.mail_to))
    return out


def events(session: Session, *, customer: str | None = None, all_tenants: bool = False,
           kind: str | None = None, limit: int = 100) -> list[AlertEvent]:
    """Events, newest first: every tenant's with ``all_tenants`` (operators), otherwise
    only ``customer``'s (a tenant never sees another's, nor events of no tenant)."""
    q = select(AlertEvent).order_by(AlertEvent.id.desc()).limit(max(1, min(limit, 10_000)))
    if not all_tenants:
        if customer is None:
            return []
        q = q.where(AlertEvent.customer == customer)
    if kind is not None:
        if kind not in EVENT_KINDS:
            raise BadDestination(f"kind: unknown event kind {kind!r}")
        q = q.where(AlertEvent.kind == kind)
    return list(session.execute(q).scalars())


@dataclass(frozen=True, slots=True, kw_only=True)
class DeliveryRow:
    """A line of the delivery log."""

    id: int
    status: str
    attempts: int
    destination: str
    event_key: str
    event_kind: str
    contract_id: str | None
    customer: str | None
    subject: str
    last_status: int | None
    last_error: str | None
    created_at: datetime
    updated_at: datetime
    delivered_at: datetime | None

    def to_json(self) -> dict[str, Any]:
        """Plain JSON, times as ISO 8601 UTC."""
        def t(x: datetime | None) -> str | None:
            return x.astimezone(UTC).isoformat() if x else None

        return {
            "id": self.id, "status": self.status, "attempts": self.attempts,
            "destination": self.destination, "event_key": self.event_key,
            "event_kind": self.event_kind, "contract_id": self.contract_id,
            "subject": self.subject, "last_status": self.last_status,
            "last_error": self.last_error, "created_at": t(self.created_at),
            "updated_at": t(self.updated_at), "delivered_at": t(self.delivered_at),
        }


def deliveries(session: Session, *, status: str | None = None, destination: str | None = None,
               customer: str | None = None, all_tenants: bool = True,
               limit: int = 100) -> list[DeliveryRow]:
    """The delivery log, newest first, optionally filtered; tenant-scoped like :func:`events`."""
    q = (
        select(AlertDelivery, AlertDestination.name, AlertEvent)
        .join(AlertDestination, AlertDestination.id == AlertDelivery.destination_id)
        .join(AlertEvent, AlertEvent.id == AlertDelivery.event_id)
        .order_by(AlertDelivery.id.desc())
        .limit(max(1, min(limit, 10_000)))
    )
    if status is not None:
        if status not in ("pending", "delivered", "failed"):
            raise BadDestination(f"status: expected pending, delivered or failed, got {status!r}")
        q = q.where(AlertDelivery.status == status)
    if destination is not None:
        get_destination(session, destination)
        q = q.where(AlertDestination.name == destination)
    if not all_tenants:
        if customer is None:
            return []
        q = q.where(AlertEvent.customer == customer)
    return [
        DeliveryRow(
            id=d.id, status=d.status, attempts=d.attempts, destination=name,
            event_key=e.key, event_kind=e.kind, contract_id=e.contract_id,
            customer=e.customer, subject=e.subject, last_status=d.last_status,
            last_error=d.last_error, created_at=d.created_at, updated_at=d.updated_at,
            delivered_at=d.delivered_at,
        )
        for d, name, e in session.execute(q).all()
    ]


def attempts_of(session: Session, delivery_id: int) -> list[AlertAttempt]:
    """Every attempt of a delivery, in order."""
    if session.get(AlertDelivery, delivery_id) is None:
        raise UnknownDelivery(f"no delivery with id {delivery_id}")
    return list(session.execute(
        select(AlertAttempt).where(AlertAttempt.delivery_id == delivery_id)
        .order_by(AlertAttempt.attempt)
    ).scalars())


def queue_replay(session: Session, delivery_ids: Sequence[int] = (), *,
                 failed: bool = False, requested_by: str, via: str) -> list[int]:
    """Put deliveries back in the queue (``delivery_ids``, and with ``failed`` every failed
    one); return their ids. The event, its body and its idempotency key are unchanged.

    Audited: one ``alert_replays`` row per delivery queued, naming ``requested_by`` (the
    operator) and ``via`` (``cli`` or ``portal``), in the same transaction. Raises
    UnknownDelivery (nothing queued) for an unknown id, ValueError for a bad
    ``requested_by``/``via`` (nothing queued)."""
    if via not in REPLAY_VIAS:
        raise ValueError(f"via: expected one of {', '.join(REPLAY_VIAS)}, got {via!r}")
    if not isinstance(requested_by, str) or not 1 <= len(requested_by.strip()) <= 320:
        raise ValueError("requested_by: who asks for the replay (1 to 320 characters)")
    ids = sorted(set(delivery_ids))
    found = set(session.execute(
        select(AlertDelivery.id).where(AlertDelivery.id.in_(ids))
    ).scalars()) if ids else set()
    missing = [i for i in ids if i not in found]
    if missing:
        raise UnknownDelivery(f"no delivery with id {', '.join(map(str, missing))}")
    if failed:
        ids = sorted(set(ids) | set(session.execute(
            select(AlertDelivery.id).where(AlertDelivery.status == "failed")).scalars()))
    now = datetime.now(UTC)
    for d in session.execute(
        select(AlertDelivery).where(AlertDelivery.id.in_(ids)).with_for_update()
    ).scalars():
        d.status = "pending"
        d.updated_at = now
        session.add(AlertReplay(delivery_id=d.id, requested_by=requested_by.strip(), via=via,
                                requested_at=now))
    session.flush()
    return ids


def replays(session: Session, *, delivery_id: int | None = None,
            limit: int = 100) -> list[AlertReplay]:
    """The audit trail of replays, newest first (of one delivery with ``delivery_id``)."""
    q = select(AlertReplay).order_by(AlertReplay.id.desc()).limit(max(1, min(limit, 10_000)))
    if delivery_id is not None:
        q = q.where(AlertReplay.delivery_id == delivery_id)
    return list(session.execute(q).scalars())


def queue_test(session: Session, name: str, *, now: datetime | None = None) -> int:
    """Queue a ``test`` event for destination ``name`` only; return the delivery id."""
    dest = get_destination(session, name)
    now = now or datetime.now(UTC)
    event = AlertEvent(
        key=f"test:{dest.name}:{uuid.uuid4()}", kind="test", contract_id=None,
        customer=dest.customer, year=None, occurred_at=now,
        subject=f"test alert for destination {dest.name}",
        data={"destination": dest.name, "note": "sent by `yoco alerts test`; no action needed"},
    )
    session.add(event)
    session.flush()
    delivery = AlertDelivery(event_id=event.id, destination_id=dest.id, status="pending",
                             attempts=0)
    session.add(delivery)
    session.flush()
    return delivery.id
