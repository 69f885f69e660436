"""web: portal users, API tokens, sessions, login attempts; the portal role and row-level security

The portal reads tenant data as the role ``yoco_portal`` (SELECT only).  Every table it
reads has row-level security: a row is visible to ``yoco_portal`` only when its contract
belongs to the customer named by the transaction setting ``yoco.customer``, or when
``yoco.scope`` is ``all`` (operators and finance).  The application role ``yoco_app``
(ingest, billing) gets BYPASSRLS: PostgreSQL refuses ``COPY FROM`` into tables with
row-level security for roles that do not bypass it, and the ledger's bulk writes use COPY.

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-01 10:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

from migrations.helpers import APP_ROLE, grant_read_write, grant_sequences, revoke_all

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

PORTAL_ROLE = "yoco_portal"
WEB_TABLES = ("portal_users", "portal_sessions", "api_tokens", "login_attempts")
WEB_SEQUENCES = ("portal_users_id_seq", "api_tokens_id_seq", "login_attempts_id_seq")

_ALL = "current_setting('yoco.scope', true) = 'all'"
_MINE = (
    "(SELECT c.contract_id FROM contracts c "
    "WHERE c.customer = current_setting('yoco.customer', true))"
)
#: Tables the portal reads, and the predicate that scopes each to the caller's customer.
TENANT_TABLES: dict[str, str] = {
    "contracts": "customer = current_setting('yoco.customer', true)",
    "ledger_logs": f"log_id IN {_MINE}",
    "journal_entries": f"log_id IN {_MINE}",
    "merkle_nodes": f"log_id IN {_MINE}",
    "checkpoints": f"log_id IN {_MINE}",
    "job_spans": f"contract_id IN {_MINE}",
    "failures": f"contract_id IN {_MINE}",
    "outcomes": f"contract_id IN {_MINE}",
    "exclusions": f"contract_id IN {_MINE}",
    "billing_years": f"contract_id IN {_MINE}",
    "billing_closes": f"contract_id IN {_MINE}",
    "billing_credits": f"contract_id IN {_MINE}",
    "billing_credit_applications": f"contract_id IN {_MINE}",
    "billing_disputes": f"contract_id IN {_MINE}",
    "billing_reclassifications": f"contract_id IN {_MINE}",
    "billing_amendments": f"contract_id IN {_MINE}",
    # Exports belong to finance's own log, never to a customer's.
    "billing_exports": "false",
}


def upgrade() -> None:
    op.create_table(
        "portal_users",
        sa.Column("id", sa.BigInteger(), autoincrement=True, nullable=False),
        sa.Column("email", sa.Text(), nullable=False),
        sa.Column("name", sa.Text(), nullable=False),
        sa.Column("role", sa.Text(), nullable=False),
        sa.Column("customer", sa.Text(), nullable=True),
        sa.Column("password_hash", sa.Text(), nullable=False),
        sa.Column("disabled", sa.Boolean(), server_default="false", nullable=False),
        sa.Column(
            "created_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.CheckConstraint(
            "(role = 'customer') = (customer IS NOT NULL)",
            name=op.f("ck_portal_users_customer_iff_customer_role"),
        ),
        sa.CheckConstraint("email = lower(email)", name=op.f("ck_portal_users_email_lower")),
        sa.CheckConstraint(
            "role IN ('customer', 'operator', 'finance')", name=op.f("ck_portal_users_role_known")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_portal_users")),
        sa.UniqueConstraint("email", name=op.f("uq_portal_users_email")),
    )
    op.create_table(
        "portal_sessions",
        sa.Column("token_hash", sa.LargeBinary(), nullable=False),
        sa.Column("user_id", sa.BigInteger(), nullable=False),
        sa.Column(
            "created_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["user_id"],
            ["portal_users.id"],
            name=op.f("fk_portal_sessions_user_id_portal_users"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("token_hash", name=op.f("pk_portal_sessions")),
    )
    op.create_index(
        op.f("ix_portal_sessions_user_id"), "portal_sessions", ["user_id"], unique=False
    )
    op.create_table(
        "api_tokens",
        sa.Column("id", sa.BigInteger(), autoincrement=True, nullable=False),
        sa.Column("prefix", sa.Text(), nullable=False),
        sa.Column("secret_hash", sa.LargeBinary(), nullable=False),
        sa.Column("name", sa.Text(), nullable=False),
        sa.Column("customer", sa.Text(), nullable=True),
        sa.Column(
            "contract_ids", postgresql.ARRAY(sa.Text()), server_default="{}", nullable=False
        ),
        sa.Column(
            "created_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.Column("revoked_at", sa.DateTime(timezone=True), nullable=True),
        sa.CheckConstraint(
            "customer IS NOT NULL OR cardinality(contract_ids) > 0",
            name=op.f("ck_api_tokens_has_scope"),
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_api_tokens")),
        sa.UniqueConstraint("prefix", name=op.f("uq_api_tokens_prefix")),
    )
    op.create_table(
        "login_attempts",
        sa.Column("id", sa.BigInteger(), autoincrement=True, nullable=False),
        sa.Column("key", sa.Text(), nullable=False),
        sa.Column(
            "at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_login_attempts")),
    )
    op.create_index(
        op.f("ix_login_attempts_key_at"), "login_attempts", ["key", "at"], unique=False
    )
    grant_read_write(*WEB_TABLES)
    grant_sequences(*WEB_SEQUENCES)

    # The portal role: SELECT on the tenant tables only, nothing else.
    op.execute(
        f"""
        DO $$
        BEGIN
            IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = '{PORTAL_ROLE}') THEN
                CREATE ROLE {PORTAL_ROLE} NOLOGIN;
            END IF;
            BEGIN
                EXECUTE 'GRANT {PORTAL_ROLE} TO ' || quote_ident(current_user);
            EXCEPTION WHEN OTHERS THEN
                RAISE NOTICE 'could not grant {PORTAL_ROLE} to %: %', current_user, SQLERRM;
            END;
        END
        $$
        """
    )
    op.execute(f"GRANT USAGE ON SCHEMA public TO {PORTAL_ROLE}")
    # Writers bypass row-level security (COPY FROM refuses tables with RLS otherwise).
    op.execute(
        f"""
        DO $$
        BEGIN
            IF NOT (SELECT rolbypassrls FROM pg_roles WHERE rolname = '{APP_ROLE}') THEN
                EXECUTE 'ALTER ROLE {APP_ROLE} BYPASSRLS';
            END IF;
        EXCEPTION WHEN insufficient_privilege THEN
            RAISE EXCEPTION 'yoco: the role {APP_ROLE} needs BYPASSRLS (row-level security '
                'guards the portal); run ALTER ROLE {APP_ROLE} BYPASSRLS as a superuser, '
                'then migrate again';
        END
        $$
        """
    )
    for table, predicate in TENANT_TABLES.items():
        op.execute(f"GRANT SELECT ON {table} TO {PORTAL_ROLE}")
        op.execute(f"ALTER TABLE {table} ENABLE ROW LEVEL SECURITY")
        op.execute(
            f"CREATE POLICY {table}_portal_tenant ON {table} FOR SELECT TO {PORTAL_ROLE} "
            f"USING ({_ALL} OR {predicate})"
        )


def downgrade() -> None:
    # The roles are server-wide (other databases may use them): they stay, and so does
    # yoco_app's BYPASSRLS.
    for table in TENANT_TABLES:
        op.execute(f"DROP POLICY IF EXISTS {table}_portal_tenant ON {table}")
        op.execute(f"ALTER TABLE {table} DISABLE ROW LEVEL SECURITY")
        op.execute(f"REVOKE ALL ON {table} FROM {PORTAL_ROLE}")
    revoke_all(*WEB_TABLES)
    op.drop_table("login_attempts")
    op.drop_table("api_tokens")
    op.drop_index(op.f("ix_portal_sessions_user_id"), table_name="portal_sessions")
    op.drop_table("portal_sessions")
    op.drop_table("portal_users")
