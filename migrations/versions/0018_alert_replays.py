"""alert replays (who replayed which delivery, when, from where); refusal-count index

``alert_replays`` is the audit trail of replays: one row per delivery an operator asked
to send again, from ``yoco alerts replay`` or the portal's operator page. The
application role may SELECT and INSERT it, nothing else (no UPDATE, DELETE or
TRUNCATE); the tenant role ``yoco_portal`` gets nothing, as for every alerts table.

The index on ``alert_events (kind, contract_id, occurred_at)`` serves the flood limit of
``record_refused`` (counting a window's refusals per contract, alerts/refusals.py).

Revision ID: 0018
Revises: 0017
Create Date: 2026-12-01 06:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from migrations.helpers import APP_ROLE, grant_sequences, revoke_all

revision: str = "0018"
down_revision: str | None = "0017"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

TABLE = "alert_replays"
SEQUENCE = "alert_replays_id_seq"


def upgrade() -> None:
    op.create_table(
        TABLE,
        sa.Column("id", sa.BigInteger(), autoincrement=True, nullable=False),
        sa.Column("delivery_id", sa.BigInteger(), nullable=False),
        sa.Column("requested_by", sa.Text(), nullable=False),
        sa.Column("via", sa.Text(), nullable=False),
        sa.Column("requested_at", sa.DateTime(timezone=True), server_default=sa.text("now()"),
                  nullable=False),
        sa.CheckConstraint("via IN ('cli', 'portal')", name=op.f("ck_alert_replays_via_known")),
        sa.CheckConstraint("length(requested_by) BETWEEN 1 AND 320",
                           name=op.f("ck_alert_replays_requested_by_length")),
        sa.ForeignKeyConstraint(["delivery_id"], ["alert_deliveries.id"],
                                name=op.f("fk_alert_replays_delivery_id_alert_deliveries")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_alert_replays")),
    )
    op.create_index(op.f("ix_alert_replays_delivery_id_id"), TABLE, ["delivery_id", "id"])
    op.create_index(op.f("ix_alert_events_kind_contract_id_occurred_at"), "alert_events",
                    ["kind", "contract_id", "occurred_at"])
    op.execute(f"GRANT SELECT, INSERT ON {TABLE} TO {APP_ROLE}")
    grant_sequences(SEQUENCE)


def downgrade() -> None:
    revoke_all(TABLE)
    op.execute(f"REVOKE ALL ON SEQUENCE {SEQUENCE} FROM {APP_ROLE}")
    op.drop_index(op.f("ix_alert_events_kind_contract_id_occurred_at"), table_name="alert_events")
    op.drop_index(op.f("ix_alert_replays_delivery_id_id"), table_name=TABLE)
    op.drop_table(TABLE)
