"""billing: year closes, credits, applications, disputes, reclassifications, amendments, exports

Every table here is a projection of billing's journal entries (rebuilt by
``yoco ledger rebuild``).  One credit per contract year is guaranteed by the
partial unique index ``uq_billing_credits_live_year`` (among non-void credits),
one first close per contract year by the primary key of ``billing_years``.

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-01 09:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

from migrations.helpers import grant_read_write, revoke_all

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

TABLES = (
    "billing_credit_applications",
    "billing_credits",
    "billing_closes",
    "billing_years",
    "billing_disputes",
    "billing_reclassifications",
    "billing_amendments",
    "billing_exports",
)


def _ts(name: str, nullable: bool = False) -> sa.Column:
    return sa.Column(name, sa.DateTime(timezone=True), nullable=nullable)


def upgrade() -> None:
    op.create_table(
        "billing_years",
        sa.Column("contract_id", sa.Text(), nullable=False),
        sa.Column("year", sa.Integer(), nullable=False),
        sa.Column("close_event_id", sa.UUID(), nullable=False),
        sa.Column("closed_seq", sa.BigInteger(), nullable=False),
        _ts("closed_at"),
        sa.Column("last_event_id", sa.UUID(), nullable=False),
        sa.Column("last_seq", sa.BigInteger(), nullable=False),
        sa.Column("guarantee_met", sa.Boolean(), nullable=False),
        sa.Column("adjustments", sa.Integer(), nullable=False),
        sa.Column("pending_seq", sa.BigInteger(), nullable=True),
        sa.Column("pending_event_id", sa.UUID(), nullable=True),
        sa.CheckConstraint("year >= 1", name=op.f("ck_billing_years_year_positive")),
        sa.PrimaryKeyConstraint("contract_id", "year", name=op.f("pk_billing_years")),
    )
    op.create_table(
        "billing_closes",
        sa.Column("event_id", sa.UUID(), nullable=False),
        sa.Column("contract_id", sa.Text(), nullable=False),
        sa.Column("year", sa.Integer(), nullable=False),
        sa.Column("seq", sa.BigInteger(), nullable=False),
        sa.Column("kind", sa.Text(), nullable=False),
        _ts("occurred_at"),
        _ts("period_start"),
        _ts("period_end"),
        sa.Column("covered_failures", sa.Integer(), nullable=False),
        sa.Column("resolved_failures", sa.Integer(), nullable=False),
        sa.Column("excluded_failures", sa.Integer(), nullable=False),
        sa.Column("pending_failures", sa.Integer(), nullable=False),
        sa.Column("threshold_percent", sa.Numeric(), nullable=False),
        sa.Column("guarantee_met", sa.Boolean(), nullable=False),
        sa.Column("tree_size", sa.BigInteger(), nullable=False),
        sa.Column("root_hash", sa.Text(), nullable=False),
        sa.Column("figures", postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        sa.Column("terms", postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        sa.CheckConstraint(
            "kind IN ('year_close', 'adjustment')", name=op.f("ck_billing_closes_kind_known")
        ),
        sa.PrimaryKeyConstraint("event_id", name=op.f("pk_billing_closes")),
    )
    op.create_index(
        "uq_billing_closes_first_close",
        "billing_closes",
        ["contract_id", "year"],
        unique=True,
        postgresql_where=sa.text("kind = 'year_close'"),
    )
    op.create_table(
        "billing_credits",
        sa.Column("credit_id", sa.UUID(), nullable=False),
        sa.Column("contract_id", sa.Text(), nullable=False),
        sa.Column("year", sa.Integer(), nullable=False),
        sa.Column("seq", sa.BigInteger(), nullable=False),
        sa.Column("credit_note", sa.Text(), nullable=False),
        _ts("issued_at"),
        sa.Column("close_event_id", sa.UUID(), nullable=False),
        _ts("period_start"),
        _ts("period_end"),
        sa.Column("covered_failures", sa.Integer(), nullable=False),
        sa.Column("resolved_failures", sa.Integer(), nullable=False),
        sa.Column("threshold_percent", sa.Numeric(), nullable=False),
        sa.Column("credit_percent", sa.Numeric(), nullable=False),
        sa.Column("currency", sa.Text(), nullable=False),
        sa.Column("base_minor", sa.BigInteger(), nullable=False),
        sa.Column("amount_minor", sa.BigInteger(), nullable=False),
        sa.Column("applied_minor", sa.BigInteger(), nullable=False),
        sa.Column("status", sa.Text(), nullable=False),
        sa.Column("void_event_id", sa.UUID(), nullable=True),
        _ts("voided_at", nullable=True),
        sa.CheckConstraint("amount_minor >= 0", name=op.f("ck_billing_credits_amount_nonnegative")),
        sa.CheckConstraint("base_minor >= 0", name=op.f("ck_billing_credits_base_nonnegative")),
        sa.CheckConstraint(
            "applied_minor >= 0 AND applied_minor <= amount_minor",
            name=op.f("ck_billing_credits_applied_within_amount"),
        ),
        sa.CheckConstraint(
            "status IN ('issued', 'partially_applied', 'applied', 'void')",
            name=op.f("ck_billing_credits_status_known"),
        ),
        sa.PrimaryKeyConstraint("credit_id", name=op.f("pk_billing_credits")),
        sa.UniqueConstraint("credit_note", name=op.f("uq_billing_credits_credit_note")),
    )
    # One credit per contract year, by the database: among credits that are not void.
    op.create_index(
        "uq_billing_credits_live_year",
        "billing_credits",
        ["contract_id", "year"],
        unique=True,
        postgresql_where=sa.text("status <> 'void'"),
    )
    op.create_index("ix_billing_credits_issued_at", "billing_credits", ["issued_at"])
    op.create_table(
        "billing_credit_applications",
        sa.Column("event_id", sa.UUID(), nullable=False),
        sa.Column("credit_id", sa.UUID(), nullable=False),
        sa.Column("contract_id", sa.Text(), nullable=False),
        sa.Column("seq", sa.BigInteger(), nullable=False),
        sa.Column("invoice_ref", sa.Text(), nullable=False),
        sa.Column("invoice_kind", sa.Text(), nullable=False),
        sa.Column("invoice_minor", sa.BigInteger(), nullable=False),
        sa.Column("amount_minor", sa.BigInteger(), nullable=False),
        sa.Column("remaining_minor", sa.BigInteger(), nullable=False),
        sa.Column("applied_on", sa.Date(), nullable=False),
        _ts("occurred_at"),
        sa.CheckConstraint(
            "amount_minor > 0", name=op.f("ck_billing_credit_applications_amount_positive")
        ),
        sa.CheckConstraint(
            "remaining_minor >= 0", name=op.f("ck_billing_credit_applications_remaining_ok")
        ),
        sa.ForeignKeyConstraint(
            ["credit_id"],
            ["billing_credits.credit_id"],
            name=op.f("fk_billing_credit_applications_credit_id_billing_credits"),
        ),
        sa.PrimaryKeyConstraint("event_id", name=op.f("pk_billing_credit_applications")),
    )
    op.create_index(
        "ix_billing_credit_applications_credit_id", "billing_credit_applications", ["credit_id"]
    )
    op.create_table(
        "billing_disputes",
        sa.Column("dispute_id", sa.UUID(), nullable=False),
        sa.Column("contract_id", sa.Text(), nullable=False),
        sa.Column("failure_event_id", sa.UUID(), nullable=False),
        sa.Column("seq", sa.BigInteger(), nullable=False),
        _ts("opened_at"),
        sa.Column("opened_by", sa.Text(), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("status", sa.Text(), nullable=False),
        sa.Column("resolution", sa.Text(), nullable=True),
        sa.Column("decision_event_id", sa.UUID(), nullable=True),
        _ts("decided_at", nullable=True),
        sa.Column("decided_by", sa.Text(), nullable=True),
        sa.Column("note", sa.Text(), nullable=True),
        sa.CheckConstraint(
            "status IN ('open', 'resolved', 'rejected')",
            name=op.f("ck_billing_disputes_status_known"),
        ),
        sa.PrimaryKeyConstraint("dispute_id", name=op.f("pk_billing_disputes")),
    )
    op.create_index(
        "ix_billing_disputes_contract_id_status", "billing_disputes", ["contract_id", "status"]
    )
    op.create_table(
        "billing_reclassifications",
        sa.Column("event_id", sa.UUID(), nullable=False),
        sa.Column("failure_event_id", sa.UUID(), nullable=False),
        sa.Column("contract_id", sa.Text(), nullable=False),
        sa.Column("seq", sa.BigInteger(), nullable=False),
        sa.Column("failure_class", sa.Text(), nullable=False),
        sa.Column("cause", sa.Text(), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        _ts("occurred_at"),
        sa.PrimaryKeyConstraint("event_id", name=op.f("pk_billing_reclassifications")),
    )
    op.create_index(
        "ix_billing_reclassifications_failure_event_id",
        "billing_reclassifications",
        ["failure_event_id"],
    )
    op.create_table(
        "billing_amendments",
        sa.Column("event_id", sa.UUID(), nullable=False),
        sa.Column("contract_id", sa.Text(), nullable=False),
        sa.Column("seq", sa.BigInteger(), nullable=False),
        sa.Column("amendment_type", sa.Text(), nullable=False),
        sa.Column("effective_date", sa.Date(), nullable=False),
        sa.Column("applies_to_year_in_progress", sa.Boolean(), nullable=False),
        sa.Column("changes", postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        _ts("occurred_at"),
        sa.PrimaryKeyConstraint("event_id", name=op.f("pk_billing_amendments")),
    )
    op.create_index(
        "ix_billing_amendments_contract_id_seq", "billing_amendments", ["contract_id", "seq"]
    )
    op.create_table(
        "billing_exports",
        sa.Column("event_id", sa.UUID(), nullable=False),
        sa.Column("log_id", sa.Text(), nullable=False),
        sa.Column("seq", sa.BigInteger(), nullable=False),
        sa.Column("batch_id", sa.Text(), nullable=False),
        sa.Column("format", sa.Text(), nullable=False),
        sa.Column("selection", postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        sa.Column("row_count", sa.Integer(), nullable=False),
        sa.Column("sha256", sa.Text(), nullable=False),
        _ts("occurred_at"),
        sa.PrimaryKeyConstraint("event_id", name=op.f("pk_billing_exports")),
    )
    op.create_index("ix_billing_exports_batch_id", "billing_exports", ["batch_id"])
    grant_read_write(*TABLES)


def downgrade() -> None:
    revoke_all(*TABLES)
    for table in TABLES:
        op.drop_table(table)
