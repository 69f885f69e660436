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
    CHANGE_ACTIONS,
    EVENT_KINDS,
    REPLAY_VIAS,
    AlertAttempt,
    AlertDelivery,
    AlertDestination,
    AlertDestinationChange,
    AlertEvent,
    AlertReplay,
)
from ledger.models import Contract

__all__ = [
    "MAX_CUSTOMER_RECIPIENTS",
    "DeliveryRow",
    "add_customer_email",
    "add_email",
    "add_webhook",
    "attempts_of",
    "check_recipient",
    "customer_changes",
    "customer_recipients",
    "deliveries",
    "destination_json",
    "events",
    "get_destination",
    "list_destinations",
    "new_secret",
    "queue_replay",
    "queue_test",
    "record_change",
    "remove_customer_email",
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


#: At most this many live e-mail recipients per customer, added by its admin.
MAX_CUSTOMER_RECIPIENTS = 20
_LOCAL = re.compile(r"^[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+(\.[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+)*$")
_LABEL = re.compile(r"^(?!-)[A-Za-z0-9-]{1,63}(?<!-)$")


def check_recipient(address: object, *, field: str = "email") -> str:
    """A recipient's address as a customer's admin types it: ``local@domain``, the local
    part letters, digits and ``!#$%&'*+/=?^_`{|}~-`` in dot-separated runs (at most 64),
    the domain two or more dot-separated labels of letters, digits and inner hyphens
    ending in letters (an IDN in its ``xn--`` form), 254 characters in all.  Returns it
    with surrounding spaces dropped and the domain lower-cased.  Raises
    :class:`BadDestination` naming ``field`` and what is wrong."""
    if not isinstance(address, str) or not address.strip():
        raise BadDestination(f"{field}: enter an e-mail address (name@example.com)")
    text_ = address.strip()
    if len(text_) > 254:
        raise BadDestination(f"{field}: at most 254 characters, got {len(text_)}")
    local, at, domain = text_.rpartition("@")
    if not at or not local:
        raise BadDestination(f"{field}: {text_!r} is not an e-mail address (name@example.com)")
    if len(local) > 64 or not _LOCAL.match(local):
        raise BadDestination(
            f"{field}: the part before the @ of {text_!r} is not a plain mailbox name "
            "(letters, digits, dots between them and !#$%&'*+/=?^_`{|}~-, at most 64)")
    labels = domain.split(".")
    if len(labels) < 2 or not all(_LABEL.match(x) for x in labels) \
            or not labels[-1].isalpha():
        raise BadDestination(
            f"{field}: the domain of {text_!r} is not a mail domain such as example.com "
            "(letters, digits and hyphens; an international name in its xn-- form)")
    return f"{local}@{domain.lower()}"


def record_change(session: Session, dest: AlertDestination, action: str,
                  changed_by: str) -> AlertDestinationChange:
    """Audit one change a customer's admin made to ``dest`` in the portal (an
    ``alert_destination_changes`` row, in the caller's transaction).  ValueError for an
    unknown ``action`` or an empty ``changed_by``."""
    if action not in CHANGE_ACTIONS:
        raise ValueError(f"action: expected one of {', '.join(CHANGE_ACTIONS)}, got {action!r}")
    if not isinstance(changed_by, str) or not 1 <= len(changed_by.strip()) <= 320:
        raise ValueError("changed_by: who made the change (1 to 320 characters)")
    row = AlertDestinationChange(destination_id=dest.id, action=action,
                                 changed_by=changed_by.strip())
    session.add(row)
    session.flush()
    return row


def customer_recipients(session: Session, customer: str) -> list[AlertDestination]:
    """The e-mail recipients ``customer``'s admin added and has not removed, oldest
    first (never another customer's, nor the operator's destinations)."""
    return list(session.execute(
        select(AlertDestination).where(
            AlertDestination.customer == customer,
            AlertDestination.customer_managed.is_(True),
            AlertDestination.kind == "email",
            AlertDestination.removed_at.is_(None),
        ).order_by(AlertDestination.id)
    ).scalars())


def add_customer_email(
    session: Session,
    *,
    customer: str,
    address: str,
    events: Sequence[str],
    relay: str | None,
    changed_by: str,
) -> AlertDestination:
    """Add ``address`` as an e-mail recipient of ``customer``'s alerts of ``events``,
    for the customer's own admin (the portal), audited as ``added``.

    The message goes the way every alert e-mail goes (:func:`alerts.send.send_email`),
    through the operator's relay: the e-mail destination named ``relay``
    (``YOCO_WEB_CUSTOMER_MAIL_VIA``), whose SMTP server, login and From address are
    copied now; the customer chooses only the address and the kinds.  Raises
    :class:`BadDestination` naming the field (``email``, ``event``) -- or saying that no
    relay is configured -- before anything is written."""
    to = check_recipient(address)
    kinds = _check_kinds(events)
    if not kinds:
        raise BadDestination("event: choose at least one kind of alert")
    if relay is None:
        raise BadDestination("email: e-mail alerts are not offered by this operator yet "
                             "(no relay is configured)")
    via = session.execute(
        select(AlertDestination).where(AlertDestination.name == relay)
    ).scalar_one_or_none()
    if via is None or via.kind != "email" or via.customer is not None or not via.enabled:
        raise BadDestination(f"email: the operator's relay {relay!r} is not an enabled e-mail "
                             "destination of theirs: e-mail alerts cannot be added now")
    live = customer_recipients(session, customer)
    if any(to.casefold() == d.mail_to[0].casefold() for d in live):
        raise BadDestination(f"email: {to} receives your alerts already")
    if len(live) >= MAX_CUSTOMER_RECIPIENTS:
        raise BadDestination(f"email: at most {MAX_CUSTOMER_RECIPIENTS} recipients; remove "
                             "one first")
    dest = AlertDestination(
        name=f"cust-mail-{secrets.token_hex(6)}", kind="email", smtp_host=via.smtp_host,
        smtp_port=via.smtp_port, smtp_starttls=via.smtp_starttls,
        smtp_username=via.smtp_username, smtp_password_env=via.smtp_password_env,
        mail_from=via.mail_from, mail_to=[to], customer=_check_customer(session, customer),
        customer_managed=True, event_kinds=kinds,
        allow_unsafe_address=via.allow_unsafe_address, enabled=True,
    )
    session.add(dest)
    session.flush()
    record_change(session, dest, "added", changed_by)
    return dest


def remove_customer_email(session: Session, *, customer: str, name: str,
                          changed_by: str) -> AlertDestination | None:
    """Remove ``customer``'s e-mail recipient ``name``: disabled for good (never sent to
    or turned on again; its delivery log stays), audited as ``removed``.  None when no
    live recipient of that customer has that name (another customer's, the operator's,
    a webhook, one removed already): nothing changes."""
    dest = session.execute(
        select(AlertDestination).where(
            AlertDestination.name == name,
            AlertDestination.customer == customer,
            AlertDestination.customer_managed.is_(True),
            AlertDestination.kind == "email",
            AlertDestination.removed_at.is_(None),
        ).with_for_update()
    ).scalar_one_or_none()
    if dest is None:
        return None
    dest.enabled = False
    dest.removed_at = datetime.now(UTC)
    session.flush()
    record_change(session, dest, "removed", changed_by)
    return dest


def customer_changes(session: Session, customer: str,
                     limit: int = 20) -> list[tuple[AlertDestinationChange, AlertDestination]]:
    """The latest changes ``customer``'s admins made to its destinations, newest first."""
    return [(c, d) for c, d in session.execute(
        select(AlertDestinationChange, AlertDestination)
        .join(AlertDestination, AlertDestination.id == AlertDestinationChange.destination_id)
        .where(AlertDestination.customer == customer)
        .order_by(AlertDestinationChange.id.desc())
        .limit(max(1, min(limit, 1000)))
    ).all()]


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
    """Enable or disable a destination (its delivery log stays).  A recipient its
    customer removed is never turned on again (BadDestination)."""
    dest = get_destination(session, name)
    if enabled and dest.removed_at is not None:
        raise BadDestination(f"name: {name!r} was removed by its customer's admin; it is "
                             "never turned on again")
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
