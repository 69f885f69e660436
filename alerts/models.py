"""Tables of the alerts: destinations, events, deliveries, attempts, year standings.

None of them is a projection of the journal (alerts are operational, not evidence): they
are not replayed by ``yoco ledger verify`` and no figure reads them. The application role
may INSERT and SELECT them and UPDATE only the few state columns named in migration 0017;
nothing is ever deleted (the delivery log is the operator's record of what was sent).
The portal's tenant role (``yoco_portal``) cannot read any of them.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import (
    BigInteger,
    Boolean,
    CheckConstraint,
    DateTime,
    ForeignKey,
    Index,
    Integer,
    Text,
    UniqueConstraint,
    func,
)
from sqlalchemy.dialects.postgresql import ARRAY, JSONB
from sqlalchemy.orm import Mapped, mapped_column

from ledger.models import Base

#: Every kind of event (docs/alerts.md). ``test`` is sent by ``yoco alerts test`` only.
EVENT_KINDS = (
    "year_at_risk",
    "year_below",
    "year_missed",
    "credit_issued",
    "checkpoint_stale",
    "record_refused",
    "witness_down",
    "witness_refused",
    "checkpoint_cosigned",
    "report_issued",
    "witness_policy_unmet",
    "test",
)
#: Kinds sent only to destinations that name them (``--events``): a destination of every
#: kind does not get them (a cosigned head of every log every few minutes is for a
#: customer who wants to hold the heads, not for the on-call operator); an issued
#: report goes to the contract's subscribers who asked for it (e-mail: PDF and HTML
#: attached, migration 0024).
OPT_IN_KINDS = ("checkpoint_cosigned", "report_issued")
DESTINATION_KINDS = ("webhook", "email")
DELIVERY_STATES = ("pending", "delivered", "failed")
#: Where a replay was asked for: ``yoco alerts replay`` or the portal's operator page.
REPLAY_VIAS = ("cli", "portal")
#: What a customer's admin did to one of their customer's destinations in the portal
#: (``alert_destination_changes``, migration 0027).
CHANGE_ACTIONS = ("added", "disabled", "enabled", "removed")

_TS = DateTime(timezone=True)
#: A customer's own destination: a webhook to public addresses only, or an e-mail
#: destination of exactly one recipient (migration 0027; 0026 allowed webhooks only).
CUSTOMER_MANAGED_SAFE = (
    "NOT customer_managed OR (customer IS NOT NULL AND ((kind = 'webhook' AND NOT "
    "allow_unsafe_address) OR (kind = 'email' AND cardinality(mail_to) = 1)))"
)


def _in(column: str, values: tuple[str, ...]) -> str:
    return f"{column} IN ({', '.join(repr(v) for v in values)})"


class AlertDestination(Base):
    """Where alerts go: a webhook (URL + shared secret) or e-mail over SMTP.

    ``customer`` set: only events of that customer's contracts go there (a tenant's own
    endpoint); NULL: every event (the operator's). ``event_kinds`` empty: every kind.
    """

    __tablename__ = "alert_destinations"

    id: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=True)
    name: Mapped[str] = mapped_column(Text, nullable=False, unique=True)
    kind: Mapped[str] = mapped_column(Text, nullable=False)
    url: Mapped[str | None] = mapped_column(Text)
    secret: Mapped[str | None] = mapped_column(Text)
    smtp_host: Mapped[str | None] = mapped_column(Text)
    smtp_port: Mapped[int | None] = mapped_column(Integer)
    smtp_starttls: Mapped[bool] = mapped_column(Boolean, nullable=False, server_default="false")
    smtp_username: Mapped[str | None] = mapped_column(Text)
    #: The name of the environment variable holding the SMTP password (never the password).
    smtp_password_env: Mapped[str | None] = mapped_column(Text)
    mail_from: Mapped[str | None] = mapped_column(Text)
    mail_to: Mapped[list[str]] = mapped_column(ARRAY(Text), nullable=False, server_default="{}")
    customer: Mapped[str | None] = mapped_column(Text)
    #: Added by the customer's own admin in the portal: a webhook to public addresses
    #: only (the operator's destinations may name internal receivers), or one e-mail
    #: recipient sent through the operator's relay (migration 0027).
    customer_managed: Mapped[bool] = mapped_column(
        Boolean, nullable=False, server_default="false"
    )
    #: When the customer's admin removed this e-mail recipient (it is then disabled for
    #: good: never listed to them, never sent to, never turned on again); the row stays,
    #: as every destination does, for the delivery log.
    removed_at: Mapped[datetime | None] = mapped_column(_TS)
    event_kinds: Mapped[list[str]] = mapped_column(
        ARRAY(Text), nullable=False, server_default="{}"
    )
    allow_unsafe_address: Mapped[bool] = mapped_column(
        Boolean, nullable=False, server_default="false"
    )
    enabled: Mapped[bool] = mapped_column(Boolean, nullable=False, server_default="true")
    created_at: Mapped[datetime] = mapped_column(_TS, nullable=False, server_default=func.now())

    __table_args__ = (
        CheckConstraint(_in("kind", DESTINATION_KINDS), name="kind_known"),
        CheckConstraint("length(name) BETWEEN 1 AND 100", name="name_length"),
        CheckConstraint(
            "kind <> 'webhook' OR (url IS NOT NULL AND secret IS NOT NULL)", name="webhook_complete"
        ),
        CheckConstraint(
            "kind <> 'email' OR (smtp_host IS NOT NULL AND smtp_port BETWEEN 1 AND 65535 "
            "AND mail_from IS NOT NULL AND cardinality(mail_to) > 0)",
            name="email_complete",
        ),
        CheckConstraint(
            "event_kinds <@ ARRAY[" + ", ".join(repr(k) for k in EVENT_KINDS) + "]::text[]",
            name="event_kinds_known",
        ),
        CheckConstraint(CUSTOMER_MANAGED_SAFE, name="customer_managed_safe"),
        CheckConstraint("removed_at IS NULL OR (customer_managed AND kind = 'email' "
                        "AND NOT enabled)", name="removed_for_good"),
    )


class AlertEvent(Base):
    """Something an operator must hear about, stored once per idempotency ``key``."""

    __tablename__ = "alert_events"

    id: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=True)
    key: Mapped[str] = mapped_column(Text, nullable=False, unique=True)
    kind: Mapped[str] = mapped_column(Text, nullable=False)
    contract_id: Mapped[str | None] = mapped_column(Text)
    #: The contract's customer (tenant scope); NULL for events of no tenant.
    customer: Mapped[str | None] = mapped_column(Text)
    year: Mapped[int | None] = mapped_column(Integer)
    #: When what the event says happened (or was observed, for a standing).
    occurred_at: Mapped[datetime] = mapped_column(_TS, nullable=False)
    detected_at: Mapped[datetime] = mapped_column(_TS, nullable=False, server_default=func.now())
    subject: Mapped[str] = mapped_column(Text, nullable=False)
    data: Mapped[dict[str, Any]] = mapped_column(JSONB, nullable=False)

    __table_args__ = (
        CheckConstraint(_in("kind", EVENT_KINDS), name="kind_known"),
        Index(None, "customer", "id"),
        # The refusal flood limit counts a window's record_refused events (migration 0018).
        Index(None, "kind", "contract_id", "occurred_at"),
    )


class AlertDelivery(Base):
    """One event to one destination: its state and how many attempts it took."""

    __tablename__ = "alert_deliveries"

    id: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=True)
    event_id: Mapped[int] = mapped_column(
        BigInteger, ForeignKey("alert_events.id"), nullable=False
    )
    destination_id: Mapped[int] = mapped_column(
        BigInteger, ForeignKey("alert_destinations.id"), nullable=False
    )
    status: Mapped[str] = mapped_column(Text, nullable=False, server_default="pending")
    attempts: Mapped[int] = mapped_column(Integer, nullable=False, server_default="0")
    last_error: Mapped[str | None] = mapped_column(Text)
    last_status: Mapped[int | None] = mapped_column(Integer)
    created_at: Mapped[datetime] = mapped_column(_TS, nullable=False, server_default=func.now())
    updated_at: Mapped[datetime] = mapped_column(_TS, nullable=False, server_default=func.now())
    delivered_at: Mapped[datetime | None] = mapped_column(_TS)

    __table_args__ = (
        UniqueConstraint("event_id", "destination_id"),
        CheckConstraint(_in("status", DELIVERY_STATES), name="status_known"),
        Index(None, "status", "id"),
        Index(None, "destination_id"),
    )


class AlertAttempt(Base):
    """One try at a delivery (append-only): what the destination answered, or the error."""

    __tablename__ = "alert_attempts"

    id: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=True)
    delivery_id: Mapped[int] = mapped_column(
        BigInteger, ForeignKey("alert_deliveries.id"), nullable=False
    )
    attempt: Mapped[int] = mapped_column(Integer, nullable=False)
    at: Mapped[datetime] = mapped_column(_TS, nullable=False)
    ok: Mapped[bool] = mapped_column(Boolean, nullable=False)
    status_code: Mapped[int | None] = mapped_column(Integer)
    error: Mapped[str | None] = mapped_column(Text)
    #: Seconds waited before the next attempt (NULL after the last one).
    backoff_s: Mapped[float | None] = mapped_column()
    replay: Mapped[bool] = mapped_column(Boolean, nullable=False, server_default="false")

    __table_args__ = (Index(None, "delivery_id", "attempt"),)


class AlertReplay(Base):
    """Who asked for a delivery to be sent again, when, and from where (append-only): the
    audit trail of replays, whether or not the replay then arrived (its attempts say)."""

    __tablename__ = "alert_replays"

    id: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=True)
    delivery_id: Mapped[int] = mapped_column(
        BigInteger, ForeignKey("alert_deliveries.id"), nullable=False
    )
    #: The operator: a portal user's e-mail, or the OS user who ran ``yoco alerts replay``.
    requested_by: Mapped[str] = mapped_column(Text, nullable=False)
    via: Mapped[str] = mapped_column(Text, nullable=False)
    requested_at: Mapped[datetime] = mapped_column(_TS, nullable=False, server_default=func.now())

    __table_args__ = (
        CheckConstraint(_in("via", REPLAY_VIAS), name="via_known"),
        CheckConstraint("length(requested_by) BETWEEN 1 AND 320", name="requested_by_length"),
        Index(None, "delivery_id", "id"),
    )


class AlertDestinationChange(Base):
    """A change a customer's admin made in the portal to one of their customer's
    destinations (append-only): which, what (:data:`CHANGE_ACTIONS`), who and when --
    the audit trail of customer self-service, as ``alert_replays`` is of replays."""

    __tablename__ = "alert_destination_changes"

    id: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=True)
    destination_id: Mapped[int] = mapped_column(
        BigInteger, ForeignKey("alert_destinations.id"), nullable=False
    )
    action: Mapped[str] = mapped_column(Text, nullable=False)
    #: The portal user: their name and id (``Alice (user #3)``).
    changed_by: Mapped[str] = mapped_column(Text, nullable=False)
    changed_at: Mapped[datetime] = mapped_column(_TS, nullable=False, server_default=func.now())

    __table_args__ = (
        CheckConstraint(_in("action", CHANGE_ACTIONS), name="action_known"),
        CheckConstraint("length(changed_by) BETWEEN 1 AND 320", name="changed_by_length"),
        Index(None, "destination_id", "id"),
    )


class AlertYearStanding(Base):
    """The standing the detector last saw for an open contract year, and how often it
    worsened: the transition counter that makes the at-risk event's key deterministic."""

    __tablename__ = "alert_year_standings"

    contract_id: Mapped[str] = mapped_column(Text, primary_key=True)
    year: Mapped[int] = mapped_column(Integer, primary_key=True)
    standing: Mapped[str] = mapped_column(Text, nullable=False)
    escalations: Mapped[int] = mapped_column(Integer, nullable=False, server_default="0")
    updated_at: Mapped[datetime] = mapped_column(_TS, nullable=False, server_default=func.now())


ALERT_TABLES = (
    "alert_destinations",
    "alert_events",
    "alert_deliveries",
    "alert_attempts",
    "alert_year_standings",
    "alert_replays",
    "alert_destination_changes",
)
