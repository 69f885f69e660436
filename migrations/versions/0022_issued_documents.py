"""issued documents: the exact bytes of each issued report, append-only, per tenant

A monthly report is issued once per contract and month (a year-end statement once per
contract year, period ``year-K``), over a named checkpoint; its
HTML and PDF are kept here as issued, with their SHA-256 digests (checked by the
database against the bytes) and the ``report`` entry of the contract's log that
records the same digests (foreign key to the journal).  Nothing may change them:

* the application role ``yoco_app`` may SELECT and INSERT, never UPDATE, DELETE or
  TRUNCATE (and triggers enabled ALWAYS refuse those to everyone, the owner included);
* the portal role ``yoco_portal`` may SELECT only, under row-level security like every
  other tenant table: a row is visible when its contract belongs to ``yoco.customer``,
  or when ``yoco.scope`` is ``all`` (staff).

Revision ID: 0022
Revises: 0021
Create Date: 2026-12-02 13:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

from migrations.helpers import APP_ROLE, make_append_only

revision: str = "0022"
down_revision: str | None = "0021"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

TABLE = "issued_documents"
PORTAL_ROLE = "yoco_portal"
#: The same predicate as every tenant table of migration 0003.
_POLICY = (
    "current_setting('yoco.scope', true) = 'all' OR contract_id IN "
    "(SELECT c.contract_id FROM contracts c "
    "WHERE c.customer = current_setting('yoco.customer', true))"
)


def upgrade() -> None:
    op.create_table(
        TABLE,
        sa.Column("contract_id", sa.Text(), nullable=False),
        sa.Column("document", sa.Text(), nullable=False),
        sa.Column("period", sa.Text(), nullable=False),
        sa.Column("event_id", postgresql.UUID(as_uuid=True), nullable=False),
        sa.Column("seq", sa.BigInteger(), nullable=False),
        sa.Column("checkpoint_tree_size", sa.BigInteger(), nullable=False),
        sa.Column("checkpoint_root_hash", sa.Text(), nullable=False),
        sa.Column("html", sa.LargeBinary(), nullable=False),
        sa.Column("pdf", sa.LargeBinary(), nullable=False),
        sa.Column("html_sha256", sa.Text(), nullable=False),
        sa.Column("pdf_sha256", sa.Text(), nullable=False),
        sa.Column(
            "issued_at", sa.DateTime(timezone=True), server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.CheckConstraint(
            "document IN ('monthly-sla', 'year-statement')",
            name=op.f("ck_issued_documents_document_known"),
        ),
        sa.CheckConstraint(
            "(document = 'monthly-sla' AND period ~ '^[0-9]{4}-(0[1-9]|1[0-2])$') OR "
            "(document = 'year-statement' AND period ~ '^year-[1-9][0-9]{0,2}$')",
            name=op.f("ck_issued_documents_period_format"),
        ),
        sa.CheckConstraint(
            "html_sha256 = encode(sha256(html), 'hex')",
            name=op.f("ck_issued_documents_html_digest"),
        ),
        sa.CheckConstraint(
            "pdf_sha256 = encode(sha256(pdf), 'hex')",
            name=op.f("ck_issued_documents_pdf_digest"),
        ),
        sa.CheckConstraint(
            "checkpoint_tree_size > 0 AND seq >= 0", name=op.f("ck_issued_documents_sizes_valid")
        ),
        sa.CheckConstraint(
            "seq >= checkpoint_tree_size",
            name=op.f("ck_issued_documents_entry_after_checkpoint"),
        ),
        sa.ForeignKeyConstraint(
            ["contract_id", "seq"],
            ["journal_entries.log_id", "journal_entries.seq"],
            name=op.f("fk_issued_documents_contract_id_journal_entries"),
        ),
        sa.PrimaryKeyConstraint("contract_id", "document", "period",
                                name=op.f("pk_issued_documents")),
        sa.UniqueConstraint("event_id", name=op.f("uq_issued_documents_event_id")),
    )
    make_append_only(TABLE)  # SELECT, INSERT for yoco_app; nothing else, for anyone
    op.execute(f"GRANT SELECT ON {TABLE} TO {PORTAL_ROLE}")
    op.execute(f"ALTER TABLE {TABLE} ENABLE ROW LEVEL SECURITY")
    op.execute(
        f"CREATE POLICY {TABLE}_portal_tenant ON {TABLE} FOR SELECT TO {PORTAL_ROLE} "
        f"USING ({_POLICY})"
    )


def downgrade() -> None:
    op.execute(f"DROP POLICY IF EXISTS {TABLE}_portal_tenant ON {TABLE}")
    op.execute(f"REVOKE ALL ON {TABLE} FROM {PORTAL_ROLE}")
    op.execute(f"REVOKE ALL ON {TABLE} FROM {APP_ROLE}")
    op.drop_table(TABLE)
