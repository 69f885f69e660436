"""a customer's admin adds and removes e-mail recipients of alerts; their changes audited

``alert_destinations``: a ``customer_managed`` destination may now be an e-mail
destination of exactly one recipient (0026 allowed webhooks only). Its SMTP server and
From address are the operator's relay (the destination named by
``YOCO_WEB_CUSTOMER_MAIL_VIA``), copied when the recipient is added: the customer
chooses only the address and the kinds. ``removed_at``: when the customer's admin
removed the recipient -- it is then disabled for good; the row stays for the delivery
log (nothing of the alerts is ever deleted). The application role may UPDATE that one
column more.

``alert_destination_changes``: the audit trail of what customers' admins did to their
destinations in the portal (a webhook added, turned off or on; a recipient added or
removed), who and when. Append-only: the application role may SELECT and INSERT it,
nothing else; the tenant role ``yoco_portal`` gets nothing, as for every alerts table.

Revision ID: 0027
Revises: 0026
Create Date: 2026-12-04 19:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from migrations.helpers import APP_ROLE, grant_sequences, revoke_all

revision: str = "0027"
down_revision: str | None = "0026"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

TABLE = "alert_destination_changes"
SEQUENCE = "alert_destination_changes_id_seq"
#: The columns of ``alert_destinations`` the application role may UPDATE from now on,
#: beside those of migration 0017.
UPDATABLE = {"alert_destinations": ("removed_at",)}

_SAFE_0026 = ("NOT customer_managed OR (customer IS NOT NULL AND kind = 'webhook' "
              "AND NOT allow_unsafe_address)")
_SAFE = ("NOT customer_managed OR (customer IS NOT NULL AND ((kind = 'webhook' AND NOT "
         "allow_unsafe_address) OR (kind = 'email' AND cardinality(mail_to) = 1)))")
_CK_SAFE = "ck_alert_destinations_customer_managed_safe"
_CK_REMOVED = "ck_alert_destinations_removed_for_good"


def upgrade() -> None:
    op.drop_constraint(op.f(_CK_SAFE), "alert_destinations", type_="check")
    op.create_check_constraint(op.f(_CK_SAFE), "alert_destinations", _SAFE)
    op.add_column("alert_destinations",
                  sa.Column("removed_at", sa.DateTime(timezone=True), nullable=True))
    op.create_check_constraint(
        op.f(_CK_REMOVED), "alert_destinations",
        "removed_at IS NULL OR (customer_managed AND kind = 'email' AND NOT enabled)",
    )
    op.execute(f"GRANT UPDATE (removed_at) ON alert_destinations TO {APP_ROLE}")
    op.create_table(
        TABLE,
        sa.Column("id", sa.BigInteger(), autoincrement=True, nullable=False),
        sa.Column("destination_id", sa.BigInteger(), nullable=False),
        sa.Column("action", sa.Text(), nullable=False),
        sa.Column("changed_by", sa.Text(), nullable=False),
        sa.Column("changed_at", sa.DateTime(timezone=True), server_default=sa.text("now()"),
                  nullable=False),
        sa.CheckConstraint("action IN ('added', 'disabled', 'enabled', 'removed')",
                           name=op.f("ck_alert_destination_changes_action_known")),
        sa.CheckConstraint("length(changed_by) BETWEEN 1 AND 320",
                           name=op.f("ck_alert_destination_changes_changed_by_length")),
        sa.ForeignKeyConstraint(
            ["destination_id"], ["alert_destinations.id"],
            name=op.f("fk_alert_destination_changes_destination_id_alert_destinations")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_alert_destination_changes")),
    )
    op.create_index(op.f("ix_alert_destination_changes_destination_id_id"), TABLE,
                    ["destination_id", "id"])
    op.execute(f"GRANT SELECT, INSERT ON {TABLE} TO {APP_ROLE}")
    grant_sequences(SEQUENCE)


def downgrade() -> None:
    revoke_all(TABLE)
    op.execute(f"REVOKE ALL ON SEQUENCE {SEQUENCE} FROM {APP_ROLE}")
    op.drop_index(op.f("ix_alert_destination_changes_destination_id_id"), table_name=TABLE)
    op.drop_table(TABLE)
    op.execute(f"REVOKE UPDATE (removed_at) ON alert_destinations FROM {APP_ROLE}")
    op.drop_constraint(op.f(_CK_REMOVED), "alert_destinations", type_="check")
    op.drop_column("alert_destinations", "removed_at")
    # Customers' e-mail recipients cannot stay customer_managed under 0026's rule.
    op.execute("UPDATE alert_destinations SET customer_managed = false "
               "WHERE customer_managed AND kind = 'email'")
    op.drop_constraint(op.f(_CK_SAFE), "alert_destinations", type_="check")
    op.create_check_constraint(op.f(_CK_SAFE), "alert_destinations", _SAFE_0026)
