"""a customer's own admin: API tokens and alert webhooks managed in the portal

``portal_users.customer_admin``: a customer user who may create and revoke the API
tokens of their own customer (tenant) in the portal (``/account/tokens``), and add
alert webhooks for it (``/account/alerts``), which before only an operator could, from
the command line. Only a customer user can be one.

``alert_destinations.customer_managed``: a webhook such an admin added: it belongs to a
customer, and only public addresses are sent to (never ``allow_unsafe_address``).

Revision ID: 0026
Revises: 0025
Create Date: 2026-12-02 18:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0026"
down_revision: str | None = "0025"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column(
        "portal_users",
        sa.Column("customer_admin", sa.Boolean(), server_default="false", nullable=False),
    )
    op.create_check_constraint(
        op.f("ck_portal_users_customer_admin_is_customer"),
        "portal_users",
        "NOT customer_admin OR role = 'customer'",
    )
    op.add_column(
        "alert_destinations",
        sa.Column("customer_managed", sa.Boolean(), server_default="false", nullable=False),
    )
    op.create_check_constraint(
        op.f("ck_alert_destinations_customer_managed_safe"),
        "alert_destinations",
        "NOT customer_managed OR (customer IS NOT NULL AND kind = 'webhook' "
        "AND NOT allow_unsafe_address)",
    )


def downgrade() -> None:
    op.drop_constraint(
        op.f("ck_alert_destinations_customer_managed_safe"), "alert_destinations", type_="check"
    )
    op.drop_column("alert_destinations", "customer_managed")
    op.drop_constraint(
        op.f("ck_portal_users_customer_admin_is_customer"), "portal_users", type_="check"
    )
    op.drop_column("portal_users", "customer_admin")
