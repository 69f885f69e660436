"""witnesses' cosignatures of signed checkpoints; alerts of a witness down or refusing

``checkpoint_cosignatures`` keeps, for each signed checkpoint (``log_id``, ``tree_size``),
the cosignature line each witness answered (C2SP tlog-witness / tlog-cosignature); the
ledger serves a checkpoint's note with them as extra signature lines. Append-only (a
cosignature is evidence, never edited), readable by the application role and, scoped to
the caller's contracts like ``checkpoints``, by the portal.

The alert kinds ``witness_down`` (a witness could not be reached: cosigning is delayed),
``witness_refused`` (a witness refused to cosign a checkpoint) and
``checkpoint_cosigned`` (a head reached the witness quorum: published to the customers
who ask for it) are added to the check constraints of ``alert_events.kind`` and
``alert_destinations.event_kinds``.

Revision ID: 0023
Revises: 0022
Create Date: 2026-12-02 13:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from migrations.helpers import (
    grant_sequences,
    make_append_only,
    revoke_all,
    set_alert_kinds,
)

revision: str = "0023"
down_revision: str | None = "0022"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

PORTAL_ROLE = "yoco_portal"
_MINE = (
    "(SELECT c.contract_id FROM contracts c "
    "WHERE c.customer = current_setting('yoco.customer', true))"
)
_ALL = "current_setting('yoco.scope', true) = 'all'"
OLD_KINDS = (
    "year_at_risk", "year_below", "year_missed", "credit_issued", "checkpoint_stale",
    "record_refused", "test",
)
NEW_KINDS = (*OLD_KINDS, "witness_down", "witness_refused", "checkpoint_cosigned")


def upgrade() -> None:
    op.create_table(
        "checkpoint_cosignatures",
        sa.Column("id", sa.BigInteger(), autoincrement=True, nullable=False),
        sa.Column("log_id", sa.Text(), nullable=False),
        sa.Column("tree_size", sa.BigInteger(), nullable=False),
        sa.Column("witness", sa.Text(), nullable=False),
        sa.Column("line", sa.Text(), nullable=False),
        sa.Column("cosigned_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column(
            "received_at", sa.DateTime(timezone=True), server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.ForeignKeyConstraint(
            ["log_id", "tree_size"], ["checkpoints.log_id", "checkpoints.tree_size"],
            name=op.f("fk_checkpoint_cosignatures_log_id_checkpoints"),
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_checkpoint_cosignatures")),
        sa.UniqueConstraint(
            "log_id", "tree_size", "witness",
            name=op.f("uq_checkpoint_cosignatures_log_id_tree_size_witness"),
        ),
    )
    make_append_only("checkpoint_cosignatures")
    grant_sequences("checkpoint_cosignatures_id_seq")
    op.execute(f"GRANT SELECT ON checkpoint_cosignatures TO {PORTAL_ROLE}")
    op.execute("ALTER TABLE checkpoint_cosignatures ENABLE ROW LEVEL SECURITY")
    op.execute(
        "CREATE POLICY checkpoint_cosignatures_portal_tenant ON checkpoint_cosignatures "
        f"FOR SELECT TO {PORTAL_ROLE} USING ({_ALL} OR log_id IN {_MINE})"
    )
    set_alert_kinds(NEW_KINDS)


def downgrade() -> None:
    # Refused (by the check constraint) while events of the new kinds are stored: the
    # alerts log is the operator's record and is never deleted.
    set_alert_kinds(OLD_KINDS)
    op.execute(f"REVOKE ALL ON checkpoint_cosignatures FROM {PORTAL_ROLE}")
    revoke_all("checkpoint_cosignatures")
    op.drop_table("checkpoint_cosignatures")
