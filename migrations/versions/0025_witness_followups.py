"""an index of a log's cosignatures in arrival order; the alert of an unmeetable policy

``ix_checkpoint_cosignatures_log_id_id``: the portal's probe of a contract
(``web.db.probe_statement``), run before every answer about it, names the latest
cosignature stored for the contract's log (``max(id) ... WHERE log_id = ?``): the answers
that show cosignatures (the checkpoint list) are tagged by it, so a cosignature that
arrives after its checkpoint was signed changes their tag. The unique (``log_id``,
``tree_size``, ``witness``) index would make that lookup read every cosignature of the
log; (``log_id``, ``id``) answers it from the index's last entry.

The alert kind ``witness_policy_unmet`` (a contract's witness policy names witnesses the
ledger does not submit to and the configured ones cannot reach its quorum) is added to
the check constraints of ``alert_events.kind`` and ``alert_destinations.event_kinds``.

Revision ID: 0025
Revises: 0024
Create Date: 2026-12-02 18:30:00
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

from migrations.helpers import set_alert_kinds

revision: str = "0025"
down_revision: str | None = "0024"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

INDEX = "ix_checkpoint_cosignatures_log_id_id"
#: 0024's kinds, in its order (a downgrade restores its very constraint text).
OLD_KINDS = (
    "year_at_risk", "year_below", "year_missed", "credit_issued", "checkpoint_stale",
    "record_refused", "test", "witness_down", "witness_refused", "checkpoint_cosigned",
    "report_issued",
)
NEW_KINDS = (*OLD_KINDS, "witness_policy_unmet")


def upgrade() -> None:
    op.create_index(INDEX, "checkpoint_cosignatures", ["log_id", "id"], unique=False)
    set_alert_kinds(NEW_KINDS)


def downgrade() -> None:
    # Refused (by the check constraint) while events of the new kind are stored: the
    # alerts log is the operator's record and is never deleted.
    set_alert_kinds(OLD_KINDS)
    op.drop_index(INDEX, table_name="checkpoint_cosignatures")
