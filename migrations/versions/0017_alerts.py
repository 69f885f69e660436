"""alerts: destinations (webhook, e-mail), events stored once per key, deliveries, attempts

The application role ``yoco_app`` gets exactly what the alerts need and nothing more:
SELECT and INSERT on every alerts table; UPDATE only of a destination's ``enabled`` flag
and webhook ``secret`` (rotation), of a delivery's state columns and of a year's last
standing; never DELETE or TRUNCATE (the delivery log is the operator's record). The
tenant role ``yoco_portal`` gets nothing: the portal reads alerts for operators through
the application role, after checking the caller is one.

Revision ID: 0017
Revises: 0016
Create Date: 2026-12-01 02:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

from migrations.helpers import APP_ROLE, grant_sequences, revoke_all

revision: str = "0017"
down_revision: str | None = "0016"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

EVENT_KINDS = (
    "year_at_risk",
    "year_below",
    "year_missed",
    "credit_issued",
    "checkpoint_stale",
    "record_refused",
    "test",
)
TABLES = (
    "alert_destinations",
    "alert_events",
    "alert_deliveries",
    "alert_attempts",
    "alert_year_standings",
)
SEQUENCES = (
    "alert_destinations_id_seq",
    "alert_events_id_seq",
    "alert_deliveries_id_seq",
    "alert_attempts_id_seq",
)
#: The only columns the application role may UPDATE, per table.
UPDATABLE: dict[str, tuple[str, ...]] = {
    "alert_destinations": ("enabled", "secret"),
    "alert_deliveries": ("status", "attempts", "last_error", "last_status", "updated_at",
                         "delivered_at"),
    "alert_year_standings": ("standing", "escalations", "updated_at"),
}

_TS = sa.DateTime(timezone=True)


def _now() -> sa.TextClause:
    return sa.text("now()")


def upgrade() -> None:
    kinds = ", ".join(repr(k) for k in EVENT_KINDS)
    op.create_table(
        "alert_destinations",
        sa.Column("id", sa.BigInteger(), autoincrement=True, nullable=False),
        sa.Column("name", sa.Text(), nullable=False),
        sa.Column("kind", sa.Text(), nullable=False),
        sa.Column("url", sa.Text(), nullable=True),
        sa.Column("secret", sa.Text(), nullable=True),
        sa.Column("smtp_host", sa.Text(), nullable=True),
        sa.Column("smtp_port", sa.Integer(), nullable=True),
        sa.Column("smtp_starttls", sa.Boolean(), server_default="false", nullable=False),
        sa.Column("smtp_username", sa.Text(), nullable=True),
        sa.Column("smtp_password_env", sa.Text(), nullable=True),
        sa.Column("mail_from", sa.Text(), nullable=True),
        sa.Column("mail_to", postgresql.ARRAY(sa.Text()), server_default="{}", nullable=False),
        sa.Column("customer", sa.Text(), nullable=True),
        sa.Column(
            "event_kinds", postgresql.ARRAY(sa.Text()), server_default="{}", nullable=False
        ),
        sa.Column("allow_unsafe_address", sa.Boolean(), server_default="false", nullable=False),
        sa.Column("enabled", sa.Boolean(), server_default="true", nullable=False),
        sa.Column("created_at", _TS, server_default=_now(), nullable=False),
        sa.CheckConstraint(
            "kind IN ('webhook', 'email')", name=op.f("ck_alert_destinations_kind_known")
        ),
        sa.CheckConstraint(
            "length(name) BETWEEN 1 AND 100", name=op.f("ck_alert_destinations_name_length")
        ),
        sa.CheckConstraint(
            "kind <> 'webhook' OR (url IS NOT NULL AND secret IS NOT NULL)",
            name=op.f("ck_alert_destinations_webhook_complete"),
        ),
        sa.CheckConstraint(
            "kind <> 'email' OR (smtp_host IS NOT NULL AND smtp_port BETWEEN 1 AND 65535 "
            "AND mail_from IS NOT NULL AND cardinality(mail_to) > 0)",
            name=op.f("ck_alert_destinations_email_complete"),
        ),
        sa.CheckConstraint(
            f"event_kinds <@ ARRAY[{kinds}]::text[]",
            name=op.f("ck_alert_destinations_event_kinds_known"),
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_alert_destinations")),
        sa.UniqueConstraint("name", name=op.f("uq_alert_destinations_name")),
    )
    op.create_table(
        "alert_events",
        sa.Column("id", sa.BigInteger(), autoincrement=True, nullable=False),
        sa.Column("key", sa.Text(), nullable=False),
        sa.Column("kind", sa.Text(), nullable=False),
        sa.Column("contract_id", sa.Text(), nullable=True),
        sa.Column("customer", sa.Text(), nullable=True),
        sa.Column("year", sa.Integer(), nullable=True),
        sa.Column("occurred_at", _TS, nullable=False),
        sa.Column("detected_at", _TS, server_default=_now(), nullable=False),
        sa.Column("subject", sa.Text(), nullable=False),
        sa.Column("data", postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        sa.CheckConstraint(f"kind IN ({kinds})", name=op.f("ck_alert_events_kind_known")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_alert_events")),
        sa.UniqueConstraint("key", name=op.f("uq_alert_events_key")),
    )
    op.create_index(
        op.f("ix_alert_events_customer_id"), "alert_events", ["customer", "id"], unique=False
    )
    op.create_table(
        "alert_deliveries",
        sa.Column("id", sa.BigInteger(), autoincrement=True, nullable=False),
        sa.Column("event_id", sa.BigInteger(), nullable=False),
        sa.Column("destination_id", sa.BigInteger(), nullable=False),
        sa.Column("status", sa.Text(), server_default="pending", nullable=False),
        sa.Column("attempts", sa.Integer(), server_default="0", nullable=False),
        sa.Column("last_error", sa.Text(), nullable=True),
        sa.Column("last_status", sa.Integer(), nullable=True),
        sa.Column("created_at", _TS, server_default=_now(), nullable=False),
        sa.Column("updated_at", _TS, server_default=_now(), nullable=False),
        sa.Column("delivered_at", _TS, nullable=True),
        sa.CheckConstraint(
            "status IN ('pending', 'delivered', 'failed')",
            name=op.f("ck_alert_deliveries_status_known"),
        ),
        sa.ForeignKeyConstraint(
            ["destination_id"],
            ["alert_destinations.id"],
            name=op.f("fk_alert_deliveries_destination_id_alert_destinations"),
        ),
        sa.ForeignKeyConstraint(
            ["event_id"],
            ["alert_events.id"],
            name=op.f("fk_alert_deliveries_event_id_alert_events"),
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_alert_deliveries")),
        sa.UniqueConstraint(
            "event_id", "destination_id", name=op.f("uq_alert_deliveries_event_id_destination_id")
        ),
    )
    op.create_index(
        op.f("ix_alert_deliveries_status_id"), "alert_deliveries", ["status", "id"], unique=False
    )
    op.create_index(
        op.f("ix_alert_deliveries_destination_id"),
        "alert_deliveries",
        ["destination_id"],
        unique=False,
    )
    op.create_table(
        "alert_attempts",
        sa.Column("id", sa.BigInteger(), autoincrement=True, nullable=False),
        sa.Column("delivery_id", sa.BigInteger(), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("at", _TS, nullable=False),
        sa.Column("ok", sa.Boolean(), nullable=False),
        sa.Column("status_code", sa.Integer(), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("backoff_s", sa.Float(), nullable=True),
        sa.Column("replay", sa.Boolean(), server_default="false", nullable=False),
        sa.ForeignKeyConstraint(
            ["delivery_id"],
            ["alert_deliveries.id"],
            name=op.f("fk_alert_attempts_delivery_id_alert_deliveries"),
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_alert_attempts")),
    )
    op.create_index(
        op.f("ix_alert_attempts_delivery_id_attempt"),
        "alert_attempts",
        ["delivery_id", "attempt"],
        unique=False,
    )
    op.create_table(
        "alert_year_standings",
        sa.Column("contract_id", sa.Text(), nullable=False),
        sa.Column("year", sa.Integer(), nullable=False),
        sa.Column("standing", sa.Text(), nullable=False),
        sa.Column("escalations", sa.Integer(), server_default="0", nullable=False),
        sa.Column("updated_at", _TS, server_default=_now(), nullable=False),
        sa.PrimaryKeyConstraint("contract_id", "year", name=op.f("pk_alert_year_standings")),
    )
    for table in TABLES:
        op.execute(f"GRANT SELECT, INSERT ON {table} TO {APP_ROLE}")
    for table, columns in UPDATABLE.items():
        op.execute(f"GRANT UPDATE ({', '.join(columns)}) ON {table} TO {APP_ROLE}")
    grant_sequences(*SEQUENCES)


def downgrade() -> None:
    revoke_all(*TABLES)
    for seq in SEQUENCES:
        op.execute(f"REVOKE ALL ON SEQUENCE {seq} FROM {APP_ROLE}")
    op.drop_table("alert_year_standings")
    op.drop_index(op.f("ix_alert_attempts_delivery_id_attempt"), table_name="alert_attempts")
    op.drop_table("alert_attempts")
    op.drop_index(op.f("ix_alert_deliveries_destination_id"), table_name="alert_deliveries")
    op.drop_index(op.f("ix_alert_deliveries_status_id"), table_name="alert_deliveries")
    op.drop_table("alert_deliveries")
    op.drop_index(op.f("ix_alert_events_customer_id"), table_name="alert_events")
    op.drop_table("alert_events")
    op.drop_table("alert_destinations")
